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

    /// Weights after `init`: `e·P` plus the `VarMap`'s metadata (names, `Var`s, hash table).
    pub fn weights_bytes(&self) -> u64 {
        E * self.params() + INIT_META_FIXED + INIT_META_PER_LAYER * self.l
    }

    /// Tensors the training forward keeps alive for backward (the graph), in bytes.
    ///
    /// Per block, in floats: LayerNorm (`layer_norm_slow`) 5·BSH + 6·BS each; q/k/v matmul and
    /// bias 6·BSH; head split `contiguous()` copies 3·BSH and the head merge 1·BSH (both skipped
    /// when A = 1, where the transposes are already contiguous); scores q·kᵀ, scale, mask add and
    /// the composed softmax (diff, exp, quotient) 6·A·B·S², its max and sum 2·A·B·S; attn×v,
    /// o-proj and bias, residual 4·BSH; fc1 + bias 8·BSH, GELU 4·BSH, fc2 + bias + residual 3·BSH.
    /// Total 39·BSH + 6·ABS² + 2·ABS + 12·BS (35·BSH when A = 1).
    /// Outside the blocks: embedding + position add 2·BSH, final LayerNorm 5·BSH + 6·BS, logits
    /// and log-softmax 4·BSV + 4·BS, the S² causal mask; plus graph metadata.
    pub fn activation_bytes(&self) -> u64 {
        let Shape {
            b, s, h, a, l, v, ..
        } = *self;
        let copies = if a == 1 { 0 } else { 4 * b * s * h };
        let per_layer = 35 * b * s * h + copies + 6 * a * b * s * s + 2 * a * b * s + 12 * b * s;
        E * (l * per_layer + 7 * b * s * h + s * s + 4 * b * s * v + 10 * b * s)
            + GRAPH_META_FIXED
            + GRAPH_META_PER_LAYER * l
    }

    /// Gradients of all parameters after pruning the store: `e·P` plus metadata.
    pub fn gradient_bytes(&self) -> u64 {
        E * self.params() + GRAD_META_FIXED + GRAD_META_PER_LAYER * self.l
    }

    /// Optimizer state: AdamW keeps m and v (`2·e·P`); SGD nothing.
    pub fn optimizer_state_bytes(&self, opt: OptimizerKind) -> u64 {
        match opt {
            OptimizerKind::Sgd => 0,
            OptimizerKind::Adamw => {
                2 * E * self.params() + 2 * INIT_META_PER_VAR * self.param_tensors()
            }
        }
    }

    /// Peak temporaries of one optimizer step: candle's AdamW builds its update from unfused
    /// per-tensor ops whose results stay referenced until the parameter is written, 14 tensors
    /// the size of the largest parameter; SGD's `θ − lr·g` needs 2.
    pub fn optimizer_step_temp_bytes(&self, opt: OptimizerKind) -> u64 {
        let n = self.largest_param();
        match opt {
            OptimizerKind::Sgd => 2 * E * n,
            OptimizerKind::Adamw => 14 * E * n + OPT_META_FIXED + OPT_META_PER_LAYER * self.l,
        }
    }

    /// Backward peak above the kept activations: the larger of two points.
    ///
    /// * Head (derived, exact to ≈ 2 KiB when it dominates): the cross-entropy and log-softmax
    ///   backward hold 7 tensors of `B·S·V` at once (the gradient being processed, the
    ///   accumulated gradients of both `broadcast_sub` operands, and `or_insert`'s zero tensors
    ///   that `add` replaces): `7·e·BSV`.
    /// * Tail (provisional least-squares fit over 12 medium configs, error up to ±46 %): near
    ///   the embedding, all parameter gradients exist, plus candle's leftover gradients of the
    ///   constant causal mask (`e·L·A·B·S²`) and per-op temporaries. Deriving this point op by
    ///   op is open work.
    pub fn backward_peak_bytes(&self) -> u64 {
        let Shape {
            b, s, h, a, l, v, ..
        } = *self;
        let head = 7 * E * b * s * v + BACKWARD_HEAD_META;
        let tail = 0.822 * (E * self.params()) as f64
            + 1.482 * (E * l * a * b * s * s) as f64
            + 2.693 * (E * v * h) as f64
            + 67.907 * (E * b * s * h) as f64
            + 0.293 * (E * a * b * s * s) as f64;
        head.max(tail.round() as u64)
    }

    /// Inference (no graph) peak, provisional: the larger of the head (logits `BSV` beside the
    /// final hidden states) and an attention block (scores and probabilities `ABS²` beside a
    /// handful of `BSH` tensors).
    pub fn inference_peak_bytes(&self) -> u64 {
        let Shape { b, s, h, a, v, .. } = *self;
        E * (b * s * v + 4 * b * s * h + 2 * b * s)
            .max(13 * b * s * h + 4 * a * b * s * s + 2 * a * b * s)
    }

    pub fn predict(&self, phase: Phase, opt: OptimizerKind) -> Prediction {
        let Shape { b, s, v, .. } = *self;
        let step = self.gradient_bytes() + self.optimizer_step_temp_bytes(opt);
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
                peak_bytes: self.backward_peak_bytes(),
                retained_bytes: self.gradient_bytes() as i64,
            },
            Phase::Optimizer => Prediction {
                // The state's own metadata is inside the step's fitted metadata constant.
                peak_bytes: match opt {
                    OptimizerKind::Sgd => 0,
                    OptimizerKind::Adamw => 2 * E * self.params(),
                } + self.optimizer_step_temp_bytes(opt),
                retained_bytes: self.optimizer_state_bytes(opt) as i64,
            },
            Phase::TrainStep => Prediction {
                peak_bytes: (self.activation_bytes() + self.backward_peak_bytes()).max(step),
                retained_bytes: 0,
            },
            Phase::Inference => Prediction {
                peak_bytes: self.inference_peak_bytes(),
                retained_bytes: (E * b * s * v) as i64,
            },
        }
    }
}

// Metadata constants: fitted on the measured residuals (bytes the allocator sees beyond the
// tensor data: `Arc`s, layouts, shapes, graph nodes, `VarMap` names and hash table). They are
// small next to any real model and are documented, not derived.

/// `VarMap` + model metadata outside the blocks (measured 7,324 B at L = 1, 16,908 B at L = 3).
pub const INIT_META_FIXED: u64 = 2_500;
/// `VarMap` + model metadata per block.
pub const INIT_META_PER_LAYER: u64 = 4_800;
/// Metadata per parameter tensor of a `Var` created by an optimizer.
pub const INIT_META_PER_VAR: u64 = 272;
/// Graph metadata outside the blocks (fit, residual ≤ 2.2 KiB over 40 configs).
pub const GRAPH_META_FIXED: u64 = 8_890;
/// Graph metadata per block.
pub const GRAPH_META_PER_LAYER: u64 = 22_270;
/// Gradient-store metadata (measured 5,840 B at L = 1; +4,420 B per block).
pub const GRAD_META_FIXED: u64 = 1_420;
/// Gradient-store metadata per block.
pub const GRAD_META_PER_LAYER: u64 = 4_420;
/// AdamW step metadata (measured 14,912 B at L = 1, 23,712 B at L = 2, 41,312 B at L = 4).
pub const OPT_META_FIXED: u64 = 6_112;
/// AdamW step metadata per block.
pub const OPT_META_PER_LAYER: u64 = 8_800;
/// Metadata of the backward head point.
pub const BACKWARD_HEAD_META: u64 = 4_108;
