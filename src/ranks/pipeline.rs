//! Pipeline parallelism on real ranks (issue 53, `memfit ranks --pp S`): each rank a stage
//! holding its layers ([`crate::formula::parallel::stage_layers`]) and, as Megatron lays a
//! model out, the token table on the first stage (and on the last when the head is tied to
//! it: its own copy, the two gradients summed between the two stages), the final norm and the
//! head on the last ([`StageWeights`]). One training step pushes `M` microbatches of `B` rows
//! through the stages on Megatron's non-interleaved 1F1B schedule
//! ([`Schedule`]: stage `s` runs `min(S − s − 1, M)` forwards ahead, then one forward and one
//! backward in turn, then the backwards left), the activations and their gradients sent
//! between neighbouring stages through MPI (the paired exchanges as one `MPI_Sendrecv`, as
//! Megatron batches its `isend`/`irecv` pairs). A stage's output is freed once sent (Megatron's
//! `deallocate_output_tensor`); its backward is seeded with the gradient received from the
//! stage above, block by block ([`crate::phase::by_block`]'s cut and seed). The gradients of
//! the `M` microbatches accumulate in place, then are divided by `M` (the global batch's mean
//! loss), and each stage steps its own weights in place.
//!
//! What is measured on each rank (the counting allocator; the process layer as RSS): the
//! windows `init` (the stage built), `pipeline` (the first step's `M` microbatches, no
//! optimizer), `optimizer` (its state made and its first step) and `train-step` (a second
//! whole step); after every forward and backward of the schedule the heap, and from it one
//! microbatch's graph and the graph at the schedule's fullest (`in_flight` microbatches),
//! predicted by `formula::parallel::stage_activations` (`min(M, S − s)` in flight: the first
//! stage holds `S`).

use std::collections::VecDeque;

use anyhow::{Context, ensure};
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, TensorId, Var};
use candle_nn::{VarBuilder, VarMap};

use super::comm::Comm;
use super::zero::{self, with_f32_mut};
use super::{Check, Window, fill_deterministic, named_vars, window};
use crate::formula::parallel::{self, Layout};
use crate::formula::transformer::Shape;
use crate::meter::cpu_alloc;
use crate::meter::rusage::{vm_hwm_bytes, vm_rss_bytes};
use crate::model::kernels::boundary::{cut, seed};
use crate::model::transformer::{Transformer, synthetic_batch};
use crate::model::weights::StageWeights;
use crate::optim::inplace::Stepper;
use crate::workload::Case;

/// The windows of a stage's rank, in order.
pub const WINDOWS: [&str; 4] = ["init", "pipeline", "optimizer", "train-step"];

/// What a pipeline run is asked.
#[derive(Debug, Clone, Copy)]
pub struct PipePlan {
    /// Microbatches a step (`M`).
    pub microbatches: usize,
    pub check: bool,
    pub threads: usize,
}

/// One forward (`F`) or backward (`B`) of the schedule and the heap after it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Event {
    pub op: String,
    pub microbatch: usize,
    /// Microbatches whose graph the stage holds after it.
    pub in_flight: usize,
    /// The counting allocator after it, relative to the `pipeline` window's start; after a
    /// forward that sends its output, less that output (sent next, then freed).
    pub heap_bytes: i64,
}

/// One stage's rank's report.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StageReport {
    pub rank: usize,
    pub stages: usize,
    pub microbatches: usize,
    /// Its layers, `[start, end)`.
    pub layers: [usize; 2],
    /// [`WINDOWS`], in order.
    pub windows: Vec<Window>,
    /// The first step's forwards and backwards, in the order this stage ran them.
    pub schedule: Vec<Event>,
    /// One microbatch's graph (after the first forward), measured and predicted.
    pub microbatch_graph_bytes: i64,
    pub predicted_microbatch_graph_bytes: u64,
    /// Most microbatches in flight, and the graph then (at the first forward reaching it).
    pub in_flight: usize,
    pub predicted_in_flight: usize,
    pub in_flight_graph_bytes: i64,
    pub predicted_in_flight_graph_bytes: u64,
    /// The stage's parameters and their data bytes, as `formula::parallel::stage_ranks`
    /// counts them.
    pub params: u64,
    pub predicted_params: u64,
    pub rss_peak_bytes: Option<u64>,
    pub check: Option<Check>,
}

