//! `memfit max-batch`: the largest batch whose training step fits a budget. The formula module
//! predicts it (`predict --fit-in`'s search); trials then run `memfit run --phases train-step`
//! at chosen batches, each in a child process (on the CPU with `--mem-budget`, so running out
//! aborts only the child), searching around the prediction for the largest batch that passes.

use std::process::Command;

use crate::cli::MaxBatchArgs;
use crate::cmd::predict::predict_case;
use crate::record::Status;
use crate::units;
use crate::workload::{self, WorkloadFile};

/// One trial.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Trial {
    pub batch: usize,
    pub fits: bool,
}

/// The predicted and the found largest batch.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MaxBatch {
    pub budget_bytes: u64,
    pub predicted: usize,
    pub found: usize,
    pub trials: Vec<Trial>,
}

pub fn max_batch(args: &MaxBatchArgs) -> anyhow::Result<()> {
    let budget = units::parse_size(&args.budget, "budget")?;
    let mut flags = args.grid.grid_flags();
    flags.batch = None;
    let cases = workload::expand(&WorkloadFile::default(), &flags, "flags")?;
    if cases.len() != 1 {
        anyhow::bail!(
            "max-batch searches one case; the flags describe {} (give single values)",
            cases.len()
        );
    }
    let predicted = predict_case(&cases[0], args.threads, Some(budget))
        .max_batch
        .unwrap_or(0);
    let mut trials = Vec::new();
    let mut run = |batch: usize| -> anyhow::Result<bool> {
        let fits = trial(batch, &args.budget, args.threads)?;
        trials.push(Trial { batch, fits });
        Ok(fits)
    };
    // The largest passing batch: grow from the prediction until a failure, then bisect.
    let (mut lo, mut hi) = (0usize, 0usize); // lo passes (0 trivially), hi fails
    let mut probe = predicted.max(1);
    loop {
        if run(probe)? {
            lo = probe;
            probe = (probe * 2).max(probe + 1);
            if probe > 1 << 20 {
                break;
            }
        } else {
            hi = probe;
            break;
        }
    }
    if hi == 0 {
        hi = lo + 1;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if run(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let out = MaxBatch {
        budget_bytes: budget,
        predicted,
        found: lo,
        trials,
    };
    if args.json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!(
            "budget {}: predicted largest batch {}, found {} ({} trial(s): {})",
            args.budget,
            out.predicted,
            out.found,
            out.trials.len(),
            out.trials
                .iter()
                .map(|t| format!("{}{}", t.batch, if t.fits { "✓" } else { "✗" }))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    Ok(())
}

/// Runs the case at `batch` in a child `memfit run` and says whether its training step
/// completed within the budget.
fn trial(batch: usize, budget: &str, threads: usize) -> anyhow::Result<bool> {
    let dir = tempfile_dir()?;
    let mut args: Vec<String> = passthrough_args();
    args.extend([
        "--batch".into(),
        batch.to_string(),
        "--phases".into(),
        "train-step".into(),
        "--threads".into(),
        threads.to_string(),
        "--mem-budget".into(),
        budget.into(),
        "--quiet".into(),
        "--out".into(),
        dir.join("out").display().to_string(),
    ]);
    let status = Command::new(std::env::current_exe()?)
        .arg("run")
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()?;
    let rows =
        crate::store::jsonl::read(&dir.join("out").join("results.jsonl")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(status.success() && !rows.is_empty() && rows.iter().all(|r| r.status == Status::Ok))
}

/// The workload flags this `max-batch` was given, to hand to the trials (without its own
/// options and the batch, which the trial sets).
fn passthrough_args() -> Vec<String> {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let skip_with_value = ["--budget", "--batch", "--threads", "--phases", "--out"];
    let mut out = Vec::new();
    let mut it = all.into_iter().skip_while(|a| a != "max-batch").skip(1);
    while let Some(a) = it.next() {
        if a == "--json" {
            continue;
        }
        if skip_with_value.contains(&a.as_str()) {
            it.next();
            continue;
        }
        if skip_with_value
            .iter()
            .any(|k| a.starts_with(&format!("{k}=")))
        {
            continue;
        }
        out.push(a);
    }
    out
}

fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!(
        "memfit-max-batch-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}
