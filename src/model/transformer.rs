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
use super::kernels::{self, Kernels};
use super::llama::{self, Llama};
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
    /// Attention as the tiled composition of [`super::tiled_attention`] (every device and
    /// type; what `efficient` runs on CUDA).
    #[serde(default)]
    pub tiled_attention: bool,
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
    /// A LLaMA-family decoder ([`super::llama`]): RMSNorm, rotary positions (no position
    /// table), grouped-query attention, SwiGLU.
    #[serde(default)]
    pub llama: Option<Llama>,
    /// The LM head is the token embedding itself (`tie_word_embeddings`).
    #[serde(default)]
    pub tied: bool,
    /// Base of the rotary angles (`rope_theta`; LLaMA only).
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    /// Fused kernels with a backward ([`super::kernels`]) or candle's composed ops for the
    /// norms, attention softmax, activations and loss.
    #[serde(default)]
    pub kernels: Kernels,
}

fn default_rope_theta() -> f64 {
    10_000.0
}

/// One projection of a block: its LoRA target, its path under the block, `in → out`, bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProjSpec {
    pub target: LoraTarget,
    pub path: &'static str,
    pub inp: usize,
    pub out: usize,
    pub bias: bool,
}

/// The projections of one block, in model order: GPT q, k, v, o `H → H` and fc1 `H → 4H`,
/// fc2 `4H → H`, all with bias; LLaMA q `H → A·D`, k and v `H → G·D`, o `A·D → H`, gate and
/// up `H → I`, down `I → H`, with the biases the config names.
pub fn block_projections(hidden: usize, heads: usize, llama: Option<&Llama>) -> Vec<ProjSpec> {
    let p = |target, path, inp, out, bias| ProjSpec {
        target,
        path,
        inp,
        out,
        bias,
    };
    let h = hidden;
    match llama {
        None => vec![
            p(LoraTarget::Q, "attn.q", h, h, true),
            p(LoraTarget::K, "attn.k", h, h, true),
            p(LoraTarget::V, "attn.v", h, h, true),
            p(LoraTarget::O, "attn.o", h, h, true),
            p(LoraTarget::Fc1, "mlp.fc1", h, 4 * h, true),
            p(LoraTarget::Fc2, "mlp.fc2", 4 * h, h, true),
        ],
        Some(l) => {
            let (q, kv, i) = (heads * l.head_dim, l.kv_heads * l.head_dim, l.intermediate);
            vec![
                p(LoraTarget::Q, "attn.q", h, q, l.qkv_bias),
                p(LoraTarget::K, "attn.k", h, kv, l.qkv_bias),
                p(LoraTarget::V, "attn.v", h, kv, l.qkv_bias),
                p(LoraTarget::O, "attn.o", q, h, l.o_bias),
                p(LoraTarget::Gate, "mlp.gate", h, i, l.mlp_bias),
                p(LoraTarget::Up, "mlp.up", h, i, l.mlp_bias),
                p(LoraTarget::Down, "mlp.down", i, h, l.mlp_bias),
            ]
        }
    }
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
            tiled_attention: false,
            lora_rank: 0,
            lora_targets: Vec::new(),
            lora_base: LoraBase::Op,
            vision: None,
            llama: None,
            tied: false,
            rope_theta: default_rope_theta(),
            kernels: Kernels::Composed,
        }
    }

    /// A LLaMA-family decoder ([`super::llama`]); the RMSNorm epsilon is 1e-5 and θ 10,000
    /// until set.
    pub fn llama(
        vocab: usize,
        hidden: usize,
        heads: usize,
        layers: usize,
        max_seq: usize,
        llama: Llama,
        tied: bool,
    ) -> Self {
        let mut cfg = Self::new(vocab, hidden, heads, layers, max_seq);
        cfg.llama = Some(llama);
        cfg.tied = tied;
        cfg
    }

    /// K/V heads (the query heads outside LLaMA).
    pub fn kv_heads(&self) -> usize {
        self.llama.map_or(self.heads, |l| l.kv_heads)
    }

    /// Width of one head (`H/A` outside LLaMA).
    pub fn head_dim(&self) -> usize {
        self.llama.map_or(self.hidden / self.heads, |l| l.head_dim)
    }

    /// The projections of one block ([`block_projections`]).
    pub fn projections(&self) -> Vec<ProjSpec> {
        block_projections(self.hidden, self.heads, self.llama.as_ref())
    }

    /// The LoRA targets this family has.
    pub fn lora_target_names(&self) -> &'static str {
        if self.llama.is_some() {
            "q, k, v, o, gate, up, down, all"
        } else {
            "q, k, v, o, fc1, fc2, all"
        }
    }

    pub fn preset(name: &str) -> Option<Self> {
        match name {
            "tiny" => Some(Self::tiny()),
            "small" => Some(Self::small()),
            "gpt2-small" => Some(Self::gpt2_small()),
            "gpt2-medium" => Some(Self::gpt2_medium()),
            "llama-7b-shape" => Some(Self::llama_7b_shape()),
            _ => vit::preset(name)
                .map(Self::vit)
                .or_else(|| llama::preset(name)),
        }
    }

    /// Exact parameter count (see the module docs, [`super::vit`]'s and [`super::llama`]'s).
    pub fn params(&self) -> u64 {
        let (v, h, l, s) = (
            self.vocab as u64,
            self.hidden as u64,
            self.layers as u64,
            self.max_seq as u64,
        );
        let head = if self.tied { 0 } else { v * h };
        let block: u64 = self
            .projections()
            .iter()
            .map(|p| (p.inp * p.out + if p.bias { p.out } else { 0 }) as u64)
            .sum::<u64>()
            + self.norm_params();
        let outside = match (self.vision, self.llama) {
            // Token table, position table, final LayerNorm, head.
            (None, None) => v * h + s * h + 2 * h + head,
            // Patch projection with bias, class token, positions, final LayerNorm, classifier
            // with bias.
            (Some(vis), _) => vis.patch_dim() as u64 * h + 2 * h + s * h + 2 * h + v * h + v,
            // Token table, final RMSNorm, head.
            (None, Some(_)) => v * h + h + head,
        };
        outside + l * block + self.lora_params()
    }

    /// Parameters of a block's two norms: LayerNorm weight and bias `4H`, RMSNorm weight `2H`.
    fn norm_params(&self) -> u64 {
        let h = self.hidden as u64;
        if self.llama.is_some() { 2 * h } else { 4 * h }
    }

    /// Parameters of the LoRA adapters: `L · Σ_targets r·(in + out)`.
    pub fn lora_params(&self) -> u64 {
        if self.lora_rank == 0 {
            return 0;
        }
        let r = self.lora_rank as u64;
        let per_layer: u64 = self
            .projections()
            .iter()
            .filter(|p| self.lora_targets.contains(&p.target))
            .map(|p| r * (p.inp + p.out) as u64)
            .sum();
        self.layers as u64 * per_layer
    }

    /// Number of parameter tensors (each costs a little allocator metadata).
    pub fn param_tensors(&self) -> u64 {
        // GPT: wte, wpe, lnf (2), head; per block: ln1 2, q/k/v/o 8, ln2 2, fc1 2, fc2 2. ViT:
        // patch (2), cls, wpe, lnf (2), head (2). LLaMA: wte, ln_f, head; per block two norms
        // and the projections' weights and biases.
        let tied = u64::from(self.tied);
        let per_block = self
            .projections()
            .iter()
            .map(|p| 1 + u64::from(p.bias))
            .sum::<u64>()
            + if self.llama.is_some() { 2 } else { 4 };
        let outside = match (self.vision, self.llama) {
            (Some(_), _) => 8,
            (None, None) => 5 - tied,
            (None, Some(_)) => 3 - tied,
        };
        outside + per_block * self.layers as u64
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
    /// [`kernels::layer_norm`] instead of `layer_norm_slow`.
    fused: bool,
}

