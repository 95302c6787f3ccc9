//! The named models: GPT's and ViT's sizes, and the LLaMA family's shipped configs read by
//! `hf_config` (`Config::preset`). Above the families and the config reader, so that neither
//! the layout (`config`) nor a family needs the other to name a model.

use super::config::Config;
use super::{llama, vit};

impl Config {
    pub fn preset(name: &str) -> Option<Self> {
        match name {
            "tiny" => Some(Self::tiny()),
            "small" => Some(Self::small()),
            "gpt2-small" => Some(Self::gpt2_small()),
            "gpt2-medium" => Some(Self::gpt2_medium()),
            "llama-7b-shape" => Some(Self::llama_7b_shape()),
            _ => vit::preset(name)
                .map(Self::vit)
                .or_else(|| llama::preset(name)),
        }
    }
}
