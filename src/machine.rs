//! This machine: its CPU model and OS as the rows' metadata records them ([`base_meta`]), and
//! the CPU backend's thread count, resolved from the flags or the workload and pinned
//! ([`resolve_threads`], [`pin_threads`]). Used by every command that measures.

use crate::error::UserError;
use crate::record::RunMeta;

/// Most CPU threads accepted by `--threads`.
pub const MAX_THREADS: i64 = 1024;

/// The metadata of a run on this machine before any device is opened: versions, CPU, OS,
/// threads, the workload's origin, the cluster it runs in.
pub fn base_meta(run_id: String, threads: usize, origin: &str) -> RunMeta {
    let cpu = cpu_model();
    RunMeta {
        run_id,
        memfit_version: env!("CARGO_PKG_VERSION").into(),
        git_commit: env!("MEMFIT_GIT_COMMIT").into(),
        candle_version: env!("MEMFIT_CANDLE_VERSION").into(),
        device_name: format!("cpu: {cpu}"),
        cpu_model: cpu,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
        os: os_name(),
        threads: threads as u64,
        workload: origin.to_string(),
        cuda_context_bytes: None,
        device_memory_bytes: None,
        driver_version: None,
        cuda_version: None,
        cuda_pool_release_threshold: None,
        cublas_workspace_bytes: None,
        cluster: crate::record::ClusterMeta::here(),
    }
}

/// `--threads` (else the workload's `threads`, else every core), checked.
pub fn resolve_threads(
    flag: Option<i64>,
    file: Option<i64>,
    origin: &str,
) -> Result<usize, UserError> {
    let (value, origin) = match (flag, file) {
        (Some(t), _) => (t, "flags"),
        (None, Some(t)) => (t, origin),
        (None, None) => {
            return Ok(std::thread::available_parallelism().map_or(1, |n| n.get()));
        }
    };
    if !(1..=MAX_THREADS).contains(&value) {
        return Err(UserError::OutOfRange {
            origin: origin.into(),
            key: "threads".into(),
            value: value.to_string(),
            reason: "the CPU backend needs at least one thread".into(),
            allowed: format!("1..={MAX_THREADS}"),
        });
    }
    Ok(value as usize)
}

/// candle's setting of how long its element-wise pool's idle workers spin before parking.
pub const SPIN_LIMIT: &str = "CANDLE_BARRIER_POOL_SPIN_LIMIT";

/// Pins the CPU backend to `threads`: the rayon pool and candle's gemm (which reads
/// `RAYON_NUM_THREADS`).
pub fn pin_threads(threads: usize) -> anyhow::Result<()> {
    // SAFETY: called before memfit starts any thread of its own; nothing reads the
    // environment concurrently.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", threads.to_string()) };
    // candle 0.11.1 runs its element-wise ops on a pool of its own beside rayon's (gemm's):
    // its workers spin 25,000 rounds after each op before parking, on the cores the next
    // gemm's rayon workers need (`threads` of each pool on `threads` cores). Parked at once,
    // they leave the cores to whichever pool has work; the user's own setting is kept.
    if std::env::var_os(SPIN_LIMIT).is_none() {
        // SAFETY: as above.
        unsafe { std::env::set_var(SPIN_LIMIT, "0") };
    }
    match rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
    {
        Ok(()) => Ok(()),
        // Already built (a second run in one process): it must have the same size.
        Err(_) if rayon::current_num_threads() == threads => Ok(()),
        Err(e) => Err(anyhow::anyhow!(
            "the thread pool already has {} threads, cannot pin {threads}: {e}",
            rayon::current_num_threads()
        )),
    }
}

/// The host CPU's model name (`/proc/cpuinfo`), else the architecture.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

fn os_name() -> String {
    let pretty = std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("PRETTY_NAME=")).map(|l| {
                l.trim_start_matches("PRETTY_NAME=")
                    .trim_matches('"')
                    .to_string()
            })
        });
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .ok();
    match (pretty, kernel) {
        (Some(p), Some(k)) => format!("{p} (Linux {k})"),
        (Some(p), None) => p,
        (None, Some(k)) => format!("Linux {k}"),
        (None, None) => std::env::consts::OS.to_string(),
    }
}
