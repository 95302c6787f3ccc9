//! The measured memory timeline on CUDA (`memfit run --timeline` on a GPU): the pool's bytes in
//! use, sampled from a thread while a window is open.
//!
//! The CPU's timeline is event for event (the counting allocator sees every allocation); CUDA's
//! stream-ordered pool gives watermarks, not events: `USED_MEM_CURRENT` (bytes handed out now,
//! moved when the host calls `cuMemAllocAsync`/`cuMemFreeAsync`, in program order) and
//! `USED_MEM_HIGH`. So [`PoolSampling`] reads `USED_MEM_CURRENT` every [`SAMPLE_PERIOD`] from its
//! own thread, above the window's start; a spike shorter than the period can fall between two
//! samples, so the sampled maximum is at most the row's `peak_bytes` (the pool's high-water
//! mark, exact), which the trace marks beside it. No category is known (the pool sees sizes,
//! not tensors): one counter, `pool (sampled)`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::pool::PoolSource;
use super::{Meter, Reading};

/// How often the thread reads the pool (the driver call takes about a microsecond).
pub const SAMPLE_PERIOD: Duration = Duration::from_micros(20);
/// Samples a window keeps at most (the rest are counted, not kept).
pub const MAX_SAMPLES: usize = 1 << 20;

/// One window's samples: `(µs since the window opened, bytes in use above its start)`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampled {
    pub baseline_bytes: u64,
    pub samples: Vec<(u64, u64)>,
    /// Samples taken beyond [`MAX_SAMPLES`] (not kept).
    pub dropped: u64,
}

static LAST: Mutex<Option<Sampled>> = Mutex::new(None);

/// The samples of the last window read, once.
pub fn take() -> Option<Sampled> {
    LAST.lock().ok()?.take()
}

/// A running sampler: its stop flag and its thread, which gives the source back with the
/// samples.
type Running<S> = (Arc<AtomicBool>, JoinHandle<(S, Sampled)>);

/// A meter that samples a pool while each window is open and leaves the samples for [`take`].
pub struct PoolSampling<S: PoolSource + Send + 'static> {
    source: Option<S>,
    running: Option<Running<S>>,
}

impl<S: PoolSource + Send + 'static> PoolSampling<S> {
    pub fn new(source: S) -> Self {
        Self {
            source: Some(source),
            running: None,
        }
    }
}

impl<S: PoolSource + Send + 'static> Meter for PoolSampling<S> {
    fn label(&self) -> &'static str {
        "cuda-pool-timeline"
    }

    fn start(&mut self) -> anyhow::Result<()> {
        let mut source = self
            .source
            .take()
            .ok_or_else(|| anyhow::anyhow!("the pool sampler is already running"))?;
        source.sync()?;
        let baseline = source.used_current()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let t0 = Instant::now();
            let mut out = Sampled {
                baseline_bytes: baseline,
                ..Sampled::default()
            };
            let bound = source.bind().is_ok();
            let mut last = None;
            while bound && !flag.load(Ordering::Relaxed) {
                if let Ok(now) = source.used_current() {
                    let above = now.saturating_sub(baseline);
                    // Only changes are kept: a flat stretch is one sample.
                    if last != Some(above) {
                        if out.samples.len() < MAX_SAMPLES {
                            out.samples.push((t0.elapsed().as_micros() as u64, above));
                        } else {
                            out.dropped += 1;
                        }
                        last = Some(above);
                    }
                }
                std::thread::sleep(SAMPLE_PERIOD);
            }
            (source, out)
        });
        self.running = Some((stop, handle));
        Ok(())
    }

    fn read(&mut self, _into: &mut Reading) -> anyhow::Result<()> {
        let Some((stop, handle)) = self.running.take() else {
            return Ok(());
        };
        stop.store(true, Ordering::Relaxed);
        let (mut source, mut out) = handle
            .join()
            .map_err(|_| anyhow::anyhow!("the pool sampler thread panicked"))?;
        // The level the window closed at, after the device finished its work.
        source.sync()?;
        let end = source.used_current()?.saturating_sub(out.baseline_bytes);
        let t = out.samples.last().map_or(0, |s| s.0 + 1);
        out.samples.push((t, end));
        self.source = Some(source);
        if let Ok(mut last) = LAST.lock() {
            *last = Some(out);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// A pool whose bytes in use another thread moves.
    #[derive(Clone, Default)]
    struct SharedPool(Arc<AtomicU64>);

    impl PoolSource for SharedPool {
        fn sync(&mut self) -> anyhow::Result<()> {
            Ok(())
        }
        fn used_current(&mut self) -> anyhow::Result<u64> {
            Ok(self.0.load(Ordering::Relaxed))
        }
        fn used_high(&mut self) -> anyhow::Result<u64> {
            Ok(0)
        }
        fn reserved_high(&mut self) -> anyhow::Result<u64> {
            Ok(0)
        }
        fn reset_highs(&mut self) -> anyhow::Result<()> {
            Ok(())
        }
    }

    /// The samples are above the window's start, in time order, every level held for a few
    /// periods is seen, none is above the highest level set, and the window's last level
    /// closes the list.
    #[test]
    fn samples_follow_the_pool_above_the_window_start() {
        let pool = SharedPool::default();
        pool.0.store(1_000, Ordering::Relaxed); // weights, before the window
        let mut m = PoolSampling::new(pool.clone());
        m.start().unwrap();
        for level in [5_000u64, 9_000, 3_000, 1_500] {
            pool.0.store(level, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(20));
        }
        m.read(&mut Reading::default()).unwrap();
        let s = take().unwrap();
        assert_eq!(s.baseline_bytes, 1_000);
        let levels: Vec<u64> = s.samples.iter().map(|x| x.1).collect();
        for want in [4_000, 8_000, 2_000, 500] {
            assert!(levels.contains(&want), "{want} in {levels:?}");
        }
        assert!(levels.iter().all(|&b| b <= 8_000));
        assert!(s.samples.windows(2).all(|w| w[0].0 <= w[1].0));
        assert_eq!(*levels.last().unwrap(), 500);
        assert!(take().is_none(), "taken once");
        // The meter can open the next window.
        m.start().unwrap();
        m.read(&mut Reading::default()).unwrap();
        assert!(take().is_some());
    }
}
