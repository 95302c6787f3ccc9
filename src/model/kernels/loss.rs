//! Mean cross-entropy from logits as one op: `(N, V)` logits and `(N)` u32 targets → a scalar,
//! `−(1/N)·Σᵢ log softmax(xᵢ)[tᵢ]`, computed per row in f32 (a running maximum and sum). The
//! graph keeps the logits only; candle's composed `log_softmax` + `nll` keeps the shifted
//! logits, their exponentials and the log-probabilities, each `(N, V)`.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use super::Kernel;
use super::cpu::{Float, dispatch, slice};

/// Mean cross-entropy of `logits (N, V)` against `targets (N)` u32, with a fused backward.
pub fn cross_entropy(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    logits.apply_op2(targets, CrossEntropyOp)
}

/// [`cross_entropy`] as transformers' loss runs it: the node also holds `lp`, the f32
/// log-probabilities `(N, V)`, from which the backward works ([`Kernel::CrossEntropyF32`]).
pub fn cross_entropy_f32(logits: &Tensor, targets: &Tensor, lp: &Tensor) -> Result<Tensor> {
    let op = super::held::Held {
        op: CrossEntropyOp,
        kernel: Kernel::CrossEntropyF32,
        held: vec![lp.clone()],
    };
    logits.apply_op2(targets, op)
}

struct CrossEntropyOp;

fn loss<T: Float>(x: &[T], t: &[u32], v: usize) -> Result<f32> {
    let n = t.len();
    let mut total = 0f64;
    for (i, &target) in t.iter().enumerate() {
        let row = &x[i * v..(i + 1) * v];
        let Some(xt) = row.get(target as usize) else {
            candle_core::bail!("cross_entropy: target {target} of row {i} is not below {v}")
        };
        let m = row.iter().fold(f32::NEG_INFINITY, |m, x| m.max(x.f()));
        let sum: f32 = row.iter().map(|x| (x.f() - m).exp()).sum();
        total += (m + sum.ln() - xt.f()) as f64;
    }
    Ok((total / n as f64) as f32)
}

impl CustomOp2 for CrossEntropyOp {
    fn name(&self) -> &'static str {
        Kernel::CrossEntropy.name()
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (n, v) = l1.shape().dims2()?;
        let CpuStorage::U32(t) = s2 else {
            candle_core::bail!("cross_entropy: targets must be u32")
        };
        let t = slice(t, l2, op, "targets")?;
        if t.len() != n {
            candle_core::bail!("cross_entropy: {} targets for {n} rows", t.len())
        }
        dispatch!(op, s1, |x: T| {
            let x = slice(x, l1, op, "logits")?;
            let l = loss(x, t, v)?;
            Ok((
                <T as candle_core::WithDType>::to_cpu_storage_owned(vec![T::of(l)]),
                Shape::from_dims(&[]),
            ))
        })
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        super::cuda::cross_entropy((s1, l1), (s2, l2))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Kernel::CrossEntropy.backward2(&[logits, targets], res, grad)
    }
}
