//! What a case holds at each phase's peak, split by component: the bars of `memfit predict
//! --plot` ([`crate::store::breakdown`] draws them).
//!
//! Each bar sums exactly to the prediction it splits:
//! - **train step**: the weights after init, the optimizer state, and the batch (`other`) before
//!   the window, then the step's predicted peak split as its timeline is at that peak
//!   ([`super::timeline::train_step`]: activations saved for the backward, temporaries,
//!   gradients; gemm's workspace and candle's bookkeeping in `other`) — the sum is
//!   [`Shape::train_total_bytes`];
//! - **inference**: the serving copy's weights (`--weights`) and the forward's peak
//!   (temporaries: nothing is kept);
//! - **prefill**: the serving weights, the KV cache the prompt leaves (`B` sequences of `S`
//!   tokens; a sliding layer keeps its window), and the rest of the window's peak (temporaries);
//! - **decode**: the serving weights, the cache at the last step (`S + T − 1` tokens per
//!   sequence; its tensors' bookkeeping and the step's token in `other`) and that step's peak
//!   above it.

use super::transformer::Shape;
use crate::step::{OptimizerKind, Phase};
use crate::workload::Case;

/// The components, in the bars' stacking order.
pub const COMPONENTS: [&str; 7] = [
    "weights",
    "optimizer state",
    "gradients",
    "activations",
    "KV cache",
    "temporaries",
    "other",
];

/// One phase's peak, by component (bytes per [`COMPONENTS`] entry).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Bar {
    pub phase: &'static str,
    pub bytes: [u64; 7],
}

impl Bar {
    pub fn total(&self) -> u64 {
        self.bytes.iter().sum()
    }
}

/// The bars of `case`'s phases among train step, inference, prefill and decode (the CPU's gemm
/// buffers for `threads` threads).
pub fn bars(case: &Case, threads: usize) -> Vec<Bar> {
    let shape = Shape::of(case);
    let opt = case.optimizer;
    let mut bars = Vec::new();
    if case.phases.contains(&Phase::TrainStep) {
        bars.push(train_step(&shape, opt, threads));
    }
    if shape.vision.is_some() {
        return bars;
    }
    let serving_weights = || shape.decode_step(1, threads).0;
    if case.phases.contains(&Phase::Inference) {
        let mut b = [0; 7];
        b[0] = serving_weights();
        b[5] = shape.predict(Phase::Inference, opt, threads).peak_bytes;
        bars.push(Bar {
            phase: "inference",
            bytes: b,
        });
    }
    if case.phases.contains(&Phase::Prefill) {
        let peak = shape.predict(Phase::Prefill, opt, threads).peak_bytes;
        let kv = shape.b * kv_bytes_per_sequence(&shape, shape.s);
        let mut b = [0; 7];
        (b[0], b[4], b[5]) = (serving_weights(), kv, peak.saturating_sub(kv));
        bars.push(Bar {
            phase: "prefill",
            bytes: b,
        });
    }
    if case.phases.contains(&Phase::Decode) {
        let last = shape.s + case.decode_tokens.max(1) as u64 - 1;
        let (w, cache, step) = shape.decode_step(last, threads);
        // The replay's cache figure carries its tensors' bookkeeping and the next token.
        let kv = shape.b * kv_bytes_per_sequence(&shape, last);
        let mut b = [0; 7];
        (b[0], b[4], b[5], b[6]) = (w, kv, step, cache.saturating_sub(kv));
        bars.push(Bar {
            phase: "decode",
            bytes: b,
        });
    }
    bars
}

/// The train step's bar: sums to `train_total_bytes`.
fn train_step(shape: &Shape, opt: OptimizerKind, threads: usize) -> Bar {
    use crate::timeline::{ACTIVATIONS, GRADIENTS, KV, TEMPORARIES};
    let t = super::timeline::train_step(shape, opt, threads);
    let (_, at) = t.peak();
    let mut b = [0; 7];
    b[0] = shape
        .predict(Phase::Init, opt, threads)
        .retained_bytes
        .max(0) as u64;
    b[1] = shape.optimizer_state_bytes(opt);
    b[6] = shape.input_bytes();
    if let Some(s) = t.samples.get(at) {
        // CATEGORIES: kv cache (none in training), activations, temporaries, gradients,
        // workspace, bookkeeping.
        let c = s.shown();
        b[3] = c[ACTIVATIONS] + c[KV];
        b[5] = c[TEMPORARIES];
        b[2] = c[GRADIENTS];
        b[6] += c[4] + c[5];
    }
    Bar {
        phase: "train step",
        bytes: b,
    }
}

/// What one sequence of `tokens` keeps in the cache: per layer, its window's tokens at most;
/// a linear layer (Qwen3-Next's) its fixed state instead ([`Shape::state_bytes_per_sequence`]).
pub fn kv_bytes_per_sequence(shape: &Shape, tokens: u64) -> u64 {
    let per_layer = shape.kv_bytes_per_token() / shape.cached_layers().max(1);
    let grown: u64 = (0..shape.l as usize)
        .filter(|&i| shape.llama.is_none_or(|l| l.linear_at(i).is_none()))
        .map(|i| {
            per_layer
                * shape
                    .llama
                    .and_then(|l| l.window_at(i))
                    .map_or(tokens, |w| tokens.min(w as u64))
        })
        .sum();
    grown + shape.state_bytes_per_sequence()
}
