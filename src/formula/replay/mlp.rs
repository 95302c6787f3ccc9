//! Mirror of `model::mlp`: GPT's GELU MLP and LLaMA's SwiGLU, composed or fused.

use super::proj::Linear;
use crate::formula::symbolic::Sym;
use crate::model::kernels::Kernel;
pub(super) use crate::model::mlp::Glu;

/// GPT's `fc2(gelu(fc1(x)))` or LLaMA's `down(silu(gate(x)) · up(x))`.
pub(super) enum Mlp {
    Gelu {
        fc1: Linear,
        fc2: Linear,
        fused: bool,
    },
    SwiGlu {
        gate: Linear,
        up: Linear,
        down: Linear,
        fused: bool,
        /// The gate's activation.
        act: Glu,
    },
}

impl Mlp {
    /// Mirror of the model's `Mlp::hidden`.
    fn hidden(&self, x: &Sym) -> (Sym, &Linear) {
        match self {
            Mlp::Gelu {
                fc1,
                fc2,
                fused: true,
            } => {
                let y = fc1.forward(x);
                (Sym::kernel(Kernel::Gelu, &[&y], y.dims(), y.dtype()), fc2)
            }
            Mlp::Gelu { fc1, fc2, .. } => (fc1.forward(x).gelu(), fc2),
            // Mirror of the model's one-op GLUs.
            Mlp::SwiGlu {
                gate,
                up,
                down,
                fused,
                act,
            } if act.one_op(*fused) => {
                let g = gate.forward(x);
                let u = up.forward(x);
                let k = Kernel::SiluMul {
                    oss: *act == Glu::Oss,
                };
                let m = Sym::kernel(k, &[&g, &u], g.dims(), g.dtype());
                drop((g, u));
                (m, down)
            }
            Mlp::SwiGlu {
                gate,
                up,
                down,
                fused: true,
                act: Glu::Gelu,
            } => {
                let g = gate.forward(x);
                let u = up.forward(x);
                let a = Sym::kernel(Kernel::Gelu, &[&g], g.dims(), g.dtype());
                drop(g);
                let m = a.mul(&u);
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
                let g = gate.forward(x).gelu();
                let u = up.forward(x);
                let m = g.mul(&u);
                drop((g, u));
                (m, down)
            }
            Mlp::SwiGlu { gate, up, down, .. } => {
                let g = gate.forward(x).silu();
                let u = up.forward(x);
                let m = g.mul(&u);
                drop((g, u));
                (m, down)
            }
        }
    }

    pub(super) fn forward(&self, x: &Sym) -> Sym {
        let (a, out) = self.hidden(x);
        out.forward(&a)
    }

    /// Mirror of the model's `Mlp::forward_scaled`.
    pub(super) fn forward_scaled(&self, x: Sym, s: &Sym) -> Sym {
        let (a, out) = self.hidden(&x);
        drop(x);
        out.forward_scaled(a, s)
    }

    /// Mirror of the model's `Mlp::forward_add`.
    pub(super) fn forward_add(&self, x: Sym, residual: &Sym) -> Sym {
        let (a, out) = self.hidden(&x);
        out.forward_add(a, x, residual)
    }

    pub(super) fn linears(&self) -> Vec<&Linear> {
        match self {
            Mlp::Gelu { fc1, fc2, .. } => vec![fc1, fc2],
            Mlp::SwiGlu { gate, up, down, .. } => vec![gate, up, down],
        }
    }

    pub(super) fn map(&self, f: &dyn Fn(&Linear) -> Linear) -> Self {
        match self {
            Mlp::Gelu { fc1, fc2, fused } => Mlp::Gelu {
                fc1: f(fc1),
                fc2: f(fc2),
                fused: *fused,
            },
            Mlp::SwiGlu {
                gate,
                up,
                down,
                fused,
                act,
            } => Mlp::SwiGlu {
                gate: f(gate),
                up: f(up),
                down: f(down),
                fused: *fused,
                act: *act,
            },
        }
    }
}
