//! The transformer memfit measures: a GPT-style decoder (token + position embedding, `L`
//! pre-LayerNorm blocks of multi-head causal self-attention and a 4H GELU MLP, a final
//! LayerNorm, an untied LM head and cross-entropy), or with `Config::vision` the ViT encoder of
//! [`super::vit`] (patch embedding and class token in front, the same blocks without the mask,
//! a classifier on the class token). Everything below the embedding is shared.
//!
//! Shapes (B batch, S sequence, H hidden, A heads, D = H/A, V vocab):
//! tokens `(B, S)` u32 → embeddings `(B, S, H)` → blocks `(B, S, H)` → logits `(B, S, V)`;
//! attention scores `(B, A, S, S)`.
//!
//! Parameter count (exact): `P = 2·V·H + S_max·H + L·(12·H² + 13·H) + 2·H`
//! (token and head matrices `V·H` each, position table `S_max·H`, per block two LayerNorms `4H`,
//! q/k/v/o `4(H² + H)`, MLP `8H² + 5H`; final LayerNorm `2H`).
//!
//! Only ops with a backward in candle 0.11.1 are used: `ops::layer_norm_slow` (not
//! `LayerNorm::forward`, which has none) and the composed `ops::softmax` (not
//! `softmax_last_dim`). The same code runs with `Var`s (training: every op is recorded) or with
//! detached weights (`Transformer::detached`, inference: no graph).
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

use candle_core::{D, DType, Device, Module, Result, Tensor};
use candle_nn::{Embedding, Init, Linear, VarBuilder, embedding, linear, linear_no_bias, ops};
use serde::{Deserialize, Serialize};

use super::efficient_attention::EfficientAttention;
use super::frozen::{FrozenLinear, FrozenWeight};
use super::vit::{self, Vision};
use candle_core::quantized::GgmlDType;

/// Shape of a GPT-style decoder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    pub vocab: usize,
    pub hidden: usize,
    pub heads: usize,
    pub layers: usize,
    /// Rows of the position-embedding table: the longest sequence the model accepts.
    pub max_seq: usize,
    pub layer_norm_eps: f64,
    /// Attention without the `(S, S)` scores ([`super::efficient_attention`]; CPU only).
    #[serde(default)]
    pub efficient_attention: bool,
    /// LoRA rank (0 = no adapters).
    #[serde(default)]
    pub lora_rank: usize,
    /// Projections that get an adapter when `lora_rank > 0`.
    #[serde(default)]
    pub lora_targets: Vec<LoraTarget>,
    /// How the base projections are frozen under LoRA.
    #[serde(default)]
    pub lora_base: LoraBase,
    /// A ViT: the input is images cut into patches ([`super::vit`]); `vocab` is then the number
    /// of classes and `max_seq` the patches + 1.
    #[serde(default)]
    pub vision: Option<Vision>,
}

/// Names of the GPT presets accepted by [`Config::preset`] (the ViT ones are
/// [`vit::PRESETS`]).
pub const PRESETS: &[&str] = &[
    "tiny",
    "small",
    "gpt2-small",
    "gpt2-medium",
    "llama-7b-shape",
];

impl Config {
    /// Test-sized: V 300, H 96, A 3, L 2, S_max 128.
    pub fn tiny() -> Self {
        Self::new(300, 96, 3, 2, 128)
    }
    /// A few million parameters: V 2048, H 256, A 4, L 4, S_max 256.
    pub fn small() -> Self {
        Self::new(2048, 256, 4, 4, 256)
    }
    /// GPT-2 small shape: V 50257, H 768, A 12, L 12, S_max 1024 (124 M parameters untied).
    pub fn gpt2_small() -> Self {
        Self::new(50257, 768, 12, 12, 1024)
    }
    /// GPT-2 medium shape: V 50257, H 1024, A 16, L 24, S_max 1024.
    pub fn gpt2_medium() -> Self {
        Self::new(50257, 1024, 16, 24, 1024)
    }

