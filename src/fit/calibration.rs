//! Calibration of the analytical predictions against stored measurements (`memfit predict
//! --calibration`): per phase, device kind (`cpu`, `cuda`) and element type, the least-squares
//! line `measured ≈ a + b·predicted` over the stored rows that have both figures, with its
//! 5-fold held-out error (n − 1 folds below six rows: `fit::k_fold` needs more rows than folds). Applying it to a new case's
//! analytical peak gives the calibrated peak. On the CPU, where the formulas are exact, the line
//! is ≈ `0 + 1·predicted`; on CUDA it absorbs what kernels and cuBLAS allocate beyond tensors.

use std::collections::BTreeMap;
use std::path::Path;

use super::{HeldOut, k_fold, least_squares};
use crate::error::UserError;
use crate::record::{Row, Status};

/// Reads the stored rows under `path` (a results file or a folder searched like `memfit fit`'s
/// arguments) and fits the corrections.
pub fn load(path: &Path) -> anyhow::Result<Calibration> {
    if !path.exists() {
        return Err(UserError::Unreadable {
            origin: path.display().to_string(),
            what: "calibration results",
            message: "no such file or folder".into(),
        }
        .into());
    }
    let mut rows = Vec::new();
    let mut runtimes = Vec::new();
    for f in crate::store::result_files(path)? {
        let (r, meta) = crate::store::read_rows_and_meta(&f)?;
        rows.extend(r);
        if let Some(m) = meta {
            let rt = Runtime::of(&m);
            if !runtimes.contains(&rt) {
                runtimes.push(rt);
            }
        }
    }
    let mut c = Calibration::fit(&rows);
    c.origin = path.display().to_string();
    c.runtimes = runtimes;
    Ok(c)
}

/// The software a calibration's rows were measured with: memfit's version and commit,
/// candle's version, and on CUDA the driver and runtime versions. Constants fitted under one
/// runtime may not hold under another (kernels, cuBLAS and allocators change their memory
/// between releases).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Runtime {
    pub memfit_version: String,
    pub git_commit: String,
    pub candle_version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_version: Option<String>,
}

impl Runtime {
    pub fn of(m: &crate::record::RunMeta) -> Self {
        Self {
            memfit_version: m.memfit_version.clone(),
            git_commit: m.git_commit.clone(),
            candle_version: m.candle_version.clone(),
            driver_version: m.driver_version.clone(),
            cuda_version: m.cuda_version.clone(),
        }
    }

    /// This binary (no device is touched: driver and runtime unknown).
    pub fn current() -> Self {
        Self {
            memfit_version: env!("CARGO_PKG_VERSION").into(),
            git_commit: env!("MEMFIT_GIT_COMMIT").into(),
            candle_version: env!("MEMFIT_CANDLE_VERSION").into(),
            driver_version: None,
            cuda_version: None,
        }
    }

    /// Same memfit and candle releases (commits may differ).
    pub fn same_release(&self, other: &Runtime) -> bool {
        (&self.memfit_version, &self.candle_version)
            == (&other.memfit_version, &other.candle_version)
    }
}

impl std::fmt::Display for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "memfit {} ({}), candle {}",
            self.memfit_version, self.git_commit, self.candle_version
        )?;
        if let (Some(d), Some(c)) = (&self.driver_version, &self.cuda_version) {
            write!(f, ", CUDA driver {d}, runtime {c}")?;
        }
        Ok(())
    }
}

/// What `predict --calibration` says of the runtimes: the calibration's, this binary's, and
/// whether the constants come from another one.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RuntimeCheck {
    pub calibrated_with: Vec<Runtime>,
    pub predicting_with: Runtime,
    /// Some stored run used another memfit or candle release than this binary (or none says
    /// what it used).
    pub other_runtime: bool,
    /// The same releases, but some run was built from another commit.
    pub other_commit: bool,
}

impl Calibration {
    /// The calibration's runtimes against this binary's.
    pub fn runtime_check(&self) -> RuntimeCheck {
        let now = Runtime::current();
        RuntimeCheck {
            other_runtime: self.runtimes.is_empty()
                || self.runtimes.iter().any(|r| !r.same_release(&now)),
            other_commit: self.runtimes.iter().any(|r| r.git_commit != now.git_commit),
            calibrated_with: self.runtimes.clone(),
            predicting_with: now,
        }
    }
}

/// One phase of a case, calibrated.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Calibrated {
    pub phase: String,
    pub analytical_bytes: u64,
    pub calibrated_bytes: u64,
    pub rows: usize,
    /// Held-out mean and max error of the calibration (percent), when it has ≥ 3 rows.
    pub held_out_pct: Option<(f64, f64)>,
    /// Held out by size: mean and max error (percent) on the larger half of the configs (by
    /// parameter count) of a calibration fitted on the smaller half; `None` with one size.
    pub by_size_pct: Option<(f64, f64)>,
    /// The largest parameter count the by-size calibration was fitted on.
    pub by_size_fit_params: Option<u64>,
}

