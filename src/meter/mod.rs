//! Meters read one figure family each around a phase's window. A [`Meter`] is started right
//! before the window and read right after it; readings land in a [`Reading`] whose fields are
//! `None` until some meter fills them.
//!
//! Order matters: meters are started in order and read in reverse, so the allocator meter
//! (which must see nothing but the phase) is started last and read first.

pub mod cpu_alloc;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod pool;
pub mod proctree;
pub mod rusage;
pub mod sampler;

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
    /// `dataload` windows: throughput, the process tree's memory, copy bandwidths.
    pub data: Option<crate::data::DataFigures>,
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
pub fn measure<T>(
    meters: &mut [Box<dyn Meter>],
    window: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, Reading)> {
    for m in meters.iter_mut() {
        m.start()?;
    }
    let out = window();
    let mut reading = Reading::default();
    for m in meters.iter_mut().rev() {
        m.read(&mut reading)?;
    }
    Ok((out?, reading))
}
