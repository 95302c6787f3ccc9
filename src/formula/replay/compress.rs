//! Replaying a deep model through a few of its layers, exactly.
//!
//! A model's layers come in runs of identical layers (Llama-3-8B: one run of 32; DeepSeek-V3:
//! 3 dense, then 58 sparse). Within a run every layer does the same thing to the ledger, only
//! higher or lower by what the layers before it keep (forward) or what the layers above it
//! have left (backward): its trajectory is translated, not reshaped. So the highest level any
//! part of the step reaches — a segment: the work done under one tag, [`Ledger::set_tag`] — is
//! an affine function of each run's length `n`, and the level of its `j`-th layer an affine
//! function of `j` and `n`, whose maximum over `j` is at the first or the last inner layer.
//!
//! A run of `n ≥ 5` layers is replayed with `c = 3` and `c = 4` of them: its first layer, its
//! inner layers (the first and the last inner one named apart, the same layer when `c = 3`)
//! and its last. Every recorded maximum (per window, per part, per occurrence of the part) and
//! every retained figure is then multilinear in the runs' lengths, and is evaluated at the real
//! lengths from the `2^V` corners (`V` runs compressed): `f(n) = (4 − n)·f(3) + (n − 3)·f(4)`
//! per run. A window's peak is the largest extrapolated maximum minus the extrapolated
//! baseline. The result equals the full replay byte for byte (`tests` compare them over
//! configs of every family, routing, precision, kernel, attention and checkpointing); where
//! the corners do not record the same parts (something not translation-invariant), the full
//! replay answers instead.
//!
//! Not compressed: recorded routings (each sparse layer routes differently) and checkpointing
//! segments of more than one block (a segment spans layers).

use std::collections::HashMap;

use super::super::shape::Shape;
use super::super::symbolic::Windows;
use super::Slot;

/// Shortest run worth compressing (replayed with 3 and 4 of its layers).
const MIN_RUN: usize = 5;

/// Whose work a segment is, the same in every corner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Part {
    /// Outside the blocks (tag 0).
    Outside,
    /// A layer replayed as itself (runs shorter than [`MIN_RUN`]).
    Layer(usize),
    /// A compressed run's first layer, first inner layer, last inner layer, last layer.
    First(usize),
    InnerFirst(usize),
    InnerLast(usize),
    Last(usize),
}

/// The runs of identical consecutive layers: `(first layer, length)`.
fn runs(shape: &Shape) -> Vec<(usize, usize)> {
    let key = |layer: usize| {
        (
            shape.layer_layout(layer as u64),
            shape.llama.and_then(|l| l.window_at(layer)),
        )
    };
    let mut runs: Vec<(usize, usize)> = Vec::new();
    let mut last = None;
    for layer in 0..shape.l as usize {
        let k = key(layer);
        match (&last, runs.last_mut()) {
            (Some(prev), Some(run)) if *prev == k => run.1 += 1,
            _ => runs.push((layer, 1)),
        }
        last = Some(k);
    }
    runs
}

/// How a shape's layers are compressed: its runs, and which of them vary between corners.
pub(super) struct Plan {
    runs: Vec<(usize, usize)>,
    /// Indices into `runs` of the compressed ones.
    vars: Vec<usize>,
}

impl Plan {
    /// `None` when nothing is compressed (no run of [`MIN_RUN`] layers, a recorded routing,
    /// checkpoint segments of several blocks).
    pub(super) fn of(shape: &Shape) -> Option<Plan> {
        if shape.routing.is_some() || shape.checkpoint > 1 {
            return None;
        }
        let runs = runs(shape);
        let vars: Vec<usize> = (0..runs.len()).filter(|&r| runs[r].1 >= MIN_RUN).collect();
        (!vars.is_empty()).then_some(Plan { runs, vars })
    }

    /// Corners: bit `v` set puts compressed run `vars[v]` at 4 layers, else 3.
    pub(super) fn corners(&self) -> std::ops::Range<usize> {
        0..1 << self.vars.len()
    }

    /// The layers of corner `corner`, and the parts each tag is.
    pub(super) fn slots(&self, corner: usize) -> (Vec<Slot>, HashMap<u32, Vec<Part>>) {
        let mut slots = Vec::new();
        let mut parts: HashMap<u32, Vec<Part>> = HashMap::from([(0, vec![Part::Outside])]);
        let mut push = |layer: usize, p: Vec<Part>| {
            let tag = slots.len() as u32 + 1;
            slots.push(Slot { layer, tag });
            parts.insert(tag, p);
        };
        for (r, &(start, len)) in self.runs.iter().enumerate() {
            match self.vars.iter().position(|&v| v == r) {
                None => (start..start + len).for_each(|l| push(l, vec![Part::Layer(l)])),
                Some(v) => {
                    let c = if corner >> v & 1 == 1 { 4 } else { 3 };
                    push(start, vec![Part::First(r)]);
                    for j in 1..c - 1 {
                        let mut p = Vec::new();
                        if j == 1 {
                            p.push(Part::InnerFirst(r));
                        }
                        if j == c - 2 {
                            p.push(Part::InnerLast(r));
                        }
                        push(start + j, p);
                    }
                    push(start + len - 1, vec![Part::Last(r)]);
                }
            }
        }
        (slots, parts)
    }

