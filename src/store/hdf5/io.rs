//! The HDF5 file itself (the layout is described in the parent module), built only with the
//! `hdf5` feature (the default): the GPU machine's build leaves it out, writes the JSONL journal
//! and CSV, and `memfit convert` rebuilds the HDF5 file back here.

use std::path::Path;
use std::str::FromStr;

use ::hdf5::types::{TypeDescriptor, VarLenUnicode};
use ::hdf5::{Attribute, Dataset, File, Group, H5Type, Location};
use anyhow::{Context, bail};
use serde::Deserialize;
use serde::de::{self, value::StrDeserializer};

use super::super::replace_atomically;
#[allow(unused_imports)]
use super::{MISSING_I64, MISSING_U64, ROWS_GROUP, SCHEMA_VERSION, description_of, unit, units_of};
use crate::record::{Row, RunMeta, Status};
use crate::step::Phase;

/// Writes `meta` and `rows` to the HDF5 file `path`, replacing any file there.
///
/// The file is built under a temporary name in the same directory, closed, synced and then
/// renamed into place, so an interrupted write never leaves a partial file under `path`.
pub fn write(path: &Path, meta: &RunMeta, rows: &[Row]) -> anyhow::Result<()> {
    replace_atomically(path, |tmp| write_file(tmp, meta, rows))
        .with_context(|| format!("writing HDF5 file {}", path.display()))
}

/// Reads the run metadata and the rows back from an HDF5 file written by [`write()`].
///
/// Missing markers become `None` again. Errors name the file and, where one is involved, the
/// dataset or attribute.
pub fn read(path: &Path) -> anyhow::Result<(RunMeta, Vec<Row>)> {
    read_file(path).with_context(|| format!("reading HDF5 file {}", path.display()))
}

/// Options for opening or creating a file without HDF5's `flock` file locking.
///
/// The HDF5 C library opens files without `O_CLOEXEC`, so a child process spawned by any thread
/// while a file is open inherits the descriptor and, with it, the lock, for as long as the child
/// lives. A later open of the same file in this process then fails with `EWOULDBLOCK`. memfit
/// needs no locks: [`write()`] builds a private temporary file and renames it into place, and
/// [`read()`] only ever sees complete files.
fn unlocked() -> ::hdf5::FileBuilder {
    let mut builder = File::with_options();
    builder.with_fapl(|fapl| fapl.file_locking(false));
    builder
}

// ---------------------------------------------------------------------------------------------
// Writing

