//! A model's shape: [`Config`] (sizes, family, variants) with its presets, parameter counts
//! and the projections of a block ([`block_projections`]).

use serde::{Deserialize, Serialize};

use super::kernels::Kernels;
use super::shapes::{GatedDelta, Llama, LoraBase, LoraTarget, MlaShape, MoeShape, Sizes, Vision};

/// A model's shape: the sizes every family has (`vocab` is a ViT's classes), the GPT decoder by
/// default, a ViT with `vision`, the LLaMA family with `llama`.
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
    /// How the rotary angles stretch (`rope_scaling`; none: the default angles).
    #[serde(default)]
    pub rope_scaling: Option<super::shapes::RopeScaling>,
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

impl ProjSpec {
    pub const fn new(
        target: LoraTarget,
        path: &'static str,
        inp: usize,
        out: usize,
        bias: bool,
    ) -> Self {
        Self {
            target,
            path,
            inp,
            out,
            bias,
        }
    }
}

/// The projections of one block, in model order: GPT q, k, v, o `H → H` and fc1 `H → 4H`,
/// fc2 `4H → H`, all with bias; LLaMA q `H → A·D`, k and v `H → G·D`, o `A·D → H`, gate and
/// up `H → I`, down `I → H`, with the biases the config names; MLA's attention projections
/// ([`mla_projections`]) instead of q, k, v, o. A mixture of experts: one expert's
/// gate, up, down (width `I`); [`layer_layout`] gives each layer's own.
pub fn block_projections(hidden: usize, heads: usize, llama: Option<&Llama>) -> Vec<ProjSpec> {
    let mut v = attn_projections(hidden, heads, llama);
    v.extend(mlp_projections(
        hidden,
        llama.map_or(4 * hidden, |l| l.intermediate),
        llama,
    ));
    v
}

/// The attention's projections (GPT, LLaMA: q, k, v, o; MLA: its own).
pub fn attn_projections(hidden: usize, heads: usize, llama: Option<&Llama>) -> Vec<ProjSpec> {
    let p = ProjSpec::new;
    let h = hidden;
    match llama {
        None => vec![
            p(LoraTarget::Q, "attn.q", h, h, true),
            p(LoraTarget::K, "attn.k", h, h, true),
            p(LoraTarget::V, "attn.v", h, h, true),
            p(LoraTarget::O, "attn.o", h, h, true),
        ],
        Some(l) => match &l.mla {
            Some(m) => mla_projections(h, heads, m, l.o_bias),
            None => {
                let (q, kv) = (heads * l.head_dim, l.kv_heads * l.head_dim);
                // Qwen3-Next: each query head followed by its output gate's.
                let gated = if l.variant.attn_output_gate { 2 } else { 1 };
                vec![
                    p(LoraTarget::Q, "attn.q", h, gated * q, l.qkv_bias),
                    p(LoraTarget::K, "attn.k", h, kv, l.qkv_bias),
                    p(LoraTarget::V, "attn.v", h, kv, l.qkv_bias),
                    p(LoraTarget::O, "attn.o", q, h, l.o_bias),
                ]
            }
        },
    }
}

/// The projections of a Gated DeltaNet layer (Qwen3-Next's linear attention) that take an
/// adapter, in model order: `qkvz` `H → 2·Kd + 2·Vd` (as a query's target) and `out`
/// `Vd → H` (as o's); its `ba` projection is a plain linear ([`block_tensors`]).
pub fn linear_attn_projections(hidden: usize, g: &GatedDelta) -> Vec<ProjSpec> {
    let p = ProjSpec::new;
    let (kd, vd) = (g.key_width(), g.value_width());
    vec![
        p(LoraTarget::Q, "attn.qkvz", hidden, 2 * kd + 2 * vd, false),
        p(LoraTarget::O, "attn.out", vd, hidden, false),
    ]
}

