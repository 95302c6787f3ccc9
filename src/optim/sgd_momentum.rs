//! SGD with momentum: `v ← μ·v + g`, `θ ← θ − lr·v` (PyTorch's convention, no dampening).
//!
//! State: one velocity tensor per parameter, in the parameter's dtype (`e·P`). Each update
//! works on detached tensors, so no op records its operands: the step's temporaries are two
//! tensors the size of the parameter at a time (`μ·v` beside `μ·v + g`, then `lr·v` beside
//! `θ − lr·v`), written back in place with `Var::set`.

use candle_core::backprop::GradStore;
use candle_core::{Result, Var};
use candle_nn::Optimizer;

#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub lr: f64,
    pub momentum: f64,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            lr: 1e-3,
            momentum: 0.9,
        }
    }
}

pub struct SgdMomentum {
    vars: Vec<(Var, Var)>,
    params: Params,
}

impl Optimizer for SgdMomentum {
    type Config = Params;

    fn new(vars: Vec<Var>, params: Params) -> Result<Self> {
        let vars = vars
            .into_iter()
            .filter(|v| v.dtype().is_float())
            .map(|v| {
                let velocity = Var::zeros(v.shape(), v.dtype(), v.device())?;
                Ok((v, velocity))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { vars, params })
    }

    fn learning_rate(&self) -> f64 {
        self.params.lr
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.params.lr = lr;
    }

    fn step(&mut self, grads: &GradStore) -> Result<()> {
        for (theta, velocity) in &self.vars {
            let Some(g) = grads.get(theta) else { continue };
            let next_v = (velocity
                .as_detached_tensor()
                .affine(self.params.momentum, 0.)?
                + g)?;
            velocity.set(&next_v)?;
            drop(next_v);
            let next_theta = (theta.as_detached_tensor()
                - velocity.as_detached_tensor().affine(self.params.lr, 0.)?)?;
            theta.set(&next_theta)?;
        }
        Ok(())
    }
}