fn write_file(path: &Path, meta: &RunMeta, rows: &[Row]) -> anyhow::Result<()> {
    let file = unlocked()
        .create(path)
        .with_context(|| format!("creating {}", path.display()))?;
    {
        write_meta(&file, meta)?;
        let group = file
            .create_group(ROWS_GROUP)
            .with_context(|| format!("creating group /{ROWS_GROUP}"))?;
        let w = ColumnWriter { group: &group };

        w.string("run_id", rows, |r| Some(&r.run_id))?;
        w.plain_u64("case", rows, |r| r.case)?;
        w.string("model", rows, |r| Some(&r.model))?;
        w.string("preset", rows, |r| Some(&r.preset))?;
        w.plain_u64("batch", rows, |r| r.batch)?;
        w.plain_u64("seq", rows, |r| r.seq)?;
        w.plain_u64("max_seq", rows, |r| r.max_seq)?;
        w.plain_u64("hidden", rows, |r| r.hidden)?;
        w.plain_u64("heads", rows, |r| r.heads)?;
        w.plain_u64("layers", rows, |r| r.layers)?;
        w.plain_u64("vocab", rows, |r| r.vocab)?;
        w.plain_u64("image_px", rows, |r| r.image_px)?;
        w.plain_u64("patch_px", rows, |r| r.patch_px)?;
        w.plain_u64("channels", rows, |r| r.channels)?;
        w.plain_u64("kv_heads", rows, |r| r.kv_heads)?;
        w.plain_u64("head_dim", rows, |r| r.head_dim)?;
        w.plain_u64("intermediate", rows, |r| r.intermediate)?;
        w.string("tied", rows, |r| Some(&r.tied))?;
        w.string("biases", rows, |r| Some(&r.biases))?;
        w.string("dtype", rows, |r| Some(&r.dtype))?;
        w.string("checkpoint_dtype", rows, |r| Some(&r.checkpoint_dtype))?;
        w.string("device", rows, |r| Some(&r.device))?;
        w.string("optimizer", rows, |r| Some(&r.optimizer))?;
        w.plain_u64("optimizer_block", rows, |r| r.optimizer_block)?;
        w.plain_u64("checkpoint", rows, |r| r.checkpoint)?;
        w.plain_u64("decode_tokens", rows, |r| r.decode_tokens)?;
        w.string("kv_cache", rows, |r| Some(&r.kv_cache))?;
        w.string("weights", rows, |r| Some(&r.weights))?;
        w.string("load", rows, |r| Some(&r.load))?;
        w.string("attention", rows, |r| Some(&r.attention))?;
        w.string("kernels", rows, |r| Some(&r.kernels))?;
        w.string("flush_denormals", rows, |r| Some(&r.flush_denormals))?;
        w.string("trim", rows, |r| Some(&r.trim))?;
        w.string("backward", rows, |r| Some(&r.backward))?;
        w.plain_u64("lora_rank", rows, |r| r.lora_rank)?;
        w.string("lora_targets", rows, |r| Some(&r.lora_targets))?;
        w.string("lora_base", rows, |r| Some(&r.lora_base))?;
        w.string("precision", rows, |r| Some(&r.precision))?;
        w.string("phase", rows, |r| Some(r.phase.as_str()))?;
        w.string("status", rows, |r| Some(r.status.as_str()))?;
        w.opt_string("error", rows, |r| r.error.as_deref())?;
        w.plain_u64("params", rows, |r| r.params)?;
        w.opt_u64("peak_bytes", rows, |r| r.peak_bytes)?;
        w.opt_i64("retained_bytes", rows, |r| r.retained_bytes)?;
        w.opt_u64("alloc_count", rows, |r| r.alloc_count)?;
        w.opt_u64("predicted_peak_bytes", rows, |r| r.predicted_peak_bytes)?;
        w.opt_i64("predicted_retained_bytes", rows, |r| {
            r.predicted_retained_bytes
        })?;
        w.opt_f64("cpu_user_s", rows, |r| r.cpu_user_s)?;
        w.opt_f64("cpu_sys_s", rows, |r| r.cpu_sys_s)?;
        w.opt_f64("wall_s", rows, |r| r.wall_s)?;
        w.opt_u64("rss_peak_bytes", rows, |r| r.rss_peak_bytes)?;
        w.opt_f64("logits_rel_error", rows, |r| r.logits_rel_error)?;
        w.string("peak_meter", rows, |r| Some(&r.peak_meter))?;
        w.opt_u64("reserved_peak_bytes", rows, |r| r.reserved_peak_bytes)?;
        w.opt_i64("device_used_bytes", rows, |r| r.device_used_bytes)?;
        w.opt_u64("nvml_process_peak_bytes", rows, |r| {
            r.nvml_process_peak_bytes
        })?;
        w.opt_f64("gpu_util_mean_pct", rows, |r| r.gpu_util_mean_pct)?;
        w.opt_f64("gpu_power_peak_w", rows, |r| r.gpu_power_peak_w)?;
        w.opt_u64("nvml_samples_count", rows, |r| r.nvml_samples_count)?;
        w.plain_u64("threads", rows, |r| r.threads)?;
        w.string("dataset", rows, |r| Some(&r.dataset))?;
        w.opt_u64("workers", rows, |r| r.workers)?;
        w.string("worker_kind", rows, |r| Some(&r.worker_kind))?;
        w.opt_u64("prefetch", rows, |r| r.prefetch)?;
        w.string("storage", rows, |r| Some(&r.storage))?;
        w.string("persistent", rows, |r| Some(&r.persistent))?;
        w.opt_u64("epochs", rows, |r| r.epochs)?;
        w.opt_u64("crop_px", rows, |r| r.crop_px)?;
        w.opt_u64("images", rows, |r| r.images)?;
        w.opt_f64("images_per_s", rows, |r| r.images_per_s)?;
        w.opt_f64("startup_s", rows, |r| r.startup_s)?;
        w.opt_u64("tree_processes_count", rows, |r| r.tree_processes_count)?;
        w.opt_u64("tree_rss_peak_bytes", rows, |r| r.tree_rss_peak_bytes)?;
        w.opt_u64("tree_rss_steady_bytes", rows, |r| r.tree_rss_steady_bytes)?;
        w.opt_u64("pss_peak_bytes", rows, |r| r.pss_peak_bytes)?;
        w.opt_u64("pss_steady_bytes", rows, |r| r.pss_steady_bytes)?;
        w.opt_f64("h2d_pinned_bytes_per_s", rows, |r| r.h2d_pinned_bytes_per_s)?;
        w.opt_f64("h2d_pageable_bytes_per_s", rows, |r| {
            r.h2d_pageable_bytes_per_s
        })?;
        w.string("trim_layer", rows, |r| Some(&r.trim_layer))?;
        w.opt_u64("trim_before_bytes", rows, |r| r.trim_before_bytes)?;
        w.opt_u64("trim_after_bytes", rows, |r| r.trim_after_bytes)?;
        w.opt_u64("trim_live_bytes", rows, |r| r.trim_live_bytes)?;
        w.string("moe_routing", rows, |r| Some(&r.moe_routing))?;
        w.opt_u64("moe_tokens_max", rows, |r| r.moe_tokens_max)?;
        w.opt_u64("moe_tokens_min", rows, |r| r.moe_tokens_min)?;
        w.opt_u64("active_params", rows, |r| r.active_params)?;
        w.opt_u64("kv_bytes_per_token", rows, |r| r.kv_bytes_per_token)?;
        w.opt_u64("sliding_window", rows, |r| r.sliding_window)?;
        w.opt_u64("heap_start_bytes", rows, |r| r.heap_start_bytes)?;
    }
    file.flush().context("flushing")?;
    file.close().context("closing")?;
    Ok(())
}

