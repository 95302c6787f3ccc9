//! The host arena: memory a step keeps *off the device* on purpose — ZeRO-Offload's optimizer
//! partitions (`crate::ranks::offload`) — counted apart from the device's tensors.
//!
//! On a GPU the two layers are apart by construction: the device's tensors live in CUDA's pool
//! and the offloaded state in pinned host memory (`cudaHostAlloc`), which the pool never sees.
//! On the CPU every tensor goes through the counting allocator ([`super::cpu_alloc`], the
//! device layer of a CPU run), so the arena's buffers are taken from the system allocator
//! directly (`std::alloc::System`, beside the `#[global_allocator]`) and counted here, to the
//! byte requested: the device layer does not see them, this layer sees nothing else. The
//! process's resident set (`VmRSS`) holds both.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use super::{Meter, Reading};

static CURRENT: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);

/// Bytes the arena holds now.
pub fn current() -> u64 {
    CURRENT.load(Relaxed)
}

/// Sets the arena's high-water mark to its current bytes and returns them.
pub fn reset_peak() -> u64 {
    let now = CURRENT.load(Relaxed);
    PEAK.store(now, Relaxed);
    now
}

/// The arena's high-water mark since the last [`reset_peak`].
pub fn peak() -> u64 {
    PEAK.load(Relaxed)
}

/// `n` f32 in the host arena, zeroed (an empty buffer allocates nothing).
pub struct HostBuf {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: the buffer owns its allocation exclusively (no aliasing handles exist), as a Vec does.
unsafe impl Send for HostBuf {}
unsafe impl Sync for HostBuf {}

impl HostBuf {
    /// `n` zeros; panics, as `Vec` does, when the system has no memory for them.
    pub fn zeros(n: usize) -> Self {
        if n == 0 {
            return HostBuf {
                ptr: std::ptr::NonNull::dangling().as_ptr(),
                len: 0,
            };
        }
        let layout = Self::layout(n);
        // SAFETY: a non-zero size with f32's alignment.
        let ptr = unsafe { System.alloc_zeroed(layout) } as *mut f32;
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        let now = CURRENT.fetch_add(layout.size() as u64, Relaxed) + layout.size() as u64;
        PEAK.fetch_max(now, Relaxed);
        HostBuf { ptr, len: n }
    }

    /// A copy of `data` in the arena.
    pub fn copy_of(data: &[f32]) -> Self {
        let mut b = Self::zeros(data.len());
        b.copy_from_slice(data);
        b
    }

    fn layout(n: usize) -> Layout {
        Layout::array::<f32>(n).expect("a host buffer's size fits in memory")
    }

    /// Bytes a buffer of `n` f32 takes from the arena.
    pub const fn bytes(n: u64) -> u64 {
        4 * n
    }
}

impl std::ops::Deref for HostBuf {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: `ptr` holds `len` initialised f32 (zeroed at allocation), or is dangling with 0.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for HostBuf {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as `deref`, and `&mut self` is the only handle.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        let layout = Self::layout(self.len);
        // SAFETY: allocated by `System` with this layout in `zeros`.
        unsafe { System.dealloc(self.ptr as *mut u8, layout) };
        CURRENT.fetch_sub(layout.size() as u64, Relaxed);
    }
}

/// The host arena's layer around a window: `host_peak_bytes` (above the window's start) and
/// `host_retained_bytes`.
#[derive(Debug, Default)]
pub struct HostArenaMeter {
    baseline: u64,
}

impl Meter for HostArenaMeter {
    fn label(&self) -> &'static str {
        "host-arena"
    }
    fn start(&mut self) -> anyhow::Result<()> {
        self.baseline = reset_peak();
        Ok(())
    }
    fn read(&mut self, into: &mut Reading) -> anyhow::Result<()> {
        into.host_peak_bytes = Some(peak().saturating_sub(self.baseline));
        into.host_retained_bytes = Some(current() as i64 - self.baseline as i64);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer is zeroed, writable, copied whole; an empty one allocates nothing. (What the
    /// arena counts is asserted by `tests/ranks.rs`, a process per rank with nothing else in
    /// the arena: the unit tests of this binary run side by side.)
    #[test]
    fn buffers_are_zeroed_writable_and_copied() {
        let n = 1 << 20;
        let mut b = HostBuf::zeros(n);
        b[n - 1] = 3.0;
        assert!(b[..n - 1].iter().all(|&x| x == 0.0));
        let c = HostBuf::copy_of(&b[n - 4..]);
        assert_eq!(&c[..], &[0.0, 0.0, 0.0, 3.0]);
        assert_eq!(HostBuf::zeros(0).len(), 0);
        assert_eq!(HostBuf::bytes(n as u64), 4 << 20);
    }
}
