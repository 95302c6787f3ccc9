//! The LLaMA-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3, TinyLlama, SmolLM; with the
//! mixtures of experts of [`super::moe`] Mixtral, Qwen2/3-MoE, and with the latent attention of
//! [`super::mla`] DeepSeek-V2/V3): the blocks of
//! [`super::transformer`] with RMSNorm instead of LayerNorm, rotary position embeddings instead
//! of a position table, grouped-query attention (`kv_heads` K/V heads, each shared by
//! `heads / kv_heads` query heads), an explicit `head_dim`, a SwiGLU MLP
//! `down(silu(gate(x)) · up(x))` of intermediate size `I`, optional q/k/v (and o, MLP) biases,
//! optional q/k norms (Qwen3: an RMSNorm over `D` of every query and key head, before the
//! rotary embedding) and an LM head that may be the token embedding itself (tied).
//!
//! Shapes (B batch, S sequence, H hidden, A heads, G kv_heads, D head_dim, I intermediate,
//! V vocab): tokens `(B, S)` → embeddings `(B, S, H)` → per block: RMSNorm; q `(B, A, S, D)`,
//! k and v `(B, G, S, D)` (the cache stores these), rotary embedding on q and k, then k and v
//! repeated to `(B, A, S, D)` as candle-transformers' `utils::repeat_kv` does (a
//! `Tensor::cat` of `A/G` copies along the sequence and a reshape: one copy the size of the
//! repeated tensor, measured); scores `(B, A, S, S)`; heads merged to `(B, S, A·D)`, `o` back
//! to `(B, S, H)`; residual; RMSNorm; gate and up `(B, S, I)`, down to `(B, S, H)`; residual.
//! Final RMSNorm, logits `(B, S, V)`.
//!
//! Gemma 3 (its family file sets every [`super::shapes::Variant`]) on the same blocks: every RMSNorm scales by `1 + w` (the
//! sum a fresh `(n)` tensor per call), `ln1_post` after the attention's output projection and
//! `ln2_post` after the MLP, each before its residual sum; GeGLU `down(gelu_tanh(gate(x)) ·
//! up(x))`; the embedding times `√H` (an affine copy `(B, S, H)`, the rows freed); the attention
//! scale `query_pre_attn_scalar^-½`; sliding layers rotate from a second pair of tables (base
//! `rope_local_base_freq`, no scaling). Parameters: `+ 2H` per block (the two extra norms) and
//! Qwen3's `2D` q/k norms.
//!
//! gpt-oss (`Llama::oss`) on the same blocks: q, k, v, o with biases; each attention head's
//! learned sink logit (`attn.sinks (A)`) in the softmax beside the keys, then dropped
//! ([`super::attention::Core::attend_sinks`]: the scores and a `(B, A, S, 1)` column
//! concatenated, `(B, A, S, T + 1)`; the standard attention only); a mixture of experts with a
//! biased router and biased experts whose GLU is clamped ([`super::kernels::oss_glu`]).
//! Parameters: `+ A` per block (the sinks), `+ E` (router bias), `+ E·(2I + H)` (expert biases).
//!
//! Parameter count (exact):
//! `P = V·H (embedding) + [V·H (head, untied)] + H (final norm) + L·(2H + H·A·D + 2·H·G·D +
//! A·D·H + 3·H·I + biases [+ 2D q/k norms])`, biases `A·D + 2·G·D` (q, k, v), `H` (o), `2I + H`
//! (MLP) where the config has them.
//! The rotary tables (cos and sin, `S_max × D/2` each, in the weights' type) are buffers, not
//! parameters.
//!
//! Differentiable compositions (candle 0.11.1's fused kernels have no backward on the CPU):
//! RMSNorm is `candle_nn::ops::rms_norm_slow` (x² mean, `+ eps`, sqrt, divide, scale), not
//! `ops::rms_norm`; the rotary embedding is composed from `narrow`, `broadcast_mul`, `sub`,
//! `add` and `cat` (the non-interleaved "rotate half" form of Hugging Face's Llama), not
//! `candle_nn::rotary_emb::rope`; SiLU is `Tensor::silu` (a unary op with a backward).
//! Every parameter gets a gradient (tests/llama.rs).
//!
//! ```no_run
//! use candle_core::{DType, Device, Tensor};
//! use candle_nn::{VarBuilder, VarMap};
//! use memfit::model::transformer::{Config, Transformer};
//! let cfg = Config::preset("llama-tiny").unwrap();
//! let varmap = VarMap::new();
//! let model = Transformer::new(&cfg, VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu)).unwrap();
//! let tokens = Tensor::zeros((2, 16), DType::U32, &Device::Cpu).unwrap();
//! let logits = model.forward(&tokens).unwrap(); // (2, 16, cfg.vocab)
//! ```

