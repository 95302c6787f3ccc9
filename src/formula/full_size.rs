//! Full-size figures the claims quote beside their measured slices: the formulas (which each
//! claim checks on its rows first) evaluated on the shipped presets at the sizes the seed's
//! claims name — Llama-2-7B in f16, B 4 × S 4096, Llama-2-70B under QLoRA. Nothing here
//! measures; every figure is labelled "predicted" where it is shown. `memfit report` computes
//! [`FullSize`] once and hands it to the report, which only prints it.
//!
//! Each setting is a grid built with the workload module's types ([`GridSpec`]) and expanded
//! for prediction as a workload file's `[[grid]]` would be.

use crate::formula::transformer::Shape;
use crate::step::Phase;
use crate::workload::{self, Case, GridSpec, OneOrMany, WorkloadFile};

/// The cases of one grid of presets at full size, expanded for prediction (CUDA cases included
/// on a CPU build); `what` names the claim in errors.
pub fn cases(grid: GridSpec, what: &str) -> anyhow::Result<Vec<Case>> {
    let file = WorkloadFile {
        grid: vec![grid],
        ..WorkloadFile::default()
    };
    Ok(workload::expand_for_prediction(
        &file,
        &GridSpec::default(),
        what,
    )?)
}

/// `phase`'s retained bytes of each case (one thread: the figures quoted are CUDA's or the
/// weights', where the CPU's per-thread gemm scratch plays no part).
pub fn retained(cases: &[Case], phase: Phase) -> Vec<u64> {
    cases
        .iter()
        .map(|c| crate::formula::predict(c, phase, 1).retained_bytes.max(0) as u64)
        .collect()
}

/// What a case's training step holds at its peak ([`Shape::train_total_bytes`]).
pub fn train_total(c: &Case) -> u64 {
    Shape::of(c).train_total_bytes(c.optimizer, 1)
}

/// Every full-size figure the claims quote, computed once before any claim. The inputs are
/// embedded presets, so a failure is a bug in memfit (a preset or a formula), and
/// [`FullSize::compute`] returns it as an error: the report stops there instead of showing the
/// claims as "open".
#[derive(Debug, Clone)]
pub struct FullSize {
    /// [`llama2_7b_f16_weights`].
    pub llama2_7b_f16: u64,
    /// [`b4_s4096`] of `llama-2-7b` and of `llama-7b-shape` (F3 uses the one its rows measured).
    pub b4_s4096: Vec<(&'static str, (u64, u64, u64))>,
    /// [`llama2_70b_qlora`].
    pub qlora70b: Vec<Qlora>,
}

impl FullSize {
    pub fn compute() -> anyhow::Result<Self> {
        use anyhow::Context;
        Ok(Self {
            llama2_7b_f16: llama2_7b_f16_weights().context("I1: Llama-2-7B f16 weights")?,
            b4_s4096: ["llama-2-7b", "llama-7b-shape"]
                .into_iter()
                .map(|p| {
                    Ok((
                        p,
                        b4_s4096(p).with_context(|| format!("F3: {p} at B 4 × S 4096"))?,
                    ))
                })
                .collect::<anyhow::Result<_>>()?,
            qlora70b: llama2_70b_qlora().context("B6: Llama-2-70B under QLoRA")?,
        })
    }

