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
//!   prefill,decode` measures it, its token table and head vocab-parallel
//!   ([`Shape::vocab_parallel`]: the masked lookup's rows and their all-reduced copy, `B·S·H`
//!   each, while the embedding runs; the last positions' logits gathered, vLLM's all-gather
//!   buffer and its moved copy, `B·V` each, before sampling). A mixture's experts split by
//!   width, MLA's heads split and its latents whole ([`parallel::shard`]); linear attention's
//!   activations under a split are not modelled ([`parallel::shard`] says why): their
//!   capacity is then unknown, never guessed.
//! - **KV capacity** under a budget (`--fit-in`, taken as given: vLLM's
//!   `gpu_memory_utilization`, 0.9 by default, is the caller's to apply, e.g. `--fit-in 72GiB`
//!   for 0.9 × 80 GiB): `free = budget − weights − prefill activations`,
//!   then [`budget::kv_capacity`] (per layer kind, as vLLM's allocator counts).
//!
//! **Expert parallelism** (`--parallel tp=T,ep=E`, vLLM's `--enable-expert-parallel` over
//! `E/T` data-parallel attention replicas of `T` ranks each, [`serve_rank_ep`]):
//! - **The layout**: vLLM's mixture-of-experts layers run over an expert-parallel group of all
//!   `tp·dp` ranks, each holding whole experts, none split by tensor parallelism
//!   (`FusedMoEParallelConfig.make` in `vllm/model_executor/layers/fused_moe/config.py`: with
//!   expert parallelism `ep_size = dp·tp`, the MoE's `tp_size = 1`). So `ep` must be a
//!   multiple of `tp` (`dp = ep/tp` attention replicas); anything else is refused by name, as
//!   is `ep > 1` on a dense model.
//! - **Weights**: the attention, the dense layers, the norms, the routers, the shared experts,
//!   the token table and the head as the tensor-parallel rank above holds them
//!   ([`parallel::stage_ranks`] at `tp`, its dense parameters: vLLM's shared experts are the
//!   model's MLP class, column- and row-parallel over `tp` like a dense MLP, whole at tp 1),
//!   except that with `tp > 1` and `dp > 1` vLLM runs the mixture sequence-parallel
//!   (`ParallelConfig.use_sequence_parallel_moe` in `vllm/config/parallel.py`: expert
//!   parallelism, tp > 1, dp > 1 and its default backend) and builds the shared experts with
//!   `disable_tp` (`DeepseekV2MLP` in `vllm/model_executor/models/deepseek_v2.py`: "the
//!   weights are replicated"; Qwen2-MoE's and Llama 4's shared experts alike), so there they
//!   are whole ([`parallel::shared_expert_params`]); the routed experts whole, `⌈E/ep⌉` of them a sparse layer: `determine_expert_map` in
//!   `vllm/model_executor/layers/fused_moe/layer.py` gives each rank `E // ep` and the first
//!   `E mod ep` ranks one more (its docstring says the last rank; its code gives them to the
//!   first), so the rank sized is the first, the worst. An expert's parameters come from
//!   [`parallel::stage_ranks`] at tp 1 and ep 1 (all `E` whole, over `E`): its own `ep` key
//!   splits each expert over `tp` too (Megatron-Core's expert tensor parallelism), which is not
//!   vLLM's, and counts `E/ep` (it refuses a remainder), so it is used where the two agree (tp
//!   1, `E` a multiple of `ep`: tested equal) and not beyond. No redundant experts (EPLB's
//!   `num_redundant_experts`, 0 by default). Their bytes are those of the serving copy, tensor
//!   by tensor at the rank's shapes ([`parallel::serving_weight_bytes`]): a quantized
//!   checkpoint's projections as shipped (DeepSeek-V3's FP8 blocks, gpt-oss's MXFP4 experts),
//!   as the single device's serving copy holds them.
//! - **KV cache**: as above at `tp` — each attention replica caches its own sequences.
//! - **Activations** at tp 1 (data-parallel attention, DeepSeek-V3's serving layout): the
//!   serving replay of the whole model holding the rank's experts
//!   ([`crate::formula::replay::replay_serving_ep`]), each mixture of experts' forward as vLLM's
//!   default all-to-all backend runs it (`allgather_reducescatter`, `ParallelConfig` in
//!   `vllm/config/parallel.py`; the naive, pplx and DeepEP backends are opt-in): the `dp`
//!   ranks' tokens all-gathered (`(ep·B·S, H)` fresh), the held experts on them, the output
//!   reduce-scattered home ([`crate::formula::replay::expert::Gathered`]). The gathered rows
//!   do not depend on the routing; what the experts do with them does: the routing `shape`
//!   asks (`--routing`, worst by default: every rank's tokens on the first `k` experts, the
//!   first rank's). The token-to-expert all-to-all of training (`parallel::shard_graph_ep`,
//!   its `expert_rows`) is not what vLLM serves with by default, so it is not used. The replay
//!   is memfit's mixture (expert by expert), not vLLM's fused-MoE kernels: their workspaces
//!   (sized over every gathered row's `k` slots) are not counted, as CUDA graphs and NCCL's
//!   buffers are not for the tp rank.
//! - **Activations** at tp > 1: the replay of the tp rank's shard (heads, K/V heads, the dense
//!   layers' width, the vocabulary; the shared experts' width too with one replica) with the
//!   routed experts whole, `g` after every sublayer, the table and head vocab-parallel
//!   ([`ep_shard`]). With one replica (`ep = tp`, vLLM's `-tp T --enable-expert-parallel`)
//!   nothing is gathered (vLLM dispatches only over dp > 1) and the mixture's output is
//!   all-reduced over tp, as vLLM does with `ep > 1`; with more, vLLM's sequence-parallel
//!   mixture: each rank's `⌈B·S/tp⌉` rows of the replicated tokens gathered over all `ep`
//!   ranks, reduce-scattered back and all-gathered over tp (`Gathered` with `tp`; memfit's `g`
//!   after it one `(B·S, H)` above vLLM). MLA splits its heads over tp, its latent whole. Linear
//!   attention split over tp is not modelled: `None`, and so the capacity, with the reason.

