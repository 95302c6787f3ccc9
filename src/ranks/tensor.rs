//! Tensor parallelism on real ranks (issue 53): each of `N` ranks (the MPI world) holds one
//! shard of every block, Megatron-LM's way, and all of them train on the same batch (tensor
//! parallelism splits the model, not the data):
//! - q, k, v, gate and up are column-parallel: rank `r` holds rows `r·n/N..(r+1)·n/N` of each
//!   (its `A/N` query heads, its `G/N` K/V heads — K/V heads not divisible by `N` are refused,
//!   not replicated —, its `I/N` columns of the MLP);
//! - o and down are row-parallel: rank `r` holds the matching columns;
//! - the token table and the head are vocab-parallel (Megatron's `VocabParallelEmbedding`, a
//!   column-parallel head and `vocab_parallel_cross_entropy`; [`MegatronVocab`]): rank `r`
//!   holds rows `r·V/N..(r+1)·V/N` of each (of the one table when tied), looks up the tokens
//!   in its run (zeros for the others) and sums the rows over the group (`g`), enters the head
//!   through `f`, and its loss takes the whole vocabulary's log-sum-exp from the group's
//!   row maxima and sums (one `N`-float all-reduce each) before its part of the mean is
//!   summed (`g` on the scalar). `V` must split into `N` equal runs (refused otherwise:
//!   Megatron pads it);
//! - the norms are replicated (their gradients come out equal on every rank, so nothing is
//!   reduced).
//!
//! The block is the model's own ([`crate::model::transformer::Block`]), built from a
//! [`Config`](crate::model::transformer::Config) of the shard's widths, with Megatron's
//! conjugate collectives set around its sublayers ([`Megatron`], the model's
//! [`Collectives`](crate::model::transformer::Collectives) hook, written once over the tensor
//! trait in [`crate::model::tensor_parallel`]): `f` (identity forward, the input's gradient
//! all-reduced in the backward) before a sublayer's column-parallel projections and `g` (the
//! row-parallel projection's partial output all-reduced forward, identity backward) before the
//! residual sum. Both are candle ops
//! (`EnterOp`, `ReduceOp`) that reach the group through this thread's [`Group`] (MPI's
//! communicator is neither `Send` nor `Sync`, which candle's ops must be: the op holds nothing,
//! and candle calls an op's forward and backward on the thread that runs the step, where the
//! group is set).
//!
//! What the collectives hold (the counting allocator sees them): `f` copies its input and
//! all-reduces its gradient into a fresh tensor; `g` all-reduces into a fresh output. With
//! memfit's fused kernels (`fused`, `transformers`) the tensors no backward reads are released,
//! as PyTorch's autograd would not save them — the norm's output once copied (Megatron's
//! identity keeps one tensor), the partial and the reduced outputs once summed —, so the graph
//! keeps only bookkeeping more than the single device's (a tensor or two a collective); with
//! candle's composed ops nothing is released (stock candle keeps every op's inputs): `4·B·S·H`
//! floats a block more. The windows' predictions replay the shard with the same collectives
//! on symbolic tensors ([`train_shape`]: the same `Megatron` statements, so the same tensors
//! made and freed, in the forward, in a checkpointed segment's recomputation and in the
//! backward alike).

use std::cell::RefCell;
use std::rc::Rc;

use anyhow::{Context, ensure};
use candle_core::backprop::GradStore;
use candle_core::{
    CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Storage, Tensor, Var,
};
use candle_nn::{VarBuilder, VarMap};

use super::comm::{Comm, Solo};
use super::{Check, Plan, RankReport, States, WINDOWS, Window, named_vars, window, zero};
use crate::formula::parallel::{self, Layout as ParallelLayout};
use crate::formula::transformer::Shape as FormulaShape;
use crate::meter::rusage::{vm_hwm_bytes, vm_rss_bytes};
use crate::model::tensor_parallel::CollectiveOps;
pub use crate::model::tensor_parallel::{Megatron, MegatronVocab};
use crate::model::transformer::{Transformer, synthetic_batch};
use crate::optim::inplace::Stepper;
use crate::workload::Case;

thread_local! {
    /// The tensor-parallel group this thread's collectives reach ([`Group::join`]).
    static GROUP: RefCell<Option<Rc<dyn Comm>>> = const { RefCell::new(None) };
}

/// This thread's membership of a tensor-parallel group: set by [`Group::join`], left when
/// dropped.
pub struct Group(());

impl Group {
    pub fn join(comm: Rc<dyn Comm>) -> Self {
        GROUP.with(|g| *g.borrow_mut() = Some(comm));
        Group(())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        GROUP.with(|g| *g.borrow_mut() = None);
    }
}

/// `recv = Σ over the group of send`, through this thread's group.
fn all_reduce(send: &[f32], recv: &mut [f32]) -> Result<()> {
    GROUP.with(|g| match g.borrow().as_ref() {
        Some(comm) => {
            comm.all_reduce_sum(send, recv);
            Ok(())
        }
        None => candle_core::bail!("ranks --tp: a collective outside the tensor-parallel group"),
    })
}