/// What `memfit ranks --pp S --json` prints and `--out` writes (rank 0).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PipelineDoc {
    pub git_commit: String,
    pub cpu_model: String,
    pub case: super::RanksCase,
    pub stages: usize,
    pub microbatches: usize,
    pub mpi_library: String,
    pub windows: Vec<String>,
    pub layers: std::collections::BTreeMap<String, String>,
    pub ranks: Vec<StageReport>,
}

impl PipelineDoc {
    pub fn new(case: &Case, plan: PipePlan, library: String, ranks: Vec<StageReport>) -> Self {
        let layers = [
            (
                "windows",
                "counting allocator (memfit's tensors and bookkeeping), relative to each window's start",
            ),
            (
                "schedule",
                "counting allocator after each forward and backward, relative to the pipeline window's start",
            ),
            (
                "rss_bytes",
                "process resident set after the window (VmRSS), MPI's buffers included",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        PipelineDoc {
            git_commit: env!("MEMFIT_GIT_COMMIT").into(),
            cpu_model: crate::machine::cpu_model(),
            case: super::RanksCase::of(case, plan.threads),
            stages: ranks.len(),
            microbatches: plan.microbatches,
            mpi_library: library,
            windows: WINDOWS.iter().map(|w| w.to_string()).collect(),
            layers,
            ranks,
        }
    }
}

/// Refuses what the pipeline runner does not run, by name (beyond [`super::check_case`]).
pub fn check_pipeline(case: &Case, stages: usize, plan: PipePlan) -> anyhow::Result<()> {
    super::check_case(case, 0)?;
    ensure!(
        plan.microbatches >= 1,
        "ranks --microbatches 0: a step has 1 microbatch or more"
    );
    ensure!(
        stages >= 2,
        "ranks --pp {stages}: a pipeline has 2 stages or more (launch that many ranks)"
    );
    ensure!(
        stages <= case.cfg.layers,
        "ranks --pp {stages}: {} layers cannot fill {stages} stages",
        case.cfg.layers
    );
    ensure!(
        case.checkpoint == 0,
        "ranks --pp: gradient checkpointing is not run on a pipeline's stages"
    );
    Ok(())
}

/// A stage: its model (its layers, the first stage's table, the last's norm and head), its
/// variables by name (the parts other stages hold are made empty and left out), and where it
/// sits.
struct Stage {
    _varmap: VarMap,
    model: Transformer,
    vars: Vec<(String, Var)>,
    first: bool,
    last: bool,
    /// The head is the token table (held by the first and the last stage).
    tied: bool,
    layers: std::ops::Range<usize>,
}

impl Stage {
    fn new(case: &Case, rank: usize, stages: usize) -> anyhow::Result<Self> {
        let layers = parallel::stage_layers(case.cfg.layers, stages)[rank].clone();
        let (first, last) = (rank == 0, rank + 1 == stages);
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
        let w = StageWeights::new(vb, first, last, case.cfg.tied);
        let list: Vec<(usize, u32)> = layers.clone().map(|i| (i, i as u32)).collect();
        let model = Transformer::build(&case.cfg, &w, &list, case.cfg.clone())?;
        let vars = named_vars(&varmap)
            .into_iter()
            .filter(|(_, v)| v.elem_count() > 0)
            .collect();
        Ok(Stage {
            _varmap: varmap,
            model,
            vars,
            first,
            last,
            tied: case.cfg.tied,
            layers,
        })
    }
}

/// One microbatch's forward on a stage, kept for its backward.
struct Flight {
    /// The last stage: the loss; the others: the stage's output as its last block made it (its
    /// storage sent and freed; the backward seeds it).
    top: Tensor,
    /// The boundaries below the top, from the bottom: the tensor a part made (its storage
    /// moved into the next part's input variable) and that variable's id.
    cuts: Vec<(Tensor, TensorId)>,
    /// A stage past the first: the received input (a variable: its gradient goes back).
    input: Option<Var>,
}

/// A stage's microbatches and its forward and backward.
struct Runner<'a> {
    stage: &'a Stage,
    comm: &'a dyn Comm,
    batches: &'a [(Tensor, Tensor)],
    /// `(B, S, H)`: what goes between stages.
    dims: (usize, usize, usize),
}

/// Sums `all`'s gradients of `vars` into `acc` in place (the first one moved in).
fn accumulate(
    acc: &mut GradStore,
    all: &mut GradStore,
    vars: &[(String, Var)],
) -> anyhow::Result<()> {
    for (_, v) in vars {
        let Some(g) = all.remove(v.as_tensor()) else {
            continue;
        };
        match acc.get(v.as_tensor()) {
            Some(prev) => {
                // In place, as PyTorch's `AccumulateGrad` adds into `.grad`.
                with_f32_mut(&g, |src| {
                    with_f32_mut(prev, |a| {
                        a.iter_mut().zip(src.iter()).for_each(|(x, y)| *x += y)
                    })
                    .expect("an f32 gradient")
                })?;
            }
            None => {
                acc.insert(v.as_tensor(), g);
            }
        }
    }
    Ok(())
}

impl Runner<'_> {
    /// A received activation: a variable (its gradient goes back down).
    fn input(&self) -> anyhow::Result<Var> {
        Ok(Var::zeros(self.dims, DType::F32, &Device::Cpu)?)
    }

