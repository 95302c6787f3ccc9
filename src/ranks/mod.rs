//! Data parallelism on real ranks (issue 53; pipeline parallelism: [`pipeline`]): each rank a process running the case's training
//! step on its own microbatch, the gradients averaged and the optimizer state sharded over the
//! ranks as ZeRO stage 0, 1 or 2 does ([`zero`]), the collectives through MPI ([`comm`]).
//! Each rank measures its own windows with the counting allocator, as a single-device run does,
//! and predicts them: the single device's replay for the same microbatch (the forward and
//! backward are the same model on the same shapes) and the sharded terms by arithmetic.
//!
//! The windows of a rank, in order: `init` (the model built), `forward`, `backward`, `reduce`
//! (the gradients averaged over the ranks), `optimizer` (the shard's state made and its first
//! step), `gather` (the updated shards into every rank's weights), then `train-step` (a whole
//! second step from the steady state: forward, backward, reduce, step, gather). Before the
//! first window every rank fills its weights from one deterministic sequence per tensor name
//! (the constant-initialised vectors kept) and takes rank 0's by broadcast, as DDP starts
//! every replica from rank 0's weights; rank `r` trains on rows `r·B..(r+1)·B` of one
//! synthetic global batch of `ranks·B` rows.
//!
//! With `--tp N` ([`tensor`]) the ranks split the model instead: tensor parallelism,
//! Megatron-style, every rank one shard of every block on the same batch, the same windows
//! (`reduce` and `gather` empty) measured and predicted from the replay of the shard.
//!
//! With `--ep N` ([`expert`]) the ranks split a mixture of experts' experts while each trains
//! on its own microbatch: expert parallelism inside data parallelism, the routed rows exchanged
//! by all-to-all, the same windows measured and predicted from the replay of the rank's step.
//!
//! Layers of memory, each labelled: the counting allocator (memfit's tensors and bookkeeping:
//! the windows' peaks and retained bytes) and the process's resident set (`VmRSS`, `VmHWM`),
//! which also holds the MPI library's buffers and shared-memory segments.

pub mod comm;
pub mod expert;
pub mod fsdp;
pub mod offload;
pub mod pipeline;
pub mod serve;
pub mod tensor;
pub mod zero;

use anyhow::{Context, ensure};
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};

use crate::device::{DeviceSpec, Precision};
use crate::formula::transformer::Shape;
use crate::meter::cpu_alloc::{self, AllocMeter};
use crate::meter::host_arena::HostArenaMeter;
use crate::meter::rusage::{vm_hwm_bytes, vm_rss_bytes};
use crate::meter::{Meter, measure};
use crate::model::transformer::{Transformer, synthetic_batch};
use crate::optim::inplace::Stepper;
use crate::phase::train;
use crate::step::{OptimizerKind, Phase};
use crate::workload::Case;
use comm::Comm;

/// The windows of a rank, in order.
pub const WINDOWS: [&str; 7] = [
    "init",
    "forward",
    "backward",
    "reduce",
    "optimizer",
    "gather",
    "train-step",
];

/// One window of one rank: measured (the counting allocator, relative to the window's start)
/// and predicted.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Window {
    pub peak_bytes: u64,
    pub retained_bytes: i64,
    /// The counting allocator's bytes when the window opened.
    pub heap_start_bytes: u64,
    /// The process layer after the window: resident set (`VmRSS`; MPI's buffers included);
    /// `None` where `/proc` does not say.
    pub rss_bytes: Option<u64>,
    pub predicted_peak_bytes: u64,
    pub predicted_retained_bytes: i64,
    /// With `--offload optimizer`, from `reduce` on: the host arena's layer
    /// ([`crate::meter::host_arena`]: the offloaded partition), apart from the device's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostWindow>,
}

/// A window's host-arena layer (ZeRO-Offload's partition), measured (relative to the window's
/// start) and predicted.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HostWindow {
    pub peak_bytes: u64,
    pub retained_bytes: i64,
    pub predicted_peak_bytes: u64,
    pub predicted_retained_bytes: i64,
}

/// What a rank holds of the model states entering the optimizer, measured (from the windows'
/// retained bytes) and predicted by `formula::zero::shards` (data only: parameters ×
/// bytes per element, each shard rounded up).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct States {
    pub weights_bytes: i64,
    pub gradient_bytes: i64,
    pub optimizer_state_bytes: i64,
    pub predicted_weights_bytes: u64,
    pub predicted_gradient_bytes: u64,
    pub predicted_optimizer_state_bytes: u64,
    /// With `--offload optimizer`: the partition in host memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostStates>,
}

/// ZeRO-Offload's partition in host memory: measured (the host arena's bytes the `optimizer`
/// window kept) and predicted by [`crate::formula::zero::offloaded`] (data only), part by part.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HostStates {
    pub bytes: i64,
    pub predicted_master_bytes: u64,
    pub predicted_gradient_bytes: u64,
    pub predicted_optimizer_state_bytes: u64,
}

/// The single-process check: this rank's averaged gradients (its shard at stage 2) and its
/// weights after the two steps, against one process training on the whole global batch.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Check {
    /// ‖g_rank − g_single‖ / ‖g_single‖ over this rank's runs of every gradient.
    pub gradient_rel_diff: f64,
    /// ‖w_rank − w_single‖ / ‖w_single‖ over every weight after both steps.
    pub weight_rel_diff: f64,
}

