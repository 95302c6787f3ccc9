//! What a model's config says about its parts, with no layer in it: the LLaMA family's
//! [`Llama`] (widths, biases, windows), a mixture of experts' [`MoeShape`], latent attention's
//! [`MlaShape`], a ViT's image ([`Vision`], [`Sizes`]), and how LoRA adapts ([`LoraTarget`])
//! and freezes ([`LoraBase`]) projections.
//! The config reader (`hf_config`), the layout (`config`), the layers and the device sit above
//! it; it imports none of them.

use candle_core::quantized::GgmlDType;
use serde::{Deserialize, Serialize};

/// What a LLaMA-family decoder has beyond the GPT sizes (`hidden`, `heads`, `layers`, `vocab`,
/// `max_seq` stay in [`Config`]; the RMSNorm epsilon is `Config::layer_norm_eps`, the rotary
/// base `Config::rope_theta`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Llama {
    /// Width of the SwiGLU MLP (`intermediate_size`).
    pub intermediate: usize,
    /// K/V heads (`num_key_value_heads`); divides `heads`.
    pub kv_heads: usize,
    /// Width of one head (`head_dim`; even).
    pub head_dim: usize,
    /// Biases on q, k, v (Qwen2; Llama's `attention_bias`).
    pub qkv_bias: bool,
    /// A bias on o (Llama's `attention_bias`).
    pub o_bias: bool,
    /// Biases on gate, up, down (`mlp_bias`).
    pub mlp_bias: bool,
    /// RMSNorm of each query and key head over `head_dim` before the rotary embedding
    /// (Qwen3's `q_norm`, `k_norm`: a weight of `D` each per layer).
    #[serde(default)]
    pub qk_norm: bool,
    /// A mixture of experts instead of the dense MLP in every layer (`intermediate` is then
    /// one expert's width).
    #[serde(default)]
    pub moe: Option<MoeShape>,
    /// Sliding-window attention (Mistral's `sliding_window`; in every layer but those of
    /// `full_layers`): query `i` sees the
    /// keys `i − W + 1 ..= i`, and the KV cache keeps the last `W` tokens.
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// With a window: the layers that attend to everything (bit `i` for layer `i`; from
    /// `layer_types` or Qwen's `max_window_layers`), as transformers' per-layer attention types.
    #[serde(default)]
    pub full_layers: u128,
    /// Multi-head latent attention instead of q, k, v ([`super::mla`]; DeepSeek). `head_dim`
    /// is then the rotary part's width (`qk_rope_head_dim`), as transformers sets it.
    #[serde(default)]
    pub mla: Option<MlaShape>,
    /// The shared block's variations a family switches on ([`Variant`]: Gemma 3's).
    #[serde(default)]
    pub variant: Variant,
}