    /// A received gradient.
    fn gradient(&self) -> anyhow::Result<Tensor> {
        Ok(Tensor::zeros(self.dims, DType::F32, &Device::Cpu)?)
    }

    /// Microbatch `m`'s forward from `input` (the first stage: the tokens): its flight and,
    /// below the last stage, the output to send.
    fn forward(&self, m: usize, input: Option<Var>) -> anyhow::Result<(Flight, Option<Tensor>)> {
        let model = &self.stage.model;
        let (tokens, targets) = &self.batches[m];
        let masks = model.input_mask(tokens)?;
        let mut x = match &input {
            None => model.embed(tokens)?,
            Some(v) => v.as_tensor().clone(),
        };
        let mut cuts = Vec::new();
        for j in 0..model.blocks.len() {
            if j > 0 || self.stage.first {
                let var = cut(&x)?;
                cuts.push((x, var.id()));
                x = var;
            }
            x = model.blocks_forward(&x, &masks, j..j + 1)?;
        }
        let out = cut(&x)?;
        if !self.stage.last {
            return Ok((
                Flight {
                    top: x,
                    cuts,
                    input,
                },
                Some(out),
            ));
        }
        cuts.push((x, out.id()));
        let logits = model.head_forward(&out)?;
        drop(out);
        let loss = model.train_loss(&logits, targets)?;
        drop(logits);
        Ok((
            Flight {
                top: loss,
                cuts,
                input,
            },
            None,
        ))
    }

    /// A flight's backward, part by part from the top (the loss, or the output seeded with
    /// `grad` from the stage above), each part's graph freed once its gradients are taken and
    /// summed into `acc`; the gradient of the stage's input (past the first stage).
    fn backward(
        &self,
        flight: Flight,
        grad: Option<Tensor>,
        acc: &mut GradStore,
    ) -> anyhow::Result<Option<Tensor>> {
        let Flight {
            top,
            mut cuts,
            input,
        } = flight;
        let vars = &self.stage.vars;
        let below = |all: &GradStore, cuts: &[(Tensor, TensorId)]| match cuts.last() {
            Some((_, id)) => all.get_id(*id).cloned(),
            None => input.as_ref().and_then(|v| all.get(v.as_tensor()).cloned()),
        };
        let mut all = match grad {
            None => top.backward()?,
            Some(g) => {
                let root = seed(&top, g)?;
                drop(top);
                let all = root.backward()?;
                drop(root);
                all
            }
        };
        let mut upstream = below(&all, &cuts);
        accumulate(acc, &mut all, vars)?;
        drop(all);
        while let Some((made, _)) = cuts.pop() {
            let g = upstream
                .take()
                .context("pipeline: no gradient for a boundary")?;
            let root = seed(&made, g)?;
            drop(made);
            let mut all = root.backward()?;
            drop(root);
            upstream = below(&all, &cuts);
            accumulate(acc, &mut all, vars)?;
        }
        Ok(upstream)
    }
}

/// Megatron's non-interleaved 1F1B order for stage `s` of `stages` with `m` microbatches:
/// `warmup` forwards, then `m − warmup` forward-backward pairs, then `warmup` backwards.
pub struct Schedule {
    pub warmup: usize,
    pub steady: usize,
}

impl Schedule {
    pub fn of(stage: usize, stages: usize, m: usize) -> Self {
        let warmup = (stages - stage - 1).min(m);
        Schedule {
            warmup,
            steady: m - warmup,
        }
    }
}

