//! The transformer memfit measures: a GPT-style decoder (token + position embedding, `L`
//! pre-LayerNorm blocks of multi-head causal self-attention and a 4H GELU MLP, a final
//! LayerNorm, an untied LM head and cross-entropy), or with `Config::vision` the ViT encoder of
//! [`super::vit`] (patch embedding and class token in front, the same blocks without the mask,
//! a classifier on the class token), or with `Config::llama` the LLaMA-family decoder of
//! [`super::llama`] (RMSNorm, rotary positions, grouped-query attention, SwiGLU, optionally a
//! tied head). Everything below the embedding is shared.
//!
//! Shapes (B batch, S sequence, H hidden, A heads, D = H/A, V vocab):
//! tokens `(B, S)` u32 → embeddings `(B, S, H)` → blocks `(B, S, H)` → logits `(B, S, V)`;
//! attention scores `(B, A, S, S)`.
//!
//! Parameter count (exact): `P = 2·V·H + S_max·H + L·(12·H² + 13·H) + 2·H`
//! (token and head matrices `V·H` each, position table `S_max·H`, per block two LayerNorms `4H`,
//! q/k/v/o `4(H² + H)`, MLP `8H² + 5H`; final LayerNorm `2H`).
//!
//! Only ops with a backward are used. With `Config::kernels` composed: candle 0.11.1's
//! `ops::layer_norm_slow` (not `LayerNorm::forward`, which has none), the composed
//! `ops::softmax` (not `softmax_last_dim`) with an additive causal mask, and
//! `loss::cross_entropy`. With fused: memfit's single ops of [`super::kernels`] (norms,
//! attention probabilities with the causal mask inside, GELU, SiLU·mul, cross-entropy), each
//! with its own backward, and no mask tensor. The same code runs with `Var`s (training: every
//! op is recorded) or with detached weights (`Transformer::detached`, inference: no graph).
//!
//! The layers live in their own files, assembled here: [`super::config`] (`Config`, presets,
//! the block's projections), [`super::norm`], [`super::proj`] (projections, LoRA),
//! [`super::attention`], [`super::mlp`], with the fused kernels in [`super::kernels`]; their
//! types are re-exported from this module.
//!
//! ```no_run
//! use candle_core::{DType, Device, Tensor};
//! use candle_nn::{VarBuilder, VarMap};
//! use memfit::model::transformer::{Config, Transformer};
//! let cfg = Config::tiny();
//! let varmap = VarMap::new();
//! let vb = VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu);
//! let model = Transformer::new(&cfg, vb).unwrap();
//! let tokens = Tensor::zeros((2, 16), DType::U32, &Device::Cpu).unwrap();
//! let logits = model.forward(&tokens).unwrap(); // (2, 16, cfg.vocab)
//! ```

use candle_core::{DType, Device, Result, Tensor};
use candle_nn::{Init, VarBuilder};

use super::kernels::{Kernel, Kernels};
use super::shapes::RopeScaling;
use super::tensor_ops::{self, Map, TensorOps};
use super::vit::{self};
use super::weights::Weights;

pub use super::attention::{Attention, Rotary};
pub use super::config::{
    BlockTensor, Config, LayerLayout, MlpLayout, PRESETS, ProjSpec, block_projections,
};
pub use super::gated_delta::GatedDeltaNet;
pub use super::mla::Mla;
pub use super::mlp::Mlp;
pub use super::moe::Moe;
use super::moe::{HostRouting, Routing};
pub use super::norm::Norm;
pub use super::proj::{Lora, LoraBase, LoraTarget, Proj};

/// A block's feed-forward part: a dense MLP ([`Mlp`]) or a mixture of experts ([`Moe`]),
/// routed by `R` (candle's on the host from the router's values; the replay's as a recorded,
/// balanced or worst routing says).
#[derive(Debug, Clone)]
pub enum Ffn<T: TensorOps = Tensor, R = HostRouting> {
    Dense(Mlp<T>),
    Moe(Box<Moe<T, R>>),
}

impl<T: TensorOps, R> Ffn<T, R> {
    /// The feed-forward part of block `layer` as its layout says.
    fn for_block<W: Weights<Tensor = T, Routing = R>>(
        cfg: &Config,
        layer: usize,
        layout: &MlpLayout,
        w: &W,
    ) -> Result<Self> {
        Ok(match layout {
            MlpLayout::Moe {
                shape,
                expert,
                shared,
            } => Ffn::Moe(Box::new(Moe::new(cfg, *shape, layer, expert, shared, w)?)),
            MlpLayout::Dense(projs) => Ffn::Dense(Mlp::new(cfg, projs, w)?),
        })
    }
}

impl Ffn {
    fn projs_mut(&mut self) -> Vec<&mut Proj> {
        match self {
            Ffn::Dense(m) => m.projs_mut(),
            Ffn::Moe(m) => m.projs_mut(),
        }
    }
}

impl<T: TensorOps, R: Routing<T> + Clone> Ffn<T, R> {
    fn map(&self, base: &Map<'_, T>, adapter: &Map<'_, T>) -> Result<Self> {
        Ok(match self {
            Ffn::Dense(m) => Ffn::Dense(m.map(base, adapter)?),
            Ffn::Moe(m) => Ffn::Moe(Box::new(m.map(base, adapter)?)),
        })
    }

    /// A projection reading the input (every one is of its type).
    fn input_proj(&self) -> &Proj<T> {
        match self {
            Ffn::Dense(m) => m.input_proj(),
            Ffn::Moe(m) => &m.router,
        }
    }

    /// `ffn(x)`, no residual (Gemma's norm comes between), x freed once used.
    pub(crate) fn forward_owned(&self, x: T) -> Result<T> {
        let y = match self {
            Ffn::Dense(m) => m.forward(&x)?,
            Ffn::Moe(m) => m.forward(&x)?,
        };
        drop(x);
        Ok(y)
    }

    /// `residual + ffn(x)`, x freed before the sum (a dense MLP: [`Mlp::forward_add`]).
    pub(crate) fn forward_add(&self, x: T, residual: &T) -> Result<T> {
        match self {
            Ffn::Dense(m) => m.forward_add(x, residual),
            Ffn::Moe(m) => {
                let y = m.forward(&x)?;
                drop(x);
                add_owned(residual, y)
            }
        }
    }
}

/// `a + b` with b passed by value (candle's `&a + b`): b freed once the sum exists (in the
/// wider type: [`tensor_ops::add_into`]).
fn add_owned<T: TensorOps>(a: &T, b: T) -> Result<T> {
    tensor_ops::add_into(a, b)
}

/// A block's attention: q, k, v, o ([`Attention`]) or multi-head latent attention
/// ([`Mla`]).
#[derive(Debug, Clone)]
pub enum SelfAttention<T: TensorOps = Tensor> {
    Mha(Attention<T>),
    Mla(Mla<T>),
    /// Qwen3-Next's linear attention ([`GatedDeltaNet`]); its cache pair is its fixed state.
    Linear(Box<GatedDeltaNet<T>>),
}

