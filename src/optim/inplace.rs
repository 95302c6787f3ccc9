//! Optimizer steps that update in place, as PyTorch's `foreach`/`fused` optimizers do: the
//! state and the weights are rewritten through candle's in-place ops (`InplaceOp2/3`), so a
//! step allocates nothing but, for a gradient that is not contiguous, one contiguous copy of
//! it. candle-nn's own AdamW builds each update from unfused tensor ops (14 tensors the size of
//! the largest parameter at its peak) and its SGD from two.
//!
//! Per parameter θ with gradient g (f32 arithmetic, stored in θ's type):
//! - `sgd`: `θ ← θ − lr·g`;
//! - `sgd-momentum`: `v ← μ·v + g`, `θ ← θ − lr·v` (state `v`, as `sgd_momentum`);
//! - `adam`/`adamw`: `m ← β₁m + (1−β₁)g`, `v ← β₂v + (1−β₂)g²`,
//!   `θ ← θ·(1 − lr·λ) − lr·m̂/(√v̂ + ε)` with `m̂ = m/(1−β₁ᵗ)`, `v̂ = v/(1−β₂ᵗ)` — candle-nn's
//!   AdamW exactly, in three passes (m, v, θ).
//!
//! The state tensors are `zeros` of θ's shape and type, as candle's optimizers make theirs
//! (plain tensors here, not `Var`s: 251 B of bookkeeping each instead of 272); only the step's
//! temporaries go.
//! CPU loops here; on CUDA the same updates run as `memfit_axpby` and `memfit_adam_update`
//! (`model/kernels/fused.cu`). The runner uses these with `kernels = fused`.

use candle_core::backprop::GradStore;
use candle_core::{CpuStorage, InplaceOp2, InplaceOp3, Layout, Result, Tensor, Var, bail};
use candle_nn::ParamsAdamW;

use crate::model::kernels::cpu::{Float, slice};
use crate::step::OptimizerKind;

/// The update rule.
#[derive(Debug, Clone, Copy)]
enum Rule {
    Sgd,
    Momentum {
        mu: f64,
    },
    AdamW {
        beta1: f64,
        beta2: f64,
        eps: f64,
        wd: f64,
    },
}

/// Host bytes of the optimizer's per-tensor slot (the `Var` and its two optional state
/// tensors), beside the state's own data and bookkeeping.
pub const SLOT_BYTES: u64 = std::mem::size_of::<Slot>() as u64;

/// Bookkeeping per state tensor (`Tensor::zeros`: the `Arc`'d tensor, its shape and strides,
/// the storage's lock and vector header), measured: 251 B (fit over 1–5 blocks of an odd GPT,
/// within 18 B).
pub const STATE_META_PER_TENSOR: u64 = 251;

/// Host bytes per entry of the list of trainable `Var`s the optimizer is built from (freed once
/// the slots exist).
pub const VAR_BYTES: u64 = std::mem::size_of::<Var>() as u64;

/// One parameter and its state.
struct Slot {
    var: Var,
    m: Option<Tensor>,
    v: Option<Tensor>,
}

/// The update rule of an optimizer kind with its learning rate: one parameter's (or one
/// contiguous view's) step, given its gradient and state. [`InPlace`] steps every parameter
/// with it; a ZeRO rank (`crate::ranks::zero`) steps its shard of each.
#[derive(Debug, Clone, Copy)]
pub struct Stepper {
    rule: Rule,
    lr: f64,
}

impl Stepper {
    /// `kind` with learning rate `lr` (AdamW's other settings candle-nn's defaults; `adam`
    /// without weight decay; momentum 0.9 as `sgd_momentum`); `adamw-8bit` is an error (it
    /// has its own step).
    pub fn new(kind: OptimizerKind, lr: f64) -> Result<Self> {
        let d = ParamsAdamW::default();
        let rule = match kind {
            OptimizerKind::Sgd => Rule::Sgd,
            OptimizerKind::SgdMomentum => Rule::Momentum {
                mu: super::sgd_momentum::Params::default().momentum,
            },
            OptimizerKind::Adam | OptimizerKind::Adamw => Rule::AdamW {
                beta1: d.beta1,
                beta2: d.beta2,
                eps: d.eps,
                wd: if kind == OptimizerKind::Adam {
                    0.0
                } else {
                    d.weight_decay
                },
            },
            OptimizerKind::Adamw8bit => bail!("adamw-8bit has no in-place step here"),
        };
        Ok(Self { rule, lr })
    }

    /// Which state tensors the rule keeps: (first moment or velocity, second moment).
    pub fn state(&self) -> (bool, bool) {
        match self.rule {
            Rule::Sgd => (false, false),
            Rule::Momentum { .. } => (true, false),
            Rule::AdamW { .. } => (true, true),
        }
    }

