//! Fused kernels with a backward: what a PyTorch user's autograd runs, written for candle.
//!
//! candle 0.11.1's fused ops (`candle_nn::ops::{rms_norm, layer_norm, softmax_last_dim}`) have
//! no backward, so memfit's `composed` models build every norm, softmax, activation and loss
//! from elementary ops, and candle's graph keeps every intermediate of them until the backward
//! ends. `--kernels fused` replaces each with one op ([`Kernel`]) whose graph node keeps only
//! its inputs and its output, which is what PyTorch's autograd nodes save:
//!
//! | kernel | args → output | kept for backward (besides args/output the model keeps anyway) |
//! |---|---|---|
//! | [`layer_norm`] | x `(…, H)`, w, b `(H)` → `(…, H)` | nothing (PyTorch: mean, rstd `(…)`) |
//! | [`rms_norm`] | x `(…, H)`, w `(H)` → `(…, H)` | nothing (PyTorch: rstd `(…)`) |
//! | [`gelu`] (tanh) | x → gelu(x) | x |
//! | [`silu_mul`] (SwiGLU) | gate, up → silu(gate)·up | gate, up |
//! | [`oss_glu`] (gpt-oss) | gate, up → (clamp(up, ±7) + 1)·g·σ(1.702·g), g = min(gate, 7) | gate, up |
//! | [`attn_probs`] | q `(B, A, Sq, D)`, k `(B, A, Sk, D)` → softmax(q·kᵀ·scale + causal) | the probabilities only: no scores, no mask, no mask gradient |
//! | [`cross_entropy`] | logits `(N, V)`, targets `(N)` → mean loss `()` | the logits |
//! | [`rotary`] | x `(B, n, S, D)`, cos, sin `(S, D/2)` → x rotated ("rotate half") | x (no halves, products or `cat`; no gradient for the tables) |
//! | [`linear`] (with bias) | x `(…, in)`, w `(out, in)`, b `(out)` → `x·wᵀ + b` | x (no separate product and bias sum) |
//! | [`linear_no_bias`] | x `(…, in)`, w `(out, in)` → `x·wᵀ` | x (the backward writes `dx`, `dw` once: no placeholder and sum per matmul, transpose and reshape arm) |
//! | [`linear_scaled`] (a routed expert's down projection) | h `(n, in)`, w `(out, in)`, s `(n, 1)` → `(h·wᵀ) ⊙ s` | h, s (not the unscaled product) |
//! | [`scatter_rows`] (the experts' combine) | y `(k·T, H)`, ids `(k·T)` → `(T, H)` | y, ids (no `(T, H)` zeros kept) |
//! | [`linear_add`] (no bias, into the residual) | h `(…, in)`, w `(out, in)`, x `(…, out)` → `x + h·wᵀ` | h, x (the projection's own output never exists) |
//!
//! The statistics (mean, rstd, row maxima and sums) are recomputed in the backward rather than
//! saved: they are `O(rows)`, which is below what the allocator can tell apart from metadata.
//!
//! Forward: a CPU kernel per op for f32, f16 and bf16 (`cpu.rs`), allocating only its output
//! ([`attn_probs`]: the `q·kᵀ` product through candle's own gemm, then the scale, mask and
//! softmax in place). On CUDA, [`gelu`] and [`silu_mul`] run candle's own element-wise kernels
//! and the others memfit's (`fused.cu`, launched from `cuda.rs`), allocating the same outputs
//! (the cross-entropy also keeps its `N` row losses in f32 between two launches).
//!
//! Backward: [`Kernel::backward`], composed of ordinary candle ops on detached tensors (so it
//! runs on every device, and its temporaries die at the end of their statements instead of
//! living inside the accumulated gradients). It is generic over [`Graph`], so the replay
//! (`formula::replay`) predicts it by running the same function on symbolic tensors.

pub(crate) mod act;
mod attn;
pub mod boundary;
pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
pub mod graph;
mod held;
mod linear;
mod loss;
mod norm;
mod rotary;
mod scatter;
pub(crate) mod simd;
pub mod tiled;
mod vocab;

