//! Human-readable output. Pure functions from rows (and fit results) to text and bytes: the run
//! table (`table`), and `memfit report`'s document (`build`): environment, per-phase tables,
//! the fit table with held-out errors, the textbook formulas, the claims table, the hardware
//! comparison with FLOP/s, and the plots (`plots`, drawn to SVG and PNG).
//!
//! The report reads rows and what was computed from them: it never measures and never parses
//! a workload, and the fits it shows are made by its caller (`cmd::report`), which hands them
//! in [`Inputs`]: the group fits (`fit::group`), the textbook errors (`fit::textbook`), the
//! `dataload` fits (`fit::dataload`), the full-size figures (`formula::full_size`) and, when
//! asked for, the CPU's measured peak FLOP/s (`meter::flops`). (Claims F1, F4 and B3 fit a
//! straight line through the sweep each selects with `fit::line::Affine`: the fitting is
//! `fit`'s, the choice of points the claim's.)

pub mod claims;
pub mod doc;
pub mod hardware;
pub mod labels;
pub mod plots;
pub mod table;
pub mod torch;

use crate::step::Phase;
use std::collections::BTreeMap;

use crate::fit::group::GroupFit;
use crate::fit::textbook::TextbookError;
use crate::formula::full_size::FullSize;
use crate::record::{Row, RunMeta, Status};
use crate::units::human_bytes;
use doc::Block;
use plots::{BarChart, Chart, Panels, Series, XyChart};

/// One result set (one argument of `memfit report`): its rows and the runs' metadata.
#[derive(Debug, Clone)]
pub struct ResultSet {
    pub label: String,
    pub metas: Vec<RunMeta>,
    pub rows: Vec<Row>,
    /// PyTorch's figures stored beside the rows (`torch.jsonl`), if any.
    pub reference: Vec<crate::store::reference::ReferenceRow>,
    /// The memory timelines stored beside them (`memfit run --timeline`): each file's path and
    /// its trace JSON.
    pub timelines: Vec<(String, String)>,
    /// The multi-rank runs stored beside them (`memfit ranks --out ranks*.json`).
    pub ranks: Vec<crate::ranks::RanksDoc>,
}

/// The CPU's peak FLOP/s, measured by `memfit report --measure-cpu-peak` (never asserted).
#[derive(Debug, Clone, PartialEq)]
pub struct CpuPeak {
    pub flops: f64,
    /// How and where it was measured.
    pub how: String,
    /// The CPU model it was measured on: it applies to result sets of that CPU only.
    pub cpu_model: String,
}

/// Everything `build` needs besides the rows.
pub struct Inputs<'a> {
    pub sets: &'a [ResultSet],
    pub fits: &'a [GroupFit],
    pub textbook: &'a [TextbookError],
    /// The analytical predictions' errors and under-estimates per component.
    pub components: &'a [crate::fit::components::ComponentError],
    /// The fitted peak of a row's phase and group (the least-squares fit of `memfit fit`).
    pub fitted: &'a dyn Fn(&Row) -> Option<f64>,
    /// The `dataload` rows' RAM fits and throughput curves, for the claims.
    pub dataload: &'a claims::Fitted,
    /// The full-size figures the claims quote.
    pub full_size: &'a FullSize,
    pub cpu_peak: Option<&'a CpuPeak>,
}

/// The rendered report: Markdown, HTML (plots inlined) and the charts to draw as files.
pub struct Report {
    pub markdown: String,
    pub html: String,
    pub charts: Vec<(String, Chart)>,
    pub svgs: BTreeMap<String, String>,
}

const MIB: f64 = 1024.0 * 1024.0;

/// MiB as a short label: `2.6 GiB`, `85 MiB`, `3.1 MiB`, `0.42 MiB`.
fn human_mib(m: f64) -> String {
    if m >= 1024.0 {
        format!("{:.1} GiB", m / 1024.0)
    } else if m >= 10.0 {
        format!("{m:.0} MiB")
    } else if m >= 1.0 {
        format!("{m:.1} MiB")
    } else {
        format!("{m:.2} MiB")
    }
}

/// A set's peak FLOP/s per element type.
type PeakFn = Box<dyn Fn(&str) -> Option<hardware::Peak>>;

/// The KV cache points (tokens, MiB) of one configuration and its formula.
struct KvSeries {
    points: Vec<(f64, f64)>,
    /// The configurations measured, (model, B and element type; serving weights): each
    /// cache the same size at every n.
    configs: Vec<(String, String)>,
    /// Bytes per token in the cache: B · the architecture's bytes per token of a sequence.
    per_token: f64,
    /// Tokens a sliding window keeps, if any.
    window: Option<u64>,
}

fn err_pct(r: &Row) -> Option<f64> {
    match (r.peak_bytes, r.predicted_peak_bytes) {
        (Some(m), Some(p)) => table::error_pct(m, p),
        _ => None,
    }
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or("—".into(), f)
}

/// Builds the whole report.
pub fn build(inp: &Inputs) -> anyhow::Result<Report> {
    let mut b: Vec<Block> = Vec::new();
    let all: Vec<Row> = inp
        .sets
        .iter()
        .flat_map(|s| s.rows.iter().cloned())
        .collect();
    let ok: Vec<&Row> = all.iter().filter(|r| r.status == Status::Ok).collect();
    b.push(Block::Heading(1, "memfit report".into()));
    let workload_of = workload_names(inp);
    let cores_of: BTreeMap<String, u64> = inp
        .sets
        .iter()
        .flat_map(|s| s.metas.iter().map(|m| (m.run_id.clone(), m.cores)))
        .collect();
    let ranks: Vec<crate::ranks::RanksDoc> = inp
        .sets
        .iter()
        .flat_map(|s| s.ranks.iter().cloned())
        .collect();
    let claims = claims::evaluate(
        &all,
        &workload_of,
        &cores_of,
        inp.dataload,
        inp.full_size,
        &ranks,
    );
    let charts = plots_for(&ok, inp.fitted);
    first_screen(&mut b, &claims, &charts);
    for line in mixed_builds(inp.sets) {
        b.push(Block::Para(line));
    }
    summary(&mut b, &all, &ok, &claims);
    components_section(&mut b, inp.components);
    claims_section(&mut b, &claims);
    timelines_section(&mut b, inp.sets);
    b.push(Block::Heading(2, "Details".into()));
    environment(&mut b, inp);
    phase_tables(&mut b, &ok, &workload_of);
    fit_section(&mut b, inp);
    candle_extra_section(&mut b, &ok);
    let refs: Vec<_> = inp
        .sets
        .iter()
        .flat_map(|s| s.reference.iter().cloned())
        .collect();
    let metas: Vec<RunMeta> = inp
        .sets
        .iter()
        .flat_map(|s| s.metas.iter().cloned())
        .collect();
    torch::section(&mut b, &ok, &refs, &metas);
    hardware_section(&mut b, inp);
    b.push(Block::Heading(2, "Plots".into()));
    for (name, chart) in charts
        .iter()
        .filter(|(n, _)| !AT_A_GLANCE.contains(&n.as_str()))
    {
        let mut caption = chart.title().to_string();
        if name.starts_with("memory_vs_") {
            caption.push_str(
                ". Each line is its phase's group fit (the fit table's), its formula drawn at every \
                 size; a group pools every row of its phase, model, element type and attention, \
                 so it can miss one sweep's points: the legend gives its largest miss on them",
            );
        }
        b.push(Block::Plot {
            name: name.clone(),
            caption,
        });
    }
    let mut svgs = BTreeMap::new();
    for (name, chart) in &charts {
        svgs.insert(name.clone(), plots::svg(chart)?);
    }
    let markdown = doc::markdown(&b);
    let html = doc::html("memfit report", &b, &|n| svgs.get(n).cloned());
    Ok(Report {
        markdown,
        html,
        charts,
        svgs,
    })
}

