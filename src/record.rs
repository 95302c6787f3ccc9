//! One measured row per case × phase, and the environment a run happened in.
//!
//! Units live in the field names (`_bytes`, `_s`). A figure that was not measured is `None`
//! (JSON `null`), never a made-up number; `status` says why a whole row has no figures.
//! Derived numbers (error percentages) are not stored: the report computes them from
//! `peak_bytes` and `predicted_peak_bytes`.

use crate::step::Phase;
use serde::{Deserialize, Serialize};

/// Outcome of one case × phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// The phase ran and every meter was read.
    Ok,
    /// The device (or the CPU budget) ran out of memory.
    Oom,
    /// The phase failed; `error` holds the message.
    Error,
    /// The case's process was killed at its time limit (`--case-timeout`, or the run's
    /// `--deadline`) while this phase (or the warm-up before it) was running.
    Timeout,
    /// The case's process died while this phase (or the warm-up before it) was running: a
    /// signal, a panic, an abort, or a kill by a second SIGINT/SIGTERM to `memfit run`.
    Crashed,
    /// The phase never started: an earlier phase of the case failed.
    Skipped,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Oom => "oom",
            Status::Error => "error",
            Status::Timeout => "timeout",
            Status::Crashed => "crashed",
            Status::Skipped => "skipped",
        }
    }

    /// Every status, in the order above.
    pub const ALL: [Status; 6] = [
        Status::Ok,
        Status::Oom,
        Status::Error,
        Status::Timeout,
        Status::Crashed,
        Status::Skipped,
    ];

    /// Final statuses are kept by `memfit run --resume`; a case with a `timeout` or `crashed`
    /// row (or with a phase missing) is run again and its old rows are set aside.
    pub fn is_final(self) -> bool {
        !matches!(self, Status::Timeout | Status::Crashed)
    }
}

/// An error that knows its row status (a phase skipped after an earlier failure, a case's
/// process that crashed or ran out of time); other errors get theirs from [`status_of`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct StatusError {
    pub status: Status,
    pub message: String,
}

impl StatusError {
    /// A phase that never started because phase `failed` did, with `msg`.
    pub fn skipped_after(failed: &str, msg: &str) -> anyhow::Error {
        Self::error(
            Status::Skipped,
            format!("not run: phase {failed} failed: {msg}"),
        )
    }

    /// The error, as an `anyhow::Error` a phase result can carry.
    pub fn error(status: Status, message: impl Into<String>) -> anyhow::Error {
        anyhow::Error::new(StatusError {
            status,
            message: message.into(),
        })
    }
}

/// The status and stored message of a failed phase's error.
pub fn failure_of(e: &anyhow::Error) -> (Status, String) {
    match e.downcast_ref::<StatusError>() {
        Some(se) => (se.status, se.message.clone()),
        None => {
            let msg = error_text(e);
            (status_of(&msg), msg)
        }
    }
}