impl LayerNorm {
    pub fn new(size: usize, eps: f64, fused: bool, vb: VarBuilder) -> Result<Self> {
        let weight = vb.get_with_hints(size, "weight", Init::Const(1.0))?;
        let bias = vb.get_with_hints(size, "bias", Init::Const(0.0))?;
        Ok(Self {
            weight,
            bias,
            eps,
            fused,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.fused {
            return kernels::layer_norm(x, &self.weight, &self.bias, self.eps as f32);
        }
        ops::layer_norm_slow(x, &self.weight, &self.bias, self.eps as f32)
    }
}

/// The block's normalisation: LayerNorm (GPT, ViT) or RMSNorm (LLaMA: weight only, computed
/// with `ops::rms_norm_slow`, which has a backward; `ops::rms_norm` has none).
#[derive(Debug, Clone)]
pub enum Norm {
    Layer(LayerNorm),
    Rms {
        weight: Tensor,
        eps: f64,
        fused: bool,
    },
}

impl Norm {
    pub fn new(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        match cfg.llama {
            None => Ok(Norm::Layer(LayerNorm::new(
                cfg.hidden,
                cfg.layer_norm_eps,
                cfg.kernels.fused(),
                vb,
            )?)),
            Some(_) => Ok(Norm::Rms {
                weight: vb.get_with_hints(cfg.hidden, "weight", Init::Const(1.0))?,
                eps: cfg.layer_norm_eps,
                fused: cfg.kernels.fused(),
            }),
        }
    }

    fn map(&self, f: &dyn Fn(&Tensor) -> Result<Tensor>) -> Result<Self> {
        Ok(match self {
            Norm::Layer(l) => Norm::Layer(LayerNorm {
                weight: f(&l.weight)?,
                bias: f(&l.bias)?,
                eps: l.eps,
                fused: l.fused,
            }),
            Norm::Rms { weight, eps, fused } => Norm::Rms {
                weight: f(weight)?,
                eps: *eps,
                fused: *fused,
            },
        })
    }
}

impl Module for Norm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Norm::Layer(l) => l.forward(x),
            Norm::Rms {
                weight,
                eps,
                fused: true,
            } => kernels::rms_norm(x, weight, *eps as f32),
            Norm::Rms { weight, eps, .. } => ops::rms_norm_slow(x, weight, *eps as f32),
        }
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
    /// With a bias and no frozen base: one [`kernels::linear`] op.
    pub fused: bool,
}

