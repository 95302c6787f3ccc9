//! The model's attention (`model::attention`) on symbolic tensors: the layer and its core are
//! the model's own; what stays here is the copy of a layer's tensors.

use super::proj::Linear;
use super::{Sym, lift};
pub(super) use crate::model::attention::Core;

/// The model's multi-head attention on symbolic tensors.
pub(super) type Attention = crate::model::attention::Attention<Sym>;

/// `f` on the projections, `w` on the q/k norms' weights and the sinks, in model order.
pub(super) fn map(
    a: &Attention,
    f: &dyn Fn(&Linear) -> Linear,
    w: &dyn Fn(&Sym) -> Sym,
) -> Attention {
    Attention {
        q: f(&a.q),
        k: f(&a.k),
        v: f(&a.v),
        o: f(&a.o),
        qk_norm: a
            .qk_norm
            .as_ref()
            .map(|(qn, kn)| (lift(qn, w), lift(kn, w))),
        sinks: a.sinks.as_ref().map(w),
        head_dim: a.head_dim,
        core: a.core,
    }
}