/// One row of the journal. Field order is the CSV column order. Fields added after the first
/// schema read as empty / 0 / missing from older journals (`#[serde(default)]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Row {
    /// Identifier of the `memfit run` that produced the row (UTC start time, `YYYYMMDDTHHMMSSZ`).
    pub run_id: String,
    /// Index of the case in the expanded workload (0-based).
    pub case: u64,
    /// Model family: `gpt`, `vit` or `llama`.
    pub model: String,
    /// Preset name the case started from, or `custom`.
    pub preset: String,
    pub batch: u64,
    pub seq: u64,
    /// Length of the position-embedding table (≥ `seq`).
    pub max_seq: u64,
    pub hidden: u64,
    pub heads: u64,
    pub layers: u64,
    pub vocab: u64,
    /// ViT: side of the input image in pixels (0 for a GPT case; then `seq` is the patches +
    /// 1 and `vocab` the classes).
    #[serde(default)]
    pub image_px: u64,
    /// ViT: side of a patch in pixels (0 for a GPT case).
    #[serde(default)]
    pub patch_px: u64,
    /// ViT: colour channels of the image (0 for a GPT case).
    #[serde(default)]
    pub channels: u64,
    /// K/V heads of attention (grouped-query attention in the LLaMA family; `heads` for GPT
    /// and ViT). 0 in rows written before the column existed.
    #[serde(default)]
    pub kv_heads: u64,
    /// Width of one attention head (`hidden / heads` for GPT and ViT; 0 in older rows).
    #[serde(default)]
    pub head_dim: u64,
    /// Width of the MLP: LLaMA's SwiGLU intermediate size, `4·hidden` for GPT and ViT (0 in
    /// older rows).
    #[serde(default)]
    pub intermediate: u64,
    /// Whether the LM head is the token embedding: `on` or `off` (empty in older rows).
    #[serde(default)]
    pub tied: String,
    /// Which projections carry biases: a comma list of `qkv`, `o`, `mlp`, or `none` (GPT and
    /// ViT: `qkv,o,mlp`; empty in older rows).
    #[serde(default)]
    pub biases: String,
    /// Element type of weights and activations: `f32`.
    pub dtype: String,
    /// The `--hf-config` checkpoint's element type (`torch_dtype` / `dtype`) when it gives one,
    /// else empty: where it differs from `dtype`, this case measured `dtype` instead (the CPU
    /// has no bf16 matmul) or `--dtype` asked for another.
    #[serde(default)]
    pub checkpoint_dtype: String,
    /// `cpu` or `cuda:N`.
    pub device: String,
    /// `sgd`, `sgd-momentum`, `adam`, `adamw` or `adamw-8bit`.
    pub optimizer: String,
    /// Elements per quantization block of `adamw-8bit` (recorded for every optimizer).
    #[serde(default)]
    pub optimizer_block: u64,
    /// Blocks per gradient-checkpoint segment; 0 = no checkpointing.
    #[serde(default)]
    pub checkpoint: u64,
    /// `by-block` (each block's graph freed as the backward passes it; checkpointed cases
    /// too, by segment) or `whole` (candle's `loss.backward()` over the whole graph); rows
    /// written before the column existed ran the whole backward.
    #[serde(default = "whole")]
    pub backward: String,
    /// Tokens generated by the `decode` phase (0 when the case does not decode).
    #[serde(default)]
    pub decode_tokens: u64,
    /// `on`: decoding uses a key/value cache; `off`: it recomputes the prefix per token.
    #[serde(default)]
    pub kv_cache: String,
    /// Weights the inference phases serve with: `model`, `f16`, `q8_0`, `q4_0`.
    #[serde(default)]
    pub weights: String,
    /// How the `load` phase reads the weights file: `read` or `mmap`.
    #[serde(default)]
    pub load: String,
    /// `standard`, `efficient` or `tiled` attention; rows written before the column existed
    /// used the standard one.
    #[serde(default = "standard")]
    pub attention: String,
    /// `fused` (memfit's kernels with a backward) or `composed` (candle's stock ops); rows
    /// written before the column existed were composed.
    #[serde(default = "composed")]
    pub kernels: String,
    /// `on` when the CPU threads flushed subnormal floats to zero; `off` (and in rows written
    /// before the column existed).
    #[serde(default = "off")]
    pub flush_denormals: String,
    /// `on` when the meters trimmed the heap around the window (and in rows written before the
    /// column existed); `off` (`--trim off`): `rss_peak_bytes` and the `trim_*` figures are
    /// missing.
    #[serde(default = "on")]
    pub trim: String,
    /// LoRA rank; 0 = no adapters (every weight trains).
    #[serde(default)]
    pub lora_rank: u64,
    /// Projections with adapters, comma-separated (empty when `lora_rank` is 0).
    #[serde(default)]
    pub lora_targets: String,
    /// How the base projections are frozen under LoRA: `detach`, `op`, `q4_0`, `q8_0`
    /// (empty when `lora_rank` is 0).
    #[serde(default)]
    pub lora_base: String,
    /// `pure` (everything in `dtype`) or `mixed` (f32 master weights, gradients, optimizer
    /// state; `dtype` working copies and activations).
    #[serde(default)]
    pub precision: String,
    /// The measured phase (`init`, `forward`, …, `dataload`; written as its name).
    pub phase: Phase,
    pub status: Status,
    /// Error message when `status` is not `ok`.
    pub error: Option<String>,
    /// Exact parameter count of the model.
    pub params: u64,
    /// Peak device bytes in the phase's window above the bytes allocated when it began.
    pub peak_bytes: Option<u64>,
    /// Device bytes still allocated when the window closed, minus those at its start (may be < 0).
    pub retained_bytes: Option<i64>,
    /// Number of allocations made inside the window (CPU allocator only).
    pub alloc_count: Option<u64>,
    /// The formula module's prediction of `peak_bytes`.
    pub predicted_peak_bytes: Option<u64>,
    /// The formula module's prediction of `retained_bytes`.
    pub predicted_retained_bytes: Option<i64>,
    /// User CPU seconds of the whole process in the window (all threads).
    pub cpu_user_s: Option<f64>,
    /// System CPU seconds of the whole process in the window.
    pub cpu_sys_s: Option<f64>,
    /// Wall-clock seconds of the window.
    pub wall_s: Option<f64>,
    /// Host resident-set high-water mark during the window (VmHWM after a reset), whole process.
    pub rss_peak_bytes: Option<u64>,
    /// Inference rows served with other weights: relative L2 error of the logits against the
    /// model's own weights (random weights compound it; recorded, not hidden).
    #[serde(default)]
    pub logits_rel_error: Option<f64>,
    /// The meter `peak_bytes` and `retained_bytes` come from: `cpu-allocator` (the counting
    /// allocator, every tensor byte on the CPU), `cuda-pool` (the CUDA memory pool's exact
    /// tensor high-water mark), `cuda-meminfo-sampled` (a device without memory pools) or
    /// `none` (no figure).
    #[serde(default)]
    pub peak_meter: String,
    /// CUDA: the memory pool's reservation high-water mark (what it took from the device).
    #[serde(default)]
    pub reserved_peak_bytes: Option<u64>,
    /// CUDA: device memory in use by all processes (`cuMemGetInfo`) after the window minus before.
    #[serde(default)]
    pub device_used_bytes: Option<i64>,
    /// CUDA: peak of this process's device memory in NVML samples (context, libraries, pool).
    #[serde(default)]
    pub nvml_process_peak_bytes: Option<u64>,
    /// CUDA: mean GPU utilisation over the NVML samples, in percent.
    #[serde(default)]
    pub gpu_util_mean_pct: Option<f64>,
    /// CUDA: peak board power over the NVML samples, in watts.
    #[serde(default)]
    pub gpu_power_peak_w: Option<f64>,
    /// CUDA: number of NVML samples taken in the window.
    #[serde(default)]
    pub nvml_samples_count: Option<u64>,
    /// `dataload` rows (empty / missing elsewhere): the dataset folder.
    #[serde(default)]
    pub dataset: String,
    /// `dataload`: pipeline workers (0 = the main thread).
    #[serde(default)]
    pub workers: Option<u64>,
    /// `dataload`: `thread`, `process`, or `main` when `workers` is 0.
    #[serde(default)]
    pub worker_kind: String,
    /// `dataload`: batches requested ahead per worker (0 when `workers` is 0).
    #[serde(default)]
    pub prefetch: Option<u64>,
    /// `dataload`: where the encoded images are read from: `ram`, `mmap`, `stream`.
    #[serde(default)]
    pub storage: String,
    /// `dataload`: `on` (workers live through every epoch) or `off` (started per epoch).
    #[serde(default)]
    pub persistent: String,
    /// `dataload`: passes over the dataset in the window.
    #[serde(default)]
    pub epochs: Option<u64>,
    /// `dataload`: side of the square crop, in pixels.
    #[serde(default)]
    pub crop_px: Option<u64>,
    /// `dataload`: images delivered as batch tensors in the window.
    #[serde(default)]
    pub images: Option<u64>,
    /// `dataload`: `images / wall_s`.
    #[serde(default)]
    pub images_per_s: Option<f64>,
    /// `dataload`: seconds from each epoch's start to its first batch, summed over epochs.
    #[serde(default)]
    pub startup_s: Option<f64>,
    /// `dataload`: most processes in the tree (memfit + worker processes) in one sample.
    #[serde(default)]
    pub tree_processes_count: Option<u64>,
    /// `dataload`: peak of the process tree's summed RSS (shared pages once per process).
    #[serde(default)]
    pub tree_rss_peak_bytes: Option<u64>,
    /// `dataload`: mean of the tree's summed RSS over the window's second half.
    #[serde(default)]
    pub tree_rss_steady_bytes: Option<u64>,
    /// `dataload`: peak of the process tree's summed PSS (shared pages counted once).
    #[serde(default)]
    pub pss_peak_bytes: Option<u64>,
    /// `dataload`: mean of the tree's summed PSS over the window's second half.
    #[serde(default)]
    pub pss_steady_bytes: Option<u64>,
    /// `dataload` on CUDA: host→device copy bandwidth of one batch from pinned memory.
    #[serde(default)]
    pub h2d_pinned_bytes_per_s: Option<f64>,
    /// `dataload` on CUDA: the same copy from pageable (ordinary heap) memory.
    #[serde(default)]
    pub h2d_pageable_bytes_per_s: Option<f64>,
    /// The allocator layer the `trim_*` figures read: `rss` (CPU: the process's resident set
    /// around `malloc_trim(0)`), `cuda-pool-reserved` (CUDA: the pool's reservation around
    /// `cuMemPoolTrimTo(pool, 0)`); empty when not measured (a failed phase, a CUDA device
    /// without memory pools, rows written before these columns).
    #[serde(default)]
    pub trim_layer: String,
    /// After the window (its temporaries freed, what it keeps alive): what `trim_layer` held
    /// before the trim.
    #[serde(default)]
    pub trim_before_bytes: Option<u64>,
    /// The same right after the trim; `before − after` is what the trim gave back.
    #[serde(default)]
    pub trim_after_bytes: Option<u64>,
    /// Bytes live in the tensor allocator at that moment (CPU: the counting allocator; CUDA:
    /// the pool's `USED_MEM_CURRENT`): what no trim can give back.
    #[serde(default)]
    pub trim_live_bytes: Option<u64>,
    /// A mixture of experts: the tokens each expert received in the phase's forward, per layer
    /// (`n₀,n₁,…;…`, layers in order; empty for a dense model); of several forwards (decode),
    /// the one whose largest expert got the most tokens. The replay predicts from it.
    #[serde(default)]
    pub moe_routing: String,
    /// The most and fewest tokens any expert of any layer received (a mixture of experts).
    #[serde(default)]
    pub moe_tokens_max: Option<u64>,
    #[serde(default)]
    pub moe_tokens_min: Option<u64>,
    /// Parameters a token uses (a mixture of experts: the router, shared experts and `k` of
    /// the `E` routed experts per sparse layer); `params` for a dense model.
    #[serde(default)]
    pub active_params: Option<u64>,
    /// A decoder: the bytes one cached token of one sequence costs in the KV cache, as the
    /// architecture defines it (`2·L·G·D·e`; MLA's latent `L·(kv_lora_rank +
    /// qk_rope_head_dim)·e`), e the serving activations' bytes.
    #[serde(default)]
    pub kv_bytes_per_token: Option<u64>,
    /// Sliding-window attention: keys per query (the cache keeps that many tokens).
    #[serde(default)]
    pub sliding_window: Option<u64>,
    /// CPU: the bytes the counting allocator held when the window opened — everything the case
    /// process keeps outside the phase (weights, optimizer state, the batch, gemm's packing
    /// buffers kept from the warm-up, thread pools). `heap_start_bytes + peak_bytes` is the
    /// process heap's peak, the figure `--mem-budget` caps. Missing on CUDA and in older rows.
    #[serde(default)]
    pub heap_start_bytes: Option<u64>,
    /// Worker threads of the CPU backend (rayon pool) for this run.
    pub threads: u64,
}

