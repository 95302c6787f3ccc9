//! The analytical predictions' errors per component of memory, and how often each
//! under-estimates — the one error a memory tool must not make — read from stored rows (never
//! measured here), for `memfit fit` and the report.
//!
//! Each component is a figure every row of a phase records twice, measured and predicted:
//! - **weights**: what init leaves (`init` rows' retained bytes);
//! - **optimizer state**: what the first step leaves (`optimizer` rows' retained bytes);
//! - **activations**: the graph a training forward keeps (`forward` rows' retained bytes);
//! - **KV cache**: what a prompt leaves (`prefill` rows' retained bytes: the cache and the next
//!   token);
//! - **step peaks**: every window's peak above its start (all phases: activations,
//!   temporaries, workspace and bookkeeping together).
//!
//! The error is `(predicted − measured) / measured`. An under-estimate is a prediction below
//! the measurement by more than [`UNDER_BYTES`] and [`UNDER_REL`] of it (a difference inside
//! either is one op's metadata or a rounding of the figure, not a missed tensor).

use crate::record::{Row, Status};
use crate::step::Phase;

/// Under-estimates smaller than this many bytes are bookkeeping: one op's, 8 tensors × 256 B
/// (the tests' floor, `tests/common::OP_BOOKKEEPING`).
pub const UNDER_BYTES: f64 = 2048.0;
/// Under-estimates smaller than this fraction of the measurement are bookkeeping.
pub const UNDER_REL: f64 = 0.001;

/// The components, with the phase whose rows give each and whether the figure is the retained
/// bytes (else the window's peak).
pub const COMPONENTS: [(&str, Option<Phase>, bool); 5] = [
    ("weights", Some(Phase::Init), true),
    ("optimizer state", Some(Phase::Optimizer), true),
    ("activations", Some(Phase::Forward), true),
    ("KV cache", Some(Phase::Prefill), true),
    ("step peaks", None, false),
];

/// One component's errors over the rows that record it, per device kind.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ComponentError {
    pub component: &'static str,
    /// `cpu` or `cuda`.
    pub device: String,
    pub rows: usize,
    /// Mean and largest |error| in percent.
    pub mean_abs_pct: f64,
    pub max_abs_pct: f64,
    /// Rows whose prediction is below the measurement beyond the bookkeeping bounds, and their
    /// share of `rows`.
    pub under: usize,
    pub under_rate: f64,
    /// The largest under-estimate in bytes (0 when none is below the measurement at all).
    pub worst_under_bytes: f64,
}

/// The measured and predicted figure of `r` for a component.
fn pair(r: &Row, retained: bool) -> Option<(f64, f64)> {
    if retained {
        Some((r.retained_bytes? as f64, r.predicted_retained_bytes? as f64))
    } else {
        Some((r.peak_bytes? as f64, r.predicted_peak_bytes? as f64))
    }
}

/// Per component and device kind, over the ok rows that record both figures (a measurement of
/// 0 bytes has no relative error and is left out).
pub fn errors(rows: &[Row]) -> Vec<ComponentError> {
    let mut out = Vec::new();
    for (component, phase, retained) in COMPONENTS {
        for device in ["cpu", "cuda"] {
            let pairs: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.status == Status::Ok)
                .filter(|r| phase.is_none_or(|p| r.phase == p) && r.phase != Phase::Dataload)
                .filter(|r| crate::fit::calibration::device_kind(&r.device) == device)
                .filter_map(|r| pair(r, retained))
                .filter(|&(m, _)| m > 0.0)
                .collect();
            if pairs.is_empty() {
                continue;
            }
            let pct: Vec<f64> = pairs.iter().map(|(m, p)| 100.0 * (p - m) / m).collect();
            let under = pairs
                .iter()
                .filter(|&&(m, p)| m - p > UNDER_BYTES && m - p > UNDER_REL * m)
                .count();
            out.push(ComponentError {
                component,
                device: device.to_string(),
                rows: pairs.len(),
                mean_abs_pct: pct.iter().map(|e| e.abs()).sum::<f64>() / pct.len() as f64,
                max_abs_pct: pct.iter().fold(0f64, |a, e| a.max(e.abs())),
                under,
                under_rate: under as f64 / pairs.len() as f64,
                worst_under_bytes: pairs.iter().fold(0f64, |a, &(m, p)| a.max(m - p)),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(phase: &str, device: &str, measured: (u64, i64), predicted: (u64, i64)) -> Row {
        let mut r = crate::record::Row::example();
        r.phase = crate::step::Phase::parse(phase).expect("a phase");
        r.device = device.into();
        r.status = Status::Ok;
        (r.peak_bytes, r.retained_bytes) = (Some(measured.0), Some(measured.1));
        (r.predicted_peak_bytes, r.predicted_retained_bytes) =
            (Some(predicted.0), Some(predicted.1));
        r
    }

    /// Worked by hand: init's weights 1,000,000 measured against 1,010,000 and 980,000
    /// predicted (+1 %, −2 %: the second an under-estimate of 20,000 B, beyond 2 KiB and 0.1 %);
    /// a forward 100,000 against 98,500 (−1.5 %, but 1,500 B: bookkeeping, not counted); peaks of
    /// every phase; CUDA apart; failed rows and zero measurements left out.
    #[test]
    fn errors_and_under_estimates_by_hand() {
        let mut failed = row("init", "cpu", (1, 1), (1, 1));
        failed.status = Status::Oom;
        let rows = vec![
            row(
                "init",
                "cpu",
                (2_000_000, 1_000_000),
                (2_000_000, 1_010_000),
            ),
            row("init", "cpu", (2_000_000, 1_000_000), (1_900_000, 980_000)),
            row("forward", "cpu", (400_000, 100_000), (400_000, 98_500)),
            row(
                "init",
                "cuda:0",
                (4_000_000, 4_000_000),
                (4_000_000, 4_000_000),
            ),
            row("prefill", "cpu", (0, 0), (10, 10)),
            failed,
        ];
        let e = errors(&rows);
        let get = |c: &str, d: &str| e.iter().find(|x| x.component == c && x.device == d);
        let w = get("weights", "cpu").unwrap();
        assert_eq!((w.rows, w.under), (2, 1));
        assert!((w.mean_abs_pct - 1.5).abs() < 1e-12 && (w.max_abs_pct - 2.0).abs() < 1e-12);
        assert_eq!((w.under_rate, w.worst_under_bytes), (0.5, 20_000.0));
        let a = get("activations", "cpu").unwrap();
        assert_eq!((a.rows, a.under), (1, 0));
        assert!((a.max_abs_pct - 1.5).abs() < 1e-12);
        assert_eq!(get("weights", "cuda").unwrap().max_abs_pct, 0.0);
        assert!(
            get("KV cache", "cpu").is_none(),
            "a zero measurement has no error"
        );
        let peaks = get("step peaks", "cpu").unwrap();
        // Peaks: 0 %, −5 % (100,000 B under: counted), 0 %.
        assert_eq!((peaks.rows, peaks.under), (3, 1));
        assert_eq!(peaks.worst_under_bytes, 100_000.0);
    }
}