impl<T: TensorOps> SelfAttention<T> {
    /// A projection reading the input (every one is of its type).
    fn input_proj(&self) -> &Proj<T> {
        match self {
            SelfAttention::Mha(a) => &a.q,
            SelfAttention::Mla(a) => &a.kv_a,
            SelfAttention::Linear(a) => &a.qkvz,
        }
    }

    /// `residual + attn(x)`: the heads, then the output projection into the residual
    /// ([`Proj::forward_add`]); x freed before the sum.
    fn forward_add(
        &self,
        x: T,
        residual: &T,
        mask: Option<&T>,
        rotary: Option<Rotary<T>>,
    ) -> Result<T> {
        let (y, o) = match self {
            SelfAttention::Mha(a) => (a.heads(&x, mask, rotary)?, &a.o),
            SelfAttention::Mla(a) => (a.heads(&x, mask, rotary)?, &a.o),
            SelfAttention::Linear(a) => (a.heads(&x, None)?, &a.out),
        };
        o.forward_add(y, x, residual)
    }

    /// The heads and the output projection, no residual (Gemma's norm comes between): `x`
    /// freed once the heads exist, the heads once projected.
    fn forward_owned(
        &self,
        x: T,
        mask: Option<&T>,
        rotary: Option<Rotary<T>>,
        cache: Option<&mut Option<(T, T)>>,
    ) -> Result<T> {
        let (heads, o) = match (self, cache) {
            (SelfAttention::Mha(a), None) => (a.heads(&x, mask, rotary)?, &a.o),
            (SelfAttention::Mla(a), None) => (a.heads(&x, mask, rotary)?, &a.o),
            (SelfAttention::Mha(a), Some(c)) => (a.heads_cached(&x, mask, rotary, c)?, &a.o),
            (SelfAttention::Mla(a), Some(c)) => (a.heads_cached(&x, mask, rotary, c)?, &a.o),
            (SelfAttention::Linear(a), c) => (a.heads(&x, c)?, &a.out),
        };
        drop(x);
        let y = o.forward(&heads)?;
        drop(heads);
        Ok(y)
    }

    /// [`SelfAttention::forward_add`] with the key/value cache.
    fn forward_cached_add(
        &self,
        x: T,
        residual: &T,
        mask: Option<&T>,
        rotary: Option<Rotary<T>>,
        cache: &mut Option<(T, T)>,
    ) -> Result<T> {
        let (y, o) = match self {
            SelfAttention::Mha(a) => (a.heads_cached(&x, mask, rotary, cache)?, &a.o),
            SelfAttention::Mla(a) => (a.heads_cached(&x, mask, rotary, cache)?, &a.o),
            SelfAttention::Linear(a) => (a.heads(&x, Some(cache))?, &a.out),
        };
        o.forward_add(y, x, residual)
    }
}

/// Tensor parallelism's conjugate collectives around a pre-norm block's two sublayers
/// (Megatron-LM's `f` and `g`), for a block whose column-parallel projections (q, k, v; gate,
/// up) and row-parallel ones (o; down) hold one rank's shard: `enter` is `f` on the sublayer's
/// input (identity forward, the gradient all-reduced in the backward), `reduce_add` is `g` on
/// the row-parallel projection's partial output (all-reduced forward, identity backward) and
/// the residual sum after it. `memfit ranks --tp` sets them ([`Transformer::with_collectives`];
/// `crate::ranks::tensor`); a block without them is the whole model's. The pre-norm forward
/// ([`Block::forward`]) and the cached generation ([`Block::forward_cached`]: serving a shard)
/// run them; Gemma's sandwich blocks do not (`ranks --tp` refuses sandwich norms).
pub trait Collectives<T>: std::fmt::Debug {
    /// `f(x)`: the sublayer's projections read the result; x (the norm's output) may be
    /// released.
    fn enter(&self, x: T) -> Result<T>;
    /// `residual + g(y)`: y (the partial sum of this rank's heads or MLP columns) summed over
    /// the ranks, then added to the residual stream.
    fn reduce_add(&self, y: T, residual: &T) -> Result<T>;
}

/// Megatron's vocab-parallel embedding, head and loss on a tensor-parallel rank (`memfit ranks
/// --tp`; [`Transformer::with_vocab_parallel`]): the rank holds its run of `V/tp` rows of the
/// token table and of the head (the table itself when tied), so its logits are its run of
/// the vocabulary's columns. Written once over the tensor trait in
/// [`crate::model::tensor_parallel`].
pub trait VocabParallel<T>: std::fmt::Debug {
    /// The embedding of `tokens (B, S)` u32: this rank's rows looked up (zeros for the tokens
    /// another rank holds), summed over the group (`g`).
    fn embed(&self, table: &T, tokens: &T) -> Result<T>;
    /// `f` on the final norm's output, before the column-parallel head (the norm's output may
    /// be released).
    fn enter(&self, x: T) -> Result<T>;
    /// Serving: this rank's logits `(…, V/tp)` of the last positions gathered from every rank
    /// into the whole vocabulary's `(…, V)`, for sampling.
    fn gather(&self, logits: T) -> Result<T>;
    /// The mean cross-entropy over the whole vocabulary from this rank's logits `(B, S,
    /// V/tp)` against `targets (B, S)` u32, equal on every rank.
    fn loss(&self, logits: &T, targets: &T) -> Result<T>;
}

/// Pre-norm block: `x + attn(ln1(x))`, then `x + mlp(ln2(x))`; Gemma's ("sandwich"):
/// `x + ln1_post(attn(ln1(x)))`, then `x + ln2_post(mlp(ln2(x)))`.
#[derive(Debug, Clone)]
pub struct Block<T: TensorOps = Tensor, R = HostRouting> {
    /// The norms before the attention and the MLP (none in OLMo 2, whose norms come after).
    pub(crate) ln1: Option<Norm<T>>,
    pub(crate) attn: SelfAttention<T>,
    pub(crate) ln2: Option<Norm<T>>,
    pub(crate) mlp: Ffn<T, R>,
    /// Gemma's norms after the attention (`ln1_post`) and after the MLP (`ln2_post`).
    pub(crate) post: Option<(Norm<T>, Norm<T>)>,
    /// Its attention slides (takes the windowed mask and, in a Gemma, the local tables).
    pub(crate) windowed: bool,
    /// Its queries and keys are not rotated (SmolLM3's NoPE layers).
    pub(crate) nope: bool,
    /// Its segment of the replay's ledger (`formula::replay::compress`): what it allocates,
    /// forward and backward; candle's blocks carry their index.
    pub(crate) tag: u32,
    /// Tensor parallelism's `f` and `g` ([`Collectives`]): none in a whole model.
    pub(crate) tp: Option<std::rc::Rc<dyn Collectives<T>>>,
}

