//! A block's projection: candle-nn's `Linear` (or the fused linear), an optional LoRA adapter,
//! and how LoRA freezes the base ([`LoraBase`], [`LoraTarget`]). The forward is written once
//! over [`TensorOps`]: the model runs it on candle's tensors, the replay on symbolic ones.

use candle_core::{Module, Result, Tensor};
use candle_nn::{Init, VarBuilder};

use super::config::{Config, ProjSpec};
use super::frozen::FrozenWeight;
use super::kernels::Kernel;
pub use super::shapes::{LoraBase, LoraTarget};
use super::tensor_ops::{self, Map, TensorOps};

/// LoRA adapter of a projection: `y += scale · (x·Aᵀ)·Bᵀ`, A `(r, in)` random, B `(out, r)`
/// zero at the start, scale `α/r` with α = r.
#[derive(Debug, Clone)]
pub struct Lora<T = Tensor> {
    pub a: T,
    pub b: T,
    pub scale: f64,
}

/// A projection (candle-nn's `Linear`: weight `(out, in)`, optional bias) with an optional
/// LoRA adapter. Under LoRA with `lora_base` `op`, `q4_0`, `q8_0`, `fp8` or `mxfp4` the base
/// runs as the frozen-linear op instead (`frozen`, what the op holds), and `weight` keeps only
/// what the op does not hold (candle: a 1-element placeholder when quantized).
#[derive(Debug, Clone)]
pub struct Proj<T: TensorOps = Tensor> {
    pub weight: T,
    pub bias: Option<T>,
    pub lora: Option<Lora<T>>,
    pub frozen: Option<T::Frozen>,
    /// Fused kernels: with no frozen base one [`Kernel::Linear`] op (with a bias) or
    /// [`Kernel::LinearNoBias`] (without, on a contiguous input).
    pub fused: bool,
}

impl Proj {
    /// The projection `spec` (`in → out`, with or without bias); an adapter of rank
    /// `cfg.lora_rank` when its target is adapted.
    pub(crate) fn new(spec: &ProjSpec, cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let vb = vb.pp(spec.path.rsplit('.').next().expect("a path"));
        let (inp, out) = (spec.inp, spec.out);
        let r = cfg.adapter_rank(spec.target);
        let lora = if r > 0 {
            Some(Lora {
                a: vb.get_with_hints(
                    (r, inp),
                    "lora_a",
                    Init::Randn {
                        mean: 0.,
                        stdev: 0.02,
                    },
                )?,
                b: vb.get_with_hints((out, r), "lora_b", Init::Const(0.))?,
                scale: 1.0,
            })
        } else {
            None
        };
        let linear = if spec.bias {
            candle_nn::linear(inp, out, vb)?
        } else {
            candle_nn::linear_no_bias(inp, out, vb)?
        };
        let (weight, bias) = (linear.weight().clone(), linear.bias().cloned());
        Ok(Self {
            weight,
            bias,
            lora,
            frozen: None,
            fused: cfg.kernels.fused(),
        })
    }

    /// candle-nn's `Linear` as a projection without adapter (the patch projection, the head),
    /// fused or not.
    pub(crate) fn plain(l: candle_nn::Linear, fused: bool) -> Self {
        Self {
            weight: l.weight().clone(),
            bias: l.bias().cloned(),
            lora: None,
            frozen: None,
            fused,
        }
    }

    /// The projection with its base frozen as `mode` says (adapters untouched).
    pub(crate) fn freeze(&self, mode: LoraBase) -> Result<Self> {
        let bias = self.bias.as_ref().map(|b| b.detach());
        let weight = self.weight.detach();
        let frozen = match mode {
            LoraBase::Detach => None,
            LoraBase::Op => Some(FrozenWeight::Dense(weight.clone())),
            LoraBase::Fp8 => Some(FrozenWeight::quantize_fp8(&weight)?),
            LoraBase::Mxfp4 => Some(FrozenWeight::quantize_mxfp4(&weight)?),
            q => Some(FrozenWeight::quantize(
                &weight,
                q.ggml().expect("the other bases are dense"),
            )?),
        };
        // A quantized projection keeps no dense weight: a 1-element placeholder stands in.
        let weight = if mode.quantized() {
            Tensor::zeros(1, weight.dtype(), weight.device())?
        } else {
            weight
        };
        Ok(Self {
            weight,
            bias,
            lora: self.lora.clone(),
            frozen,
            fused: self.fused,
        })
    }
}

impl<T: TensorOps> Proj<T> {
    /// A copy with `base` on the weight, the bias and a frozen base's weight, and `adapter` on
    /// LoRA's A and B.
    pub(crate) fn map(&self, base: &Map<'_, T>, adapter: &Map<'_, T>) -> Result<Self> {
        let weight = base(&self.weight)?;
        Ok(Self {
            bias: self.bias.as_ref().map(base).transpose()?,
            lora: match &self.lora {
                None => None,
                Some(l) => Some(Lora {
                    a: adapter(&l.a)?,
                    b: adapter(&l.b)?,
                    scale: l.scale,
                }),
            },
            frozen: match &self.frozen {
                None => None,
                Some(f) => Some(T::map_frozen(f, &weight, base)?),
            },
            weight,
            fused: self.fused,
        })
    }