impl Row {
    /// K/V heads of attention; rows written before the column existed read as GPT/ViT rows
    /// (`heads`), an older LLaMA row as unknown.
    pub fn kv_heads_or_heads(&self) -> Option<u64> {
        match (self.kv_heads, self.model.as_str()) {
            (0, "llama") => None,
            (0, _) => Some(self.heads),
            (g, _) => Some(g),
        }
    }

    /// Width of one head; older rows as in [`Row::kv_heads_or_heads`] (`hidden / heads`).
    pub fn head_dim_or_default(&self) -> Option<u64> {
        match (self.head_dim, self.model.as_str()) {
            (0, "llama") => None,
            (0, _) => Some(self.hidden / self.heads.max(1)),
            (d, _) => Some(d),
        }
    }

    /// The gradients a `backward` row leaves, in bytes: what it retains, plus — where the
    /// backward used the forward's graph up as it went (by block, or checkpointed) — what that
    /// forward kept (`forward`: the same case's `forward` row). `None` without those figures.
    pub fn gradient_bytes(&self, forward: Option<&Row>) -> Option<i64> {
        let kept = self.retained_bytes?;
        if self.backward == "whole" && self.checkpoint == 0 {
            return Some(kept);
        }
        Some(kept + forward?.retained_bytes?)
    }