pub use act::{gelu, oss_glu, silu_mul, silu_mul_holding};
pub use attn::attn_probs;
pub use graph::Graph;
pub use linear::{linear, linear_add, linear_no_bias, linear_scaled};
pub use loss::{cross_entropy, cross_entropy_f32};
pub use norm::{layer_norm, rms_norm, rms_normalise};
pub use rotary::rotary;
pub use scatter::scatter_rows;
pub(crate) use vocab::{VocabCeGradOp, VocabRowsGradOp};
pub use vocab::{vocab_cross_entropy, vocab_embedding};

use candle_core::{Result, Tensor};
use serde::{Deserialize, Serialize};

/// Which implementation of the norms, softmax, activations and loss a model uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kernels {
    /// candle's stock composed ops (what a candle user gets from `candle_nn::ops::*_slow`,
    /// `ops::softmax`, `loss::cross_entropy`): every intermediate is a graph node.
    #[default]
    Composed,
    /// memfit's fused kernels of this module, lean: each node keeps only its inputs and its
    /// output (what Liger-style fused RMSNorm and SwiGLU kernels keep).
    Fused,
    /// The fused kernels keeping what PyTorch + transformers' autograd keeps
    /// (`scripts/torch_saved.py` counts it): RMSNorm's f32 copy of a 16-bit input and its
    /// normalised value ([`Kernel::RmsNormalise`], the weight product a recorded op), the
    /// SiLU output of SwiGLU ([`silu_mul`] with a third, held arg), the loss's f32
    /// log-probabilities ([`Kernel::CrossEntropyF32`]), and nothing of a tensor no backward
    /// reads: the rotary op's input and a 16-bit norm's input (the residual stream, raw q/k)
    /// are released once used ([`crate::model::tensor_ops::TensorOps::release`]).
    Transformers,
}

impl Kernels {
    pub const NAMES: &'static str = "transformers, fused, composed";

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "transformers" => Some(Self::Transformers),
            "fused" => Some(Self::Fused),
            "composed" => Some(Self::Composed),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Transformers => "transformers",
            Self::Fused => "fused",
            Self::Composed => "composed",
        }
    }

    /// One op per norm, activation, softmax and loss (lean or as transformers keeps).
    pub fn fused(self) -> bool {
        self != Self::Composed
    }

    /// Keeps what transformers keeps ([`Kernels::Transformers`]).
    pub fn torch(self) -> bool {
        self == Self::Transformers
    }
}

/// A fused kernel: its parameters; [`Kernel::backward`] is its gradient.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kernel {
    /// args x, w, b.
    LayerNorm { eps: f32 },
    /// args x, w.
    RmsNorm { eps: f32 },
    /// GELU with the tanh approximation (candle's `gelu`); arg x.
    Gelu,
    /// `silu(gate)·up` (with `oss`, gpt-oss's clamped GLU, [`oss_glu`]); args gate, up.
    SiluMul { oss: bool },
    /// `softmax(q·kᵀ·scale + mask)`; args q, k. With `causal`, query `i` of `Sq` sees keys
    /// `0..=i + Sk − Sq`.
    AttnProbs {
        scale: f32,
        causal: bool,
        /// A sliding window: query `i` sees only its last `window` keys (itself included);
        /// 0 for none.
        window: usize,
    },
    /// Mean cross-entropy of logits `(N, V)` against targets `(N)` u32.
    CrossEntropy,
    /// [`Kernel::CrossEntropy`] as transformers' `ForCausalLMLoss` runs it (`logits.float()`,
    /// then `log_softmax` and `nll_loss`): args logits, targets and the f32 log-probabilities
    /// `(N, V)` (held, no gradient), from which the backward works in f32, converting the
    /// logits' gradient to their type last.
    CrossEntropyF32,
    /// transformers' RMSNorm before its weight product: `x·rsqrt(mean(x²) + eps)` in x's
    /// type, computed in f32; args x, a `(H)` of ones in x's type, and x in f32 (held: a 16-bit
    /// x's f32 copy, which the backward reads; an f32 x itself).
    RmsNormalise { eps: f32 },
    /// `x·wᵀ + b`; args x, w, b.
    Linear,
    /// `x + h·wᵀ` (a projection without bias into the residual stream); args h, w, x.
    LinearAdd,
    /// `x·wᵀ`; args x, w.
    LinearNoBias,
    /// `(h·wᵀ) ⊙ s` with `s (n, 1)`; args h, w, s.
    LinearScaled,
    /// Rows of y `(n, H)` added into a `(rows, H)` zeros at `ids (n)`; args y, ids.
    ScatterRows { rows: usize },
    /// Expert parallelism's exchange of rows between ranks (`ranks::expert`; the replay's
    /// model of its candle ops, which hold the exchange's plan): arg `(n, cols)`, output
    /// `(rows, cols)`, a host buffer of `temp` rows held while the rows are reordered; the
    /// backward the exchange the other way, `(back_rows, cols)` beside `back_temp` rows.
    Exchange {
        rows: usize,
        temp: usize,
        back_rows: usize,
        back_temp: usize,
    },
    /// The rotary embedding; args x and the tables cos, sin `(S, D/2)` (no gradient).
    Rotary,
    /// The tiled attention of [`crate::model::tiled_attention`]; args q, k, v and the
    /// forward's `lse` (kept by the node, no gradient), output `(B, S, A, Dv)`; `window` as in
    /// `AttnProbs`.
    TiledAttention {
        scale: f32,
        causal: bool,
        window: usize,
    },
    /// Megatron's vocab-parallel lookup ([`vocab_embedding`]): args the rank's rows of the
    /// table `(rows, H)` (the vocabulary's from `start`) and ids `(n)` u32 → `(n, H)`, zeros
    /// where another rank holds the token.
    VocabEmbedding { start: usize },
    /// This rank's part of the vocab-parallel mean loss ([`vocab_cross_entropy`]): args the
    /// rank's logits `(N, rows)`, targets `(N)` u32 and the whole vocabulary's log-sum-exp
    /// `(N, 1)` (no gradient) → a scalar.
    VocabCrossEntropy { start: usize },
}

