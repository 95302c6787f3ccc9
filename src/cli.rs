//! Command-line definitions (clap derive). Parsing does no I/O; `cmd::*` resolves and runs.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::workload::GridSpec;

#[derive(Debug, Parser)]
#[command(
    name = "memfit",
    version,
    about = "Measures where the memory goes when a model trains or serves, and how well formulas predict it",
    after_help = "Example:\n  memfit run                      # the embedded default workload on the CPU\n  memfit run workloads/default.toml --threads 1 --out runs/mine"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a workload: every case × phase measured, predicted and stored.
    #[command(
        after_help = "Every key of a workload file's grid is a flag too: a comma list (--batch 1,2,4) expands like a TOML list, and flags lie over every grid of a file.\n\nExit status: 0 every row measured; 1 bad input, or the journal could not be written (the message says how to resume); 2 a malformed command line; 3 every row written, but some case crashed, failed, ran out of memory or of time (its rows say which); 130 interrupted by SIGINT/SIGTERM (resume with --resume --out DIR).\n\nExamples:\n  memfit run\n  memfit run workloads/default.toml --out runs/a\n  memfit run --model gpt --batch 3 --seq 100 --hidden 96 --heads 3 --layers 5 --vocab 300 \\\n      --phases init,forward,backward,optimizer,train-step,inference --optimizer adamw --out runs/b\n  memfit run --preset small --batch 1,2,4 --seq 64 --threads 1"
    )]
    Run(Box<RunArgs>),
    /// Write results.csv and results.h5 of a run folder from its journal and meta.json (e.g. a
    /// GPU run whose machine had no HDF5 library).
    #[command(after_help = "Example:\n  memfit convert results/h200/20261202T120000Z")]
    Convert(ConvertArgs),
    /// Predict every phase's memory for a workload or flags, without running anything.
    #[command(
        after_help = "Every key of a workload file's grid is a flag too: a comma list (--batch 1,2,4) expands like a TOML list, and flags lie over every grid of a file.\n\nExamples:\n  memfit predict --preset gpt2-medium --batch 8 --seq 1024 --dtype bf16 --precision mixed\n  memfit predict --preset llama-7b-shape --batch 4 --seq 4096 --dtype bf16 --precision mixed \\\n      --attention standard --fit-in 80GiB\n  memfit predict workloads/default.toml --json"
    )]
    Predict(Box<PredictArgs>),
    /// Fit each phase's peak to the decoder features from stored results (never measures),
    /// with 5-fold and extrapolation held-out errors.
    #[command(
        after_help = "Examples:\n  memfit fit runs/\n  memfit fit results/h200 runs/a/results.jsonl --json"
    )]
    Fit(FitArgs),
    /// The largest batch whose training step fits a memory budget: predicted, then verified
    /// by running trials (each in a child process) around the prediction.
    #[command(
        after_help = "Example:\n  memfit max-batch --preset small --seq 128 --budget 1GiB\n  memfit max-batch --hidden 96 --heads 3 --layers 2 --vocab 300 --seq 64 --budget 64MiB --json"
    )]
    MaxBatch(Box<MaxBatchArgs>),
    /// Write a report (Markdown, HTML, PNG and SVG plots) from stored results: per-phase
    /// tables, fits, textbook formulas, the claims table and a hardware comparison. Each
    /// argument is one result set (a machine); nothing is measured.
    #[command(
        after_help = "Examples:\n  memfit report results/cpu --out docs/report\n  memfit report results/cpu results/h200 --out report --measure-cpu-peak"
    )]
    Report(ReportArgs),
    /// Merge the run folders of a sharded sweep (`run --shard I/N`) into one: rows keyed by
    /// case and phase, identical duplicates kept once, conflicts refused (or --on-conflict),
    /// every shard's meta.json kept, CSV and HDF5 rebuilt.
    #[command(
        after_help = "Example:\n  memfit merge runs/sweep/shard-0 runs/sweep/shard-1 --out runs/sweep/merged"
    )]
    Merge(MergeArgs),
    /// Synthetic image datasets for the dataload phase.
    #[command(subcommand)]
    Dataset(DatasetCommand),
    /// One bare operation in a window of the device's meters: what a library allocates beyond
    /// the tensors a formula counts.
    #[command(subcommand)]
    Probe(ProbeCommand),
    /// The numeric self-checks on one device: the fused kernels against candle's composed ops
    /// and the in-place optimizer steps against the reference ones (what the test suite runs,
    /// built into the binary so a GPU machine can run them without test binaries).
    #[command(
        after_help = "Examples:\n  memfit selftest\n  memfit selftest --device cuda:0 --json\n  memfit selftest --list\n  memfit selftest --filter attn"
    )]
    Selftest(SelftestArgs),
    /// One rank of a training (or, `--tp N --phases prefill,decode`, serving) case per process,
    /// launched by `mpirun -np N` or `srun -n N`: data parallel with ZeRO 0 to 3 (ZeRO-Offload,
    /// FSDP's SHARD_GRAD_OP and HYBRID_SHARD), tensor, expert or pipeline parallel, through MPI;
    /// every rank's windows measured and predicted, printed by rank 0.
    #[command(
        after_help = "Needs a build with `--features ranks` (MPI) to run more than one rank.\n\nExamples:\n  mpirun -np 2 memfit ranks --preset small --layers 2 --batch 2 --seq 64 --optimizer adamw --zero 1\n  srun -n 4 memfit ranks --hidden 96 --heads 3 --layers 2 --vocab 300 --seq 32 --zero 2 --check --json\n  mpirun -np 2 memfit ranks --model llama --hidden 64 --heads 4 --kv-heads 2 --layers 2 --tp 2 --check"
    )]
    Ranks(Box<RanksArgs>),
    /// (internal) A dataload worker process: jobs on stdin, batches on stdout.
    #[command(hide = true)]
    DataloadWorker(DataloadWorkerArgs),
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Result sets: folders searched for results.jsonl (else results.h5), or files; one set each.
    #[arg(required = true)]
    pub results: Vec<PathBuf>,
    /// Folder the report is written to (created if missing).
    #[arg(long)]
    pub out: PathBuf,
    /// Measure this CPU's f32 matmul FLOP/s (a few seconds) as the CPU sets' peak, when this
    /// host's CPU model is the results' one.
    #[arg(long)]
    pub measure_cpu_peak: bool,
}

