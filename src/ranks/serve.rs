//! Serving with tensor parallelism on real ranks (issue 53), as vLLM runs a dense decoder over
//! `N` GPUs: each rank holds one Megatron-style shard of every block ([`super::tensor`]'s
//! split, by name, of the whole model's deterministic fill: its `A/N` query heads, its `G/N`
//! K/V heads, its `I/N` MLP columns), caches only its own K/V heads, and every rank serves the
//! same batch. The serving forward is the model's own cached generation
//! ([`crate::phase::generate`]) with Megatron's collectives around each sublayer
//! ([`Megatron`]): `f` is the identity (no graph, nothing copied), `g` all-reduces the
//! row-parallel projection's partial output into a fresh tensor before the residual sum
//! (vLLM's `tensor_model_parallel_all_reduce` after `RowParallelLinear`).
//!
//! The windows of a rank: `init` (the shard built), `prefill` (the prompt `B×S` into the
//! cache; the greedy next token kept) and `decode` (`--decode-tokens` greedy tokens over the
//! cache), each measured by the counting allocator relative to its start (the process's
//! resident set beside, MPI's buffers in it) and predicted by the replay of the rank's shard
//! with the same collectives ([`crate::formula::shape::Shape::tp_collectives`]).
//!
//! The token table and the LM head are vocab-parallel, as vLLM's `VocabParallelEmbedding` and
//! `ParallelLMHead` hold them (the training rank's split, [`super::tensor::MegatronVocab`]):
//! rank `r` holds rows `r·V/N..(r+1)·V/N`, looks up the tokens of its run (zeros for the
//! others) and all-reduces the rows, and its head computes its `V/N` logits of the last
//! positions, which every rank gathers (`LogitsProcessor`'s all-gather: the ranks' blocks into
//! a `(N, B, V/N)` buffer, then moved into the `(B, V)` logits) before sampling.
//!
//! What is not vLLM's here, by name: K/V heads that do not split into `N` equal parts are
//! refused, not replicated; a vocabulary that does not split into `N` equal runs is refused,
//! not padded; f32 on the CPU, no paged cache (the cache is candle's concatenated tensors,
//! grown a token at a time).

use std::rc::Rc;

use anyhow::ensure;
use candle_core::Tensor;

use super::comm::Comm;
use super::tensor::{Megatron, ShardStart, check_tp, megatron_rank, start_shard, train_shape};
use super::{RankReport, States, window};
use crate::device::ServingWeights;
use crate::meter::rusage::{vm_hwm_bytes, vm_rss_bytes};
use crate::model::transformer::{KvCache, Transformer};
use crate::phase::generate;
use crate::step::{OptimizerKind, Phase};
use crate::workload::Case;

/// The windows of a serving rank, in order.
pub const WINDOWS: [&str; 3] = ["init", "prefill", "decode"];

/// What a serving rank run is asked.
#[derive(Debug, Clone, Copy)]
pub struct ServePlan {
    /// After the windows, also run one process's whole model on the same prompt and compare
    /// the logits.
    pub check: bool,
    /// CPU threads (the replay's gemm packing buffers).
    pub threads: usize,
    /// `g` all-reduces (false only to show that the check catches its absence:
    /// `--tp-skip-g-all-reduce`).
    pub g_all_reduce: bool,
}

/// A serving rank's cache and check, beside its [`RankReport`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ServeRank {
    /// K/V heads this rank caches (of the model's `kv_heads`).
    pub kv_heads: usize,
    /// Bytes one cached token of one sequence costs on this rank, `2·L·(G/N)·D·4`.
    pub kv_bytes_per_token: u64,
    /// The cache's tensors' data after the prefill (`B·S` tokens) and after the decode
    /// (`B·(S + T)` with a cache; `B·S` without, the decode recomputing the prefix on caches of
    /// its own), measured from
    /// the cache's tensors, and predicted (`kv_bytes_per_token × tokens`).
    pub kv_cache_bytes_after_prefill: u64,
    pub predicted_kv_cache_bytes_after_prefill: u64,
    pub kv_cache_bytes_after_decode: u64,
    pub predicted_kv_cache_bytes_after_decode: u64,
    /// `‖z_rank − z_single‖ / ‖z_single‖` over the prefill's logits (the last position, all
    /// `V`: every rank gathers them from the ranks' runs) and one cached decode step's,
    /// against one process's whole model on the same prompt and token; `None` without
    /// `--check`.
    pub logits_rel_diff: Option<f64>,
}

/// The serving part of a [`super::RanksDoc`] (`ranks --tp N --phases prefill,decode`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Serve {
    /// Tokens the decode window generates (`--decode-tokens`), and whether with a cache.
    pub decode_tokens: usize,
    pub kv_cache: bool,
    /// `g` all-reduced (false: the `--tp-skip-g-all-reduce` mutation, the check's target).
    pub g_all_reduce: bool,
    /// Every rank's, by rank.
    pub ranks: Vec<ServeRank>,
}