/// Variations of the shared decoder block that a family switches on (each off by default;
/// Gemma 3, `super::families::gemma3`, sets the first six, gpt-oss the next three, SmolLM3
/// `nope_layers`, OLMo 2 the next two, GLM-4.5 `partial_rotary`, Gemma 2 the soft-caps, Llama 4
/// the last three and `nope_layers`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct Variant {
    /// Every RMSNorm scales by `1 + w` (its weight starts at 0; the sum is a fresh `(n)`
    /// tensor each call).
    pub unit_offset_norms: bool,
    /// A norm after the attention and after the MLP, before each residual sum (four norms a
    /// block: `ln1_post`, `ln2_post`).
    pub sandwich_norms: bool,
    /// The gated MLP is GeGLU (`down(gelu_tanh(gate(x)) · up(x))`) instead of SwiGLU.
    pub gelu_glu: bool,
    /// The token embedding is multiplied by `√H` (in the weights' type).
    pub embed_scaled: bool,
    /// The attention scale itself, instead of `head_dim^-½` (Gemma's
    /// `query_pre_attn_scalar^-½`).
    pub attention_scale: Option<Factor>,
    /// The sliding layers' own rotary base, with no scaling (their own tables, `S_max × D/2`
    /// cos and sin more); the full layers keep `rope_theta` and `rope_scaling`.
    pub local_rope_theta: Option<Factor>,
    /// Attention sinks: a learned logit per query head (`attn.sinks (A)`) in every softmax
    /// beside the keys, then dropped; the mask is a tensor whatever the kernels (gpt-oss).
    pub attention_sinks: bool,
    /// The mixture of experts' router has a bias (gpt-oss).
    pub router_bias: bool,
    /// The gated MLP is the clamped SwiGLU `(clamp(up, ±7) + 1)·g·σ(1.702·g)`,
    /// `g = min(gate, 7)` (gpt-oss's experts).
    pub clamped_glu: bool,
    /// The layers whose queries and keys are not rotated (bit `i` for layer `i`; SmolLM3's
    /// NoPE layers, `no_rope_layers`).
    pub nope_layers: u128,
    /// The block's norms come after each half only (`ln1_post`, `ln2_post`), none before:
    /// `x + norm(attn(x))`, then `x + norm(mlp(x))` (OLMo 2).
    pub post_norms_only: bool,
    /// The q/k norms are over the whole projection (`A·D` and `G·D`), before the heads are
    /// split, instead of over each head (OLMo 2).
    pub qk_norm_whole: bool,
    /// The rotary embedding covers only the first this many of each head's `D` (its tables
    /// are that wide); the rest passes through unrotated (GLM-4.5's `partial_rotary_factor`).
    pub partial_rotary: Option<usize>,
    /// The attention scores soft-capped before the mask, `c·tanh(s/c)` (Gemma 2's
    /// `attn_logit_softcapping`): the standard attention only.
    pub attn_softcap: Option<Factor>,
    /// The logits soft-capped, `c·tanh(l/c)` (Gemma 2's `final_logit_softcapping`).
    pub final_softcap: Option<Factor>,
    /// The window is a chunk (Llama 4's `attention_chunk_size`): the windowed layers' query `i`
    /// sees the keys of its own chunk up to itself (`⌊i/W⌋·W ..= i`), and their cache keeps the
    /// current chunk's tokens (at most `W`); the standard attention only.
    pub chunked_attention: bool,
    /// Each query and key head of the rotary layers L2-normalised over `D`, no weight
    /// (Llama 4's `use_qk_norm`, `Llama4TextL2Norm` with `rms_norm_eps`).
    pub qk_l2_norm: bool,
    /// Llama 4's attention temperature on the NoPE layers (`attn_temperature_tuning`): the
    /// queries at position `p` times `ln(1 + ⌊(p + 1)/floor_scale⌋)·attn_scale + 1`; the
    /// factors `(floor_scale, attn_scale)`.
    pub attn_temperature: Option<(Factor, Factor)>,
    /// The full layers' queries come with an output gate of their width (Qwen3-Next: `q`
    /// projects to `2·A·D`, each head's second half the gate; the attention's output times
    /// `sigmoid(gate)` before `o`).
    pub attn_output_gate: bool,
    /// The layers whose attention is Gated DeltaNet's linear attention (Qwen3-Next's
    /// `linear_attention` layers, [`GatedDelta`]).
    pub gated_delta: Option<GatedDelta>,
}

/// Qwen3-Next's Gated DeltaNet (transformers' `Qwen3NextGatedDeltaNet`): `in_proj_qkvz`,
/// `in_proj_ba`, a depthwise causal convolution of `conv_kernel` over q, k, v, the gated delta
/// rule over `value_heads` heads (q and k repeated from `key_heads`), a gated RMSNorm and
/// `out_proj`. Its state per sequence is fixed: the convolution's last `conv_kernel` inputs
/// and the recurrent state, `value_heads × key_dim × value_dim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GatedDelta {
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    pub conv_kernel: usize,
    /// The linear layers (bit `i` for layer `i`); the others are full attention.
    pub layers: u128,
}

impl GatedDelta {
    /// q and k, `key_heads·key_dim` each.
    pub fn key_width(&self) -> usize {
        self.key_heads * self.key_dim
    }

