//! One case in a process of its own.
//!
//! `memfit run` re-executes this binary with its own arguments plus `--child-case N`; the
//! child expands the same workload, runs case `N` (model phases through
//! [`crate::phase::runner`], or the data pipeline) and streams [`Event`]s on stdout, one JSON
//! line each behind [`PREFIX`]: `hello` once started, `device` once its meters are open (what
//! the device said about itself), `phase` before each asked phase's window (the warm-up is
//! announced as the first asked phase), `rows` as phases finish, `done` at the end. Other
//! stdout lines are passed on to stderr; stderr is passed on and its tail kept.
//!
//! The parent ([`run_one`]) waits with a time limit. A child that dies before `done` — a
//! signal, a panic, an abort on `--mem-budget`, a kill at the time limit or by a second
//! SIGINT — leaves the rows it sent, and the parent writes the rest: the phase that was
//! running gets `oom` (the budget's allocation failure), `timeout` or `crashed`, with the
//! tail of the child's stderr; every later phase `skipped`. The child runs in a process group
//! of its own (so a terminal's Ctrl-C reaches only the parent, which decides) and is killed
//! with its group (data-loading worker processes included); it dies with the parent.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::rows::{case_rows, failed_rows, row_of};
use crate::meter::Meter;
use crate::phase::Phase;
use crate::phase::runner::{PhaseResult, run_case_observed};
use crate::record::{Row, RunMeta, Status, StatusError};
use crate::workload::Case;

/// Marks the child's event lines on its stdout.
pub const PREFIX: &str = "memfit-event ";

/// The run id the child's rows carry (set by the parent).
pub const RUN_ID_ENV: &str = "MEMFIT_RUN_ID";

/// Lines of the child's stderr kept for an error message.
const TAIL_LINES: usize = 12;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Event {
    /// The child has parsed its arguments: its CPU seconds so far (the isolation's cost).
    Hello {
        cpu_s: f64,
    },
    /// The device is open; what it said about itself (CUDA: name, memory, driver).
    Device {
        meta: Box<RunMeta>,
    },
    /// A phase (or the warm-up before the first one) is about to run.
    Phase {
        phase: Phase,
    },
    Rows {
        rows: Vec<Row>,
    },
    Done,
}

fn emit(ev: &Event) {
    let line = serde_json::to_string(ev).expect("an event serialises");
    let mut out = std::io::stdout().lock();
    // A parent that is gone: nothing to tell (the child dies with it).
    let _ = writeln!(out, "{PREFIX}{line}").and_then(|()| out.flush());
}

/// The child's side: runs `case` and streams its events. `meta` is the run's (the child's
/// device figures join it).
pub fn serve(case: &Case, mut meta: RunMeta, budget: Option<u64>) -> anyhow::Result<()> {
    let (user, sys) = crate::meter::rusage::cpu_times();
    emit(&Event::Hello { cpu_s: user + sys });
    let faults = super::fault::from_env()?;
    if let Some(b) = budget {
        anyhow::ensure!(
            !crate::meter::cpu_alloc::UNMETERED,
            "--mem-budget needs the counting allocator, which the `unmetered` build leaves out"
        );
        crate::meter::cpu_alloc::set_budget(b);
    }
    let exe = crate::data::workers::current_exe()?;
    let opened =
        open_meters(case.device, case.trim, case.timeline.is_some(), &mut meta).and_then(|m| {
            if case.flush_denormals {
                crate::phase::denormals::set_all_threads()?;
            }
            Ok(m)
        });
    match opened {
        Err(e) => {
            super::fault::trigger(&faults, case.index, case.phases[0]);
            emit(&Event::Rows {
                rows: failed_rows(case, &meta, &e),
            });
        }
        Ok((mut meters, label)) => {
            emit(&Event::Device {
                meta: Box::new(meta.clone()),
            });
            let sent = std::cell::Cell::new(0usize);
            let send_new = |results: &[PhaseResult]| {
                let new = &results[sent.get().min(results.len())..];
                if !new.is_empty() {
                    emit(&Event::Rows {
                        rows: case_rows(case, &meta, new, label),
                    });
                }
                sent.set(results.len());
            };
            let observe = |phase: Phase, results: &[PhaseResult]| {
                send_new(results);
                emit(&Event::Phase { phase });
                super::fault::trigger(&faults, case.index, phase);
            };
            let results = if let Some(data) = &case.data {
                observe(Phase::Dataload, &[]);
                crate::data::bench::run_case(data, case.device, &mut meters, &exe)
            } else {
                run_case_observed(case, &mut meters, &observe)
            };
            send_new(&results);
        }
    }
    emit(&Event::Done);
    Ok(())
}

