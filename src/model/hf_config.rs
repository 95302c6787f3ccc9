//! A Hugging Face `config.json` (a local file; nothing is ever downloaded) read into a memfit
//! [`Config`].
//!
//! `model_type` decides the family: `llama`, `mistral`, `phi3`, `qwen2`, `qwen3`,
//! `gemma3_text`, `mixtral`, `qwen2_moe`, `qwen3_moe`, `deepseek_v2`, `deepseek_v3`, `gpt_oss` →
//! the LLaMA-family decoder ([`super::llama`]); `gpt2` → the GPT decoder; `vit` → the ViT
//! encoder; the multimodal `gemma3` (its vision tower) is refused by name. gpt-oss
//! (`Llama::oss`) takes `GptOssConfig`'s defaults for absent fields ([`GPT_OSS_DEFAULTS`]),
//! biases on q, k, v, o and the experts always, its router as Mixtral's (softmax, renormalised
//! top k), even layers sliding unless `layer_types` says otherwise, `swiglu_limit` 7 when
//! given, and reads its shipped `quantization_config` mxfp4 as the experts alone in MXFP4
//! ([`Shipped::Mxfp4Experts`]). A family with a file of its own ([`super::families`]: Gemma
//! 3) adds its keys, defaults, layer pattern and wrapping types to this shared reader. Read for LLaMA:
//! `hidden_size`, `intermediate_size`, `num_hidden_layers`, `num_attention_heads`,
//! `num_key_value_heads` (default: the attention heads), `head_dim` (default hidden/heads),
//! `vocab_size`, `max_position_embeddings`, `tie_word_embeddings` (default false),
//! `attention_bias` (llama: q, k, v, o; default false), `mlp_bias` (default false),
//! `rms_norm_eps`, `rope_theta`, `rope_scaling` (`linear`, `llama3`, `yarn` — DeepSeek's
//! with its `mscale²` on the attention scale —, `longrope` with its short factors, `dynamic` and
//! `default` as transformers computes the angles; the tables' sizes never change), `torch_dtype` or `dtype` (transformers ≥ 4.56; both must agree), `hidden_act` (must be `silu`), `sliding_window` (mistral, mixtral, phi3:
//! every layer, Mistral's 4096 when absent; qwen2, qwen3, qwen2_moe when `use_sliding_window`,
//! the layers from `max_window_layers` (default 28) on, qwen3_moe every layer; 4096 when
//! absent, as transformers' configs default) and
//! `layer_types` (per layer: full or sliding). Qwen2 (and Qwen2-MoE) has
//! q, k, v biases and none on o; Qwen3 reads `attention_bias` (default false) and has q/k
//! norms (`q_norm`, `k_norm`: RMSNorm over `head_dim`, with `rms_norm_eps`). DeepSeek reads
//! its multi-head latent attention ([`super::mla`]: `q_lora_rank`, `kv_lora_rank`,
//! `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`; `head_dim` becomes the rotary width,
//! as transformers sets it) and `scoring_func` (V2 softmax, V3 sigmoid: transformers builds
//! nothing else, so another value is refused). Absent fields take transformers' defaults
//! (DeepSeek-V2: 64 routed experts, 2 shared, no dense layer first; V3: 256, 1 shared, 3 dense
//! first; Qwen2-MoE's shared expert 5632 wide). Phi-3 is LLaMA with
//! fused `qkv_proj` and `gate_up_proj` weights: memfit builds the same projections unfused (the
//! same parameters, gradients and activations in bytes; a checkpoint's fused rows are q, k, v and
//! gate, up in that order), refuses `partial_rotary_factor` ≠ 1 (Phi-4-mini), and, as for every
//! family, non-zero dropout (`attention_dropout`, `resid_pdrop`, `embd_pdrop`). The mixtures of
//! experts are read by [`moe_shape`]. Fields that change memory and that memfit does not model
//! are refused, never ignored: mixture-of-experts fields in a dense type, the routers'
//! auxiliary loss, another activation, a `quantization_config` that memfit does not hold as
//! shipped (MXFP4, GPTQ, AWQ, bitsandbytes …, named in the error; `--hf-set
//! quantization_config=null` asks for the unquantized model).
//!
//! `quantization_config` with `quant_method: fp8` (DeepSeek-V3/R1, Kimi-K2, the `*-FP8` Qwen
//! checkpoints) is read as shipped ([`Shipped`]): e4m3 (`fmt`), 128×128 blocks
//! (`weight_block_size`, the default), dynamic activations (`activation_scheme`; activations are
//! not held in FP8 between ops), the block projections (attention, MLP, experts, shared
//! experts) in FP8 with an f32 scale per block and everything else (embeddings, norms, routers,
//! the head) in `dtype`; `modules_to_not_convert` may name only parts memfit keeps dense anyway
//! (the head, embeddings, norms, routers). Serving phases then hold the weights as shipped
//! (`weights = "fp8"` by default) and LoRA freezes its base as shipped (`lora_base = "fp8"`);
//! full training upcasts to `dtype`, as transformers' `dequantize: true` does (which is read too:
//! it asks for the dense model).
//! Every key is accounted for: `model_type` is checked first (an unknown type is refused as
//! unknown, listing [`model_types`], with what memfit lacks for the newer ones it knows of:
//! [`UNBUILT_TYPES`]); each reader records the keys it asks for, and once the family is read
//! any other key of the file is refused ([`accounted`]) unless [`super::hf_keys`] lists it as
//! changing no memory (token ids, `architectures`, generation defaults, `aux_loss_alpha`, DeepSeek-V3's
//! multi-token-prediction layers (`num_nextn_predict_layers`), which transformers does not build,
//! …, each with its reason), or it is transformers' private metadata (a leading underscore). A
//! refusal names the file and the key, and the known key nearest to a misspelling.
//! `--hf-set FIELD=VALUE` ([`load_with`]) changes any field before it is read, so a misspelt
//! field is refused the same way. Kimi-K2 (`kimi_k2`) is read as DeepSeek-V3, whose
//! architecture it ships. Dropout is refused in every family ([`DROPOUT_KEYS`]).
//!
//! GPT-2 reads `n_embd`, `n_head`, `n_layer`, `vocab_size`, `n_positions`,
//! `layer_norm_epsilon`, `n_inner` (null or 4·n_embd), `activation_function` (`gelu_new`, the
//! tanh GELU memfit's GPT uses) and `tie_word_embeddings` (default true, as in transformers).
//! ViT reads `hidden_size`, `num_hidden_layers`, `num_attention_heads`, `intermediate_size`
//! (4·hidden), `image_size`, `patch_size`, `num_channels` (default 3), `layer_norm_eps` and the
//! classes (`num_labels`, else the size of `id2label`, else transformers' default 2); memfit's
//! ViT computes GELU with the tanh approximation whatever `hidden_act` says.