    /// Corner `corner`'s weight at the real lengths: `Π (4 − n)` or `(n − 3)` per run.
    fn weight(&self, corner: usize) -> i128 {
        self.vars
            .iter()
            .enumerate()
            .map(|(v, &r)| {
                let n = self.runs[r].1 as i128;
                if corner >> v & 1 == 1 { n - 3 } else { 4 - n }
            })
            .product()
    }
}

/// One corner's replay: its figures (`Training`'s or `Serving`'s fields in order), the windows
/// it recorded, and the parts of its tags.
pub(super) struct Corner {
    pub figures: Vec<i128>,
    pub windows: Windows,
    pub parts: HashMap<u32, Vec<Part>>,
}

/// The figures at the real lengths, from the corners (in [`Plan::corners`] order). `peaks`
/// names the figures that are window peaks: `(figure, window)`; the others are extrapolated
/// as they are. `None` when the corners did not record the same parts.
pub(super) fn extrapolate(
    plan: &Plan,
    corners: &[Corner],
    peaks: &[(usize, usize)],
) -> Option<Vec<i128>> {
    let weights: Vec<i128> = plan.corners().map(|c| plan.weight(c)).collect();
    let at = |f: &dyn Fn(&Corner) -> Option<i128>| -> Option<i128> {
        let mut sum = 0i128;
        for (c, w) in corners.iter().zip(&weights) {
            sum += w * f(c)?;
        }
        Some(sum)
    };
    let n = corners[0].figures.len();
    let mut out: Vec<i128> = (0..n)
        .map(|i| at(&|c: &Corner| Some(c.figures[i])))
        .collect::<Option<_>>()?;
    let windows = corners[0].windows.0.len();
    if corners.iter().any(|c| c.windows.0.len() != windows) {
        return None;
    }
    // Each corner's maxima per (part, occurrence) of each window.
    let by_part: Vec<Vec<HashMap<(Part, u32), i128>>> = corners
        .iter()
        .map(|c| {
            c.windows
                .0
                .iter()
                .map(|w| {
                    let mut m = HashMap::new();
                    for (&(tag, occ), &max) in &w.maxima {
                        for &p in &c.parts[&tag] {
                            m.insert((p, occ), max as i128);
                        }
                    }
                    m
                })
                .collect()
        })
        .collect();
    for &(figure, window) in peaks {
        if window >= windows {
            continue;
        }
        let keys = &by_part[0][window];
        if by_part.iter().any(|w| {
            w[window].len() != keys.len() || keys.keys().any(|k| !w[window].contains_key(k))
        }) {
            return None;
        }
        let base = at(&|c: &Corner| Some(c.windows.0[window].base as i128))?;
        let mut peak = base;
        for key in keys.keys() {
            let (mut level, mut i) = (0i128, 0usize);
            for (w, weight) in by_part.iter().zip(&weights) {
                level += weight * w[window][key];
                i += 1;
            }
            debug_assert_eq!(i, corners.len());
            peak = peak.max(level);
        }
        out[figure] = peak - base;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::super::{
        decode_step_compressed, decode_step_full, replay_serving_full, replay_training_full,
        serving_compressed, training_compressed,
    };
    use super::*;
    use crate::device::ElemType;
    use crate::model::kernels::Kernels;

    /// Llama-family shapes of every kind the replay knows, at depths that compress.
    fn shapes() -> Vec<(String, Shape)> {
        use crate::model::hf_config;
        let mut out = Vec::new();
        let fixtures = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        for family in [
            "llama",
            "mistral",
            "qwen3",
            "qwen3_layer_types",
            "mixtral",
            "qwen2_moe",
            "qwen3_moe",
            "qwen3_moe_dense",
            "deepseek_v2",
            "deepseek_v3",
        ] {
            let path = fixtures.join(family).join("config.json");
            let cfg = hf_config::load(&path)
                .unwrap_or_else(|e| panic!("{family}: {e}"))
                .cfg;
            for layers in [6, 9] {
                let mut s = Shape::new(
                    3,
                    11,
                    cfg.hidden as u64,
                    cfg.heads as u64,
                    layers as u64,
                    cfg.vocab as u64,
                    cfg.max_seq.min(64) as u64,
                );
                s.llama = cfg.llama;
                s.tied = cfg.tied;
                out.push((format!("{family} L{layers}"), s.clone()));
                s.worst_routing = true;
                out.push((format!("{family} L{layers} worst"), s));
            }
        }
        out
    }

    fn variants(s: &Shape) -> Vec<(String, Shape)> {
        let mut v = vec![("f32 cpu composed".to_string(), s.clone())];
        let mut f = s.clone();
        f.kernels = Kernels::Fused;
        v.push(("fused".into(), f.clone()));
        let mut e = f.clone();
        e.efficient = true;
        e.elem = ElemType::Bf16;
        e.cpu = false;
        v.push(("bf16 cuda fused efficient".into(), e));
        let mut c = s.clone();
        c.checkpoint = 1;
        c.mixed = true;
        c.elem = ElemType::F16;
        v.push(("mixed f16 checkpoint 1".into(), c));
        let mut t = s.clone();
        t.tiled = true;
        t.decode_tokens = 3;
        v.push(("tiled decode 3".into(), t));
        let mut lora = s.clone();
        lora.lora_rank = 4;
        lora.lora_targets = crate::formula::shape::lora_bits(&[
            crate::model::proj::LoraTarget::Q,
            crate::model::proj::LoraTarget::V,
        ]);
        v.push(("lora".into(), lora));
        v
    }

    /// The compressed replay is the full replay, byte for byte.
    #[test]
    fn compressed_equals_full() {
        let (mut checked, mut compressed) = (0, 0);
        for (name, s) in shapes() {
            for (variant, s) in variants(&s) {
                let plan = Plan::of(&s).is_some();
                for threads in [1, 2] {
                    let (meta, gemm) = (240, s.cpu.then_some(threads));
                    let (t, v) = (
                        training_compressed(&s, meta, gemm),
                        serving_compressed(&s, meta, gemm),
                    );
                    // A plan is always carried out: its corners agree.
                    assert_eq!(t.is_some(), plan, "{name} {variant} training");
                    assert_eq!(v.is_some(), plan, "{name} {variant} serving");
                    if let (Some(t), Some(v)) = (t, v) {
                        assert_eq!(t, replay_training_full(&s, meta, gemm), "{name} {variant}");
                        assert_eq!(v, replay_serving_full(&s, meta, gemm), "{name} {variant}");
                        compressed += 1;
                    }
                    // One decode step over caches shorter and longer than a window.
                    for cached in [1, 9, 40] {
                        let d = decode_step_compressed(&s, cached, meta, gemm);
                        assert_eq!(d.is_some(), plan, "{name} {variant} decode step");
                        if let Some(d) = d {
                            assert_eq!(
                                d,
                                decode_step_full(&s, cached, meta, gemm),
                                "{name} {variant} decode step at {cached}"
                            );
                        }
                    }
                    checked += 1;
                }
            }
        }
        assert!(
            compressed * 10 > checked * 7,
            "{compressed} of {checked} compressed"
        );
    }

    /// GPT and ViT shapes too, and a run too short to compress beside a long one.
    #[test]
    fn compressed_equals_full_for_gpt_and_vit() {
        let mut gpt = Shape::new(2, 9, 24, 3, 6, 50, 16);
        gpt.decode_tokens = 2;
        let mut fused = gpt.clone();
        fused.kernels = Kernels::Fused;
        let mut vit = Shape::new(2, 17, 24, 3, 5, 10, 17);
        vit.vision = Some(crate::model::vit::Vision {
            image: 16,
            patch: 4,
            channels: 3,
        });
        for s in [gpt, fused, vit] {
            for gemm in [None, Some(1), Some(2)] {
                assert_eq!(
                    training_compressed(&s, 240, gemm),
                    Some(replay_training_full(&s, 240, gemm))
                );
                assert_eq!(
                    serving_compressed(&s, 240, gemm),
                    Some(replay_serving_full(&s, 240, gemm))
                );
            }
        }
    }

    /// The plan: runs found, the short ones replayed whole, corners weighted to the lengths.
    #[test]
    fn plans_runs_and_weights() {
        let mut s = Shape::new(1, 4, 16, 2, 9, 20, 4);
        let p = Plan::of(&s).unwrap();
        assert_eq!(p.runs, vec![(0, 9)]);
        let (slots, _) = p.slots(0);
        assert_eq!(slots.iter().map(|s| s.layer).collect::<Vec<_>>(), [0, 1, 8]);
        assert_eq!(p.slots(1).0.len(), 4);
        // f(9) = (4 − 9)·f(3) + (9 − 3)·f(4): a line through both.
        assert_eq!((p.weight(0), p.weight(1)), (-5, 6));
        s.l = 4;
        assert!(Plan::of(&s).is_none());
    }
}