impl Proj {
    /// The projection `spec` (`in → out`, with or without bias); an adapter of rank
    /// `cfg.lora_rank` when its target is adapted.
    fn new(spec: &ProjSpec, cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let vb = vb.pp(spec.path.rsplit('.').next().expect("a path"));
        let (inp, out) = (spec.inp, spec.out);
        let lora = if cfg.lora_rank > 0 && cfg.lora_targets.contains(&spec.target) {
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
        let linear = if spec.bias {
            linear(inp, out, vb)?
        } else {
            linear_no_bias(inp, out, vb)?
        };
        Ok(Self {
            linear,
            lora,
            frozen: None,
            fused: cfg.kernels.fused(),
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
            fused: self.fused,
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
            fused: self.fused,
        })
    }
}

impl Module for Proj {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match (&self.frozen, self.linear.bias()) {
            (None, Some(b)) if self.fused => kernels::linear(x, self.linear.weight(), b)?,
            (None, _) => self.linear.forward(x)?,
            (Some(w), _) => {
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
    /// LLaMA's SwiGLU projections.
    Gate,
    Up,
    Down,
}

impl LoraTarget {
    pub const ALL: [LoraTarget; 9] = [
        Self::Q,
        Self::K,
        Self::V,
        Self::O,
        Self::Fc1,
        Self::Fc2,
        Self::Gate,
        Self::Up,
        Self::Down,
    ];

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
            Self::Gate => "gate",
            Self::Up => "up",
            Self::Down => "down",
        }
    }
}

/// The rotary tables of a LLaMA model and the position of the first token: what a block needs
/// to embed positions.
#[derive(Debug, Clone, Copy)]
pub struct Rotary<'a> {
    pub cos: &'a Tensor,
    pub sin: &'a Tensor,
    pub offset: usize,
}

/// Multi-head causal self-attention with separate q, k, v, o projections; with `kv_heads` <
/// `heads` (LLaMA's grouped-query attention) k and v have fewer heads and are repeated before
/// the scores ([`llama::repeat_kv`]).
#[derive(Debug, Clone)]
pub struct Attention {
    q: Proj,
    k: Proj,
    v: Proj,
    o: Proj,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    efficient: bool,
    /// [`super::tiled_attention`].
    tiled: bool,
    /// [`kernels::attn_probs`] instead of the composed scores, mask and softmax.
    fused: bool,
    /// A decoder (causal); the ViT encoder attends everywhere.
    causal: bool,
}