    /// LLaMA-7B's sizes in this GPT architecture (LayerNorm, 4H GELU MLP, learned positions):
    /// V 32000, H 4096, A 32, L 32, S_max 4096, 6.74 B parameters. For predictions (F3).
    pub fn llama_7b_shape() -> Self {
        Self::new(32000, 4096, 32, 32, 4096)
    }

    /// A ViT of the given sizes ([`super::vit`]): `vocab` holds the classes, `max_seq` the
    /// patches + 1.
    pub fn vit(s: vit::Sizes) -> Self {
        let mut cfg = Self::new(s.classes, s.hidden, s.heads, s.layers, s.vision.seq());
        cfg.layer_norm_eps = 1e-6;
        cfg.vision = Some(s.vision);
        cfg
    }

    pub fn new(vocab: usize, hidden: usize, heads: usize, layers: usize, max_seq: usize) -> Self {
        Self {
            vocab,
            hidden,
            heads,
            layers,
            max_seq,
            layer_norm_eps: 1e-5,
            efficient_attention: false,
            lora_rank: 0,
            lora_targets: Vec::new(),
            lora_base: LoraBase::Op,
            vision: None,
        }
    }

    pub fn preset(name: &str) -> Option<Self> {
        match name {
            "tiny" => Some(Self::tiny()),
            "small" => Some(Self::small()),
            "gpt2-small" => Some(Self::gpt2_small()),
            "gpt2-medium" => Some(Self::gpt2_medium()),
            "llama-7b-shape" => Some(Self::llama_7b_shape()),
            _ => vit::preset(name).map(Self::vit),
        }
    }

    /// Exact parameter count (see the module docs and [`super::vit`]'s).
    pub fn params(&self) -> u64 {
        let (v, h, l, s) = (
            self.vocab as u64,
            self.hidden as u64,
            self.layers as u64,
            self.max_seq as u64,
        );
        let (stem, head) = match self.vision {
            None => (v * h, v * h),
            // Patch projection with bias, class token; classifier with bias.
            Some(vis) => (vis.patch_dim() as u64 * h + 2 * h, v * h + v),
        };
        stem + s * h + l * (12 * h * h + 13 * h) + 2 * h + head + self.lora_params()
    }

    /// Parameters of the LoRA adapters: `L · Σ_targets r·(in + out)` (in + out is 2H for q, k,
    /// v, o and 5H for fc1, fc2).
    pub fn lora_params(&self) -> u64 {
        let (h, l, r) = (
            self.hidden as u64,
            self.layers as u64,
            self.lora_rank as u64,
        );
        if r == 0 {
            return 0;
        }
        let per_layer: u64 = self
            .lora_targets
            .iter()
            .map(|t| match t {
                LoraTarget::Fc1 | LoraTarget::Fc2 => r * 5 * h,
                _ => r * 2 * h,
            })
            .sum();
        l * per_layer
    }

    /// Number of parameter tensors (each costs a little allocator metadata).
    pub fn param_tensors(&self) -> u64 {
        // wte, wpe, lnf (2), head; per block: ln1 2, q/k/v/o 8, ln2 2, fc1 2, fc2 2. ViT:
        // patch (2), cls, wpe, lnf (2), head (2).
        let outside = if self.vision.is_some() { 8 } else { 5 };
        outside + 16 * self.layers as u64
    }

    /// The model's sequence for an input of `seq` tokens: ViT's is fixed by its image.
    pub fn seq_for(&self, seq: usize) -> usize {
        self.vision.map_or(seq, |v| v.seq())
    }
}

/// LayerNorm with weight and bias, computed with `ops::layer_norm_slow` (which has a backward).
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f64,
}

impl LayerNorm {
    pub fn new(size: usize, eps: f64, vb: VarBuilder) -> Result<Self> {
        let weight = vb.get_with_hints(size, "weight", Init::Const(1.0))?;
        let bias = vb.get_with_hints(size, "bias", Init::Const(0.0))?;
        Ok(Self { weight, bias, eps })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::layer_norm_slow(x, &self.weight, &self.bias, self.eps as f32)
    }
}

