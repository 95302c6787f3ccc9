//! The rotary embedding ("rotate half", as `model::rotary::apply_rotary`) as one op: x `(B, n, S, D)`
//! and the tables `cos`, `sin` `(S, D/2)` at the sequence's positions →
//! `[x₁·cos − x₂·sin, x₂·cos + x₁·sin]`. The composed version makes four products, a
//! difference, a sum and a `cat` per rotated tensor, and candle keeps them (and gradients for
//! the constant tables) for the backward; here the graph keeps x and the output only. The
//! backward is the rotation by −θ: `[g₁·cos + g₂·sin, g₂·cos − g₁·sin]`.

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};

use super::Kernel;
use super::cpu::{Float, dispatch, rows, same, slice, zeros};

/// `x` rotated by the tables' angles; `cos`, `sin` `(S, D/2)` (e.g. narrowed at the cache
/// offset), `x` contiguous.
pub fn rotary(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    x.apply_op3(cos, sin, RotaryOp)
}

struct RotaryOp;

/// The positions `S`, the head size `D` and its half, checked against the tables `(S, D/2)`.
fn dims(op: &str, l1: &Layout, l2: &Layout, l3: &Layout) -> Result<(usize, usize, usize)> {
    let (_b, _n, s, d) = l1.shape().dims4()?;
    let h = d / 2;
    if l2.shape().dims() != [s, h] || l3.shape().dims() != [s, h] || d % 2 != 0 {
        candle_core::bail!(
            "{op}: x {:?} with tables {:?}, {:?}",
            l1.shape(),
            l2.shape(),
            l3.shape()
        )
    }
    Ok((s, d, h))
}

impl CustomOp3 for RotaryOp {
    fn name(&self) -> &'static str {
        Kernel::Rotary.name()
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (s, d, h) = dims(op, l1, l2, l3)?;
        dispatch!(op, s1, |x: T| {
            let x = slice(x, l1, op, "x")?;
            let cos = slice(same::<T>(op, s2)?, l2, op, "cos")?;
            let sin = slice(same::<T>(op, s3)?, l3, op, "sin")?;
            let mut out = zeros::<T>(x.len());
            rows(&mut out, d, |r, o| {
                let p = r % s;
                let (xr, c, sn) = (
                    &x[r * d..(r + 1) * d],
                    &cos[p * h..(p + 1) * h],
                    &sin[p * h..(p + 1) * h],
                );
                for j in 0..h {
                    let (x1, x2) = (xr[j].f(), xr[j + h].f());
                    let (c, sn) = (c[j].f(), sn[j].f());
                    o[j] = T::of(x1 * c - x2 * sn);
                    o[j + h] = T::of(x2 * c + x1 * sn);
                }
            });
            Ok((
                <T as candle_core::WithDType>::to_cpu_storage_owned(out),
                l1.shape().clone(),
            ))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (s, _d, h) = dims(self.name(), l1, l2, l3)?;
        let out = super::cuda::rotary((s1, l1), (s2, l2), (s3, l3), s, h)?;
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        Kernel::Rotary.backward3(&[x, cos, sin], res, grad)
    }
}