/// One rank's report.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RankReport {
    pub rank: usize,
    pub ranks: usize,
    pub zero: u8,
    /// Tensor-parallel ranks the model is split over (`--tp`; 1: every rank the whole model,
    /// the documents before tensor parallelism).
    #[serde(default = "one")]
    pub tp: usize,
    /// Expert-parallel ranks the experts are split over (`--ep`; 1: every rank every expert).
    #[serde(default = "one")]
    pub ep: usize,
    /// [`WINDOWS`], in order.
    pub windows: Vec<Window>,
    pub states: States,
    /// The process's resident high-water mark (`VmHWM`) at the end.
    pub rss_peak_bytes: Option<u64>,
    pub check: Option<Check>,
}

/// The case a rank run trained, as its document names it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RanksCase {
    pub preset: String,
    pub model: String,
    pub hidden: usize,
    /// Query heads and K/V heads of the whole model (0 in documents written before they
    /// were named).
    #[serde(default)]
    pub heads: usize,
    #[serde(default)]
    pub kv_heads: usize,
    pub layers: usize,
    pub params: u64,
    pub batch_per_rank: usize,
    pub seq: usize,
    pub optimizer: String,
    pub threads: usize,
}

impl RanksCase {
    pub fn of(case: &Case, threads: usize) -> Self {
        RanksCase {
            preset: case.preset.clone(),
            model: case.model.as_str().to_string(),
            hidden: case.cfg.hidden,
            heads: case.cfg.heads,
            kv_heads: case.cfg.llama.map_or(case.cfg.heads, |l| l.kv_heads),
            layers: case.cfg.layers,
            params: Shape::of(case).params(),
            batch_per_rank: case.batch,
            seq: case.seq,
            optimizer: case.optimizer.as_str().to_string(),
            threads,
        }
    }
}

/// What `memfit ranks --json` prints and `--out` writes (rank 0): every rank's report, the
/// case and the library; `memfit report` reads these files (`ranks*.json`) beside a result
/// set's rows (claim B5).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RanksDoc {
    /// The commit memfit was built from and the CPU the ranks ran on.
    #[serde(default)]
    pub git_commit: String,
    #[serde(default)]
    pub cpu_model: String,
    pub case: RanksCase,
    pub zero: u8,
    /// Tensor-parallel ranks (`--tp`; 1 in data-parallel documents, and in those written
    /// before it existed): claim B5 reads only documents of 1.
    #[serde(default = "one")]
    pub tp: usize,
    /// Megatron's sequence parallelism beside `tp` (`--sp`); absent without it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub sp: bool,
    /// Expert-parallel ranks (`--ep`; 1 in the other documents): claim B5 reads only
    /// documents of 1.
    #[serde(default = "one")]
    pub ep: usize,
    /// With `--ep`: each rank's experts and the rows its exchanges moved, by rank.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ep_routing: Vec<expert::EpRouting>,
    pub mpi_library: String,
    pub windows: Vec<String>,
    /// Which layer each figure is.
    pub layers: std::collections::BTreeMap<String, String>,
    pub ranks: Vec<RankReport>,
    /// ZeRO 3's prefetch in the backward (`backward`: FSDP's `BACKWARD_PRE`, or `none`);
    /// absent in other stages' documents. ZeRO 3 documents written before it ran without.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fsdp_prefetch: Option<String>,
    /// ZeRO-Offload (`optimizer`: each rank's optimizer partition in host memory); absent
    /// without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offload: Option<String>,
    /// ZeRO 3's `reshard_after_forward` (`on`: FULL_SHARD; `off`: every unit kept whole from
    /// its forward to its backward, SHARD_GRAD_OP); absent in other stages' documents and in
    /// ZeRO 3 documents written before it (which ran `on`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fsdp_reshard_after_forward: Option<String>,
    /// ZeRO 3's `forward_prefetch` (`on`: the next unit gathered before a unit's forward runs;
    /// `off`, FSDP1's default); absent in other stages' documents and in ZeRO 3 documents
    /// written before it (which ran `off`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fsdp_forward_prefetch: Option<String>,
    /// ZeRO 3 as hybrid sharding (`--hsdp S`): the ranks of a shard group; absent with one
    /// group of every rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hsdp_shard_group: Option<usize>,
    /// Serving with tensor parallelism (`--tp N --phases prefill,decode`): the decode's tokens,
    /// each rank's cache and logits check; `windows` are then [`serve::WINDOWS`]. Absent in
    /// training documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve: Option<serve::Serve>,
}

fn one() -> usize {
    1
}

/// The windows a data-parallel rank of ZeRO `stage` measures: [`WINDOWS`], or ZeRO 3's
/// ([`fsdp::WINDOWS`]: the reduce-scatters inside the backward, the gathers inside the forward
/// and backward).
pub fn windows_of_stage(stage: u8) -> &'static [&'static str] {
    if stage == 3 { &fsdp::WINDOWS } else { &WINDOWS }
}

impl RanksDoc {
    pub fn new(
        case: &Case,
        zero: u8,
        tp: usize,
        threads: usize,
        library: String,
        ranks: Vec<RankReport>,
    ) -> Self {
        let layers = [
            (
                "windows",
                "counting allocator (memfit's tensors and bookkeeping), relative to each window's start",
            ),
            (
                "rss_bytes",
                "process resident set after the window (VmRSS), MPI's buffers included",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        RanksDoc {
            git_commit: env!("MEMFIT_GIT_COMMIT").into(),
            cpu_model: crate::machine::cpu_model(),
            case: RanksCase::of(case, threads),
            zero,
            tp,
            sp: false,
            ep: 1,
            ep_routing: Vec::new(),
            mpi_library: library,
            windows: windows_of_stage(zero)
                .iter()
                .map(|w| w.to_string())
                .collect(),
            layers,
            ranks,
            fsdp_prefetch: None,
            offload: None,
            fsdp_reshard_after_forward: None,
            fsdp_forward_prefetch: None,
            hsdp_shard_group: None,
            serve: None,
        }
    }

    /// The `ranks*.json` files under `path` (a file itself, or a folder searched to any depth),
    /// sorted.
    pub fn files(path: &std::path::Path) -> Vec<std::path::PathBuf> {
        crate::store::files_under(path, |p| {
            p.extension().is_some_and(|e| e == "json")
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("ranks"))
        })
    }

    /// Reads one document, naming the file on failure.
    pub fn read(path: &std::path::Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text)
            .with_context(|| format!("{}: not a `memfit ranks` document", path.display()))
    }
}

