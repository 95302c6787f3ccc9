//! Fitting formulas to stored measurements (never measures): least squares with standard
//! errors and R², and held-out validation (k-fold over cases, and an extrapolation split that
//! fits the smaller half of the configs by parameter count and tests on the larger half).
//!
//! The generic model of a phase's peak is `bytes = c₀ + c₁·P + c₂·B·S·H·L + c₃·A·B·S²·L +
//! c₄·B·S·V` (P parameters; the activation terms of a decoder; a ViT's head sees the class
//! token only, so its last term is `B·K`, S = 1 at the head). Features that do not vary in a
//! group are dropped before solving (their coefficient is reported as 0 with no error), so small
//! groups still fit; the solve uses an SVD, so collinear features give the minimum-norm solution
//! instead of failing.
//!
//! What is fitted, one file each: `group` (that model per group of comparable rows, for
//! `memfit fit` and the report's fit table), `dataload` (the data pipeline's RAM formula and
//! throughput curves), `calibration` (the analytical predictions against the measurements),
//! `components` (their errors and under-estimates per component of memory) and
//! `textbook` (the literature's formulas on the same rows). The commands call them; the report
//! only reads their results.

pub mod calibration;
pub mod components;
pub mod dataload;
pub mod group;
pub mod line;
pub mod textbook;

use nalgebra::{DMatrix, DVector};

use crate::record::Row;

/// Names of the features of [`features`], in order.
pub const FEATURES: [&str; 5] = ["1", "P", "B·S·H·L", "A·B·S²·L", "B·S·V"];

/// The features of a row.
pub fn features(r: &Row) -> [f64; 5] {
    let (b, s, h, a, l, v) = (
        r.batch as f64,
        r.seq as f64,
        r.hidden as f64,
        r.heads as f64,
        r.layers as f64,
        r.vocab as f64,
    );
    let head_seq = if r.model == "vit" { 1.0 } else { s };
    [
        1.0,
        r.params as f64,
        b * s * h * l,
        a * b * s * s * l,
        b * head_seq * v,
    ]
}

/// A least-squares fit.
#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    pub coef: Vec<f64>,
    /// Standard errors (NaN where there are no residual degrees of freedom or the feature was
    /// constant and dropped).
    pub stderr: Vec<f64>,
    pub r2: f64,
    /// Features actually used (varying in the data).
    pub used: Vec<bool>,
}

impl Fit {
    pub fn predict(&self, x: &[f64]) -> f64 {
        self.coef.iter().zip(x).map(|(c, v)| c * v).sum()
    }
}

/// Ordinary least squares of `y` on the columns of `x` (one row per observation). Columns that
/// are constant across the rows — other than a leading column of ones — are dropped.
pub fn least_squares(x: &[Vec<f64>], y: &[f64]) -> Option<Fit> {
    let n = y.len();
    if n == 0 || x.len() != n {
        return None;
    }
    let p = x[0].len();
    let used: Vec<bool> = (0..p)
        .map(|j| j == 0 || x.iter().any(|row| row[j] != x[0][j]))
        .collect();
    let cols: Vec<usize> = (0..p).filter(|&j| used[j]).collect();
    let k = cols.len();
    // Scale each column to unit max magnitude: the SVD's tolerance then means the same for
    // parameters (1e8) and constants (1).
    let scale: Vec<f64> = cols
        .iter()
        .map(|&j| {
            x.iter()
                .fold(0f64, |m, r| m.max(r[j].abs()))
                .max(f64::MIN_POSITIVE)
        })
        .collect();
    let a = DMatrix::from_fn(n, k, |i, c| x[i][cols[c]] / scale[c]);
    let b = DVector::from_column_slice(y);
    let svd = a.clone().svd(true, true);
    let beta = svd.solve(&b, 1e-12).ok()?;
    let fitted = &a * &beta;
    let mean = y.iter().sum::<f64>() / n as f64;
    let ss_res: f64 = (0..n).map(|i| (y[i] - fitted[i]).powi(2)).sum();
    let ss_tot: f64 = y.iter().map(|v| (v - mean).powi(2)).sum();
    let r2 = if ss_tot > 0.0 {
        1.0 - ss_res / ss_tot
    } else {
        1.0
    };
    // Standard errors: σ²·(AᵀA)⁻¹ on the diagonal, with σ² = SS_res / (n − k).
    let dof = n as i64 - k as i64;
    let ata_inv = (a.transpose() * &a).try_inverse();
    let mut coef = vec![0.0; p];
    let mut stderr = vec![f64::NAN; p];
    for (c, &j) in cols.iter().enumerate() {
        coef[j] = beta[c] / scale[c];
        if let (true, Some(inv)) = (dof > 0, ata_inv.as_ref()) {
            let sigma2 = ss_res / dof as f64;
            stderr[j] = (sigma2 * inv[(c, c)]).max(0.0).sqrt() / scale[c];
        }
    }
    Some(Fit {
        coef,
        stderr,
        r2,
        used,
    })
}

/// Held-out errors in percent of the measured value: mean and max of |predicted − measured|.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HeldOut {
    pub mean_pct: f64,
    pub max_pct: f64,
    pub tested: usize,
}

fn errors(fit: &Fit, x: &[Vec<f64>], y: &[f64], idx: &[usize], acc: &mut Vec<f64>) {
    for &i in idx {
        if y[i] != 0.0 {
            acc.push(((fit.predict(&x[i]) - y[i]) / y[i]).abs() * 100.0);
        }
    }
}