/// Trace files larger than this are named, not drawn inline (the page would carry them whole).
const TIMELINE_INLINE_BYTES: usize = 2 << 20;

/// The stored memory timelines (`memfit run --timeline`): the first of each phase drawn from
/// its trace JSON in the page (the trace embedded as is, drawn by the page's script: what a
/// trace viewer opens), the others counted.
fn timelines_section(b: &mut Vec<Block>, sets: &[ResultSet]) {
    let mut all: Vec<&(String, String)> = sets.iter().flat_map(|s| s.timelines.iter()).collect();
    // The train step first, then the serving phases in their order.
    let rank = |f: &str| {
        ["train-step", "inference", "prefill", "decode"]
            .iter()
            .position(|p| f.ends_with(&format!("{p}.json")))
            .unwrap_or(4)
    };
    all.sort_by_key(|(f, _)| rank(f));
    if all.is_empty() {
        return;
    }
    b.push(Block::Heading(2, "Memory timelines (measured)".into()));
    b.push(Block::Para(format!(
        "{} stored timeline(s) (`memfit run --timeline`): the counting allocator's every change \
         in the window, split into KV cache, activations, temporaries, gradients, workspace and \
         bookkeeping above the window's start; the first of each phase is drawn here from its \
         trace file, which opens as is in ui.perfetto.dev or chrome://tracing.",
        all.len()
    )));
    let mut drawn: Vec<usize> = Vec::new();
    for (path, json) in all {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else {
            b.push(Block::Para(format!(
                "`{path}`: not valid trace JSON (skipped)."
            )));
            continue;
        };
        let events = v["traceEvents"].as_array().cloned().unwrap_or_default();
        let name = events
            .iter()
            .find(|e| e["ph"] == "M")
            .and_then(|e| e["args"]["name"].as_str())
            .unwrap_or(path.as_str())
            .to_string();
        // One drawing per phase, named by the file (`case-N-PHASE.json`; any other trace file
        // counts as one more kind).
        if drawn.contains(&rank(path)) {
            continue;
        }
        drawn.push(rank(path));
        let peak = events
            .iter()
            .find(|e| e["ph"] == "i" && e["name"].as_str().is_some_and(|n| n.starts_with("peak")))
            .map(|e| &e["args"]);
        let caption = match peak {
            Some(p) => {
                let op = p["op"].as_str().unwrap_or("?");
                format!(
                    "{name}: peak {} in the {}{}",
                    crate::store::timeline::human(p["bytes"].as_u64().unwrap_or(0)),
                    p["stage"].as_str().unwrap_or("?"),
                    // The allocator sees no op names (`alloc`); a prediction's peak has one.
                    if op == "alloc" {
                        String::new()
                    } else {
                        format!(" at `{op}` ({})", p["layer"].as_str().unwrap_or("?"))
                    }
                )
            }
            None => name.clone(),
        };
        b.push(Block::Timeline {
            file: path.clone(),
            caption,
            trace: (json.len() <= TIMELINE_INLINE_BYTES).then(|| json.clone()),
        });
    }
}

/// The plots of the report's first screen, beside the verdicts.
const AT_A_GLANCE: [&str; 2] = ["predicted_vs_measured", "breakdown"];

/// The colour of each verdict kind in the strip.
const KIND_COLOURS: [(&str, &str); 6] = [
    ("holds", "#8cd17d"),
    ("partly", "#f1ce63"),
    ("does not hold", "#ff9d9a"),
    ("open", "#d7d7d7"),
    ("derived", "#a0cbe8"),
    ("not applicable", "#f4f4f4"),
];

/// The first screen: every claim's verdict as a coloured strip, then the predicted-against-
/// measured plot and what each training case holds, side by side.
fn first_screen(b: &mut Vec<Block>, claims: &[claims::Claim], charts: &[(String, Chart)]) {
    let n = |k: &str| claims.iter().filter(|c| c.kind() == k).count();
    b.push(Block::Para(format!(
        "Verdicts of the {} claims ({}), from the stored rows:",
        claims.len(),
        KIND_COLOURS
            .iter()
            .filter(|(k, _)| n(k) > 0)
            .map(|(k, _)| format!("{k} {}", n(k)))
            .collect::<Vec<_>>()
            .join(", ")
    )));
    b.push(Block::Strip {
        cells: claims
            .iter()
            .map(|c| (c.id.to_string(), c.kind().to_string()))
            .collect(),
        legend: KIND_COLOURS
            .iter()
            .map(|(k, c)| (k.to_string(), c.to_string()))
            .collect(),
    });
    let glance: Vec<(String, String)> = AT_A_GLANCE
        .iter()
        .filter_map(|name| {
            charts
                .iter()
                .find(|(n, _)| n == name)
                .map(|(n, chart)| (n.clone(), chart.title().to_string()))
        })
        .collect();
    if !glance.is_empty() {
        b.push(Block::Glance(glance));
    }
}

/// One line per result set whose runs come from more than one build (memfit version and git
/// commit), naming each build's runs: figures the report sets side by side across those runs
/// (a claim reading two workloads, a ratio) may differ by what changed between the builds.
fn mixed_builds(sets: &[ResultSet]) -> Vec<String> {
    let mut out = Vec::new();
    for s in sets {
        let mut builds: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for m in &s.metas {
            let name = std::path::Path::new(&m.workload)
                .file_stem()
                .map_or(m.workload.clone(), |n| n.to_string_lossy().into_owned());
            let runs = builds
                .entry(format!("memfit {} ({})", m.memfit_version, m.git_commit))
                .or_default();
            if !runs.contains(&name) {
                runs.push(name);
            }
        }
        if builds.len() > 1 {
            let parts: Vec<String> = builds
                .iter()
                .map(|(b, runs)| format!("{b}: {}", runs.join(", ")))
                .collect();
            out.push(format!(
                "**Mixed builds** in {}: {} builds measured its runs — {}. Figures compared across runs of different builds may differ by what changed between them; regenerate the set at one commit (`scripts/results-cpu.sh`) to compare like with like.",
                s.label,
                builds.len(),
                parts.join("; ")
            ));
        }
    }
    out
}