/// One training step's `M` microbatches through the pipeline on this rank, the gradients of
/// its weights accumulated into `acc` and averaged (the tied table's two summed between the
/// first and last stages); `events` gets the heap after each forward and backward.
fn pipeline_step(
    r: &Runner<'_>,
    microbatches: usize,
    events: Option<&mut Vec<Event>>,
) -> anyhow::Result<GradStore> {
    let comm = r.comm;
    let rank = comm.rank();
    let stages = comm.size();
    let (prev, next) = (rank.wrapping_sub(1), rank + 1);
    let (first, last) = (r.stage.first, r.stage.last);
    let Schedule { warmup, steady } = Schedule::of(rank, stages, microbatches);
    let start = cpu_alloc::current() as i64;
    let mut log = events;
    let mut record = |op: &str, m: usize, in_flight: usize, less: u64| {
        if let Some(ev) = log.as_deref_mut() {
            ev.push(Event {
                op: op.into(),
                microbatch: m,
                in_flight,
                heap_bytes: cpu_alloc::current() as i64 - less as i64 - start,
            });
        }
    };
    let bytes = |t: &Tensor| 4 * t.elem_count() as u64;
    let recv_forward = || -> anyhow::Result<Option<Var>> {
        if first {
            return Ok(None);
        }
        let v = r.input()?;
        with_f32_mut(v.as_tensor(), |b| comm.recv(prev, b))?;
        Ok(Some(v))
    };
    let mut acc = GradStore::default();
    let mut flights = VecDeque::new();
    let (mut fwd, mut bwd) = (0, 0);
    for _ in 0..warmup {
        let x = recv_forward()?;
        let (f, out) = r.forward(fwd, x)?;
        flights.push_back(f);
        let out = out.context("a warm-up forward is below the last stage")?;
        record("F", fwd, flights.len(), bytes(&out));
        with_f32_mut(&out, |b| comm.send(next, b))?;
        fwd += 1;
    }
    let mut x = if steady > 0 { recv_forward()? } else { None };
    for i in 0..steady {
        let (f, out) = r.forward(fwd, x.take())?;
        flights.push_back(f);
        record("F", fwd, flights.len(), out.as_ref().map_or(0, bytes));
        fwd += 1;
        let grad = match out {
            Some(out) => {
                let g = r.gradient()?;
                with_f32_mut(&out, |o| {
                    with_f32_mut(&g, |gb| comm.send_recv(next, o, next, gb)).expect("an f32 buffer")
                })?;
                Some(g)
            }
            None => None,
        };
        let flight = flights.pop_front().context("a flight for the backward")?;
        let gin = r.backward(flight, grad, &mut acc)?;
        record("B", bwd, flights.len(), 0);
        bwd += 1;
        match gin {
            Some(g) if i + 1 == steady => with_f32_mut(&g, |b| comm.send(prev, b))?,
            Some(g) => {
                let v = r.input()?;
                with_f32_mut(&g, |gb| {
                    with_f32_mut(v.as_tensor(), |vb| comm.send_recv(prev, gb, prev, vb))
                        .expect("an f32 buffer")
                })?;
                drop(g);
                x = Some(v);
            }
            None => {}
        }
    }
    for _ in 0..warmup {
        let g = r.gradient()?;
        with_f32_mut(&g, |b| comm.recv(next, b))?;
        let flight = flights.pop_front().context("a flight for the backward")?;
        let gin = r.backward(flight, Some(g), &mut acc)?;
        record("B", bwd, flights.len(), 0);
        bwd += 1;
        if let Some(g) = gin {
            with_f32_mut(&g, |b| comm.send(prev, b))?;
        }
    }
    ensure!(
        !last || fwd == microbatches,
        "pipeline: {fwd} forwards of {microbatches}"
    );
    // The mean over the global batch: each microbatch's loss is its own mean.
    let scale = 1.0 / microbatches as f32;
    for (_, v) in &r.stage.vars {
        if let Some(g) = acc.get(v.as_tensor()) {
            with_f32_mut(g, |a| a.iter_mut().for_each(|x| *x *= scale))?;
        }
    }
    // A tied table: the first stage's embedding gradient and the last's head gradient summed
    // on both (Megatron's embedding group all-reduce).
    if r.stage.tied && (first || last) {
        let (_, v) = r
            .stage
            .vars
            .iter()
            .find(|(n, _)| n == "wte.weight")
            .expect("found");
        if let Some(g) = acc.get(v.as_tensor()) {
            // Sent from the gradient itself; the peer's received beside it, then added in.
            let peer = if first { stages - 1 } else { 0 };
            let mut theirs = vec![0f32; g.elem_count()];
            with_f32_mut(g, |a| {
                comm.send_recv(peer, a, peer, &mut theirs);
                a.iter_mut().zip(&theirs).for_each(|(x, y)| *x += y);
            })?;
        }
    }
    Ok(acc)
}