/// `cpu` or `cuda` (all `cuda:N` of a machine are the same model).
pub fn device_kind(device: &str) -> &str {
    if device.starts_with("cuda") {
        "cuda"
    } else {
        device
    }
}

/// One group's correction.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Correction {
    pub phase: String,
    pub device: String,
    pub dtype: String,
    pub rows: usize,
    /// `measured ≈ intercept + slope·predicted` (bytes).
    pub intercept: f64,
    pub slope: f64,
    /// Held-out error of the calibrated prediction (percent of measured); `None` below 3 rows.
    pub held_out: Option<(f64, f64)>,
    /// Held out by size ([`super::extrapolation`]): fitted on the smaller half of the configs
    /// by parameter count, tested on the larger half; `None` with one size.
    pub by_size: Option<(f64, f64)>,
    /// The largest parameter count of the smaller half.
    pub by_size_fit_params: Option<u64>,
}

impl Correction {
    pub fn apply(&self, predicted: u64) -> u64 {
        (self.intercept + self.slope * predicted as f64)
            .round()
            .max(0.0) as u64
    }
}

/// One row's (predicted, measured, parameters).
type Point = (f64, f64, f64);

/// The corrections fitted from `rows`, keyed by (phase, device kind, dtype).
#[derive(Debug, Clone, Default)]
pub struct Calibration {
    pub groups: BTreeMap<(String, String, String), Correction>,
    /// Where the rows came from (for messages).
    pub origin: String,
    /// The software the stored runs used (one entry per distinct runtime).
    pub runtimes: Vec<Runtime>,
}

impl Calibration {
    pub fn fit(rows: &[Row]) -> Self {
        let mut by: BTreeMap<(String, String, String), Vec<Point>> = BTreeMap::new();
        for r in rows.iter().filter(|r| r.status == Status::Ok) {
            if let (Some(m), Some(p)) = (r.peak_bytes, r.predicted_peak_bytes) {
                by.entry((
                    r.phase.to_string(),
                    device_kind(&r.device).to_string(),
                    r.dtype.clone(),
                ))
                .or_default()
                .push((p as f64, m as f64, r.params as f64));
            }
        }
        let groups = by
            .into_iter()
            .filter_map(|(k, pts)| {
                let x: Vec<Vec<f64>> = pts.iter().map(|(p, _, _)| vec![1.0, *p]).collect();
                let y: Vec<f64> = pts.iter().map(|(_, m, _)| *m).collect();
                let size: Vec<f64> = pts.iter().map(|(_, _, s)| *s).collect();
                let by_size = super::extrapolation(&x, &y, &size).map(|h| (h.mean_pct, h.max_pct));
                let by_size_fit_params = by_size.and_then(|_| {
                    let mut d = size.clone();
                    d.sort_by(f64::total_cmp);
                    d.dedup();
                    d.get(d.len() / 2 - 1).map(|v| *v as u64)
                });
                let f = least_squares(&x, &y)?;
                // A single predicted value gives no slope: the line is the mean offset.
                let (intercept, slope) = if f.used[1] {
                    (f.coef[0], f.coef[1])
                } else {
                    (f.coef[0] - x[0][1], 1.0)
                };
                let folds = 5.min(y.len().saturating_sub(1));
                let held = (y.len() >= 3)
                    .then(|| k_fold(&x, &y, folds))
                    .flatten()
                    .map(|h: HeldOut| (h.mean_pct, h.max_pct));
                Some((
                    k.clone(),
                    Correction {
                        phase: k.0,
                        device: k.1,
                        dtype: k.2,
                        rows: y.len(),
                        intercept,
                        slope,
                        held_out: held,
                        by_size,
                        by_size_fit_params,
                    },
                ))
            })
            .collect();
        Self {
            groups,
            origin: String::new(),
            runtimes: Vec::new(),
        }
    }

    /// Every phase of a case calibrated, or a user error naming the first phase the
    /// calibration has no rows for.
    pub fn apply(
        &self,
        device: &str,
        dtype: &str,
        phases: &[(String, u64)],
    ) -> Result<Vec<Calibrated>, UserError> {
        phases
            .iter()
            .map(|(phase, analytical)| {
                let c =
                    self.get(phase, device, dtype)
                        .map_err(|message| UserError::Calibration {
                            origin: self.origin.clone(),
                            message,
                        })?;
                Ok(Calibrated {
                    phase: phase.clone(),
                    analytical_bytes: *analytical,
                    calibrated_bytes: c.apply(*analytical),
                    rows: c.rows,
                    held_out_pct: c.held_out,
                    by_size_pct: c.by_size,
                    by_size_fit_params: c.by_size_fit_params,
                })
            })
            .collect()
    }

