//! Mirror of `model::moe`: the router, the host routing, the experts on their gathered tokens
//! and the `index_add`s (one over the concatenated outputs in training, one per expert in
//! inference), for a given routing (tokens per expert; a row's recorded
//! `moe_routing`, or balanced).

use super::Mlp;
use super::proj::Linear;
use crate::formula::symbolic::Sure;
use crate::formula::symbolic::{DType, Sym};
use crate::model::kernels::Kernel;
use crate::model::moe::{MoeShape, Scoring};
use crate::model::tensor_ops;

/// Mirror of the composed sigmoid `1 / (1 + exp(−x))` (`model::moe`).
fn sigmoid(x: &Sym) -> Sym {
    let e = x.neg().exp();
    let p = e.affine(1.0);
    drop(e);
    p.recip()
}

pub(super) struct Moe {
    pub(super) router: Linear,
    pub(super) experts: Vec<Mlp>,
    /// Each expert's index among the model's `E` (all of them, or a compressed training
    /// replay's few: `compress`).
    pub(super) expert_ids: Vec<usize>,
    /// Shared experts and Qwen2-MoE's gate on them.
    pub(super) shared: Option<Mlp>,
    pub(super) shared_gate: Option<Linear>,
    pub(super) shape: MoeShape,
    /// Tokens per expert as recorded for this layer, if any.
    pub(super) routing: Option<Vec<usize>>,
    /// Without a recorded routing: every token on the first `k` experts (the worst case).
    pub(super) worst: bool,
    /// Fused kernels (the model's `Moe::fused`).
    pub(super) fused: bool,
}

/// `k·T` tokens spread evenly over `E` experts (the first `k·T mod E` get one more).
pub(super) fn balanced(tokens: usize, shape: MoeShape) -> Vec<usize> {
    let (total, e) = (tokens * shape.top_k, shape.experts);
    (0..e)
        .map(|i| total / e + usize::from(i < total % e))
        .collect()
}

/// The worst routing of `tokens`: every expert gets a token where there are enough (each one
/// runs, keeping its own gathered input and intermediates in a training graph) and the first `k`
/// as many as possible (`n_e ≤ T`: a token picks distinct experts; the largest intermediates in
/// inference), the two things routing moves.
pub(super) fn worst(tokens: usize, shape: MoeShape) -> Vec<usize> {
    let (e, k) = (shape.experts, shape.top_k);
    let rest = e - k;
    // One token for each of the others while the first k keep at least one each.
    let spread = rest.min(tokens.saturating_sub(1) * k).min(tokens * k - k);
    let mut counts = vec![0; e];
    let mut left = tokens * k - spread;
    for c in counts.iter_mut().take(k) {
        *c = left.min(tokens);
        left -= *c;
    }
    for c in counts.iter_mut().skip(k).take(spread) {
        *c = 1;
    }
    counts
}

