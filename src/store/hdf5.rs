//! HDF5 export: the rows of a run in column layout, with units, for foreign readers.
//!
//! Layout (see `docs/schema.md`):
//!
//! - `/` carries the [`RunMeta`] fields as attributes (strings as variable-length UTF-8,
//!   `cores` and `threads` as `u64`) plus `schema_version` = [`SCHEMA_VERSION`].
//! - `/rows` holds one 1-D dataset per [`Row`] field, named like the field, all of the same
//!   length (the number of rows). Each dataset has the string attributes `units` and
//!   `description`.
//! - Plain `u64` fields are `u64` datasets. `Option<u64>` fields are `i64` datasets with
//!   missing = `-1`; `Option<i64>` fields (which may legitimately be `-1`) are `i64` datasets
//!   with missing = `i64::MIN`; both carry an `i64` attribute `missing_value`. `Option<f64>`
//!   fields are `f64` datasets with missing = NaN (`missing_value` = the string `"NaN"`).
//!   Strings, `status` included, are variable-length UTF-8; `Option<String>` uses missing = `""`
//!   (`missing_value` = `""`).
//!
//! A value that would be read back as a different one (a `u64` above `i64::MAX` in an
//! `Option<u64>` field, `Some(i64::MIN)`, `Some(NaN)`, `Some("")`, a string containing NUL) is
//! refused by [`write()`] instead of being silently changed.

#[cfg(not(feature = "hdf5"))]
use std::path::Path;

#[cfg(not(feature = "hdf5"))]
use crate::record::{Row, RunMeta};

#[cfg(feature = "hdf5")]
mod io;
#[cfg(feature = "hdf5")]
pub use io::{read, write};

/// Whether this build reads and writes HDF5 files (the `hdf5` feature, on by default; the GPU
/// machine's build is made without it, see `scripts/build-cuda.sh`).
pub const AVAILABLE: bool = cfg!(feature = "hdf5");

/// The error of a build without the `hdf5` feature.
#[cfg(not(feature = "hdf5"))]
fn unavailable(path: &Path) -> anyhow::Error {
    anyhow::anyhow!(
        "{}: this memfit was built without HDF5 (the `hdf5` feature); the journal \
         results.jsonl holds every row: `memfit convert DIR` on a default build writes results.h5",
        path.display()
    )
}

/// Writes `meta` and `rows` to the HDF5 file `path` — not in this build (no `hdf5` feature).
#[cfg(not(feature = "hdf5"))]
pub fn write(path: &Path, _meta: &RunMeta, _rows: &[Row]) -> anyhow::Result<()> {
    Err(unavailable(path))
}

/// Reads an HDF5 file — not in this build (no `hdf5` feature).
#[cfg(not(feature = "hdf5"))]
pub fn read(path: &Path) -> anyhow::Result<(RunMeta, Vec<Row>)> {
    Err(unavailable(path))
}

/// Version of the layout described in this module; stored as the root attribute
/// `schema_version`.
pub const SCHEMA_VERSION: u64 = 1;

/// Name of the group holding the row datasets.
pub const ROWS_GROUP: &str = "rows";

/// Missing marker of `Option<u64>` columns (stored as `i64`).
pub const MISSING_U64: i64 = -1;

/// Missing marker of `Option<i64>` columns. `-1` cannot be used there: those fields (byte
/// differences) may be negative.
pub const MISSING_I64: i64 = i64::MIN;

/// The unit of a [`Row`] field: one explicit entry per column (a test checks every column
/// has one, so a new field cannot inherit a wrong unit from its name's ending); `""` for
/// strings and dimensionless numbers (ratios, the status). `None` for a name that is not a
/// field of `Row`.
pub fn unit(field: &str) -> Option<&'static str> {
    Some(match field {
        "run_id" | "model" | "preset" | "dtype" | "checkpoint_dtype" | "device" | "optimizer"
        | "kv_cache" | "weights" | "load" | "attention" | "kernels" | "flush_denormals"
        | "trim" | "backward" | "lora_targets" | "lora_base" | "precision" | "phase" | "status"
        | "error" | "peak_meter" | "dataset" | "worker_kind" | "storage" | "persistent"
        | "tied" | "biases" | "trim_layer" | "moe_routing" => "",
        "moe_tokens_max" | "moe_tokens_min" | "sliding_window" => "tokens",
        "active_params" => "parameters",
        "kv_bytes_per_token" => "bytes",
        // A relative L2 error: a ratio.
        "logits_rel_error" => "",
        "case" => "index",
        "batch" => "sequences",
        "seq" | "max_seq" | "decode_tokens" => "tokens",
        "vocab" => "tokens",
        "hidden" => "features",
        "heads" => "heads",
        "layers" => "layers",
        "image_px" | "patch_px" | "crop_px" => "pixels",
        "channels" => "channels",
        "kv_heads" => "heads",
        "head_dim" | "intermediate" => "features",
        "optimizer_block" => "elements",
        "checkpoint" => "blocks",
        "lora_rank" => "rank",
        "params" => "parameters",
        "peak_bytes"
        | "retained_bytes"
        | "predicted_peak_bytes"
        | "predicted_retained_bytes"
        | "rss_peak_bytes"
        | "reserved_peak_bytes"
        | "device_used_bytes"
        | "nvml_process_peak_bytes"
        | "tree_rss_peak_bytes"
        | "tree_rss_steady_bytes"
        | "pss_peak_bytes"
        | "pss_steady_bytes"
        | "trim_before_bytes"
        | "trim_after_bytes"
        | "trim_live_bytes"
        | "heap_start_bytes" => "bytes",
        "alloc_count" | "nvml_samples_count" => "count",
        "tree_processes_count" => "processes",
        "cpu_user_s" | "cpu_sys_s" | "wall_s" | "startup_s" => "s",
        "gpu_util_mean_pct" => "percent",
        "gpu_power_peak_w" => "W",
        "workers" => "workers",
        "prefetch" => "batches",
        "epochs" => "epochs",
        "images" => "images",
        "images_per_s" => "images/s",
        "h2d_pinned_bytes_per_s" | "h2d_pageable_bytes_per_s" => "bytes/s",
        "threads" => "threads",
        _ => return None,
    })
}

