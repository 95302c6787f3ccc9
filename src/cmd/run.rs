//! `memfit run`: resolve the workload, run every case, append rows to the journal after each
//! case, then derive CSV and HDF5 from the journal and print the table.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::cli::RunArgs;
use crate::device::DeviceSpec;
use crate::error::UserError;
use crate::formula;
use crate::meter::cpu_alloc::AllocMeter;
use crate::meter::rusage::HostMeter;
use crate::meter::{Meter, Reading};
use crate::phase::runner::{PhaseResult, run_case};
use crate::record::{Row, RunMeta, Status, error_text, status_of};
use crate::report::table;
use crate::store;
use crate::workload::{self, Case, WorkloadFile};

/// Most CPU threads accepted by `--threads`.
pub const MAX_THREADS: i64 = 1024;

pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    // 1. Resolve everything before touching the disk.
    let (file, origin) = match &args.workload {
        Some(path) => (workload::load(path)?, path.display().to_string()),
        None if args.has_grid_flags() => (WorkloadFile::default(), "flags".to_string()),
        None => (
            workload::parse(workload::DEFAULT_TOML, "<embedded default>")?,
            "<embedded default>".to_string(),
        ),
    };
    let cases = workload::expand(&file, &args.grid_flags(), &origin)?;
    let threads = resolve_threads(args.threads, file.threads, &origin)?;
    let run_id = crate::units::utc_stamp(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    );
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs").join(&run_id));
    let journal_path = out.join("results.jsonl");
    if journal_path.exists() {
        return Err(UserError::Output {
            path: journal_path.display().to_string(),
            message: "a journal is already there; choose another --out or remove it".into(),
        }
        .into());
    }
    pin_threads(threads)?;
    let budget = args
        .mem_budget
        .as_deref()
        .map(|v| crate::units::parse_size(v, "mem-budget"))
        .transpose()?;

    let cpu = cpu_model();
    let mut meta = RunMeta {
        run_id: run_id.clone(),
        memfit_version: env!("CARGO_PKG_VERSION").into(),
        git_commit: env!("MEMFIT_GIT_COMMIT").into(),
        candle_version: env!("MEMFIT_CANDLE_VERSION").into(),
        device_name: format!("cpu: {cpu}"),
        cpu_model: cpu,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
        os: os_name(),
        threads: threads as u64,
        workload: origin.clone(),
        cuda_context_bytes: None,
        device_memory_bytes: None,
        driver_version: None,
        cuda_version: None,
    };

    // 2. Measure, appending after every case.
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    write_meta(&out.join("meta.json"), &meta)?;
    let mut journal = store::jsonl::Journal::open(&journal_path)?;
    let mut meter_sets = MeterSets::default();
    if let Some(b) = budget {
        crate::meter::cpu_alloc::set_budget(b);
    }
    if !args.quiet {
        println!(
            "memfit {} · {} case(s) from {} · {} thread(s) · out {}",
            meta.memfit_version,
            cases.len(),
            origin,
            threads,
            out.display()
        );
        println!("{}", table::header());
    }
    let exe = crate::data::workers::current_exe()?;
    for case in &cases {
        let isolated = case.data.is_some() && !crate::data::bench::in_child();
        let rows = match meter_sets.get(case.device, &mut meta) {
            // A dataload case runs in a fresh process of its own (`data::bench`).
            Ok(_) if isolated => crate::data::bench::rows_in_child(case, &meta, &exe)
                .unwrap_or_else(|e| failed_rows(case, &meta, &e)),
            Ok((meters, label)) => {
                let results = if case.data.is_some() {
                    crate::data::bench::run_case(case, meters, &exe)
                } else {
                    run_case(case, meters)
                };
                case_rows(case, &meta, results, label)
            }
            Err(e) => failed_rows(case, &meta, &e),
        };
        journal
            .append(&rows)
            .with_context(|| format!("appending case {} to the journal", case.index))?;
        if !args.quiet {
            for r in &rows {
                println!("{}", table::line(r));
            }
        }
    }
    drop(journal);
    // What the devices told us while running (CUDA context size, driver) joins the metadata.
    write_meta(&out.join("meta.json"), &meta)?;

    // 3. Derive the other stores from the journal (what is on disk, not what is in memory).
    let rows = store::jsonl::read(&journal_path)?;
    store::csv::write(&out.join("results.csv"), &rows)?;
    store::hdf5::write(&out.join("results.h5"), &meta, &rows)?;
    if !args.quiet {
        println!(
            "wrote {} row(s): {}, results.csv, results.h5, meta.json",
            rows.len(),
            journal_path.display()
        );
    }
    Ok(())
}

