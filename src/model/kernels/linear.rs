//! Projections as single ops, each a product `x·wᵀ` written by candle's own gemm into its
//! output (`x (…, in)` contiguous, `w (out, in)`) and finished in place:
//!
//! | op | result | what the graph keeps |
//! |---|---|---|
//! | [`linear`] | `x·wᵀ + b` | x and the output, as PyTorch's `addmm` (candle-nn keeps the product and the sum) |
//! | [`linear_no_bias`] | `x·wᵀ` | x; the backward writes `dx`, `dw` once, where candle's matmul, transpose and reshape arms each hold a placeholder and a sum |
//! | [`linear_add`] | `x + h·wᵀ` (into the residual stream) | h and x, which the model keeps anyway: the projection's own output never exists |
//! | [`linear_scaled`] | `(h·wᵀ) ⊙ s`, `s (n, 1)` (a routed expert's output times its routing weight) | h and s, not the unscaled product (which transformers' `expert(x) * weight` keeps) |
//!
//! No weight gradient is computed for a frozen (untracked) weight or bias.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use super::Kernel;
use super::cpu::{Float, dispatch, same, slice, zeros};

/// `x·wᵀ + b` with a fused backward; `x` contiguous.
pub fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    x.apply_op3(w, b, LinearOp)
}

/// `x·wᵀ` with a fused backward; `x` contiguous.
pub fn linear_no_bias(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.apply_op2(w, LinearNoBiasOp)
}

/// `x + h·wᵀ` with a fused backward (`dh = g·w`, `dw = gᵀ·h`, `dx = g` itself); h, x
/// contiguous, x of the output's shape.
pub fn linear_add(h: &Tensor, w: &Tensor, x: &Tensor) -> Result<Tensor> {
    h.apply_op3(w, x, LinearAddOp)
}

/// `(h·wᵀ) ⊙ s` with a fused backward (`ds = Σ_row g ⊙ (h·wᵀ)`, the product recomputed;
/// `dh`, `dw` against `g ⊙ s`); `h (n, in)` contiguous, `s (n, 1)` of any row stride (a
/// column of the routing weights).
pub fn linear_scaled(h: &Tensor, w: &Tensor, s: &Tensor) -> Result<Tensor> {
    h.apply_op3(w, s, LinearScaledOp)
}

/// A bias's gradient: `g (…, out)` summed over every leading dimension into `(out)`, on the
/// CPU one pass over `g`'s rows in order, accumulated in f32 (PyTorch's `sum` of a 16-bit
/// tensor accumulates in f32 too). It allocates what candle's `sum` does, the output, and gives
/// its bits in f32 (the same additions in the same order); candle's CPU reduction walks `g`
/// down its columns (a stride of `out` between the terms), a few percent of GPT small's train
/// step. A strided `g` or another device: candle's `sum`.
pub fn sum_rows(g: &Tensor) -> Result<Tensor> {
    if g.device().is_cpu() && g.is_contiguous() && g.rank() >= 1 {
        g.apply_op1_no_bwd(&SumRowsOp)
    } else {
        g.sum((0..g.rank().saturating_sub(1)).collect::<Vec<_>>())
    }
}

struct SumRowsOp;

/// Columns summed at once into a buffer on the stack (so the op allocates only its output).
const SUM_BLOCK: usize = 256;

/// `out[c] = Σ_r x[r·n + c]`, the rows added in order, in f32; column blocks in parallel
/// where the tensor is large.
fn sum_rows_of<T: Float>(x: &[T], n: usize) -> Vec<T> {
    let mut out = zeros::<T>(n);
    let block = |c0: usize, o: &mut [T]| {
        let mut acc = [0f32; SUM_BLOCK];
        let acc = &mut acc[..o.len()];
        for row in x.chunks_exact(n) {
            for (a, v) in acc.iter_mut().zip(&row[c0..c0 + o.len()]) {
                *a += v.f();
            }
        }
        for (o, a) in o.iter_mut().zip(acc.iter()) {
            *o = T::of(*a);
        }
    };
    if x.len() < 1 << 18 || n <= SUM_BLOCK {
        out.chunks_mut(SUM_BLOCK)
            .enumerate()
            .for_each(|(b, o)| block(b * SUM_BLOCK, o));
    } else {
        out.par_chunks_mut(SUM_BLOCK)
            .enumerate()
            .for_each(|(b, o)| block(b * SUM_BLOCK, o));
    }
    out
}

