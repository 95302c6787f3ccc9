//! The blocks' normalisation: LayerNorm (GPT, ViT) or RMSNorm (LLaMA), composed from candle's
//! `*_slow` ops or fused ([`super::kernels`]).

use candle_core::{Module, Result, Tensor};
use candle_nn::{Init, VarBuilder, ops};

use super::config::Config;
use super::kernels;

/// LayerNorm with weight and bias, computed with `ops::layer_norm_slow` (which has a backward).
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Tensor,
    bias: Tensor,
    eps: f64,
    /// [`kernels::layer_norm`] instead of `layer_norm_slow`.
    fused: bool,
}

impl LayerNorm {
    pub fn new(size: usize, eps: f64, fused: bool, vb: VarBuilder) -> Result<Self> {
        let weight = vb.get_with_hints(size, "weight", Init::Const(1.0))?;
        let bias = vb.get_with_hints(size, "bias", Init::Const(0.0))?;
        Ok(Self {
            weight,
            bias,
            eps,
            fused,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.fused {
            return kernels::layer_norm(x, &self.weight, &self.bias, self.eps as f32);
        }
        ops::layer_norm_slow(x, &self.weight, &self.bias, self.eps as f32)
    }
}

/// The block's normalisation: LayerNorm (GPT, ViT) or RMSNorm (LLaMA: weight only, computed
/// with `ops::rms_norm_slow`, which has a backward; `ops::rms_norm` has none). Gemma's RMSNorm
/// (`offset`) scales by `1 + w`: the sum is made at each call (a fresh `(n)` tensor, freed
/// when the call returns; in training the graph keeps it) and its weight starts at 0.
#[derive(Debug, Clone)]
pub enum Norm {
    Layer(LayerNorm),
    Rms {
        weight: Tensor,
        eps: f64,
        fused: bool,
        offset: bool,
    },
}

impl Norm {
    pub fn new(cfg: &Config, vb: VarBuilder) -> Result<Self> {
        match cfg.llama {
            None => Ok(Norm::Layer(LayerNorm::new(
                cfg.hidden,
                cfg.layer_norm_eps,
                cfg.kernels.fused(),
                vb,
            )?)),
            Some(_) => Self::rms(cfg.hidden, cfg, vb),
        }
    }

    /// An RMSNorm over `size` (the blocks', Qwen3's and Gemma's q/k norms over a head), with
    /// Gemma's `1 + w` in a Gemma.
    pub fn rms(size: usize, cfg: &Config, vb: VarBuilder) -> Result<Self> {
        let offset = cfg.llama.is_some_and(|l| l.gemma.is_some());
        let init = Init::Const(if offset { 0.0 } else { 1.0 });
        Ok(Norm::Rms {
            weight: vb.get_with_hints(size, "weight", init)?,
            eps: cfg.layer_norm_eps,
            fused: cfg.kernels.fused(),
            offset,
        })
    }

    /// An RMSNorm over `size` with its own epsilon (MLA's inner norms).
    pub fn rms_eps(size: usize, eps: f64, fused: bool, vb: VarBuilder) -> Result<Self> {
        Ok(Norm::Rms {
            weight: vb.get_with_hints(size, "weight", Init::Const(1.0))?,
            eps,
            fused,
            offset: false,
        })
    }

    pub(crate) fn map(&self, f: &dyn Fn(&Tensor) -> Result<Tensor>) -> Result<Self> {
        Ok(match self {
            Norm::Layer(l) => Norm::Layer(LayerNorm {
                weight: f(&l.weight)?,
                bias: f(&l.bias)?,
                eps: l.eps,
                fused: l.fused,
            }),
            Norm::Rms {
                weight,
                eps,
                fused,
                offset,
            } => Norm::Rms {
                weight: f(weight)?,
                eps: *eps,
                fused: *fused,
                offset: *offset,
            },
        })
    }
}

impl Module for Norm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Norm::Layer(l) => l.forward(x),
            Norm::Rms {
                weight,
                eps,
                fused,
                offset,
            } => {
                // Gemma: `1 + w`, made first and freed when the norm returns.
                let plus_one = if *offset {
                    Some(weight.affine(1.0, 1.0)?)
                } else {
                    None
                };
                let w = plus_one.as_ref().unwrap_or(weight);
                if *fused {
                    kernels::rms_norm(x, w, *eps as f32)
                } else {
                    ops::rms_norm_slow(x, w, *eps as f32)
                }
            }
        }
    }
}