fn resolve_threads(flag: Option<i64>, file: Option<i64>, origin: &str) -> Result<usize, UserError> {
    let (value, origin) = match (flag, file) {
        (Some(t), _) => (t, "flags"),
        (None, Some(t)) => (t, origin),
        (None, None) => {
            return Ok(std::thread::available_parallelism().map_or(1, |n| n.get()));
        }
    };
    if !(1..=MAX_THREADS).contains(&value) {
        return Err(UserError::OutOfRange {
            origin: origin.into(),
            key: "threads".into(),
            value: value.to_string(),
            reason: "the CPU backend needs at least one thread".into(),
            allowed: format!("1..={MAX_THREADS}"),
        });
    }
    Ok(value as usize)
}

/// Pins the CPU backend to `threads`: the rayon pool and candle's gemm (which reads
/// `RAYON_NUM_THREADS`).
fn pin_threads(threads: usize) -> anyhow::Result<()> {
    // SAFETY: called before memfit starts any thread of its own; nothing reads the
    // environment concurrently.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", threads.to_string()) };
    match rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
    {
        Ok(()) => Ok(()),
        // Already built (a second run in one process): it must have the same size.
        Err(_) if rayon::current_num_threads() == threads => Ok(()),
        Err(e) => Err(anyhow::anyhow!(
            "the thread pool already has {} threads, cannot pin {threads}: {e}",
            rayon::current_num_threads()
        )),
    }
}

/// The meters of each device a run uses, built when a case first needs the device.
#[derive(Default)]
struct MeterSets {
    sets: HashMap<DeviceSpec, MeterSet>,
}

/// A device's meters and the label of the one that fills `peak_bytes`.
type MeterSet = (Vec<Box<dyn Meter>>, &'static str);

impl MeterSets {
    /// The meters of `device` and the label of the meter that fills `peak_bytes`. Opening a
    /// CUDA device records what it tells about itself in `meta` (the first one does).
    fn get(
        &mut self,
        device: DeviceSpec,
        meta: &mut RunMeta,
    ) -> anyhow::Result<(&mut [Box<dyn Meter>], &'static str)> {
        let (m, label) = match self.sets.entry(device) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(open_meters(device, meta)?),
        };
        Ok((m.as_mut_slice(), *label))
    }
}

fn open_meters(device: DeviceSpec, meta: &mut RunMeta) -> anyhow::Result<MeterSet> {
    match device {
        DeviceSpec::Cpu => Ok((
            vec![
                Box::new(HostMeter::default()),
                Box::new(AllocMeter::default()),
            ],
            "cpu-allocator",
        )),
        #[cfg(feature = "cuda")]
        DeviceSpec::Cuda(n) => {
            let s = crate::meter::cuda::setup(n)?;
            if let Some(why) = &s.nvml_missing {
                eprintln!("warning: cuda:{n}: {why}; the NVML fields stay empty");
            }
            if meta.device_memory_bytes.is_none() {
                meta.device_name = format!("cuda:{n}: {}", s.device_name);
                meta.device_memory_bytes = Some(s.memory_bytes);
                meta.cuda_context_bytes = s.context_bytes;
                meta.driver_version = s.driver_version;
                meta.cuda_version = s.cuda_version;
            }
            Ok((s.meters, "cuda-pool"))
        }
        #[cfg(not(feature = "cuda"))]
        DeviceSpec::Cuda(_) => {
            let _ = meta;
            anyhow::bail!(crate::device::NO_CUDA)
        }
    }
}

/// Rows of a case that could not run: every phase failed with `e`.
fn failed_rows(case: &Case, meta: &RunMeta, e: &anyhow::Error) -> Vec<Row> {
    let msg = error_text(e);
    let failed = case
        .phases
        .iter()
        .map(|&phase| PhaseResult {
            phase,
            outcome: Err(anyhow::anyhow!("{msg}")),
        })
        .collect();
    case_rows(case, meta, failed, "none")
}

