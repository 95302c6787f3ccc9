//! Expert parallelism on real ranks (issue 53), the layout DeepSpeed-MoE and Megatron-Core run
//! (EP inside DP): the `N` ranks of the MPI world are both the data-parallel group and the
//! expert-parallel group. Every rank holds the dense part whole (the token table, attention,
//! norms, the routers, shared experts, the head) and trains on its own microbatch (rank `r`
//! rows `r·B..(r+1)·B` of one synthetic global batch, as [`super::run_rank`]); rank `r` holds
//! the routed experts `r·E/N..(r+1)·E/N` of every sparse layer, under their global names.
//!
//! A sparse layer's forward ([`ExpertParallel`], the model's [`MoeParallel`] hook): the router
//! and top-k on the rank's own tokens ([`Moe::routed`], as one device routes); every rank's
//! tokens per expert exchanged (one all-gather of `E` counts); the `k·T` (token, expert) rows
//! gathered in expert order, `X_send (k·T, H)`, and the routing weights' rows `W_send (k·T, E)`,
//! each sent to the experts' owner by one all-to-all (`MPI_Alltoallv`, [`Comm::all_to_all_v`]:
//! the experts of a rank are contiguous, so expert order is rank order); the owner receives
//! `X_recv (R, H)` and `W_recv (R, E)`, laid out expert by expert (for each of its experts, the
//! rows of rank 0, then rank 1, …), and runs each expert as one device does — its rows gathered
//! (`index_select`), the expert's output scaled by its routing-weight column in the down
//! projection — then concatenates them, `Y (R, H)`, which the reverse all-to-all returns to the
//! rows' home ranks, `Y_back (k·T, H)` in `X_send`'s order, added into the `(T, H)` output at
//! the tokens' ids (each token's experts in ascending order, as one device adds them).
//! The exchanges are candle ops ([`Dispatch`], [`Return`]) whose backward is the exchange the
//! other way: the gradient of `X_recv` and `W_recv` go back to the rows' home ranks, the
//! gradient of `Y_back` to the owners. candle's backward meets them in the same order on every
//! rank: a layer's `Return`, its `W` and `X` dispatches (the expert's scaled product reads its
//! input before its scale), then the layer below.
//!
//! Gradients: the dense part's are averaged over the ranks (an all-reduce, as data parallelism);
//! an expert's already sum every rank's tokens on its owner (each rank's loss the mean over its
//! own `B·S` tokens), so they are divided by `N` to be the mean over the global batch.
//! `--check` compares every rank's gradients and weights after two steps with one process
//! training the whole global batch with every expert (by name: a rank's experts against the
//! same experts of the whole model).
//!
//! Predictions ([`predict_ep_windows`]): `forward`, `backward` and `train-step` are the replay
//! of this rank's own step on symbolic tensors ([`crate::formula::replay::replay_training_ep`]):
//! the rank's model (its experts held) whose sparse layers run this forward statement by
//! statement (`formula::replay::expert`), each exchange a
//! [`Kernel::Exchange`](crate::model::kernels::Kernel::Exchange) — its output rows, the host
//! buffer it holds while reordering (`R·cols` floats: the rows received rank by rank before they
//! are laid out expert by expert, or the rows laid out rank by rank before they go home), and in
//! the backward the same exchange the other way — at the row counts this rank's run recorded
//! (`k·T` rows sent, `R` received: the routing depends on the data, so it is predicted from the
//! measured routing, as a single device's mixture of experts is from its snapshot). Per sparse
//! layer the graph keeps, beyond one device's: `Y_back (k·T, H)` and `k·T` ids where one device
//! keeps `Y (R, H)` and `R` ids (`Y` is released once returned), and the nodes of the four
//! released exchange tensors. Not in the replay: the exchange plan the three ops share (a few
//! hundred bytes a layer), the counts' all-gather (`4·E` bytes a rank, transient) and the
//! routing's record; measured, every window is within 5.4 KB of its prediction on the wide slice
//! of `tests/ranks.rs` (the one-device replay alone: 4.9 KB on the forward there). `reduce` is
//! the dense all-reduce's bucket, `optimizer` the rank's AdamW state by the data-parallel
//! arithmetic over its variables, `init` the whole model's less the experts it lacks.

use std::cell::RefCell;
use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;

use anyhow::{Context, ensure};
use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Storage, Tensor};
use candle_nn::{Init, VarBuilder, VarMap};

