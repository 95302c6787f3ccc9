//! CUDA meters (feature `cuda`): the pool (allocator layer), `cuMemGetInfo` (device layer) and
//! NVML (process layer). Each is labelled; see `docs/schema.md` for why their figures differ.

use std::sync::Arc;

use anyhow::Context;
use candle_core::cuda_backend::cudarc::driver::{CudaContext, result, sys};
use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;

use super::pool::PoolSource;
use super::sampler::{Sample, SampleSource};
use super::{Meter, Reading};

/// The device's default memory pool, which candle's `cuMemAllocAsync` allocations come from.
pub struct CudaPool {
    ctx: Arc<CudaContext>,
    pool: sys::CUmemoryPool,
}

impl CudaPool {
    pub fn new(ctx: Arc<CudaContext>) -> anyhow::Result<Self> {
        ctx.bind_to_thread()?;
        // SAFETY: the device comes from a live context.
        let pool = unsafe { result::device::get_default_mem_pool(ctx.cu_device()) }
            .context("cuDeviceGetDefaultMemPool")?;
        Ok(Self { ctx, pool })
    }

    fn get(&self, attr: sys::CUmemPool_attribute) -> anyhow::Result<u64> {
        let mut v: u64 = 0;
        // SAFETY: the pool is valid for the context's lifetime; these attributes are cuuint64_t.
        unsafe { result::mem_pool::get_attribute(self.pool, attr, &mut v as *mut u64 as *mut _) }
            .with_context(|| format!("cuMemPoolGetAttribute({attr:?})"))?;
        Ok(v)
    }

    /// Keeps freed blocks reserved up to `bytes` between synchronisations (the default, 0,
    /// gives every freed block back at the next synchronisation).
    pub fn set_release_threshold(&self, bytes: u64) -> anyhow::Result<()> {
        let mut v = bytes;
        let attr = sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;
        // SAFETY: as above; this attribute is a cuuint64_t.
        unsafe { result::mem_pool::set_attribute(self.pool, attr, &mut v as *mut u64 as *mut _) }
            .with_context(|| format!("cuMemPoolSetAttribute({attr:?}, {bytes})"))
    }

    fn reset(&self, attr: sys::CUmemPool_attribute) -> anyhow::Result<()> {
        let mut zero: u64 = 0;
        // SAFETY: as above; 0 is the only value these attributes accept.
        unsafe { result::mem_pool::set_attribute(self.pool, attr, &mut zero as *mut u64 as *mut _) }
            .with_context(|| format!("cuMemPoolSetAttribute({attr:?}, 0)"))
    }
}

// SAFETY: the pool handle is a process-wide driver object, valid from any thread on which its
// context is bound ([`PoolSource::bind`]); the context itself is shared by an `Arc`.
unsafe impl Send for CudaPool {}

impl PoolSource for CudaPool {
    fn sync(&mut self) -> anyhow::Result<()> {
        self.ctx.synchronize().context("cuCtxSynchronize")
    }
    fn bind(&mut self) -> anyhow::Result<()> {
        self.ctx
            .bind_to_thread()
            .context("binding the CUDA context")
    }
    fn used_current(&mut self) -> anyhow::Result<u64> {
        self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    }
    fn used_high(&mut self) -> anyhow::Result<u64> {
        self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)
    }
    fn reserved_high(&mut self) -> anyhow::Result<u64> {
        self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
    }
    fn reset_highs(&mut self) -> anyhow::Result<()> {
        self.reset(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH)?;
        self.reset(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)
    }
}

/// The pool's trim ([`super::trim`]): its reservation (`RESERVED_MEM_CURRENT`) around
/// `cuMemPoolTrimTo(pool, 0)`, the bytes handed out (`USED_MEM_CURRENT`) as the live ones.
impl super::trim::TrimSource for CudaPool {
    fn layer(&self) -> &'static str {
        "cuda-pool-reserved"
    }
    fn held(&mut self) -> anyhow::Result<Option<u64>> {
        self.sync()?;
        self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
            .map(Some)
    }
    fn live(&mut self) -> anyhow::Result<u64> {
        self.sync()?;
        self.used_current()
    }
    fn trim(&mut self) -> anyhow::Result<()> {
        // SAFETY: the pool is valid for the context's lifetime; the driver releases only
        // memory that backs no outstanding allocation.
        unsafe { result::mem_pool::trim_to(self.pool, 0) }.context("cuMemPoolTrimTo(pool, 0)")?;
        self.sync()
    }
}

/// `cuMemGetInfo`: device memory in use by everyone (after − before the window).
pub struct MemInfoMeter {
    ctx: Arc<CudaContext>,
    used_before: u64,
}

impl MemInfoMeter {
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        Self {
            ctx,
            used_before: 0,
        }
    }

    fn used(&self) -> anyhow::Result<u64> {
        self.ctx.synchronize().context("cuCtxSynchronize")?;
        let (free, total) = self.ctx.mem_get_info().context("cuMemGetInfo")?;
        Ok((total - free) as u64)
    }
}

