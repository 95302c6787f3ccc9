//! Formulas for the GPT decoder of [`crate::model::gpt`] on candle 0.11.1's CPU backend, f32.
//!
//! Notation: B batch, S sequence, H hidden, A heads, L layers, V vocab, S_max position table,
//! P parameters, e = 4 bytes per element. "Metadata" is candle's per-tensor bookkeeping
//! (`Arc`s, layouts, shapes, graph nodes) that the counting allocator also sees.

use crate::phase::{OptimizerKind, Phase};
use crate::workload::Case;

use super::Prediction;

/// Bytes per f32 element.
pub const E: u64 = 4;

/// The shape of a case, in u64 for the arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub b: u64,
    pub s: u64,
    pub h: u64,
    pub a: u64,
    pub l: u64,
    pub v: u64,
    pub s_max: u64,
}

impl Shape {
    pub fn of(case: &Case) -> Self {
        Self {
            b: case.batch as u64,
            s: case.seq as u64,
            h: case.cfg.hidden as u64,
            a: case.cfg.heads as u64,
            l: case.cfg.layers as u64,
            v: case.cfg.vocab as u64,
            s_max: case.cfg.max_seq as u64,
        }
    }

    /// `P = 2VH + S_max·H + L(12H² + 13H) + 2H`.
    pub fn params(&self) -> u64 {
        let Shape { h, l, v, s_max, .. } = *self;
        2 * v * h + s_max * h + l * (12 * h * h + 13 * h) + 2 * h
    }

    /// Parameter tensors: 5 outside the blocks, 16 per block.
    pub fn param_tensors(&self) -> u64 {
        5 + 16 * self.l
    }

    /// Elements of the largest parameter tensor.
    pub fn largest_param(&self) -> u64 {
        let Shape { h, v, s_max, .. } = *self;
        (v * h).max(4 * h * h).max(s_max * h)
    }

    /// Weights after `init`: `e·P` plus metadata per variable.
    pub fn weights_bytes(&self) -> u64 {
        E * self.params() + META_PER_VAR * self.param_tensors()
    }

    /// Tensors the training forward keeps alive for backward (the graph), in bytes.
    pub fn activation_bytes(&self) -> u64 {
        let Shape { b, s, h, a, l, v, .. } = *self;
        let per_layer = 39 * b * s * h + 6 * a * b * s * s;
        E * (l * per_layer + 7 * b * s * h + 10 * b * s + 4 * b * s * v + 2)
            + GRAPH_META_PER_LAYER * l
            + GRAPH_META_FIXED
    }

    /// Gradients of all parameters: `e·P`.
    pub fn gradient_bytes(&self) -> u64 {
        E * self.params() + META_PER_VAR * self.param_tensors()
    }

    /// Optimizer state: AdamW keeps m and v (`2·e·P`); SGD nothing.
    pub fn optimizer_state_bytes(&self, opt: OptimizerKind) -> u64 {
        match opt {
            OptimizerKind::Sgd => 0,
            OptimizerKind::Adamw => 2 * E * self.params() + 2 * META_PER_VAR * self.param_tensors(),
        }
    }

    /// Peak temporaries of one optimizer step above its state and the gradients.
    pub fn optimizer_step_temp_bytes(&self, opt: OptimizerKind) -> u64 {
        let n = self.largest_param();
        match opt {
            OptimizerKind::Sgd => 2 * E * n,
            OptimizerKind::Adamw => 14 * E * n,
        }
    }

    /// Peak of backward above the kept activations.
    pub fn backward_extra_bytes(&self) -> u64 {
        let Shape { b, s, a, l, .. } = *self;
        self.gradient_bytes() + E * l * a * b * s * s
    }

    /// Inference (no graph) peak: the largest set of live intermediates.
    pub fn inference_peak_bytes(&self) -> u64 {
        let Shape { b, s, h, a, v, .. } = *self;
        E * (2 * b * s * h + 4 * a * b * s * s + 2 * a * b * s)
            .max(11 * b * s * h)
            .max(2 * b * s * h + b * s * v)
    }

    pub fn predict(&self, phase: Phase, opt: OptimizerKind) -> Prediction {
        let Shape { b, s, v, .. } = *self;
        match phase {
            Phase::Init => Prediction {
                peak_bytes: self.weights_bytes(),
                retained_bytes: self.weights_bytes() as i64,
            },
            Phase::Forward => Prediction {
                peak_bytes: self.activation_bytes(),
                retained_bytes: self.activation_bytes() as i64,
            },
            Phase::Backward => Prediction {
                peak_bytes: self.backward_extra_bytes(),
                retained_bytes: self.gradient_bytes() as i64,
            },
            Phase::Optimizer => Prediction {
                peak_bytes: self.optimizer_state_bytes(opt) + self.optimizer_step_temp_bytes(opt),
                retained_bytes: self.optimizer_state_bytes(opt) as i64,
            },
            Phase::TrainStep => Prediction {
                peak_bytes: (self.activation_bytes() + self.backward_extra_bytes())
                    .max(self.gradient_bytes() + self.optimizer_step_temp_bytes(opt)),
                retained_bytes: 0,
            },
            Phase::Inference => Prediction {
                peak_bytes: self.inference_peak_bytes(),
                retained_bytes: (E * b * s * v) as i64,
            },
        }
    }
}

/// Allocator metadata per `Var` (storage `Arc`, layout, shape).
pub const META_PER_VAR: u64 = 341;
/// Graph metadata per decoder block.
pub const GRAPH_META_PER_LAYER: u64 = 22_344;
/// Graph metadata outside the blocks.
pub const GRAPH_META_FIXED: u64 = 9_072;
