//! ZeRO data parallelism on real ranks: the gradients averaged over the data-parallel group
//! (stages 0 and 1: all-reduced whole; stage 2: reduce-scattered, each rank keeping its shard),
//! each rank's optimizer stepping only its shard of every parameter with the state of that
//! shard (stages 1 and 2), and the updated shards broadcast back into every rank's weights.
//!
//! A shard: each parameter's elements in `N` contiguous runs of `⌈n/N⌉` (the last shorter, or
//! empty), rank `r` owning run `r` — FSDP2's per-parameter sharding, flattened. The update is
//! [`Stepper::apply`] on views of the runs, so a rank's arithmetic is the single process's
//! element for element.
//!
//! What each collective holds (the library's own buffers are outside the counting allocator):
//! - all-reduce (stages 0, 1): in buckets of at most [`BUCKET_ELEMS`] (PyTorch DDP's
//!   `bucket_cap_mb = 25`): each bucket copied into one send buffer and reduced into the
//!   gradient's storage, so the window holds one buffer of `4·min(BUCKET_ELEMS, largest n)` B;
//! - reduce-scatter (stage 2): for each parameter, largest first, its shard allocated and the
//!   whole gradient dropped once reduced, so the window peaks at the largest shard;
//! - the gather: broadcasts in place into the weights, nothing allocated.
//!
//! candle's backward makes every gradient before any is reduced, so the backward's peak holds
//! all of them at every stage; DeepSpeed's stage 2 reduces buckets during the backward.

use std::cell::RefCell;
use std::ops::Range;

use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, DType, InplaceOp1, Layout, Result, Tensor, Var, bail};

use super::comm::{Comm, Solo};
use super::offload::HostSlot;
use crate::optim::inplace::Stepper;

/// Elements a bucket of the all-reduce holds: PyTorch DDP's 25 MiB of f32.
pub const BUCKET_ELEMS: usize = 25 * 1024 * 1024 / 4;

/// Rank `r`'s run of `n` elements over `ranks` ranks: `⌈n/ranks⌉` each, the last shorter.
pub fn run_of(n: usize, ranks: usize, r: usize) -> Range<usize> {
    let c = n.div_ceil(ranks);
    (r * c).min(n)..((r + 1) * c).min(n)
}

/// `f` on the `f32` data of a contiguous CPU tensor, mutably (through candle's in-place op, so
/// the storage's lock is held and nothing is copied).
pub fn with_f32_mut(t: &Tensor, f: impl FnOnce(&mut [f32])) -> Result<()> {
    struct Op<F>(RefCell<Option<F>>);
    impl<F: FnOnce(&mut [f32])> InplaceOp1 for Op<F> {
        fn name(&self) -> &'static str {
            "rank-buffer"
        }
        fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> Result<()> {
            let Some((a, b)) = layout.contiguous_offsets() else {
                bail!("a collective's buffer must be contiguous")
            };
            let CpuStorage::F32(data) = storage else {
                bail!("a collective's buffer must be f32")
            };
            let f = self.0.borrow_mut().take().expect("called once");
            f(&mut data[a..b]);
            Ok(())
        }
    }
    if t.dtype() != DType::F32 || !t.device().is_cpu() {
        bail!("ranks: collectives run on f32 tensors on the CPU")
    }
    t.inplace_op1(&Op(RefCell::new(Some(f))))
}

/// One parameter's shard and its state.
struct Slot {
    var: Var,
    /// This rank's run of the flattened parameter.
    run: Range<usize>,
    m: Option<Tensor>,
    v: Option<Tensor>,
}

/// Host bytes of the sharded optimizer's per-tensor slot, beside the state's own data and
/// bookkeeping.
pub const SLOT_BYTES: u64 = std::mem::size_of::<Slot>() as u64;

