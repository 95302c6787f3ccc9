//! ZeRO stage 3 on real ranks, as PyTorch FSDP's `FULL_SHARD` runs it (`memfit ranks --zero 3`):
//! every parameter sharded, gathered only while its unit runs.
//!
//! - **At rest** rank `r` holds run `r` of every parameter ([`super::zero::run_of`], FSDP2's
//!   per-parameter sharding, flattened) as a variable of its own. The whole parameter's `Var`
//!   keeps its shape but its storage is **emptied** ([`empty`]: candle's in-place op receives
//!   `&mut CpuStorage`, and `*storage = CpuStorage::F32(Vec::new())` frees the data while every
//!   tensor sharing that storage — the model's, the graph's saved references — keeps pointing at
//!   it: FSDP's `storage.resize_(0)`). Gathering is [`fill`]: a fresh `Vec` of the whole length,
//!   all-gathered into from every rank's run (`MPI_Allgatherv`), becomes the storage again.
//!   Nothing in candle 0.11.1 keeps a storage's length (`Tensor_` holds its layout — shape,
//!   strides, offset — and an `Arc<RwLock<Storage>>`; a kernel reads the storage through the
//!   layout when it runs), so a refilled storage is read whole by every tensor sharing it.
//!   An op on an *emptied* weight is not caught by candle everywhere: its CPU matmul slices
//!   from the offset and hands gemm a raw pointer, reading past the empty `Vec`. Only the
//!   order below (every unit gathered before its forward and its backward) keeps that from
//!   happening; `--check` (gradients and weights equal to one process's) is what shows it.
//! - **Units**: the parts the block-by-block backward already cuts the model into
//!   ([`crate::phase::by_block`]): the embedding, each block, the head (final norm and head).
//!   Forward: for each unit, gather its parameters, run its forward, reshard them
//!   (`reshard_after_forward=True`; the head's too). Backward, the head first: gather the unit's
//!   parameters again, run its backward (seeded from above, as `by_block`), reduce-scatter each
//!   of its gradients into this rank's shard (largest first; summed over the ranks and divided
//!   by their number, as ZeRO 2 does), drop the whole gradients, reshard. The prefetch
//!   (`--fsdp-prefetch`, [`backward`]) is FSDP's default: in the backward the next unit is
//!   gathered before this unit's gradients are computed (`BACKWARD_PRE`: two units whole at
//!   once); `--fsdp-prefetch none` keeps one unit whole at a time (`backward_prefetch=None`).
//!   In the forward nothing is gathered ahead by default (FSDP1's `forward_prefetch=False`);
//!   `--fsdp-forward-prefetch on` ([`ForwardSchedule::prefetch`]) gathers the next unit before
//!   this unit's forward runs (FSDP1's `forward_prefetch=True`, FSDP2's
//!   `set_modules_to_forward_prefetch` with one unit ahead): two units whole while a unit's
//!   forward runs, the next one's parameters counted in the forward's peak.
//! - **A tied table** (the head is the token table: SmolLM2, GPT) is one parameter in two units,
//!   the embedding's and the head's: gathered whenever either runs. Its gradient is the sum of
//!   its two uses: the head's use (first in the backward) is reduce-scattered into a new shard;
//!   the embedding's use, at the end of the backward, is reduce-scattered into the same shard
//!   and added (this rank adds `N ×` its shard into its own run before the sum, so the average
//!   lands in place, nothing allocated). The whole gradient of one use is dropped before the
//!   next use makes its own.
//! - **Optimizer**: each rank steps its own shards with their state ([`zero::Sharded`] over the
//!   shard variables, [`Stepper::apply`] on each), no broadcast after: the next step's gathers
//!   bring the new values.
//!
//! The forward and backward are written once over [`Autograd`] and a [`Sharding`]: on candle's
//! tensors with MPI ([`Real`], measured), and on the replay's symbolic tensors ([`Replayed`]:
//! a gather is a host buffer of the parameter's bytes, a reduce-scatter a shard tensor),
//! which predicts the windows: what is freed where is the same by construction.

use std::rc::Rc;

use anyhow::{Context, ensure};
use candle_core::{CpuStorage, DType, Device, InplaceOp1, Layout, Tensor, Var, bail};

use super::comm::{Comm, Solo};
use super::zero::{self, run_of, with_f32_mut};
use super::{Check, Plan, RankReport, States, TENSOR_META, Window, window, windows_of};
use crate::formula::symbolic::{DType as SymType, HostBytes, Ledger, Sure, Sym};
use crate::formula::transformer::{META_PER_TENSOR, Shape};
use crate::meter::rusage::{vm_hwm_bytes, vm_rss_bytes};
use crate::model::moe::Routing;
use crate::model::tensor_ops::Autograd;
use crate::model::transformer::Transformer;
use crate::optim::inplace::Stepper;
use crate::phase::by_block::{self, Forward};
use crate::step::{Backward, Phase};
use crate::workload::Case;

/// The windows of a ZeRO 3 rank, in order: the model built whole (`init`), each parameter cut
/// to this rank's run (`shard`), the first step's `forward` and `backward` (the gradients
/// reduce-scattered unit by unit inside it), the `optimizer` (its state made, the first step
/// on the shards), then a whole steady `train-step`.
pub const WINDOWS: [&str; 6] = [
    "init",
    "shard",
    "forward",
    "backward",
    "optimizer",
    "train-step",
];

