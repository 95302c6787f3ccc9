//! The model's multi-head latent attention (`model::mla`) on symbolic tensors: the layer is
//! the model's own; what stays here is the copy of a layer's tensors.

use super::proj::Linear;
use super::{Sure, Sym};

/// The model's MLA on symbolic tensors.
pub(super) type Mla = crate::model::mla::Mla<Sym>;

/// `f` on the projections, `w` on the norms' weights, in model order.
pub(super) fn map(m: &Mla, f: &dyn Fn(&Linear) -> Linear, w: &dyn Fn(&Sym) -> Sym) -> Mla {
    m.map_parts(&|p| Ok(f(p)), &|t| Ok(w(t))).sure()
}
