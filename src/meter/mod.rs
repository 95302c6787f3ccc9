//! Meters read one figure family each around a phase's window. A [`Meter`] is started right
//! before the window and read right after it; readings land in a [`Reading`] whose fields are
//! `None` until some meter fills them.
//!
//! Order matters: meters are started in order and read in reverse, so the allocator meter
//! (which must see nothing but the phase) is started last and read first.

pub mod cpu_alloc;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod flops;
pub mod host_arena;
pub mod pool;
pub mod pool_timeline;
pub mod proctree;
pub mod rusage;
pub mod sampler;
pub mod trim;

/// Figures of one phase window. Units are in the names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    pub peak_bytes: Option<u64>,
    pub retained_bytes: Option<i64>,
    pub alloc_count: Option<u64>,
    pub cpu_user_s: Option<f64>,
    pub cpu_sys_s: Option<f64>,
    pub wall_s: Option<f64>,
    pub rss_peak_bytes: Option<u64>,
    /// CUDA pool: the pool's reservation high-water mark (`RESERVED_MEM_HIGH`).
    pub reserved_peak_bytes: Option<u64>,
    /// CUDA device layer: `cuMemGetInfo` used bytes after the window minus before.
    pub device_used_bytes: Option<i64>,
    /// CUDA process layer (NVML samples): peak process memory, mean utilisation, peak power.
    pub nvml_process_peak_bytes: Option<u64>,
    pub gpu_util_mean_pct: Option<f64>,
    pub gpu_power_peak_w: Option<f64>,
    pub nvml_samples_count: Option<u64>,
    /// Inference with other weights than the model's: ‖logits − logits_model‖ / ‖logits_model‖.
    pub logits_rel_error: Option<f64>,
    /// After the window, the allocator layer asked to give back what it holds unused
    /// ([`trim`]): its name (`rss`, `cuda-pool-reserved`), what it held before and after the
    /// trim, and the bytes live in the tensor allocator at that moment.
    pub trim_layer: Option<&'static str>,
    pub trim_before_bytes: Option<u64>,
    pub trim_after_bytes: Option<u64>,
    pub trim_live_bytes: Option<u64>,
    /// CPU: the counting allocator's bytes when the window opened.
    pub heap_start_bytes: Option<u64>,
    /// `dataload` windows: throughput, the process tree's memory, copy bandwidths.
    pub data: Option<DataFigures>,
    /// A mixture of experts: tokens per expert of each layer's forward in the window (of
    /// several, the most skewed; [`crate::model::moe::routing_snapshot`]).
    pub moe_routing: Option<Vec<Vec<usize>>>,
    /// The host arena ([`host_arena`]: ZeRO-Offload's optimizer partitions), apart from the
    /// device layer: its peak above the window's start and the bytes it kept.
    pub host_peak_bytes: Option<u64>,
    pub host_retained_bytes: Option<i64>,
}

/// A source of measurements around a window.
pub trait Meter {
    /// Short label of the layer this meter reads (e.g. `cpu-allocator`, `host-rusage`).
    fn label(&self) -> &'static str;
    /// Called right before the window opens.
    fn start(&mut self) -> anyhow::Result<()>;
    /// Called right after the window closes; fills the fields this meter owns.
    fn read(&mut self, into: &mut Reading) -> anyhow::Result<()>;
}

