//! The model's mixture of experts (`model::moe::Moe`) on symbolic tensors, routed as it is
//! told ([`Told`]: a row's recorded tokens per expert, the worst routing, or balanced) instead
//! of on the host, with the host bytes candle's routing holds charged to the ledger.

use crate::formula::symbolic::{DType, HostBytes, Sym};
use crate::model::moe::{MoeShape, Routing};

/// A routing the replay is told.
#[derive(Debug, Clone)]
pub(crate) struct Told {
    /// Each held expert's index among the model's `E` (all of them, or a compressed training
    /// replay's few: `compress`).
    pub(super) expert_ids: Vec<usize>,
    /// Tokens per expert as recorded for this layer, if any.
    pub(super) routing: Option<Vec<usize>>,
    /// Without a recorded routing: every token on the first `k` experts (the worst case).
    pub(super) worst: bool,
    /// The layer's place among the sparse layers (its recorded rows under expert
    /// parallelism: a checkpointed backward runs a layer's forward again).
    pub(super) sparse: usize,
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

impl Told {
    /// The tokens per expert of a forward over `tokens`: the recorded routing when it is of
    /// this many tokens, else the worst case when asked, else balanced.
    fn counts(&self, tokens: usize, shape: &MoeShape) -> Vec<usize> {
        match &self.routing {
            Some(r) if r.iter().sum::<usize>() == tokens * shape.top_k => r.clone(),
            _ if self.worst => worst(tokens, *shape),
            _ => balanced(tokens, *shape),
        }
    }
}

/// Host bytes of one expert's ids, and their count.
pub(super) type Ids = (HostBytes, usize);

impl Routing<Sym> for Told {
    type Ids = Ids;
    /// The parts' vector (8 B a part) and the `k·T` ids.
    type Combine = (HostBytes, HostBytes);
    /// The host copy of the probabilities, the 0/1 selection and each expert's token list (the
    /// last two become tensors without a copy: `Tensor::from_vec`); DeepSeek-V3's correction
    /// bias, `E` f32 on the host, while the routing is computed.
    fn route(&self, probs: &Sym, shape: &MoeShape) -> candle_core::Result<(Sym, Vec<Option<Ids>>)> {
        let (t, e) = (probs.dims()[0], probs.dims()[1]);
        let counts = self.counts(t, shape);
        let ledger = probs.ledger();
        let host = ledger.host(4 * t * e);
        let bias = shape.correction_bias.then(|| ledger.host(4 * e));
        let mask = ledger.host(4 * t * e);
        let ids = self
            .expert_ids
            .iter()
            .map(|&i| (counts[i] > 0).then(|| (ledger.host(4 * counts[i]), counts[i])))
            .collect();
        drop((host, bias));
        Ok((mask.into_tensor(&[t, e], DType::F32), ids))
    }
    fn expert(&self, slot: usize) -> usize {
        self.expert_ids[slot]
    }
    fn count(ids: &Ids) -> usize {
        ids.1
    }
    fn ids_tensor((host, n): Ids, _like: &Sym) -> candle_core::Result<Sym> {
        Ok(host.into_tensor(&[n], DType::U32))
    }
    fn combine(&self, like: &Sym, hit: usize, total: usize) -> (HostBytes, HostBytes) {
        let ledger = like.ledger();
        (ledger.host(8 * hit), ledger.host(4 * total))
    }
    fn extend(_combine: &mut (HostBytes, HostBytes), _ids: &Ids) {}
    fn combined_ids(
        (parts, ids): (HostBytes, HostBytes),
        total: usize,
        _like: &Sym,
    ) -> candle_core::Result<Sym> {
        drop(parts);
        Ok(ids.into_tensor(&[total], DType::U32))
    }
    fn one_per_count(&self) -> bool {
        !EVERY_EXPERT.with(|e| e.get())
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