impl Attention {
    /// `projs` are the block's q, k, v, o.
    fn new(cfg: &Config, projs: &[ProjSpec], vb: VarBuilder) -> Result<Self> {
        let p = |i: usize| Proj::new(&projs[i], cfg, vb.clone());
        Ok(Self {
            q: p(0)?,
            k: p(1)?,
            v: p(2)?,
            o: p(3)?,
            heads: cfg.heads,
            kv_heads: cfg.kv_heads(),
            head_dim: cfg.head_dim(),
            efficient: cfg.efficient_attention,
            tiled: cfg.tiled_attention,
            fused: cfg.kernels.fused(),
            causal: cfg.vision.is_none(),
        })
    }

    /// `x (B, S, H)`, `mask (S, S)` with 0 on and below the diagonal and −∞ above (decoder),
    /// or none (encoder: every position attends to every position).
    pub fn forward(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        rotary: Option<Rotary>,
    ) -> Result<Tensor> {
        let (q, k, v) = self.qkv(x, rotary)?;
        let group = self.heads / self.kv_heads;
        let k = llama::repeat_kv(k, group)?;
        let v = llama::repeat_kv(v, group)?;
        if self.tiled {
            let (b, _, s, d) = q.dims4()?;
            let scale = (1.0 / (d as f64).sqrt()) as f32;
            let y = super::tiled_attention::attention(&q, &k, &v, scale, self.causal)?;
            drop((q, k, v));
            let y = y.transpose(1, 2)?.reshape((b, s, self.heads * d))?;
            return self.o.forward(&y);
        }
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

    /// The queries `(B, A, S, D)` and the keys and values `(B, G, S, D)` of `x (B, S, H)`,
    /// contiguous; with rotary tables, queries and keys rotated.
    fn qkv(&self, x: &Tensor, rotary: Option<Rotary>) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, s, _h) = x.dims3()?;
        let d = self.head_dim;
        let split = |t: Tensor, n: usize| -> Result<Tensor> {
            t.reshape((b, s, n, d))?.transpose(1, 2)?.contiguous()
        };
        let rotate = |t: Tensor| -> Result<Tensor> {
            match rotary {
                None => Ok(t),
                Some(r) if self.fused => kernels::rotary(
                    &t,
                    &r.cos.narrow(0, r.offset, s)?,
                    &r.sin.narrow(0, r.offset, s)?,
                ),
                Some(r) => llama::apply_rotary(&t, r.cos, r.sin, r.offset),
            }
        };
        let q = rotate(split(self.q.forward(x)?, self.heads)?)?;
        let k = rotate(split(self.k.forward(x)?, self.kv_heads)?)?;
        let v = split(self.v.forward(x)?, self.kv_heads)?;
        Ok((q, k, v))
    }

    /// `softmax(q·kᵀ/√D + mask)·v` with the heads merged back to `(B, S, A·D)`, through `o`;
    /// each intermediate is freed as soon as the next exists.
    ///
    /// Fused: the probabilities in one op ([`kernels::attn_probs`]), causal for a decoder
    /// (no mask tensor: a single cached query sees every key, a prompt is masked).
    fn attend(&self, q: Tensor, k: Tensor, v: Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let (b, _, s, d) = q.dims4()?;
        if self.fused {
            let scale = (1.0 / (d as f64).sqrt()) as f32;
            let probs = kernels::attn_probs(&q, &k, scale, self.causal)?;
            drop((q, k));
            let y = probs.matmul(&v)?;
            drop((probs, v));
            let y = y.transpose(1, 2)?.reshape((b, s, self.heads * d))?;
            return self.o.forward(&y);
        }
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

    /// Inference with a key/value cache `(B, G, T, D)` each (at the K/V heads): the new keys
    /// and values are appended (`Tensor::cat`, a new allocation; the old cache is freed
    /// after), then repeated to the query heads for this step only, and the queries attend to
    /// every cached position (`mask` only for a prompt of several tokens).
    pub fn forward_cached(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        rotary: Option<Rotary>,
        cache: &mut Option<(Tensor, Tensor)>,
    ) -> Result<Tensor> {
        let (q, k, v) = self.qkv(x, rotary)?;
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
        let group = self.heads / self.kv_heads;
        let k = llama::repeat_kv(k, group)?;
        let v = llama::repeat_kv(v, group)?;
        self.attend(q, k, v, mask)
    }

    fn projs_mut(&mut self) -> [&mut Proj; 4] {
        [&mut self.q, &mut self.k, &mut self.v, &mut self.o]
    }
}