thread_local! {
    /// Inference replays one expert per distinct token count (see `Moe::forward`); tests turn
    /// it off to compare with every expert replayed.
    static EVERY_EXPERT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Replay every expert of an inference forward, not one per distinct token count (tests).
#[cfg(test)]
pub(super) fn replay_every_expert(on: bool) {
    EVERY_EXPERT.with(|e| e.set(on));
}

impl Moe {
    /// The tokens per expert of a forward over `tokens`: the recorded routing when it is of
    /// this many tokens, else the worst case when asked, else balanced.
    fn counts(&self, tokens: usize) -> Vec<usize> {
        match &self.routing {
            Some(r) if r.iter().sum::<usize>() == tokens * self.shape.top_k => r.clone(),
            _ if self.worst => worst(tokens, self.shape),
            _ => balanced(tokens, self.shape),
        }
    }

    pub(super) fn forward(&self, x: &Sym) -> Sym {
        let (b, s, h) = (x.dims()[0], x.dims()[1], x.dims()[2]);
        let (t, e) = (b * s, self.shape.experts);
        let counts = self.counts(t);
        let ledger = x.ledger().clone();
        let xs = x.reshape(&[t, h]);
        let logits = tensor_ops::linear(&self.router.weight, self.router.bias.as_ref(), &xs).sure();
        let probs = {
            let l = logits.to_dtype(DType::F32);
            match self.shape.scoring {
                Scoring::Softmax => tensor_ops::softmax_last(&l).sure(),
                Scoring::Sigmoid => sigmoid(&l),
            }
        };
        drop(logits);
        // The host copy of the probabilities, the 0/1 selection and each expert's token list
        // (the last two become tensors without a copy: `Tensor::from_vec`); DeepSeek-V3's
        // correction bias, `E` f32 on the host, while the routing is computed.
        let host = ledger.host(4 * t * e);
        let bias = self.shape.correction_bias.then(|| ledger.host(4 * e));
        let mask = ledger.host(4 * t * e);
        let mut ids: Vec<_> = self
            .expert_ids
            .iter()
            .map(|&i| (counts[i] > 0).then(|| ledger.host(4 * counts[i])))
            .collect();
        drop((host, bias));
        let mask = mask.into_tensor(&[t, e], DType::F32);
        let selected = probs.mul(&mask);
        drop((probs, mask));
        let weights = match (self.shape.norm_topk, self.shape.group) {
            (false, _) => selected,
            (true, None) if self.shape.scoring == Scoring::Softmax => {
                let sum = selected.sum_keepdim(&[1]);
                selected.broadcast_div(&sum)
            }
            (true, _) => {
                let sum = {
                    let s = selected.sum_keepdim(&[1]);
                    let r = s.affine(1.0);
                    drop(s);
                    r
                };
                selected.broadcast_div(&sum)
            }
        };
        let weights = if self.shape.routed_scale.0 != 1.0 {
            let r = weights.affine(self.shape.routed_scale.0);
            drop(weights);
            r
        } else {
            weights
        }
        .to_dtype(x.dtype());
        // Training: the scaled expert outputs concatenated and added by one `index_add` (the
        // `Vec` of parts, 8 B a part, and the `k·T` ids on the host first); inference: expert
        // by expert into the output.
        let tracked = weights.track_op();
        let total: usize = self.expert_ids.iter().map(|&i| counts[i]).sum();
        let hit = self.expert_ids.iter().filter(|&&i| counts[i] > 0).count();
        let (parts_vec, all_ids) = if tracked {
            (Some(ledger.host(8 * hit)), Some(ledger.host(4 * total)))
        } else {
            (None, None)
        };
        let mut parts: Vec<Sym> = Vec::new();
        let mut ys = (!tracked).then(|| xs.zeros_like());
        // Inference: an expert leaves the ledger where it found it (its output added into a
        // new accumulator, the old one freed) less its host ids, and its temporaries depend on
        // its token count only. So an expert whose count an earlier expert had peaks no higher
        // than that one did (the ids still waiting are fewer) and changes nothing after: its ids
        // are freed and it is not replayed. Exact, and one expert per distinct count.
        let skip_repeats = !tracked && !EVERY_EXPERT.with(|e| e.get());
        let mut replayed: Vec<usize> = Vec::new();
        // Each expert's work is its own segment (tag: the layer's, plus its slot above 2¹⁶).
        let layer_tag = ledger.tag();
        for (slot, (expert, &i)) in self.experts.iter().zip(&self.expert_ids).enumerate() {
            let n = counts[i];
            let Some(host_ids) = ids[slot].take() else {
                continue;
            };
            if skip_repeats {
                if replayed.contains(&n) {
                    drop(host_ids);
                    continue;
                }
                replayed.push(n);
            }
            ledger.set_tag(layer_tag | (slot as u32 + 1) << 16);
            let ids = host_ids.into_tensor(&[n], DType::U32);
            let we = weights.index_select(&ids, 0).narrow(1, i, 1);
            let ye = expert.forward_scaled(xs.index_select(&ids, 0), &we).sure();
            drop(we);
            match ys.take() {
                Some(acc) => ys = Some(acc.index_add_tracked(&ids, &ye, 0)),
                None => parts.push(ye),
            }
        }
        ledger.set_tag(layer_tag);
        let ys = match ys {
            Some(ys) => ys,
            None => {
                let y = Sym::cat(&parts.iter().collect::<Vec<_>>(), 0);
                drop(parts);
                drop(parts_vec);
                let ids = all_ids.expect("tracked").into_tensor(&[total], DType::U32);
                let zeros = xs.zeros_like();
                let r = if self.fused {
                    // `kernels::scatter_rows`: zeros, candle's index_add into the output, the
                    // zeros freed in the op.
                    let kernel = Kernel::ScatterRows { rows: t };
                    Sym::kernel(kernel, &[&y, &ids], &[t, h], y.dtype())
                } else {
                    zeros.index_add_tracked(&ids, &y, 0)
                };
                drop(zeros);
                r
            }
        };
        drop(weights);
        let ys = ys.reshape(&[b, s, h]);
        match &self.shared {
            None => ys,
            Some(shared) => {
                let y = shared.forward(x).sure();
                let y = match &self.shared_gate {
                    None => y,
                    Some(g) => {
                        let gate = sigmoid(&g.forward(x).sure());
                        y.broadcast_mul(&gate)
                    }
                };
                let r = ys.add(&y);
                drop((ys, y));
                r
            }
        }
    }

    pub(super) fn linears(&self) -> Vec<&Linear> {
        let mut v = vec![&self.router];
        for e in self.experts.iter().chain(&self.shared) {
            v.extend(e.projs());
        }
        v.extend(&self.shared_gate);
        v
    }

    pub(super) fn map(&self, f: &dyn Fn(&Linear) -> Linear) -> Self {
        let ledger = self.router.weight.ledger().clone();
        let layer_tag = ledger.tag();
        Moe {
            router: f(&self.router),
            experts: self
                .experts
                .iter()
                .enumerate()
                .map(|(slot, e)| {
                    // A mapped weight (mixed precision's cast) is its expert's, as in forward.
                    ledger.set_tag(layer_tag | (slot as u32 + 1) << 16);
                    let m = e.map_projs(&|p| Ok(f(p))).sure();
                    ledger.set_tag(layer_tag);
                    m
                })
                .collect(),
            expert_ids: self.expert_ids.clone(),
            shared: self
                .shared
                .as_ref()
                .map(|e| e.map_projs(&|p| Ok(f(p))).sure()),
            shared_gate: self.shared_gate.as_ref().map(f),
            shape: self.shape,
            fused: self.fused,
            routing: self.routing.clone(),
            worst: self.worst,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::formula::transformer::Shape;
    use crate::step::{OptimizerKind, Phase};
    use std::sync::Arc;

    /// A Mixtral-shaped slice: 8 experts of width 512, 2 per token, B 4 × S 32.
    fn shape(routing: Option<Vec<Vec<usize>>>) -> Shape {
        let text = r#"{"model_type": "mixtral", "hidden_act": "silu", "hidden_size": 64,
            "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64,
            "num_local_experts": 8, "num_experts_per_tok": 2}"#;
        let cfg = crate::model::hf_config::parse(text, "mixtral.json")
            .unwrap()
            .cfg;
        Shape {
            llama: cfg.llama,
            routing: routing.map(Arc::new),
            ..Shape::new(4, 32, 64, 4, 2, 128, 64)
        }
    }

    #[test]
    fn the_worst_routing_fills_k_experts_and_touches_every_other() {
        let m = MoeShape::plain(8, 2, true);
        let w = worst(13, m);
        assert_eq!(w.iter().sum::<usize>(), 26);
        assert_eq!(w, vec![13, 7, 1, 1, 1, 1, 1, 1]);
        // One token: only k experts can be chosen.
        assert_eq!(worst(1, m), vec![1, 1, 0, 0, 0, 0, 0, 0]);
    }

    /// In a training forward the worst routing keeps at least what balanced routing and a
    /// routing on k experts only keep (every expert balanced routing runs, the
    /// largest experts of the skewed one); in inference it peaks above balanced routing.
    #[test]
    fn the_worst_routing_bounds_the_others() {
        let t = 4 * 32;
        let worst_shape = Shape {
            worst_routing: true,
            ..shape(None)
        };
        let only_k = shape(Some(vec![vec![t, t, 0, 0, 0, 0, 0, 0]; 2]));
        for phase in [Phase::Forward, Phase::Inference] {
            let at = |s: Shape| s.predict(phase, OptimizerKind::Adamw, 1).peak_bytes;
            let w = at(worst_shape.clone());
            assert!(w >= at(shape(None)) && w >= at(only_k.clone()), "{phase:?}");
        }
        let at = |s: Shape| {
            s.predict(Phase::Inference, OptimizerKind::Adamw, 1)
                .peak_bytes
        };
        assert!(at(worst_shape) > at(shape(None)));
    }

    /// One expert per distinct count in inference gives what every expert gives, byte for
    /// byte, for balanced, worst and recorded routings, on the CPU and CUDA.
    #[test]
    fn inference_through_one_expert_per_count_is_exact() {
        for routing in [None, Some(vec![vec![9, 20, 20, 100, 20, 20, 47, 20]; 2])] {
            for worst in [false, true] {
                for cpu in [true, false] {
                    let mut s = shape(routing.clone());
                    s.worst_routing = worst;
                    s.cpu = cpu;
                    s.decode_tokens = 3;
                    let gemm = cpu.then_some(2);
                    let fast = super::super::replay_serving_full(&s, 240, gemm);
                    replay_every_expert(true);
                    let every = super::super::replay_serving_full(&s, 240, gemm);
                    replay_every_expert(false);
                    assert_eq!(fast, every, "routing {routing:?} worst {worst} cpu {cpu}");
                }
            }
        }
    }

    #[test]
    fn balanced_spreads_k_tokens_each() {
        let m = MoeShape::plain(8, 2, true);
        let b = balanced(13, m);
        assert_eq!(b.iter().sum::<usize>(), 26);
        assert_eq!(b, vec![4, 4, 3, 3, 3, 3, 3, 3]);
    }

    /// The routing a row records moves the prediction: every token on two experts peaks
    /// higher in inference (one expert's activations of all 128 tokens at once) than the
    /// balanced spread, and a routing of another token count falls back to balanced.
    #[test]
    fn the_recorded_routing_moves_the_prediction() {
        let t = 4 * 32;
        let skewed = vec![vec![t, t, 0, 0, 0, 0, 0, 0]; 2];
        let at = |s: Shape| {
            s.predict(Phase::Inference, OptimizerKind::Adamw, 1)
                .peak_bytes
        };
        let balanced = at(shape(None));
        let skewed_peak = at(shape(Some(skewed)));
        assert!(skewed_peak > balanced);
        // The worst case without a run: the first k experts as full as possible and every
        // other one a token; above the balanced and the skewed routing in inference.
        let worst_shape = Shape {
            worst_routing: true,
            ..shape(None)
        };
        assert!(at(worst_shape) >= skewed_peak);
        let other_count = vec![vec![1, 1, 0, 0, 0, 0, 0, 0]; 2];
        assert_eq!(at(shape(Some(other_count))), balanced);
    }
}