use std::cell::RefCell;
use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::ModelKind;
use super::config::Config;
use super::families;
pub(crate) use super::hf_fields::{Fields, periodic};
use super::hf_keys;
use super::shapes::{
    Factor, GroupLimit, Llama, MlaShape, MoeShape, RopeScaling, Scoring, Sizes, Variant, Vision,
};

use super::shapes::ElemType;
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

/// The model types memfit reads: the LLaMA line's, the families' with a file
/// ([`families::FAMILIES`]), GPT-2 and ViT.
pub fn model_types() -> String {
    LLAMA_TYPES
        .iter()
        .copied()
        .chain(families::FAMILIES.iter().map(|f| f.model_type()))
        .chain(["gpt2", "vit"])
        .collect::<Vec<_>>()
        .join(", ")
}

/// Types memfit does not build yet, with what each needs (refused as unknown; none is another
/// type under a new name, so no relabelling sizes it).
const UNBUILT_TYPES: &[(&str, &str)] = &[
    (
        "mistral3",
        "Mistral 3 with its Pixtral vision tower is not built (its text_config, model_type \
         mistral, would size the language model alone, without the tower)",
    ),
    (
        "qwen2_vl",
        "Qwen2-VL's vision tower and multimodal rotary are not built",
    ),
    (
        "qwen2_5_vl",
        "Qwen2.5-VL's vision tower and multimodal rotary are not built",
    ),
    ("phimoe", "Phi-3.5-MoE's sparse-mixer router is not built"),
    (
        "granitemoe",
        "Granite's MoE with its own multipliers is not built",
    ),
    (
        "cohere",
        "Cohere's parallel attention and MLP blocks are not built",
    ),
    (
        "falcon",
        "Falcon's parallel attention and multi-query layout are not built",
    ),
];

/// The LLaMA-family types.
const LLAMA_TYPES: &[&str] = &[
    "llama",
    "mistral",
    "phi3",
    "qwen2",
    "qwen3",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "kimi_k2",
    "gpt_oss",
];

/// The mixture-of-experts types.
const MOE_TYPES: &[&str] = &[
    "glm4_moe",
    "llama4_text",
    "qwen3_next",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "gpt_oss",
];

/// The `rope_scaling` types accepted: each changes the rotary angles, none the tables' sizes
/// (`S_max × D/2`), which is what memory sees; memfit computes the default angles.
const ROPE_TYPES: &[&str] = &["default", "linear", "dynamic", "yarn", "longrope", "llama3"];

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
    /// How the checkpoint ships its block projections, when not in `dtype`.
    pub shipped: Option<Shipped>,
}

/// A checkpoint's block projections as shipped (`quantization_config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shipped {
    /// FP8 e4m3 with an f32 inverse scale per 128×128 block.
    Fp8,
    /// The experts' projections in MXFP4, the rest in `dtype` (gpt-oss).
    Mxfp4Experts,
}

/// Reads and parses `path`.
pub fn load(path: &std::path::Path) -> Result<HfConfig, UserError> {
    load_with(path, &[])
}

/// [`Fields::size`], or transformers' default for `model_type` when absent
/// ([`moe_default`]).
fn moe_size(f: &Fields, model_type: &str, field: &str, max: i64) -> Result<usize, UserError> {
    match (f.size_opt(field, max)?, moe_default(model_type, field)) {
        (Some(n), _) | (None, Some(n)) => Ok(n),
        (None, None) => Err(f.missing(field, &format!("an integer 1..={max}"))),
    }
}

/// Reads `path` with `sets` (`FIELD=VALUE`: the value as JSON, else as a string) applied to
/// its fields before they are read.
pub fn load_with(path: &std::path::Path, sets: &[String]) -> Result<HfConfig, UserError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| UserError::Unreadable {
        origin: origin.clone(),
        what: "Hugging Face config",
        message: e.to_string(),
    })?;
    parse_with(&text, &origin, sets)
}

/// The checkpoint's element type: `torch_dtype`, or `dtype` as transformers ≥ 4.56 writes it
/// (both given must agree).
fn config_dtype(f: &Fields) -> Result<Option<ElemType>, UserError> {
    let read = |field: &str| -> Result<Option<ElemType>, UserError> {
        match f.str_opt(field)? {
            None => Ok(None),
            Some("float32") => Ok(Some(ElemType::F32)),
            Some("float16") => Ok(Some(ElemType::F16)),
            Some("bfloat16") => Ok(Some(ElemType::Bf16)),
            Some(other) => Err(f.bad(
                field,
                &Value::from(other),
                "unknown element type",
                "float32, float16, bfloat16",
            )),
        }
    };
    match (read("torch_dtype")?, read("dtype")?) {
        (Some(a), Some(b)) if a != b => Err(f.bad(
            "dtype",
            &Value::from(b.as_str()),
            &format!("disagrees with torch_dtype ({})", a.as_str()),
            "the same element type in both, or one of them",
        )),
        (a, b) => Ok(a.or(b)),
    }
}

/// Reads a `quantization_config`: FP8 with 128×128 block scales as shipped; every other format
/// refused by name (sizing the unquantized model instead would be a different answer given
/// silently; `--hf-set quantization_config=null` asks for it).
fn quantization(f: &Fields) -> Result<Option<Shipped>, UserError> {
    let Some(q) = f.get("quantization_config").filter(|q| !q.is_null()) else {
        return Ok(None);
    };
    let method = q
        .get("quant_method")
        .and_then(Value::as_str)
        .unwrap_or("(no quant_method)");
    let format = match method {
        "fp8" => return fp8_config(f, q),
        "mxfp4" if f.str_opt("model_type")? == Some("gpt_oss") => return mxfp4_config(f, q),
        "mxfp4" => {
            "MXFP4: 4-bit values with an 8-bit scale per 32; memfit holds projections so \
             (`--weights mxfp4`, `--lora-base mxfp4`), but reads which modules a checkpoint ships \
             in it for gpt-oss only (its experts)"
        }
        "gptq" | "awq" => "4-bit integer weights with group scales",
        "bitsandbytes" => "bitsandbytes 8-bit or 4-bit weights",
        "compressed-tensors" => "compressed-tensors weights",
        _ => "a weight format",
    };
    Err(f.bad(
        "quantization_config",
        q,
        &format!(
            "quant_method `{method}` ({format}): memfit does not build checkpoints in this format yet, and sizing the unquantized model instead would be a different answer"
        ),
        "quant_method fp8, or no quantization_config: `--hf-set quantization_config=null` sizes the unquantized model in --dtype",
    ))
}