    /// F3's figures for `preset` (one of the two computed).
    pub fn b4_s4096(&self, preset: &str) -> (u64, u64, u64) {
        self.b4_s4096
            .iter()
            .find(|(p, _)| *p == preset)
            .map(|(_, v)| *v)
            .expect("F3 asks for llama-2-7b or llama-7b-shape")
    }
}

fn one<T>(v: T) -> Option<OneOrMany<T>> {
    Some(OneOrMany::One(v))
}

fn many<T>(v: Vec<T>) -> Option<OneOrMany<T>> {
    Some(OneOrMany::Many(v))
}

/// I1's grid: `llama-2-7b` in f16, B 1 × S 1, init only.
fn llama2_7b_f16_grid() -> GridSpec {
    GridSpec {
        preset: Some("llama-2-7b".into()),
        dtype: one("f16".into()),
        batch: one(1),
        seq: one(1),
        phases: Some(vec!["init".into()]),
        ..GridSpec::default()
    }
}

/// F3's grids: `preset` at B 4 × S 4096 in bf16 on CUDA without and with checkpointing every
/// block, and at one and two layers (the default dtype and device).
fn b4_s4096_grids(preset: &str) -> (GridSpec, GridSpec) {
    let base = GridSpec {
        preset: Some(preset.into()),
        batch: one(4),
        seq: one(4096),
        ..GridSpec::default()
    };
    let graph = GridSpec {
        dtype: one("bf16".into()),
        device: Some("cuda:0".into()),
        checkpoint: many(vec![0, 1]),
        ..base.clone()
    };
    let depth = GridSpec {
        layers: many(vec![1, 2]),
        ..base
    };
    (graph, depth)
}

/// B6's settings: `(rank, targets)`.
const QLORA: [(i64, &[&str]); 2] = [(8, &["q", "v"]), (64, &["all"])];

/// B6's grid: `llama-2-70b` at B 1 × S 512, checkpointing every block, AdamW, LoRA of `rank` on
/// `targets` over q4_0 frozen projections, the training step only.
fn qlora_grid(rank: i64, targets: &[&str]) -> GridSpec {
    GridSpec {
        preset: Some("llama-2-70b".into()),
        batch: one(1),
        seq: one(512),
        checkpoint: one(1),
        optimizer: one("adamw".into()),
        lora_rank: one(rank),
        lora_targets: Some(targets.iter().map(|t| t.to_string()).collect()),
        lora_base: one("q4_0".into()),
        phases: Some(vec!["train-step".into()]),
        ..GridSpec::default()
    }
}

/// Llama-2-7B's weights in f16 (the seed's "≈ 14 GB"): init's retained bytes.
pub fn llama2_7b_f16_weights() -> anyhow::Result<u64> {
    let c = cases(llama2_7b_f16_grid(), "I1")?;
    Ok(retained(&c, Phase::Init)[0])
}

/// The forward graph of `preset` at B 4 × S 4096 in bf16 on CUDA, without and with
/// checkpointing every block (claim F3), and one block's share in f32 at that size (the
/// difference between one and two blocks).
pub fn b4_s4096(preset: &str) -> anyhow::Result<(u64, u64, u64)> {
    let (graph, depth) = b4_s4096_grids(preset);
    let g = retained(&cases(graph, "F3")?, Phase::Forward);
    let d = retained(&cases(depth, "F3")?, Phase::Forward);
    anyhow::ensure!(g.len() == 2 && d.len() == 2, "F3: expected two cases each");
    Ok((g[0], g[1], d[1].saturating_sub(d[0])))
}

/// A QLoRA setting of Llama-2-70B and what its training step holds (bytes).
#[derive(Debug, Clone)]
pub struct Qlora {
    /// `r8 q, v`, `r64 all`.
    pub setting: String,
    /// Weights after init: q4_0 projections, f32 embedding, head and norms, the adapters.
    pub weights: u64,
    /// AdamW's state of the adapters.
    pub state: u64,
    /// The training step's peak above weights, input and state (gradients, checkpointed
    /// activations, the dequantized layer).
    pub step: u64,
    pub total: u64,
}

/// Llama-2-70B under QLoRA (q4_0 frozen projections, f32 adapters and AdamW, B 1 × S 512,
/// checkpointing every block): rank 8 on q and v, and rank 64 on every projection (the QLoRA
/// paper's setting).
pub fn llama2_70b_qlora() -> anyhow::Result<Vec<Qlora>> {
    let mut out = Vec::new();
    for (rank, targets) in QLORA {
        let c = cases(qlora_grid(rank, targets), "B6")?;
        let shape = Shape::of(&c[0]);
        let opt = c[0].optimizer;
        out.push(Qlora {
            setting: format!("r{rank} {}", targets.join(", ")),
            weights: shape.predict(Phase::Init, opt, 1).retained_bytes.max(0) as u64,
            state: shape.optimizer_state_bytes(opt),
            step: shape.predict(Phase::TrainStep, opt, 1).peak_bytes,
            total: train_total(&c[0]),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed grids are the `[[grid]]` tables the figures were first written as: the same
    /// specs, so the same cases.
    #[test]
    fn grids_equal_their_workload_text() {
        let parsed = |toml: &str| {
            let mut f = workload::parse(toml, "test").unwrap();
            assert_eq!(f.grid.len(), 1);
            f.grid.remove(0)
        };
        assert_eq!(
            llama2_7b_f16_grid(),
            parsed(
                "[[grid]]\npreset = \"llama-2-7b\"\ndtype = \"f16\"\nbatch = 1\nseq = 1\nphases = [\"init\"]\n"
            )
        );
        for preset in ["llama-2-7b", "llama-7b-shape"] {
            let (graph, depth) = b4_s4096_grids(preset);
            assert_eq!(
                graph,
                parsed(&format!(
                    "[[grid]]\npreset = \"{preset}\"\nbatch = 4\nseq = 4096\ndtype = \"bf16\"\ndevice = \"cuda:0\"\ncheckpoint = [0, 1]\n"
                ))
            );
            assert_eq!(
                depth,
                parsed(&format!(
                    "[[grid]]\npreset = \"{preset}\"\nbatch = 4\nseq = 4096\nlayers = [1, 2]\n"
                ))
            );
        }
        for ((rank, targets), text) in QLORA.into_iter().zip(["\"q\", \"v\"", "\"all\""]) {
            assert_eq!(
                qlora_grid(rank, targets),
                parsed(&format!(
                    "[[grid]]\npreset = \"llama-2-70b\"\nbatch = 1\nseq = 512\ncheckpoint = 1\noptimizer = \"adamw\"\nlora_rank = {rank}\nlora_targets = [{text}]\nlora_base = \"q4_0\"\nphases = [\"train-step\"]\n"
                ))
            );
        }
    }

    /// Every figure computes, and the settings read as the claims print them.
    #[test]
    fn computes() {
        let f = FullSize::compute().unwrap();
        assert!(f.llama2_7b_f16 > 13_000_000_000, "{}", f.llama2_7b_f16);
        let settings: Vec<&str> = f.qlora70b.iter().map(|q| q.setting.as_str()).collect();
        assert_eq!(settings, ["r8 q, v", "r64 all"]);
        let (full, checkpointed, _) = f.b4_s4096("llama-2-7b");
        assert!(checkpointed < full);
    }
}