use super::budget;
use super::parallel::{self, Layout};
use super::shape::Shape;
use crate::model::config::Config;
use crate::step::{OptimizerKind, Phase};

/// One serving rank of `tp` (and `ep`), predicted.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ServeRank {
    pub tp: usize,
    /// Expert-parallel ranks (1: none; vLLM's `ep = tp·dp`) and the attention replicas `dp`.
    pub ep: usize,
    pub dp: usize,
    /// A mixture's routed experts this rank holds a sparse layer: with `ep > 1` whole experts,
    /// the first (worst) rank's `⌈E/ep⌉`; with `ep` 1 all `E`, each split `tp` ways. Absent for
    /// a dense model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub experts_per_rank: Option<usize>,
    /// Of [`Self::params`], the routed experts' (every sparse layer's).
    pub expert_params: u64,
    /// K/V heads this rank caches, and whether they are replicated (`G < tp`).
    pub kv_heads: usize,
    pub kv_replicated: bool,
    /// Parameters on the rank ([`parallel::stage_ranks`]).
    pub params: u64,
    /// The serving copy (`--weights`: `model`, `fp8`, `mxfp4-experts`, …; an FP8 checkpoint's
    /// default is `fp8`, as shipped) and the rank's weights in it, tensor by tensor
    /// ([`parallel::serving_weight_bytes`]: the block projections quantized as the single
    /// device's serving copy, the rest in the model's type; the rotary tables whole on every
    /// rank).
    pub weights: String,
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
    serve_rank_ep(cfg, shape, tp, 1, budget, threads)
}

/// The routed experts the worst rank of `ep` holds of `experts` (vLLM's
/// `determine_expert_map`: `E // ep` each, one more on the first `E mod ep`).
pub fn experts_per_rank(experts: usize, ep: usize) -> usize {
    experts.div_ceil(ep)
}

