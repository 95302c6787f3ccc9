//! A memory timeline: the live bytes of a window, event by event, split by what they are
//! ([`Timeline`], [`classify`]). The events come from the replay (`formula::timeline`,
//! predicted) or from the counting allocator (`memfit run --timeline`, measured); both are
//! classified here the same way. `store::timeline` writes them (trace events, pictures).
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
pub const CATEGORIES: [&str; 6] = [
    "kv cache",
    "activations",
    "temporaries",
    "gradients",
    "workspace",
    "bookkeeping",
];
/// Indexes into [`CATEGORIES`].
pub const KV: usize = 0;
pub const ACTIVATIONS: usize = 1;
pub const TEMPORARIES: usize = 2;
pub const GRADIENTS: usize = 3;
const WORKSPACE_BYTES: usize = 4;
const BOOKKEEPING_BYTES: usize = 5;

/// One step of the timeline: the live bytes per category after an event, and what made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Bytes per [`CATEGORIES`] entry made in the window and alive now.
    pub bytes: [u64; 6],
    /// Bytes made before the window and freed in it so far (a decode step's grown cache
    /// replaces the one before): they lower the live bytes above the window's start.
    pub released: u64,
    /// The op (or `bookkeeping`, `gemm`, `optimizer-step`) of the event.
    pub label: &'static str,
    /// The layer (0: outside the blocks; else the block's index + 1).
    pub tag: u32,
    pub stage: &'static str,
}

impl Sample {
    /// The live bytes above the window's start.
    pub fn total(&self) -> u64 {
        self.bytes.iter().sum::<u64>().saturating_sub(self.released)
    }

    /// [`Sample::bytes`] less the released bytes, taken from the bottom category up: what
    /// the pictures stack (summing to [`Sample::total`]).
    pub fn shown(&self) -> [u64; 6] {
        let mut left = self.released;
        self.bytes.map(|b| {
            let take = b.min(left);
            left -= take;
            b - take
        })
    }
}

/// A window's timeline (a train step, or a serving phase).
#[derive(Debug, Clone)]
pub struct Timeline {
    /// Bytes alive before the window (weights, the batch, a cache; a prediction's optimizer
    /// state is added from its closed form: the replay does not build it).
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
/// categorised by the stage that made it and whether it is still alive when that stage ends:
/// kept by the forward, activations (and the inference's output); by the backward, gradients;
/// by prefill or decode, the key/value cache (and the next token); the rest temporaries. Frees
/// of what the window did not make are [`Sample::released`].
pub fn classify(events: &[Event]) -> Timeline {
    // `done` is what follows the window (a train step's gradients released in the gradient
    // store's hash order, not the same from run to run).
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
    // A category, or None: made before the window.
    let category = |e: &Event| -> Option<usize> {
        match e.id {
            WORKSPACE => Some(WORKSPACE_BYTES),
            BOOKKEEPING => Some(BOOKKEEPING_BYTES),
            id => match (made.get(&id).copied(), kept.get(&id).copied()) {
                (None, _) => None,
                (Some("forward" | "inference"), Some(true)) => Some(ACTIVATIONS),
                (Some("backward"), Some(true)) => Some(GRADIENTS),
                (Some("prefill" | "decode"), Some(true)) => Some(KV),
                _ => Some(TEMPORARIES),
            },
        }
    };
    let mut bytes = [0i64; 6];
    let mut before = 0i64;
    let mut samples = Vec::new();
    for e in events.iter().filter(in_window) {
        match category(e) {
            Some(c) => bytes[c] += e.delta,
            None => before -= e.delta,
        }
        // A pooled category below zero (bookkeeping of tensors made before the window, freed
        // in it) is released bytes too.
        let deficit: i64 = bytes.iter().map(|b| (-b).max(0)).sum();
        samples.push(Sample {
            bytes: bytes.map(|b| b.max(0) as u64),
            released: (before + deficit).max(0) as u64,
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
/// a free of memory allocated before the window (id 0, never made in it) is released bytes.
/// The allocator sees no op names: every event is `alloc` or `free`.
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
                None => (0, stage_at(i)),
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