/// `√(2/π)` and the cubic coefficient of the tanh GELU.
const GELU_C: f64 = 0.797_884_560_802_865_4;
const GELU_A: f64 = 0.044_715;

impl Kernel {
    pub fn name(&self) -> &'static str {
        match self {
            Kernel::LayerNorm { .. } => "fused-layer-norm",
            Kernel::RmsNorm { .. } => "fused-rms-norm",
            Kernel::Gelu => "fused-gelu",
            Kernel::SiluMul { oss: false } => "fused-silu-mul",
            Kernel::SiluMul { oss: true } => "fused-oss-glu",
            Kernel::AttnProbs { .. } => "fused-attn-probs",
            Kernel::CrossEntropy => "fused-cross-entropy",
            Kernel::CrossEntropyF32 => "torch-cross-entropy",
            Kernel::RmsNormalise { .. } => "torch-rms-normalise",
            Kernel::Linear => "fused-linear",
            Kernel::LinearAdd => "fused-linear-add",
            Kernel::LinearNoBias => "fused-linear-no-bias",
            Kernel::LinearScaled => "fused-linear-scaled",
            Kernel::ScatterRows { .. } => "fused-scatter-rows",
            Kernel::Exchange { .. } => "ep-exchange",
            Kernel::Rotary => "fused-rotary",
            Kernel::TiledAttention { .. } => "tiled-attention",
            Kernel::VocabEmbedding { .. } => "tp-vocab-embedding",
            Kernel::VocabCrossEntropy { .. } => "tp-vocab-cross-entropy",
        }
    }

    /// [`Kernel::backward`] for a `CustomOp1`'s `bwd`: the first arg's gradient.
    pub fn backward1(
        &self,
        args: &[&Tensor],
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<Option<Tensor>> {
        Ok(self.backward(args, res, grad)?.into_iter().next().flatten())
    }

    /// [`Kernel::backward`] for a `CustomOp2`'s `bwd`: the first two args' gradients.
    #[allow(clippy::type_complexity)]
    pub fn backward2(
        &self,
        args: &[&Tensor],
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let mut g = self.backward(args, res, grad)?.into_iter();
        Ok((g.next().flatten(), g.next().flatten()))
    }

    /// [`Kernel::backward`] for a `CustomOp3`'s `bwd`: the first three args' gradients.
    #[allow(clippy::type_complexity)]
    pub fn backward3(
        &self,
        args: &[&Tensor],
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let mut g = self.backward(args, res, grad)?.into_iter();
        Ok((g.next().flatten(), g.next().flatten(), g.next().flatten()))
    }

    /// The gradients of the args (in their order; `None` for the integer targets) from the
    /// output `res` and its gradient `grad`. Works on detached copies of the args: nothing it
    /// computes is recorded, and each temporary is freed at the end of its statement.
    pub fn backward<G: Graph>(&self, args: &[&G], res: &G, grad: &G) -> Result<Vec<Option<G>>> {
        match *self {
            Kernel::LayerNorm { eps } => norm_bwd(args, grad, eps, true),
            Kernel::RmsNorm { eps } => norm_bwd(args, grad, eps, false),
            Kernel::Gelu => gelu_bwd(args[0], grad),
            Kernel::SiluMul { oss } => silu_mul_bwd(args[0], args[1], grad, oss),
            Kernel::AttnProbs { scale, .. } => attn_probs_bwd(args[0], args[1], res, grad, scale),
            Kernel::CrossEntropy => cross_entropy_bwd(args[0], args[1], grad),
            Kernel::CrossEntropyF32 => cross_entropy_f32_bwd(args[0], args[1], args[2], grad),
            Kernel::RmsNormalise { eps } => rms_normalise_bwd(args[0], args[1], args[2], grad, eps),
            Kernel::Linear => linear_bwd(args[0], args[1], args[2], grad),
            Kernel::LinearAdd => linear_add_bwd(args[0], args[1], grad),
            Kernel::LinearScaled => linear_scaled_bwd(args[0], args[1], args[2], grad),
            Kernel::ScatterRows { .. } => {
                Ok(vec![Some(grad.index_select(&args[1].detach(), 0)?), None])
            }
            Kernel::Exchange {
                back_rows,
                back_temp,
                ..
            } => {
                // The reordering buffer, then the rows that come back (candle's op: two host
                // vectors, the second kept as the gradient's storage).
                let cols = grad.dims()[1];
                let temp = grad.zeros(&[back_temp, cols])?;
                let out = grad.zeros(&[back_rows, cols])?;
                drop(temp);
                Ok(vec![Some(out)])
            }
            Kernel::LinearNoBias => {
                let (dx, dw, g) = product_bwd(args[0], args[1], grad)?;
                drop(g);
                Ok(vec![Some(dx), dw])
            }
            Kernel::Rotary => rotary_bwd(args[1], args[2], grad),
            Kernel::VocabEmbedding { start } => {
                let rows = args[0].dims()[0];
                let dt = G::vocab_rows_grad(grad, &args[1].detach(), rows, start)?;
                Ok(vec![Some(dt), None])
            }
            Kernel::VocabCrossEntropy { start } => {
                let (x, t, lse) = (args[0].detach(), args[1].detach(), args[2].detach());
                Ok(vec![
                    Some(G::vocab_ce_grad(&x, &t, &lse, grad, start)?),
                    None,
                    None,
                ])
            }
            Kernel::TiledAttention {
                scale,
                causal,
                window,
            } => {
                // The output and its gradient `(B, S, A, Dv)`, read as `(B, A, S, Dv)` views.
                let (dq, dk, dv) = tiled::backward(
                    &args[0].detach(),
                    &args[1].detach(),
                    &args[2].detach(),
                    &res.detach().transpose(1, 2)?,
                    args[3],
                    &grad.transpose(1, 2)?,
                    scale as f64,
                    causal,
                    window,
                )?;
                Ok(vec![Some(dq), Some(dk), Some(dv), None])
            }
        }
    }
}

