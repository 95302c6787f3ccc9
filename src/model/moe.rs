//! A mixture-of-experts MLP (Mixtral, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3, gpt-oss: its router
//! with a bias, its experts with biases and the clamped SwiGLU of [`kernels::oss_glu`]): a
//! router and `E` SwiGLU experts, computed as the reference implementations do — each token goes to its `k`
//! best experts, each expert runs on the tokens gathered for it, and the results are added
//! back — so memory depends on the routing the case drew; optional shared experts on every
//! token; dense layers first or between sparse ones ([`MoeShape::sparse`]).
//!
//! Shapes (T = B·S tokens, H hidden, E experts, I an expert's width, k per token):
//! - router: `x (T, H) · Wᵀ` → logits `(T, E)` → scores `P` in f32: a softmax over E, or a
//!   sigmoid per expert (DeepSeek-V3), composed `1/(1 + exp(−x))`;
//! - top-k per token on the host (a copy of `P`, `4·T·E` bytes, freed at once; DeepSeek-V3's
//!   correction bias added for the choice only; group-limited routing picks the best groups
//!   first), giving the tokens of each expert `top_x[e]` (`n_e` of them, `Σ n_e = k·T`) and a
//!   0/1 selection `M (T, E)` f32;
//! - weights `R = P·M`, renormalised over the selected experts when `norm_topk` (`R / Σ_E R`;
//!   DeepSeek `R / (Σ_E R + 1e-20)`), times `routed_scaling_factor` when it is not 1, cast to
//!   the activations' type: differentiable, so the router learns;
//! - per expert with `n_e > 0`: `x_e = x[top_x[e]] (n_e, H)`, `y_e = down(silu(gate(x_e)) ·
//!   up(x_e)) (n_e, H)`, scaled by `R[top_x[e]] (n_e, E)`'s column `e`; in training (weights
//!   tracked) the scaled `y_e` are concatenated, `Y (k·T, H)`, and added into a `(T, H)` zeros
//!   by one `index_add` over all `k·T` token ids (`4·k·T` bytes, on the host first; with fused
//!   kernels one op, `kernels::scatter_rows`, whose node does not keep the zeros), so the
//!   graph keeps `Y` and the zeros — not a fresh `(T, H)` per expert, as adding expert by expert
//!   would keep (candle's `index_add` is not in place: `(experts hit + 1)·T·H` per sparse
//!   layer, 96 GiB of Qwen3-30B-A3B's graph at S 4096); in inference expert by expert into the
//!   output (nothing is kept; one `(n_e, H)` at a time);
//! - Llama 4 ([`MoeShape::input_scaled`]): the weight scales the expert's input instead,
//!   `y_e = expert(x_e · R[top_x[e]]_e)`;
//! - shared experts: one SwiGLU of width `shared` on every token, added last (Qwen2-MoE: times
//!   `sigmoid(x·g)`, `g (1, H)`).
//!
//! Parameters per sparse layer: router `H·E` + `E·3·H·I` + `3·H·I_shared` (+ `H` for the
//! shared gate); per token `k·3·H·I` of the routed ones are active. The routing of each
//! layer's forward in the last metered window is kept process-wide ([`routing_snapshot`]:
//! tokens per expert, by sparse layer; of a decode's several forwards, the most skewed): the
//! runner records it in each phase's row, and the replay predicts from it.
//! The router computes in the activations' type (transformers' DeepSeek casts to f32 first: the
//! same memory in f32, a little less here in 16 bits).

use std::collections::BTreeMap;
use std::sync::Mutex;

use candle_core::{Result, Tensor};

use super::config::{Config, ProjSpec};
use super::kernels::Kernel;
use super::mlp::Mlp;
use super::proj::Proj;
pub use super::shapes::{Factor, GroupLimit, MoeShape, Scoring};
use super::tensor_ops::{self, Map, TensorOps};
use super::weights::Weights;

