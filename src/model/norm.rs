//! The blocks' normalisation: LayerNorm (GPT, ViT) or RMSNorm (LLaMA), composed from candle's
//! `*_slow` ops or fused ([`super::kernels`]). Written once over [`TensorOps`]: the model runs
//! it on candle's tensors, the replay on symbolic ones.

use candle_core::{Module, Result, Tensor};
use candle_nn::Init;

use super::config::Config;
use super::kernels::Kernel;
use super::tensor_ops::{self, TensorOps};
use super::weights::Weights;

/// The block's normalisation: LayerNorm with weight and bias (GPT, ViT: `layer_norm_slow`,
/// which has a backward; `LayerNorm::forward` has none) or RMSNorm (LLaMA: weight only,
/// `rms_norm_slow`; `ops::rms_norm` has no backward), or with `fused` one kernel. Gemma's
/// RMSNorm (`offset`) scales by `1 + w`: the sum is made at each call (a fresh `(n)` tensor,
/// freed when the call returns; in training the graph keeps it) and its weight starts at 0.
#[derive(Debug, Clone)]
pub enum Norm<T = Tensor> {
    Layer {
        weight: T,
        bias: T,
        eps: f64,
        fused: bool,
    },
    Rms {
        weight: T,
        eps: f64,
        fused: bool,
        offset: bool,
        /// Fused as transformers' `LlamaRMSNorm` runs (`Kernels::Transformers`): the
        /// normalisation in f32 holding x's f32 copy ([`Kernel::RmsNormalise`]), then the
        /// weight product in x's type as a recorded op, which keeps the normalised value.
        torch: bool,
    },
}

impl<T: TensorOps> Norm<T> {
    /// The block's norm: LayerNorm (GPT, ViT) or RMSNorm (LLaMA) over the hidden size.
    pub fn new<W: Weights<Tensor = T>>(cfg: &Config, w: &W) -> Result<Self> {
        match cfg.llama {
            None => Ok(Norm::Layer {
                weight: w.weight(&[cfg.hidden], "weight", Init::Const(1.0))?,
                bias: w.weight(&[cfg.hidden], "bias", Init::Const(0.0))?,
                eps: cfg.layer_norm_eps,
                fused: cfg.kernels.fused(),
            }),
            Some(_) => Self::rms(cfg.hidden, cfg, w),
        }
    }

    /// An RMSNorm over `size` (the blocks', Qwen3's and Gemma's q/k norms over a head), with
    /// Gemma's `1 + w` in a Gemma.
    pub fn rms<W: Weights<Tensor = T>>(size: usize, cfg: &Config, w: &W) -> Result<Self> {
        let offset = cfg.llama.is_some_and(|l| l.variant.unit_offset_norms);
        let init = Init::Const(if offset { 0.0 } else { 1.0 });
        Ok(Norm::Rms {
            weight: w.weight(&[size], "weight", init)?,
            eps: cfg.layer_norm_eps,
            fused: cfg.kernels.fused(),
            offset,
            torch: cfg.kernels.torch(),
        })
    }

    /// An RMSNorm over `size` with its own epsilon (MLA's inner norms), kernels as `cfg`'s.
    pub fn rms_eps<W: Weights<Tensor = T>>(
        size: usize,
        eps: f64,
        cfg: &Config,
        w: &W,
    ) -> Result<Self> {
        Ok(Norm::Rms {
            weight: w.weight(&[size], "weight", Init::Const(1.0))?,
            eps,
            fused: cfg.kernels.fused(),
            offset: false,
            torch: cfg.kernels.torch(),
        })
    }

    /// Fused as transformers runs it ([`Norm::Rms`]'s `torch`): its output is a fresh tensor
    /// that no backward of its own reads.
    pub fn torch(&self) -> bool {
        matches!(
            self,
            Norm::Rms {
                fused: true,
                torch: true,
                ..
            }
        )
    }

    /// Whether it keeps a 16-bit input's f32 copy instead of reading the input in its
    /// backward (the caller may then release the input once nothing else reads it).
    pub fn holds_f32_copy(&self, x: &T) -> bool {
        self.torch() && x.half()
    }
}