/// What a rank run is asked.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// ZeRO stage 0, 1 or 2.
    pub zero: u8,
    /// Also train one process on the whole global batch and compare (after the windows).
    pub check: bool,
    /// CPU threads (the formulas' gemm packing buffers).
    pub threads: usize,
    /// Tensor-parallel ranks (`--tp`; 1: data parallel).
    pub tp: usize,
    /// Megatron's sequence parallelism beside tensor parallelism (`--sp`).
    pub sp: bool,
    /// Sequence parallelism all-reduces the norms' gradients over the tp group (false only to
    /// show that `--check` catches its absence).
    pub sp_norm_all_reduce: bool,
    /// Tensor parallelism's `f` all-reduces the gradient in its backward (false only to show
    /// that `--check` catches its absence).
    pub f_all_reduce: bool,
    /// ZeRO 3 adds a tied table's second use (the embedding's) into its gradient's shard
    /// (false only to show that `--check` catches its absence).
    pub tied_second_use: bool,
    /// ZeRO 3 gathers the next unit before a unit's backward (FSDP's `BACKWARD_PRE`).
    pub prefetch: bool,
    /// Expert-parallel ranks (`--ep`; 1: none).
    pub ep: usize,
    /// Expert parallelism's dispatch returns the rows' gradient in its backward (false only
    /// to show that `--check` catches its absence).
    pub ep_dispatch_backward: bool,
    /// Expert parallelism divides the experts' gradients by the ranks (false only to show
    /// that `--check` catches its absence).
    pub ep_expert_scaling: bool,
    /// ZeRO-Offload (`--offload optimizer`, stages 1 and 2): the shard's optimizer in host
    /// memory ([`offload`]).
    pub offload: bool,
    /// ZeRO 3 reshards each unit after its forward (FSDP's `reshard_after_forward=True`,
    /// `FULL_SHARD`); false keeps every unit whole until its backward (`SHARD_GRAD_OP`).
    pub reshard_after_forward: bool,
    /// ZeRO 3 gathers the next unit before a unit's forward (FSDP's `forward_prefetch=True`).
    pub forward_prefetch: bool,
    /// ZeRO 3 as hybrid sharding (FSDP's `HYBRID_SHARD`): shard groups of this many ranks,
    /// each run replicated over the groups; 0: one group of every rank.
    pub hsdp: usize,
}

impl Plan {
    /// ZeRO 3's forward schedule ([`fsdp::ForwardSchedule`]).
    pub fn forward_schedule(&self) -> fsdp::ForwardSchedule {
        fsdp::ForwardSchedule {
            reshard_after_forward: self.reshard_after_forward,
            prefetch: self.forward_prefetch,
        }
    }
}

/// Refuses what the rank runner does not run, by name.
pub fn check_case(case: &Case, zero: u8) -> anyhow::Result<()> {
    ensure!(
        case.device == DeviceSpec::Cpu,
        "ranks: device {}: ranks run on the CPU (NCCL ranks on GPUs are not built)",
        case.device
    );
    ensure!(
        case.dtype.candle() == DType::F32 && case.precision == Precision::Pure,
        "ranks: dtype {} precision {}: ranks train in f32 (their collectives sum f32)",
        case.dtype.as_str(),
        case.precision.as_str()
    );
    ensure!(
        case.cfg.vision.is_none() && case.cfg.lora_rank == 0,
        "ranks: a ViT or LoRA case is not run on ranks (decoders, full fine-tune)"
    );
    ensure!(
        matches!(
            case.optimizer,
            OptimizerKind::Sgd
                | OptimizerKind::SgdMomentum
                | OptimizerKind::Adam
                | OptimizerKind::Adamw
        ),
        "ranks: optimizer {}: sgd, sgd-momentum, adam or adamw (adamw-8bit's blocks are not sharded)",
        case.optimizer.as_str()
    );
    ensure!(
        zero <= 3,
        "ranks: ZeRO stage {zero}: stages 0 to 3 run on ranks"
    );
    Ok(())
}