/// A data-parallel rank's optimizer under ZeRO `stage` (0: every rank steps every parameter
/// with its whole state, as plain data parallelism does; 1 and 2: its shard).
pub struct Sharded {
    stepper: Stepper,
    stage: u8,
    slots: Vec<Slot>,
    /// ZeRO-Offload ([`Sharded::offloaded`]): each slot's run in host memory (the slots then
    /// keep no state); empty otherwise.
    host: Vec<HostSlot>,
    step_t: i32,
}

impl Sharded {
    /// The state of this rank's shards of `vars` (in the order the steps visit them),
    /// allocated now.
    pub fn new(
        stepper: Stepper,
        stage: u8,
        vars: &[(String, Var)],
        comm: &dyn Comm,
    ) -> Result<Self> {
        Self::over(stepper, stage, vars.iter().map(|(_, v)| v), comm)
    }

    /// [`Sharded::new`] with the shard's optimizer in host memory (ZeRO-Offload, stages 1 and
    /// 2: [`super::offload`]): master weights, gradient buffer and state of each run made in
    /// the host arena now, nothing of the state on the device.
    pub fn offloaded(
        stepper: Stepper,
        stage: u8,
        vars: &[(String, Var)],
        comm: &dyn Comm,
    ) -> Result<Self> {
        if !(1..=2).contains(&stage) {
            bail!("ranks: ZeRO-Offload runs at stages 1 and 2 (stage {stage})")
        }
        Self::offloaded_over(stepper, stage, vars.iter().map(|(_, v)| v), comm)
    }

    /// [`Sharded::offloaded`] over the variables themselves (ZeRO 3: the shards, each a
    /// variable stepped whole, over [`super::comm::Solo`]), stepped with [`Sharded::step_each`].
    pub fn offloaded_over<'v>(
        stepper: Stepper,
        stage: u8,
        vars: impl ExactSizeIterator<Item = &'v Var>,
        comm: &dyn Comm,
    ) -> Result<Self> {
        let mut slots = Vec::with_capacity(vars.len());
        let mut host = Vec::with_capacity(vars.len());
        for var in vars {
            let run = run_of(var.elem_count(), comm.size(), comm.rank());
            host.push(HostSlot::new(&stepper, var, &run)?);
            slots.push(Slot {
                var: var.clone(),
                run,
                m: None,
                v: None,
            });
        }
        Ok(Self {
            stepper,
            stage,
            slots,
            host,
            step_t: 0,
        })
    }

    /// [`Sharded::new`] over the variables themselves (ZeRO 3: the shards, each stepped whole
    /// at stage 0 with [`Sharded::step_each`]).
    pub fn over<'v>(
        stepper: Stepper,
        stage: u8,
        vars: impl ExactSizeIterator<Item = &'v Var>,
        comm: &dyn Comm,
    ) -> Result<Self> {
        if stage > 2 {
            bail!("ranks: ZeRO stage {stage} is not run on ranks (stages 0 to 2)")
        }
        let slots = Self::slots(&stepper, stage, vars, comm)?;
        Ok(Self {
            stepper,
            stage,
            slots,
            host: Vec::new(),
            step_t: 0,
        })
    }

    /// This optimizer with `vars` stepped whole beside its shards, their state made now:
    /// expert parallelism's experts, whose data-parallel group is their owner alone (`dp/ep`
    /// ranks: 1 where every rank is an expert-parallel rank), beside the dense part sharded at
    /// the stage. Their gradients are whole at every stage (ZeRO 2's [`reduce`] leaves them).
    pub fn and_whole(mut self, vars: &[(String, Var)]) -> Result<Self> {
        let whole = Self::slots(&self.stepper, 0, vars.iter().map(|(_, v)| v), &Solo)?;
        self.slots.extend(whole);
        Ok(self)
    }

    /// A slot for each of `vars`: its run at `stage` and its state, allocated now.
    fn slots<'v>(
        stepper: &Stepper,
        stage: u8,
        vars: impl ExactSizeIterator<Item = &'v Var>,
        comm: &dyn Comm,
    ) -> Result<Vec<Slot>> {
        let (moments, second) = stepper.state();
        let mut slots = Vec::with_capacity(vars.len());
        for var in vars {
            let n = var.elem_count();
            let run = if stage == 0 {
                0..n
            } else {
                run_of(n, comm.size(), comm.rank())
            };
            let zeros = || Tensor::zeros(run.len(), var.dtype(), var.device());
            slots.push(Slot {
                m: moments.then(zeros).transpose()?,
                v: second.then(zeros).transpose()?,
                var: var.clone(),
                run,
            });
        }
        Ok(slots)
    }

    /// One step of every shard with its (averaged) gradient: at stage 2 the store holds the
    /// shard itself ([`reduce`]), else the whole gradient, of which the shard's run is read.
    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        self.step_by(|_, theta| grads.get(theta))
    }

    /// One step of every slot with `grads[i]`, the gradient of slot `i` (the order the
    /// variables were given in), where there is one.
    pub fn step_each(&mut self, grads: &[Option<Tensor>]) -> Result<()> {
        if grads.len() != self.slots.len() {
            bail!(
                "ranks: {} gradients for {} slots",
                grads.len(),
                self.slots.len()
            )
        }
        self.step_by(|i, _| grads[i].as_ref())
    }

    fn step_by<'g>(&mut self, grad: impl Fn(usize, &Tensor) -> Option<&'g Tensor>) -> Result<()> {
        self.step_t += 1;
        for (i, slot) in self.slots.iter().enumerate() {
            let theta = slot.var.as_tensor();
            let Some(g) = grad(i, theta) else { continue };
            if slot.run.is_empty() {
                continue;
            }
            if let Some(host) = self.host.get_mut(i) {
                host.step(
                    &self.stepper,
                    &slot.var,
                    &slot.run,
                    g,
                    self.stage == 2,
                    self.step_t,
                )?;
                continue;
            }
            let (start, len) = (slot.run.start, slot.run.len());
            let view = theta.flatten_all()?.narrow(0, start, len)?;
            // Stage 2 leaves each sharded variable's run in the store ([`reduce`]), a variable
            // stepped whole ([`Sharded::and_whole`]) its whole gradient: a gradient of the
            // run's length, flat, is the run.
            let g = if self.stage == 2 && g.rank() == 1 && g.elem_count() == len {
                g.clone()
            } else {
                g.flatten_all()?.narrow(0, start, len)?
            };
            self.stepper
                .apply(&view, &g, slot.m.as_ref(), slot.v.as_ref(), self.step_t)?;
        }
        Ok(())
    }
}

