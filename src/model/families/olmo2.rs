//! OLMo 2 (`olmo2`; transformers' `modeling_olmo2`, 4.57.1) over the shared layers: a Llama
//! whose block normalises each half's output instead of its input (`x + norm(attn(x))`, then
//! `x + norm(mlp(x))`: `post_attention_layernorm`, `post_feedforward_layernorm`, no norm
//! before), with RMSNorms of the whole query and key projections (`A·D` and `G·D` wide)
//! before the heads are split; `attention_bias` biases q, k, v and o; the MLP has no biases.
//! Fields a config leaves out take `Olmo2Config`'s defaults.

use serde_json::Value;

use super::Family;
use crate::error::UserError;
use crate::model::hf_fields::Fields;
use crate::model::shapes::{Llama, Variant};

pub struct Olmo2;

impl Family for Olmo2 {
    fn model_type(&self) -> &'static str {
        "olmo2"
    }

    /// transformers' `Olmo2Config` defaults (4.57.1; `num_key_value_heads` absent: the heads).
    fn defaults(&self) -> &'static [(&'static str, &'static str)] {
        &[
            ("vocab_size", "50304"),
            ("hidden_size", "4096"),
            ("intermediate_size", "11008"),
            ("num_hidden_layers", "32"),
            ("num_attention_heads", "32"),
            ("hidden_act", "\"silu\""),
            ("max_position_embeddings", "2048"),
            ("rms_norm_eps", "1e-5"),
            ("rope_theta", "10000.0"),
            ("attention_bias", "false"),
            ("tie_word_embeddings", "false"),
        ]
    }

    /// `hidden_act` (SiLU); the post-norms and whole-projection q/k norms always; its MLP has
    /// no bias whatever `mlp_bias` says.
    fn read(&self, f: &Fields, llama: &mut Llama) -> Result<(), UserError> {
        f.require("hidden_act", &["silu"])?;
        if let Some(v) = f.get("mlp_bias").filter(|v| v.as_bool() == Some(true)) {
            return Err(f.bad(
                "mlp_bias",
                v,
                "transformers' OLMo 2 MLP has no biases",
                &Value::from(false).to_string(),
            ));
        }
        llama.mlp_bias = false;
        llama.qk_norm = true;
        llama.variant = Variant {
            post_norms_only: true,
            qk_norm_whole: true,
            ..llama.variant
        };
        Ok(())
    }
}