impl CustomOp1 for SumRowsOp {
    fn name(&self) -> &'static str {
        "sum-rows"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let n = l.shape().dims().last().copied().unwrap_or(1);
        dispatch!(op, s, |v: T| {
            let x = slice(v, l, op, "the gradient")?;
            let out = if n == 0 {
                Vec::new()
            } else {
                sum_rows_of::<T>(x, n)
            };
            Ok((
                <T as candle_core::WithDType>::to_cpu_storage_owned(out),
                Shape::from_dims(&[n]),
            ))
        })
    }
}

struct LinearOp;
struct LinearNoBiasOp;
struct LinearAddOp;
struct LinearScaledOp;

/// The product's rows, input and output features and output shape, checked: `x (…, in)`
/// contiguous, `w (out, in)`.
struct Product {
    rows: usize,
    inp: usize,
    out: usize,
    shape: Shape,
}

impl Product {
    fn of(kernel: Kernel, lx: &Layout, lw: &Layout) -> Result<Self> {
        let dims = lx.shape().dims();
        let inp = *dims.last().unwrap_or(&1);
        let (out, win) = lw.shape().dims2()?;
        if win != inp || !lx.is_contiguous() {
            candle_core::bail!(
                "{}: x {:?} (contiguous) against w {:?}",
                kernel.name(),
                lx.shape(),
                lw.shape()
            )
        }
        let mut shape = dims.to_vec();
        *shape.last_mut().expect("a dimension") = out;
        Ok(Self {
            rows: lx.shape().elem_count() / inp.max(1),
            inp,
            out,
            shape: Shape::from_dims(&shape),
        })
    }

    /// `x·wᵀ` by candle's matmul (gemm on the CPU, cuBLAS on CUDA) into a fresh storage.
    fn run<B: BackendStorage>(&self, x: &B, lx: &Layout, w: &B, lw: &Layout) -> Result<B> {
        let l = Layout::contiguous_with_offset((self.rows, self.inp), lx.start_offset());
        x.matmul(
            w,
            (1, self.rows, self.out, self.inp),
            &l,
            &lw.transpose(0, 1)?,
        )
    }

    /// A third operand: contiguous with `n` elements (a bias: `out`; a residual: the output's).
    fn check(&self, kernel: Kernel, l: &Layout, n: usize) -> Result<()> {
        if l.shape().elem_count() != n || !l.is_contiguous() {
            candle_core::bail!(
                "{}: {:?} is not {n} contiguous elements",
                kernel.name(),
                l.shape()
            )
        }
        Ok(())
    }
}

/// `y[i] += x[i % n]` (a bias when `n` = out, a residual when `n` = y's length).
fn add_in_place<T: Float>(y: &mut [T], x: &[T]) {
    for row in y.chunks_mut(x.len()) {
        for (v, b) in row.iter_mut().zip(x) {
            *v = T::of(v.f() + b.f());
        }
    }
}

/// Each row `r` of `y (·, out)` times `s[r·stride]`.
fn scale_rows<T: Float>(y: &mut [T], s: &[T], out: usize, stride: usize) {
    for (r, row) in y.chunks_mut(out).enumerate() {
        let f = s[r * stride].f();
        row.iter_mut().for_each(|v| *v = T::of(v.f() * f));
    }
}

/// The product of `kernel` on either device, then `finish` on its output.
fn product<B: BackendStorage>(
    kernel: Kernel,
    (s1, l1): (&B, &Layout),
    (s2, l2): (&B, &Layout),
    finish: impl FnOnce(&Product, &mut B) -> Result<()>,
) -> Result<(B, Shape)> {
    let p = Product::of(kernel, l1, l2)?;
    let mut y = p.run(s1, l1, s2, l2)?;
    finish(&p, &mut y)?;
    Ok((y, p.shape))
}

/// The CPU product's output plus a contiguous operand of `n` elements, repeated over it (a
/// bias, `n` = out) or whole (a residual), in place.
fn cpu_add(
    kernel: Kernel,
    p: &Product,
    y: &mut CpuStorage,
    (s, l): (&CpuStorage, &Layout),
    n: usize,
) -> Result<()> {
    p.check(kernel, l, n)?;
    let (op, at) = (kernel.name(), l.start_offset());
    dispatch!(op, y, |v: T| {
        add_in_place(v, &same::<T>(op, s)?[at..at + n]);
        Ok(())
    })
}

impl CustomOp3 for LinearOp {
    fn name(&self) -> &'static str {
        Kernel::Linear.name()
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
        product(Kernel::Linear, (s1, l1), (s2, l2), |p, y| {
            cpu_add(Kernel::Linear, p, y, (s3, l3), p.out)
        })
    }

    /// cuBLAS's `x·wᵀ` into the output, then the bias added in place.
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
        product(Kernel::Linear, (s1, l1), (s2, l2), |p, y| {
            p.check(Kernel::Linear, l3, p.out)?;
            super::cuda::add_bias(y, (s3, l3), p.out)
        })
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        Kernel::Linear.backward3(&[x, w, b], res, grad)
    }
}