/// The projections of an MLA attention in model order: `q_a`, `q_b` (or `q`), `kv_a`, `kv_b`,
/// `o` (`attention_bias` on `q_a`, `kv_a` and `o`).
pub fn mla_projections(hidden: usize, heads: usize, m: &MlaShape, bias: bool) -> Vec<ProjSpec> {
    use super::shapes::LoraTarget as T;
    let p = ProjSpec::new;
    let dq = m.qk_head_dim();
    let mut v = match m.q_lora_rank {
        None => vec![p(T::Q, "attn.q", hidden, heads * dq, false)],
        Some(r) => vec![
            p(T::Q, "attn.q_a", hidden, r, bias),
            p(T::Q, "attn.q_b", r, heads * dq, false),
        ],
    };
    v.extend([
        p(
            T::K,
            "attn.kv_a",
            hidden,
            m.kv_lora_rank + m.qk_rope_head_dim,
            bias,
        ),
        p(
            T::V,
            "attn.kv_b",
            m.kv_lora_rank,
            heads * (m.qk_nope_head_dim + m.v_head_dim),
            false,
        ),
        p(T::O, "attn.o", heads * m.v_head_dim, hidden, bias),
    ]);
    v
}

/// An MLP's projections of width `width`: GPT fc1, fc2 (biased); LLaMA gate, up, down.
pub fn mlp_projections(hidden: usize, width: usize, llama: Option<&Llama>) -> Vec<ProjSpec> {
    let p = ProjSpec::new;
    let h = hidden;
    match llama {
        None => vec![
            p(LoraTarget::Fc1, "mlp.fc1", h, width, true),
            p(LoraTarget::Fc2, "mlp.fc2", width, h, true),
        ],
        Some(l) => vec![
            p(LoraTarget::Gate, "mlp.gate", h, width, l.mlp_bias),
            p(LoraTarget::Up, "mlp.up", h, width, l.mlp_bias),
            p(LoraTarget::Down, "mlp.down", width, h, l.mlp_bias),
        ],
    }
}

/// The MLP of one layer.
#[derive(Debug, Clone, PartialEq)]
pub enum MlpLayout {
    /// GPT's or a dense SwiGLU: its projections.
    Dense(Vec<ProjSpec>),
    /// A mixture of experts: one routed expert's projections (there are `shape.experts`) and
    /// the shared experts' (empty without).
    Moe {
        shape: MoeShape,
        expert: Vec<ProjSpec>,
        shared: Vec<ProjSpec>,
    },
}

/// One layer's parts: its attention's projections and its MLP.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerLayout {
    pub attn: Vec<ProjSpec>,
    pub mlp: MlpLayout,
}

/// Layer `layer`'s layout: dense or mixture-of-experts MLP ([`MoeShape::sparse`]),
/// at the widths the config gives.
pub fn layer_layout(
    hidden: usize,
    heads: usize,
    llama: Option<&Llama>,
    layer: usize,
) -> LayerLayout {
    let attn = match llama.and_then(|l| l.linear_at(layer)) {
        Some(g) => linear_attn_projections(hidden, &g),
        None => attn_projections(hidden, heads, llama),
    };
    let mlp = match llama.and_then(|l| l.moe.map(|m| (l, m))) {
        Some((l, m)) if m.sparse(layer) => MlpLayout::Moe {
            shape: m,
            expert: mlp_projections(hidden, l.intermediate, llama),
            shared: if m.shared > 0 {
                mlp_projections(hidden, m.shared, llama)
            } else {
                Vec::new()
            },
        },
        Some((_, m)) => MlpLayout::Dense(mlp_projections(hidden, m.dense_width, llama)),
        None => MlpLayout::Dense(mlp_projections(
            hidden,
            llama.map_or(4 * hidden, |l| l.intermediate),
            llama,
        )),
    };
    LayerLayout { attn, mlp }
}

/// One parameter tensor of a block, in the order the model creates them.
#[derive(Debug, Clone, PartialEq)]
pub enum BlockTensor {
    /// A norm's weight (LayerNorm: and its bias) of `size`, at `path` under the block.
    Norm { path: String, size: usize },
    /// A projection (its weight, bias and LoRA adapter as `spec` says), at `path`.
    Proj { path: String, spec: ProjSpec },
    /// A plain linear without adapter (a router `H → E`, with a bias in gpt-oss; a
    /// shared-expert gate `H → 1`).
    Linear {
        path: String,
        inp: usize,
        out: usize,
        bias: bool,
    },
    /// A plain vector of `size` named `path` (gpt-oss's attention sinks, one per head).
    Vector { path: String, size: usize },
}