/// Runs `window` between `start` and `read` of every meter (started in order, read in reverse).
///
/// Every meter that was started is read, whatever fails: a meter whose `start` fails stops the
/// window before it opens (the meters already started are read and their readings dropped),
/// and a failing `read` does not keep the meters after it from being read. So no meter is
/// left running (a sampler thread, a held lock) after an error. The first error is returned.
pub fn measure<T>(
    meters: &mut [Box<dyn Meter>],
    window: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, Reading)> {
    let mut started = 0;
    let mut first_err = None;
    for m in meters.iter_mut() {
        match m.start() {
            Ok(()) => started += 1,
            Err(e) => {
                first_err = Some(e.context(format!("starting meter {}", m.label())));
                break;
            }
        }
    }
    let out = if first_err.is_none() {
        Some(window())
    } else {
        None
    };
    let mut reading = Reading::default();
    for m in meters[..started].iter_mut().rev() {
        if let Err(e) = m.read(&mut reading) {
            let e = e.context(format!("reading meter {}", m.label()));
            first_err.get_or_insert(e);
        }
    }
    match (out, first_err) {
        (Some(Err(e)), _) => Err(e),
        (_, Some(e)) => Err(e),
        (Some(Ok(v)), None) => Ok((v, reading)),
        (None, None) => unreachable!("the window runs unless a meter failed to start"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Counts its starts and reads; fails where told.
    struct Probe {
        starts: Arc<AtomicUsize>,
        reads: Arc<AtomicUsize>,
        fail_start: bool,
        fail_read: bool,
    }

    impl Meter for Probe {
        fn label(&self) -> &'static str {
            "probe"
        }
        fn start(&mut self) -> anyhow::Result<()> {
            if self.fail_start {
                anyhow::bail!("start failed");
            }
            self.starts.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn read(&mut self, _: &mut Reading) -> anyhow::Result<()> {
            self.reads.fetch_add(1, Ordering::SeqCst);
            if self.fail_read {
                anyhow::bail!("read failed");
            }
            Ok(())
        }
    }

    fn probes(
        fail_start: [bool; 3],
        fail_read: [bool; 3],
    ) -> (Vec<Box<dyn Meter>>, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let (s, r) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let v = (0..3)
            .map(|i| {
                Box::new(Probe {
                    starts: s.clone(),
                    reads: r.clone(),
                    fail_start: fail_start[i],
                    fail_read: fail_read[i],
                }) as Box<dyn Meter>
            })
            .collect();
        (v, s, r)
    }

    #[test]
    fn a_failing_read_does_not_leave_later_meters_running() {
        let (mut m, starts, reads) = probes([false; 3], [false, false, true]);
        let e = measure(&mut m, || Ok(())).unwrap_err();
        assert!(format!("{e:#}").contains("read failed"));
        assert_eq!(starts.load(Ordering::SeqCst), 3);
        assert_eq!(reads.load(Ordering::SeqCst), 3, "every started meter read");
    }

    #[test]
    fn a_failing_start_reads_the_started_ones_and_skips_the_window() {
        let (mut m, starts, reads) = probes([false, true, false], [false; 3]);
        let mut ran = false;
        let e = measure(&mut m, || {
            ran = true;
            Ok(())
        })
        .unwrap_err();
        assert!(format!("{e:#}").contains("start failed"));
        assert!(!ran);
        assert_eq!(starts.load(Ordering::SeqCst), 1);
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn the_window_error_comes_first() {
        let (mut m, _, reads) = probes([false; 3], [true; 3]);
        let e = measure(&mut m, || -> anyhow::Result<()> { anyhow::bail!("window") }).unwrap_err();
        assert_eq!(e.to_string(), "window");
        assert_eq!(reads.load(Ordering::SeqCst), 3);
    }
}

/// Figures of a dataload window beyond the common meters'.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DataFigures {
    pub images: u64,
    pub images_per_s: f64,
    /// Seconds from each epoch's start to its first batch, summed over epochs (worker start-up
    /// and the first batch's work).
    pub startup_s: f64,
    pub tree_rss_peak_bytes: Option<u64>,
    pub tree_rss_steady_bytes: Option<u64>,
    pub pss_peak_bytes: Option<u64>,
    pub pss_steady_bytes: Option<u64>,
    pub tree_processes_count: Option<u64>,
    /// CPU seconds of worker processes reaped in the window (added to the row's CPU figures).
    pub children_user_s: f64,
    pub children_sys_s: f64,
    /// CUDA: host→device copy bandwidth from a pinned and a pageable buffer of one batch.
    pub h2d_pinned_bytes_per_s: Option<f64>,
    pub h2d_pageable_bytes_per_s: Option<f64>,
}
