//! Predicted bytes per phase. Every function here is a formula of the case's shape, derived from
//! what the model and candle 0.11.1's CPU backend allocate; `transformer` holds the derivations.

pub mod breakdown;
pub mod budget;
pub mod cuda_init;
pub mod flops;
pub mod full_size;
pub mod gemm;
pub mod memo;
pub mod parallel;
pub mod replay;
pub mod search;
pub mod serve_parallel;
pub mod shape;
pub mod symbolic;
pub mod timeline;
pub mod transformer;
pub mod zero;

use crate::step::Phase;
use crate::workload::Case;

/// What the formula module predicts for one phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prediction {
    pub peak_bytes: u64,
    pub retained_bytes: i64,
}

/// Prediction for `phase` of `case` on the CPU backend running `threads` threads.
pub fn predict(case: &Case, phase: Phase, threads: usize) -> Prediction {
    transformer::Shape::of(case).predict(phase, case.optimizer, threads)
}

/// [`predict`] with a mixture of experts' routing as measured (tokens per expert per layer;
/// `None`: balanced).
pub fn predict_routed(
    case: &Case,
    phase: Phase,
    threads: usize,
    routing: Option<Vec<Vec<usize>>>,
) -> Prediction {
    let shape = transformer::Shape {
        routing: routing.map(std::sync::Arc::new),
        ..transformer::Shape::of(case)
    };
    shape.predict(phase, case.optimizer, threads)
}