    /// v, z and the output, `value_heads·value_dim` each.
    pub fn value_width(&self) -> usize {
        self.value_heads * self.value_dim
    }

    /// The convolution's channels, q, k and v: `2·Kd + Vd`.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_width() + self.value_width()
    }

    /// Elements of one sequence's state in one layer: the convolution's `conv_kernel` last
    /// inputs (transformers' `conv_states`, `(conv_dim, kernel)`) and the recurrent state
    /// (`(value_heads, key_dim, value_dim)`).
    pub fn state_elems(&self) -> usize {
        self.conv_dim() * self.conv_kernel + self.value_heads * self.key_dim * self.value_dim
    }
}

impl Llama {
    /// The window of layer `layer`'s attention, if it slides.
    pub fn window_at(&self, layer: usize) -> Option<usize> {
        self.sliding_window
            .filter(|_| layer >= 128 || self.full_layers & (1u128 << layer) == 0)
    }

    /// The widths of the q and k norms of a model with `heads` query heads: a head (Qwen3),
    /// or the whole projection, `A·D` and `G·D` (OLMo 2's [`Variant::qk_norm_whole`]).
    pub fn qk_norm_sizes(&self, heads: usize) -> (usize, usize) {
        match self.variant.qk_norm_whole {
            true => (heads * self.head_dim, self.kv_heads * self.head_dim),
            false => (self.head_dim, self.head_dim),
        }
    }

    /// Layer `layer`'s Gated DeltaNet, when it is a linear-attention layer (Qwen3-Next).
    pub fn linear_at(&self, layer: usize) -> Option<GatedDelta> {
        self.variant
            .gated_delta
            .filter(|g| layer < 128 && g.layers & (1u128 << layer) != 0)
    }

    /// Whether layer `layer` has no rotary embedding (NoPE).
    pub fn nope_at(&self, layer: usize) -> bool {
        layer < 128 && self.variant.nope_layers & (1u128 << layer) != 0
    }

    /// Whether the model keeps a second pair of rotary tables: sliding layers with their own
    /// base ([`Variant::local_rope_theta`]).
    /// Why its attention is the standard one only, composed with a mask tensor whatever the
    /// kernels (gpt-oss's sinks, Gemma 2's soft-capped scores: the efficient op and the tiled
    /// composition have neither), and what to give instead; `None` when any attention builds.
    pub fn standard_attention_only(&self) -> Option<(&'static str, &'static str)> {
        if self.variant.attention_sinks {
            Some((
                "gpt-oss's attention sinks are built into the standard attention only (the efficient op and the tiled composition have no sink yet)",
                "standard with a gpt-oss model",
            ))
        } else if self.variant.attn_softcap.is_some() {
            Some((
                "Gemma 2's soft-capped attention scores are built into the standard attention only (the efficient op and the tiled composition have no cap)",
                "standard with a Gemma 2 model",
            ))
        } else if self.variant.chunked_attention && self.sliding_window.is_some() {
            Some((
                "Llama 4's chunked attention is built into the standard attention only (the efficient op and the tiled composition have no chunk mask)",
                "standard with a Llama 4 model",
            ))
        } else {
            None
        }
    }

    /// The rotary tables' width: the rotated part of a head.
    pub fn rotary_width(&self) -> usize {
        self.variant.partial_rotary.unwrap_or(self.head_dim)
    }

    pub fn local_rope(&self, layers: usize) -> bool {
        self.variant.local_rope_theta.is_some() && (0..layers).any(|i| self.window_at(i).is_some())
    }

    /// Whether some layers slide and others do not.
    pub fn mixed_windows(&self) -> bool {
        self.sliding_window.is_some() && self.full_layers != 0
    }

    /// Query heads per K/V head.
    pub fn group(&self, heads: usize) -> usize {
        heads / self.kv_heads
    }
}

/// How the router turns its logits into scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scoring {
    /// Softmax over the experts (Mixtral, Qwen, DeepSeek-V2).
    #[default]
    Softmax,
    /// A sigmoid per expert (DeepSeek-V3), composed `1 / (1 + exp(−x))`.
    Sigmoid,
}