impl<T: TensorOps> Norm<T> {
    /// A copy with `f` applied to the weight (and bias).
    pub(crate) fn map<U>(&self, f: &dyn Fn(&T) -> Result<U>) -> Result<Norm<U>> {
        Ok(match self {
            Norm::Layer {
                weight,
                bias,
                eps,
                fused,
            } => Norm::Layer {
                weight: f(weight)?,
                bias: f(bias)?,
                eps: *eps,
                fused: *fused,
            },
            Norm::Rms {
                weight,
                eps,
                fused,
                offset,
                torch,
            } => Norm::Rms {
                weight: f(weight)?,
                eps: *eps,
                fused: *fused,
                offset: *offset,
                torch: *torch,
            },
        })
    }

    /// The weight, and LayerNorm's bias.
    pub fn weights(&self) -> Vec<&T> {
        match self {
            Norm::Layer { weight, bias, .. } => vec![weight, bias],
            Norm::Rms { weight, .. } => vec![weight],
        }
    }

    /// The normalised `x`, over its last dimension.
    pub fn forward(&self, x: &T) -> Result<T> {
        match self {
            Norm::Layer {
                weight,
                bias,
                eps,
                fused,
            } => {
                let eps = *eps as f32;
                if *fused {
                    T::kernel(Kernel::LayerNorm { eps }, &[x, weight, bias])
                } else {
                    tensor_ops::layer_norm_slow(x, weight, bias, eps)
                }
            }
            Norm::Rms {
                weight,
                eps,
                fused,
                offset,
                torch,
            } => {
                // Gemma: `1 + w`, made first and freed when the norm returns.
                let plus_one = if *offset {
                    Some(weight.affine(1.0, 1.0)?)
                } else {
                    None
                };
                let w = plus_one.as_ref().unwrap_or(weight);
                let eps = *eps as f32;
                if *fused && *torch && *offset {
                    // Gemma's `(_norm(x.float()) * (1.0 + weight.float())).type_as(x)`: the f32
                    // copy (held by the norm op) and the normalised f32 value (held by the
                    // product) kept; the f32 product, read by no backward, released once cast.
                    let x32 = x.to_f32()?;
                    let ones = unit_weight(&x32.detach())?;
                    let n32 = T::kernel(Kernel::RmsNorm { eps }, &[&x32, &ones])?;
                    drop((x32, ones));
                    let w32 = w.to_f32()?;
                    let o32 = n32.broadcast_mul(&w32)?;
                    drop((n32, w32));
                    let out = o32.to_dtype_of(x)?;
                    o32.release_if(x.half())?;
                    Ok(out)
                } else if *fused && *torch {
                    // `hidden_states.to(float32)` (a 16-bit x's f32 copy, held), normalised,
                    // `.to(input_dtype)`, then `weight * …` in x's type (under autocast an f32
                    // weight times a 16-bit x: the weight cast, its `(n)` copy the only
                    // difference from PyTorch's promoted product, whose f32 output the next
                    // projection casts back).
                    let h = {
                        let xd = x.detach();
                        let x32 = xd.upcast()?;
                        let ones = unit_weight(&xd)?;
                        T::kernel(Kernel::RmsNormalise { eps }, &[x, &ones, &x32])?
                    };
                    h.broadcast_mul(&w.to_dtype_of(&h)?)
                } else if *fused {
                    T::kernel(Kernel::RmsNorm { eps }, &[x, w])
                } else {
                    tensor_ops::rms_norm_slow(x, w, eps)
                }
            }
        }
    }
}

/// A `(H)` of ones in x's type, H x's last dimension: the weight of a normalisation alone
/// (made as zeros, then set: two allocations, the first freed at once).
pub(crate) fn unit_weight<T: TensorOps>(x: &T) -> Result<T> {
    let n = *x.dims().last().expect("a dimension");
    x.zeros(&[n])?.affine(0.0, 1.0)
}

impl Module for Norm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Norm::<Tensor>::forward(self, x)
    }
}