    /// The passes of step `t` (from 1): each an update written in place, in order.
    fn passes(&self, t: i32) -> Passes {
        let lr = self.lr;
        let axpby = |a, b, square| Axpby { a, b, square };
        match self.rule {
            Rule::Sgd => Passes::Sgd(axpby(1.0, -lr, false)),
            Rule::Momentum { mu } => {
                Passes::Momentum(axpby(mu, 1.0, false), axpby(1.0, -lr, false))
            }
            Rule::AdamW {
                beta1,
                beta2,
                eps,
                wd,
            } => Passes::AdamW(
                axpby(beta1, 1.0 - beta1, false),
                axpby(beta2, 1.0 - beta2, true),
                AdamUpdate {
                    lr,
                    decay: 1.0 - lr * wd,
                    scale_m: 1.0 / (1.0 - beta1.powi(t)),
                    scale_v: 1.0 / (1.0 - beta2.powi(t)),
                    eps,
                },
            ),
        }
    }

    /// Step `t` (from 1) of `theta` with its gradient `g` (contiguous, of `theta`'s size) and
    /// its state, all written in place.
    pub fn apply(
        &self,
        theta: &Tensor,
        g: &Tensor,
        m: Option<&Tensor>,
        v: Option<&Tensor>,
        t: i32,
    ) -> Result<()> {
        match (self.passes(t), m, v) {
            (Passes::Sgd(step), _, _) => theta.inplace_op2(g, &step),
            (Passes::Momentum(vel, step), Some(v), _) => {
                v.inplace_op2(g, &vel)?;
                theta.inplace_op2(v, &step)
            }
            (Passes::AdamW(first, second, update), Some(m), Some(v)) => {
                m.inplace_op2(g, &first)?;
                v.inplace_op2(g, &second)?;
                theta.inplace_op3(m, v, &update)
            }
            _ => bail!("in-place optimizer: state missing for its rule"),
        }
    }

    /// [`Stepper::apply`] on f32 slices in host memory (ZeRO-Offload's step on the host:
    /// `crate::ranks::offload`): the same passes with the same arithmetic, so the same bits.
    pub fn apply_host(
        &self,
        theta: &mut [f32],
        g: &[f32],
        m: Option<&mut [f32]>,
        v: Option<&mut [f32]>,
        t: i32,
    ) -> Result<()> {
        fn each<const N: usize>(
            d: &mut [f32],
            s: [&[f32]; N],
            f: impl Fn(f32, [f32; N]) -> f32,
        ) -> Result<()> {
            if s.iter().any(|s| s.len() != d.len()) {
                bail!("in-place optimizer: operands of different sizes")
            }
            for (i, di) in d.iter_mut().enumerate() {
                *di = f(*di, std::array::from_fn(|k| s[k][i]));
            }
            Ok(())
        }
        match (self.passes(t), m, v) {
            (Passes::Sgd(step), _, _) => each(theta, [g], step.f()),
            (Passes::Momentum(vel, step), Some(v), _) => {
                each(v, [g], vel.f())?;
                each(theta, [v], step.f())
            }
            (Passes::AdamW(first, second, update), Some(m), Some(v)) => {
                each(m, [g], first.f())?;
                each(v, [g], second.f())?;
                each(theta, [m, v], update.f())
            }
            _ => bail!("in-place optimizer: state missing for its rule"),
        }
    }
}

/// A step's in-place passes ([`Stepper::passes`]).
enum Passes {
    Sgd(Axpby),
    /// The velocity's, then the weight's.
    Momentum(Axpby, Axpby),
    /// The first moment's, the second's, then the weight's.
    AdamW(Axpby, Axpby, AdamUpdate),
}

/// An in-place optimizer.
pub struct InPlace {
    stepper: Stepper,
    slots: Vec<Slot>,
    step_t: i32,
}

impl InPlace {
    /// `kind` with learning rate `lr` ([`Stepper::new`]).
    pub fn new(kind: OptimizerKind, vars: Vec<Var>, lr: f64) -> Result<Self> {
        let stepper = Stepper::new(kind, lr)?;
        let (moments, second) = stepper.state();
        // Exactly one slot per parameter tensor (a collected `filter` would grow by doubling).
        let mut slots = Vec::with_capacity(vars.len());
        for var in vars.into_iter().filter(|v| v.dtype().is_float()) {
            let zeros = || Tensor::zeros(var.shape(), var.dtype(), var.device());
            slots.push(Slot {
                m: moments.then(zeros).transpose()?,
                v: second.then(zeros).transpose()?,
                var,
            });
        }
        Ok(Self {
            stepper,
            slots,
            step_t: 0,
        })
    }

