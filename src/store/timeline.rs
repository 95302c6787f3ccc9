//! A memory timeline's two pictures: Chrome/Perfetto trace events (`.json`; opens in
//! <https://ui.perfetto.dev> and `chrome://tracing`) and a stacked-area SVG. The timeline
//! itself — the live bytes of a window, event by event, split by what they are, classified the
//! same way whether the events come from the replay (`formula::timeline`, predicted) or from the
//! counting allocator (`memfit run --timeline`, measured) — is [`crate::timeline`]'s.
//!
//! The bytes above the window's start are split by each allocation's stage and lifetime:
//! - **activations**: made in the forward and still alive when the backward begins (saved for
//!   it, and the block boundaries the backward by block starts from);
//! - **temporaries**: made in a stage and freed before it ends (the optimizer step's update
//!   temporaries too, from its closed form, in a prediction);
//! - **gradients**: made in the backward and alive when it ends;
//! - **workspace**: gemm's packing buffers (the replay's CPU model);
//! - **bookkeeping**: candle's per-tensor metadata (the replay's; the allocator sees it inside
//!   the others).
//!
//! What exists before the window is the `baseline` track, outside the sum. Time is the event's
//! index (one microsecond each in the trace).

use std::io::Write;

use serde_json::{Value, json};

use super::picture::{Anchor, Mark, Picture, Text};
use crate::timeline::*;

/// [`write_trace`] to the file `path` (created or truncated).
pub fn write_trace_file(
    path: &std::path::Path,
    timelines: &[(String, Timeline)],
) -> std::io::Result<()> {
    to_file(path, |out| write_trace(out, timelines))
}

/// [`write_sampled_trace`] into the file `path`.
pub fn write_sampled_trace_file(
    path: &std::path::Path,
    name: &str,
    baseline: u64,
    samples: &[(u64, u64)],
    peak: Option<u64>,
) -> std::io::Result<()> {
    to_file(path, |out| {
        write_sampled_trace(out, name, baseline, samples, peak)
    })
}

/// Creates `path` and writes it through a buffer with `write`.
fn to_file(
    path: &std::path::Path,
    write: impl FnOnce(&mut std::io::BufWriter<std::fs::File>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    write(&mut out)?;
    out.flush()
}

/// Chrome/Perfetto trace events of the timelines `(name, timeline)`, one process each: a
/// stacked counter track `bytes` (the categories), a `baseline` counter, and instant events at
/// each stage's start and at the peak (naming its op, layer and the categories there). Written
/// event by event (a full-size model has tens of thousands).
pub fn write_trace(out: &mut impl Write, timelines: &[(String, Timeline)]) -> std::io::Result<()> {
    out.write_all(b"{\"traceEvents\":[\n")?;
    let mut first = true;
    let mut emit = |out: &mut dyn Write, e: Value| -> std::io::Result<()> {
        if !first {
            out.write_all(b",\n")?;
        }
        first = false;
        serde_json::to_writer(&mut *out, &e)?;
        Ok(())
    };
    let categories = |bytes: &[u64; 6]| -> serde_json::Map<String, Value> {
        CATEGORIES
            .iter()
            .zip(bytes)
            .map(|(c, b)| (c.to_string(), json!(b)))
            .collect()
    };
    for (pid, (name, t)) in timelines.iter().enumerate() {
        let pid = pid + 1;
        emit(
            out,
            json!({"name": "process_name", "ph": "M", "pid": pid, "tid": 0,
            "args": {"name": name}}),
        )?;
        emit(
            out,
            json!({"name": "baseline (weights, batch, optimizer state)", "ph": "C",
            "ts": 0, "pid": pid, "tid": 0, "args": {"bytes": t.baseline_bytes}}),
        )?;
        let mut stage = "";
        let mut released = 0;
        for (i, s) in t.samples.iter().enumerate() {
            if s.stage != stage {
                stage = s.stage;
                emit(
                    out,
                    json!({"name": stage, "ph": "i", "s": "p", "ts": i, "pid": pid,
                    "tid": 0}),
                )?;
            }
            emit(
                out,
                json!({"name": "bytes", "ph": "C", "ts": i, "pid": pid, "tid": 0,
                "args": categories(&s.shown())}),
            )?;
            if s.released != released {
                released = s.released;
                emit(
                    out,
                    json!({"name": "freed from before the window", "ph": "C", "ts": i,
                    "pid": pid, "tid": 0, "args": {"bytes": released}}),
                )?;
            }
        }
        let (peak, at) = t.peak();
        if let Some(s) = t.samples.get(at) {
            let (op, layer) = t.peak_op();
            emit(
                out,
                json!({"name": format!("peak: {peak} B ({op}, {layer}, {})", s.stage),
                "ph": "i", "s": "p", "ts": at, "pid": pid, "tid": 0,
                "args": {"bytes": peak, "op": op, "layer": layer, "stage": s.stage,
                    "categories": categories(&s.shown())}}),
            )?;
        }
    }
    out.write_all(
        format!(
            "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{{\"producer\":\"memfit --timeline\",\"build\":\"{}\",\"time\":\"event index\"}}}}\n",
            env!("MEMFIT_GIT_COMMIT")
        )
        .as_bytes(),
    )
}

/// A sampled timeline's trace (CUDA's pool, `meter::pool_timeline`): one process `name`, the
/// baseline, one counter `bytes` with the single category `pool (sampled)` at each sample's
/// time (µs since the window opened), and instant events at the sampled maximum and, when
/// known, at the pool's exact high-water mark (`peak_bytes`, which a spike shorter than the
/// sampling period can exceed the samples by).
pub fn write_sampled_trace(
    out: &mut impl Write,
    name: &str,
    baseline: u64,
    samples: &[(u64, u64)],
    peak: Option<u64>,
) -> std::io::Result<()> {
    let mut events = vec![
        json!({"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": name}}),
        json!({"name": "baseline (weights, batch, optimizer state)", "ph": "C", "ts": 0,
            "pid": 1, "tid": 0, "args": {"bytes": baseline}}),
    ];
    for (t, b) in samples {
        events.push(
            json!({"name": "bytes", "ph": "C", "ts": t, "pid": 1, "tid": 0,
            "args": {"pool (sampled)": b}}),
        );
    }
    if let Some((t, b)) = samples.iter().max_by_key(|s| s.1) {
        events.push(
            json!({"name": format!("sampled maximum: {b} B"), "ph": "i", "s": "p",
            "ts": t, "pid": 1, "tid": 0, "args": {"bytes": b}}),
        );
        if let Some(p) = peak {
            events.push(
                json!({"name": format!("peak: {p} B (the pool's high-water mark)"),
                "ph": "i", "s": "p", "ts": t, "pid": 1, "tid": 0,
                "args": {"bytes": p, "stage": "window", "op": "cuda-pool", "layer": "—"}}),
            );
        }
    }
    serde_json::to_writer(
        &mut *out,
        &json!({"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": "memfit run --timeline (CUDA pool, sampled)",
                "build": env!("MEMFIT_GIT_COMMIT"), "time": "µs since the window opened"}}),
    )?;
    out.write_all(b"\n")
}