impl CustomOp2 for LinearNoBiasOp {
    fn name(&self) -> &'static str {
        Kernel::LinearNoBias.name()
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        product(Kernel::LinearNoBias, (s1, l1), (s2, l2), |_, _| Ok(()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        product(Kernel::LinearNoBias, (s1, l1), (s2, l2), |_, _| Ok(()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Kernel::LinearNoBias.backward2(&[x, w], res, grad)
    }
}

impl CustomOp3 for LinearAddOp {
    fn name(&self) -> &'static str {
        Kernel::LinearAdd.name()
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
        product(Kernel::LinearAdd, (s1, l1), (s2, l2), |p, y| {
            cpu_add(Kernel::LinearAdd, p, y, (s3, l3), p.shape.elem_count())
        })
    }

    /// cuBLAS's `h·wᵀ` into the output, then x added in place.
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
        product(Kernel::LinearAdd, (s1, l1), (s2, l2), |p, y| {
            p.check(Kernel::LinearAdd, l3, p.shape.elem_count())?;
            let ly = Layout::contiguous((p.rows, p.out));
            super::cuda::axpby((y, &ly), (s3, l3), 1.0, 1.0, false)
        })
    }

    fn bwd(
        &self,
        h: &Tensor,
        w: &Tensor,
        x: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        Kernel::LinearAdd.backward3(&[h, w, x], res, grad)
    }
}

/// `s (rows, 1)` against the product, checked; its row stride.
fn scale_stride(p: &Product, l: &Layout) -> Result<usize> {
    if l.shape().dims() != [p.rows, 1] {
        candle_core::bail!(
            "{}: s {:?} against {} rows",
            Kernel::LinearScaled.name(),
            l.shape(),
            p.rows
        )
    }
    Ok(l.stride()[0])
}

impl CustomOp3 for LinearScaledOp {
    fn name(&self) -> &'static str {
        Kernel::LinearScaled.name()
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
        product(Kernel::LinearScaled, (s1, l1), (s2, l2), |p, y| {
            let stride = scale_stride(p, l3)?;
            let s0 = l3.start_offset();
            dispatch!(op, y, |v: T| {
                scale_rows(v, &same::<T>(op, s3)?[s0..], p.out, stride);
                Ok(())
            })
        })
    }

    /// cuBLAS's `h·wᵀ` into the output, then each row scaled in place.
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
        product(Kernel::LinearScaled, (s1, l1), (s2, l2), |p, y| {
            scale_stride(p, l3)?;
            super::cuda::scale_rows(y, (s3, l3), p.out)
        })
    }

    fn bwd(
        &self,
        h: &Tensor,
        w: &Tensor,
        s: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        Kernel::LinearScaled.backward3(&[h, w, s], res, grad)
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    /// The bias gradient equals candle's `sum` over the leading dimensions: to the bit in f32
    /// (the same additions in the same order), in f32 accumulation for bf16; small and large
    /// (the parallel column blocks), and a width that is not a multiple of the block.
    #[test]
    fn sum_rows_equals_candles_sum() -> candle_core::Result<()> {
        for (rows, n) in [(3, 5), (512, 768), (700, 1000), (4, 1)] {
            let g = Tensor::randn(0f32, 1.0, (2, rows, n), &Device::Cpu)?;
            let ours = super::sum_rows(&g)?;
            let candle = g.sum((0, 1))?;
            assert_eq!(ours.dims(), candle.dims());
            assert_eq!(ours.to_vec1::<f32>()?, candle.to_vec1::<f32>()?);
            let b = g.to_dtype(DType::BF16)?;
            let exact = b.to_dtype(DType::F32)?.sum((0, 1))?;
            let ours = super::sum_rows(&b)?.to_dtype(DType::F32)?;
            let err = (ours - &exact)?.abs()?.max(0)?.to_scalar::<f32>()?;
            let size = exact.abs()?.max(0)?.to_scalar::<f32>()?;
            assert!(err <= size / 128.0, "bf16: {err} against {size}");
        }
        // A strided gradient goes to candle's sum.
        let g = Tensor::randn(0f32, 1.0, (6, 4), &Device::Cpu)?.t()?;
        assert_eq!(
            super::sum_rows(&g)?.to_vec1::<f32>()?,
            g.sum(0)?.to_vec1::<f32>()?
        );
        Ok(())
    }
}
