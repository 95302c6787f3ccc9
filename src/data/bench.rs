//! The `dataload` phase: one metered window over `epochs` passes of the dataset, batches
//! consumed in order by the main thread as candle tensors (moved to the case's device on CUDA).
//!
//! Inside the window: opening the dataset in its storage mode (`ram` reads the pack here),
//! starting the workers (per epoch when not persistent), every batch, stopping the workers.
//! Around it: the process-tree sampler (started before, stopped after, 10 ms period) and
//! `RUSAGE_CHILDREN` (worker processes are reaped inside the window, so their CPU seconds are
//! the difference). On CUDA, after the window, one batch is copied host→device from a pageable
//! and from a pinned buffer to time both (`h2d_*_bytes_per_s`, D6).
//!
//! Each case runs in a fresh process (as every case does: `crate::sweep::child`), so
//! the tree's memory starts from a bare memfit and no earlier case's freed-but-kept heap
//! (glibc arenas of finished worker threads, measured: ≈ 47 MiB after a sweep) is counted.

use std::path::Path;
use std::time::Duration;

use anyhow::Context;
use candle_core::{Device, Tensor};

use super::DataCase;
use super::DataFigures;
use super::workers::run_epochs;
use crate::device::DeviceSpec;
use crate::meter::proctree::TreeSampler;
use crate::meter::{Meter, measure};
use crate::record::Row;
use crate::step::Phase;
use crate::step::PhaseResult;

/// Sampling period of the process tree's memory.
pub const SAMPLE_PERIOD: Duration = Duration::from_millis(10);

fn children_cpu() -> (f64, f64) {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    (s(ru.ru_utime), s(ru.ru_stime))
}

/// Runs a case's dataload window over `data` on `device`; `exe` is the binary worker
/// processes run.
pub fn run_case(
    data: &DataCase,
    device: DeviceSpec,
    meters: &mut [Box<dyn Meter>],
    exe: &Path,
) -> Vec<PhaseResult> {
    let outcome = window(data, device, meters, exe).map(|(mut reading, figures)| {
        reading.cpu_user_s = reading.cpu_user_s.map(|u| u + figures.children_user_s);
        reading.cpu_sys_s = reading.cpu_sys_s.map(|s| s + figures.children_sys_s);
        reading.data = Some(figures);
        reading
    });
    vec![PhaseResult {
        phase: Phase::Dataload,
        outcome,
    }]
}

fn window(
    data: &DataCase,
    spec: DeviceSpec,
    meters: &mut [Box<dyn Meter>],
    exe: &Path,
) -> anyhow::Result<(crate::meter::Reading, DataFigures)> {
    let device = spec
        .candle()
        .with_context(|| format!("opening device {spec}"))?;
    // Checked before the window: a missing dataset is an error row, not a measurement.
    super::dataset::read_manifest(&data.dataset)?;
    let c = data.crop as usize;
    // Free heap goes back to the kernel before the first sample (the host meter trims again).
    // SAFETY: malloc_trim only releases free heap memory.
    #[cfg(target_os = "linux")]
    unsafe {
        libc::malloc_trim(0);
    }
    let sampler = TreeSampler::start(std::process::id(), SAMPLE_PERIOD)?;
    let mut children = (0.0, 0.0);
    let result = measure(meters, || {
        let (u0, s0) = children_cpu();
        let stats = run_epochs(data, exe, |_epoch, floats, n| {
            let t = Tensor::from_vec(floats, (n, 3, c, c), &Device::Cpu)?;
            if !device.is_cpu() {
                let on_device = t.to_device(&device)?;
                device.synchronize()?;
                drop(on_device);
            }
            drop(t);
            Ok(())
        })
        .context("phase dataload")?;
        let (u1, s1) = children_cpu();
        children = (u1 - u0, s1 - s0);
        Ok(stats)
    });
    let tree = sampler.stop()?;
    let (stats, reading) = result?;
    let wall = reading.wall_s.unwrap_or(f64::NAN);
    let mut figures = DataFigures {
        images: stats.images,
        images_per_s: stats.images as f64 / wall,
        startup_s: stats.startup_s,
        tree_rss_peak_bytes: Some(tree.rss_peak_bytes),
        tree_rss_steady_bytes: Some(tree.rss_steady_bytes),
        pss_peak_bytes: Some(tree.pss_peak_bytes),
        pss_steady_bytes: Some(tree.pss_steady_bytes),
        tree_processes_count: Some(tree.processes_max),
        children_user_s: children.0,
        children_sys_s: children.1,
        ..DataFigures::default()
    };
    if tree.samples == 0 || tree.pss_peak_bytes == 0 {
        // /proc unreadable: no tree figures rather than zeros.
        figures.tree_rss_peak_bytes = None;
        figures.tree_rss_steady_bytes = None;
        figures.pss_peak_bytes = None;
        figures.pss_steady_bytes = None;
        figures.tree_processes_count = None;
    }
    #[cfg(feature = "cuda")]
    if let DeviceSpec::Cuda(n) = spec {
        let (pinned, pageable) = super::cuda::h2d_bandwidth(n, data.batch_bytes() as usize)
            .context("timing host→device copies")?;
        figures.h2d_pinned_bytes_per_s = Some(pinned);
        figures.h2d_pageable_bytes_per_s = Some(pageable);
    }
    Ok((reading, figures))
}

/// A `dataload` row: no model (its fields empty, no prediction), the pipeline's settings and
/// figures.
pub fn row(row: Row, d: &super::DataCase, f: Option<DataFigures>) -> Row {
    let f = f.as_ref();
    Row {
        model: String::new(),
        preset: String::new(),
        batch: d.batch as u64,
        seq: 0,
        max_seq: 0,
        hidden: 0,
        heads: 0,
        layers: 0,
        vocab: 0,
        dtype: String::new(),
        optimizer: String::new(),
        optimizer_block: 0,
        kv_cache: String::new(),
        weights: String::new(),
        load: String::new(),
        attention: String::new(),
        precision: String::new(),
        params: 0,
        predicted_peak_bytes: None,
        predicted_retained_bytes: None,
        dataset: d.dataset.display().to_string(),
        workers: Some(d.workers as u64),
        worker_kind: if d.workers == 0 {
            "main".into()
        } else {
            d.kind.as_str().into()
        },
        prefetch: Some(d.prefetch as u64),
        storage: d.storage.as_str().into(),
        persistent: if d.workers == 0 {
            String::new()
        } else if d.persistent {
            "on".into()
        } else {
            "off".into()
        },
        epochs: Some(d.epochs as u64),
        crop_px: Some(d.crop as u64),
        images: f.map(|f| f.images),
        images_per_s: f.map(|f| f.images_per_s),
        startup_s: f.map(|f| f.startup_s),
        tree_processes_count: f.and_then(|f| f.tree_processes_count),
        tree_rss_peak_bytes: f.and_then(|f| f.tree_rss_peak_bytes),
        tree_rss_steady_bytes: f.and_then(|f| f.tree_rss_steady_bytes),
        pss_peak_bytes: f.and_then(|f| f.pss_peak_bytes),
        pss_steady_bytes: f.and_then(|f| f.pss_steady_bytes),
        h2d_pinned_bytes_per_s: f.and_then(|f| f.h2d_pinned_bytes_per_s),
        h2d_pageable_bytes_per_s: f.and_then(|f| f.h2d_pageable_bytes_per_s),
        ..row
    }
}
