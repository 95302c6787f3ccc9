//! A Hugging Face `config.json` (a local file; nothing is ever downloaded) read into a memfit
//! [`Config`].
//!
//! `model_type` decides the family: `llama`, `mistral`, `qwen2`, `qwen3`, `mixtral`, `qwen3_moe`
//! → the LLaMA-family decoder
//! ([`super::llama`]); `gpt2` → the GPT decoder; `vit` → the ViT encoder. Read for LLaMA:
//! `hidden_size`, `intermediate_size`, `num_hidden_layers`, `num_attention_heads`,
//! `num_key_value_heads` (default: the attention heads), `head_dim` (default hidden/heads),
//! `vocab_size`, `max_position_embeddings`, `tie_word_embeddings` (default false),
//! `attention_bias` (llama: q, k, v, o; default false), `mlp_bias` (default false),
//! `rms_norm_eps`, `rope_theta`, `torch_dtype`, `hidden_act` (must be `silu`), and
//! `sliding_window` (mistral, mixtral: every layer; qwen when `use_sliding_window`, and every
//! layer or none by `max_window_layers`). Qwen2 has q, k, v biases and none on o; Qwen3 reads
//! `attention_bias` (default false) and has q/k norms (`q_norm`, `k_norm`: RMSNorm over
//! `head_dim`, with `rms_norm_eps`). Mixtral and Qwen3-MoE read their experts
//! ([`moe_shape`]). Fields that change memory and that memfit does not model are refused,
//! never ignored: mixture-of-experts fields in a dense type, dense layers between sparse ones,
//! per-layer windows, another activation. Fields that do not change memory (`rope_scaling`,
//! token ids, `architectures`, …) are not read.
//!
//! GPT-2 reads `n_embd`, `n_head`, `n_layer`, `vocab_size`, `n_positions`,
//! `layer_norm_epsilon`, `n_inner` (null or 4·n_embd), `activation_function` (`gelu_new`, the
//! tanh GELU memfit's GPT uses) and `tie_word_embeddings` (default true, as in transformers).
//! ViT reads `hidden_size`, `num_hidden_layers`, `num_attention_heads`, `intermediate_size`
//! (4·hidden), `image_size`, `patch_size`, `num_channels` (default 3), `layer_norm_eps` and the
//! classes (`num_labels`, else the size of `id2label`, else transformers' default 2); memfit's
//! ViT computes GELU with the tanh approximation whatever `hidden_act` says.

use serde_json::{Map, Value};

use super::ModelKind;
use super::llama::Llama;
use super::moe::MoeShape;
use super::transformer::Config;
use super::vit;
use crate::device::ElemType;
use crate::error::UserError;

/// Fields of mixture-of-experts configs: memfit's MLP is dense, so their presence is an error.
pub const MOE_FIELDS: &[&str] = &[
    "num_local_experts",
    "num_experts",
    "num_experts_per_tok",
    "n_routed_experts",
    "n_shared_experts",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
];

/// The model types memfit reads.
pub const MODEL_TYPES: &str = "llama, mistral, qwen2, qwen3, mixtral, qwen3_moe, gpt2, vit";

/// What a config file gives.
#[derive(Debug, Clone, PartialEq)]
pub struct HfConfig {
    pub kind: ModelKind,
    pub cfg: Config,
    /// `torch_dtype`, when given.
    pub dtype: Option<ElemType>,
    /// The attention window, when the model uses one (tokens).
    pub sliding_window: Option<usize>,
    /// `model_type` as written.
    pub model_type: String,
}

/// Reads and parses `path`.
pub fn load(path: &std::path::Path) -> Result<HfConfig, UserError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| UserError::Unreadable {
        origin: origin.clone(),
        what: "Hugging Face config",
        message: e.to_string(),
    })?;
    parse(&text, &origin)
}

struct Fields<'a> {
    map: &'a Map<String, Value>,
    origin: &'a str,
}

