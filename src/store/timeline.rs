//! A memory timeline: the live bytes of a window, event by event, split by what they are, and
//! its two pictures — Chrome/Perfetto trace events (`.json`; opens in <https://ui.perfetto.dev>
//! and `chrome://tracing`) and a stacked-area SVG. The events come from the replay
//! (`formula::timeline`, predicted) or from the counting allocator (`memfit run --timeline`,
//! measured); both are classified here the same way.
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

use std::collections::HashMap;
use std::io::Write;

use serde_json::{Value, json};

/// One change of the live bytes (a timeline's event: the replay's `Ledger::start_trace`, or the
/// counting allocator's `meter::cpu_alloc::start_events`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The allocation it belongs to: a storage, a host buffer, or one of the pooled kinds
    /// [`BOOKKEEPING`] (candle's per-tensor metadata) and [`WORKSPACE`] (gemm's packing).
    pub id: u64,
    pub delta: i64,
    /// What allocated it: the op that made the tensor (`matmul`, `kernel`, `cat`, …), `tensor`
    /// for one made without an op, `cut` for a block boundary's moved storage, `host`,
    /// `bookkeeping` or `gemm`.
    pub label: &'static str,
    /// The part of the model (the replay's `Ledger::set_tag`: 0 outside a block, else its
    /// layer + 1).
    pub tag: u32,
    /// The driver's stage (`forward`, `backward`, `optimizer`; `setup` before the window).
    pub stage: &'static str,
}

/// [`Event::id`] of candle's per-tensor bookkeeping bytes (all tensors pooled).
pub const BOOKKEEPING: u64 = u64::MAX;
/// [`Event::id`] of gemm's transient packing buffers.
pub const WORKSPACE: u64 = u64::MAX - 1;

/// The categories of the bytes above the window's start, in the trace's stacking order.
pub const CATEGORIES: [&str; 5] = [
    "activations",
    "temporaries",
    "gradients",
    "workspace",
    "bookkeeping",
];

/// One step of the timeline: the live bytes per category after an event, and what made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Bytes per [`CATEGORIES`] entry, above the window's start.
    pub bytes: [u64; 5],
    /// The op (or `bookkeeping`, `gemm`, `optimizer-step`) of the event.
    pub label: &'static str,
    /// The layer (0: outside the blocks; else the block's index + 1).
    pub tag: u32,
    pub stage: &'static str,
}

impl Sample {
    pub fn total(&self) -> u64 {
        self.bytes.iter().sum()
    }
}

/// A training step's predicted timeline.
#[derive(Debug, Clone)]
pub struct Timeline {
    /// Bytes alive before the window (weights, the batch; the optimizer state is added from
    /// its closed form: the replay does not build it).
    pub baseline_bytes: u64,
    pub samples: Vec<Sample>,
}

impl Timeline {
    /// The largest total and the first sample that reaches it.
    pub fn peak(&self) -> (u64, usize) {
        self.samples
            .iter()
            .enumerate()
            .fold((0, 0), |(m, at), (i, s)| {
                if s.total() > m {
                    (s.total(), i)
                } else {
                    (m, at)
                }
            })
    }

    /// The op that allocated last when the peak was reached (the peak's own event may be a
    /// tensor's bookkeeping or a gemm buffer beside it) and its layer.
    pub fn peak_op(&self) -> (&'static str, String) {
        let (_, at) = self.peak();
        let s = self
            .samples
            .get(..=at)
            .unwrap_or_default()
            .iter()
            .rev()
            .find(|s| !matches!(s.label, "bookkeeping" | "free" | "gemm"))
            .or(self.samples.get(at));
        match s {
            None => ("none", String::new()),
            Some(s) => (
                s.label,
                if s.tag == 0 {
                    "outside the blocks".to_string()
                } else {
                    format!("layer {}", s.tag - 1)
                },
            ),
        }
    }

    /// The index of the first sample of `stage`.
    pub fn stage_start(&self, stage: &str) -> Option<usize> {
        self.samples.iter().position(|s| s.stage == stage)
    }
}