use super::comm::Comm;
use super::tensor::{Group, f32_data, with_group};
use super::{Check, Plan, RankReport, States, WINDOWS, Window, named_vars, window, zero};
use crate::meter::rusage::{vm_hwm_bytes, vm_rss_bytes};
use crate::model::config::{Config, ProjSpec};
use crate::model::moe::{HostRouting, Moe, MoeParallel};
use crate::model::proj::Proj;
use crate::model::shapes::RopeScaling;
use crate::model::tensor_ops::TensorOps;
use crate::model::transformer::Transformer;
use crate::model::weights::Weights;
use crate::optim::inplace::Stepper;
use crate::workload::Case;

/// One sparse layer's exchange, from every rank's tokens per expert: who sends what to whom.
#[derive(Debug)]
pub struct Exchange {
    /// This rank's tokens per expert (all `E`): the rows it sends, in expert order.
    pub sent: Vec<usize>,
    /// Rows this rank sends to each rank (its tokens' rows for that rank's experts).
    pub send_rows: Vec<usize>,
    /// `from[s][j]`: rows rank `s` sends this rank for its `j`-th expert.
    pub from: Vec<Vec<usize>>,
    /// The dispatch's backward sends nothing back (only to show that `--check` catches it).
    skip_backward: bool,
}

impl Exchange {
    /// Rows received from each rank.
    fn recv_rows(&self) -> Vec<usize> {
        self.from.iter().map(|f| f.iter().sum()).collect()
    }

    /// Rows received for each of this rank's experts.
    pub fn expert_rows(&self) -> Vec<usize> {
        let per = self.from.first().map_or(0, Vec::len);
        (0..per)
            .map(|j| self.from.iter().map(|f| f[j]).sum())
            .collect()
    }

    /// `(rank, expert)` blocks of `cols`-wide rows, in the order `rank_major` says, and where
    /// each starts in the other order: (start rank-major, start expert-major, rows).
    fn blocks(&self) -> Vec<(usize, usize, usize)> {
        let per = self.from.first().map_or(0, Vec::len);
        let mut expert_start = vec![0usize; self.from.len() * per];
        let mut at = 0;
        for j in 0..per {
            for (s, f) in self.from.iter().enumerate() {
                expert_start[s * per + j] = at;
                at += f[j];
            }
        }
        let mut out = Vec::with_capacity(expert_start.len());
        let mut at = 0;
        for (s, f) in self.from.iter().enumerate() {
            for (j, &n) in f.iter().enumerate() {
                out.push((at, expert_start[s * per + j], n));
                at += n;
            }
        }
        out
    }

    /// Rows received rank by rank, laid out expert by expert (a fresh buffer).
    fn to_expert_major(&self, src: &[f32], cols: usize) -> Vec<f32> {
        let mut out = vec![0f32; src.len()];
        for (r, e, n) in self.blocks() {
            out[e * cols..(e + n) * cols].copy_from_slice(&src[r * cols..(r + n) * cols]);
        }
        out
    }

    /// Rows laid out expert by expert, rank by rank again (a fresh buffer).
    fn to_rank_major(&self, src: &[f32], cols: usize) -> Vec<f32> {
        let mut out = vec![0f32; src.len()];
        for (r, e, n) in self.blocks() {
            out[r * cols..(r + n) * cols].copy_from_slice(&src[e * cols..(e + n) * cols]);
        }
        out
    }

    /// The dispatch: rows in expert order (each rank's run in rank order) to their owners,
    /// what this rank receives laid out expert by expert. Holds, besides its output, the
    /// received rows rank by rank while it reorders them.
    fn dispatch(&self, send: &[f32], cols: usize) -> Result<Vec<f32>> {
        let recv_rows = self.recv_rows();
        let total: usize = recv_rows.iter().sum();
        let mut recv = vec![0f32; total * cols];
        let sc: Vec<usize> = self.send_rows.iter().map(|n| n * cols).collect();
        let rc: Vec<usize> = recv_rows.iter().map(|n| n * cols).collect();
        with_group(|c| c.all_to_all_v(send, &sc, &mut recv, &rc))?;
        Ok(self.to_expert_major(&recv, cols))
    }

    /// The return: rows laid out expert by expert back to their home ranks, in the order the
    /// dispatch took them. Holds, besides its output, the rows reordered rank by rank.
    fn give_back(&self, rows: &[f32], cols: usize) -> Result<Vec<f32>> {
        let send = self.to_rank_major(rows, cols);
        let home: usize = self.send_rows.iter().sum();
        let mut out = vec![0f32; home * cols];
        let sc: Vec<usize> = self.recv_rows().iter().map(|n| n * cols).collect();
        let rc: Vec<usize> = self.send_rows.iter().map(|n| n * cols).collect();
        with_group(|c| c.all_to_all_v(&send, &sc, &mut out, &rc))?;
        Ok(out)
    }
}