#[derive(Debug, Subcommand)]
pub enum DatasetCommand {
    /// Write a deterministic synthetic JPEG/PNG dataset: loose files and one packed file.
    #[command(
        after_help = "Example:\n  memfit dataset make --out data/synth --count 512 --size 256-512\n  memfit run --phases dataload --dataset data/synth --workers 0,1,2 --batch 32"
    )]
    Make(DatasetMakeArgs),
}

#[derive(Debug, Args)]
pub struct DatasetMakeArgs {
    /// Folder to create (must not hold a dataset yet).
    #[arg(long)]
    pub out: PathBuf,
    /// Number of images.
    #[arg(long, default_value_t = 256)]
    pub count: usize,
    /// Side in pixels: `PX` (square) or `MIN-MAX` (width and height drawn per image).
    #[arg(long, default_value = "256-512")]
    pub size: String,
    /// Encodings, cycled over the images: jpeg, png.
    #[arg(long, value_delimiter = ',', default_value = "jpeg,png")]
    pub format: Vec<String>,
    /// Seed: the same seed and sizes give the same bytes.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(Debug, Args)]
pub struct DataloadWorkerArgs {
    #[arg(long)]
    pub dataset: PathBuf,
    #[arg(long)]
    pub storage: String,
    #[arg(long)]
    pub crop: u32,
    #[arg(long)]
    pub seed: u64,
}

#[derive(Debug, Args)]
pub struct MaxBatchArgs {
    /// The case: workload keys as flags (one case; `--batch` is what is searched).
    #[command(flatten)]
    pub grid: GridArgs,
    /// The memory budget (e.g. 1GiB): on the CPU the heap cap of `run --mem-budget`, on CUDA
    /// the device's own memory decides.
    #[arg(long)]
    pub budget: String,
    /// CPU threads of the trials.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// A mixture of experts: the routing the predicted batch assumes (as `predict --routing`):
    /// `worst` holds whatever the tokens, `balanced` is what a trained router tends to. The
    /// trials run the model's own router either way.
    #[arg(long, value_enum, default_value_t = Routing::Worst)]
    pub routing: Routing,
    /// One JSON object instead of the text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct FitArgs {
    /// Result files (results.jsonl, results.h5) or folders searched for them.
    #[arg(required = true)]
    pub results: Vec<PathBuf>,
    /// One JSON object per group instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct PredictArgs {
    /// Workload TOML file; without it the flags describe the cases (default: the embedded
    /// default workload).
    pub workload: Option<PathBuf>,
    #[command(flatten)]
    pub grid: GridArgs,
    /// CPU threads the CPU formulas assume (gemm's packing buffers); default: all cores.
    #[arg(long)]
    pub threads: Option<usize>,
    /// A memory budget (e.g. 80GiB, 24G, 512MiB): says whether each case's training step fits
    /// and the largest batch that would.
    #[arg(long)]
    pub fit_in: Option<String>,
    /// A mixture of experts: the routing `--fit-in`'s answers assume (fits, max batch, max
    /// sequence, KV capacity, max context). `worst` (every token of a forward on the same k
    /// experts, each other expert a token) holds whatever the tokens; `balanced` (k·B·S/E
    /// tokens each) is what a trained router tends to.
    #[arg(long, value_enum, default_value_t = Routing::Worst)]
    pub routing: Routing,
    /// One JSON object per case instead of the table.
    #[arg(long)]
    pub json: bool,
    /// A parallel layout, `tp=T,pp=P,dp=D,zero=Z,ep=E,mb=M,vp=V,amp=A` (any subset; the rest
    /// 1, ZeRO 0; `vp`: Megatron's interleaved stages, V chunks a rank): each pipeline stage's rank's model states (weights, gradients, optimizer
    /// state), from the model's tensors split as Megatron-Core splits them, ZeRO sharding over
    /// the data-parallel group, and (dense LLaMA-family decoders) the activations 1F1B keeps.
    /// `amp` (mixed precision): autocast (the default: memfit's own step, f32 masters and a
    /// 16-bit copy in the graph), megatron (bf16 parameters, f32 main gradients, f32 master +
    /// state in the optimizer) or deepspeed (bf16 parameters and gradients, f32 master + state).
    /// `sp=on`: sequence parallelism (the norms' and the residual stream's activations split
    /// over tp). `offload=optimizer` (ZeRO 1–3): ZeRO-Offload, each rank's optimizer partition
    /// (f32 master, f32 gradient buffer, state) in host memory, its bytes a rank beside the
    /// device's. `gather=unit|tensor` (ZeRO 3): what a rank holds gathered beside its shards —
    /// FSDP's units (`unit`, the default but under amp=deepspeed: the largest layer, embedding
    /// or head whole twice, its next unit prefetched, and its gradient once) or DeepSpeed's
    /// estimator (`tensor`: the largest tensor's weight and gradient). `search` (with --fit-in
    /// and --gpus): every layout of that many GPUs, those that fit first. With `--phases
    /// prefill,decode`: one vLLM serving rank, `tp=T` (tensor parallel) or `tp=T,ep=E` (expert
    /// parallel over E/T data-parallel attention replicas, ⌈experts/E⌉ whole experts a rank; E
    /// a multiple of T).
    #[arg(long, value_name = "LAYOUT")]
    pub parallel: Option<String>,
    /// `--parallel search`: the GPUs every layout is laid over (tp·pp·dp).
    #[arg(long)]
    pub gpus: Option<usize>,
    /// Stored results (folder or file, any format `fit` reads) to calibrate the analytical
    /// peaks with: per phase, device kind and dtype, measured ≈ a + b·predicted.
    #[arg(long)]
    pub calibration: Option<PathBuf>,
    /// Write each case's predicted train step and serving phases (inference, prefill, decode)
    /// as memory timelines: Chrome/Perfetto trace events (FILE.json; open in ui.perfetto.dev
    /// or chrome://tracing), the live bytes event by event split into KV cache, activations,
    /// temporaries, gradients, workspace and bookkeeping, with the peak's op and layer marked;
    /// or one timeline's picture (FILE.svg or FILE.png).
    #[arg(long, value_name = "FILE")]
    pub timeline: Option<PathBuf>,
    /// Draw each case's phases (train step, inference, prefill, decode among those asked) as
    /// stacked bars split into weights, optimizer state, gradients, activations, KV cache,
    /// temporaries and other, with the `--fit-in` budget as a line (FILE.svg or FILE.png).
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
}

/// The routing a mixture of experts' budget answers assume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Routing {
    Worst,
    Balanced,
}