    /// A GPT row (L 3, B 2, S 8, H 16, A 2, V 10, 1000 parameters, f32 on the CPU, AdamW,
    /// phase `init`, status ok) with nothing measured: the base of the unit tests'
    /// hand-worked rows.
    #[cfg(test)]
    pub(crate) fn example() -> Row {
        serde_json::from_str(
            r#"{"run_id":"r","case":0,"model":"gpt","preset":"custom","batch":2,"seq":8,
            "max_seq":8,"hidden":16,"heads":2,"layers":3,"vocab":10,"dtype":"f32",
            "device":"cpu","optimizer":"adamw","phase":"init","status":"ok","error":null,
            "params":1000,"peak_bytes":null,"retained_bytes":null,"alloc_count":null,
            "predicted_peak_bytes":null,"predicted_retained_bytes":null,"cpu_user_s":null,
            "cpu_sys_s":null,"wall_s":null,"rss_peak_bytes":null,"threads":1}"#,
        )
        .expect("the example row parses")
    }
}

/// Where and with what a run happened; stored once per run (`meta.json`, HDF5 attributes).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunMeta {
    pub run_id: String,
    pub memfit_version: String,
    pub git_commit: String,
    pub candle_version: String,
    pub cpu_model: String,
    pub cores: u64,
    pub os: String,
    pub device_name: String,
    pub threads: u64,
    /// Workload file, or `<embedded default>` / `<flags>`.
    pub workload: String,
    /// CUDA runs: device memory the CUDA context (and candle's handles) took before any tensor.
    #[serde(default)]
    pub cuda_context_bytes: Option<u64>,
    /// CUDA runs: total memory of the device.
    #[serde(default)]
    pub device_memory_bytes: Option<u64>,
    /// CUDA runs: NVIDIA driver version (NVML).
    #[serde(default)]
    pub driver_version: Option<String>,
    /// CUDA runs: CUDA version the driver supports.
    #[serde(default)]
    pub cuda_version: Option<String>,
    /// CUDA runs on a device with memory pools: the release threshold memfit set on the
    /// default pool (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`; u64::MAX: freed blocks stay reserved
    /// between synchronisations, as PyTorch's caching allocator keeps them, so the trim figures
    /// show what the pool cached). `None`: not set (CPU, a device without pools, older runs).
    #[serde(default)]
    pub cuda_pool_release_threshold: Option<u64>,
    /// CUDA runs: the fixed cuBLAS workspace memfit allocated outside the pool
    /// ([`crate::device::CUBLAS_WORKSPACE_BYTES`]).
    #[serde(default)]
    pub cublas_workspace_bytes: Option<u64>,
    /// Where and as what part of a sweep it ran (`--shard`, Slurm); see [`ClusterMeta`].
    #[serde(default)]
    pub cluster: ClusterMeta,
}