/// Whether `case` asks for serving phases (and then none other than `init`).
pub fn serves(case: &Case) -> bool {
    case.phases
        .iter()
        .any(|p| matches!(p, Phase::Prefill | Phase::Decode))
}

/// Refuses what a serving rank does not run, by name (beside [`check_tp`]'s refusals).
pub fn check_serve(case: &Case, tp: usize) -> anyhow::Result<()> {
    ensure!(
        tp >= 2,
        "ranks --phases prefill,decode: serving on ranks runs with --tp N (2 or more); give --tp"
    );
    ensure!(
        case.phases
            .iter()
            .all(|p| matches!(p, Phase::Init | Phase::Prefill | Phase::Decode)),
        "ranks --tp {tp} --phases: serving on ranks runs init, prefill and decode; training phases run without prefill or decode (another run)"
    );
    ensure!(
        case.phases.contains(&Phase::Prefill),
        "ranks --tp {tp} --phases: decode needs prefill (the prompt into the cache); add prefill"
    );
    ensure!(
        case.weights == ServingWeights::Model,
        "ranks --tp {tp} --weights {}: a serving rank serves the model's own f32 weights (--weights model)",
        case.weights.as_str()
    );
    super::check_case(case, 0)?;
    check_tp(case, tp)
}

/// Runs one serving rank of `case` over `comm` (every rank of the world one shard): its
/// `init`, `prefill` and `decode` windows, measured and predicted, and its cache and check.
pub fn run_serve_rank(
    case: &Case,
    plan: ServePlan,
    comm: Rc<dyn Comm>,
) -> anyhow::Result<(RankReport, ServeRank)> {
    let (rank, tp) = (comm.rank(), comm.size());
    check_serve(case, tp)?;
    let mut measured = Vec::with_capacity(WINDOWS.len());
    // Every rank serves the same prompt of `B` rows; `init` builds the shard.
    let ShardStart {
        shard,
        _group,
        tokens,
        varmap,
        model,
        ..
    } = start_shard(case, &comm, &super::comm::Solo, &mut measured)?;
    // The serving copy (views of the same storage: nothing allocated), made before the windows.
    let megatron = Megatron {
        f_all_reduce: true,
        g_all_reduce: plan.g_all_reduce,
        release: case.cfg.kernels.fused(),
        sequence: None,
    };
    let serving = megatron_rank(model.detached(), case, megatron, (rank, tp));

    // prefill, decode (as `memfit run`'s runner: `phase::generate`)
    let mut cache = KvCache::default();
    comm.barrier();
    let (next, p, r, s) = window(|| Ok(generate::prefill(&serving, &tokens, &mut cache)?))?;
    measured.push((p, r, s, vm_rss_bytes()));
    let after_prefill = cache_bytes(&cache)?;
    let mut prefix = tokens.clone();
    comm.barrier();
    let (last, p, r, s) = window(|| {
        Ok(generate::decode(
            &serving,
            next,
            &mut prefix,
            &mut cache,
            case.decode_tokens,
            case.kv_cache,
        )?)
    })?;
    measured.push((p, r, s, vm_rss_bytes()));
    let after_decode = cache_bytes(&cache)?;
    drop((last, prefix, cache));

    let logits_rel_diff = plan
        .check
        .then(|| check_logits(case, &serving, &tokens))
        .transpose()?;
    let predicted = predict_serve_windows(case, tp, plan.threads)?;
    let windows = super::windows_of(&measured, &predicted);
    let per_token = serve_shape(case, tp)?.kv_bytes_per_token();
    let bs = (case.batch * case.seq) as u64;
    // Without a cache the decode recomputes the prefix on caches of its own: the prefill's
    // stays as it was.
    let decoded = if case.kv_cache {
        bs + (case.batch * case.decode_tokens) as u64
    } else {
        bs
    };
    let serve = ServeRank {
        kv_heads: shard.cfg.llama.map_or(shard.cfg.heads, |l| l.kv_heads),
        kv_bytes_per_token: per_token,
        kv_cache_bytes_after_prefill: after_prefill,
        predicted_kv_cache_bytes_after_prefill: per_token * bs,
        kv_cache_bytes_after_decode: after_decode,
        predicted_kv_cache_bytes_after_decode: per_token * decoded,
        logits_rel_diff,
    };
    let (weights, _, _) = super::tensor::predicted_tp_states(case, tp, (4, 0, 0))?;
    let states = States {
        weights_bytes: windows[0].retained_bytes,
        gradient_bytes: 0,
        optimizer_state_bytes: 0,
        predicted_weights_bytes: weights,
        predicted_gradient_bytes: 0,
        predicted_optimizer_state_bytes: 0,
        host: None,
    };
    drop((serving, model, varmap));
    let report = RankReport {
        rank,
        ranks: tp,
        zero: 0,
        tp,
        ep: 1,
        windows,
        states,
        rss_peak_bytes: vm_hwm_bytes(),
        check: None,
    };
    Ok((report, serve))
}

