//! The fused kernels' ops on symbolic tensors ([`crate::model::kernels::Graph`] for [`Sym`]):
//! each kernel's backward, written once over the trait, replays here statement for statement;
//! and the frozen projections' weights ([`FrozenW`]) the serving and LoRA replays hold.

use std::cell::Cell;

use super::*;

thread_local! {
    /// Tests: compute every tile the shortcut of [`Graph::skipped`] would stand in for.
    static EVERY_TILE: Cell<bool> = const { Cell::new(false) };
}

/// Replay every tile of the tiled attention, no shortcut (tests).
#[cfg(test)]
pub fn replay_every_tile(on: bool) {
    EVERY_TILE.with(|e| e.set(on));
}

/// The fused kernels' backward on symbolic tensors: each method is the candle op of the same
/// name (`model::kernels::graph`), so [`Kernel::backward`] replays statement for statement.
impl Graph for Sym {
    fn dims(&self) -> Vec<usize> {
        Sym::dims(self).to_vec()
    }
    fn skipped(&self, dims: &[usize]) -> Option<Self> {
        (!EVERY_TILE.with(|e| e.get())).then(|| Sym::new(self.ledger(), dims, self.0.dtype))
    }
    fn detach(&self) -> Self {
        Sym::detach(self)
    }
    fn tracked(&self) -> bool {
        self.track_op()
    }
    fn index_select(&self, ids: &Self, dim: usize) -> candle_core::Result<Self> {
        Ok(Sym::index_select(self, ids, dim))
    }
    fn silu_mul_grad(
        gate: &Self,
        _up: &Self,
        grad: &Self,
        _oss: bool,
    ) -> candle_core::Result<(Self, Self)> {
        let grad = grad.contiguous();
        let mut dims = vec![2];
        dims.extend_from_slice(gate.dims());
        let both = Sym::new(gate.ledger(), &dims, gate.0.dtype);
        drop(grad);
        Ok((
            both.narrow(0, 0, 1).squeeze(0),
            both.narrow(0, 1, 1).squeeze(0),
        ))
    }
    fn gelu_grad(x: &Self, grad: &Self) -> candle_core::Result<Self> {
        let (x, grad) = (x.contiguous(), grad.contiguous());
        let dx = Sym::new(x.ledger(), x.dims(), x.0.dtype);
        drop((x, grad));
        Ok(dx)
    }
    fn norm_grad(
        x: &Self,
        _w: &Self,
        grad: &Self,
        _eps: f32,
        centre: bool,
    ) -> candle_core::Result<(Self, Self, Option<Self>)> {
        let grad = grad.contiguous();
        let n = *x.dims().last().expect("a norm's input has a dimension");
        let rows = x.dims().iter().product::<usize>() / n;
        let l = x.ledger().clone();
        // `cpu_fwd`: the output, then the rows' statistics, freed on return.
        let all = Sym::new(&l, &[rows + 1 + usize::from(centre), n], x.0.dtype);
        let stats = Sym::new(&l, &[rows, 2], DType::F32);
        drop(stats);
        drop(grad);
        let dx = all.narrow(0, 0, rows).reshape(x.dims());
        // `Tensor::copy` of a row: a fresh `(H)` tensor each.
        let dw = Sym::new(&l, &[n], x.0.dtype);
        let db = centre.then(|| Sym::new(&l, &[n], x.0.dtype));
        Ok((dx, dw, db))
    }
    fn to_f32(&self) -> candle_core::Result<Self> {
        Ok(self.to_dtype(DType::F32))
    }
    fn to_dtype_of(&self, like: &Self) -> candle_core::Result<Self> {
        Ok(self.to_dtype(like.dtype()))
    }
    fn same_type(&self, other: &Self) -> bool {
        self.dtype() == other.dtype()
    }
    fn add(&self, rhs: &Self) -> candle_core::Result<Self> {
        Ok(Sym::add(self, rhs))
    }
    fn sub(&self, rhs: &Self) -> candle_core::Result<Self> {
        Ok(Sym::sub(self, rhs))
    }
    fn mul(&self, rhs: &Self) -> candle_core::Result<Self> {
        Ok(Sym::mul(self, rhs))
    }
    fn broadcast_sub(&self, rhs: &Self) -> candle_core::Result<Self> {
        Ok(Sym::broadcast_sub(self, rhs))
    }
    fn broadcast_mul(&self, rhs: &Self) -> candle_core::Result<Self> {
        Ok(Sym::broadcast_mul(self, rhs))
    }
    fn broadcast_div(&self, rhs: &Self) -> candle_core::Result<Self> {
        Ok(Sym::broadcast_div(self, rhs))
    }
    fn affine(&self, mul: f64, _add: f64) -> candle_core::Result<Self> {
        Ok(Sym::affine(self, mul))
    }
    fn exp(&self) -> candle_core::Result<Self> {
        Ok(Sym::exp(self))
    }
    fn log(&self) -> candle_core::Result<Self> {
        Ok(Sym::log(self))
    }
    fn broadcast_add(&self, rhs: &Self) -> candle_core::Result<Self> {
        Ok(Sym::broadcast_add(self, rhs))
    }
    /// `Tensor::from_vec` of f32 on the device (the vector becomes the storage on the CPU),
    /// then `to_dtype`.
    fn causal_mask(
        &self,
        rows: usize,
        cols: usize,
        _first_row: usize,
        _period: usize,
        _first_key: usize,
        _window: usize,
    ) -> candle_core::Result<Self> {
        Ok(Sym::new(self.ledger(), &[rows, cols], DType::F32).to_dtype(self.dtype()))
    }
    /// `Tensor::from_vec` of f32 on the device, then `to_dtype` (the values are not computed).
    fn host_table(
        &self,
        dims: &[usize],
        _value: &dyn Fn(usize) -> f32,
    ) -> candle_core::Result<Self> {
        Ok(Sym::new(self.ledger(), dims, DType::F32).to_dtype(self.dtype()))
    }
    /// `Tensor::zeros`: one fresh tensor.
    fn zeros(&self, dims: &[usize]) -> candle_core::Result<Self> {
        Ok(Sym::new(self.ledger(), dims, self.0.dtype))
    }
    /// In place: nothing allocated.
    fn slice_set(&self, _src: &Self, _dim: usize, _offset: usize) -> candle_core::Result<()> {
        Ok(())
    }
    fn sqr(&self) -> candle_core::Result<Self> {
        Ok(Sym::sqr(self))
    }
    fn sqrt(&self) -> candle_core::Result<Self> {
        Ok(Sym::sqrt(self))
    }
    fn recip(&self) -> candle_core::Result<Self> {
        Ok(Sym::recip(self))
    }
    fn tanh(&self) -> candle_core::Result<Self> {
        Ok(Sym::tanh(self))
    }
    fn neg(&self) -> candle_core::Result<Self> {
        Ok(Sym::neg(self))
    }
    fn sum_last_keepdim(&self) -> candle_core::Result<Self> {
        Ok(self.sum_keepdim(&[self.dims().len() - 1]))
    }
    fn max_last_keepdim(&self) -> candle_core::Result<Self> {
        Ok(self.max_keepdim(self.dims().len() - 1))
    }
    fn sum_leading(&self) -> candle_core::Result<Self> {
        let dims: Vec<usize> = (0..self.dims().len() - 1).collect();
        Ok(self.sum(&dims))
    }
    fn matmul(&self, rhs: &Self) -> candle_core::Result<Self> {
        Ok(Sym::matmul(self, rhs))
    }
    fn t(&self) -> candle_core::Result<Self> {
        Ok(Sym::t(self))
    }
    fn transpose(&self, a: usize, b: usize) -> candle_core::Result<Self> {
        Ok(Sym::transpose(self, a, b))
    }
    fn is_contiguous(&self) -> bool {
        Sym::is_contiguous(self)
    }
    fn contiguous(&self) -> candle_core::Result<Self> {
        Ok(Sym::contiguous(self))
    }
    fn reshape(&self, dims: &[usize]) -> candle_core::Result<Self> {
        Ok(Sym::reshape(self, dims))
    }
    fn narrow(&self, dim: usize, start: usize, len: usize) -> candle_core::Result<Self> {
        Ok(Sym::narrow(self, dim, start, len))
    }
    fn cat(parts: &[&Self], dim: usize) -> candle_core::Result<Self> {
        Ok(Sym::cat(parts, dim))
    }
    /// `Tensor::full(−1f32, (N, 1))` converted to the type, then `scatter_add_set` in place.
    fn minus_one_at(self, targets: &Self) -> candle_core::Result<Self> {
        let idx = targets.unsqueeze(1);
        let src = Sym::new(self.ledger(), idx.dims(), DType::F32).to_dtype(self.dtype());
        drop((idx, src));
        Ok(self)
    }
    /// `VocabRowsGradOp`: the gradient made contiguous, one fresh `(rows, H)`.
    fn vocab_rows_grad(
        grad: &Self,
        _ids: &Self,
        rows: usize,
        _start: usize,
    ) -> candle_core::Result<Self> {
        let g = grad.contiguous();
        let h = *g.dims().last().expect("a gradient has a dimension");
        let out = Sym::new(g.ledger(), &[rows, h], g.dtype());
        drop(g);
        Ok(out)
    }
    /// `VocabCeGradOp`: one fresh tensor of the logits' shape and type.
    fn vocab_ce_grad(
        x: &Self,
        _targets: &Self,
        _lse: &Self,
        _grad: &Self,
        _start: usize,
    ) -> candle_core::Result<Self> {
        Ok(Sym::new(x.ledger(), x.dims(), x.dtype()))
    }
}