/// A run's place in a sweep spread over machines: its host, its shard, the Slurm job it was,
/// the cases it was asked to run; for a merged folder (`memfit merge`), every shard's
/// metadata.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterMeta {
    /// The host name (`/proc/sys/kernel/hostname`).
    #[serde(default)]
    pub host: String,
    /// `I/N` when the run was one shard of N (0-based I).
    #[serde(default)]
    pub shard: Option<String>,
    /// `SLURM_JOB_ID`, `SLURM_ARRAY_JOB_ID`, `SLURM_ARRAY_TASK_ID` when Slurm ran it.
    #[serde(default)]
    pub slurm_job_id: Option<String>,
    #[serde(default)]
    pub slurm_array_job_id: Option<String>,
    #[serde(default)]
    pub slurm_array_task_id: Option<String>,
    /// Indices of the cases this run was asked to run (its shard), so a merge can tell an
    /// incomplete shard.
    #[serde(default)]
    pub planned_cases: Vec<u64>,
    /// A merged folder: the metadata of every run merged into it.
    #[serde(default)]
    pub merged_from: Vec<RunMeta>,
}

impl RunMeta {
    /// Takes what `from`'s device said about itself (name, memory, CUDA context, driver).
    pub fn adopt_device(&mut self, from: &RunMeta) {
        self.device_name = from.device_name.clone();
        self.device_memory_bytes = from.device_memory_bytes;
        self.cuda_context_bytes = from.cuda_context_bytes;
        self.driver_version = from.driver_version.clone();
        self.cuda_version = from.cuda_version.clone();
        self.cuda_pool_release_threshold = from.cuda_pool_release_threshold;
        self.cublas_workspace_bytes = from.cublas_workspace_bytes;
    }
}