/// gpt-oss's `quant_method: mxfp4`: its experts' projections in MXFP4 (read as shipped,
/// `weights = "mxfp4-experts"`), everything `modules_to_not_convert` names (attention, router,
/// embeddings, head, norms: what gpt-oss ships) in `dtype`; naming anything else is refused;
/// `dequantize: true` asks for the dense model.
fn mxfp4_config(f: &Fields, q: &Value) -> Result<Option<Shipped>, UserError> {
    if q.get("dequantize").and_then(Value::as_bool) == Some(true) {
        return Ok(None);
    }
    if let Some(v) = q.get("modules_to_not_convert").filter(|v| !v.is_null()) {
        let allowed = "attention (self_attn), mlp.router, embed_tokens, lm_head, norms: memfit holds \
                       gpt-oss's experts alone in MXFP4";
        let names = v.as_array().ok_or_else(|| {
            f.bad(
                "quantization_config.modules_to_not_convert",
                v,
                "not a list",
                allowed,
            )
        })?;
        for name in names {
            let ok = name.as_str().is_some_and(|n| {
                n.ends_with("norm")
                    || ["self_attn", "mlp.router", "embed_tokens", "lm_head"]
                        .iter()
                        .any(|k| n == *k || n.ends_with(&format!(".{k}")))
            });
            if !ok {
                return Err(f.bad(
                    "quantization_config.modules_to_not_convert",
                    name,
                    "memfit holds gpt-oss's experts in MXFP4 and the rest dense; keeping an expert dense is not modelled",
                    allowed,
                ));
            }
        }
    }
    Ok(Some(Shipped::Mxfp4Experts))
}

/// The parts `modules_to_not_convert` may name: memfit holds them in `dtype` anyway.
const KEPT_DENSE: &[&str] = &[
    "lm_head",
    "embed_tokens",
    "norm",
    "mlp.gate",
    "shared_expert_gate",
];

/// `quant_method: fp8` (transformers' `FineGrainedFP8Config`): e4m3, 128×128 blocks, dynamic
/// activations; `dequantize: true` asks for the dense model.
fn fp8_config(f: &Fields, q: &Value) -> Result<Option<Shipped>, UserError> {
    let bad = |key: &str, v: &Value, why: &str, allowed: &str| {
        f.bad(&format!("quantization_config.{key}"), v, why, allowed)
    };
    if let Some(v) = q.get("dequantize")
        && v.as_bool() == Some(true)
    {
        return Ok(None);
    }
    if let Some(v) = q.get("fmt").filter(|v| v.as_str() != Some("e4m3")) {
        return Err(bad("fmt", v, "memfit holds FP8 as e4m3", "e4m3"));
    }
    if let Some(v) = q.get("weight_block_size").filter(|v| !v.is_null())
        && v.as_array()
            .map(|a| a.iter().map(Value::as_u64).collect::<Vec<_>>())
            != Some(vec![Some(128), Some(128)])
    {
        return Err(bad(
            "weight_block_size",
            v,
            "memfit holds FP8 with a scale per 128×128 block (DeepSeek-V3's and Qwen's layout)",
            "[128, 128]",
        ));
    }
    if let Some(v) = q
        .get("activation_scheme")
        .filter(|v| v.as_str() != Some("dynamic"))
    {
        return Err(bad(
            "activation_scheme",
            v,
            "static activation scales are not modelled",
            "dynamic",
        ));
    }
    if let Some(v) = q.get("modules_to_not_convert").filter(|v| !v.is_null()) {
        let names = v.as_array().ok_or_else(|| {
            bad(
                "modules_to_not_convert",
                v,
                "not a list",
                "a list of module names",
            )
        })?;
        for name in names {
            let ok = name.as_str().is_some_and(|n| {
                n.ends_with("norm")
                    || KEPT_DENSE
                        .iter()
                        .any(|k| n == *k || n.ends_with(&format!(".{k}")))
            });
            if !ok {
                return Err(bad(
                    "modules_to_not_convert",
                    name,
                    "memfit holds every block projection in FP8; keeping this one dense is not modelled",
                    "names of parts memfit keeps dense anyway: lm_head, embed_tokens, norms, mlp.gate (routers), shared_expert_gate",
                ));
            }
        }
    }
    Ok(Some(Shipped::Fp8))
}

/// Parses the text of a `config.json`; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<HfConfig, UserError> {
    parse_with(text, origin, &[])
}

/// [`parse`] with `sets` applied first (see [`load_with`]).
pub fn parse_with(text: &str, origin: &str, sets: &[String]) -> Result<HfConfig, UserError> {
    let mut value: Value = serde_json::from_str(text).map_err(|e| UserError::Syntax {
        origin: origin.into(),
        message: format!("not a JSON config: {e}"),
    })?;
    if let Value::Object(map) = &mut value {
        for set in sets {
            let Some((field, v)) = set.split_once('=').filter(|(f, _)| !f.trim().is_empty()) else {
                return Err(UserError::OutOfRange {
                    origin: origin.into(),
                    key: "hf_set".into(),
                    value: set.clone(),
                    reason: "not FIELD=VALUE".into(),
                    allowed: "FIELD=VALUE, e.g. num_hidden_layers=2".into(),
                });
            };
            let v = serde_json::from_str(v.trim()).unwrap_or_else(|_| Value::from(v.trim()));
            map.insert(field.trim().to_string(), v);
        }
    }
    let origin = &if sets.is_empty() {
        origin.to_string()
    } else {
        format!("{origin} (with hf_set {})", sets.join(", "))
    };
    let Value::Object(map) = &value else {
        return Err(UserError::Syntax {
            origin: origin.into(),
            message: "a config.json is a JSON object".into(),
        });
    };
    let read = RefCell::new(BTreeSet::new());
    let f = Fields {
        map,
        origin,
        read: &read,
    };
    let model_type = f
        .str_opt("model_type")?
        .ok_or_else(|| f.missing("model_type", &model_types()))?
        .to_string();
    // The type first: an unknown one is refused as unknown, whatever else the file says.
    if let Some(why) = families::wrapper(&model_type) {
        return Err(f.bad(
            "model_type",
            &Value::from(model_type.as_str()),
            why,
            &model_types(),
        ));
    }
    let family = families::find(&model_type);
    if !LLAMA_TYPES.contains(&model_type.as_str())
        && family.is_none()
        && !["gpt2", "vit"].contains(&model_type.as_str())
    {
        let why = UNBUILT_TYPES
            .iter()
            .find(|(t, _)| *t == model_type)
            .map_or("unknown model type".to_string(), |(_, why)| {
                format!("unknown model type: {why}")
            });
        return Err(f.bad(
            "model_type",
            &Value::from(model_type.as_str()),
            &why,
            &model_types(),
        ));
    }
    // Kimi-K2 ships DeepSeek-V3's architecture under its own type name (its `architectures` is
    // `DeepseekV3ForCausalLM`): read as DeepSeek-V3, defaults included.
    let reader_type = match model_type.as_str() {
        "kimi_k2" => "deepseek_v3",
        t => t,
    };
    // A family's configs (Gemma 3's) and gpt-oss's leave most fields to transformers'
    // defaults.
    let filled;
    let f = match (family, reader_type) {
        (Some(fam), _) => {
            filled = with_defaults(map, fam.defaults());
            Fields {
                map: &filled,
                origin,
                read: &read,
            }
        }
        (None, "gpt_oss") => {
            filled = with_defaults(map, GPT_OSS_DEFAULTS);
            Fields {
                map: &filled,
                origin,
                read: &read,
            }
        }
        _ => f,
    };
    let moe_type = MOE_TYPES.contains(&reader_type);
    for field in MOE_FIELDS.iter().filter(|_| !moe_type) {
        if let Some(v) = f.get(field) {
            return Err(f.bad(
                field,
                v,
                &format!(
                    "a mixture-of-experts field, but transformers' {model_type} is dense (it \
                     builds no experts, so the file is not the model it names)"
                ),
                "a config without it",
            ));
        }
    }
    let shipped = quantization(&f)?;
    let dtype = config_dtype(&f)?;
    no_dropout(&f)?;
    let (kind, cfg, sliding_window) = match reader_type {
        "gpt2" => (ModelKind::Gpt, gpt2_config(&f)?, None),
        "vit" => (ModelKind::Vit, vit_config(&f)?, None),
        t => llama_config(&f, t)?,
    };
    accounted(map, &read.borrow(), &model_type, reader_type, origin)?;
    Ok(HfConfig {
        kind,
        cfg,
        dtype,
        sliding_window,
        model_type,
        shipped,
    })
}