impl Fields<'_> {
    fn bad(&self, field: &str, value: &Value, reason: &str, allowed: &str) -> UserError {
        UserError::OutOfRange {
            origin: self.origin.into(),
            key: field.into(),
            value: value.to_string(),
            reason: reason.into(),
            allowed: allowed.into(),
        }
    }

    fn missing(&self, field: &str, allowed: &str) -> UserError {
        UserError::Missing {
            origin: self.origin.into(),
            key: field.into(),
            allowed: allowed.into(),
        }
    }

    /// The field, `None` when absent or null.
    fn get(&self, field: &str) -> Option<&Value> {
        self.map.get(field).filter(|v| !v.is_null())
    }

    /// A positive integer ≤ `max`.
    fn size_opt(&self, field: &str, max: i64) -> Result<Option<usize>, UserError> {
        let Some(v) = self.get(field) else {
            return Ok(None);
        };
        match v.as_i64() {
            Some(n) if n >= 1 && n <= max => Ok(Some(n as usize)),
            Some(_) => Err(self.bad(field, v, "out of range", &format!("1..={max}"))),
            None => Err(self.bad(field, v, "not an integer", &format!("an integer 1..={max}"))),
        }
    }

    fn size(&self, field: &str, max: i64) -> Result<usize, UserError> {
        self.size_opt(field, max)?
            .ok_or_else(|| self.missing(field, &format!("an integer 1..={max}")))
    }

    fn bool_or(&self, field: &str, default: bool) -> Result<bool, UserError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.bad(field, v, "not a boolean", "true, false")),
        }
    }

    fn float_or(&self, field: &str, default: f64) -> Result<f64, UserError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => match v.as_f64() {
                Some(x) if x > 0.0 && x.is_finite() => Ok(x),
                _ => Err(self.bad(field, v, "not a positive number", "a number > 0")),
            },
        }
    }

    fn str_opt(&self, field: &str) -> Result<Option<&str>, UserError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.bad(field, v, "not a string", "a string")),
        }
    }

    /// `field` must be `want` when present.
    fn require(&self, field: &str, want: &[&str]) -> Result<(), UserError> {
        if let Some(s) = self.str_opt(field)?
            && !want.contains(&s)
        {
            return Err(self.bad(
                field,
                &Value::from(s),
                "memfit's model computes another function (its memory differs)",
                &want.join(", "),
            ));
        }
        Ok(())
    }
}

/// Parses the text of a `config.json`; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<HfConfig, UserError> {
    let value: Value = serde_json::from_str(text).map_err(|e| UserError::Syntax {
        origin: origin.into(),
        message: format!("not a JSON config: {e}"),
    })?;
    let Value::Object(map) = &value else {
        return Err(UserError::Syntax {
            origin: origin.into(),
            message: "a config.json is a JSON object".into(),
        });
    };
    let f = Fields { map, origin };
    let model_type = f
        .str_opt("model_type")?
        .ok_or_else(|| f.missing("model_type", MODEL_TYPES))?
        .to_string();
    let moe_type = matches!(model_type.as_str(), "mixtral" | "qwen3_moe");
    for field in MOE_FIELDS.iter().filter(|_| !moe_type) {
        if let Some(v) = f.get(field) {
            return Err(f.bad(
                field,
                v,
                "a mixture-of-experts field in a dense model type",
                "a config without it, or model_type mixtral or qwen3_moe",
            ));
        }
    }
    let dtype = match f.str_opt("torch_dtype")? {
        None => None,
        Some("float32") => Some(ElemType::F32),
        Some("float16") => Some(ElemType::F16),
        Some("bfloat16") => Some(ElemType::Bf16),
        Some(other) => {
            return Err(f.bad(
                "torch_dtype",
                &Value::from(other),
                "unknown element type",
                "float32, float16, bfloat16",
            ));
        }
    };
    let (kind, cfg, sliding_window) = match model_type.as_str() {
        "llama" | "mistral" | "qwen2" | "qwen3" | "mixtral" | "qwen3_moe" => {
            llama_config(&f, &model_type)?
        }
        "gpt2" => (ModelKind::Gpt, gpt2_config(&f)?, None),
        "vit" => (ModelKind::Vit, vit_config(&f)?, None),
        other => {
            return Err(f.bad(
                "model_type",
                &Value::from(other),
                "unknown model type",
                MODEL_TYPES,
            ));
        }
    };
    Ok(HfConfig {
        kind,
        cfg,
        dtype,
        sliding_window,
        model_type,
    })
}

const MAX_SIZE: i64 = super::limits::MAX_HIDDEN;