/// The unit written as a dataset's `units` attribute (see [`unit`]); `""` for a name that is
/// not a field.
pub fn units_of(field: &str) -> &'static str {
    unit(field).unwrap_or("")
}

/// A one-sentence description of a [`Row`] field, stored as the dataset's `description`.
///
/// Returns `None` for a name that is not a field of `Row`.
pub fn description_of(field: &str) -> Option<&'static str> {
    Some(match field {
        "run_id" => "Identifier of the memfit run that produced the row (UTC start time).",
        "case" => "Index of the case in the expanded workload (0-based).",
        "model" => "Model family.",
        "preset" => "Preset name the case started from, or custom.",
        "batch" => "Sequences per batch.",
        "seq" => "Tokens per sequence.",
        "max_seq" => "Length of the position-embedding table (at least seq).",
        "hidden" => "Width of the hidden state.",
        "heads" => "Attention heads per layer.",
        "layers" => "Number of transformer blocks.",
        "vocab" => "Vocabulary size (ViT: classes).",
        "image_px" => "ViT: side of the input image in pixels (0 for GPT).",
        "patch_px" => "ViT: side of a patch in pixels (0 for GPT).",
        "channels" => "ViT: colour channels of the image (0 for GPT).",
        "kv_heads" => "K/V heads of attention (grouped-query attention; heads for GPT and ViT).",
        "head_dim" => "Width of one attention head (hidden / heads for GPT and ViT).",
        "intermediate" => "Width of the MLP (LLaMA: SwiGLU intermediate size; GPT, ViT: 4 hidden).",
        "tied" => "on when the LM head is the token embedding, else off.",
        "biases" => "Projections with biases: comma list of qkv, o, mlp, or none.",
        "dtype" => "Element type of weights and activations.",
        "checkpoint_dtype" => {
            "The --hf-config checkpoint's element type (torch_dtype / dtype); empty when none."
        }
        "device" => "Device the case ran on: cpu or cuda:N.",
        "optimizer" => "Optimizer: sgd, sgd-momentum, adam, adamw or adamw-8bit.",
        "checkpoint" => "Blocks per gradient-checkpoint segment; 0 = no checkpointing.",
        "optimizer_block" => "Elements per quantization block of adamw-8bit.",
        "decode_tokens" => {
            "Tokens generated by the decode phase (0 when the case does not decode)."
        }
        "weights" => "Weights the inference phases serve with: model, f16, q8_0 or q4_0.",
        "logits_rel_error" => "Relative L2 error of the logits against the model's own weights.",
        "load" => "How the load phase reads the safetensors file: read or mmap.",
        "kv_cache" => {
            "on: decoding uses a key/value cache; off: it recomputes the prefix per token."
        }
        "attention" => "Attention: standard (scores materialised) or efficient (online softmax).",
        "kernels" => {
            "Norms, attention softmax, activations, loss: fused (one op each) or composed."
        }
        "backward" => {
            "by-block: each block's graph freed as the backward passes it (checkpointed cases: by segment); whole: candle's loss.backward() over the whole graph."
        }
        "flush_denormals" => "on: the CPU threads flushed subnormal floats to zero (FTZ/DAZ).",
        "trim" => {
            "on: the heap was trimmed and the RSS high-water mark reset before the window, and trimmed after it; off: rss_peak_bytes and trim_* are missing."
        }
        "lora_rank" => "LoRA rank; 0 = no adapters (every weight trains).",
        "lora_targets" => "Projections with LoRA adapters, comma-separated.",
        "lora_base" => "How LoRA freezes the base projections: detach, op, q4_0 or q8_0.",
        "precision" => {
            "pure (everything in dtype) or mixed (f32 master weights, gradients, optimizer state)."
        }
        "phase" => {
            "Measured phase: init, forward, backward, optimizer, train-step, inference, prefill, decode, load or dataload."
        }
        "status" => "Outcome of the phase: ok, oom, error or timeout.",
        "error" => "Error message when status is not ok.",
        "params" => "Exact parameter count of the model.",
        "peak_bytes" => {
            "Peak device bytes in the phase's window above the bytes allocated when it began."
        }
        "retained_bytes" => {
            "Device bytes still allocated when the window closed minus those at its start."
        }
        "alloc_count" => "Number of allocations made inside the window (CPU allocator only).",
        "predicted_peak_bytes" => "The formula module's prediction of peak_bytes.",
        "predicted_retained_bytes" => "The formula module's prediction of retained_bytes.",
        "cpu_user_s" => "User CPU seconds of the whole process in the window (all threads).",
        "cpu_sys_s" => "System CPU seconds of the whole process in the window.",
        "wall_s" => "Wall-clock seconds of the window.",
        "rss_peak_bytes" => "Host resident-set high-water mark during the window, whole process.",
        "threads" => "Worker threads of the CPU backend for this run.",
        "peak_meter" => {
            "Meter that peak_bytes and retained_bytes come from: cpu-allocator, cuda-pool, cuda-meminfo-sampled, or none."
        }
        "reserved_peak_bytes" => {
            "CUDA: the memory pool's reservation high-water mark in the window."
        }
        "device_used_bytes" => {
            "CUDA: device memory in use (cuMemGetInfo) after the window minus before."
        }
        "nvml_process_peak_bytes" => {
            "CUDA: peak device memory of this process in the NVML samples."
        }
        "gpu_util_mean_pct" => "CUDA: mean GPU utilisation over the NVML samples.",
        "gpu_power_peak_w" => "CUDA: peak board power over the NVML samples.",
        "nvml_samples_count" => "CUDA: number of NVML samples taken in the window.",
        "dataset" => "dataload: the dataset folder.",
        "workers" => "dataload: pipeline workers (0 = the main thread).",
        "worker_kind" => "dataload: thread, process, or main when workers is 0.",
        "prefetch" => "dataload: batches requested ahead per worker.",
        "storage" => "dataload: where images are read from: ram, mmap or stream.",
        "persistent" => "dataload: on (workers live through every epoch) or off.",
        "epochs" => "dataload: passes over the dataset in the window.",
        "crop_px" => "dataload: side of the square crop in pixels.",
        "images" => "dataload: images delivered as batch tensors in the window.",
        "images_per_s" => "dataload: images / wall_s.",
        "startup_s" => "dataload: seconds from each epoch's start to its first batch, summed.",
        "tree_processes_count" => "dataload: most processes in the tree in one sample.",
        "tree_rss_peak_bytes" => "dataload: peak of the process tree's summed RSS.",
        "tree_rss_steady_bytes" => "dataload: mean tree RSS over the window's second half.",
        "pss_peak_bytes" => "dataload: peak of the process tree's summed PSS.",
        "pss_steady_bytes" => "dataload: mean tree PSS over the window's second half.",
        "h2d_pinned_bytes_per_s" => "dataload on CUDA: host-to-device copy rate, pinned buffer.",
        "h2d_pageable_bytes_per_s" => {
            "dataload on CUDA: host-to-device copy rate, pageable buffer."
        }
        "trim_layer" => {
            "Layer of the trim figures: rss (CPU, malloc_trim) or cuda-pool-reserved (cuMemPoolTrimTo)."
        }
        "trim_before_bytes" => "After the window: what trim_layer held before the trim.",
        "trim_after_bytes" => "After the window: what trim_layer held right after the trim.",
        "trim_live_bytes" => {
            "After the window: bytes live in the tensor allocator (CPU counting allocator, CUDA pool used)."
        }
        "moe_routing" => {
            "Mixture of experts: tokens per expert in the phase's forward, per layer (n0,n1,...;...); of several forwards (decode), the one whose largest expert got the most tokens."
        }
        "moe_tokens_max" => "Mixture of experts: the most tokens any expert of any layer received.",
        "moe_tokens_min" => {
            "Mixture of experts: the fewest tokens any expert of any layer received."
        }
        "active_params" => {
            "Parameters a token uses (a mixture of experts: router, shared and k routed experts)."
        }
        "kv_bytes_per_token" => {
            "Decoders: KV-cache bytes of one cached token of one sequence (2LGDe; MLA: L(kv_lora_rank+rope)e)."
        }
        "sliding_window" => "Sliding-window attention: keys per query; the cache keeps that many.",
        "heap_start_bytes" => {
            "CPU: bytes the counting allocator held when the window opened (the process's heap outside the phase); + peak_bytes = the heap's peak."
        }
        _ => return None,
    })
}
