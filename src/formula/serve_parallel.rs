//! Serving with tensor parallelism at any scale (issue 53; `memfit predict --parallel tp=T
//! --phases prefill,decode [--fit-in B]`): what one rank of a vLLM-style tensor-parallel
//! server holds, predicted.
//!
//! - **Weights**: [`parallel::stage_ranks`] at `tp` in the serving copy's element type: the
//!   column-parallel projections by rows, the row-parallel ones by columns, the norms whole, the
//!   token table and the head vocab-parallel (`⌈V/tp⌉` rows: vLLM's `VocabParallelEmbedding`
//!   and `ParallelLMHead`; vLLM first pads `V` to a multiple of 64, the same for every preset
//!   whose `V` is one), a mixture's experts each split `tp` ways (vLLM's default without
//!   `--enable-expert-parallel`).
//! - **KV cache**: a rank caches its `G/tp` K/V heads; where `G < tp` vLLM replicates them,
//!   one a rank (`tp` a multiple of `G`; anything else vLLM refuses, and so does this). MLA's
//!   latent is not split by heads: every rank caches the whole latent.
//! - **Activations**: the serving replay of the rank's shard ([`parallel::shard`]: heads, K/V
//!   heads, the MLP's width and the vocabulary split) with Megatron's `g` after each
//!   row-parallel projection ([`Shape::tp_collectives`]), as `ranks --tp --phases
//!   prefill,decode` measures it; beside it, added whole (an upper bound), what the shard's
//!   replay does not hold: the vocab-parallel embedding's all-reduced output (`B·S·H`) and the
//!   last positions' logits gathered whole for sampling (`B·V`). A mixture of experts' or
//!   MLA's activations under a split are not modelled ([`parallel::shard`] says why): their
//!   capacity is then unknown, never guessed.
//! - **KV capacity** under a budget (`--fit-in`, taken as given: vLLM's
//!   `gpu_memory_utilization`, 0.9 by default, is the caller's to apply, e.g. `--fit-in 72GiB`
//!   for 0.9 × 80 GiB): `free = budget − weights − prefill activations − the extras above`,
//!   then [`budget::kv_capacity`] (per layer kind, as vLLM's allocator counts).

use super::budget;
use super::parallel::{self, Layout};
use super::shape::Shape;
use crate::model::config::Config;
use crate::step::{OptimizerKind, Phase};

/// One serving rank of `tp`, predicted.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ServeRank {
    pub tp: usize,
    /// K/V heads this rank caches, and whether they are replicated (`G < tp`).
    pub kv_heads: usize,
    pub kv_replicated: bool,
    /// Parameters on the rank ([`parallel::stage_ranks`]) and their bytes in the serving
    /// copy's type.
    pub params: u64,
    pub weights_bytes: u64,
    /// One cached token of one sequence on this rank.
    pub kv_bytes_per_token: u64,
    /// One sequence of `--seq` tokens in this rank's cache (sliding layers capped at their
    /// window).
    pub kv_bytes_per_sequence: u64,
    /// The prefill's peak above the weights minus the cache it leaves, from the replay of the
    /// shard (`None`: not modelled, [`Self::activations_missing`] says why).
    pub prefill_activation_bytes: Option<u64>,
    /// The decode window's peak above its start (`--decode-tokens` tokens from the prompt).
    pub decode_peak_bytes: Option<u64>,
    /// The inference forward's peak (all `S` positions' logits, `⌈V/tp⌉` wide).
    pub inference_peak_bytes: Option<u64>,
    /// Not in the shard's replay, added whole to the prefill: the embedding's all-reduced
    /// output `B·S·H` and the gathered logits `B·V`, in the serving type.
    pub collective_bytes: u64,
    /// Why the activations (and so the capacity) are unknown.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activations_missing: Option<String>,
    /// With a budget: the cached tokens and sequences of `--seq` that fit on the rank.
    pub kv_capacity_tokens: Option<u64>,
    pub kv_capacity_sequences: Option<u64>,
}

/// K/V heads a rank of `tp` caches of `kv` (vLLM's split: `kv/tp` when `tp` divides `kv`, one
/// replicated when `kv` divides `tp`), or why not.
pub fn kv_heads_per_rank(kv: usize, tp: usize) -> Result<(usize, bool), String> {
    if kv.is_multiple_of(tp) {
        Ok((kv / tp, false))
    } else if tp.is_multiple_of(kv) {
        Ok((1, true))
    } else {
        Err(format!(
            "--parallel tp={tp}: {kv} K/V heads neither split into {tp} equal parts nor divide {tp} (vLLM replicates K/V heads only when tp is a multiple of them)"
        ))
    }
}

