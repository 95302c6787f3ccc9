//! The position-wise MLP: GPT's tanh-GELU MLP, LLaMA's SwiGLU or Gemma's GeGLU, composed or
//! fused. Written once over [`TensorOps`]: the model runs it on candle's tensors, the replay on
//! symbolic ones.

use candle_core::{Module, Result, Tensor};

use super::config::{Config, ProjSpec};
use super::kernels::Kernel;
use super::proj::Proj;
use super::shapes::Llama;
use super::tensor_ops::{Map, TensorOps};
use super::weights::Weights;

/// Position-wise MLP: GPT's `fc2(gelu(fc1(x)))` (width 4H, GELU with the tanh approximation)
/// or LLaMA's SwiGLU `down(silu(gate(x)) · up(x))` (width I); with `gelu`, Gemma's GeGLU
/// `down(gelu_tanh(gate(x)) · up(x))` (fused: the GELU kernel, then the product).
#[derive(Debug, Clone)]
pub enum Mlp<T: TensorOps = Tensor> {
    Gelu {
        fc1: Proj<T>,
        fc2: Proj<T>,
        fused: bool,
    },
    SwiGlu {
        gate: Proj<T>,
        up: Proj<T>,
        down: Proj<T>,
        fused: bool,
        /// The gate's activation.
        act: Glu,
        /// Fused SwiGLU holding `silu(gate)` too, as transformers' autograd keeps it
        /// (`Kernels::Transformers`).
        torch: bool,
    },
}

/// A gated MLP's activation: LLaMA's SwiGLU, Gemma's GeGLU (tanh GELU), gpt-oss's clamped
/// SwiGLU ([`kernels::oss_glu`], one op with either kernel set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Glu {
    Silu,
    Gelu,
    Oss,
}

impl Glu {
    /// The activation of a LLaMA-family model's gated MLPs (SiLU outside Gemma and gpt-oss).
    pub fn of(llama: Option<&Llama>) -> Self {
        match llama {
            Some(l) if l.variant.gelu_glu => Glu::Gelu,
            Some(l) if l.variant.clamped_glu => Glu::Oss,
            _ => Glu::Silu,
        }
    }

    /// Whether the MLP's activation is one op on gate and up: gpt-oss's clamped GLU (with
    /// either kernel set), or SwiGLU with fused kernels.
    pub fn one_op(self, fused: bool) -> bool {
        self == Glu::Oss || (fused && self == Glu::Silu)
    }
}

impl<T: TensorOps> Mlp<T> {
    /// `projs` are the block's MLP projections (fc1, fc2 or gate, up, down).
    pub(crate) fn new<W: Weights<Tensor = T>>(
        cfg: &Config,
        projs: &[ProjSpec],
        w: &W,
    ) -> Result<Self> {
        let p = |i: usize| w.proj(&projs[i], cfg);
        let fused = cfg.kernels.fused();
        Ok(match projs.len() {
            2 => Mlp::Gelu {
                fc1: p(0)?,
                fc2: p(1)?,
                fused,
            },
            _ => Mlp::SwiGlu {
                gate: p(0)?,
                up: p(1)?,
                down: p(2)?,
                fused,
                act: Glu::of(cfg.llama.as_ref()),
                torch: cfg.kernels.torch(),
            },
        })
    }
}

impl Mlp {
    pub(crate) fn projs_mut(&mut self) -> Vec<&mut Proj> {
        match self {
            Mlp::Gelu { fc1, fc2, .. } => vec![fc1, fc2],
            Mlp::SwiGlu { gate, up, down, .. } => vec![gate, up, down],
        }
    }
}

impl<T: TensorOps> Mlp<T> {
    /// A copy with `base` applied to the weights and biases and `adapter` to LoRA's A and B.
    pub(crate) fn map(&self, base: &Map<'_, T>, adapter: &Map<'_, T>) -> Result<Self> {
        self.map_projs(&|p| p.map(base, adapter))
    }

    /// The projection reading the input first (fc1, or gate: up reads it too, of one type).
    pub fn input_proj(&self) -> &Proj<T> {
        match self {
            Mlp::Gelu { fc1, .. } => fc1,
            Mlp::SwiGlu { gate, .. } => gate,
        }
    }

    /// The projections (fc1, fc2 or gate, up, down).
    pub fn projs(&self) -> Vec<&Proj<T>> {
        match self {
            Mlp::Gelu { fc1, fc2, .. } => vec![fc1, fc2],
            Mlp::SwiGlu { gate, up, down, .. } => vec![gate, up, down],
        }
    }