impl<T: TensorOps, R> Block<T, R> {
    /// Block `layer` of the model ([`super::config::layer_layout`]) in segment `tag`; its
    /// tensors are made in [`super::config::block_tensors`]' order.
    pub fn new<W: Weights<Tensor = T, Routing = R>>(
        cfg: &Config,
        layer: usize,
        tag: u32,
        w: &W,
    ) -> Result<Self> {
        let lay = cfg.layer_layout(layer);
        let variant = cfg.llama.map(|l| l.variant).unwrap_or_default();
        let post_only = variant.post_norms_only;
        let gemma = variant.sandwich_norms || post_only;
        let pre = |name: &str| {
            (!post_only)
                .then(|| Norm::new(cfg, &w.pp(name)))
                .transpose()
        };
        let ln1 = pre("ln1")?;
        let linear = cfg.llama.and_then(|l| l.linear_at(layer));
        let attn = match cfg.llama.and_then(|l| l.mla) {
            _ if linear.is_some() => SelfAttention::Linear(Box::new(GatedDeltaNet::new(
                cfg,
                linear.expect("a linear layer"),
                &lay.attn,
                &w.pp("attn"),
            )?)),
            Some(m) => SelfAttention::Mla(Mla::new(cfg, layer, m, &lay.attn, &w.pp("attn"))?),
            None => SelfAttention::Mha(Attention::new(cfg, layer, &lay.attn, &w.pp("attn"))?),
        };
        let ln1_post = gemma
            .then(|| Norm::new(cfg, &w.pp("ln1_post")))
            .transpose()?;
        let ln2 = pre("ln2")?;
        let mlp = Ffn::for_block(cfg, layer, &lay.mlp, &w.pp("mlp"))?;
        let post = match ln1_post {
            Some(a) => Some((a, Norm::new(cfg, &w.pp("ln2_post"))?)),
            None => None,
        };
        Ok(Self {
            ln1,
            attn,
            ln2,
            mlp,
            post,
            windowed: cfg.llama.and_then(|l| l.window_at(layer)).is_some(),
            nope: cfg.llama.is_some_and(|l| l.nope_at(layer)),
            tag,
            tp: None,
        })
    }
}

impl<T: TensorOps, R: Routing<T> + Clone> Block<T, R> {
    /// A copy with `base` on the weights, `norm` on the norms' and `adapter` on LoRA's A and B.
    fn map(&self, base: &Map<'_, T>, adapter: &Map<'_, T>, norm: &Map<'_, T>) -> Result<Self> {
        let attn = match &self.attn {
            SelfAttention::Mha(a) => SelfAttention::Mha(a.map(base, adapter, norm)?),
            SelfAttention::Mla(a) => SelfAttention::Mla(a.map(base, adapter, norm)?),
            SelfAttention::Linear(a) => {
                SelfAttention::Linear(Box::new(a.map(base, adapter, norm)?))
            }
        };
        let ln1 = self.ln1.as_ref().map(|n| n.map(norm)).transpose()?;
        let ln1_post = self.post.as_ref().map(|p| p.0.map(norm)).transpose()?;
        let ln2 = self.ln2.as_ref().map(|n| n.map(norm)).transpose()?;
        let mlp = self.mlp.map(base, adapter)?;
        let post = match (ln1_post, &self.post) {
            (Some(a), Some((_, b))) => Some((a, b.map(norm)?)),
            _ => None,
        };
        Ok(Block {
            ln1,
            attn,
            ln2,
            mlp,
            post,
            windowed: self.windowed,
            nope: self.nope,
            tag: self.tag,
            tp: self.tp.clone(),
        })
    }

    pub fn forward(&self, x: &T, mask: Option<&T>, rotary: Option<Rotary<T>>) -> Result<T> {
        if let Some(post) = &self.post {
            return self.sandwich(x, post, mask, rotary, None);
        }
        let (a, cast) = sublayer_input(&self.ln1, x, self.attn.input_proj())?;
        let h = match &self.tp {
            None => self.attn.forward_add(a, x, mask, rotary)?,
            Some(tp) => {
                let y = self.attn.forward_owned(tp.enter(a)?, mask, rotary, None)?;
                tp.reduce_add(y, x)?
            }
        };
        release_cast(cast)?;
        release_residual(&self.ln1, x)?;
        let (m, cast) = sublayer_input(&self.ln2, &h, self.mlp.input_proj())?;
        let y = match &self.tp {
            None => self.mlp.forward_add(m, &h)?,
            Some(tp) => tp.reduce_add(self.mlp.forward_owned(tp.enter(m)?)?, &h)?,
        };
        release_cast(cast)?;
        release_residual(&self.ln2, &h)?;
        Ok(y)
    }

    /// Gemma's block: each half's output normalised before its residual sum; each
    /// intermediate freed as soon as the next exists.
    fn sandwich(
        &self,
        x: &T,
        (ln1_post, ln2_post): &(Norm<T>, Norm<T>),
        mask: Option<&T>,
        rotary: Option<Rotary<T>>,
        cache: Option<&mut Option<(T, T)>>,
    ) -> Result<T> {
        let (a, cast) = sublayer_input(&self.ln1, x, self.attn.input_proj())?;
        let y = self.attn.forward_owned(a, mask, rotary, cache)?;
        // (After the sum: without a norm before the half (OLMo 2) the input is x itself.)
        let h = post_add(x, y, ln1_post)?;
        release_cast(cast)?;
        release_residual(&self.ln1, x)?;
        let (m, cast) = sublayer_input(&self.ln2, &h, self.mlp.input_proj())?;
        let y = self.mlp.forward_owned(m)?;
        let out = post_add(&h, y, ln2_post)?;
        release_cast(cast)?;
        release_residual(&self.ln2, &h)?;
        Ok(out)
    }

    /// [`Block::forward`] with the attention's key/value cache.
    pub fn forward_cached(
        &self,
        x: &T,
        mask: Option<&T>,
        rotary: Option<Rotary<T>>,
        cache: &mut Option<(T, T)>,
    ) -> Result<T> {
        if let Some(post) = &self.post {
            return self.sandwich(x, post, mask, rotary, Some(cache));
        }
        let Some(tp) = &self.tp else {
            let x = self
                .attn
                .forward_cached_add(pre(&self.ln1, x)?, x, mask, rotary, cache)?;
            return self.mlp.forward_add(pre(&self.ln2, &x)?, &x);
        };
        // A tensor-parallel rank's shard (serving: `ranks --tp --phases prefill,decode`): its
        // heads into its part of the cache, each sublayer's partial output summed by `g`.
        let y =
            self.attn
                .forward_owned(tp.enter(pre(&self.ln1, x)?)?, mask, rotary, Some(cache))?;
        let h = tp.reduce_add(y, x)?;
        let y = self.mlp.forward_owned(tp.enter(pre(&self.ln2, &h)?)?)?;
        tp.reduce_add(y, &h)
    }
}

/// `x + norm(y)` (a sandwich or post-norm block's half), y and the norm's output freed once
/// used. With the norm as transformers runs it and the graph recorded, neither is kept: the
/// sum's backward reads neither, and the norm holds a 16-bit y's f32 copy instead of y.
fn post_add<T: TensorOps>(x: &T, y: T, norm: &Norm<T>) -> Result<T> {
    let n = norm.forward(&y)?;
    y.release_if(norm.holds_f32_copy(&y))?;
    drop(y);
    let sum = tensor_ops::add_promoted(x, &n)?;
    n.release_if(norm.torch() || !n.same_type(&sum))?;
    drop(n);
    Ok(sum)
}