/// Each microbatch's tokens and targets: rows `m·B..(m+1)·B` of one synthetic global batch of
/// `M·B` rows (every stage makes the same; the first reads the tokens, the last the targets).
fn microbatches(case: &Case, m: usize) -> anyhow::Result<Vec<(Tensor, Tensor)>> {
    let b = case.batch;
    let (tokens, targets) = synthetic_batch(m * b, case.seq, case.cfg.vocab, &Device::Cpu)?;
    (0..m)
        .map(|i| {
            let rows = |t: &Tensor| t.narrow(0, i * b, b)?.contiguous()?.copy();
            Ok((rows(&tokens)?, rows(&targets)?))
        })
        .collect()
}

/// Runs this rank's stage of `case` over `comm` (a stage a rank), measuring and predicting.
pub fn run_stage(case: &Case, plan: PipePlan, comm: &dyn Comm) -> anyhow::Result<StageReport> {
    let (rank, stages) = (comm.rank(), comm.size());
    check_pipeline(case, stages, plan)?;
    let device = Device::Cpu;
    crate::phase::runner::warm_up(case, &device).context("the warm-up step")?;
    {
        let mut x = [1.0f32; 4];
        let send = x;
        comm.all_reduce_sum(&send, &mut x);
        if stages > 1 {
            let peer = rank ^ 1;
            if peer < stages {
                comm.send_recv(peer, &send, peer, &mut x);
            }
        }
        comm.barrier();
    }
    let batches = microbatches(case, plan.microbatches)?;
    let mut measured = Vec::with_capacity(WINDOWS.len());

    // init
    let (stage, p, r, s) = window(|| Stage::new(case, rank, stages))?;
    measured.push((p, r, s, vm_rss_bytes()));
    fill_deterministic(&stage.vars)?;
    let runner = Runner {
        stage: &stage,
        comm,
        batches: &batches,
        dims: (case.batch, case.seq, case.cfg.hidden),
    };
    let stepper = Stepper::new(case.optimizer, crate::optim::LEARNING_RATE)?;

    // pipeline
    comm.barrier();
    let mut events = Vec::new();
    let (grads, p, r, s) = window(|| pipeline_step(&runner, plan.microbatches, Some(&mut events)))?;
    measured.push((p, r, s, vm_rss_bytes()));
    let gradient_rel_diff = if plan.check {
        Some(check_gradients(case, &stage, &grads, plan.microbatches)?)
    } else {
        None
    };
    // optimizer
    let solo = super::comm::Solo;
    let (mut opt, p, r, s) = window(|| {
        let mut o = zero::Sharded::new(stepper, 0, &stage.vars, &solo)?;
        o.step(&grads)?;
        Ok(o)
    })?;
    measured.push((p, r, s, vm_rss_bytes()));
    drop(grads);
    // train-step
    comm.barrier();
    let ((), p, r, s) = window(|| {
        let grads = pipeline_step(&runner, plan.microbatches, None)?;
        opt.step(&grads)?;
        Ok(())
    })?;
    measured.push((p, r, s, vm_rss_bytes()));

    let shape = Shape::of(case);
    let layout = Layout {
        pp: stages,
        mb: plan.microbatches,
        ..Layout::default()
    };
    let acts = parallel::stage_activations(&shape, &layout, case.optimizer, plan.threads)
        .map_err(|e| anyhow::anyhow!("ranks --pp: {e}"))?[rank];
    let predicted_params =
        parallel::stage_ranks(&case.cfg, &layout, (4, 4, 0), false)[rank].params();
    let predicted = predict_windows(case, &stage, &acts, plan.threads)?;
    let windows = super::windows_of(&measured, &predicted);
    let one = events
        .iter()
        .find(|e| e.op == "F")
        .map_or(0, |e| e.heap_bytes);
    let most = events.iter().map(|e| e.in_flight).max().unwrap_or(0);
    let fullest = events
        .iter()
        .find(|e| e.op == "F" && e.in_flight == most)
        .map_or(0, |e| e.heap_bytes);
    let check = match gradient_rel_diff {
        Some(gradient_rel_diff) => Some(Check {
            gradient_rel_diff,
            weight_rel_diff: check_weights(case, &stage, plan.microbatches)?,
        }),
        None => None,
    };
    let params = stage.vars.iter().map(|(_, v)| v.elem_count() as u64).sum();
    Ok(StageReport {
        rank,
        stages,
        microbatches: plan.microbatches,
        layers: [stage.layers.start, stage.layers.end],
        windows,
        schedule: events,
        microbatch_graph_bytes: one,
        predicted_microbatch_graph_bytes: acts.microbatch_graph_bytes,
        in_flight: most,
        predicted_in_flight: acts.in_flight,
        in_flight_graph_bytes: fullest,
        predicted_in_flight_graph_bytes: acts.bytes,
        params,
        predicted_params,
        rss_peak_bytes: vm_hwm_bytes(),
        check,
    })
}

