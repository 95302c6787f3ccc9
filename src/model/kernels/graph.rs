//! The tensor operations a fused kernel's backward is written in, as a trait: implemented by
//! candle's [`Tensor`] (the backward that runs) and by the replay's symbolic tensor
//! ([`crate::formula::symbolic::Sym`], the backward that is predicted). Each kernel's backward
//! is one generic function ([`super::Kernel::backward`]), so both run the same statements, and
//! Rust's drop order (a temporary dies at the end of its statement) is the same for both.
//!
//! Every method allocates what the candle op of the same name allocates; none is recorded in a
//! graph, because the backward works on detached tensors.

use candle_core::{D, DType, Result, Tensor};

/// Tensor operations used by the fused kernels' backward passes.
pub trait Graph: Clone + Sized {
    fn dims(&self) -> Vec<usize>;
    /// The replay's shortcut: a fresh tensor of `dims` in this one's type standing for work
    /// whose only lasting result it is, where an identical later piece of work, computed,
    /// reaches higher (see `tiled_attention`). `None` on a device: everything is computed.
    fn skipped(&self, _dims: &[usize]) -> Option<Self> {
        None
    }
    /// The tensor without its op (shares the storage).
    fn detach(&self) -> Self;
    /// Whether a gradient is wanted for it: a variable or the result of a recorded op.
    fn tracked(&self) -> bool;
    /// f32 (the same tensor when already f32).
    fn to_f32(&self) -> Result<Self>;
    /// The type a 16-bit tensor computes in (f32); any other type is kept (candle-nn's norms:
    /// f64 stays f64). The replay's tensors are f32 or 16-bit: [`Graph::to_f32`].
    fn upcast(&self) -> Result<Self> {
        self.to_f32()
    }
    /// Converted to `like`'s element type (the same tensor when equal).
    fn to_dtype_of(&self, like: &Self) -> Result<Self>;
    /// Whether `other` has this one's element type.
    fn same_type(&self, other: &Self) -> bool;
    fn add(&self, rhs: &Self) -> Result<Self>;
    fn sub(&self, rhs: &Self) -> Result<Self>;
    fn mul(&self, rhs: &Self) -> Result<Self>;
    fn broadcast_sub(&self, rhs: &Self) -> Result<Self>;
    fn broadcast_mul(&self, rhs: &Self) -> Result<Self>;
    fn broadcast_div(&self, rhs: &Self) -> Result<Self>;
    /// `x·mul + add`.
    fn affine(&self, mul: f64, add: f64) -> Result<Self>;
    fn exp(&self) -> Result<Self>;
    fn log(&self) -> Result<Self>;
    fn broadcast_add(&self, rhs: &Self) -> Result<Self>;
    /// The additive causal mask of `rows` query rows starting at row `first_row` over `cols`
    /// keys from position `first_key`, row `i` being the query at position `i mod period` (a
    /// query-head group's rows read as one matrix; `period` = the queries per head): 0 where
    /// the key is visible, −∞ after the query or (a sliding `window` > 0) `window` or more
    /// positions before it ([`crate::model::mask::grouped_causal_mask`]); made as f32 `(rows,
    /// cols)` on `self`'s device, then converted to `self`'s type.
    fn causal_mask(
        &self,
        rows: usize,
        cols: usize,
        first_row: usize,
        period: usize,
        first_key: usize,
        window: usize,
    ) -> Result<Self>;
    /// A table of `dims` whose element `i` (row-major) is `value(i)`, made as f32 on `self`'s
    /// device (the host's vector becomes the storage on the CPU), then converted to `self`'s
    /// type: a mask or a per-position factor the host computes (the replay only sizes it and
    /// never calls `value`).
    fn host_table(&self, dims: &[usize], value: &dyn Fn(usize) -> f32) -> Result<Self>;
    /// A fresh tensor of zeros of `dims` in this one's type on its device.
    fn zeros(&self, dims: &[usize]) -> Result<Self>;
    /// Copies `src` into `self` from `offset` along `dim`, in place (candle's `slice_set`:
    /// both contiguous, nothing allocated).
    fn slice_set(&self, src: &Self, dim: usize, offset: usize) -> Result<()>;
    fn sqr(&self) -> Result<Self>;
    fn sqrt(&self) -> Result<Self>;
    fn recip(&self) -> Result<Self>;
    fn tanh(&self) -> Result<Self>;
    fn neg(&self) -> Result<Self>;
    /// Sum over the last dimension, kept.
    fn sum_last_keepdim(&self) -> Result<Self>;
    /// Maximum over the last dimension, kept.
    fn max_last_keepdim(&self) -> Result<Self>;
    /// Sum over every dimension but the last: `(…, H)` → `(H)`.
    fn sum_leading(&self) -> Result<Self>;
    fn matmul(&self, rhs: &Self) -> Result<Self>;
    /// Swaps the last two dimensions (a view).
    fn t(&self) -> Result<Self>;
    /// Swaps dimensions `a` and `b` (a view).
    fn transpose(&self, a: usize, b: usize) -> Result<Self>;
    fn is_contiguous(&self) -> bool;
    /// The same tensor when contiguous, else a contiguous copy.
    fn contiguous(&self) -> Result<Self>;
    /// A view when contiguous, else a copy.
    fn reshape(&self, dims: &[usize]) -> Result<Self>;
    fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Self>;
    fn cat(parts: &[&Self], dim: usize) -> Result<Self>;
    /// SwiGLU's gradients `(d/d gate, d/d up)` of detached gate, up and the output's gradient
    /// (made contiguous first: a copy when it is not), in the inputs' type: two views of one
    /// fresh `(2, …)` allocation (`kernels::act::SiluMulGradOp`).
    fn silu_mul_grad(gate: &Self, up: &Self, grad: &Self, oss: bool) -> Result<(Self, Self)>;
    /// GELU's gradient of detached x and the output's gradient (each made contiguous first: a
    /// copy when it is not), in x's type: one fresh tensor (`kernels::act::GeluGradOp`).
    fn gelu_grad(x: &Self, grad: &Self) -> Result<Self>;
    /// A norm's gradients `(dx, dw, db)` (`db` with `centre` only) of detached x, w and the
    /// output's gradient (made contiguous first), in the inputs' type: `dx` a view of one
    /// fresh `(rows + 1 + centre, H)` allocation, `dw`, `db` copies of its last rows, and the
    /// call's `(rows, 2)` f32 statistics (`kernels::norm::NormGradOp`).
    #[allow(clippy::type_complexity)]
    fn norm_grad(
        x: &Self,
        w: &Self,
        grad: &Self,
        eps: f32,
        centre: bool,
    ) -> Result<(Self, Self, Option<Self>)>;
    /// The rows (or slices along `dim`) at `ids` (u32), a fresh tensor.
    fn index_select(&self, ids: &Self, dim: usize) -> Result<Self>;
    /// `self` with −1 added, in place, at column `targets[i]` of each row `i` (`self (N, V)`
    /// fresh and unshared, `targets (N)` u32): candle's `scatter_add_set` of a `(N, 1)` f32
    /// tensor of −1 (converted to `self`'s type).
    fn minus_one_at(self, targets: &Self) -> Result<Self>;
    /// The vocab-parallel table's gradient ([`super::Kernel::VocabEmbedding`]): `(rows, H)`
    /// zeros with each row of `grad (…, H)` (made contiguous first) added at its id less
    /// `start` where that is one of the rows: one fresh tensor (`kernels::vocab::VocabRowsGradOp`).
    fn vocab_rows_grad(grad: &Self, ids: &Self, rows: usize, start: usize) -> Result<Self>;
    /// The vocab-parallel loss's logits gradient ([`super::Kernel::VocabCrossEntropy`]) from
    /// the loss's scalar gradient `grad`: `grad/N·(exp(x − lse) − 1 at the target less
    /// start)`, one fresh `(N, rows)` in x's type (`kernels::vocab::VocabCeGradOp`).
    fn vocab_ce_grad(
        x: &Self,
        targets: &Self,
        lse: &Self,
        grad: &Self,
        start: usize,
    ) -> Result<Self>;
}

