//! The trim meter: what the allocator under candle gives back when asked, right after a window.
//!
//! When a phase's window closes, the tensors it made and did not keep have been freed, but the
//! allocator may still hold their memory for reuse: glibc's malloc keeps freed chunks in its
//! arenas (the process's RSS stays up), the CUDA stream-ordered pool keeps freed blocks reserved
//! from the device. [`TrimMeter`] reads what the layer holds, asks it to give back everything
//! unused — `malloc_trim(0)` on the CPU, `cuMemPoolTrimTo(pool, 0)` on CUDA (candle's
//! equivalent of `torch.cuda.empty_cache()`) — and reads again. Beside the two it reads the
//! bytes the tensor allocator counts as live at that moment (the counting allocator on the CPU,
//! the pool's `USED_MEM_CURRENT` on CUDA): `before − live` is what the layer held beyond the
//! live tensors, `before − after` what the trim returned.
//!
//! The meter does nothing when the window opens and trims when it is read. It is the first
//! meter of a list (started first, read last), so the trim's own time and any page it frees are
//! in no other meter's figures, and the window's figures are final before it runs. The host
//! meter trims the heap before every window anyway, so a trim after the window changes nothing
//! the next one measures on the CPU. The source is a trait so the logic is tested without a GPU.

use super::{Meter, Reading};

/// The layer a [`TrimMeter`] reads and trims.
pub trait TrimSource {
    /// Written as the rows' `trim_layer`: `rss` or `cuda-pool-reserved`.
    fn layer(&self) -> &'static str;
    /// Bytes the layer holds now (the process's RSS, the pool's reservation); `None` when the
    /// platform cannot say (then no trim figure is recorded).
    fn held(&mut self) -> anyhow::Result<Option<u64>>;
    /// Bytes of live allocations the tensor allocator counts now.
    fn live(&mut self) -> anyhow::Result<u64>;
    /// Gives back every unused byte the layer can.
    fn trim(&mut self) -> anyhow::Result<()>;
}

/// Trims its layer after each window and records what the layer held before and after.
#[derive(Debug)]
pub struct TrimMeter<S> {
    source: S,
}

impl<S: TrimSource> TrimMeter<S> {
    pub fn new(source: S) -> Self {
        Self { source }
    }
}

impl<S: TrimSource> Meter for TrimMeter<S> {
    fn label(&self) -> &'static str {
        "trim"
    }

    fn start(&mut self) -> anyhow::Result<()> {
        Ok(())
    }

    fn read(&mut self, into: &mut Reading) -> anyhow::Result<()> {
        let live = self.source.live()?;
        let Some(before) = self.source.held()? else {
            return Ok(());
        };
        self.source.trim()?;
        let after = self.source.held()?;
        into.trim_layer = Some(self.source.layer());
        into.trim_before_bytes = Some(before);
        into.trim_after_bytes = after;
        into.trim_live_bytes = Some(live);
        Ok(())
    }
}

/// The CPU's heap: the process's resident set (`/proc/self/statm`) around `malloc_trim(0)`,
/// the counting allocator's live bytes.
#[derive(Debug, Default)]
pub struct HeapTrim;

/// Resident bytes of this process: `/proc/self/statm`'s second field (pages) × the page size.
/// Read into a stack buffer, so the reading itself allocates nothing on the heap it measures.
pub fn resident_bytes() -> Option<u64> {
    use std::io::Read;
    let mut buf = [0u8; 256];
    let mut f = std::fs::File::open("/proc/self/statm").ok()?;
    let n = f.read(&mut buf).ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    let pages: u64 = text.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    (page > 0).then(|| pages * page as u64)
}

impl TrimSource for HeapTrim {
    fn layer(&self) -> &'static str {
        "rss"
    }
    fn held(&mut self) -> anyhow::Result<Option<u64>> {
        Ok(resident_bytes())
    }
    fn live(&mut self) -> anyhow::Result<u64> {
        Ok(super::cpu_alloc::current())
    }
    fn trim(&mut self) -> anyhow::Result<()> {
        // SAFETY: malloc_trim only releases free heap memory.
        #[cfg(target_os = "linux")]
        unsafe {
            libc::malloc_trim(0);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An allocator that keeps freed bytes until trimmed, as glibc's arenas and the CUDA pool
    /// do: `held` = live + cached, a trim drops what is cached down to `keep`.
    struct Caching {
        live: u64,
        cached: u64,
        keep: u64,
        readable: bool,
        trims: u32,
    }

    impl TrimSource for &mut Caching {
        fn layer(&self) -> &'static str {
            "test-layer"
        }
        fn held(&mut self) -> anyhow::Result<Option<u64>> {
            Ok(self.readable.then_some(self.live + self.cached))
        }
        fn live(&mut self) -> anyhow::Result<u64> {
            Ok(self.live)
        }
        fn trim(&mut self) -> anyhow::Result<()> {
            self.trims += 1;
            self.cached = self.cached.min(self.keep);
            Ok(())
        }
    }

    #[test]
    fn records_held_before_and_after_the_trim_and_the_live_bytes() {
        let mut a = Caching {
            live: 10_000,
            cached: 7_000,
            keep: 1_000,
            readable: true,
            trims: 0,
        };
        let mut m = TrimMeter::new(&mut a);
        m.start().unwrap();
        let mut r = Reading::default();
        m.read(&mut r).unwrap();
        assert_eq!(r.trim_layer, Some("test-layer"));
        assert_eq!(r.trim_before_bytes, Some(17_000));
        assert_eq!(r.trim_after_bytes, Some(11_000));
        assert_eq!(r.trim_live_bytes, Some(10_000));
        assert_eq!(a.trims, 1, "trimmed once, when read");
    }

    #[test]
    fn an_unreadable_layer_records_nothing_and_trims_nothing() {
        let mut a = Caching {
            live: 10,
            cached: 5,
            keep: 0,
            readable: false,
            trims: 0,
        };
        let mut r = Reading::default();
        TrimMeter::new(&mut a).read(&mut r).unwrap();
        assert_eq!(r.trim_layer, None);
        assert_eq!((r.trim_before_bytes, r.trim_after_bytes), (None, None));
        assert_eq!(r.trim_live_bytes, None);
        assert_eq!(a.trims, 0);
    }

    /// The real heap: statm's resident pages agree with `VmRSS` (other tests run beside this
    /// one, so within a margin), and a trim after freeing 64 MiB records the `rss` layer.
    #[test]
    fn the_heap_layer_reads_the_resident_set() {
        let (Some(statm), Some(status)) = (resident_bytes(), crate::meter::rusage::vm_rss_bytes())
        else {
            panic!("/proc/self/statm or /proc/self/status unreadable (memfit measures on Linux)");
        };
        let margin = (status / 4).max(64 << 20);
        assert!(
            statm.abs_diff(status) <= margin,
            "statm {statm} vs VmRSS {status}"
        );
        let chunks: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8 + 1; 1 << 20]).collect();
        drop(chunks);
        let mut r = Reading::default();
        TrimMeter::new(HeapTrim).read(&mut r).unwrap();
        assert_eq!(r.trim_layer, Some("rss"));
        assert!(r.trim_before_bytes.is_some() && r.trim_after_bytes.is_some());
        assert!(r.trim_live_bytes.unwrap() > 0);
    }
}