/// Group-limited routing (DeepSeek): the experts in `groups` equal groups, each token first
/// picks its `top_groups` best groups (by their best score, or the sum of their two best with
/// `top2_sum`), then its `k` experts among those. Host-side: no device memory of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GroupLimit {
    pub groups: usize,
    pub top_groups: usize,
    pub top2_sum: bool,
}

/// A multiplier on the routed experts' weights (`routed_scaling_factor`), compared by its bits.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Factor(pub f64);

impl PartialEq for Factor {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}
impl Eq for Factor {}
impl std::hash::Hash for Factor {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state)
    }
}
impl Default for Factor {
    fn default() -> Self {
        Factor(1.0)
    }
}

fn one() -> usize {
    1
}

/// What makes a LLaMA-family MLP a mixture of experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MoeShape {
    /// Routed experts `E` (`num_local_experts`, `num_experts`, `n_routed_experts`).
    pub experts: usize,
    /// Experts per token `k` (`num_experts_per_tok`).
    pub top_k: usize,
    /// Renormalise the `k` selected weights to sum to 1 (Mixtral always; `norm_topk_prob`
    /// in Qwen's and DeepSeek's configs; DeepSeek adds 1e-20 to the sum).
    pub norm_topk: bool,
    /// Softmax or sigmoid scores.
    #[serde(default)]
    pub scoring: Scoring,
    /// Group-limited routing (DeepSeek's `group_limited_greedy`, `noaux_tc`).
    #[serde(default)]
    pub group: Option<GroupLimit>,
    /// DeepSeek-V3's `e_score_correction_bias`: added to the scores for the choice only (not
    /// to the weights). Kept on the host beside the routing (`E` f32 a layer; zero at init,
    /// as transformers makes it).
    #[serde(default)]
    pub correction_bias: bool,
    /// `routed_scaling_factor` (1: no multiply).
    #[serde(default)]
    pub routed_scale: Factor,
    /// Width of the shared experts' SwiGLU, run on every token beside the routed ones
    /// (DeepSeek: `n_shared_experts · moe_intermediate_size`; Qwen2-MoE:
    /// `shared_expert_intermediate_size`); 0 = none.
    #[serde(default)]
    pub shared: usize,
    /// Qwen2-MoE's `shared_expert_gate`: the shared output times `sigmoid(x·g)`, `g (1, H)`.
    #[serde(default)]
    pub shared_gate: bool,
    /// The first layers are dense (DeepSeek's `first_k_dense_replace`).
    #[serde(default)]
    pub first_dense: usize,
    /// Layer `i` (past the dense ones) is sparse when `(i + 1) % sparse_step == 0` (Qwen's
    /// `decoder_sparse_step`); 1: every one.
    #[serde(default = "one")]
    pub sparse_step: usize,
    /// Width of the dense layers' SwiGLU (`intermediate_size`; the experts' is
    /// `Llama::intermediate`).
    #[serde(default)]
    pub dense_width: usize,
    /// Layers listed dense (Qwen's `mlp_only_layers`; bit `i` for layer `i`).
    #[serde(default)]
    pub dense_layers: u128,
    /// The routing weight multiplies each expert's input, not its output (Llama 4:
    /// `expert(x·w)`).
    #[serde(default)]
    pub input_scaled: bool,
}

impl MoeShape {
    /// `experts` routed experts, `top_k` per token, nothing else: Mixtral's shape.
    pub fn plain(experts: usize, top_k: usize, norm_topk: bool) -> Self {
        Self {
            experts,
            top_k,
            norm_topk,
            scoring: Scoring::Softmax,
            group: None,
            correction_bias: false,
            routed_scale: Factor(1.0),
            shared: 0,
            shared_gate: false,
            first_dense: 0,
            sparse_step: 1,
            dense_width: 0,
            dense_layers: 0,
            input_scaled: false,
        }
    }

