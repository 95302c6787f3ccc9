//! The predicted memory timelines of a training step and of the serving phases: the replay's own allocations
//! ([`crate::formula::replay::trace_training`]) classified by [`crate::store::timeline`]
//! (`memfit predict --timeline FILE.json|svg`).
//!
//! Every change of the replay's live bytes is one event `(allocation, ±bytes, op, layer,
//! stage)`; op-less tensors made in the backward carry the node being differentiated. The
//! timeline ends with the step: the gradients' release after it is left out (the gradient
//! store's hash order, not the same from run to run). The sum's maximum is the predicted
//! train-step peak exactly (tested): the replay's forward and backward as they run, then — when
//! the optimizer step's closed form ([`Shape::train_step_update_bytes`] beside the gradients)
//! stands higher than the level the backward leaves — that step as one event.

use super::replay::{trace_serving, trace_training};
use super::transformer::Shape;
use crate::step::{OptimizerKind, Phase};
pub use crate::store::timeline::{picture, write_svg, write_trace};
use crate::timeline::Event;
pub use crate::timeline::{CATEGORIES, Sample, TEMPORARIES, Timeline, classify};

/// The train step of `shape` (optimizer `opt`, the CPU on `threads` threads where it matters),
/// event by event.
pub fn train_step(shape: &Shape, opt: OptimizerKind, threads: usize) -> Timeline {
    let (_, events) = trace_training(
        shape,
        shape.meta(super::transformer::META_PER_TENSOR),
        shape.cpu.then_some(threads),
    );
    let mut t = classify(&events);
    t.baseline_bytes += shape.optimizer_state_bytes(opt);
    // The step: the gradients beside the update's temporaries (closed form), after the graph
    // is gone.
    let step = shape.gradient_bytes() + shape.train_step_update_bytes(opt);
    if let Some(last) = t.samples.iter().rposition(|s| s.stage == "backward") {
        let level = t.samples[last].total();
        if step > level {
            let mut s = t.samples[last].clone();
            s.bytes[TEMPORARIES] += step - level;
            (s.label, s.tag, s.stage) = ("optimizer-step", 0, "optimizer");
            let mut after = t.samples[last].clone();
            (after.label, after.tag, after.stage) = ("optimizer-step", 0, "optimizer");
            t.samples.insert(last + 1, s);
            t.samples.insert(last + 2, after);
        }
    }
    t
}

/// The serving phases of `shape` among `phases` (inference; prefill and decode for a decoder),
/// each its own window as the runner meters it: what the replay made before the phase is the
/// baseline, what it does after is left out. Each timeline's maximum is the phase's predicted
/// peak exactly (tested).
pub fn serving(shape: &Shape, phases: &[Phase], threads: usize) -> Vec<(Phase, Timeline)> {
    let (_, events) = trace_serving(
        shape,
        shape.meta(super::transformer::META_PER_TENSOR),
        shape.cpu.then_some(threads),
    );
    let order = ["setup", "inference", "between", "prefill", "decode", "done"];
    let rank = |stage: &str| order.iter().position(|s| *s == stage).unwrap_or(0);
    [
        (Phase::Inference, "inference"),
        (Phase::Prefill, "prefill"),
        (Phase::Decode, "decode"),
    ]
    .into_iter()
    .filter(|(p, _)| phases.contains(p) && (shape.vision.is_none() || *p == Phase::Inference))
    .map(|(p, stage)| {
        let at = rank(stage);
        let window: Vec<Event> = events
            .iter()
            .map(|e| {
                let r = rank(e.stage);
                Event {
                    stage: match r.cmp(&at) {
                        std::cmp::Ordering::Less => "setup",
                        std::cmp::Ordering::Equal => stage,
                        std::cmp::Ordering::Greater => "done",
                    },
                    ..e.clone()
                }
            })
            .collect();
        (p, classify(&window))
    })
    .collect()
}
