//! `memfit fit RESULTS…`: fit each phase's peak to the decoder features by least squares, per
//! group of comparable rows, from stored results only (JSONL or HDF5 files, or folders searched
//! for them), with held-out errors: 5-fold over cases and the extrapolation split.

use std::collections::BTreeMap;

use crate::cli::FitArgs;
use crate::fit::{self, FEATURES, HeldOut};
use crate::record::{Row, Status};
use crate::store;

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
);

pub fn key(r: &Row) -> GroupKey {
    (
        r.phase.clone(),
        r.model.clone(),
        r.device.clone(),
        r.dtype.clone(),
        r.precision.clone(),
        r.attention.clone(),
        r.checkpoint,
        r.lora_rank,
        r.optimizer.clone(),
        // Decoding with and without the cache are different computations: separate fits.
        if r.phase == "decode" {
            format!("{} kv-{}", r.weights, r.kv_cache)
        } else {
            r.weights.clone()
        },
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
    pub coefficients: Vec<(String, f64, f64)>,
    pub r2: f64,
    pub in_sample_max_pct: f64,
    pub kfold: Option<(f64, f64)>,
    pub extrapolation: Option<(f64, f64)>,
}

pub fn fit_cmd(args: &FitArgs) -> anyhow::Result<()> {
    let mut files = Vec::new();
    for p in &args.results {
        files.extend(store::result_files(p)?);
    }
    let mut groups: BTreeMap<GroupKey, Vec<Row>> = BTreeMap::new();
    let mut all = Vec::new();
    for f in &files {
        for r in store::read_rows(f)? {
            // dataload rows have their own formula (crate::data::fit), printed below.
            if r.status == Status::Ok && r.peak_bytes.is_some() && r.phase != "dataload" {
                groups.entry(key(&r)).or_default().push(r.clone());
            }
            all.push(r);
        }
    }
    let has_data = all.iter().any(|r| r.phase == "dataload");
    if groups.is_empty() && !has_data {
        anyhow::bail!("no measured rows in {} file(s)", files.len());
    }
    if !args.json && !groups.is_empty() {
        println!(
            "{:<10} {:<7} {:<5} {:<28} {:>4} {:>9}  {:>16}  {:>16}  bytes =",
            "phase",
            "device",
            "dtype",
            "variant",
            "rows",
            "R²",
            "5-fold mean/max%",
            "extrap mean/max%",
        );
    }
    let textbook = fit::textbook::evaluate(&all);
    for (k, rows) in &groups {
        let g = fit_group(k, rows);
        if args.json {
            println!("{}", serde_json::to_string(&g)?);
            continue;
        }
        let pair =
            |h: Option<(f64, f64)>| h.map_or("-".to_string(), |(a, b)| format!("{a:.3}/{b:.3}"));
        let formula: Vec<String> = g
            .coefficients
            .iter()
            .filter(|(_, c, _)| *c != 0.0)
            .map(|(n, c, _)| format!("{c:.4}·{n}"))
            .collect();
        println!(
            "{:<10} {:<7} {:<5} {:<28} {:>4} {:>9.6}  {:>16}  {:>16}  {}",
            g.phase,
            g.device,
            g.dtype,
            g.variant,
            g.rows,
            g.r2,
            pair(g.kfold),
            pair(g.extrapolation),
            formula.join(" + ")
        );
    }
    crate::data::fit::print(&all, args.json)?;
    // The textbook formulas on the same rows, beside ours.
    if args.json {
        for t in &textbook {
            println!("{}", serde_json::to_string(t)?);
        }
    } else if !textbook.is_empty() {
        println!(
            "\ntextbook formula            against                     cases   mean %    max %"
        );
        for t in &textbook {
            println!(
                "{:<27} {:<27} {:>5} {:>8.2} {:>8.2}",
                t.formula, t.against, t.cases, t.mean_pct, t.max_pct
            );
        }
    }
    Ok(())
}

pub fn fit_group(k: &GroupKey, rows: &[Row]) -> GroupFit {
    let x: Vec<Vec<f64>> = rows.iter().map(|r| fit::features(r).to_vec()).collect();
    let y: Vec<f64> = rows
        .iter()
        .map(|r| r.peak_bytes.unwrap_or(0) as f64)
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
            "{} {} {} ck{} lora{} {} {}",
            k.1, k.4, k.5, k.6, k.7, k.8, k.9
        ),
        rows: rows.len(),
        coefficients: FEATURES
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let (c, e) = f
                    .as_ref()
                    .map_or((f64::NAN, f64::NAN), |f| (f.coef[i], f.stderr[i]));
                (n.to_string(), c, e)
            })
            .collect(),
        r2: f.as_ref().map_or(f64::NAN, |f| f.r2),
        in_sample_max_pct: in_sample,
        kfold: pair(fit::k_fold(&x, &y, 5)),
        extrapolation: pair(fit::extrapolation(&x, &y, &size)),
    }
}