    /// Whether layer `layer` has the mixture (else the dense MLP of `dense_width`).
    pub fn sparse(&self, layer: usize) -> bool {
        layer >= self.first_dense
            && (layer + 1).is_multiple_of(self.sparse_step.max(1))
            && (layer >= 128 || self.dense_layers & (1u128 << layer) == 0)
    }
}

/// What makes a LLaMA-family attention MLA.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MlaShape {
    /// `q_lora_rank` (none: one `q` projection).
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// Decode steps decompress the whole latent cache through `kv_b` each step (transformers'
    /// form); `false`, the default, attends over the latent with the absorbed projections
    /// (vLLM's, SGLang's and FlashMLA's form: [`super::mla`]).
    #[serde(default)]
    pub decompressed_decode: bool,
}

impl MlaShape {
    /// Width of a query or key head: `n + r`.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// Elements a token keeps in one layer's latent cache: `L + r`.
    pub fn latent_per_token(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// Elements a token keeps in one layer's decompressed cache: `A·(dq + dv)`.
    pub fn decompressed_per_token(&self, heads: usize) -> usize {
        heads * (self.qk_head_dim() + self.v_head_dim)
    }
}

/// How LoRA freezes the base projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoraBase {
    /// Detached weights in candle's own matmul: their gradients are still computed and held
    /// until the gradient store is dropped.
    Detach,
    /// [`super::frozen::FrozenLinear`]: no gradient for the weight.
    #[default]
    Op,
    /// QLoRA: [`super::frozen::FrozenLinear`] over 4-bit GGML blocks (18 B per 32 weights).
    Q4_0,
    /// [`super::frozen::FrozenLinear`] over 8-bit GGML blocks (34 B per 32 weights).
    Q8_0,
    /// [`super::frozen::FrozenLinear`] over GGUF's 4-bit k-quant super-blocks (144 B per 256 weights).
    #[serde(rename = "q4_k")]
    Q4K,
    /// [`super::frozen::FrozenLinear`] over GGUF's 6-bit k-quant super-blocks (210 B per 256 weights).
    #[serde(rename = "q6_k")]
    Q6K,
    /// [`super::frozen::FrozenLinear`] over FP8 e4m3 weights (1 B each) with an f32 inverse
    /// scale per 128×128 block, as DeepSeek-V3 and the `*-FP8` checkpoints ship them
    /// (`quantization_config` `quant_method: fp8`, `weight_block_size: [128, 128]`).
    Fp8,
    /// [`super::frozen::FrozenLinear`] over MXFP4 (OCP Microscaling): e2m1 values, two per
    /// byte, and a UE8M0 power-of-two scale per 32 weights of a row (17 B per 32 weights), as
    /// gpt-oss ships its experts and vLLM and llama.cpp serve them ([`MXFP4_BLOCK`]).
    Mxfp4,
}

impl LoraBase {
    pub const NAMES: &'static str = "detach, op, q4_0, q8_0, q4_k, q6_k, fp8, mxfp4";

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "detach" => Some(Self::Detach),
            "op" => Some(Self::Op),
            "q4_0" => Some(Self::Q4_0),
            "q8_0" => Some(Self::Q8_0),
            "q4_k" => Some(Self::Q4K),
            "q6_k" => Some(Self::Q6K),
            "fp8" => Some(Self::Fp8),
            "mxfp4" => Some(Self::Mxfp4),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Detach => "detach",
            Self::Op => "op",
            Self::Q4_0 => "q4_0",
            Self::Q8_0 => "q8_0",
            Self::Q4K => "q4_k",
            Self::Q6K => "q6_k",
            Self::Fp8 => "fp8",
            Self::Mxfp4 => "mxfp4",
        }
    }

    /// Whether the base is held in blocks (GGML's, FP8's or MXFP4's) rather than dense.
    pub fn quantized(self) -> bool {
        !matches!(self, Self::Detach | Self::Op)
    }

    /// The weights of a row one block holds, where a row is cut into blocks (GGML's, MXFP4's
    /// 32); `None` for dense and FP8 (128×128 tiles, partial at the edges) bases.
    pub fn row_block(self) -> Option<usize> {
        match self {
            Self::Mxfp4 => Some(MXFP4_BLOCK),
            q => q.ggml().map(|g| g.block_size()),
        }
    }

    /// The GGML block type of a quantized base; `None` for dense, FP8 and MXFP4 ones.
    pub fn ggml(self) -> Option<GgmlDType> {
        match self {
            Self::Detach | Self::Op | Self::Fp8 | Self::Mxfp4 => None,
            Self::Q4_0 => Some(GgmlDType::Q4_0),
            Self::Q8_0 => Some(GgmlDType::Q8_0),
            Self::Q4K => Some(GgmlDType::Q4K),
            Self::Q6K => Some(GgmlDType::Q6K),
        }
    }
}

