//! Host meter: CPU seconds (`getrusage(RUSAGE_SELF)`, all threads), wall time, and the
//! resident-set high-water mark of the window.
//!
//! Peak RSS: before the window, `malloc_trim(0)` hands freed heap pages back to the kernel and
//! writing `5` to `/proc/self/clear_refs` resets `VmHWM` to the current RSS; after the window
//! `VmHWM` from `/proc/self/status` is the window's peak (absolute, whole process). Without the
//! trim, pages freed earlier are reused silently and the rise under-reads. If `clear_refs` cannot
//! be written (not Linux, no permission), `rss_peak_bytes` is `None`. In the `unmetered` build
//! (the overhead benchmark) only the clocks run: no trim, no reset, `rss_peak_bytes` `None`.
//! With `--trim off` ([`HostMeter::without_trim`]) the trim and the reset are skipped too, and
//! `rss_peak_bytes` is `None` (a high-water mark not reset before the window is not the
//! window's): the window then costs no page faults of a freshly trimmed heap (BENCHMARKS.md § 1).

use std::time::Instant;

use super::{Meter, Reading};

#[derive(Debug, Default)]
pub struct HostMeter {
    t0: Option<Instant>,
    user0: f64,
    sys0: f64,
    hwm_reset: bool,
    /// `--trim off`: no `malloc_trim`, no high-water-mark reset, no RSS peak.
    skip_trim: bool,
}

impl HostMeter {
    /// The host meter of `--trim off`: the clocks only, `rss_peak_bytes` missing.
    pub fn without_trim() -> Self {
        Self {
            skip_trim: true,
            ..Self::default()
        }
    }

    /// The host meter of a case: [`HostMeter::without_trim`] unless `trim`.
    pub fn for_case(trim: bool) -> Self {
        if trim {
            Self::default()
        } else {
            Self::without_trim()
        }
    }
}

/// User and system CPU seconds of this process so far (all threads).
pub fn cpu_times() -> (f64, f64) {
    // SAFETY: getrusage writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let s = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    (s(ru.ru_utime), s(ru.ru_stime))
}

/// `VmHWM` of this process in bytes, if `/proc` has it.
pub fn vm_hwm_bytes() -> Option<u64> {
    status_kib("VmHWM:").map(|k| k * 1024)
}

/// `VmRSS` of this process in bytes, if `/proc` has it.
pub fn vm_rss_bytes() -> Option<u64> {
    status_kib("VmRSS:").map(|k| k * 1024)
}

fn status_kib(key: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(key))?;
    line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

impl Meter for HostMeter {
    fn label(&self) -> &'static str {
        "host-rusage"
    }

    fn start(&mut self) -> anyhow::Result<()> {
        // The `unmetered` build keeps only the clocks: no trim, no high-water-mark reset.
        if !super::cpu_alloc::UNMETERED && !self.skip_trim {
            // SAFETY: malloc_trim only releases free heap memory.
            #[cfg(target_os = "linux")]
            unsafe {
                libc::malloc_trim(0);
            }
            self.hwm_reset = std::fs::write("/proc/self/clear_refs", "5").is_ok();
        }
        let (u, s) = cpu_times();
        self.user0 = u;
        self.sys0 = s;
        self.t0 = Some(Instant::now());
        Ok(())
    }

    fn read(&mut self, into: &mut Reading) -> anyhow::Result<()> {
        let wall = self.t0.map(|t| t.elapsed().as_secs_f64());
        let (u, s) = cpu_times();
        into.wall_s = wall;
        into.cpu_user_s = Some(u - self.user0);
        into.cpu_sys_s = Some(s - self.sys0);
        into.rss_peak_bytes = if self.hwm_reset { vm_hwm_bytes() } else { None };
        Ok(())
    }
}