/// Position-wise MLP: GPT's `fc2(gelu(fc1(x)))` (width 4H, GELU with the tanh approximation)
/// or LLaMA's SwiGLU `down(silu(gate(x)) · up(x))` (width I).
#[derive(Debug, Clone)]
pub enum Mlp {
    Gelu {
        fc1: Proj,
        fc2: Proj,
        fused: bool,
    },
    SwiGlu {
        gate: Proj,
        up: Proj,
        down: Proj,
        fused: bool,
    },
}

impl Mlp {
    /// `projs` are the block's MLP projections (fc1, fc2 or gate, up, down).
    fn new(cfg: &Config, projs: &[ProjSpec], vb: VarBuilder) -> Result<Self> {
        let p = |i: usize| Proj::new(&projs[i], cfg, vb.clone());
        let fused = cfg.kernels.fused();
        Ok(match projs.len() {
            2 => Mlp::Gelu {
                fc1: p(0)?,
                fc2: p(1)?,
                fused,
            },
            _ => Mlp::SwiGlu {
                gate: p(0)?,
                up: p(1)?,
                down: p(2)?,
                fused,
            },
        })
    }

    fn projs_mut(&mut self) -> Vec<&mut Proj> {
        match self {
            Mlp::Gelu { fc1, fc2, .. } => vec![fc1, fc2],
            Mlp::SwiGlu { gate, up, down, .. } => vec![gate, up, down],
        }
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Mlp::Gelu {
                fc1,
                fc2,
                fused: true,
            } => {
                let a = kernels::gelu(&fc1.forward(x)?)?;
                fc2.forward(&a)
            }
            Mlp::Gelu { fc1, fc2, .. } => {
                let a = fc1.forward(x)?.gelu()?;
                fc2.forward(&a)
            }
            Mlp::SwiGlu {
                gate,
                up,
                down,
                fused: true,
            } => {
                let g = gate.forward(x)?;
                let u = up.forward(x)?;
                let m = kernels::silu_mul(&g, &u)?;
                drop((g, u));
                down.forward(&m)
            }
            Mlp::SwiGlu { gate, up, down, .. } => {
                let g = gate.forward(x)?.silu()?;
                let u = up.forward(x)?;
                let m = g.mul(&u)?;
                drop((g, u));
                down.forward(&m)
            }
        }
    }
}

/// Pre-norm block: `x + attn(ln1(x))`, then `x + mlp(ln2(x))`.
#[derive(Debug, Clone)]
pub struct Block {
    ln1: Norm,
    attn: Attention,
    ln2: Norm,
    mlp: Mlp,
}

impl Block {
    pub fn new(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let projs = cfg.projections();
        Ok(Self {
            ln1: Norm::new(cfg, vb.pp("ln1"))?,
            attn: Attention::new(cfg, &projs[..4], vb.pp("attn"))?,
            ln2: Norm::new(cfg, vb.pp("ln2"))?,
            mlp: Mlp::new(cfg, &projs[4..], vb.pp("mlp"))?,
        })
    }

    pub fn forward(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        rotary: Option<Rotary>,
    ) -> Result<Tensor> {
        let a = self.attn.forward(&self.ln1.forward(x)?, mask, rotary)?;
        let x = (x + a)?;
        let m = self.mlp.forward(&self.ln2.forward(&x)?)?;
        x + m
    }

    /// [`Block::forward`] with the attention's key/value cache.
    pub fn forward_cached(
        &self,
        x: &Tensor,
        mask: Option<&Tensor>,
        rotary: Option<Rotary>,
        cache: &mut Option<(Tensor, Tensor)>,
    ) -> Result<Tensor> {
        let a = self
            .attn
            .forward_cached(&self.ln1.forward(x)?, mask, rotary, cache)?;
        let x = (x + a)?;
        let m = self.mlp.forward(&self.ln2.forward(&x)?)?;
        x + m
    }

    /// The block's projections in model order.
    fn projs_mut(&mut self) -> Vec<&mut Proj> {
        let mut v: Vec<&mut Proj> = self.attn.projs_mut().into_iter().collect();
        v.extend(self.mlp.projs_mut());
        v
    }

