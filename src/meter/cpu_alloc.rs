//! A counting global allocator: the device meter of the CPU backend.
//!
//! candle's CPU tensors are `Vec`s, so every tensor byte passes through Rust's global allocator.
//! [`CountingAlloc`] forwards to the system allocator and keeps three atomics: bytes currently
//! allocated, their high-water mark since the last [`reset_peak`], and the number of
//! allocations. Counted are the *requested* sizes (`Layout::size`), not the allocator's rounding.
//! The bookkeeping is three atomic operations and allocates nothing itself, so it is never
//! counted and cannot recurse. Because the counters are process-wide, a window measures every
//! thread of the process: keep other work out of it (and, in tests, one measuring test per
//! process). An optional budget ([`set_budget`], `memfit run --mem-budget`) makes allocations
//! beyond it fail, which is how the CPU emulates a device of a given size.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};

use super::{Meter, Reading};

static CURRENT: AtomicU64 = AtomicU64::new(0);
/// Allocations that would take [`CURRENT`] above this fail (`--mem-budget`); `u64::MAX`: none.
static BUDGET: AtomicU64 = AtomicU64::new(u64::MAX);
static PEAK: AtomicU64 = AtomicU64::new(0);
static COUNT: AtomicU64 = AtomicU64::new(0);

/// Events a traced window keeps ([`start_events`]): each change of the counted bytes as the
/// allocation's address and ±bytes, in static arrays (16 MiB of zero pages, touched only while
/// tracing), so recording allocates nothing on the heap the meter counts.
pub const EVENTS: usize = 1 << 20;
static EVENT_ON: AtomicBool = AtomicBool::new(false);
static EVENT_LEN: AtomicUsize = AtomicUsize::new(0);
static EVENT_PTR: [AtomicU64; EVENTS] = [const { AtomicU64::new(0) }; EVENTS];
static EVENT_DELTA: [AtomicI64; EVENTS] = [const { AtomicI64::new(0) }; EVENTS];
/// The event index at which each stage began ([`mark`]; `usize::MAX`: not reached).
static MARKS: [AtomicUsize; STAGES.len()] = [const { AtomicUsize::new(usize::MAX) }; STAGES.len()];

/// The stages a traced train step marks, in order.
pub const STAGES: [&str; 3] = ["forward", "backward", "optimizer"];

#[inline]
fn record(ptr: *mut u8, delta: i64) {
    if EVENT_ON.load(Relaxed) {
        let i = EVENT_LEN.fetch_add(1, Relaxed);
        if i < EVENTS {
            EVENT_PTR[i].store(ptr as u64, Relaxed);
            EVENT_DELTA[i].store(delta, Relaxed);
        }
    }
}

/// Starts recording every change of the counted bytes (a window's timeline).
pub fn start_events() {
    EVENT_LEN.store(0, Relaxed);
    for m in &MARKS {
        m.store(usize::MAX, Relaxed);
    }
    EVENT_ON.store(true, Relaxed);
}

/// Notes that stage `STAGES[i]` begins now (nothing when not recording).
pub fn mark(i: usize) {
    if EVENT_ON.load(Relaxed) {
        MARKS[i].store(EVENT_LEN.load(Relaxed), Relaxed);
    }
}

/// Stops recording (allocates nothing: call it inside the window, [`take_events`] after).
pub fn stop_events() {
    EVENT_ON.store(false, Relaxed);
}

/// A traced window: the events `(address, ±bytes)` and each of [`STAGES`]' first event index.
pub type Events = (Vec<(u64, i64)>, [Option<usize>; STAGES.len()]);

/// The recorded [`Events`], or how many events there were when more than [`EVENTS`].
pub fn take_events() -> Result<Events, usize> {
    stop_events();
    let n = EVENT_LEN.load(Relaxed);
    if n > EVENTS {
        return Err(n);
    }
    let events = (0..n)
        .map(|i| (EVENT_PTR[i].load(Relaxed), EVENT_DELTA[i].load(Relaxed)))
        .collect();
    let marks = std::array::from_fn(|i| {
        let m = MARKS[i].load(Relaxed);
        (m != usize::MAX).then_some(m)
    });
    Ok((events, marks))
}

/// The allocator. memfit's library installs it as the `#[global_allocator]`.
pub struct CountingAlloc;

#[inline]
fn grow(bytes: u64) {
    let now = CURRENT.fetch_add(bytes, Relaxed) + bytes;
    PEAK.fetch_max(now, Relaxed);
    COUNT.fetch_add(1, Relaxed);
}

