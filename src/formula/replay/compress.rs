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
    let keys: Vec<_> = (0..shape.l as usize)
        .map(|layer| {
            (
                shape.layer_layout(layer as u64),
                shape.llama.and_then(|l| l.window_at(layer)),
            )
        })
        .collect();
    runs_of(&keys)
}

/// Runs of equal values: `(first index, length)`.
fn runs_of<T: PartialEq>(items: &[T]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for i in 0..items.len() {
        match runs.last_mut() {
            Some(run) if items[run.0] == items[i] => run.1 += 1,
            _ => runs.push((i, 1)),
        }
    }
    runs
}

/// The runs (of at least [`MIN_RUN`] items) worth compressing, by index: each one compressed
/// doubles the corners and replays 4 (or 3) of its `n` items instead of `n`, so runs are taken
/// longest first while the work, corners × items replayed, does not grow (a run of `n` items
/// among `m` replayed is taken when `n ≥ m/2 + 4`). Llama-3-8B's one run of 32: 2 corners of 4 layers.
/// Gemma 3-27B's ten runs of five sliding layers between its full ones: none (compressing all
/// ten would replay 2¹⁰ corners of 42 layers, 700 times the 62 of the full replay; 20 s).
fn worth_compressing(runs: &[(usize, usize)]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..runs.len()).filter(|&r| runs[r].1 >= MIN_RUN).collect();
    order.sort_by_key(|&r| std::cmp::Reverse(runs[r].1));
    let mut items: usize = runs.iter().map(|r| r.1).sum();
    let mut vars = Vec::new();
    for r in order {
        let after = items - runs[r].1 + 4;
        if 2 * after > items {
            break;
        }
        items = after;
        vars.push(r);
    }
    vars.sort_unstable();
    vars
}

/// How a shape's layers (and a training replay's experts) are compressed: the runs, and which
/// of them vary between corners.
pub(super) struct Plan {
    runs: Vec<(usize, usize)>,
    /// Indices into `runs` of the compressed ones.
    vars: Vec<usize>,
    /// A mixture of experts: the runs of experts with the same token count in the training
    /// forward (every sparse layer routes the same count per expert) with the compressed ones,
    /// when experts are compressed; else one run of all `E`.
    expert_runs: Vec<(usize, usize)>,
    expert_vars: Vec<usize>,
}

impl Plan {
    /// `None` when nothing is compressed (no run of [`MIN_RUN`] layers or experts, a recorded
    /// routing, checkpoint segments of several blocks). `experts`: compress the experts too
    /// (the training replay, whose one forward routes `B·S` tokens; a serving replay routes
    /// other counts in each forward).
    pub(super) fn of(shape: &Shape, experts: bool) -> Option<Plan> {
        if shape.routing.is_some() || shape.checkpoint > 1 {
            return None;
        }
        let runs = runs(shape);
        let vars = worth_compressing(&runs);
        let moe = shape.llama.and_then(|l| l.moe);
        let e = moe.map_or(0, |m| m.experts);
        let (expert_runs, expert_vars) = match moe {
            Some(m) if experts && shape.vision.is_none() => {
                let t = (shape.b * shape.s) as usize;
                let counts = if shape.worst_routing {
                    super::moe::worst(t, m)
                } else {
                    super::moe::balanced(t, m)
                };
                let runs = runs_of(&counts);
                let vars = worth_compressing(&runs);
                (runs, vars)
            }
            _ => (
                vec![(0, e)].into_iter().filter(|r| r.1 > 0).collect(),
                Vec::new(),
            ),
        };
        (!vars.is_empty() || !expert_vars.is_empty()).then_some(Plan {
            runs,
            vars,
            expert_runs,
            expert_vars,
        })
    }

    /// Corners: bit `v` set puts compressed run `v` (the layers' first, then the experts')
    /// at 4, else 3.
    pub(super) fn corners(&self) -> std::ops::Range<usize> {
        0..1 << (self.vars.len() + self.expert_vars.len())
    }