/// `dx = g·gelu'(x)` in one pass ([`Graph::gelu_grad`]).
fn gelu_bwd<G: Graph>(arg: &G, grad: &G) -> Result<Vec<Option<G>>> {
    Ok(vec![Some(G::gelu_grad(&arg.detach(), grad)?)])
}

/// A norm's `dx`, `dw` (and `db`) in one op ([`Graph::norm_grad`]).
fn norm_bwd<G: Graph>(args: &[&G], grad: &G, eps: f32, centre: bool) -> Result<Vec<Option<G>>> {
    let (dx, dw, db) = G::norm_grad(&args[0].detach(), &args[1].detach(), grad, eps, centre)?;
    let mut out = vec![Some(dx), Some(dw)];
    if centre {
        out.push(db);
    }
    Ok(out)
}

/// `d/d gate = up·σ(gate)·(1 + gate·(1 − σ(gate)))·g`, `d/d up = silu(gate)·g`, in f32 per
/// element, in one pass ([`Graph::silu_mul_grad`]: one `(2, …)` allocation in the inputs'
/// type, where a composition of tensor ops held seven f32 tensors of the input's size at once).
fn silu_mul_bwd<G: Graph>(gate: &G, up: &G, grad: &G, oss: bool) -> Result<Vec<Option<G>>> {
    let (dg, du) = G::silu_mul_grad(&gate.detach(), &up.detach(), grad, oss)?;
    Ok(vec![Some(dg), Some(du)])
}

