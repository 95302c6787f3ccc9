//! How long a case will likely take, for `memfit run --deadline`: from the cases already
//! finished in this run, scaled by each case's predicted work.
//!
//! A model case's work is `W = F_asked + F_warm-up + 1000·P·(phases + 1)`: the matmul FLOPs of
//! its asked phases and of the unmetered warm-up (one training step and one inference forward,
//! `crate::formula::flops`), plus a term for the per-element work that is not matmuls (random
//! initialisation, optimizer updates, copies; `P` parameters, 1000 FLOP-equivalents each per
//! phase, ≈ 20 ns at this CPU's 50 GFLOP/s). Finished cases fit `seconds = a + b·W` by least
//! squares (a ≥ 0, b ≥ 0; with one case, or costs all equal, `b = seconds / W`). The estimate
//! is that line times 1.25. Data-loading cases are estimated by the mean of the finished ones.
//! With nothing to go by there is no estimate, and the case starts if time is left at all.

use crate::formula::flops::FlopCase;
use crate::record::Row;
use crate::step::Phase;

/// Safety factor on the fitted line.
pub const MARGIN: f64 = 1.25;

/// Predicted work of the case whose skeleton row is `row` (any phase), for `phases`.
pub fn work(row: &Row, phases: &[Phase]) -> Option<f64> {
    if !row.dataset.is_empty() || row.model.is_empty() {
        return None;
    }
    let f = FlopCase::of_row(row);
    let flops = |p: Phase| f.phase(p).unwrap_or(0) as f64;
    let asked: f64 = phases.iter().map(|&p| flops(p)).sum();
    let warm = flops(Phase::TrainStep) + flops(Phase::Inference);
    Some(asked + warm + 1000.0 * row.params as f64 * (phases.len() as f64 + 1.0))
}

/// Finished cases' work and seconds.
#[derive(Debug, Default)]
pub struct Estimator {
    model: Vec<(f64, f64)>,
    data: Vec<f64>,
}

impl Estimator {
    /// Records a finished case (`work` as from [`work`], `None` for a data-loading case).
    pub fn record(&mut self, work: Option<f64>, seconds: f64) {
        match work {
            Some(w) => self.model.push((w, seconds)),
            None => self.data.push(seconds),
        }
    }

    /// Estimated seconds of a case with `work`, or `None` when no finished case says.
    pub fn estimate(&self, work: Option<f64>) -> Option<f64> {
        match work {
            None => (!self.data.is_empty())
                .then(|| MARGIN * self.data.iter().sum::<f64>() / self.data.len() as f64),
            Some(w) => {
                let (a, b) = fit(&self.model)?;
                Some(MARGIN * (a + b * w))
            }
        }
    }
}

/// `seconds = a + b·work` by least squares with `a, b ≥ 0`.
fn fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    if points.is_empty() {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let proportional = || (0.0, if mx > 0.0 { my / mx } else { 0.0 });
    if points.len() < 2 || sxx <= f64::EPSILON * mx * mx {
        // One point (or all alike): through the origin, so a bigger case takes longer.
        return Some(if mx > 0.0 { proportional() } else { (my, 0.0) });
    }
    let b = sxy / sxx;
    let a = my - b * mx;
    Some(if b < 0.0 {
        (my, 0.0)
    } else if a < 0.0 {
        // Through the origin: b = Σxy / Σx².
        let sxy0: f64 = points.iter().map(|p| p.0 * p.1).sum();
        let sxx0: f64 = points.iter().map(|p| p.0 * p.0).sum();
        (0.0, sxy0 / sxx0)
    } else {
        (a, b)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_through_finished_cases_scales_to_bigger_ones() {
        let mut e = Estimator::default();
        assert_eq!(e.estimate(Some(1e9)), None, "nothing finished yet");
        e.record(Some(1e9), 1.0);
        // One point: proportional.
        assert!((e.estimate(Some(4e9)).unwrap() - MARGIN * 4.0).abs() < 1e-9);
        e.record(Some(3e9), 2.0);
        // a = 0.5 s, b = 0.5 s per 1e9.
        assert!((e.estimate(Some(5e9)).unwrap() - MARGIN * 3.0).abs() < 1e-9);
        assert_eq!(e.estimate(None), None, "no dataload case yet");
        e.record(None, 4.0);
        e.record(None, 2.0);
        assert!((e.estimate(None).unwrap() - MARGIN * 3.0).abs() < 1e-9);
    }

    #[test]
    fn the_fit_never_goes_negative() {
        // Bigger cases faster (noise): flat at the mean.
        assert_eq!(fit(&[(1.0, 2.0), (2.0, 1.0)]), Some((1.5, 0.0)));
        // A negative intercept: through the origin instead.
        let (a, b) = fit(&[(1.0, 0.1), (2.0, 2.0), (3.0, 4.0)]).unwrap();
        assert_eq!(a, 0.0);
        assert!(b > 0.0);
    }

    #[test]
    fn work_counts_the_warm_up_and_grows_with_the_case() {
        let r = Row::example();
        let small = work(&r, &[Phase::Init, Phase::Forward]).unwrap();
        let big = work(
            &Row {
                batch: 8,
                ..Row::example()
            },
            &[Phase::Init, Phase::Forward],
        )
        .unwrap();
        assert!(big > small && small > 0.0);
        let data = Row {
            dataset: "d".into(),
            ..Row::example()
        };
        assert_eq!(work(&data, &[Phase::Dataload]), None);
    }
}