/// How the rotary angles are stretched for long contexts (`rope_scaling`, transformers'
/// `modeling_rope_utils`): each changes the inverse frequencies (and YaRN and LongRoPE scale the
/// tables by an attention factor), none the tables' sizes. `dynamic` NTK equals the default
/// angles up to `max_position_embeddings` (the longest sequence memfit runs), so it needs none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "type")]
pub enum RopeScaling {
    /// Every frequency divided by `factor`.
    Linear { factor: f64 },
    /// Llama 3.1: low frequencies divided by `factor`, high ones kept, the band between
    /// smoothed.
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max: usize,
    },
    /// YaRN: interpolated and extrapolated frequencies blended by a ramp over the dimensions
    /// between the `beta_fast` and `beta_slow` rotations; cos and sin times `attention_factor`.
    /// DeepSeek's attention scale is also multiplied by `softmax_scale` (`mscale²` from
    /// `mscale_all_dim`; 1 elsewhere).
    Yarn {
        factor: f64,
        original_max: usize,
        beta_fast: f64,
        beta_slow: f64,
        truncate: bool,
        attention_factor: f64,
        softmax_scale: f64,
    },
    /// LongRoPE (Phi-3): frequency `j` divided by `factors[j]` (the short factors: what
    /// transformers uses up to `original_max_position_embeddings`), cos and sin times
    /// `attention_factor`.
    LongRope {
        factors: Vec<f64>,
        attention_factor: f64,
    },
}

impl RopeScaling {
    /// The inverse frequencies of a rotary width `dim` with base `theta` (`dim/2` of them), and
    /// the factor on cos and sin.
    pub fn inv_freq(this: Option<&Self>, dim: usize, theta: f64) -> (Vec<f64>, f64) {
        let half = dim / 2;
        let base: Vec<f64> = (0..half)
            .map(|j| 1.0 / theta.powf(2.0 * j as f64 / dim as f64))
            .collect();
        let pi2 = 2.0 * std::f64::consts::PI;
        match this {
            None => (base, 1.0),
            Some(Self::Linear { factor }) => (base.iter().map(|f| f / factor).collect(), 1.0),
            Some(Self::Llama3 {
                factor,
                low_freq_factor: lo,
                high_freq_factor: hi,
                original_max,
            }) => {
                let old = *original_max as f64;
                let (low_wavelen, high_wavelen) = (old / lo, old / hi);
                let f = base
                    .iter()
                    .map(|&f| {
                        let wavelen = pi2 / f;
                        let scaled = if wavelen > low_wavelen { f / factor } else { f };
                        if wavelen < high_wavelen || wavelen > low_wavelen {
                            scaled
                        } else {
                            let smooth = (old / wavelen - lo) / (hi - lo);
                            (1.0 - smooth) * scaled / factor + smooth * scaled
                        }
                    })
                    .collect();
                (f, 1.0)
            }
            Some(Self::Yarn {
                factor,
                original_max,
                beta_fast,
                beta_slow,
                truncate,
                attention_factor,
                ..
            }) => {
                let d = dim as f64;
                let corr =
                    |rot: f64| d * (*original_max as f64 / (rot * pi2)).ln() / (2.0 * theta.ln());
                let (mut low, mut high) = (corr(*beta_fast), corr(*beta_slow));
                if *truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
                if low == high {
                    high += 0.001;
                }
                let f = base
                    .iter()
                    .enumerate()
                    .map(|(j, &f)| {
                        let ramp = ((j as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        let extrapolation = 1.0 - ramp;
                        f / factor * (1.0 - extrapolation) + f * extrapolation
                    })
                    .collect();
                (f, *attention_factor)
            }
            Some(Self::LongRope {
                factors,
                attention_factor,
            }) => (
                base.iter().zip(factors).map(|(f, e)| f / e).collect(),
                *attention_factor,
            ),
        }
    }

    /// What DeepSeek's attention scale is multiplied by (YaRN's `mscale²`; else 1).
    pub fn softmax_scale(this: Option<&Self>) -> f64 {
        match this {
            Some(Self::Yarn { softmax_scale, .. }) => *softmax_scale,
            _ => 1.0,
        }
    }
}

/// FP8 weights' scale blocks: `rows × cols` weights share one f32 inverse scale (the weight is
/// `f8 · scale`); the last block of a dimension that is not a multiple is partial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fp8Block {
    pub rows: usize,
    pub cols: usize,
}

/// The blocks of every FP8 checkpoint memfit reads (DeepSeek-V3's, Qwen3's `*-FP8`).
pub const FP8_BLOCK: Fp8Block = Fp8Block {
    rows: 128,
    cols: 128,
};

impl Fp8Block {
    /// The scales of an `(out, in)` weight: `(⌈out/rows⌉, ⌈in/cols⌉)`.
    pub fn scales(self, out: usize, inp: usize) -> (usize, usize) {
        (out.div_ceil(self.rows), inp.div_ceil(self.cols))
    }