/// `f` on `t`'s rows (`(n, cols)`, contiguous f32 on the CPU) into a fresh `(rows, cols)`.
fn exchanged(
    t: &Tensor,
    rows: usize,
    f: impl FnOnce(&[f32], usize) -> Result<Vec<f32>>,
) -> Result<Tensor> {
    let t = t.contiguous()?;
    let cols = t.dims2()?.1;
    let out = {
        let (storage, layout) = t.storage_and_layout();
        let Storage::Cpu(cpu) = &*storage else {
            candle_core::bail!("ranks --ep: the exchanges run on the CPU")
        };
        f(f32_data(cpu, layout)?, cols)?
    };
    Tensor::from_vec(out, (rows, cols), t.device())
}

/// The dispatch of rows to the experts' owners; its backward returns their gradient.
struct Dispatch(Arc<Exchange>);

impl CustomOp1 for Dispatch {
    fn name(&self) -> &'static str {
        "ep-dispatch"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let cols = l.dims()[1];
        let out = self.0.dispatch(f32_data(s, l)?, cols)?;
        let rows = out.len() / cols.max(1);
        Ok((CpuStorage::F32(out), Shape::from((rows, cols))))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let home: usize = self.0.send_rows.iter().sum();
        if self.0.skip_backward {
            return Ok(Some(arg.zeros_like()?));
        }
        Ok(Some(exchanged(grad, home, |g, c| self.0.give_back(g, c))?))
    }
}

/// The return of the experts' rows to their home ranks; its backward dispatches their
/// gradient to the owners.
struct Return(Arc<Exchange>);

impl CustomOp1 for Return {
    fn name(&self) -> &'static str {
        "ep-return"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let cols = l.dims()[1];
        let out = self.0.give_back(f32_data(s, l)?, cols)?;
        let rows = out.len() / cols.max(1);
        Ok((CpuStorage::F32(out), Shape::from((rows, cols))))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let rows = arg.dims2()?.0;
        Ok(Some(exchanged(grad, rows, |g, c| self.0.dispatch(g, c))?))
    }
}

/// A sparse layer's forward over the ranks (the module doc): set on every mixture of experts
/// of a rank's model ([`Transformer::with_expert_parallel`]).
#[derive(Debug)]
pub struct ExpertParallel {
    rank: usize,
    ranks: usize,
    /// The dispatch's backward sends nothing back (`--ep-skip-dispatch-backward`).
    skip_dispatch_backward: bool,
    /// The last exchange of each sparse layer (by block index).
    exchanges: RefCell<Vec<Option<Arc<Exchange>>>>,
}

impl ExpertParallel {
    pub fn new(rank: usize, ranks: usize, layers: usize, skip_dispatch_backward: bool) -> Self {
        ExpertParallel {
            rank,
            ranks,
            skip_dispatch_backward,
            exchanges: RefCell::new(vec![None; layers]),
        }
    }

    /// The last forward's exchange of each sparse layer, in layer order.
    pub fn exchanges(&self) -> Vec<Arc<Exchange>> {
        self.exchanges.borrow().iter().flatten().cloned().collect()
    }
}

impl MoeParallel<Tensor, HostRouting> for ExpertParallel {
    fn forward(&self, moe: &Moe<Tensor, HostRouting>, x: &Tensor) -> Result<Tensor> {
        let (b, s, h) = x.dims3()?;
        let t = b * s;
        let xs = x.reshape((t, h))?;
        let (weights, ids) = moe.routed(&xs, x)?;
        let per = moe.shape.experts / self.ranks;
        let first = self.rank * per;
        let counts: Vec<usize> = ids.iter().map(|i| i.as_ref().map_or(0, Vec::len)).collect();
        let total: usize = counts.iter().sum();
        // Every token's rows in expert order (each expert's tokens ascending).
        let mut all = Vec::with_capacity(total);
        for i in ids.into_iter().flatten() {
            all.extend_from_slice(&i);
        }
        // Every rank's tokens per expert, on every rank: the rows this rank receives.
        let from: Vec<Vec<usize>> = {
            let mine: Vec<u8> = counts
                .iter()
                .flat_map(|&n| (n as u32).to_le_bytes())
                .collect();
            let table = with_group(|c| c.all_gather_bytes(&mine))?;
            table
                .iter()
                .map(|b| {
                    b.chunks_exact(4)
                        .skip(first)
                        .take(per)
                        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as usize)
                        .collect()
                })
                .collect()
        };
        let send_rows = (0..self.ranks)
            .map(|d| counts[d * per..(d + 1) * per].iter().sum())
            .collect();
        let ex = Arc::new(Exchange {
            sent: counts,
            send_rows,
            from,
            skip_backward: self.skip_dispatch_backward,
        });
        if let Some(slot) = self.exchanges.borrow_mut().get_mut(moe.routing.layer) {
            *slot = Some(ex.clone());
        }
        let ids_all = Tensor::from_vec(all, total, x.device())?;
        // The rows to the owners (no backward reads what is sent: released once sent).
        let x_send = xs.index_select(&ids_all, 0)?;
        let x_recv = x_send.apply_op1(Dispatch(ex.clone()))?;
        x_send.release_if(true)?;
        drop(x_send);
        let w_send = weights.index_select(&ids_all, 0)?;
        let w_recv = w_send.apply_op1(Dispatch(ex.clone()))?;
        w_send.release_if(true)?;
        drop((w_send, weights));
        // The owner's experts, each on its rows as one device runs an expert on its tokens.
        let dev = x.device();
        moe.expert_parallel_tail(
            x,
            xs,
            [x_recv, w_recv],
            ex.expert_rows(),
            first,
            |at, n| Tensor::from_vec((at as u32..(at + n) as u32).collect::<Vec<u32>>(), n, dev),
            |y| y.apply_op1(Return(ex.clone())),
            ids_all,
        )
    }
}

