//! memfit beside PyTorch, per phase: candle's composed ops, memfit's fused kernels, PyTorch
//! eager and PyTorch `scaled_dot_product_attention`, on the same configuration (matched on
//! parameters, batch, sequence and element type), from stored rows and stored reference lines
//! (`store::reference`). Memory is each phase's peak above its start (memfit: the rows of the
//! run stored beside PyTorch's figures when it has the phase, else the median over every
//! matching row: the figures are exact and repeat within a build, not across builds). Time is compared like with like or not
//! at all: memfit's wall seconds only from the run stored beside PyTorch's figures (the
//! torch-compare run: same machine, same build, same session), PyTorch's only when they were
//! timed before any profiled run (`time_method`) on the CPU that run names; otherwise the time
//! columns say "—" and a line says why.
//!
//! Per phase, the share of the gap the fused kernels close is
//! `(composed − fused) / (composed − eager)` (when composed keeps more than eager). For the
//! train step the remaining gap is split into its two measured parts: what the training forward
//! keeps for the backward (its retained bytes) and the backward's peak above that.

use std::collections::BTreeMap;

use super::doc::Block;
use crate::record::{Row, RunMeta};
use crate::store::reference::{ReferenceRow, TIMED_CLEAN};

const MIB: f64 = 1024.0 * 1024.0;
const PHASES: [&str; 6] = [
    "init",
    "forward",
    "backward",
    "optimizer",
    "train-step",
    "inference",
];

/// One side's figures for one phase: peak bytes, retained bytes, seconds (medians).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Fig {
    peak: Option<f64>,
    retained: Option<f64>,
    wall: Option<f64>,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The medians of a side's (peak, retained, wall) samples; `None` when there are none.
fn fig(peaks: impl Iterator<Item = (Option<f64>, Option<f64>, Option<f64>)>) -> Option<Fig> {
    let (mut p, mut r, mut w) = (Vec::new(), Vec::new(), Vec::new());
    let mut any = false;
    for (a, b, c) in peaks {
        any = true;
        p.extend(a);
        r.extend(b);
        w.extend(c);
    }
    any.then(|| Fig {
        peak: median(p),
        retained: median(r),
        wall: median(w),
    })
}

/// One configuration: its label and, per column and phase, the figures.
struct Config {
    label: String,
    cols: BTreeMap<&'static str, BTreeMap<&'static str, Fig>>,
    /// The backward modes (`whole`, `by-block`) of the fused backward rows read.
    backward: std::collections::BTreeSet<String>,
    /// Why the times are not compared (every wall figure is then `None`).
    time_refused: Option<String>,
}

/// Whether the times of `refs` (one configuration's reference lines) may be divided by memfit's
/// rows of the run stored beside them: `Err(reason)` when not.
fn time_comparable<'a>(
    refs: &[&ReferenceRow],
    metas: &'a [RunMeta],
) -> Result<&'a RunMeta, String> {
    let run = refs.first().map_or("", |r| r.run_id.as_str());
    if run.is_empty() || refs.iter().any(|r| r.run_id != run) {
        return Err("PyTorch's figures are not stored beside one memfit run".into());
    }
    let meta = metas
        .iter()
        .find(|m| m.run_id == run)
        .ok_or_else(|| format!("run {run}'s meta.json is missing"))?;
    if refs
        .iter()
        .any(|r| r.time_method.as_deref() != Some(TIMED_CLEAN))
    {
        return Err("PyTorch's times were taken after profiled runs (up to 15× slower: torch_reference.py before it timed first)".into());
    }
    if let Some(r) = refs
        .iter()
        .find(|r| r.cpu_model.as_deref() != Some(meta.cpu_model.as_str()))
    {
        return Err(format!(
            "PyTorch ran on {}, memfit's run {run} on {}",
            r.cpu_model.as_deref().unwrap_or("an unrecorded CPU"),
            meta.cpu_model
        ));
    }
    Ok(meta)
}

