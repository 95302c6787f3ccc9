//! The transformer of [`crate::model::transformer`] (GPT decoder, ViT encoder or the
//! LLaMA-family decoder of [`crate::model::llama`]) on [`Sym`] tensors: the backward and
//! inference predictions. For LLaMA the model follows `rms_norm_slow` (x², mean, `+ eps`,
//! sqrt, divide, scale), the composed rotary embedding (two halves, four broadcast products, a
//! sub, an add and a `cat` per rotated tensor, the tables narrowed at the cache offset),
//! `repeat_kv` (one `cat` of `heads/kv_heads` copies), SiLU with candle's backward (`neg`,
//! `exp`, `+ 1`, `recip`, `1 − node`, two products and a sum, all recorded), and SwiGLU's
//! product.
//!
//! The model is the model's own: `Norm`, `Proj`, `Mlp`, `Attention` (its core, rotary,
//! cache), `Mla`, the `Block` and the `Transformer` (stems, masks, head, loss, the cached
//! generation) are written once over [`crate::model::tensor_ops::TensorOps`] and run here on
//! [`Sym`], so what is alive when is candle's by construction: a temporary dies at the end of
//! its statement, a shadowed binding at the end of its scope, an operand passed by value when
//! the operator returns; the copies a step makes (mixed precision's cast, the detached
//! inference copy) are the model's `map_with`. The model is built by its own constructors
//! over a source of weights (`model::weights::Weights`); `model.rs` and `proj.rs` are the
//! replay's source, which holds each weight as the case does (variables, frozen bases, LoRA's
//! adapters, quantized bytes); `moe.rs` routes the model's mixture of experts as it is told (a
//! recorded, balanced or worst routing) and charges the host bytes candle's routing holds. No
//! layer is stated twice. The training step's forward and backward are the runner's own
//! (`phase::train`, generic over the backward); generation and the phases' windows on the
//! ledger are here.
//!
//! [`replay_training`], [`replay_serving`] and [`decode_step`] run a deep model through a few
//! layers of each run of identical layers (training: and a few experts of each run of experts
//! with the same token count) and extrapolate, exactly (`compress.rs`); the `_full` forms run
//! every layer, and the two agree byte for byte (tested). Every block (and expert) allocates
//! under its own ledger tag, so the ledger can record what each part reaches.
//!
//! Why replay rather than a closed form: candle's backward peak is where the most gradients and
//! backward temporaries overlap, and which point that is (the cross-entropy head, an attention
//! block's softmax, a GELU, the embeddings) moves with the shape. Replaying candle's own
//! algorithm on shapes gives that peak exactly; the closed forms in [`super::transformer`] give the
//! terms (weights, activations, gradients) and agree with the replay where both exist.

use std::rc::Rc;

use super::shape::Shape;
use super::symbolic::{DType, Ledger, Sym};
use crate::device::{ElemType, ServingWeights};
use crate::model::tensor_ops::Map;
use crate::model::transformer::{LoraBase, ProjSpec};
use crate::phase::{generate, train};

mod compress;
pub mod expert;
mod model;
mod moe;
mod proj;

use super::symbolic::Sure;
use proj::Linear;

pub(crate) use model::Transformer as ReplayModel;
use model::*;
pub use model::{KvCache, Masks};

/// Tokens per expert when `tokens` are routed over a mixture `m`: the worst routing (every
/// token on the same first `k` experts, each other expert a token where there are enough) or
/// balanced (`k·tokens/E` each).
pub fn moe_counts(tokens: usize, m: crate::model::moe::MoeShape, worst: bool) -> Vec<usize> {
    if worst {
        moe::worst(tokens, m)
    } else {
        moe::balanced(tokens, m)
    }
}

/// One layer of a (possibly compressed) model: its index in the full model and its tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot {
    pub(super) layer: usize,
    pub(super) tag: u32,
}

/// Replayed peaks of one case, in bytes above each window's baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replay {
    /// Training forward: its peak, and the graph it keeps for backward.
    pub forward_peak: u64,
    pub forward_retained: u64,
    /// `loss.backward()` peak above the graph.
    pub backward_peak: u64,
    /// What backward leaves after pruning the store to the parameters' gradients, minus what
    /// it used up (the checkpointed forward's kept tensors).
    pub backward_retained: i64,
    /// No-graph forward to the logits: peak and what stays (the logits).
    pub inference_peak: u64,
    pub inference_retained: u64,
    /// Prefill (the prompt into the key/value cache) and decode (T tokens), above their
    /// baselines; decode's retained is the cache growth (or the grown prefix without a cache).
    pub prefill_peak: u64,
    pub prefill_retained: u64,
    pub decode_peak: u64,
    pub decode_retained: i64,
}

