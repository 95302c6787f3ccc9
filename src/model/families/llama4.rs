//! Llama 4's text model (`llama4_text`; transformers' `modeling_llama4`, 4.57.1,
//! `Llama4ForCausalLM`) over the shared layers: a Llama attention (GQA, `head_dim`, no biases)
//! whose rotary layers attend within chunks of `attention_chunk_size` tokens (a query sees the
//! keys of its own chunk up to itself; [`Variant::chunked_attention`]: the window is a chunk,
//! the cache keeps the current chunk) and L2-normalise each query and key head with no weight
//! (`use_qk_norm`, [`Variant::qk_l2_norm`]), while every `no_rope_layer_interval`-th layer (or
//! as `no_rope_layers` lists; an empty list is absent) is NoPE, attends causally to everything, and tempers its queries
//! (`attn_temperature_tuning`: times `ln(1 + ⌊(p + 1)/floor_scale⌋)·attn_scale + 1` at
//! position `p`, [`Variant::attn_temperature`]); a mixture of experts on the layers of
//! `moe_layers` (else every `interleave_moe_layer_step`-th): the top `num_experts_per_tok` of
//! `num_local_experts` by the router's logits, their sigmoid multiplied into the expert's input
//! ([`crate::model::shapes::MoeShape::input_scaled`]), SwiGLU experts and a shared expert of
//! `intermediate_size` on every token, summed; the dense layers' SwiGLU is
//! `intermediate_size_mlp` wide; the head untied by default.
//!
//! As memfit builds it: transformers rotates interleaved pairs of each head (complex
//! `freqs_cis`); memfit rotates the halves, which is the same function of weights whose q and
//! k rows are de-interleaved per head (pair `j`'s two rows moved to `j` and `D/2 + j`, as
//! transformers' own Llama conversion permutes Meta's checkpoints; the fixture's weights and
//! gradients are written so), with the same tensors' sizes. The L2 norm comes before the
//! rotation (transformers': after; the rotation keeps each head's norm, so the values are the
//! same). transformers' experts run every token through every expert (an input of zeros where
//! not routed, `E·T` rows); memfit, as the other mixtures, gathers each expert's tokens. Fields
//! a config leaves out take `Llama4TextConfig`'s defaults (Llama-4-Scout-17B-16E's shape). The
//! multimodal `llama4` (its vision tower and projector) is refused by name.

use serde_json::Value;

use super::Family;
use crate::error::UserError;
use crate::model::hf_fields::{Fields, check_top_k, layer_set};
use crate::model::limits::{MAX_EXPERTS, MAX_HIDDEN, MAX_LAYERS, MAX_SEQ};
use crate::model::shapes::{Factor, Llama, MoeShape, Scoring, Variant};

pub struct Llama4;

/// The mixture of experts: `num_local_experts`, `num_experts_per_tok`, sigmoid weights on the
/// experts' inputs, a shared expert of `intermediate_size`; sparse on `moe_layers` (else every
/// `interleave_moe_layer_step`-th layer), dense `intermediate_size_mlp` elsewhere.
fn moe(f: &Fields, layers: usize) -> Result<MoeShape, UserError> {
    let experts = f.size("num_local_experts", MAX_EXPERTS)?;
    let top_k = f.size("num_experts_per_tok", MAX_EXPERTS)?;
    check_top_k(f, top_k, experts)?;
    let mut m = MoeShape::plain(experts, top_k, false);
    m.scoring = Scoring::Sigmoid;
    m.input_scaled = true;
    m.shared = f.size("intermediate_size", MAX_HIDDEN)?;
    match f.get("moe_layers") {
        Some(v) => {
            // transformers reads the step only to make a missing list.
            f.ignored(&["interleave_moe_layer_step"]);
            let sparse = layer_set(f, "moe_layers", v, layers)?;
            if layers > 128 {
                return Err(f.bad(
                    "num_hidden_layers",
                    &Value::from(layers),
                    "moe_layers in more than 128 layers is not modelled",
                    "at most 128 layers with moe_layers, or interleave_moe_layer_step",
                ));
            }
            let all = (0..layers).fold(0u128, |m, i| m | 1u128 << i);
            m.dense_layers = all & !sparse;
        }
        None => m.sparse_step = f.size("interleave_moe_layer_step", MAX_LAYERS)?,
    }
    if (0..layers).all(|i| m.sparse(i)) {
        // Every layer sparse: transformers builds no dense MLP.
        f.ignored(&["intermediate_size_mlp"]);
    } else {
        m.dense_width = f.size("intermediate_size_mlp", MAX_HIDDEN)?;
    }
    Ok(m)
}

/// `attn_temperature_tuning` (a boolean; transformers tests its truth, so a number is read as
/// non-zero) with `floor_scale` and `attn_scale`.
fn temperature(f: &Fields) -> Result<Option<(Factor, Factor)>, UserError> {
    let on = match f.get("attn_temperature_tuning") {
        None => false,
        Some(v) => match (v.as_bool(), v.as_f64()) {
            (Some(b), _) => b,
            (None, Some(x)) => x != 0.0,
            _ => {
                return Err(f.bad("attn_temperature_tuning", v, "not a boolean", "true, false"));
            }
        },
    };
    if !on {
        f.ignored(&["floor_scale", "attn_scale"]);
        return Ok(None);
    }
    Ok(Some((
        Factor(f.float_or("floor_scale", 8192.0)?),
        Factor(f.float_or("attn_scale", 0.1)?),
    )))
}