/// How `FrozenWeight` holds a frozen weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrozenW {
    /// The dense weight.
    Dense,
    /// GGML blocks: dequantized to f32 (with `scratch` bytes beside the output while it is
    /// written), then cast when the activations are 16-bit.
    Ggml { scratch: usize },
    /// FP8 with block scales, or MXFP4: dequantized straight into the activations' type.
    Fp8,
}

/// `FrozenWeight::dense`: the dense weight `w` itself, or a fresh dequantized `(out, in)` copy
/// in `like` (GGML's through f32, the f32 copy dropped after the cast; FP8's directly).
pub(crate) fn frozen_dense(
    l: &Rc<Ledger>,
    w: &Sym,
    held: FrozenW,
    out: usize,
    inp: usize,
    like: DType,
) -> Sym {
    let scratch = match held {
        FrozenW::Dense => return w.clone(),
        FrozenW::Fp8 => return Sym::new(l, &[out, inp], like),
        FrozenW::Ggml { scratch } => scratch,
    };
    let f = Sym::new(l, &[out, inp], DType::F32);
    if scratch > 0 {
        drop(Sym::new(l, &[scratch], DType::U8));
    }
    if like == DType::F32 {
        return f;
    }
    let h = f.to_dtype(like);
    drop(f);
    h
}