/// Runs `body` as a window of the counting allocator's meter (`memfit run`'s CPU meter):
/// (peak above the start, retained, start).
fn window<T>(body: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<Win<T>> {
    Ok(host_window(body)?.0)
}

/// [`window`] with the host arena's layer too ([`crate::meter::host_arena`]: the window's
/// (peak above its start, retained) there).
fn host_window<T>(body: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<(Win<T>, Host)> {
    let mut meters: [Box<dyn Meter>; 2] = [
        Box::new(HostArenaMeter::default()),
        Box::new(AllocMeter::default()),
    ];
    let (out, r) = measure(&mut meters, body)?;
    match (
        r.peak_bytes,
        r.retained_bytes,
        r.heap_start_bytes,
        r.host_peak_bytes,
        r.host_retained_bytes,
    ) {
        (Some(peak), Some(retained), Some(start), Some(hp), Some(hr)) => {
            Ok(((out, peak, retained, start), (hp, hr)))
        }
        _ => anyhow::bail!("ranks: the counting allocator read nothing (an `unmetered` build?)"),
    }
}

/// A window's output with the counting allocator's (peak, retained, start).
type Win<T> = (T, u64, i64, u64);

/// A window's host-arena layer: (peak above its start, retained).
type Host = (u64, i64);

/// A window as measured: (peak, retained, start) from the counting allocator, the process's
/// resident set after it.
pub(super) type Measured = (u64, i64, u64, Option<u64>);

/// The windows, measured beside their (peak, retained) predictions.
fn windows_of(measured: &[Measured], predicted: &[(u64, i64)]) -> Vec<Window> {
    measured
        .iter()
        .zip(predicted)
        .map(|(&(peak, retained, start, rss), &(pp, pr))| Window {
            peak_bytes: peak,
            retained_bytes: retained,
            heap_start_bytes: start,
            rss_bytes: rss,
            predicted_peak_bytes: pp,
            predicted_retained_bytes: pr,
            host: None,
        })
        .collect()
}

/// Every variable, by name (the order the collectives visit them on every rank).
fn named_vars(varmap: &VarMap) -> Vec<(String, Var)> {
    let data = varmap.data().lock().expect("varmap lock");
    let mut v: Vec<(String, Var)> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The weights every rank starts from: each tensor that is not constant filled from a xorshift
/// sequence seeded by its name, uniform with a standard deviation of 0.02 (GPT-2's
/// initialisation); the constant ones (norms' weights, zero biases) kept. In place: nothing
/// allocated.
fn fill_deterministic(vars: &[(String, Var)]) -> anyhow::Result<()> {
    for (name, var) in vars {
        // FNV-1a of the name, never 0.
        let mut state = name
            .bytes()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
            })
            .max(1);
        let a = 0.02 * 3f32.sqrt();
        zero::with_f32_mut(var.as_tensor(), |w| {
            if w.iter().all(|&x| x == w[0]) {
                return;
            }
            for x in w.iter_mut() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                *x = ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * a;
            }
        })?;
    }
    Ok(())
}

/// The windows from `reduce` on ([`WINDOWS`]' last four), the same for every layout whose rank
/// steps its own part of the model (data, tensor and expert parallelism), each pushed to
/// `measured`: `reduce` (the layout's gradient collective on `grads`, the first step's),
/// `check` on the reduced gradients between the windows (everything it makes is freed before
/// the next), `optimizer` (`make` builds the optimizer over this rank's part, which steps
/// once), `gather` (the layout's collective after a step), and a whole steady `train-step`
/// (forward, backward, `reduce`, the step, `gather`). Returns the check's answer, the
/// optimizer (its state kept until the rank's report) and the four windows' host-arena layer
/// (peak, retained: ZeRO-Offload's partition; zeros without it).
#[allow(clippy::too_many_arguments)]
fn step_tail<C>(
    step: &Step<'_>,
    mut grads: GradStore,
    comm: &dyn Comm,
    measured: &mut Vec<Measured>,
    reduce: &dyn Fn(&mut GradStore) -> anyhow::Result<()>,
    check: impl FnOnce(&GradStore) -> anyhow::Result<C>,
    make: impl FnOnce() -> anyhow::Result<zero::Sharded>,
    gather: &dyn Fn() -> anyhow::Result<()>,
) -> anyhow::Result<(C, zero::Sharded, [Host; 4])> {
    let mut host = [(0, 0); 4];
    comm.barrier();
    let (((), p, r, s), h) = host_window(|| reduce(&mut grads))?;
    measured.push((p, r, s, vm_rss_bytes()));
    host[0] = h;
    let checked = check(&grads)?;
    let ((mut opt, p, r, s), h) = host_window(|| {
        let mut o = make()?;
        o.step(&grads)?;
        Ok(o)
    })?;
    measured.push((p, r, s, vm_rss_bytes()));
    host[1] = h;
    comm.barrier();
    let (((), p, r, s), h) = host_window(gather)?;
    measured.push((p, r, s, vm_rss_bytes()));
    host[2] = h;
    drop(grads);
    comm.barrier();
    // A mixture's routing from here is the train step's (the check's forward before it not).
    crate::model::moe::routing_window();
    let (((), p, r, s), h) = host_window(|| {
        let mut graph = Some(step.forward()?);
        let mut grads = step.backward(&mut graph)?;
        drop(graph);
        reduce(&mut grads)?;
        opt.step(&grads)?;
        gather()?;
        drop(grads);
        Ok(())
    })?;
    measured.push((p, r, s, vm_rss_bytes()));
    host[3] = h;
    Ok((checked, opt, host))
}

/// The `forward` and `backward` windows of a rank that steps its own part of the model (data,
/// tensor and expert parallelism), each pushed to `measured` (after `init`, its first): the
/// gradients, the bytes they hold with the forward's graph gone, and what `between` took
/// after the forward (a mixture's routing, the exchanges' rows).
fn forward_backward<X>(
    step: &Step<'_>,
    comm: &dyn Comm,
    measured: &mut Vec<Measured>,
    between: impl FnOnce() -> X,
) -> anyhow::Result<(GradStore, i64, X)> {
    comm.barrier();
    let (graph, p, r, s) = window(|| Ok(step.forward()?))?;
    measured.push((p, r, s, vm_rss_bytes()));
    let x = between();
    let mut graph = Some(graph);
    let (grads, p, r, s) = window(|| Ok(step.backward(&mut graph)?))?;
    measured.push((p, r, s, vm_rss_bytes()));
    drop(graph);
    let grads_held = cpu_alloc::current() as i64 - measured[1].2 as i64;
    Ok((grads, grads_held, x))
}