    /// `out·in` bytes of e4m3 plus 4 per scale.
    pub fn bytes(self, out: usize, inp: usize) -> u64 {
        let (r, c) = self.scales(out, inp);
        (out * inp) as u64 + 4 * (r * c) as u64
    }
}

/// Weights of a row that share one MXFP4 scale.
pub const MXFP4_BLOCK: usize = 32;

/// Bytes of an MXFP4 `(out, in)` weight (`in` a multiple of [`MXFP4_BLOCK`]): half a byte per
/// value, one per scale: `out·in/2 + out·in/32`.
pub fn mxfp4_bytes(out: usize, inp: usize) -> u64 {
    (out * inp / 2 + out * inp / MXFP4_BLOCK) as u64
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

/// The image side of a ViT configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Vision {
    /// Side of the square input image, in pixels.
    pub image: usize,
    /// Side of a square patch, in pixels (divides `image`).
    pub patch: usize,
    /// Colour channels.
    pub channels: usize,
}

impl Vision {
    /// Patches per image, `(I/p)²`.
    pub fn patches(&self) -> usize {
        (self.image / self.patch).pow(2)
    }

    /// Values per patch, `C·p²` (the patch projection's input).
    pub fn patch_dim(&self) -> usize {
        self.channels * self.patch * self.patch
    }

    /// The encoder's sequence: patches plus the class token.
    pub fn seq(&self) -> usize {
        self.patches() + 1
    }
}

/// The sizes of a named ViT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    pub vision: Vision,
    pub classes: usize,
    pub hidden: usize,
    pub heads: usize,
    pub layers: usize,
}

/// Element type of weights, activations, gradients and optimizer state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElemType {
    F32,
    Bf16,
    F16,
}

impl ElemType {
    pub const NAMES: &'static str = "f32, bf16, f16";

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "f32" => Some(Self::F32),
            "bf16" => Some(Self::Bf16),
            "f16" => Some(Self::F16),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::F16 => 2,
        }
    }

    pub fn candle(self) -> candle_core::DType {
        match self {
            Self::F32 => candle_core::DType::F32,
            Self::Bf16 => candle_core::DType::BF16,
            Self::F16 => candle_core::DType::F16,
        }
    }
}

impl std::fmt::Display for ElemType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