/// This thread's group has `tp` ranks.
fn check_group(tp: usize) -> Result<()> {
    let n = with_group(|c| c.size())?;
    if n != tp {
        candle_core::bail!("ranks --tp: a collective over {tp} ranks in a group of {n}")
    }
    Ok(())
}

/// `f` on this thread's group (expert parallelism's exchanges reach it here too).
pub(super) fn with_group<O>(f: impl FnOnce(&dyn Comm) -> O) -> Result<O> {
    GROUP.with(|g| match g.borrow().as_ref() {
        Some(comm) => Ok(f(comm.as_ref())),
        None => candle_core::bail!("ranks: a collective outside the ranks' group"),
    })
}

/// The contiguous `f32` data of a CPU storage under `l`.
pub(super) fn f32_data<'a>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [f32]> {
    let Some((a, b)) = l.contiguous_offsets() else {
        candle_core::bail!("ranks --tp: a collective's tensor must be contiguous")
    };
    match s {
        CpuStorage::F32(d) => Ok(&d[a..b]),
        _ => candle_core::bail!("ranks --tp: collectives run on f32 tensors"),
    }
}

/// `t` summed over the group (or, `reduce` false, copied) into a fresh tensor.
fn all_reduced(t: &Tensor, reduce: bool) -> Result<Tensor> {
    let t = t.contiguous()?;
    let out = cpu_f32(&t, |data| {
        let mut out = vec![0f32; data.len()];
        if reduce {
            all_reduce(data, &mut out)?;
        } else {
            out.copy_from_slice(data);
        }
        Ok(out)
    })?;
    Tensor::from_vec(out, t.shape(), t.device())
}

/// `f` on the contiguous `f32` data of a CPU tensor (the collectives' send buffer).
fn cpu_f32<O>(t: &Tensor, f: impl FnOnce(&[f32]) -> Result<O>) -> Result<O> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        candle_core::bail!("ranks --tp: collectives run on the CPU")
    };
    f(f32_data(cpu, layout)?)
}

/// Megatron's `f`: the identity forward (a copy: a candle op makes its output), the gradient
/// all-reduced over the group in the backward. `reduce` false drops the all-reduce (only to
/// show that the check catches it: `--tp-skip-f-all-reduce`).
struct EnterOp {
    reduce: bool,
}

impl CustomOp1 for EnterOp {
    fn name(&self) -> &'static str {
        "tp-f"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        Ok((CpuStorage::F32(f32_data(s, l)?.to_vec()), l.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(all_reduced(grad, self.reduce)?))
    }
}

/// Megatron's `g`: the partial outputs of the row-parallel projection summed over the group
/// into a fresh output; the identity backward. `reduce` false copies instead (only to show
/// that the serving check catches it: `--tp-skip-g-all-reduce`).
struct ReduceOp {
    reduce: bool,
}

impl CustomOp1 for ReduceOp {
    fn name(&self) -> &'static str {
        "tp-g"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let data = f32_data(s, l)?;
        let mut out = vec![0f32; data.len()];
        if self.reduce {
            all_reduce(data, &mut out)?;
        } else {
            out.copy_from_slice(data);
        }
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad.clone()))
    }
}

/// Every rank's `data` gathered over `c`, its runs of `run` elements interleaved: row `j` of
/// the result is rank 0's run `j`, then rank 1's run `j`, and so on. The ranks' blocks (whole,
/// as MPI gathers them) land in a host buffer first, freed once moved into the result.
fn gather_interleaved(c: &dyn Comm, data: &[f32], run: usize) -> Vec<f32> {
    let tp = c.size();
    let mut blocks = vec![0f32; tp * data.len()];
    c.all_gather_into(data, &mut blocks);
    let mut out = vec![0f32; blocks.len()];
    for (r, block) in blocks.chunks(data.len()).enumerate() {
        for (row, part) in block.chunks(run).enumerate() {
            let at = (row * tp + r) * run;
            out[at..at + run].copy_from_slice(part);
        }
    }
    out
}

/// `data` of a `(B, s, H)` gathered along dim 1 over the group (every rank's `s` rows in rank
/// order): `(B, tp·s, H)`. With `B > 1` the ranks' `s·H` runs are interleaved row by row
/// ([`gather_interleaved`]); with one row MPI gathers into the result directly.
fn seq_gather(data: &[f32], (b, s, h): (usize, usize, usize)) -> Result<Vec<f32>> {
    with_group(|c| {
        if b > 1 {
            return gather_interleaved(c, data, s * h);
        }
        let mut out = vec![0f32; c.size() * data.len()];
        c.all_gather_into(data, &mut out);
        out
    })
}

