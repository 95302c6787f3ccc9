//! The decoder families a `config.json` names, a file each over the shared layers: what a
//! family's config says that the shared reader ([`super::hf_config`]) does not (its own keys,
//! transformers' defaults for absent ones, its pattern of full and sliding layers, the
//! multimodal types that wrap it) and its shipped presets. The model itself is the shared
//! layers' ([`super::transformer`]), parameterised by the shape the family fills in
//! ([`super::shapes::Llama`]). [`FAMILIES`] is the registry.
//!
//! Adding a family that reuses existing layers: its file here, a line in [`FAMILIES`], its
//! fixture and its tests. The families of the LLaMA line read before this registry existed
//! (`llama`, `mistral`, `phi3`, the Qwen, Mixtral, DeepSeek and gpt-oss types) are still read
//! by the shared reader's branches; Gemma 3 is the first written here, SmolLM3 the first new
//! family (its NoPE layers one switch of the shared block, `Variant::nope_layers`), OLMo 2 the
//! second (two switches: `post_norms_only`, `qk_norm_whole`), GLM-4.5 the third (one switch,
//! `partial_rotary`, and DeepSeek-V3's router under its own type), Gemma 2 the fourth (two:
//! `attn_softcap`, `final_softcap`), Llama 4's text model the fifth (three: `chunked_attention`,
//! `qk_l2_norm`, `attn_temperature`, SmolLM3's `nope_layers`, and the experts' input-side weight,
//! `MoeShape::input_scaled`), Qwen3-Next the sixth (a layer kind of its own, Gated DeltaNet's
//! linear attention, `Variant::gated_delta`, and the full layers' `attn_output_gate`).

use super::hf_fields::Fields;
use super::shapes::Llama;
use crate::error::UserError;

mod gemma2;
mod gemma3;
mod glm4_moe;
mod llama4;
mod olmo2;
mod qwen3_next;
mod smollm3;

/// What a LLaMA-style family adds to the shared reader.
pub(crate) trait Family: Sync {
    /// `model_type` as transformers writes it.
    fn model_type(&self) -> &'static str;
    /// transformers' config-class defaults (its version's) for the fields memfit reads, where
    /// a config leaves them out.
    fn defaults(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }
    /// Types that wrap this one (a multimodal model) and are refused, with why.
    fn wrappers(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }
    /// Reads the family's own keys into the shape the shared reader filled in (its activation
    /// included: the shared reader requires `hidden_act` silu of the families without a file).
    fn read(&self, f: &Fields, llama: &mut Llama) -> Result<(), UserError>;
    /// The head is tied when `tie_word_embeddings` is absent.
    fn tied_by_default(&self) -> bool {
        false
    }
    /// The window and the full layers (a bit each) of a model of `layers` layers, when the
    /// family has a pattern of its own (`layer_types` still overrides it).
    fn layer_pattern(
        &self,
        _f: &Fields,
        _layers: usize,
    ) -> Option<Result<(Option<usize>, u128), UserError>> {
        None
    }
    /// Shipped presets: name and the `config.json` as published.
    fn presets(&self) -> &'static [(&'static str, &'static str)] {
        &[]
    }
}

/// The registry: every family with a file of its own.
pub(crate) const FAMILIES: &[&dyn Family] = &[
    &gemma2::Gemma2,
    &gemma3::Gemma3,
    &smollm3::SmolLm3,
    &olmo2::Olmo2,
    &glm4_moe::Glm4Moe,
    &llama4::Llama4,
    &qwen3_next::Qwen3Next,
];

/// The family of `model_type`, when it has a file.
pub(crate) fn find(model_type: &str) -> Option<&'static dyn Family> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.model_type() == model_type)
}

/// The refused type `model_type` wraps a family's: why.
pub(crate) fn wrapper(model_type: &str) -> Option<&'static str> {
    FAMILIES
        .iter()
        .flat_map(|f| f.wrappers())
        .find(|(t, _)| *t == model_type)
        .map(|(_, why)| *why)
}

/// The families' shipped presets.
pub(crate) fn presets() -> impl Iterator<Item = (&'static str, &'static str)> {
    FAMILIES.iter().flat_map(|f| f.presets().iter().copied())
}