/// A residual stream tensor, once both its uses (its norm, its sum) are done, released when
/// its norm holds its f32 copy and the graph is recorded: no backward reads it (the sums'
/// don't, the norm's reads the copy), and transformers keeps only the copy.
fn release_residual<T: TensorOps>(norm: &Option<Norm<T>>, x: &T) -> Result<()> {
    x.release_if(norm.as_ref().is_some_and(|n| n.holds_f32_copy(x)))
}

/// A sublayer's input, `norm(x)` (or x: [`pre`]), and, where the graph is recorded and the
/// sublayer's projections (of `proj`'s type) each cast it (autocast: an f32 input, 16-bit
/// projections), the same tensor to release once the sublayer has run: no backward reads it
/// (a cast's reads none of its input; the residual sum's neither; an f32 norm input is
/// itself its f32 copy, which the norm reads, so x is never this input where a norm comes
/// first), and PyTorch keeps only the projections' casts.
fn sublayer_input<T: TensorOps>(
    norm: &Option<Norm<T>>,
    x: &T,
    proj: &Proj<T>,
) -> Result<(T, Option<T>)> {
    let h = pre(norm, x)?;
    let cast = (h.tracked() && proj.casts(&h)).then(|| h.clone());
    Ok((h, cast))
}

/// Releases [`sublayer_input`]'s cast input.
fn release_cast<T: TensorOps>(cast: Option<T>) -> Result<()> {
    match cast {
        Some(h) => h.release(),
        None => Ok(()),
    }
}

/// `norm(x)`, or (no norm before this half: OLMo 2) `x` itself.
fn pre<T: TensorOps>(norm: &Option<Norm<T>>, x: &T) -> Result<T> {
    match norm {
        Some(n) => n.forward(x),
        None => Ok(x.clone()),
    }
}

impl Block {
    /// The block's projections in model order.
    fn projs_mut(&mut self) -> Vec<&mut Proj> {
        let mut v: Vec<&mut Proj> = match &mut self.attn {
            SelfAttention::Mha(a) => a.projs_mut(),
            SelfAttention::Mla(a) => a.projs_mut(),
            SelfAttention::Linear(a) => vec![&mut a.qkvz, &mut a.out],
        };
        v.extend(self.mlp.projs_mut());
        v
    }
}

/// A decoder's additive attention masks (composed kernels): the causal one for full layers,
/// the windowed one for sliding layers; each only when some layer needs it.
#[derive(Debug, Clone)]
pub struct Masks<T = Tensor> {
    pub full: Option<T>,
    pub sliding: Option<T>,
}

impl<T> Default for Masks<T> {
    fn default() -> Self {
        Self {
            full: None,
            sliding: None,
        }
    }
}

impl<T> Masks<T> {
    /// The mask of a layer that slides (`windowed`) or not.
    pub fn at(&self, windowed: bool) -> Option<&T> {
        if windowed {
            self.sliding.as_ref()
        } else {
            self.full.as_ref()
        }
    }
}

/// The key/value cache of a decoder: per block, keys and values `(B, G, T, D)` (G = A outside
/// LLaMA).
#[derive(Debug)]
pub struct KvCache<T = Tensor> {
    pub layers: Vec<Option<(T, T)>>,
    /// Tokens seen so far (a sliding window's cache keeps only the last W of them).
    pub pos: usize,
}

impl<T> Default for KvCache<T> {
    fn default() -> Self {
        Self {
            layers: Vec::new(),
            pos: 0,
        }
    }
}

