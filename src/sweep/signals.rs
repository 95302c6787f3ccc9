//! SIGINT / SIGTERM during a sweep: the first asks `memfit run` to stop after the running case,
//! a second one kills that case's process (its rows say `crashed`). SIGXFSZ is ignored, so a
//! file-size limit (`ulimit -f`) makes a write fail with an error the sweep reports instead of
//! killing it in the middle of a line.

use std::sync::atomic::{AtomicUsize, Ordering};

static COUNT: AtomicUsize = AtomicUsize::new(0);

/// Installs the handlers (once per process; later calls do nothing).
pub fn install() -> anyhow::Result<()> {
    static DONE: std::sync::Once = std::sync::Once::new();
    let mut result = Ok(());
    DONE.call_once(|| {
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            // SAFETY: the handler only increments an atomic, which is async-signal-safe.
            let r = unsafe {
                signal_hook::low_level::register(sig, || {
                    COUNT.fetch_add(1, Ordering::SeqCst);
                })
            };
            if let Err(e) = r {
                result = Err(anyhow::anyhow!(
                    "installing the handler of signal {sig}: {e}"
                ));
            }
        }
        // SAFETY: setting a signal's disposition to "ignore" has no other effect.
        unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    });
    result
}

/// SIGINT and SIGTERM received so far.
pub fn count() -> usize {
    COUNT.load(Ordering::SeqCst)
}
