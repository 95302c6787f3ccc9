//! `memfit fit RESULTS…`: reads stored results only (JSONL or HDF5 files, or folders searched
//! for them) and prints, per group of comparable rows, the least-squares fit of each phase's
//! peak with its held-out errors (`crate::fit::group`), the `dataload` rows' RAM formula and
//! throughput curves (`crate::fit::dataload`), and the textbook formulas on the same rows
//! (`crate::fit::textbook`). The fitting is in `crate::fit`; this is the subcommand: its
//! arguments and what it prints.

use crate::step::Phase;
use std::collections::BTreeMap;

use crate::cli::FitArgs;
use crate::fit::dataload::{curves, ram_fits};
use crate::fit::group::{GroupKey, fit_group, key};
use crate::record::{Row, Status};
use crate::{fit, store};

pub fn fit_cmd(args: &FitArgs) -> anyhow::Result<()> {
    let mut files = Vec::new();
    for p in &args.results {
        files.extend(store::result_files(p)?);
    }
    let mut groups: BTreeMap<GroupKey, Vec<Row>> = BTreeMap::new();
    let mut all = Vec::new();
    for f in &files {
        for r in store::read_rows(f)? {
            // dataload rows have their own formula (crate::fit::dataload), printed below.
            if r.status == Status::Ok && r.peak_bytes.is_some() && r.phase != Phase::Dataload {
                groups.entry(key(&r)).or_default().push(r.clone());
            }
            all.push(r);
        }
    }
    let has_data = all.iter().any(|r| r.phase == Phase::Dataload);
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
        let formula = g.formula();
        println!(
            "{:<10} {:<7} {:<5} {:<28} {:>4} {:>9}  {:>16}  {:>16}  {}",
            g.phase,
            g.device,
            g.dtype,
            g.variant,
            g.rows,
            if g.r2.is_finite() {
                format!("{:.6}", g.r2)
            } else {
                "—".into()
            },
            pair(g.kfold),
            pair(g.extrapolation),
            formula
        );
    }
    print_components(&all, args.json)?;
    print_dataload(&all, args.json)?;
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

/// Prints the analytical predictions' errors per component and how often each under-estimates
/// ([`crate::fit::components`]).
fn print_components(rows: &[Row], json: bool) -> anyhow::Result<()> {
    use crate::fit::components::{UNDER_BYTES, UNDER_REL, errors};
    let e = errors(rows);
    if json {
        for c in &e {
            println!("{}", serde_json::to_string(c)?);
        }
        return Ok(());
    }
    if e.is_empty() {
        return Ok(());
    }
    println!(
        "
predicted against measured, per component (under-estimate: below the measurement by more than {} KiB and {} %)",
        UNDER_BYTES / 1024.0,
        UNDER_REL * 100.0
    );
    println!(
        "{:<16} {:<6} {:>6} {:>13} {:>12} {:>16} {:>16}",
        "component",
        "device",
        "rows",
        "mean |err| %",
        "max |err| %",
        "under-estimates",
        "worst under B"
    );
    for c in &e {
        println!(
            "{:<16} {:<6} {:>6} {:>13.3} {:>12.3} {:>9} ({:>4.1} %) {:>16.0}",
            c.component,
            c.device,
            c.rows,
            c.mean_abs_pct,
            c.max_abs_pct,
            c.under,
            100.0 * c.under_rate,
            c.worst_under_bytes
        );
    }
    Ok(())
}

/// Prints the `dataload` rows' RAM fits and throughput curves (text, or one JSON object per
/// line).
fn print_dataload(rows: &[Row], json: bool) -> anyhow::Result<()> {
    let fits = ram_fits(rows);
    let curves = curves(rows);
    if json {
        for f in &fits {
            println!("{}", serde_json::to_string(f)?);
        }
        for c in &curves {
            println!("{}", serde_json::to_string(c)?);
        }
        return Ok(());
    }
    if fits.is_empty() && curves.is_empty() {
        return Ok(());
    }
    let mib = |b: f64| b / (1u64 << 20) as f64;
    println!(
        "\ndataload RAM = base + per_worker·workers + k·in-flight batch bytes (tree peak, least squares)"
    );
    println!(
        "{:<7} {:<8} {:<7} {:<4} {:>4} {:>11} {:>15} {:>12} {:>9} {:>8}",
        "device",
        "kind",
        "storage",
        "sum",
        "rows",
        "base MiB",
        "per worker MiB",
        "k",
        "R²",
        "max err%"
    );
    for f in &fits {
        println!(
            "{:<7} {:<8} {:<7} {:<4} {:>4} {:>11.1} {:>8.1} ± {:<4.1} {:>5.2} ± {:<4.2} {:>9.4} {:>8.1}",
            f.device,
            f.worker_kind,
            f.storage,
            f.measure,
            f.rows,
            mib(f.base_bytes),
            mib(f.per_worker_bytes),
            mib(f.stderr[1]),
            f.in_flight_factor,
            f.stderr[2],
            f.r2,
            f.max_err_pct
        );
    }
    println!("\ndataload throughput (persistent workers): workers → images/s (CPU cores busy)");
    for c in &curves {
        let pts: Vec<String> = c
            .points
            .iter()
            .map(|(w, ips, u)| format!("{w}→{ips:.0} ({u:.2})"))
            .collect();
        println!(
            "{:<7} {:<8} {:<7} {}   saturates at {} worker(s)",
            c.device,
            c.worker_kind,
            c.storage,
            pts.join("  "),
            c.saturation_workers
        );
    }
    Ok(())
}
