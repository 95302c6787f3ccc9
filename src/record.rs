//! One measured row per case × phase, and the environment a run happened in.
//!
//! Units live in the field names (`_bytes`, `_s`). A figure that was not measured is `None`
//! (JSON `null`), never a made-up number; `status` says why a whole row has no figures.
//! Derived numbers (error percentages) are not stored: the report computes them from
//! `peak_bytes` and `predicted_peak_bytes`.

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
    /// The phase ran past its time limit.
    Timeout,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Oom => "oom",
            Status::Error => "error",
            Status::Timeout => "timeout",
        }
    }
}

/// One row of the journal. Field order is the CSV column order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Row {
    /// Identifier of the `memfit run` that produced the row (UTC start time, `YYYYMMDDTHHMMSSZ`).
    pub run_id: String,
    /// Index of the case in the expanded workload (0-based).
    pub case: u64,
    /// Model family: `gpt`.
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
    /// Element type of weights and activations: `f32`.
    pub dtype: String,
    /// `cpu` or `cuda:N`.
    pub device: String,
    /// `sgd`, `sgd-momentum`, `adam`, `adamw` or `adamw-8bit`.
    pub optimizer: String,
    /// Elements per quantization block of `adamw-8bit` (recorded for every optimizer).
    pub optimizer_block: u64,
    /// Blocks per gradient-checkpoint segment; 0 = no checkpointing.
    pub checkpoint: u64,
    /// `standard` or `efficient` attention.
    pub attention: String,
    /// LoRA rank; 0 = no adapters (every weight trains).
    pub lora_rank: u64,
    /// Projections with adapters, comma-separated (empty when `lora_rank` is 0).
    pub lora_targets: String,
    /// How the base projections are frozen under LoRA: `detach`, `op`, `q4_0`, `q8_0`
    /// (empty when `lora_rank` is 0).
    pub lora_base: String,
    /// `pure` (everything in `dtype`) or `mixed` (f32 master weights, gradients, optimizer
    /// state; `dtype` working copies and activations).
    pub precision: String,
    /// `init`, `forward`, `backward`, `optimizer`, `train-step`, `inference`.
    pub phase: String,
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
    /// The meter `peak_bytes` and `retained_bytes` come from: `cpu-allocator` (the counting
    /// allocator, every tensor byte on the CPU) or `cuda-pool` (the CUDA memory pool's exact
    /// tensor high-water mark).
    pub peak_meter: String,
    /// CUDA: the memory pool's reservation high-water mark (what it took from the device).
    pub reserved_peak_bytes: Option<u64>,
    /// CUDA: device memory in use by all processes (`cuMemGetInfo`) after the window minus before.
    pub device_used_bytes: Option<i64>,
    /// CUDA: peak of this process's device memory in NVML samples (context, libraries, pool).
    pub nvml_process_peak_bytes: Option<u64>,
    /// CUDA: mean GPU utilisation over the NVML samples, in percent.
    pub gpu_util_mean_pct: Option<f64>,
    /// CUDA: peak board power over the NVML samples, in watts.
    pub gpu_power_peak_w: Option<f64>,
    /// CUDA: number of NVML samples taken in the window.
    pub nvml_samples_count: Option<u64>,
    /// Worker threads of the CPU backend (rayon pool) for this run.
    pub threads: u64,
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
}