/// Rows of one case: measured figures beside the formula's predictions.
pub fn case_rows(
    case: &Case,
    meta: &RunMeta,
    results: Vec<PhaseResult>,
    peak_meter: &str,
) -> Vec<Row> {
    results
        .into_iter()
        .map(|res| {
            let pred = formula::predict(case, res.phase, meta.threads as usize);
            let (status, error, mut reading) = match res.outcome {
                Ok(r) => (Status::Ok, None, r),
                Err(e) => {
                    let msg = error_text(&e);
                    (status_of(&msg), Some(msg), Reading::default())
                }
            };
            let figures = reading.data.take();
            let row = Row {
                run_id: meta.run_id.clone(),
                case: case.index as u64,
                model: case.model.as_str().into(),
                preset: case.preset.clone(),
                batch: case.batch as u64,
                seq: case.seq as u64,
                max_seq: case.cfg.max_seq as u64,
                hidden: case.cfg.hidden as u64,
                heads: case.cfg.heads as u64,
                layers: case.cfg.layers as u64,
                vocab: case.cfg.vocab as u64,
                image_px: case.cfg.vision.map_or(0, |v| v.image as u64),
                patch_px: case.cfg.vision.map_or(0, |v| v.patch as u64),
                channels: case.cfg.vision.map_or(0, |v| v.channels as u64),
                dtype: case.dtype.to_string(),
                device: case.device.to_string(),
                optimizer: case.optimizer.as_str().into(),
                optimizer_block: case.optimizer_block as u64,
                checkpoint: case.checkpoint as u64,
                decode_tokens: case.decode_tokens as u64,
                kv_cache: if case.kv_cache { "on" } else { "off" }.into(),
                weights: case.weights.as_str().into(),
                load: if case.load_mmap { "mmap" } else { "read" }.into(),
                precision: case.precision.as_str().into(),
                lora_rank: case.cfg.lora_rank as u64,
                lora_targets: case
                    .cfg
                    .lora_targets
                    .iter()
                    .map(|t| t.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
                lora_base: if case.cfg.lora_rank > 0 {
                    case.cfg.lora_base.as_str().into()
                } else {
                    String::new()
                },
                attention: if case.cfg.efficient_attention {
                    "efficient"
                } else {
                    "standard"
                }
                .into(),
                phase: res.phase.as_str().into(),
                status,
                error,
                params: case.cfg.params(),
                peak_bytes: reading.peak_bytes,
                retained_bytes: reading.retained_bytes,
                alloc_count: reading.alloc_count,
                predicted_peak_bytes: Some(pred.peak_bytes),
                predicted_retained_bytes: Some(pred.retained_bytes),
                cpu_user_s: reading.cpu_user_s,
                cpu_sys_s: reading.cpu_sys_s,
                wall_s: reading.wall_s,
                rss_peak_bytes: reading.rss_peak_bytes,
                logits_rel_error: reading.logits_rel_error,
                peak_meter: peak_meter.into(),
                reserved_peak_bytes: reading.reserved_peak_bytes,
                device_used_bytes: reading.device_used_bytes,
                nvml_process_peak_bytes: reading.nvml_process_peak_bytes,
                gpu_util_mean_pct: reading.gpu_util_mean_pct,
                gpu_power_peak_w: reading.gpu_power_peak_w,
                nvml_samples_count: reading.nvml_samples_count,
                threads: meta.threads,
                dataset: String::new(),
                workers: None,
                worker_kind: String::new(),
                prefetch: None,
                storage: String::new(),
                persistent: String::new(),
                epochs: None,
                crop_px: None,
                images: None,
                images_per_s: None,
                startup_s: None,
                tree_processes_count: None,
                tree_rss_peak_bytes: None,
                tree_rss_steady_bytes: None,
                pss_peak_bytes: None,
                pss_steady_bytes: None,
                h2d_pinned_bytes_per_s: None,
                h2d_pageable_bytes_per_s: None,
            };
            match &case.data {
                Some(d) => crate::data::bench::row(row, d, figures),
                None => row,
            }
        })
        .collect()
}

fn write_meta(path: &Path, meta: &RunMeta) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(meta)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// The host CPU's model name (`/proc/cpuinfo`), else the architecture.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

fn os_name() -> String {
    let pretty = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("PRETTY_NAME=")).map(|l| {
                l.trim_start_matches("PRETTY_NAME=")
                    .trim_matches('"')
                    .to_string()
            })
        });
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .ok();
    match (pretty, kernel) {
        (Some(p), Some(k)) => format!("{p} (Linux {k})"),
        (Some(p), None) => p,
        (None, Some(k)) => format!("Linux {k}"),
        (None, None) => std::env::consts::OS.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_errors_lose_the_backtrace_and_oom_is_recognised() {
        let e = anyhow::anyhow!(
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")\n   0: bt\n   at x.rs:1"
        )
        .context("phase forward");
        let text = error_text(&e);
        assert_eq!(
            text,
            "phase forward: DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")"
        );
        assert_eq!(status_of(&text), Status::Oom);
        assert_eq!(status_of("shape mismatch"), Status::Error);
    }
}
