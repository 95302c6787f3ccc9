//! Megatron-LM's conjugate collectives `f` and `g` ([`Collectives`]) written once over the
//! tensor trait: candle's tensors run them over MPI (`crate::ranks::tensor`, `memfit ranks
//! --tp`), the replay's symbolic tensors size them (`crate::formula::replay`), so the order in
//! which their tensors are made and freed is the same by construction. An interpreter gives
//! only the two ops' forwards ([`CollectiveOps`]).

use candle_core::Result;

use super::tensor_ops::TensorOps;
use super::transformer::Collectives;

/// The two collective ops of tensor parallelism on one interpreter's tensors.
pub trait CollectiveOps: TensorOps {
    /// `f`'s forward: a copy of this tensor (an op makes its output), whose backward
    /// all-reduces the gradient over the group (copies it when `!reduce`).
    fn tp_enter(&self, reduce: bool) -> Result<Self>;
    /// `g`'s forward: this tensor summed over the group (copied when `!reduce`) into a fresh
    /// tensor of its shape; the identity backward.
    fn tp_reduce(&self, reduce: bool) -> Result<Self>;
}

/// Megatron's `f` and `g` around a block's sublayers.
#[derive(Debug, Clone, Copy)]
pub struct Megatron {
    /// `f`'s backward all-reduces (always, but to show the check catches its absence).
    pub f_all_reduce: bool,
    /// `g`'s forward all-reduces (always, but to show the serving check catches its absence:
    /// `ranks --tp-skip-g-all-reduce`).
    pub g_all_reduce: bool,
    /// Release the tensors no backward reads (the norm's output once copied, the partial and
    /// the reduced outputs once summed), as memfit's fused kernels do (`Kernels::fused`);
    /// with candle's composed ops every op's inputs stay in the graph, as stock candle keeps
    /// them.
    pub release: bool,
}

impl<T: CollectiveOps> Collectives<T> for Megatron {
    fn enter(&self, x: T) -> Result<T> {
        // Serving (no graph recorded): `f` is the identity with no backward, nothing to copy
        // (vLLM's forward has no `f` at all).
        if !x.tracked() {
            return Ok(x);
        }
        let y = x.tp_enter(self.f_all_reduce)?;
        // No backward reads the norm's output (the norm's reads its input; f's none).
        x.release_if(self.release)?;
        Ok(y)
    }

    fn reduce_add(&self, y: T, residual: &T) -> Result<T> {
        let r = y.tp_reduce(self.g_all_reduce)?;
        // The projection's backward reads its input and weight, g's and the sum's nothing.
        y.release_if(self.release)?;
        drop(y);
        let sum = residual.add(&r)?;
        r.release_if(self.release)?;
        Ok(sum)
    }
}