/// The configurations PyTorch measured, each with memfit's matching rows (plain training:
/// standard attention, no checkpointing, LoRA or mixed precision, AdamW) by kernels.
fn configs(ok: &[&Row], refs: &[ReferenceRow], metas: &[RunMeta]) -> Vec<Config> {
    let mut keys: Vec<(u64, u64, u64, String, String, String)> = refs
        .iter()
        .map(|r| {
            let (p, b, s) = (r.params, r.batch, r.seq);
            (p, b, s, r.dtype.clone(), r.device.clone(), r.model.clone())
        })
        .collect();
    keys.sort();
    keys.dedup();
    let mut out = Vec::new();
    for (params, batch, seq, dtype, device, model) in keys {
        // The configuration's identity, on either side.
        let same = |p: u64, b: u64, s: u64, d: &str, dev: &str| {
            (p, b, s) == (params, batch, seq) && d == dtype && dev == device
        };
        let mine: Vec<&&Row> = ok
            .iter()
            .filter(|r| {
                same(r.params, r.batch, r.seq, &r.dtype, &r.device)
                    && r.attention == "standard"
                    && r.checkpoint == 0
                    && r.lora_rank == 0
                    && r.precision == "pure"
                    && r.optimizer == "adamw"
            })
            .collect();
        let Some(first) = mine.first() else { continue };
        let these: Vec<&ReferenceRow> = refs
            .iter()
            .filter(|r| same(r.params, r.batch, r.seq, &r.dtype, &r.device) && r.model == model)
            .collect();
        let same_run = time_comparable(&these, metas).map(|m| m.run_id.clone());
        let mut cols: BTreeMap<&'static str, BTreeMap<&'static str, Fig>> = BTreeMap::new();
        let mut backward = std::collections::BTreeSet::new();
        for (col, kernels) in [("composed", "composed"), ("fused", "fused")] {
            for ph in PHASES {
                let of_phase: Vec<&&Row> = mine
                    .iter()
                    .copied()
                    .filter(|r| r.kernels == kernels && r.phase.as_str() == ph)
                    .collect();
                // The run beside PyTorch's figures, when it has the phase, for the memory too:
                // other runs may come from other builds, whose figures differ.
                let beside = |r: &&&Row| same_run.as_deref().is_ok_and(|run| r.run_id == run);
                let pick: Vec<&&Row> = if of_phase.iter().any(beside) {
                    of_phase.into_iter().filter(|r| beside(r)).collect()
                } else {
                    of_phase
                };
                if kernels == "fused" && ph == "backward" {
                    backward.extend(pick.iter().map(|r| r.backward.clone()));
                }
                let rows = pick.into_iter().map(|r| {
                    let timed = same_run.as_deref().is_ok_and(|run| r.run_id == run);
                    (
                        r.peak_bytes.map(|v| v as f64),
                        r.retained_bytes.map(|v| v as f64),
                        r.wall_s.filter(|_| timed),
                    )
                });
                if let Some(f) = fig(rows) {
                    cols.entry(col).or_default().insert(ph, f);
                }
            }
        }
        for (col, att) in [("eager", "eager"), ("sdpa", "sdpa")] {
            for ph in PHASES {
                let rows = these
                    .iter()
                    .filter(|r| r.attention == att && r.phase == ph)
                    .map(|r| {
                        (
                            r.peak_bytes.map(|v| v as f64),
                            r.retained_bytes.map(|v| v as f64),
                            Some(r.wall_s).filter(|_| same_run.is_ok()),
                        )
                    });
                if let Some(f) = fig(rows) {
                    cols.entry(col).or_default().insert(ph, f);
                }
            }
        }
        let layers = if first.preset.starts_with("vit") {
            format!("{} B{}", first.preset, batch)
        } else {
            format!("{} B{} S{}", first.preset, batch, seq)
        };
        out.push(Config {
            label: format!("{layers} L{} {dtype} {device}", first.layers),
            cols,
            backward,
            time_refused: same_run.err(),
        });
    }
    out
}