/// Rank `rank`'s rows of the synthetic global batch of `ranks·B` rows.
fn rank_batch(case: &Case, rank: usize, ranks: usize) -> anyhow::Result<(Tensor, Tensor)> {
    let (b, s) = (case.batch, case.seq);
    let (tokens, targets) = synthetic_batch(ranks * b, s, case.cfg.vocab, &Device::Cpu)?;
    let rows = |t: Tensor| t.narrow(0, rank * b, b)?.contiguous()?.copy();
    Ok((rows(tokens)?, rows(targets)?))
}

/// A rank's (or the single process's) model and batch: its training forward and backward.
struct Step<'a> {
    model: &'a Transformer,
    vars: &'a [(String, Var)],
    tokens: &'a Tensor,
    targets: &'a Tensor,
    case: &'a Case,
}

impl Step<'_> {
    fn forward(
        &self,
    ) -> candle_core::Result<
        train::Graph<Tensor, crate::model::moe::HostRouting, crate::model::config::Config>,
    > {
        train::forward(
            self.model,
            None,
            self.tokens,
            self.targets,
            self.case.checkpoint,
            self.case.backward,
        )
    }

    fn backward(
        &self,
        graph: &mut Option<
            train::Graph<Tensor, crate::model::moe::HostRouting, crate::model::config::Config>,
        >,
    ) -> candle_core::Result<GradStore> {
        let vars = || self.vars.iter().map(|(_, v)| v.clone()).collect::<Vec<_>>();
        train::backward(self.model, vars, graph, self.tokens, self.case.checkpoint)
    }
}

impl Step<'_> {
    /// One forward and backward: the gradients (the reference's).
    fn gradients(&self) -> anyhow::Result<GradStore> {
        let mut graph = Some(self.forward()?);
        let grads = self.backward(&mut graph)?;
        drop(graph);
        Ok(grads)
    }

    /// Two steps of the case's optimizer on every variable (in place, unsharded): the
    /// reference's weights for a check.
    fn train_twice(&self) -> anyhow::Result<()> {
        let stepper = Stepper::new(self.case.optimizer, crate::optim::LEARNING_RATE)?;
        let mut opt = zero::Sharded::new(stepper, 0, self.vars, &comm::Solo)?;
        for _ in 0..2 {
            opt.step(&self.gradients()?)?;
        }
        Ok(())
    }
}

/// What a data-parallel rank (ZeRO 0 to 3) starts from: its batch, the model built whole in
/// the `init` window (pushed onto `measured`), every weight filled as rank 0's.
struct Start {
    tokens: Tensor,
    targets: Tensor,
    varmap: VarMap,
    model: Transformer,
    vars: Vec<(String, Var)>,
}

/// The warm-up (first-use allocations: gemm's packing, thread-locals; the library's first
/// collectives, the all-gather too when `gather`), this rank's batch, then the `init` window
/// and the weights filled deterministically and broadcast from rank 0.
fn start(
    case: &Case,
    comm: &dyn Comm,
    gather: bool,
    measured: &mut Vec<Measured>,
) -> anyhow::Result<Start> {
    let (rank, ranks) = (comm.rank(), comm.size());
    let device = Device::Cpu;
    crate::phase::runner::warm_up(case, &device).context("the warm-up step")?;
    warm_up_collectives(comm, gather);
    let (tokens, targets) = rank_batch(case, rank, ranks)?;
    let varmap = VarMap::new();
    let (model, p, r, s) = window(|| {
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &device);
        Ok(Transformer::new(&case.cfg, vb)?)
    })?;
    measured.push((p, r, s, vm_rss_bytes()));
    let vars = named_vars(&varmap);
    fill_deterministic(&vars)?;
    for (_, v) in &vars {
        zero::with_f32_mut(v.as_tensor(), |w| comm.broadcast(0, w))?;
    }
    Ok(Start {
        tokens,
        targets,
        varmap,
        model,
        vars,
    })
}

/// The data-parallel collectives (ZeRO's all-reduce, broadcast and reduce, and with `gather`
/// its all-gather) used once on `comm` before any window, so that the library's first-use
/// allocations fall outside them.
fn warm_up_collectives(comm: &dyn Comm, gather: bool) {
    let (rank, ranks) = (comm.rank(), comm.size());
    let mut x = [1.0f32; 4];
    let send = x;
    comm.all_reduce_sum(&send, &mut x);
    comm.broadcast(0, &mut x);
    comm.reduce_sum(0, &send, (rank == 0).then_some(&mut x[..]));
    if gather {
        let mut all = vec![0f32; 4 * ranks];
        let mine = zero::run_of(all.len(), ranks, rank).len();
        comm.all_gather_into(&send[..mine.min(4)], &mut all);
    }
    comm.barrier();
}

