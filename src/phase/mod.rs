//! Phases: each runs one piece of a training or serving step inside a metered window.
//!
//! A case runs its phases in the fixed order below, after an unmetered warm-up on a throwaway
//! copy of the same model (a training step when a training phase is asked, else the serving
//! forwards alone: [`runner::warm_up`]), so gemm's per-thread scratch buffers and other
//! first-use allocations are out of the way. Phases that were not asked for but are
//! needed by later ones still run, unmetered. What each window contains:
//!
//! | phase | window | baseline holds |
//! |---|---|---|
//! | `init` | `VarMap` + model construction: weights materialised and initialised | nothing of the case |
//! | `forward` | training forward to the mean cross-entropy loss; the graph is kept | weights, input batch |
//! | `backward` | block by block (the default: [`by_block`], each part's graph dropped once its gradients are taken, so the window ends without the graph) or `loss.backward()` over the whole graph (`--backward whole`: the graph is still alive when the window ends), pruned to the parameters' gradients | weights, graph (activations) |
//! | `optimizer` | creating the optimizer (its state) and its first `step` | weights, gradients |
//! | `train-step` | a steady-state step: forward, backward, drop the graph, `step`, drop the gradients | weights, optimizer state |
//! | `inference` | forward to the logits with the serving weights (no graph) | weights, optimizer state |
//! | `prefill` | the prompt through the model, filling the key/value cache; greedy next token | weights |
//! | `decode` | `decode_tokens` greedy tokens (with the cache, or recomputing the prefix) | weights, the prompt's cache |
//! | `load` | the weights read back from a safetensors file (whole, or memory-mapped) | weights, the file on disk |
//! | `dataload` | epochs of the image pipeline (`crate::data::bench`); no model | nothing of the case |
//!
//! `peak_bytes` is the window's high-water mark above its baseline; `retained_bytes` is what
//! is still allocated when it closes (for `forward` the graph, for `backward` the gradients —
//! minus the graph it used up, by block or checkpointed ([`crate::record::Row::gradient_bytes`]) —
//! for `optimizer` its state, for `inference` the logits, for `prefill` the cache, for `decode`
//! the cache's growth, for `load` the loaded tensors). The default phase list is the first six;
//! `prefill`, `decode` and `load` run when asked for.

pub mod by_block;
pub mod checkpoint;
pub mod denormals;
pub mod runner;

use serde::{Deserialize, Serialize};

/// One metered part of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Init,
    Forward,
    Backward,
    Optimizer,
    TrainStep,
    Inference,
    Prefill,
    Decode,
    Load,
    /// The image data pipeline (`crate::data`); a case with it runs no model phase.
    Dataload,
}

impl Phase {
    /// A training phase: the training forward, backward, optimizer step or whole step.
    pub fn trains(self) -> bool {
        (Phase::Forward..=Phase::TrainStep).contains(&self)
    }

    /// The phases a case runs when it names none: training and one inference forward.
    pub const DEFAULT: [Phase; 6] = [
        Phase::Init,
        Phase::Forward,
        Phase::Backward,
        Phase::Optimizer,
        Phase::TrainStep,
        Phase::Inference,
    ];

    /// Every phase in run order.
    pub const ALL: [Phase; 10] = [
        Phase::Init,
        Phase::Forward,
        Phase::Backward,
        Phase::Optimizer,
        Phase::TrainStep,
        Phase::Inference,
        Phase::Prefill,
        Phase::Decode,
        Phase::Load,
        Phase::Dataload,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Init => "init",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
            Phase::TrainStep => "train-step",
            Phase::Inference => "inference",
            Phase::Prefill => "prefill",
            Phase::Decode => "decode",
            Phase::Load => "load",
            Phase::Dataload => "dataload",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// The names, for error messages.
    pub fn names() -> String {
        Self::ALL.map(Phase::as_str).join(", ")
    }
}

/// Optimizers (see `crate::optim` for their state and step memory).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OptimizerKind {
    /// Plain SGD (candle-nn): no state.
    Sgd,
    /// SGD with momentum 0.9: one velocity per parameter.
    SgdMomentum,
    /// Adam (candle-nn's AdamW without weight decay): first and second moments.
    Adam,
    /// AdamW (candle-nn): first and second moments in the parameters' dtype.
    Adamw,
    /// AdamW with blockwise 8-bit moments (memfit's own).
    Adamw8bit,
}

impl OptimizerKind {
    pub const ALL: [OptimizerKind; 5] = [
        OptimizerKind::Sgd,
        OptimizerKind::SgdMomentum,
        OptimizerKind::Adam,
        OptimizerKind::Adamw,
        OptimizerKind::Adamw8bit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::SgdMomentum => "sgd-momentum",
            OptimizerKind::Adam => "adam",
            OptimizerKind::Adamw => "adamw",
            OptimizerKind::Adamw8bit => "adamw-8bit",
        }
    }

    /// The names, for error messages.
    pub fn names() -> String {
        Self::ALL.map(OptimizerKind::as_str).join(", ")
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }
}
