//! Data loading: a real image pipeline whose host RAM and CPU are measured (claims D1–D6).
//!
//! The path, one file each: `dataset` (a deterministic synthetic JPEG/PNG dataset, as loose
//! files and as one packed file; the three storage modes that read it) → `pipeline` (decode →
//! random resized crop → flip → colour jitter → normalise → one `B × 3 × C × C` f32 batch) →
//! `workers` (0 = the main thread, N threads, or N worker processes re-executing this binary,
//! with a prefetch depth and persistent or re-spawned workers) → `bench` (the `dataload`
//! phase's window: epochs over the dataset, the process tree's RSS/PSS sampled, images/s).
//!
//! What is measured in a `dataload` window (one row):
//! - `images_per_s` = images delivered to the main thread as batch tensors / `wall_s`;
//! - `cpu_user_s`, `cpu_sys_s`: this process (all threads) plus every worker process reaped in
//!   the window (`RUSAGE_CHILDREN`); utilisation = (user + sys) / wall, over cores = that / cores;
//! - the process tree's memory, summed over memfit and its worker processes from
//!   `/proc/<pid>/smaps_rollup` every 10 ms: `tree_rss_peak_bytes` (shared pages counted once per
//!   process that maps them) and `pss_peak_bytes` (each shared page divided among its sharers,
//!   so the sum counts it once), and their means over the window's second half (`…_steady_…`);
//! - `peak_bytes`: the main process's heap high-water mark (counting allocator).
//!
//! The RAM model the seed workload fits (`docs/claims.md`, D2; fitted from stored rows by
//! `crate::fit::dataload`, not here):
//! `PSS ≈ base + workers × per-worker working set + in-flight batches × batch bytes`,
//! batch bytes = `B · 3 · C² · 4`, in-flight = `prefetch × max(workers, 1)` (PyTorch's
//! `prefetch_factor` is per worker).

pub mod bench;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod dataset;
pub mod pipeline;
pub mod workers;

use std::path::PathBuf;

/// Where the encoded images are read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Storage {
    /// The packed file read whole into memory (by each worker process; threads share it).
    Ram,
    /// The packed file memory-mapped (page cache pages shared by every process).
    Mmap,
    /// One loose file read per image.
    Stream,
}

impl Storage {
    pub const NAMES: &'static str = "ram, mmap, stream";

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "ram" => Some(Storage::Ram),
            "mmap" => Some(Storage::Mmap),
            "stream" => Some(Storage::Stream),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Storage::Ram => "ram",
            Storage::Mmap => "mmap",
            Storage::Stream => "stream",
        }
    }
}

/// How workers run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkerKind {
    /// Threads of this process (share the dataset and the heap).
    Thread,
    /// Child processes (`memfit dataload-worker`), each with its own memory.
    Process,
}

impl WorkerKind {
    pub const NAMES: &'static str = "thread, process";

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "thread" => Some(WorkerKind::Thread),
            "process" => Some(WorkerKind::Process),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WorkerKind::Thread => "thread",
            WorkerKind::Process => "process",
        }
    }
}

/// One dataload case: everything the pipeline and its workers need.
#[derive(Debug, Clone, PartialEq)]
pub struct DataCase {
    /// Folder written by `memfit dataset make`.
    pub dataset: PathBuf,
    /// 0 = load in the main thread.
    pub workers: usize,
    pub kind: WorkerKind,
    /// Batches requested ahead per worker (PyTorch's `prefetch_factor`); with 0 workers the
    /// main thread makes one batch at a time.
    pub prefetch: usize,
    pub storage: Storage,
    /// Workers live through every epoch (`true`) or are started again each epoch.
    pub persistent: bool,
    /// Passes over the dataset in the window.
    pub epochs: usize,
    /// Images per batch.
    pub batch: usize,
    /// Side of the square crop the pipeline outputs, in pixels.
    pub crop: u32,
    /// Seed of the sampler's shuffle and the augmentations.
    pub seed: u64,
}

impl DataCase {
    /// Bytes of one batch tensor: `B · 3 · C² · 4`.
    pub fn batch_bytes(&self) -> u64 {
        self.batch as u64 * 3 * (self.crop as u64).pow(2) * 4
    }

    /// Batches requested but not yet consumed, at most.
    pub fn in_flight(&self) -> usize {
        if self.workers == 0 {
            1
        } else {
            self.prefetch * self.workers
        }
    }
}

pub use crate::meter::DataFigures;