impl Routing {
    pub fn worst(self) -> bool {
        self == Routing::Worst
    }
}

/// ZeRO 3's all-gather prefetch (`memfit ranks --fsdp-prefetch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FsdpPrefetch {
    Backward,
    None,
}

/// A setting that is on or off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

/// ZeRO-Offload (`memfit ranks --offload`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Offload {
    None,
    Optimizer,
}

#[derive(Debug, Args)]
pub struct RanksArgs {
    #[command(flatten)]
    pub grid: GridArgs,
    /// ZeRO stage over the ranks: 0 (plain data parallel: gradients all-reduced, every rank
    /// the whole optimizer state), 1 (the state sharded), 2 (the gradients reduce-scattered
    /// too), 3 (the weights sharded too, as FSDP's FULL_SHARD: each unit — the embedding, a
    /// block, the head — gathered while it runs). Default 1, and 0 with `--tp` (which runs
    /// with 0, 1 or 2 over its data-parallel replicas) and `--ep` (which runs with 0, 1 or 2:
    /// the dense part sharded, each expert's state whole on its owner); not with `--pp`.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub zero: Option<u8>,
    /// Tensor parallelism over groups of N ranks (2 or more; the ranks mpirun starts a
    /// multiple of N: N × data-parallel replicas, tp innermost): each rank holds one
    /// Megatron-style shard of every block (LLaMA-family dense decoders in f32), every rank of
    /// a group trains on its replica's rows; `--zero 0`, 1 or 2 over the replicas.
    #[arg(long, default_value_t = 1)]
    pub tp: usize,
    /// Megatron's sequence parallelism beside `--tp` (training): the residual stream, the
    /// norms and the embedding's output hold a `1/N` run of the sequence; each sublayer's input
    /// all-gathered along it, each output reduce-scattered, the norms' gradients all-reduced
    /// over the group after the backward. The sequence must split into N equal runs.
    #[arg(long)]
    pub sp: bool,
    /// (testing) Sequence parallelism without the norms' gradient all-reduce, to show that
    /// `--check` catches it.
    #[arg(long, hide = true)]
    pub sp_skip_norm_all_reduce: bool,
    /// (testing) Tensor parallelism's `f` without its backward all-reduce, to show that
    /// `--check` catches it.
    #[arg(long, hide = true)]
    pub tp_skip_f_all_reduce: bool,
    /// (testing) ZeRO 3 without a tied table's second use (the embedding's gradient is not
    /// added into the table's shard), to show that `--check` catches it.
    #[arg(long, hide = true)]
    pub zero3_skip_tied_second_use: bool,
    /// ZeRO 3's prefetch in the backward: `backward` (FSDP's default, `BACKWARD_PRE`: the
    /// next unit's parameters gathered before this unit's gradients are computed, two units
    /// whole at once) or `none` (`backward_prefetch=None`: one unit whole at a time).
    #[arg(long, value_enum, default_value_t = FsdpPrefetch::Backward)]
    pub fsdp_prefetch: FsdpPrefetch,
    /// ZeRO 3's prefetch in the forward: `off` (FSDP1's default `forward_prefetch=False`: one
    /// unit whole at a time) or `on` (`forward_prefetch=True`: the next unit's parameters
    /// gathered before this unit's forward runs, two units whole at once).
    #[arg(long, value_enum, default_value_t = OnOff::Off)]
    pub fsdp_forward_prefetch: OnOff,
    /// ZeRO 3's `reshard_after_forward` (FSDP2's flag): `on` (the default, `FULL_SHARD`: each
    /// unit's parameters freed after its forward and gathered again for its backward) or `off`
    /// (FSDP1's `SHARD_GRAD_OP`: every unit kept whole from its forward to its backward, the
    /// backward gathering nothing but a tied table resharded with the head).
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    pub fsdp_reshard_after_forward: OnOff,
    /// ZeRO 3 as hybrid sharding (FSDP's `HYBRID_SHARD`, HSDP): shard groups of this many
    /// consecutive ranks (dividing the ranks launched), every parameter sharded within a group
    /// and replicated over the groups, each gradient reduce-scattered in its group then
    /// all-reduced over the replicas. Default: one group of every rank (`FULL_SHARD`).
    #[arg(long, value_name = "RANKS")]
    pub hsdp: Option<usize>,
    /// ZeRO-Offload (DeepSpeed's `offload_optimizer: {device: cpu}`), ZeRO 1, 2 and 3: `optimizer`
    /// keeps each rank's optimizer partition — f32 master weights, a gradient buffer, the state —
    /// in host memory and steps it there, the device holding weights and gradients only; the
    /// host layer measured (a host arena outside the counting allocator, as pinned memory is
    /// outside CUDA's pool) and predicted beside the device's. `none`: everything on the device.
    #[arg(long, value_enum, default_value_t = Offload::None)]
    pub offload: Offload,
    /// Expert parallelism inside data parallelism over every rank (N = the ranks mpirun
    /// starts, 2 or more, dividing the experts): every rank the dense part whole and its own
    /// microbatch, rank r the experts r·E/N..(r+1)·E/N of every sparse layer, the routed rows
    /// exchanged by all-to-all (a mixture of experts in f32); runs with `--zero 0`.
    #[arg(long, default_value_t = 1)]
    pub ep: usize,
    /// (testing) Expert parallelism's dispatch without its backward all-to-all (the rows'
    /// gradient not returned home), to show that `--check` catches it.
    #[arg(long, hide = true)]
    pub ep_skip_dispatch_backward: bool,
    /// (testing) Expert parallelism without dividing the experts' gradients by the ranks, to
    /// show that `--check` catches it.
    #[arg(long, hide = true)]
    pub ep_skip_expert_scaling: bool,
    /// Pipeline parallelism instead of data parallelism: a stage a rank (this many ranks
    /// launched), Megatron's 1F1B schedule over `--microbatches` microbatches of `--batch` rows.
    #[arg(long, value_name = "STAGES")]
    pub pp: Option<usize>,
    /// Microbatches a step through the pipeline (with `--pp`).
    #[arg(long, default_value_t = 4)]
    pub microbatches: usize,
    /// CPU threads of each rank.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// After the windows, also train one process on the whole global batch from the same
    /// weights and compare its gradients and weights with every rank's.
    #[arg(long)]
    pub check: bool,
    /// One JSON document instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write that document to FILE (rank 0); name it `ranks*.json` inside a result set's
    /// folder and `memfit report` reads it (claim B5).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// (testing) Serving with tensor parallelism (`--tp N --phases prefill,decode`): `g`
    /// copies the partial output instead of all-reducing it, to show that `--check` catches it.
    #[arg(long, hide = true)]
    pub tp_skip_g_all_reduce: bool,
}