/// A serving rank of `tp` for the case of `cfg` and `shape`, with `budget` bytes a GPU.
pub fn serve_rank(
    cfg: &Config,
    shape: &Shape,
    tp: usize,
    budget: Option<u64>,
    threads: usize,
) -> Result<ServeRank, String> {
    if tp == 0 || !(shape.a as usize).is_multiple_of(tp) {
        return Err(format!(
            "--parallel tp={tp}: the {} attention heads do not split into {tp} equal parts",
            shape.a
        ));
    }
    let mla = shape.llama.and_then(|l| l.mla).is_some();
    let (kv_heads, kv_replicated) = if mla {
        (cfg.kv_heads(), false)
    } else {
        kv_heads_per_rank(cfg.kv_heads(), tp)?
    };
    let e = shape.kv_elem_bytes();
    let layout = Layout {
        tp,
        ..Default::default()
    };
    let rank = parallel::stage_ranks(cfg, &layout, (e, 0, 0), false)
        .into_iter()
        .next()
        .ok_or("--parallel: no stage")?;
    // This rank's cache: its K/V heads (MLA: the whole latent).
    let cached = Shape {
        llama: shape.llama.map(|mut l| {
            if !mla {
                l.kv_heads = kv_heads;
            }
            l
        }),
        ..shape.clone()
    };
    let kv_bytes_per_sequence = super::breakdown::kv_bytes_per_sequence(&cached, shape.s);
    // One GPU: no all-reduce, nothing gathered.
    let collective_bytes = if tp > 1 {
        e * shape.b * (shape.s * shape.h + shape.v)
    } else {
        0
    };
    let mut out = ServeRank {
        tp,
        kv_heads,
        kv_replicated,
        params: rank.params(),
        weights_bytes: rank.weights_bytes,
        kv_bytes_per_token: cached.kv_bytes_per_token(),
        kv_bytes_per_sequence,
        prefill_activation_bytes: None,
        decode_peak_bytes: None,
        inference_peak_bytes: None,
        collective_bytes,
        activations_missing: None,
        kv_capacity_tokens: None,
        kv_capacity_sequences: None,
    };
    let served = match parallel::shard(shape, tp, shape.l as usize) {
        Ok(s) => Shape {
            tp_collectives: tp > 1,
            ..s
        },
        Err(why) => {
            out.activations_missing = Some(why);
            return Ok(out);
        }
    };
    let at = |p: Phase| served.predict(p, OptimizerKind::Sgd, threads);
    let prefill = at(Phase::Prefill);
    let activations = prefill
        .peak_bytes
        .saturating_sub(prefill.retained_bytes.max(0) as u64);
    out.prefill_activation_bytes = Some(activations);
    out.decode_peak_bytes = Some(at(Phase::Decode).peak_bytes);
    out.inference_peak_bytes = Some(at(Phase::Inference).peak_bytes);
    if let Some(b) = budget {
        let free = b.saturating_sub(out.weights_bytes + activations + collective_bytes);
        let (tokens, sequences) = budget::kv_capacity(&cached, free);
        out.kv_capacity_tokens = Some(tokens);
        out.kv_capacity_sequences = Some(sequences);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// vLLM's rule: `G/tp` when `tp` divides `G`, one replicated when `G` divides `tp`, else
    /// refused (Llama-2-70B's 8 at tp 8: 1; Qwen3-30B-A3B's 4 at tp 8: 1, replicated).
    #[test]
    fn kv_heads_split_or_replicate_as_vllm() {
        assert_eq!(kv_heads_per_rank(8, 8), Ok((1, false)));
        assert_eq!(kv_heads_per_rank(8, 2), Ok((4, false)));
        assert_eq!(kv_heads_per_rank(4, 8), Ok((1, true)));
        assert_eq!(kv_heads_per_rank(1, 4), Ok((1, true)));
        assert!(kv_heads_per_rank(3, 2).unwrap_err().contains("3 K/V heads"));
        assert!(kv_heads_per_rank(6, 4).is_err());
    }
}