/// The gradients of `vars` summed over the ranks and divided by their number, as DDP averages
/// them: whole (stages 0, 1) or, stage 2, each rank left with its run of each (the store's
/// entry for a parameter replaced by it).
pub fn reduce(
    stage: u8,
    vars: &[(String, Var)],
    grads: &mut GradStore,
    comm: &dyn Comm,
) -> Result<()> {
    let ranks = comm.size();
    let scale = 1.0 / ranks as f32;
    agree_on_gradients(vars, grads, comm)?;
    if stage < 2 {
        let largest = vars.iter().map(|(_, v)| v.elem_count()).max();
        let mut send: Vec<f32> = Vec::with_capacity(largest.unwrap_or(0).min(BUCKET_ELEMS));
        for (_, var) in vars {
            let Some(g) = grads.get(var.as_tensor()) else {
                continue;
            };
            with_f32_mut(g, |g| {
                for part in g.chunks_mut(BUCKET_ELEMS) {
                    send.clear();
                    send.extend_from_slice(part);
                    comm.all_reduce_sum(&send, part);
                    part.iter_mut().for_each(|x| *x *= scale);
                }
            })?;
        }
        return Ok(());
    }
    // Stage 2: largest first, so the window's peak is the largest shard.
    let mut order: Vec<&Var> = vars.iter().map(|(_, v)| v).collect();
    order.sort_by_key(|v| std::cmp::Reverse(v.elem_count()));
    for var in order {
        let theta = var.as_tensor();
        let Some(g) = grads.get(theta) else { continue };
        let n = g.elem_count();
        let shard = Tensor::zeros(run_of(n, ranks, comm.rank()).len(), DType::F32, g.device())?;
        reduce_scatter(g, &shard, comm, false)?;
        // The whole gradient goes; the shard stays in its place.
        grads.insert(theta, shard);
    }
    Ok(())
}