    fn map(
        &self,
        base: &dyn Fn(&Tensor) -> Result<Tensor>,
        adapter: &dyn Fn(&Tensor) -> Result<Tensor>,
    ) -> Result<Self> {
        let a = &self.attn;
        Ok(Block {
            ln1: self.ln1.map(base)?,
            attn: Attention {
                q: a.q.map(base, adapter)?,
                k: a.k.map(base, adapter)?,
                v: a.v.map(base, adapter)?,
                o: a.o.map(base, adapter)?,
                ..a.clone()
            },
            ln2: self.ln2.map(base)?,
            mlp: match &self.mlp {
                Mlp::Gelu { fc1, fc2, fused } => Mlp::Gelu {
                    fc1: fc1.map(base, adapter)?,
                    fc2: fc2.map(base, adapter)?,
                    fused: *fused,
                },
                Mlp::SwiGlu {
                    gate,
                    up,
                    down,
                    fused,
                } => Mlp::SwiGlu {
                    gate: gate.map(base, adapter)?,
                    up: up.map(base, adapter)?,
                    down: down.map(base, adapter)?,
                    fused: *fused,
                },
            },
        })
    }
}

/// The key/value cache of a decoder: per block, keys and values `(B, G, T, D)` (G = A outside
/// LLaMA).
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
    /// Position embeddings `(S_max, H)` (GPT, ViT).
    wpe: Option<Tensor>,
    /// Rotary tables cos and sin `(S_max, D/2)` (LLaMA).
    rope: Option<(Tensor, Tensor)>,
    blocks: Vec<Block>,
    ln_f: Norm,
    head: Linear,
    cfg: Config,
    /// Element type of the weights (the causal mask is converted to it).
    dtype: DType,
}

