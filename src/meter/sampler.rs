//! The process layer on CUDA: a background thread samples NVML while a window is open.
//!
//! NVML's per-process memory (which includes the CUDA context, cuBLAS workspaces and loaded
//! kernels, not just tensors), GPU utilisation and power are snapshots, so a thread reads them
//! every [`Sampler::PERIOD`] (≥ 100 samples/s) and [`Stats`] keeps the peak memory, the mean
//! utilisation and the peak power. The source is a trait so the aggregation is tested without a
//! GPU; a source that fails is recorded as missing, never as zero.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{Meter, Reading};

/// One snapshot; each figure is `None` when the source could not read it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    pub process_bytes: Option<u64>,
    pub util_pct: Option<f64>,
    pub power_w: Option<f64>,
}

/// Something that can be sampled from a thread.
pub trait SampleSource: Send + 'static {
    fn sample(&mut self) -> Sample;
}

/// Aggregates of the samples of one window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub samples: u64,
    pub process_peak_bytes: Option<u64>,
    util_sum: f64,
    util_n: u64,
    pub power_peak_w: Option<f64>,
}

impl Stats {
    pub fn add(&mut self, s: Sample) {
        self.samples += 1;
        // A process with a CUDA context holds memory: 0 means the driver reported nothing for
        // it (some drivers list the pid with 0 bytes), a missing figure, not a measured 0.
        if let Some(b) = s.process_bytes.filter(|&b| b > 0) {
            self.process_peak_bytes = Some(self.process_peak_bytes.map_or(b, |p| p.max(b)));
        }
        if let Some(u) = s.util_pct {
            self.util_sum += u;
            self.util_n += 1;
        }
        if let Some(w) = s.power_w {
            self.power_peak_w = Some(self.power_peak_w.map_or(w, |p| p.max(w)));
        }
    }

    /// Mean utilisation over the samples that had one.
    pub fn util_mean_pct(&self) -> Option<f64> {
        (self.util_n > 0).then(|| self.util_sum / self.util_n as f64)
    }
}

/// Samples a source on a thread between `start` and `read`.
///
/// The thread takes the source's lock for one sample at a time (never across the sleep), and
/// a sampler is never left running: `start` stops a thread a failed window left behind, and
/// dropping the sampler stops its thread. A source that panics poisons nothing for the next
/// window (the lock's poison is cleared) and the window reports the panic.
pub struct Sampler<S: SampleSource> {
    source: Arc<Mutex<S>>,
    running: Option<(Arc<AtomicBool>, JoinHandle<Stats>)>,
}

impl<S: SampleSource> Sampler<S> {
    /// 200 samples per second.
    pub const PERIOD: Duration = Duration::from_millis(5);

    pub fn new(source: S) -> Self {
        Self {
            source: Arc::new(Mutex::new(source)),
            running: None,
        }
    }

    /// Stops the thread (if one runs) and returns its figures.
    fn stop(&mut self) -> Option<std::thread::Result<Stats>> {
        let (stop, handle) = self.running.take()?;
        stop.store(true, Ordering::Release);
        Some(handle.join())
    }
}

impl<S: SampleSource> Drop for Sampler<S> {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

impl<S: SampleSource> Meter for Sampler<S> {
    fn label(&self) -> &'static str {
        "nvml-process"
    }