/// What a frozen projection's op holds, on symbolic tensors (candle's `FrozenWeight`): the
/// weight's storage (dense `(out, in)`, or the quantized bytes), FP8's or MXFP4's block scales,
/// how it is dequantized, and the widths.
#[derive(Debug, Clone)]
pub struct FrozenSym {
    pub weight: Sym,
    pub scales: Option<Sym>,
    pub held: FrozenW,
    pub out: usize,
    pub inp: usize,
}

impl FrozenSym {
    /// `FrozenWeight::dense_as`: the dense `(out, in)` weight in `like` (the weight itself when
    /// dense; a fresh dequantized copy otherwise).
    pub fn dense(&self, like: DType) -> Sym {
        frozen_dense(
            self.weight.ledger(),
            &self.weight,
            self.held,
            self.out,
            self.inp,
            like,
        )
    }
}

/// The layers' forward on symbolic tensors: each method is the candle op of the same name.
impl crate::model::tensor_ops::TensorOps for Sym {
    type Frozen = FrozenSym;
    fn gelu(&self) -> candle_core::Result<Self> {
        Ok(Sym::gelu(self))
    }
    fn silu(&self) -> candle_core::Result<Self> {
        Ok(Sym::silu(self))
    }
    fn broadcast_left(&self, left: &[usize]) -> candle_core::Result<Self> {
        Ok(Sym::broadcast_left(self, left))
    }
    fn kernel(k: Kernel, a: &[&Self]) -> candle_core::Result<Self> {
        Ok(match k {
            Kernel::Linear | Kernel::LinearAdd | Kernel::LinearNoBias | Kernel::LinearScaled => {
                a[0].fused_product(k, a[1], &a[2..])
            }
            Kernel::CrossEntropy | Kernel::CrossEntropyF32 => {
                // CUDA: the per-row losses (f32) live until the mean is written.
                let ledger = a[0].ledger();
                let rows = ledger
                    .cuda
                    .get()
                    .then(|| Sym::new(ledger, &[a[0].dims()[0]], DType::F32));
                let loss = Sym::kernel(k, a, &[], a[0].dtype());
                drop(rows);
                loss
            }
            // `kernels::scatter_rows`: zeros, candle's index_add into the output, the zeros
            // freed in the op.
            Kernel::ScatterRows { rows } => {
                let h = a[0].dims()[1];
                let zeros = Sym::new(a[0].ledger(), &[rows, h], a[0].dtype());
                let y = Sym::kernel(k, a, &[rows, h], a[0].dtype());
                drop(zeros);
                y
            }
            // `ranks::expert`'s exchange: the reordering buffer on the host beside the rows
            // that arrive.
            Kernel::Exchange { rows, temp, .. } => {
                let cols = a[0].dims()[1];
                let buffer = a[0].ledger().host(4 * temp * cols);
                let y = Sym::kernel(k, a, &[rows, cols], a[0].dtype());
                drop(buffer);
                y
            }
            Kernel::AttnProbs { .. } | Kernel::TiledAttention { .. } => {
                candle_core::bail!("{k:?} is applied by its attention, not through `kernel`")
            }
            // The looked-up rows `(n, H)` of the table's type.
            Kernel::VocabEmbedding { .. } => {
                let h = a[0].dims()[1];
                let mut dims = a[1].dims().to_vec();
                dims.push(h);
                Sym::kernel(k, a, &dims, a[0].dtype())
            }
            Kernel::VocabCrossEntropy { .. } => Sym::kernel(k, a, &[], a[0].dtype()),
            // Element-wise on the first arg: norms, activations, the rotary embedding.
            _ => Sym::kernel(k, a, a[0].dims(), a[0].dtype()),
        })
    }
    fn frozen_linear(&self, w: &FrozenSym, bias: Option<&Self>) -> candle_core::Result<Self> {
        Ok(Sym::frozen_linear(self, &w.weight, w.held, w.out, bias))
    }
    fn broadcast_as(&self, dims: &[usize]) -> candle_core::Result<Self> {
        Ok(Sym::broadcast_as(self, dims))
    }
    fn squeeze(&self, dim: usize) -> candle_core::Result<Self> {
        Ok(Sym::squeeze(self, dim))
    }
    fn frozen_dense(w: &FrozenSym, like: &Self) -> candle_core::Result<Self> {
        Ok(w.dense(like.dtype()))
    }
    /// The window does not change what the kernel allocates.
    fn attn_probs(
        q: &Self,
        k: &Self,
        scale: f32,
        causal: bool,
        _window: Option<usize>,
    ) -> candle_core::Result<Self> {
        Ok(Sym::attn_probs(q, k, scale, causal))
    }
    fn efficient_attention(
        q: &Self,
        k: &Self,
        v: &Self,
        _scale: f32,
        _causal: bool,
        _window: usize,
    ) -> candle_core::Result<Self> {
        Ok(Sym::efficient_attention(q, k, v))
    }
    /// `tiled_attention::attention`: the tiled forward on detached views, then the node's copy
    /// of the output (the precomputed one freed inside its forward).
    fn tiled_attention(
        q: &Self,
        k: &Self,
        v: &Self,
        scale: f32,
        causal: bool,
        window: usize,
    ) -> candle_core::Result<Self> {
        let (out, lse) = crate::model::tiled_attention::precompute(q, k, v, scale, causal, window)?;
        let kernel = Kernel::TiledAttention {
            scale,
            causal,
            window,
        };
        // The node's output `(B, S, A, Dv)`: the heads last.
        let mut dims = out.dims().to_vec();
        dims.swap(1, 2);
        let y = Sym::kernel(kernel, &[q, k, v, &lse], &dims, out.dtype());
        drop((out, lse));
        Ok(y)
    }
    fn permute(&self, order: &[usize]) -> candle_core::Result<Self> {
        Ok(Sym::permute(self, order))
    }
    fn unsqueeze(&self, dim: usize) -> candle_core::Result<Self> {
        Ok(Sym::unsqueeze(self, dim))
    }
    fn gather(&self, ids: &Self, dim: usize) -> candle_core::Result<Self> {
        Ok(Sym::gather(self, ids, dim))
    }
    fn sum_all(&self) -> candle_core::Result<Self> {
        Ok(Sym::sum_all(self))
    }
    fn index_add(&self, ids: &Self, src: &Self, dim: usize) -> candle_core::Result<Self> {
        Ok(Sym::index_add_tracked(self, ids, src, dim))
    }
    fn cat_owned(parts: &[Self], dim: usize) -> candle_core::Result<Self> {
        Ok(Sym::cat(&parts.iter().collect::<Vec<_>>(), dim))
    }
    fn argmax_last(&self) -> candle_core::Result<Self> {
        Ok(Sym::argmax_last(self))
    }
    /// candle-nn's `softmax_last_dim` on a detached tensor: its output only.
    fn softmax_last(&self) -> candle_core::Result<Self> {
        Ok(Sym::new(self.ledger(), self.dims(), self.dtype()))
    }
    fn release(&self) -> candle_core::Result<()> {
        Sym::release(self, self.ledger().cuda.get());
        Ok(())
    }
    fn half(&self) -> bool {
        self.dtype() == DType::Half
    }
    /// The frozen op holds the projection's (mapped) weight and its scales.
    fn map_frozen(
        f: &FrozenSym,
        weight: &Self,
        base: &crate::model::tensor_ops::Map<'_, Self>,
    ) -> candle_core::Result<FrozenSym> {
        Ok(FrozenSym {
            weight: weight.clone(),
            scales: f.scales.as_ref().map(base).transpose()?,
            ..f.clone()
        })
    }
    fn segment(&self) -> u32 {
        self.ledger().tag()
    }
    fn set_segment(&self, tag: u32) {
        self.ledger().set_tag(tag)
    }
}