impl<T> KvCache<T> {
    /// Tokens seen (the next token's position).
    pub fn len(&self) -> usize {
        self.pos
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What turns the input into the blocks' `(B, S, H)`.
#[derive(Debug, Clone)]
pub(crate) enum Stem<T: TensorOps = Tensor> {
    /// GPT: the token embedding table `wte (V, H)`.
    Tokens(T),
    /// ViT: patch projection (`patch`, not fused) and class token (`cls`, `(1, 1, H)`).
    Patches { proj: Proj<T>, cls: T, patch: usize },
}

/// What the forward reads of the configuration, the same for every interpreter.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Form {
    pub(crate) kernels: Kernels,
    /// The longest input the position tables allow: checked where candle runs (the replay
    /// sizes any length).
    pub(crate) max_seq: Option<usize>,
    /// Gemma's embedding scale `√H` (candle's affine rounds it to the weights' type, as
    /// transformers' `embed_scale.to(dtype)`).
    pub(crate) embed_scale: Option<f64>,
    /// The sliding layers' window.
    pub(crate) sliding_window: Option<usize>,
    /// The window is a chunk (Llama 4): the windowed layers' mask is the chunked one.
    pub(crate) chunked: bool,
    /// Its attention adds the mask tensor whatever the kernels: the standard attention composed
    /// (gpt-oss's sinks, Gemma 2's capped scores: [`super::shapes::Llama::standard_attention_only`]).
    pub(crate) composed_attention: bool,
    /// Gemma 2's soft-capping of the logits ([`tensor_ops::soft_cap`]).
    pub(crate) final_softcap: Option<f64>,
    /// The head is the token table.
    pub(crate) tied: bool,
}

impl Form {
    pub(crate) fn of(cfg: &Config) -> Self {
        Form {
            kernels: cfg.kernels,
            max_seq: Some(cfg.max_seq),
            embed_scale: cfg
                .llama
                .filter(|l| l.variant.embed_scaled)
                .map(|_| (cfg.hidden as f64).sqrt()),
            sliding_window: cfg.llama.and_then(|l| l.sliding_window),
            chunked: cfg.llama.is_some_and(|l| l.variant.chunked_attention),
            composed_attention: cfg
                .llama
                .is_some_and(|l| l.standard_attention_only().is_some()),
            final_softcap: cfg.llama.and_then(|l| l.variant.final_softcap).map(|f| f.0),
            tied: cfg.tied,
        }
    }
}

/// The whole model, decoder or encoder, over one interpreter's tensors `T` (candle's, which
/// run; the replay's, which are predicted) with its experts' routing `R`; `C` is what the
/// interpreter keeps beside (candle: the [`Config`]; the replay: its variables).
#[derive(Debug, Clone)]
pub struct Transformer<T: TensorOps = Tensor, R = HostRouting, C = Config> {
    pub(crate) stem: Stem<T>,
    /// Position embeddings `(S_max, H)` (GPT, ViT).
    pub(crate) wpe: Option<T>,
    /// Rotary tables cos and sin `(S_max, D/2)` (LLaMA).
    pub(crate) rope: Option<(T, T)>,
    /// Gemma's sliding layers' own tables (their base, no scaling), when a layer slides.
    pub(crate) rope_local: Option<(T, T)>,
    pub(crate) blocks: Vec<Block<T, R>>,
    pub(crate) ln_f: Norm<T>,
    /// The LM head or classifier (fused with fused kernels; the token table when tied).
    pub(crate) head: Proj<T>,
    /// The vocab-parallel embedding, head and loss of a tensor-parallel rank
    /// ([`VocabParallel`]): none in a whole model.
    pub(crate) vocab: Option<std::rc::Rc<dyn VocabParallel<T>>>,
    pub(crate) form: Form,
    pub(crate) own: C,
}

impl<T: TensorOps, R: Routing<T> + Clone, C: Clone> Transformer<T, R, C> {
    /// A copy of the model whose weights are detached views of the same storage: running it
    /// records no graph (inference) and allocates nothing for the weights.
    pub fn detached(&self) -> Self {
        let f = |t: &T| Ok(t.detach());
        self.map_with(&f, &f, self.own.clone())
            .expect("detach cannot fail")
    }
}

impl<T: TensorOps, R, C> Transformer<T, R, C> {
    /// The model of `cfg` with its weights from `w`, with the blocks `layers` (each its index
    /// in the model and its segment, in order: all of them, or a compressed replay's few) and
    /// `own` beside.
    pub fn build<W: Weights<Tensor = T, Routing = R>>(
        cfg: &Config,
        w: &W,
        layers: &[(usize, u32)],
        own: C,
    ) -> Result<Self> {
        // The rotary tables first: their f32 originals are freed before the weights exist.
        let rope = match cfg.llama {
            None => None,
            Some(l) => {
                let width = l.rotary_width();
                Some(w.rotary(cfg, width, cfg.rope_theta, cfg.rope_scaling.as_ref())?)
            }
        };
        let rope_local = match cfg.llama {
            Some(l) if l.local_rope(cfg.layers) => {
                let theta = l.variant.local_rope_theta.expect("a local base");
                Some(w.rotary(cfg, l.rotary_width(), theta.0, None)?)
            }
            _ => None,
        };
        let normal = |stdev| Init::Randn { mean: 0., stdev };
        let stem = match cfg.vision {
            None => Stem::Tokens(w.pp("wte").weight(
                &[cfg.vocab, cfg.hidden],
                "weight",
                normal(1.),
            )?),
            Some(v) => Stem::Patches {
                proj: w.pp("patch").linear(v.patch_dim(), cfg.hidden, true)?,
                cls: w.weight(&[1, 1, cfg.hidden], "cls", normal(0.02))?,
                patch: v.patch,
            },
        };
        let wpe = match cfg.llama {
            Some(_) => None,
            None => Some(w.weight(&[cfg.max_seq, cfg.hidden], "wpe", normal(0.02))?),
        };
        let blocks = layers
            .iter()
            .map(|&(i, tag)| {
                w.segment(tag);
                Block::new(cfg, i, tag, &w.pp(&format!("h.{i}")))
            })
            .collect::<Result<Vec<_>>>()?;
        w.segment(0);
        let ln_f = Norm::new(cfg, &w.pp("ln_f"))?;
        let fused = cfg.kernels.fused();
        let head = match (&stem, cfg.vision, cfg.tied) {
            (Stem::Tokens(wte), None, true) => Proj {
                weight: wte.clone(),
                bias: None,
                lora: None,
                frozen: None,
                fused,
            },
            (_, vision, _) => Proj {
                fused,
                ..w.pp("head")
                    .linear(cfg.hidden, cfg.vocab, vision.is_some())?
            },
        };
        Ok(Self {
            stem,
            wpe,
            rope,
            rope_local,
            blocks,
            ln_f,
            head,
            vocab: None,
            form: Form::of(cfg),
            own,
        })
    }
}

impl<T: TensorOps, R, C> Transformer<T, R, C> {
    /// The model with tensor parallelism's collectives around every block's sublayers
    /// ([`Collectives`]): its blocks must hold one rank's shard (`memfit ranks --tp`).
    pub fn with_collectives(mut self, tp: std::rc::Rc<dyn Collectives<T>>) -> Self {
        for b in &mut self.blocks {
            b.tp = Some(tp.clone());
        }
        self
    }

    /// The model with Megatron's vocab-parallel embedding, head and loss ([`VocabParallel`]):
    /// its token table (and head) must hold one rank's run of the vocabulary (`memfit ranks
    /// --tp`).
    pub fn with_vocab_parallel(mut self, vocab: std::rc::Rc<dyn VocabParallel<T>>) -> Self {
        self.vocab = Some(vocab);
        self
    }

    /// The model with every mixture of experts' forward handed to `ep` (expert parallelism:
    /// its blocks hold one rank's experts; `memfit ranks --ep`, `crate::ranks::expert`).
    pub fn with_expert_parallel(
        mut self,
        ep: std::rc::Rc<dyn super::moe::MoeParallel<T, R>>,
    ) -> Self
    where
        T: TensorOps,
    {
        for b in &mut self.blocks {
            if let Ffn::Moe(m) = &mut b.mlp {
                m.parallel = Some(ep.clone());
            }
        }
        self
    }
}

impl Transformer {
    /// The model of `cfg` with its weights from `vb` (every layer; the blocks' segments are
    /// their indices).
    pub fn new(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let layers: Vec<(usize, u32)> = (0..cfg.layers).map(|i| (i, i as u32)).collect();
        Self::build(cfg, &vb, &layers, cfg.clone())
    }

    pub fn config(&self) -> &Config {
        &self.own
    }

    /// Mean cross-entropy of `logits (B, S, V)` against `targets (B, S)` u32 (candle-nn's
    /// composed `cross_entropy`).
    pub fn loss(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        loss_with(Kernels::Composed, logits, targets)
    }

    /// The training forward to the loss with the whole graph recorded. `half`: mixed
    /// precision's 16-bit working type (a working copy of the weights with recorded
    /// conversions, [`Self::working`]; the loss in f32).
    pub fn training_loss(
        &self,
        input: &Tensor,
        targets: &Tensor,
        half: Option<DType>,
    ) -> Result<Tensor> {
        match half {
            None => self.train_loss(&self.forward(input)?, targets),
            Some(dtype) => {
                let copy = self.working(dtype)?;
                let logits = copy.forward(input)?;
                self.train_loss(&logits.to_dtype(DType::F32)?, targets)
            }
        }
    }

    /// A copy of the model whose weights are `w.to_dtype(dtype)` (mixed precision's 16-bit
    /// working copy). With variables the conversions are recorded, so the gradients flow back,
    /// converted, to the f32 master weights; the copies (`2·P` bytes for 16 bits) live as long
    /// as the copy or a graph that uses it. The rotary tables are converted too.
    pub fn cast(&self, dtype: DType) -> Result<Self> {
        let f = |t: &Tensor| t.to_dtype(dtype);
        self.map_with(&f, &f, self.own.clone())
    }

    /// Mixed precision's working copy in `dtype` ([`Transformer::working_copy`]): [`Self::cast`]
    /// except, under transformers' kernels, the norms and embedding tables, which stay the f32
    /// masters, as autocast runs the model.
    pub fn working(&self, dtype: DType) -> Result<Self> {
        let f = |t: &Tensor| t.to_dtype(dtype);
        let kept = |t: &Tensor| Ok(t.clone());
        self.working_copy(&f, &kept, self.own.clone(), true)
    }