/// Every key of the file is read, or listed as leaving memory unchanged ([`hf_keys`]), or
/// transformers' private metadata (a leading underscore); any other key is refused, naming the
/// nearest key memfit knows when it looks like a misspelling.
fn accounted(
    map: &Map<String, Value>,
    read: &BTreeSet<String>,
    model_type: &str,
    reader_type: &str,
    origin: &str,
) -> Result<(), UserError> {
    for (key, value) in map {
        if key == "model_type" || key.starts_with('_') || read.contains(key) {
            continue;
        }
        let bad = |reason: String, allowed: String| UserError::OutOfRange {
            origin: origin.into(),
            key: key.clone(),
            value: value.to_string(),
            reason,
            allowed,
        };
        match hf_keys::neutral(reader_type, key) {
            Some(n) if n.when == hf_keys::When::Always || hf_keys::is_unset(value) => {}
            Some(n) => {
                return Err(bad(
                    format!("changes memory in a way memfit does not model: {}", n.why),
                    "null, false, 0 or absent".into(),
                ));
            }
            None => {
                let known = read
                    .iter()
                    .map(String::as_str)
                    .chain(hf_keys::COMMON.iter().map(|n| n.key))
                    .chain(hf_keys::family(reader_type).iter().map(|n| n.key));
                let hint = hf_keys::nearest(key, known)
                    .map_or(String::new(), |k| format!("did you mean `{k}`? "));
                let reads: Vec<&str> = read.iter().map(String::as_str).collect();
                return Err(UserError::UnknownKey {
                    origin: origin.into(),
                    key: format!("`{key}` = {value}"),
                    reason: format!(
                        "{hint}memfit's {model_type} reader does not read it and does not know \
                         it to leave memory unchanged, so ignoring it could size another model \
                         than the file's"
                    ),
                    allowed: format!(
                        "the keys memfit reads for {model_type} ({}), or ones it lists as \
                         changing no memory (token ids, generation defaults, metadata)",
                        reads.join(", ")
                    ),
                });
            }
        }
    }
    Ok(())
}

const MAX_SIZE: i64 = super::limits::MAX_HIDDEN;

/// transformers' `GptOssConfig` defaults (4.57.1: gpt-oss-120b's sizes) for the fields memfit
/// reads, where the config leaves them out; `layer_types` then alternates sliding (even layers)
/// and full (odd).
const GPT_OSS_DEFAULTS: &[(&str, &str)] = &[
    ("num_hidden_layers", "36"),
    ("num_local_experts", "128"),
    ("num_experts_per_tok", "4"),
    ("vocab_size", "201088"),
    ("hidden_size", "2880"),
    ("intermediate_size", "2880"),
    ("head_dim", "64"),
    ("num_attention_heads", "64"),
    ("num_key_value_heads", "8"),
    ("sliding_window", "128"),
    ("rope_theta", "150000.0"),
    ("max_position_embeddings", "131072"),
    ("rms_norm_eps", "1e-5"),
    (
        "rope_scaling",
        r#"{"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": false, "original_max_position_embeddings": 4096}"#,
    ),
];

/// A config with `defaults` where a field is absent.
fn with_defaults(map: &Map<String, Value>, defaults: &[(&str, &str)]) -> Map<String, Value> {
    let mut m = map.clone();
    for (k, v) in defaults {
        if !m.contains_key(*k) {
            m.insert(
                k.to_string(),
                serde_json::from_str(v).expect("the defaults are JSON"),
            );
        }
    }
    m
}

