//! A `config.json`'s fields as the readers take them (the shared reader, [`super::hf_config`],
//! and the families' files, [`super::families`]): each read typed and range-checked, every key
//! asked for remembered so that the keys nobody read are refused, and errors naming the file,
//! the key and what is allowed.

use std::cell::RefCell;
use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::error::UserError;

/// The fields of one config file, with the keys read so far.
pub(crate) struct Fields<'a> {
    pub(crate) map: &'a Map<String, Value>,
    pub(crate) origin: &'a str,
    /// Every key a reader asked for (present or not): what the config's keys are checked
    /// against once the family is read (`hf_config::accounted`).
    pub(crate) read: &'a RefCell<BTreeSet<String>>,
}

impl Fields<'_> {
    pub(crate) fn bad(&self, field: &str, value: &Value, reason: &str, allowed: &str) -> UserError {
        UserError::OutOfRange {
            origin: self.origin.into(),
            key: field.into(),
            value: value.to_string(),
            reason: reason.into(),
            allowed: allowed.into(),
        }
    }

    pub(crate) fn missing(&self, field: &str, allowed: &str) -> UserError {
        UserError::Missing {
            origin: self.origin.into(),
            key: field.into(),
            allowed: allowed.into(),
        }
    }

    /// The field, `None` when absent or null.
    pub(crate) fn get(&self, field: &str) -> Option<&Value> {
        self.read.borrow_mut().insert(field.to_string());
        self.map.get(field).filter(|v| !v.is_null())
    }

    /// Whether the field is present (even null).
    pub(crate) fn has(&self, field: &str) -> bool {
        self.read.borrow_mut().insert(field.to_string());
        self.map.contains_key(field)
    }

    /// Marks `fields` as read where transformers reads and then ignores them in this
    /// configuration (each call site says why): they change nothing here.
    pub(crate) fn ignored(&self, fields: &[&str]) {
        let mut read = self.read.borrow_mut();
        read.extend(fields.iter().map(|f| f.to_string()));
    }

    /// A positive integer ≤ `max`.
    pub(crate) fn size_opt(&self, field: &str, max: i64) -> Result<Option<usize>, UserError> {
        let Some(v) = self.get(field) else {
            return Ok(None);
        };
        match v.as_i64() {
            Some(n) if n >= 1 && n <= max => Ok(Some(n as usize)),
            Some(_) => Err(self.bad(field, v, "out of range", &format!("1..={max}"))),
            None => Err(self.bad(field, v, "not an integer", &format!("an integer 1..={max}"))),
        }
    }

    pub(crate) fn size(&self, field: &str, max: i64) -> Result<usize, UserError> {
        self.size_opt(field, max)?
            .ok_or_else(|| self.missing(field, &format!("an integer 1..={max}")))
    }

    pub(crate) fn bool_or(&self, field: &str, default: bool) -> Result<bool, UserError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => v
                .as_bool()
                .ok_or_else(|| self.bad(field, v, "not a boolean", "true, false")),
        }
    }

    pub(crate) fn float_or(&self, field: &str, default: f64) -> Result<f64, UserError> {
        match self.get(field) {
            None => Ok(default),
            Some(v) => match v.as_f64() {
                Some(x) if x > 0.0 && x.is_finite() => Ok(x),
                _ => Err(self.bad(field, v, "not a positive number", "a number > 0")),
            },
        }
    }

    pub(crate) fn str_opt(&self, field: &str) -> Result<Option<&str>, UserError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.bad(field, v, "not a string", "a string")),
        }
    }

    /// `field` must be `want` when present.
    pub(crate) fn require(&self, field: &str, want: &[&str]) -> Result<(), UserError> {
        if let Some(s) = self.str_opt(field)?
            && !want.contains(&s)
        {
            return Err(self.bad(
                field,
                &Value::from(s),
                "memfit's model computes another function (its memory differs)",
                &want.join(", "),
            ));
        }
        Ok(())
    }
}

/// The rotated width of a head of `head_dim` under `partial_rotary_factor` (`default` when
/// absent), as transformers sizes its tables: `int(head_dim · factor)`; `None` for the whole
/// head. A factor outside (0, 1], or one whose width is odd (the rotation turns pairs), is
/// refused.
pub(crate) fn partial_rotary(
    f: &Fields,
    head_dim: usize,
    default: f64,
) -> Result<Option<usize>, UserError> {
    let factor = f.float_or("partial_rotary_factor", default)?;
    let width = (head_dim as f64 * factor) as usize;
    if !(factor > 0.0 && factor <= 1.0) || width == 0 || !width.is_multiple_of(2) {
        return Err(f.bad(
            "partial_rotary_factor",
            &Value::from(factor),
            &format!("rotates {width} of each head's {head_dim} dimensions, not an even number"),
            &format!("a factor in (0, 1] whose int(head_dim = {head_dim} × factor) is even"),
        ));
    }
    Ok((width < head_dim).then_some(width))
}

/// `num_experts_per_tok` = `top_k` refused above the `experts` there are.
pub(crate) fn check_top_k(f: &Fields, top_k: usize, experts: usize) -> Result<(), UserError> {
    if top_k > experts {
        return Err(f.bad(
            "num_experts_per_tok",
            &Value::from(top_k),
            &format!("more than the {experts} experts"),
            &format!("1..={experts}"),
        ));
    }
    Ok(())
}

/// A list of layer indices `v` under `key` (transformers' `mlp_only_layers`, Llama 4's
/// `moe_layers`) as a bit each: every entry a layer index below `layers` (and 128).
pub(crate) fn layer_set(
    f: &Fields,
    key: &str,
    v: &Value,
    layers: usize,
) -> Result<u128, UserError> {
    let allowed = format!("a list of layer indices below {}", layers.min(128));
    let list = v
        .as_array()
        .ok_or_else(|| f.bad(key, v, "not a list", &allowed))?;
    let mut set = 0u128;
    for x in list {
        match x.as_u64() {
            Some(i) if (i as usize) < layers.min(128) => set |= 1u128 << i,
            _ => {
                return Err(f.bad(
                    key,
                    v,
                    "an entry is not a layer index (or is past 127)",
                    &allowed,
                ));
            }
        }
    }
    Ok(set)
}

/// Layer `i` of `layers` attends to everything when `(i + 1)` is a multiple of `period`, the
/// others slide (`layer_types`, when given, overrides); a period of 1: no window. The window
/// and the full layers, a bit each.
pub(crate) fn periodic(
    f: &Fields,
    layers: usize,
    period: usize,
) -> Result<(Option<usize>, u128), UserError> {
    if period == 1 {
        return Ok((None, 0));
    }
    if layers > 128 && f.get("layer_types").is_none() {
        return Err(f.bad(
            "num_hidden_layers",
            &Value::from(layers),
            "full and sliding layers mixed in more than 128 layers are not modelled",
            "at most 128 layers when they mix",
        ));
    }
    let full = (0..layers.min(128))
        .filter(|i| (i + 1) % period == 0)
        .fold(0u128, |m, i| m | 1u128 << i);
    Ok((f.size_opt("sliding_window", super::limits::MAX_SEQ)?, full))
}