/// Refuses what ZeRO 3 does not run on ranks, by name (beyond [`super::check_case`]).
pub fn check_fsdp(case: &Case) -> anyhow::Result<()> {
    ensure!(
        case.checkpoint == 0,
        "ranks --zero 3: gradient checkpointing is not run under ZeRO 3 (its units are the by-block backward's parts)"
    );
    ensure!(
        case.backward == Backward::ByBlock,
        "ranks --zero 3: runs the by-block backward (its parts are the units gathered one at a time); not --backward whole"
    );
    ensure!(
        case.cfg.llama.is_none_or(|l| l.moe.is_none()),
        "ranks --zero 3: a mixture of experts is not run under ZeRO 3"
    );
    Ok(())
}

/// Frees `t`'s storage in place: its data goes, its shape and every tensor sharing the
/// storage stay (FSDP's `storage.resize_(0)`). `t` must cover its storage whole, contiguous
/// from offset 0 (a parameter), in f32 on the CPU.
pub fn empty(t: &Tensor) -> candle_core::Result<()> {
    struct Empty;
    impl InplaceOp1 for Empty {
        fn name(&self) -> &'static str {
            "zero3-reshard"
        }
        fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
            let CpuStorage::F32(data) = storage else {
                bail!("zero3: a parameter must be f32")
            };
            if layout.contiguous_offsets() != Some((0, data.len())) {
                bail!("zero3: a parameter must own its storage whole ({layout:?})")
            }
            *storage = CpuStorage::F32(Vec::new());
            Ok(())
        }
    }
    t.inplace_op1(&Empty)
}

/// Gives `t`'s emptied storage `data` (its whole length) as its data again: every tensor
/// sharing the storage reads it from now on.
pub fn fill(t: &Tensor, data: Vec<f32>) -> candle_core::Result<()> {
    struct Fill(std::cell::RefCell<Option<Vec<f32>>>);
    impl InplaceOp1 for Fill {
        fn name(&self) -> &'static str {
            "zero3-gather"
        }
        fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
            let CpuStorage::F32(old) = storage else {
                bail!("zero3: a parameter must be f32")
            };
            let data = self.0.borrow_mut().take().expect("called once");
            if !old.is_empty() {
                bail!("zero3: gathering into a parameter that is not resharded")
            }
            if layout.start_offset() != 0
                || !layout.is_contiguous()
                || layout.shape().elem_count() != data.len()
            {
                bail!(
                    "zero3: {} elements for a parameter of layout {layout:?}",
                    data.len()
                )
            }
            *storage = CpuStorage::F32(data);
            Ok(())
        }
    }
    if t.dtype() != DType::F32 || !t.device().is_cpu() {
        bail!("zero3: parameters are f32 on the CPU")
    }
    t.inplace_op1(&Fill(std::cell::RefCell::new(Some(data))))
}

/// What ZeRO 3 does to a unit's parameters and gradients.
pub trait Sharding<T: Autograd> {
    /// Unit `unit`'s parameters whole on this rank (those whole already left as they are: a
    /// unit kept whole after its forward, a tied table whole in the other unit).
    fn gather(&mut self, unit: usize) -> candle_core::Result<()>;
    /// Unit `unit`'s parameters back to this rank's runs only (those resharded already left).
    fn reshard(&mut self, unit: usize) -> candle_core::Result<()>;
    /// `grad`, one use's whole gradient of variable `var`, summed over the ranks and averaged
    /// into this rank's run of it (added to what an earlier use left there), then dropped.
    fn scatter(&mut self, var: usize, grad: T) -> candle_core::Result<()>;
}

/// Each unit's variables (indices into `vars`), the embedding's, each block's, then the
/// head's, each largest first (the reduce-scatter's order): a tied table is in the first and
/// the last.
pub fn units<T: Autograd, R: Routing<T> + Clone, C>(
    model: &Transformer<T, R, C>,
    vars: &[T::Var],
) -> candle_core::Result<Vec<Vec<usize>>>
where
    T::Id: PartialEq,
{
    let ids: Vec<T::Id> = vars.iter().map(|v| T::var_tensor(v).grad_id()).collect();
    let elems = |i: usize| -> usize { T::var_tensor(&vars[i]).dims().iter().product() };
    let mut seen = vec![false; vars.len()];
    let mut out = Vec::new();
    for part in model.part_weights()? {
        let mut unit: Vec<usize> = Vec::new();
        for t in &part {
            let Some(i) = ids.iter().position(|id| *id == t.grad_id()) else {
                bail!("zero3: a weight of the model is not a variable")
            };
            if !unit.contains(&i) {
                unit.push(i);
            }
            seen[i] = true;
        }
        unit.sort_by_key(|&i| std::cmp::Reverse(elems(i)));
        out.push(unit);
    }
    if let Some(i) = seen.iter().position(|s| !s) {
        bail!("zero3: variable {i} is in no unit")
    }
    Ok(out)
}

/// What the forward does around each unit: FSDP's `reshard_after_forward` and
/// `forward_prefetch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ForwardSchedule {
    /// Each unit's parameters resharded after its forward (`FULL_SHARD`); else every unit
    /// stays whole until its backward (`SHARD_GRAD_OP`).
    pub reshard_after_forward: bool,
    /// The next unit gathered before this unit's forward runs (`forward_prefetch=True`).
    pub prefetch: bool,
}

impl ForwardSchedule {
    /// FSDP's defaults: resharded after the forward, nothing gathered ahead.
    pub const DEFAULT: Self = ForwardSchedule {
        reshard_after_forward: true,
        prefetch: false,
    };
}

