//! The budget answers: what fits in a memory budget, from the predictions alone — whether a
//! training step fits and the largest batch and sequence that would (`predict --fit-in`,
//! `max-batch`'s first guess), and serving's KV capacity and longest context (vLLM's
//! questions). Each is a search over the replay's totals ([`super::search::largest_within`]).

use super::search::largest_within;
use super::shape::Shape;
use crate::step::{OptimizerKind, Phase};

/// The largest batch tried (2²⁰ sequences).
pub const MAX_BATCH: u64 = 1 << 20;

/// Whether `fit`'s training step (weights, optimizer state, the batch and the step's peak)
/// fits in `budget`.
pub fn fits(fit: &Shape, budget: u64, optimizer: OptimizerKind, threads: usize) -> bool {
    fit.train_total_bytes(optimizer, threads) <= budget
}

/// The largest batch whose training step, with `extra` bytes beside it (`max-batch`'s measured
/// process part; 0 for the tensors alone), fits in `budget` (0: not even one sequence).
pub fn max_batch(
    fit: &Shape,
    budget: u64,
    optimizer: OptimizerKind,
    threads: usize,
    extra: i64,
) -> u64 {
    largest_within(MAX_BATCH, budget, |b| {
        let total = Shape { b, ..fit.clone() }.train_total_bytes(optimizer, threads);
        (total as i64 + extra).max(0) as u64
    })
}

/// The longest sequence (≤ the position table) whose training step fits in `budget` at `fit`'s
/// batch (0: not even one token).
pub fn max_seq(fit: &Shape, budget: u64, optimizer: OptimizerKind, threads: usize) -> u64 {
    largest_within(fit.s_max, budget, |s| {
        Shape { s, ..fit.clone() }.train_total_bytes(optimizer, threads)
    })
}

/// Serving a decoder: weights, cache and activations (all from the replay of the serving model).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Serving {
    /// How the serving copy holds its projections (`--weights`: `model`, `f16`, `q8_0`, …,
    /// `fp8`, `mxfp4`; an FP8 checkpoint's default is `fp8`, as shipped).
    pub weights: String,
    /// The serving copy's weights, with the rotary tables and metadata.
    pub weights_bytes: u64,
    /// `2 · L · kv_heads · head_dim · e` (MLA: `L · (kv_lora_rank + qk_rope_head_dim) · e`, the
    /// latent cache): what one cached token of one sequence costs.
    pub kv_bytes_per_token: u64,
    /// MLA: one cached token decompressed (keys and values per head, `L·A·(dq + dv)·e`,
    /// what transformers' cache keeps), the comparison for the latent cache memfit measures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_bytes_per_token_decompressed: Option<u64>,
    /// Qwen3-Next: what each sequence keeps in its linear layers whatever its length (the
    /// convolution's last inputs and the recurrent state, [`Shape::state_bytes_per_sequence`]),
    /// counted in `kv_bytes_per_sequence`; absent without linear layers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_bytes_per_sequence: Option<u64>,
    /// One sequence of `--seq` tokens in the cache: `min(seq, window) · kv_bytes_per_token`
    /// (per full layer), plus the linear layers' fixed state.
    pub kv_bytes_per_sequence: u64,
    /// A prefill of `--seq` (at the case's batch): its peak above the weights, minus the cache
    /// it leaves.
    pub prefill_activation_bytes: u64,
    /// With a budget: the tokens of context that fit in `budget − weights − prefill
    /// activations` across sequences of `--seq` tokens each, counted per layer kind as vLLM's
    /// hybrid allocator does: a sliding-window layer keeps at most its window of each sequence,
    /// so the capacity is `free · seq / kv_bytes_per_sequence` (`free / kv_bytes_per_token`
    /// without windows or when `--seq` is within every window; 0 when even the prefill does not
    /// fit).
    pub kv_capacity_tokens: Option<u64>,
    /// With a budget: how many sequences of `--seq` tokens fit at once, `free /
    /// kv_bytes_per_sequence` (vLLM's "maximum concurrency").
    pub kv_capacity_sequences: Option<u64>,
    /// With a budget: the longest context (cached tokens per sequence, ≤ the position table)
    /// at which one more decode step of the case's batch still fits, counting the step's own
    /// temporaries (the grown cache, the K/V repeated to the query heads, the scores); 0 when
    /// none fits.
    pub max_context: Option<u64>,
    /// One decode step's temporaries over a cache of `--seq` tokens per sequence (its peak
    /// above the weights and that cache). MLA: attending over the latent (the absorbed form).
    pub decode_step_bytes: u64,
    /// MLA: the same step in transformers' form, the whole cache decompressed through `kv_b`
    /// (`decompressed_decode`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_step_bytes_decompressed: Option<u64>,
    /// MLA with a budget: [`Serving::max_context`] in the decompressed form.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_context_decompressed: Option<u64>,
}