impl Meter for MemInfoMeter {
    fn label(&self) -> &'static str {
        "cuda-meminfo"
    }
    fn start(&mut self) -> anyhow::Result<()> {
        self.used_before = self.used()?;
        Ok(())
    }
    fn read(&mut self, into: &mut Reading) -> anyhow::Result<()> {
        into.device_used_bytes = Some(self.used()? as i64 - self.used_before as i64);
        Ok(())
    }
}

/// The peak layer on a device without memory pools: a thread samples `cuMemGetInfo` every
/// millisecond while the window is open; `peak_bytes` is the highest used figure above the one
/// at the start (device-wide, sampled: a lower bound of the true peak), `retained_bytes` the
/// used figure after minus before. Labelled `cuda-meminfo-sampled` in the rows.
pub struct MemInfoPeak {
    ctx: Arc<CudaContext>,
    running: Option<(
        Arc<std::sync::atomic::AtomicBool>,
        std::thread::JoinHandle<anyhow::Result<u64>>,
        u64,
    )>,
}

impl MemInfoPeak {
    pub fn new(ctx: Arc<CudaContext>) -> Self {
        Self { ctx, running: None }
    }

    fn used(ctx: &CudaContext) -> anyhow::Result<u64> {
        let (free, total) = ctx.mem_get_info().context("cuMemGetInfo")?;
        Ok((total - free) as u64)
    }

    fn stop(&mut self) -> Option<(anyhow::Result<u64>, u64)> {
        let (flag, handle, before) = self.running.take()?;
        flag.store(true, std::sync::atomic::Ordering::Release);
        let high = handle
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the cuMemGetInfo sampler panicked")));
        Some((high, before))
    }
}