fn write_meta(root: &Group, meta: &RunMeta) -> anyhow::Result<()> {
    let RunMeta {
        run_id,
        memfit_version,
        git_commit,
        candle_version,
        cpu_model,
        cores,
        os,
        device_name,
        threads,
        workload,
        cuda_context_bytes,
        device_memory_bytes,
        driver_version,
        cuda_version,
        cuda_pool_release_threshold,
        cublas_workspace_bytes,
        cluster,
    } = meta;
    str_attr(root, "run_id", run_id)?;
    str_attr(root, "memfit_version", memfit_version)?;
    str_attr(root, "git_commit", git_commit)?;
    str_attr(root, "candle_version", candle_version)?;
    str_attr(root, "cpu_model", cpu_model)?;
    scalar_attr(root, "cores", cores)?;
    str_attr(root, "os", os)?;
    str_attr(root, "device_name", device_name)?;
    scalar_attr(root, "threads", threads)?;
    str_attr(root, "workload", workload)?;
    // CUDA-only attributes are written only when known.
    if let Some(v) = cuda_context_bytes {
        scalar_attr(root, "cuda_context_bytes", v)?;
    }
    if let Some(v) = device_memory_bytes {
        scalar_attr(root, "device_memory_bytes", v)?;
    }
    if let Some(v) = driver_version {
        str_attr(root, "driver_version", v)?;
    }
    if let Some(v) = cuda_version {
        str_attr(root, "cuda_version", v)?;
    }
    if let Some(v) = cuda_pool_release_threshold {
        scalar_attr(root, "cuda_pool_release_threshold", v)?;
    }
    if let Some(v) = cublas_workspace_bytes {
        scalar_attr(root, "cublas_workspace_bytes", v)?;
    }
    // Where it ran as part of a sweep (host, shard, Slurm ids; a merge's shards), as JSON.
    if *cluster != crate::record::ClusterMeta::default() {
        str_attr(root, "cluster", &serde_json::to_string(cluster)?)?;
    }
    scalar_attr(root, "schema_version", &SCHEMA_VERSION)?;
    Ok(())
}

/// Creates a scalar attribute `name` holding `value` on `loc`.
fn scalar_attr<T: H5Type>(loc: &Location, name: &str, value: &T) -> anyhow::Result<()> {
    loc.new_attr::<T>()
        .shape(())
        .create(name)
        .and_then(|a| a.write_scalar(value))
        .with_context(|| format!("writing attribute {name} on {}", loc.name()))
}

/// Creates a scalar variable-length UTF-8 attribute `name` holding `value` on `loc`.
fn str_attr(loc: &Location, name: &str, value: &str) -> anyhow::Result<()> {
    let v = VarLenUnicode::from_str(value).map_err(|e| {
        anyhow::anyhow!(
            "attribute {name} on {}: {value:?} cannot be stored: {e}",
            loc.name()
        )
    })?;
    scalar_attr(loc, name, &v)
}

/// Writes the columns of `/rows`, one dataset per field.
struct ColumnWriter<'a> {
    group: &'a Group,
}