/// Runs one rank of `case` under `plan` over `comm`, measuring and predicting its windows.
pub fn run_rank(case: &Case, plan: Plan, comm: &dyn Comm) -> anyhow::Result<RankReport> {
    check_case(case, plan.zero)?;
    if plan.zero == 3 {
        return fsdp::run_fsdp_rank(case, plan, comm);
    }
    let (rank, ranks) = (comm.rank(), comm.size());
    let mut measured = Vec::with_capacity(WINDOWS.len());
    let Start {
        tokens,
        targets,
        varmap,
        model,
        vars,
    } = start(case, comm, false, &mut measured)?;
    let step = Step {
        model: &model,
        vars: &vars,
        tokens: &tokens,
        targets: &targets,
        case,
    };
    let stepper = Stepper::new(case.optimizer, crate::optim::LEARNING_RATE)?;

    // forward, backward (a mixture's routing of this forward kept for the predictions)
    crate::model::moe::routing_window();
    let (grads, grads_held, first) = forward_backward(&step, comm, &mut measured, || {
        crate::model::moe::routing_snapshot()
    })?;
    // reduce, optimizer, gather, train-step; the check's first half between reduce and
    // optimizer: this rank's averaged gradients against one process's on the global batch.
    let (gradient_rel_diff, opt, host) = step_tail(
        &step,
        grads,
        comm,
        &mut measured,
        &|g| Ok(zero::reduce(plan.zero, &vars, g, comm)?),
        |g| {
            plan.check
                .then(|| check_gradients(case, comm, &vars, g, plan.zero))
                .transpose()
        },
        || {
            Ok(if plan.offload {
                zero::Sharded::offloaded(stepper, plan.zero, &vars, comm)?
            } else {
                zero::Sharded::new(stepper, plan.zero, &vars, comm)?
            })
        },
        &|| Ok(zero::gather(plan.zero, &vars, comm)?),
    )?;

    // The train step's routing (`step_tail` opens a routing window before it).
    let last = crate::model::moe::routing_snapshot();
    let zero_grads = match &first {
        Some(mine) => zero_gradient_bytes(&vars, mine, comm),
        None => 0,
    };
    let routed = Routed {
        first,
        last,
        zero_grads,
    };
    let predicted = predict_windows(case, plan, ranks, rank, &routed);
    let mut windows = windows_of(&measured, &predicted);
    if plan.offload {
        let predicted = predict_host_windows(&Shape::of(case), case.optimizer, ranks, rank);
        for (w, ((peak, retained), (pp, pr))) in
            windows[3..].iter_mut().zip(host.iter().zip(predicted))
        {
            w.host = Some(HostWindow {
                peak_bytes: *peak,
                retained_bytes: *retained,
                predicted_peak_bytes: pp,
                predicted_retained_bytes: pr,
            });
        }
    }
    let states = states(case, plan, ranks, &windows, grads_held);
    let check = match gradient_rel_diff {
        Some(gradient_rel_diff) => Some(Check {
            gradient_rel_diff,
            weight_rel_diff: check_weights(case, comm, &vars)?,
        }),
        None => None,
    };
    drop((opt, model, varmap));
    Ok(RankReport {
        rank,
        ranks,
        zero: plan.zero,
        tp: 1,
        ep: 1,
        windows,
        states,
        rss_peak_bytes: vm_hwm_bytes(),
        check,
    })
}

/// One process on the whole global batch from the same starting weights (the deterministic
/// fill: rank 0's after the broadcast): its model, variables by name, and its step.
struct Single {
    _varmap: VarMap,
    model: Transformer,
    vars: Vec<(String, Var)>,
    tokens: Tensor,
    targets: Tensor,
    case: Case,
}

impl Single {
    fn new(case: &Case, ranks: usize) -> anyhow::Result<Self> {
        let device = Device::Cpu;
        let varmap = VarMap::new();
        let model = Transformer::new(
            &case.cfg,
            VarBuilder::from_varmap(&varmap, DType::F32, &device),
        )?;
        let vars = named_vars(&varmap);
        fill_deterministic(&vars)?;
        let (tokens, targets) =
            synthetic_batch(ranks * case.batch, case.seq, case.cfg.vocab, &device)?;
        Ok(Single {
            _varmap: varmap,
            model,
            vars,
            tokens,
            targets,
            case: Case {
                batch: ranks * case.batch,
                ..case.clone()
            },
        })
    }

    fn step(&self) -> Step<'_> {
        Step {
            model: &self.model,
            vars: &self.vars,
            tokens: &self.tokens,
            targets: &self.targets,
            case: &self.case,
        }
    }
}

/// `‖a − b‖² and ‖b‖²`, added to `sums`.
fn add_sums(sums: &mut (f64, f64), a: &[f32], b: &[f32]) {
    for (x, y) in a.iter().zip(b) {
        sums.0 += ((x - y) as f64).powi(2);
        sums.1 += (*y as f64).powi(2);
    }
}

/// `‖a − b‖ / ‖b‖` from [`add_sums`]' sums. Over every element compared at once: a tensor
/// whose gradient is zero in exact arithmetic (the keys' bias under softmax) holds only
/// rounding, and its relative difference alone means nothing.
fn rel((d, n): (f64, f64)) -> f64 {
    if n == 0.0 { d.sqrt() } else { (d / n).sqrt() }
}

/// `‖a − b‖ / ‖b‖` over every variable of `mine` (a rank's), `a` and `b` what `pick` takes
/// from it and from the variable of the same name in `whole` (one process's model).
fn compare(
    mine: &[(String, Var)],
    whole: &[(String, Var)],
    pick: impl Fn(&str, &Var, &Var) -> anyhow::Result<(Tensor, Tensor)>,
) -> anyhow::Result<f64> {
    let mut sums = (0f64, 0f64);
    for (name, v) in mine {
        let (_, w) = whole
            .iter()
            .find(|(n, _)| n == name)
            .with_context(|| format!("ranks check: {name} is not in the whole model"))?;
        let (a, b) = pick(name, v, w)?;
        add_sums(
            &mut sums,
            &a.flatten_all()?.to_vec1::<f32>()?,
            &b.flatten_all()?.to_vec1::<f32>()?,
        );
    }
    Ok(rel(sums))
}

/// `var`'s gradient in `grads`, naming it when there is none.
fn grad_of(grads: &GradStore, name: &str, var: &Var) -> anyhow::Result<Tensor> {
    grads
        .get(var.as_tensor())
        .cloned()
        .with_context(|| format!("ranks check: no gradient for {name}"))
}

