//! `memfit probe matmul`: one bare `(n × n) · (n × n)` product in a window of the device's
//! meters, to tell what a matmul allocates beyond its output. A memory formula counts the
//! output; anything else the window's peak shows is the library's scratch:
//! - on the CPU, `gemm`'s packing buffer, which the formulas model (`formula::gemm`): the probe
//!   prints the modelled bytes beside the measured ones (f32; f16 packs in f32 too);
//! - on CUDA, cuBLAS's workspace when it comes from the device's memory pool (cuBLAS ≥ 12.2
//!   allocates it with `cudaMallocAsync` unless a workspace is set). memfit sets a fixed
//!   workspace outside the pool before any window (`device::CUBLAS_WORKSPACE_BYTES`, recorded in
//!   the run's meta), so the probe should read 0 bytes beyond the output there; the first GPU
//!   call (`scripts/gpu-run.sh`) says whether it does.
//!
//! The operands are made, a small product run on every pool thread (each thread's gemm packing
//! slab) and one product run (and synchronised) before the window, so the handles, the kernels
//! and any lazily made workspace exist already; the window holds one
//! product and keeps its output alive until the meters are read.

use anyhow::Context;

use crate::cli::ProbeArgs;
use crate::device::{DeviceSpec, ElemType};
use crate::error::UserError;

/// What one probe measured.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MatmulProbe {
    pub device: String,
    pub dtype: String,
    pub n: usize,
    pub threads: usize,
    pub peak_meter: String,
    /// The window's peak above what was allocated when it opened.
    pub peak_bytes: Option<u64>,
    /// `n² · e`: the product's output.
    pub output_bytes: u64,
    /// `peak_bytes − output_bytes`: the library's scratch.
    pub beyond_output_bytes: Option<i64>,
    /// The CPU's modelled `gemm` packing buffer (`None` on CUDA).
    pub predicted_scratch_bytes: Option<u64>,
}

/// Runs the probe; `threads` is already pinned.
pub fn matmul(
    device: DeviceSpec,
    dtype: ElemType,
    n: usize,
    threads: usize,
) -> anyhow::Result<MatmulProbe> {
    let mut meta = crate::machine::base_meta(String::new(), threads, "probe");
    let (mut meters, label) = crate::sweep::child::open_meters(device, true, false, &mut meta)?;
    let dev = device.candle().context("opening the device")?;
    let make = || -> anyhow::Result<candle_core::Tensor> {
        Ok(candle_core::Tensor::randn(0f32, 1.0, (n, n), &dev)?.to_dtype(dtype.candle())?)
    };
    let (a, b) = (make()?, make()?);
    // Every pool thread's packing slab made before the window, as a case's warm-up does.
    crate::phase::runner::warm_pool_threads(&dev)?;
    drop(a.matmul(&b)?);
    dev.synchronize()?;
    let (c, reading) = crate::meter::measure(&mut meters, || {
        let c = a.matmul(&b)?;
        dev.synchronize()?;
        Ok(c)
    })?;
    drop(c);
    let output_bytes = (n * n) as u64 * dtype.size();
    let predicted_scratch_bytes = matches!(device, DeviceSpec::Cpu).then(|| {
        let s = (1, n);
        match dtype {
            ElemType::F32 => crate::formula::gemm::scratch_bytes(n, n, n, s, s, threads),
            _ => crate::formula::gemm::scratch_bytes_f16(n, n, n, s, s, threads),
        }
    });
    Ok(MatmulProbe {
        device: device.to_string(),
        dtype: dtype.as_str().into(),
        n,
        threads,
        peak_meter: label.into(),
        peak_bytes: reading.peak_bytes,
        output_bytes,
        beyond_output_bytes: reading.peak_bytes.map(|p| p as i64 - output_bytes as i64),
        predicted_scratch_bytes,
    })
}

/// A probe's `--device` and `--dtype` flags, checked.
pub(crate) fn device_and_dtype(
    device: &str,
    dtype: &str,
) -> anyhow::Result<(DeviceSpec, ElemType)> {
    let device = DeviceSpec::from_flag(device)?;
    let parsed = ElemType::parse(dtype).ok_or_else(|| UserError::OutOfRange {
        origin: "flags".into(),
        key: "dtype".into(),
        value: dtype.into(),
        reason: "unknown element type".into(),
        allowed: ElemType::NAMES.into(),
    })?;
    Ok((device, parsed))
}

/// `--threads` (default: all cores), pinned for candle's CPU backend.
pub(crate) fn pinned_threads(threads: Option<usize>) -> anyhow::Result<usize> {
    let threads =
        threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    crate::machine::pin_threads(threads)?;
    Ok(threads)
}

pub fn probe(args: &ProbeArgs) -> anyhow::Result<()> {
    let (device, dtype) = device_and_dtype(&args.device, &args.dtype)?;
    if !(1..=16384).contains(&args.n) {
        return Err(UserError::OutOfRange {
            origin: "flags".into(),
            key: "n".into(),
            value: args.n.to_string(),
            reason: "the probe's square operands".into(),
            allowed: "1..=16384".into(),
        }
        .into());
    }
    let threads = pinned_threads(args.threads)?;
    let p = matmul(device, dtype, args.n, threads)?;
    if args.json {
        println!("{}", serde_json::to_string(&p)?);
    } else {
        let b = |v: Option<u64>| v.map_or("—".to_string(), |v| format!("{v} B"));
        println!(
            "matmul {n}×{n}·{n}×{n} {} on {} ({} thread(s)), {}: peak {}, output {} B, beyond the output {}{}",
            p.dtype,
            p.device,
            p.threads,
            p.peak_meter,
            b(p.peak_bytes),
            p.output_bytes,
            p.beyond_output_bytes
                .map_or("—".to_string(), |v| format!("{v} B")),
            p.predicted_scratch_bytes.map_or(String::new(), |v| format!(
                " (gemm's packing buffer, modelled: {v} B)"
            )),
            n = p.n
        );
    }
    Ok(())
}
