//! `memfit report RESULTS… --out DIR`: reads stored result sets (never runs a model), fits them
//! as `memfit fit` does, and writes `report.md`, `report.html` (plots inlined) and every plot as
//! `NAME.svg` and `NAME.png`. With `--measure-cpu-peak` it times an f32 matmul on this host to
//! give the CPU sets a peak FLOP/s (the only thing it measures, and only when asked).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::cli::ReportArgs;
use crate::cmd::fit::{GroupKey, fit_group, key};
use crate::error::UserError;
use crate::record::{Row, RunMeta, Status};
use crate::report::{self, CpuPeak, Inputs, ResultSet};
use crate::store::result_files;

/// Reads one result set: every result file under `path`, and each run's metadata
/// (`meta.json` beside a journal, the attributes of an HDF5 file).
pub fn load_set(path: &Path) -> anyhow::Result<ResultSet> {
    let files = result_files(path)?;
    if files.is_empty() {
        return Err(UserError::Unreadable {
            origin: path.display().to_string(),
            what: "result set",
            message: "no results.jsonl or results.h5 in it".into(),
        }
        .into());
    }
    let mut rows = Vec::new();
    let mut metas: Vec<RunMeta> = Vec::new();
    for f in &files {
        let (r, meta) = crate::store::read_rows_and_meta(f)?;
        rows.extend(r);
        metas.extend(meta);
    }
    metas.sort_by(|a, b| a.run_id.cmp(&b.run_id));
    metas.dedup_by(|a, b| a.run_id == b.run_id);
    let mut reference = Vec::new();
    for f in crate::store::reference::files(path) {
        reference.extend(crate::store::reference::read(&f)?);
    }
    Ok(ResultSet {
        label: path.display().to_string(),
        metas,
        rows,
        reference,
    })
}

/// f32 matmul FLOP/s of this host: the best of twenty 1024³ and five 2048³ candle products
/// after a warm-up (the best, because other processes only ever slow a sample down).
fn measure_cpu_peak() -> anyhow::Result<f64> {
    use candle_core::{Device, Tensor};
    let mut best = 0f64;
    for (n, reps) in [(1024usize, 20), (2048, 5)] {
        let a = Tensor::randn(0f32, 1.0, (n, n), &Device::Cpu)?;
        let b = Tensor::randn(0f32, 1.0, (n, n), &Device::Cpu)?;
        a.matmul(&b)?;
        for _ in 0..reps {
            let t = std::time::Instant::now();
            let c = a.matmul(&b)?;
            let s = t.elapsed().as_secs_f64();
            drop(c);
            best = best.max(2.0 * (n as f64).powi(3) / s);
        }
    }
    Ok(best)
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
    let by_key: BTreeMap<&GroupKey, &crate::cmd::fit::GroupFit> =
        groups.keys().zip(&fits).collect();
    let fitted =
        |r: &Row| -> Option<f64> { by_key.get(&key(r))?.predict(&crate::fit::features(r)) };
    let textbook = crate::fit::textbook::evaluate(&all);
    let cpu_peak = if args.measure_cpu_peak {
        let model = crate::cmd::run::cpu_model();
        let flops = measure_cpu_peak().context("measuring the CPU's matmul FLOP/s")?;
        let threads = rayon::current_num_threads();
        Some(CpuPeak {
            flops,
            how: format!(
                "measured by `memfit report --measure-cpu-peak`: best of 20 × 1024³ and 5 × 2048³ f32 candle matmuls on {model}, {threads} thread(s), at {} UTC",
                crate::units::utc_stamp(
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs())
                )
            ),
            cpu_model: model,
        })
    } else {
        None
    };
    let rep = report::build(&Inputs {
        sets: &sets,
        fits: &fits,
        textbook: &textbook,
        fitted: &fitted,
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