/// The tensors of block `layer` in creation order: `ln1`; the attention (q, k, v, o and
/// Qwen3's and Gemma's `q_norm`, `k_norm`; MLA: `q_a`, `q_a_norm`, `q_b` or `q`, then `kv_a`,
/// `kv_a_norm`, `kv_b`, `o`); Gemma's `ln1_post`; `ln2`; the MLP (dense: its projections; a
/// mixture: the router, each expert's projections, the shared experts', the shared gate);
/// Gemma's `ln2_post`. Paths are under `h.{i}`.
pub fn block_tensors(
    hidden: usize,
    heads: usize,
    llama: Option<&Llama>,
    layer: usize,
) -> Vec<BlockTensor> {
    let lay = layer_layout(hidden, heads, llama, layer);
    let proj = |spec: &ProjSpec, prefix: &str| BlockTensor::Proj {
        path: format!("{prefix}{}", spec.path),
        spec: *spec,
    };
    let norm = |path: &str, size| BlockTensor::Norm {
        path: path.to_string(),
        size,
    };
    let variant = llama.map(|l| l.variant).unwrap_or_default();
    // OLMo 2: no norms before the halves, only after.
    let pre = !variant.post_norms_only;
    let mut v: Vec<BlockTensor> = pre.then(|| norm("ln1", hidden)).into_iter().collect();
    let linear = llama.and_then(|l| l.linear_at(layer));
    match llama.and_then(|l| l.mla.as_ref()) {
        // Qwen3-Next's linear layers: qkvz, ba, the convolution `(K, C)`, dt_bias, A_log, the
        // gated norm over a value head, out.
        _ if linear.is_some() => {
            let g = linear.expect("a linear layer");
            v.push(proj(&lay.attn[0], ""));
            v.push(BlockTensor::Linear {
                path: "attn.ba".into(),
                inp: hidden,
                out: 2 * g.value_heads,
                bias: false,
            });
            v.push(BlockTensor::Vector {
                path: "attn.conv".into(),
                size: g.conv_kernel * g.conv_dim(),
            });
            v.push(BlockTensor::Vector {
                path: "attn.dt_bias".into(),
                size: g.value_heads,
            });
            v.push(BlockTensor::Vector {
                path: "attn.a_log".into(),
                size: g.value_heads,
            });
            v.push(norm("attn.norm", g.value_dim));
            v.push(proj(&lay.attn[1], ""));
        }
        Some(m) => {
            let q_lora = usize::from(m.q_lora_rank.is_some());
            for (i, spec) in lay.attn.iter().enumerate() {
                v.push(proj(spec, ""));
                match (i, m.q_lora_rank) {
                    (0, Some(r)) => v.push(norm("attn.q_a_norm", r)),
                    (i, _) if i == q_lora + 1 => v.push(norm("attn.kv_a_norm", m.kv_lora_rank)),
                    _ => {}
                }
            }
        }
        None => {
            v.extend(lay.attn.iter().map(|s| proj(s, "")));
            if let Some(l) = llama.filter(|l| l.qk_norm) {
                let (q, k) = l.qk_norm_sizes(heads);
                v.extend([norm("attn.q_norm", q), norm("attn.k_norm", k)]);
            }
            if llama.is_some_and(|l| l.variant.attention_sinks) {
                v.push(BlockTensor::Vector {
                    path: "attn.sinks".into(),
                    size: heads,
                });
            }
        }
    }
    let post = variant.sandwich_norms || variant.post_norms_only;
    if post {
        v.push(norm("ln1_post", hidden));
    }
    if pre {
        v.push(norm("ln2", hidden));
    }
    match &lay.mlp {
        MlpLayout::Dense(p) => v.extend(p.iter().map(|s| proj(s, ""))),
        MlpLayout::Moe {
            shape,
            expert,
            shared,
        } => {
            v.push(BlockTensor::Linear {
                path: "mlp.router".into(),
                inp: hidden,
                out: shape.experts,
                bias: llama.is_some_and(|l| l.variant.router_bias),
            });
            for e in 0..shape.experts {
                for s in expert {
                    v.push(BlockTensor::Proj {
                        path: s.path.replacen("mlp.", &format!("mlp.experts.{e}."), 1),
                        spec: *s,
                    });
                }
            }
            for s in shared {
                v.push(BlockTensor::Proj {
                    path: s.path.replacen("mlp.", "mlp.shared.", 1),
                    spec: *s,
                });
            }
            if !shared.is_empty() && shape.shared_gate {
                v.push(BlockTensor::Linear {
                    path: "mlp.shared_gate".into(),
                    inp: hidden,
                    out: 1,
                    bias: false,
                });
            }
        }
    }
    if post {
        v.push(norm("ln2_post", hidden));
    }
    v
}