/// The attention replicas of a serving layout `tp × ep`, or why not: `ep` a multiple of
/// `tp` (vLLM's expert-parallel group is `tp·dp` ranks), a mixture of experts when `ep > 1`.
pub fn attention_replicas(cfg: &Config, tp: usize, ep: usize) -> Result<usize, String> {
    if ep == 1 {
        return Ok(1);
    }
    if cfg.llama.and_then(|l| l.moe).is_none() {
        return Err(format!(
            "--parallel ep={ep}: the model has no mixture of experts (expert parallelism splits a mixture's routed experts)"
        ));
    }
    if tp == 0 || !ep.is_multiple_of(tp) {
        return Err(format!(
            "--parallel tp={tp},ep={ep}: vLLM's expert-parallel group is tp × dp ranks (dp attention replicas of tp ranks each), so ep must be a multiple of tp"
        ));
    }
    Ok(ep / tp)
}

/// A serving rank of `tp` tensor-parallel ranks in an expert-parallel group of `ep`
/// ([module docs](self)) for the case of `cfg` and `shape`, with `budget` bytes a GPU.
pub fn serve_rank_ep(
    cfg: &Config,
    shape: &Shape,
    tp: usize,
    ep: usize,
    budget: Option<u64>,
    threads: usize,
) -> Result<ServeRank, String> {
    let dp = attention_replicas(cfg, tp, ep)?;
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
    let one_stage = |layout: &Layout| {
        parallel::stage_ranks(cfg, layout, (e, 0, 0), false)
            .into_iter()
            .next()
            .ok_or("--parallel: no stage")
    };
    let rank = one_stage(&layout)?;
    let moe = cfg.llama.and_then(|l| l.moe);
    // The routed experts: at ep 1 all E split tp ways (stage_ranks' share); with ep > 1 the
    // worst rank's ⌈E/ep⌉ whole (an expert's parameters: all E whole over E).
    let (experts, expert_params) = match moe {
        None => (None, 0),
        Some(_) if ep == 1 => (moe.map(|m| m.experts), rank.expert_params),
        Some(m) => {
            let whole = one_stage(&Layout::default())?.expert_params;
            if !whole.is_multiple_of(m.experts as u64) {
                return Err(format!(
                    "--parallel ep={ep}: the {} experts' {whole} parameters are not alike",
                    m.experts
                ));
            }
            let held = experts_per_rank(m.experts, ep);
            (Some(held), whole / m.experts as u64 * held as u64)
        }
    };
    // Shared experts: split over tp as a dense MLP, except under vLLM's sequence-parallel MoE
    // (expert parallelism with tp > 1 and dp > 1), which replicates them whole.
    let dense_params = if ep > 1 && tp > 1 && dp > 1 {
        rank.dense_params - parallel::shared_expert_params(cfg, tp)
            + parallel::shared_expert_params(cfg, 1)
    } else {
        rank.dense_params
    };
    let params = dense_params + expert_params;
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
    let mut out = ServeRank {
        tp,
        ep,
        dp,
        experts_per_rank: experts,
        expert_params,
        kv_heads,
        kv_replicated,
        params,
        weights: shape.serve.as_str().to_string(),
        weights_bytes: parallel::serving_weight_bytes(
            cfg,
            tp,
            parallel::ServingExperts {
                held_whole: (ep > 1).then_some(experts.unwrap_or(0)),
                shared_whole: ep > 1 && tp > 1 && dp > 1,
            },
            e,
            shape.serve,
        ) + shape.rotary_bytes(),
        kv_bytes_per_token: cached.kv_bytes_per_token(),
        kv_bytes_per_sequence,
        prefill_activation_bytes: None,
        decode_peak_bytes: None,
        inference_peak_bytes: None,
        activations_missing: None,
        kv_capacity_tokens: None,
        kv_capacity_sequences: None,
    };
    let activations = if ep > 1 {
        let served = match ep_shard(shape, tp, dp) {
            Ok(s) => s,
            Err(why) => {
                out.activations_missing = Some(why);
                return Ok(out);
            }
        };
        let held: Vec<usize> = (0..experts.unwrap_or(0)).collect();
        let sv = crate::formula::replay::replay_serving_ep(
            &served,
            served.meta(crate::formula::transformer::META_PER_TENSOR),
            served.cpu.then_some(threads),
            &held,
            tp,
            dp,
        );
        out.decode_peak_bytes = Some(sv.decode_peak);
        out.inference_peak_bytes = Some(sv.inference_peak);
        sv.prefill_peak.saturating_sub(sv.prefill_retained)
    } else {
        let served = match parallel::shard(shape, tp, shape.l as usize) {
            Ok(s) => Shape {
                tp_collectives: tp > 1,
                vocab_parallel: tp,
                ..s
            },
            Err(why) => {
                out.activations_missing = Some(why);
                return Ok(out);
            }
        };
        let at = |p: Phase| served.predict(p, OptimizerKind::Sgd, threads);
        let prefill = at(Phase::Prefill);
        out.decode_peak_bytes = Some(at(Phase::Decode).peak_bytes);
        out.inference_peak_bytes = Some(at(Phase::Inference).peak_bytes);
        prefill
            .peak_bytes
            .saturating_sub(prefill.retained_bytes.max(0) as u64)
    };
    out.prefill_activation_bytes = Some(activations);
    if let Some(b) = budget {
        let free = b.saturating_sub(out.weights_bytes + activations);
        let (tokens, sequences) = budget::kv_capacity(&cached, free);
        out.kv_capacity_tokens = Some(tokens);
        out.kv_capacity_sequences = Some(sequences);
    }
    Ok(out)
}

