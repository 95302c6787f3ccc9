//! The data pipeline's RAM formula and throughput curve, fitted from stored `dataload` rows
//! (reads rows, never measures): `memfit fit` prints them after the model fits, and
//! `memfit report` computes them for claims D2 and D4 (the report itself never fits).
//!
//! RAM, per group of rows with the same device, worker kind and storage (the `workers = 0`
//! rows join the thread groups as their zero point; with processes the main process no longer
//! holds the data, so they stay out of the process fits), by least squares (`crate::fit`):
//!
//! `memory = base + per_worker · workers + k · in_flight_bytes`
//!
//! with `in_flight_bytes = min(in-flight batches, batches per epoch) · B·3·C²·4`, in-flight =
//! `prefetch × workers` (1 with no worker). With a single prefetch depth in a group the two
//! terms are proportional: `k` is then not fitted (NaN) and `per_worker` holds both. `memory` is the tree's PSS peak (shared pages once)
//! and, beside it, the tree's summed RSS peak (shared pages once per process). `k ≈ 1` means
//! each requested batch costs its bytes once; `k ≈ 2` that it exists twice (a worker's copy
//! and the main thread's, or pipe buffers).
//!
//! Repeated runs are samples: the rows of one configuration (workers, prefetch, epochs, images,
//! persistent) are fitted as one point, their median; `samples` is the fewest a point had.
//!
//! Throughput: images/s per worker count (the median over that count's rows); saturation = the
//! fewest workers reaching 95 % of the group's best; CPU utilisation = (user + sys) / wall, in
//! cores (the median too).

use crate::step::Phase;
use std::collections::BTreeMap;

use serde::Serialize;

use crate::fit::least_squares;
use crate::record::{Row, Status};

/// `(device, worker kind, storage)`.
type Key = (String, String, String);

/// One RAM fit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RamFit {
    pub device: String,
    pub worker_kind: String,
    pub storage: String,
    /// `pss` or `rss` (the tree's sums).
    pub measure: String,
    /// Rows read (every sample).
    pub rows: usize,
    /// Configurations fitted (one point each, the median of its samples).
    pub points: usize,
    /// The fewest samples (rows) any point had.
    pub samples: usize,
    pub base_bytes: f64,
    pub per_worker_bytes: f64,
    pub in_flight_factor: f64,
    /// Standard errors of the three, in the same order.
    pub stderr: [f64; 3],
    pub r2: f64,
    /// Largest |fitted − measured| / measured over the rows, percent.
    pub max_err_pct: f64,
}

/// Throughput of one group against the worker count.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Curve {
    pub device: String,
    pub worker_kind: String,
    pub storage: String,
    /// `(workers, images/s, CPU cores busy)`, the median per worker count.
    pub points: Vec<(u64, f64, f64)>,
    /// The fewest rows (samples) any worker count had.
    pub samples: usize,
    pub saturation_workers: u64,
}

/// Bytes of the batches that can be in flight in a row's case.
pub fn in_flight_bytes(r: &Row) -> Option<f64> {
    let (w, p, e, n, c) = (r.workers?, r.prefetch?, r.epochs?, r.images?, r.crop_px?);
    let per_epoch = n.checked_div(e)?;
    let batches = per_epoch.div_ceil(r.batch.max(1));
    let flight = if w == 0 { 1 } else { p * w };
    Some((flight.min(batches) * r.batch * 3 * c * c * 4) as f64)
}

/// The median of `v` (not empty).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn groups(rows: &[Row]) -> BTreeMap<Key, Vec<&Row>> {
    let ok: Vec<&Row> = rows
        .iter()
        .filter(|r| r.phase == Phase::Dataload && r.status == Status::Ok && r.workers.is_some())
        .collect();
    let mut g: BTreeMap<Key, Vec<&Row>> = BTreeMap::new();
    for r in &ok {
        if r.worker_kind != "main" {
            g.entry((r.device.clone(), r.worker_kind.clone(), r.storage.clone()))
                .or_default()
                .push(r);
        }
    }
    // The main-thread rows are every kind's zero point.
    let keys: Vec<Key> = g.keys().cloned().collect();
    for k in keys {
        for r in &ok {
            if r.worker_kind == "main" && r.device == k.0 && r.storage == k.2 {
                g.get_mut(&k).expect("key exists").push(r);
            }
        }
    }
    g
}