    pub fn step(&mut self, grads: &GradStore) -> Result<()> {
        self.step_t += 1;
        for slot in &self.slots {
            let theta = slot.var.as_tensor();
            let Some(g) = grads.get(theta) else { continue };
            // The one scratch a step may make: a contiguous copy of a strided gradient
            // (`contiguous` is the same tensor otherwise).
            let g = g.contiguous()?;
            self.stepper
                .apply(theta, &g, slot.m.as_ref(), slot.v.as_ref(), self.step_t)?;
        }
        Ok(())
    }
}

/// `dst ← f(dst, srcs)` element by element over contiguous operands of one float type; no
/// allocation.
fn run<T: Float, const N: usize>(
    d: &mut [T],
    dl: &Layout,
    srcs: [(&[T], &Layout); N],
    f: impl Fn(f32, [f32; N]) -> f32,
) -> Result<()> {
    let Some((a, b)) = dl.contiguous_offsets() else {
        bail!("in-place optimizer: the parameter must be contiguous")
    };
    let d = &mut d[a..b];
    let mut s: [&[T]; N] = [&[]; N];
    for (i, (data, l)) in srcs.iter().enumerate() {
        s[i] = slice(data, l, "in-place optimizer", "an operand")?;
        if s[i].len() != d.len() {
            bail!("in-place optimizer: operands of different sizes")
        }
    }
    for (i, di) in d.iter_mut().enumerate() {
        *di = T::of(f(di.f(), std::array::from_fn(|k| s[k][i].f())));
    }
    Ok(())
}

/// [`run`] on the storage's type (f32, f16, bf16).
macro_rules! elementwise {
    ($name:expr, $dst:expr, $dl:expr, [$(($s:expr, $sl:expr)),*], $f:expr) => {
        match $dst {
            CpuStorage::F32(d) => run(d, $dl, [$((same::<f32>($s)?, $sl)),*], $f),
            CpuStorage::F16(d) => run(d, $dl, [$((same::<half::f16>($s)?, $sl)),*], $f),
            CpuStorage::BF16(d) => run(d, $dl, [$((same::<half::bf16>($s)?, $sl)),*], $f),
            other => bail!(
                "{}: unsupported type {:?}",
                $name,
                candle_core::backend::BackendStorage::dtype(other)
            ),
        }
    };
}

fn same<T: candle_core::WithDType>(s: &CpuStorage) -> Result<&[T]> {
    crate::model::kernels::cpu::same::<T>("in-place optimizer", s)
}

/// `dst ← a·dst + b·src` (or `b·src²` with `square`).
struct Axpby {
    a: f64,
    b: f64,
    square: bool,
}

/// AdamW's weight update from the updated moments.
struct AdamUpdate {
    lr: f64,
    decay: f64,
    scale_m: f64,
    scale_v: f64,
    eps: f64,
}

impl Axpby {
    /// The update of one element (f32 arithmetic).
    fn f(&self) -> impl Fn(f32, [f32; 1]) -> f32 + use<> {
        let (a, b, square) = (self.a as f32, self.b as f32, self.square);
        move |d, [x]| a * d + b * if square { x * x } else { x }
    }
}

impl AdamUpdate {
    /// The update of one weight from its moments (f32 arithmetic).
    fn f(&self) -> impl Fn(f32, [f32; 2]) -> f32 + use<> {
        let (lr, decay, sm, sv, eps) = (
            self.lr as f32,
            self.decay as f32,
            self.scale_m as f32,
            self.scale_v as f32,
            self.eps as f32,
        );
        move |d, [m, v]| d * decay - lr * (m * sm) / ((v * sv).sqrt() + eps)
    }
}

impl InplaceOp2 for Axpby {
    fn name(&self) -> &'static str {
        "inplace-axpby"
    }
    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        elementwise!(self.name(), s1, l1, [(s2, l2)], self.f())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<()> {
        let (a, b) = (self.a as f32, self.b as f32);
        crate::model::kernels::cuda::axpby((s1, l1), (s2, l2), a, b, self.square)
    }
}

impl InplaceOp3 for AdamUpdate {
    fn name(&self) -> &'static str {
        "inplace-adamw-update"
    }
    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        elementwise!(self.name(), s1, l1, [(s2, l2), (s3, l3)], self.f())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &mut candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
        s3: &candle_core::CudaStorage,
        l3: &Layout,
    ) -> Result<()> {
        let k = [self.lr, self.decay, self.scale_m, self.scale_v, self.eps].map(|v| v as f32);
        crate::model::kernels::cuda::adam_update((s1, l1), (s2, l2), (s3, l3), k)
    }
}