/// This rank's averaged gradients (its run of each: at stage 2 what it keeps, else the run it
/// steps) against one process's on the whole global batch.
fn check_gradients(
    case: &Case,
    comm: &dyn Comm,
    vars: &[(String, Var)],
    grads: &GradStore,
    zero: u8,
) -> anyhow::Result<f64> {
    let (rank, ranks) = (comm.rank(), comm.size());
    let single = Single::new(case, ranks)?;
    let reference = single.step().gradients()?;
    compare(vars, &single.vars, |name, v, w| {
        let mine = grad_of(grads, name, v)?.flatten_all()?;
        let theirs = grad_of(&reference, name, w)?.flatten_all()?;
        owned_runs(mine, theirs, zero, ranks, rank)
    })
}

/// A rank's flattened gradient and the reference's, each narrowed to the run rank `rank` of
/// `ranks` owns (ZeRO 2 keeps only that run: `mine` is it already).
fn owned_runs(
    mine: Tensor,
    theirs: Tensor,
    zero: u8,
    ranks: usize,
    rank: usize,
) -> anyhow::Result<(Tensor, Tensor)> {
    let run = zero::run_of(theirs.elem_count(), ranks, rank);
    let theirs = theirs.narrow(0, run.start, run.len())?;
    let mine = if zero == 2 {
        mine
    } else {
        mine.narrow(0, run.start, run.len())?
    };
    Ok((mine, theirs))
}

/// This rank's weights after its two steps against one process's after two steps of the same
/// optimizer (in place, unsharded) on the whole global batch.
fn check_weights(case: &Case, comm: &dyn Comm, vars: &[(String, Var)]) -> anyhow::Result<f64> {
    let single = Single::new(case, comm.size())?;
    single.step().train_twice()?;
    compare(vars, &single.vars, |_, a, b| {
        Ok((a.as_tensor().clone(), b.as_tensor().clone()))
    })
}

/// Bytes of a state or shard tensor's bookkeeping beyond its data (`Tensor::zeros`: as the
/// in-place optimizer's state, measured there).
const TENSOR_META: u64 = crate::optim::inplace::STATE_META_PER_TENSOR;

/// Each window's (peak, retained) predicted for rank `rank` of `ranks`.
pub fn predict_windows(
    case: &Case,
    plan: Plan,
    ranks: usize,
    rank: usize,
    routed: &Routed,
) -> Vec<(u64, i64)> {
    let shape = Shape::of(case);
    let with = |r: &Option<Vec<Vec<usize>>>| Shape {
        routing: r.clone().map(std::sync::Arc::new),
        ..shape.clone()
    };
    let at = |r: &Option<Vec<Vec<usize>>>| {
        predict_windows_of(
            &with(r),
            case.optimizer,
            plan,
            ranks,
            rank,
            routed.zero_grads,
        )
    };
    let mut w = at(&routed.first);
    if routed.last != routed.first {
        // The train step at its own routing (the weights moved by a step).
        w[6] = at(&routed.last)[6];
    }
    w
}

/// A mixture of experts' routing on a data-parallel rank, as measured (tokens per expert per
/// sparse layer; `None`: a dense model, or balanced), of the first step's forward and of the
/// train step's, and the bytes of the zero gradients the first `reduce` makes for the experts
/// this rank's tokens skipped and another rank's did not ([`zero_gradient_bytes`]).
#[derive(Debug, Clone, Default)]
pub struct Routed {
    pub first: Option<Vec<Vec<usize>>>,
    pub last: Option<Vec<Vec<usize>>>,
    pub zero_grads: u64,
}

/// `(layer, expert)` of a routed expert's variable (`h.<l>.mlp.experts.<e>.…`: the first
/// number of the name is its block's).
fn expert_slot(name: &str) -> Option<(usize, usize)> {
    let (head, rest) = name.split_once(".experts.")?;
    let e = rest.split('.').next()?.parse().ok()?;
    let l = head.split('.').find_map(|p| p.parse().ok())?;
    Some((l, e))
}

/// The bytes of the zero gradients [`zero::reduce`] gives this rank (data and a tensor's
/// bookkeeping each): the routed experts no token of this rank went to (`mine`: tokens per
/// expert per sparse layer) that some rank's tokens did go to (every rank's routing
/// all-gathered: a collective, so every rank calls it).
fn zero_gradient_bytes(vars: &[(String, Var)], mine: &[Vec<usize>], comm: &dyn Comm) -> u64 {
    let flat: Vec<f32> = mine.iter().flatten().map(|&c| c as f32).collect();
    let n = flat.len();
    let mut all = vec![0f32; n * comm.size()];
    comm.all_gather_into(&flat, &mut all);
    let anywhere = |i: usize| (0..comm.size()).any(|r| all[r * n + i] > 0.0);
    let layers: std::collections::BTreeSet<usize> = vars
        .iter()
        .filter_map(|(name, _)| expert_slot(name).map(|s| s.0))
        .collect();
    let experts = mine.first().map_or(0, |c| c.len());
    vars.iter()
        .filter_map(|(name, v)| {
            let (l, e) = expert_slot(name)?;
            let i = layers.iter().position(|&k| k == l)? * experts + e;
            (flat.get(i) == Some(&0.0) && anywhere(i))
                .then(|| 4 * v.elem_count() as u64 + TENSOR_META)
        })
        .sum()
}