    /// `runs` at a corner (bits from `first`): each item `(index, parts)`, compressed runs as
    /// their first, inner and last items.
    fn items(
        runs: &[(usize, usize)],
        vars: &[usize],
        corner: usize,
        first: usize,
        whole: impl Fn(usize) -> Part,
    ) -> Vec<(usize, Vec<Part>)> {
        let mut out = Vec::new();
        for (r, &(start, len)) in runs.iter().enumerate() {
            match vars.iter().position(|&v| v == r) {
                None => out.extend((start..start + len).map(|i| (i, vec![whole(i)]))),
                Some(v) => {
                    let c = if corner >> (first + v) & 1 == 1 { 4 } else { 3 };
                    out.push((start, vec![Part::First(r)]));
                    for j in 1..c - 1 {
                        let mut p = Vec::new();
                        if j == 1 {
                            p.push(Part::InnerFirst(r));
                        }
                        if j == c - 2 {
                            p.push(Part::InnerLast(r));
                        }
                        out.push((start + j, p));
                    }
                    out.push((start + len - 1, vec![Part::Last(r)]));
                }
            }
        }
        out
    }

    /// The layers of corner `corner`, its routed experts when they are compressed, and the
    /// parts each tag is (a layer's tag; an expert's: the layer's plus its slot above 2¹⁶).
    pub(super) fn slots(&self, corner: usize) -> (Vec<Slot>, Option<Vec<usize>>, Tags) {
        let layers = Self::items(&self.runs, &self.vars, corner, 0, Part::Layer);
        let experts = Self::items(
            &self.expert_runs,
            &self.expert_vars,
            corner,
            self.vars.len(),
            Part::Layer,
        );
        let mut parts: Tags = HashMap::from([(0, vec![(Part::Outside, None)])]);
        let mut slots = Vec::new();
        for (i, (layer, lp)) in layers.into_iter().enumerate() {
            let tag = i as u32 + 1;
            slots.push(Slot { layer, tag });
            parts.insert(tag, lp.iter().map(|&p| (p, None)).collect());
            for (j, (_, ep)) in experts.iter().enumerate() {
                let both = lp
                    .iter()
                    .flat_map(|&l| ep.iter().map(move |&e| (l, Some(e))))
                    .collect();
                parts.insert(tag | (j as u32 + 1) << 16, both);
            }
        }
        let list = (!self.expert_vars.is_empty()).then(|| experts.iter().map(|e| e.0).collect());
        (slots, list, parts)
    }

    /// Corner `corner`'s weight at the real lengths: `Π (4 − n)` or `(n − 3)` per run.
    fn weight(&self, corner: usize) -> i128 {
        let lengths = self
            .vars
            .iter()
            .map(|&r| self.runs[r].1)
            .chain(self.expert_vars.iter().map(|&r| self.expert_runs[r].1));
        lengths
            .enumerate()
            .map(|(v, n)| {
                let n = n as i128;
                if corner >> v & 1 == 1 { n - 3 } else { 4 - n }
            })
            .product()
    }
}

/// The parts each tag is: `(layer part, expert part)`.
pub(super) type Tags = HashMap<u32, Vec<(Part, Option<Part>)>>;

/// One corner's replay: its figures (`Training`'s or `Serving`'s fields in order), the windows
/// it recorded, and the parts of its tags.
pub(super) struct Corner {
    pub figures: Vec<i128>,
    pub windows: Windows,
    pub parts: Tags,
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
    let at = |f: &dyn Fn(&Corner) -> i128| -> i128 {
        corners.iter().zip(&weights).map(|(c, w)| w * f(c)).sum()
    };
    let n = corners[0].figures.len();
    let mut out: Vec<i128> = (0..n).map(|i| at(&|c: &Corner| c.figures[i])).collect();
    let windows = corners[0].windows.0.len();
    if corners.iter().any(|c| c.windows.0.len() != windows) {
        return None;
    }
    // Each corner's maxima per (part, occurrence) of each window.
    type Key = ((Part, Option<Part>), u32);
    let by_part: Vec<Vec<HashMap<Key, i128>>> = corners
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
        let base = at(&|c: &Corner| c.windows.0[window].base as i128);
        let peak = keys
            .keys()
            .map(|key| {
                by_part
                    .iter()
                    .zip(&weights)
                    .map(|(w, weight)| weight * w[window][key])
                    .sum::<i128>()
            })
            .fold(base, i128::max);
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