fn llama_config(
    f: &Fields,
    model_type: &str,
) -> Result<(ModelKind, Config, Option<usize>), UserError> {
    // A family with a file reads its own activation (and its other keys) once the shape is
    // filled in.
    let family = families::find(model_type);
    if family.is_none() {
        f.require("hidden_act", &["silu"])?;
    }
    // A partial rotary is read where transformers' attention splits each head (Phi-3's, for
    // Phi-4-mini's 0.75, below; GLM-4.5's family file); elsewhere it is refused.
    if let Some(v) = f
        .get("partial_rotary_factor")
        .filter(|_| !matches!(model_type, "glm4_moe" | "phi3" | "qwen3_next"))
        && v.as_f64() != Some(1.0)
    {
        return Err(f.bad(
            "partial_rotary_factor",
            v,
            "transformers' attention of this type rotates each head whole",
            "1.0",
        ));
    }
    let hidden = f.size("hidden_size", MAX_SIZE)?;
    let deepseek = model_type.starts_with("deepseek");
    // A mixture of experts: the experts are `moe_intermediate_size` wide (Mixtral:
    // `intermediate_size`), dense layers `intermediate_size`.
    let moe = moe_shape(f, model_type)?;
    let intermediate = match moe {
        Some(_) if !matches!(model_type, "mixtral" | "gpt_oss") => {
            moe_size(f, model_type, "moe_intermediate_size", MAX_SIZE)?
        }
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
    let mla = if deepseek {
        Some(mla_shape(f, model_type)?)
    } else {
        None
    };
    let head_dim = match (mla, f.size_opt("head_dim", MAX_SIZE)?) {
        // MLA: the rotary part's width, as transformers sets `head_dim`.
        (Some(m), _) => m.qk_rope_head_dim,
        (None, Some(d)) => d,
        (None, None) if hidden % heads == 0 => hidden / heads,
        (None, None) => {
            return Err(f.missing(
                "head_dim",
                &format!("given when hidden_size = {hidden} is not a multiple of num_attention_heads = {heads}"),
            ));
        }
    };
    if head_dim % 2 != 0 {
        let field = if mla.is_some() {
            "qk_rope_head_dim"
        } else {
            "head_dim"
        };
        return Err(f.bad(
            field,
            &Value::from(head_dim),
            "the rotary embedding rotates pairs",
            "an even number",
        ));
    }
    // Qwen2 (and Qwen2-MoE): biases on q, k, v always (its config has no `attention_bias`);
    // Qwen3: none by default, q/k norms.
    let qwen2 = matches!(model_type, "qwen2" | "qwen2_moe");
    if qwen2 {
        // transformers' Qwen2 biases q, k, v whatever `attention_bias` says (not its field).
        f.ignored(&["attention_bias"]);
    }
    // Qwen2-MoE's `qkv_bias` (transformers 4.57; true by default) turns them off.
    let qkv_bias = qwen2 && (model_type != "qwen2_moe" || f.bool_or("qkv_bias", true)?);
    // gpt-oss: biases on q, k, v, o always (transformers sets `attention_bias` itself) and on
    // the experts' projections.
    let oss = model_type == "gpt_oss";
    if let Some(v) = f.get("swiglu_limit").filter(|_| oss)
        && v.as_f64() != Some(7.0)
    {
        return Err(f.bad(
            "swiglu_limit",
            v,
            "memfit's gpt-oss experts clamp at 7 (transformers 4.57's `GptOssExperts.limit`)",
            "7.0",
        ));
    }
    // gpt-oss's config class sets `attention_bias` true; a file may say otherwise.
    let attention_bias = if qwen2 {
        false
    } else {
        f.bool_or("attention_bias", oss)?
    };
    let (sliding_window, full_layers) = sliding_window(f, model_type, layers)?;
    let mut llama = Llama {
        intermediate,
        kv_heads,
        head_dim,
        qkv_bias: qkv_bias || attention_bias,
        o_bias: attention_bias,
        mlp_bias: oss || f.bool_or("mlp_bias", false)?,
        qk_norm: matches!(model_type, "qwen3" | "qwen3_moe"),
        moe,
        sliding_window,
        full_layers,
        mla,
        // gpt-oss: sinks, a biased router and its clamped SwiGLU experts.
        variant: Variant {
            attention_sinks: oss,
            router_bias: oss,
            clamped_glu: oss,
            // Phi-3's attention rotates the first `int(head_dim · partial_rotary_factor)`.
            partial_rotary: if model_type == "phi3" {
                super::hf_fields::partial_rotary(f, head_dim, 1.0)?
            } else {
                None
            },
            ..Variant::default()
        },
    };
    if let Some(fam) = family {
        fam.read(f, &mut llama)?;
    }
    let mut cfg = Config::llama(
        vocab,
        hidden,
        heads,
        layers,
        max_seq,
        llama,
        f.bool_or(
            "tie_word_embeddings",
            family.is_some_and(|fam| fam.tied_by_default()),
        )?,
    );
    cfg.layer_norm_eps = f.float_or("rms_norm_eps", 1e-6)?;
    cfg.rope_theta = f.float_or("rope_theta", 10_000.0)?;
    cfg.rope_scaling = rope_scaling(f, model_type, head_dim, max_seq)?;
    Ok((ModelKind::Llama, cfg, sliding_window))
}

/// The dropout probabilities of the families' configs (LLaMA family: `attention_dropout`,
/// Phi-3's `resid_pdrop` and `embd_pdrop`; GPT-2: `attn_pdrop`, `resid_pdrop`, `embd_pdrop`;
/// ViT: `hidden_dropout_prob`, `attention_probs_dropout_prob`).
const DROPOUT_KEYS: &[&str] = &[
    "attention_dropout",
    "attn_pdrop",
    "resid_pdrop",
    "embd_pdrop",
    "hidden_dropout",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
];

/// Dropout keeps a mask per dropped tensor in training, which memfit does not build: in every
/// family the dropout probabilities ([`DROPOUT_KEYS`]) must be 0 when given (what every shipped
/// LLaMA-family config says; GPT-2's and ViT's ship 0.1 and 0.0).
fn no_dropout(f: &Fields) -> Result<(), UserError> {
    for key in DROPOUT_KEYS {
        if let Some(v) = f.get(key)
            && v.as_f64() != Some(0.0)
        {
            return Err(f.bad(
                key,
                v,
                "dropout is not built (training would keep a mask per dropped tensor, which \
                 memfit does not count)",
                &format!("0.0; `--hf-set {key}=0` sizes the model without dropout"),
            ));
        }
    }
    Ok(())
}

/// `rope_scaling`: null, or an object whose `rope_type` (or `type`) is one of [`ROPE_TYPES`],
/// read as transformers' `modeling_rope_utils` computes its angles (`default` and `dynamic`:
/// the default angles, which `dynamic` keeps up to `max_position_embeddings`); its keys are
/// checked by type, a missing `factor` or a LongRoPE factor list of another length than
/// `dim / 2` refused. DeepSeek's YaRN also multiplies the attention scale by `mscale²` (from
/// `mscale_all_dim`), as transformers' DeepSeek attention does.
fn rope_scaling(
    f: &Fields,
    model_type: &str,
    dim: usize,
    max_pos: usize,
) -> Result<Option<RopeScaling>, UserError> {
    // transformers reads a top-level `original_max_position_embeddings` (Phi-3's) for LongRoPE
    // alone (below); beside another scaling, or none, it changes nothing.
    f.ignored(&["original_max_position_embeddings"]);
    let Some(v) = f.get("rope_scaling").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let allowed = format!(
        "null, or an object with rope_type one of {}",
        ROPE_TYPES.join(", ")
    );
    let Value::Object(m) = v else {
        return Err(f.bad("rope_scaling", v, "not an object", &allowed));
    };
    let kind = match m
        .get("rope_type")
        .or_else(|| m.get("type"))
        .and_then(Value::as_str)
    {
        Some(t) if ROPE_TYPES.contains(&t) => t,
        _ => return Err(f.bad("rope_scaling", v, "unknown rope_type", &allowed)),
    };
    let num = |key: &str| -> Result<Option<f64>, UserError> {
        match m.get(key).filter(|x| !x.is_null()) {
            None => Ok(None),
            Some(x) => x.as_f64().map(Some).ok_or_else(|| {
                f.bad(
                    &format!("rope_scaling.{key}"),
                    x,
                    "not a number",
                    "a number",
                )
            }),
        }
    };
    let need = |key: &str| -> Result<f64, UserError> {
        num(key)?.ok_or_else(|| {
            f.missing(
                &format!("rope_scaling.{key}"),
                &format!("a number (rope_type {kind})"),
            )
        })
    };
    let original = |default: usize| -> Result<usize, UserError> {
        Ok(num("original_max_position_embeddings")?.map_or(default, |x| x as usize))
    };
    Ok(match kind {
        "default" | "dynamic" => None,
        "linear" => Some(RopeScaling::Linear {
            factor: need("factor")?,
        }),
        "llama3" => Some(RopeScaling::Llama3 {
            factor: need("factor")?,
            low_freq_factor: need("low_freq_factor")?,
            high_freq_factor: need("high_freq_factor")?,
            original_max: need("original_max_position_embeddings")? as usize,
        }),
        "yarn" => {
            let factor = need("factor")?;
            let mscale = |scale: f64, m: f64| {
                if scale <= 1.0 {
                    1.0
                } else {
                    0.1 * m * scale.ln() + 1.0
                }
            };
            let (ms, ms_all) = (num("mscale")?, num("mscale_all_dim")?);
            let attention_factor = match (num("attention_factor")?, ms, ms_all) {
                (Some(a), _, _) => a,
                (None, Some(a), Some(b)) if a != 0.0 && b != 0.0 => {
                    mscale(factor, a) / mscale(factor, b)
                }
                _ => mscale(factor, 1.0),
            };
            let deepseek = model_type.starts_with("deepseek");
            let softmax_scale = match ms_all {
                Some(b) if deepseek && b != 0.0 => mscale(factor, b).powi(2),
                _ => 1.0,
            };
            Some(RopeScaling::Yarn {
                factor,
                original_max: original(max_pos)?,
                beta_fast: num("beta_fast")?.filter(|&b| b != 0.0).unwrap_or(32.0),
                beta_slow: num("beta_slow")?.filter(|&b| b != 0.0).unwrap_or(1.0),
                truncate: m.get("truncate").and_then(Value::as_bool).unwrap_or(true),
                attention_factor,
                softmax_scale,
            })
        }
        "longrope" => {
            let factors: Vec<f64> = m
                .get("short_factor")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default();
            if factors.len() != dim / 2 {
                return Err(f.bad(
                    "rope_scaling.short_factor",
                    m.get("short_factor").unwrap_or(&Value::Null),
                    &format!(
                        "LongRoPE needs one factor per rotary frequency ({})",
                        dim / 2
                    ),
                    &format!("a list of {} numbers", dim / 2),
                ));
            }
            // transformers: the factor is max / original when the config gives the original.
            let orig = f.size_opt("original_max_position_embeddings", MAX_SIZE)?;
            let factor = match orig {
                Some(o) => max_pos as f64 / o as f64,
                None => num("factor")?.unwrap_or(1.0),
            };
            let orig = orig.unwrap_or(max_pos) as f64;
            let attention_factor = match num("attention_factor")? {
                Some(a) => a,
                None if factor <= 1.0 => 1.0,
                None => (1.0 + factor.ln() / orig.ln()).sqrt(),
            };
            Some(RopeScaling::LongRope {
                factors,
                attention_factor,
            })
        }
        _ => unreachable!("ROPE_TYPES"),
    })
}

/// The attention window and the layers that do not use it (bit `i`: layer `i` attends to
/// everything): `sliding_window` in mistral, mixtral and phi3 (every layer; Mistral's 4096
/// when absent); in qwen2, qwen3 and qwen2_moe when `use_sliding_window`, the layers from
/// `max_window_layers` (default 28) on slide (transformers' `layer_types` for Qwen), in
/// qwen3_moe every layer (4096 when absent); `layer_types`, when given, says per layer (`full_attention`,
/// `sliding_attention`; a mixed model of more than 128 layers is refused).
fn sliding_window(
    f: &Fields,
    model_type: &str,
    layers: usize,
) -> Result<(Option<usize>, u128), UserError> {
    let all = |from: usize| -> u128 { (0..from.min(128)).fold(0, |m, i| m | 1u128 << i) };
    // transformers' default window where the key is absent (Mistral's and Qwen's configs:
    // 4096); an explicit null is no window.
    let window_or = |default: Option<usize>| -> Result<Option<usize>, UserError> {
        if f.has("sliding_window") {
            f.size_opt("sliding_window", super::limits::MAX_SEQ)
        } else {
            Ok(default)
        }
    };
    let pattern = families::find(model_type).and_then(|fam| fam.layer_pattern(f, layers));
    let (window, mut full) = match model_type {
        _ if pattern.is_some() => pattern.expect("a pattern")?,
        "mistral" => (window_or(Some(4096))?, 0),
        "mixtral" | "phi3" => (f.size_opt("sliding_window", super::limits::MAX_SEQ)?, 0),
        // gpt-oss: even layers slide, odd ones attend to everything.
        "gpt_oss" => periodic(f, layers, 2)?,
        // Qwen3-MoE's attention slides in every layer (it has no `max_window_layers`).
        "qwen3_moe" if f.bool_or("use_sliding_window", false)? => (window_or(Some(4096))?, 0),
        "qwen2" | "qwen3" | "qwen2_moe" if f.bool_or("use_sliding_window", false)? => {
            let from = match f.get("max_window_layers") {
                None => 28,
                Some(v) => v.as_u64().ok_or_else(|| {
                    f.bad("max_window_layers", v, "not an integer", "an integer ≥ 0")
                })? as usize,
            };
            if from >= layers {
                (None, 0)
            } else if from > 128 {
                return Err(f.bad(
                    "max_window_layers",
                    &Value::from(from),
                    "more than 128 full layers before sliding ones are not modelled",
                    "0..=128, or ≥ num_hidden_layers",
                ));
            } else {
                (window_or(Some(4096))?, all(from))
            }
        }
        // Qwen's window keys without `use_sliding_window`: transformers ignores them too.
        "qwen2" | "qwen3" | "qwen2_moe" | "qwen3_moe" => {
            f.ignored(&["sliding_window", "max_window_layers"]);
            (None, 0)
        }
        _ => (None, 0),
    };
    // Qwen3-MoE slides every layer when it slides: `max_window_layers` is not read by it.
    if model_type == "qwen3_moe" {
        f.ignored(&["max_window_layers"]);
    }
    if let Some(v) = f.get("layer_types") {
        let types: Option<Vec<&str>> = v
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .filter(|t: &Vec<&str>| {
                t.len() == layers
                    && t.iter().all(|x| match *x {
                        "full_attention" | "sliding_attention" => true,
                        // Llama 4's window is a chunk (`attention_chunk_size`).
                        "chunked_attention" => model_type == "llama4_text",
                        // Qwen3-Next's linear layers (its family reads which).
                        "linear_attention" => model_type == "qwen3_next",
                        _ => false,
                    })
            });
        let allowed = format!(
            "{layers} entries, each full_attention or sliding_attention (sliding ones with a sliding_window)"
        );
        let Some(types) = types else {
            return Err(f.bad(
                "layer_types",
                v,
                "not a list of the layers' attention types",
                &allowed,
            ));
        };
        let sliding = types
            .iter()
            .any(|t| matches!(*t, "sliding_attention" | "chunked_attention"));
        if sliding && window.is_none() {
            return Err(f.bad(
                "layer_types",
                v,
                "sliding layers without a sliding_window",
                &allowed,
            ));
        }
        let mixed = sliding && types.contains(&"full_attention");
        if mixed && layers > 128 {
            return Err(f.bad(
                "layer_types",
                v,
                "full and sliding layers mixed in more than 128 layers are not modelled",
                "at most 128 layers when they mix",
            ));
        }
        full = types
            .iter()
            .enumerate()
            .filter(|(_, t)| **t == "full_attention")
            .fold(0, |m, (i, _)| m | 1u128 << i.min(127));
        if !sliding {
            return Ok((None, 0));
        }
    }
    Ok((window, if window.is_some() { full } else { 0 }))
}

/// DeepSeek's multi-head latent attention: `q_lora_rank` (null: one q projection),
/// `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`; DeepSeek-V3's
/// `rope_interleave` must be true (its default).
fn mla_shape(f: &Fields, model_type: &str) -> Result<MlaShape, UserError> {
    if model_type == "deepseek_v3" && !f.bool_or("rope_interleave", true)? {
        return Err(f.bad(
            "rope_interleave",
            &Value::from(false),
            "memfit's MLA rotates interleaved pairs (DeepSeek-V2's and V3's default)",
            "true",
        ));
    }
    // transformers derives `qk_head_dim` (nope + rope) and V3's `head_dim` (rope) but keeps a
    // value the file gives, which then sizes the query projection and the rotary: only the
    // derived values are the model memfit builds.
    let (nope, rope) = (
        f.size("qk_nope_head_dim", MAX_SIZE)?,
        f.size("qk_rope_head_dim", MAX_SIZE)?,
    );
    for (key, want) in [("qk_head_dim", nope + rope), ("head_dim", rope)] {
        // DeepSeek-V2's config class overwrites `head_dim` whatever the file says.
        if model_type == "deepseek_v2" && key == "head_dim" {
            continue;
        }
        if let Some(v) = f.get(key)
            && v.as_u64() != Some(want as u64)
        {
            return Err(f.bad(
                key,
                v,
                "differs from the value transformers derives from qk_nope_head_dim and \
                 qk_rope_head_dim, which memfit's MLA uses",
                &want.to_string(),
            ));
        }
    }
    Ok(MlaShape {
        q_lora_rank: f.size_opt("q_lora_rank", MAX_SIZE)?,
        kv_lora_rank: f.size("kv_lora_rank", MAX_SIZE)?,
        qk_nope_head_dim: f.size("qk_nope_head_dim", MAX_SIZE)?,
        qk_rope_head_dim: f.size("qk_rope_head_dim", MAX_SIZE)?,
        v_head_dim: f.size("v_head_dim", MAX_SIZE)?,
        decompressed_decode: false,
    })
}

/// A non-negative integer (default `default`).
fn count_or(f: &Fields, field: &str, default: usize) -> Result<usize, UserError> {
    match f.get(field) {
        None => Ok(default),
        Some(v) => v
            .as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| f.bad(field, v, "not an integer ≥ 0", "an integer ≥ 0")),
    }
}

