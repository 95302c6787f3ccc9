//! Gemma 3's language model (`gemma3_text`; transformers' `modeling_gemma3`, 4.57.1) over the
//! shared layers: every RMSNorm scales by `1 + w`, four norms a block (the sandwich), q/k
//! norms, the tanh GELU in a GeGLU, the embedding times `√H`, queries scaled by
//! `query_pre_attn_scalar^-½`, every `sliding_window_pattern`-th layer full and the others
//! sliding with their own rotary base (`rope_local_base_freq`), the head tied by default.
//! Fields a config leaves out take `Gemma3TextConfig`'s defaults. Soft-capping (Gemma 2's)
//! and bidirectional attention (EmbeddingGemma) are not built and are refused when set; the
//! multimodal `gemma3` (its SigLIP tower) is refused by name.

use serde_json::Value;

use super::Family;
use crate::error::UserError;
use crate::model::hf_fields::{Fields, periodic};
use crate::model::shapes::{Factor, Llama, Variant};

pub struct Gemma3;

/// The block Gemma 2 and 3 share, on `v`: `1 + w` norms, four a block, GeGLU with the tanh
/// GELU, the embedding times `√H`, queries scaled by `query_pre_attn_scalar^-½`.
pub(super) fn gemma_block(f: &Fields, v: Variant) -> Result<Variant, UserError> {
    Ok(Variant {
        unit_offset_norms: true,
        sandwich_norms: true,
        gelu_glu: true,
        embed_scaled: true,
        attention_scale: Some(Factor(
            f.float_or("query_pre_attn_scalar", 256.0)?.powf(-0.5),
        )),
        ..v
    })
}

impl Family for Gemma3 {
    fn model_type(&self) -> &'static str {
        "gemma3_text"
    }

    /// transformers' `Gemma3TextConfig` defaults (4.57.1).
    fn defaults(&self) -> &'static [(&'static str, &'static str)] {
        &[
            ("vocab_size", "262208"),
            ("hidden_size", "2304"),
            ("intermediate_size", "9216"),
            ("num_hidden_layers", "26"),
            ("num_attention_heads", "8"),
            ("num_key_value_heads", "4"),
            ("head_dim", "256"),
            ("hidden_activation", "\"gelu_pytorch_tanh\""),
            ("max_position_embeddings", "131072"),
            ("rms_norm_eps", "1e-6"),
            ("tie_word_embeddings", "true"),
            ("rope_theta", "1000000.0"),
            ("query_pre_attn_scalar", "256"),
            ("sliding_window", "4096"),
            ("rope_local_base_freq", "10000.0"),
            ("sliding_window_pattern", "6"),
        ]
    }

    fn wrappers(&self) -> &'static [(&'static str, &'static str)] {
        &[(
            "gemma3",
            "Gemma 3 with its SigLIP vision tower: memfit builds Gemma 3's language model \
             (gemma3_text) but not the vision tower and projector (about 0.42 B parameters that \
             serving loads too), so sizing the language model alone would under-estimate; to \
             size the language model alone, save the config's text_config as its own \
             config.json with \"model_type\": \"gemma3_text\" (as --preset gemma-3-27b is)",
        )]
    }

    /// `hidden_activation` (the tanh GELU), `query_pre_attn_scalar`, `rope_local_base_freq`;
    /// q/k norms always.
    fn read(&self, f: &Fields, llama: &mut Llama) -> Result<(), UserError> {
        f.require("hidden_activation", &["gelu_pytorch_tanh"])?;
        for key in ["final_logit_softcapping", "attn_logit_softcapping"] {
            if let Some(v) = f.get(key) {
                return Err(f.bad(
                    key,
                    v,
                    "soft-capping (tanh of the scaled logits) is not built",
                    "null (Gemma 3's configs)",
                ));
            }
        }
        if f.bool_or("use_bidirectional_attention", false)? {
            return Err(f.bad(
                "use_bidirectional_attention",
                &Value::from(true),
                "a bidirectional Gemma (EmbeddingGemma) is not built",
                "false",
            ));
        }
        llama.variant = Variant {
            local_rope_theta: Some(Factor(f.float_or("rope_local_base_freq", 10_000.0)?)),
            ..gemma_block(f, llama.variant)?
        };
        llama.qk_norm = true;
        Ok(())
    }

    fn tied_by_default(&self) -> bool {
        true
    }

    /// Every `sliding_window_pattern`-th layer full (5 local : 1 global).
    fn layer_pattern(
        &self,
        f: &Fields,
        layers: usize,
    ) -> Option<Result<(Option<usize>, u128), UserError>> {
        let pattern = f.size("sliding_window_pattern", crate::model::limits::MAX_LAYERS);
        Some(pattern.and_then(|p| periodic(f, layers, p)))
    }

    fn presets(&self) -> &'static [(&'static str, &'static str)] {
        &[
            (
                "gemma-3-1b",
                include_str!("../../../workloads/configs/gemma-3-1b.json"),
            ),
            (
                "gemma-3-27b",
                include_str!("../../../workloads/configs/gemma-3-27b.json"),
            ),
        ]
    }
}