impl Drop for MemInfoPeak {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

impl Meter for MemInfoPeak {
    fn label(&self) -> &'static str {
        "cuda-meminfo-sampled"
    }
    fn start(&mut self) -> anyhow::Result<()> {
        let _ = self.stop();
        self.ctx.synchronize().context("cuCtxSynchronize")?;
        let before = Self::used(&self.ctx)?;
        let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (f, ctx) = (flag.clone(), self.ctx.clone());
        let handle = std::thread::Builder::new()
            .name("memfit-meminfo".into())
            .spawn(move || -> anyhow::Result<u64> {
                ctx.bind_to_thread()?;
                let mut high = 0u64;
                loop {
                    let last = f.load(std::sync::atomic::Ordering::Acquire);
                    high = high.max(Self::used(&ctx)?);
                    if last {
                        return Ok(high);
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            })?;
        self.running = Some((flag, handle, before));
        Ok(())
    }
    fn read(&mut self, into: &mut Reading) -> anyhow::Result<()> {
        self.ctx.synchronize().context("cuCtxSynchronize")?;
        let after = Self::used(&self.ctx)?;
        let (high, before) = self
            .stop()
            .ok_or_else(|| anyhow::anyhow!("cuMemGetInfo sampler read without start"))?;
        let high = high?.max(after);
        into.peak_bytes = Some(high.saturating_sub(before));
        into.retained_bytes = Some(after as i64 - before as i64);
        Ok(())
    }
}

/// NVML figures of this process on one GPU (read-only queries: no setting is changed, and
/// accounting mode is never enabled).
pub struct NvmlSource {
    nvml: Nvml,
    index: u32,
    pid: u32,
}

impl NvmlSource {
    /// NVML's device with the CUDA device's `uuid` (its index in NVML's own order); the
    /// reason when NVML cannot be loaded or does not list the device (the caller warns once).
    pub fn new(uuid: &str) -> Result<Self, String> {
        let nvml = Nvml::init().map_err(|e| format!("NVML unavailable: {e}"))?;
        let index = nvml
            .device_by_uuid(uuid)
            .and_then(|d| d.index())
            .map_err(|e| format!("NVML device {uuid}: {e}"))?;
        Ok(Self {
            nvml,
            index,
            pid: std::process::id(),
        })
    }
}

impl SampleSource for NvmlSource {
    fn sample(&mut self) -> Sample {
        let Ok(dev) = self.nvml.device_by_index(self.index) else {
            return Sample::default();
        };
        let process_bytes = dev.running_compute_processes().ok().and_then(|ps| {
            ps.into_iter()
                .find(|p| p.pid == self.pid)
                .and_then(|p| match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => Some(b),
                    UsedGpuMemory::Unavailable => None,
                })
        });
        Sample {
            process_bytes,
            util_pct: dev.utilization_rates().ok().map(|u| u.gpu as f64),
            power_w: dev.power_usage().ok().map(|mw| mw as f64 / 1000.0),
        }
    }
}

/// The meters of one CUDA device and what is known about it.
pub struct CudaSetup {
    /// Started in order, read in reverse: the pool's trim (devices with memory pools), host
    /// figures, NVML sampler, `cuMemGetInfo`, pool.
    pub meters: Vec<Box<dyn Meter>>,
    /// The meter `peak_bytes` comes from: `cuda-pool`, or, on a device without memory pools
    /// (candle then allocates with `cuMemAlloc`, which no pool sees), `cuda-meminfo-sampled`.
    pub peak_meter: &'static str,
    pub device_name: String,
    pub memory_bytes: u64,
    /// This process's device memory (NVML) once the context and candle's handles exist, before
    /// any tensor: the CUDA context, cuBLAS/cuRAND handles and loaded modules.
    pub context_bytes: Option<u64>,
    pub driver_version: Option<String>,
    pub cuda_version: Option<String>,
    /// The default pool's release threshold memfit set (devices with pools).
    pub pool_release_threshold: Option<u64>,
    /// Why NVML figures are missing, if they are (to warn once).
    pub nvml_missing: Option<String>,
}

/// Opens `cuda:ordinal` the way candle does and builds its meters; without `trim` (`--trim
/// off`) the host meter does not trim the heap before a window and no meter trims the pool
/// after it; with `sample_pool` (`run --timeline`) a meter samples the pool's bytes in use
/// while each window is open.
pub fn setup(ordinal: usize, trim: bool, sample_pool: bool) -> anyhow::Result<CudaSetup> {
    // The process's one device (its cuBLAS workspace already set outside the pool).
    let dev = crate::device::DeviceSpec::Cuda(ordinal)
        .candle()
        .with_context(|| format!("opening cuda:{ordinal}"))?;
    let ctx = dev.as_cuda_device()?.cuda_stream().context().clone();
    let device_name = ctx.name().context("cuDeviceGetName")?;
    let memory_bytes = ctx.total_mem().context("cuDeviceTotalMem")? as u64;
    let mut meters: Vec<Box<dyn Meter>> = vec![Box::new(super::rusage::HostMeter::for_case(trim))];
    let (mut context_bytes, mut driver_version, mut cuda_version, mut nvml_missing) =
        (None, None, None, None);
    // NVML's device is the one with the CUDA device's UUID (the ordinals differ under
    // CUDA_VISIBLE_DEVICES and in PCI order).
    let uuid = ctx.uuid().context("cuDeviceGetUuid")?;
    let uuid = crate::device::nvml_uuid(uuid.bytes.map(|b| b as u8));
    match NvmlSource::new(&uuid) {
        Ok(mut src) => {
            context_bytes = src.sample().process_bytes;
            driver_version = src.nvml.sys_driver_version().ok();
            cuda_version = src.nvml.sys_cuda_driver_version().ok().map(|v| {
                format!(
                    "{}.{}",
                    nvml_wrapper::cuda_driver_version_major(v),
                    nvml_wrapper::cuda_driver_version_minor(v)
                )
            });
            meters.push(Box::new(super::sampler::Sampler::new(src)));
        }
        Err(why) => nvml_missing = Some(why),
    }
    // cudarc allocates from the default pool (`cuMemAllocAsync`) only when the device says it
    // supports memory pools; otherwise every allocation is a `cuMemAlloc` the pool never sees
    // and its watermark would read 0.
    let mut pool_release_threshold = None;
    let peak_meter = if ctx.has_async_alloc() {
        // Freed blocks stay in the pool (as PyTorch's caching allocator keeps them), so the
        // trim after each window measures what the pool cached; with the default 0 they would
        // go back at every synchronisation and the trim would read nothing.
        // `MEMFIT_CUDA_POOL_RELEASE=0` keeps CUDA's default instead (the smoke stage of the GPU
        // call measures both).
        let threshold = crate::device::pool_release_threshold(
            std::env::var(crate::device::POOL_RELEASE_VAR)
                .ok()
                .as_deref(),
        )?;
        CudaPool::new(ctx.clone())?.set_release_threshold(threshold)?;
        pool_release_threshold = Some(threshold);
        // First, so read last: the trim comes after every other figure of the window.
        if trim {
            let trim = super::trim::TrimMeter::new(CudaPool::new(ctx.clone())?);
            meters.insert(0, Box::new(trim));
        }
        meters.push(Box::new(MemInfoMeter::new(ctx.clone())));
        // `memfit run --timeline`: the pool's bytes in use, sampled while each window is open.
        if sample_pool {
            meters.push(Box::new(super::pool_timeline::PoolSampling::new(
                CudaPool::new(ctx.clone())?,
            )));
        }
        meters.push(Box::new(super::pool::PoolMeter::new(CudaPool::new(ctx)?)));
        "cuda-pool"
    } else {
        eprintln!(
            "warning: cuda:{ordinal}: the device has no memory pools (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 0): \
             peak_bytes falls back to sampled cuMemGetInfo (peak_meter cuda-meminfo-sampled)"
        );
        meters.push(Box::new(MemInfoMeter::new(ctx.clone())));
        meters.push(Box::new(MemInfoPeak::new(ctx)));
        "cuda-meminfo-sampled"
    };
    Ok(CudaSetup {
        meters,
        peak_meter,
        device_name,
        memory_bytes,
        context_bytes,
        driver_version,
        cuda_version,
        pool_release_threshold,
        nvml_missing,
    })
}