/// The runner's prefill and decode windows (`phase::generate`): their peaks and what they keep.
fn generation(
    ledger: &Rc<Ledger>,
    model: &Transformer,
    tokens: &Sym,
    shape: &Shape,
) -> (u64, u64, u64, i64) {
    let mut cache = KvCache::default();
    let base = ledger.reset_peak();
    ledger.set_stage("prefill");
    let next = generate::prefill(model, tokens, &mut cache).sure();
    let prefill_peak = ledger.window_peak(base);
    let prefill_retained = ledger.current() - base;
    let base = ledger.reset_peak();
    ledger.set_stage("decode");
    let mut prefix = tokens.clone();
    let (n, kv) = (shape.decode_tokens as usize, shape.kv_cache);
    let next = generate::decode(model, next, &mut prefix, &mut cache, n, kv).sure();
    let decode_peak = ledger.window_peak(base);
    let decode_retained = ledger.current() as i64 - base as i64;
    ledger.set_stage("done");
    drop((cache, next, prefix));

    (prefill_peak, prefill_retained, decode_peak, decode_retained)
}

/// One decode step of the serving model over a key/value cache already holding `cached`
/// tokens per sequence (the case's batch): the serving weights' bytes (with metadata), the
/// cache's bytes, and the step's peak above them (the grown cache, the keys and values
/// repeated to the query heads for one layer at a time, the scores of one query).
pub fn decode_step(
    shape: &Shape,
    cached: usize,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> (u64, u64, u64) {
    decode_step_compressed(shape, cached, meta_per_tensor, gemm_threads)
        .unwrap_or_else(|| decode_step_full(shape, cached, meta_per_tensor, gemm_threads))
}

/// [`decode_step`] compressed ([`compressed`]).
fn decode_step_compressed(
    shape: &Shape,
    cached: usize,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> Option<(u64, u64, u64)> {
    compressed(
        shape,
        meta_per_tensor,
        gemm_threads,
        false,
        |l, slots, _| decode_step_on(l, shape, cached, slots),
    )
}

/// [`decode_step`] through every layer.
fn decode_step_full(
    shape: &Shape,
    cached: usize,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> (u64, u64, u64) {
    let ledger = Ledger::new(meta_per_tensor, gemm_threads);
    decode_step_on(&ledger, shape, cached, &all_layers(shape))
}

/// [`decode_step`] of the layers `slots` on `ledger`.
fn decode_step_on(
    ledger: &Rc<Ledger>,
    shape: &Shape,
    cached: usize,
    slots: &[Slot],
) -> (u64, u64, u64) {
    let model = Transformer::with_layers(ledger, shape, false, slots, None);
    let weights = ledger.current();
    let (g, d) = shape.kv_dims();
    // The cache is in the serving weights' (unquantized) type: the final norm's.
    let dtype = model.ln_f.weights()[0].dtype();
    let b = shape.b as usize;
    // Keys and values `(B, G, T, D)`; MLA: the latent `(B, 1, T, L)` and the shared rotary
    // key `(B, 1, T, r)`.
    let (kd, vd) = match shape.llama.and_then(|l| l.mla) {
        Some(m) => (
            [b, 1, cached, m.kv_lora_rank],
            [b, 1, cached, m.qk_rope_head_dim],
        ),
        None => (
            [b, g as usize, cached, d as usize],
            [b, g as usize, cached, d as usize],
        ),
    };
    // A sliding layer's cache holds the last W tokens.
    let layers = slots
        .iter()
        .map(|&Slot { layer, tag }| {
            ledger.set_tag(tag);
            // A linear layer (Qwen3-Next's Gated DeltaNet): its fixed state, the
            // convolution's last inputs `(B, K, C)` in the cache's type and the recurrent
            // state `(B, nv, dk, dv)` in f32 (transformers computes and keeps it so).
            if let Some(g) = shape.llama.and_then(|l| l.linear_at(layer)) {
                let conv = [b, g.conv_kernel, g.conv_dim()];
                let state = [b, g.value_heads, g.key_dim, g.value_dim];
                return Some((
                    Sym::new(ledger, &conv, dtype),
                    Sym::new(ledger, &state, DType::F32),
                ));
            }
            let t = shape
                .llama
                .and_then(|l| l.window_at(layer))
                .map_or(cached, |w| cached.min(w));
            let (mut kd, mut vd) = (kd, vd);
            kd[2] = t;
            vd[2] = t;
            Some((Sym::new(ledger, &kd, dtype), Sym::new(ledger, &vd, dtype)))
        })
        .collect();
    let mut cache = KvCache {
        layers,
        pos: cached,
    };
    ledger.set_tag(0);
    let token = Sym::new(ledger, &[shape.b as usize, 1], DType::U32);
    let cache_bytes = ledger.current() - weights;
    let base = ledger.reset_peak();
    let logits = model.forward_cached(&token, &mut cache).sure();
    let peak = ledger.window_peak(base);
    drop((logits, cache, token));
    (weights, cache_bytes, peak)
}

/// The runner's synthetic input and targets: tokens and next tokens `(B, S)`, or images
/// `(B, C, I, I)` f32 and classes `(B, 1)`.
fn inputs(ledger: &Rc<Ledger>, shape: &Shape) -> (Sym, Sym) {
    let (b, s) = (shape.b as usize, shape.s as usize);
    match shape.vision {
        None => (
            Sym::new(ledger, &[b, s], DType::U32),
            Sym::new(ledger, &[b, s], DType::U32),
        ),
        Some(v) => (
            Sym::new(ledger, &[b, v.channels, v.image, v.image], DType::F32),
            Sym::new(ledger, &[b, 1], DType::U32),
        ),
    }
}

/// The training forward and backward of one case, in bytes above each window's baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Training {
    pub forward_peak: u64,
    pub forward_retained: u64,
    pub backward_peak: u64,
    pub backward_retained: i64,
}

/// The serving model's windows: the inference forward, prefill and decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Serving {
    pub inference_peak: u64,
    pub inference_retained: u64,
    pub prefill_peak: u64,
    pub prefill_retained: u64,
    pub decode_peak: u64,
    pub decode_retained: i64,
}

/// Replays the training forward and backward, and the inference forward, of `shape`.
/// `meta_per_tensor` is the bookkeeping charged per live tensor.
pub fn replay(shape: &Shape, meta_per_tensor: u64, gemm_threads: Option<usize>) -> Replay {
    let t = replay_training(shape, meta_per_tensor, gemm_threads);
    let s = replay_serving(shape, meta_per_tensor, gemm_threads);
    Replay {
        forward_peak: t.forward_peak,
        forward_retained: t.forward_retained,
        backward_peak: t.backward_peak,
        backward_retained: t.backward_retained,
        inference_peak: s.inference_peak,
        inference_retained: s.inference_retained,
        prefill_peak: s.prefill_peak,
        prefill_retained: s.prefill_retained,
        decode_peak: s.decode_peak,
        decode_retained: s.decode_retained,
    }
}

/// The training forward and backward of `shape` (the forward, backward and train-step phases),
/// through a few layers of each long run of identical layers ([`compress`]); byte for byte
/// [`replay_training_full`].
pub fn replay_training(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> Training {
    training_compressed(shape, meta_per_tensor, gemm_threads)
        .unwrap_or_else(|| replay_training_full(shape, meta_per_tensor, gemm_threads))
}

/// A replay's figures in a fixed order, as [`compressed`] extrapolates them, and which of them
/// are window peaks: `(figure, window)`.
trait Figures: Sized {
    const PEAKS: &'static [(usize, usize)];
    fn to_vec(&self) -> Vec<i128>;
    fn from_vec(f: &[i128]) -> Self;
}

impl Figures for Training {
    const PEAKS: &'static [(usize, usize)] = &[(0, 0), (2, 1)];
    fn to_vec(&self) -> Vec<i128> {
        vec![
            self.forward_peak as i128,
            self.forward_retained as i128,
            self.backward_peak as i128,
            self.backward_retained as i128,
        ]
    }
    fn from_vec(f: &[i128]) -> Self {
        Training {
            forward_peak: f[0] as u64,
            forward_retained: f[1] as u64,
            backward_peak: f[2] as u64,
            backward_retained: f[3] as i64,
        }
    }
}

impl Figures for Serving {
    const PEAKS: &'static [(usize, usize)] = &[(0, 0), (2, 1), (4, 2)];
    fn to_vec(&self) -> Vec<i128> {
        vec![
            self.inference_peak as i128,
            self.inference_retained as i128,
            self.prefill_peak as i128,
            self.prefill_retained as i128,
            self.decode_peak as i128,
            self.decode_retained as i128,
        ]
    }
    fn from_vec(f: &[i128]) -> Self {
        Serving {
            inference_peak: f[0] as u64,
            inference_retained: f[1] as u64,
            prefill_peak: f[2] as u64,
            prefill_retained: f[3] as u64,
            decode_peak: f[4] as u64,
            decode_retained: f[5] as i64,
        }
    }
}

/// [`decode_step`]'s weights, cache and step peak (one window).
impl Figures for (u64, u64, u64) {
    const PEAKS: &'static [(usize, usize)] = &[(2, 0)];
    fn to_vec(&self) -> Vec<i128> {
        vec![self.0 as i128, self.1 as i128, self.2 as i128]
    }
    fn from_vec(f: &[i128]) -> Self {
        (f[0] as u64, f[1] as u64, f[2] as u64)
    }
}

/// `run` (a replay of the layers, and routed experts, it is given on a recording ledger) at
/// every corner of `shape`'s [`compress::Plan`], extrapolated to the real depth (`experts`:
/// compress the experts too). `None` when nothing is compressed or the corners disagree.
fn compressed<F: Figures>(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
    experts: bool,
    run: impl Fn(&Rc<Ledger>, &[Slot], Option<&[usize]>) -> F,
) -> Option<F> {
    let plan = compress::Plan::of(shape, experts)?;
    let corners: Vec<compress::Corner> = plan
        .corners()
        .map(|c| {
            let (slots, experts, parts) = plan.slots(c);
            let ledger = Ledger::new(meta_per_tensor, gemm_threads);
            ledger.record();
            let figures = run(&ledger, &slots, experts.as_deref()).to_vec();
            compress::Corner {
                figures,
                windows: ledger.recorded(),
                parts,
            }
        })
        .collect();
    compress::extrapolate(&plan, &corners, F::PEAKS).map(|f| F::from_vec(&f))
}

/// [`replay_training`] compressed ([`compressed`]).
fn training_compressed(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> Option<Training> {
    compressed(shape, meta_per_tensor, gemm_threads, true, |l, slots, e| {
        training_on(l, shape, slots, e, None)
    })
}

/// The training replay through every layer.
pub fn replay_training_full(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> Training {
    let ledger = Ledger::new(meta_per_tensor, gemm_threads);
    let slots = all_layers(shape);
    training_on(&ledger, shape, &slots, None, None)
}

/// The training replay of rank `rank` of `ranks` under expert parallelism (`ranks::expert`):
/// `shape`'s whole model holding the routed experts `rank·E/N..(rank+1)·E/N`, every mixture of
/// experts' forward replayed as the rank runs it ([`expert::ExpertParallel`]) on the rows
/// `layers` says each sparse layer moved, every layer replayed.
pub fn replay_training_ep(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
    rank: usize,
    ranks: usize,
    layers: Vec<expert::LayerRows>,
) -> Training {
    let e = shape.llama.and_then(|l| l.moe).map_or(0, |m| m.experts);
    let per = e / ranks;
    let held: Vec<usize> = (rank * per..(rank + 1) * per).collect();
    let parallel = Rc::new(expert::ExpertParallel::new(rank, ranks, layers));
    let ledger = Ledger::new(meta_per_tensor, gemm_threads);
    let slots = all_layers(shape);
    training_on(&ledger, shape, &slots, Some(&held), Some(parallel))
}

/// [`replay_training_ep`] recording every change of the live bytes, as [`trace_training`].
pub fn trace_training_ep(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
    ranks: usize,
    layers: Vec<expert::LayerRows>,
) -> (Training, Vec<crate::formula::symbolic::Event>) {
    let e = shape.llama.and_then(|l| l.moe).map_or(0, |m| m.experts);
    let held: Vec<usize> = (0..e / ranks).collect();
    let parallel = Rc::new(expert::ExpertParallel::new(0, ranks, layers));
    let ledger = Ledger::new(meta_per_tensor, gemm_threads);
    ledger.start_trace();
    let slots = all_layers(shape);
    let t = training_on(&ledger, shape, &slots, Some(&held), Some(parallel));
    (t, ledger.take_trace())
}

/// [`replay_training_full`] recording every change of the live bytes ([`Ledger::start_trace`]):
/// the stages `setup` (the model and the batch, before the window), `forward`, `backward` and
/// `done` (the gradients dropped).
pub fn trace_training(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> (Training, Vec<crate::formula::symbolic::Event>) {
    let ledger = Ledger::new(meta_per_tensor, gemm_threads);
    ledger.start_trace();
    let slots = all_layers(shape);
    let t = training_on(&ledger, shape, &slots, None, None);
    (t, ledger.take_trace())
}

/// A training driver of the caller's own on `shape`'s whole model (every layer, its weights
/// variables) and batch on a fresh ledger (`meta_per_tensor`, `gemm_threads` as
/// [`replay_training_full`]): `drive` gets the ledger, the model, its variables in the order
/// the model made them, the tokens and the targets, and returns what it measured on the
/// ledger (`ranks::fsdp`'s ZeRO 3 step, unit by unit).
pub(crate) fn with_training_model<R>(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
    drive: impl FnOnce(&Rc<Ledger>, &ReplayModel, &[Sym], &Sym, &Sym) -> R,
) -> R {
    let ledger = Ledger::new(meta_per_tensor, gemm_threads);
    ledger.set_stage("setup");
    let slots = all_layers(shape);
    let model = ReplayModel::with_layers(&ledger, shape, true, &slots, None);
    let (tokens, targets) = inputs(&ledger, shape);
    let vars = model.own.vars.clone();
    drive(&ledger, &model, &vars, &tokens, &targets)
}

/// Every layer of `shape`, tagged by its index + 1.
fn all_layers(shape: &Shape) -> Vec<Slot> {
    (0..shape.l as usize)
        .map(|layer| Slot {
            layer,
            tag: layer as u32 + 1,
        })
        .collect()
}

/// The training replay of the layers `slots` on `ledger`: the runner's forward and backward
/// windows (`phase::train`).
fn training_on(
    ledger: &Rc<Ledger>,
    shape: &Shape,
    slots: &[Slot],
    experts: Option<&[usize]>,
    parallel: Option<Rc<dyn crate::model::moe::MoeParallel<Sym, moe::Told>>>,
) -> Training {
    ledger.set_stage("setup");
    let model = Transformer::with_layers(ledger, shape, true, slots, experts);
    let model = match parallel {
        Some(p) => model.with_expert_parallel(p),
        None => model,
    };
    let (tokens, targets) = inputs(ledger, shape);
    let k = shape.checkpoint as usize;
    let backward = match shape.by_block {
        true => train::Backward::ByBlock,
        false => train::Backward::Whole,
    };
    let base = ledger.reset_peak();
    ledger.set_stage("forward");
    let half = |t: &Sym| Ok(t.to_dtype(DType::Half));
    let cast = shape.mixed.then_some(&half as &Map<'_, Sym>);
    let graph = train::forward(&model, cast, &tokens, &targets, k, backward).sure();
    let forward_peak = ledger.window_peak(base);
    let forward_retained = ledger.current() - base;
    let base = ledger.reset_peak();
    ledger.set_stage("backward");
    let mut graph = Some(graph);
    let grads = train::backward(&model, || &model.own.vars, &mut graph, &tokens, k).sure();
    let backward_peak = ledger.window_peak(base);
    let backward_retained = ledger.current() as i64 - base as i64;
    ledger.set_stage("done");
    drop((graph, grads));
    Training {
        forward_peak,
        forward_retained,
        backward_peak,
        backward_retained,
    }
}

/// The serving model of `shape`: its inference forward, then (a decoder) prefill and decode;
/// compressed as [`replay_training`] is, byte for byte [`replay_serving_full`].
pub fn replay_serving(shape: &Shape, meta_per_tensor: u64, gemm_threads: Option<usize>) -> Serving {
    serving_compressed(shape, meta_per_tensor, gemm_threads)
        .unwrap_or_else(|| replay_serving_full(shape, meta_per_tensor, gemm_threads))
}

/// [`replay_serving`] compressed ([`compressed`]).
fn serving_compressed(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> Option<Serving> {
    compressed(
        shape,
        meta_per_tensor,
        gemm_threads,
        false,
        |l, slots, _| serving_on(l, shape, slots, None, None),
    )
}

/// [`replay_serving_full`] recording every change of the live bytes ([`Ledger::start_trace`]):
/// the stages `setup` (the serving model and the prompt), `inference`, `between` (its logits
/// dropped), `prefill`, `decode` and `done`.
pub fn trace_serving(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> (Serving, Vec<crate::formula::symbolic::Event>) {
    let ledger = Ledger::new(meta_per_tensor, gemm_threads);
    ledger.start_trace();
    let s = serving_on(&ledger, shape, &all_layers(shape), None, None);
    (s, ledger.take_trace())
}

/// The serving replay through every layer.
pub fn replay_serving_full(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> Serving {
    let ledger = Ledger::new(meta_per_tensor, gemm_threads);
    serving_on(&ledger, shape, &all_layers(shape), None, None)
}

/// The serving replay of an expert-parallel rank as vLLM runs one: `shape`'s model (the whole
/// one with data-parallel attention at tp 1, or a rank of `tp`'s shard with its collectives:
/// its attention, dense layers, shared experts, table and head, its own sequences' cache)
/// holding the routed experts `held` (indices among `E`), every mixture of experts' forward on
/// the tokens of the `dp` replicas gathered ([`expert::Gathered`]: sequence-parallel over `tp`;
/// with one replica nothing is gathered), routed as `shape` asks (its `worst_routing`: every token of
/// every replica on the first `k` experts, which `held` holds when it starts at 0), compressed
/// as [`replay_serving`] is.
pub fn replay_serving_ep(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
    held: &[usize],
    tp: usize,
    dp: usize,
) -> Serving {
    let run = |l: &Rc<Ledger>, slots: &[Slot]| {
        let parallel = (dp > 1).then(|| {
            Rc::new(expert::Gathered { dp, tp }) as Rc<dyn crate::model::moe::MoeParallel<_, _>>
        });
        serving_on(l, shape, slots, Some(held), parallel)
    };
    compressed(
        shape,
        meta_per_tensor,
        gemm_threads,
        false,
        |l, slots, _| run(l, slots),
    )
    .unwrap_or_else(|| {
        run(
            &Ledger::new(meta_per_tensor, gemm_threads),
            &all_layers(shape),
        )
    })
}

/// The serving replay of the layers `slots` on `ledger` (a mixture of experts holding
/// `experts`, or all of them; its forward handed to `parallel` where given).
fn serving_on(
    ledger: &Rc<Ledger>,
    shape: &Shape,
    slots: &[Slot],
    experts: Option<&[usize]>,
    parallel: Option<Rc<dyn crate::model::moe::MoeParallel<Sym, moe::Told>>>,
) -> Serving {
    ledger.set_stage("setup");
    let model = Transformer::with_layers(ledger, shape, false, slots, experts);
    let model = match parallel {
        Some(p) => model.with_expert_parallel(p),
        None => model,
    };
    let (tokens, _) = inputs(ledger, shape);
    let base = ledger.reset_peak();
    ledger.set_stage("inference");
    let logits = model.forward(&tokens).sure();
    let inference_peak = ledger.window_peak(base);
    let inference_retained = ledger.current() - base;
    ledger.set_stage("between");
    drop(logits);
    // A ViT does not generate (the workload refuses prefill and decode).
    let (prefill_peak, prefill_retained, decode_peak, decode_retained) = match shape.vision {
        None => generation(ledger, &model, &tokens, shape),
        Some(_) => (0, 0, 0, 0),
    };
    Serving {
        inference_peak,
        inference_retained,
        prefill_peak,
        prefill_retained,
        decode_peak,
        decode_retained,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(b: u64, s: u64, h: u64, a: u64, l: u64, v: u64) -> Shape {
        Shape::new(b, s, h, a, l, v, s)
    }

    /// The replayed graph is the closed form's activation data, byte for byte, on shapes with
    /// one head, odd heads, odd sequence lengths and a position table longer than the sequence.
    #[test]
    fn replayed_graph_equals_the_closed_form() {
        let mut shapes = vec![
            shape(2, 77, 120, 5, 3, 1000),
            shape(1, 33, 96, 3, 2, 300),
            shape(3, 50, 48, 1, 2, 97),
            shape(1, 1, 8, 2, 1, 5),
        ];
        let mut long = shape(2, 10, 16, 2, 2, 30);
        long.s_max = 64;
        shapes.push(long);
        for s in shapes {
            let r = replay(&s, 0, None);
            assert_eq!(r.forward_retained, s.activation_data_bytes(), "{s:?}");
        }
    }

    /// The same for ViT shapes: odd heads, one head, batch 1 (no class-token copy), one
    /// channel.
    #[test]
    fn replayed_vit_graph_equals_the_closed_form() {
        use crate::model::vit::Vision;
        for (b, image, patch, channels, h, a, l, k) in [
            (3, 24, 6, 3, 60, 5, 3, 7),
            (1, 32, 8, 3, 96, 3, 2, 10),
            (2, 16, 4, 1, 32, 1, 2, 5),
        ] {
            let vis = Vision {
                image,
                patch,
                channels,
            };
            let s = vis.seq() as u64;
            let mut shape = Shape::new(b, s, h, a, l, k, s);
            shape.vision = Some(vis);
            let r = replay(&shape, 0, None);
            assert_eq!(
                r.forward_retained,
                shape.activation_data_bytes(),
                "{shape:?}"
            );
        }
    }

    /// Where the vocabulary dominates, the backward peak is the closed-form head point.
    #[test]
    fn head_point_matches_the_closed_form() {
        let s = shape(2, 64, 64, 2, 1, 8192);
        let r = replay(&s, 0, None);
        assert_eq!(r.backward_peak, s.backward_head_bytes());
    }

    /// After pruning, backward leaves exactly the parameters' gradients (4 bytes each).
    #[test]
    fn backward_leaves_the_gradients() {
        for s in [shape(2, 77, 120, 5, 3, 1000), shape(3, 50, 48, 1, 2, 97)] {
            let r = replay(&s, 0, None);
            assert_eq!(r.backward_retained, 4 * s.params() as i64, "{s:?}");
        }
    }

    /// The tiled attention's middle tiles stood in for (`Graph::skipped`) give what computing
    /// every tile gives, byte for byte: training and serving, causal and not, sequences of
    /// one tile, two, a partial last tile and many, CPU and CUDA.
    #[test]
    fn tiles_stood_in_for_are_exact() {
        use crate::formula::symbolic::replay_every_tile;
        use crate::model::tiled_attention::TILE;
        // Training and serving of `s` (tiled, 2 decode tokens), fast and computing every tile.
        let check = |mut s: Shape, cpu: bool, what: &str| {
            s.tiled = true;
            s.cpu = cpu;
            s.decode_tokens = 2;
            let gemm = cpu.then_some(2);
            let both = || {
                (
                    replay_training_full(&s, 240, gemm),
                    replay_serving_full(&s, 240, gemm),
                )
            };
            let fast = both();
            replay_every_tile(true);
            let every = both();
            replay_every_tile(false);
            assert_eq!(fast, every, "{what}, cpu {cpu}");
        };
        for s_len in [5, TILE, 2 * TILE + 3, 4 * TILE, 5 * TILE + 37] {
            for cpu in [true, false] {
                check(
                    shape(2, s_len as u64, 24, 3, 2, 50),
                    cpu,
                    &format!("S {s_len}"),
                );
            }
        }
        let mut vit = shape(2, 17, 24, 3, 2, 10);
        vit.vision = Some(crate::model::vit::Vision {
            image: 64,
            patch: 4,
            channels: 3,
        });
        vit.s = 257;
        vit.s_max = 257;
        vit.tiled = true;
        let fast = replay_training_full(&vit, 240, None);
        replay_every_tile(true);
        let every = replay_training_full(&vit, 240, None);
        replay_every_tile(false);
        assert_eq!(fast, every, "ViT (not causal)");
        // Sliding windows (the Mistral fixture: 4 query heads over 2 key heads), shorter and
        // longer than a tile: the tiles' key ranges grow, then slide; a tile across two heads'
        // rows reads every key (wider than the last full tile: computed, not stood in for).
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/mistral/config.json");
        let cfg = crate::model::hf_config::load(&path).unwrap().cfg;
        for window in [4, 100, 300] {
            for s_len in [TILE, 2 * TILE + 3, 5 * TILE + 37] {
                for cpu in [true, false] {
                    let mut s = Shape::new(2, s_len as u64, 32, 4, 2, 64, s_len as u64);
                    let mut llama = cfg.llama.unwrap();
                    llama.sliding_window = Some(window);
                    s.llama = Some(llama);
                    check(s, cpu, &format!("window {window}, S {s_len}"));
                }
            }
        }
    }

    /// Inference keeps only the logits.
    #[test]
    fn inference_keeps_the_logits() {
        let s = shape(2, 40, 64, 4, 2, 500);
        let r = replay(&s, 0, None);
        assert_eq!(r.inference_retained, 4 * 2 * 40 * 500);
        assert!(r.inference_peak > r.inference_retained);
    }

    /// An expert-parallel serving rank's replay ([`replay_serving_ep`]): compressed, byte for
    /// byte the replay of every layer; the tokens of more replicas gathered hold more (each
    /// gathered `(dp·T, H)` and the reduce-scatter's `(T, H)` fresh); holding fewer experts
    /// changes only their token lists (inference runs one expert at a time).
    #[test]
    fn expert_parallel_serving_compresses_exactly_and_gathers() {
        let text = r#"{"model_type": "mixtral", "hidden_act": "silu", "hidden_size": 64,
            "intermediate_size": 256, "num_hidden_layers": 8, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64,
            "num_local_experts": 8, "num_experts_per_tok": 2}"#;
        let cfg = crate::model::hf_config::parse(text, "mixtral.json")
            .unwrap()
            .cfg;
        let s = Shape {
            llama: cfg.llama,
            worst_routing: true,
            decode_tokens: 3,
            ..Shape::new(2, 16, 64, 4, 8, 128, 64)
        };
        // One replica gathers nothing (vLLM dispatches over dp > 1 only).
        let full = |held: &[usize], dp: usize| {
            let ledger = Ledger::new(240, Some(2));
            let p = (dp > 1).then(|| {
                Rc::new(expert::Gathered { dp, tp: 1 })
                    as Rc<dyn crate::model::moe::MoeParallel<_, _>>
            });
            serving_on(&ledger, &s, &all_layers(&s), Some(held), p)
        };
        let held = [0, 1, 2, 3];
        for dp in [1, 2, 4] {
            let compressed = serving_compressed_ep(&s, &held, dp);
            assert!(compressed.is_some(), "dp={dp}: nothing compressed");
            assert_eq!(compressed.unwrap(), full(&held, dp), "dp={dp}");
            assert_eq!(
                replay_serving_ep(&s, 240, Some(2), &held, 1, dp),
                full(&held, dp)
            );
        }
        // A tp=2 rank's shard in 2 replicas (the sequence-parallel mixture): compressed, every
        // layer's replay; its gather of 2·2 chunks of B·S/2 rows holds as many rows as the tp=1
        // rank's of 2 replicas, less its own half.
        let mut l = s.llama.unwrap();
        l.kv_heads = 1;
        let shard = Shape {
            a: 2,
            v: 64,
            llama: Some(l),
            tp_collectives: true,
            ..s.clone()
        };
        let sp = |l: &Rc<Ledger>, slots: &[Slot]| {
            let p: Rc<dyn crate::model::moe::MoeParallel<Sym, moe::Told>> =
                Rc::new(expert::Gathered { dp: 2, tp: 2 });
            serving_on(l, &shard, slots, Some(&held), Some(p))
        };
        let every = sp(&Ledger::new(240, Some(2)), &all_layers(&shard));
        assert_eq!(replay_serving_ep(&shard, 240, Some(2), &held, 2, 2), every);
        assert!(every.prefill_peak > 0 && every.decode_peak > 0);
        let (one, two) = (full(&held, 1), full(&held, 2));
        assert!(two.prefill_peak > one.prefill_peak);
        assert!(two.decode_peak > one.decode_peak);
        // The cache the prefill leaves is the rank's own sequences', whatever dp.
        assert_eq!(two.prefill_retained, one.prefill_retained);
        // Fewer experts held: no more (their token lists, 4 B a token on the host, are fewer).
        let fewer = full(&[0, 1], 2);
        assert!(fewer.prefill_peak <= two.prefill_peak && fewer.decode_peak <= two.decode_peak);
        assert!(two.prefill_peak - fewer.prefill_peak < 64);
    }

    /// DeepSeek-V2-Lite's layers (a dense first layer, 64 routed experts, 2 shared, MLA), as
    /// an expert-parallel serving rank holds them: compressed, byte for byte every layer's
    /// replay.
    #[test]
    fn expert_parallel_serving_of_deepseek_compresses_exactly() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/workloads/configs/deepseek-v2-lite.json"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let cfg = crate::model::hf_config::parse(&text, path).unwrap().cfg;
        let s = Shape {
            llama: cfg.llama,
            worst_routing: true,
            decode_tokens: 2,
            cpu: false,
            ..Shape::new(
                1,
                8,
                cfg.hidden as u64,
                cfg.heads as u64,
                cfg.layers as u64,
                cfg.vocab as u64,
                64,
            )
        };
        let held: Vec<usize> = (0..16).collect();
        let compressed = serving_compressed_ep(&s, &held, 4).expect("compressed");
        let ledger = Ledger::new(240, Some(2));
        let p: Rc<dyn crate::model::moe::MoeParallel<Sym, moe::Told>> =
            Rc::new(expert::Gathered { dp: 4, tp: 1 });
        let full = serving_on(&ledger, &s, &all_layers(&s), Some(&held), Some(p));
        assert_eq!(compressed, full);
    }

    fn serving_compressed_ep(shape: &Shape, held: &[usize], dp: usize) -> Option<Serving> {
        compressed(shape, 240, Some(2), false, |l, slots, _| {
            let p = (dp > 1).then(|| {
                Rc::new(expert::Gathered { dp, tp: 1 })
                    as Rc<dyn crate::model::moe::MoeParallel<_, _>>
            });
            serving_on(l, shape, slots, Some(held), p)
        })
    }
}