impl ColumnWriter<'_> {
    /// Creates the 1-D dataset `name` from `values`, with `units` and `description`.
    fn dataset<T: H5Type>(&self, name: &str, values: &[T]) -> anyhow::Result<Dataset> {
        let description =
            description_of(name).with_context(|| format!("{name} is not a field of Row"))?;
        let ds = self
            .group
            .new_dataset::<T>()
            .shape(values.len())
            .create(name)
            .with_context(|| format!("creating dataset /{ROWS_GROUP}/{name}"))?;
        if !values.is_empty() {
            ds.write_raw(values)
                .with_context(|| format!("writing dataset /{ROWS_GROUP}/{name}"))?;
        }
        str_attr(&ds, "units", units_of(name))?;
        str_attr(&ds, "description", description)?;
        Ok(ds)
    }

    fn plain_u64(&self, name: &str, rows: &[Row], get: impl Fn(&Row) -> u64) -> anyhow::Result<()> {
        let values: Vec<u64> = rows.iter().map(get).collect();
        self.dataset(name, &values)?;
        Ok(())
    }

    fn opt_u64(
        &self,
        name: &str,
        rows: &[Row],
        get: impl Fn(&Row) -> Option<u64>,
    ) -> anyhow::Result<()> {
        let values = rows
            .iter()
            .enumerate()
            .map(|(i, r)| match get(r) {
                None => Ok(MISSING_U64),
                Some(v) => i64::try_from(v).map_err(|_| {
                    anyhow::anyhow!(
                        "dataset /{ROWS_GROUP}/{name}, row {i} (case {}, phase {}): \
                         {v} exceeds i64::MAX and cannot be stored",
                        r.case,
                        r.phase
                    )
                }),
            })
            .collect::<anyhow::Result<Vec<i64>>>()?;
        let ds = self.dataset(name, &values)?;
        scalar_attr(&ds, "missing_value", &MISSING_U64)
    }

    fn opt_i64(
        &self,
        name: &str,
        rows: &[Row],
        get: impl Fn(&Row) -> Option<i64>,
    ) -> anyhow::Result<()> {
        let values = rows
            .iter()
            .enumerate()
            .map(|(i, r)| match get(r) {
                None => Ok(MISSING_I64),
                Some(MISSING_I64) => Err(anyhow::anyhow!(
                    "dataset /{ROWS_GROUP}/{name}, row {i} (case {}, phase {}): \
                     {MISSING_I64} is the missing marker and cannot be stored as a value",
                    r.case,
                    r.phase
                )),
                Some(v) => Ok(v),
            })
            .collect::<anyhow::Result<Vec<i64>>>()?;
        let ds = self.dataset(name, &values)?;
        scalar_attr(&ds, "missing_value", &MISSING_I64)
    }

    fn opt_f64(
        &self,
        name: &str,
        rows: &[Row],
        get: impl Fn(&Row) -> Option<f64>,
    ) -> anyhow::Result<()> {
        let values = rows
            .iter()
            .enumerate()
            .map(|(i, r)| match get(r) {
                None => Ok(f64::NAN),
                Some(v) if v.is_nan() => Err(anyhow::anyhow!(
                    "dataset /{ROWS_GROUP}/{name}, row {i} (case {}, phase {}): \
                     NaN is the missing marker and cannot be stored as a value",
                    r.case,
                    r.phase
                )),
                Some(v) => Ok(v),
            })
            .collect::<anyhow::Result<Vec<f64>>>()?;
        let ds = self.dataset(name, &values)?;
        str_attr(&ds, "missing_value", "NaN")
    }

    fn string<'r>(
        &self,
        name: &str,
        rows: &'r [Row],
        get: impl Fn(&'r Row) -> Option<&'r str>,
    ) -> anyhow::Result<()> {
        let values = self.strings(name, rows, get)?;
        self.dataset(name, &values)?;
        Ok(())
    }

    fn opt_string<'r>(
        &self,
        name: &str,
        rows: &'r [Row],
        get: impl Fn(&'r Row) -> Option<&'r str>,
    ) -> anyhow::Result<()> {
        for (i, r) in rows.iter().enumerate() {
            if get(r) == Some("") {
                bail!(
                    "dataset /{ROWS_GROUP}/{name}, row {i} (case {}, phase {}): an empty string \
                     is the missing marker and cannot be stored as a value",
                    r.case,
                    r.phase
                );
            }
        }
        let values = self.strings(name, rows, get)?;
        let ds = self.dataset(name, &values)?;
        str_attr(&ds, "missing_value", "")
    }

    /// Converts a string column to HDF5 strings; `None` becomes `""`.
    fn strings<'r>(
        &self,
        name: &str,
        rows: &'r [Row],
        get: impl Fn(&'r Row) -> Option<&'r str>,
    ) -> anyhow::Result<Vec<VarLenUnicode>> {
        rows.iter()
            .enumerate()
            .map(|(i, r)| {
                let s = get(r).unwrap_or("");
                VarLenUnicode::from_str(s).map_err(|e| {
                    anyhow::anyhow!(
                        "dataset /{ROWS_GROUP}/{name}, row {i} (case {}, phase {}): \
                         {s:?} cannot be stored: {e}",
                        r.case,
                        r.phase
                    )
                })
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Reading

/// An attribute that is written only when known: `None` when absent.
fn read_opt<T>(
    loc: &Location,
    name: &str,
    read: impl FnOnce(&str) -> anyhow::Result<T>,
) -> anyhow::Result<Option<T>> {
    let names = loc
        .attr_names()
        .with_context(|| format!("listing attributes of {}", loc.name()))?;
    if names.iter().any(|n| n == name) {
        read(name).map(Some)
    } else {
        Ok(None)
    }
}

fn read_file(path: &Path) -> anyhow::Result<(RunMeta, Vec<Row>)> {
    let file = unlocked().open(path).context("opening")?;

    let version: u64 = read_attr(&file, "schema_version")?;
    if version != SCHEMA_VERSION {
        bail!("attribute /schema_version is {version}, this memfit reads {SCHEMA_VERSION}");
    }
    let meta = RunMeta {
        run_id: read_str_attr(&file, "run_id")?,
        memfit_version: read_str_attr(&file, "memfit_version")?,
        git_commit: read_str_attr(&file, "git_commit")?,
        candle_version: read_str_attr(&file, "candle_version")?,
        cpu_model: read_str_attr(&file, "cpu_model")?,
        cores: read_attr(&file, "cores")?,
        os: read_str_attr(&file, "os")?,
        device_name: read_str_attr(&file, "device_name")?,
        threads: read_attr(&file, "threads")?,
        workload: read_str_attr(&file, "workload")?,
        cuda_context_bytes: read_opt(&file, "cuda_context_bytes", |n| read_attr(&file, n))?,
        device_memory_bytes: read_opt(&file, "device_memory_bytes", |n| read_attr(&file, n))?,
        driver_version: read_opt(&file, "driver_version", |n| read_str_attr(&file, n))?,
        cuda_version: read_opt(&file, "cuda_version", |n| read_str_attr(&file, n))?,
        cuda_pool_release_threshold: read_opt(&file, "cuda_pool_release_threshold", |n| {
            read_attr(&file, n)
        })?,
        cublas_workspace_bytes: read_opt(&file, "cublas_workspace_bytes", |n| read_attr(&file, n))?,
        cluster: read_opt(&file, "cluster", |n| {
            let text = read_str_attr(&file, n)?;
            serde_json::from_str(&text).with_context(|| format!("attribute /{n} is not valid JSON"))
        })?
        .unwrap_or_default(),
    };

    let group = file
        .group(ROWS_GROUP)
        .with_context(|| format!("opening group /{ROWS_GROUP}"))?;
    let members = group
        .member_names()
        .with_context(|| format!("listing group /{ROWS_GROUP}"))?;
    for member in &members {
        if !crate::store::csv::columns().contains(&member.as_str()) {
            bail!("/{ROWS_GROUP}/{member} is not a field of Row");
        }
    }
    let mut r = ColumnReader {
        group: &group,
        len: None,
    };

    let run_id = r.string("run_id")?;
    let case = r.plain_u64("case")?;
    let model = r.string("model")?;
    let preset = r.string("preset")?;
    let batch = r.plain_u64("batch")?;
    let seq = r.plain_u64("seq")?;
    let max_seq = r.plain_u64("max_seq")?;
    let hidden = r.plain_u64("hidden")?;
    let heads = r.plain_u64("heads")?;
    let layers = r.plain_u64("layers")?;
    let vocab = r.plain_u64("vocab")?;
    let image_px = r.plain_u64("image_px")?;
    let patch_px = r.plain_u64("patch_px")?;
    let channels = r.plain_u64("channels")?;
    let kv_heads = r.plain_u64("kv_heads")?;
    let head_dim = r.plain_u64("head_dim")?;
    let intermediate = r.plain_u64("intermediate")?;
    let tied = r.string("tied")?;
    let biases = r.string("biases")?;
    let dtype = r.string("dtype")?;
    let device = r.string("device")?;
    let optimizer = r.string("optimizer")?;
    let optimizer_block = r.plain_u64("optimizer_block")?;
    let checkpoint = r.plain_u64("checkpoint")?;
    let decode_tokens = r.plain_u64("decode_tokens")?;
    let kv_cache = r.string("kv_cache")?;
    let weights = r.string("weights")?;
    let load = r.string("load")?;
    let attention = r.string("attention")?;
    let lora_rank = r.plain_u64("lora_rank")?;
    let lora_targets = r.string("lora_targets")?;
    let lora_base = r.string("lora_base")?;
    let precision = r.string("precision")?;
    let phase = r.phase("phase")?;
    let status = r.status("status")?;
    let error = r.opt_string("error")?;
    let params = r.plain_u64("params")?;
    let peak_bytes = r.opt_u64("peak_bytes")?;
    let retained_bytes = r.opt_i64("retained_bytes")?;
    let alloc_count = r.opt_u64("alloc_count")?;
    let predicted_peak_bytes = r.opt_u64("predicted_peak_bytes")?;
    let predicted_retained_bytes = r.opt_i64("predicted_retained_bytes")?;
    let cpu_user_s = r.opt_f64("cpu_user_s")?;
    let cpu_sys_s = r.opt_f64("cpu_sys_s")?;
    let wall_s = r.opt_f64("wall_s")?;
    let rss_peak_bytes = r.opt_u64("rss_peak_bytes")?;
    let logits_rel_error = r.opt_f64("logits_rel_error")?;
    let peak_meter = r.string("peak_meter")?;
    let reserved_peak_bytes = r.opt_u64("reserved_peak_bytes")?;
    let device_used_bytes = r.opt_i64("device_used_bytes")?;
    let nvml_process_peak_bytes = r.opt_u64("nvml_process_peak_bytes")?;
    let gpu_util_mean_pct = r.opt_f64("gpu_util_mean_pct")?;
    let gpu_power_peak_w = r.opt_f64("gpu_power_peak_w")?;
    let nvml_samples_count = r.opt_u64("nvml_samples_count")?;
    let threads = r.plain_u64("threads")?;
    let dataset = r.string("dataset")?;
    let workers = r.opt_u64("workers")?;
    let worker_kind = r.string("worker_kind")?;
    let prefetch = r.opt_u64("prefetch")?;
    let storage = r.string("storage")?;
    let persistent = r.string("persistent")?;
    let epochs = r.opt_u64("epochs")?;
    let crop_px = r.opt_u64("crop_px")?;
    let images = r.opt_u64("images")?;
    let images_per_s = r.opt_f64("images_per_s")?;
    let startup_s = r.opt_f64("startup_s")?;
    let tree_processes_count = r.opt_u64("tree_processes_count")?;
    let tree_rss_peak_bytes = r.opt_u64("tree_rss_peak_bytes")?;
    let tree_rss_steady_bytes = r.opt_u64("tree_rss_steady_bytes")?;
    let pss_peak_bytes = r.opt_u64("pss_peak_bytes")?;
    let pss_steady_bytes = r.opt_u64("pss_steady_bytes")?;
    let h2d_pinned_bytes_per_s = r.opt_f64("h2d_pinned_bytes_per_s")?;
    let h2d_pageable_bytes_per_s = r.opt_f64("h2d_pageable_bytes_per_s")?;
    // Files written before the trim columns existed read them as not measured.
    let has = |name: &str| members.iter().any(|m| m == name);
    let n = r.len.unwrap_or(0);
    // A string column an older file does not have: every row reads `missing`.
    let mut string_or = |name: &str, missing: &str| {
        if has(name) {
            r.string(name)
        } else {
            Ok(vec![missing.to_string(); n])
        }
    };
    // Files written before the kernels column held composed rows only, and no row flushed
    // denormals.
    let kernels = string_or("kernels", "composed")?;
    let flush_denormals = string_or("flush_denormals", "off")?;
    let trim = string_or("trim", "on")?;
    let backward = string_or("backward", "whole")?;
    let trim_layer = string_or("trim_layer", "")?;
    let mut moe_routing = string_or("moe_routing", "")?.into_iter();
    let mut checkpoint_dtype = string_or("checkpoint_dtype", "")?.into_iter();
    let mut trim_u64 = |name: &str| {
        if has(name) {
            r.opt_u64(name)
        } else {
            Ok(vec![None; n])
        }
    };
    let trim_before_bytes = trim_u64("trim_before_bytes")?;
    let trim_after_bytes = trim_u64("trim_after_bytes")?;
    let trim_live_bytes = trim_u64("trim_live_bytes")?;
    // Files written before the mixture-of-experts columns: dense models.
    let moe_tokens_max = trim_u64("moe_tokens_max")?;
    let moe_tokens_min = trim_u64("moe_tokens_min")?;
    // Files written before the architecture columns: none recorded.
    let active_params = trim_u64("active_params")?;
    let kv_bytes_per_token = trim_u64("kv_bytes_per_token")?;
    let sliding_window = trim_u64("sliding_window")?;
    // Files written before the column: not recorded.
    let heap_start_bytes = trim_u64("heap_start_bytes")?;

    let mut run_id = run_id.into_iter();
    let mut model = model.into_iter();
    let mut preset = preset.into_iter();
    let mut dtype = dtype.into_iter();
    let mut tied = tied.into_iter();
    let mut biases = biases.into_iter();
    let mut device = device.into_iter();
    let mut optimizer = optimizer.into_iter();
    let mut error = error.into_iter();
    let mut peak_meter = peak_meter.into_iter();
    let mut attention = attention.into_iter();
    let mut kv_cache = kv_cache.into_iter();
    let mut weights = weights.into_iter();
    let mut load = load.into_iter();
    let mut lora_targets = lora_targets.into_iter();
    let mut lora_base = lora_base.into_iter();
    let mut precision = precision.into_iter();
    let mut dataset = dataset.into_iter();
    let mut worker_kind = worker_kind.into_iter();
    let mut storage = storage.into_iter();
    let mut persistent = persistent.into_iter();
    let mut trim_layer = trim_layer.into_iter();
    let mut kernels = kernels.into_iter();
    let mut flush_denormals = flush_denormals.into_iter();
    let mut trim = trim.into_iter();
    let mut backward = backward.into_iter();

    let n = r.len.unwrap_or(0);
    let mut rows = Vec::with_capacity(n);
    for i in 0..n {
        // Every column was checked to hold exactly `n` values, so the iterators cannot run dry.
        let next = |it: &mut std::vec::IntoIter<String>| it.next().unwrap_or_default();
        rows.push(Row {
            run_id: next(&mut run_id),
            case: case[i],
            model: next(&mut model),
            preset: next(&mut preset),
            batch: batch[i],
            seq: seq[i],
            max_seq: max_seq[i],
            hidden: hidden[i],
            heads: heads[i],
            layers: layers[i],
            vocab: vocab[i],
            image_px: image_px[i],
            patch_px: patch_px[i],
            channels: channels[i],
            kv_heads: kv_heads[i],
            head_dim: head_dim[i],
            intermediate: intermediate[i],
            tied: next(&mut tied),
            biases: next(&mut biases),
            dtype: next(&mut dtype),
            checkpoint_dtype: next(&mut checkpoint_dtype),
            device: next(&mut device),
            optimizer: next(&mut optimizer),
            optimizer_block: optimizer_block[i],
            checkpoint: checkpoint[i],
            decode_tokens: decode_tokens[i],
            kv_cache: next(&mut kv_cache),
            weights: next(&mut weights),
            load: next(&mut load),
            attention: next(&mut attention),
            kernels: next(&mut kernels),
            flush_denormals: next(&mut flush_denormals),
            trim: next(&mut trim),
            backward: next(&mut backward),
            lora_rank: lora_rank[i],
            lora_targets: next(&mut lora_targets),
            lora_base: next(&mut lora_base),
            precision: next(&mut precision),
            phase: phase[i],
            status: status[i],
            error: error.next().flatten(),
            params: params[i],
            peak_bytes: peak_bytes[i],
            retained_bytes: retained_bytes[i],
            alloc_count: alloc_count[i],
            predicted_peak_bytes: predicted_peak_bytes[i],
            predicted_retained_bytes: predicted_retained_bytes[i],
            cpu_user_s: cpu_user_s[i],
            cpu_sys_s: cpu_sys_s[i],
            wall_s: wall_s[i],
            rss_peak_bytes: rss_peak_bytes[i],
            logits_rel_error: logits_rel_error[i],
            peak_meter: next(&mut peak_meter),
            reserved_peak_bytes: reserved_peak_bytes[i],
            device_used_bytes: device_used_bytes[i],
            nvml_process_peak_bytes: nvml_process_peak_bytes[i],
            gpu_util_mean_pct: gpu_util_mean_pct[i],
            gpu_power_peak_w: gpu_power_peak_w[i],
            nvml_samples_count: nvml_samples_count[i],
            threads: threads[i],
            dataset: next(&mut dataset),
            workers: workers[i],
            worker_kind: next(&mut worker_kind),
            prefetch: prefetch[i],
            storage: next(&mut storage),
            persistent: next(&mut persistent),
            epochs: epochs[i],
            crop_px: crop_px[i],
            images: images[i],
            images_per_s: images_per_s[i],
            startup_s: startup_s[i],
            tree_processes_count: tree_processes_count[i],
            tree_rss_peak_bytes: tree_rss_peak_bytes[i],
            tree_rss_steady_bytes: tree_rss_steady_bytes[i],
            pss_peak_bytes: pss_peak_bytes[i],
            pss_steady_bytes: pss_steady_bytes[i],
            h2d_pinned_bytes_per_s: h2d_pinned_bytes_per_s[i],
            h2d_pageable_bytes_per_s: h2d_pageable_bytes_per_s[i],
            trim_layer: next(&mut trim_layer),
            trim_before_bytes: trim_before_bytes[i],
            trim_after_bytes: trim_after_bytes[i],
            trim_live_bytes: trim_live_bytes[i],
            moe_routing: next(&mut moe_routing),
            moe_tokens_max: moe_tokens_max[i],
            moe_tokens_min: moe_tokens_min[i],
            active_params: active_params[i],
            kv_bytes_per_token: kv_bytes_per_token[i],
            sliding_window: sliding_window[i],
            heap_start_bytes: heap_start_bytes[i],
        });
    }
    Ok((meta, rows))
}

/// Opens the attribute `name` on `loc` and checks that it is a scalar of type `T`.
fn open_attr<T: H5Type>(loc: &Location, name: &str) -> anyhow::Result<Attribute> {
    let where_ = format!("attribute {name} on {}", loc.name());
    let attr = loc
        .attr(name)
        .with_context(|| format!("opening {where_}"))?;
    check_type::<T>(&attr, &where_)?;
    if !attr.is_scalar() {
        bail!("{where_} is not a scalar (shape {:?})", attr.shape());
    }
    Ok(attr)
}

fn read_attr<T: H5Type>(loc: &Location, name: &str) -> anyhow::Result<T> {
    open_attr::<T>(loc, name)?
        .read_scalar::<T>()
        .with_context(|| format!("reading attribute {name} on {}", loc.name()))
}

fn read_str_attr(loc: &Location, name: &str) -> anyhow::Result<String> {
    Ok(read_attr::<VarLenUnicode>(loc, name)?.as_str().to_owned())
}

/// Checks that the element type of `container` is exactly `T`'s.
fn check_type<T: H5Type>(container: &::hdf5::Container, where_: &str) -> anyhow::Result<()> {
    let found: TypeDescriptor = container
        .dtype()
        .and_then(|t| t.to_descriptor())
        .with_context(|| format!("reading the type of {where_}"))?;
    let expected = T::type_descriptor();
    if found != expected {
        bail!("{where_} has type {found}, expected {expected}");
    }
    Ok(())
}

/// Reads the columns of `/rows`, checking that all have the same length.
struct ColumnReader<'a> {
    group: &'a Group,
    /// Length of the first column read; every later one must match it.
    len: Option<usize>,
}

impl ColumnReader<'_> {
    /// Reads the 1-D dataset `name` as `T` values.
    fn raw<T: H5Type>(&mut self, name: &str) -> anyhow::Result<Vec<T>> {
        let where_ = format!("dataset /{ROWS_GROUP}/{name}");
        let ds = self
            .group
            .dataset(name)
            .with_context(|| format!("opening {where_}"))?;
        check_type::<T>(&ds, &where_)?;
        if ds.ndim() != 1 {
            bail!("{where_} is not 1-D (shape {:?})", ds.shape());
        }
        let values: Vec<T> = if ds.size() == 0 {
            Vec::new()
        } else {
            ds.read_raw::<T>()
                .with_context(|| format!("reading {where_}"))?
        };
        match self.len {
            None => self.len = Some(values.len()),
            Some(n) if n != values.len() => {
                bail!(
                    "{where_} has {} values, earlier columns have {n}",
                    values.len()
                )
            }
            Some(_) => {}
        }
        Ok(values)
    }

    fn plain_u64(&mut self, name: &str) -> anyhow::Result<Vec<u64>> {
        self.raw::<u64>(name)
    }

    fn opt_u64(&mut self, name: &str) -> anyhow::Result<Vec<Option<u64>>> {
        self.raw::<i64>(name)?
            .into_iter()
            .enumerate()
            .map(|(i, v)| match v {
                MISSING_U64 => Ok(None),
                v => u64::try_from(v).map(Some).map_err(|_| {
                    anyhow::anyhow!("dataset /{ROWS_GROUP}/{name}, row {i}: negative value {v}")
                }),
            })
            .collect()
    }

    fn opt_i64(&mut self, name: &str) -> anyhow::Result<Vec<Option<i64>>> {
        Ok(self
            .raw::<i64>(name)?
            .into_iter()
            .map(|v| (v != MISSING_I64).then_some(v))
            .collect())
    }

    fn opt_f64(&mut self, name: &str) -> anyhow::Result<Vec<Option<f64>>> {
        Ok(self
            .raw::<f64>(name)?
            .into_iter()
            .map(|v| (!v.is_nan()).then_some(v))
            .collect())
    }

    fn string(&mut self, name: &str) -> anyhow::Result<Vec<String>> {
        Ok(self
            .raw::<VarLenUnicode>(name)?
            .iter()
            .map(|s| s.as_str().to_owned())
            .collect())
    }

    fn opt_string(&mut self, name: &str) -> anyhow::Result<Vec<Option<String>>> {
        Ok(self
            .string(name)?
            .into_iter()
            .map(|s| (!s.is_empty()).then_some(s))
            .collect())
    }

    fn phase(&mut self, name: &str) -> anyhow::Result<Vec<Phase>> {
        self.string(name)?
            .iter()
            .enumerate()
            .map(|(i, s)| {
                Phase::parse(s).ok_or_else(|| {
                    anyhow::anyhow!(
                        "dataset /{ROWS_GROUP}/{name}, row {i}: unknown phase {s:?} (allowed: {})",
                        Phase::names()
                    )
                })
            })
            .collect()
    }

    fn status(&mut self, name: &str) -> anyhow::Result<Vec<Status>> {
        self.string(name)?
            .iter()
            .enumerate()
            .map(|(i, s)| {
                Status::deserialize(StrDeserializer::<de::value::Error>::new(s)).map_err(|_| {
                    anyhow::anyhow!("dataset /{ROWS_GROUP}/{name}, row {i}: unknown status {s:?}")
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_field_has_a_description() {
        for field in crate::store::csv::columns() {
            assert!(
                description_of(field).is_some(),
                "{field} lacks a description"
            );
        }
    }

    /// Every column has an explicit unit; rates are per second of their quantity, not `s`.
    #[test]
    fn every_column_has_its_unit() {
        for field in crate::store::csv::columns() {
            let u = unit(field).unwrap_or_else(|| panic!("{field} has no unit entry"));
            if field.ends_with("_per_s") {
                assert!(u.ends_with("/s"), "{field}: {u}");
            } else if field.ends_with("_bytes") {
                assert_eq!(u, "bytes", "{field}");
            } else if field.ends_with("_s") {
                assert_eq!(u, "s", "{field}");
            } else if field.ends_with("_px") {
                assert_eq!(u, "pixels", "{field}");
            }
        }
        assert_eq!(units_of("images_per_s"), "images/s");
        assert_eq!(units_of("h2d_pinned_bytes_per_s"), "bytes/s");
        assert_eq!(units_of("h2d_pageable_bytes_per_s"), "bytes/s");
        assert_eq!(units_of("workers"), "workers");
        assert_eq!(unit("no_such_field"), None);
    }

    #[test]
    fn units_follow_the_field_names() {
        assert_eq!(units_of("peak_bytes"), "bytes");
        assert_eq!(units_of("wall_s"), "s");
        assert_eq!(units_of("alloc_count"), "count");
        assert_eq!(units_of("params"), "parameters");
        assert_eq!(units_of("batch"), "sequences");
        assert_eq!(units_of("max_seq"), "tokens");
        assert_eq!(units_of("case"), "index");
        assert_eq!(units_of("status"), "");
    }
}