/// `data` of a `(B, S, H)` summed over the group and scattered along dim 1: this rank's run of
/// `S/tp` rows, `(B, S/tp, H)`. With `B > 1` the rows are first reordered by the rank they go
/// to (MPI scatters whole runs) into a host buffer of `B·S·H`.
fn seq_scatter(data: &[f32], (b, s, h): (usize, usize, usize)) -> Result<Vec<f32>> {
    with_group(|c| {
        let tp = c.size();
        let mut out = vec![0f32; data.len() / tp];
        if b == 1 {
            c.reduce_scatter_sum(data, &mut out);
            return out;
        }
        let run = s / tp * h;
        let mut send = vec![0f32; data.len()];
        for (row, whole) in data.chunks(s * h).enumerate() {
            for (r, part) in whole.chunks(run).enumerate() {
                let at = (r * b + row) * run;
                send[at..at + run].copy_from_slice(part);
            }
        }
        c.reduce_scatter_sum(&send, &mut out);
        out
    })
}

/// `data` of a `(B, s, H)` through [`seq_gather`] (`gather`) or [`seq_scatter`]: the result
/// and its length along the sequence.
fn seq_collective(
    data: &[f32],
    (b, s, h): (usize, usize, usize),
    gather: bool,
) -> Result<(Vec<f32>, usize)> {
    let tp = with_group(|c| c.size())?;
    if gather {
        return Ok((seq_gather(data, (b, s, h))?, s * tp));
    }
    if !s.is_multiple_of(tp) {
        candle_core::bail!("ranks --sp: {s} positions do not split into {tp} runs")
    }
    Ok((seq_scatter(data, (b, s, h))?, s / tp))
}

/// `t (B, S, H)` through [`seq_collective`] into a fresh tensor.
fn sequence_collective(t: &Tensor, gather: bool) -> Result<Tensor> {
    let t = t.contiguous()?;
    let (b, s, h) = t.dims3()?;
    let (out, rows) = cpu_f32(&t, |data| seq_collective(data, (b, s, h), gather))?;
    Tensor::from_vec(out, (b, rows, h), t.device())
}

/// Sequence parallelism's all-gather (`gather`) or reduce-scatter along the sequence; the
/// backward the other one, into a fresh gradient.
struct SequenceOp {
    gather: bool,
}

impl CustomOp1 for SequenceOp {
    fn name(&self) -> &'static str {
        if self.gather {
            "sp-gather"
        } else {
            "sp-scatter"
        }
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (b, n, h) = l.shape().dims3()?;
        let (out, rows) = seq_collective(f32_data(s, l)?, (b, n, h), self.gather)?;
        Ok((CpuStorage::F32(out), Shape::from_dims(&[b, rows, h])))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(sequence_collective(grad, !self.gather)?))
    }
}

/// Megatron's `f` and `g` on candle's tensors, over this thread's [`Group`]
/// ([`Megatron`]'s statements are written once over the tensor trait).
impl CollectiveOps for Tensor {
    fn tp_enter(&self, reduce: bool) -> Result<Tensor> {
        self.apply_op1(EnterOp { reduce })
    }

    fn tp_reduce(&self, reduce: bool) -> Result<Tensor> {
        self.apply_op1(ReduceOp { reduce })
    }

    fn sp_gather(&self, tp: usize) -> Result<Tensor> {
        check_group(tp)?;
        self.apply_op1(SequenceOp { gather: true })
    }

    fn sp_scatter(&self, tp: usize) -> Result<Tensor> {
        check_group(tp)?;
        self.apply_op1(SequenceOp { gather: false })
    }

    fn tp_gather_last(&self, tp: usize) -> Result<Tensor> {
        let x = self.contiguous()?;
        let mut dims = x.dims().to_vec();
        let n = *dims.last().expect("a tensor with a last dimension");
        check_group(tp)?;
        let out = cpu_f32(&x, |data| with_group(|c| gather_interleaved(c, data, n)))?;
        *dims.last_mut().expect("a last dimension") *= tp;
        Tensor::from_vec(out, dims, self.device())
    }

    fn tp_logsumexp(&self) -> Result<Tensor> {
        let x = self.contiguous()?;
        let (n, v) = x.dims2()?;
        let lse = cpu_f32(&x, |data| {
            let mut local: Vec<f32> = data
                .chunks(v)
                .map(|r| r.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)))
                .collect();
            let mut max = vec![0f32; n];
            with_group(|c| c.all_reduce_max(&local, &mut max))?;
            for ((s, r), m) in local.iter_mut().zip(data.chunks(v)).zip(&max) {
                *s = r.iter().map(|x| (x - m).exp()).sum();
            }
            let mut lse = vec![0f32; n];
            all_reduce(&local, &mut lse)?;
            drop(local);
            for (l, m) in lse.iter_mut().zip(&max) {
                *l = m + l.ln();
            }
            Ok(lse)
        })?;
        Tensor::from_vec(lse, (n, 1), self.device())
    }
}

