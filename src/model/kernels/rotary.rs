//! The rotary embedding ("rotate half", as `model::rotary::apply_rotary`) as one op: x `(B, n, S, D)`
//! and the tables `cos`, `sin` `(S, D/2)` at the sequence's positions →
//! `[x₁·cos − x₂·sin, x₂·cos + x₁·sin]`, contiguous. The composed version makes four products,
//! a difference, a sum and a `cat` per rotated tensor, and candle keeps them (and gradients for
//! the constant tables) for the backward; here the graph keeps x and the output only. x may be
//! strided (its last dimension contiguous): the head split of a projection's output `(B, S,
//! n·D)` as the view `(B, S, n, D)ᵀ`, so the rotation itself makes the `(B, n, S, D)` layout
//! and no contiguous copy of the split is made or kept (the projection's output, which the
//! node keeps as x, is the only input kept). The backward is the rotation by −θ: `[g₁·cos +
//! g₂·sin, g₂·cos − g₁·sin]`; it reads the tables only.

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor};

use super::Kernel;
use super::cpu::{Float, dispatch, rows, same, slice, zeros};

/// `x` rotated by the tables' angles; `cos`, `sin` `(S, D/2)` (e.g. narrowed at the cache
/// offset), `x` of any strides with a contiguous last dimension; the output contiguous.
pub fn rotary(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    x.apply_op3(cos, sin, RotaryOp)
}

struct RotaryOp;

/// The heads `n`, the positions `S`, the head size `D` and its half, checked against the
/// tables `(S, D/2)`, and x's strides of its batch, head and position dimensions.
fn dims(op: &str, l1: &Layout, l2: &Layout, l3: &Layout) -> Result<(Dims, [usize; 3])> {
    let (_b, n, s, d) = l1.shape().dims4()?;
    let h = d / 2;
    if l2.shape().dims() != [s, h] || l3.shape().dims() != [s, h] || d % 2 != 0 {
        candle_core::bail!(
            "{op}: x {:?} with tables {:?}, {:?}",
            l1.shape(),
            l2.shape(),
            l3.shape()
        )
    }
    let st = l1.stride();
    if st[3] != 1 {
        candle_core::bail!("{op}: x's last dimension must be contiguous")
    }
    Ok((Dims { n, s, d, h }, [st[0], st[1], st[2]]))
}

/// x's heads, positions, head size and half head size.
#[derive(Clone, Copy)]
struct Dims {
    n: usize,
    s: usize,
    d: usize,
    h: usize,
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
        let (Dims { n, s, d, h }, st) = dims(op, l1, l2, l3)?;
        dispatch!(op, s1, |x: T| {
            let x = &x[l1.start_offset()..];
            let cos = slice(same::<T>(op, s2)?, l2, op, "cos")?;
            let sin = slice(same::<T>(op, s3)?, l3, op, "sin")?;
            let mut out = zeros::<T>(l1.shape().elem_count());
            rows(&mut out, d, |r, o| {
                let p = r % s;
                let at = (r / (s * n)) * st[0] + (r / s % n) * st[1] + p * st[2];
                let (xr, c, sn) = (
                    &x[at..at + d],
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
        let (Dims { n, s, h, .. }, st) = dims(self.name(), l1, l2, l3)?;
        let out = super::cuda::rotary((s1, l1), (s2, l2), (s3, l3), [n, s, h], st)?;
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