/// The RAM fits (PSS and RSS) of every group with enough rows.
pub fn ram_fits(rows: &[Row]) -> Vec<RamFit> {
    let mut out = Vec::new();
    for ((device, kind, storage), rs) in groups(rows) {
        // With worker processes the main process no longer holds the dataset (`ram`) or maps
        // it (`mmap`): the main-thread rows are another regime, not the zero point of the line.
        let rs: Vec<&Row> = rs
            .into_iter()
            .filter(|r| kind != "process" || r.worker_kind != "main")
            .collect();
        for measure in ["pss", "rss"] {
            // One point per configuration: its samples' median.
            type Config<'s> = (u64, Option<u64>, Option<u64>, Option<u64>, &'s str);
            let mut by_config: BTreeMap<Config, (f64, Vec<f64>)> = BTreeMap::new();
            for r in &rs {
                let m = match measure {
                    "pss" => r.pss_peak_bytes,
                    _ => r.tree_rss_peak_bytes,
                };
                if let (Some(m), Some(b), Some(w)) = (m, in_flight_bytes(r), r.workers) {
                    let key = (w, r.prefetch, r.epochs, r.images, r.persistent.as_str());
                    by_config
                        .entry(key)
                        .or_insert((b, Vec::new()))
                        .1
                        .push(m as f64);
                }
            }
            let rows_read: usize = by_config.values().map(|v| v.1.len()).sum();
            let samples = by_config.values().map(|v| v.1.len()).min().unwrap_or(0);
            let (mut x, y): (Vec<Vec<f64>>, Vec<f64>) = by_config
                .iter()
                .map(|((w, ..), (b, ms))| (vec![1.0, *w as f64, *b], median(ms)))
                .unzip();
            if y.len() < 4 {
                continue;
            }
            // One prefetch depth only: in-flight bytes ∝ workers, the two terms cannot be told
            // apart; fit the per-worker term alone and leave k unknown (NaN).
            let mut depths: Vec<u64> = rs
                .iter()
                .filter(|r| r.workers.unwrap_or(0) > 0)
                .filter_map(|r| r.prefetch)
                .collect();
            depths.sort_unstable();
            depths.dedup();
            let separable = depths.len() > 1;
            if !separable {
                for xi in &mut x {
                    xi[2] = 0.0;
                }
            }
            let Some(mut f) = least_squares(&x, &y) else {
                continue;
            };
            if !separable {
                f.coef[2] = f64::NAN;
            }
            let fitted = |xi: &Vec<f64>| {
                f.coef[0] + f.coef[1] * xi[1] + if separable { f.coef[2] * xi[2] } else { 0.0 }
            };
            let max_err_pct = x
                .iter()
                .zip(&y)
                .map(|(xi, v)| ((fitted(xi) - v) / v).abs() * 100.0)
                .fold(0.0, f64::max);
            out.push(RamFit {
                device: device.clone(),
                worker_kind: kind.clone(),
                storage: storage.clone(),
                measure: measure.into(),
                rows: rows_read,
                points: y.len(),
                samples,
                base_bytes: f.coef[0],
                per_worker_bytes: f.coef[1],
                in_flight_factor: f.coef[2],
                stderr: [f.stderr[0], f.stderr[1], f.stderr[2]],
                r2: f.r2,
                max_err_pct,
            });
        }
    }
    out
}