/// A mixture-of-experts MLP over tensors `T`: router, experts (SwiGLU [`Mlp`]s), routed by `R`
/// (candle's [`HostRouting`] on the host from the router's scores; the replay's as it is told).
#[derive(Debug, Clone)]
pub struct Moe<T: TensorOps = Tensor, R = HostRouting> {
    /// candle-nn's linear (not fused), with gpt-oss's bias.
    pub(crate) router: Proj<T>,
    /// The routed experts this layer holds (all `E` of them, or a compressed replay's few:
    /// [`Routing::expert`] gives each one's index).
    pub(crate) experts: Vec<Mlp<T>>,
    /// Shared experts (one SwiGLU of width `shape.shared`) and Qwen2-MoE's gate on them.
    pub(crate) shared: Option<Mlp<T>>,
    pub(crate) shared_gate: Option<Proj<T>>,
    pub(crate) shape: MoeShape,
    /// Fused kernels: the training combine is one op ([`super::kernels::scatter_rows`]).
    pub(crate) fused: bool,
    pub(crate) routing: R,
    /// Expert parallelism: the forward that exchanges the routed rows with the experts' owners
    /// (`memfit ranks --ep`, [`crate::ranks::expert`]); none in a model that holds its experts.
    pub(crate) parallel: Option<std::rc::Rc<dyn MoeParallel<T, R>>>,
}

/// A mixture of experts' forward over ranks that each hold some of its experts (expert
/// parallelism): given the layer, it routes with [`Moe::routed`], exchanges the rows and
/// combines as it will; [`Moe::forward`] hands over to it when set.
pub trait MoeParallel<T: TensorOps, R>: std::fmt::Debug {
    fn forward(&self, moe: &Moe<T, R>, x: &T) -> Result<T>;
}

/// How a mixture of experts picks each token's experts, on the host: the interpreter's part of
/// [`Moe::forward`] (candle routes from the router's scores; the replay charges the same host
/// bytes for a routing it is given).
pub trait Routing<T: TensorOps> {
    /// One expert's token ids as the host holds them.
    type Ids;
    /// The training combine's host buffers: the parts' vector and every token id.
    type Combine;
    /// Routes the tokens scored `probs (T, E)` f32 (the host copy of the scores, DeepSeek-V3's
    /// correction bias, the choice): the 0/1 selection `(T, E)` f32 and, for each expert held,
    /// its token ids (`None`: no token).
    fn route(&self, probs: &T, shape: &MoeShape) -> Result<(T, Vec<Option<Self::Ids>>)>;
    /// The index among the `E` of held expert `slot`.
    fn expert(&self, slot: usize) -> usize;
    fn count(ids: &Self::Ids) -> usize;
    /// The ids as a u32 tensor on `like`'s device (no copy on the CPU).
    fn ids_tensor(ids: Self::Ids, like: &T) -> Result<T>;
    /// The training combine's buffers for `hit` experts' parts and `total` ids.
    fn combine(&self, like: &T, hit: usize, total: usize) -> Self::Combine;
    /// One expert's ids appended to the combine's.
    fn extend(combine: &mut Self::Combine, ids: &Self::Ids);
    /// Every id as a u32 tensor; the parts' vector freed.
    fn combined_ids(combine: Self::Combine, total: usize, like: &T) -> Result<T>;
    /// Inference runs one expert per distinct token count (an interpreter that only sizes:
    /// an expert leaves the memory where it found it less its ids, and its temporaries depend
    /// on its count only, so a repeated count peaks no higher and changes nothing after).
    fn one_per_count(&self) -> bool {
        false
    }
}

/// candle's routing: on the host from the router's scores, recorded per layer
/// ([`routing_snapshot`]).
#[derive(Debug, Clone, Copy)]
pub struct HostRouting {
    /// The block's index (where its routing is recorded).
    pub(crate) layer: usize,
}

/// Tokens per expert of each layer, with the window that drew them, in this process (each case
/// runs in a process of its own): of a window's forwards (decode runs one per token), the one
/// whose largest expert got the most tokens.
static ROUTING: Mutex<BTreeMap<usize, (u64, Vec<usize>)>> = Mutex::new(BTreeMap::new());