/// The forward unit by unit ([`by_block::forward_on`]'s ops, in its order), each unit's
/// parameters gathered before it runs (and, with [`ForwardSchedule::prefetch`], the next
/// unit's with them) and resharded after.
pub fn forward<T: Autograd, R: Routing<T> + Clone, C>(
    model: &Transformer<T, R, C>,
    tokens: &T,
    targets: &T,
    units: &[Vec<usize>],
    sh: &mut dyn Sharding<T>,
    schedule: ForwardSchedule,
) -> candle_core::Result<Forward<T>> {
    let head = units.len() - 1;
    let masks = model.input_mask(tokens)?;
    // The unit the forward prefetch has gathered already.
    let mut ahead = None;
    // Unit `unit` whole (unless the prefetch gathered it), and with the forward prefetch the
    // next one too, unless the two share a variable.
    let mut ready = |sh: &mut dyn Sharding<T>, unit: usize| -> candle_core::Result<()> {
        if ahead != Some(unit) {
            sh.gather(unit)?;
        }
        if schedule.prefetch {
            ahead = prefetch_next(units, unit, (unit < head).then_some(unit + 1), sh)?;
        }
        Ok(())
    };
    // FSDP's `reshard_after_forward`: else every unit stays whole until its backward.
    let done = |sh: &mut dyn Sharding<T>, unit: usize| {
        if schedule.reshard_after_forward {
            sh.reshard(unit)
        } else {
            Ok(())
        }
    };
    ready(sh, 0)?;
    let mut x = model.embed(tokens)?;
    done(sh, 0)?;
    let layers = model.blocks.len();
    let mut cuts = Vec::with_capacity(layers + 1);
    let outer = tokens.segment();
    for i in 0..layers {
        let part = if i == 0 {
            outer
        } else {
            model.blocks[i - 1].tag
        };
        let (input, cut) = by_block::boundary(x, part)?;
        cuts.push(cut);
        ready(sh, i + 1)?;
        x = model.blocks_forward(&input, &masks, i..i + 1)?;
        drop(input);
        done(sh, i + 1)?;
    }
    let part = model.blocks.last().map_or(outer, |b| b.tag);
    let (input, cut) = by_block::boundary(x, part)?;
    cuts.push(cut);
    ready(sh, head)?;
    let logits = model.head_forward(&input)?;
    drop(input);
    let loss = model.train_loss(&logits, targets)?;
    drop(logits);
    done(sh, head)?;
    Ok(Forward { loss, cuts })
}

/// Every gradient of `unit`'s variables in `all` reduce-scattered (largest first).
fn scatter_unit<T: Autograd>(
    vars: &[T::Var],
    unit: &[usize],
    all: &mut T::Grads,
    sh: &mut dyn Sharding<T>,
) -> candle_core::Result<()> {
    for &i in unit {
        if let Some(g) = T::take_grad(all, T::var_tensor(&vars[i])) {
            sh.scatter(i, g)?;
        }
    }
    Ok(())
}

/// Gathers the unit the backward differentiates next, `next` (the one that made the last
/// boundary still to differentiate), unless it shares a variable with `unit` (a tied table is
/// in the embedding and the head, never prefetched while the other runs): the unit gathered.
fn prefetch_next<T: Autograd>(
    units: &[Vec<usize>],
    unit: usize,
    next: Option<usize>,
    sh: &mut dyn Sharding<T>,
) -> candle_core::Result<Option<usize>> {
    let Some(n) = next.filter(|&n| n != unit && !units[n].iter().any(|v| units[unit].contains(v)))
    else {
        return Ok(None);
    };
    sh.gather(n)?;
    Ok(Some(n))
}

/// The backward unit by unit from the head ([`by_block::backward`]'s order): each unit's
/// parameters gathered, its part differentiated, its gradients reduce-scattered and dropped,
/// its parameters resharded. With `prefetch` (FSDP's default `BACKWARD_PRE`), the next unit's
/// parameters are gathered before this unit's gradients are computed, so two units are whole
/// while a unit's backward runs (FSDP's all-gather overlapping the computation; on ranks here
/// the gather completes first, the same bytes alive).
pub fn backward<T: Autograd>(
    vars: &[T::Var],
    fwd: Forward<T>,
    units: &[Vec<usize>],
    sh: &mut dyn Sharding<T>,
    prefetch: bool,
) -> candle_core::Result<()> {
    let Forward { loss, mut cuts } = fwd;
    let head = units.len() - 1;
    let outer = loss.segment();
    // The unit that made the last boundary still to differentiate (boundary `k` was made by
    // unit `k`: the embedding, 0, or block `k − 1`): the backward's next unit.
    let next = |cuts: &[Option<by_block::Boundary<T>>]| {
        (prefetch && matches!(cuts.last(), Some(Some(_)))).then(|| cuts.len() - 1)
    };
    sh.gather(head)?;
    // The unit a prefetch has gathered already.
    let mut ready = prefetch_next(units, head, next(&cuts), sh)?;
    let mut all = loss.backward()?;
    drop(loss);
    let mut upstream = by_block::take_cut::<T>(&all, cuts.last())?;
    scatter_unit(vars, &units[head], &mut all, sh)?;
    drop(all);
    sh.reshard(head)?;
    while let Some(Some(b)) = cuts.pop() {
        // The boundary `k` was made by unit `k`: the embedding (0) or block `k − 1`.
        let unit = cuts.len();
        if ready != Some(unit) {
            sh.gather(unit)?;
        }
        ready = prefetch_next(units, unit, next(&cuts), sh)?;
        b.made.set_segment(b.part);
        let g = upstream
            .take()
            .ok_or_else(|| candle_core::Error::Msg("zero3: no gradient for a boundary".into()))?;
        let root = b.made.seed(g)?;
        drop(b);
        let mut all = root.backward()?;
        drop(root);
        upstream = by_block::take_cut::<T>(&all, cuts.last())?;
        scatter_unit(vars, &units[unit], &mut all, sh)?;
        drop(all);
        sh.reshard(unit)?;
    }
    if let Some(first) = vars.first() {
        T::var_tensor(first).set_segment(outer);
    }
    Ok(())
}

