//! The tensor operations the layers' forward passes are written in: [`Graph`] (what the fused
//! kernels' backward uses) grown to the forward. Two interpreters implement it: candle's
//! [`Tensor`] (the model that runs and is metered) and the replay's symbolic tensor
//! ([`crate::formula::symbolic::Sym`], the model that is predicted at any size). A layer
//! written once over [`TensorOps`] (`Norm<T>`, `Proj<T>`, `Mlp<T>`) runs the same statements
//! on both, so where memory is allocated and freed is the same by construction — PyTorch sizes
//! models it never runs the same way, by executing the module's code on fake tensors.
//!
//! Every method allocates what the candle op of the same name allocates and, unlike
//! [`Graph`]'s use in the backward, is recorded in the autograd graph when an operand is
//! tracked.

use candle_core::{Result, Tensor};

use super::efficient_attention::EfficientAttention;
use super::frozen::{FrozenLinear, FrozenWeight};
use super::kernels::{self, Graph, Kernel};

/// A function applied to every weight of a model (a copy's cast, detach or freeze).
pub type Map<'a, T> = dyn Fn(&T) -> Result<T> + 'a;

/// Tensor operations used by the layers' forward passes.
pub trait TensorOps: Graph {
    /// A frozen projection's weight as its op holds it (dense, GGML blocks, FP8 or MXFP4):
    /// candle's [`FrozenWeight`]; the replay's description of the same bytes.
    type Frozen: Clone + std::fmt::Debug;
    /// GELU with the tanh approximation, composed (candle's `gelu`).
    fn gelu(&self) -> Result<Self>;
    fn silu(&self) -> Result<Self>;
    /// A view with `left` prepended as broadcast dimensions.
    fn broadcast_left(&self, left: &[usize]) -> Result<Self>;
    /// One of the fused kernels of [`kernels`] on `args` (in the order [`Kernel`] lists them):
    /// one fresh output.
    fn kernel(k: Kernel, args: &[&Self]) -> Result<Self>;
    /// The frozen-linear op ([`FrozenLinear`]) on rows `x (N, in)` → `(N, out)`.
    fn frozen_linear(&self, w: &Self::Frozen, bias: Option<&Self>) -> Result<Self>;
    /// A view broadcast to `dims`.
    fn broadcast_as(&self, dims: &[usize]) -> Result<Self>;
    /// The view without dimension `dim` (of size 1).
    fn squeeze(&self, dim: usize) -> Result<Self>;
    /// A frozen weight as a dense `(out, in)` tensor in `like`'s type (the dense weight itself,
    /// or a fresh dequantized copy).
    fn frozen_dense(w: &Self::Frozen, like: &Self) -> Result<Self>;
    /// [`kernels::attn_probs`]: `softmax(q·kᵀ·scale + mask)` per key head, one op.
    fn attn_probs(
        q: &Self,
        k: &Self,
        scale: f32,
        causal: bool,
        window: Option<usize>,
    ) -> Result<Self>;
    /// The efficient CPU attention op ([`EfficientAttention`]) on q, k, v of one width:
    /// `(B, S, A, D)`, the heads last.
    fn efficient_attention(
        q: &Self,
        k: &Self,
        v: &Self,
        scale: f32,
        causal: bool,
        window: usize,
    ) -> Result<Self>;
    /// The tiled attention ([`super::tiled_attention::attention`]): `(B, S, A, Dv)`, the
    /// heads last.
    fn tiled_attention(
        q: &Self,
        k: &Self,
        v: &Self,
        scale: f32,
        causal: bool,
        window: usize,
    ) -> Result<Self>;
    /// The dimensions in the order `order` (a view).
    fn permute(&self, order: &[usize]) -> Result<Self>;
    /// A view with a dimension of size 1 inserted at `dim`.
    fn unsqueeze(&self, dim: usize) -> Result<Self>;
    /// The values at `ids` along `dim` (`ids` of this one's rank).
    fn gather(&self, ids: &Self, dim: usize) -> Result<Self>;
    /// The sum of every element, a scalar.
    fn sum_all(&self) -> Result<Self>;
    /// A copy of this one with `src`'s rows added at `ids` along `dim` (candle's `index_add`:
    /// not in place).
    fn index_add(&self, ids: &Self, src: &Self, dim: usize) -> Result<Self>;
    /// [`Graph::cat`] of owned parts (candle's `Tensor::cat` of a slice: one part is returned
    /// as it is).
    fn cat_owned(parts: &[Self], dim: usize) -> Result<Self>;
    /// The index of the largest value along the last dimension (u32, that dimension gone).
    fn argmax_last(&self) -> Result<Self>;
    /// The softmax over the last dimension as one op (candle-nn's `softmax_last_dim`), not
    /// recorded: a fresh tensor.
    fn softmax_last(&self) -> Result<Self>;
    /// Frees this one's storage in place when it covers it whole, keeping the tensor (and its
    /// place in the graph): for a tensor a node holds only to route the gradient, which no
    /// backward reads ([`kernels::boundary::release`]). Nothing may read it afterwards.
    fn release(&self) -> Result<()>;
    /// [`TensorOps::release`] when `when` and a graph holds this one (it is recorded); outside
    /// a graph nothing else holds it, and it is freed when dropped.
    fn release_if(&self, when: bool) -> Result<()> {
        if when && self.tracked() {
            self.release()
        } else {
            Ok(())
        }
    }
    /// Whether its type is 16-bit (f16, bf16).
    fn half(&self) -> bool;
    /// The replay's ledger segment (a block's tag) the work under way belongs to; candle has
    /// none.
    fn segment(&self) -> u32 {
        0
    }
    /// Puts the work that follows in segment `tag` (the replay's ledger; nothing on candle).
    fn set_segment(&self, _tag: u32) {}
    /// A frozen weight of a projection whose weight became `weight`, with `base` applied to
    /// what it holds as tensors (a dense weight, a quantized one's scales).
    fn map_frozen(f: &Self::Frozen, weight: &Self, base: &Map<'_, Self>) -> Result<Self::Frozen>;
}

impl TensorOps for Tensor {
    type Frozen = FrozenWeight;
    fn gelu(&self) -> Result<Self> {
        Tensor::gelu(self)
    }
    fn silu(&self) -> Result<Self> {
        Tensor::silu(self)
    }
    fn broadcast_left(&self, left: &[usize]) -> Result<Self> {
        Tensor::broadcast_left(self, left)
    }
    fn kernel(k: Kernel, a: &[&Self]) -> Result<Self> {
        match k {
            Kernel::LayerNorm { eps } => kernels::layer_norm(a[0], a[1], a[2], eps),
            Kernel::RmsNorm { eps } => kernels::rms_norm(a[0], a[1], eps),
            Kernel::Gelu => kernels::gelu(a[0]),
            Kernel::SiluMul { oss: false } if a.len() > 2 => {
                kernels::silu_mul_holding(a[0], a[1], a[2])
            }
            Kernel::SiluMul { oss: false } => kernels::silu_mul(a[0], a[1]),
            Kernel::RmsNormalise { eps } => kernels::rms_normalise(a[0], a[1], a[2], eps),
            Kernel::CrossEntropyF32 => kernels::cross_entropy_f32(a[0], a[1], a[2]),
            Kernel::SiluMul { oss: true } => kernels::oss_glu(a[0], a[1]),
            Kernel::CrossEntropy => kernels::cross_entropy(a[0], a[1]),
            Kernel::Linear => kernels::linear(a[0], a[1], a[2]),
            Kernel::LinearAdd => kernels::linear_add(a[0], a[1], a[2]),
            Kernel::LinearNoBias => kernels::linear_no_bias(a[0], a[1]),
            Kernel::LinearScaled => kernels::linear_scaled(a[0], a[1], a[2]),
            Kernel::ScatterRows { rows } => kernels::scatter_rows(a[0], a[1], rows),
            Kernel::Rotary => kernels::rotary(a[0], a[1], a[2]),
            Kernel::VocabEmbedding { start } => kernels::vocab_embedding(a[0], a[1], start),
            Kernel::VocabCrossEntropy { start } => {
                kernels::vocab_cross_entropy(a[0], a[1], a[2], start)
            }
            Kernel::AttnProbs { .. } | Kernel::TiledAttention { .. } => {
                candle_core::bail!("{k:?} is applied by its attention, not through `kernel`")
            }
            Kernel::Exchange { .. } => {
                candle_core::bail!(
                    "{k:?} is applied by `ranks::expert`'s ops, not through `kernel`"
                )
            }
        }
    }
    fn frozen_linear(&self, w: &FrozenWeight, bias: Option<&Self>) -> Result<Self> {
        self.apply_op1(FrozenLinear {
            weight: w.clone(),
            bias: bias.cloned(),
        })
    }
    fn broadcast_as(&self, dims: &[usize]) -> Result<Self> {
        Tensor::broadcast_as(self, dims)
    }
    fn squeeze(&self, dim: usize) -> Result<Self> {
        Tensor::squeeze(self, dim)
    }
    fn frozen_dense(w: &FrozenWeight, like: &Self) -> Result<Self> {
        w.dense_as(like.dtype(), like.device())
    }
    fn attn_probs(
        q: &Self,
        k: &Self,
        scale: f32,
        causal: bool,
        window: Option<usize>,
    ) -> Result<Self> {
        kernels::attn_probs(q, k, scale, causal, window)
    }
    fn efficient_attention(
        q: &Self,
        k: &Self,
        v: &Self,
        scale: f32,
        causal: bool,
        window: usize,
    ) -> Result<Self> {
        q.apply_op3(
            k,
            v,
            EfficientAttention {
                scale,
                causal,
                window,
            },
        )
    }
    fn tiled_attention(
        q: &Self,
        k: &Self,
        v: &Self,
        scale: f32,
        causal: bool,
        window: usize,
    ) -> Result<Self> {
        super::tiled_attention::attention(q, k, v, scale, causal, window)
    }
    fn permute(&self, order: &[usize]) -> Result<Self> {
        Tensor::permute(self, order)
    }
    fn unsqueeze(&self, dim: usize) -> Result<Self> {
        Tensor::unsqueeze(self, dim)
    }
    fn gather(&self, ids: &Self, dim: usize) -> Result<Self> {
        Tensor::gather(self, ids, dim)
    }
    fn sum_all(&self) -> Result<Self> {
        Tensor::sum_all(self)
    }
    fn index_add(&self, ids: &Self, src: &Self, dim: usize) -> Result<Self> {
        Tensor::index_add(self, ids, src, dim)
    }
    fn cat_owned(parts: &[Self], dim: usize) -> Result<Self> {
        Tensor::cat(parts, dim)
    }
    fn argmax_last(&self) -> Result<Self> {
        self.argmax(candle_core::D::Minus1)
    }
    fn softmax_last(&self) -> Result<Self> {
        candle_nn::ops::softmax_last_dim(self)
    }
    fn release(&self) -> Result<()> {
        kernels::boundary::release(self)
    }
    fn half(&self) -> bool {
        matches!(
            self.dtype(),
            candle_core::DType::F16 | candle_core::DType::BF16
        )
    }
    /// A dense frozen weight is mapped on its own; quantized blocks are kept.
    fn map_frozen(f: &FrozenWeight, _weight: &Self, base: &Map<'_, Self>) -> Result<FrozenWeight> {
        Ok(match f {
            FrozenWeight::Dense(w) => FrozenWeight::Dense(base(w)?),
            q => q.clone(),
        })
    }
}

/// What a backward pass needs of a tensor type beyond the forward: a variable made from a
/// tensor, the backward of a scalar and its gradient store (candle's `backprop`; the replay's
/// symbolic backward).
pub trait Autograd: TensorOps {
    /// A model's variable (candle's `Var`; the replay's variables are tensors).
    type Var;
    type Grads: Default;
    fn var_tensor(v: &Self::Var) -> &Self;
    /// A variable holding a copy of this tensor's values (the tensor itself when it is one:
    /// candle's `Var::from_tensor`).
    fn var_from(&self) -> Result<Self>;
    fn backward(&self) -> Result<Self::Grads>;
    fn take_grad(grads: &mut Self::Grads, of: &Self) -> Option<Self>;
    fn put_grad(grads: &mut Self::Grads, of: &Self, g: Self);
    /// A tensor's identity in a gradient store.
    type Id: Copy;
    fn grad_id(&self) -> Self::Id;
    /// The gradient of the tensor `id`, left in the store.
    fn grad_of(grads: &Self::Grads, id: Self::Id) -> Option<Self>;
    /// The by-block backward's cut: this tensor's storage moved (nothing allocated) into a new
    /// variable of its shape; this one keeps its op (`kernels::boundary::cut`).
    fn cut(&self) -> Result<Self>;
    /// A one-element tensor whose backward hands `grad` to this one
    /// (`kernels::boundary::seed`).
    fn seed(&self, grad: Self) -> Result<Self>;
}

impl Autograd for Tensor {
    type Var = candle_core::Var;
    type Grads = candle_core::backprop::GradStore;
    fn var_tensor(v: &candle_core::Var) -> &Self {
        v.as_tensor()
    }
    fn var_from(&self) -> Result<Self> {
        Ok(candle_core::Var::from_tensor(self)?.as_tensor().clone())
    }
    fn backward(&self) -> Result<Self::Grads> {
        Tensor::backward(self)
    }
    fn take_grad(grads: &mut Self::Grads, of: &Self) -> Option<Self> {
        grads.remove(of)
    }
    fn put_grad(grads: &mut Self::Grads, of: &Self, g: Self) {
        grads.insert(of, g);
    }
    type Id = candle_core::TensorId;
    fn grad_id(&self) -> Self::Id {
        self.id()
    }
    fn grad_of(grads: &Self::Grads, id: Self::Id) -> Option<Self> {
        grads.get_id(id).cloned()
    }
    fn cut(&self) -> Result<Self> {
        super::kernels::boundary::cut(self)
    }
    fn seed(&self, grad: Self) -> Result<Self> {
        super::kernels::boundary::seed(self, grad)
    }
}

/// `c·tanh(x/c)` (Gemma 2's soft-capping of the attention scores and of the logits), x freed
/// once divided. With `release` (transformers' kernels) and a recorded graph, what no backward
/// reads is released once used, as PyTorch saves only the tanh's output: x (the division's
/// backward reads none of it) and x/c (tanh's backward reads its output).
pub fn soft_cap<T: TensorOps>(x: T, c: f64, release: bool) -> Result<T> {
    let scaled = x.affine(1.0 / c, 0.0)?;
    x.release_if(release)?;
    drop(x);
    let t = scaled.tanh()?;
    scaled.release_if(release)?;
    drop(scaled);
    t.affine(c, 0.0)
}

/// `a + b` by PyTorch's type promotion: in the wider type when the two differ (under autocast
/// the f32 residual stream plus a sublayer's 16-bit output is f32). The narrower operand's
/// widened copy lives only for the sum (PyTorch widens in the kernel, without a copy; the
/// difference is a transient): the sum's node holds it, reading none of it, so with a graph it
/// is released once the sum exists. Equal types: `a + b`, nothing more.
pub fn add_promoted<T: TensorOps>(a: &T, b: &T) -> Result<T> {
    if a.same_type(b) {
        return a.add(b);
    }
    let (wide, sum) = if a.half() {
        let wide = a.to_dtype_of(b)?;
        let sum = wide.add(b)?;
        (wide, sum)
    } else {
        let wide = b.to_dtype_of(a)?;
        let sum = a.add(&wide)?;
        (wide, sum)
    };
    wide.release_if(true)?;
    Ok(sum)
}

/// `a + b` ([`add_promoted`]) for a b passed by value that no backward reads (a sublayer's
/// output into the residual stream), freed once the sum exists; widened, it is released too
/// (with a graph its conversion's node holds it, reading none of it).
pub fn add_into<T: TensorOps>(a: &T, b: T) -> Result<T> {
    let sum = add_promoted(a, &b)?;
    b.release_if(!b.same_type(&sum))?;
    Ok(sum)
}

/// candle-nn's `Embedding::forward` (candle-nn 0.11.1): the rows of `table (V, H)` at `ids`,
/// shaped `(ids…, H)`.
pub fn embedding<T: TensorOps>(table: &T, ids: &T) -> Result<T> {
    let mut final_dims = ids.dims();
    final_dims.push(table.dims()[1]);
    let n = final_dims[..final_dims.len() - 1].iter().product();
    let indexes = ids.reshape(&[n])?;
    let values = table.index_select(&indexes, 0)?;
    values.reshape(&final_dims)
}

/// candle-nn's `ops::log_softmax` over the last dimension (candle-nn 0.11.1), composed.
pub fn log_softmax_last<T: TensorOps>(xs: &T) -> Result<T> {
    let max = xs.max_last_keepdim()?;
    let diff = xs.broadcast_sub(&max)?;
    let sum_exp = diff.exp()?.sum_last_keepdim()?;
    diff.broadcast_sub(&sum_exp.log()?)
}

/// candle-nn's `loss::cross_entropy` (candle-nn 0.11.1): the mean negative log-likelihood of
/// `targets (N)` u32 under the log-softmax of `logits (N, V)`.
pub fn cross_entropy<T: TensorOps>(logits: &T, targets: &T) -> Result<T> {
    let n = targets.dims()[0];
    let inp = log_softmax_last(logits)?;
    inp.gather(&targets.unsqueeze(1)?, 1)?
        .sum_all()?
        .affine(-1f64 / n as f64, 0.)
}

/// candle-nn's `ops::softmax` over the last dimension (candle-nn 0.11.1), composed.
pub fn softmax_last<T: TensorOps>(xs: &T) -> Result<T> {
    let max = xs.max_last_keepdim()?;
    let diff = xs.broadcast_sub(&max)?;
    let num = diff.exp()?;
    let den = num.sum_last_keepdim()?;
    num.broadcast_div(&den)
}

/// candle-nn's `ops::layer_norm_slow` (candle-nn 0.11.1), statement for statement: half
/// precision is normalised in f32, f32 and f64 in their own type.
pub fn layer_norm_slow<T: TensorOps>(x: &T, w: &T, b: &T, eps: f32) -> Result<T> {
    let h = *x.dims().last().expect("a norm's input has a dimension") as f64;
    let xf = x.upcast()?;
    let xf = {
        let mean_x = xf.sum_last_keepdim()?.affine(1.0 / h, 0.0)?;
        xf.broadcast_sub(&mean_x)?
    };
    let norm_x = xf.sqr()?.sum_last_keepdim()?.affine(1.0 / h, 0.0)?;
    let x_normed = xf.broadcast_div(&norm_x.affine(1.0, eps as f64)?.sqrt()?)?;
    x_normed.to_dtype_of(x)?.broadcast_mul(w)?.broadcast_add(b)
}

/// candle-nn's `ops::rms_norm_slow` (candle-nn 0.11.1), statement for statement.
pub fn rms_norm_slow<T: TensorOps>(x: &T, w: &T, eps: f32) -> Result<T> {
    let h = *x.dims().last().expect("a norm's input has a dimension") as f64;
    let xf = x.upcast()?;
    let norm_x = xf.sqr()?.sum_last_keepdim()?.affine(1.0 / h, 0.0)?;
    let x_normed = xf.broadcast_div(&norm_x.affine(1.0, eps as f64)?.sqrt()?)?;
    x_normed.to_dtype_of(x)?.broadcast_mul(w)
}

/// candle-nn's `Linear::forward` (candle-nn 0.11.1) with weight `w (out, in)` and an optional
/// bias: a contiguous 3- or 4-d input multiplied as rows, a strided one by a broadcast weight.
pub fn linear<T: TensorOps>(w: &T, b: Option<&T>, x: &T) -> Result<T> {
    let dims = x.dims();
    let y = match *dims.as_slice() {
        [b1, b2, m, k] if x.is_contiguous() => {
            let wt = w.t()?;
            let n = wt.dims()[1];
            x.reshape(&[b1 * b2 * m, k])?
                .matmul(&wt)?
                .reshape(&[b1, b2, m, n])?
        }
        [b1, b2, _, _] => x.matmul(&w.broadcast_left(&[b1, b2])?.t()?)?,
        [bsize, m, k] if x.is_contiguous() => {
            let wt = w.t()?;
            let n = wt.dims()[1];
            x.reshape(&[bsize * m, k])?
                .matmul(&wt)?
                .reshape(&[bsize, m, n])?
        }
        [bsize, _, _] => x.matmul(&w.broadcast_left(&[bsize])?.t()?)?,
        _ => x.matmul(&w.t()?)?,
    };
    match b {
        None => Ok(y),
        Some(b) => y.broadcast_add(b),
    }
}

/// Checks [`linear`] against candle-nn's own `Linear` (the same values, so the same ops).
#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{D, DType, Device, Module};

