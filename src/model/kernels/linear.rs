//! A linear layer with bias as one op: `x (…, in)`, `w (out, in)`, `b (out)` → `x·wᵀ + b`
//! `(…, out)`. candle-nn's `Linear` makes the product and then a second tensor for the bias
//! sum, and the graph keeps both; here the bias is added in place into the product (candle's
//! own gemm writes it), so the graph keeps x (which the model keeps anyway) and the output,
//! as PyTorch's `addmm` does.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};

use super::Kernel;
use super::cpu::{Float, same};

/// `x·wᵀ + b` with a fused backward; `x` contiguous.
pub fn linear(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    x.apply_op3(w, b, LinearOp)
}

struct LinearOp;

fn add_bias<T: Float>(y: &mut [T], b: &[T]) {
    for row in y.chunks_mut(b.len()) {
        for (v, b) in row.iter_mut().zip(b) {
            *v = T::of(v.f() + b.f());
        }
    }
}

/// Rows, input and output features, and the output's shape, checked.
fn dims(op: &str, l1: &Layout, l2: &Layout, l3: &Layout) -> Result<(usize, usize, usize, Shape)> {
    let dims = l1.shape().dims();
    let inp = *dims.last().unwrap_or(&1);
    let (out, win) = l2.shape().dims2()?;
    if win != inp || l3.shape().elem_count() != out {
        candle_core::bail!(
            "{op}: x {:?}, w {:?}, b {:?}",
            l1.shape(),
            l2.shape(),
            l3.shape()
        )
    }
    if !l1.is_contiguous() || !l3.is_contiguous() {
        candle_core::bail!("{op}: x and b must be contiguous")
    }
    let rows = l1.shape().elem_count() / inp.max(1);
    let mut shape = dims.to_vec();
    *shape.last_mut().expect("a dimension") = out;
    Ok((rows, inp, out, Shape::from_dims(&shape)))
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
        let op = self.name();
        let (rows, inp, out, shape) = dims(op, l1, l2, l3)?;
        let lx = Layout::contiguous_with_offset((rows, inp), l1.start_offset());
        let mut y = s1.matmul(s2, (1, rows, out, inp), &lx, &l2.transpose(0, 1)?)?;
        let b0 = l3.start_offset();
        match &mut y {
            CpuStorage::F32(v) => add_bias(v, &same::<f32>(op, s3)?[b0..b0 + out]),
            CpuStorage::F16(v) => add_bias(v, &same::<half::f16>(op, s3)?[b0..b0 + out]),
            CpuStorage::BF16(v) => add_bias(v, &same::<half::bf16>(op, s3)?[b0..b0 + out]),
            other => candle_core::bail!("{op}: unsupported type {:?}", other.dtype()),
        }
        Ok((y, shape))
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
        let (rows, inp, out, shape) = dims(self.name(), l1, l2, l3)?;
        let lx = Layout::contiguous_with_offset((rows, inp), l1.start_offset());
        let mut y = s1.matmul(s2, (1, rows, out, inp), &lx, &l2.transpose(0, 1)?)?;
        super::cuda::add_bias(&mut y, (s3, l3), out)?;
        Ok((y, shape))
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

/// `x + h·wᵀ` with a fused backward: a projection without bias whose output is added to the
/// residual stream, as one op. `h (…, in)`, `w (out, in)`, `x (…, out)` contiguous. The
/// product is written by candle's gemm into the output and x added in place, so the
/// projection's own output never exists: the graph keeps h and x (which the model keeps anyway:
/// h is the projection's input, x the next norm's) and the sum, as PyTorch's `addmm`-then-add
/// keeps nothing of the sum's operands. The backward: `dh = g·w`, `dw = gᵀ·h`, `dx = g` (the
/// upstream gradient itself, no copy).
pub fn linear_add(h: &Tensor, w: &Tensor, x: &Tensor) -> Result<Tensor> {
    h.apply_op3(w, x, LinearAddOp)
}

struct LinearAddOp;

fn add_in_place<T: Float>(y: &mut [T], x: &[T]) {
    for (v, x) in y.iter_mut().zip(x) {
        *v = T::of(v.f() + x.f());
    }
}

/// Rows, input and output features, and the output's shape of `x + h·wᵀ`, checked.
fn add_dims(l1: &Layout, l2: &Layout, l3: &Layout) -> Result<(usize, usize, usize, Shape)> {
    let op = Kernel::LinearAdd.name();
    let dims = l1.shape().dims();
    let inp = *dims.last().unwrap_or(&1);
    let (out, win) = l2.shape().dims2()?;
    let rows = l1.shape().elem_count() / inp.max(1);
    let mut shape = dims.to_vec();
    *shape.last_mut().expect("a dimension") = out;
    if win != inp || l3.shape().dims() != shape {
        candle_core::bail!(
            "{op}: h {:?}, w {:?}, x {:?}",
            l1.shape(),
            l2.shape(),
            l3.shape()
        )
    }
    if !l1.is_contiguous() || !l3.is_contiguous() {
        candle_core::bail!("{op}: h and x must be contiguous")
    }
    Ok((rows, inp, out, Shape::from_dims(&shape)))
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
        let op = self.name();
        let (rows, inp, out, shape) = add_dims(l1, l2, l3)?;
        let lh = Layout::contiguous_with_offset((rows, inp), l1.start_offset());
        let mut y = s1.matmul(s2, (1, rows, out, inp), &lh, &l2.transpose(0, 1)?)?;
        let (x0, n) = (l3.start_offset(), rows * out);
        match &mut y {
            CpuStorage::F32(v) => add_in_place(v, &same::<f32>(op, s3)?[x0..x0 + n]),
            CpuStorage::F16(v) => add_in_place(v, &same::<half::f16>(op, s3)?[x0..x0 + n]),
            CpuStorage::BF16(v) => add_in_place(v, &same::<half::bf16>(op, s3)?[x0..x0 + n]),
            other => candle_core::bail!("{op}: unsupported type {:?}", other.dtype()),
        }
        Ok((y, shape))
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
        let (rows, inp, out, shape) = add_dims(l1, l2, l3)?;
        let lh = Layout::contiguous_with_offset((rows, inp), l1.start_offset());
        let mut y = s1.matmul(s2, (1, rows, out, inp), &lh, &l2.transpose(0, 1)?)?;
        let ly = Layout::contiguous((rows, out));
        super::cuda::axpby((&mut y, &ly), (s3, l3), 1.0, 1.0, false)?;
        Ok((y, shape))
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

/// `x·wᵀ` with a fused backward (a projection without bias); `x (…, in)` contiguous, `w (out,
/// in)`. The forward is candle-nn's `Linear` product (one gemm into the output); the backward
/// writes `dx = g·w` and `dw = gᵀ·x` directly (no `dw` for a frozen weight), where candle's
/// matmul, transpose and reshape arms each hold a placeholder and a sum of the weight's and the
/// input's size.
pub fn linear_no_bias(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    x.apply_op2(w, LinearNoBiasOp)
}

struct LinearNoBiasOp;

/// Rows, input and output features, and the output's shape of `x·wᵀ`, checked.
fn no_bias_dims(l1: &Layout, l2: &Layout) -> Result<(usize, usize, usize, Shape)> {
    let op = Kernel::LinearNoBias.name();
    let dims = l1.shape().dims();
    let inp = *dims.last().unwrap_or(&1);
    let (out, win) = l2.shape().dims2()?;
    if win != inp || !l1.is_contiguous() {
        candle_core::bail!("{op}: x {:?} (contiguous), w {:?}", l1.shape(), l2.shape())
    }
    let rows = l1.shape().elem_count() / inp.max(1);
    let mut shape = dims.to_vec();
    *shape.last_mut().expect("a dimension") = out;
    Ok((rows, inp, out, Shape::from_dims(&shape)))
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
        let (rows, inp, out, shape) = no_bias_dims(l1, l2)?;
        let lx = Layout::contiguous_with_offset((rows, inp), l1.start_offset());
        let y = s1.matmul(s2, (1, rows, out, inp), &lx, &l2.transpose(0, 1)?)?;
        Ok((y, shape))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (rows, inp, out, shape) = no_bias_dims(l1, l2)?;
        let lx = Layout::contiguous_with_offset((rows, inp), l1.start_offset());
        let y = s1.matmul(s2, (1, rows, out, inp), &lx, &l2.transpose(0, 1)?)?;
        Ok((y, shape))
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

/// `(h·wᵀ) ⊙ s`: a projection without bias whose rows are scaled, as one op — a routed
/// expert's down projection times its routing weight. `h (n, in)` contiguous, `w (out, in)`,
/// `s (n, 1)` (any row stride: a column of the routing weights). The graph keeps h, w and s,
/// not the unscaled product (which transformers' `expert(x) * weight` keeps); the backward
/// recomputes it for `ds = Σ_row g ⊙ (h·wᵀ)`, and `dh = (g ⊙ s)·w`, `dw = (g ⊙ s)ᵀ·h`.
pub fn linear_scaled(h: &Tensor, w: &Tensor, s: &Tensor) -> Result<Tensor> {
    h.apply_op3(w, s, LinearScaledOp)
}

struct LinearScaledOp;

fn scale_rows<T: Float>(y: &mut [T], s: &[T], out: usize, stride: usize) {
    for (r, row) in y.chunks_mut(out).enumerate() {
        let f = s[r * stride].f();
        row.iter_mut().for_each(|v| *v = T::of(v.f() * f));
    }
}

/// Rows, input and output features of `(h·wᵀ) ⊙ s`, checked.
fn scaled_dims(l1: &Layout, l2: &Layout, l3: &Layout) -> Result<(usize, usize, usize)> {
    let op = Kernel::LinearScaled.name();
    let (rows, inp) = l1.shape().dims2()?;
    let (out, win) = l2.shape().dims2()?;
    if win != inp || l3.shape().dims() != [rows, 1] || !l1.is_contiguous() {
        candle_core::bail!(
            "{op}: h {:?} (contiguous), w {:?}, s {:?}",
            l1.shape(),
            l2.shape(),
            l3.shape()
        )
    }
    Ok((rows, inp, out))
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
        let (rows, inp, out) = scaled_dims(l1, l2, l3)?;
        let mut y = s1.matmul(s2, (1, rows, out, inp), l1, &l2.transpose(0, 1)?)?;
        let (s0, st) = (l3.start_offset(), l3.stride()[0]);
        match &mut y {
            CpuStorage::F32(v) => scale_rows(v, &same::<f32>(op, s3)?[s0..], out, st),
            CpuStorage::F16(v) => scale_rows(v, &same::<half::f16>(op, s3)?[s0..], out, st),
            CpuStorage::BF16(v) => scale_rows(v, &same::<half::bf16>(op, s3)?[s0..], out, st),
            other => candle_core::bail!("{op}: unsupported type {:?}", other.dtype()),
        }
        Ok((y, Shape::from_dims(&[rows, out])))
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
        let (rows, inp, out) = scaled_dims(l1, l2, l3)?;
        let mut y = s1.matmul(s2, (1, rows, out, inp), l1, &l2.transpose(0, 1)?)?;
        super::cuda::scale_rows(&mut y, (s3, l3), out)?;
        Ok((y, Shape::from_dims(&[rows, out])))
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