/// The trace files `memfit run --timeline` and `predict --timeline` write under `dir`: every
/// `.json` in a folder named `timeline` (the workload key's default name) or inside `dir` when
/// it is one, in path order.
pub fn trace_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    super::files_under(dir, |p| {
        p.extension().is_some_and(|x| x == "json")
            && p.parent()
                .and_then(|d| d.file_name())
                .is_some_and(|n| n == "timeline")
    })
}

/// `bytes` in the unit that keeps it readable (B, KiB, MiB, GiB).
pub(crate) fn human(bytes: u64) -> String {
    let b = bytes as f64;
    let k = 1024.0;
    if b >= k * k * k {
        format!("{:.2} GiB", b / (k * k * k))
    } else if b >= k * k {
        format!("{:.2} MiB", b / (k * k))
    } else if b >= k {
        format!("{:.2} KiB", b / k)
    } else {
        format!("{bytes} B")
    }
}

/// Colours of [`CATEGORIES`] in the picture.
const COLOURS: [&str; 6] = [
    "#76b7b2", "#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#bab0ac",
];

/// A stacked-area picture of one timeline: the categories over the events (at most 1200
/// columns, each the event of its span with the largest total, so the peak is drawn), the
/// stages' starts, the peak marked with its op and layer, a legend.
pub fn picture(title: &str, t: &Timeline) -> Picture {
    let (w, h, left, top, bottom) = (960.0, 400.0, 90.0, 40.0, 70.0);
    let (pw, ph) = (w - left - 20.0, h - top - bottom);
    let n = t.samples.len().max(1);
    let cols = n.min(1200);
    let picked: Vec<(usize, &Sample)> = (0..cols)
        .filter_map(|c| {
            let (a, b) = (c * n / cols, ((c + 1) * n / cols).max(c * n / cols + 1));
            t.samples[a..b.min(t.samples.len())]
                .iter()
                .enumerate()
                .max_by_key(|(_, s)| s.total())
                .map(|(i, s)| (a + i, s))
        })
        .collect();
    let (peak, at) = t.peak();
    let ymax = (peak.max(1)) as f64 * 1.1;
    let x = |i: usize| left + pw * i as f64 / n as f64;
    let y = |b: f64| top + ph * (1.0 - b / ymax);
    let mut p = head((w, h), left, 22.0, title);
    // The grid under the areas.
    y_ticks(&mut p, ymax, left, left + pw, &y);
    // Areas, bottom category first: each polygon between the running sums.
    let mut below = vec![0u64; picked.len()];
    let shown: Vec<[u64; 6]> = picked.iter().map(|(_, s)| s.shown()).collect();
    for (c, &colour) in COLOURS.iter().enumerate() {
        if shown.iter().all(|s| s[c] == 0) {
            continue;
        }
        let above: Vec<u64> = shown.iter().zip(&below).map(|(s, b)| b + s[c]).collect();
        // Steps: column `c` spans `cx(c)..cx(c + 1)` at its sample's level, so a one-event
        // spike (the peak) is a column wide.
        let cx = |c: usize| left + pw * c as f64 / picked.len() as f64;
        let mut points: Vec<(f64, f64)> = above
            .iter()
            .enumerate()
            .flat_map(|(c, a)| {
                let ya = y(*a as f64);
                [(cx(c), ya), (cx(c + 1), ya)]
            })
            .collect();
        points.extend(below.iter().enumerate().rev().flat_map(|(c, b)| {
            let yb = y(*b as f64);
            [(cx(c + 1), yb), (cx(c), yb)]
        }));
        p.push(Mark::Polygon {
            points,
            fill: colour,
        });
        below = above;
    }
    // Axes and ticks.
    p.push(Mark::line((left, top + ph), (left + pw, top + ph), "black"));
    p.push(Mark::line((left, top), (left, top + ph), "black"));
    p.push(
        Text::new(
            (20.0, top + ph / 2.0),
            "memory held above the window's start",
        )
        .anchor(Anchor::Middle)
        .fill("#555555")
        .upwards()
        .into(),
    );
    // Stage starts.
    let mut stage = "";
    for (i, s) in t.samples.iter().enumerate() {
        if s.stage != stage {
            stage = s.stage;
            p.push(Mark::Line {
                from: (x(i), top),
                to: (x(i), top + ph),
                stroke: "#555555",
                width: 1.0,
                dash: Some((4.0, 3.0)),
            });
            p.push(
                Text::new((x(i) + 3.0, top + 12.0), stage)
                    .fill("#555555")
                    .into(),
            );
        }
    }
    // The peak.
    let (op, layer) = t.peak_op();
    let (px, py) = (x(at), y(peak as f64));
    let end = px > left + pw * 0.4;
    p.push(Mark::Circle {
        at: (px, py),
        r: 4.0,
        fill: "red",
    });
    p.push(
        Text::new(
            (if end { px - 8.0 } else { px + 8.0 }, py - 6.0),
            format!(
                "peak {}: {op} ({layer}, {})",
                human(peak),
                t.samples.get(at).map_or("", |s| s.stage)
            ),
        )
        .anchor(if end { Anchor::End } else { Anchor::Start })
        .fill("red")
        .into(),
    );
    // Legend and the axis name.
    for (c, (name, colour)) in CATEGORIES.iter().zip(COLOURS).enumerate() {
        let lx = left + c as f64 * 130.0;
        legend(&mut p, (lx, h - 28.0), colour, name);
    }
    let released = t.samples.iter().map(|s| s.released).max().unwrap_or(0);
    p.push(Text::new(
            (left + pw, top + ph + 18.0),
            if released > 0 {
                format!(
                    "events →  (above the window's start; before it: {}, of which freed in it up to {})",
                    human(t.baseline_bytes),
                    human(released)
                )
            } else {
                format!(
                    "events →  (above the window's start; before it: {})",
                    human(t.baseline_bytes)
                )
            },
        ).anchor(Anchor::End).fill("#555555").into());
    p
}