fn summarize(errs: &[f64]) -> Option<HeldOut> {
    (!errs.is_empty()).then(|| HeldOut {
        mean_pct: errs.iter().sum::<f64>() / errs.len() as f64,
        max_pct: errs.iter().fold(0f64, |m, e| m.max(*e)),
        tested: errs.len(),
    })
}

/// k-fold cross-validation (folds by position `i mod k`): every observation predicted by a fit
/// that did not see it. `None` with fewer than `k + 1` observations... or `k < 2`.
pub fn k_fold(x: &[Vec<f64>], y: &[f64], k: usize) -> Option<HeldOut> {
    if k < 2 || y.len() <= k {
        return None;
    }
    let mut errs = Vec::new();
    for f in 0..k {
        let (test, train): (Vec<usize>, Vec<usize>) = (0..y.len()).partition(|i| i % k == f);
        let xt: Vec<Vec<f64>> = train.iter().map(|&i| x[i].clone()).collect();
        let yt: Vec<f64> = train.iter().map(|&i| y[i]).collect();
        let fit = least_squares(&xt, &yt)?;
        errors(&fit, x, y, &test, &mut errs);
    }
    summarize(&errs)
}

/// Extrapolation held out by size: the distinct sizes (parameter counts: one per config) are
/// split in half; the fit sees every observation of the smaller half of the configs and is
/// tested on every observation of the larger half. `None` with fewer than two distinct sizes.
pub fn extrapolation(x: &[Vec<f64>], y: &[f64], size: &[f64]) -> Option<HeldOut> {
    let mut distinct: Vec<f64> = size.to_vec();
    distinct.sort_by(f64::total_cmp);
    distinct.dedup();
    if distinct.len() < 2 {
        return None;
    }
    let cut = distinct[distinct.len() / 2 - 1];
    let (small, large): (Vec<usize>, Vec<usize>) = (0..y.len()).partition(|&i| size[i] <= cut);
    let xt: Vec<Vec<f64>> = small.iter().map(|&i| x[i].clone()).collect();
    let yt: Vec<f64> = small.iter().map(|&i| y[i]).collect();
    let fit = least_squares(&xt, &yt)?;
    let mut errs = Vec::new();
    errors(&fit, x, y, &large, &mut errs);
    summarize(&errs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A textbook simple regression: y = (1, 3, 2, 5, 4) on x = 1..5. By hand: slope 8/10 = 0.8,
    /// intercept 3 − 0.8·3 = 0.6; residuals −0.4, 0.8, −1, 1.2, −0.6, SS_res 3.6, SS_tot 10,
    /// R² 0.64; σ² = 3.6/3 = 1.2, se(slope) = √(1.2/10) = 0.34641, se(intercept) =
    /// √(1.2·(1/5 + 9/10)) = 1.14891.
    #[test]
    fn textbook_regression() {
        let x: Vec<Vec<f64>> = (1..=5).map(|v| vec![1.0, v as f64]).collect();
        let fit = least_squares(&x, &[1.0, 3.0, 2.0, 5.0, 4.0]).unwrap();
        assert!((fit.coef[0] - 0.6).abs() < 1e-9 && (fit.coef[1] - 0.8).abs() < 1e-9);
        assert!((fit.r2 - 0.64).abs() < 1e-12);
        assert!((fit.stderr[1] - 0.346_410_161_5).abs() < 1e-9);
        assert!((fit.stderr[0] - 1.148_912_529_3).abs() < 1e-9);
    }

    /// Noise-free data from known coefficients of the decoder features is recovered exactly,
    /// and held-out errors are zero (12 configs: every 4-fold training set and the smaller half
    /// have more rows than features).
    #[test]
    fn exact_recovery_and_zero_held_out_error() {
        let truth = [4096.0, 4.0, 39.0 * 4.0, 24.0, 16.0];
        let mut x = Vec::new();
        let mut y = Vec::new();
        let mut size = Vec::new();
        for i in 0..12u64 {
            let (b, s, h, a, l, v) = (
                1 + i % 4,
                16 + 7 * i,
                32 + 16 * (i % 5),
                1 + i % 3,
                1 + (i * 7) % 4,
                50 + 97 * ((i * 5) % 7),
            );
            let p = (2 * v * h + s * h + l * (12 * h * h + 13 * h) + 2 * h) as f64;
            let f = [
                1.0,
                p,
                (b * s * h * l) as f64,
                (a * b * s * s * l) as f64,
                (b * s * v) as f64,
            ];
            y.push(f.iter().zip(truth).map(|(a, b)| a * b).sum());
            x.push(f.to_vec());
            size.push(p);
        }
        let fit = least_squares(&x, &y).unwrap();
        for (c, t) in fit.coef.iter().zip(truth) {
            assert!((c - t).abs() < 1e-6 * t.max(1.0), "{c} vs {t}");
        }
        assert!((fit.r2 - 1.0).abs() < 1e-12);
        let kf = k_fold(&x, &y, 4).unwrap();
        assert!(kf.max_pct < 1e-6 && kf.tested == 12, "{kf:?}");
        let ex = extrapolation(&x, &y, &size).unwrap();
        assert!(ex.max_pct < 1e-6 && ex.tested == 6, "{ex:?}");
    }

    #[test]
    fn constant_features_are_dropped_not_fatal() {
        let x: Vec<Vec<f64>> = (0..4).map(|i| vec![1.0, 7.0, i as f64]).collect();
        let fit = least_squares(&x, &[1.0, 3.0, 5.0, 7.0]).unwrap();
        assert_eq!(fit.used, vec![true, false, true]);
        assert!((fit.coef[2] - 2.0).abs() < 1e-9 && (fit.coef[0] - 1.0).abs() < 1e-9);
        assert_eq!(fit.coef[1], 0.0);
    }
}