/// Refuses what tensor parallelism on ranks does not run, by name (beside
/// [`super::check_case`]'s refusals).
pub fn check_tp(case: &Case, tp: usize) -> anyhow::Result<()> {
    ensure!(
        tp >= 2,
        "ranks --tp {tp}: tensor parallelism needs 2 ranks or more"
    );
    let Some(l) = case.cfg.llama else {
        anyhow::bail!(
            "ranks --tp: model {}: tensor parallelism on ranks splits LLaMA-family dense decoders (GPT's and ViT's are not split)",
            case.model.as_str()
        )
    };
    ensure!(
        l.moe.is_none(),
        "ranks --tp: a mixture of experts is not split on ranks (dense decoders only)"
    );
    ensure!(
        l.mla.is_none(),
        "ranks --tp: MLA (multi-head latent attention) is not split on ranks"
    );
    let v = l.variant;
    ensure!(
        v.gated_delta.is_none(),
        "ranks --tp: linear attention (Gated DeltaNet) is not split on ranks"
    );
    ensure!(
        !v.sandwich_norms && !v.post_norms_only,
        "ranks --tp: sandwich or post-sublayer norms (Gemma, OLMo 2) are not split on ranks"
    );
    ensure!(
        !l.qk_norm && !v.qk_norm_whole && !v.qk_l2_norm,
        "ranks --tp: query/key norms are not split on ranks (their weights' gradients would be partial on each rank)"
    );
    ensure!(
        !v.attn_output_gate && !v.attention_sinks,
        "ranks --tp: output gates and attention sinks are not split on ranks"
    );
    ensure!(
        !l.o_bias && !l.mlp_bias,
        "ranks --tp: a bias on a row-parallel projection (o, down) is not split on ranks"
    );
    let heads = case.cfg.heads;
    ensure!(
        heads.is_multiple_of(tp) && l.kv_heads.is_multiple_of(tp),
        "ranks --tp {tp}: {heads} query heads over {} K/V heads do not split into {tp} equal parts (Megatron's split; K/V heads are not replicated here)",
        l.kv_heads
    );
    ensure!(
        l.intermediate.is_multiple_of(tp),
        "ranks --tp {tp}: the MLP's width {} does not split into {tp} equal parts",
        l.intermediate
    );
    // Megatron and vLLM pad the vocabulary to a multiple of tp (and more); memfit's ranks
    // refuse rather than pad, so that the checks compare every row with the single process's.
    let v = case.cfg.vocab;
    ensure!(
        v.is_multiple_of(tp),
        "ranks --tp {tp}: the vocabulary {v} does not split into {tp} equal runs (the token table and head are vocab-parallel; pad it, as Megatron does, with --vocab a multiple of {tp})"
    );
    Ok(())
}

/// The case a rank of `tp` runs: the shard's widths (heads, K/V heads, the MLP's width and the
/// vocabulary over `tp`; the hidden size and the heads' width whole).
pub fn shard_case(case: &Case, tp: usize) -> Case {
    let mut cfg = case.cfg.clone();
    cfg.vocab /= tp;
    cfg.heads /= tp;
    if let Some(l) = cfg.llama.as_mut() {
        l.kv_heads /= tp;
        l.intermediate /= tp;
    }
    Case {
        cfg,
        ..case.clone()
    }
}

/// The slice of a whole-model tensor `full` that rank `rank` of `tp` holds as a tensor of
/// `dims`: all of it (replicated), or the run of the one dimension that is `tp` times longer.
pub(super) fn slice_of(
    full: &Tensor,
    dims: &[usize],
    rank: usize,
    tp: usize,
) -> anyhow::Result<Tensor> {
    let whole = full.dims();
    ensure!(
        whole.len() == dims.len(),
        "ranks --tp: {whole:?} against {dims:?}"
    );
    let split: Vec<usize> = (0..dims.len()).filter(|&d| whole[d] != dims[d]).collect();
    match split[..] {
        [] => Ok(full.clone()),
        [d] if whole[d] == dims[d] * tp => Ok(full.narrow(d, rank * dims[d], dims[d])?),
        _ => anyhow::bail!("ranks --tp: no shard of {whole:?} is {dims:?}"),
    }
}

/// Fills every shard variable with its slice of the whole model filled by
/// `super::fill_deterministic` (by name), so a rank's shard is the single process's; whether
/// each is replicated (the whole tensor on every rank: the norms).
pub(super) fn fill_shard(
    case: &Case,
    vars: &[(String, Var)],
    rank: usize,
    tp: usize,
) -> anyhow::Result<Vec<bool>> {
    let mut replicated = Vec::with_capacity(vars.len());
    // One process's model (the same batch as every rank: tensor parallelism splits the model,
    // not the data).
    let full = super::Single::new(case, 1)?;
    for ((name, v), (other, w)) in vars.iter().zip(&full.vars) {
        ensure!(name == other, "ranks --tp: {name} against {other}");
        replicated.push(v.dims() == w.dims());
        let part = slice_of(w.as_tensor(), v.dims(), rank, tp)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        zero::with_f32_mut(v.as_tensor(), |d| d.copy_from_slice(&part))?;
    }
    Ok(replicated)
}