/// Every block's tensors, built once per distinct layout (a model has a handful of layer
/// kinds: dense, sparse, …), so that walking a 61-layer, 256-expert model's tensors formats
/// each path once per kind rather than once per layer.
#[derive(Debug, Clone)]
pub struct Blocks {
    kinds: Vec<(LayerLayout, Vec<BlockTensor>)>,
    /// Per kind, its tensors' parameter sizes ([`BlockTensor::param_sizes`], LayerNorm outside
    /// LLaMA) one after the other, and their sum.
    sizes: Vec<(Vec<u64>, u64)>,
    of: Vec<usize>,
    key: (usize, usize, Option<Llama>, usize),
}

impl Blocks {
    /// The blocks of a model, shared: the last model asked for on this thread is remembered
    /// (a prediction asks for the same model's tensors many times).
    pub fn of(
        hidden: usize,
        heads: usize,
        llama: Option<&Llama>,
        layers: usize,
    ) -> std::rc::Rc<Self> {
        thread_local! {
            static LAST: std::cell::RefCell<Option<std::rc::Rc<Blocks>>> =
                const { std::cell::RefCell::new(None) };
        }
        let key = (hidden, heads, llama.copied(), layers);
        LAST.with(|last| {
            let mut last = last.borrow_mut();
            match &*last {
                Some(b) if b.key == key => b.clone(),
                _ => {
                    let b = std::rc::Rc::new(Self::new(hidden, heads, llama, layers));
                    *last = Some(b.clone());
                    b
                }
            }
        })
    }

    pub fn new(hidden: usize, heads: usize, llama: Option<&Llama>, layers: usize) -> Self {
        let mut kinds: Vec<(LayerLayout, Vec<BlockTensor>)> = Vec::new();
        let of = (0..layers)
            .map(|i| {
                let lay = layer_layout(hidden, heads, llama, i);
                match kinds.iter().position(|(k, _)| *k == lay) {
                    Some(k) => k,
                    None => {
                        kinds.push((lay, block_tensors(hidden, heads, llama, i)));
                        kinds.len() - 1
                    }
                }
            })
            .collect();
        let layer_norm = llama.is_none();
        let sizes = kinds
            .iter()
            .map(|(_, t)| {
                let v: Vec<u64> = t.iter().flat_map(|t| t.param_sizes(layer_norm)).collect();
                let sum = v.iter().sum();
                (v, sum)
            })
            .collect();
        Self {
            kinds,
            sizes,
            of,
            key: (hidden, heads, llama.copied(), layers),
        }
    }

    /// Every block's parameter sizes ([`BlockTensor::param_sizes`]), in layer order.
    pub fn param_sizes(&self) -> impl Iterator<Item = u64> + '_ {
        self.of
            .iter()
            .flat_map(|&k| self.sizes[k].0.iter().copied())
    }

    /// Parameters of every block (no LoRA adapters).
    pub fn params(&self) -> u64 {
        self.of.iter().map(|&k| self.sizes[k].1).sum()
    }

    /// Parameter tensors of every block.
    pub fn param_tensors(&self) -> u64 {
        self.of.iter().map(|&k| self.sizes[k].0.len() as u64).sum()
    }

    /// Block `layer`'s tensors ([`block_tensors`]).
    pub fn layer(&self, layer: usize) -> &[BlockTensor] {
        &self.kinds[self.of[layer]].1
    }

    /// Every block's tensors, in layer order.
    pub fn iter(&self) -> impl Iterator<Item = &[BlockTensor]> + '_ {
        self.of.iter().map(|&k| self.kinds[k].1.as_slice())
    }

    /// Every block's tensors, in layer order, one after the other.
    pub fn tensors(&self) -> impl Iterator<Item = &BlockTensor> + '_ {
        self.iter().flatten()
    }
}