    /// The correction for a phase on a device and element type, or a message saying what the
    /// calibration holds instead.
    pub fn get(&self, phase: &str, device: &str, dtype: &str) -> Result<&Correction, String> {
        let key = (
            phase.to_string(),
            device_kind(device).to_string(),
            dtype.to_string(),
        );
        self.groups.get(&key).ok_or_else(|| {
            let have: Vec<String> = self
                .groups
                .keys()
                .map(|(p, d, t)| format!("{p}/{d}/{t}"))
                .collect();
            format!(
                "no measured rows for phase {phase} on {} in {dtype}; it holds (phase/device/dtype): {}",
                device_kind(device),
                if have.is_empty() {
                    "nothing".to_string()
                } else {
                    have.join(", ")
                }
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(phase: &str, predicted: u64, measured: u64) -> Row {
        let mut r = Row::example();
        r.dtype = "bf16".into();
        r.device = "cuda:0".into();
        r.phase = crate::step::Phase::parse(phase).expect("a phase");
        r.predicted_peak_bytes = Some(predicted);
        r.peak_bytes = Some(measured);
        r
    }

    /// Measured = 1 MiB + 1.25 × predicted exactly: recovered, zero held-out error, and a
    /// 4 GiB prediction calibrates to 1 MiB + 5 GiB.
    #[test]
    fn exact_line_is_recovered() {
        let rows: Vec<Row> = (1..=8u64)
            .map(|i| row("forward", i << 24, (1 << 20) + (i << 24) * 5 / 4))
            .collect();
        let c = Calibration::fit(&rows);
        let g = c.get("forward", "cuda:1", "bf16").unwrap();
        assert!((g.intercept - 1_048_576.0).abs() < 1e-3 && (g.slope - 1.25).abs() < 1e-12);
        assert!(g.held_out.unwrap().1 < 1e-9);
        assert_eq!(g.apply(4 << 30), (1 << 20) + (5 << 30));
    }

    /// The textbook regression of `fit` (predicted 1..5, measured 1, 3, 2, 5, 4): a = 0.6,
    /// b = 0.8, so a prediction of 10 calibrates to 8.6. Held out with 4 folds (5 rows): fold 0
    /// holds rows 1 and 5 out; the middle three (2,3), (3,2), (4,5) fit b = 2/2 = 1,
    /// a = 10/3 − 3 = 1/3, so row 1 is predicted 4/3 against 1 and row 5 16/3 against 4: both
    /// 33.3 % off — the maximum held-out error is at least that.
    #[test]
    fn textbook_line_and_held_out_error() {
        let rows: Vec<Row> = [(1, 1), (2, 3), (3, 2), (4, 5), (5, 4)]
            .iter()
            .map(|&(p, m)| row("backward", p, m))
            .collect();
        let c = Calibration::fit(&rows);
        let g = c.get("backward", "cuda:0", "bf16").unwrap();
        assert!((g.intercept - 0.6).abs() < 1e-9 && (g.slope - 0.8).abs() < 1e-9);
        assert_eq!(g.apply(10), 9); // 8.6 rounds to 9
        assert!(g.held_out.unwrap().1 >= 100.0 / 3.0 - 1e-9);
    }

    /// Held out by size: configs of 100, 200, 300 and 400 parameters, measured = 2·predicted
    /// below 250 parameters and 3·predicted above. Fitted on the smaller two (slope 2), the
    /// larger two are predicted 2/3 of their measured value: 33.3 % off, both.
    #[test]
    fn held_out_by_size_fits_small_tests_large() {
        let rows: Vec<Row> = [(100u64, 10u64), (200, 20), (300, 30), (400, 40)]
            .iter()
            .flat_map(|&(params, p)| {
                let k = if params < 250 { 2 } else { 3 };
                // Two rows per config (two batch sizes).
                [1u64, 2].map(|b| {
                    let mut r = row("forward", p * b, k * p * b);
                    r.params = params;
                    r.batch = b;
                    r
                })
            })
            .collect();
        let c = Calibration::fit(&rows);
        let g = c.get("forward", "cuda:0", "bf16").unwrap();
        let (mean, max) = g.by_size.unwrap();
        assert!((mean - 100.0 / 3.0).abs() < 1e-9 && (max - 100.0 / 3.0).abs() < 1e-9);
        assert_eq!(g.by_size_fit_params, Some(200));
        // One size only: nothing to extrapolate to.
        let one = Calibration::fit(&rows[..2]);
        assert_eq!(one.get("forward", "cuda:0", "bf16").unwrap().by_size, None);
    }

    #[test]
    fn missing_group_is_refused_with_what_there_is() {
        let c = Calibration::fit(&[row("forward", 10, 12), row("forward", 20, 22)]);
        let e = c.get("forward", "cpu", "f32").unwrap_err();
        assert!(e.contains("phase forward on cpu in f32") && e.contains("forward/cuda/bf16"));
        assert!(c.get("decode", "cuda:0", "bf16").is_err());
        let e = c
            .apply(
                "cuda:0",
                "bf16",
                &[("forward".into(), 30), ("decode".into(), 5)],
            )
            .unwrap_err()
            .to_string();
        assert!(e.contains("phase decode on cuda in bf16"), "{e}");
        // forward: 2 + 1·30 = 32.
        let ok = c
            .apply("cuda:0", "bf16", &[("forward".into(), 30)])
            .unwrap();
        assert_eq!(ok[0].calibrated_bytes, 32);
    }
}
