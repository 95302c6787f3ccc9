//! `memfit max-batch`: the largest batch whose training step fits a budget. The formula module
//! predicts the tensors (`predict --fit-in`'s search); the budget, though, caps the whole case
//! process's heap, which also holds what no tensor formula counts and what depends on this
//! machine: gemm's packing buffers kept from the warm-up (sized by this CPU's caches), thread
//! pools, bookkeeping. So the prediction adds that part, measured here: one train step run
//! without the cap at the formula's answer gives the heap's peak (`heap_start_bytes +
//! peak_bytes`), its excess over the formula's total is the process's own part, and the largest
//! batch whose formula total plus that part fits is the prediction — measured again at that
//! batch until the answer stops moving (at most four runs; one or two in practice), so the part
//! is the one at the answer itself and the answer never over-promises on any CPU. Trials then
//! run `memfit run --phases train-step` at chosen batches, each in a child process (on the CPU
//! with `--mem-budget`, so running out aborts only the child), searching around the prediction
//! for the largest batch that passes.

use std::process::Command;

use crate::cli::MaxBatchArgs;
use crate::formula::budget;
use crate::formula::transformer::Shape;
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
    /// The formula's answer from the tensors alone.
    pub formula_predicted: usize,
    /// The case process's heap beyond the formula's total, measured on this machine at
    /// `overhead_batch` (`None`: the uncapped run gave no heap figure, e.g. on CUDA).
    pub process_overhead_bytes: Option<i64>,
    pub overhead_batch: Option<usize>,
    /// A mixture of experts: the routing the prediction assumes (`worst` or `balanced`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routing: Option<&'static str>,
    /// The answer: the largest batch whose formula total plus the measured part fits.
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
    let case = &cases[0];
    let shape = Shape::of(case);
    let moe = case.cfg.llama.and_then(|l| l.moe).is_some();
    // The tensors at batch `b` with the routing asked for (MoE only) and with the balanced one,
    // the routing the process's own part is measured against (a trial runs the model's router,
    // which spreads tokens nearly evenly).
    let total_with = |b: u64, worst: bool| {
        Shape {
            b,
            worst_routing: worst,
            ..shape.clone()
        }
        .train_total_bytes(case.optimizer, args.threads)
    };
    let worst = moe && args.routing.worst();
    let fit = Shape {
        worst_routing: worst,
        ..shape.clone()
    };
    let largest =
        |extra: i64| budget::max_batch(&fit, budget, case.optimizer, args.threads, extra) as usize;
    // `predict --fit-in`'s max batch: the same search.
    let formula_predicted = largest(0);
    // The process's own part, measured at the answer until the answer stops moving.
    let (mut predicted, mut at) = (formula_predicted, formula_predicted.max(1));
    let (mut overhead, mut overhead_batch) = (None, None);
    for _ in 0..4 {
        let Some(heap_peak) = heap_peak(at, args.threads)? else {
            break;
        };
        let gap = heap_peak as i64 - total_with(at as u64, false) as i64;
        (overhead, overhead_batch) = (Some(gap), Some(at));
        predicted = largest(gap);
        if predicted == at || predicted == 0 {
            break;
        }
        at = predicted;
    }
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
        formula_predicted,
        process_overhead_bytes: overhead,
        overhead_batch,
        routing: moe.then_some(if worst { "worst" } else { "balanced" }),
        predicted,
        found: lo,
        trials,
    };
    if args.json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!(
            "budget {}: predicted largest batch {}{} (tensors alone: {}; this process's own heap: {}), found {} ({} trial(s): {})",
            args.budget,
            out.predicted,
            out.routing
                .map_or(String::new(), |r| format!(" with {r} routing (--routing)")),
            out.formula_predicted,
            match (out.process_overhead_bytes, out.overhead_batch) {
                (Some(g), Some(b)) => format!("{g} B measured at batch {b}"),
                _ => "not measured".into(),
            },
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
    let rows = child_rows(batch, Some(budget), threads)?;
    Ok(!rows.is_empty() && rows.iter().all(|r| r.status == Status::Ok))
}

/// The heap's peak of the training step at `batch` run without the cap: the bytes held when
/// its window opened plus the window's peak (`None` when the run gave no such figure).
fn heap_peak(batch: usize, threads: usize) -> anyhow::Result<Option<u64>> {
    let rows = child_rows(batch, None, threads)?;
    Ok(match rows.as_slice() {
        [r] if r.status == Status::Ok => r.heap_start_bytes.zip(r.peak_bytes).map(|(a, b)| a + b),
        _ => None,
    })
}

/// The rows of the case's training step at `batch` in a child `memfit run` (under `budget`
/// when given); empty when the child wrote none.
fn child_rows(
    batch: usize,
    budget: Option<&str>,
    threads: usize,
) -> anyhow::Result<Vec<crate::record::Row>> {
    let dir = tempfile_dir()?;
    let mut args: Vec<String> = passthrough_args();
    args.extend([
        "--batch".into(),
        batch.to_string(),
        "--phases".into(),
        "train-step".into(),
        "--threads".into(),
        threads.to_string(),
        "--quiet".into(),
        "--out".into(),
        dir.join("out").display().to_string(),
    ]);
    if let Some(b) = budget {
        args.extend(["--mem-budget".into(), b.into()]);
    }
    let status = Command::new(std::env::current_exe()?)
        .arg("run")
        .args(&args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()?;
    let rows =
        crate::store::jsonl::read(&dir.join("out").join("results.jsonl")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    // A trial that ran out of memory still wrote its rows (`run` exits 3 then).
    let wrote = status.success() || status.code() == Some(crate::sweep::CasesFailed::EXIT.into());
    Ok(if wrote { rows } else { Vec::new() })
}

/// The workload flags this `max-batch` was given, to hand to the trials (without its own
/// options and the batch, which the trial sets).
fn passthrough_args() -> Vec<String> {
    let all: Vec<String> = std::env::args().skip(1).collect();
    let skip_with_value = [
        "--budget",
        "--batch",
        "--threads",
        "--phases",
        "--out",
        "--routing",
    ];
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