/// `dS = P·(dP − Σ_row dP·P)`, `dq = dS·k·scale`, `dk = dSᵀ·q·scale`, in the probabilities'
/// type (masked entries have `P = 0`, so they get no gradient). With grouped keys `(B, G, Sk,
/// D)`, `P` and `dS` are `(B, G, r·Sq, Sk)` and q is read the same way, so `dk` sums its
/// query heads.
fn attn_probs_bwd<G: Graph>(q: &G, k: &G, res: &G, grad: &G, scale: f32) -> Result<Vec<Option<G>>> {
    let p = res.detach();
    let gp = grad.mul(&p)?;
    let r = gp.sum_last_keepdim()?;
    drop(gp);
    let t = grad.broadcast_sub(&r)?;
    drop(r);
    let ds = t.mul(&p)?;
    drop((t, p));
    let scale = scale as f64;
    // Grouped-query attention: `dS` is `(B, G, r·Sq, Sk)`, q read the same way (a view).
    let qd = q.dims();
    let dq = ds.matmul(&k.detach())?.affine(scale, 0.0)?.reshape(&qd)?;
    let q = q
        .detach()
        .reshape(&[ds.dims()[0], ds.dims()[1], ds.dims()[2], qd[3]])?;
    let dk = ds.t()?.matmul(&q)?.affine(scale, 0.0)?;
    drop((ds, q));
    Ok(vec![Some(dq), Some(dk)])
}

/// `dlogits = (softmax(logits) − onehot(targets))·g/N`, in the logits' type.
fn cross_entropy_bwd<G: Graph>(logits: &G, targets: &G, grad: &G) -> Result<Vec<Option<G>>> {
    let x = logits.detach();
    let n = x.dims()[0] as f64;
    let m = x.max_last_keepdim()?;
    let e = x.broadcast_sub(&m)?.exp()?;
    drop(m);
    let z = e.sum_last_keepdim()?;
    let p = e.broadcast_div(&z)?;
    drop((e, z));
    let d = p.minus_one_at(&targets.detach())?;
    let gs = grad.affine(1.0 / n, 0.0)?;
    let dx = d.broadcast_mul(&gs)?;
    drop((d, gs));
    Ok(vec![Some(dx), None])
}

/// From the held f32 log-probabilities `lp`: `p = exp(lp)` (f32), −1 at the targets in place,
/// times `g/N`, then converted to the logits' type (PyTorch's `NllLossBackward` →
/// `LogSoftmaxBackward` → `ToCopyBackward`: at its highest the logits, `lp` and two f32
/// `(N, V)`, as here).
fn cross_entropy_f32_bwd<G: Graph>(
    logits: &G,
    targets: &G,
    lp: &G,
    grad: &G,
) -> Result<Vec<Option<G>>> {
    let n = lp.dims()[0] as f64;
    let p = lp.detach().exp()?.minus_one_at(&targets.detach())?;
    let gs = grad.to_dtype_of(lp)?.affine(1.0 / n, 0.0)?;
    let d = p.broadcast_mul(&gs)?;
    drop((p, gs));
    let dx = d.to_dtype_of(logits)?;
    drop(d);
    Ok(vec![Some(dx), None, None])
}