/// LoRA adapter of a projection: `y += scale · (x·Aᵀ)·Bᵀ`, A `(r, in)` random, B `(out, r)`
/// zero at the start, scale `α/r` with α = r.
#[derive(Debug, Clone)]
pub struct Lora {
    pub a: Tensor,
    pub b: Tensor,
    pub scale: f64,
}

/// A projection (candle-nn `Linear`) with an optional LoRA adapter. Under LoRA with
/// `lora_base` `op`, `q4_0` or `q8_0` the base runs as a [`FrozenLinear`] instead (`frozen`),
/// and `linear` keeps only what the op does not hold.
#[derive(Debug, Clone)]
pub struct Proj {
    pub linear: Linear,
    pub lora: Option<Lora>,
    pub frozen: Option<FrozenWeight>,
}

impl Proj {
    /// `in → out` with bias; an adapter of rank `cfg.lora_rank` when `target` is adapted.
    fn new(
        inp: usize,
        out: usize,
        cfg: &Config,
        target: LoraTarget,
        vb: VarBuilder,
    ) -> Result<Self> {
        let lora = if cfg.lora_rank > 0 && cfg.lora_targets.contains(&target) {
            let r = cfg.lora_rank;
            Some(Lora {
                a: vb.get_with_hints(
                    (r, inp),
                    "lora_a",
                    Init::Randn {
                        mean: 0.,
                        stdev: 0.02,
                    },
                )?,
                b: vb.get_with_hints((out, r), "lora_b", Init::Const(0.))?,
                scale: 1.0,
            })
        } else {
            None
        };
        Ok(Self {
            linear: linear(inp, out, vb)?,
            lora,
            frozen: None,
        })
    }

    /// A copy with `base` applied to the weight and bias and `adapter` to A and B.
    fn map(
        &self,
        base: &dyn Fn(&Tensor) -> Result<Tensor>,
        adapter: &dyn Fn(&Tensor) -> Result<Tensor>,
    ) -> Result<Self> {
        Ok(Self {
            linear: Linear::new(
                base(self.linear.weight())?,
                self.linear.bias().map(base).transpose()?,
            ),
            lora: match &self.lora {
                None => None,
                Some(l) => Some(Lora {
                    a: adapter(&l.a)?,
                    b: adapter(&l.b)?,
                    scale: l.scale,
                }),
            },
            frozen: match &self.frozen {
                None => None,
                Some(FrozenWeight::Dense(w)) => Some(FrozenWeight::Dense(base(w)?)),
                Some(q) => Some(q.clone()),
            },
        })
    }

    /// The projection with its base frozen as `mode` says (adapters untouched).
    fn freeze(&self, mode: LoraBase) -> Result<Self> {
        let bias = self.linear.bias().map(|b| b.detach());
        let weight = self.linear.weight().detach();
        let frozen = match mode {
            LoraBase::Detach => None,
            LoraBase::Op => Some(FrozenWeight::Dense(weight.clone())),
            LoraBase::Q4_0 => Some(FrozenWeight::quantize(&weight, GgmlDType::Q4_0)?),
            LoraBase::Q8_0 => Some(FrozenWeight::quantize(&weight, GgmlDType::Q8_0)?),
        };
        // A quantized projection keeps no f32 weight: a 1-element placeholder stands in.
        let weight = match mode {
            LoraBase::Q4_0 | LoraBase::Q8_0 => Tensor::zeros(1, weight.dtype(), weight.device())?,
            _ => weight,
        };
        Ok(Self {
            linear: Linear::new(weight, bias),
            lora: self.lora.clone(),
            frozen,
        })
    }
}