impl BlockTensor {
    /// Elements of the parameter tensors it makes (no LoRA adapters), in creation order:
    /// weight then bias; a LayerNorm (`layer_norm`) weight then bias.
    pub fn param_sizes(&self, layer_norm: bool) -> Vec<u64> {
        match self {
            BlockTensor::Norm { size, .. } => vec![*size as u64; 1 + usize::from(layer_norm)],
            BlockTensor::Proj { spec, .. } => {
                let mut v = vec![(spec.inp * spec.out) as u64];
                if spec.bias {
                    v.push(spec.out as u64);
                }
                v
            }
            BlockTensor::Linear { inp, out, bias, .. } => {
                let mut v = vec![(inp * out) as u64];
                if *bias {
                    v.push(*out as u64);
                }
                v
            }
            BlockTensor::Vector { size, .. } => vec![*size as u64],
        }
    }
}

/// Names of the GPT presets accepted by [`Config::preset`] (the ViT ones are
/// [`super::vit::PRESETS`]).
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
    /// GPT-2 small: V 50257, H 768, A 12, L 12, S_max 1024, the head tied to the token table
    /// as GPT-2's is: 124,439,808 parameters (transformers' `num_parameters()` of `gpt2`).
    pub fn gpt2_small() -> Self {
        Self {
            tied: true,
            ..Self::new(50257, 768, 12, 12, 1024)
        }
    }
    /// GPT-2 medium: V 50257, H 1024, A 16, L 24, S_max 1024, tied: 354,823,168 parameters
    /// (transformers' `num_parameters()` of `gpt2-medium`).
    pub fn gpt2_medium() -> Self {
        Self {
            tied: true,
            ..Self::new(50257, 1024, 16, 24, 1024)
        }
    }

    /// LLaMA-7B's sizes in this GPT architecture (LayerNorm, 4H GELU MLP, learned positions,
    /// untied head): V 32000, H 4096, A 32, L 32, S_max 4096, 6,723,084,288 parameters — not
    /// LLaMA-7B (`llama-2-7b` is: 6,738,415,616), its shape in GPT-2's layers, as its name
    /// says. For predictions (F3).
    pub fn llama_7b_shape() -> Self {
        Self::new(32000, 4096, 32, 32, 4096)
    }

    /// A ViT of the given sizes ([`super::vit`]): `vocab` holds the classes, `max_seq` the
    /// patches + 1.
    pub fn vit(s: Sizes) -> Self {
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
            rope_scaling: None,
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

    /// The attention's name as the rows and the `attention` key spell it: `efficient`,
    /// `tiled` or `standard`.
    pub fn attention_name(&self) -> &'static str {
        if self.efficient_attention {
            "efficient"
        } else if self.tiled_attention {
            "tiled"
        } else {
            "standard"
        }
    }

    /// K/V heads (the query heads outside LLaMA).
    pub fn kv_heads(&self) -> usize {
        self.llama.map_or(self.heads, |l| l.kv_heads)
    }

    /// Width of one head (`H/A` outside LLaMA).
    pub fn head_dim(&self) -> usize {
        self.llama.map_or(self.hidden / self.heads, |l| l.head_dim)
    }

    /// Layer `layer`'s layout ([`layer_layout`]).
    pub fn layer_layout(&self, layer: usize) -> LayerLayout {
        layer_layout(self.hidden, self.heads, self.llama.as_ref(), layer)
    }

    /// The projections of one block ([`block_projections`]).
    pub fn projections(&self) -> Vec<ProjSpec> {
        block_projections(self.hidden, self.heads, self.llama.as_ref())
    }

    /// The rank of the LoRA adapter on a projection of `target`: `lora_rank` when adapted, else 0.
    pub fn adapter_rank(&self, target: LoraTarget) -> usize {
        match self.lora_targets.contains(&target) {
            true => self.lora_rank,
            false => 0,
        }
    }

    /// The LoRA targets this family has.
    pub fn lora_target_names(&self) -> &'static str {
        if self.llama.is_some() {
            "q, k, v, o, gate, up, down, all"
        } else {
            "q, k, v, o, fc1, fc2, all"
        }
    }

    /// Every block's tensors ([`Blocks`]).
    pub fn blocks(&self) -> std::rc::Rc<Blocks> {
        Blocks::of(self.hidden, self.heads, self.llama.as_ref(), self.layers)
    }

    /// Exact parameter count (see the module docs, [`super::vit`]'s, [`super::llama`]'s,
    /// [`super::moe`]'s and [`super::mla`]'s): outside the blocks, then each block's tensors
    /// ([`block_tensors`]), plus the LoRA adapters.
    pub fn params(&self) -> u64 {
        let (v, h, s) = (self.vocab as u64, self.hidden as u64, self.max_seq as u64);
        let head = if self.tied { 0 } else { v * h };
        let outside = match (self.vision, self.llama) {
            // Token table, position table, final LayerNorm, head.
            (None, None) => v * h + s * h + 2 * h + head,
            // Patch projection with bias, class token, positions, final LayerNorm, classifier
            // with bias.
            (Some(vis), _) => vis.patch_dim() as u64 * h + 2 * h + s * h + 2 * h + v * h + v,
            // Token table, final RMSNorm, head.
            (None, Some(_)) => v * h + h + head,
        };
        outside + self.blocks().params() + self.lora_params()
    }

    /// Parameters a token uses: a mixture of experts' router, shared experts and `k` of its
    /// `E` routed experts in each sparse layer, everything else; the parameter count otherwise.
    pub fn active_params(&self) -> u64 {
        let idle: u64 = (0..self.layers)
            .map(
                |i| match layer_layout(self.hidden, self.heads, self.llama.as_ref(), i).mlp {
                    MlpLayout::Moe { shape, expert, .. } => {
                        let one: u64 = expert
                            .iter()
                            .map(|p| (p.inp * p.out + if p.bias { p.out } else { 0 }) as u64)
                            .sum();
                        (shape.experts - shape.top_k) as u64 * one
                    }
                    MlpLayout::Dense(_) => 0,
                },
            )
            .sum();
        self.params() - idle
    }

    /// Projections of every block, with the layer they are in (experts' once per expert).
    pub fn all_projections(&self) -> Vec<(usize, String, ProjSpec)> {
        let blocks = self.blocks();
        (0..self.layers)
            .flat_map(|i| {
                blocks.layer(i).iter().filter_map(move |t| match t {
                    BlockTensor::Proj { path, spec } => Some((i, path.clone(), *spec)),
                    _ => None,
                })
            })
            .collect()
    }

    /// Parameters of the LoRA adapters: `Σ_layers Σ_targets r·(in + out)`.
    pub fn lora_params(&self) -> u64 {
        if self.lora_rank == 0 {
            return 0;
        }
        let r = self.lora_rank as u64;
        self.blocks()
            .tensors()
            .filter_map(|t| match t {
                BlockTensor::Proj { spec: p, .. } if self.lora_targets.contains(&p.target) => {
                    Some(r * (p.inp + p.out) as u64)
                }
                _ => None,
            })
            .sum()
    }

    /// Number of parameter tensors (each costs a little allocator metadata).
    pub fn param_tensors(&self) -> u64 {
        // GPT: wte, wpe, lnf (2), head; ViT: patch (2), cls, wpe, lnf (2), head (2). LLaMA:
        // wte, ln_f, head; then each block's tensors.
        let tied = u64::from(self.tied);
        let outside = match (self.vision, self.llama) {
            (Some(_), _) => 8,
            (None, None) => 5 - tied,
            (None, Some(_)) => 3 - tied,
        };
        outside + self.blocks().param_tensors()
    }

    /// The model's sequence for an input of `seq` tokens: ViT's is fixed by its image.
    pub fn seq_for(&self, seq: usize) -> usize {
        self.vision.map_or(seq, |v| v.seq())
    }
}
