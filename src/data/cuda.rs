//! Host→device copy bandwidth of one batch (feature `cuda`), claim D6's `pin_memory`.
//!
//! The same `bytes` are copied into one device buffer `REPS` times from an ordinary heap
//! buffer (pageable: the driver stages it through its own pinned bounce buffer) and from a
//! page-locked buffer (`cuMemHostAlloc`, flags 0, as PyTorch's `pin_memory()`), after one
//! unmeasured copy each; the stream is synchronized before and after each timed series.
//! bandwidth = `REPS · bytes / seconds`.

use std::time::Instant;

use anyhow::Context;

/// Copies per timed series.
pub const REPS: usize = 20;

/// `(pinned, pageable)` host→device bytes per second for a buffer of `bytes` on `cuda:ordinal`.
pub fn h2d_bandwidth(ordinal: usize, bytes: usize) -> anyhow::Result<(f64, f64)> {
    let dev = candle_core::Device::new_cuda(ordinal).context("opening the device")?;
    let stream = dev.as_cuda_device()?.cuda_stream();
    let ctx = stream.context().clone();
    let n = (bytes / 4).max(1);
    let pageable: Vec<f32> = vec![0.5; n];
    // SAFETY: the buffer is filled before any read.
    let mut pinned = unsafe { ctx.alloc_pinned_with_flags::<f32>(n, 0) }
        .context("cuMemHostAlloc (pinned buffer)")?;
    pinned.as_mut_slice()?.fill(0.5);
    let mut dst = stream.alloc_zeros::<f32>(n).context("device buffer")?;
    let mut time = |pinned_src: bool| -> anyhow::Result<f64> {
        let copy = |dst: &mut _| -> anyhow::Result<()> {
            if pinned_src {
                stream.memcpy_htod(&pinned, dst)?;
            } else {
                stream.memcpy_htod(&pageable, dst)?;
            }
            Ok(())
        };
        copy(&mut dst)?;
        stream.synchronize()?;
        let t0 = Instant::now();
        for _ in 0..REPS {
            copy(&mut dst)?;
        }
        stream.synchronize()?;
        Ok((REPS * n * 4) as f64 / t0.elapsed().as_secs_f64())
    };
    let pinned_rate = time(true)?;
    let pageable_rate = time(false)?;
    Ok((pinned_rate, pageable_rate))
}
