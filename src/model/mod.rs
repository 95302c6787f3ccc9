//! Synthetic models written the candle way: a `Config` with named presets and layers built by
//! `new(cfg, w)` with sub-layers named through `w.pp`, over a source of weights
//! ([`weights::Weights`]: candle-nn's `VarBuilder`, or the replay's symbolic parameters).

pub mod attention;
pub mod config;
pub mod efficient_attention;
pub mod families;
pub mod frozen;
pub mod gated_delta;
pub mod hf_config;
pub mod hf_fields;
pub mod hf_keys;
pub mod kernels;
pub mod limits;
pub mod llama;
pub mod mask;
pub mod mla;
pub mod mlp;
pub mod moe;
pub mod norm;
pub mod presets;
pub mod proj;
pub mod rotary;
pub mod shapes;
pub mod tensor_ops;
pub mod tensor_parallel;
pub mod tiled_attention;
pub mod transformer;
pub mod vit;
pub mod weights;

/// Model families memfit can build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    Gpt,
    Vit,
    /// The LLaMA-family decoder ([`llama`]).
    Llama,
}

impl ModelKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelKind::Gpt => "gpt",
            ModelKind::Vit => "vit",
            ModelKind::Llama => "llama",
        }
    }
}