impl Transformer {
    pub fn new(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        // The rotary tables first: their f32 originals are freed before the weights exist.
        let rope = match cfg.llama {
            None => None,
            Some(l) => Some(llama::rotary_tables(
                cfg.max_seq,
                l.head_dim,
                cfg.rope_theta,
                vb.dtype(),
                vb.device(),
            )?),
        };
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
        let wpe = match cfg.llama {
            Some(_) => None,
            None => Some(vb.get_with_hints(
                (cfg.max_seq, cfg.hidden),
                "wpe",
                Init::Randn {
                    mean: 0.,
                    stdev: 0.02,
                },
            )?),
        };
        let blocks = (0..cfg.layers)
            .map(|i| Block::new(cfg, vb.pp(format!("h.{i}"))))
            .collect::<Result<Vec<_>>>()?;
        let ln_f = Norm::new(cfg, vb.pp("ln_f"))?;
        let head = match (&stem, cfg.vision, cfg.tied) {
            (Stem::Tokens(wte), None, true) => Linear::new(wte.embeddings().clone(), None),
            (_, None, _) => linear_no_bias(cfg.hidden, cfg.vocab, vb.pp("head"))?,
            (_, Some(_), _) => linear(cfg.hidden, cfg.vocab, vb.pp("head"))?,
        };
        let dtype = vb.dtype();
        Ok(Self {
            stem,
            wpe,
            rope,
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

    /// The rotary tables at positions `offset..` (LLaMA), or none.
    fn rotary(&self, offset: usize) -> Option<Rotary<'_>> {
        self.rope
            .as_ref()
            .map(|(cos, sin)| Rotary { cos, sin, offset })
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
            x = block.forward(&x, mask.as_ref(), self.rotary(0))?;
        }
        self.head_forward(&x)
    }

    /// The attention mask for `input`: the causal mask of its length (decoder), none (ViT).
    pub fn input_mask(&self, input: &Tensor) -> Result<Option<Tensor>> {
        match self.stem {
            Stem::Tokens(_) if self.needs_mask() => {
                Ok(Some(self.mask(input.dim(1)?, input.device())?))
            }
            _ => Ok(None),
        }
    }

    /// Whether the decoder's attention adds a mask tensor: not with fused kernels, whose
    /// attention masks inside ([`kernels::attn_probs`]).
    pub fn needs_mask(&self) -> bool {
        !self.cfg.kernels.fused()
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
        let mask = if s > 1 && self.needs_mask() {
            Some(self.mask(s, tokens.device())?)
        } else {
            None
        };
        let mut x = match &self.wpe {
            Some(wpe) => {
                let pos = wpe.narrow(0, offset, s)?;
                wte.forward(tokens)?.broadcast_add(&pos)?
            }
            None => wte.forward(tokens)?,
        };
        for (block, c) in self.blocks.iter().zip(cache.layers.iter_mut()) {
            x = block.forward_cached(&x, mask.as_ref(), self.rotary(offset), c)?;
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

    /// Token plus position embedding (LLaMA: the token embedding; positions are rotary):
    /// `tokens (B, S)` → `(B, S, H)`. ViT: the patches projected, the class token in front,
    /// plus position embedding: `images (B, C, I, I)` → `(B, N + 1, H)`.
    pub fn embed(&self, input: &Tensor) -> Result<Tensor> {
        match &self.stem {
            Stem::Tokens(wte) => {
                let (_b, s) = input.dims2()?;
                if s > self.cfg.max_seq {
                    candle_core::bail!("sequence {s} is longer than max_seq {}", self.cfg.max_seq)
                }
                match &self.wpe {
                    Some(wpe) => {
                        let pos = wpe.narrow(0, 0, s)?;
                        wte.forward(input)?.broadcast_add(&pos)
                    }
                    None => wte.forward(input),
                }
            }
            Stem::Patches { proj, cls, patch } => {
                let wpe = self.wpe.as_ref().expect("a ViT has a position table");
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
                x.broadcast_add(wpe)
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
            x = block.forward(&x, mask, self.rotary(0))?;
        }
        Ok(x)
    }

    /// Final norm and LM head: `(B, S, H)` → logits `(B, S, V)`. ViT: the class token
    /// only (taken first: the LayerNorm is per position), `(B, 1, K)`.
    pub fn head_forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = match self.stem {
            Stem::Tokens(_) => self.ln_f.forward(x)?,
            Stem::Patches { .. } => self.ln_f.forward(&x.narrow(1, 0, 1)?.contiguous()?)?,
        };
        self.head.forward(&x)
    }

    /// Mean cross-entropy of `logits (B, S, V)` against `targets (B, S)` u32 (candle-nn's
    /// composed `cross_entropy`).
    pub fn loss(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        Self::loss_with(Kernels::Composed, logits, targets)
    }

    /// [`Transformer::loss`] with the model's kernels ([`kernels::cross_entropy`] when fused).
    pub fn train_loss(&self, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        Self::loss_with(self.cfg.kernels, logits, targets)
    }

    /// Mean cross-entropy with the given kernels.
    pub fn loss_with(kernels: Kernels, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        let (b, s, v) = logits.dims3()?;
        let (logits, targets) = (logits.reshape((b * s, v))?, targets.flatten_all()?);
        match kernels {
            Kernels::Fused => kernels::cross_entropy(&logits, &targets),
            Kernels::Composed => candle_nn::loss::cross_entropy(&logits, &targets),
        }
    }

    /// A copy of the model whose weights are `w.to_dtype(dtype)` (mixed precision's 16-bit
    /// working copy). With variables the conversions are recorded, so the gradients flow back,
    /// converted, to the f32 master weights; the copies (`2·P` bytes for 16 bits) live as long
    /// as the copy or a graph that uses it. The rotary tables are converted too.
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
    /// adapters still variables; the block projections frozen as `cfg.lora_base` says.
    pub fn frozen(&self) -> Result<Self> {
        self.frozen_with(self.cfg.lora_base, false)
    }

    /// A serving copy whose block projections run through the frozen-linear op over `mode`'s
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
            for p in b.projs_mut() {
                *p = p.freeze(mode)?;
            }
        }
        Ok(m)
    }

    /// A copy with `base` applied to every base weight (and the rotary tables) and `adapter`
    /// to every LoRA tensor, in model order (for each projection: weight, bias, A, B). A tied
    /// head is the mapped token table itself.
    fn map(
        &self,
        base: &dyn Fn(&Tensor) -> Result<Tensor>,
        adapter: &dyn Fn(&Tensor) -> Result<Tensor>,
        dtype: DType,
    ) -> Result<Self> {
        let rope = match &self.rope {
            None => None,
            Some((c, s)) => Some((base(c)?, base(s)?)),
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
        let wpe = self.wpe.as_ref().map(base).transpose()?;
        let blocks = self
            .blocks
            .iter()
            .map(|b| b.map(base, adapter))
            .collect::<Result<Vec<_>>>()?;
        let ln_f = self.ln_f.map(base)?;
        let head = match (&stem, self.cfg.tied) {
            (Stem::Tokens(wte), true) => Linear::new(wte.embeddings().clone(), None),
            _ => Linear::new(
                base(self.head.weight())?,
                self.head.bias().map(base).transpose()?,
            ),
        };
        Ok(Self {
            stem,
            wpe,
            rope,
            blocks,
            ln_f,
            head,
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
