//! The allocator layer on CUDA: the stream-ordered memory pool's watermarks.
//!
//! candle allocates CUDA tensors with `cuMemAllocAsync` from the device's default pool, whose
//! attributes give the exact tensor bytes: `USED_MEM_CURRENT` (bytes handed out now),
//! `USED_MEM_HIGH` (their high-water mark), `RESERVED_MEM_HIGH` (the pool's own reservation from
//! the device, rounded to its granularity). Writing 0 to a `*_HIGH` attribute resets it to the
//! current value. [`PoolMeter`] resets both marks when a window opens, takes `USED_MEM_CURRENT`
//! as the baseline and reports `peak_bytes = USED_MEM_HIGH − baseline`,
//! `retained_bytes = USED_MEM_CURRENT(after) − baseline` and `reserved_peak_bytes =
//! RESERVED_MEM_HIGH`. The source is a trait so the logic is tested without a GPU.

use super::{Meter, Reading};

/// What the pool meter reads; `sync` must wait for all queued work on the device.
pub trait PoolSource {
    fn sync(&mut self) -> anyhow::Result<()>;
    fn used_current(&mut self) -> anyhow::Result<u64>;
    fn used_high(&mut self) -> anyhow::Result<u64>;
    fn reserved_high(&mut self) -> anyhow::Result<u64>;
    /// Resets `USED_MEM_HIGH` and `RESERVED_MEM_HIGH` to the current values.
    fn reset_highs(&mut self) -> anyhow::Result<()>;
    /// Makes the source usable from the calling thread (CUDA: binds its context), for a
    /// sampler on its own thread ([`super::pool_timeline`]).
    fn bind(&mut self) -> anyhow::Result<()> {
        Ok(())
    }
}

/// The pool's watermark around a window.
#[derive(Debug)]
pub struct PoolMeter<S> {
    source: S,
    baseline: u64,
}

impl<S: PoolSource> PoolMeter<S> {
    pub fn new(source: S) -> Self {
        Self {
            source,
            baseline: 0,
        }
    }
}

impl<S: PoolSource> Meter for PoolMeter<S> {
    fn label(&self) -> &'static str {
        "cuda-pool"
    }

    fn start(&mut self) -> anyhow::Result<()> {
        self.source.sync()?;
        self.source.reset_highs()?;
        self.baseline = self.source.used_current()?;
        Ok(())
    }

    fn read(&mut self, into: &mut Reading) -> anyhow::Result<()> {
        self.source.sync()?;
        let high = self.source.used_high()?;
        let now = self.source.used_current()?;
        into.peak_bytes = Some(high.saturating_sub(self.baseline));
        into.retained_bytes = Some(now as i64 - self.baseline as i64);
        into.reserved_peak_bytes = Some(self.source.reserved_high()?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool that follows the CUDA semantics: allocations move `current` and the marks;
    /// a reset sets each mark to its current value.
    #[derive(Default)]
    struct FakePool {
        current: u64,
        high: u64,
        reserved: u64,
        reserved_high: u64,
        syncs: u32,
    }

    impl FakePool {
        fn alloc(&mut self, b: u64) {
            self.current += b;
            self.high = self.high.max(self.current);
            self.reserved = self
                .reserved
                .max(self.current.div_ceil(2 << 20) * (2 << 20));
            self.reserved_high = self.reserved_high.max(self.reserved);
        }
        fn free(&mut self, b: u64) {
            self.current -= b;
        }
    }

    impl PoolSource for &mut FakePool {
        fn sync(&mut self) -> anyhow::Result<()> {
            self.syncs += 1;
            Ok(())
        }
        fn used_current(&mut self) -> anyhow::Result<u64> {
            Ok(self.current)
        }
        fn used_high(&mut self) -> anyhow::Result<u64> {
            Ok(self.high)
        }
        fn reserved_high(&mut self) -> anyhow::Result<u64> {
            Ok(self.reserved_high)
        }
        fn reset_highs(&mut self) -> anyhow::Result<()> {
            self.high = self.current;
            self.reserved_high = self.reserved;
            Ok(())
        }
    }

    #[test]
    fn peak_is_above_the_baseline_and_earlier_peaks_are_forgotten() {
        let mut pool = FakePool::default();
        pool.alloc(10_000_000); // weights
        pool.alloc(50_000_000); // an earlier phase's peak …
        pool.free(50_000_000); // … gone before the window
        let mut m = PoolMeter::new(&mut pool);
        m.start().unwrap();
        let mut r = Reading::default();
        {
            let p = &mut m.source;
            p.alloc(3_000_000);
            p.alloc(1_000_000);
            p.free(3_000_000);
        }
        m.read(&mut r).unwrap();
        assert_eq!(r.peak_bytes, Some(4_000_000));
        assert_eq!(r.retained_bytes, Some(1_000_000));
        // The pool keeps the 60 MB (29 granules of 2 MiB) it reserved for the earlier phase.
        assert_eq!(r.reserved_peak_bytes, Some(29 * (2 << 20)));
        assert_eq!(pool.syncs, 2, "synchronized before each reading");
    }

    #[test]
    fn freeing_more_than_was_allocated_gives_negative_retained() {
        let mut pool = FakePool::default();
        pool.alloc(8_000);
        let mut m = PoolMeter::new(&mut pool);
        m.start().unwrap();
        m.source.free(8_000);
        let mut r = Reading::default();
        m.read(&mut r).unwrap();
        assert_eq!(r.peak_bytes, Some(0));
        assert_eq!(r.retained_bytes, Some(-8_000));
    }
}