    fn start(&mut self) -> anyhow::Result<()> {
        // A window that failed before `read` left its thread: it ends here.
        let _ = self.stop();
        self.source.clear_poison();
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, source) = (stop.clone(), self.source.clone());
        let handle = std::thread::Builder::new()
            .name("memfit-nvml".into())
            .spawn(move || {
                let mut stats = Stats::default();
                loop {
                    // Sample once more after the stop flag: the window's last state counts.
                    let last = flag.load(Ordering::Acquire);
                    let sample = source.lock().unwrap_or_else(|p| p.into_inner()).sample();
                    stats.add(sample);
                    if last {
                        return stats;
                    }
                    std::thread::sleep(Self::PERIOD);
                }
            })?;
        self.running = Some((stop, handle));
        Ok(())
    }

    fn read(&mut self, into: &mut Reading) -> anyhow::Result<()> {
        let stats = self
            .stop()
            .ok_or_else(|| anyhow::anyhow!("sampler read without start"))?
            .map_err(|_| anyhow::anyhow!("the NVML sampler thread panicked"))?;
        into.nvml_process_peak_bytes = stats.process_peak_bytes;
        into.gpu_util_mean_pct = stats.util_mean_pct();
        into.gpu_power_peak_w = stats.power_peak_w;
        into.nvml_samples_count = Some(stats.samples);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_keep_peaks_and_average_only_present_values() {
        let mut s = Stats::default();
        s.add(Sample {
            process_bytes: Some(500),
            util_pct: Some(20.0),
            power_w: Some(100.0),
        });
        s.add(Sample {
            process_bytes: Some(900),
            util_pct: None,
            power_w: Some(350.5),
        });
        s.add(Sample {
            process_bytes: Some(700),
            util_pct: Some(80.0),
            power_w: None,
        });
        assert_eq!(s.samples, 3);
        assert_eq!(s.process_peak_bytes, Some(900));
        assert_eq!(s.util_mean_pct(), Some(50.0));
        assert_eq!(s.power_peak_w, Some(350.5));
    }

    #[test]
    fn a_source_that_reads_nothing_gives_missing_not_zero() {
        let mut s = Stats::default();
        s.add(Sample::default());
        assert_eq!(s.process_peak_bytes, None);
        assert_eq!(s.util_mean_pct(), None);
        assert_eq!(s.power_peak_w, None);
        s.add(Sample {
            process_bytes: Some(0),
            ..Sample::default()
        });
        assert_eq!(
            s.process_peak_bytes, None,
            "a process figure of 0 is missing"
        );
    }

    /// A source whose memory ramps up: the sampler sees the ramp's top (sampled after stop).
    struct Ramp(u64);
    impl SampleSource for Ramp {
        fn sample(&mut self) -> Sample {
            self.0 += 1;
            Sample {
                process_bytes: Some(self.0 * 1000),
                util_pct: Some(100.0),
                power_w: None,
            }
        }
    }

    #[test]
    fn the_thread_samples_until_read() {
        let mut m = Sampler::new(Ramp(0));
        m.start().unwrap();
        std::thread::sleep(Duration::from_millis(30));
        let mut r = Reading::default();
        m.read(&mut r).unwrap();
        let n = r.nvml_samples_count.unwrap();
        assert!(n >= 2, "{n} samples");
        assert_eq!(r.nvml_process_peak_bytes, Some(n * 1000));
        assert_eq!(r.gpu_util_mean_pct, Some(100.0));
        assert_eq!(r.gpu_power_peak_w, None);
        assert!(
            m.read(&mut r).is_err(),
            "a second read without start is an error"
        );
    }

    /// Panics on its third sample, then works again.
    struct Flaky(u32);
    impl SampleSource for Flaky {
        fn sample(&mut self) -> Sample {
            self.0 += 1;
            if self.0 == 3 {
                panic!("the fake source fails");
            }
            Sample {
                process_bytes: Some(7),
                ..Sample::default()
            }
        }
    }

    /// A meter that always fails to read, standing in for any meter after the sampler.
    struct Broken;
    impl Meter for Broken {
        fn label(&self) -> &'static str {
            "broken"
        }
        fn start(&mut self) -> anyhow::Result<()> {
            Ok(())
        }
        fn read(&mut self, _: &mut Reading) -> anyhow::Result<()> {
            anyhow::bail!("broken meter")
        }
    }

    /// Runs `f` on a thread and fails the test if it does not end within 5 s (a hang).
    fn within_5s(f: impl FnOnce() + Send + 'static) {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            f();
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(5))
            .expect("the sampler hung");
    }

    #[test]
    fn a_failing_source_or_meter_never_leaves_a_thread_or_a_lock_behind() {
        within_5s(|| {
            // The source panics in the first window: that window fails, the next one works.
            let mut meters: Vec<Box<dyn Meter>> = vec![Box::new(Sampler::new(Flaky(0)))];
            let e = crate::meter::measure(&mut meters, || {
                std::thread::sleep(Duration::from_millis(40));
                Ok(())
            })
            .unwrap_err();
            assert!(format!("{e:#}").contains("panicked"), "{e:#}");
            let ((), r) = crate::meter::measure(&mut meters, || Ok(())).unwrap();
            assert_eq!(r.nvml_process_peak_bytes, Some(7));

            // A meter after the sampler fails to read: the sampler is still stopped, and
            // the next window's sampler does not wait on the old thread's lock.
            let mut meters: Vec<Box<dyn Meter>> =
                vec![Box::new(Sampler::new(Ramp(0))), Box::new(Broken)];
            for _ in 0..3 {
                assert!(crate::meter::measure(&mut meters, || Ok(())).is_err());
            }
            // A sampler started and never read (a window abandoned) is stopped by the next
            // start and when dropped.
            let mut s = Sampler::new(Ramp(0));
            s.start().unwrap();
            s.start().unwrap();
            let mut r = Reading::default();
            s.read(&mut r).unwrap();
            s.start().unwrap();
            drop(s);
        });
    }
}