    /// LoRA training: the base weights detached (frozen: no gradient, no optimizer state), the
    /// adapters still variables; the block projections frozen as `cfg.lora_base` says.
    pub fn frozen(&self) -> Result<Self> {
        self.frozen_with(self.own.lora_base, false, false)
    }

    /// A serving copy whose block projections run through the frozen-linear op over `mode`'s
    /// weights (`q4_0`, `q8_0`: quantized inference; `experts`: only a mixture of experts'
    /// expert projections, the rest as the model's own); everything detached.
    pub fn serving(&self, mode: LoraBase, experts: bool) -> Result<Self> {
        self.frozen_with(mode, true, experts)
    }

    /// A copy with the base weights detached and the block projections (only the experts' with
    /// `experts_only`) frozen as `mode` says.
    fn frozen_with(
        &self,
        mode: LoraBase,
        detach_adapters: bool,
        experts_only: bool,
    ) -> Result<Self> {
        let base = |t: &Tensor| Ok(t.detach());
        let adapter = |t: &Tensor| {
            Ok(if detach_adapters {
                t.detach()
            } else {
                t.clone()
            })
        };
        let mut m = self.map_with(&base, &adapter, self.own.clone())?;
        for b in &mut m.blocks {
            let projs = match (&mut b.mlp, experts_only) {
                (_, false) => b.projs_mut(),
                (Ffn::Moe(moe), true) => moe.projs_mut(),
                (Ffn::Dense(_), true) => Vec::new(),
            };
            for p in projs {
                *p = p.freeze(mode)?;
            }
        }
        Ok(m)
    }
}

/// Mean cross-entropy of `logits (B, S, V)` against `targets (B, S)` u32 with the given
/// kernels: candle-nn's composed `cross_entropy`, or one op ([`super::kernels::cross_entropy`]).
pub fn loss_with<T: TensorOps>(kernels: Kernels, logits: &T, targets: &T) -> Result<T> {
    let d = logits.dims();
    let (logits, targets) = (
        logits.reshape(&[d[0] * d[1], d[2]])?,
        targets.reshape(&[d[0] * d[1]])?,
    );
    match kernels {
        Kernels::Transformers => {
            // transformers' `ForCausalLMLoss`: `logits.float()` (freed once the softmax
            // exists), `log_softmax` (its f32 output kept for the backward), `nll_loss`.
            let p = {
                let x = logits.detach().upcast()?;
                x.softmax_last()?
            };
            let lp = p.log()?;
            drop(p);
            T::kernel(Kernel::CrossEntropyF32, &[&logits, &targets, &lp])
        }
        Kernels::Fused => T::kernel(Kernel::CrossEntropy, &[&logits, &targets]),
        Kernels::Composed => tensor_ops::cross_entropy(&logits, &targets),
    }
}

impl<T: TensorOps, R: Routing<T> + Clone, C> Transformer<T, R, C> {
    /// A copy with `base` applied to every base weight (and the rotary tables) and `adapter`
    /// to every LoRA tensor, in model order (for each projection: weight, bias, A, B; each
    /// block's in its segment), keeping `own` beside. A tied head is the mapped token table.
    /// The weights of each part the block-by-block backward cuts the model into, in the
    /// forward's order: the embedding (the token table, GPT's position table), each block, then
    /// the head (the final norm and the head's weight: the token table itself when tied). The
    /// units ZeRO 3 gathers and reshards one at a time (`ranks::fsdp`); clones of the model's
    /// own tensors (nothing allocated). A ViT's patch stem is not a part here (`Err`).
    pub(crate) fn part_weights(&self) -> Result<Vec<Vec<T>>> {
        use std::cell::RefCell;
        let seen = RefCell::new(Vec::new());
        let rec = |t: &T| {
            seen.borrow_mut().push(t.clone());
            Ok(t.clone())
        };
        let take = || std::mem::take(&mut *seen.borrow_mut());
        let mut parts = Vec::with_capacity(self.blocks.len() + 2);
        match &self.stem {
            Stem::Tokens(wte) => rec(wte).map(drop)?,
            Stem::Patches { .. } => candle_core::bail!("part_weights: a ViT's stem is not split"),
        }
        if let Some(wpe) = &self.wpe {
            rec(wpe)?;
        }
        parts.push(take());
        for b in &self.blocks {
            b.map(&rec, &rec, &rec)?;
            parts.push(take());
        }
        self.ln_f.map(&rec)?;
        self.head.map(&rec, &rec)?;
        parts.push(take());
        Ok(parts)
    }

    pub(crate) fn map_with(&self, base: &Map<'_, T>, adapter: &Map<'_, T>, own: C) -> Result<Self> {
        self.map_parts(base, adapter, None, own, true)
    }

    /// Mixed precision's working copy: `cast` (a recorded conversion to the 16-bit type, or
    /// its detached form) on every weight — except, under transformers' kernels, as autocast
    /// runs the model: the norms' weights and the embedding tables are `kept` (the f32 masters
    /// themselves, or detached), so the residual stream and the norms compute in f32 and each
    /// projection casts its input ([`Proj::forward`]); the rotary tables are cast (the rotated
    /// q and k reach the attention in 16 bits either way) and a tied head is the token table
    /// cast.
    pub(crate) fn working_copy(
        &self,
        cast: &Map<'_, T>,
        kept: &Map<'_, T>,
        own: C,
        blocks: bool,
    ) -> Result<Self> {
        let kept = self.form.kernels.torch().then_some(kept);
        self.map_parts(cast, cast, kept, own, blocks)
    }

    /// [`Self::working_copy`]'s blocks `range` (a checkpointed segment's).
    pub(crate) fn working_blocks(
        &self,
        range: std::ops::Range<usize>,
        cast: &Map<'_, T>,
        kept: &Map<'_, T>,
    ) -> Result<Vec<Block<T, R>>> {
        let norm = if self.form.kernels.torch() {
            kept
        } else {
            cast
        };
        self.map_blocks(range, cast, cast, norm)
    }

    /// A copy with `base` on the weights, `adapter` on LoRA's, `kept` (where given: autocast,
    /// [`Self::working_copy`]) on the norms' weights and the embedding tables, else `base`;
    /// the blocks only with `blocks`.
    fn map_parts(
        &self,
        base: &Map<'_, T>,
        adapter: &Map<'_, T>,
        kept: Option<&Map<'_, T>>,
        own: C,
        blocks: bool,
    ) -> Result<Self> {
        let norm = kept.unwrap_or(base);
        let rope = match &self.rope {
            None => None,
            Some((c, s)) => Some((base(c)?, base(s)?)),
        };
        let rope_local = match &self.rope_local {
            None => None,
            Some((c, s)) => Some((base(c)?, base(s)?)),
        };
        let stem = match &self.stem {
            Stem::Tokens(wte) => Stem::Tokens(norm(wte)?),
            Stem::Patches { proj, cls, patch } => Stem::Patches {
                proj: proj.map(base, adapter)?,
                cls: norm(cls)?,
                patch: *patch,
            },
        };
        let wpe = self.wpe.as_ref().map(norm).transpose()?;
        let w = &self.head.weight;
        let outer = w.segment();
        let blocks = match blocks {
            true => self.map_blocks(0..self.blocks.len(), base, adapter, norm)?,
            false => Vec::new(),
        };
        w.set_segment(outer);
        let ln_f = self.ln_f.map(norm)?;
        let head = match (&stem, &self.stem, self.form.tied) {
            // Autocast: the head casts the f32 table for itself.
            (_, Stem::Tokens(table), true) if kept.is_some() => Proj {
                weight: base(table)?,
                ..self.head.clone()
            },
            (Stem::Tokens(wte), _, true) => Proj {
                weight: wte.clone(),
                ..self.head.clone()
            },
            _ => self.head.map(base, adapter)?,
        };
        Ok(Self {
            stem,
            wpe,
            rope,
            rope_local,
            blocks,
            ln_f,
            head,
            vocab: self.vocab.clone(),
            form: self.form,
            own,
        })
    }