/// Sequence parallelism's last reduce of the backward (Megatron's all-reduce of the sequence-
/// parallel norms' gradients over the tensor-parallel group): each replicated variable's
/// gradient, computed on this rank's run of the sequence only, summed over the group in place
/// (through a fresh vector of its size, freed at once).
fn all_reduce_replicated(
    vars: &[(String, Var)],
    replicated: &[bool],
    grads: &GradStore,
    group: &dyn Comm,
) -> anyhow::Result<()> {
    for ((name, v), _) in vars.iter().zip(replicated).filter(|(_, r)| **r) {
        let g = super::grad_of(grads, name, v)?;
        zero::with_f32_mut(&g, |d| {
            let mut sum = vec![0f32; d.len()];
            group.all_reduce_sum(d, &mut sum);
            d.copy_from_slice(&sum);
        })?;
    }
    Ok(())
}

/// A training rank's collectives: `f`'s backward all-reduces (unless the plan's mutation),
/// the tensors no backward reads released under memfit's kernels.
pub(super) fn training_collectives(case: &Case, plan: &Plan) -> Megatron {
    Megatron {
        f_all_reduce: plan.f_all_reduce,
        g_all_reduce: true,
        release: case.cfg.kernels.fused(),
        sequence: plan.sp.then_some(plan.tp),
    }
}

/// A rank's model (training, or serving: `model` detached): `megatron`'s `f` and `g` around
/// its blocks' sublayers and its vocab-parallel embedding, head and loss (its run of the
/// vocabulary from `rank·V/tp`; serving gathers the logits).
pub(super) fn megatron_rank(
    model: Transformer,
    case: &Case,
    megatron: Megatron,
    (rank, tp): (usize, usize),
) -> Transformer {
    model
        .with_collectives(Rc::new(megatron))
        .with_vocab_parallel(Rc::new(MegatronVocab {
            start: rank * case.cfg.vocab / tp,
            tp,
            megatron,
        }))
}

/// What a tensor-parallel rank (training or serving) starts from: its shard's case, its
/// membership of the group, the batch every rank runs, and its shard built in the `init` window
/// (pushed onto `measured`) and filled with its slice of the whole model.
pub(super) struct ShardStart {
    pub shard: Case,
    pub _group: Group,
    pub tokens: Tensor,
    pub targets: Tensor,
    pub varmap: VarMap,
    pub model: Transformer,
    pub vars: Vec<(String, Var)>,
    /// Each of `vars` replicated over the group (the norms).
    pub replicated: Vec<bool>,
}

/// The warm-up (the shard's first-use allocations, the library's first all-reduce), the group
/// joined, the batch of `B` rows (every rank the same: tensor parallelism splits the model, not
/// the data), then the `init` window and the shard's fill.
pub(super) fn start_shard(
    case: &Case,
    comm: &Rc<dyn Comm>,
    dp: &dyn Comm,
    measured: &mut Vec<super::Measured>,
) -> anyhow::Result<ShardStart> {
    let (rank, tp) = (comm.rank(), comm.size());
    let shard = shard_case(case, tp);
    let device = Device::Cpu;
    crate::phase::runner::warm_up(&shard, &device).context("the warm-up step")?;
    {
        let mut x = [1.0f32; 4];
        let send = x;
        comm.all_reduce_sum(&send, &mut x);
        comm.barrier();
    }
    if dp.size() > 1 {
        super::warm_up_collectives(dp, true);
    }
    let _group = Group::join(comm.clone());
    // Every rank of a tensor-parallel group the same rows: its replica's of the global batch.
    let (tokens, targets) = if dp.size() > 1 {
        super::rank_batch(case, dp.rank(), dp.size())?
    } else {
        synthetic_batch(case.batch, case.seq, case.cfg.vocab, &device)?
    };
    let varmap = VarMap::new();
    let (model, p, r, s) = window(|| {
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
        Ok(Transformer::new(&shard.cfg, vb)?)
    })?;
    measured.push((p, r, s, vm_rss_bytes()));
    let vars = named_vars(&varmap);
    let replicated = fill_shard(case, &vars, rank, tp)?;
    Ok(ShardStart {
        shard,
        _group,
        tokens,
        targets,
        varmap,
        model,
        vars,
        replicated,
    })
}