fn environment(b: &mut Vec<Block>, inp: &Inputs) {
    b.push(Block::Heading(2, "Environment".into()));
    let mut rows = Vec::new();
    for s in inp.sets {
        for m in &s.metas {
            rows.push(vec![
                s.label.clone(),
                m.run_id.clone(),
                m.workload.clone(),
                m.device_name.clone(),
                format!("{} ({} cores)", m.cpu_model, m.cores),
                m.threads.to_string(),
                m.os.clone(),
                format!(
                    "memfit {} ({}), candle {}",
                    m.memfit_version, m.git_commit, m.candle_version
                ),
                m.device_memory_bytes
                    .map_or("—".into(), |v| human_bytes(v as f64)),
                m.cuda_context_bytes
                    .map_or("—".into(), |v| human_bytes(v as f64)),
            ]);
        }
    }
    b.push(Block::Table(
        [
            "set",
            "run",
            "workload",
            "device",
            "CPU",
            "threads",
            "OS",
            "software",
            "device memory",
            "CUDA context",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    ));
    b.push(Block::Para(match inp.cpu_peak {
        Some(p) => format!(
            "CPU peak FLOP/s: {:.1} GFLOP/s, {} (the denominator of the CPU's \"% of peak\").",
            p.flops / 1e9,
            p.how
        ),
        None => "CPU peak FLOP/s: unknown (no datasheet figure; `memfit report --measure-cpu-peak` measures one with a matmul benchmark on this host when its CPU is the results').".into(),
    }));
}

/// Run id → the workload's file stem.
fn workload_names(inp: &Inputs) -> BTreeMap<String, String> {
    let mut workload_of = BTreeMap::new();
    for s in inp.sets {
        for m in &s.metas {
            let name = std::path::Path::new(&m.workload)
                .file_stem()
                .map_or(m.workload.clone(), |n| n.to_string_lossy().to_string());
            workload_of.insert(m.run_id.clone(), name);
        }
    }
    workload_of
}

/// The first screen: what was measured, how close the formulas are, and the verdicts.
fn summary(b: &mut Vec<Block>, all: &[Row], ok: &[&Row], claims: &[claims::Claim]) {
    let mut devices: Vec<String> = all.iter().map(|r| r.device.clone()).collect();
    devices.sort();
    devices.dedup();
    let runs: std::collections::BTreeSet<&str> = all.iter().map(|r| r.run_id.as_str()).collect();
    b.push(Block::Heading(2, "Summary".into()));
    b.push(Block::Para(format!(
        "{} row(s) from {} run(s) ({} ok, {} failed or out of memory) on {}. Every number below is read from the stored rows or computed from them; `memfit report` runs no model.",
        all.len(),
        runs.len(),
        ok.len(),
        all.len() - ok.len(),
        devices.join(", ")
    )));
    let mut counts: Vec<String> = claims::KINDS
        .iter()
        .filter_map(|k| {
            let n = claims.iter().filter(|c| c.kind() == *k).count();
            (n > 0).then(|| {
                let ids: Vec<&str> = claims
                    .iter()
                    .filter(|c| c.kind() == *k)
                    .map(|c| c.id)
                    .collect();
                format!("{k} {n} ({})", ids.join(", "))
            })
        })
        .collect();
    let other: Vec<&str> = claims
        .iter()
        .filter(|c| c.kind() == "other")
        .map(|c| c.id)
        .collect();
    if !other.is_empty() {
        counts.push(format!(
            "unclassified {} ({})",
            other.len(),
            other.join(", ")
        ));
    }
    b.push(Block::Para(format!(
        "Verdicts of the {} claims: {}.",
        claims.len(),
        counts.join("; ")
    )));
    let mut by: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
    for r in ok {
        by.entry(r.phase.as_str()).or_default().push(r);
    }
    let worst: Vec<Vec<String>> = by
        .iter()
        .map(|(p, rs)| {
            let w = rs
                .iter()
                .filter_map(|r| Some((*r, err_pct(r)?)))
                .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()));
            vec![
                p.to_string(),
                rs.len().to_string(),
                w.map_or("—".into(), |(_, e)| format!("{e:+.4}")),
                w.map_or("— (no prediction)".into(), |(r, _)| hardware::describe(r)),
            ]
        })
        .collect();
    b.push(Block::OpenTable(
        ["phase", "rows", "worst error %", "worst row"]
            .map(String::from)
            .to_vec(),
        worst,
    ));
    let cuda = all.iter().any(|r| r.device.starts_with("cuda"));
    b.push(Block::Para(if cuda {
        let open: Vec<&str> = claims
            .iter()
            .filter(|c| c.kind() != "holds" && !gpu_clauses(c).is_empty())
            .map(|c| c.id)
            .collect();
        format!(
            "CUDA rows are present. Still open on a GPU: {}.",
            if open.is_empty() { "nothing".into() } else { open.join(", ") }
        )
    } else {
        // Every claim whose verdict names a GPU or CUDA part, whatever its kind (a CPU half that
        // holds can leave a CUDA half unmeasured), with the clause that names it.
        let open: Vec<String> = claims
            .iter()
            .filter_map(|c| {
                let parts = gpu_clauses(c);
                (!parts.is_empty()).then(|| format!("{} ({})", c.id, parts.join("; ")))
            })
            .collect();
        format!(
            "No CUDA rows: every figure is the CPU's exact allocator count. Needs a GPU (`scripts/gpu-run.sh`): {}; and every CUDA calibration of `memfit predict`.",
            if open.is_empty() { "no claim".into() } else { open.join("; ") }
        )
    }));
}

/// The clauses of a claim's verdict (split at `;`) that name a GPU or CUDA: what a GPU run would
/// add to it. Empty when the verdict names neither.
fn gpu_clauses(c: &claims::Claim) -> Vec<String> {
    let kind = format!("{}: ", c.kind());
    c.verdict
        .split(';')
        .map(str::trim)
        .filter(|p| p.contains("GPU") || p.contains("CUDA"))
        .map(|p| p.strip_prefix(kind.as_str()).unwrap_or(p).to_string())
        .collect()
}

fn phase_tables(b: &mut Vec<Block>, ok: &[&Row], workload_of: &BTreeMap<String, String>) {
    b.push(Block::Heading(
        2,
        "Per phase: measured against the formulas".into(),
    ));
    b.push(Block::Para(
        "A configuration shows every case key that differs within its table; the same configuration in two runs carries its workload's name.".into(),
    ));
    for (p, rs) in &phase_groups(ok) {
        b.push(Block::Heading(3, format!("`{p}`")));
        let names = labels::labels(rs, workload_of);
        let lines = rs
            .iter()
            .zip(names)
            .map(|(r, name)| {
                vec![
                    name,
                    r.device.clone(),
                    opt(r.peak_bytes.map(|v| v as f64), human_bytes),
                    opt(r.predicted_peak_bytes.map(|v| v as f64), human_bytes),
                    opt(err_pct(r), |e| format!("{e:+.4}")),
                    opt(r.retained_bytes.map(|v| v as f64), human_bytes),
                    opt(r.rss_peak_bytes.map(|v| v as f64), human_bytes),
                    opt(r.wall_s, |w| format!("{w:.3}")),
                ]
            })
            .collect();
        b.push(Block::Table(
            [
                "configuration",
                "device",
                "measured peak",
                "predicted",
                "error %",
                "retained",
                "RSS peak",
                "wall s",
            ]
            .map(String::from)
            .to_vec(),
            lines,
        ));
    }
}