    /// Blocks `range` with `base` on their weights, `norm` on their norms' and `adapter` on
    /// LoRA's A and B, each made in its block's segment.
    pub(crate) fn map_blocks(
        &self,
        range: std::ops::Range<usize>,
        base: &Map<'_, T>,
        adapter: &Map<'_, T>,
        norm: &Map<'_, T>,
    ) -> Result<Vec<Block<T, R>>> {
        let w = &self.head.weight;
        let outer = w.segment();
        let blocks = self.blocks[range]
            .iter()
            .map(|b| {
                w.set_segment(b.tag);
                b.map(base, adapter, norm)
            })
            .collect::<Result<Vec<_>>>();
        w.set_segment(outer);
        blocks
    }

    /// `block`'s rotary tables at positions `offset..` (LLaMA; a Gemma's sliding layer:
    /// the local tables), or none (GPT, ViT, a NoPE layer).
    fn rotary(&self, block: &Block<T, R>, offset: usize) -> Option<Rotary<'_, T>> {
        let tables = match &self.rope_local {
            _ if block.nope => None,
            Some(local) if block.windowed => Some(local),
            _ => self.rope.as_ref(),
        };
        tables.map(|(cos, sin)| Rotary { cos, sin, offset })
    }

    /// The token embedding of `tokens` (Gemma: times √H, the unscaled rows freed).
    fn tokens(&self, wte: &T, tokens: &T) -> Result<T> {
        let e = match &self.vocab {
            Some(v) => v.embed(wte, tokens)?,
            None => tensor_ops::embedding(wte, tokens)?,
        };
        match self.form.embed_scale {
            None => Ok(e),
            Some(s) => {
                let x = e.affine(s, 0.0)?;
                drop(e);
                Ok(x)
            }
        }
    }

    /// `tokens (B, S)` u32 → logits `(B, S, V)`; ViT: `images (B, C, I, I)` → `(B, 1, K)`.
    pub fn forward(&self, input: &T) -> Result<T> {
        let masks = self.input_mask(input)?;
        let x = self.embed(input)?;
        let x = self.run_blocks(x, &masks, 0..self.blocks.len())?;
        self.head_forward(&x)
    }

    /// The attention masks for `input`: the causal mask of its length for the full layers and
    /// the windowed one for the sliding layers, each made when some layer uses it (decoder);
    /// none (ViT, fused kernels).
    pub fn input_mask(&self, input: &T) -> Result<Masks<T>> {
        self.input_mask_for(&self.blocks, input)
    }

    /// [`Self::input_mask`] for the layers `blocks` (a working copy without blocks: the
    /// masters').
    pub fn input_mask_for(&self, blocks: &[Block<T, R>], input: &T) -> Result<Masks<T>> {
        match &self.stem {
            Stem::Tokens(_) if self.needs_mask() => self.masks_for(blocks, input.dims()[1]),
            _ => Ok(Masks::default()),
        }
    }

    fn masks(&self, s: usize) -> Result<Masks<T>> {
        self.masks_for(&self.blocks, s)
    }

    /// The masks of a prompt of `s` tokens for the layers `blocks`: full first, then windowed
    /// (as transformers makes its `full_attention` and `sliding_attention` masks).
    fn masks_for(&self, blocks: &[Block<T, R>], s: usize) -> Result<Masks<T>> {
        let full = if blocks.iter().any(|b| !b.windowed) {
            Some(self.mask(s, None)?)
        } else {
            None
        };
        let sliding = match self.form.sliding_window {
            Some(w) if blocks.iter().any(|b| b.windowed) => Some(self.mask(s, Some(w))?),
            _ => None,
        };
        Ok(Masks { full, sliding })
    }

    /// Whether the decoder's attention adds a mask tensor: not with fused kernels, whose
    /// attention masks inside ([`super::kernels::attn_probs`]).
    pub fn needs_mask(&self) -> bool {
        !self.form.kernels.fused() || self.form.composed_attention
    }

    /// Inference with a key/value cache: `tokens (B, s)` at positions `cache.len()..`, appended
    /// to the cache; returns the logits of the last position `(B, V)`. A prompt of several
    /// tokens uses the causal mask; a single new token attends to everything cached.
    pub fn forward_cached(&self, tokens: &T, cache: &mut KvCache<T>) -> Result<T> {
        let Stem::Tokens(wte) = &self.stem else {
            candle_core::bail!("generation (prefill, decode) needs a decoder, not a ViT")
        };
        let s = tokens.dims()[1];
        let offset = cache.len();
        if let Some(max) = self.form.max_seq
            && offset + s > max
        {
            candle_core::bail!("position {} is beyond max_seq {max}", offset + s)
        }
        if cache.layers.len() != self.blocks.len() {
            cache.layers = (0..self.blocks.len()).map(|_| None).collect();
        }
        let masks = if s > 1 && self.needs_mask() {
            self.masks(s)?
        } else {
            Masks::default()
        };
        let mut x = match &self.wpe {
            Some(wpe) => {
                let pos = wpe.narrow(0, offset, s)?;
                self.tokens(wte, tokens)?.broadcast_add(&pos)?
            }
            None => self.tokens(wte, tokens)?,
        };
        let outer = tokens.segment();
        for (block, c) in self.blocks.iter().zip(cache.layers.iter_mut()) {
            tokens.set_segment(block.tag);
            x = block.forward_cached(
                &x,
                masks.at(block.windowed),
                self.rotary(block, offset),
                c,
            )?;
        }
        tokens.set_segment(outer);
        cache.pos += s;
        let last = x.narrow(1, s - 1, 1)?.contiguous()?;
        drop(x);
        let logits = self.head_forward(&last)?;
        let logits = match &self.vocab {
            Some(v) => v.gather(logits)?,
            None => logits,
        };
        logits.squeeze(1)
    }

    /// The causal mask (with a window: the windowed one; Llama 4: the chunked one) in the type
    /// the attention computes in, the head's (f32 → the model's type: no copy for f32; under
    /// autocast the token table stays f32 and the head is 16-bit, as the scores are).
    fn mask(&self, s: usize, window: Option<usize>) -> Result<T> {
        let like = &self.head.weight;
        match window {
            Some(c) if self.form.chunked => {
                like.host_table(&[s, s], &|i| super::mask::chunked(i / s, i % s, c))
            }
            _ => like.causal_mask(s, s, 0, s, 0, window.unwrap_or(0)),
        }
    }

