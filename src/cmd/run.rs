//! `memfit run`: resolve the workload, then run every case in a process of its own
//! (`crate::sweep`), appending its rows to the journal as it ends; CSV and HDF5 are derived
//! from the journal at the end (also after an interrupt). `--resume` continues a journal;
//! `--child-case` is the process of one case.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::cli::RunArgs;
use crate::error::UserError;
use crate::machine::{base_meta, pin_threads, resolve_threads};
use crate::record::RunMeta;
use crate::step::Phase;
use crate::store;
use crate::sweep;
use crate::workload::{self, Case, WorkloadFile};

/// The cases of a run and what they run with, resolved before anything is touched.
struct Resolved {
    cases: Vec<Case>,
    origin: String,
    threads: usize,
    budget: Option<u64>,
    case_timeout: f64,
    /// `--timeline`, or the workload's `timeline` key.
    timeline: Option<std::path::PathBuf>,
}

fn resolve(args: &RunArgs) -> anyhow::Result<Resolved> {
    let (file, origin) = match &args.workload {
        Some(path) => (workload::load(path)?, path.display().to_string()),
        None if args.has_grid_flags() => (WorkloadFile::default(), "flags".to_string()),
        None => (
            workload::parse(workload::DEFAULT_TOML, "<embedded default>")?,
            "<embedded default>".to_string(),
        ),
    };
    // Listing runs nothing: a CUDA workload lists on a CPU build too.
    let cases = if args.list_cases {
        workload::expand_for_prediction(&file, &args.grid_flags(), &origin)?
    } else {
        workload::expand(&file, &args.grid_flags(), &origin)?
    };
    let threads = resolve_threads(args.threads, file.threads, &origin)?;
    let budget = args
        .mem_budget
        .as_deref()
        .map(|v| crate::units::parse_size(v, "mem-budget"))
        .transpose()?;
    let case_timeout = match (args.case_timeout, file.case_timeout) {
        (Some(t), _) => seconds(t, "flags", "case-timeout")?,
        (None, Some(t)) => seconds(t, &origin, "case_timeout")?,
        (None, None) => sweep::DEFAULT_CASE_TIMEOUT_S,
    };
    // Each case writes its measured timelines to the run's folder, when one is asked for.
    let timeline = args.timeline.clone().or(file.timeline);
    let mut cases = cases;
    for c in &mut cases {
        c.timeline = timeline.clone();
    }
    Ok(Resolved {
        cases,
        origin,
        threads,
        budget,
        case_timeout,
        timeline,
    })
}

/// A positive, finite number of seconds.
fn seconds(v: f64, origin: &str, key: &str) -> Result<f64, UserError> {
    if v.is_finite() && v > 0.0 && v <= 1e9 {
        Ok(v)
    } else {
        Err(UserError::OutOfRange {
            origin: origin.into(),
            key: key.into(),
            value: v.to_string(),
            reason: "a time limit is a positive number of seconds".into(),
            allowed: "0 < seconds ≤ 1e9".into(),
        })
    }
}

pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    // 1. Resolve everything before touching the disk.
    if args.resume && args.out.is_none() {
        return Err(UserError::OutOfRange {
            origin: "flags".into(),
            key: "resume".into(),
            value: "set".into(),
            reason: "--resume continues the run in --out, and none was given (without --out a \
                     run starts in a new folder runs/<time>)"
                .into(),
            allowed: "--resume with --out DIR, the folder of the run to continue".into(),
        }
        .into());
    }
    let r = resolve(args)?;
    if let Some(dir) = &r.timeline {
        anyhow::ensure!(
            !crate::meter::cpu_alloc::UNMETERED,
            "--timeline records the counting allocator's events, which the `unmetered` build leaves out"
        );
        if args.child_case.is_none() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("--timeline {}: creating the folder", dir.display()))?;
        }
    }
    if let Some(index) = args.child_case {
        // The process of one case, for a parent `memfit run` (`sweep::child`).
        let case = r
            .cases
            .iter()
            .find(|c| c.index == index)
            .with_context(|| format!("the workload has no case {index}"))?;
        pin_threads(r.threads)?;
        let run_id = std::env::var(sweep::child::RUN_ID_ENV).unwrap_or_else(|_| "child".into());
        return sweep::child::serve(case, base_meta(run_id, r.threads, &r.origin), r.budget);
    }
    if !args.quiet {
        dtype_notes(&r.cases);
    }
    let deadline = args
        .deadline
        .map(|d| seconds(d, "flags", "deadline"))
        .transpose()?
        .map(|d| Instant::now() + Duration::from_secs_f64(d));
    // Each case's skeleton row (its key for --resume) and predicted work (for --deadline and
    // --shard).
    let skel_meta = base_meta(String::new(), r.threads, &r.origin);
    let skeletons: Vec<crate::record::Row> = r
        .cases
        .iter()
        .map(|c| sweep::rows::skeleton(c, &skel_meta))
        .collect();
    let costs: Vec<Option<f64>> = r
        .cases
        .iter()
        .zip(&skeletons)
        .map(|(c, sk)| sweep::estimate::work(sk, &c.phases))
        .collect();
    let shard = args.shard.as_deref().map(sweep::shard::parse).transpose()?;
    let shard_of = shard.map(|s| sweep::shard::assign(&costs, s.count));
    if args.list_cases {
        list_cases(&r.cases, &costs, shard, shard_of.as_deref());
        return Ok(());
    }
    // Positions (in `r.cases`) of the cases this run is asked to run.
    let planned: Vec<usize> = (0..r.cases.len())
        .filter(|&i| match (shard, &shard_of) {
            (Some(s), Some(of)) => of[i] == s.index,
            _ => true,
        })
        .collect();
    let stamp = crate::units::utc_stamp(unix_now());
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("runs").join(&stamp));
    let journal_path = out.join("results.jsonl");
    let meta_path = out.join("meta.json");
    if journal_path.exists() && !args.resume {
        return Err(UserError::Output {
            path: journal_path.display().to_string(),
            message:
                "a journal is already there; continue it with --resume, or choose another --out"
                    .into(),
        }
        .into());
    }
    // The children read RAYON_NUM_THREADS; this process runs no kernel itself.
    // SAFETY: called before memfit starts any thread of its own.
    unsafe { std::env::set_var("RAYON_NUM_THREADS", r.threads.to_string()) };
    sweep::signals::install()?;

    // 2. The journal: a new one, or the one to resume (its unfinished cases set aside).
    std::fs::create_dir_all(&out).map_err(|e| UserError::Output {
        path: out.display().to_string(),
        message: format!("cannot create the output folder: {e}"),
    })?;
    let keys: Vec<(String, Vec<Phase>)> = r
        .cases
        .iter()
        .zip(&skeletons)
        .map(|(c, sk)| (sweep::resume::case_key(sk), c.phases.clone()))
        .collect();
    let (mut meta, todo) = if journal_path.exists() {
        let prior_meta: Option<RunMeta> = std::fs::read_to_string(&meta_path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
        let rows = store::jsonl::read(&journal_path)?;
        let run_id = prior_meta
            .as_ref()
            .map(|m| m.run_id.clone())
            .or_else(|| rows.first().map(|r| r.run_id.clone()))
            .unwrap_or_else(|| stamp.clone());
        let prior = sweep::resume::split(rows, &keys);
        store::jsonl::rewrite(
            &journal_path,
            &prior.kept,
            &out.join("superseded.jsonl"),
            &prior.superseded,
        )?;
        let todo: Vec<usize> = planned
            .iter()
            .copied()
            .filter(|&i| !prior.finished.contains(&keys[i].0))
            .collect();
        if !args.quiet {
            println!(
                "resuming {}: {} of {} case(s) finished, {} to run{}",
                journal_path.display(),
                planned.len() - todo.len(),
                planned.len(),
                todo.len(),
                if prior.superseded.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; {} row(s) of unfinished cases moved to superseded.jsonl",
                        prior.superseded.len()
                    )
                }
            );
        }
        let mut meta = base_meta(run_id, r.threads, &r.origin);
        if let Some(p) = prior_meta.filter(|p| p.device_memory_bytes.is_some()) {
            meta.adopt_device(&p);
        }
        (meta, todo)
    } else {
        (base_meta(stamp, r.threads, &r.origin), planned.clone())
    };
    meta.cluster.shard = shard.map(|s| s.to_string());
    meta.cluster.planned_cases = planned.iter().map(|&i| r.cases[i].index as u64).collect();
    let todo: Vec<(&Case, Option<f64>)> =
        todo.into_iter().map(|i| (&r.cases[i], costs[i])).collect();
    write_meta(&meta_path, &meta)?;
    let mut journal = store::jsonl::Journal::open(&journal_path)?;
    if !args.quiet {
        println!(
            "memfit {} · {} case(s) from {} · {} thread(s) · out {}",
            meta.memfit_version,
            todo.len(),
            r.origin,
            r.threads,
            out.display()
        );
    }

    // 3. Measure, each case in a process of its own, appending after every case.
    let sweep_args = sweep::Sweep {
        exe: crate::data::workers::current_exe()?,
        args: std::env::args_os().skip(1).collect(),
        case_timeout: Duration::from_secs_f64(r.case_timeout),
        deadline,
        quiet: args.quiet,
    };
    let summary = sweep::run(&sweep_args, &todo, &mut meta, &mut journal, &|m| {
        write_meta(&meta_path, m)
    });
    drop(journal);

    // 4. Derive the other stores from the journal (what is on disk, not what is in memory). A
    // build without HDF5 (the GPU machine's) leaves results.h5 to `memfit convert`.
    let mut failed = None;
    let derived = store::jsonl::read(&journal_path).and_then(|rows| {
        store::csv::write(&out.join("results.csv"), &rows)?;
        if store::hdf5::AVAILABLE {
            store::hdf5::write(&out.join("results.h5"), &meta, &rows)?;
        }
        // Every row of the journal (a resumed run's earlier ones too) that did not measure; a
        // skipped phase follows its case's failed one, which is counted.
        let bad: Vec<crate::record::Row> = rows
            .iter()
            .filter(|r| {
                !matches!(
                    r.status,
                    crate::record::Status::Ok | crate::record::Status::Skipped
                )
            })
            .cloned()
            .collect();
        if !bad.is_empty() {
            failed = Some(sweep::CasesFailed {
                failed: bad.len(),
                total: rows.len(),
                counts: sweep::progress::status_counts(&bad),
                journal: journal_path.display().to_string(),
            });
        }
        Ok(rows.len())
    });
    print_summary(args, &summary, &journal_path, &derived);
    if let Some(e) = summary.write_error {
        return Err(e.context(format!("resume with: {}", resume_command(&out))));
    }
    derived?;
    if summary.interrupted > 0 || sweep::signals::count() > 0 {
        return Err(sweep::Interrupted {
            resume: resume_command(&out),
        }
        .into());
    }
    match failed {
        Some(f) => Err(f.into()),
        None => Ok(()),
    }
}

