//! GELU (tanh approximation) and SwiGLU's `silu(gate)·up` as single ops. The forward keeps
//! the inputs only; the backward ([`Kernel::backward`]) recomputes the rest in f32 on detached
//! tensors, where candle's own `gelu`/`silu` backward records a chain of temporaries that
//! stay inside the accumulated gradient.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};

use super::Kernel;
use super::cpu::{Float, dispatch, rows, same, slice, zeros};
use super::simd::{self, multiversion};

/// `gelu(x)` (tanh approximation, candle's `Tensor::gelu`) with a fused backward.
pub fn gelu(x: &Tensor) -> Result<Tensor> {
    x.apply_op1(GeluOp)
}

/// `silu(gate)·up` with a fused backward; `gate` and `up` of one shape, contiguous.
pub fn silu_mul(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    glu(gate, up, false)
}

/// [`silu_mul`] whose node also holds `s = silu(gate)` (transformers' SwiGLU saves it for the
/// product's backward); the backward is the same.
pub fn silu_mul_holding(gate: &Tensor, up: &Tensor, s: &Tensor) -> Result<Tensor> {
    same_shape(gate, up)?;
    let op = super::held::Held {
        op: SiluMulOp { oss: false },
        kernel: Kernel::SiluMul { oss: false },
        held: vec![s.clone()],
    };
    gate.apply_op2(up, op)
}

/// gpt-oss's clamped SwiGLU with a fused backward: `g' = min(gate, 7)`, `u' = clamp(up, −7,
/// 7)`, `(u' + 1)·g'·σ(1.702·g')` (transformers' `GptOssExperts`: `alpha`, `limit`).
pub fn oss_glu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    glu(gate, up, true)
}

fn glu(gate: &Tensor, up: &Tensor, oss: bool) -> Result<Tensor> {
    same_shape(gate, up)?;
    gate.apply_op2(up, SiluMulOp { oss })
}

/// A gated activation's gate and up must be of one shape.
fn same_shape(gate: &Tensor, up: &Tensor) -> Result<()> {
    if gate.shape() != up.shape() {
        candle_core::bail!(
            "silu_mul: gate {:?} and up {:?} differ",
            gate.shape(),
            up.shape()
        )
    }
    Ok(())
}

struct GeluOp;

/// GELU (tanh) of one element: `x·σ(2u)`, `u = c(x + a x³)`.
#[inline(always)]
fn gelu_of(x: f32) -> f32 {
    let (c, a) = (super::GELU_C as f32, super::GELU_A as f32);
    x * simd::sigmoid(2.0 * c * (x + a * x * x * x))
}

/// Its derivative times `d`: `gelu' = s + 2x·s(1 − s)·c(1 + 3a x²)`, `s = σ(2u)` (`= ½(1 +
/// tanh u) + ½x(1 − tanh² u)·u'`).
#[inline(always)]
fn gelu_grad_of(x: f32, d: f32) -> f32 {
    let (c, a) = (super::GELU_C as f32, super::GELU_A as f32);
    let s = simd::sigmoid(2.0 * c * (x + a * x * x * x));
    let du = c * (1.0 + 3.0 * a * x * x);
    d * (s + 2.0 * x * s * (1.0 - s) * du)
}

#[inline(always)]
fn gelu_row<T: Float>(x: &[T], o: &mut [T]) {
    for (o, x) in o.iter_mut().zip(x) {
        *o = T::of(gelu_of(x.f()));
    }
}
multiversion!(fn gelu_row_fast<T: Float>(x: &[T], o: &mut [T]) -> () = gelu_row);

#[inline(always)]
fn gelu_grad_row<T: Float>(x: &[T], d: &[T], o: &mut [T]) {
    for ((o, x), d) in o.iter_mut().zip(x).zip(d) {
        *o = T::of(gelu_grad_of(x.f(), d.f()));
    }
}
multiversion!(fn gelu_grad_row_fast<T: Float>(x: &[T], d: &[T], o: &mut [T]) -> () = gelu_grad_row);