impl Family for Llama4 {
    fn model_type(&self) -> &'static str {
        "llama4_text"
    }

    fn presets(&self) -> &'static [(&'static str, &'static str)] {
        &[(
            "llama-4-scout-17b-16e",
            include_str!("../../../workloads/configs/llama-4-scout-17b-16e.json"),
        )]
    }

    /// transformers' `Llama4TextConfig` defaults (4.57.1: Llama-4-Scout-17B-16E's shape;
    /// `moe_layers` absent: every `interleave_moe_layer_step`-th layer, `no_rope_layers`
    /// absent: every `no_rope_layer_interval`-th layer NoPE).
    fn defaults(&self) -> &'static [(&'static str, &'static str)] {
        &[
            ("vocab_size", "202048"),
            ("hidden_size", "5120"),
            ("intermediate_size", "8192"),
            ("intermediate_size_mlp", "16384"),
            ("num_hidden_layers", "48"),
            ("num_attention_heads", "40"),
            ("num_key_value_heads", "8"),
            ("head_dim", "128"),
            ("hidden_act", "\"silu\""),
            ("max_position_embeddings", "131072"),
            ("rms_norm_eps", "1e-5"),
            ("tie_word_embeddings", "false"),
            ("rope_theta", "500000"),
            ("num_experts_per_tok", "1"),
            ("num_local_experts", "16"),
            ("interleave_moe_layer_step", "1"),
            ("use_qk_norm", "true"),
            ("no_rope_layer_interval", "4"),
            ("attention_chunk_size", "8192"),
            ("attn_temperature_tuning", "true"),
            ("floor_scale", "8192"),
            ("attn_scale", "0.1"),
        ]
    }

    fn wrappers(&self) -> &'static [(&'static str, &'static str)] {
        &[(
            "llama4",
            "Llama 4 with its vision tower: memfit builds Llama 4's text model (llama4_text) but \
             not the vision tower and its projector (vision_config: 0.46 B parameters at \
             Llama4VisionConfig's defaults, 415,856,640 in the tower and 39,321,600 in the \
             projector, that serving loads too), so sizing the text model alone would \
             under-estimate; to size the text model alone, save the config's text_config as its \
             own config.json with \"model_type\": \"llama4_text\"",
        )]
    }

    /// `hidden_act` (SiLU), `use_qk_norm`, the NoPE layers, the temperature, the mixture of
    /// experts ([`moe`]); no biases (transformers sets `attention_bias` false whatever the file
    /// says); `rope_scaling`, when given, llama3's (transformers' Llama 4 uses no other).
    fn read(&self, f: &Fields, llama: &mut Llama) -> Result<(), UserError> {
        f.require("hidden_act", &["silu"])?;
        // Read by transformers into attributes its Llama 4 never uses: the router has no
        // jitter, the auxiliary loss needs `output_router_logits` (refused by the shared
        // reader), llm-compressor's flag is metadata.
        f.ignored(&[
            "router_aux_loss_coef",
            "router_jitter_noise",
            "for_llm_compressor",
        ]);
        if let Some(v) = f.get("rope_scaling")
            && let Some(t) = v
                .get("rope_type")
                .or_else(|| v.get("type"))
                .and_then(Value::as_str)
            && t != "llama3"
        {
            return Err(f.bad(
                "rope_scaling",
                v,
                "transformers' Llama 4 scales its rotary as llama3 whatever the type says",
                "null, or rope_type llama3",
            ));
        }
        let layers = f.size("num_hidden_layers", MAX_LAYERS)?;
        llama.qkv_bias = false;
        llama.o_bias = false;
        llama.mlp_bias = false;
        llama.qk_norm = false;
        llama.moe = Some(moe(f, layers)?);
        let nope = super::smollm3::nope_layers(f, layers, true)?;
        let temperature = temperature(f)?;
        // The tempered NoPE layers attend to everything (their queries' positions are their
        // cache's length).
        if temperature.is_some()
            && let Some(i) = (0..layers.min(128))
                .find(|&i| nope & (1u128 << i) != 0 && llama.window_at(i).is_some())
        {
            return Err(f.bad(
                "layer_types",
                f.get("layer_types").unwrap_or(&Value::Null),
                &format!("NoPE layer {i} is chunked: the temperature is modelled on full layers"),
                "full_attention on the NoPE layers (transformers' default)",
            ));
        }
        llama.variant = Variant {
            nope_layers: nope,
            qk_l2_norm: f.bool_or("use_qk_norm", true)?,
            attn_temperature: temperature,
            chunked_attention: llama.sliding_window.is_some(),
            ..llama.variant
        };
        Ok(())
    }

    /// The rotary layers chunked (`attention_chunk_size`; null: none), the NoPE layers full, as
    /// `Llama4TextConfig` makes its `layer_types` (which still overrides it).
    fn layer_pattern(
        &self,
        f: &Fields,
        layers: usize,
    ) -> Option<Result<(Option<usize>, u128), UserError>> {
        let pattern = || {
            let Some(chunk) = f.size_opt("attention_chunk_size", MAX_SEQ)? else {
                return Ok((None, 0));
            };
            let nope = super::smollm3::nope_layers(f, layers, true)?;
            Ok((Some(chunk), nope))
        };
        Some(pattern())
    }
}