/// Every rank reduces the same variables: one that has a gradient on some rank but none here
/// (a mixture's expert this rank's microbatch routed no token to) gets a zero gradient first,
/// as DDP's bucket holds a zero for an unused parameter, so the ranks issue the same
/// collectives in the same order (before, such a variable was skipped on one rank only: the
/// collectives mismatched, `MPI_ERR_TRUNCATE`). A variable with no gradient anywhere stays
/// without one. Costs one all-reduce of a flag a variable.
fn agree_on_gradients(
    vars: &[(String, Var)],
    grads: &mut GradStore,
    comm: &dyn Comm,
) -> Result<()> {
    if comm.size() == 1 {
        return Ok(());
    }
    let held: Vec<f32> = vars
        .iter()
        .map(|(_, v)| f32::from(u8::from(grads.get(v.as_tensor()).is_some())))
        .collect();
    let mut anywhere = vec![0f32; held.len()];
    comm.all_reduce_sum(&held, &mut anywhere);
    for (((_, var), here), any) in vars.iter().zip(&held).zip(&anywhere) {
        if *here == 0.0 && *any > 0.0 {
            let theta = var.as_tensor();
            grads.insert(theta, theta.zeros_like()?);
        }
    }
    Ok(())
}

/// The gradient `g` summed over the ranks and divided by their number, this rank's run of it
/// into `shard` (each rank's run reduced to its owner). With `add`, `shard` already holds an
/// earlier use's average, added back first (N times, into this rank's run of `g`, so the
/// average over the ranks is both uses'): `g` is changed in place then.
pub fn reduce_scatter(g: &Tensor, shard: &Tensor, comm: &dyn Comm, add: bool) -> Result<()> {
    let (ranks, me) = (comm.size(), comm.rank());
    let n = g.elem_count();
    let scale = 1.0 / ranks as f32;
    let mut mine = Ok(());
    with_f32_mut(g, |g| {
        for r in 0..ranks {
            let run = run_of(n, ranks, r);
            if r == me {
                // The shard's storage, borrowed for the reduce.
                mine = with_f32_mut(shard, |s| {
                    if add {
                        let f = ranks as f32;
                        g[run.clone()]
                            .iter_mut()
                            .zip(s.iter())
                            .for_each(|(x, y)| *x += f * y);
                    }
                    comm.reduce_sum(r, &g[run], Some(s));
                    s.iter_mut().for_each(|x| *x *= scale);
                });
            } else {
                comm.reduce_sum(r, &g[run], None);
            }
        }
    })?;
    mine
}

/// Every rank's updated runs of `vars` into every rank's weights, in place (stages 1, 2;
/// nothing at 0, where every rank stepped everything).
pub fn gather(stage: u8, vars: &[(String, Var)], comm: &dyn Comm) -> Result<()> {
    if stage == 0 {
        return Ok(());
    }
    let ranks = comm.size();
    for (_, var) in vars {
        let n = var.elem_count();
        with_f32_mut(var.as_tensor(), |w| {
            for r in 0..ranks {
                comm.broadcast(r, &mut w[run_of(n, ranks, r)]);
            }
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_cover_every_element_once() {
        for n in [0, 1, 5, 7, 8, 1000, 1001] {
            for ranks in 1..=5 {
                let runs: Vec<_> = (0..ranks).map(|r| run_of(n, ranks, r)).collect();
                assert_eq!(runs[0].start, 0);
                assert_eq!(runs[ranks - 1].end, n);
                for w in runs.windows(2) {
                    assert_eq!(w[0].end, w[1].start, "n {n} ranks {ranks}");
                }
                assert!(runs.iter().all(|r| r.len() <= n.div_ceil(ranks)));
            }
        }
    }
}