/// A device's meters and the label of the one that fills `peak_bytes`. Opening a CUDA device
/// records what it tells about itself in `meta`. Without `trim` (`--trim off`) the host meter
/// neither trims nor resets the RSS high-water mark before a window, and no trim meter reads
/// the layer after it. With `timeline` (`run --timeline`) a CUDA device's pool is sampled
/// while each window is open (`meter::pool_timeline`; the CPU's events are always recorded).
pub fn open_meters(
    device: crate::device::DeviceSpec,
    trim: bool,
    timeline: bool,
    meta: &mut RunMeta,
) -> anyhow::Result<(Vec<Box<dyn Meter>>, &'static str)> {
    use crate::device::DeviceSpec;
    match device {
        // The meter-overhead benchmark's build: the clocks only (wall, CPU seconds); every
        // memory field stays missing and `peak_meter` says so.
        DeviceSpec::Cpu if crate::meter::cpu_alloc::UNMETERED => {
            let _ = (meta, timeline);
            Ok((
                vec![Box::new(crate::meter::rusage::HostMeter::default())],
                "unmetered",
            ))
        }
        #[cfg(feature = "cuda")]
        DeviceSpec::Cuda(n) if crate::meter::cpu_alloc::UNMETERED => {
            let s = crate::meter::cuda::setup(n, trim, timeline)?;
            meta.device_name = format!("cuda:{n}: {}", s.device_name);
            meta.device_memory_bytes = Some(s.memory_bytes);
            Ok((
                vec![Box::new(crate::meter::rusage::HostMeter::default())],
                "unmetered",
            ))
        }
        DeviceSpec::Cpu => {
            let _ = (meta, timeline);
            let mut meters: Vec<Box<dyn Meter>> = Vec::new();
            if trim {
                // First: read last, trimming the heap once the window's figures are in.
                meters.push(Box::new(crate::meter::trim::TrimMeter::new(
                    crate::meter::trim::HeapTrim,
                )));
            }
            meters.push(Box::new(crate::meter::rusage::HostMeter::for_case(trim)));
            meters.push(Box::new(crate::meter::cpu_alloc::AllocMeter::default()));
            Ok((meters, "cpu-allocator"))
        }
        #[cfg(feature = "cuda")]
        DeviceSpec::Cuda(n) => {
            let s = crate::meter::cuda::setup(n, trim, timeline)?;
            if let Some(why) = &s.nvml_missing {
                eprintln!("warning: cuda:{n}: {why}; the NVML fields stay empty");
            }
            meta.device_name = format!("cuda:{n}: {}", s.device_name);
            meta.device_memory_bytes = Some(s.memory_bytes);
            meta.cuda_context_bytes = s.context_bytes;
            meta.driver_version = s.driver_version;
            meta.cuda_version = s.cuda_version;
            meta.cuda_pool_release_threshold = s.pool_release_threshold;
            meta.cublas_workspace_bytes = Some(crate::device::CUBLAS_WORKSPACE_BYTES as u64);
            Ok((s.meters, s.peak_meter))
        }
        #[cfg(not(feature = "cuda"))]
        DeviceSpec::Cuda(_) => {
            let _ = (meta, timeline);
            anyhow::bail!(crate::device::NO_CUDA)
        }
    }
}

/// Why the parent killed a child.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kill {
    /// Past `--case-timeout` (or the run's `--deadline`).
    Timeout { limit_s: f64, deadline: bool },
    /// A second SIGINT/SIGTERM.
    Interrupt,
}

