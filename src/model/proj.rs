//! A block's projection: candle-nn's `Linear` (or the fused linear), an optional LoRA adapter,
//! and how LoRA freezes the base ([`LoraBase`], [`LoraTarget`]).

use candle_core::{Module, Result, Tensor};
use candle_nn::{Init, Linear, VarBuilder, linear, linear_no_bias};

use super::config::{Config, ProjSpec};
use super::frozen::{FrozenLinear, FrozenWeight};
use super::kernels;
pub use super::shapes::{LoraBase, LoraTarget};

/// LoRA adapter of a projection: `y += scale · (x·Aᵀ)·Bᵀ`, A `(r, in)` random, B `(out, r)`
/// zero at the start, scale `α/r` with α = r.
#[derive(Debug, Clone)]
pub struct Lora {
    pub a: Tensor,
    pub b: Tensor,
    pub scale: f64,
}

/// A projection (candle-nn `Linear`) with an optional LoRA adapter. Under LoRA with
/// `lora_base` `op`, `q4_0` or `q8_0` the base runs as a [`FrozenLinear`] instead (`frozen`),
/// and `linear` keeps only what the op does not hold.
#[derive(Debug, Clone)]
pub struct Proj {
    pub linear: Linear,
    pub lora: Option<Lora>,
    pub frozen: Option<FrozenWeight>,
    /// Fused kernels: with no frozen base one [`kernels::linear`] op (with a bias) or
    /// [`kernels::linear_no_bias`] (without, on a contiguous input).
    pub fused: bool,
}

impl Proj {
    /// The projection `spec` (`in → out`, with or without bias); an adapter of rank
    /// `cfg.lora_rank` when its target is adapted.
    pub(crate) fn new(spec: &ProjSpec, cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let vb = vb.pp(spec.path.rsplit('.').next().expect("a path"));
        let (inp, out) = (spec.inp, spec.out);
        let lora = if cfg.lora_rank > 0 && cfg.lora_targets.contains(&spec.target) {
            let r = cfg.lora_rank;
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
            linear(inp, out, vb)?
        } else {
            linear_no_bias(inp, out, vb)?
        };
        Ok(Self {
            linear,
            lora,
            frozen: None,
            fused: cfg.kernels.fused(),
        })
    }
    /// A copy with `base` applied to the weight and bias and `adapter` to A and B.
    pub(crate) fn map(
        &self,
        base: &dyn Fn(&Tensor) -> Result<Tensor>,
        adapter: &dyn Fn(&Tensor) -> Result<Tensor>,
    ) -> Result<Self> {
        Ok(Self {
            linear: Linear::new(
                base(self.linear.weight())?,
                self.linear.bias().map(base).transpose()?,
            ),
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
                Some(FrozenWeight::Dense(w)) => Some(FrozenWeight::Dense(base(w)?)),
                Some(q) => Some(q.clone()),
            },
            fused: self.fused,
        })
    }

    /// The projection with its base frozen as `mode` says (adapters untouched).
    pub(crate) fn freeze(&self, mode: LoraBase) -> Result<Self> {
        let bias = self.linear.bias().map(|b| b.detach());
        let weight = self.linear.weight().detach();
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
            linear: Linear::new(weight, bias),
            lora: self.lora.clone(),
            frozen,
            fused: self.fused,
        })
    }
}

impl Proj {
    /// `residual + self.forward(&h)`, freeing h and `input` (the sublayer's input, which the
    /// caller no longer needs) before the sum is made. With fused kernels, a dense projection
    /// without bias or adapter (contiguous operands) is one op ([`kernels::linear_add`]): its
    /// own output never exists, so the graph does not keep it.
    pub fn forward_add(&self, h: Tensor, input: Tensor, residual: &Tensor) -> Result<Tensor> {
        if self.adds_in_place() && h.is_contiguous() && residual.is_contiguous() {
            drop(input);
            return kernels::linear_add(&h, self.linear.weight(), residual);
        }
        let y = self.forward(&h)?;
        drop((h, input));
        residual + y
    }

    /// `self.forward(&h) ⊙ s` for `h (n, in)` and `s (n, 1)` (a routed expert's output times
    /// its routing weight), h freed before the product is scaled. With fused kernels, a dense
    /// projection without bias or adapter on a contiguous h is one op
    /// ([`kernels::linear_scaled`]): the unscaled product is never kept.
    pub fn forward_scaled(&self, h: Tensor, s: &Tensor) -> Result<Tensor> {
        if self.adds_in_place() && h.is_contiguous() {
            return kernels::linear_scaled(&h, self.linear.weight(), s);
        }
        let y = self.forward(&h)?;
        drop(h);
        y.broadcast_mul(s)
    }

    /// Fused kernels, a dense weight, no bias, no adapter: [`Proj::forward_add`]'s and
    /// [`Proj::forward_scaled`]'s one op.
    fn adds_in_place(&self) -> bool {
        self.fused && self.frozen.is_none() && self.lora.is_none() && self.linear.bias().is_none()
    }
}

impl Module for Proj {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match &self.frozen {
            None => dense(&self.linear, self.fused, x)?,
            Some(w) => {
                let op = FrozenLinear {
                    weight: w.clone(),
                    bias: self.linear.bias().cloned(),
                };
                let y = rows(x)?.apply_op1(op)?;
                let out = y.dim(1)?;
                y.reshape(out_dims(x, out)?)?
            }
        };
        match &self.lora {
            None => Ok(y),
            Some(l) => {
                let down = rows(x)?.matmul(&l.a.t()?)?;
                let up = down.matmul(&l.b.t()?)?.reshape(out_dims(x, l.b.dim(0)?)?)?;
                y + (up * l.scale)?
            }
        }
    }
}

/// A dense linear layer: with fused kernels one op ([`kernels::linear`] with a bias,
/// [`kernels::linear_no_bias`] without, on a contiguous input), else candle-nn's `Linear`.
/// The block projections and the LM head.
pub(crate) fn dense(linear: &Linear, fused: bool, x: &Tensor) -> Result<Tensor> {
    match linear.bias() {
        Some(b) if fused => kernels::linear(x, linear.weight(), b),
        None if fused && x.is_contiguous() => kernels::linear_no_bias(x, linear.weight()),
        _ => linear.forward(x),
    }
}

/// `x (…, in)` as rows `(N, in)` (a view when contiguous): `(B, S, H)` in the blocks,
/// `(n_e, H)` in an expert.
fn rows(x: &Tensor) -> Result<Tensor> {
    let inp = x.dim(candle_core::D::Minus1)?;
    x.reshape((x.elem_count() / inp, inp))
}

/// `x`'s leading dimensions with `out` last.
fn out_dims(x: &Tensor, out: usize) -> Result<Vec<usize>> {
    let mut d = x.dims().to_vec();
    *d.last_mut()
        .expect("a projection's input has a last dimension") = out;
    Ok(d)
}