/// The two groups of a rank of `tp` tensor-parallel × `dp` data-parallel ranks, Megatron's
/// order (tp innermost: world ranks `d·tp..(d+1)·tp` hold one replica's shards): its
/// tensor-parallel group and its data-parallel group (the ranks holding the same shard).
fn groups(world: &Rc<dyn Comm>, tp: usize) -> (Rc<dyn Comm>, Rc<dyn Comm>) {
    if world.size() == tp {
        return (world.clone(), Rc::new(Solo));
    }
    let (tp_group, dp_group) = split_groups(world.as_ref(), tp);
    (tp_group, Rc::from(dp_group))
}

/// `world` split into [`groups`]' two sub-communicators (collective: every rank calls it).
pub(super) fn split_groups(world: &dyn Comm, tp: usize) -> (Rc<dyn Comm>, Box<dyn Comm>) {
    let rank = world.rank();
    (Rc::from(world.split(rank / tp)), world.split(rank % tp))
}

/// Runs one tensor-parallel rank of `case` under `plan` over `comm`: `plan.tp` ranks a model's
/// shards, the world's `dp = N/tp` replicas each on its own rows of the global batch
/// ([`groups`]), measuring and predicting its windows as [`super::run_rank`] does. With one
/// replica `reduce` and `gather` are empty and the optimizer steps the shard in place; with
/// more, ZeRO `plan.zero` (0, 1 or 2) over the data-parallel group, as on data-parallel ranks
/// (Megatron's distributed optimizer beside tensor parallelism): the shard's gradients
/// averaged (stage 2: reduce-scattered), its optimizer state sharded, the updated runs
/// gathered.
pub fn run_tp_rank(case: &Case, plan: Plan, comm: Rc<dyn Comm>) -> anyhow::Result<RankReport> {
    let (world_rank, world) = (comm.rank(), comm.size());
    let tp = plan.tp;
    super::check_case(case, plan.zero)?;
    check_tp(case, tp)?;
    ensure!(
        world.is_multiple_of(tp),
        "ranks --tp {tp}: launched on {world} ranks, not a multiple of {tp} (mpirun -np {tp} or a multiple: tp × data-parallel replicas)"
    );
    let (tp_comm, dp_comm) = groups(&comm, tp);
    let (rank, dp, dp_rank) = (tp_comm.rank(), dp_comm.size(), dp_comm.rank());
    let mut measured = Vec::with_capacity(WINDOWS.len());
    let ShardStart {
        shard,
        _group,
        tokens,
        targets,
        varmap,
        model,
        vars,
        replicated,
    } = start_shard(case, &tp_comm, dp_comm.as_ref(), &mut measured)?;
    let model = megatron_rank(model, case, training_collectives(case, &plan), (rank, tp));
    let step = super::Step {
        model: &model,
        vars: &vars,
        tokens: &tokens,
        targets: &targets,
        case: &shard,
    };
    let stepper = Stepper::new(case.optimizer, crate::optim::LEARNING_RATE)?;

    // forward, backward
    let (grads, grads_held, ()) =
        super::forward_backward(&step, comm.as_ref(), &mut measured, || ())?;
    // reduce: over the replicas only (the replicated tensors' gradients are equal on every
    // rank of a tensor-parallel group); the optimizer the shard's state (its runs under ZeRO),
    // stepped in place; gather: the updated runs over the replicas
    let replicas = dp_comm.as_ref();
    let (gradient_rel_diff, opt, _) = super::step_tail(
        &step,
        grads,
        comm.as_ref(),
        &mut measured,
        &|g| {
            if plan.sp && plan.sp_norm_all_reduce {
                all_reduce_replicated(&vars, &replicated, g, tp_comm.as_ref())?;
            }
            if dp > 1 {
                zero::reduce(plan.zero, &vars, g, replicas)?;
            }
            Ok(())
        },
        |g| {
            plan.check
                .then(|| check_gradients(case, (rank, tp), (dp_rank, dp), plan.zero, &vars, g))
                .transpose()
        },
        || Ok(zero::Sharded::new(stepper, plan.zero, &vars, replicas)?),
        &|| {
            if dp > 1 {
                zero::gather(plan.zero, &vars, replicas)?;
            }
            Ok(())
        },
    )?;

    let predicted = predict_tp_windows(case, plan, tp, (dp_rank, dp))?;
    let windows = super::windows_of(&measured, &predicted);
    let states = tp_states(case, tp, plan.zero, dp, &windows, grads_held)?;
    let check = match gradient_rel_diff {
        Some(gradient_rel_diff) => Some(Check {
            gradient_rel_diff,
            weight_rel_diff: check_weights(case, (rank, tp), dp, &vars)?,
        }),
        None => None,
    };
    drop((opt, model, varmap));
    Ok(RankReport {
        rank: world_rank,
        ranks: world,
        zero: plan.zero,
        tp,
        ep: 1,
        windows,
        states,
        rss_peak_bytes: vm_hwm_bytes(),
        check,
    })
}

