//! Gemma 2 (`gemma2`; transformers' `modeling_gemma2`, 4.57.1) over the shared layers: Gemma
//! 3's block without its q/k norms and local rotary base — every RMSNorm scales by `1 + w`,
//! four norms a block, the tanh GELU in a GeGLU, the embedding times `√H`, queries scaled by
//! `query_pre_attn_scalar^-½`, even layers sliding and odd ones full (`layer_types` overrides
//! it), the head tied by default — with soft-capping: the attention scores
//! (`attn_logit_softcapping`) and the final logits (`final_logit_softcapping`) each become
//! `c·tanh(x/c)`. The capped attention is built into the standard attention (composed, as
//! transformers' eager attention, which Gemma 2 trains with), its default; the efficient and
//! tiled attentions are refused by name. Fields a config leaves out take `Gemma2Config`'s
//! defaults.

use serde_json::Value;

use super::Family;
use crate::error::UserError;
use crate::model::hf_fields::{Fields, periodic};
use crate::model::shapes::{Factor, Llama, Variant};

pub struct Gemma2;

/// A soft-capping value: absent or null for none, else a positive number.
fn cap(f: &Fields, key: &str) -> Result<Option<Factor>, UserError> {
    match f.get(key) {
        None => Ok(None),
        Some(v) if v.is_null() => Ok(None),
        Some(v) => match v.as_f64() {
            Some(c) if c > 0.0 && c.is_finite() => Ok(Some(Factor(c))),
            _ => Err(f.bad(key, v, "not a positive number", "null or a positive number")),
        },
    }
}

impl Family for Gemma2 {
    fn model_type(&self) -> &'static str {
        "gemma2"
    }

    fn presets(&self) -> &'static [(&'static str, &'static str)] {
        &[(
            "gemma-2-2b",
            include_str!("../../../workloads/configs/gemma-2-2b.json"),
        )]
    }

    /// transformers' `Gemma2Config` defaults (4.57.1).
    fn defaults(&self) -> &'static [(&'static str, &'static str)] {
        &[
            ("vocab_size", "256000"),
            ("hidden_size", "2304"),
            ("intermediate_size", "9216"),
            ("num_hidden_layers", "26"),
            ("num_attention_heads", "8"),
            ("num_key_value_heads", "4"),
            ("head_dim", "256"),
            ("hidden_activation", "\"gelu_pytorch_tanh\""),
            ("max_position_embeddings", "8192"),
            ("rms_norm_eps", "1e-6"),
            ("tie_word_embeddings", "true"),
            ("rope_theta", "10000.0"),
            ("attention_bias", "false"),
            ("query_pre_attn_scalar", "256"),
            ("sliding_window", "4096"),
            ("final_logit_softcapping", "30.0"),
            ("attn_logit_softcapping", "50.0"),
        ]
    }

    /// `hidden_activation` (the tanh GELU), `query_pre_attn_scalar`, the two soft-caps.
    fn read(&self, f: &Fields, llama: &mut Llama) -> Result<(), UserError> {
        f.require("hidden_activation", &["gelu_pytorch_tanh"])?;
        // Gemma 2's published configs carry these too; transformers' Gemma 2 reads neither (its
        // activation is `hidden_activation`, its window `sliding_window`).
        f.ignored(&["hidden_act", "sliding_window_size"]);
        if let Some(v) = f
            .get("attention_bias")
            .filter(|v| v.as_bool() == Some(true))
        {
            return Err(f.bad(
                "attention_bias",
                v,
                "Gemma 2's projections have no biases in memfit yet",
                &Value::from(false).to_string(),
            ));
        }
        llama.variant = Variant {
            attn_softcap: cap(f, "attn_logit_softcapping")?,
            final_softcap: cap(f, "final_logit_softcapping")?,
            ..super::gemma3::gemma_block(f, llama.variant)?
        };
        Ok(())
    }

    fn tied_by_default(&self) -> bool {
        true
    }

    /// Even layers sliding, odd ones full (`Gemma2Config`'s `layer_types`).
    fn layer_pattern(
        &self,
        f: &Fields,
        layers: usize,
    ) -> Option<Result<(Option<usize>, u128), UserError>> {
        Some(periodic(f, layers, 2))
    }
}