/// candle's weights of a rank: the routed experts `held` of every mixture (under their global
/// names), everything else whole.
#[derive(Clone)]
struct RankWeights<'a> {
    vb: VarBuilder<'a>,
    held: Range<usize>,
}

impl Weights for RankWeights<'_> {
    type Tensor = Tensor;
    type Routing = HostRouting;
    fn pp(&self, name: &str) -> Self {
        RankWeights {
            vb: Weights::pp(&self.vb, name),
            held: self.held.clone(),
        }
    }
    fn weight(&self, dims: &[usize], name: &str, init: Init) -> Result<Tensor> {
        Weights::weight(&self.vb, dims, name, init)
    }
    fn linear(&self, inp: usize, out: usize, bias: bool) -> Result<Proj> {
        Weights::linear(&self.vb, inp, out, bias)
    }
    fn proj(&self, spec: &ProjSpec, cfg: &Config) -> Result<Proj> {
        Weights::proj(&self.vb, spec, cfg)
    }
    fn rotary(
        &self,
        cfg: &Config,
        head_dim: usize,
        theta: f64,
        scaling: Option<&RopeScaling>,
    ) -> Result<(Tensor, Tensor)> {
        Weights::rotary(&self.vb, cfg, head_dim, theta, scaling)
    }
    fn experts(&self, _n: usize) -> Vec<usize> {
        self.held.clone().collect()
    }
    fn routing(&self, cfg: &Config, layer: usize, experts: &[usize]) -> HostRouting {
        Weights::routing(&self.vb, cfg, layer, experts)
    }
}