struct SiluMulOp {
    oss: bool,
}

/// gpt-oss's GLU constants (`GptOssExperts.alpha`, `.limit`).
pub(crate) const OSS_ALPHA: f32 = 1.702;
pub(crate) const OSS_LIMIT: f32 = 7.0;

/// gpt-oss's clamped GLU of one element.
fn oss(g: f32, u: f32) -> f32 {
    let (a, b) = (g.min(OSS_LIMIT), u.clamp(-OSS_LIMIT, OSS_LIMIT));
    (b + 1.0) * a / (1.0 + (-OSS_ALPHA * a).exp())
}

/// Its gradients `(d/d gate, d/d up)` for the output gradient `d`: none past a clamp (torch's
/// clamp passes the bounds themselves).
fn oss_grad(g: f32, u: f32, d: f32) -> (f32, f32) {
    let (a, b) = (g.min(OSS_LIMIT), u.clamp(-OSS_LIMIT, OSS_LIMIT));
    let s = 1.0 / (1.0 + (-OSS_ALPHA * a).exp());
    let dg = if g <= OSS_LIMIT {
        d * (b + 1.0) * s * (1.0 + OSS_ALPHA * a * (1.0 - s))
    } else {
        0.0
    };
    let du = if (-OSS_LIMIT..=OSS_LIMIT).contains(&u) {
        d * a * s
    } else {
        0.0
    };
    (dg, du)
}

impl CustomOp1 for GeluOp {
    fn name(&self) -> &'static str {
        Kernel::Gelu.name()
    }

    /// `gelu(x) = x·σ(2u)` (`= ½x(1 + tanh u)`, `u = c(x + a x³)`) per element through
    /// [`simd::sigmoid`], a loop the compiler vectorises: within a few ulp of candle's `gelu`
    /// (its `tanh` from the C library, element by element), whose values a strided `x` gets.
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        if !l.is_contiguous() {
            return Ok((s.unary_impl::<candle_core::op::Gelu>(l)?, l.shape().clone()));
        }
        let op = self.name();
        dispatch!(op, s, |x: T| {
            let x = slice(x, l, op, "x")?;
            let n = l.shape().dims().last().copied().unwrap_or(1).max(1);
            let mut out = zeros::<T>(x.len());
            rows(&mut out, n, |i, o| gelu_row_fast(&x[i * n..(i + 1) * n], o));
            Ok((
                <T as candle_core::WithDType>::to_cpu_storage_owned(out),
                l.shape().clone(),
            ))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((s.unary_impl::<candle_core::op::Gelu>(l)?, l.shape().clone()))
    }

    fn bwd(&self, arg: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Kernel::Gelu.backward1(&[arg], res, grad)
    }
}

/// One element-wise pass over two contiguous operands of one shape (named for errors), in f32,
/// into one fresh output of their type and shape.
fn map2(
    op: &str,
    (n1, s1, l1): (&str, &CpuStorage, &Layout),
    (n2, s2, l2): (&str, &CpuStorage, &Layout),
    f: impl Fn(f32, f32) -> f32 + Sync,
) -> Result<(CpuStorage, Shape)> {
    dispatch!(op, s1, |a: T| {
        let a = slice(a, l1, op, n1)?;
        let b = slice(same::<T>(op, s2)?, l2, op, n2)?;
        if a.len() != b.len() {
            candle_core::bail!("{op}: {n1} and {n2} differ in size")
        }
        let n = l1.shape().dims().last().copied().unwrap_or(1).max(1);
        let mut out = zeros::<T>(a.len());
        rows(&mut out, n, |i, o| {
            let (a, b) = (&a[i * n..(i + 1) * n], &b[i * n..(i + 1) * n]);
            for ((o, a), b) in o.iter_mut().zip(a).zip(b) {
                *o = T::of(f(a.f(), b.f()));
            }
        });
        Ok((
            <T as candle_core::WithDType>::to_cpu_storage_owned(out),
            l1.shape().clone(),
        ))
    })
}

fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