/// Throughput curves (persistent-worker rows and main-thread rows only).
pub fn curves(rows: &[Row]) -> Vec<Curve> {
    let mut out = Vec::new();
    for ((device, kind, storage), rs) in groups(rows) {
        let mut by_w: BTreeMap<u64, Vec<(f64, f64)>> = BTreeMap::new();
        for r in rs.iter().filter(|r| r.persistent != "off") {
            if let (Some(w), Some(ips), Some(u), Some(s), Some(wall)) = (
                r.workers,
                r.images_per_s,
                r.cpu_user_s,
                r.cpu_sys_s,
                r.wall_s,
            ) {
                by_w.entry(w).or_default().push((ips, (u + s) / wall));
            }
        }
        let samples = by_w.values().map(Vec::len).min().unwrap_or(0);
        let points: Vec<(u64, f64, f64)> = by_w
            .into_iter()
            .map(|(w, v)| {
                let ips: Vec<f64> = v.iter().map(|p| p.0).collect();
                let busy: Vec<f64> = v.iter().map(|p| p.1).collect();
                (w, median(&ips), median(&busy))
            })
            .collect();
        if points.is_empty() {
            continue;
        }
        let best = points.iter().map(|p| p.1).fold(0.0, f64::max);
        let saturation_workers = points
            .iter()
            .find(|p| p.1 >= 0.95 * best)
            .map_or(0, |p| p.0);
        out.push(Curve {
            device,
            worker_kind: kind,
            storage,
            points,
            samples,
            saturation_workers,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(kind: &str, w: u64, prefetch: u64, pss: u64) -> Row {
        let mut r = Row::example();
        r.phase = Phase::Dataload;
        (r.cpu_user_s, r.cpu_sys_s, r.wall_s) = (Some(1.0), Some(0.5), Some(3.0));
        r.worker_kind = kind.into();
        r.workers = Some(w);
        r.prefetch = Some(prefetch);
        r.storage = "ram".into();
        r.epochs = Some(1);
        r.images = Some(64);
        r.crop_px = Some(8);
        r.pss_peak_bytes = Some(pss);
        r.tree_rss_peak_bytes = Some(pss);
        r.images_per_s = Some(10.0 * (w.min(2) + 1) as f64);
        r
    }

    /// Built from base 1000, 300 per worker, k = 2 exactly: batch bytes 2·3·64·4 = 1536.
    #[test]
    fn recovers_constructed_constants() {
        let bb = 1536.0;
        let mk = |kind: &str, w: u64, p: u64| {
            let flight = if w == 0 { 1 } else { p * w } as f64;
            row(
                kind,
                w,
                p,
                (1000.0 + 300.0 * w as f64 + 2.0 * flight * bb) as u64,
            )
        };
        let rows = vec![
            mk("process", 4, 1),
            mk("process", 1, 2),
            mk("process", 2, 2),
            mk("process", 3, 2),
            mk("process", 2, 4),
            mk("process", 1, 8),
        ];
        assert_eq!(in_flight_bytes(&rows[4]), Some(8.0 * bb));
        let f = &ram_fits(&rows)[0];
        assert_eq!((f.worker_kind.as_str(), f.rows), ("process", 6));
        // The main-thread row is every group's throughput reference, not a process RAM point.
        let with_main: Vec<Row> = rows.iter().cloned().chain([mk("main", 0, 0)]).collect();
        assert_eq!(ram_fits(&with_main)[0].rows, 6);
        assert!((f.base_bytes - 1000.0).abs() < 1e-6, "{f:?}");
        assert!((f.per_worker_bytes - 300.0).abs() < 1e-6);
        assert!((f.in_flight_factor - 2.0).abs() < 1e-9);
        // A single prefetch depth: k is not identifiable.
        let single = vec![
            mk("thread", 1, 2),
            mk("thread", 2, 2),
            mk("thread", 3, 2),
            mk("thread", 4, 2),
        ];
        let g = &ram_fits(&single)[0];
        assert!(g.in_flight_factor.is_nan());
        assert!(
            (g.per_worker_bytes - (300.0 + 2.0 * 2.0 * bb)).abs() < 1e-6,
            "{g:?}"
        );
        let c = &curves(&with_main)[0];
        // 0 → 10, 1 → 20, 2 and 3 → 30: saturates at 2; CPU (1 + 0.5) / 3 = 0.5 cores.
        assert_eq!(c.saturation_workers, 2);
        assert_eq!(c.points[0], (0, 10.0, 0.5));
        assert_eq!(c.samples, 1);
    }

    /// Three runs: each configuration is one point, its samples' median, so one wild sample
    /// per point (a tenth more, or less) leaves the constants exact; the curve's points are
    /// medians too.
    #[test]
    fn samples_are_fitted_by_their_median() {
        let bb = 1536.0;
        let mut rows = Vec::new();
        for (i, (w, p)) in [(4, 1), (1, 2), (2, 2), (3, 2), (2, 4), (1, 8)]
            .into_iter()
            .enumerate()
        {
            let flight = (p * w) as f64;
            let exact = 1000.0 + 300.0 * w as f64 + 2.0 * flight * bb;
            let wild = if i % 2 == 0 { 1.1 } else { 0.9 };
            for (s, f) in [1.0, wild, 1.0].into_iter().enumerate() {
                let mut r = row("process", w, p, (exact * f) as u64);
                r.run_id = format!("r{s}");
                r.images_per_s = Some(10.0 * w as f64 * f);
                rows.push(r);
            }
        }
        let f = &ram_fits(&rows)[0];
        assert_eq!((f.rows, f.points, f.samples), (18, 6, 3), "{f:?}");
        assert!((f.base_bytes - 1000.0).abs() < 1e-6, "{f:?}");
        assert!((f.per_worker_bytes - 300.0).abs() < 1e-6, "{f:?}");
        assert!((f.in_flight_factor - 2.0).abs() < 1e-9, "{f:?}");
        let c = &curves(&rows)[0];
        assert_eq!(c.samples, 3);
        // Worker count 1: configurations (1, 2) and (1, 8), samples 10, 9, 10 and 10, 9, 10.
        assert_eq!(c.points[0].1, 10.0, "{c:?}");
        assert_eq!(c.points[1].1, 20.0, "{c:?}");
    }
}
