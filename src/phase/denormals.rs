//! Flush-to-zero and denormals-are-zero for the CPU backend's threads (`--flush-denormals on`).
//!
//! Subnormal floats (magnitudes below 2⁻¹²⁶ in f32) take a slow microcode path on x86: SmolLM2's
//! backward was measured 9× slower from them (BENCHMARKS.md § 4). PyTorch offers the same switch
//! (`torch.set_flush_denormal`). It changes results — subnormal inputs and outputs become 0 —
//! but no memory figure, and the backward it speeds up is what bounds a sweep's time, so it is
//! on by default (`--flush-denormals off` keeps IEEE subnormals) and recorded in every row
//! (`flush_denormals`).
//!
//! The setting is per thread (x86-64: MXCSR bits FTZ 15 and DAZ 6; aarch64: FPCR bit FZ 24), so
//! it is set on the calling thread and on every thread of rayon's pool, which runs candle's
//! element-wise ops and gemm. It applies to host computation only; GPU kernels are unaffected.

use anyhow::{Result, bail};

/// Sets flush-to-zero (and denormals-are-zero where the CPU has it) on the calling thread.
pub fn set_this_thread() -> Result<()> {
    #[cfg(target_arch = "x86_64")]
    {
        let mut csr: u32 = 0;
        // SAFETY: stmxcsr/ldmxcsr read and write the thread's SSE control register only.
        unsafe {
            std::arch::asm!("stmxcsr [{}]", in(reg) &mut csr, options(nostack));
            csr |= (1 << 15) | (1 << 6);
            std::arch::asm!("ldmxcsr [{}]", in(reg) &csr, options(nostack));
        }
        Ok(())
    }
    #[cfg(target_arch = "aarch64")]
    {
        // SAFETY: reads and writes the thread's floating-point control register only.
        unsafe {
            let mut fpcr: u64;
            std::arch::asm!("mrs {}, fpcr", out(reg) fpcr);
            fpcr |= 1 << 24;
            std::arch::asm!("msr fpcr, {}", in(reg) fpcr);
        }
        Ok(())
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        bail!(
            "--flush-denormals on (the default): not supported on this CPU architecture; run with \
             --flush-denormals off"
        )
    }
}

/// Whether the calling thread flushes subnormal results to zero (a multiplication whose exact
/// result is subnormal, computed at run time).
pub fn flushing() -> bool {
    let tiny = std::hint::black_box(f32::MIN_POSITIVE);
    let half = std::hint::black_box(0.5f32);
    tiny * half == 0.0
}

/// Sets the flags on the calling thread and on every thread of rayon's global pool, and checks
/// that each flushes.
pub fn set_all_threads() -> Result<()> {
    set_this_thread()?;
    let pool: Vec<Result<bool>> = rayon::broadcast(|_| set_this_thread().map(|()| flushing()));
    for (i, r) in pool.into_iter().enumerate() {
        if !r? {
            bail!(
                "--flush-denormals on (the default): rayon thread {i} still computes subnormals \
                 (an emulator such as valgrind ignores the flush-to-zero bits); run with \
                 --flush-denormals off"
            )
        }
    }
    if !flushing() {
        bail!(
            "--flush-denormals on (the default): the main thread still computes subnormals (an \
             emulator such as valgrind ignores the flush-to-zero bits); run with \
             --flush-denormals off"
        )
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh thread computes subnormals; after the call it flushes them (on its own thread,
    /// so no other test sees the flags).
    #[test]
    fn setting_the_flags_flushes_subnormals() {
        std::thread::spawn(|| {
            assert!(!flushing(), "a new thread should compute subnormals");
            set_this_thread().unwrap();
            assert!(flushing());
        })
        .join()
        .unwrap();
    }
}