/// This rank's gradients (after the replicas' reduce) against the matching slices of one
/// process's on the global batch (`dp` replicas' rows): its tensor-parallel slice, then under
/// ZeRO the run its data-parallel rank owns (ZeRO 2 keeps only that run).
fn check_gradients(
    case: &Case,
    (rank, tp): (usize, usize),
    (dp_rank, dp): (usize, usize),
    zero: u8,
    vars: &[(String, Var)],
    grads: &GradStore,
) -> anyhow::Result<f64> {
    let whole = super::Single::new(case, dp)?;
    let reference = whole.step().gradients()?;
    super::compare(vars, &whole.vars, |name, v, w| {
        let mine = super::grad_of(grads, name, v)?.flatten_all()?;
        let theirs =
            slice_of(&super::grad_of(&reference, name, w)?, v.dims(), rank, tp)?.flatten_all()?;
        if dp == 1 {
            return Ok((mine, theirs));
        }
        super::owned_runs(mine, theirs, zero, dp, dp_rank)
    })
}

/// This rank's shard after its two steps against the matching slices of one process's weights
/// after two steps of the same optimizer on the global batch (`dp` replicas' rows).
pub(super) fn check_weights(
    case: &Case,
    (rank, tp): (usize, usize),
    dp: usize,
    vars: &[(String, Var)],
) -> anyhow::Result<f64> {
    let whole = super::Single::new(case, dp)?;
    whole.step().train_twice()?;
    super::compare(vars, &whole.vars, |_, a, b| {
        Ok((
            a.as_tensor().clone(),
            slice_of(b.as_tensor(), a.dims(), rank, tp)?,
        ))
    })
}

/// The replay's shape of a rank of `tp`'s shard: `formula::parallel::shard` (heads, K/V heads,
/// the MLP's width and the vocabulary over `tp`), without its collectives.
pub fn rank_shape(case: &Case, tp: usize) -> anyhow::Result<FormulaShape> {
    let whole = FormulaShape::of(case);
    parallel::shard(&whole, tp, case.cfg.layers).map_err(anyhow::Error::msg)
}

/// The replay's shape of a rank of `tp` ([`rank_shape`]) with Megatron's collectives around
/// its sublayers, as the rank runs them (`f` a copy whose backward all-reduces into a fresh
/// gradient, `g` a fresh output), in its forward, its recomputed segments and its serving copy
/// alike, and its vocab-parallel embedding, head and loss (serving: the logits gathered); with
/// `sp`, under Megatron's sequence parallelism (`f` an all-gather along the sequence, `g` a
/// reduce-scatter).
pub fn train_shape(case: &Case, tp: usize, sp: bool) -> anyhow::Result<FormulaShape> {
    Ok(FormulaShape {
        tp_collectives: true,
        vocab_parallel: tp,
        sequence_parallel: sp,
        ..rank_shape(case, tp)?
    })
}

/// Each window's (peak, retained) predicted for a rank of `tp` in data-parallel replica
/// `dp_rank` of `dp`: the data-parallel prediction of that rank under ZeRO `plan.zero`
/// ([`super::predict_windows_of`]) for the replay of the shard with its collectives
/// ([`train_shape`]); with one replica, nothing to reduce or gather.
pub fn predict_tp_windows(
    case: &Case,
    plan: Plan,
    tp: usize,
    (dp_rank, dp): (usize, usize),
) -> anyhow::Result<Vec<(u64, i64)>> {
    let shape = train_shape(case, tp, plan.sp)?;
    let mut w = super::predict_windows_of(&shape, case.optimizer, plan, dp, dp_rank, 0);
    // Under sequence parallelism the reduce begins with the norms' all-reduce: one vector of
    // a norm's `H` floats at a time, before the replicas' reduce.
    let norms = if plan.sp {
        4 * case.cfg.hidden as u64
    } else {
        0
    };
    if dp > 1 {
        w[3].0 = w[3].0.max(norms);
        return Ok(w);
    }
    let t = shape.replay_training(plan.threads);
    w[3] = (norms, 0);
    w[6] = (
        (t.forward_retained + t.backward_peak).max(t.forward_peak),
        0,
    );
    Ok(w)
}

/// [`predicted_tp_states`] at the ranks' rates: f32 weights and gradients, the optimizer's
/// f32 state.
pub(super) fn predicted_f32_tp_states(case: &Case, tp: usize) -> anyhow::Result<(u64, u64, u64)> {
    let rates = parallel::rates(4, case.optimizer)
        .context("ranks --tp: an optimizer of whole bytes per parameter")?;
    predicted_tp_states(case, tp, rates)
}

/// A rank of `tp`'s (weights, gradients, optimizer state) bytes at `rates` bytes a parameter:
/// [`parallel::stage_ranks`] at `tp` (Megatron's, and vLLM's, vocab-parallel rank, which the
/// rank is).
pub fn predicted_tp_states(
    case: &Case,
    tp: usize,
    rates: (u64, u64, u64),
) -> anyhow::Result<(u64, u64, u64)> {
    let layout = ParallelLayout {
        tp,
        ..Default::default()
    };
    let megatron = parallel::stage_ranks(&case.cfg, &layout, rates, false);
    let r = megatron.first().context("ranks --tp: no stage")?;
    Ok((r.weights_bytes, r.gradient_bytes, r.optimizer_state_bytes))
}

