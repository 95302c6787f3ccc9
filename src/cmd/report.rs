//! `memfit report RESULTS… --out DIR`: reads stored result sets (never runs a model), computes
//! what the report quotes besides the rows — the group fits as `memfit fit` makes them
//! (`fit::group`), the textbook errors (`fit::textbook`), the `dataload` RAM fits and
//! throughput curves (`fit::dataload`), the full-size figures (`formula::full_size`) — and
//! hands them to `report::build`, which writes `report.md`, `report.html` (plots inlined) and
//! every plot as `NAME.svg` and `NAME.png`. With `--measure-cpu-peak` it times an f32 matmul on
//! this host (`meter::flops`) to give the CPU sets a peak FLOP/s (the only thing it measures,
//! and only when asked).

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;

use crate::cli::ReportArgs;
use crate::error::UserError;
use crate::fit::group::{GroupFit, GroupKey, fit_group, key};
use crate::formula::full_size::FullSize;
use crate::record::{Row, Status};
use crate::report::{self, CpuPeak, Inputs, ResultSet, claims, load_set};

/// The CPU's peak FLOP/s, measured here now (`meter::flops`), with how and on what.
fn cpu_peak() -> anyhow::Result<CpuPeak> {
    let model = crate::machine::cpu_model();
    let flops =
        crate::meter::flops::cpu_matmul_peak().context("measuring the CPU's matmul FLOP/s")?;
    let threads = rayon::current_num_threads();
    Ok(CpuPeak {
        flops,
        how: format!(
            "measured by `memfit report --measure-cpu-peak`: {} on {model}, {threads} thread(s), at {} UTC",
            crate::meter::flops::method(),
            crate::units::utc_stamp(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs())
            )
        ),
        cpu_model: model,
    })
}

pub fn report(args: &ReportArgs) -> anyhow::Result<()> {
    let sets: Vec<ResultSet> = args
        .results
        .iter()
        .map(|p| load_set(p))
        .collect::<anyhow::Result<_>>()?;
    let all: Vec<Row> = sets.iter().flat_map(|s| s.rows.iter().cloned()).collect();
    if !all.iter().any(|r| r.status == Status::Ok) {
        anyhow::bail!("no measured rows in {} result set(s)", sets.len());
    }
    let mut groups: BTreeMap<GroupKey, Vec<Row>> = BTreeMap::new();
    for r in all
        .iter()
        .filter(|r| r.status == Status::Ok && r.peak_bytes.is_some())
    {
        groups.entry(key(r)).or_default().push(r.clone());
    }
    let fits: Vec<_> = groups.iter().map(|(k, rows)| fit_group(k, rows)).collect();
    let by_key: BTreeMap<&GroupKey, &GroupFit> = groups.keys().zip(&fits).collect();
    let fitted =
        |r: &Row| -> Option<f64> { by_key.get(&key(r))?.predict(&crate::fit::features(r)) };
    let textbook = crate::fit::textbook::evaluate(&all);
    let components = crate::fit::components::errors(&all);
    let cpu_peak = if args.measure_cpu_peak {
        Some(cpu_peak()?)
    } else {
        None
    };
    // The claims' `dataload` fits, over every row (each fit is one device's group).
    let dataload = claims::Fitted {
        ram: crate::fit::dataload::ram_fits(&all),
        curves: crate::fit::dataload::curves(&all),
    };
    let full_size = FullSize::compute()
        .map_err(|e| e.context("the full-size formulas the claims quote (a bug in memfit)"))?;
    let rep = report::build(&Inputs {
        sets: &sets,
        fits: &fits,
        textbook: &textbook,
        components: &components,
        fitted: &fitted,
        dataload: &dataload,
        full_size: &full_size,
        cpu_peak: cpu_peak.as_ref(),
    })?;
    let out = &args.out;
    std::fs::create_dir_all(out).map_err(|e| UserError::Output {
        path: out.display().to_string(),
        message: format!("cannot create the report folder: {e}"),
    })?;
    let write = |name: &str, bytes: &[u8]| -> anyhow::Result<PathBuf> {
        let p = out.join(name);
        std::fs::write(&p, bytes).with_context(|| format!("writing {}", p.display()))?;
        Ok(p)
    };
    write("report.md", rep.markdown.as_bytes())?;
    write("report.html", rep.html.as_bytes())?;
    for (name, chart) in &rep.charts {
        write(&format!("{name}.svg"), rep.svgs[name].as_bytes())?;
        write(&format!("{name}.png"), &crate::report::plots::png(chart)?)?;
    }
    println!(
        "wrote {}: report.md, report.html, {} plot(s) as SVG and PNG ({})",
        out.display(),
        rep.charts.len(),
        rep.charts
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}