/// ZeRO 3 on candle's tensors over `comm`: the whole variables (emptied at rest), this rank's
/// runs of them, and of their averaged gradients.
pub struct Real<'a> {
    /// The shard group (every rank, or hybrid sharding's group of `--hsdp` ranks).
    comm: &'a dyn Comm,
    /// Hybrid sharding: the ranks holding the same run in the other shard groups, over which
    /// each averaged shard of a gradient is averaged again (`None`: one shard group).
    replicas: Option<&'a dyn Comm>,
    vars: &'a [(String, Var)],
    units: &'a [Vec<usize>],
    /// This rank's run of every variable (its weights at rest), in `vars`' order.
    pub shards: Vec<Var>,
    /// This rank's run of every variable's averaged gradient, once a use has made one.
    pub grads: Vec<Option<Tensor>>,
    /// A tied table's second use added into its shard (false only to show that `--check`
    /// catches its absence).
    pub second_use: bool,
    /// Which variables are whole now.
    whole: Vec<bool>,
}

impl<'a> Real<'a> {
    /// With `shards` (this rank's runs, [`Real::cut`]).
    pub fn new(
        comm: &'a dyn Comm,
        replicas: Option<&'a dyn Comm>,
        vars: &'a [(String, Var)],
        units: &'a [Vec<usize>],
        shards: Vec<Var>,
        second_use: bool,
    ) -> Self {
        let grads = vec![None; vars.len()];
        Real {
            comm,
            replicas,
            vars,
            units,
            shards,
            grads,
            second_use,
            whole: vec![false; vars.len()],
        }
    }

    /// Each of `vars` cut to this rank's run: the run copied into a variable of its own (in
    /// `into`, made before), then the whole one emptied, one variable at a time.
    pub fn cut(vars: &[(String, Var)], comm: &dyn Comm, into: &mut Vec<Var>) -> anyhow::Result<()> {
        for (_, var) in vars {
            let run = run_of(var.elem_count(), comm.size(), comm.rank());
            let shard = Var::zeros(run.len(), DType::F32, &Device::Cpu)?;
            with_f32_mut(var.as_tensor(), |w| {
                with_f32_mut(shard.as_tensor(), |s| s.copy_from_slice(&w[run]))
                    .expect("an f32 shard")
            })?;
            empty(var.as_tensor())?;
            into.push(shard);
        }
        Ok(())
    }

    /// Variable `i` whole again, from every rank's run (unless it is whole).
    fn gather_var(&mut self, i: usize) -> candle_core::Result<()> {
        if std::mem::replace(&mut self.whole[i], true) {
            return Ok(());
        }
        let var = &self.vars[i].1;
        let mut full = vec![0f32; var.elem_count()];
        with_f32_mut(self.shards[i].as_tensor(), |s| {
            self.comm.all_gather_into(s, &mut full)
        })?;
        fill(var.as_tensor(), full)
    }

    /// Every variable whole (the check's weights), once.
    pub fn gather_all(&mut self) -> candle_core::Result<()> {
        (0..self.vars.len()).try_for_each(|i| self.gather_var(i))
    }
}

impl Sharding<Tensor> for Real<'_> {
    fn gather(&mut self, unit: usize) -> candle_core::Result<()> {
        let units = self.units;
        units[unit].iter().try_for_each(|&i| self.gather_var(i))
    }

    fn reshard(&mut self, unit: usize) -> candle_core::Result<()> {
        for &i in &self.units[unit] {
            if std::mem::replace(&mut self.whole[i], false) {
                empty(self.vars[i].1.as_tensor())?;
            }
        }
        Ok(())
    }

    fn scatter(&mut self, var: usize, grad: Tensor) -> candle_core::Result<()> {
        let (ranks, me) = (self.comm.size(), self.comm.rank());
        let n = grad.elem_count();
        let shard = match &self.grads[var] {
            Some(_) if !self.second_use => return Ok(()),
            Some(s) => s.clone(),
            None => Tensor::zeros(run_of(n, ranks, me).len(), DType::F32, &Device::Cpu)?,
        };
        let add = self.grads[var].is_some();
        zero::reduce_scatter(&grad, &shard, self.comm, add)?;
        drop(grad);
        if let Some(replicas) = self.replicas {
            // Hybrid sharding: the shard group's average averaged over the replicas (a use
            // added before is the same on every replica, so it stays as it is).
            let scale = 1.0 / replicas.size() as f32;
            with_f32_mut(&shard, |s| {
                let send = s.to_vec();
                replicas.all_reduce_sum(&send, s);
                s.iter_mut().for_each(|x| *x *= scale);
            })?;
        }
        if !add {
            self.grads[var] = Some(shard);
        }
        Ok(())
    }
}

/// ZeRO 3 on the replay's symbolic tensors: a gather is a host buffer of the parameter's
/// bytes (the `Vec` [`fill`] hands over, no tensor bookkeeping), a first use's reduce-scatter
/// a shard tensor of the run, a second use's nothing (added in place).
pub struct Replayed {
    ledger: Rc<Ledger>,
    units: Vec<Vec<usize>>,
    /// Each variable's elements and this rank's run's.
    elems: Vec<usize>,
    runs: Vec<usize>,
    gathered: Vec<Option<HostBytes>>,
    pub grads: Vec<Option<Sym>>,
    /// Hybrid sharding over several shard groups: each shard's all-reduce over the replicas
    /// copies it first (a host buffer of the run, freed once reduced).
    replicas: bool,
}