/// `--list-cases`: every case, its shard and predicted cost; per-shard totals.
fn list_cases(
    cases: &[Case],
    costs: &[Option<f64>],
    shard: Option<sweep::shard::Shard>,
    shard_of: Option<&[usize]>,
) {
    use std::fmt::Write as _;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "{:>5} {:>5} {:>14}  case",
        "case", "shard", "cost GFLOP"
    );
    for (i, c) in cases.iter().enumerate() {
        let s = shard_of.map_or("-".to_string(), |of| of[i].to_string());
        let cost = costs[i].map_or("— (dataload)".to_string(), |w| format!("{:.3}", w / 1e9));
        let _ = writeln!(
            text,
            "{:>5} {:>5} {:>14}  {}",
            c.index,
            s,
            cost,
            sweep::label(c)
        );
    }
    if let (Some(s), Some(of)) = (shard, shard_of) {
        let _ = writeln!(text, "shard  cases   cost GFLOP");
        for k in 0..s.count {
            let mine: Vec<usize> = (0..cases.len()).filter(|&i| of[i] == k).collect();
            let total: f64 = mine.iter().filter_map(|&i| costs[i]).sum();
            let mark = if k == s.index { " ← this shard" } else { "" };
            let _ = writeln!(text, "{k:>5} {:>6} {:>12.3}{mark}", mine.len(), total / 1e9);
        }
    }
    // A reader that stops early (`| head`) is not an error: a closed pipe ends the listing.
    use std::io::Write as _;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// This run's command line with `--resume` (and `--out`) so that it continues in `out`.