/// Refuses what expert parallelism on ranks does not run, by name (beside
/// [`super::check_case`]'s refusals).
pub fn check_ep(case: &Case, zero: u8, ep: usize) -> anyhow::Result<()> {
    ensure!(
        ep >= 2,
        "ranks --ep {ep}: expert parallelism needs 2 ranks or more"
    );
    let Some(m) = case.cfg.llama.and_then(|l| l.moe) else {
        anyhow::bail!(
            "ranks --ep: model {}: expert parallelism splits a mixture of experts (a --hf-config of Mixtral, Qwen-MoE, …)",
            case.model.as_str()
        )
    };
    let e = m.experts;
    ensure!(
        e.is_multiple_of(ep),
        "ranks --ep {ep}: {e} experts do not split into {ep} equal parts (--ep must divide the experts: {})",
        (2..=e)
            .filter(|n| e.is_multiple_of(*n))
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    ensure!(
        zero <= 2,
        "ranks --ep {ep} --zero {zero}: expert parallelism runs with ZeRO 0, 1 or 2 (ZeRO 3's gathers are not run beside the exchanges)"
    );
    ensure!(
        !m.input_scaled,
        "ranks --ep: Llama 4's input-scaled experts are not split on ranks"
    );
    Ok(())
}

/// The experts rank `rank` of `ep` holds.
pub fn held(case: &Case, rank: usize, ep: usize) -> Range<usize> {
    let e = case.cfg.llama.and_then(|l| l.moe).map_or(0, |m| m.experts);
    let per = e / ep;
    rank * per..(rank + 1) * per
}

/// The global expert a variable named `name` belongs to (`….experts.<e>.…`), if any.
fn expert_of(name: &str) -> Option<usize> {
    super::expert_slot(name).map(|(_, e)| e)
}

/// The variables of rank `rank` of `ep` as the model's layout names them (the whole model's
/// [`crate::formula::transformer::Shape::named_variables`] less the experts it does not hold):
/// (name, elements).
pub fn rank_variables(case: &Case, rank: usize, ep: usize) -> Vec<(String, u64)> {
    let mine = held(case, rank, ep);
    crate::formula::transformer::Shape::of(case)
        .named_variables()
        .into_iter()
        .filter(|(n, _)| expert_of(n).is_none_or(|e| mine.contains(&e)))
        .map(|(n, d)| (n, d.iter().product()))
        .collect()
}

/// The replay of rank `rank`'s training step ([`crate::formula::replay::replay_training_ep`]:
/// its model, its experts held, every sparse layer's forward as [`ExpertParallel`] runs it) on
/// the rows `exchanges` say each sparse layer moved.
fn replay_rank(
    case: &Case,
    plan: Plan,
    rank: usize,
    ep: usize,
    exchanges: &[Arc<Exchange>],
) -> crate::formula::replay::Training {
    let shape = crate::formula::transformer::Shape::of(case);
    let layers = exchanges
        .iter()
        .map(|ex| crate::formula::replay::expert::LayerRows {
            sent: ex.sent.clone(),
            from: ex.from.clone(),
        })
        .collect();
    crate::formula::replay::replay_training_ep(
        &shape,
        shape.meta(crate::formula::transformer::META_PER_TENSOR),
        shape.cpu.then_some(plan.threads),
        rank,
        ep,
        layers,
    )
}

/// Each window's (peak, retained) predicted for rank `rank` of `ep`: `forward` and `backward`
/// the replay of the rank's step ([`replay_rank`]) on the rows the first forward moved,
/// `train-step` on the rows its own forward moved (the router has learnt a step: the routing
/// moves); `reduce` the dense gradients' all-reduce (its bucket, [`zero::reduce`]) and the
/// experts' scaling in place; `optimizer` the rank's whole state ([`super::predict_windows_of`]'s
/// arithmetic over the rank's variables); `gather` nothing. `init`: the whole model's less the
/// experts the rank does not hold (their data and one variable's bookkeeping each,
/// [`crate::formula::transformer::INIT_META_PER_VAR`]).
pub fn predict_ep_windows(
    case: &Case,
    plan: Plan,
    rank: usize,
    ep: usize,
    first: &[Arc<Exchange>],
    step: &[Arc<Exchange>],
) -> Vec<(u64, i64)> {
    use crate::formula::transformer::{INIT_META_PER_VAR, Shape as FormulaShape};
    use crate::step::Phase;
    let whole = FormulaShape::of(case);
    let init = whole.predict(Phase::Init, case.optimizer, plan.threads);
    let all = whole.named_variables();
    let dropped: Vec<u64> = all
        .iter()
        .filter(|(n, _)| expert_of(n).is_some_and(|e| !held(case, rank, ep).contains(&e)))
        .map(|(_, d)| d.iter().product())
        .collect();
    let dropped_bytes =
        4 * dropped.iter().sum::<u64>() + whole.meta(INIT_META_PER_VAR) * dropped.len() as u64;
    let (dense, owned) = dense_and_owned(case, plan.zero, rank, ep);
    let dense_largest = dense.iter().copied().max().unwrap_or(0);
    let run = |n: u64| zero::run_of(n as usize, ep, rank).len() as u64;
    // ZeRO 0 and 1 all-reduce the dense gradients through one bucket; ZeRO 2 reduce-scatters
    // each into a run of its own (largest first), the whole dense gradient freed.
    let (reduce_peak, reduce_kept): (u64, i64) = if plan.zero < 2 {
        (4 * dense_largest.min(zero::BUCKET_ELEMS as u64), 0)
    } else {
        use crate::formula::transformer::GRAD_META_PER_TENSOR;
        let shards: u64 = dense.iter().map(|&n| 4 * run(n) + super::TENSOR_META).sum();
        let whole: u64 = dense.iter().map(|&n| 4 * n + GRAD_META_PER_TENSOR).sum();
        (
            4 * run(dense_largest) + super::TENSOR_META,
            shards as i64 - whole as i64,
        )
    };
    let stepper = Stepper::new(case.optimizer, crate::optim::LEARNING_RATE).expect("checked");
    let (m, v) = stepper.state();
    let moments = m as u64 + v as u64;
    let count = rank_variables(case, rank, ep).len() as u64;
    let state = moments * (4 * owned + super::TENSOR_META * count) + zero::SLOT_BYTES * count;
    let t = replay_rank(case, plan, rank, ep, first);
    let s = replay_rank(case, plan, rank, ep, step);
    // The gradients the backward leaves: its retained bytes with the graph's freed added back.
    let grads = (s.forward_retained as i64 + s.backward_retained).max(0) as u64;
    let train_step = (s.forward_retained + s.backward_peak)
        .max(s.forward_peak)
        .max(grads + reduce_peak)
        .max((grads as i64 + reduce_kept).max(0) as u64);
    vec![
        (
            init.peak_bytes - dropped_bytes,
            init.retained_bytes - dropped_bytes as i64,
        ),
        (t.forward_peak, t.forward_retained as i64),
        (t.backward_peak, t.backward_retained),
        (reduce_peak, reduce_kept),
        (state, state as i64),
        (0, 0),
        (train_step, 0),
    ]
}

/// Rank `rank` of `ep`'s dense variables' elements, and the elements its optimizer steps at
/// ZeRO `stage`: its run of each dense variable (every element at stage 0) and its experts
/// whole (their data-parallel group is their owner alone).
fn dense_and_owned(case: &Case, stage: u8, rank: usize, ep: usize) -> (Vec<u64>, u64) {
    let vars = rank_variables(case, rank, ep);
    let dense: Vec<u64> = vars
        .iter()
        .filter(|(n, _)| expert_of(n).is_none())
        .map(|(_, n)| *n)
        .collect();
    let experts: u64 = vars
        .iter()
        .filter(|(n, _)| expert_of(n).is_some())
        .map(|(_, n)| n)
        .sum();
    let run = |n: u64| zero::run_of(n as usize, ep, rank).len() as u64;
    let dense_owned: u64 = dense
        .iter()
        .map(|&n| if stage == 0 { n } else { run(n) })
        .sum();
    (dense, dense_owned + experts)
}

/// What an expert-parallel rank reports beside its windows: the experts it holds and, for each
/// sparse layer of the first forward, the rows it sent and received per expert.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EpRouting {
    /// The experts held, `[first, end)`.
    pub experts: [usize; 2],
    /// Per sparse layer: rows sent to each rank (the first forward).
    pub sent_rows: Vec<Vec<usize>>,
    /// Per sparse layer: rows received for each held expert (the first forward).
    pub received_rows: Vec<Vec<usize>>,
    /// Per sparse layer: rows received for each held expert (the train-step's forward).
    pub train_step_received_rows: Vec<Vec<usize>>,
}

