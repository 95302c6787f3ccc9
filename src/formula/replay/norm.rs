//! Mirror of `model::norm`: LayerNorm and RMSNorm, composed or fused.

use super::Params;
use crate::formula::symbolic::{DType, Sym};
use crate::model::kernels::Kernel;

/// `layer_norm_slow` with weight and bias (GPT, ViT), or `rms_norm_slow` with a weight
/// (LLaMA), over the last dimension.
///
/// Fused (`model::kernels`): one op on x and the weights (its `eps` does not change memory).
/// Gemma's RMSNorm (`offset`) makes `1 + w` first, freed when the norm returns.
pub(super) enum Norm {
    Layer {
        weight: Sym,
        bias: Sym,
        fused: bool,
    },
    Rms {
        weight: Sym,
        fused: bool,
        offset: bool,
    },
}

impl Norm {
    pub(super) fn new(p: &Params, h: usize, rms: bool) -> Self {
        Self::with_offset(p, h, rms, false)
    }

    /// [`Norm::new`]; an RMSNorm with `offset` scales by `1 + w` (Gemma).
    pub(super) fn with_offset(p: &Params, h: usize, rms: bool, offset: bool) -> Self {
        if rms {
            Norm::Rms {
                weight: p.tensor(&[h]),
                fused: p.fused,
                offset,
            }
        } else {
            Norm::Layer {
                weight: p.tensor(&[h]),
                bias: p.tensor(&[h]),
                fused: p.fused,
            }
        }
    }

    pub(super) fn map(&self, f: &dyn Fn(&Sym) -> Sym) -> Self {
        match self {
            Norm::Layer {
                weight,
                bias,
                fused,
            } => Norm::Layer {
                weight: f(weight),
                bias: f(bias),
                fused: *fused,
            },
            Norm::Rms {
                weight,
                fused,
                offset,
            } => Norm::Rms {
                weight: f(weight),
                fused: *fused,
                offset: *offset,
            },
        }
    }

    pub(super) fn weights(&self) -> Vec<Sym> {
        match self {
            Norm::Layer { weight, bias, .. } => vec![weight.clone(), bias.clone()],
            Norm::Rms { weight, .. } => vec![weight.clone()],
        }
    }

    pub(super) fn forward(&self, x: &Sym) -> Sym {
        if let Norm::Rms {
            weight,
            fused,
            offset: true,
        } = self
        {
            // Gemma: `weight.affine(1, 1)`, freed when the norm returns.
            let plus_one = Norm::Rms {
                weight: weight.affine(1.0),
                fused: *fused,
                offset: false,
            };
            return plus_one.forward(x);
        }
        match self {
            Norm::Layer {
                weight,
                bias,
                fused: true,
            } => {
                let k = Kernel::LayerNorm { eps: 0.0 };
                return Sym::kernel(k, &[x, weight, bias], x.dims(), x.dtype());
            }
            Norm::Rms {
                weight,
                fused: true,
                ..
            } => {
                let k = Kernel::RmsNorm { eps: 0.0 };
                return Sym::kernel(k, &[x, weight], x.dims(), x.dtype());
            }
            _ => {}
        }
        let last = x.dims().len() - 1;
        let x_dtype = x.dtype();
        // Half-precision input is normalised in f32.
        let x = x.to_dtype(DType::F32);
        match self {
            Norm::Layer { weight, bias, .. } => {
                let x = {
                    let mean_x = x.sum_keepdim(&[last]).affine(1.0);
                    x.broadcast_sub(&mean_x)
                };
                let norm_x = x.sqr().sum_keepdim(&[last]).affine(1.0);
                let x_normed = x.broadcast_div(&norm_x.affine(1.0).sqrt());
                x_normed
                    .to_dtype(x_dtype)
                    .broadcast_mul(weight)
                    .broadcast_add(bias)
            }
            Norm::Rms { weight, .. } => {
                // `(x.sqr()?.sum_keepdim(D::Minus1)? / h)?`, then `x / (norm_x + eps).sqrt()`.
                let norm_x = x.sqr().sum_keepdim(&[last]).affine(1.0);
                let x_normed = x.broadcast_div(&norm_x.affine(1.0).sqrt());
                x_normed.to_dtype(x_dtype).broadcast_mul(weight)
            }
        }
    }
}
