//! The position-wise MLP: GPT's tanh-GELU MLP, LLaMA's SwiGLU or Gemma's GeGLU, composed or
//! fused.

use candle_core::{Module, Result, Tensor};
use candle_nn::VarBuilder;

use super::config::{Config, ProjSpec};
use super::kernels;
use super::proj::Proj;
use super::shapes::Llama;

/// Position-wise MLP: GPT's `fc2(gelu(fc1(x)))` (width 4H, GELU with the tanh approximation)
/// or LLaMA's SwiGLU `down(silu(gate(x)) · up(x))` (width I); with `gelu`, Gemma's GeGLU
/// `down(gelu_tanh(gate(x)) · up(x))` (fused: the GELU kernel, then the product).
#[derive(Debug, Clone)]
pub enum Mlp {
    Gelu {
        fc1: Proj,
        fc2: Proj,
        fused: bool,
    },
    SwiGlu {
        gate: Proj,
        up: Proj,
        down: Proj,
        fused: bool,
        /// The gate's activation.
        act: Glu,
    },
}

/// A gated MLP's activation: LLaMA's SwiGLU, Gemma's GeGLU (tanh GELU), gpt-oss's clamped
/// SwiGLU ([`kernels::oss_glu`], one op with either kernel set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Glu {
    Silu,
    Gelu,
    Oss,
}

impl Glu {
    /// The activation of a LLaMA-family model's gated MLPs (SiLU outside Gemma and gpt-oss).
    pub fn of(llama: Option<&Llama>) -> Self {
        match llama {
            Some(l) if l.gemma.is_some() => Glu::Gelu,
            Some(l) if l.oss => Glu::Oss,
            _ => Glu::Silu,
        }
    }

    /// Whether the MLP's activation is one op on gate and up: gpt-oss's clamped GLU (with
    /// either kernel set), or SwiGLU with fused kernels.
    pub fn one_op(self, fused: bool) -> bool {
        self == Glu::Oss || (fused && self == Glu::Silu)
    }
}

impl Mlp {
    /// `projs` are the block's MLP projections (fc1, fc2 or gate, up, down).
    pub(crate) fn new(cfg: &Config, projs: &[ProjSpec], vb: VarBuilder) -> Result<Self> {
        let p = |i: usize| Proj::new(&projs[i], cfg, vb.clone());
        let fused = cfg.kernels.fused();
        Ok(match projs.len() {
            2 => Mlp::Gelu {
                fc1: p(0)?,
                fc2: p(1)?,
                fused,
            },
            _ => Mlp::SwiGlu {
                gate: p(0)?,
                up: p(1)?,
                down: p(2)?,
                fused,
                act: Glu::of(cfg.llama.as_ref()),
            },
        })
    }

    pub(crate) fn projs_mut(&mut self) -> Vec<&mut Proj> {
        match self {
            Mlp::Gelu { fc1, fc2, .. } => vec![fc1, fc2],
            Mlp::SwiGlu { gate, up, down, .. } => vec![gate, up, down],
        }
    }

    /// A copy with `base` applied to the weights and biases and `adapter` to LoRA's A and B.
    pub(crate) fn map(
        &self,
        base: &dyn Fn(&Tensor) -> Result<Tensor>,
        adapter: &dyn Fn(&Tensor) -> Result<Tensor>,
    ) -> Result<Self> {
        Ok(match self {
            Mlp::Gelu { fc1, fc2, fused } => Mlp::Gelu {
                fc1: fc1.map(base, adapter)?,
                fc2: fc2.map(base, adapter)?,
                fused: *fused,
            },
            Mlp::SwiGlu {
                gate,
                up,
                down,
                fused,
                act,
            } => Mlp::SwiGlu {
                gate: gate.map(base, adapter)?,
                up: up.map(base, adapter)?,
                down: down.map(base, adapter)?,
                fused: *fused,
                act: *act,
            },
        })
    }
}

impl Mlp {
    /// The hidden activation of `x` and the projection that brings it back to `H` (fc2 or
    /// down).
    fn hidden(&self, x: &Tensor) -> Result<(Tensor, &Proj)> {
        Ok(match self {
            Mlp::Gelu {
                fc1,
                fc2,
                fused: true,
            } => (kernels::gelu(&fc1.forward(x)?)?, fc2),
            Mlp::Gelu { fc1, fc2, .. } => (fc1.forward(x)?.gelu()?, fc2),
            // One op on gate and up: gpt-oss's clamped GLU (with either kernel set), or the
            // fused SwiGLU.
            Mlp::SwiGlu {
                gate,
                up,
                down,
                fused,
                act,
            } if act.one_op(*fused) => {
                let g = gate.forward(x)?;
                let u = up.forward(x)?;
                let m = if *act == Glu::Oss {
                    kernels::oss_glu(&g, &u)?
                } else {
                    kernels::silu_mul(&g, &u)?
                };
                drop((g, u));
                (m, down)
            }
            Mlp::SwiGlu {
                gate,
                up,
                down,
                fused: true,
                act: Glu::Gelu,
            } => {
                let g = gate.forward(x)?;
                let u = up.forward(x)?;
                let a = kernels::gelu(&g)?;
                drop(g);
                let m = a.mul(&u)?;
                drop((a, u));
                (m, down)
            }
            Mlp::SwiGlu {
                gate,
                up,
                down,
                act: Glu::Gelu,
                ..
            } => {
                let g = gate.forward(x)?.gelu()?;
                let u = up.forward(x)?;
                let m = g.mul(&u)?;
                drop((g, u));
                (m, down)
            }
            Mlp::SwiGlu { gate, up, down, .. } => {
                let g = gate.forward(x)?.silu()?;
                let u = up.forward(x)?;
                let m = g.mul(&u)?;
                drop((g, u));
                (m, down)
            }
        })
    }

    /// `self.forward(x) ⊙ s`, `s (n, 1)` ([`Proj::forward_scaled`]): a routed expert's output
    /// times its routing weights; x freed once the hidden activation exists.
    pub fn forward_scaled(&self, x: Tensor, s: &Tensor) -> Result<Tensor> {
        let (a, out) = self.hidden(&x)?;
        drop(x);
        out.forward_scaled(a, s)
    }

    /// `residual + self.forward(&x)` ([`Proj::forward_add`]), x freed before the sum.
    pub fn forward_add(&self, x: Tensor, residual: &Tensor) -> Result<Tensor> {
        let (a, out) = self.hidden(&x)?;
        out.forward_add(a, x, residual)
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (a, out) = self.hidden(x)?;
        out.forward(&a)
    }
}