/// Runs one expert-parallel rank of `case` under `plan` over `comm` (every rank of the world
/// one part of the experts and its own microbatch), measuring and predicting its windows as
/// [`super::run_rank`] does.
pub fn run_ep_rank(
    case: &Case,
    plan: Plan,
    comm: Rc<dyn Comm>,
) -> anyhow::Result<(RankReport, EpRouting)> {
    let (rank, ep) = (comm.rank(), comm.size());
    super::check_case(case, plan.zero)?;
    check_ep(case, plan.zero, ep)?;
    ensure!(
        plan.ep == ep,
        "ranks --ep {}: launched on {ep} ranks (mpirun -np {})",
        plan.ep,
        plan.ep
    );
    let device = Device::Cpu;
    crate::phase::runner::warm_up(case, &device).context("the warm-up step")?;
    {
        let mut x = [1.0f32; 4];
        let send = x;
        comm.all_reduce_sum(&send, &mut x);
        let mut back = vec![0f32; ep];
        comm.all_to_all_v(&vec![1f32; ep], &vec![1; ep], &mut back, &vec![1; ep]);
        comm.all_gather_bytes(&[0u8; 4]);
        comm.barrier();
    }
    let _group = Group::join(comm.clone());
    let (tokens, targets) = super::rank_batch(case, rank, ep)?;
    let mut measured = Vec::with_capacity(WINDOWS.len());
    let rss_now = vm_rss_bytes;

    // init: the dense part and this rank's experts
    let varmap = VarMap::new();
    let mine = held(case, rank, ep);
    let (model, p, r, s) = window(|| {
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
        let w = RankWeights {
            vb,
            held: mine.clone(),
        };
        let layers: Vec<(usize, u32)> = (0..case.cfg.layers).map(|i| (i, i as u32)).collect();
        Ok(Transformer::build(
            &case.cfg,
            &w,
            &layers,
            case.cfg.clone(),
        )?)
    })?;
    measured.push((p, r, s, rss_now()));
    let parallel = Rc::new(ExpertParallel::new(
        rank,
        ep,
        case.cfg.layers,
        !plan.ep_dispatch_backward,
    ));
    let model = model.with_expert_parallel(parallel.clone());
    let vars = named_vars(&varmap);
    // Every weight as the whole model's of the same name (the experts too); the dense ones
    // from rank 0, as data parallelism starts.
    super::fill_deterministic(&vars)?;
    let (experts, dense): (Vec<_>, Vec<_>) = vars
        .iter()
        .cloned()
        .partition(|(n, _)| expert_of(n).is_some());
    for (_, v) in &dense {
        zero::with_f32_mut(v.as_tensor(), |w| comm.broadcast(0, w))?;
    }
    let step = super::Step {
        model: &model,
        vars: &vars,
        tokens: &tokens,
        targets: &targets,
        case,
    };
    let stepper = Stepper::new(case.optimizer, crate::optim::LEARNING_RATE)?;
    let reduce = |grads: &mut GradStore| -> anyhow::Result<()> {
        zero::reduce(plan.zero, &dense, grads, comm.as_ref())?;
        if plan.ep_expert_scaling {
            let scale = 1.0 / ep as f32;
            for (_, v) in &experts {
                if let Some(g) = grads.get(v.as_tensor()) {
                    zero::with_f32_mut(g, |g| g.iter_mut().for_each(|x| *x *= scale))?;
                }
            }
        }
        Ok(())
    };

    // forward, backward
    let (grads, grads_held, first) =
        super::forward_backward(&step, comm.as_ref(), &mut measured, || parallel.exchanges())?;
    // reduce: the dense gradients averaged (ZeRO 2: each reduce-scattered into this rank's
    // run), the experts' divided by the ranks; the optimizer: the dense part's state at the
    // ZeRO stage over every rank, the experts' whole (each expert's data-parallel group is
    // its owner alone), stepped in place; gather: the dense runs (ZeRO 1 and 2)
    let (gradient_rel_diff, opt, _) = super::step_tail(
        &step,
        grads,
        comm.as_ref(),
        &mut measured,
        &reduce,
        |g| {
            plan.check
                .then(|| check_gradients(case, plan.zero, comm.as_ref(), &vars, g))
                .transpose()
        },
        || Ok(zero::Sharded::new(stepper, plan.zero, &dense, comm.as_ref())?.and_whole(&experts)?),
        &|| Ok(zero::gather(plan.zero, &dense, comm.as_ref())?),
    )?;
    let last = parallel.exchanges();

    let predicted = predict_ep_windows(case, plan, rank, ep, &first, &last);
    let windows = super::windows_of(&measured, &predicted);
    let states = ep_states(case, plan.zero, rank, ep, &windows, grads_held)?;
    let check = match gradient_rel_diff {
        Some(gradient_rel_diff) => Some(Check {
            gradient_rel_diff,
            weight_rel_diff: check_weights(case, ep, &vars)?,
        }),
        None => None,
    };
    let rows = |xs: &[Arc<Exchange>]| xs.iter().map(|x| x.expert_rows()).collect();
    let routing = EpRouting {
        experts: [mine.start, mine.end],
        sent_rows: first.iter().map(|x| x.send_rows.clone()).collect(),
        received_rows: rows(&first),
        train_step_received_rows: rows(&last),
    };
    drop((opt, model, varmap));
    Ok((
        RankReport {
            rank,
            ranks: ep,
            zero: plan.zero,
            tp: 1,
            ep,
            windows,
            states,
            rss_peak_bytes: vm_hwm_bytes(),
            check,
        },
        routing,
    ))
}

