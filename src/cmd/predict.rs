//! `memfit predict`: every phase's memory for the cases of a workload (or flags), from the
//! formula module alone — nothing is run. Per case: the model state (weights, gradients,
//! optimizer state), the graph a training forward keeps, each phase's peak above its baseline,
//! the totals in use at the training step's and at inference's peak, and with `--fit-in` whether
//! the training step fits and the largest batch that would.

use crate::cli::PredictArgs;
use crate::formula::transformer::Shape;
use crate::phase::Phase;
use crate::units;

fn human_bytes(b: u64) -> String {
    units::human_bytes(b as f64)
}
use crate::workload::{self, Case, WorkloadFile};

/// What `predict` says about one case.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CasePrediction {
    pub case: usize,
    /// `gpt` or `vit`.
    pub model: String,
    pub preset: String,
    pub batch: usize,
    pub seq: usize,
    pub params: u64,
    pub weights_bytes: u64,
    pub gradient_bytes: u64,
    pub optimizer_state_bytes: u64,
    pub graph_bytes: u64,
    /// Peak above its baseline, per phase of the case.
    pub phase_peak_bytes: Vec<(String, u64)>,
    /// Weights + the input batch + optimizer state + the training step's peak.
    pub train_total_bytes: u64,
    /// Weights + the inference forward's peak.
    pub inference_total_bytes: u64,
    pub fits: Option<bool>,
    /// Largest batch whose training step fits the budget (0: not even batch 1).
    pub max_batch: Option<usize>,
    /// With `--calibration`: each phase's peak corrected by the stored measurements.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibrated: Option<Vec<crate::fit::calibration::Calibrated>>,
}

pub fn predict(args: &PredictArgs) -> anyhow::Result<()> {
    let (file, origin) = match &args.workload {
        Some(path) => (workload::load(path)?, path.display().to_string()),
        None if args.grid.has_grid_flags() => (WorkloadFile::default(), "flags".to_string()),
        None => (
            workload::parse(workload::DEFAULT_TOML, "<embedded default>")?,
            "<embedded default>".to_string(),
        ),
    };
    let mut cases = workload::expand_for_prediction(&file, &args.grid.grid_flags(), &origin)?;
    // dataload cases build no model: nothing to predict (their RAM formula is fitted from
    // measurements, `memfit fit`).
    cases.retain(|c| c.data.is_none());
    let budget = args
        .fit_in
        .as_deref()
        .map(|v| units::parse_size(v, "fit-in"))
        .transpose()?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let calibration = args
        .calibration
        .as_deref()
        .map(crate::fit::calibration::load)
        .transpose()?;
    // Every case first, so a calibration that lacks a case's rows fails before any output.
    let mut predictions = Vec::with_capacity(cases.len());
    for case in &cases {
        let mut p = predict_case(case, threads, budget);
        if let Some(c) = &calibration {
            p.calibrated = Some(c.apply(
                &case.device.to_string(),
                case.dtype.as_str(),
                &p.phase_peak_bytes,
            )?);
        }
        predictions.push(p);
    }
    if !args.json {
        println!(
            "{:>4} {:<14} {:>5} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}{}",
            "case",
            "preset",
            "B",
            "S",
            "weights",
            "grads",
            "opt state",
            "graph",
            "train total",
            "infer total",
            "train step",
            if budget.is_some() {
                "  fits  max B"
            } else {
                ""
            }
        );
    }
    for p in predictions {
        if args.json {
            println!("{}", serde_json::to_string(&p)?);
        } else {
            let step = p
                .phase_peak_bytes
                .iter()
                .find(|(ph, _)| ph == "train-step")
                .map_or("-".to_string(), |(_, b)| human_bytes(*b));
            let fit = match (p.fits, p.max_batch) {
                (Some(f), Some(m)) => format!("  {:<5} {m:>5}", if f { "yes" } else { "no" }),
                _ => String::new(),
            };
            println!(
                "{:>4} {:<14} {:>5} {:>6} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}{fit}",
                p.case,
                p.preset,
                p.batch,
                p.seq,
                human_bytes(p.weights_bytes),
                human_bytes(p.gradient_bytes),
                human_bytes(p.optimizer_state_bytes),
                human_bytes(p.graph_bytes),
                human_bytes(p.train_total_bytes),
                human_bytes(p.inference_total_bytes),
                step,
            );
            for c in p.calibrated.iter().flatten() {
                println!(
                    "       {:<10} analytical {:>12}  calibrated {:>12}  ({} rows; held out mean/max {}; by size {})",
                    c.phase,
                    human_bytes(c.analytical_bytes),
                    human_bytes(c.calibrated_bytes),
                    c.rows,
                    c.held_out_pct
                        .map_or("— (under 3 rows)".into(), |(a, m)| format!(
                            "5-fold {a:.3}/{m:.3} %"
                        )),
                    match (c.by_size_pct, c.by_size_fit_params) {
                        (Some((a, m)), Some(p)) => format!(
                            "{a:.3}/{m:.3} % (fitted on configs ≤ {p} parameters, tested on the larger)"
                        ),
                        _ => "— (one config size)".into(),
                    }
                );
            }
        }
    }
    Ok(())
}

/// The prediction of one case (and, with a budget, the largest batch that fits).
pub fn predict_case(case: &Case, threads: usize, budget: Option<u64>) -> CasePrediction {
    let shape = Shape::of(case);
    let at = |phase| shape.predict(phase, case.optimizer, threads).peak_bytes;
    let train_total = |s: &Shape| {
        s.weights_bytes()
            + s.input_bytes()
            + s.optimizer_state_bytes(case.optimizer)
            + s.predict(Phase::TrainStep, case.optimizer, threads)
                .peak_bytes
    };
    let (fits, max_batch) = match budget {
        None => (None, None),
        Some(b) => {
            let total_at = |batch: u64| train_total(&Shape { b: batch, ..shape });
            // Memory grows with the batch: the largest batch ≤ 2^20 whose step fits.
            let (mut lo, mut hi) = (0u64, 1u64 << 20);
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                if total_at(mid) <= b {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            (Some(train_total(&shape) <= b), Some(lo as usize))
        }
    };
    CasePrediction {
        case: case.index,
        model: case.model.as_str().to_string(),
        preset: case.preset.clone(),
        batch: case.batch,
        seq: case.seq,
        params: shape.params(),
        weights_bytes: shape.weights_bytes(),
        gradient_bytes: shape.gradient_bytes(),
        optimizer_state_bytes: shape.optimizer_state_bytes(case.optimizer),
        graph_bytes: shape
            .predict(Phase::Forward, case.optimizer, threads)
            .retained_bytes
            .max(0) as u64,
        phase_peak_bytes: case
            .phases
            .iter()
            .map(|&ph| (ph.as_str().to_string(), at(ph)))
            .collect(),
        train_total_bytes: train_total(&shape),
        inference_total_bytes: shape.weights_bytes() + at(Phase::Inference),
        fits,
        max_batch,
        calibrated: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        let p = |s| units::parse_size(s, "fit-in");
        assert_eq!(p("80GiB").unwrap(), 80 << 30);
        assert_eq!(p("24G").unwrap(), 24 << 30);
        assert_eq!(p("512 MiB").unwrap(), 512 << 20);
        assert_eq!(p("1.5TB").unwrap(), 1_500_000_000_000);
        assert_eq!(p("1000").unwrap(), 1000);
        assert!(p("lots").is_err());
        assert!(p("-3G").is_err());
        assert!(p("0").is_err());
    }
}