/// Writes [`picture`] as an SVG.
pub fn write_svg(out: &mut impl Write, title: &str, t: &Timeline) -> std::io::Result<()> {
    picture(title, t).svg(out)
}

/// A picture `size` wide and high with the bold `title` at `(left, title_y)`.
pub(crate) fn head((w, h): (f64, f64), left: f64, title_y: f64, title: &str) -> Picture {
    let mut p = Picture::new((w, h));
    p.push(Text::new((left, title_y), title).size(14.0).bold().into());
    p
}

/// A legend entry: a 12-pixel swatch of `colour` at `at` and its `name`.
pub(crate) fn legend(p: &mut Picture, at: (f64, f64), colour: &'static str, name: &str) {
    p.push(Mark::Rect {
        x: at.0,
        y: at.1,
        w: 12.0,
        h: 12.0,
        fill: colour,
        title: None,
    });
    p.push(Mark::text((at.0 + 16.0, at.1 + 10.0), name));
}

/// Five byte ticks from 0 to `ymax` with grid lines from `left` to `right`; `y` maps bytes to
/// the picture's ordinate.
pub(crate) fn y_ticks(p: &mut Picture, ymax: f64, left: f64, right: f64, y: &dyn Fn(f64) -> f64) {
    for k in 0..=4 {
        let b = ymax * k as f64 / 4.0;
        p.push(
            Text::new((left - 6.0, y(b) + 4.0), human(b as u64))
                .anchor(Anchor::End)
                .into(),
        );
        p.push(Mark::line((left, y(b)), (right, y(b)), "#dddddd"));
    }
}