/// This rank's gradients (averaged, the experts' scaled) against one process's on the whole
/// global batch, each variable against the whole model's of the same name.
fn check_gradients(
    case: &Case,
    stage: u8,
    comm: &dyn Comm,
    vars: &[(String, candle_core::Var)],
    grads: &GradStore,
) -> anyhow::Result<f64> {
    let (rank, ranks) = (comm.rank(), comm.size());
    let single = super::Single::new(case, ranks)?;
    let reference = single.step().gradients()?;
    super::compare(vars, &single.vars, |name, v, w| {
        let mine = super::grad_of(grads, name, v)?;
        let theirs = super::grad_of(&reference, name, w)?;
        // ZeRO 2 leaves this rank's run of each dense gradient.
        if stage == 2 && expert_of(name).is_none() {
            let theirs = theirs.flatten_all()?;
            let run = zero::run_of(theirs.elem_count(), ranks, rank);
            return Ok((mine, theirs.narrow(0, run.start, run.len())?));
        }
        Ok((mine, theirs))
    })
}

/// This rank's weights after its two steps against the same variables of one process's after
/// two steps on the whole global batch.
fn check_weights(
    case: &Case,
    ranks: usize,
    vars: &[(String, candle_core::Var)],
) -> anyhow::Result<f64> {
    let single = super::Single::new(case, ranks)?;
    single.step().train_twice()?;
    super::compare(vars, &single.vars, |_, a, b| {
        Ok((a.as_tensor().clone(), b.as_tensor().clone()))
    })
}