/// The metered window under way ([`routing_window`]).
static WINDOW: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A metered window opens: the routings its forwards draw replace the earlier ones (a window
/// without a forward, the backward, keeps its forward's).
pub fn routing_window() {
    WINDOW.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// Records layer `layer`'s routing `counts`: the first of this window, or one whose largest
/// expert got more tokens than the recorded one's (the temporaries and products of an expert
/// grow with its tokens, so the window peaked no lower than with it).
fn record_routing(layer: usize, counts: Vec<usize>) {
    let window = WINDOW.load(std::sync::atomic::Ordering::Relaxed);
    let mut map = ROUTING.lock().unwrap_or_else(|e| e.into_inner());
    record_in(&mut map, window, layer, counts);
}

/// [`record_routing`] into `map` during `window`.
fn record_in(
    map: &mut BTreeMap<usize, (u64, Vec<usize>)>,
    window: u64,
    layer: usize,
    counts: Vec<usize>,
) {
    let most = |c: &[usize]| c.iter().copied().max().unwrap_or(0);
    match map.get(&layer) {
        Some((w, old)) if *w == window && most(old) >= most(&counts) => {}
        _ => {
            map.insert(layer, (window, counts));
        }
    }
}

/// The routing of every mixture-of-experts layer, in layer order: tokens per expert, of the
/// last window's forward (of several, the most skewed: [`record_routing`]). `None` when no
/// such layer has run.
pub fn routing_snapshot() -> Option<Vec<Vec<usize>>> {
    let map = ROUTING.lock().unwrap_or_else(|e| e.into_inner());
    (!map.is_empty()).then(|| map.values().map(|(_, c)| c.clone()).collect())
}

impl Moe {
    /// The projections of every expert (routed, then shared), for LoRA.
    pub(crate) fn projs_mut(&mut self) -> Vec<&mut Proj> {
        self.experts
            .iter_mut()
            .chain(self.shared.iter_mut())
            .flat_map(|e| e.projs_mut())
            .collect()
    }
}

impl<T: TensorOps, R> Moe<T, R> {
    /// `expert` are one routed expert's gate, up, down; `shared` the shared experts'; the
    /// routed experts those `w` holds, routed as it says.
    pub(crate) fn new<W: Weights<Tensor = T, Routing = R>>(
        cfg: &Config,
        shape: MoeShape,
        layer: usize,
        expert: &[ProjSpec],
        shared: &[ProjSpec],
        w: &W,
    ) -> Result<Self> {
        // gpt-oss's router has a bias.
        let router_bias = cfg.llama.is_some_and(|l| l.variant.router_bias);
        let router = w
            .pp("router")
            .linear(cfg.hidden, shape.experts, router_bias)?;
        let ids = w.experts(shape.experts);
        let experts = ids
            .iter()
            .map(|e| Mlp::new(cfg, expert, &w.pp("experts").pp(&e.to_string())))
            .collect::<Result<Vec<_>>>()?;
        let shared_mlp = match shape.shared {
            0 => None,
            _ => Some(Mlp::new(cfg, shared, &w.pp("shared"))?),
        };
        let shared_gate = match shape.shared > 0 && shape.shared_gate {
            true => Some(w.pp("shared_gate").linear(cfg.hidden, 1, false)?),
            false => None,
        };
        Ok(Self {
            router,
            experts,
            shared: shared_mlp,
            shared_gate,
            shape,
            fused: cfg.kernels.fused(),
            routing: w.routing(cfg, layer, &ids),
            parallel: None,
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

/// The `k` largest of `p` among the allowed (ties to the lower index), as `torch.topk` picks
/// them.
fn top_k(p: &[f32], k: usize, allowed: impl Fn(usize) -> bool, out: &mut Vec<usize>) {
    out.clear();
    for _ in 0..k {
        let best = (0..p.len())
            .filter(|&i| allowed(i) && !out.contains(&i))
            .max_by(|&a, &b| p[a].total_cmp(&p[b]).then(b.cmp(&a)))
            .expect("k ≤ allowed experts");
        out.push(best);
    }
}

/// Per expert, the tokens routed to it (ascending), each list exactly sized; and the 0/1
/// selection `(T·E)` row-major. `scores` are the router's (softmax or sigmoid) `(T·E)`; the
/// choice adds `bias` (DeepSeek-V3's correction) and, with `group`, keeps to each token's best
/// groups.
pub fn route(scores: &[f32], shape: &MoeShape, bias: Option<&[f32]>) -> (Vec<Vec<u32>>, Vec<f32>) {
    let (experts, k) = (shape.experts, shape.top_k);
    let tokens = scores.len() / experts;
    let mut chosen = Vec::with_capacity(k);
    let mut groups = Vec::new();
    let mut choice = vec![0f32; experts];
    let mut mask = vec![0f32; scores.len()];
    let mut counts = vec![0usize; experts];
    for t in 0..tokens {
        let row = &scores[t * experts..(t + 1) * experts];
        for (e, c) in choice.iter_mut().enumerate() {
            *c = row[e] + bias.map_or(0.0, |b| b[e]);
        }
        match shape.group {
            None => top_k(&choice, k, |_| true, &mut chosen),
            Some(g) => {
                let per = experts / g.groups;
                let group_score: Vec<f32> = (0..g.groups)
                    .map(|i| {
                        let mut s: Vec<f32> = choice[i * per..(i + 1) * per].to_vec();
                        s.sort_by(|a, b| b.total_cmp(a));
                        if g.top2_sum {
                            s.iter().take(2).sum()
                        } else {
                            s[0]
                        }
                    })
                    .collect();
                top_k(&group_score, g.top_groups, |_| true, &mut groups);
                top_k(&choice, k, |e| groups.contains(&(e / per)), &mut chosen);
            }
        }
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

/// The router's scores in f32 `(T, E)`: softmax, or the sigmoid composed from ops with a
/// backward (`neg`, `exp`, `+ 1`, `recip`).
pub(crate) fn scores<T: TensorOps>(logits: &T, scoring: Scoring) -> Result<T> {
    let l = logits.to_f32()?;
    match scoring {
        Scoring::Softmax => tensor_ops::softmax_last(&l),
        Scoring::Sigmoid => sigmoid(&l),
    }
}

/// `1 / (1 + exp(−x))` from ops with a backward, each intermediate freed once the next exists.
pub(crate) fn sigmoid<T: TensorOps>(x: &T) -> Result<T> {
    let e = x.neg()?.exp()?;
    let p = e.affine(1.0, 1.0)?;
    drop(e);
    p.recip()
}

impl Routing<Tensor> for HostRouting {
    type Ids = Vec<u32>;
    /// The parts' vector is the forward's own; the ids gathered here.
    type Combine = Vec<u32>;
    fn route(&self, probs: &Tensor, shape: &MoeShape) -> Result<(Tensor, Vec<Option<Vec<u32>>>)> {
        let (t, e) = probs.dims2()?;
        let (top_x, mask) = {
            let host = probs.flatten_all()?.to_vec1::<f32>()?;
            // DeepSeek-V3's correction bias: zero until trained, as transformers makes it.
            let bias = shape.correction_bias.then(|| vec![0f32; e]);
            route(&host, shape, bias.as_deref())
        };
        record_routing(self.layer, top_x.iter().map(Vec::len).collect());
        let mask = Tensor::from_vec(mask, (t, e), probs.device())?;
        let ids = top_x
            .into_iter()
            .map(|ids| (!ids.is_empty()).then_some(ids))
            .collect();
        Ok((mask, ids))
    }
    fn expert(&self, slot: usize) -> usize {
        slot
    }
    fn count(ids: &Vec<u32>) -> usize {
        ids.len()
    }
    fn ids_tensor(ids: Vec<u32>, like: &Tensor) -> Result<Tensor> {
        let n = ids.len();
        Tensor::from_vec(ids, n, like.device())
    }
    fn combine(&self, _like: &Tensor, _hit: usize, total: usize) -> Vec<u32> {
        Vec::with_capacity(total)
    }
    fn extend(combine: &mut Vec<u32>, ids: &Vec<u32>) {
        combine.extend_from_slice(ids);
    }
    fn combined_ids(combine: Vec<u32>, total: usize, like: &Tensor) -> Result<Tensor> {
        Tensor::from_vec(combine, total, like.device())
    }
}

impl<T: TensorOps, R: Routing<T> + Clone> Moe<T, R> {
    /// A copy with `base` applied to the weights and biases and `adapter` to LoRA's A and B;
    /// each expert's copies in its segment, as its forward.
    pub(crate) fn map(&self, base: &Map<'_, T>, adapter: &Map<'_, T>) -> Result<Self> {
        let w = &self.router.weight;
        let layer_tag = w.segment();
        let router = self.router.map(base, adapter)?;
        let experts = self
            .experts
            .iter()
            .enumerate()
            .map(|(slot, e)| {
                w.set_segment(layer_tag | (slot as u32 + 1) << 16);
                let m = e.map(base, adapter);
                w.set_segment(layer_tag);
                m
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Moe {
            router,
            experts,
            shared: self
                .shared
                .as_ref()
                .map(|e| e.map(base, adapter))
                .transpose()?,
            shared_gate: self
                .shared_gate
                .as_ref()
                .map(|g| g.map(base, adapter))
                .transpose()?,
            shape: self.shape,
            fused: self.fused,
            routing: self.routing.clone(),
            parallel: self.parallel.clone(),
        })
    }
}

impl<T: TensorOps, R: Routing<T>> Moe<T, R> {
    /// The routing of the tokens `xs (T, H)`: the weights `R (T, E)` in the activations' type
    /// (differentiable) and each expert's token ids (`None`: no token), as the module doc says.
    pub(crate) fn routed(&self, xs: &T, x: &T) -> Result<(T, Vec<Option<R::Ids>>)> {
        self.routed_by(&self.routing, xs, x)
    }

    /// [`Moe::routed`] with the choice made by `routing` (an expert-parallel replay routes the
    /// rank's tokens over every expert, though it holds a few).
    pub(crate) fn routed_by(&self, routing: &R, xs: &T, x: &T) -> Result<(T, Vec<Option<R::Ids>>)> {
        let logits = self.router.forward(xs)?;
        let probs = scores(&logits, self.shape.scoring)?;
        drop(logits);
        let (mask, ids) = routing.route(&probs, &self.shape)?;
        let selected = probs.mul(&mask)?;
        drop((probs, mask));
        let weights = match (self.shape.norm_topk, self.shape.group) {
            (false, _) => selected,
            // Mixtral, Qwen: `w / Σ w`.
            (true, None) if self.shape.scoring == Scoring::Softmax => {
                let sum = selected.sum_last_keepdim()?;
                selected.broadcast_div(&sum)?
            }
            // DeepSeek: `w / (Σ w + 1e-20)`.
            (true, _) => {
                let sum = selected.sum_last_keepdim()?.affine(1.0, 1e-20)?;
                selected.broadcast_div(&sum)?
            }
        };
        let weights = if self.shape.routed_scale.0 != 1.0 {
            let scaled = weights.affine(self.shape.routed_scale.0, 0.0)?;
            drop(weights);
            scaled
        } else {
            weights
        }
        .to_dtype_of(x)?;
        Ok((weights, ids))
    }

    /// `y (T, H)` of the routed experts as `x (B, S, H)`, with the shared experts added.
    pub(crate) fn finish(&self, x: &T, ys: T) -> Result<T> {
        let d = x.dims();
        let ys = ys.reshape(&[d[0], d[1], d[2]])?;
        // Shared experts on every token, added after the routed ones (Qwen2-MoE: gated by
        // `sigmoid(x·g)`).
        match &self.shared {
            None => Ok(ys),
            Some(shared) => {
                let y = shared.forward(x)?;
                let y = match &self.shared_gate {
                    None => y,
                    Some(g) => {
                        let gate = sigmoid(&g.forward(x)?)?;
                        y.broadcast_mul(&gate)?
                    }
                };
                let sum = tensor_ops::add_into(&ys, y)?;
                drop(ys);
                Ok(sum)
            }
        }
    }

    /// Expert parallelism's owner side and return trip, over either tensors (candle's on ranks,
    /// the replay's predicting them): this rank's experts, holding columns `first..` of the
    /// routing weights, each on its `received` rows of `x_recv` (in order, scaled by their rows
    /// of `w_recv`; `ids(start, n)` makes the `n` row ids from `start`), their outputs sent home
    /// by `home`, added into `(T, H)` at `ids_all` (every token's rows in expert order), the
    /// shared experts last. What each step releases is what the rank's op holds no more.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn expert_parallel_tail(
        &self,
        x: &T,
        xs: T,
        [x_recv, w_recv]: [T; 2],
        received: impl IntoIterator<Item = usize>,
        first: usize,
        ids: impl Fn(usize, usize) -> Result<T>,
        home: impl FnOnce(&T) -> Result<T>,
        ids_all: T,
    ) -> Result<T> {
        let d = xs.dims();
        let (t, h) = (d[0], d[1]);
        let mut parts = Vec::with_capacity(self.experts.len());
        let mut at = 0;
        for (j, (expert, n)) in self.experts.iter().zip(received).enumerate() {
            if n == 0 {
                continue;
            }
            let rows = ids(at, n)?;
            at += n;
            let we = w_recv.index_select(&rows, 0)?.narrow(1, first + j, 1)?;
            let xe = x_recv.index_select(&rows, 0)?;
            parts.push(expert.forward_scaled(xe, &we)?);
        }
        let y = if parts.is_empty() {
            // No rows came: an empty `Y` on the exchanges' path, so that the backward still
            // meets this rank's exchanges.
            x_recv
                .affine(0.0, 0.0)?
                .broadcast_add(&w_recv.sum_last_keepdim()?.affine(0.0, 0.0)?)?
        } else {
            let y = T::cat_owned(&parts, 0)?;
            if parts.len() > 1 {
                for p in &parts {
                    p.release_if(self.fused)?;
                }
            }
            y
        };
        drop(parts);
        // The rows received: their gathers' backward reads none of them.
        x_recv.release_if(true)?;
        w_recv.release_if(true)?;
        drop((x_recv, w_recv));
        let back = home(&y)?;
        y.release_if(true)?;
        drop(y);
        let ys = if self.fused {
            T::kernel(Kernel::ScatterRows { rows: t }, &[&back, &ids_all])?
        } else {
            xs.zeros(&[t, h])?.index_add(&ids_all, &back, 0)?
        };
        drop((back, ids_all));
        let out = self.finish(x, ys);
        drop(xs);
        out
    }

    pub fn forward(&self, x: &T) -> Result<T> {
        if let Some(p) = &self.parallel {
            return p.forward(self, x);
        }
        self.forward_held(x)
    }

    /// The forward over the experts this layer holds, whatever [`Self::parallel`] says: every
    /// token of `x` routed, each held expert on its tokens (an expert-parallel serving rank's
    /// experts on the tokens gathered from every rank: `formula::replay::expert::Gathered`).
    pub(crate) fn forward_held(&self, x: &T) -> Result<T> {
        let d = x.dims();
        let (b, s, h) = (d[0], d[1], d[2]);
        let t = b * s;
        let xs = x.reshape(&[t, h])?;
        let (weights, ids) = self.routed(&xs, x)?;
        // Training (the weights tracked): the experts' scaled outputs are concatenated and added
        // into the output by one `index_add`, so the graph keeps one `(k·T, H)` tensor and one
        // `(T, H)` zeros, not a fresh `(T, H)` per expert (candle's `index_add` is not in place).
        // Inference: expert by expert into the output (nothing kept, one `(n_e, H)` at a time).
        // The sums are the same in both, in the same order (each token's experts ascending).
        let tracked = weights.tracked();
        let total: usize = ids.iter().flatten().map(R::count).sum();
        let hit = ids.iter().flatten().count();
        let (mut parts, mut combine) = if tracked {
            (
                Vec::with_capacity(hit),
                Some(self.routing.combine(x, hit, total)),
            )
        } else {
            (Vec::new(), None)
        };
        let mut ys = if tracked {
            None
        } else {
            Some(xs.zeros(&[t, h])?)
        };
        let one_per_count = !tracked && self.routing.one_per_count();
        let mut counts_run: Vec<usize> = Vec::new();
        // Each expert's work is its own segment (the layer's, plus its slot above 2¹⁶).
        let layer_tag = x.segment();
        for (slot, (expert, ids)) in self.experts.iter().zip(ids).enumerate() {
            let Some(ids) = ids else {
                continue;
            };
            let n = R::count(&ids);
            if one_per_count {
                if counts_run.contains(&n) {
                    continue;
                }
                counts_run.push(n);
            }
            x.set_segment(layer_tag | (slot as u32 + 1) << 16);
            if let Some(c) = combine.as_mut() {
                R::extend(c, &ids);
            }
            let ids = R::ids_tensor(ids, x)?;
            // The rows of the expert's tokens (contiguous, `(n_e, E)`), then its column; the
            // expert's output scaled by it (with fused kernels in its down projection's op).
            let we = weights
                .index_select(&ids, 0)?
                .narrow(1, self.routing.expert(slot), 1)?;
            let xe = xs.index_select(&ids, 0)?;
            let ye = if self.shape.input_scaled {
                // Llama 4: the weight scales the expert's input.
                let scaled = xe.broadcast_mul(&we)?;
                drop(xe);
                let y = expert.forward(&scaled)?;
                drop(scaled);
                y
            } else {
                expert.forward_scaled(xe, &we)?
            };
            drop(we);
            // Under autocast the routing weights are f32 (x's type) and the expert 16-bit:
            // PyTorch's scaled output is promoted to f32 and added into f32 rows (transformers'
            // `final_hidden_states`, in the hidden states' type), so the scaled rows are
            // widened here (the 16-bit product, which no backward reads, released).
            let ye = if ye.same_type(&weights) {
                ye
            } else {
                let wide = ye.to_dtype_of(&weights)?;
                ye.release_if(true)?;
                wide
            };
            match ys.take() {
                Some(acc) => ys = Some(acc.index_add(&ids, &ye, 0)?),
                None => parts.push(ye),
            }
        }
        x.set_segment(layer_tag);
        let ys = match ys {
            Some(ys) => ys,
            None => {
                // One part is returned as it is by `cat` (no copy). Several are copied, and the
                // parts, which `cat`'s node holds and no backward reads, are released (fused:
                // the scatter's node keeps the one `(k·T, H)`, as `index_add_` keeps its source).
                let y = T::cat_owned(&parts, 0)?;
                if parts.len() > 1 {
                    for p in &parts {
                        p.release_if(self.fused)?;
                    }
                }
                drop(parts);
                let ids = R::combined_ids(combine.expect("tracked"), total, x)?;
                if self.fused {
                    T::kernel(Kernel::ScatterRows { rows: t }, &[&y, &ids])?
                } else {
                    xs.zeros(&[t, h])?.index_add(&ids, &y, 0)?
                }
            }
        };
        drop(weights);
        // xs lives as long as before the split (its bookkeeping freed after the shared
        // experts).
        let y = self.finish(x, ys);
        drop(xs);
        y
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A window's first routing replaces an earlier window's; within a window only a more
    /// skewed one (a larger largest expert) replaces it.
    #[test]
    fn a_window_keeps_its_most_skewed_routing() {
        let mut map = BTreeMap::new();
        record_in(&mut map, 1, 0, vec![8, 0, 0, 0]);
        record_in(&mut map, 2, 0, vec![1, 1, 1, 1]);
        assert_eq!(map[&0].1, vec![1, 1, 1, 1], "a new window replaces");
        record_in(&mut map, 2, 0, vec![2, 1, 0, 1]);
        assert_eq!(map[&0].1, vec![2, 1, 0, 1], "more skewed replaces");
        record_in(&mut map, 2, 0, vec![1, 1, 1, 1]);
        record_in(&mut map, 2, 0, vec![0, 2, 1, 1]);
        assert_eq!(map[&0].1, vec![2, 1, 0, 1], "as or less skewed does not");
    }
}