    /// The embedding and the composed cross-entropy give candle-nn's values.
    #[test]
    fn embedding_and_cross_entropy_are_candle_nns() -> Result<()> {
        let dev = Device::Cpu;
        let table = Tensor::randn(0f32, 1., (7, 3), &dev)?;
        let ids = Tensor::new(&[[1u32, 6, 0], [2, 2, 5]], &dev)?;
        let theirs = candle_nn::Embedding::new(table.clone(), 3).forward(&ids)?;
        let ours = embedding(&table, &ids)?;
        assert_eq!(theirs.dims(), ours.dims());
        assert_eq!(
            theirs.flatten_all()?.to_vec1::<f32>()?,
            ours.flatten_all()?.to_vec1::<f32>()?
        );
        let logits = Tensor::randn(0f32, 1., (6, 7), &dev)?;
        let targets = ids.flatten_all()?;
        let theirs = candle_nn::loss::cross_entropy(&logits, &targets)?;
        let ours = cross_entropy(&logits, &targets)?;
        assert_eq!(theirs.to_scalar::<f32>()?, ours.to_scalar::<f32>()?);
        Ok(())
    }

    #[test]
    fn linear_and_norms_are_candle_nns() -> Result<()> {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1., (5, 4), &dev)?;
        let b = Tensor::randn(0f32, 1., 5, &dev)?;
        let g = Tensor::randn(0f32, 1., 4, &dev)?;
        for x in [
            Tensor::randn(0f32, 1., (2, 3, 4), &dev)?,
            Tensor::randn(0f32, 1., (2, 4, 3), &dev)?.transpose(1, 2)?,
            Tensor::randn(0f32, 1., (2, 2, 3, 4), &dev)?,
            Tensor::randn(0f32, 1., (3, 4), &dev)?,
        ] {
            let theirs = candle_nn::Linear::new(w.clone(), Some(b.clone())).forward(&x)?;
            let ours = linear(&w, Some(&b), &x)?;
            assert_eq!(theirs.dims(), ours.dims());
            let diff = (theirs - ours)?.abs()?.flatten_all()?.max(D::Minus1)?;
            assert!(diff.to_scalar::<f32>()? < 1e-6);
            for dt in [DType::F32, DType::BF16] {
                let x = x.to_dtype(dt)?;
                let (g, b) = (g.to_dtype(dt)?, b.narrow(0, 0, 4)?.to_dtype(dt)?);
                let pairs = [
                    (
                        candle_nn::ops::layer_norm_slow(&x, &g, &b, 1e-5)?,
                        layer_norm_slow(&x, &g, &b, 1e-5)?,
                    ),
                    (
                        candle_nn::ops::rms_norm_slow(&x, &g, 1e-5)?,
                        rms_norm_slow(&x, &g, 1e-5)?,
                    ),
                ];
                for (theirs, ours) in pairs {
                    let d = (theirs.to_dtype(DType::F32)? - ours.to_dtype(DType::F32)?)?;
                    let d = d.abs()?.flatten_all()?.max(D::Minus1)?;
                    assert_eq!(d.to_scalar::<f32>()?, 0.0);
                }
            }
        }
        Ok(())
    }
}