/// The model states entering the optimizer, measured from the windows and predicted from the
/// rank's variables ([`rank_variables`]: data only, 4 bytes an element, the optimizer's
/// moments each as large).
fn ep_states(
    case: &Case,
    stage: u8,
    rank: usize,
    ep: usize,
    w: &[Window],
    grads_held: i64,
) -> anyhow::Result<States> {
    let (we, ge, oe) = crate::formula::parallel::rates(4, case.optimizer)
        .context("ranks --ep: an optimizer of whole bytes per parameter")?;
    let n: u64 = rank_variables(case, rank, ep).iter().map(|(_, n)| n).sum();
    // ZeRO 1 shards the dense part's state over the ranks, ZeRO 2 its gradients too; the
    // experts' stay whole.
    let (_, owned) = dense_and_owned(case, stage, rank, ep);
    Ok(States {
        weights_bytes: w[0].retained_bytes,
        gradient_bytes: grads_held + w[3].retained_bytes,
        optimizer_state_bytes: w[4].retained_bytes,
        predicted_weights_bytes: we * n,
        predicted_gradient_bytes: ge * if stage == 2 { owned } else { n },
        predicted_optimizer_state_bytes: oe * owned,
        host: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::Kernels;
    use crate::model::transformer::synthetic_batch;
    use crate::ranks::comm::Solo;

    /// Rows received rank by rank are laid out expert by expert and back.
    #[test]
    fn rows_are_laid_out_expert_by_expert_and_back() {
        // Rank 0 sends 1 row for expert 0 and 2 for expert 1; rank 1 sends 3 and 0.
        let ex = Exchange {
            sent: vec![0, 0],
            send_rows: vec![0, 0],
            from: vec![vec![1, 2], vec![3, 0]],
            skip_backward: false,
        };
        assert_eq!(ex.expert_rows(), vec![4, 2]);
        assert_eq!(ex.recv_rows(), vec![3, 3]);
        let rank_major: Vec<f32> = (0..6).map(|x| x as f32).collect();
        let expert_major = ex.to_expert_major(&rank_major, 1);
        // Expert 0: rank 0's row 0, rank 1's rows 3, 4, 5; expert 1: rank 0's rows 1, 2.
        assert_eq!(expert_major, vec![0., 3., 4., 5., 1., 2.]);
        assert_eq!(ex.to_rank_major(&expert_major, 1), rank_major);
    }

    /// On a group of one rank the expert-parallel forward (dispatch, the experts on the rows
    /// received, return, combine) is the model's own, with every kernel set (the hook runs
    /// without MPI): the same loss and, to float rounding, the same gradients (the input's
    /// gradient from a token's experts is summed in one gather's backward before it joins the
    /// residual stream's, where one device adds each expert's in turn: another association).
    #[test]
    fn expert_parallel_on_one_rank_changes_nothing() {
        let text = r#"{"model_type": "mixtral", "hidden_act": "silu", "hidden_size": 32,
            "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 64, "max_position_embeddings": 32,
            "num_local_experts": 4, "num_experts_per_tok": 2}"#;
        for kernels in [Kernels::Fused, Kernels::Composed, Kernels::Transformers] {
            let mut cfg = crate::model::hf_config::parse(text, "mixtral.json")
                .unwrap()
                .cfg;
            cfg.kernels = kernels;
            let varmap = VarMap::new();
            let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
            let model = Transformer::new(&cfg, vb).unwrap();
            let vars = named_vars(&varmap);
            super::super::fill_deterministic(&vars).unwrap();
            let (tokens, targets) = synthetic_batch(2, 12, cfg.vocab, &Device::Cpu).unwrap();
            let run =
                |m: &Transformer| crate::ranks::loss_and_gradients(m, &vars, &tokens, &targets);
            let plain = run(&model);
            let _group = Group::join(Rc::new(Solo));
            let parallel = Rc::new(ExpertParallel::new(0, 1, cfg.layers, false));
            let split = model.clone().with_expert_parallel(parallel.clone());
            let ep = run(&split);
            assert_eq!(ep.0, plain.0, "{kernels:?}: the loss");
            let mut sums = (0f64, 0f64);
            for (a, b) in ep.1.iter().zip(&plain.1) {
                super::super::add_sums(&mut sums, a, b);
            }
            let rel = super::super::rel(sums);
            assert!(rel < 1e-6, "{kernels:?}: gradients within {rel:e}");
            // Every row of every token came to the one rank: k·T of them a layer.
            for ex in parallel.exchanges() {
                assert_eq!(ex.expert_rows().iter().sum::<usize>(), 2 * 24);
            }
        }
    }
}