/// The serving answers of a decoder case (see [`Serving`]); the budget answers from `fit` (the
/// case with the routing they assume).
pub fn serving(shape: &Shape, fit: &Shape, threads: usize, budget: Option<u64>) -> Serving {
    let activations_of = |s: &Shape| {
        let prefill = s.predict(Phase::Prefill, OptimizerKind::Sgd, threads);
        let activations = prefill
            .peak_bytes
            .saturating_sub(prefill.retained_bytes.max(0) as u64);
        (prefill, activations)
    };
    let (_, activations) = activations_of(shape);
    let (weights, _, _) = shape.decode_step(1, threads);
    let per_token = shape.kv_bytes_per_token();
    // One more token must have a position: contexts up to S_max − 1; none when the prefill
    // itself does not fit.
    let max_context = |shape: &Shape, b: u64, prefill_peak: u64| {
        if weights + prefill_peak <= b {
            largest_within(shape.s_max.saturating_sub(1), b, |t| {
                let (w, cache, step) = shape.decode_step(t, threads);
                w + cache + step
            })
        } else {
            0
        }
    };
    // MLA: the same shape decoding in transformers' decompressed form.
    let decompressed = |s: &Shape| {
        let mut l = s.llama?;
        let mut m = l.mla?;
        m.decompressed_decode = true;
        l.mla = Some(m);
        Some(Shape {
            llama: Some(l),
            ..s.clone()
        })
    };
    let (capacity, sequences, context, context_decompressed) = match budget {
        None => (None, None, None, None),
        Some(b) => {
            let shape = fit;
            let (prefill, activations) = activations_of(shape);
            let free = b.saturating_sub(weights + activations);
            let (tokens, sequences) = kv_capacity(shape, free);
            let context = max_context(shape, b, prefill.peak_bytes);
            let other = decompressed(shape).map(|d| max_context(&d, b, prefill.peak_bytes));
            (Some(tokens), Some(sequences), Some(context), other)
        }
    };
    Serving {
        weights: shape.serve.as_str().to_string(),
        weights_bytes: weights,
        kv_bytes_per_token: per_token,
        kv_bytes_per_token_decompressed: shape.kv_bytes_per_token_decompressed(),
        // A sliding layer's window caps what one sequence keeps there (per-token bytes are the
        // same in every layer).
        state_bytes_per_sequence: Some(shape.state_bytes_per_sequence()).filter(|&b| b > 0),
        kv_bytes_per_sequence: crate::formula::breakdown::kv_bytes_per_sequence(shape, shape.s),
        prefill_activation_bytes: activations,
        kv_capacity_tokens: capacity,
        kv_capacity_sequences: sequences,
        max_context: context,
        decode_step_bytes: shape.decode_step(shape.s, threads).2,
        decode_step_bytes_decompressed: decompressed(shape).map(|d| d.decode_step(d.s, threads).2),
        max_context_decompressed: context_decompressed,
    }
}

/// `free` bytes of cache as `(tokens, sequences)` of `shape.s` tokens each, per layer kind:
/// each sliding-window layer keeps `min(seq, window)` tokens of a sequence, a full layer all of
/// them (see [`Serving::kv_capacity_tokens`]).
pub fn kv_capacity(shape: &Shape, free: u64) -> (u64, u64) {
    let per_sequence = crate::formula::breakdown::kv_bytes_per_sequence(shape, shape.s);
    if per_sequence == 0 {
        return (0, 0);
    }
    let tokens = (free as u128 * shape.s as u128 / per_sequence as u128) as u64;
    (tokens, free / per_sequence)
}