/// transformers' default of a mixture-of-experts size field its config class sets when the file
/// leaves it out (transformers 4.57's `configuration_*.py`).
fn moe_default(model_type: &str, field: &str) -> Option<usize> {
    Some(match (model_type, field) {
        ("mixtral", "num_local_experts") => 8,
        ("mixtral", "num_experts_per_tok") => 2,
        ("qwen2_moe", "num_experts") => 60,
        ("qwen2_moe", "num_experts_per_tok") => 4,
        ("qwen2_moe", "moe_intermediate_size") => 1408,
        ("qwen3_moe", "num_experts") => 128,
        ("qwen3_moe", "num_experts_per_tok") => 8,
        ("qwen3_moe", "moe_intermediate_size") => 768,
        ("deepseek_v2", "moe_intermediate_size") => 1407,
        ("deepseek_v3", "moe_intermediate_size") => 2048,
        ("deepseek_v3", "num_experts_per_tok") => 8,
        _ => return None,
    })
}

/// The mixture of experts of each type:
/// - `mixtral`: `num_local_experts`, `num_experts_per_tok`, always renormalised;
/// - `qwen2_moe`, `qwen3_moe`: `num_experts`, `num_experts_per_tok`, `norm_topk_prob`
///   (default false), `decoder_sparse_step` (default 1), `mlp_only_layers` (dense layers,
///   indices below 128);
///   Qwen2-MoE's shared expert of `shared_expert_intermediate_size` (default 5632) with its
///   sigmoid gate;
/// - `deepseek_v2`, `deepseek_v3`: `n_routed_experts` (absent: 64 / 256 as transformers'
///   defaults; null: a dense model), `num_experts_per_tok`, `n_shared_experts` (default 2 / 1)
///   × `moe_intermediate_size` shared, `first_k_dense_replace` (default 0 / 3) dense layers
///   first (`moe_layer_freq` must be 1), `routed_scaling_factor`, `norm_topk_prob` (V3 only:
///   transformers' V2 never renormalises); V2's `topk_method` greedy or
///   group_limited_greedy (softmax scores; `n_group`, `topk_group`), V3's noaux_tc (sigmoid
///   scores, the correction bias, groups ranked by their two best).
///
/// The routers' auxiliary loss is refused where a config asks for it in training
/// (`output_router_logits`), not ignored: memfit does not build it yet.
fn moe_shape(f: &Fields, model_type: &str) -> Result<Option<MoeShape>, UserError> {
    let max = super::limits::MAX_EXPERTS;
    if f.bool_or("output_router_logits", false)? {
        return Err(f.bad(
            "output_router_logits",
            &Value::from(true),
            "the routers' auxiliary loss is not built yet",
            "false",
        ));
    }
    let dense_width = || f.size("intermediate_size", MAX_SIZE);
    let mut shape = match model_type {
        // gpt-oss routes by the top k logits' softmax: the same weights as the top k of the
        // softmax over every expert, renormalised.
        "mixtral" | "gpt_oss" => {
            MoeShape::plain(moe_size(f, model_type, "num_local_experts", max)?, 0, true)
        }
        "qwen2_moe" | "qwen3_moe" | "qwen3_next" => {
            let layers = f.size("num_hidden_layers", super::limits::MAX_LAYERS)?;
            let dense_layers = match f.get("mlp_only_layers") {
                None => 0u128,
                Some(v) => super::hf_fields::layer_set(f, "mlp_only_layers", v, layers)?,
            };
            let mut m = MoeShape::plain(
                moe_size(f, model_type, "num_experts", max)?,
                0,
                f.bool_or("norm_topk_prob", false)?,
            );
            m.sparse_step = f
                .size_opt("decoder_sparse_step", super::limits::MAX_LAYERS)?
                .unwrap_or(1);
            m.dense_layers = dense_layers;
            if m.sparse_step > 1 || dense_layers != 0 {
                m.dense_width = dense_width()?;
            } else {
                // Every layer sparse: transformers sizes nothing by the dense width.
                f.ignored(&["intermediate_size"]);
            }
            if matches!(model_type, "qwen2_moe" | "qwen3_next") {
                m.shared = count_or(f, "shared_expert_intermediate_size", 5632)?;
                m.shared_gate = m.shared > 0;
            }
            m
        }
        "deepseek_v2" | "deepseek_v3" => {
            let v3 = model_type == "deepseek_v3";
            // transformers' defaults: 64 routed experts (V2), 256 (V3); `n_routed_experts:
            // null` is a dense model.
            let experts = if f.has("n_routed_experts") {
                f.size_opt("n_routed_experts", max)?
            } else {
                Some(if v3 { 256 } else { 64 })
            };
            let Some(experts) = experts else {
                // A dense DeepSeek: transformers reads none of the experts' fields.
                f.ignored(&[
                    "num_experts_per_tok",
                    "n_shared_experts",
                    "moe_intermediate_size",
                    "first_k_dense_replace",
                    "moe_layer_freq",
                    "routed_scaling_factor",
                    "norm_topk_prob",
                    "scoring_func",
                    "topk_method",
                    "n_group",
                    "topk_group",
                ]);
                return Ok(None);
            };
            // transformers scores V2's router with a softmax and V3's with a sigmoid whatever
            // `scoring_func` says: a config that says otherwise is not the model it builds.
            let scoring = if v3 { "sigmoid" } else { "softmax" };
            if let Some(v) = f.get("scoring_func")
                && v.as_str() != Some(scoring)
            {
                return Err(f.bad(
                    "scoring_func",
                    v,
                    &format!("transformers' {model_type} scores its router with a {scoring}"),
                    scoring,
                ));
            }
            if let Some(v) = f.get("moe_layer_freq")
                && v.as_u64() != Some(1)
            {
                return Err(f.bad(
                    "moe_layer_freq",
                    v,
                    "dense layers between sparse ones are not modelled yet",
                    "1",
                ));
            }
            // V2 never renormalises its top-k weights in transformers (`norm_topk_prob` is
            // read and unused); V3 does unless `norm_topk_prob: false`.
            let renorm = v3 && f.bool_or("norm_topk_prob", true)?;
            f.ignored(&["norm_topk_prob"]);
            let mut m = MoeShape::plain(experts, 0, renorm);
            m.routed_scale =
                Factor(f.float_or("routed_scaling_factor", if v3 { 2.5 } else { 1.0 })?);
            m.first_dense = count_or(f, "first_k_dense_replace", if v3 { 3 } else { 0 })?;
            if m.first_dense > 0 {
                m.dense_width = dense_width()?;
            } else {
                // Every layer sparse: transformers sizes nothing by the dense width.
                f.ignored(&["intermediate_size"]);
            }
            m.shared = count_or(f, "n_shared_experts", if v3 { 1 } else { 2 })?
                * moe_size(f, model_type, "moe_intermediate_size", MAX_SIZE)?;
            let method =
                f.str_opt("topk_method")?
                    .unwrap_or(if v3 { "noaux_tc" } else { "greedy" });
            let defaults = if v3 { (8, 4) } else { (1, 1) };
            let groups = |m: &MoeShape, top2_sum| group_limit(f, m.experts, defaults, top2_sum);
            match (v3, method) {
                // Greedy top k over every expert: transformers' V2 reads no group.
                (false, "greedy") => f.ignored(&["n_group", "topk_group"]),
                (false, "group_limited_greedy") => m.group = Some(groups(&m, false)?),
                (true, "noaux_tc") => {
                    m.scoring = Scoring::Sigmoid;
                    m.correction_bias = true;
                    m.group = Some(groups(&m, true)?);
                }
                (_, other) => {
                    return Err(f.bad(
                        "topk_method",
                        &Value::from(other),
                        "not the routing transformers builds for this model type",
                        if v3 {
                            "noaux_tc"
                        } else {
                            "greedy, group_limited_greedy"
                        },
                    ));
                }
            }
            m
        }
        // GLM-4.5 (its family file gives `Glm4MoeConfig`'s defaults): DeepSeek-V3's router
        // (sigmoid scores, the correction bias, groups ranked by their two best, `1e-20` in
        // the renormalisation) over `n_routed_experts`, `n_shared_experts` ×
        // `moe_intermediate_size` shared, `first_k_dense_replace` dense layers first.
        "glm4_moe" => {
            let experts = f.size("n_routed_experts", max)?;
            let mut m = MoeShape::plain(experts, 0, f.bool_or("norm_topk_prob", true)?);
            m.routed_scale = Factor(f.float_or("routed_scaling_factor", 1.0)?);
            m.first_dense = count_or(f, "first_k_dense_replace", 1)?;
            if m.first_dense > 0 {
                m.dense_width = dense_width()?;
            } else {
                f.ignored(&["intermediate_size"]);
            }
            m.shared =
                count_or(f, "n_shared_experts", 1)? * f.size("moe_intermediate_size", MAX_SIZE)?;
            m.scoring = Scoring::Sigmoid;
            m.correction_bias = true;
            m.group = Some(group_limit(f, experts, (1, 1), true)?);
            m
        }
        _ => return Ok(None),
    };
    let experts = shape.experts;
    let top_k = moe_size(f, model_type, "num_experts_per_tok", max)?;
    super::hf_fields::check_top_k(f, top_k, experts)?;
    if let Some(g) = shape.group
        && top_k > g.top_groups * (experts / g.groups)
    {
        return Err(f.bad(
            "num_experts_per_tok",
            &Value::from(top_k),
            &format!(
                "more than the {} experts of the topk_group = {} groups",
                g.top_groups * (experts / g.groups),
                g.top_groups
            ),
            "≤ topk_group · n_routed_experts / n_group",
        ));
    }
    shape.top_k = top_k;
    Ok(Some(shape))
}