impl ClusterMeta {
    /// This process's host and Slurm job (from the environment), nothing planned yet.
    pub fn here() -> Self {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Self {
            host: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_string())
                .unwrap_or_default(),
            shard: None,
            slurm_job_id: env("SLURM_JOB_ID"),
            slurm_array_job_id: env("SLURM_ARRAY_JOB_ID"),
            slurm_array_task_id: env("SLURM_ARRAY_TASK_ID"),
            planned_cases: Vec::new(),
            merged_from: Vec::new(),
        }
    }
}

/// An error chain as stored in a row: without the backtrace candle appends to its errors when
/// `RUST_BACKTRACE` is set (it would bury the message and bloat every store).
pub fn error_text(e: &anyhow::Error) -> String {
    let full = format!("{e:#}");
    let cut = full
        .find("\n   0: ")
        .or_else(|| full.find("\nstack backtrace:"))
        .unwrap_or(full.len());
    full[..cut].trim_end().to_string()
}

/// `oom` when the error chain is the device (or the CPU budget) running out of memory, else
/// `error`. Rust's allocation-failure abort reads "memory allocation of N bytes failed".
pub fn status_of(message: &str) -> Status {
    if message.contains("OUT_OF_MEMORY")
        || message.contains("out of memory")
        || (message.contains("memory allocation of") && message.contains("failed"))
    {
        Status::Oom
    } else {
        Status::Error
    }
}

/// The kernels of rows written before the `kernels` column: candle's composed ops.
fn composed() -> String {
    "composed".into()
}

fn standard() -> String {
    "standard".into()
}

/// The backward of rows written before the `backward` column.
fn whole() -> String {
    "whole".into()
}

/// The setting of rows written before the `flush_denormals` column.
fn off() -> String {
    "off".into()
}

/// The setting of rows written before the `trim` column.
fn on() -> String {
    "on".into()
}
