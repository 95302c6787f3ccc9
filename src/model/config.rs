//! A model's shape: [`Config`] (sizes, family, variants) with its presets, parameter counts
//! and the projections of a block ([`block_projections`]).

use serde::{Deserialize, Serialize};

use super::kernels::Kernels;
use super::llama::{self, Llama};
use super::transformer::{LoraBase, LoraTarget};
use super::vit::{self, Vision};

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
        let proj = |p: &ProjSpec| (p.inp * p.out + if p.bias { p.out } else { 0 }) as u64;
        let projs = self.projections();
        // A mixture of experts: E copies of the MLP projections and the router `H·E`.
        let block: u64 = match self.llama.and_then(|l| l.moe) {
            None => projs.iter().map(proj).sum::<u64>(),
            Some(m) => {
                let e = m.experts as u64;
                projs[..4].iter().map(proj).sum::<u64>()
                    + e * projs[4..].iter().map(proj).sum::<u64>()
                    + h * e
            }
        } + self.norm_params();
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

    /// Parameters a token uses (a mixture of experts: the router and its `k` experts of each
    /// layer, not all `E`); the parameter count otherwise.
    pub fn active_params(&self) -> u64 {
        match self.llama.and_then(|l| l.moe) {
            None => self.params(),
            Some(m) => {
                let mlp: u64 = self.projections()[4..]
                    .iter()
                    .map(|p| (p.inp * p.out + if p.bias { p.out } else { 0 }) as u64)
                    .sum();
                self.params() - self.layers as u64 * (m.experts - m.top_k) as u64 * mlp
            }
        }
    }

    /// Parameters of a block's norms: LayerNorm weight and bias `4H`, RMSNorm weight `2H`
    /// (and Qwen3's q/k norms `2D`).
    fn norm_params(&self) -> u64 {
        let h = self.hidden as u64;
        match self.llama {
            None => 4 * h,
            Some(l) if l.qk_norm => 2 * h + 2 * l.head_dim as u64,
            Some(_) => 2 * h,
        }
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