fn llama_config(
    f: &Fields,
    model_type: &str,
) -> Result<(ModelKind, Config, Option<usize>), UserError> {
    f.require("hidden_act", &["silu"])?;
    let hidden = f.size("hidden_size", MAX_SIZE)?;
    // A mixture of experts: every layer's MLP is E experts of `moe_intermediate_size`
    // (Mixtral: `intermediate_size`).
    let moe = moe_shape(f, model_type)?;
    let intermediate = match model_type {
        "qwen3_moe" => f.size("moe_intermediate_size", MAX_SIZE)?,
        _ => f.size("intermediate_size", MAX_SIZE)?,
    };
    let layers = f.size("num_hidden_layers", super::limits::MAX_LAYERS)?;
    let heads = f.size("num_attention_heads", super::limits::MAX_HEADS)?;
    let kv_heads = f
        .size_opt("num_key_value_heads", super::limits::MAX_HEADS)?
        .unwrap_or(heads);
    let vocab = f.size("vocab_size", super::limits::MAX_VOCAB)?;
    let max_seq = f.size("max_position_embeddings", super::limits::MAX_SEQ)?;
    if heads % kv_heads != 0 {
        return Err(f.bad(
            "num_key_value_heads",
            &Value::from(kv_heads),
            &format!("does not divide num_attention_heads = {heads}"),
            "a divisor of num_attention_heads",
        ));
    }
    let head_dim = match f.size_opt("head_dim", MAX_SIZE)? {
        Some(d) => d,
        None if hidden % heads == 0 => hidden / heads,
        None => {
            return Err(f.missing(
                "head_dim",
                &format!("given when hidden_size = {hidden} is not a multiple of num_attention_heads = {heads}"),
            ));
        }
    };
    if head_dim % 2 != 0 {
        return Err(f.bad(
            "head_dim",
            &Value::from(head_dim),
            "the rotary embedding rotates pairs",
            "an even head_dim",
        ));
    }
    // Qwen2: biases on q, k, v always (its config has no `attention_bias`); Qwen3: none by
    // default, q/k norms.
    let qwen = model_type == "qwen2";
    let attention_bias = if qwen {
        false
    } else {
        f.bool_or("attention_bias", false)?
    };
    let sliding_window = match model_type {
        "mistral" | "mixtral" => f.size_opt("sliding_window", super::limits::MAX_SEQ)?,
        // Qwen: layers from `max_window_layers` on slide; all or none are modelled.
        "qwen2" | "qwen3" | "qwen3_moe" if f.bool_or("use_sliding_window", false)? => {
            let from = match f.get("max_window_layers") {
                None => 0,
                Some(v) => v.as_u64().ok_or_else(|| {
                    f.bad("max_window_layers", v, "not an integer", "an integer ≥ 0")
                })? as usize,
            };
            if from >= layers {
                None
            } else if from == 0 {
                f.size_opt("sliding_window", super::limits::MAX_SEQ)?
            } else {
                return Err(f.bad(
                    "max_window_layers",
                    &Value::from(from),
                    &format!(
                        "sliding layers after {from} full ones: per-layer windows are not built yet"
                    ),
                    &format!("0 (every layer slides) or ≥ {layers} (none does)"),
                ));
            }
        }
        _ => None,
    };
    let llama = Llama {
        intermediate,
        kv_heads,
        head_dim,
        qkv_bias: qwen || attention_bias,
        o_bias: attention_bias,
        mlp_bias: f.bool_or("mlp_bias", false)?,
        qk_norm: matches!(model_type, "qwen3" | "qwen3_moe"),
        moe,
        sliding_window,
    };
    let mut cfg = Config::llama(
        vocab,
        hidden,
        heads,
        layers,
        max_seq,
        llama,
        f.bool_or("tie_word_embeddings", false)?,
    );
    cfg.layer_norm_eps = f.float_or("rms_norm_eps", 1e-6)?;
    cfg.rope_theta = f.float_or("rope_theta", 10_000.0)?;
    Ok((ModelKind::Llama, cfg, sliding_window))
}