/// The samples of `events`: the `setup` stage is the baseline; every later allocation is
/// categorised by the stage that made it and whether it is still alive when that stage ends.
pub fn classify(events: &[Event]) -> Timeline {
    // `done` is the gradients' release after the step, in the gradient store's hash order:
    // not part of the step, and not the same order from run to run.
    let in_window = |e: &&Event| !matches!(e.stage, "setup" | "" | "done");
    let baseline: i64 = events
        .iter()
        .filter(|e| matches!(e.stage, "setup" | ""))
        .map(|e| e.delta)
        .sum();
    // The stage each allocation was made in, and whether it outlived that stage.
    let mut made: HashMap<u64, &'static str> = HashMap::new();
    let mut alive: HashMap<u64, i64> = HashMap::new();
    let mut kept: HashMap<u64, bool> = HashMap::new();
    let mut stage = "";
    let close = |stage: &str,
                 made: &HashMap<u64, &str>,
                 alive: &HashMap<u64, i64>,
                 kept: &mut HashMap<u64, bool>| {
        for (id, b) in alive {
            if made.get(id).is_some_and(|m| *m == stage) {
                kept.entry(*id).or_insert(*b > 0);
            }
        }
    };
    for e in events.iter().filter(in_window) {
        if e.stage != stage {
            close(stage, &made, &alive, &mut kept);
            stage = e.stage;
        }
        if e.delta > 0 && !e.label.is_empty() {
            made.entry(e.id).or_insert(e.stage);
        }
        *alive.entry(e.id).or_insert(0) += e.delta;
    }
    close(stage, &made, &alive, &mut kept);
    let category = |e: &Event| -> usize {
        match e.id {
            WORKSPACE => 3,
            BOOKKEEPING => 4,
            id => match (made.get(&id).copied(), kept.get(&id).copied()) {
                (Some("forward"), Some(true)) => 0,
                (Some("backward"), Some(true)) => 2,
                _ => 1,
            },
        }
    };
    let mut bytes = [0i64; 5];
    let mut samples = Vec::new();
    for e in events.iter().filter(in_window) {
        bytes[category(e)] += e.delta;
        samples.push(Sample {
            bytes: bytes.map(|b| b.max(0) as u64),
            label: if e.label.is_empty() { "free" } else { e.label },
            tag: e.tag,
            stage: e.stage,
        });
    }
    Timeline {
        baseline_bytes: baseline.max(0) as u64,
        samples,
    }
}

/// The timeline of allocator events `(address, ±bytes)` whose stages begin at the event
/// indexes `marks` (`(index, stage)`, in order; the events before the first are its stage).
/// Each allocation's lifetime is one id (an address reused after a free is a new allocation);
/// a free of memory allocated before the window belongs to the baseline (`setup`). The
/// allocator sees no op names: every event is `alloc` or `free`.
pub fn of_addresses(events: &[(u64, i64)], marks: &[(usize, &'static str)]) -> Timeline {
    let stage_at = |i: usize| {
        marks
            .iter()
            .rev()
            .find(|(m, _)| i >= *m)
            .or(marks.first())
            .map_or("forward", |(_, s)| *s)
    };
    let mut live: HashMap<u64, (u64, i64)> = HashMap::new();
    let mut next = 0u64;
    let events: Vec<Event> = events
        .iter()
        .enumerate()
        .map(|(i, &(ptr, delta))| {
            let (id, stage) = match live.get_mut(&ptr) {
                Some((id, bytes)) => {
                    *bytes += delta;
                    let id = *id;
                    if *bytes <= 0 {
                        live.remove(&ptr);
                    }
                    (id, stage_at(i))
                }
                None if delta > 0 => {
                    next += 1;
                    live.insert(ptr, (next, delta));
                    (next, stage_at(i))
                }
                None => (0, "setup"),
            };
            Event {
                id,
                delta,
                label: if delta > 0 { "alloc" } else { "" },
                tag: 0,
                stage,
            }
        })
        .collect();
    classify(&events)
}

/// [`write_trace`] to the file `path` (created or truncated).
pub fn write_trace_file(
    path: &std::path::Path,
    timelines: &[(String, Timeline)],
) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    write_trace(&mut out, timelines)?;
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
    let categories = |bytes: &[u64; 5]| -> serde_json::Map<String, Value> {
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
                "args": categories(&s.bytes)}),
            )?;
        }
        let (peak, at) = t.peak();
        if let Some(s) = t.samples.get(at) {
            let (op, layer) = t.peak_op();
            emit(
                out,
                json!({"name": format!("peak: {peak} B ({op}, {layer}, {})", s.stage),
                "ph": "i", "s": "p", "ts": at, "pid": pid, "tid": 0,
                "args": {"bytes": peak, "op": op, "layer": layer, "stage": s.stage,
                    "categories": categories(&s.bytes)}}),
            )?;
        }
    }
    out.write_all(
        b"\n],\"displayTimeUnit\":\"ns\",\"otherData\":{\"producer\":\"memfit predict --timeline\",\"time\":\"event index\"}}\n",
    )
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
const COLOURS: [&str; 5] = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#bab0ac"];

