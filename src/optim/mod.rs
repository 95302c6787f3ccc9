//! Optimizers: candle-nn's SGD and AdamW, and memfit's own SGD with momentum and 8-bit AdamW.
//!
//! State each keeps (P parameters, e bytes per element, n_t elements of tensor t):
//!
//! | optimizer | state | step temporaries (peak, beside the state) |
//! |---|---|---|
//! | `sgd` | none | `θ − lr·g`: 2 tensors the size of the largest parameter |
//! | `sgd-momentum` | velocity: `e·P` | 2 × largest (`μ·v + g`, then `θ − lr·v`) |
//! | `adam` | m, v: `2e·P` | candle's AdamW with weight decay 0: 14 × largest |
//! | `adamw` | m, v: `2e·P` | 14 × largest (unfused per-tensor ops) |
//! | `adamw-8bit` | m, v as bytes + one f32 scale per block: `Σ_t 2·(n_t + 4⌈n_t/block⌉)` | on the host: `10·n + 8·⌈n/block⌉ + 8·block` bytes for the largest tensor (f32 copies of θ and g, the four state arrays, two block buffers) |
//!
//! With fused kernels the runner builds `sgd`, `sgd-momentum`, `adam` and `adamw` as
//! [`inplace::InPlace`]: the same state, and no step temporaries (the update is written into θ,
//! m and v).
//!
//! Every optimizer is created in the `optimizer` phase's window, so the phase's peak is its state
//! plus its first step's temporaries.

pub mod adamw8bit;
pub mod code8;
pub mod inplace;
pub mod sgd_momentum;

use candle_core::backprop::GradStore;
use candle_core::{Result, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW, SGD};

use crate::step::OptimizerKind;

/// Learning rate of every optimizer (the value does not change memory).
pub const LEARNING_RATE: f64 = 1e-3;

/// A constructed optimizer of any kind.
pub enum Opt {
    Sgd(SGD),
    SgdMomentum(sgd_momentum::SgdMomentum),
    Adam(AdamW),
    Adamw(AdamW),
    Adamw8bit(Box<adamw8bit::AdamW8bit>),
    /// `sgd`, `sgd-momentum`, `adam`, `adamw` stepping in place ([`inplace`]).
    InPlace(inplace::InPlace),
}

impl Opt {
    /// The optimizer with default settings (8-bit blocks of 2048).
    pub fn new(kind: OptimizerKind, vars: Vec<Var>) -> Result<Self> {
        Self::with_block(kind, vars, adamw8bit::Params::default().block)
    }

    /// `block`: elements per quantization block of `adamw-8bit` (ignored by the others).
    pub fn with_block(kind: OptimizerKind, vars: Vec<Var>, block: usize) -> Result<Self> {
        Self::build(kind, vars, block, false)
    }

    /// With `in_place`, `sgd`, `sgd-momentum`, `adam` and `adamw` update in place
    /// ([`inplace::InPlace`]: the runner's choice with fused kernels); `adamw-8bit` is memfit's
    /// own either way.
    pub fn build(
        kind: OptimizerKind,
        vars: Vec<Var>,
        block: usize,
        in_place: bool,
    ) -> Result<Self> {
        if in_place && kind != OptimizerKind::Adamw8bit {
            return Ok(Opt::InPlace(inplace::InPlace::new(
                kind,
                vars,
                LEARNING_RATE,
            )?));
        }
        Ok(match kind {
            OptimizerKind::Sgd => Opt::Sgd(SGD::new(vars, LEARNING_RATE)?),
            OptimizerKind::SgdMomentum => Opt::SgdMomentum(sgd_momentum::SgdMomentum::new(
                vars,
                sgd_momentum::Params {
                    lr: LEARNING_RATE,
                    ..Default::default()
                },
            )?),
            OptimizerKind::Adam => Opt::Adam(AdamW::new(
                vars,
                ParamsAdamW {
                    lr: LEARNING_RATE,
                    weight_decay: 0.0,
                    ..Default::default()
                },
            )?),
            OptimizerKind::Adamw => Opt::Adamw(AdamW::new(
                vars,
                ParamsAdamW {
                    lr: LEARNING_RATE,
                    ..Default::default()
                },
            )?),
            OptimizerKind::Adamw8bit => Opt::Adamw8bit(Box::new(adamw8bit::AdamW8bit::new(
                vars,
                adamw8bit::Params {
                    lr: LEARNING_RATE,
                    block,
                    ..Default::default()
                },
            )?)),
        })
    }

    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        match self {
            Opt::Sgd(o) => o.step(grads),
            Opt::SgdMomentum(o) => o.step(grads),
            Opt::Adam(o) | Opt::Adamw(o) => o.step(grads),
            Opt::Adamw8bit(o) => o.step(grads),
            Opt::InPlace(o) => o.step(grads),
        }
    }
}