    /// Token plus position embedding (LLaMA: the token embedding; positions are rotary):
    /// `tokens (B, S)` → `(B, S, H)`. ViT: the patches projected, the class token in front,
    /// plus position embedding: `images (B, C, I, I)` → `(B, N + 1, H)`.
    pub fn embed(&self, input: &T) -> Result<T> {
        match &self.stem {
            Stem::Tokens(wte) => {
                let s = input.dims()[1];
                if let Some(max) = self.form.max_seq
                    && s > max
                {
                    candle_core::bail!("sequence {s} is longer than max_seq {max}")
                }
                match &self.wpe {
                    Some(wpe) => {
                        let pos = wpe.narrow(0, 0, s)?;
                        self.tokens(wte, input)?.broadcast_add(&pos)
                    }
                    None => self.tokens(wte, input),
                }
            }
            Stem::Patches { proj, cls, patch } => {
                let wpe = self.wpe.as_ref().expect("a ViT has a position table");
                let patches = vit::patchify(&input.to_dtype_of(&proj.weight)?, *patch)?;
                let x = proj.forward(&patches)?;
                drop(patches);
                let d = x.dims();
                let (b, n, h) = (d[0], d[1], d[2]);
                if let Some(max) = self.form.max_seq
                    && n + 1 != max
                {
                    candle_core::bail!("{n} patches do not match the {max} positions of the model")
                }
                let cls = cls.broadcast_as(&[b, 1, h])?.contiguous()?;
                // Under autocast the class token stays f32: `torch.cat` promotes the patches.
                let x = if x.same_type(&cls) {
                    T::cat(&[&cls, &x], 1)?
                } else {
                    let wide = x.to_dtype_of(&cls)?;
                    drop(x);
                    T::cat(&[&cls, &wide], 1)?
                };
                drop(cls);
                x.broadcast_add(wpe)
            }
        }
    }

    /// Blocks `range` applied to `x (B, S, H)`, each in its segment.
    pub fn blocks_forward(
        &self,
        x: &T,
        masks: &Masks<T>,
        range: std::ops::Range<usize>,
    ) -> Result<T> {
        self.run_blocks(x.clone(), masks, range)
    }

    /// Blocks `range` applied to `x`, each block's input freed once its output exists.
    fn run_blocks(&self, x: T, masks: &Masks<T>, range: std::ops::Range<usize>) -> Result<T> {
        self.run_blocks_of(&self.blocks[range], x, masks)
    }

    /// [`Self::blocks_forward`] through `blocks` (a segment's working copy of some of the
    /// blocks), with this model's tables (this model's own blocks are not read).
    pub fn blocks_forward_with(
        &self,
        blocks: &[Block<T, R>],
        x: &T,
        masks: &Masks<T>,
    ) -> Result<T> {
        self.run_blocks_of(blocks, x.clone(), masks)
    }

    fn run_blocks_of(&self, blocks: &[Block<T, R>], mut x: T, masks: &Masks<T>) -> Result<T> {
        let outer = x.segment();
        for block in blocks {
            x.set_segment(block.tag);
            x = block.forward(&x, masks.at(block.windowed), self.rotary(block, 0))?;
        }
        x.set_segment(outer);
        Ok(x)
    }

    /// Final norm and LM head: `(B, S, H)` → logits `(B, S, V)`. ViT: the class token
    /// only (taken first: the LayerNorm is per position), `(B, 1, K)`. With fused kernels the
    /// head is one op ([`super::kernels::linear_no_bias`], or [`super::kernels::linear`] with ViT's bias), so
    /// its weight gradient (`V·H`, the embedding's when tied) is written once.
    pub fn head_forward(&self, x: &T) -> Result<T> {
        let x = match self.stem {
            Stem::Tokens(_) => match &self.vocab {
                Some(v) => v.enter(self.ln_f.forward(x)?)?,
                None => self.ln_f.forward(x)?,
            },
            Stem::Patches { .. } => self.ln_f.forward(&x.narrow(1, 0, 1)?.contiguous()?)?,
        };
        let logits = self.head.forward(&x)?;
        // Autocast: the f32 normalised input, cast by the head, is read by no backward.
        x.release_if(self.head.casts(&x))?;
        match self.form.final_softcap {
            None => Ok(logits),
            Some(c) => {
                drop(x);
                tensor_ops::soft_cap(logits, c, self.form.kernels.torch())
            }
        }
    }

    /// [`loss_with`] the model's kernels ([`super::kernels::cross_entropy`] when fused).
    pub fn train_loss(&self, logits: &T, targets: &T) -> Result<T> {
        if let Some(v) = &self.vocab {
            return v.loss(logits, targets);
        }
        loss_with(self.form.kernels, logits, targets)
    }
}

/// Deterministic synthetic batch: `(tokens, targets)`, each `(B, S)` u32 in `0..V`; targets are
/// tokens shifted by one position.
pub fn synthetic_batch(
    batch: usize,
    seq: usize,
    vocab: usize,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state % vocab as u64) as u32
    };
    let stream: Vec<u32> = (0..batch * (seq + 1)).map(|_| next()).collect();
    let mut tokens = Vec::with_capacity(batch * seq);
    let mut targets = Vec::with_capacity(batch * seq);
    for row in stream.chunks(seq + 1) {
        tokens.extend_from_slice(&row[..seq]);
        targets.extend_from_slice(&row[1..]);
    }
    Ok((
        Tensor::from_vec(tokens, (batch, seq), device)?,
        Tensor::from_vec(targets, (batch, seq), device)?,
    ))
}

/// candle's source of weights: variables made and initialised in a `VarMap` (or read from a
/// checkpoint) under candle-nn's names; the experts route on the host.
impl Weights for VarBuilder<'_> {
    type Tensor = Tensor;
    type Routing = HostRouting;

    fn pp(&self, name: &str) -> Self {
        VarBuilder::pp(self, name)
    }

    fn weight(&self, dims: &[usize], name: &str, init: Init) -> Result<Tensor> {
        self.get_with_hints(dims, name, init)
    }

    fn linear(&self, inp: usize, out: usize, bias: bool) -> Result<Proj> {
        Ok(Proj::plain(
            candle_nn::linear_b(inp, out, bias, self.clone())?,
            false,
        ))
    }

    fn proj(&self, spec: &ProjSpec, cfg: &Config) -> Result<Proj> {
        Proj::new(spec, cfg, self.clone())
    }

    fn rotary(
        &self,
        cfg: &Config,
        head_dim: usize,
        theta: f64,
        scaling: Option<&RopeScaling>,
    ) -> Result<(Tensor, Tensor)> {
        super::rotary::rotary_tables(
            cfg.max_seq,
            head_dim,
            theta,
            scaling,
            self.dtype(),
            self.device(),
        )
    }

    fn routing(&self, _cfg: &Config, layer: usize, _experts: &[usize]) -> HostRouting {
        HostRouting { layer }
    }
}