/// True when `bytes` more would exceed the budget (checked before the system allocates).
#[inline]
fn over_budget(bytes: u64) -> bool {
    let budget = BUDGET.load(Relaxed);
    budget != u64::MAX && CURRENT.load(Relaxed).saturating_add(bytes) > budget
}

#[inline]
fn shrink(bytes: u64) {
    CURRENT.fetch_sub(bytes, Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged and only
// updates counters after a successful call.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if over_budget(layout.size() as u64) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grow(layout.size() as u64);
            record(p, layout.size() as i64);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if over_budget(layout.size() as u64) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grow(layout.size() as u64);
            record(p, layout.size() as i64);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        shrink(layout.size() as u64);
        record(ptr, -(layout.size() as i64));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() && over_budget((new_size - layout.size()) as u64) {
            return std::ptr::null_mut();
        }
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            let old = layout.size() as u64;
            let new = new_size as u64;
            if new >= old {
                grow(new - old);
            } else {
                shrink(old - new);
            }
            // The old block's end and the new one's start (they may differ in address).
            record(ptr, -(old as i64));
            record(p, new as i64);
        }
        p
    }
}

/// The counting allocator is the process's allocator, except in the `unmetered` build (the
/// meter-overhead benchmark), which keeps Rust's default (the system allocator, no bookkeeping).
#[cfg(not(feature = "unmetered"))]
#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

/// True in the `unmetered` build: no counting allocator, no memory meters.
pub const UNMETERED: bool = cfg!(feature = "unmetered");

/// Makes every allocation that would take the process's heap above `bytes` fail (the process
/// then aborts with "memory allocation failed": run budget trials in a child process).
pub fn set_budget(bytes: u64) {
    BUDGET.store(bytes, Relaxed);
}

/// Bytes allocated now.
pub fn current() -> u64 {
    CURRENT.load(Relaxed)
}

/// High-water mark of [`current`] since the last [`reset_peak`].
pub fn peak() -> u64 {
    PEAK.load(Relaxed)
}

/// Allocations (and growing reallocations) since the process started.
pub fn count() -> u64 {
    COUNT.load(Relaxed)
}

/// The high-water mark since the process started: [`peak`] folded with the marks that
/// [`reset_peak`] dropped (kept off the allocation path: updated only when a mark is reset or
/// read here).
pub fn process_peak() -> u64 {
    LIFETIME_PEAK.fetch_max(PEAK.load(Relaxed), Relaxed);
    LIFETIME_PEAK.load(Relaxed)
}

static LIFETIME_PEAK: AtomicU64 = AtomicU64::new(0);

/// `MEMFIT_ALLOC_TRACE=1`: the allocator meter prints its absolute figures to stderr after each
/// window (outside it).
fn trace_enabled() -> bool {
    std::env::var_os("MEMFIT_ALLOC_TRACE").is_some_and(|v| v == "1")
}

/// Sets the high-water mark to the current value and returns that value (the baseline).
pub fn reset_peak() -> u64 {
    LIFETIME_PEAK.fetch_max(PEAK.load(Relaxed), Relaxed);
    let now = CURRENT.load(Relaxed);
    PEAK.store(now, Relaxed);
    // An allocation racing with the store may have raised CURRENT; fold it in.
    PEAK.fetch_max(CURRENT.load(Relaxed), Relaxed);
    now
}

/// The CPU backend's device meter: `peak_bytes`, `retained_bytes`, `alloc_count`.
#[derive(Debug, Default)]
pub struct AllocMeter {
    baseline: u64,
    count0: u64,
}

impl Meter for AllocMeter {
    fn label(&self) -> &'static str {
        "cpu-allocator"
    }

    fn start(&mut self) -> anyhow::Result<()> {
        self.count0 = count();
        self.baseline = reset_peak();
        Ok(())
    }

    fn read(&mut self, into: &mut Reading) -> anyhow::Result<()> {
        let (peak, now, n) = (peak(), current(), count());
        into.peak_bytes = Some(peak.saturating_sub(self.baseline));
        into.retained_bytes = Some(now as i64 - self.baseline as i64);
        into.alloc_count = Some(n - self.count0);
        into.heap_start_bytes = Some(self.baseline);
        if trace_enabled() {
            // After the window: for comparing with heap profilers (scripts/bench-profilers.sh),
            // the window's absolute figures and the process's peak so far.
            eprintln!(
                "memfit-alloc-trace baseline_bytes={} window_peak_bytes={} abs_peak_bytes={} \
                 process_peak_bytes={} current_bytes={now}",
                self.baseline,
                peak - self.baseline,
                peak,
                process_peak(),
            );
        }
        Ok(())
    }
}