/// The symbolic backward ([`super::backward`]) as the drivers take it.
impl crate::model::tensor_ops::Autograd for Sym {
    type Var = Sym;
    type Grads = GradStore;
    fn var_tensor(v: &Sym) -> &Sym {
        v
    }
    fn var_from(&self) -> candle_core::Result<Self> {
        Ok(Sym::var_from(self))
    }
    fn backward(&self) -> candle_core::Result<GradStore> {
        Ok(super::backward(self))
    }
    fn take_grad(grads: &mut GradStore, of: &Sym) -> Option<Sym> {
        grads.remove(of)
    }
    fn put_grad(grads: &mut GradStore, of: &Sym, g: Sym) {
        grads.insert(of, g);
    }
    type Id = u64;
    fn grad_id(&self) -> u64 {
        self.id()
    }
    fn grad_of(grads: &GradStore, id: u64) -> Option<Sym> {
        grads.get_id(id).cloned()
    }
    /// On CUDA the moved-from tensor keeps one element.
    fn cut(&self) -> candle_core::Result<Self> {
        Ok(Sym::cut(self, self.ledger().cuda.get()))
    }
    fn seed(&self, grad: Self) -> candle_core::Result<Self> {
        Ok(Sym::seed(self, grad))
    }
}

/// Results of symbolic tensors' ops, which never fail: the replay's drivers take the value.
pub trait Sure<T> {
    fn sure(self) -> T;
}

impl<T> Sure<T> for candle_core::Result<T> {
    fn sure(self) -> T {
        self.expect("symbolic tensors' ops do not fail")
    }
}