impl Sharding<Sym> for Replayed {
    fn gather(&mut self, unit: usize) -> candle_core::Result<()> {
        for &i in &self.units[unit] {
            if self.gathered[i].is_none() {
                self.gathered[i] = Some(self.ledger.host(4 * self.elems[i]));
            }
        }
        Ok(())
    }

    fn reshard(&mut self, unit: usize) -> candle_core::Result<()> {
        for &i in &self.units[unit] {
            self.gathered[i] = None;
        }
        Ok(())
    }

    fn scatter(&mut self, var: usize, grad: Sym) -> candle_core::Result<()> {
        let shard = self.grads[var]
            .is_none()
            .then(|| Sym::new(&self.ledger, &[self.runs[var]], SymType::F32));
        drop(grad);
        if self.replicas {
            drop(self.ledger.host(4 * self.runs[var]));
        }
        if let Some(shard) = shard {
            self.grads[var] = Some(shard);
        }
        Ok(())
    }
}

/// The replay's ZeRO 3 forward and backward of `shape` on rank `rank` of `ranks`: (forward
/// peak, forward retained, backward peak, backward retained), each above its window's start.
pub fn replay(
    shape: &Shape,
    threads: usize,
    ranks: usize,
    rank: usize,
    prefetch: bool,
    schedule: ForwardSchedule,
    replicas: bool,
) -> anyhow::Result<(u64, u64, u64, i64)> {
    crate::formula::replay::with_training_model(
        shape,
        shape.meta(META_PER_TENSOR),
        shape.cpu.then_some(threads),
        |ledger, model, vars, tokens, targets| {
            let units = units(model, vars)?;
            let elems: Vec<usize> = vars.iter().map(|v| v.dims().iter().product()).collect();
            let mut sh = Replayed {
                ledger: ledger.clone(),
                units: units.clone(),
                runs: elems
                    .iter()
                    .map(|&n| run_of(n, ranks, rank).len())
                    .collect(),
                elems,
                gathered: (0..vars.len()).map(|_| None).collect(),
                grads: vec![None; vars.len()],
                replicas,
            };
            let base = ledger.reset_peak();
            ledger.set_stage("forward");
            let fwd = forward(model, tokens, targets, &units, &mut sh, schedule).sure();
            let forward_peak = ledger.window_peak(base);
            let forward_retained = ledger.current() - base;
            let base = ledger.reset_peak();
            ledger.set_stage("backward");
            backward(vars, fwd, &units, &mut sh, prefetch).sure();
            let backward_peak = ledger.window_peak(base);
            let backward_retained = ledger.current() as i64 - base as i64;
            ledger.set_stage("done");
            Ok((
                forward_peak,
                forward_retained,
                backward_peak,
                backward_retained,
            ))
        },
    )
}

/// The variables' elements in the order a rank visits them (by name, as
/// [`super::named_vars`]), from the shape's own list.
fn sizes_by_name(shape: &Shape) -> Vec<u64> {
    let mut named = shape.named_variables();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    named
        .iter()
        .map(|(_, dims)| dims.iter().product())
        .collect()
}

/// Each window's (peak, retained) predicted for rank `rank` of `ranks` ([`WINDOWS`]).
pub fn predict_windows(
    case: &Case,
    plan: Plan,
    ranks: usize,
    rank: usize,
    replicas: bool,
) -> anyhow::Result<Vec<(u64, i64)>> {
    // Beside tp: the replay of the rank's shard with its collectives.
    let shape = if plan.tp > 1 {
        super::tensor::train_shape(case, plan.tp, false)?
    } else {
        Shape::of(case)
    };
    let init = shape.predict(Phase::Init, case.optimizer, plan.threads);
    let sizes = sizes_by_name(&shape);
    let run = |n: u64| run_of(n as usize, ranks, rank).len() as u64;
    // shard: each run made (data and a tensor's bookkeeping) before its whole one is freed.
    let (mut level, mut shard_peak) = (0i64, 0i64);
    for &n in &sizes {
        level += (4 * run(n) + TENSOR_META) as i64;
        shard_peak = shard_peak.max(level);
        level -= 4 * n as i64;
    }
    let shard = (shard_peak.max(0) as u64, level);
    let (fp, fr, bp, br) = replay(
        &shape,
        plan.threads,
        ranks,
        rank,
        plan.prefetch,
        plan.forward_schedule(),
        replicas,
    )?;
    // The optimizer: the state of every run, as ZeRO 1's of the same runs.
    let stepper = Stepper::new(case.optimizer, crate::optim::LEARNING_RATE)?;
    let (m, v) = stepper.state();
    let moments = m as u64 + v as u64;
    let owned: u64 = sizes.iter().map(|&n| run(n)).sum();
    let count = sizes.len() as u64;
    let state = if plan.offload {
        // The slots' bookkeeping only: the partition is in the host arena.
        (zero::SLOT_BYTES + super::offload::HOST_SLOT_BYTES) * count
    } else {
        moments * (4 * owned + TENSOR_META * count) + zero::SLOT_BYTES * count
    };
    let step = fp.max(fr + bp);
    Ok(vec![
        (init.peak_bytes, init.retained_bytes),
        shard,
        (fp, fr as i64),
        (bp, br),
        (state, state as i64),
        (step, 0),
    ])
}

