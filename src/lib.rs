//! memfit measures where the memory goes when a model trains or serves, and how well the
//! analytical formulas predict it.
//!
//! The data path, one module each:
//! workload (TOML → cases) → model (candle) → phase (one step, metered) → meter (counting
//! allocator, rusage/VmHWM, process-tree RSS/PSS) → record (one row per case × phase) → store (JSONL journal, CSV,
//! HDF5) → formula (predicted bytes per phase) → report (tables). `sweep` runs each case of a
//! workload in a process of its own and keeps the journal whole (resume, deadline, signals). `data` is the image
//! pipeline the `dataload` phase measures (dataset, transforms, workers). `step` names the parts
//! of a step (phases, optimizers, the backward's mode) for all of them.
//!
//! What it measures on the CPU: every byte the process allocates through Rust's global allocator
//! (which is where candle's CPU tensors live), as a resettable peak and a current count. It does
//! not see memory obtained with `mmap` directly by a library, nor the allocator's own
//! fragmentation; the host meter (VmHWM) is the outer layer for those.

pub mod cli;
pub mod cmd;
pub mod data;
pub mod device;
pub mod error;
pub mod fit;
pub mod formula;
pub mod machine;
pub mod meter;
pub mod model;
pub mod optim;
pub mod phase;
pub mod ranks;
pub mod record;
pub mod report;
pub mod selftest;
pub mod step;
pub mod store;
pub mod sweep;
pub mod timeline;
pub mod units;
pub mod workload;
