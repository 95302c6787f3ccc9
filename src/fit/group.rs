//! The per-group fits of `memfit fit` and `memfit report` (reads rows, never measures): rows
//! measured under the same conditions — phase, model, device, element type, precision,
//! attention, checkpointing, LoRA rank, optimizer, serving weights (decode with and without
//! its KV cache apart), for the backward and train step the backward's mode, and the kernels
//! (fused or candle's composed ops: their saved tensors differ, so one line through both missed
//! their points by up to 77 %) — form a group ([`key`]), and each group's measured peak is fitted by
//! least squares ([`crate::fit::least_squares`]) to the features of [`crate::fit::features`]:
//!
//! `peak_bytes = c₀ + c₁·P + c₂·B·S·H·L + c₃·A·B·S²·L + c₄·B·S·V`
//!
//! with R², the largest in-sample error, and the held-out errors of [`crate::fit::k_fold`]
//! (5 folds over cases) and [`crate::fit::extrapolation`] (small configs → large ones). A
//! feature the group holds constant is dropped before solving and reported as missing, never
//! as 0; rows without a measured peak are left out.

use crate::fit::{self, FEATURES, HeldOut};
use crate::record::Row;
use crate::step::Phase;

/// Rows measured under the same conditions: one fit each.
pub type GroupKey = (
    String,
    String,
    String,
    String,
    String,
    String,
    u64,
    u64,
    String,
    String,
    String,
    String,
);

pub fn key(r: &Row) -> GroupKey {
    (
        r.phase.to_string(),
        r.model.clone(),
        r.device.clone(),
        r.dtype.clone(),
        r.precision.clone(),
        r.attention.clone(),
        r.checkpoint,
        r.lora_rank,
        r.optimizer.clone(),
        // Decoding with and without the cache are different computations: separate fits.
        if r.phase == Phase::Decode {
            format!("{} kv-{}", r.weights, r.kv_cache)
        } else {
            r.weights.clone()
        },
        // The backward's mode changes the backward and train-step peaks only.
        if matches!(r.phase, Phase::Backward | Phase::TrainStep) {
            r.backward.clone()
        } else {
            String::new()
        },
        r.kernels.clone(),
    )
}

/// One group's fit and its held-out errors.
#[derive(Debug, serde::Serialize)]
pub struct GroupFit {
    pub phase: String,
    pub device: String,
    pub dtype: String,
    pub variant: String,
    pub rows: usize,
    /// (feature, coefficient, standard error): `None` for a feature the group holds constant
    /// (dropped before solving: the intercept carries it) or when the fit failed, and a
    /// standard error of `None` without residual degrees of freedom.
    pub coefficients: Vec<(String, Option<f64>, Option<f64>)>,
    pub r2: f64,
    pub in_sample_max_pct: f64,
    pub kfold: Option<(f64, f64)>,
    pub extrapolation: Option<(f64, f64)>,
}

impl GroupFit {
    /// The fitted line as text: `c·feature` for each solved term, then the dropped ones named
    /// (`—`: constant in the group, carried by the intercept), or `—` when nothing was fitted.
    pub fn formula(&self) -> String {
        let terms: Vec<String> = self
            .coefficients
            .iter()
            .filter_map(|(n, c, _)| c.map(|c| format!("{c:.4}·{n}")))
            .collect();
        let dropped: Vec<&str> = self
            .coefficients
            .iter()
            .filter(|(_, c, _)| c.is_none())
            .map(|(n, _, _)| n.as_str())
            .collect();
        match (terms.is_empty(), dropped.is_empty()) {
            (true, _) => "—".into(),
            (false, true) => terms.join(" + "),
            (false, false) => format!(
                "{} (— for {}: constant in the group)",
                terms.join(" + "),
                dropped.join(", ")
            ),
        }
    }

    /// The fitted bytes of features `x`; `None` when the group has no fit.
    pub fn predict(&self, x: &[f64]) -> Option<f64> {
        if self.coefficients.iter().all(|(_, c, _)| c.is_none()) {
            return None;
        }
        // A dropped feature is constant in the group: the intercept already holds its part.
        let v: f64 = self
            .coefficients
            .iter()
            .zip(x)
            .filter_map(|((_, c, _), xi)| c.map(|c| c * xi))
            .sum();
        v.is_finite().then_some(v)
    }
}

/// The fit of one group. Rows without a measured peak are left out (never read as 0).
pub fn fit_group(k: &GroupKey, rows: &[Row]) -> GroupFit {
    let rows: Vec<&Row> = rows.iter().filter(|r| r.peak_bytes.is_some()).collect();
    let x: Vec<Vec<f64>> = rows.iter().map(|r| fit::features(r).to_vec()).collect();
    let y: Vec<f64> = rows
        .iter()
        .filter_map(|r| r.peak_bytes.map(|v| v as f64))
        .collect();
    let size: Vec<f64> = rows.iter().map(|r| r.params as f64).collect();
    let f = fit::least_squares(&x, &y);
    let pair = |h: Option<HeldOut>| h.map(|h| (h.mean_pct, h.max_pct));
    let in_sample = f.as_ref().map_or(f64::NAN, |f| {
        x.iter()
            .zip(&y)
            .filter(|(_, v)| **v != 0.0)
            .map(|(xi, v)| ((f.predict(xi) - v) / v).abs() * 100.0)
            .fold(0.0, f64::max)
    });
    GroupFit {
        phase: k.0.clone(),
        device: k.2.clone(),
        dtype: k.3.clone(),
        variant: format!(
            "{} {} {} ck{} lora{} {} {}{} {}",
            k.1,
            k.4,
            k.5,
            k.6,
            k.7,
            k.8,
            k.9,
            if k.10.is_empty() {
                String::new()
            } else {
                format!(" {}", k.10)
            },
            k.11
        ),
        rows: rows.len(),
        coefficients: FEATURES
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let (c, e) = f.as_ref().map_or((None, None), |f| {
                    if f.used[i] {
                        (Some(f.coef[i]), Some(f.stderr[i]).filter(|e| e.is_finite()))
                    } else {
                        (None, None)
                    }
                });
                (n.to_string(), c, e)
            })
            .collect(),
        r2: f.as_ref().map_or(f64::NAN, |f| f.r2),
        in_sample_max_pct: in_sample,
        kfold: pair(fit::k_fold(&x, &y, 5)),
        extrapolation: pair(fit::extrapolation(&x, &y, &size)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Forward rows differing in batch only: P, and the terms of S, H, A, L, V that do not vary
    /// apart from B, are fitted or dropped; a dropped feature prints as — (never 0.0000) and
    /// is `None` in JSON. A row without a peak is left out of the fit.
    #[test]
    fn dropped_features_are_missing_not_zero() {
        let rows: Vec<Row> = (1..=4u64)
            .map(|b| {
                let mut r = Row::example();
                r.phase = Phase::Forward;
                r.batch = b;
                r.peak_bytes = (b != 3).then_some(1000 + 500 * b);
                r
            })
            .collect();
        let g = fit_group(&key(&rows[0]), &rows);
        assert_eq!(g.rows, 3);
        let p = &g.coefficients[1];
        assert_eq!((p.0.as_str(), p.1), ("P", None));
        let f = g.formula();
        assert!(f.contains("— for P") && !f.contains("0.0000·P"), "{f}");
        let json = serde_json::to_string(&g).unwrap();
        assert!(json.contains(r#"["P",null,null]"#), "{json}");
        // The fit reproduces a measured row: 1000 + 500·2.
        let two = g.predict(&fit::features(&rows[1])).unwrap();
        assert!((two - 2000.0).abs() < 1e-6, "{two}");
    }
}