/// The normalisation's `dx` from the held f32 input: the norm's gradient in f32 against a
/// unit weight ([`Graph::norm_grad`]), converted to x's type (for an f32 x, no conversion).
fn rms_normalise_bwd<G: Graph>(
    x: &G,
    ones: &G,
    x32: &G,
    grad: &G,
    eps: f32,
) -> Result<Vec<Option<G>>> {
    let (g, w) = (grad.to_dtype_of(x32)?, ones.detach().to_dtype_of(x32)?);
    let (dx, dw, _) = G::norm_grad(&x32.detach(), &w, &g, eps, false)?;
    drop((dw, g, w));
    let out = dx.to_dtype_of(x)?;
    drop(dx);
    Ok(vec![Some(out), None, None])
}

/// `dx = g·w`, `dw = gᵀ·x`, `db = Σ_rows g`, with x and g seen as `(rows, ·)` matrices; no
/// `dw`, `db` for a frozen (untracked) weight and bias (LoRA's detached base).
fn linear_bwd<G: Graph>(x: &G, w: &G, b: &G, grad: &G) -> Result<Vec<Option<G>>> {
    let (dx, dw, g) = product_bwd(x, w, grad)?;
    let db = if b.tracked() {
        Some(g.sum_leading()?)
    } else {
        None
    };
    Ok(vec![Some(dx), dw, db])
}

/// `dh = g·w`, `dw = gᵀ·h` (none for a frozen weight), `dx = g` itself, of `x + h·wᵀ`.
fn linear_add_bwd<G: Graph>(h: &G, w: &G, grad: &G) -> Result<Vec<Option<G>>> {
    let (dh, dw, g) = product_bwd(h, w, grad)?;
    drop(g);
    Ok(vec![Some(dh), dw, Some(grad.clone())])
}

/// `ds = Σ_row g ⊙ (h·wᵀ)` (the product recomputed), then `dh`, `dw` of `h·wᵀ` against
/// `g ⊙ s`, of `(h·wᵀ) ⊙ s`.
fn linear_scaled_bwd<G: Graph>(h: &G, w: &G, s: &G, grad: &G) -> Result<Vec<Option<G>>> {
    let ds = if s.tracked() {
        let y = h.detach().matmul(&w.detach().t()?)?;
        let gy = grad.mul(&y)?;
        drop(y);
        Some(gy.sum_last_keepdim()?)
    } else {
        None
    };
    let gs = grad.broadcast_mul(&s.detach())?;
    let (dh, dw, g) = product_bwd(h, w, &gs)?;
    drop((g, gs));
    Ok(vec![Some(dh), dw, ds])
}

/// The gradients of `x·wᵀ`: `dx = g·w`, `dw = gᵀ·x` (`None` when w is untracked), and g as
/// `(rows, out)`.
fn product_bwd<G: Graph>(x: &G, w: &G, grad: &G) -> Result<(G, Option<G>, G)> {
    let dims = x.dims();
    let (inp, out) = (dims[dims.len() - 1], w.dims()[0]);
    let rows = dims.iter().product::<usize>() / inp.max(1);
    let g = grad.reshape(&[rows, out])?;
    let dx = g.matmul(&w.detach())?.reshape(&dims)?;
    let dw = if w.tracked() {
        let x2 = x.detach().reshape(&[rows, inp])?;
        Some(g.t()?.matmul(&x2)?)
    } else {
        None
    };
    Ok((dx, dw, g))
}

/// The rotation by −θ: `[g₁·cos + g₂·sin, g₂·cos − g₁·sin]` (the tables get no gradient).
fn rotary_bwd<G: Graph>(cos: &G, sin: &G, grad: &G) -> Result<Vec<Option<G>>> {
    let h = *grad.dims().last().expect("a dimension") / 2;
    let (c, s) = (cos.detach(), sin.detach());
    let (g1, g2) = (grad.narrow(3, 0, h)?, grad.narrow(3, h, h)?);
    let (a, b) = (g1.broadcast_mul(&c)?, g2.broadcast_mul(&s)?);
    let r1 = a.add(&b)?;
    drop((a, b));
    let (a, b) = (g2.broadcast_mul(&c)?, g1.broadcast_mul(&s)?);
    let r2 = a.sub(&b)?;
    drop((a, b));
    let dx = G::cat(&[&r1, &r2], 3)?;
    Ok(vec![Some(dx), None, None])
}