/// The ok rows by phase: one per-phase table each.
pub fn phase_groups<'a>(ok: &[&'a Row]) -> BTreeMap<String, Vec<&'a Row>> {
    let mut by: BTreeMap<String, Vec<&Row>> = BTreeMap::new();
    for r in ok {
        by.entry(r.phase.to_string()).or_default().push(r);
    }
    by
}

/// The per-phase tables' configuration labels of a result set, by phase (for tests).
pub fn phase_labels(
    rows: &[Row],
    workload_of: &BTreeMap<String, String>,
) -> BTreeMap<String, Vec<String>> {
    let ok: Vec<&Row> = rows.iter().filter(|r| r.status == Status::Ok).collect();
    phase_groups(&ok)
        .into_iter()
        .map(|(p, rs)| {
            let l = labels::labels(&rs, workload_of);
            (p, l)
        })
        .collect()
}

/// The analytical predictions per component: mean and largest error, and how often each
/// under-estimates ([`crate::fit::components`]).
fn components_section(b: &mut Vec<Block>, components: &[crate::fit::components::ComponentError]) {
    use crate::fit::components::{UNDER_BYTES, UNDER_REL};
    if components.is_empty() {
        return;
    }
    b.push(Block::Heading(2, "Predictions per component".into()));
    b.push(Block::Para(format!(
        "The analytical prediction against the measurement of each part of memory: the weights \
         init leaves, the optimizer state the first step leaves, the activations a training \
         forward keeps, the KV cache a prompt leaves, and every window's peak. An under-estimate \
         is a prediction below the measurement by more than {} KiB and {} % of it (inside both: \
         bookkeeping) — the error a memory tool must not make.",
        UNDER_BYTES / 1024.0,
        UNDER_REL * 100.0
    )));
    let rows = components
        .iter()
        .map(|c| {
            vec![
                c.component.to_string(),
                c.device.clone(),
                c.rows.to_string(),
                format!("{:.3}", c.mean_abs_pct),
                format!("{:.3}", c.max_abs_pct),
                format!("{} ({:.1} %)", c.under, 100.0 * c.under_rate),
                format!("{:.0}", c.worst_under_bytes),
            ]
        })
        .collect();
    b.push(Block::Table(
        [
            "component",
            "device",
            "rows",
            "mean |error| %",
            "max |error| %",
            "under-estimates",
            "largest under-estimate (B)",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        rows,
    ));
}

fn fit_section(b: &mut Vec<Block>, inp: &Inputs) {
    b.push(Block::Heading(2, "Fits with held-out errors".into()));
    b.push(Block::Para(
        "Per phase and group of comparable rows, `bytes = c₀ + c₁·P + c₂·B·S·H·L + c₃·A·B·S²·L + c₄·B·S·V` \
         by least squares (`memfit fit`). Held out: 5-fold over cases, and extrapolation (fit the \
         smaller half by parameters, test on the larger). Mean/max absolute error in percent; — where \
         a group has too few rows."
            .into(),
    ));
    let pair =
        |h: Option<(f64, f64)>| h.map_or("—".to_string(), |(a, m)| format!("{a:.2} / {m:.2}"));
    let rows = inp
        .fits
        .iter()
        .map(|g| {
            vec![
                g.phase.clone(),
                g.device.clone(),
                g.dtype.clone(),
                g.variant.clone(),
                g.rows.to_string(),
                if g.r2.is_nan() {
                    "—".into()
                } else {
                    format!("{:.6}", g.r2)
                },
                pair(g.kfold),
                pair(g.extrapolation),
                g.formula(),
            ]
        })
        .collect();
    b.push(Block::Table(
        [
            "phase",
            "device",
            "dtype",
            "variant",
            "rows",
            "R²",
            "5-fold mean / max %",
            "extrapolation mean / max %",
            "fit (bytes)",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    ));
    b.push(Block::Heading(
        2,
        "Textbook formulas on the same rows".into(),
    ));
    b.push(Block::Table(
        [
            "formula",
            "against",
            "cases",
            "mean |error| %",
            "max |error| %",
        ]
        .map(String::from)
        .to_vec(),
        inp.textbook
            .iter()
            .map(|t| {
                vec![
                    t.formula.to_string(),
                    t.against.to_string(),
                    t.cases.to_string(),
                    format!("{:.2}", t.mean_pct),
                    format!("{:.2}", t.max_pct),
                ]
            })
            .collect(),
    ));
    b.push(Block::Para(
        "The calculators users compare against, read as their code is written (`src/fit/textbook.rs`): \
         Megatron-LM's `theoretical_memory_usage` counts parameters with grouped-query attention and \
         SwiGLU but without linear biases or a position table, charges 18 B per parameter (16-bit \
         weights, f32 gradients, master copy and Adam moments; memfit's mixed precision keeps 16 B: \
         no separate 16-bit copy between steps), and without sequence parallelism counts 34·s·b·h \
         per layer with no attention-score term (it assumes fused attention; candle keeps the \
         A·B·S² scores). Accelerate's `estimate-memory` sizes the Hugging Face base model \
         (`AutoModel`: no LM head, so an untied head is missed) and its \"Training using Adam\" is \
         the largest of four terms (16 B/param in f32, 8 B/param for float16), not their sum; \
         neither counts activations."
            .into(),
    ));
}

/// What candle keeps that Korthikanti's dropout-free accounting does not, itemised in bytes for
/// the largest plain f32 GPT forward graph of the rows.
fn candle_extra_section(b: &mut Vec<Block>, ok: &[&Row]) {
    let Some((r, items)) = ok
        .iter()
        .filter(|r| {
            r.phase == Phase::Forward
                && r.kernels == "composed"
                && r.checkpoint == 0
                && r.lora_rank == 0
                && r.attention != "efficient"
                && r.precision != "mixed"
                && r.retained_bytes.is_some()
        })
        .filter_map(|r| Some((*r, crate::fit::textbook::candle_extra(r)?)))
        .max_by_key(|(r, _)| r.retained_bytes)
    else {
        return;
    };
    let Some(m) = r.retained_bytes.map(|v| v as f64) else {
        return;
    };
    let (bb, s, h, a, l, v) = (
        r.batch as f64,
        r.seq as f64,
        r.hidden as f64,
        r.heads as f64,
        r.layers as f64,
        r.vocab as f64,
    );
    let raw = l * s * bb * h * (34.0 + 5.0 * a * s / h) * 2.0;
    let equal = l * s * bb * h * (32.0 + 2.0 * a * s / h) * 2.0
        + 4.0 * (2.0 * bb * s * h + 2.0 * bb * s * v);
    let sum: f64 = items.iter().map(|x| x.1).sum();
    b.push(Block::Heading(
        3,
        format!(
            "What candle keeps that the paper's accounting does not ({})",
            hardware::describe(r)
        ),
    ));
    b.push(Block::Para(format!(
        "Measured forward graph {}; Korthikanti raw {} ({:+.1} %), on equal terms (no dropout, embedding/head/loss counted) {} ({:+.1} %). The rest, item by item from memfit's per-op accounting (f32):",
        human_bytes(m),
        human_bytes(raw),
        (raw / m - 1.0) * 100.0,
        human_bytes(equal),
        (equal / m - 1.0) * 100.0
    )));
    let mut rows: Vec<Vec<String>> = items
        .iter()
        .map(|(what, bytes)| {
            vec![
                what.to_string(),
                human_bytes(*bytes),
                format!("{:.1}", bytes / m * 100.0),
            ]
        })
        .collect();
    rows.push(vec![
        "equal-terms count + these items".into(),
        human_bytes(equal + sum),
        format!("{:.1}", (equal + sum) / m * 100.0),
    ]);
    rows.push(vec![
        "measured − that (candle's per-tensor metadata)".into(),
        human_bytes(m - equal - sum),
        format!("{:.3}", (m - equal - sum) / m * 100.0),
    ]);
    b.push(Block::OpenTable(
        ["item", "bytes", "% of the measured graph"]
            .map(String::from)
            .to_vec(),
        rows,
    ));
}

fn claims_section(b: &mut Vec<Block>, claims: &[claims::Claim]) {
    b.push(Block::Heading(2, "Claims".into()));
    b.push(Block::Para(
        "Every claim of the seed note, decided from these rows by the criterion in its row. A verdict \
         starts with its kind (holds, partly, does not hold, open, derived, not applicable); \"open\" \
         names the workload that would decide it; B5 is measured on real ranks where the set holds \
         `memfit ranks` runs (ranks*.json), else derived from measured per-device state; F3 \
         predicted when no such run is present."
            .into(),
    ));
    // The verdict opens onto its criterion, workloads and figures (in HTML).
    let rows = claims
        .iter()
        .map(|c| {
            (
                vec![c.id.to_string(), c.claim.to_string(), c.verdict.clone()],
                vec![
                    ("criterion".to_string(), c.criterion.clone()),
                    ("workload".to_string(), c.workload.clone()),
                    ("measured".to_string(), c.measured.clone()),
                    ("predicted".to_string(), c.predicted.clone()),
                ],
            )
        })
        .collect();
    b.push(Block::Expandable(
        ["claim", "statement", "verdict"].map(String::from).to_vec(),
        rows,
    ));
}

fn hardware_section(b: &mut Vec<Block>, inp: &Inputs) {
    b.push(Block::Heading(2, "Hardware comparison".into()));
    b.push(Block::Para(
        "The same configuration and phase in each result set. FLOPs are the matrix products of \
         `formula::flops` (≈ 6·P·tokens + the attention term for a training step); achieved = FLOPs \
         / the row's wall time (one sample, on whatever else the machine was doing); % of peak \
         against the datasheet (accelerators) or the measured CPU peak."
            .into(),
    ));
    let device_names: Vec<String> = inp
        .sets
        .iter()
        .map(|s| {
            s.metas
                .first()
                .map_or(String::new(), |m| m.device_name.clone())
        })
        .collect();
    let peak_fns: Vec<PeakFn> = inp
        .sets
        .iter()
        .zip(&device_names)
        .map(|(s, name)| {
            let name = name.clone();
            let cpu_model = s.metas.first().map(|m| m.cpu_model.clone());
            let cpu = inp.cpu_peak.cloned();
            let is_cpu = s.rows.iter().all(|r| r.device == "cpu");
            Box::new(move |dtype: &str| {
                if let Some(p) = hardware::datasheet_peak(&name, dtype) {
                    return Some(p);
                }
                match &cpu {
                    Some(c)
                        if is_cpu
                            && dtype == "f32"
                            && cpu_model.as_deref() == Some(c.cpu_model.as_str()) =>
                    {
                        Some(hardware::Peak {
                            flops: c.flops,
                            source: c.how.clone(),
                        })
                    }
                    _ => None,
                }
            }) as PeakFn
        })
        .collect();
    let views: Vec<hardware::SetView> = inp
        .sets
        .iter()
        .zip(&device_names)
        .zip(&peak_fns)
        .map(|((s, n), p)| hardware::SetView {
            label: &s.label,
            device_name: n,
            rows: &s.rows,
            peak: p.as_ref(),
        })
        .collect();
    let (head, rows, top) = hardware::table(&views);
    b.push(Block::Table(head, rows));
    if top > 1.0 {
        b.push(Block::Para(format!(
            "Some rows reach {:.0} % of the peak used: a measured peak is one sample, and when the              benchmark ran on a busier machine than the rows did it is only a lower bound of the              device's matmul rate.",
            top * 100.0
        )));
    }
    let mut notes = Vec::new();
    for v in &views {
        for dtype in ["f32", "bf16", "f16"] {
            if let Some(p) = (v.peak)(dtype) {
                notes.push(format!(
                    "{} ({}), {dtype}: peak {:.1} GFLOP/s — {}",
                    v.label,
                    v.device_name,
                    p.flops / 1e9,
                    p.source
                ));
            }
        }
    }
    if !notes.is_empty() {
        b.push(Block::Para(format!("Peaks used: {}.", notes.join("; "))));
    }
}

/// Training cases with init, forward, backward and optimizer rows: their model state and graph.
fn breakdown_cases<'a>(ok: &[&'a Row]) -> Vec<BTreeMap<&'a str, &'a Row>> {
    let mut cases: BTreeMap<(&str, u64), BTreeMap<&str, &Row>> = BTreeMap::new();
    for r in ok {
        cases
            .entry((r.run_id.as_str(), r.case))
            .or_default()
            .insert(r.phase.as_str(), r);
    }
    cases
        .into_values()
        .filter(|c| {
            ["init", "forward", "backward", "optimizer"]
                .iter()
                .all(|p| c.get(p).is_some_and(|r| r.retained_bytes.is_some()))
        })
        .take(16)
        .collect()
}