/// The model an expert-parallel serving rank of `tp` in `dp` replicas runs, or why not: at tp 1
/// the whole model (its experts set by the caller); at tp > 1 the heads, the K/V heads (one a
/// rank where fewer), the dense layers' width and the vocabulary split over tp, the routed
/// experts whole (their width the model's), each sublayer's output summed by `g` (the
/// mixture's too: with one replica vLLM all-reduces its output over the tp group when
/// `ep > 1`; with more it all-gathers the sequence-parallel chunks, as much); the shared
/// experts split over tp with one replica, whole with more (the sequence-parallel mixture's
/// `disable_tp`); MLA's heads split over tp (its up-projections and o by head), its
/// down-projections and latent cache whole on every rank (vLLM's `ReplicatedLinear`). Not
/// modelled: linear attention split over tp.
fn ep_shard(shape: &Shape, tp: usize, dp: usize) -> Result<Shape, String> {
    if shape.llama.is_some_and(|l| l.moe.is_none()) {
        return Err("expert parallelism on a model without a mixture of experts".into());
    }
    if tp == 1 {
        if shape.llama.is_none() {
            return Err("activations per rank are modelled for LLaMA-family decoders only".into());
        }
        return Ok(shape.clone());
    }
    let (attention, mut llama) = parallel::shard_attention(shape, tp)?;
    if let Some(m) = llama.moe.as_mut() {
        m.dense_width = parallel::split_width("dense layers' MLP width", m.dense_width, tp)?;
        // Under the sequence-parallel mixture (dp > 1) the shared experts are whole.
        if dp == 1 {
            m.shared = parallel::split_width("shared experts' width", m.shared, tp)?;
        }
    }
    Ok(Shape {
        llama: Some(llama),
        tp_collectives: true,
        vocab_parallel: tp,
        ..attention
    })
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

    /// vLLM's `determine_expert_map`: `E // ep` a rank, one more on the first `E mod ep`; the
    /// first rank is sized (DeepSeek-V3's 256 over 16: 16; Mixtral's 8 over 3: 3, 3, 2).
    #[test]
    fn the_worst_rank_holds_the_remainder() {
        assert_eq!(experts_per_rank(256, 16), 16);
        assert_eq!(experts_per_rank(128, 8), 16);
        assert_eq!(experts_per_rank(8, 3), 3);
        assert_eq!(experts_per_rank(10, 4), 3);
        assert_eq!(experts_per_rank(8, 8), 1);
        let vllm = |e: usize, ep: usize| -> Vec<usize> {
            (0..ep).map(|r| e / ep + usize::from(r < e % ep)).collect()
        };
        for (e, ep) in [(8, 3), (10, 4), (256, 16), (60, 8)] {
            let ranks = vllm(e, ep);
            assert_eq!(ranks.iter().sum::<usize>(), e);
            assert_eq!(ranks.iter().copied().max(), Some(experts_per_rank(e, ep)));
            assert_eq!(ranks[0], experts_per_rank(e, ep));
        }
    }

    fn config(name: &str) -> Config {
        let path = format!(
            "{}/workloads/configs/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap();
        crate::model::hf_config::parse(&text, &path).unwrap().cfg
    }

    /// A bf16 CUDA shape of `cfg` at B 1, S 256, decoding 4 tokens.
    fn shape(cfg: &Config) -> Shape {
        Shape {
            llama: cfg.llama,
            elem: crate::device::ElemType::Bf16,
            cpu: false,
            tied: cfg.tied,
            worst_routing: true,
            decode_tokens: 4,
            ..Shape::new(
                1,
                256,
                cfg.hidden as u64,
                cfg.heads as u64,
                cfg.layers as u64,
                cfg.vocab as u64,
                cfg.max_seq as u64,
            )
        }
    }

    /// Where `stage_ranks`' own `ep` means what vLLM's does (tp 1, the experts splitting evenly:
    /// `E/ep` whole experts a rank) the rank's experts are its; with a remainder one expert
    /// more than its floor; at tp > 1 the experts stay whole (stage_ranks' ep would split each
    /// over tp, Megatron-Core's expert tensor parallelism, not vLLM's).
    #[test]
    fn experts_whole_as_stage_ranks_counts_them_at_tp1() {
        let cfg = config("qwen3-30b-a3b");
        let s = shape(&cfg);
        for ep in [2, 4, 8, 16] {
            let r = serve_rank_ep(&cfg, &s, 1, ep, None, 1).unwrap();
            let layout = Layout {
                dp: ep,
                ep,
                ..Default::default()
            };
            let st = &parallel::stage_ranks(&cfg, &layout, (2, 0, 0), false)[0];
            assert_eq!(r.expert_params, st.expert_params, "ep={ep}");
            assert_eq!(r.params, st.params(), "ep={ep}");
            // The rank's weights are its parameters' and the rotary tables.
            assert_eq!(
                r.weights_bytes,
                st.weights_bytes + s.rotary_bytes(),
                "ep={ep}"
            );
        }
        // 128 over 12: the first 8 ranks 11, the rest 10.
        let r = serve_rank_ep(&cfg, &s, 1, 12, None, 1).unwrap();
        let expert = 48 * 3 * 2048 * 768;
        assert_eq!(
            (r.experts_per_rank, r.expert_params),
            (Some(11), 11 * expert)
        );
        // tp=2,ep=8: the dense part as the tp=2 rank holds it, 16 experts whole.
        let tp2 = serve_rank_ep(&cfg, &s, 2, 8, None, 1).unwrap();
        let dense2 = serve_rank(&cfg, &s, 2, None, 1).unwrap();
        assert_eq!(tp2.expert_params, 16 * expert);
        assert_eq!(
            tp2.params,
            dense2.params - dense2.expert_params + 16 * expert
        );
        assert_eq!(dense2.expert_params, 128 * expert / 2);
        assert!(tp2.activations_missing.is_none() && tp2.prefill_activation_bytes.is_some());
        assert!(tp2.kv_capacity_tokens.is_none()); // no budget
    }

    /// DeepSeek-V3's shared expert (`3·7168·2048` a sparse layer, 58 of them): split over tp
    /// at tp=2,ep=2 (dp 1, no sequence-parallel mixture), whole at tp=2,ep=4 (dp 2: vLLM's
    /// sequence-parallel mixture replicates it), whole at tp 1.
    #[test]
    fn shared_experts_whole_under_the_sequence_parallel_mixture() {
        let cfg = config("deepseek-v3");
        let shared: u64 = 58 * 3 * 7168 * 2048;
        assert_eq!(parallel::shared_expert_params(&cfg, 1), shared);
        assert_eq!(parallel::shared_expert_params(&cfg, 2), shared / 2);
        let s = shape(&cfg);
        let expert = shared; // a routed expert is the shared one's size
        let rank = |tp, ep| serve_rank_ep(&cfg, &s, tp, ep, None, 1).unwrap();
        let (dp1, dp2) = (rank(2, 2), rank(2, 4));
        assert_eq!(dp1.expert_params, 128 * expert);
        assert_eq!(dp2.expert_params, 64 * expert);
        let dense = |r: &ServeRank| r.params - r.expert_params;
        assert_eq!(dense(&dp2) - dense(&dp1), shared / 2);
        let tp2 = serve_rank(&cfg, &s, 2, None, 1).unwrap();
        assert_eq!(dense(&dp1), tp2.params - tp2.expert_params);
    }

    /// The shard of a tp rank under ep: heads, K/V heads, vocabulary split, the experts' width
    /// whole; the shared experts split with one replica, whole with more (Llama 4 Scout's, of
    /// width 8192); MLA's heads split, its latent ranks whole (DeepSeek-V3: 128 heads, 64 a
    /// rank at tp 2).
    #[test]
    fn ep_shard_splits_attention_keeps_experts_whole() {
        let cfg = config("qwen3-30b-a3b");
        let s = shape(&cfg);
        let r = ep_shard(&s, 4, 1).unwrap();
        let l = r.llama.unwrap();
        assert_eq!((r.a, l.kv_heads, r.v), (8, 1, 151_936 / 4));
        assert_eq!(l.intermediate, 768);
        assert!(r.tp_collectives && !s.tp_collectives);
        assert_eq!(ep_shard(&s, 1, 8).unwrap(), s);
        assert_eq!(ep_shard(&s, 4, 2).unwrap(), r);
        let scout = config("llama-4-scout-17b-16e");
        let shared = |dp| {
            let r = ep_shard(&shape(&scout), 2, dp).unwrap();
            r.llama.unwrap().moe.unwrap().shared
        };
        assert_eq!((shared(1), shared(2)), (4096, 8192));
        let ds = config("deepseek-v3");
        let d = ep_shard(&shape(&ds), 2, 1).unwrap();
        let dl = d.llama.unwrap();
        assert_eq!((d.a, dl.kv_heads), (64, 64));
        assert_eq!(dl.mla, ds.llama.unwrap().mla);
        let dense = config("llama-3-8b");
        assert!(ep_shard(&shape(&dense), 1, 2).is_err());
    }

    /// The serving layouts vLLM runs: `ep` a multiple of `tp` on a mixture, else refused.
    #[test]
    fn attention_replicas_are_ep_over_tp() {
        let moe = config("qwen3-30b-a3b");
        assert_eq!(attention_replicas(&moe, 1, 8), Ok(8));
        assert_eq!(attention_replicas(&moe, 2, 8), Ok(4));
        assert_eq!(attention_replicas(&moe, 4, 4), Ok(1));
        assert_eq!(attention_replicas(&moe, 4, 1), Ok(1));
        assert!(
            attention_replicas(&moe, 4, 6)
                .unwrap_err()
                .contains("multiple of tp")
        );
        let dense = config("llama-3-8b");
        assert!(
            attention_replicas(&dense, 1, 2)
                .unwrap_err()
                .contains("no mixture of experts")
        );
    }

    /// The expert-parallel rank's replay: the gathered tokens grow with the replicas, so the
    /// prefill's activations do; the worst routing holds more than the balanced one; the
    /// capacity is what the budget leaves over the cache a token.
    #[test]
    fn expert_parallel_activations_grow_with_the_replicas() {
        let cfg = config("qwen3-30b-a3b");
        let s = shape(&cfg);
        let budget = 72u64 << 30;
        let acts = |ep: usize, worst: bool| {
            let s = Shape {
                worst_routing: worst,
                ..s.clone()
            };
            serve_rank_ep(&cfg, &s, 1, ep, Some(budget), 1).unwrap()
        };
        let (two, eight) = (acts(2, true), acts(8, true));
        let a = |r: &ServeRank| r.prefill_activation_bytes.unwrap();
        assert!(a(&eight) > a(&two), "{} {}", a(&eight), a(&two));
        assert!(a(&eight) > a(&acts(8, false)));
        let free = budget - eight.weights_bytes - a(&eight);
        assert_eq!(
            eight.kv_capacity_tokens,
            Some(free / eight.kv_bytes_per_token)
        );
        assert!(eight.decode_peak_bytes.unwrap() > 0);
    }
}
