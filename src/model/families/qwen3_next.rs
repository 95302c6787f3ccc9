//! Qwen3-Next (`qwen3_next`; transformers' `modeling_qwen3_next`, 4.57.1,
//! `Qwen3NextForCausalLM`) over the shared layers: `layer_types` mixes `linear_attention` layers
//! (Gated DeltaNet, [`crate::model::gated_delta`]: `linear_num_key_heads` ×
//! `linear_key_head_dim` q/k heads, `linear_num_value_heads` × `linear_value_head_dim` value
//! heads, a causal convolution of `linear_conv_kernel_dim`) and `full_attention` layers (a
//! Qwen3 attention, per-head q/k RMSNorms, whose query projection carries an output gate per
//! head, [`Variant::attn_output_gate`], and whose rotary covers `partial_rotary_factor` of each
//! head); every RMSNorm but the linear layers' gated one zero-centred (`1 + w`,
//! [`Variant::unit_offset_norms`]); Qwen2-MoE's mixture of experts (read by the shared reader:
//! `num_experts`, `num_experts_per_tok`, `norm_topk_prob`, a shared expert of
//! `shared_expert_intermediate_size` with its sigmoid gate, `decoder_sparse_step`,
//! `mlp_only_layers`). Without `layer_types`, every `full_attention_interval`-th layer is full
//! (transformers' default 4). Fields a config leaves out take `Qwen3NextConfig`'s defaults
//! (Qwen3-Next-80B-A3B's shape).
//!
//! As memfit builds it: transformers without flash-linear-attention (its torch fallbacks: the
//! chunked delta rule in training and prefill, the recurrent step in decode); the convolution's
//! weight is kept `(K, C)` (transformers' `(C, 1, K)`), the same values.

use serde_json::Value;

use super::Family;
use crate::error::UserError;
use crate::model::hf_fields::{Fields, partial_rotary};
use crate::model::limits::{MAX_HEADS, MAX_HIDDEN as MAX_SIZE, MAX_LAYERS};
use crate::model::shapes::{GatedDelta, Llama, Variant};

pub struct Qwen3Next;

/// The linear layers (a bit each): `layer_types`' `linear_attention` entries (the shared reader
/// checks the list), else every layer but each `full_attention_interval`-th.
fn linear_layers(f: &Fields, layers: usize) -> Result<u128, UserError> {
    if let Some(v) = f.get("layer_types") {
        // transformers reads the interval only to make a missing list.
        f.ignored(&["full_attention_interval"]);
        let types = v.as_array().map(|a| a.iter().filter_map(Value::as_str));
        let Some(types) = types else {
            return Err(f.bad("layer_types", v, "not a list", "a list of attention types"));
        };
        let mask = types
            .enumerate()
            .filter(|(_, t)| *t == "linear_attention")
            .fold(0u128, |m, (i, _)| m | 1u128 << i.min(127));
        if layers > 128 && mask != 0 {
            return Err(f.bad(
                "num_hidden_layers",
                &Value::from(layers),
                "linear and full layers mixed in more than 128 layers are not modelled",
                "at most 128 layers",
            ));
        }
        return Ok(mask);
    }
    let every = f
        .size_opt("full_attention_interval", MAX_LAYERS)?
        .unwrap_or(4);
    if layers > 128 && every > 1 {
        return Err(f.bad(
            "num_hidden_layers",
            &Value::from(layers),
            "linear and full layers mixed in more than 128 layers are not modelled",
            "at most 128 layers",
        ));
    }
    Ok((0..layers.min(128))
        .filter(|i| (i + 1) % every != 0)
        .fold(0u128, |m, i| m | 1u128 << i))
}

impl Family for Qwen3Next {
    fn model_type(&self) -> &'static str {
        "qwen3_next"
    }

    fn presets(&self) -> &'static [(&'static str, &'static str)] {
        &[(
            "qwen3-next-80b-a3b",
            include_str!("../../../workloads/configs/qwen3-next-80b-a3b.json"),
        )]
    }

    /// transformers' `Qwen3NextConfig` defaults (4.57.1: Qwen3-Next-80B-A3B's shape).
    fn defaults(&self) -> &'static [(&'static str, &'static str)] {
        &[
            ("vocab_size", "151936"),
            ("hidden_size", "2048"),
            ("intermediate_size", "5632"),
            ("num_hidden_layers", "48"),
            ("num_attention_heads", "16"),
            ("num_key_value_heads", "2"),
            ("hidden_act", "\"silu\""),
            ("max_position_embeddings", "32768"),
            ("rms_norm_eps", "1e-6"),
            ("tie_word_embeddings", "false"),
            ("rope_theta", "10000.0"),
            ("partial_rotary_factor", "0.25"),
            ("attention_bias", "false"),
            ("head_dim", "256"),
            ("linear_conv_kernel_dim", "4"),
            ("linear_key_head_dim", "128"),
            ("linear_value_head_dim", "128"),
            ("linear_num_key_heads", "16"),
            ("linear_num_value_heads", "32"),
            ("decoder_sparse_step", "1"),
            ("moe_intermediate_size", "512"),
            ("shared_expert_intermediate_size", "512"),
            ("num_experts_per_tok", "10"),
            ("num_experts", "512"),
            ("norm_topk_prob", "true"),
        ]
    }

    /// `hidden_act` (SiLU), the linear layers ([`linear_layers`]) and their widths, the full
    /// layers' gate, q/k norms and partial rotary; the zero-centred norms.
    fn read(&self, f: &Fields, llama: &mut Llama) -> Result<(), UserError> {
        f.require("hidden_act", &["silu"])?;
        // The auxiliary loss needs `output_router_logits` (refused by the shared reader);
        // `Qwen3NextConfig` has no window (the published config's `use_sliding_window: false`
        // is a stray attribute that transformers' Qwen3-Next never reads, whatever its value).
        f.ignored(&["router_aux_loss_coef", "use_sliding_window"]);
        let layers = f.size("num_hidden_layers", MAX_LAYERS)?;
        let key_heads = f.size("linear_num_key_heads", MAX_HEADS)?;
        let value_heads = f.size("linear_num_value_heads", MAX_HEADS)?;
        if !value_heads.is_multiple_of(key_heads) {
            return Err(f.bad(
                "linear_num_value_heads",
                &Value::from(value_heads),
                &format!("not a multiple of linear_num_key_heads = {key_heads}"),
                "a multiple of linear_num_key_heads",
            ));
        }
        let gated = GatedDelta {
            key_heads,
            value_heads,
            key_dim: f.size("linear_key_head_dim", MAX_SIZE)?,
            value_dim: f.size("linear_value_head_dim", MAX_SIZE)?,
            conv_kernel: f.size("linear_conv_kernel_dim", MAX_SIZE)?,
            layers: linear_layers(f, layers)?,
        };
        llama.qk_norm = true;
        llama.variant = Variant {
            unit_offset_norms: true,
            partial_rotary: partial_rotary(f, llama.head_dim, 0.25)?,
            attn_output_gate: true,
            gated_delta: (gated.layers != 0).then_some(gated),
            ..llama.variant
        };
        Ok(())
    }
}