/// A router's group limit: `n_group` groups of the `experts` (`defaults` when absent: the
/// config class's), the best `topk_group` of them kept, ranked by their best or (`top2_sum`)
/// their two best scores summed; refused unless the groups divide the experts and keep no
/// more groups than there are.
fn group_limit(
    f: &Fields,
    experts: usize,
    defaults: (usize, usize),
    top2_sum: bool,
) -> Result<GroupLimit, UserError> {
    let max = super::limits::MAX_EXPERTS;
    let groups = f.size_opt("n_group", max)?.unwrap_or(defaults.0);
    let top_groups = f.size_opt("topk_group", max)?.unwrap_or(defaults.1);
    if !experts.is_multiple_of(groups) || top_groups > groups {
        return Err(f.bad(
            "n_group",
            &Value::from(groups),
            &format!(
                "does not divide the {experts} experts, or topk_group = {top_groups} exceeds it"
            ),
            "a divisor of n_routed_experts, ≥ topk_group",
        ));
    }
    Ok(GroupLimit {
        groups,
        top_groups,
        top2_sum,
    })
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
    if !f.bool_or("qkv_bias", true)? {
        return Err(f.bad(
            "qkv_bias",
            &Value::from(false),
            "memfit's ViT has biases on q, k and v (transformers' default)",
            "true",
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
        Some(k) => {
            // The labels' names: `num_labels` gives their count.
            f.ignored(&["id2label"]);
            k
        }
        None => match f.get("id2label") {
            Some(Value::Object(m)) if !m.is_empty() => m.len(),
            Some(v) => return Err(f.bad("id2label", v, "not a non-empty object", "{\"0\": …}")),
            None => 2,
        },
    };
    let mut cfg = Config::vit(Sizes {
        vision: Vision {
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
