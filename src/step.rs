//! The vocabulary of one step, below everything that runs, predicts or stores one: the phases
//! ([`Phase`]), the optimizers ([`OptimizerKind`]), the backward's mode ([`Backward`]), the
//! checkpoint segments ([`segments`]) and a phase's outcome ([`PhaseResult`]). The workload,
//! the optimizers, the data pipeline and the formulas name them here; `crate::phase` runs them.

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

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
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

/// `whole` (candle's `loss.backward()`) or `by-block` (`crate::phase::by_block`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Backward {
    Whole,
    #[default]
    ByBlock,
}

impl Backward {
    pub const NAMES: &'static str = "by-block, whole";

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "whole" => Some(Self::Whole),
            "by-block" => Some(Self::ByBlock),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Whole => "whole",
            Self::ByBlock => "by-block",
        }
    }
}

/// Segments of `k` blocks (the last may be shorter) over `layers` blocks.
pub fn segments(layers: usize, k: usize) -> Vec<std::ops::Range<usize>> {
    (0..layers)
        .step_by(k.max(1))
        .map(|s| s..(s + k.max(1)).min(layers))
        .collect()
}

/// The result of one requested phase.
#[derive(Debug)]
pub struct PhaseResult {
    pub phase: Phase,
    pub outcome: anyhow::Result<crate::meter::Reading>,
}