fn mib(v: Option<f64>) -> String {
    v.map_or("—".into(), |v| format!("{:.2}", v / MIB))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

fn times(v: Option<f64>) -> String {
    v.map_or("—".into(), |v| format!("{v:.2}×"))
}

/// The share of the composed–eager gap the fused kernels close, in percent (composed above
/// eager only).
fn closed(composed: Option<f64>, fused: Option<f64>, eager: Option<f64>) -> Option<f64> {
    match (composed, fused, eager) {
        (Some(c), Some(f), Some(e)) if c > e => Some((c - f) / (c - e) * 100.0),
        _ => None,
    }
}

/// The report's section, when reference lines exist.
pub fn section(b: &mut Vec<Block>, ok: &[&Row], refs: &[ReferenceRow], metas: &[RunMeta]) {
    let cfgs = configs(ok, refs, metas);
    if cfgs.is_empty() {
        return;
    }
    let version = refs.first().map_or("?", |r| r.torch.as_str());
    b.push(Block::Heading(3, "memfit beside PyTorch, per phase".into()));
    b.push(Block::Para(format!(
        "The same configurations (equal parameter counts) in candle's composed ops, memfit's fused kernels (`--kernels fused`), PyTorch {version} eager and PyTorch with `scaled_dot_product_attention` (sdpa), on this CPU (`scripts/torch-compare.sh`). Memory: MiB above the phase's start at its peak (memfit: the counting allocator; PyTorch: its profiler's memory events). \"Closed\": the share of the composed–eager gap the fused kernels close, (composed − fused)/(composed − eager). Time: memfit's window (one process per row) from the run stored beside PyTorch's figures only (never pooled across runs), PyTorch's median step timed before any profiled run, on the same CPU; where that does not hold the time columns say \"—\" and the reason is listed below. Read the memory columns as exact, the time columns as one session's figures; BENCHMARKS.md § 4 has repeated timings on a quiet machine."
    )));
    let get = |c: &Config, col: &str, ph: &str| c.cols.get(col).and_then(|m| m.get(ph)).copied();
    let mut rows = Vec::new();
    for c in &cfgs {
        for ph in PHASES {
            let [co, fu, ea, sd] = ["composed", "fused", "eager", "sdpa"].map(|k| get(c, k, ph));
            if [co, fu, ea, sd].iter().all(Option::is_none) {
                continue;
            }
            let p = |f: Option<Fig>| f.and_then(|f| f.peak);
            let w = |f: Option<Fig>| f.and_then(|f| f.wall);
            rows.push(vec![
                c.label.clone(),
                ph.to_string(),
                mib(p(co)),
                mib(p(fu)),
                mib(p(ea)),
                mib(p(sd)),
                times(ratio(p(fu), p(ea))),
                closed(p(co), p(fu), p(ea)).map_or("—".into(), |v| format!("{v:.0} %")),
                times(ratio(w(co), w(ea))),
                times(ratio(w(fu), w(ea))),
            ]);
        }
    }
    b.push(Block::Table(
        [
            "config",
            "phase",
            "composed MiB",
            "fused MiB",
            "eager MiB",
            "sdpa MiB",
            "fused / eager",
            "closed",
            "time composed / eager",
            "time fused / eager",
        ]
        .map(String::from)
        .to_vec(),
        rows,
    ));
    let refused: Vec<String> = cfgs
        .iter()
        .filter_map(|c| Some(format!("{}: {}", c.label, c.time_refused.as_ref()?)))
        .collect();
    if !refused.is_empty() {
        b.push(Block::Para(format!(
            "Times not compared (\"—\"): {}.",
            refused.join("; ")
        )));
    }
    // The train step's remaining gap, in its two measured parts.
    let mut lines = Vec::new();
    for c in &cfgs {
        let part = |col: &str| {
            let f = get(c, col, "forward")?;
            let bw = get(c, col, "backward")?;
            let t = get(c, col, "train-step")?;
            Some((f.retained?, bw.peak?, t.peak?))
        };
        let (Some((rf, bf, tf)), Some((re, be, te))) = (part("fused"), part("eager")) else {
            continue;
        };
        lines.push(vec![
            c.label.clone(),
            mib(Some(tf)),
            mib(Some(te)),
            format!("{:+.2}", (tf - te) / MIB),
            format!("{:.2} / {:.2}", rf / MIB, re / MIB),
            format!("{:+.2}", (rf - re) / MIB),
            format!("{:.2} / {:.2}", bf / MIB, be / MIB),
            format!("{:+.2}", (bf - be) / MIB),
        ]);
    }
    if !lines.is_empty() {
        // How memfit's backward ran, read from the rows.
        let modes: std::collections::BTreeSet<&str> = cfgs
            .iter()
            .flat_map(|c| c.backward.iter().map(String::as_str))
            .collect();
        let how = match modes.iter().copied().collect::<Vec<_>>()[..] {
            ["by-block"] => {
                "memfit's rows ran the backward block by block (`--backward by-block`): each block's graph is dropped once its gradients are taken, as PyTorch frees each node's saved tensors as its backward passes it — so both backward peaks sit on a graph that shrinks as it goes, memfit's by whole blocks."
            }
            ["whole"] => {
                "memfit's rows ran candle's whole backward (`--backward whole`), which borrows the loss, whose graph holds every saved tensor until the backward ends; PyTorch frees each node's saved tensors as its backward passes it — so memfit's backward peak sits on the whole kept graph, PyTorch's on a graph that shrinks as it goes."
            }
            _ => {
                "memfit's rows mix the whole backward (the graph kept until it ends) and the backward by block (each block's graph dropped once its gradients are taken): compare them per row's run."
            }
        };
        b.push(Block::Para(format!(
            "What remains of the train step's gap (fused against eager), in its two measured parts: what the training forward keeps for the backward (its retained bytes: the graph's saved tensors), and the backward's peak above its start. {how}"
        )));
        b.push(Block::Table(
            [
                "config",
                "train step fused MiB",
                "eager MiB",
                "gap MiB",
                "forward keeps fused / eager",
                "Δ",
                "backward peak fused / eager",
                "Δ",
            ]
            .map(String::from)
            .to_vec(),
            lines,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mine(phase: &str, kernels: &str, peak: u64, retained: i64) -> Row {
        let mut r = Row::example();
        r.phase = crate::step::Phase::parse(phase).expect("a phase");
        r.kernels = kernels.into();
        r.peak_bytes = Some(peak);
        r.retained_bytes = Some(retained);
        r.wall_s = Some(1.0);
        r.attention = "standard".into();
        r.precision = "pure".into();
        r.optimizer = "adamw".into();
        r.device = "cpu".into();
        r
    }

    fn theirs(r: &Row, phase: &str, attention: &str, peak: u64, retained: u64) -> ReferenceRow {
        ReferenceRow {
            phase: phase.into(),
            wall_s: 0.5,
            peak_bytes: Some(peak),
            retained_bytes: Some(retained as i64),
            torch: "2.9.1".into(),
            attention: attention.into(),
            device: "cpu".into(),
            dtype: r.dtype.clone(),
            threads: 2,
            params: r.params,
            batch: r.batch,
            seq: r.seq,
            model: "small".into(),
            time_method: Some(TIMED_CLEAN.into()),
            cpu_model: Some("CPU A".into()),
            run_id: "B".into(),
        }
    }

    fn text(blocks: &[Block]) -> String {
        super::super::doc::markdown(blocks)
    }

    /// The section's figures come from the rows: the closed share, the ratios and the two parts
    /// of the train step's gap move with them; without reference lines there is no section.
    #[test]
    fn section_reads_its_figures_from_the_rows() {
        const M: u64 = 1 << 20;
        let rows = vec![
            mine("forward", "composed", 100 * M, 90 * M as i64),
            mine("forward", "fused", 60 * M, 50 * M as i64),
            mine("backward", "fused", 30 * M, 0),
            mine("train-step", "fused", 80 * M, 0),
        ];
        let refs = vec![
            theirs(&rows[0], "forward", "eager", 50 * M, 40 * M),
            theirs(&rows[0], "backward", "eager", 10 * M, 0),
            theirs(&rows[0], "train-step", "eager", 50 * M, 0),
        ];
        let ok: Vec<&Row> = rows.iter().collect();
        let mut b = Vec::new();
        section(&mut b, &ok, &refs, &[]);
        let t = text(&b);
        // forward: (100 − 60)/(100 − 50) = 80 % closed; fused / eager 1.20×.
        assert!(t.contains("| 80 % |") && t.contains("1.20×"), "{t}");
        // train step: gap +30 MiB = forward keeps +10 (50 vs 40) and backward +20 (30 vs 10).
        assert!(
            t.contains("+30.00") && t.contains("+10.00") && t.contains("+20.00"),
            "{t}"
        );
        let mut rows2 = rows.clone();
        rows2[1].peak_bytes = Some(75 * M);
        let ok2: Vec<&Row> = rows2.iter().collect();
        let mut b2 = Vec::new();
        section(&mut b2, &ok2, &refs, &[]);
        assert!(text(&b2).contains("| 50 % |"), "{}", text(&b2));
        // How the backward ran is read from the rows.
        assert!(t.contains("`--backward whole`") && !t.contains("`--backward by-block`"));
        for r in rows2.iter_mut() {
            r.backward = "by-block".into();
        }
        let ok2: Vec<&Row> = rows2.iter().collect();
        let mut b3 = Vec::new();
        section(&mut b3, &ok2, &refs, &[]);
        let t3 = text(&b3);
        assert!(t3.contains("`--backward by-block`") && !t3.contains("`--backward whole`"));
        let mut none = Vec::new();
        section(&mut none, &ok, &[], &[]);
        assert!(none.is_empty());
    }

    fn meta(run_id: &str, cpu: &str) -> RunMeta {
        let mut m = crate::machine::base_meta(run_id.into(), 2, "test");
        m.cpu_model = cpu.into();
        m
    }

    /// Times (and memory, when that run has the phase) are divided like with like: memfit's
    /// rows of the run stored beside PyTorch's figures only (run A's 0.8 s rows do not pull run B's 0.2 s toward them), and nothing when
    /// PyTorch timed after profiled runs, on another CPU, or with no run beside it. The stored
    /// figures: fused 0.2 s (run B) / eager 0.5 s = 0.40×.
    #[test]
    fn time_ratios_come_from_the_reference_run_only() {
        const M: u64 = 1 << 20;
        let mut rows = Vec::new();
        // Run A (another build) kept 90 MiB, run B, beside PyTorch, 80 MiB.
        for (run, wall, peak) in [("A", 0.8, 90), ("A", 0.8, 90), ("B", 0.2, 80)] {
            let mut r = mine("train-step", "fused", peak * M, 0);
            r.run_id = run.into();
            r.wall_s = Some(wall);
            rows.push(r);
        }
        let refs = vec![theirs(&rows[0], "train-step", "eager", 50 * M, 0)];
        let ok: Vec<&Row> = rows.iter().collect();
        let metas = [meta("A", "CPU A"), meta("B", "CPU A")];
        let row_of = |t: &str| {
            t.lines()
                .find(|l| l.contains("| train-step |"))
                .unwrap_or_else(|| panic!("{t}"))
                .to_string()
        };
        let mut b = Vec::new();
        section(&mut b, &ok, &refs, &metas);
        let t = text(&b);
        assert!(row_of(&t).ends_with("| — | 0.40× |"), "{}", row_of(&t));
        // The memory too is run B's (not the median 90 MiB of all three rows): 80 / 50.
        assert!(
            row_of(&t).contains("| 80.00 |") && row_of(&t).contains("| 1.60× |"),
            "{}",
            row_of(&t)
        );
        assert!(!t.contains("Times not compared"), "{t}");

        type Change = Box<dyn Fn(&mut ReferenceRow)>;
        let cases: [(&str, Change, &str); 3] = [
            (
                "profiled",
                Box::new(|r| r.time_method = None),
                "after profiled runs",
            ),
            (
                "other CPU",
                Box::new(|r| r.cpu_model = Some("CPU B".into())),
                "PyTorch ran on CPU B",
            ),
            (
                "no run",
                Box::new(|r| r.run_id.clear()),
                "not stored beside one memfit run",
            ),
        ];
        for (what, change, reason) in cases {
            let mut refs2 = refs.clone();
            change(&mut refs2[0]);
            let mut b = Vec::new();
            section(&mut b, &ok, &refs2, &metas);
            let t = text(&b);
            assert!(row_of(&t).ends_with("| — | — |"), "{what}: {}", row_of(&t));
            assert!(t.contains(reason), "{what}: {t}");
            // The memory columns stay: with no run beside PyTorch's figures, the median of
            // every run's rows (90, 90, 80).
            assert!(row_of(&t).contains("90.00"), "{what}");
        }
    }

    #[test]
    fn closed_share_and_median() {
        assert_eq!(closed(Some(100.0), Some(60.0), Some(50.0)), Some(80.0));
        assert_eq!(closed(Some(40.0), Some(30.0), Some(50.0)), None);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
    }
}