/// The data bytes of the cache's tensors.
fn cache_bytes(cache: &KvCache) -> anyhow::Result<u64> {
    Ok(cache
        .layers
        .iter()
        .flatten()
        .map(|(k, v)| 4 * (k.elem_count() + v.elem_count()) as u64)
        .sum())
}

/// The replay's shape of a serving rank of `tp`: the training rank's ([`train_shape`]: the
/// shard with its collectives and its run of the vocabulary), whose serving replay gathers the
/// last positions' logits.
pub fn serve_shape(case: &Case, tp: usize) -> anyhow::Result<crate::formula::shape::Shape> {
    train_shape(case, tp, false)
}

/// Each window's (peak, retained) predicted for a serving rank of `tp`: `init` the shard's
/// model built (as the training rank's), `prefill` and `decode` the serving replay of the shard
/// with its collectives ([`serve_shape`]).
pub fn predict_serve_windows(
    case: &Case,
    tp: usize,
    threads: usize,
) -> anyhow::Result<Vec<(u64, i64)>> {
    let shape = serve_shape(case, tp)?;
    let at = |p: Phase| {
        let w = shape.predict(p, OptimizerKind::Sgd, threads);
        (w.peak_bytes, w.retained_bytes)
    };
    Ok(vec![at(Phase::Init), at(Phase::Prefill), at(Phase::Decode)])
}

/// This rank's logits against one process's whole model (the same deterministic fill) on the
/// same prompt: the prefill's (the last position's, `(B, V)`) and one cached decode step's
/// (the one process's greedy token fed to both), as one relative difference.
fn check_logits(case: &Case, serving: &Transformer, tokens: &Tensor) -> anyhow::Result<f64> {
    let whole = super::Single::new(case, 1)?;
    let reference = whole.model.detached();
    let (mut mine, mut theirs) = (KvCache::default(), KvCache::default());
    let a = serving.forward_cached(tokens, &mut mine)?;
    let b = reference.forward_cached(tokens, &mut theirs)?;
    let next = b.argmax(candle_core::D::Minus1)?.unsqueeze(1)?;
    let a2 = serving.forward_cached(&next, &mut mine)?;
    let b2 = reference.forward_cached(&next, &mut theirs)?;
    let mut sums = (0f64, 0f64);
    for (x, y) in [(a, b), (a2, b2)] {
        super::add_sums(
            &mut sums,
            &x.flatten_all()?.to_vec1::<f32>()?,
            &y.flatten_all()?.to_vec1::<f32>()?,
        );
    }
    Ok(super::rel(sums))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ranks::tensor::rank_shape;
    use crate::workload;

    fn case(toml: &str) -> Case {
        let file = workload::parse(toml, "test").unwrap();
        workload::expand(&file, &Default::default(), "test")
            .unwrap()
            .remove(0)
    }

    /// The serving replay of a rank runs `g`: each sublayer's partial output and its reduced
    /// copy live at once, then the reduced copy and the sum, where the single device's fused
    /// projection-and-sum makes one output. Where the MLP is narrow (I/tp = 64 under H = 256)
    /// that is the prefill's peak: above the shard's replay without the collectives by most of
    /// one `B·S·H` (measured on 2 ranks: 756,032 B against 755,824 predicted, 658,000 without
    /// `g`; `tests/ranks.rs` runs it); where the MLP is wide (the small LLaMA's and SmolLM2's
    /// widths) the peak is elsewhere and the two agree.
    #[test]
    fn the_serving_replay_of_a_rank_runs_g() {
        let grid = |shape: &str| {
            format!(
                "[[grid]]\nmodel = \"llama\"\n{shape}\nphases = [\"init\", \"prefill\", \"decode\"]\n"
            )
        };
        let prefill = |toml: &str| {
            let c = case(toml);
            let with = predict_serve_windows(&c, 2, 1).unwrap()[1].0;
            let without = rank_shape(&c, 2)
                .unwrap()
                .predict(Phase::Prefill, OptimizerKind::Sgd, 1)
                .peak_bytes;
            (with, without)
        };
        for kernels in ["transformers", "fused"] {
            let (with, without) = prefill(&grid(&format!(
                "hidden = 256\nheads = 4\nkv_heads = 2\nintermediate = 128\nlayers = 2\nvocab = 64\nbatch = 2\nseq = 64\nkernels = \"{kernels}\""
            )));
            assert_eq!(with, 755_824, "{kernels}");
            assert!(
                with - without > 2 * 64 * 256 * 4 / 2,
                "{kernels}: {with} {without}"
            );
        }
        let (with, without) = prefill(&grid(
            "hidden = 64\nheads = 4\nkv_heads = 2\nintermediate = 160\nlayers = 2\nvocab = 256\nbatch = 2\nseq = 24",
        ));
        assert_eq!(with, without);
    }
}