/// Runs one ZeRO 3 rank of `case` over `comm`, measuring and predicting its windows.
pub fn run_fsdp_rank(case: &Case, plan: Plan, comm: &dyn Comm) -> anyhow::Result<RankReport> {
    check_fsdp(case)?;
    let world = comm;
    // Beside tensor parallelism (`--tp N`, tp innermost): each rank's tp shard sharded over the
    // ranks holding the same shard (torchtitan's 2-D FSDP × TP), its collectives over its
    // tensor-parallel group.
    let tp = plan.tp;
    ensure!(
        world.size().is_multiple_of(tp),
        "ranks --tp {tp} --zero 3: launched on {} ranks, not a multiple of {tp}",
        world.size()
    );
    if tp > 1 {
        super::tensor::check_tp(case, tp)?;
    }
    let (tp_group, dp_group) = match tp {
        1 => (None, None),
        _ => {
            let (t, d) = super::tensor::split_groups(world, tp);
            (Some(t), Some(d))
        }
    };
    let tp_rank = tp_group.as_ref().map_or(0, |g| g.rank());
    // The ranks holding the same parameters: the world, or beside tp the data-parallel group.
    let base: &dyn Comm = dp_group.as_deref().unwrap_or(world);
    // Hybrid sharding (`--hsdp S`): shard groups of S consecutive ranks of `base`, each run
    // replicated over the groups; else one shard group of every rank.
    let groups = match plan.hsdp {
        0 => 1,
        s => base.size() / s,
    };
    let (shard_group, replica_group) = if groups > 1 {
        let s = plan.hsdp;
        (
            Some(base.split(base.rank() / s)),
            Some(base.split(base.rank() % s)),
        )
    } else {
        (None, None)
    };
    let comm: &dyn Comm = shard_group.as_deref().unwrap_or(base);
    let replicas = replica_group.as_deref();
    let (rank, ranks) = (comm.rank(), comm.size());
    let mut measured = Vec::with_capacity(WINDOWS.len());
    let rss_now = vm_rss_bytes;
    // init: the model whole (beside tp: the rank's shard, filled with its slice of the whole
    // model's fill), as every other stage builds it.
    let (tokens, targets, varmap, model, vars, _membership) = match &tp_group {
        None => {
            let super::Start {
                tokens,
                targets,
                varmap,
                model,
                vars,
            } = super::start(case, world, true, &mut measured)?;
            (tokens, targets, varmap, model, vars, None)
        }
        Some(group) => {
            let start = super::tensor::start_shard(case, group, base, &mut measured)?;
            let model = super::tensor::megatron_rank(
                start.model,
                case,
                super::tensor::training_collectives(case, &plan),
                (group.rank(), group.size()),
            );
            (
                start.tokens,
                start.targets,
                start.varmap,
                model,
                start.vars,
                Some(start._group),
            )
        }
    };
    let tensors: Vec<Var> = vars.iter().map(|(_, v)| v.clone()).collect();
    let units = units(&model, &tensors)?;
    // shard
    let mut shards = Vec::with_capacity(vars.len());
    comm.barrier();
    let ((), p, r, s) = window(|| Real::cut(&vars, comm, &mut shards))?;
    measured.push((p, r, s, rss_now()));
    let mut sh = Real::new(comm, replicas, &vars, &units, shards, plan.tied_second_use);

    // forward, backward
    comm.barrier();
    let fs = plan.forward_schedule();
    let (fwd, p, r, s) = window(|| Ok(forward(&model, &tokens, &targets, &units, &mut sh, fs)?))?;
    measured.push((p, r, s, rss_now()));
    let ((), p, r, s) = window(|| Ok(backward(&tensors, fwd, &units, &mut sh, plan.prefetch)?))?;
    measured.push((p, r, s, rss_now()));
    let grads_held = measured[2].1 + measured[3].1;
    let gradient_rel_diff = if plan.check {
        // Rows of the global batch: one `B` a rank holding the same parameters.
        let replicas = base.size();
        Some(check_gradients(
            case,
            replicas,
            (tp_rank, tp),
            comm,
            &vars,
            &sh.grads,
        )?)
    } else {
        None
    };
    // optimizer
    let stepper = Stepper::new(case.optimizer, crate::optim::LEARNING_RATE)?;
    // (ZeRO-Offload: each shard's optimizer in host memory, the host arena measured too.)
    let ((mut opt, p, r, s), opt_host) = super::host_window(|| {
        let mut o = if plan.offload {
            zero::Sharded::offloaded_over(stepper, 0, sh.shards.iter(), &Solo)?
        } else {
            zero::Sharded::over(stepper, 0, sh.shards.iter(), &Solo)?
        };
        o.step_each(&sh.grads)?;
        Ok(o)
    })?;
    measured.push((p, r, s, rss_now()));
    sh.grads.iter_mut().for_each(|g| *g = None);
    // train-step: the steady state's whole step
    comm.barrier();
    let (((), p, r, s), step_host) = super::host_window(|| {
        let fwd = forward(&model, &tokens, &targets, &units, &mut sh, fs)?;
        backward(&tensors, fwd, &units, &mut sh, plan.prefetch)?;
        opt.step_each(&sh.grads)?;
        sh.grads.iter_mut().for_each(|g| *g = None);
        Ok(())
    })?;
    measured.push((p, r, s, rss_now()));

    let predicted = predict_windows(case, plan, ranks, rank, replicas.is_some())?;
    let mut windows = windows_of(&measured, &predicted);
    if plan.offload {
        let host = super::predict_host_windows(&Shape::of(case), case.optimizer, ranks, rank);
        // The partition made in `optimizer`, nothing in the steady step.
        for (w, (m, p)) in windows[4..]
            .iter_mut()
            .zip([(opt_host, host[1]), (step_host, host[3])])
        {
            w.host = Some(super::HostWindow {
                peak_bytes: m.0,
                retained_bytes: m.1,
                predicted_peak_bytes: p.0,
                predicted_retained_bytes: p.1,
            });
        }
    }
    let states = states(case, plan, ranks, &windows, grads_held)?;
    let check = match gradient_rel_diff {
        Some(gradient_rel_diff) => {
            sh.gather_all()?;
            let weight_rel_diff = if tp > 1 {
                super::tensor::check_weights(case, (tp_rank, tp), base.size(), &vars)?
            } else {
                super::check_weights(case, world, &vars)?
            };
            Some(Check {
                gradient_rel_diff,
                weight_rel_diff,
            })
        }
        None => None,
    };
    drop((opt, sh, model, varmap));
    Ok(RankReport {
        rank: world.rank(),
        ranks: world.size(),
        zero: 3,
        tp,
        ep: 1,
        windows,
        states,
        rss_peak_bytes: vm_hwm_bytes(),
        check,
    })
}