    /// `x·Wᵀ (+ b)`, or the frozen-linear op on x's rows, plus `scale·(x·Aᵀ)·Bᵀ` with an
    /// adapter. An input of another type than a dense weight's is cast to it first, as
    /// autocast casts a linear's f32 input (each projection its own copy, which its matmul
    /// keeps; under mixed precision with transformers' kernels the residual stream and the norms
    /// are f32, the projections 16-bit).
    pub fn forward(&self, x: &T) -> Result<T> {
        if self.casts(x) {
            return self.forward(&x.to_dtype_of(&self.weight)?);
        }
        let y = match &self.frozen {
            None => dense(&self.weight, self.bias.as_ref(), self.fused, x)?,
            Some(w) => {
                let y = rows(x)?.frozen_linear(w, self.bias.as_ref())?;
                let out = y.dims()[1];
                y.reshape(&out_dims(x, out))?
            }
        };
        match &self.lora {
            None => Ok(y),
            Some(l) => {
                let down = rows(x)?.matmul(&l.a.t()?)?;
                let up = down
                    .matmul(&l.b.t()?)?
                    .reshape(&out_dims(x, l.b.dims()[0]))?;
                // `y + (up * scale)`: both operands by value.
                let scaled = up.affine(l.scale, 0.0)?;
                drop(up);
                let sum = y.add(&scaled)?;
                drop((y, scaled));
                Ok(sum)
            }
        }
    }

    /// Whether [`Proj::forward`] casts `x` to its dense weight's type (autocast's f32 input to
    /// a 16-bit projection): then no backward reads x itself.
    pub fn casts(&self, x: &T) -> bool {
        self.frozen.is_none() && !x.same_type(&self.weight)
    }

    /// `residual + self.forward(&h)`, freeing h and `input` (the sublayer's input, which the
    /// caller no longer needs) before the sum is made. With fused kernels, a dense projection
    /// without bias or adapter (contiguous operands) is one op ([`Kernel::LinearAdd`]): its
    /// own output never exists, so the graph does not keep it; any other projection's output
    /// is released once summed (the sum's node holds it only to route the gradient, and
    /// PyTorch's add saves nothing). The composed set keeps it, as candle's `add` does.
    pub fn forward_add(&self, h: T, input: T, residual: &T) -> Result<T> {
        if self.adds_in_place()
            && h.is_contiguous()
            && residual.is_contiguous()
            && h.same_type(&self.weight)
            && residual.same_type(&self.weight)
        {
            drop(input);
            return T::kernel(Kernel::LinearAdd, &[&h, &self.weight, residual]);
        }
        let y = self.forward(&h)?;
        drop((h, input));
        let sum = tensor_ops::add_promoted(residual, &y)?;
        y.release_if(self.fused || !y.same_type(&sum))?;
        Ok(sum)
    }

    /// `self.forward(&h) ⊙ s` for `h (n, in)` and `s (n, 1)` (a routed expert's output times
    /// its routing weight), h freed before the product is scaled. With fused kernels, a dense
    /// projection without bias or adapter on a contiguous h is one op
    /// ([`Kernel::LinearScaled`]): the unscaled product is never kept.
    pub fn forward_scaled(&self, h: T, s: &T) -> Result<T> {
        if self.adds_in_place() && h.is_contiguous() {
            return T::kernel(Kernel::LinearScaled, &[&h, &self.weight, s]);
        }
        let y = self.forward(&h)?;
        drop(h);
        y.broadcast_mul(s)
    }

    /// Fused kernels, a dense weight, no bias, no adapter: [`Proj::forward_add`]'s and
    /// [`Proj::forward_scaled`]'s one op.
    fn adds_in_place(&self) -> bool {
        self.fused && self.frozen.is_none() && self.lora.is_none() && self.bias.is_none()
    }
}

impl Module for Proj {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Proj::<Tensor>::forward(self, x)
    }
}

/// A dense linear layer `x·wᵀ (+ b)`: with fused kernels one op ([`Kernel::Linear`] with a
/// bias, [`Kernel::LinearNoBias`] without, on a contiguous input), else candle-nn's `Linear`
/// ([`tensor_ops::linear`]). The block projections and the LM head.
pub(crate) fn dense<T: TensorOps>(w: &T, b: Option<&T>, fused: bool, x: &T) -> Result<T> {
    match b {
        Some(b) if fused => T::kernel(Kernel::Linear, &[x, w, b]),
        None if fused && x.is_contiguous() => T::kernel(Kernel::LinearNoBias, &[x, w]),
        _ => tensor_ops::linear(w, b, x),
    }
}

/// `x (…, in)` as rows `(N, in)` (a view when contiguous): `(B, S, H)` in the blocks,
/// `(n_e, H)` in an expert.
fn rows<T: TensorOps>(x: &T) -> Result<T> {
    let dims = x.dims();
    let inp = *dims
        .last()
        .expect("a projection's input has a last dimension");
    x.reshape(&[dims.iter().product::<usize>() / inp, inp])
}

/// `x`'s leading dimensions with `out` last.
fn out_dims<T: TensorOps>(x: &T, out: usize) -> Vec<usize> {
    let mut d = x.dims();
    *d.last_mut()
        .expect("a projection's input has a last dimension") = out;
    d
}
