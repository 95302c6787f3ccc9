//! LayerNorm and RMSNorm over the last dimension as single ops: `(…, H)` → `(…, H)`, weight
//! (and bias) `(H)`; statistics in f32. The graph keeps the input and the output only.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};

use super::Kernel;
use super::cpu::{Float, dispatch, rows, same, slice, zeros};

/// `(x − mean)/√(var + eps)·w + b` over the last dimension.
pub fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f32) -> Result<Tensor> {
    x.apply_op3(w, b, LayerNormOp { eps })
}

/// `x/√(mean(x²) + eps)·w` over the last dimension.
pub fn rms_norm(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    x.apply_op2(w, RmsNormOp { eps })
}

struct LayerNormOp {
    eps: f32,
}

struct RmsNormOp {
    eps: f32,
}

/// One row normalised: `centre` subtracts the mean (LayerNorm), `bias` is added when given.
fn norm_row<T: Float>(x: &[T], w: &[T], b: Option<&[T]>, eps: f32, centre: bool, out: &mut [T]) {
    let n = x.len() as f32;
    let mean = if centre {
        x.iter().map(|v| v.f()).sum::<f32>() / n
    } else {
        0.0
    };
    let var = x.iter().map(|v| (v.f() - mean).powi(2)).sum::<f32>() / n;
    let rstd = 1.0 / (var + eps).sqrt();
    for (i, o) in out.iter_mut().enumerate() {
        let y = (x[i].f() - mean) * rstd * w[i].f();
        *o = T::of(match b {
            Some(b) => y + b[i].f(),
            None => y,
        });
    }
}

#[allow(clippy::too_many_arguments)]
fn norm_fwd<T: Float>(
    op: &str,
    x: &[T],
    lx: &Layout,
    w: &[T],
    lw: &Layout,
    b: Option<(&[T], &Layout)>,
    eps: f32,
    centre: bool,
) -> Result<(CpuStorage, Shape)> {
    let x = slice(x, lx, op, "the input")?;
    let w = slice(w, lw, op, "the weight")?;
    let b = match b {
        Some((b, lb)) => Some(slice(b, lb, op, "the bias")?),
        None => None,
    };
    let n = lx.shape().dims().last().copied().unwrap_or(1);
    if w.len() != n || b.is_some_and(|b| b.len() != n) {
        candle_core::bail!("{op}: weight of {} for rows of {n}", w.len())
    }
    let mut out = zeros::<T>(x.len());
    rows(&mut out, n, |i, o| {
        norm_row(&x[i * n..(i + 1) * n], w, b, eps, centre, o)
    });
    Ok((
        <T as candle_core::WithDType>::to_cpu_storage_owned(out),
        lx.shape().clone(),
    ))
}

impl CustomOp3 for LayerNormOp {
    fn name(&self) -> &'static str {
        Kernel::LayerNorm { eps: self.eps }.name()
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
        dispatch!(op, s1, |x: T| {
            let (w, b) = (same::<T>(op, s2)?, same::<T>(op, s3)?);
            norm_fwd(op, x, l1, w, l2, Some((b, l3)), self.eps, true)
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
        super::cuda::norm(self.name(), (s1, l1), (s2, l2), Some((s3, l3)), self.eps)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        Kernel::LayerNorm { eps: self.eps }.backward3(&[x, w, b], res, grad)
    }
}

impl CustomOp2 for RmsNormOp {
    fn name(&self) -> &'static str {
        Kernel::RmsNorm { eps: self.eps }.name()
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        dispatch!(op, s1, |x: T| {
            let w = same::<T>(op, s2)?;
            norm_fwd(op, x, l1, w, l2, None, self.eps, false)
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        super::cuda::norm(self.name(), (s1, l1), (s2, l2), None, self.eps)
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Kernel::RmsNorm { eps: self.eps }.backward2(&[x, w], res, grad)
    }
}