/// This rank's gradients, every variable's runs gathered from every rank's shard, against one
/// process's on the whole global batch of `replicas` × `B` rows (beside tp: the slice rank
/// `tp_rank` of `tp` holds).
fn check_gradients(
    case: &Case,
    replicas: usize,
    (tp_rank, tp): (usize, usize),
    comm: &dyn Comm,
    vars: &[(String, Var)],
    grads: &[Option<Tensor>],
) -> anyhow::Result<f64> {
    let single = super::Single::new(case, replicas)?;
    let reference = single.step().gradients()?;
    super::compare(vars, &single.vars, |name, v, w| {
        let i = vars
            .iter()
            .position(|(n, _)| n == name)
            .expect("a rank's own variable");
        let shard = grads[i]
            .as_ref()
            .with_context(|| format!("ranks check: no gradient for {name}"))?;
        let mut full = vec![0f32; v.elem_count()];
        with_f32_mut(shard, |s| comm.all_gather_into(s, &mut full))?;
        let n = full.len();
        let theirs = super::grad_of(&reference, name, w)?;
        Ok((
            Tensor::from_vec(full, n, &Device::Cpu)?,
            super::tensor::slice_of(&theirs, v.dims(), tp_rank, tp)?.flatten_all()?,
        ))
    })
}

