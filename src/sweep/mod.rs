//! A sweep: every case of a workload measured in a process of its own, its rows appended to
//! the journal as soon as the case ends, so that a crash, a kill, an out-of-memory, a time
//! limit or a full disk costs at most the case that was running.
//!
//! The loop (`memfit run`, [`run`]), for each case still to run:
//! 1. stop if SIGINT/SIGTERM came (after the running case: [`signals`]);
//! 2. with `--deadline`, skip a case that would likely end past it ([`estimate`]; such cases
//!    get no row, so `--resume` runs them later; the summary names them);
//! 3. run it in a child ([`child`]) limited to `--case-timeout` (and to what is left of the
//!    deadline); the child streams its rows, and what it could not finish gets the true status
//!    (`oom`, `timeout`, `crashed`, `skipped`);
//! 4. append its rows to the journal (written and fsync'd as one block); a failed write stops
//!    the sweep there (the journal keeps every earlier case);
//! 5. record the device's description in `meta.json` as soon as a child opened it.
//!
//! `--resume` ([`resume`]) runs only the cases without finished rows.

pub mod child;
pub mod estimate;
pub mod fault;
pub mod progress;
pub mod resume;
pub mod rows;
pub mod shard;
pub mod signals;

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::record::{Row, RunMeta};
use crate::store::jsonl::Journal;
use crate::workload::Case;

/// Default `--case-timeout`: generous, so only a hung case meets it.
pub const DEFAULT_CASE_TIMEOUT_S: f64 = 3600.0;

/// `memfit run` was stopped by SIGINT/SIGTERM (exit status 130), after writing what it had.
#[derive(Debug, thiserror::Error)]
#[error("interrupted; the journal holds every finished case. Continue with:\n  {resume}")]
pub struct Interrupted {
    pub resume: String,
}

/// `memfit run` finished, but some of its journal's rows did not measure: a case crashed, failed,
/// ran out of memory or out of time (exit status [`CasesFailed::EXIT`]). Every row is written.
#[derive(Debug, thiserror::Error)]
#[error(
    "{failed} row(s) of {total} did not measure ({counts}); they are recorded in {journal} with their status and error"
)]
pub struct CasesFailed {
    pub failed: usize,
    pub total: usize,
    pub counts: String,
    pub journal: String,
}

impl CasesFailed {
    /// The exit status of a run that wrote every row but not every row measured.
    pub const EXIT: u8 = 3;
}

/// What the loop needs besides the cases.
pub struct Sweep {
    pub exe: PathBuf,
    /// This run's arguments (after `memfit`), passed on to each child.
    pub args: Vec<OsString>,
    pub case_timeout: Duration,
    /// Instant past which no case may run.
    pub deadline: Option<Instant>,
    pub quiet: bool,
}

/// What a sweep did.
#[derive(Debug, Default)]
pub struct Summary {
    pub rows: Vec<Row>,
    pub cases_run: usize,
    /// Cases the deadline left out, with their estimated seconds.
    pub not_run: Vec<(usize, String, Option<f64>)>,
    /// Cases not reached because of SIGINT/SIGTERM.
    pub interrupted: usize,
    /// The journal write that failed, if one did (the sweep stopped there).
    pub write_error: Option<anyhow::Error>,
    /// Per case: process start to its first event (s) and its CPU seconds then.
    pub startup: Vec<(f64, f64)>,
}

