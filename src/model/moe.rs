//! A mixture-of-experts MLP (Mixtral, Qwen3-MoE): a router and `E` SwiGLU experts, computed as
//! the reference implementations do — each token goes to its `k` best experts, each expert runs
//! on the tokens gathered for it, and the results are added back — so memory depends on the
//! routing the case drew.
//!
//! Shapes (T = B·S tokens, H hidden, E experts, I an expert's width, k per token):
//! - router: `x (T, H) · Wᵀ` → logits `(T, E)`, softmax over E in f32 → probabilities `P`;
//! - top-k per token on the host (a copy of `P`, `4·T·E` bytes, freed at once), giving the
//!   tokens of each expert `top_x[e]` (`n_e` of them, `Σ n_e = k·T`) and a 0/1 selection
//!   `M (T, E)` f32;
//! - weights `R = P·M`, renormalised over the selected experts when `norm_topk`
//!   (`R / Σ_E R`), cast to the activations' type: differentiable, so the router learns;
//! - per expert with `n_e > 0`: `x_e = x[top_x[e]] (n_e, H)`, `y_e = down(silu(gate(x_e)) ·
//!   up(x_e)) (n_e, H)`, scaled by `R[top_x[e]] (n_e, E)`'s column `e`, added into the output with
//!   `index_add` (a fresh `(T, H)` each time, as candle's `index_add` is not in place).
//!
//! Parameters per layer: router `H·E` + `E·3·H·I`; per token `k·3·H·I` of them are active.
//! The routing of each layer's last forward is kept process-wide ([`routing_snapshot`]: tokens
//! per expert, by layer): the runner records it in each phase's row, and the replay predicts
//! from it.

use std::collections::BTreeMap;
use std::sync::Mutex;

use candle_core::{D, DType, Module, Result, Tensor};
use candle_nn::{Linear, VarBuilder, linear_no_bias, ops};
use serde::{Deserialize, Serialize};

use super::mlp::Mlp;
use super::transformer::{Config, ProjSpec};

/// What makes a LLaMA-family MLP a mixture of experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MoeShape {
    /// Routed experts `E` (`num_local_experts`, `num_experts`).
    pub experts: usize,
    /// Experts per token `k` (`num_experts_per_tok`).
    pub top_k: usize,
    /// Renormalise the `k` selected probabilities to sum to 1 (Mixtral always;
    /// `norm_topk_prob` in Qwen's configs).
    pub norm_topk: bool,
}

/// A mixture-of-experts MLP: router, experts (SwiGLU [`Mlp`]s), its layer.
#[derive(Debug, Clone)]
pub struct Moe {
    pub(crate) router: Linear,
    pub(crate) experts: Vec<Mlp>,
    pub(crate) shape: MoeShape,
    /// The block's index (where its routing is recorded).
    pub(crate) layer: usize,
}

/// Tokens per expert of each layer's last forward in this process (each case runs in a
/// process of its own).
static ROUTING: Mutex<BTreeMap<usize, Vec<usize>>> = Mutex::new(BTreeMap::new());

/// The routing of the last forward of every mixture-of-experts layer, in layer order: tokens
/// per expert. `None` when no such layer has run.
pub fn routing_snapshot() -> Option<Vec<Vec<usize>>> {
    let map = ROUTING.lock().unwrap_or_else(|e| e.into_inner());
    (!map.is_empty()).then(|| map.values().cloned().collect())
}

impl Moe {
    /// `projs` are one expert's gate, up, down.
    pub(crate) fn new(
        cfg: &Config,
        shape: MoeShape,
        layer: usize,
        projs: &[ProjSpec],
        vb: VarBuilder,
    ) -> Result<Self> {
        let router = linear_no_bias(cfg.hidden, shape.experts, vb.pp("router"))?;
        let experts = (0..shape.experts)
            .map(|e| Mlp::new(cfg, projs, vb.pp("experts").pp(e)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            router,
            experts,
            shape,
            layer,
        })
    }
}