fn resume_command(out: &Path) -> String {
    let mut parts: Vec<String> = vec!["memfit".into()];
    let mut has_out = false;
    for a in std::env::args().skip(1) {
        if a == "--resume" {
            continue;
        }
        if a == "--out" || a.starts_with("--out=") {
            has_out = true;
        }
        parts.push(shell_word(&a));
    }
    if !has_out {
        parts.push("--out".into());
        parts.push(shell_word(&out.display().to_string()));
    }
    parts.push("--resume".into());
    parts.join(" ")
}

fn shell_word(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,@%+".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn print_summary(
    args: &RunArgs,
    s: &sweep::Summary,
    journal: &Path,
    derived: &anyhow::Result<usize>,
) {
    if args.quiet && s.not_run.is_empty() {
        return;
    }
    let counts = sweep::progress::status_counts(&s.rows);
    eprintln!("memfit: {} case(s) run: {counts}", s.cases_run);
    if !s.startup.is_empty() {
        let n = s.startup.len() as f64;
        let wall = s.startup.iter().map(|x| x.0).sum::<f64>() / n;
        let cpu = s.startup.iter().map(|x| x.1).sum::<f64>() / n;
        eprintln!(
            "memfit: a process per case: {:.1} ms to start on average ({:.1} ms of CPU)",
            wall * 1e3,
            cpu * 1e3
        );
    }
    if !s.not_run.is_empty() {
        eprintln!(
            "memfit: {} case(s) not run: they would likely end past --deadline:",
            s.not_run.len()
        );
        for (_, label, guess) in &s.not_run {
            match guess {
                Some(g) => eprintln!("  case {label} (estimated {g:.1} s)"),
                None => eprintln!("  case {label} (no time was left)"),
            }
        }
    }
    if s.interrupted > 0 {
        eprintln!(
            "memfit: {} case(s) not reached (interrupted)",
            s.interrupted
        );
    }
    match derived {
        Ok(n) if !args.quiet => println!(
            "wrote {n} row(s): {}, results.csv, {}meta.json",
            journal.display(),
            if store::hdf5::AVAILABLE {
                "results.h5, "
            } else {
                "(no results.h5: built without HDF5; `memfit convert` adds it), "
            }
        ),
        Ok(_) => {}
        Err(e) => eprintln!("memfit: could not write results.csv / results.h5: {e:#}"),
    }
}

/// Rewrites `meta.json` atomically (a sweep that dies later still says what it ran on).
fn write_meta(path: &Path, meta: &RunMeta) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(meta)? + "\n";
    store::replace_atomically(path, |tmp| {
        std::fs::write(tmp, text.as_bytes()).with_context(|| format!("writing {}", tmp.display()))
    })
    .with_context(|| format!("writing {}", path.display()))
}

/// Says, once per element type, where cases measure another type than their checkpoint's
/// (`checkpoint_dtype`): on the CPU a bf16 checkpoint runs f32 unless `--dtype` says otherwise.
fn dtype_notes(cases: &[Case]) {
    for (c, n) in workload::checkpoint_dtypes(cases) {
        let Some(ck) = c.checkpoint_dtype.filter(|&d| d != c.dtype) else {
            continue;
        };
        let why = if ck == crate::device::ElemType::Bf16 && !c.device.is_cuda() {
            "candle's CPU matmul has no bf16; `memfit predict --device cuda:0` answers in bf16"
        } else {
            "as --dtype asks"
        };
        eprintln!(
            "memfit: the checkpoint holds {ck}; its {n} case(s) on {} measure {} ({why}); the rows' checkpoint_dtype says {ck}",
            c.device, c.dtype
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::record::{Status, error_text, status_of};

    #[test]
    fn stored_errors_lose_the_backtrace_and_oom_is_recognised() {
        let e = anyhow::anyhow!(
            "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")\n   0: bt\n   at x.rs:1"
        )
        .context("phase forward");
        let text = error_text(&e);
        assert_eq!(
            text,
            "phase forward: DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")"
        );
        assert_eq!(status_of(&text), Status::Oom);
        assert_eq!(status_of("shape mismatch"), Status::Error);
    }
}