impl Module for Proj {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match &self.frozen {
            None => self.linear.forward(x)?,
            Some(w) => {
                let (b, s, inp) = x.dims3()?;
                let op = FrozenLinear {
                    weight: w.clone(),
                    bias: self.linear.bias().cloned(),
                };
                x.reshape((b * s, inp))?
                    .apply_op1(op)?
                    .reshape((b, s, ()))?
            }
        };
        match &self.lora {
            None => Ok(y),
            Some(l) => {
                let (b, s, inp) = x.dims3()?;
                let down = x.reshape((b * s, inp))?.matmul(&l.a.t()?)?;
                let up = down.matmul(&l.b.t()?)?.reshape((b, s, ()))?;
                y + (up * l.scale)?
            }
        }
    }
}

/// How LoRA freezes the base projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoraBase {
    /// Detached weights in candle's own matmul: their gradients are still computed and held
    /// until the gradient store is dropped.
    Detach,
    /// [`FrozenLinear`]: no gradient for the weight.
    #[default]
    Op,
    /// QLoRA: [`FrozenLinear`] over 4-bit GGML blocks (18 B per 32 weights).
    Q4_0,
    /// [`FrozenLinear`] over 8-bit GGML blocks (34 B per 32 weights).
    Q8_0,
}

impl LoraBase {
    pub const NAMES: &'static str = "detach, op, q4_0, q8_0";

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "detach" => Some(Self::Detach),
            "op" => Some(Self::Op),
            "q4_0" => Some(Self::Q4_0),
            "q8_0" => Some(Self::Q8_0),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Detach => "detach",
            Self::Op => "op",
            Self::Q4_0 => "q4_0",
            Self::Q8_0 => "q8_0",
        }
    }
}

/// Projections that can carry a LoRA adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoraTarget {
    Q,
    K,
    V,
    O,
    Fc1,
    Fc2,
}

impl LoraTarget {
    pub const ALL: [LoraTarget; 6] = [Self::Q, Self::K, Self::V, Self::O, Self::Fc1, Self::Fc2];

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Q => "q",
            Self::K => "k",
            Self::V => "v",
            Self::O => "o",
            Self::Fc1 => "fc1",
            Self::Fc2 => "fc2",
        }
    }
}

/// Multi-head causal self-attention with separate q, k, v, o projections (with bias).
#[derive(Debug, Clone)]
pub struct Attention {
    q: Proj,
    k: Proj,
    v: Proj,
    o: Proj,
    heads: usize,
    efficient: bool,
}

impl Attention {
    pub fn new(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let h = cfg.hidden;
        Ok(Self {
            q: Proj::new(h, h, cfg, LoraTarget::Q, vb.pp("q"))?,
            k: Proj::new(h, h, cfg, LoraTarget::K, vb.pp("k"))?,
            v: Proj::new(h, h, cfg, LoraTarget::V, vb.pp("v"))?,
            o: Proj::new(h, h, cfg, LoraTarget::O, vb.pp("o"))?,
            heads: cfg.heads,
            efficient: cfg.efficient_attention,
        })
    }

    /// `x (B, S, H)`, `mask (S, S)` with 0 on and below the diagonal and −∞ above (decoder),
    /// or none (encoder: every position attends to every position).
    pub fn forward(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let (q, k, v) = self.qkv(x)?;
        if self.efficient {
            let (b, _, s, d) = q.dims4()?;
            let op = EfficientAttention {
                scale: (1.0 / (d as f64).sqrt()) as f32,
                causal: mask.is_some(),
            };
            let y = q.apply_op3(&k, &v, op)?;
            drop((q, k, v));
            let y = y.transpose(1, 2)?.reshape((b, s, self.heads * d))?;
            return self.o.forward(&y);
        }
        self.attend(q, k, v, mask)
    }

    /// The queries, keys and values of `x (B, S, H)`, each `(B, A, S, D)`, contiguous.
    fn qkv(&self, x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, s, h) = x.dims3()?;
        let d = h / self.heads;
        let split = |t: Tensor| -> Result<Tensor> {
            t.reshape((b, s, self.heads, d))?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = split(self.q.forward(x)?)?;
        let k = split(self.k.forward(x)?)?;
        let v = split(self.v.forward(x)?)?;
        Ok((q, k, v))
    }