/// [`predict_windows`] for the model `shape` (a tensor-parallel rank's shard) trained by `opt`;
/// `zero_grads`: the bytes of the zero gradients the first `reduce` makes ([`Routed`]).
pub fn predict_windows_of(
    shape: &Shape,
    opt: OptimizerKind,
    plan: Plan,
    ranks: usize,
    rank: usize,
    zero_grads: u64,
) -> Vec<(u64, i64)> {
    let at = |p: Phase| shape.predict(p, opt, plan.threads);
    let (init, fwd, bwd) = (at(Phase::Init), at(Phase::Forward), at(Phase::Backward));
    let sizes: Vec<u64> = shape.trainable_sizes();
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let run = |n: u64| zero::run_of(n as usize, ranks, rank).len() as u64;
    let grads = shape.gradient_bytes();
    let (reduce_peak, reduce_kept): (u64, i64) = if plan.zero < 2 {
        (4 * largest.min(zero::BUCKET_ELEMS as u64), 0)
    } else {
        let shards: u64 = sizes.iter().map(|&n| 4 * run(n) + TENSOR_META).sum();
        (4 * run(largest) + TENSOR_META, shards as i64 - grads as i64)
    };
    // The zero gradients are made first and kept (as gradients, or cut to shards): the
    // backward left `grads − zero_grads`, every variable has one after.
    let (reduce_peak, reduce_kept) = (reduce_peak + zero_grads, reduce_kept + zero_grads as i64);
    let grads = grads - zero_grads;
    let stepper = Stepper::new(opt, crate::optim::LEARNING_RATE).expect("checked optimizer");
    let (m, v) = stepper.state();
    let moments = m as u64 + v as u64;
    let owned: u64 = sizes
        .iter()
        .map(|&n| if plan.zero == 0 { n } else { run(n) })
        .sum();
    let state = if plan.offload {
        // The slots' bookkeeping only: the partition is in the host arena.
        (zero::SLOT_BYTES + offload::HOST_SLOT_BYTES) * sizes.len() as u64
    } else {
        moments * (4 * owned + TENSOR_META * sizes.len() as u64)
            + zero::SLOT_BYTES * sizes.len() as u64
    };
    let t = shape.replay_training(plan.threads);
    let held = (grads as i64 + reduce_kept) as u64;
    let step = (t.forward_retained + t.backward_peak)
        .max(t.forward_peak)
        .max(grads + reduce_peak)
        .max(held);
    vec![
        (init.peak_bytes, init.retained_bytes),
        (fwd.peak_bytes, fwd.retained_bytes),
        (bwd.peak_bytes, bwd.retained_bytes),
        (reduce_peak, reduce_kept),
        (state, state as i64),
        (0, 0),
        (step, 0),
    ]
}

/// The host arena's (peak, retained) predicted for the windows from `reduce` on of an
/// offloading rank ([`offload`]): the partition made in `optimizer` — master, gradient buffer
/// and state of this rank's run of each trainable tensor — and nothing else.
pub fn predict_host_windows(
    shape: &Shape,
    opt: OptimizerKind,
    ranks: usize,
    rank: usize,
) -> [(u64, i64); 4] {
    let stepper = Stepper::new(opt, crate::optim::LEARNING_RATE).expect("checked optimizer");
    let (m, v) = stepper.state();
    let runs = shape
        .trainable_sizes()
        .into_iter()
        .map(|n| zero::run_of(n as usize, ranks, rank).len() as u64);
    let part = offload::host_bytes(runs, m as u64 + v as u64);
    [(0, 0), (part, part as i64), (0, 0), (0, 0)]
}

/// The model states entering the optimizer, measured from the windows and predicted by
/// [`crate::formula::zero::shards`] (with `--offload optimizer`, by
/// [`crate::formula::zero::offloaded`]: the device's optimizer state none, the host's measured
/// beside it).
fn states(case: &Case, plan: Plan, ranks: usize, w: &[Window], grads_held: i64) -> States {
    let shape = Shape::of(case);
    let p = shape.params();
    let state = crate::formula::parallel::rates(4, case.optimizer).map_or(0, |(_, _, o)| o * p);
    let n = ranks as u64;
    let ((pw, pg, po), host) = if plan.offload {
        let (device, host) =
            crate::formula::zero::offloaded(plan.zero, n, (4 * p, 4 * p, state), p, false);
        let measured = w[4].host.map_or(0, |h| h.retained_bytes);
        (
            device,
            Some(HostStates {
                bytes: measured,
                predicted_master_bytes: host.0,
                predicted_gradient_bytes: host.1,
                predicted_optimizer_state_bytes: host.2,
            }),
        )
    } else {
        let shards = crate::formula::zero::shards(plan.zero, n, (4 * p, 4 * p, state), false);
        (shards, None)
    };
    States {
        weights_bytes: w[0].retained_bytes,
        gradient_bytes: grads_held + w[3].retained_bytes,
        optimizer_state_bytes: w[4].retained_bytes,
        predicted_weights_bytes: pw,
        predicted_gradient_bytes: pg,
        predicted_optimizer_state_bytes: po,
        host,
    }
}

/// (tests) One training loss of `model` on `tokens` and every variable's gradient, flattened:
/// what the collectives' one-rank tests compare with and without their hooks.
#[cfg(test)]
fn loss_and_gradients(
    model: &Transformer,
    vars: &[(String, Var)],
    tokens: &Tensor,
    targets: &Tensor,
) -> (f32, Vec<Vec<f32>>) {
    let loss = model.training_loss(tokens, targets, None).unwrap();
    let grads = loss.backward().unwrap();
    let g = vars
        .iter()
        .map(|(_, v)| {
            let g = grads.get(v.as_tensor()).unwrap();
            g.flatten_all().unwrap().to_vec1().unwrap()
        })
        .collect();
    (loss.to_scalar::<f32>().unwrap(), g)
}

#[cfg(test)]
mod slot_tests {
    /// A routed expert's variable names its block and its expert; a shared expert or the
    /// router names none.
    #[test]
    fn expert_slot_reads_the_block_and_the_expert() {
        assert_eq!(
            super::expert_slot("h.12.mlp.experts.3.gate.weight"),
            Some((12, 3))
        );
        assert_eq!(
            super::expert_slot("h.1.mlp.shared_experts.gate.weight"),
            None
        );
        assert_eq!(super::expert_slot("h.1.mlp.router.weight"), None);
    }
}