    /// Llama-family shapes of every kind the replay knows (the fixtures' configs: dense,
    /// windowed, mixed windows, mixtures of experts with and without shared experts and dense
    /// first layers, latent attention), at depths that compress, both routings.
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
            "gemma3",
        ] {
            let path = fixtures.join(family).join("config.json");
            let cfg = hf_config::load(&path)
                .unwrap_or_else(|e| panic!("{family}: {e}"))
                .cfg;
            for layers in [12, 15] {
                // Batch and sequence drawn per family and depth (a fixed generator: the same
                // shapes every run), odd and even, one token included.
                let draw = format!("{family}{layers}")
                    .bytes()
                    .fold(0xcbf2_9ce4_8422_2325u64, |h, c| {
                        (h ^ c as u64).wrapping_mul(0x100_0000_01b3)
                    });
                let (b, seq) = (1 + draw % 4, 1 + (draw >> 8) % 23);
                let mut s = Shape::new(
                    b,
                    seq,
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
        v.push(("lora".into(), lora.clone()));
        // The backward block by block (`phase::by_block`).
        let mut bf = f.clone();
        bf.by_block = true;
        v.push(("fused by-block".into(), bf));
        let mut be = v[2].1.clone();
        be.by_block = true;
        v.push(("bf16 cuda fused efficient by-block".into(), be));
        let mut bl = lora;
        bl.by_block = true;
        bl.mixed = true;
        bl.elem = ElemType::F16;
        v.push(("lora mixed f16 by-block".into(), bl));
        v
    }

    /// The compressed replay is the full replay, byte for byte.
    #[test]
    fn compressed_equals_full() {
        let (mut checked, mut compressed) = (0, 0);
        for (name, s) in shapes() {
            for (variant, s) in variants(&s) {
                let plan = Plan::of(&s, false).is_some();
                let training_plan = Plan::of(&s, true).is_some();
                for threads in [1, 2] {
                    let (meta, gemm) = (240, s.cpu.then_some(threads));
                    let (t, v) = (
                        training_compressed(&s, meta, gemm),
                        serving_compressed(&s, meta, gemm),
                    );
                    // A plan is always carried out: its corners agree.
                    assert_eq!(t.is_some(), training_plan, "{name} {variant} training");
                    assert_eq!(v.is_some(), plan, "{name} {variant} serving");
                    if let Some(t) = t {
                        assert_eq!(t, replay_training_full(&s, meta, gemm), "{name} {variant}");
                    }
                    if let Some(v) = v {
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
        let mut gpt = Shape::new(2, 9, 24, 3, 9, 50, 16);
        gpt.decode_tokens = 2;
        let mut fused = gpt.clone();
        fused.kernels = Kernels::Fused;
        let mut vit = Shape::new(2, 17, 24, 3, 9, 10, 17);
        vit.vision = Some(crate::model::vit::Vision {
            image: 16,
            patch: 4,
            channels: 3,
        });
        let by_block = Shape {
            by_block: true,
            ..fused.clone()
        };
        let vit_by_block = Shape {
            by_block: true,
            kernels: Kernels::Fused,
            ..vit.clone()
        };
        for s in [gpt, fused, vit, by_block, vit_by_block] {
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
        let p = Plan::of(&s, true).unwrap();
        assert_eq!(p.runs, vec![(0, 9)]);
        let (slots, _, _) = p.slots(0);
        assert_eq!(slots.iter().map(|s| s.layer).collect::<Vec<_>>(), [0, 1, 8]);
        assert_eq!(p.slots(1).0.len(), 4);
        // f(9) = (4 − 9)·f(3) + (9 − 3)·f(4): a line through both.
        assert_eq!((p.weight(0), p.weight(1)), (-5, 6));
        s.l = 4;
        assert!(Plan::of(&s, true).is_none());
    }
}