/// The mixture of experts of `mixtral` (`num_local_experts`, `num_experts_per_tok`, always
/// renormalised) and `qwen3_moe` (`num_experts`, `num_experts_per_tok`, `norm_topk_prob`;
/// every layer sparse: `decoder_sparse_step` 1 and no `mlp_only_layers`, else refused).
fn moe_shape(f: &Fields, model_type: &str) -> Result<Option<MoeShape>, UserError> {
    let max = super::limits::MAX_EXPERTS;
    let (experts, norm_topk) = match model_type {
        "mixtral" => (f.size("num_local_experts", max)?, true),
        "qwen3_moe" => {
            let step = f.size_opt("decoder_sparse_step", super::limits::MAX_LAYERS)?;
            if let (Some(v), Some(s)) = (f.get("decoder_sparse_step"), step)
                && s != 1
            {
                return Err(f.bad(
                    "decoder_sparse_step",
                    v,
                    "dense layers between sparse ones are not modelled yet",
                    "1",
                ));
            }
            if let Some(v) = f.get("mlp_only_layers")
                && v.as_array().is_none_or(|a| !a.is_empty())
            {
                return Err(f.bad(
                    "mlp_only_layers",
                    v,
                    "dense layers between sparse ones are not modelled yet",
                    "[]",
                ));
            }
            (
                f.size("num_experts", max)?,
                f.bool_or("norm_topk_prob", false)?,
            )
        }
        _ => return Ok(None),
    };
    let top_k = f.size("num_experts_per_tok", max)?;
    if top_k > experts {
        return Err(f.bad(
            "num_experts_per_tok",
            &Value::from(top_k),
            &format!("more than the {experts} experts"),
            &format!("1..={experts}"),
        ));
    }
    Ok(Some(MoeShape {
        experts,
        top_k,
        norm_topk,
    }))
}

fn gpt2_config(f: &Fields) -> Result<Config, UserError> {
    f.require("activation_function", &["gelu_new"])?;
    let hidden = f.size("n_embd", MAX_SIZE)?;
    let heads = f.size("n_head", super::limits::MAX_HEADS)?;
    if let Some(inner) = f.size_opt("n_inner", MAX_SIZE)?
        && inner != 4 * hidden
    {
        return Err(f.bad(
            "n_inner",
            &Value::from(inner),
            "memfit's GPT MLP is 4·n_embd wide",
            &format!("null or {}", 4 * hidden),
        ));
    }
    if hidden % heads != 0 {
        return Err(f.bad(
            "n_head",
            &Value::from(heads),
            &format!("does not divide n_embd = {hidden}"),
            "a divisor of n_embd",
        ));
    }
    let mut cfg = Config::new(
        f.size("vocab_size", super::limits::MAX_VOCAB)?,
        hidden,
        heads,
        f.size("n_layer", super::limits::MAX_LAYERS)?,
        f.size("n_positions", super::limits::MAX_SEQ)?,
    );
    cfg.layer_norm_eps = f.float_or("layer_norm_epsilon", 1e-5)?;
    cfg.tied = f.bool_or("tie_word_embeddings", true)?;
    Ok(cfg)
}

fn vit_config(f: &Fields) -> Result<Config, UserError> {
    let hidden = f.size("hidden_size", MAX_SIZE)?;
    let heads = f.size("num_attention_heads", super::limits::MAX_HEADS)?;
    let inter = f.size("intermediate_size", MAX_SIZE)?;
    if inter != 4 * hidden {
        return Err(f.bad(
            "intermediate_size",
            &Value::from(inter),
            "memfit's ViT MLP is 4·hidden_size wide",
            &(4 * hidden).to_string(),
        ));
    }
    if hidden % heads != 0 {
        return Err(f.bad(
            "num_attention_heads",
            &Value::from(heads),
            &format!("does not divide hidden_size = {hidden}"),
            "a divisor of hidden_size",
        ));
    }
    let image = f.size("image_size", super::limits::MAX_IMAGE)?;
    let patch = f.size("patch_size", super::limits::MAX_IMAGE)?;
    if image % patch != 0 {
        return Err(f.bad(
            "patch_size",
            &Value::from(patch),
            &format!("does not divide image_size = {image}"),
            "a divisor of image_size",
        ));
    }
    let classes = match f.size_opt("num_labels", super::limits::MAX_VOCAB)? {
        Some(k) => k,
        None => match f.get("id2label") {
            Some(Value::Object(m)) if !m.is_empty() => m.len(),
            Some(v) => return Err(f.bad("id2label", v, "not a non-empty object", "{\"0\": …}")),
            None => 2,
        },
    };
    let mut cfg = Config::vit(vit::Sizes {
        vision: vit::Vision {
            image,
            patch,
            channels: f
                .size_opt("num_channels", super::limits::MAX_CHANNELS)?
                .unwrap_or(3),
        },
        classes,
        hidden,
        heads,
        layers: f.size("num_hidden_layers", super::limits::MAX_LAYERS)?,
    });
    cfg.layer_norm_eps = f.float_or("layer_norm_eps", 1e-12)?;
    Ok(cfg)
}