/// The model states a ZeRO 3 rank holds entering the optimizer, measured (the weights: the
/// model built and cut to its runs; the gradients: what the forward and backward left; the
/// state: the optimizer window's) and predicted by `formula::zero::shards` at stage 3.
fn states(
    case: &Case,
    plan: Plan,
    ranks: usize,
    w: &[Window],
    grads_held: i64,
) -> anyhow::Result<States> {
    let shape = Shape::of(case);
    let p = shape.params();
    // Beside tp: the tp rank's states (Megatron's vocab-parallel rank) sharded.
    let states = if plan.tp > 1 {
        super::tensor::predicted_f32_tp_states(case, plan.tp)?
    } else {
        let state = crate::formula::parallel::rates(4, case.optimizer).map_or(0, |(_, _, o)| o * p);
        (4 * p, 4 * p, state)
    };
    let n = ranks as u64;
    let ((pw, pg, po), host) = if plan.offload {
        let (device, host) = crate::formula::zero::offloaded(3, n, states, p, false);
        let host = super::HostStates {
            bytes: w[4].host.map_or(0, |h| h.retained_bytes),
            predicted_master_bytes: host.0,
            predicted_gradient_bytes: host.1,
            predicted_optimizer_state_bytes: host.2,
        };
        (device, Some(host))
    } else {
        (crate::formula::zero::shards(3, n, states, false), None)
    };
    Ok(States {
        weights_bytes: w[0].retained_bytes + w[1].retained_bytes,
        gradient_bytes: grads_held,
        optimizer_state_bytes: w[4].retained_bytes,
        predicted_weights_bytes: pw,
        predicted_gradient_bytes: pg,
        predicted_optimizer_state_bytes: po,
        host,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ranks::{fill_deterministic, named_vars};
    use candle_nn::{VarBuilder, VarMap};

    /// The elements `t`'s storage holds now.
    fn held(t: &Tensor) -> usize {
        match &*t.storage_and_layout().0 {
            candle_core::Storage::Cpu(CpuStorage::F32(v)) => v.len(),
            _ => panic!("an f32 CPU tensor"),
        }
    }

    /// Emptying a parameter frees its data and leaves its shape; a view made before (a
    /// transposed copy the graph would keep) reads the refilled data; an op on the emptied
    /// storage fails instead of reading stale bytes.
    #[test]
    fn empty_and_fill_share_the_storage() -> anyhow::Result<()> {
        let w = Var::from_vec((0..6).map(|x| x as f32).collect(), (2, 3), &Device::Cpu)?;
        let t = w.as_tensor().t()?;
        empty(w.as_tensor())?;
        assert_eq!(w.dims(), &[2, 3]);
        assert_eq!((held(w.as_tensor()), held(&t)), (0, 0));
        // Refilled: the view reads the new values through the same storage.
        fill(w.as_tensor(), (10..16).map(|x| x as f32).collect())?;
        assert_eq!(
            t.to_vec2::<f32>()?,
            vec![vec![10., 13.], vec![11., 14.], vec![12., 15.]]
        );
        // A filled parameter is not filled twice; a wrong length is refused.
        assert!(fill(w.as_tensor(), vec![0.; 6]).is_err());
        empty(w.as_tensor())?;
        assert!(fill(w.as_tensor(), vec![0.; 5]).is_err());
        // A view that does not own its storage is not emptied.
        let v = Tensor::arange(0f32, 8., &Device::Cpu)?;
        assert!(empty(&v.narrow(0, 2, 3)?).is_err());
        Ok(())
    }

    /// Emptying drops the data's allocation (capacity 0 left); filling hands the vector over
    /// as the storage, not a copy of it (the same allocation).
    #[test]
    fn empty_frees_and_fill_moves() -> anyhow::Result<()> {
        let w = Var::zeros((256, 64), DType::F32, &Device::Cpu)?;
        empty(w.as_tensor())?;
        let cap = match &*w.as_tensor().storage_and_layout().0 {
            candle_core::Storage::Cpu(CpuStorage::F32(v)) => v.capacity(),
            _ => unreachable!(),
        };
        assert_eq!(cap, 0);
        let data = vec![1f32; 256 * 64];
        let at = data.as_ptr();
        fill(w.as_tensor(), data)?;
        match &*w.as_tensor().storage_and_layout().0 {
            candle_core::Storage::Cpu(CpuStorage::F32(v)) => assert_eq!(v.as_ptr(), at),
            _ => unreachable!(),
        }
        assert_eq!(
            w.as_tensor().sum_all()?.to_scalar::<f32>()?,
            (256 * 64) as f32
        );
        Ok(())
    }

    /// One process (`Solo`): the forward and backward of a small tied GPT through the units
    /// (every parameter emptied at rest, gathered while its unit runs) give the by-block
    /// backward's gradients, the tied table's the sum of its two uses; without the second use
    /// the table's gradient differs.
    #[test]
    fn one_rank_gives_the_by_block_gradients() -> anyhow::Result<()> {
        let cfg = crate::model::config::Config {
            tied: true,
            ..crate::model::config::Config::tiny()
        };
        let (tokens, targets) =
            crate::model::transformer::synthetic_batch(2, 16, cfg.vocab, &Device::Cpu)?;
        // Each variable's name, its gradient through the units, the by-block one.
        type Compared = Vec<(String, Vec<f32>, Vec<f32>)>;
        /// The sharding of `Real`, counting the units whole at once.
        struct Counting<'a> {
            real: Real<'a>,
            whole: std::collections::BTreeSet<usize>,
            most: usize,
            gathers: usize,
        }
        impl Sharding<Tensor> for Counting<'_> {
            fn gather(&mut self, unit: usize) -> candle_core::Result<()> {
                self.gathers += 1;
                self.whole.insert(unit);
                self.most = self.most.max(self.whole.len());
                self.real.gather(unit)
            }
            fn reshard(&mut self, unit: usize) -> candle_core::Result<()> {
                self.whole.remove(&unit);
                self.real.reshard(unit)
            }
            fn scatter(&mut self, var: usize, grad: Tensor) -> candle_core::Result<()> {
                self.real.scatter(var, grad)
            }
        }
        let run = |second_use: bool, prefetch: bool| -> anyhow::Result<Compared> {
            let varmap = VarMap::new();
            let model = Transformer::new(
                &cfg,
                VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
            )?;
            let vars = named_vars(&varmap);
            fill_deterministic(&vars)?;
            let tensors: Vec<Var> = vars.iter().map(|(_, v)| v.clone()).collect();
            // The by-block reference, before anything is emptied.
            let fwd = by_block::forward(&model, None, &tokens, &targets)?;
            let want = by_block::backward(&tensors, fwd)?;
            let units = units(&model, &tensors)?;
            assert_eq!(units.len(), cfg.layers + 2);
            let wte = vars.iter().position(|(n, _)| n == "wte.weight").unwrap();
            assert!(units[0].contains(&wte) && units[units.len() - 1].contains(&wte));
            let mut shards = Vec::new();
            Real::cut(&vars, &Solo, &mut shards)?;
            assert!(vars.iter().all(|(_, v)| held(v.as_tensor()) == 0));
            let mut sh = Counting {
                real: Real::new(&Solo, None, &vars, &units, shards, second_use),
                whole: Default::default(),
                most: 0,
                gathers: 0,
            };
            // The forward prefetch with the backward's: two units whole at once in each.
            let schedule = ForwardSchedule {
                prefetch,
                ..ForwardSchedule::DEFAULT
            };
            let fwd = forward(&model, &tokens, &targets, &units, &mut sh, schedule)?;
            // Every unit gathered once in the forward.
            assert_eq!(
                (sh.most, sh.gathers),
                (if prefetch { 2 } else { 1 }, units.len())
            );
            (sh.most, sh.gathers) = (0, 0);
            backward(&tensors, fwd, &units, &mut sh, prefetch)?;
            // Every unit gathered once in the backward; with the prefetch, two whole at once.
            assert_eq!(sh.gathers, units.len());
            assert_eq!(sh.most, if prefetch { 2 } else { 1 });
            assert!(sh.whole.is_empty());
            let sh = sh.real;
            vars.iter()
                .enumerate()
                .map(|(i, (name, v))| {
                    Ok((
                        name.clone(),
                        sh.grads[i].as_ref().unwrap().to_vec1::<f32>()?,
                        want.get(v.as_tensor())
                            .unwrap()
                            .flatten_all()?
                            .to_vec1::<f32>()?,
                    ))
                })
                .collect()
        };
        let diff = |a: &[f32], b: &[f32]| {
            a.iter()
                .zip(b)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max)
        };
        for prefetch in [false, true] {
            for (name, got, want) in run(true, prefetch)? {
                assert!(diff(&got, &want) < 1e-6, "{name}: {}", diff(&got, &want));
            }
        }
        for (name, got, want) in run(false, true)? {
            let d = diff(&got, &want);
            if name == "wte.weight" {
                assert!(d > 1e-4, "the table's gradient without its second use: {d}");
            } else {
                assert!(d < 1e-6, "{name}: {d}");
            }
        }
        Ok(())
    }
}