    /// A copy with `f` applied to each projection.
    pub fn map_projs<U: TensorOps>(
        &self,
        f: &dyn Fn(&Proj<T>) -> Result<Proj<U>>,
    ) -> Result<Mlp<U>> {
        Ok(match self {
            Mlp::Gelu { fc1, fc2, fused } => Mlp::Gelu {
                fc1: f(fc1)?,
                fc2: f(fc2)?,
                fused: *fused,
            },
            Mlp::SwiGlu {
                gate,
                up,
                down,
                fused,
                act,
                torch,
            } => Mlp::SwiGlu {
                gate: f(gate)?,
                up: f(up)?,
                down: f(down)?,
                fused: *fused,
                act: *act,
                torch: *torch,
            },
        })
    }
}

impl<T: TensorOps> Mlp<T> {
    /// The hidden activation of `x` and the projection that brings it back to `H` (fc2 or
    /// down).
    fn hidden(&self, x: &T) -> Result<(T, &Proj<T>)> {
        Ok(match self {
            Mlp::Gelu {
                fc1,
                fc2,
                fused: true,
            } => (T::kernel(Kernel::Gelu, &[&fc1.forward(x)?])?, fc2),
            Mlp::Gelu { fc1, fc2, .. } => (fc1.forward(x)?.gelu()?, fc2),
            // One op on gate and up: gpt-oss's clamped GLU (with either kernel set), or the
            // fused SwiGLU.
            Mlp::SwiGlu {
                gate,
                up,
                down,
                fused,
                act,
                torch,
            } if act.one_op(*fused) => {
                let g = gate.forward(x)?;
                let u = up.forward(x)?;
                let oss = *act == Glu::Oss;
                let m = if *torch && !oss {
                    // transformers' `act_fn(gate(x)) * up(x)` keeps the SiLU output too.
                    let s = g.detach().silu()?;
                    T::kernel(Kernel::SiluMul { oss }, &[&g, &u, &s])?
                } else {
                    T::kernel(Kernel::SiluMul { oss }, &[&g, &u])?
                };
                drop((g, u));
                (m, down)
            }
            Mlp::SwiGlu {
                gate,
                up,
                down,
                fused: true,
                act: Glu::Gelu,
                ..
            } => {
                let g = gate.forward(x)?;
                let u = up.forward(x)?;
                let a = T::kernel(Kernel::Gelu, &[&g])?;
                drop(g);
                let m = a.mul(&u)?;
                drop((a, u));
                (m, down)
            }
            Mlp::SwiGlu {
                gate,
                up,
                down,
                act: Glu::Gelu,
                ..
            } => {
                let g = gate.forward(x)?.gelu()?;
                let u = up.forward(x)?;
                let m = g.mul(&u)?;
                drop((g, u));
                (m, down)
            }
            Mlp::SwiGlu { gate, up, down, .. } => {
                let g = gate.forward(x)?.silu()?;
                let u = up.forward(x)?;
                let m = g.mul(&u)?;
                drop((g, u));
                (m, down)
            }
        })
    }

    /// `self.forward(x) ⊙ s`, `s (n, 1)` ([`Proj::forward_scaled`]): a routed expert's output
    /// times its routing weights; x freed once the hidden activation exists. As transformers
    /// runs it (`torch`), the output and the product are two recorded ops, the product keeping
    /// the output (`current_hidden_states * routing_weights`), in the expert's type.
    pub fn forward_scaled(&self, x: T, s: &T) -> Result<T> {
        let (a, out) = self.hidden(&x)?;
        // Autocast: the expert's f32 rows, cast by gate and up each, are read by no backward
        // (x is the expert's own gathered copy).
        x.release_if(self.input_proj().casts(&x))?;
        drop(x);
        if matches!(self, Mlp::SwiGlu { torch: true, .. }) {
            let y = out.forward(&a)?;
            drop(a);
            return y.broadcast_mul(&s.to_dtype_of(&y)?);
        }
        out.forward_scaled(a, s)
    }

    /// `residual + self.forward(&x)` ([`Proj::forward_add`]), x freed before the sum.
    pub fn forward_add(&self, x: T, residual: &T) -> Result<T> {
        let (a, out) = self.hidden(&x)?;
        out.forward_add(a, x, residual)
    }

    /// The MLP of `x`.
    pub fn forward(&self, x: &T) -> Result<T> {
        let (a, out) = self.hidden(x)?;
        out.forward(&a)
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Mlp::<Tensor>::forward(self, x)
    }
}