    /// `softmax(q·kᵀ/√D + mask)·v` with the heads merged back to `(B, S, H)`, through `o`;
    /// each intermediate is freed as soon as the next exists.
    fn attend(&self, q: Tensor, k: Tensor, v: Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let (b, _, s, d) = q.dims4()?;
        let scores = (q.matmul(&k.t()?)? * (1.0 / (d as f64).sqrt()))?;
        drop((q, k));
        let scores = match mask {
            Some(m) => scores.broadcast_add(m)?,
            None => scores,
        };
        let probs = ops::softmax(&scores, D::Minus1)?;
        drop(scores);
        let y = probs.matmul(&v)?;
        drop((probs, v));
        let y = y.transpose(1, 2)?.reshape((b, s, self.heads * d))?;
        self.o.forward(&y)
    }

    /// Inference with a key/value cache `(B, A, T, D)` each: the new keys and values are
    /// appended (`Tensor::cat`, a new allocation; the old cache is freed after), and the
    /// queries attend to every cached position (`mask` only for a prompt of several tokens).
    pub fn forward_cached(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        cache: &mut Option<(Tensor, Tensor)>,
    ) -> Result<Tensor> {
        let (q, k, v) = self.qkv(x)?;
        let (k, v) = match cache.take() {
            None => (k, v),
            Some((pk, pv)) => {
                let k = Tensor::cat(&[&pk, &k], 2)?;
                drop(pk);
                let v = Tensor::cat(&[&pv, &v], 2)?;
                (k, v)
            }
        };
        *cache = Some((k.clone(), v.clone()));
        self.attend(q, k, v, mask)
    }
}

/// Position-wise MLP: `fc2(gelu(fc1(x)))` with hidden width 4H and GELU (tanh approximation).
#[derive(Debug, Clone)]
pub struct Mlp {
    fc1: Proj,
    fc2: Proj,
}

impl Mlp {
    pub fn new(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let h = cfg.hidden;
        Ok(Self {
            fc1: Proj::new(h, 4 * h, cfg, LoraTarget::Fc1, vb.pp("fc1"))?,
            fc2: Proj::new(4 * h, h, cfg, LoraTarget::Fc2, vb.pp("fc2"))?,
        })
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let a = self.fc1.forward(x)?.gelu()?;
        self.fc2.forward(&a)
    }
}

/// Pre-norm block: `x + attn(ln1(x))`, then `x + mlp(ln2(x))`.
#[derive(Debug, Clone)]
pub struct Block {
    ln1: LayerNorm,
    attn: Attention,
    ln2: LayerNorm,
    mlp: Mlp,
}

impl Block {
    pub fn new(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        Ok(Self {
            ln1: LayerNorm::new(cfg.hidden, cfg.layer_norm_eps, vb.pp("ln1"))?,
            attn: Attention::new(cfg, vb.pp("attn"))?,
            ln2: LayerNorm::new(cfg.hidden, cfg.layer_norm_eps, vb.pp("ln2"))?,
            mlp: Mlp::new(cfg, vb.pp("mlp"))?,
        })
    }

    pub fn forward(&self, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let a = self.attn.forward(&self.ln1.forward(x)?, mask)?;
        let x = (x + a)?;
        let m = self.mlp.forward(&self.ln2.forward(&x)?)?;
        x + m
    }

    /// [`Block::forward`] with the attention's key/value cache.
    pub fn forward_cached(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        cache: &mut Option<(Tensor, Tensor)>,
    ) -> Result<Tensor> {
        let a = self
            .attn
            .forward_cached(&self.ln1.forward(x)?, mask, cache)?;
        let x = (x + a)?;
        let m = self.mlp.forward(&self.ln2.forward(&x)?)?;
        x + m
    }
}

/// The key/value cache of a decoder: per block, keys and values `(B, A, T, D)`.
#[derive(Debug, Default)]
pub struct KvCache {
    pub layers: Vec<Option<(Tensor, Tensor)>>,
}