/// A short label of a case for progress lines: `3 small B4 S128 f32 adamw`, then what sets it
/// apart from a default case, so that the cases of one grid read apart: ` composed` (candle's
/// composed kernels), ` standard`/` tiled` (attention), ` mixed`, ` ckpt2`, ` whole-backward`,
/// ` lora r8 q,v op`, ` weights q4_0`.
pub fn label(case: &Case) -> String {
    match &case.data {
        Some(d) => format!(
            "{} dataload w{} {} {} B{}",
            case.index,
            d.workers,
            d.kind.as_str(),
            d.storage.as_str(),
            d.batch
        ),
        None => {
            use std::fmt::Write as _;
            let mut s = format!(
                "{} {} B{} S{} {} {}",
                case.index,
                case.preset,
                case.batch,
                case.seq,
                case.dtype,
                case.optimizer.as_str(),
            );
            // The defaults (fused kernels, efficient attention, …) are not named.
            if !case.cfg.kernels.fused() {
                s.push_str(" composed");
            }
            let attention = case.cfg.attention_name();
            if attention != crate::workload::DEFAULT_ATTENTION {
                let _ = write!(s, " {attention}");
            }
            if case.precision == crate::device::Precision::Mixed {
                s.push_str(" mixed");
            }
            if case.checkpoint > 0 {
                let _ = write!(s, " ckpt{}", case.checkpoint);
            }
            if case.backward.as_str() != crate::workload::DEFAULT_BACKWARD {
                let _ = write!(s, " {}-backward", case.backward.as_str());
            }
            if case.cfg.lora_rank > 0 {
                let targets: Vec<&str> = case.cfg.lora_targets.iter().map(|t| t.as_str()).collect();
                let _ = write!(
                    s,
                    " lora r{} {} {}",
                    case.cfg.lora_rank,
                    targets.join(","),
                    case.cfg.lora_base.as_str()
                );
            }
            if case.weights != crate::device::ServingWeights::Model {
                let _ = write!(s, " weights {}", case.weights.as_str());
            }
            s
        }
    }
}

/// Runs `cases` in order (each with its predicted work, [`estimate::work`]), appending to
/// `journal`; `write_meta` is called when a child first describes its device.
pub fn run(
    sweep: &Sweep,
    cases: &[(&Case, Option<f64>)],
    meta: &mut RunMeta,
    journal: &mut Journal,
    write_meta: &dyn Fn(&RunMeta) -> anyhow::Result<()>,
) -> Summary {
    let mut summary = Summary::default();
    let mut progress = progress::Progress::new(cases.len(), sweep.quiet);
    // The header the last printed row was under.
    let mut shown_header: Option<String> = None;
    let mut est = estimate::Estimator::default();
    let mut device_recorded = meta.device_memory_bytes.is_some();
    let mut warned = false;
    for (i, &(case, work)) in cases.iter().enumerate() {
        if signals::count() > 0 {
            summary.interrupted = cases.len() - i;
            break;
        }
        let mut limit = sweep.case_timeout;
        let mut deadline_bound = false;
        if let Some(d) = sweep.deadline {
            let left = d.saturating_duration_since(Instant::now());
            let guess = est.estimate(work);
            if left.is_zero() || guess.is_some_and(|g| g > left.as_secs_f64()) {
                summary.not_run.push((case.index, label(case), guess));
                continue;
            }
            if left < limit {
                limit = left;
                deadline_bound = true;
            }
        }
        progress.start(&label(case));
        let run = child::run_one(
            &sweep.exe,
            &sweep.args,
            case,
            &meta.run_id,
            limit,
            deadline_bound,
            sweep.quiet,
        );
        if signals::count() > 0 && !warned {
            warned = true;
            progress.note(
                "memfit: interrupted: stopping after this case (a second SIGINT/SIGTERM kills it)",
            );
        }
        let wall = run.wall_s;
        if let (Some(s), Some(c)) = (run.startup_s, run.startup_cpu_s) {
            summary.startup.push((s, c));
        }
        if let Some(dev) = &run.device
            && !device_recorded
            && dev.device_name != meta.device_name
        {
            meta.adopt_device(dev);
            device_recorded = true;
            if let Err(e) = write_meta(meta) {
                progress.note(&format!("memfit: warning: {e:#}"));
            }
        }
        let rows = run.into_rows(case, meta);
        summary.cases_run += 1;
        if let Err(e) = journal.append(&rows) {
            summary.write_error = Some(e.context(format!(
                "appending case {} to the journal; the sweep stops here",
                case.index
            )));
            break;
        }
        for r in &rows {
            // Each kind of row under its own header (a dataload row has no model columns).
            let h = crate::report::table::header_of(r);
            if shown_header.as_ref() != Some(&h) {
                progress.println(&h);
                shown_header = Some(h);
            }
            progress.println(&crate::report::table::line(r));
        }
        est.record(work, wall);
        progress.finish(&label(case), &rows, wall);
        summary.rows.extend(rows);
    }
    progress.done();
    summary
}
