//! GLM-4.5 (`glm4_moe`; transformers' `modeling_glm4_moe`, 4.57.1) over the shared layers: a
//! Llama attention (GQA, `head_dim`, `attention_bias` on q, k and v only, optional per-head
//! q/k RMSNorms `use_qk_norm`) whose rotary embedding covers only the first
//! `partial_rotary_factor · head_dim` of each head (the rest passes through), and DeepSeek-V3's
//! mixture of experts (read by the shared reader: sigmoid routing with the correction bias and
//! groups, a shared expert, `first_k_dense_replace` dense layers first). Its multi-token
//! prediction layer (`num_nextn_predict_layers`) is not built, as transformers does not build
//! it. Fields a config leaves out take `Glm4MoeConfig`'s defaults.

use super::Family;
use crate::error::UserError;
use crate::model::hf_fields::{Fields, partial_rotary};
use crate::model::shapes::{Llama, Variant};

pub struct Glm4Moe;

impl Family for Glm4Moe {
    fn model_type(&self) -> &'static str {
        "glm4_moe"
    }

    /// transformers' `Glm4MoeConfig` defaults (4.57.1; `head_dim` absent: hidden / heads).
    fn defaults(&self) -> &'static [(&'static str, &'static str)] {
        &[
            ("vocab_size", "151552"),
            ("hidden_size", "4096"),
            ("intermediate_size", "10944"),
            ("num_hidden_layers", "46"),
            ("num_attention_heads", "96"),
            ("partial_rotary_factor", "0.5"),
            ("num_key_value_heads", "8"),
            ("hidden_act", "\"silu\""),
            ("max_position_embeddings", "131072"),
            ("rms_norm_eps", "1e-5"),
            ("tie_word_embeddings", "false"),
            ("rope_theta", "10000.0"),
            ("attention_bias", "false"),
            ("moe_intermediate_size", "1408"),
            ("num_experts_per_tok", "8"),
            ("n_shared_experts", "1"),
            ("n_routed_experts", "128"),
            ("routed_scaling_factor", "1.0"),
            ("n_group", "1"),
            ("topk_group", "1"),
            ("first_k_dense_replace", "1"),
            ("norm_topk_prob", "true"),
            ("use_qk_norm", "false"),
        ]
    }

    /// `hidden_act` (SiLU), `use_qk_norm`, `partial_rotary_factor`
    /// ([`partial_rotary`]); no bias on o; the multi-token prediction layer ignored.
    fn read(&self, f: &Fields, llama: &mut Llama) -> Result<(), UserError> {
        f.require("hidden_act", &["silu"])?;
        f.ignored(&["num_nextn_predict_layers"]);
        llama.qk_norm = f.bool_or("use_qk_norm", false)?;
        llama.o_bias = false;
        llama.variant = Variant {
            partial_rotary: partial_rotary(f, llama.head_dim, 0.5)?,
            ..llama.variant
        };
        Ok(())
    }
}
