//! SmolLM3 (`smollm3`; transformers' `modeling_smollm3`, 4.57.1) over the shared layers: a
//! Llama whose NoPE layers do not rotate their queries and keys (`no_rope_layers`, a 1 per
//! layer that rotates and a 0 per layer that does not; absent: every
//! `no_rope_layer_interval`-th layer is NoPE), the head tied by default. With
//! `use_sliding_window` and a `sliding_window`, the NoPE layers slide and the others attend to
//! everything (`layer_types` still overrides it), as `SmolLM3Config` makes its layer types.
//! Fields a config leaves out take `SmolLM3Config`'s defaults.

use serde_json::Value;

use super::Family;
use crate::error::UserError;
use crate::model::hf_fields::Fields;
use crate::model::shapes::{Llama, Variant};

pub struct SmolLm3;

/// The NoPE layers of a model of `layers` layers (bit `i` for layer `i`); `empty_absent`: an
/// empty list is read as absent (Llama 4's configs: transformers' backward compatibility).
pub(super) fn nope_layers(
    f: &Fields,
    layers: usize,
    empty_absent: bool,
) -> Result<u128, UserError> {
    let list = f
        .get("no_rope_layers")
        .filter(|v| !(empty_absent && v.as_array().is_some_and(|a| a.is_empty())));
    let rotates: Vec<bool> = match list {
        Some(v) => {
            // transformers reads the interval only to make a missing list.
            f.ignored(&["no_rope_layer_interval"]);
            let allowed = format!("a list of at least {layers} entries, each 1 (RoPE) or 0 (NoPE)");
            let list = v
                .as_array()
                .filter(|a| a.len() >= layers)
                .ok_or_else(|| f.bad("no_rope_layers", v, "not a list of the layers", &allowed))?;
            list.iter()
                .take(layers)
                .map(|x| match x.as_u64() {
                    Some(1) => Ok(true),
                    Some(0) => Ok(false),
                    _ => Err(f.bad("no_rope_layers", v, "an entry is not 0 or 1", &allowed)),
                })
                .collect::<Result<_, _>>()?
        }
        None => {
            let every = f.size("no_rope_layer_interval", crate::model::limits::MAX_LAYERS)?;
            (0..layers).map(|i| (i + 1) % every != 0).collect()
        }
    };
    if rotates.iter().skip(128).any(|r| !r) {
        return Err(f.bad(
            "num_hidden_layers",
            &Value::from(layers),
            "NoPE layers beyond the 128th are not modelled",
            "NoPE layers among the first 128",
        ));
    }
    Ok(rotates
        .iter()
        .take(128)
        .enumerate()
        .filter(|(_, r)| !**r)
        .fold(0u128, |m, (i, _)| m | 1u128 << i))
}

impl Family for SmolLm3 {
    fn model_type(&self) -> &'static str {
        "smollm3"
    }

    fn presets(&self) -> &'static [(&'static str, &'static str)] {
        &[(
            "smollm3-3b",
            include_str!("../../../workloads/configs/smollm3-3b.json"),
        )]
    }

    /// transformers' `SmolLM3Config` defaults (4.57.1).
    fn defaults(&self) -> &'static [(&'static str, &'static str)] {
        &[
            ("vocab_size", "128256"),
            ("hidden_size", "2048"),
            ("intermediate_size", "11008"),
            ("num_hidden_layers", "36"),
            ("num_attention_heads", "16"),
            ("num_key_value_heads", "4"),
            ("hidden_act", "\"silu\""),
            ("max_position_embeddings", "32768"),
            ("rms_norm_eps", "1e-6"),
            ("rope_theta", "2000000.0"),
            ("use_sliding_window", "false"),
            ("no_rope_layer_interval", "4"),
            ("attention_bias", "false"),
            ("mlp_bias", "false"),
            ("tie_word_embeddings", "true"),
        ]
    }

    /// `hidden_act` (SiLU), the NoPE layers; `max_window_layers`, which some of its configs
    /// carry, is not read by transformers' SmolLM3.
    fn read(&self, f: &Fields, llama: &mut Llama) -> Result<(), UserError> {
        f.require("hidden_act", &["silu"])?;
        f.ignored(&["max_window_layers"]);
        let layers = f.size("num_hidden_layers", crate::model::limits::MAX_LAYERS)?;
        llama.variant = Variant {
            nope_layers: nope_layers(f, layers, false)?,
            ..llama.variant
        };
        Ok(())
    }

    fn tied_by_default(&self) -> bool {
        true
    }

    /// With `use_sliding_window` and a window: the NoPE layers slide, the others are full.
    fn layer_pattern(
        &self,
        f: &Fields,
        layers: usize,
    ) -> Option<Result<(Option<usize>, u128), UserError>> {
        let pattern = || {
            let window = f.size_opt("sliding_window", crate::model::limits::MAX_SEQ)?;
            if !f.bool_or("use_sliding_window", false)? || window.is_none() {
                return Ok((None, 0));
            }
            if layers > 128 {
                return Err(f.bad(
                    "num_hidden_layers",
                    &Value::from(layers),
                    "full and sliding layers mixed in more than 128 layers are not modelled",
                    "at most 128 layers when they mix",
                ));
            }
            let nope = nope_layers(f, layers, false)?;
            let all = (0..layers.min(128)).fold(0u128, |m, i| m | 1u128 << i);
            Ok((window, all & !nope))
        };
        Some(pattern())
    }
}