/// What became of one case's process.
#[derive(Debug)]
pub struct CaseRun {
    /// Rows the child sent.
    pub rows: Vec<Row>,
    /// The last phase it announced.
    pub running: Option<Phase>,
    pub done: bool,
    pub exit: Option<ExitStatus>,
    pub killed: Option<Kill>,
    pub stderr_tail: String,
    pub device: Option<RunMeta>,
    /// Spawn to `hello`, and the child's CPU seconds then: the cost of a process per case.
    pub startup_s: Option<f64>,
    pub startup_cpu_s: Option<f64>,
    pub wall_s: f64,
    /// Why the child could not be started or read, if so.
    pub failure: Option<String>,
}

/// Runs case `case` in a child `exe ARGS… --child-case N`, for at most `limit`.
pub fn run_one(
    exe: &Path,
    args: &[std::ffi::OsString],
    case: &Case,
    run_id: &str,
    limit: Duration,
    deadline_bound: bool,
    quiet: bool,
) -> CaseRun {
    let t0 = Instant::now();
    let mut run = CaseRun {
        rows: Vec::new(),
        running: None,
        done: false,
        exit: None,
        killed: None,
        stderr_tail: String::new(),
        device: None,
        startup_s: None,
        startup_cpu_s: None,
        wall_s: 0.0,
        failure: None,
    };
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .args(["--child-case", &case.index.to_string()])
        .env(RUN_ID_ENV, run_id)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    // SAFETY: prctl is async-signal-safe; it only asks for SIGKILL when the parent dies.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            run.failure = Some(format!("starting {} for the case: {e}", exe.display()));
            run.wall_s = t0.elapsed().as_secs_f64();
            return run;
        }
    };
    let pid = child.id() as i32;
    let (tx, rx) = mpsc::channel::<Event>();
    let stdout = child.stdout.take().expect("piped stdout");
    let stderr = child.stderr.take().expect("piped stderr");
    let tail = Arc::new(Mutex::new(VecDeque::<String>::new()));
    let label = case.index;
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            match line.strip_prefix(PREFIX).map(serde_json::from_str::<Event>) {
                Some(Ok(ev)) => {
                    if tx.send(ev).is_err() {
                        break;
                    }
                }
                // A line torn by a kill, or not ours: passed on.
                Some(Err(_)) | None => eprintln!("case {label}: {line}"),
            }
        }
    });
    let tail2 = tail.clone();
    let errs = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if !quiet {
                eprintln!("case {label}: {line}");
            }
            if is_backtrace(&line) {
                continue;
            }
            let mut t = tail2.lock().unwrap_or_else(|p| p.into_inner());
            t.push_back(line);
            while t.len() > TAIL_LINES {
                t.pop_front();
            }
        }
    });
    let kill = |pid: i32| {
        // SAFETY: signals the child's own process group (its pid).
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    };
    let mut open = true;
    loop {
        if open {
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(ev) => {
                    take(&mut run, ev, t0);
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => open = false,
            }
        } else {
            std::thread::sleep(Duration::from_millis(10));
        }
        if run.killed.is_none() {
            if super::signals::count() >= 2 {
                run.killed = Some(Kill::Interrupt);
                kill(pid);
            } else if t0.elapsed() > limit {
                run.killed = Some(Kill::Timeout {
                    limit_s: limit.as_secs_f64(),
                    deadline: deadline_bound,
                });
                kill(pid);
            }
        }
        match child.try_wait() {
            Ok(Some(status)) => {
                run.exit = Some(status);
                break;
            }
            Ok(None) => {}
            Err(e) => {
                run.failure = Some(format!("waiting for the case's process: {e}"));
                kill(pid);
                run.exit = child.wait().ok();
                break;
            }
        }
    }
    // The group may still hold worker processes of a dead child: they go too.
    kill(pid);
    let _ = reader.join();
    while let Ok(ev) = rx.try_recv() {
        take(&mut run, ev, t0);
    }
    let _ = errs.join();
    run.stderr_tail = tail
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .cloned()
        .collect::<Vec<_>>()
        .join("\n");
    run.wall_s = t0.elapsed().as_secs_f64();
    run
}

fn take(run: &mut CaseRun, ev: Event, t0: Instant) {
    match ev {
        Event::Hello { cpu_s } => {
            run.startup_s = Some(t0.elapsed().as_secs_f64());
            run.startup_cpu_s = Some(cpu_s);
        }
        Event::Device { meta } => run.device = Some(*meta),
        Event::Phase { phase } => run.running = Some(phase),
        Event::Rows { rows } => run.rows.extend(rows),
        Event::Done => run.done = true,
    }
}