impl CustomOp2 for SiluMulOp {
    fn name(&self) -> &'static str {
        Kernel::SiluMul { oss: self.oss }.name()
    }

    /// One pass, one output.
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        if self.oss {
            return map2(self.name(), ("gate", s1, l1), ("up", s2, l2), oss);
        }
        map2(self.name(), ("gate", s1, l1), ("up", s2, l2), |g, u| {
            silu(g) * u
        })
    }

    /// `memfit_silu_mul`: one pass, one output (as on the CPU).
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let out = super::cuda::silu_mul((s1, l1), (s2, l2), None, self.oss)?;
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Kernel::SiluMul { oss: self.oss }.backward2(&[gate, up], res, grad)
    }
}

/// SwiGLU's backward in one pass over contiguous gate, up and the output's gradient: `[d/d
/// gate; d/d up]` `(2, …)` in the inputs' type, computed in f32 per element (`σ = 1/(1 +
/// e^−g)`: `d/d gate = dy·u·σ·(1 + g·(1 − σ))`, `d/d up = dy·g·σ`) — one allocation of two
/// gradients, where the composed backward held seven f32 tensors of the input's size. With
/// `oss`, gpt-oss's clamped GLU's (`oss_grad`).
pub(crate) struct SiluMulGradOp {
    pub(crate) oss: bool,
}

impl SiluMulGradOp {
    fn shape(l: &Layout) -> Shape {
        let mut dims = vec![2];
        dims.extend_from_slice(l.shape().dims());
        Shape::from_dims(&dims)
    }
}

impl CustomOp3 for SiluMulGradOp {
    fn name(&self) -> &'static str {
        "fused-silu-mul-grad"
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
        dispatch!(op, s1, |g: T| {
            let g = slice(g, l1, op, "gate")?;
            let u = slice(same::<T>(op, s2)?, l2, op, "up")?;
            let dy = slice(same::<T>(op, s3)?, l3, op, "grad")?;
            let n = g.len();
            if u.len() != n || dy.len() != n {
                candle_core::bail!("{op}: gate, up and grad differ in size")
            }
            let mut out = zeros::<T>(2 * n);
            let (dg, du) = out.split_at_mut(n);
            for i in 0..n {
                let (a, b, d) = (g[i].f(), u[i].f(), dy[i].f());
                if self.oss {
                    let (x, y) = oss_grad(a, b, d);
                    (dg[i], du[i]) = (T::of(x), T::of(y));
                    continue;
                }
                let s = 1.0 / (1.0 + (-a).exp());
                dg[i] = T::of(d * b * s * (1.0 + a * (1.0 - s)));
                du[i] = T::of(d * a * s);
            }
            Ok((
                <T as candle_core::WithDType>::to_cpu_storage_owned(out),
                Self::shape(l1),
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
        let out = super::cuda::silu_mul((s1, l1), (s2, l2), Some((s3, l3)), self.oss)?;
        Ok((out, Self::shape(l1)))
    }
}

/// GELU's (tanh) backward in one pass over contiguous x and the output's gradient: `dx =
/// dy·gelu'(x)` in the inputs' type, computed in f32 per element ([`gelu_grad_of`]) — one
/// allocation, where a composition of tensor ops held three f32 tensors of x's size beside it.
pub(crate) struct GeluGradOp;

impl CustomOp2 for GeluGradOp {
    fn name(&self) -> &'static str {
        "fused-gelu-grad"
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
            let x = slice(x, l1, op, "x")?;
            let d = slice(same::<T>(op, s2)?, l2, op, "grad")?;
            if x.len() != d.len() {
                candle_core::bail!("{op}: x and grad differ in size")
            }
            let n = l1.shape().dims().last().copied().unwrap_or(1).max(1);
            let mut out = zeros::<T>(x.len());
            rows(&mut out, n, |i, o| {
                let r = i * n..(i + 1) * n;
                gelu_grad_row_fast(&x[r.clone()], &d[r], o)
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
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        Ok((
            super::cuda::gelu_grad((s1, l1), (s2, l2))?,
            l1.shape().clone(),
        ))
    }
}