/// A routing as a row stores it: tokens per expert, `,` between experts, `;` between layers.
pub fn format_routing(routing: &[Vec<usize>]) -> String {
    routing
        .iter()
        .map(|l| {
            l.iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// [`format_routing`]'s text back (`None` for an empty or malformed one: the formula then
/// assumes balanced routing).
pub fn parse_routing(text: &str) -> Option<Vec<Vec<usize>>> {
    if text.is_empty() {
        return None;
    }
    text.split(';')
        .map(|l| l.split(',').map(|n| n.parse().ok()).collect())
        .collect()
}

/// The `k` largest of `p` (ties to the lower index), as `torch.topk` picks them.
fn top_k(p: &[f32], k: usize, out: &mut Vec<usize>) {
    out.clear();
    for _ in 0..k {
        let best = (0..p.len())
            .filter(|i| !out.contains(i))
            .max_by(|&a, &b| p[a].total_cmp(&p[b]).then(b.cmp(&a)))
            .expect("k ≤ experts");
        out.push(best);
    }
}

/// Per expert, the tokens routed to it (ascending), each list exactly sized; and the 0/1
/// selection `(T·E)` row-major.
pub fn route(probs: &[f32], experts: usize, k: usize) -> (Vec<Vec<u32>>, Vec<f32>) {
    let tokens = probs.len() / experts;
    let mut chosen = Vec::with_capacity(k);
    let mut mask = vec![0f32; probs.len()];
    let mut counts = vec![0usize; experts];
    for t in 0..tokens {
        top_k(&probs[t * experts..(t + 1) * experts], k, &mut chosen);
        for &e in &chosen {
            mask[t * experts + e] = 1.0;
            counts[e] += 1;
        }
    }
    let mut top_x: Vec<Vec<u32>> = counts.iter().map(|&n| Vec::with_capacity(n)).collect();
    for t in 0..tokens {
        for (e, list) in top_x.iter_mut().enumerate() {
            if mask[t * experts + e] != 0.0 {
                list.push(t as u32);
            }
        }
    }
    (top_x, mask)
}

impl Module for Moe {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let (b, s, h) = x.dims3()?;
        let (t, e) = (b * s, self.shape.experts);
        let xs = x.reshape((t, h))?;
        let logits = self.router.forward(&xs)?;
        let probs = ops::softmax(&logits.to_dtype(DType::F32)?, D::Minus1)?;
        drop(logits);
        let (top_x, mask) = {
            let host = probs.flatten_all()?.to_vec1::<f32>()?;
            route(&host, e, self.shape.top_k)
        };
        let counts = top_x.iter().map(Vec::len).collect();
        ROUTING
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(self.layer, counts);
        let mask = Tensor::from_vec(mask, (t, e), x.device())?;
        let selected = probs.mul(&mask)?;
        drop((probs, mask));
        let weights = if self.shape.norm_topk {
            let sum = selected.sum_keepdim(1)?;
            selected.broadcast_div(&sum)?
        } else {
            selected
        }
        .to_dtype(x.dtype())?;
        let mut ys = xs.zeros_like()?;
        for (i, (expert, tokens)) in self.experts.iter().zip(top_x).enumerate() {
            if tokens.is_empty() {
                continue;
            }
            let n = tokens.len();
            let ids = Tensor::from_vec(tokens, n, x.device())?;
            let ye = expert.forward(&xs.index_select(&ids, 0)?)?;
            // The rows of the expert's tokens (contiguous, `(n_e, E)`), then its column.
            let we = weights.index_select(&ids, 0)?.narrow(1, i, 1)?;
            let ye = ye.broadcast_mul(&we)?;
            drop(we);
            ys = ys.index_add(&ids, &ye, 0)?;
        }
        ys.reshape((b, s, h))
    }
}