/// The model states entering the optimizer, measured from the windows and predicted by
/// [`predicted_tp_states`].
fn tp_states(
    case: &Case,
    tp: usize,
    zero_stage: u8,
    dp: usize,
    w: &[Window],
    grads_held: i64,
) -> anyhow::Result<States> {
    let whole = predicted_f32_tp_states(case, tp)?;
    let (pw, pg, po) = crate::formula::zero::shards(zero_stage, dp as u64, whole, false);
    Ok(States {
        weights_bytes: w[0].retained_bytes,
        gradient_bytes: grads_held + w[3].retained_bytes,
        optimizer_state_bytes: w[4].retained_bytes,
        predicted_weights_bytes: pw,
        predicted_gradient_bytes: pg,
        predicted_optimizer_state_bytes: po,
        host: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::Kernels;

    /// On a group of one rank `f` and `g` are identities: the model with them set trains to
    /// the same loss and the same gradients, bit for bit, with every kernel set (the hook runs
    /// without MPI).
    #[test]
    fn collectives_on_one_rank_change_nothing() {
        for kernels in [Kernels::Fused, Kernels::Composed, Kernels::Transformers] {
            let mut cfg = crate::model::llama::tiny();
            cfg.kernels = kernels;
            let varmap = VarMap::new();
            let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
            let model = Transformer::new(&cfg, vb).unwrap();
            let (tokens, targets) = synthetic_batch(2, 12, cfg.vocab, &Device::Cpu).unwrap();
            let vars = named_vars(&varmap);
            let run =
                |m: &Transformer| crate::ranks::loss_and_gradients(m, &vars, &tokens, &targets);
            let plain = run(&model);
            let _group = Group::join(Rc::new(Solo));
            let split = model.clone().with_collectives(Rc::new(Megatron {
                f_all_reduce: true,
                g_all_reduce: true,
                release: kernels.fused(),
                sequence: None,
            }));
            assert_eq!(run(&split), plain, "{kernels:?}");
        }
    }

    /// On a group of one rank holding the whole vocabulary, the vocab-parallel embedding, head
    /// and loss are the model's own: the same loss and gradients to float rounding (the loss's
    /// log-sum-exp is taken apart from the op), with every kernel set.
    #[test]
    fn vocab_parallel_on_one_rank_is_the_whole_model() {
        for kernels in [Kernels::Fused, Kernels::Composed, Kernels::Transformers] {
            let mut cfg = crate::model::llama::tiny();
            cfg.kernels = kernels;
            let varmap = VarMap::new();
            let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
            let model = Transformer::new(&cfg, vb).unwrap();
            let (tokens, targets) = synthetic_batch(2, 12, cfg.vocab, &Device::Cpu).unwrap();
            let vars = named_vars(&varmap);
            let run =
                |m: &Transformer| crate::ranks::loss_and_gradients(m, &vars, &tokens, &targets);
            let (loss, grads) = run(&model);
            let _group = Group::join(Rc::new(Solo));
            let megatron = Megatron {
                f_all_reduce: true,
                g_all_reduce: true,
                release: kernels.fused(),
                sequence: None,
            };
            let split = model
                .clone()
                .with_collectives(Rc::new(megatron))
                .with_vocab_parallel(Rc::new(MegatronVocab {
                    start: 0,
                    tp: 1,
                    megatron,
                }));
            let (l, g) = run(&split);
            assert!(
                (l - loss).abs() <= 1e-6 * loss.abs(),
                "{kernels:?}: {l} against {loss}"
            );
            for (a, b) in g.iter().zip(&grads) {
                let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
                let d = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                assert!(
                    d <= 1e-5 * scale,
                    "{kernels:?}: a gradient {d} apart (scale {scale})"
                );
            }
        }
    }

    #[test]
    fn slices_split_the_one_longer_dimension() {
        let full = Tensor::arange(0f32, 24., &Device::Cpu)
            .unwrap()
            .reshape((4, 6))
            .unwrap();
        let rows = slice_of(&full, &[2, 6], 1, 2).unwrap();
        assert_eq!(rows.to_vec2::<f32>().unwrap()[0][0], 12.0);
        let cols = slice_of(&full, &[4, 3], 1, 2).unwrap();
        assert_eq!(cols.to_vec2::<f32>().unwrap()[1], vec![9.0, 10.0, 11.0]);
        assert_eq!(slice_of(&full, &[4, 6], 1, 2).unwrap().dims(), &[4, 6]);
        assert!(slice_of(&full, &[2, 3], 0, 2).is_err());
        assert!(slice_of(&full, &[1, 6], 0, 2).is_err());
    }
}