impl KvCache {
    /// Tokens cached.
    pub fn len(&self) -> usize {
        match self.layers.first() {
            Some(Some((k, _))) => k.dim(2).unwrap_or(0),
            _ => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What turns the input into the blocks' `(B, S, H)`.
#[derive(Debug, Clone)]
enum Stem {
    /// GPT: token embedding (`wte`).
    Tokens(Embedding),
    /// ViT: patch projection (`patch`) and class token (`cls`, `(1, 1, H)`).
    Patches {
        proj: Linear,
        cls: Tensor,
        patch: usize,
    },
}

/// The whole model: decoder or encoder.
#[derive(Debug, Clone)]
pub struct Transformer {
    stem: Stem,
    /// Position embeddings `(S_max, H)`.
    wpe: Tensor,
    blocks: Vec<Block>,
    ln_f: LayerNorm,
    head: Linear,
    cfg: Config,
    /// Element type of the weights (the causal mask is converted to it).
    dtype: DType,
}

impl Transformer {
    pub fn new(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let stem = match cfg.vision {
            None => Stem::Tokens(embedding(cfg.vocab, cfg.hidden, vb.pp("wte"))?),
            Some(v) => Stem::Patches {
                proj: linear(v.patch_dim(), cfg.hidden, vb.pp("patch"))?,
                cls: vb.get_with_hints(
                    (1, 1, cfg.hidden),
                    "cls",
                    Init::Randn {
                        mean: 0.,
                        stdev: 0.02,
                    },
                )?,
                patch: v.patch,
            },
        };
        let wpe = vb.get_with_hints(
            (cfg.max_seq, cfg.hidden),
            "wpe",
            Init::Randn {
                mean: 0.,
                stdev: 0.02,
            },
        )?;
        let blocks = (0..cfg.layers)
            .map(|i| Block::new(cfg, vb.pp(format!("h.{i}"))))
            .collect::<Result<Vec<_>>>()?;
        let ln_f = LayerNorm::new(cfg.hidden, cfg.layer_norm_eps, vb.pp("ln_f"))?;
        let head = match cfg.vision {
            None => linear_no_bias(cfg.hidden, cfg.vocab, vb.pp("head"))?,
            Some(_) => linear(cfg.hidden, cfg.vocab, vb.pp("head"))?,
        };
        let dtype = vb.dtype();
        Ok(Self {
            stem,
            wpe,
            blocks,
            ln_f,
            head,
            cfg: cfg.clone(),
            dtype,
        })
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The causal mask `(S, S)`: 0 where a position may attend, −∞ above the diagonal.
    pub fn causal_mask(seq: usize, device: &Device) -> Result<Tensor> {
        // An exact-size iterator: the Vec (which the tensor keeps) has no spare capacity.
        let mask: Vec<f32> = (0..seq * seq)
            .map(|k| {
                if k % seq > k / seq {
                    f32::NEG_INFINITY
                } else {
                    0.
                }
            })
            .collect();
        Tensor::from_vec(mask, (seq, seq), device)
    }

    /// `tokens (B, S)` u32 → logits `(B, S, V)`; ViT: `images (B, C, I, I)` → `(B, 1, K)`.
    pub fn forward(&self, input: &Tensor) -> Result<Tensor> {
        let mask = self.input_mask(input)?;
        let mut x = self.embed(input)?;
        for block in &self.blocks {
            x = block.forward(&x, mask.as_ref())?;
        }
        self.head_forward(&x)
    }

    /// The attention mask for `input`: the causal mask of its length (decoder), none (ViT).
    pub fn input_mask(&self, input: &Tensor) -> Result<Option<Tensor>> {
        match self.stem {
            Stem::Tokens(_) => Ok(Some(self.mask(input.dim(1)?, input.device())?)),
            Stem::Patches { .. } => Ok(None),
        }
    }

    /// Inference with a key/value cache: `tokens (B, s)` at positions `cache.len()..`, appended
    /// to the cache; returns the logits of the last position `(B, V)`. A prompt of several
    /// tokens uses the causal mask; a single new token attends to everything cached.
    pub fn forward_cached(&self, tokens: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        let Stem::Tokens(wte) = &self.stem else {
            candle_core::bail!("generation (prefill, decode) needs a decoder, not a ViT")
        };
        let (_b, s) = tokens.dims2()?;
        let offset = cache.len();
        if offset + s > self.cfg.max_seq {
            candle_core::bail!(
                "position {} is beyond max_seq {}",
                offset + s,
                self.cfg.max_seq
            )
        }
        if cache.layers.len() != self.blocks.len() {
            cache.layers = (0..self.blocks.len()).map(|_| None).collect();
        }
        let mask = if s > 1 {
            Some(self.mask(s, tokens.device())?)
        } else {
            None
        };
        let pos = self.wpe.narrow(0, offset, s)?;
        let mut x = wte.forward(tokens)?.broadcast_add(&pos)?;
        drop(pos);
        for (block, c) in self.blocks.iter().zip(cache.layers.iter_mut()) {
            x = block.forward_cached(&x, mask.as_ref(), c)?;
        }
        let last = x.narrow(1, s - 1, 1)?.contiguous()?;
        drop(x);
        let logits = self.head_forward(&last)?;
        logits.squeeze(1)
    }

    /// The causal mask in the model's element type (f32 → the model's type: no copy for f32).
    pub fn mask(&self, s: usize, device: &Device) -> Result<Tensor> {
        Self::causal_mask(s, device)?.to_dtype(self.dtype)
    }

    /// Token plus position embedding: `tokens (B, S)` → `(B, S, H)`. ViT: the patches
    /// projected, the class token in front, plus position embedding: `images (B, C, I, I)` →
    /// `(B, N + 1, H)`.
    pub fn embed(&self, input: &Tensor) -> Result<Tensor> {
        match &self.stem {
            Stem::Tokens(wte) => {
                let (_b, s) = input.dims2()?;
                if s > self.cfg.max_seq {
                    candle_core::bail!("sequence {s} is longer than max_seq {}", self.cfg.max_seq)
                }
                let pos = self.wpe.narrow(0, 0, s)?;
                wte.forward(input)?.broadcast_add(&pos)
            }
            Stem::Patches { proj, cls, patch } => {
                let patches = vit::patchify(&input.to_dtype(self.dtype)?, *patch)?;
                let x = proj.forward(&patches)?;
                drop(patches);
                let (b, n, h) = x.dims3()?;
                if n + 1 != self.cfg.max_seq {
                    candle_core::bail!(
                        "{n} patches do not match the {} positions of the model",
                        self.cfg.max_seq
                    )
                }
                let cls = cls.broadcast_as((b, 1, h))?.contiguous()?;
                let x = Tensor::cat(&[&cls, &x], 1)?;
                drop(cls);
                x.broadcast_add(&self.wpe)
            }
        }
    }

    /// Blocks `range` applied to `x (B, S, H)`.
    pub fn blocks_forward(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        range: std::ops::Range<usize>,
    ) -> Result<Tensor> {
        let mut x = x.clone();
        for block in &self.blocks[range] {
            x = block.forward(&x, mask)?;
        }
        Ok(x)
    }

    /// Final LayerNorm and LM head: `(B, S, H)` → logits `(B, S, V)`. ViT: the class token
    /// only (taken first: the LayerNorm is per position), `(B, 1, K)`.
    pub fn head_forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = match self.stem {
            Stem::Tokens(_) => self.ln_f.forward(x)?,
            Stem::Patches { .. } => self.ln_f.forward(&x.narrow(1, 0, 1)?.contiguous()?)?,
        };
        self.head.forward(&x)
    }

    /// Mean cross-entropy of `logits (B, S, V)` against `targets (B, S)` u32.
    pub fn loss(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let (b, s, v) = logits.dims3()?;
        candle_nn::loss::cross_entropy(&logits.reshape((b * s, v))?, &targets.flatten_all()?)
    }

    /// A copy of the model whose weights are `w.to_dtype(dtype)` (mixed precision's 16-bit
    /// working copy). With variables the conversions are recorded, so the gradients flow back,
    /// converted, to the f32 master weights; the copies (`2·P` bytes for 16 bits) live as long
    /// as the copy or a graph that uses it.
    pub fn cast(&self, dtype: DType) -> Result<Self> {
        let f = |t: &Tensor| t.to_dtype(dtype);
        self.map(&f, &f, dtype)
    }

    /// A copy of the model whose weights are detached views of the same storage: running it
    /// records no graph (inference) and allocates nothing for the weights.
    pub fn detached(&self) -> Self {
        let f = |t: &Tensor| Ok(t.detach());
        self.map(&f, &f, self.dtype).expect("detach cannot fail")
    }

    /// LoRA training: the base weights detached (frozen: no gradient, no optimizer state), the
    /// adapters still variables; the six projections frozen as `cfg.lora_base` says.
    pub fn frozen(&self) -> Result<Self> {
        self.frozen_with(self.cfg.lora_base, false)
    }

    /// A serving copy whose six projections run through the frozen-linear op over `mode`'s
    /// weights (`q4_0`, `q8_0`: quantized inference); everything detached.
    pub fn serving(&self, mode: LoraBase) -> Result<Self> {
        self.frozen_with(mode, true)
    }

    fn frozen_with(&self, mode: LoraBase, detach_adapters: bool) -> Result<Self> {
        let base = |t: &Tensor| Ok(t.detach());
        let adapter = |t: &Tensor| {
            Ok(if detach_adapters {
                t.detach()
            } else {
                t.clone()
            })
        };
        let mut m = self.map(&base, &adapter, self.dtype)?;
        for b in &mut m.blocks {
            for p in [
                &mut b.attn.q,
                &mut b.attn.k,
                &mut b.attn.v,
                &mut b.attn.o,
                &mut b.mlp.fc1,
                &mut b.mlp.fc2,
            ] {
                *p = p.freeze(mode)?;
            }
        }
        Ok(m)
    }

    /// A copy with `base` applied to every base weight and `adapter` to every LoRA tensor, in
    /// model order (for each projection: weight, bias, A, B).
    fn map(
        &self,
        base: &dyn Fn(&Tensor) -> Result<Tensor>,
        adapter: &dyn Fn(&Tensor) -> Result<Tensor>,
        dtype: DType,
    ) -> Result<Self> {
        let ln = |l: &LayerNorm| -> Result<LayerNorm> {
            Ok(LayerNorm {
                weight: base(&l.weight)?,
                bias: base(&l.bias)?,
                eps: l.eps,
            })
        };
        let stem = match &self.stem {
            Stem::Tokens(wte) => {
                Stem::Tokens(Embedding::new(base(wte.embeddings())?, self.cfg.hidden))
            }
            Stem::Patches { proj, cls, patch } => Stem::Patches {
                proj: Linear::new(base(proj.weight())?, proj.bias().map(base).transpose()?),
                cls: base(cls)?,
                patch: *patch,
            },
        };
        Ok(Self {
            stem,
            wpe: base(&self.wpe)?,
            blocks: self
                .blocks
                .iter()
                .map(|b| {
                    Ok(Block {
                        ln1: ln(&b.ln1)?,
                        attn: Attention {
                            q: b.attn.q.map(base, adapter)?,
                            k: b.attn.k.map(base, adapter)?,
                            v: b.attn.v.map(base, adapter)?,
                            o: b.attn.o.map(base, adapter)?,
                            heads: b.attn.heads,
                            efficient: b.attn.efficient,
                        },
                        ln2: ln(&b.ln2)?,
                        mlp: Mlp {
                            fc1: b.mlp.fc1.map(base, adapter)?,
                            fc2: b.mlp.fc2.map(base, adapter)?,
                        },
                    })
                })
                .collect::<Result<Vec<_>>>()?,
            ln_f: ln(&self.ln_f)?,
            head: Linear::new(
                base(self.head.weight())?,
                self.head.bias().map(base).transpose()?,
            ),
            cfg: self.cfg.clone(),
            dtype,
        })
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