use super::config::Config;
pub use super::shapes::Llama;

/// Presets of the LLaMA line read by the shared reader: `llama-tiny` (test-sized) and the
/// shipped Hugging Face configs (`workloads/configs/*.json`, embedded in the binary); the
/// families with a file of their own ship theirs there ([`super::families`]).
const OWN_PRESETS: &[&str] = &[
    "llama-tiny",
    "llama-2-7b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3.2-1b",
    "mistral-7b",
    "phi-3-mini",
    "qwen2-0.5b",
    "qwen3-8b",
    "qwen3-30b-a3b",
    "gpt-oss-20b",
    "mixtral-8x7b",
    "deepseek-v2-lite",
    "tinyllama-1.1b",
    "smollm2-135m",
];

/// The embedded `config.json` of a shipped preset.
pub fn preset_json(name: &str) -> Option<&'static str> {
    Some(match name {
        "llama-2-7b" => include_str!("../../workloads/configs/llama-2-7b.json"),
        "llama-2-70b" => include_str!("../../workloads/configs/llama-2-70b.json"),
        "llama-3-8b" => include_str!("../../workloads/configs/llama-3-8b.json"),
        "llama-3.2-1b" => include_str!("../../workloads/configs/llama-3.2-1b.json"),
        "mistral-7b" => include_str!("../../workloads/configs/mistral-7b.json"),
        "phi-3-mini" => include_str!("../../workloads/configs/phi-3-mini.json"),
        "qwen2-0.5b" => include_str!("../../workloads/configs/qwen2-0.5b.json"),
        "qwen3-8b" => include_str!("../../workloads/configs/qwen3-8b.json"),
        "qwen3-30b-a3b" => include_str!("../../workloads/configs/qwen3-30b-a3b.json"),
        "gpt-oss-20b" => include_str!("../../workloads/configs/gpt-oss-20b.json"),
        "mixtral-8x7b" => include_str!("../../workloads/configs/mixtral-8x7b.json"),
        "deepseek-v2-lite" => include_str!("../../workloads/configs/deepseek-v2-lite.json"),
        "tinyllama-1.1b" => include_str!("../../workloads/configs/tinyllama-1.1b.json"),
        "smollm2-135m" => include_str!("../../workloads/configs/smollm2-135m.json"),
        _ => {
            return super::families::presets()
                .find(|(n, _)| *n == name)
                .map(|(_, json)| json);
        }
    })
}

/// Every LLaMA-family preset: the shared reader's, then the families'.
pub fn presets() -> Vec<&'static str> {
    OWN_PRESETS
        .iter()
        .copied()
        .chain(super::families::presets().map(|(name, _)| name))
        .collect()
}

/// How a shipped preset's checkpoint holds its projections (`quantization_config`), if not
/// in its `dtype`.
pub fn preset_shipped(name: &str) -> Option<super::hf_config::Shipped> {
    let text = preset_json(name)?;
    super::hf_config::parse(text, &format!("<preset {name}>"))
        .expect("the shipped preset configs parse (tests/hf_config.rs)")
        .shipped
}

/// A LLaMA preset's config (`None` for other names).
pub fn preset(name: &str) -> Option<Config> {
    if name == "llama-tiny" {
        return Some(tiny());
    }
    let text = preset_json(name)?;
    let hf = super::hf_config::parse(text, &format!("<preset {name}>"))
        .expect("the shipped preset configs parse (tests/hf_config.rs)");
    Some(hf.cfg)
}

/// Test-sized: V 300, H 96, A 6, G 2, D 16, I 160, L 2, S_max 128, untied, no biases.
pub fn tiny() -> Config {
    Config::llama(
        300,
        96,
        6,
        2,
        128,
        Llama {
            intermediate: 160,
            kv_heads: 2,
            head_dim: 16,
            qkv_bias: false,
            o_bias: false,
            mlp_bias: false,
            qk_norm: false,
            moe: None,
            sliding_window: None,
            full_layers: 0,
            mla: None,
            variant: Default::default(),
        },
        false,
    )
}
