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

/// transformers' RMSNorm before its weight: `x/√(mean(x²) + eps)` in x's type
/// ([`Kernel::RmsNormalise`]); `ones` a `(H)` of ones in x's type, `x32` x in f32, held.
pub fn rms_normalise(x: &Tensor, ones: &Tensor, x32: &Tensor, eps: f32) -> Result<Tensor> {
    let op = super::held::Held {
        op: RmsNormOp { eps },
        kernel: Kernel::RmsNormalise { eps },
        held: vec![x32.clone()],
    };
    x.apply_op2(ones, op)
}

struct LayerNormOp {
    eps: f32,
}

struct RmsNormOp {
    eps: f32,
}

/// A row's mean (0 without `centre`: RMSNorm) and `1/√(var + eps)`, in f32.
fn row_stats<T: Float>(x: &[T], eps: f32, centre: bool) -> (f32, f32) {
    let n = x.len() as f32;
    let mean = if centre {
        x.iter().map(|v| v.f()).sum::<f32>() / n
    } else {
        0.0
    };
    let var = x.iter().map(|v| (v.f() - mean).powi(2)).sum::<f32>() / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// One row normalised: `centre` subtracts the mean (LayerNorm), `bias` is added when given.
fn norm_row<T: Float>(x: &[T], w: &[T], b: Option<&[T]>, eps: f32, centre: bool, out: &mut [T]) {
    let (mean, rstd) = row_stats(x, eps, centre);
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

/// A norm's backward in one op on contiguous x `(…, H)`, w `(H)` and the output's gradient:
/// one fresh `(rows + 1 + centre, H)` output in the inputs' type — `dx` (rows), then `dw`
/// (and `db` with `centre`) — computed in f32: `dx = rstd·(dy [− mean(dy)] − x̂·mean(dy·x̂))`
/// per row, `dw = Σ g·x̂`, `db = Σ g` per column (`dy = g·w`, `x̂ = (x − mean)·rstd`, mean 0
/// for RMSNorm). Beside the output it holds the rows' mean and rstd, `(rows, 2)` f32, for the
/// call only (on CUDA as well: `cuda::norm_grad`), where the composed backward held two f32
/// tensors of x's size.
pub(crate) struct NormGradOp {
    pub eps: f32,
    /// LayerNorm (subtract the mean; a bias gradient); RMSNorm without.
    pub centre: bool,
}

impl NormGradOp {
    /// The output's shape for x's rows of `n`.
    fn shape(&self, l: &Layout) -> Result<Shape> {
        let n = l.shape().dims().last().copied().unwrap_or(1).max(1);
        let rows = l.shape().elem_count() / n;
        Ok(Shape::from_dims(&[rows + 1 + usize::from(self.centre), n]))
    }
}

impl CustomOp3 for NormGradOp {
    fn name(&self) -> &'static str {
        "fused-norm-grad"
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
        use rayon::prelude::*;
        let op = self.name();
        let shape = self.shape(l1)?;
        let (centre, eps) = (self.centre, self.eps);
        dispatch!(op, s1, |x: T| {
            let x = slice(x, l1, op, "x")?;
            let w = slice(same::<T>(op, s2)?, l2, op, "the weight")?;
            let g = slice(same::<T>(op, s3)?, l3, op, "grad")?;
            let n = w.len();
            if n == 0 || x.len() % n != 0 || g.len() != x.len() {
                candle_core::bail!("{op}: x of {}, weight of {n}, grad of {}", x.len(), g.len())
            }
            let rows = x.len() / n;
            let mut out = zeros::<T>(shape.elem_count());
            let mut stats = vec![0f32; 2 * rows];
            let (dx, tail) = out.split_at_mut(rows * n);
            let work = |r: usize, o: &mut [T], st: &mut [f32]| {
                let (xr, gr) = (&x[r * n..(r + 1) * n], &g[r * n..(r + 1) * n]);
                let (mean, rstd) = row_stats(xr, eps, centre);
                let (mut s1, mut s2) = (0f32, 0f32);
                for i in 0..n {
                    let dy = gr[i].f() * w[i].f();
                    s1 += dy;
                    s2 += dy * (xr[i].f() - mean) * rstd;
                }
                let m1 = if centre { s1 / n as f32 } else { 0.0 };
                let m2 = s2 / n as f32;
                for (i, o) in o.iter_mut().enumerate() {
                    let dy = gr[i].f() * w[i].f();
                    *o = T::of(rstd * (dy - m1 - (xr[i].f() - mean) * rstd * m2));
                }
                st[0] = mean;
                st[1] = rstd;
            };
            dx.par_chunks_mut(n)
                .zip(stats.par_chunks_mut(2))
                .enumerate()
                .for_each(|(r, (o, st))| work(r, o, st));
            // The weight's (and bias's) gradient by blocks of columns, each over every row.
            let (dw, db) = tail.split_at_mut(n);
            const COLS: usize = 64;
            let stats = &stats;
            let column = |j0: usize, dw: &mut [T], mut db: Option<&mut [T]>| {
                for (c, o) in dw.iter_mut().enumerate() {
                    let j = j0 + c;
                    let (mut a, mut b) = (0f32, 0f32);
                    for r in 0..rows {
                        let gv = g[r * n + j].f();
                        a += gv * (x[r * n + j].f() - stats[2 * r]) * stats[2 * r + 1];
                        b += gv;
                    }
                    *o = T::of(a);
                    if let Some(db) = db.as_deref_mut() {
                        db[c] = T::of(b);
                    }
                }
            };
            if centre {
                dw.par_chunks_mut(COLS)
                    .zip(db.par_chunks_mut(COLS))
                    .enumerate()
                    .for_each(|(k, (w, b))| column(k * COLS, w, Some(b)));
            } else {
                dw.par_chunks_mut(COLS)
                    .enumerate()
                    .for_each(|(k, w)| column(k * COLS, w, None));
            }
            Ok((
                <T as candle_core::WithDType>::to_cpu_storage_owned(out),
                shape,
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
        let out = super::cuda::norm_grad((s1, l1), (s2, l2), (s3, l3), self.eps, self.centre)?;
        Ok((out, self.shape(l1)?))
    }
}
