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
/// with `ops::rms_norm_slow`, which has a backward; `ops::rms_norm` has none).
#[derive(Debug, Clone)]
pub enum Norm {
    Layer(LayerNorm),
    Rms {
        weight: Tensor,
        eps: f64,
        fused: bool,
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
            Some(_) => Ok(Norm::Rms {
                weight: vb.get_with_hints(cfg.hidden, "weight", Init::Const(1.0))?,
                eps: cfg.layer_norm_eps,
                fused: cfg.kernels.fused(),
            }),
        }
    }

    /// An RMSNorm over `size` (Qwen3's q/k norms over a head).
    pub fn rms(size: usize, cfg: &Config, vb: VarBuilder) -> Result<Self> {
        Ok(Norm::Rms {
            weight: vb.get_with_hints(size, "weight", Init::Const(1.0))?,
            eps: cfg.layer_norm_eps,
            fused: cfg.kernels.fused(),
        })
    }

    /// An RMSNorm over `size` with its own epsilon (MLA's inner norms).
    pub fn rms_eps(size: usize, eps: f64, fused: bool, vb: VarBuilder) -> Result<Self> {
        Ok(Norm::Rms {
            weight: vb.get_with_hints(size, "weight", Init::Const(1.0))?,
            eps,
            fused,
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
            Norm::Rms { weight, eps, fused } => Norm::Rms {
                weight: f(weight)?,
                eps: *eps,
                fused: *fused,
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
                fused: true,
            } => kernels::rms_norm(x, weight, *eps as f32),
            Norm::Rms { weight, eps, .. } => ops::rms_norm_slow(x, weight, *eps as f32),
        }
    }
}