/// Each window's (peak, retained) predicted for this stage: the weights as the single device's
/// formula counts a model of the stage's layers, with the stage's own parameters; the
/// gradients likewise; the step's peak bounded from above: the graph at the schedule's fullest
/// (every microbatch in flight whole), the accumulated gradients, the gradient received from
/// above and the largest transient of a part's backward this stage runs
/// ([`parallel::part_transients`]: its temporaries and its new gradients, which stay beside the
/// accumulated ones until added in).
fn predict_windows(
    case: &Case,
    stage: &Stage,
    acts: &parallel::StageActivations,
    threads: usize,
) -> anyhow::Result<Vec<(u64, i64)>> {
    let shape = Shape::of(case);
    let at = Shape {
        l: stage.layers.len() as u64,
        ..shape.clone()
    };
    let params: u64 = stage.vars.iter().map(|(_, v)| v.elem_count() as u64).sum();
    let data = |whole: u64| whole - 4 * at.params() + 4 * params;
    let weights = data(at.weights_bytes());
    let grads = data(at.gradient_bytes());
    let stepper = Stepper::new(case.optimizer, crate::optim::LEARNING_RATE)?;
    let (m, v) = stepper.state();
    let moments = m as u64 + v as u64;
    let sizes = stage.vars.len() as u64;
    let state = moments * (4 * params + super::TENSOR_META * sizes) + zero::SLOT_BYTES * sizes;
    let parts = parallel::part_transients(&shape, 1, case.optimizer, threads)
        .map_err(|e| anyhow::anyhow!("ranks --pp: {e}"))?;
    // The largest part's backward this stage runs: a block's, the embedding's on the first
    // stage, the head's on the last.
    let transient = parts
        .block
        .max(if stage.first { parts.embedding } else { 0 })
        .max(if stage.last { parts.head } else { 0 });
    // The gradient handed in from above: received from the next stage, or on the last stage
    // the head's for the blocks.
    let received = 4 * shape.b * shape.s * shape.h;
    let step = acts.bytes + grads + received + transient;
    Ok(vec![
        (
            weights + crate::formula::transformer::INIT_PEAK_META,
            weights as i64,
        ),
        (step, grads as i64),
        (state, state as i64),
        (step, 0),
    ])
}

/// This stage's averaged gradients against the matching ones of one process on the global
/// batch (`M·B` rows, from the same weights).
fn check_gradients(case: &Case, stage: &Stage, grads: &GradStore, m: usize) -> anyhow::Result<f64> {
    let single = super::Single::new(case, m)?;
    let reference = single.step().gradients()?;
    super::compare(&stage.vars, &single.vars, |name, v, w| {
        Ok((
            super::grad_of(grads, name, v)?,
            super::grad_of(&reference, name, w)?,
        ))
    })
}

/// This stage's weights after its two steps against one process's after two steps on the
/// global batch.
fn check_weights(case: &Case, stage: &Stage, m: usize) -> anyhow::Result<f64> {
    let single = super::Single::new(case, m)?;
    single.step().train_twice()?;
    super::compare(&stage.vars, &single.vars, |_, v, w| {
        Ok((v.as_tensor().clone(), w.as_tensor().clone()))
    })
}