/// KV cache configurations as one legend entry: each model, batch and element type once,
/// with its serving weights' formats when any is not the model's own.
fn kv_configs(configs: &[(String, String)]) -> String {
    let mut by: Vec<(&str, Vec<&str>)> = Vec::new();
    for (c, w) in configs {
        match by.iter_mut().find(|(k, _)| k == c) {
            Some((_, ws)) => ws.push(w),
            None => by.push((c, vec![w])),
        }
    }
    by.iter()
        .map(|(c, ws)| {
            if ws == &["model"] {
                c.to_string()
            } else {
                format!("{c} (weights {})", ws.join(", "))
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The gradients a training case's backward holds, in bytes: its own figure after a whole
/// backward, else its kept bytes plus the forward graph it freed ([`Row::gradient_bytes`]).
/// When the case's run measured no forward (a run of the backward and optimizer alone), the
/// forward of the same configuration in another run stands in (every configuration field but
/// the optimizer equal: the forward does not depend on it), and the flag says so; `None` when
/// there is none.
pub fn gradients_of(ok: &[&Row], o: &Row) -> Option<(i64, bool)> {
    let backward = ok
        .iter()
        .find(|b| b.phase == Phase::Backward && b.run_id == o.run_id && b.case == o.case)?;
    let own = ok
        .iter()
        .find(|f| f.phase == Phase::Forward && f.run_id == o.run_id && f.case == o.case);
    if let Some(g) = backward.gradient_bytes(own.copied()) {
        return Some((g, false));
    }
    let apart = ["run", "optimizer", "optimizer_block", "phase"];
    let key = claims::config_key_without(backward, &apart);
    let same = |r: &Row| {
        claims::config_key_without(r, &apart) == key
            && (
                r.kernels.as_str(),
                r.backward.as_str(),
                r.trim.as_str(),
                r.flush_denormals.as_str(),
            ) == (
                backward.kernels.as_str(),
                backward.backward.as_str(),
                backward.trim.as_str(),
                backward.flush_denormals.as_str(),
            )
    };
    let stand_in = ok
        .iter()
        .find(|f| f.phase == Phase::Forward && f.retained_bytes.is_some() && same(f))?;
    Some((backward.gradient_bytes(Some(stand_in))?, true))
}

/// The curve of a fit on a fine grid: `fitted` at up to 256 whole sizes between `lo` and `hi`
/// (B and S are whole), `at(x)` the row it is evaluated on.
fn fitted_curve(
    lo: u64,
    hi: u64,
    at: &dyn Fn(u64) -> Row,
    fitted: &dyn Fn(&Row) -> Option<f64>,
) -> Vec<(f64, f64)> {
    let step = hi.saturating_sub(lo).div_ceil(256).max(1) as usize;
    let mut xs: Vec<u64> = (lo..=hi).step_by(step).collect();
    if xs.last() != Some(&hi) {
        xs.push(hi);
    }
    xs.into_iter()
        .filter_map(|x| Some((x as f64, fitted(&at(x))? / MIB)))
        .collect()
}

/// The report's charts from the measured rows; `fitted` is each row's group fit.
pub fn plots_for(ok: &[&Row], fitted: &dyn Fn(&Row) -> Option<f64>) -> Vec<(String, Chart)> {
    let mut out = Vec::new();
    let mib = |v: f64| v / MIB;
    // 1. Predicted vs measured, per phase, log-log.
    let mut by: BTreeMap<&str, Vec<(f64, f64)>> = BTreeMap::new();
    for r in ok {
        if let (Some(m), Some(p)) = (r.peak_bytes, r.predicted_peak_bytes)
            && m > 0
            && p > 0
        {
            by.entry(r.phase.as_str())
                .or_default()
                .push((mib(m as f64), mib(p as f64)));
        }
    }
    if !by.is_empty() {
        out.push((
            "predicted_vs_measured".to_string(),
            Chart::Xy(XyChart {
                title: "Predicted vs measured peak per phase (log-log)".into(),
                x_label: "measured peak (MiB)".into(),
                y_label: "predicted peak (MiB)".into(),
                log: true,
                diagonal: true,
                // On the first screen, at half the page's width.
                narrow: true,
                series: by
                    .into_iter()
                    .enumerate()
                    .map(|(i, (p, pts))| Series {
                        name: p.to_string(),
                        points: pts,
                        line: false,
                        color: i,
                    })
                    .collect(),
            }),
        ));
    }
    // 2. Memory vs batch and vs sequence, per phase, with the fitted curve: the group fit's
    // formula evaluated on a fine grid. The fit is the group's (every row of the phase, model,
    // element type, attention…; `fit::group`), not the sweep's: its largest miss on the
    // sweep's own points is in the legend.
    for (axis, name, what) in [
        ("batch", "memory_vs_batch", "batch (sequences)"),
        ("seq", "memory_vs_seq", "sequence length (tokens)"),
    ] {
        let get = |r: &Row| if axis == "batch" { r.batch } else { r.seq };
        let mut series = Vec::new();
        for phase in [Phase::Forward, Phase::Backward, Phase::TrainStep] {
            let mut sw = claims::sweeps(ok, phase, axis, get);
            sw.sort_by_key(|s| std::cmp::Reverse(s.len()));
            for s in sw.into_iter().take(if axis == "seq" { 2 } else { 1 }) {
                let r0 = s[0];
                let shape = if r0.preset == "custom" {
                    format!("H{} L{}", r0.hidden, r0.layers)
                } else {
                    r0.preset.clone()
                };
                let fixed = if axis == "batch" {
                    format!("{shape} L{} S{}", r0.layers, r0.seq)
                } else {
                    format!("{shape} L{} B{}", r0.layers, r0.batch)
                };
                let tag = if axis == "seq" && r0.attention == "efficient" {
                    format!("{phase}, efficient attn ({fixed})")
                } else {
                    format!("{phase} ({fixed})")
                };
                let color = series.len() / 2;
                let points: Vec<(f64, f64)> = s
                    .iter()
                    .filter_map(|r| Some((get(r) as f64, mib(r.peak_bytes? as f64))))
                    .collect();
                let miss = s
                    .iter()
                    .filter_map(|r| {
                        let m = r.peak_bytes? as f64;
                        (m > 0.0).then_some((fitted(r)? - m).abs() / m * 100.0)
                    })
                    .fold(None, |a: Option<f64>, e| Some(a.map_or(e, |a| a.max(e))));
                let at = |x: u64| {
                    let mut r = r0.clone();
                    if axis == "batch" {
                        r.batch = x;
                    } else {
                        r.seq = x;
                    }
                    r
                };
                let curve = fitted_curve(get(s[0]), get(s[s.len() - 1]), &at, fitted);
                series.push(Series {
                    name: match miss {
                        Some(m) if m >= 10.0 => {
                            format!("{tag}; its group's fit misses by up to {m:.0} %")
                        }
                        Some(m) => format!("{tag}; fit within {m:.1} %"),
                        None => format!("{tag}; no fit"),
                    },
                    points,
                    line: false,
                    color,
                });
                series.push(Series {
                    name: String::new(),
                    points: curve,
                    line: true,
                    color,
                });
            }
        }
        if !series.is_empty() {
            out.push((
                name.to_string(),
                Chart::Xy(XyChart {
                    title: format!("Peak vs {what}: measured (dots), least-squares fit (lines)"),
                    x_label: what.into(),
                    y_label: "peak above the phase's start (MiB)".into(),
                    log: false,
                    diagonal: false,
                    series,
                    narrow: false,
                }),
            ));
        }
    }
    // 3. Stacked breakdown of training cases, each bar labelled by its configuration. A
    // missing figure is NaN: no segment is drawn and the bar's label says so.
    let cases = breakdown_cases(ok);
    if !cases.is_empty() {
        let val = |c: &BTreeMap<&str, &Row>, p: &str| {
            c.get(p)
                .and_then(|r| {
                    if p == "backward" {
                        // By block the backward used the graph up: its gradients.
                        r.gradient_bytes(c.get("forward").copied())
                    } else {
                        r.retained_bytes
                    }
                })
                .map_or(f64::NAN, |v| mib(v.max(0) as f64))
        };
        let opt_rows: Vec<&Row> = cases.iter().map(|c| c["optimizer"]).collect();
        // Shares of each case's total, so that a 3 GiB case and a 3 MiB one both show what
        // they hold; the total is in the short label.
        let parts = [
            ("weights (init)", "init"),
            ("activations (forward graph)", "forward"),
            ("gradients (backward)", "backward"),
            ("optimizer state", "optimizer"),
        ];
        let totals: Vec<f64> = cases
            .iter()
            .map(|c| {
                parts
                    .iter()
                    .map(|(_, p)| val(c, p))
                    .filter(|v| v.is_finite())
                    .sum()
            })
            .collect();
        let names = labels::short_labels(&opt_rows);
        out.push((
            "breakdown".to_string(),
            Chart::Bars(BarChart {
                title: "What a training step holds, per case (share of its total)".into(),
                y_label: "% of the case's total (the total follows its label)".into(),
                categories: names
                    .iter()
                    .zip(&totals)
                    .map(|(n, t)| format!("{n} · {}", human_mib(*t)))
                    .collect(),
                stacks: parts
                    .iter()
                    .map(|(n, p)| {
                        (
                            n.to_string(),
                            cases
                                .iter()
                                .zip(&totals)
                                .map(|(c, t)| 100.0 * val(c, p) / t.max(f64::MIN_POSITIVE))
                                .collect(),
                        )
                    })
                    .collect(),
                y_max: Some(100.0),
                horizontal: true,
                // On the first screen, at half the page's width.
                narrow: true,
            }),
        ));
    }
    // 4. KV cache growth: prefill's cache (S tokens) and after decode (S + T), against
    // B·n·(the architecture's cache bytes per token), n capped at a sliding window. Rows of
    // one architecture, batch, element type and cache width are one series (the weights'
    // formats, which leave the cache alone, are listed in its name); series are grouped into
    // panels by kind of model.
    let mut kv: BTreeMap<(usize, String), KvSeries> = BTreeMap::new();
    for d in ok
        .iter()
        .filter(|r| r.phase == Phase::Decode && r.kv_cache == "on")
    {
        let Some(p) = ok
            .iter()
            .find(|p| p.phase == Phase::Prefill && p.run_id == d.run_id && p.case == d.case)
        else {
            continue;
        };
        let (Some(pr), Some(dr)) = (p.retained_bytes, d.retained_bytes) else {
            continue;
        };
        // The architecture's figure; rows older than that column: 2·L·H·e.
        let per_token = d.kv_bytes_per_token.map_or_else(
            || {
                let e = if d.weights == "f16" || d.precision == "mixed" || d.dtype != "f32" {
                    2.0
                } else {
                    4.0
                };
                2.0 * (d.layers * d.hidden) as f64 * e
            },
            |k| k as f64,
        );
        let panel = match d.preset.as_str() {
            "custom" => 0,
            "tiny" | "small" | "gpt2-small" => 1,
            _ => 2,
        };
        let model = if d.preset == "custom" {
            format!("{} L{} H{}", d.model, d.layers, d.hidden)
        } else {
            format!("{} L{}", d.preset, d.layers)
        };
        let config = (
            format!("{model} B{} {}", d.batch, d.dtype),
            d.weights.clone(),
        );
        // Configurations whose caches are the same size at every n share a line and an entry.
        let per_cache_token = d.batch as f64 * per_token;
        let window = d
            .sliding_window
            .map_or(String::new(), |w| format!(", window {w}"));
        let key = format!("{:>12} B/token{window}", per_cache_token.round() as u64);
        let entry = kv.entry((panel, key)).or_insert_with(|| KvSeries {
            points: Vec::new(),
            configs: Vec::new(),
            per_token: per_cache_token,
            window: d.sliding_window,
        });
        if !entry.configs.contains(&config) {
            entry.configs.push(config);
        }
        for pt in [
            (d.seq as f64, mib(pr as f64)),
            ((d.seq + d.decode_tokens) as f64, mib((pr + dr) as f64)),
        ] {
            if !entry.points.contains(&pt) {
                entry.points.push(pt);
            }
        }
    }
    if !kv.is_empty() {
        let titles = [
            "custom decoders",
            "memfit's small presets",
            "published architectures, layers cut",
        ];
        let mut panels: Vec<XyChart> = Vec::new();
        for (p, title) in titles.iter().enumerate() {
            let mine: Vec<(&String, &KvSeries)> = kv
                .iter()
                .filter(|((panel, _), _)| *panel == p)
                .map(|((_, k), v)| (k, v))
                .collect();
            // At most MAX_LEGEND series a panel, each its own colour.
            for (part, chunk) in mine.chunks(plots::MAX_LEGEND).enumerate() {
                let lo = chunk
                    .iter()
                    .flat_map(|(_, s)| s.points.iter().map(|p| p.0))
                    .fold(f64::MAX, f64::min);
                let hi = chunk
                    .iter()
                    .flat_map(|(_, s)| s.points.iter().map(|p| p.0))
                    .fold(0.0, f64::max);
                // Log axes where the sizes span more than 20×, else linear from 0.
                let log = hi > 20.0 * lo;
                let (lo, hi) = if log {
                    (lo / 1.4, hi * 1.4)
                } else {
                    (0.0, hi * 1.1)
                };
                let mut series = Vec::new();
                for (i, (_, s)) in chunk.iter().enumerate() {
                    series.push(Series {
                        name: format!(
                            "{}: {}/token{}",
                            kv_configs(&s.configs),
                            human_bytes(s.per_token),
                            s.window.map_or(String::new(), |w| format!(", {w} kept"))
                        ),
                        points: s.points.clone(),
                        line: false,
                        color: i,
                    });
                    // On a fine grid, with the window's corner.
                    let mut ns: Vec<f64> = (0..=64)
                        .map(|j| {
                            let t = j as f64 / 64.0;
                            if log {
                                lo * (hi / lo).powf(t)
                            } else {
                                lo + (hi - lo) * t
                            }
                        })
                        .chain(s.window.map(|w| w as f64).filter(|w| (lo..=hi).contains(w)))
                        .collect();
                    ns.sort_by(f64::total_cmp);
                    series.push(Series {
                        name: String::new(),
                        points: ns
                            .into_iter()
                            .map(|n| {
                                let n_kept = s.window.map_or(n, |w| n.min(w as f64));
                                (n, mib(s.per_token * n_kept))
                            })
                            .collect(),
                        line: true,
                        color: i,
                    });
                }
                panels.push(XyChart {
                    title: if part == 0 {
                        title.to_string()
                    } else {
                        format!("{title} ({})", part + 1)
                    },
                    x_label: "tokens in the cache n (per sequence)".into(),
                    y_label: "cache held (MiB)".into(),
                    log,
                    diagonal: false,
                    series,
                    narrow: false,
                });
            }
        }
        out.push((
            "kv_cache".to_string(),
            Chart::Panels(Panels {
                title: "KV cache vs tokens: measured (dots), B·n·bytes per token (lines)".into(),
                panels,
            }),
        ));
    }
    // 5. Optimizer comparison: the config with the most optimizers.
    let opt_rows: Vec<&Row> = ok
        .iter()
        .copied()
        .filter(|r| r.phase == Phase::Optimizer && r.lora_rank == 0 && r.precision != "mixed")
        .collect();
    if let Some(group) = claims::sweeps(&opt_rows, Phase::Optimizer, "optimizer", |r| {
        ["sgd", "sgd-momentum", "adam", "adamw", "adamw-8bit"]
            .iter()
            .position(|o| *o == r.optimizer)
            .unwrap_or(9) as u64
    })
    .into_iter()
    .max_by_key(|g| g.len())
    {
        let found: Vec<Option<(i64, bool)>> = group.iter().map(|o| gradients_of(ok, o)).collect();
        let grads: Vec<f64> = found
            .iter()
            .map(|g| g.map_or(f64::NAN, |(v, _)| mib(v as f64)))
            .collect();
        let grads_name = if found.iter().flatten().any(|(_, stand_in)| *stand_in) {
            "gradients (the backward's; its run measured no forward: the graph it freed is \
             a same-config run's forward)"
        } else {
            "gradients (the backward's)"
        };
        let state: Vec<f64> = group
            .iter()
            .map(|o| o.retained_bytes.map_or(f64::NAN, |v| mib(v as f64)))
            .collect();
        let step: Vec<f64> = group
            .iter()
            .map(|o| match (o.peak_bytes, o.retained_bytes) {
                (Some(p), Some(r)) => mib((p as f64 - r as f64).max(0.0)),
                _ => f64::NAN,
            })
            .collect();
        out.push((
            "optimizers".to_string(),
            Chart::Bars(BarChart {
                title: format!(
                    "Optimizers on {}: gradients, state, and the first step's transient",
                    hardware::describe(group[0])
                        .split(' ')
                        .take(3)
                        .collect::<Vec<_>>()
                        .join(" ")
                ),
                y_label: "memory (MiB)".into(),
                categories: group.iter().map(|r| r.optimizer.clone()).collect(),
                stacks: vec![
                    (grads_name.into(), grads),
                    ("optimizer state (kept)".into(), state),
                    ("step transient (peak − kept)".into(), step),
                ],
                y_max: None,
                horizontal: false,
                narrow: false,
            }),
        ));
    }
    out
}

/// Reads one result set: every result file under `path`, and each run's metadata
/// (`meta.json` beside a journal, the attributes of an HDF5 file).
pub fn load_set(path: &std::path::Path) -> anyhow::Result<ResultSet> {
    let files = crate::store::result_files(path)?;
    if files.is_empty() {
        return Err(crate::error::UserError::Unreadable {
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
    let mut timelines = Vec::new();
    for f in crate::store::timeline::trace_files(path) {
        let json = std::fs::read_to_string(&f)
            .map_err(|e| anyhow::anyhow!("reading the timeline {}: {e}", f.display()))?;
        timelines.push((f.display().to_string(), json));
    }
    let ranks = crate::ranks::RanksDoc::files(path)
        .iter()
        .map(|f| crate::ranks::RanksDoc::read(f))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(ResultSet {
        label: path.display().to_string(),
        metas,
        rows,
        reference,
        timelines,
        ranks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(run: &str, commit: &str, workload: &str) -> RunMeta {
        let mut m = crate::machine::base_meta(run.into(), 2, "test");
        m.git_commit = commit.into();
        m.workload = workload.into();
        m
    }

    /// A by-block backward's gradients are its kept bytes plus the graph its forward held;
    /// a run that measured no forward borrows the forward of the same configuration from
    /// another run (and says so), never one of another configuration.
    #[test]
    fn gradients_borrow_a_same_config_forward_only() {
        let row = |run: &str, phase: &str, retained: i64, seq: u64| {
            let mut r = Row::example();
            (r.run_id, r.phase, r.retained_bytes, r.seq) = (
                run.into(),
                Phase::parse(phase).expect("a phase"),
                Some(retained),
                seq,
            );
            r.backward = "by-block".into();
            r
        };
        let opt = row("a", "optimizer", 300, 8);
        let own = [row("a", "forward", 1000, 8), row("a", "backward", -600, 8)];
        let refs: Vec<&Row> = own.iter().chain([&opt]).collect();
        assert_eq!(gradients_of(&refs, &opt), Some((400, false)));
        // Run `a` without its forward: run `b`'s forward of the same configuration stands in
        // (its optimizer differs: the forward does not depend on it), not run `c`'s longer one.
        let mut other = row("b", "forward", 1000, 8);
        other.optimizer = "sgd".into();
        let rows = [
            row("a", "backward", -600, 8),
            row("c", "forward", 5000, 16),
            other,
        ];
        let refs: Vec<&Row> = rows.iter().chain([&opt]).collect();
        assert_eq!(gradients_of(&refs, &opt), Some((400, true)));
        let refs: Vec<&Row> = rows[..2].iter().chain([&opt]).collect();
        assert_eq!(gradients_of(&refs, &opt), None);
    }

    /// A set measured by one build says nothing; a mix names each build and its workloads.
    #[test]
    fn a_mix_of_builds_is_flagged_with_each_builds_runs() {
        let set = |metas| ResultSet {
            timelines: Vec::new(),
            ranks: Vec::new(),
            label: "results/cpu".into(),
            metas,
            rows: Vec::new(),
            reference: Vec::new(),
        };
        let one = [set(vec![
            meta("a", "c1", "workloads/default.toml"),
            meta("b", "c1", "workloads/seed-vit.toml"),
        ])];
        assert!(mixed_builds(&one).is_empty());
        let two = [set(vec![
            meta("a", "c1", "workloads/default.toml"),
            meta("b", "c2", "workloads/torch-compare.toml"),
            meta("c", "c1", "workloads/seed-vit.toml"),
        ])];
        let lines = mixed_builds(&two);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].contains("2 builds")
                && lines[0].contains("(c1): default, seed-vit")
                && lines[0].contains("(c2): torch-compare"),
            "{}",
            lines[0]
        );
    }
}