/// A stacked-area picture of one timeline (SVG): the categories over the events (at most 1200
/// columns, each the event of its span with the largest total, so the peak is drawn), the
/// stages' starts, the peak marked with its op and layer, a legend.
pub fn write_svg(out: &mut impl Write, title: &str, t: &Timeline) -> std::io::Result<()> {
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
    svg_head(out, (w, h), left, 22.0, title)?;
    // Areas, bottom category first: each polygon between the running sums.
    let mut below = vec![0u64; picked.len()];
    for (c, colour) in COLOURS.iter().enumerate() {
        let above: Vec<u64> = picked
            .iter()
            .zip(&below)
            .map(|((_, s), b)| b + s.bytes[c])
            .collect();
        // Steps: column `c` spans `cx(c)..cx(c + 1)` at its sample's level, so a one-event
        // spike (the peak) is a column wide.
        let cx = |c: usize| left + pw * c as f64 / picked.len() as f64;
        let mut pts: Vec<String> = above
            .iter()
            .enumerate()
            .flat_map(|(c, a)| {
                let ya = y(*a as f64);
                [
                    format!("{:.1},{ya:.1}", cx(c)),
                    format!("{:.1},{ya:.1}", cx(c + 1)),
                ]
            })
            .collect();
        pts.extend(below.iter().enumerate().rev().flat_map(|(c, b)| {
            let yb = y(*b as f64);
            [
                format!("{:.1},{yb:.1}", cx(c + 1)),
                format!("{:.1},{yb:.1}", cx(c)),
            ]
        }));
        writeln!(
            out,
            r#"<polygon points="{}" fill="{colour}" stroke="none"/>"#,
            pts.join(" ")
        )?;
        below = above;
    }
    // Axes and ticks.
    writeln!(
        out,
        r#"<line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="black"/><line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="black"/>"#,
        top + ph,
        left + pw,
        top + ph,
        top + ph
    )?;
    y_ticks(out, ymax, left, left + pw, &y)?;
    // Stage starts.
    let mut stage = "";
    for (i, s) in t.samples.iter().enumerate() {
        if s.stage != stage {
            stage = s.stage;
            writeln!(
                out,
                r##"<line x1="{0:.1}" y1="{top}" x2="{0:.1}" y2="{1}" stroke="#555" stroke-dasharray="4 3"/><text x="{2:.1}" y="{3}" fill="#555">{4}</text>"##,
                x(i),
                top + ph,
                x(i) + 3.0,
                top + 12.0,
                stage
            )?;
        }
    }
    // The peak.
    let (op, layer) = t.peak_op();
    let (px, py) = (x(at), y(peak as f64));
    let anchor = if px > left + pw * 0.4 { "end" } else { "start" };
    let dx = if anchor == "end" { -8.0 } else { 8.0 };
    writeln!(
        out,
        r#"<circle cx="{px:.1}" cy="{py:.1}" r="4" fill="red"/><text x="{:.1}" y="{:.1}" text-anchor="{anchor}" fill="red">peak {}: {} ({}, {})</text>"#,
        px + dx,
        py - 6.0,
        human(peak),
        escape(op),
        escape(&layer),
        t.samples.get(at).map_or("", |s| s.stage)
    )?;
    // Legend and the axis name.
    for (c, (name, colour)) in CATEGORIES.iter().zip(COLOURS).enumerate() {
        let lx = left + c as f64 * 150.0;
        writeln!(
            out,
            r#"<rect x="{lx}" y="{}" width="12" height="12" fill="{colour}"/><text x="{}" y="{}">{name}</text>"#,
            h - 28.0,
            lx + 16.0,
            h - 18.0
        )?;
    }
    writeln!(
        out,
        r##"<text x="{}" y="{}" text-anchor="end" fill="#555">events →  (above the window's start; before it: {})</text>"##,
        left + pw,
        top + ph + 18.0,
        human(t.baseline_bytes)
    )?;
    writeln!(out, "</svg>")
}

/// An SVG picture's opening: the element `size` wide and high on white, the bold `title` at
/// `(left, title_y)`.
pub(crate) fn svg_head(
    out: &mut impl Write,
    (w, h): (f64, f64),
    left: f64,
    title_y: f64,
    title: &str,
) -> std::io::Result<()> {
    writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    )?;
    writeln!(out, r#"<rect width="{w}" height="{h}" fill="white"/>"#)?;
    writeln!(
        out,
        r#"<text x="{left}" y="{title_y}" font-size="14" font-weight="bold">{}</text>"#,
        escape(title)
    )
}

/// Five byte ticks from 0 to `ymax` with grid lines from `left` to `right`; `y` maps bytes to
/// the picture's ordinate.
pub(crate) fn y_ticks(
    out: &mut impl Write,
    ymax: f64,
    left: f64,
    right: f64,
    y: &dyn Fn(f64) -> f64,
) -> std::io::Result<()> {
    for k in 0..=4 {
        let b = ymax * k as f64 / 4.0;
        writeln!(
            out,
            r##"<text x="{}" y="{:.1}" text-anchor="end">{}</text><line x1="{left}" y1="{:.1}" x2="{right}" y2="{:.1}" stroke="#ddd"/>"##,
            left - 6.0,
            y(b) + 4.0,
            human(b as u64),
            y(b),
            y(b)
        )?;
    }
    Ok(())
}

pub(crate) fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