#[derive(Debug, Args)]
pub struct MergeArgs {
    /// The shards' run folders (each holds results.jsonl and meta.json).
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// The merged folder (must not hold a journal).
    #[arg(long)]
    pub out: PathBuf,
    /// What to do when two folders hold different rows for one case and phase: refuse (the
    /// default), first, last (in the order given).
    #[arg(long)]
    pub on_conflict: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum ProbeCommand {
    /// One (n × n)·(n × n) product: its window's peak beyond its output (the CPU's gemm packing
    /// buffer, modelled beside it; on CUDA, cuBLAS's workspace if it came from the pool).
    #[command(
        after_help = "Examples:\n  memfit probe matmul --n 1024 --threads 2\n  memfit probe matmul --device cuda:0 --dtype bf16 --n 4096 --json"
    )]
    Matmul(ProbeArgs),
    /// Each fused op's backward alone: its peak beyond the gradients it returns, per element
    /// of its main input (the ops' temporaries, beside PyTorch's in BENCHMARKS.md § 4).
    #[command(
        after_help = "Examples:\n  memfit probe backward --threads 2\n  memfit probe backward --op silu-mul --op gelu --dtype f16 --json"
    )]
    Backward(ProbeBackwardArgs),
}

#[derive(Debug, Args)]
pub struct ProbeBackwardArgs {
    /// The ops (repeatable; default all): layer-norm, rms-norm, gelu, silu-mul, rotary,
    /// cross-entropy, attn-probs, efficient-attention (CPU only).
    #[arg(long)]
    pub op: Vec<String>,
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Element type: f32, f16, bf16 (CUDA).
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Rows of the row-wise ops and of the loss's logits.
    #[arg(long, default_value_t = 2048)]
    pub rows: usize,
    /// Width of the row-wise ops (the loss's vocabulary).
    #[arg(long, default_value_t = 1024)]
    pub width: usize,
    /// Attention heads (rotary, attn-probs, efficient-attention; one batch row).
    #[arg(long, default_value_t = 8)]
    pub heads: usize,
    /// Attention sequence length.
    #[arg(long, default_value_t = 512)]
    pub seq: usize,
    /// Attention head size (even).
    #[arg(long, default_value_t = 64)]
    pub head_dim: usize,
    /// Worker threads of the CPU backend (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// One JSON object per op instead of a line of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Element type: f32, bf16 (CUDA), f16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// The operands' size: (n × n)·(n × n).
    #[arg(long, default_value_t = 1024)]
    pub n: usize,
    /// Worker threads of the CPU backend (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// One JSON object instead of a line of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SelftestArgs {
    /// cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Run only the checks whose name contains every one of these.
    #[arg(long)]
    pub filter: Vec<String>,
    /// Worker threads of the CPU backend (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Name every check and exit.
    #[arg(long)]
    pub list: bool,
    /// After each check, its outcome as one JSON line.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ConvertArgs {
    /// A run folder holding results.jsonl and meta.json.
    pub dir: PathBuf,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Workload TOML file; without it the embedded default workload runs.
    pub workload: Option<PathBuf>,
    #[command(flatten)]
    pub grid: GridArgs,
    /// Worker threads of the CPU backend (default: the workload's, else all cores).
    #[arg(long, allow_negative_numbers = true)]
    pub threads: Option<i64>,
    /// Folder for everything the run writes (default: runs/<run id>). Must not hold a journal.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Print no table.
    #[arg(long)]
    pub quiet: bool,
    /// Cap each case's heap (e.g. 512MiB): an allocation beyond it fails and the case's
    /// process aborts, as a device of that size would run out (CPU; used by `max-batch`);
    /// the phase that was running is recorded `oom`.
    #[arg(long)]
    pub mem_budget: Option<String>,
    /// Seconds one case may run (its process is killed then; the phase running is recorded
    /// `timeout`, later ones `skipped`). Default: the workload's `case_timeout`, else 3600.
    #[arg(long, allow_negative_numbers = true)]
    pub case_timeout: Option<f64>,
    /// Seconds from now after which no case runs: a case that would likely end past it (from
    /// the finished cases' times scaled by predicted work) is not started, and a running case
    /// is killed at it. The summary lists what was not run; `--resume` runs it later.
    #[arg(long, allow_negative_numbers = true)]
    pub deadline: Option<f64>,
    /// Continue the run in `--out`: run only the cases its journal has no finished rows for
    /// (the rows of unfinished ones move to superseded.jsonl first).
    #[arg(long)]
    pub resume: bool,
    /// Run only shard I of N (0-based): a deterministic slice of the cases balanced by
    /// predicted cost, the same on every machine; `auto` takes I and N from a Slurm job
    /// array task (`SLURM_ARRAY_TASK_ID`, `SLURM_ARRAY_TASK_COUNT`).
    #[arg(long)]
    pub shard: Option<String>,
    /// Print every case with its shard (with --shard) and predicted cost, and run nothing.
    #[arg(long, alias = "dry-run")]
    pub list_cases: bool,
    /// A folder for each CPU case's measured timelines of the train step and the serving
    /// phases (`case-N-PHASE.json`, Chrome/Perfetto trace events: every change of the counting
    /// allocator's bytes in the window, split by stage and lifetime into KV cache, activations,
    /// temporaries and gradients; recorded in static arrays, so the measured peak is the same).
    /// Name it `timeline` inside a result set's folder and `memfit report` draws them.
    #[arg(long, value_name = "DIR")]
    pub timeline: Option<PathBuf>,
    /// (internal) Run only this case, streaming events on stdout, for a parent `memfit run`.
    #[arg(long, hide = true)]
    pub child_case: Option<usize>,
}

pub use crate::workload::GridArgs;

impl RunArgs {
    /// The workload keys given as flags, to lay over every grid.
    pub fn grid_flags(&self) -> GridSpec {
        self.grid.grid_flags()
    }

    /// True when any workload key was given as a flag.
    pub fn has_grid_flags(&self) -> bool {
        self.grid.has_grid_flags()
    }
}