impl CaseRun {
    /// One row per asked phase: those the child sent, and for the others the true status of
    /// what happened.
    pub fn into_rows(self, case: &Case, meta: &RunMeta) -> Vec<Row> {
        let mut rows: Vec<Row> = self
            .rows
            .into_iter()
            .filter(|r| case.phases.contains(&r.phase))
            .map(|mut r| {
                r.run_id = meta.run_id.clone();
                r.case = case.index as u64;
                super::rows::predict(case, &mut r, meta.threads as usize);
                r
            })
            .collect();
        let missing: Vec<Phase> = case
            .phases
            .iter()
            .copied()
            .filter(|p| !rows.iter().any(|r| r.phase == *p))
            .collect();
        if missing.is_empty() {
            return rows;
        }
        let exit = match self.exit {
            Some(s) => describe(s),
            None => "no exit status".into(),
        };
        let stderr = if self.stderr_tail.trim().is_empty() {
            String::new()
        } else {
            format!("; stderr: {}", self.stderr_tail.trim())
        };
        let (status, what) = match (self.killed, &self.failure) {
            (_, Some(f)) => (Status::Crashed, f.clone()),
            (Some(Kill::Timeout { limit_s, deadline }), _) => (
                Status::Timeout,
                format!(
                    "killed after {limit_s:.1} s ({})",
                    if deadline {
                        "the run's --deadline"
                    } else {
                        "--case-timeout"
                    }
                ),
            ),
            (Some(Kill::Interrupt), _) => (
                Status::Crashed,
                "killed by a second SIGINT/SIGTERM to memfit run".into(),
            ),
            (None, None) if self.done => (
                Status::Error,
                "the case's process sent no row for this phase".into(),
            ),
            (None, None) => {
                let oom = self.stderr_tail.contains("memory allocation of")
                    && self.stderr_tail.contains("failed");
                let status = if oom { Status::Oom } else { Status::Crashed };
                (status, format!("the case's process died ({exit})"))
            }
        };
        // The phase that was running: the last announced one without a row (the warm-up is
        // announced as the first asked phase), else the first missing one.
        let running = self
            .running
            .filter(|p| missing.contains(p))
            .unwrap_or(missing[0]);
        let warm_up = running == case.phases[0] && rows.is_empty();
        for &phase in &missing {
            let err = if phase == running {
                let when = if warm_up {
                    "during this phase or the unmetered warm-up before it"
                } else {
                    "during this phase"
                };
                StatusError::error(status, format!("{what} {when}{stderr}"))
            } else if phase < running {
                StatusError::error(
                    Status::Error,
                    format!("the case's process sent no row for this phase ({what})"),
                )
            } else {
                StatusError::skipped_after(running.as_str(), &what)
            };
            rows.push(row_of(case, meta, phase, &Err(err), "none"));
        }
        rows.sort_by_key(|r| {
            case.phases
                .iter()
                .position(|p| *p == r.phase)
                .unwrap_or(usize::MAX)
        });
        rows
    }
}

/// A backtrace line (`   3: frame`, `             at file.rs:1`, the headers): passed on but
/// kept out of the stored tail, where it would bury the message.
fn is_backtrace(line: &str) -> bool {
    let t = line.trim_start();
    let frame = t
        .split_once(": ")
        .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
    (line.starts_with(' ') && (frame || t.starts_with("at ")))
        || t == "stack backtrace:"
        || t.starts_with("note: Some details are omitted")
}

/// `exit code 3`, `signal 9 (SIGKILL)`.
fn describe(s: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(sig)) => {
            let name = match sig {
                libc::SIGKILL => " (SIGKILL)",
                libc::SIGABRT => " (SIGABRT)",
                libc::SIGSEGV => " (SIGSEGV)",
                libc::SIGBUS => " (SIGBUS)",
                libc::SIGTERM => " (SIGTERM)",
                _ => "",
            };
            format!("signal {sig}{name}")
        }
        _ => "unknown exit".into(),
    }
}