impl Graph for Tensor {
    fn dims(&self) -> Vec<usize> {
        Tensor::dims(self).to_vec()
    }
    fn detach(&self) -> Self {
        Tensor::detach(self)
    }
    fn index_select(&self, ids: &Self, dim: usize) -> Result<Self> {
        Tensor::index_select(self, ids, dim)
    }
    fn silu_mul_grad(gate: &Self, up: &Self, grad: &Self, oss: bool) -> Result<(Self, Self)> {
        let grad = grad.contiguous()?;
        let both = gate.apply_op3_no_bwd(up, &grad, &super::act::SiluMulGradOp { oss })?;
        drop(grad);
        Ok((both.get(0)?, both.get(1)?))
    }
    fn gelu_grad(x: &Self, grad: &Self) -> Result<Self> {
        let (x, grad) = (x.contiguous()?, grad.contiguous()?);
        x.apply_op2_no_bwd(&grad, &super::act::GeluGradOp)
    }
    fn norm_grad(
        x: &Self,
        w: &Self,
        grad: &Self,
        eps: f32,
        centre: bool,
    ) -> Result<(Self, Self, Option<Self>)> {
        let grad = grad.contiguous()?;
        let all = x.apply_op3_no_bwd(w, &grad, &super::norm::NormGradOp { eps, centre })?;
        drop(grad);
        let rows = x.elem_count() / all.dim(1)?;
        let dx = all.narrow(0, 0, rows)?.reshape(x.shape())?;
        // A compact copy of each row (`Tensor::copy` would clone the whole storage on the CPU).
        let dw = all.get(rows)?.affine(1.0, 0.0)?;
        let db = if centre {
            Some(all.get(rows + 1)?.affine(1.0, 0.0)?)
        } else {
            None
        };
        Ok((dx, dw, db))
    }
    fn tracked(&self) -> bool {
        self.track_op()
    }
    fn to_f32(&self) -> Result<Self> {
        self.to_dtype(DType::F32)
    }
    fn upcast(&self) -> Result<Self> {
        match self.dtype() {
            DType::F16 | DType::BF16 => self.to_dtype(DType::F32),
            _ => Ok(self.clone()),
        }
    }
    fn to_dtype_of(&self, like: &Self) -> Result<Self> {
        self.to_dtype(like.dtype())
    }
    fn same_type(&self, other: &Self) -> bool {
        self.dtype() == other.dtype()
    }
    fn add(&self, rhs: &Self) -> Result<Self> {
        Tensor::add(self, rhs)
    }
    fn sub(&self, rhs: &Self) -> Result<Self> {
        Tensor::sub(self, rhs)
    }
    fn mul(&self, rhs: &Self) -> Result<Self> {
        Tensor::mul(self, rhs)
    }
    fn broadcast_sub(&self, rhs: &Self) -> Result<Self> {
        Tensor::broadcast_sub(self, rhs)
    }
    fn broadcast_mul(&self, rhs: &Self) -> Result<Self> {
        Tensor::broadcast_mul(self, rhs)
    }
    fn broadcast_div(&self, rhs: &Self) -> Result<Self> {
        Tensor::broadcast_div(self, rhs)
    }
    fn affine(&self, mul: f64, add: f64) -> Result<Self> {
        Tensor::affine(self, mul, add)
    }
    fn exp(&self) -> Result<Self> {
        Tensor::exp(self)
    }
    fn log(&self) -> Result<Self> {
        Tensor::log(self)
    }
    fn broadcast_add(&self, rhs: &Self) -> Result<Self> {
        Tensor::broadcast_add(self, rhs)
    }
    fn causal_mask(
        &self,
        rows: usize,
        cols: usize,
        first_row: usize,
        period: usize,
        first_key: usize,
        window: usize,
    ) -> Result<Self> {
        crate::model::mask::grouped_causal_mask(
            rows,
            cols,
            first_row,
            period,
            first_key,
            window,
            self.device(),
        )?
        .to_dtype(self.dtype())
    }
    fn host_table(&self, dims: &[usize], value: &dyn Fn(usize) -> f32) -> Result<Self> {
        // An exact-size iterator: the Vec (which the tensor keeps) has no spare capacity.
        let n = dims.iter().product();
        let data: Vec<f32> = (0..n).map(value).collect();
        Tensor::from_vec(data, dims, self.device())?.to_dtype(self.dtype())
    }
    fn zeros(&self, dims: &[usize]) -> Result<Self> {
        Tensor::zeros(dims, self.dtype(), self.device())
    }
    fn slice_set(&self, src: &Self, dim: usize, offset: usize) -> Result<()> {
        Tensor::slice_set(self, src, dim, offset)
    }
    fn sqr(&self) -> Result<Self> {
        Tensor::sqr(self)
    }
    fn sqrt(&self) -> Result<Self> {
        Tensor::sqrt(self)
    }
    fn recip(&self) -> Result<Self> {
        Tensor::recip(self)
    }
    fn tanh(&self) -> Result<Self> {
        Tensor::tanh(self)
    }
    fn neg(&self) -> Result<Self> {
        Tensor::neg(self)
    }
    fn sum_last_keepdim(&self) -> Result<Self> {
        self.sum_keepdim(D::Minus1)
    }
    fn max_last_keepdim(&self) -> Result<Self> {
        self.max_keepdim(D::Minus1)
    }
    fn sum_leading(&self) -> Result<Self> {
        super::linear::sum_rows(self)
    }
    fn matmul(&self, rhs: &Self) -> Result<Self> {
        Tensor::matmul(self, rhs)
    }
    fn t(&self) -> Result<Self> {
        Tensor::t(self)
    }
    fn transpose(&self, a: usize, b: usize) -> Result<Self> {
        Tensor::transpose(self, a, b)
    }
    fn is_contiguous(&self) -> bool {
        Tensor::is_contiguous(self)
    }
    fn contiguous(&self) -> Result<Self> {
        Tensor::contiguous(self)
    }
    fn reshape(&self, dims: &[usize]) -> Result<Self> {
        Tensor::reshape(self, dims)
    }
    fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Self> {
        Tensor::narrow(self, dim, start, len)
    }
    fn cat(parts: &[&Self], dim: usize) -> Result<Self> {
        Tensor::cat(parts, dim)
    }
    fn minus_one_at(self, targets: &Self) -> Result<Self> {
        let idx = targets.unsqueeze(1)?;
        let src = Tensor::full(-1f32, idx.dims(), self.device())?.to_dtype(self.dtype())?;
        self.scatter_add_set(&idx, &src, 1)?;
        Ok(self)
    }
    fn vocab_rows_grad(grad: &Self, ids: &Self, rows: usize, start: usize) -> Result<Self> {
        let g = grad.contiguous()?;
        let h = g.dims().last().copied().unwrap_or(1);
        let flat = g.reshape((g.elem_count() / h.max(1), h))?;
        let out = flat.apply_op2_no_bwd(ids, &super::VocabRowsGradOp { rows, start });
        drop((flat, g));
        out
    }
    fn vocab_ce_grad(
        x: &Self,
        targets: &Self,
        lse: &Self,
        grad: &Self,
        start: usize,
    ) -> Result<Self> {
        let scale = grad.to_scalar::<f32>()? / x.dim(0)? as f32;
        x.apply_op3_no_bwd(targets, lse, &super::VocabCeGradOp { start, scale })
    }
}
