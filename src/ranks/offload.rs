//! ZeRO-Offload on real ranks (`memfit ranks --offload optimizer`, ZeRO 1 and 2): each rank's
//! optimizer partition lives in host memory and steps there, as DeepSpeed's
//! `offload_optimizer: {device: cpu}` runs it — the partition's f32 master weights, an f32
//! buffer its reduced gradient is copied into, and the optimizer's state (Adam's two moments,
//! momentum's velocity) — while the device keeps the model's weights and gradients. A step:
//! this rank's run of each reduced gradient copied device → host, the update on the host (the
//! same passes and arithmetic as the device's in-place step: [`Stepper::apply_host`]), the
//! updated master run copied host → device into the weights, which the gather then spreads
//! over the ranks as without offload.
//!
//! The host buffers come from [`crate::meter::host_arena`] (outside the counting allocator,
//! as pinned host memory is outside CUDA's pool), so each window reports two layers: the device
//! (the counting allocator) and the host arena. Both are predicted: the device's optimizer
//! window holds only the slots' bookkeeping, the host's the partition —
//! `(2 + moments)·4·run` bytes a parameter's run ([`host_bytes`]).
//!
//! Where this differs from DeepSpeed, by design of the ranks' step: the host buffers are made
//! in the `optimizer` window (DeepSpeed makes them when the engine is built), and the device
//! keeps its reduced gradients until the step ends (DeepSpeed's stage 2 copies each reduced
//! bucket out during the backward and reuses the bucket).

use std::ops::Range;

use candle_core::{CpuStorage, DType, Result, Storage, Tensor, Var, bail};

use super::zero::with_f32_mut;
use crate::meter::host_arena::HostBuf;
use crate::optim::inplace::Stepper;

/// One parameter's run in host memory: master weights, gradient buffer, state.
pub struct HostSlot {
    master: HostBuf,
    grad: HostBuf,
    m: Option<HostBuf>,
    v: Option<HostBuf>,
}

/// Device bytes of a host slot's bookkeeping (its buffers' handles, in the optimizer's list).
pub const HOST_SLOT_BYTES: u64 = std::mem::size_of::<HostSlot>() as u64;

/// Host-arena bytes of the offloaded partition: for each run length, master + gradient buffer
/// + `moments` state buffers of f32.
pub fn host_bytes(runs: impl IntoIterator<Item = u64>, moments: u64) -> u64 {
    runs.into_iter()
        .map(|n| (2 + moments) * HostBuf::bytes(n))
        .sum()
}

impl HostSlot {
    /// The run `run` of `var` copied into host memory, with a zeroed gradient buffer and the
    /// state `stepper` keeps.
    pub fn new(stepper: &Stepper, var: &Var, run: &Range<usize>) -> Result<Self> {
        let (moments, second) = stepper.state();
        let mut master = None;
        with_f32(var.as_tensor(), |w| {
            master = Some(HostBuf::copy_of(&w[run.clone()]))
        })?;
        let zeros = || HostBuf::zeros(run.len());
        Ok(HostSlot {
            master: master.expect("with_f32 calls its closure"),
            grad: zeros(),
            m: moments.then(zeros),
            v: second.then(zeros),
        })
    }

    /// Step `t` of the run `run` of `var`: `g` (the whole reduced gradient, or `shard`: the
    /// run itself) copied into the host buffer, stepped there, the master run copied back into
    /// `var`.
    pub fn step(
        &mut self,
        stepper: &Stepper,
        var: &Var,
        run: &Range<usize>,
        g: &Tensor,
        shard: bool,
        t: i32,
    ) -> Result<()> {
        let host = &mut self.grad;
        with_f32(g, |g| {
            let g = if shard { g } else { &g[run.clone()] };
            host.copy_from_slice(g);
        })?;
        stepper.apply_host(
            &mut self.master,
            &self.grad,
            self.m.as_deref_mut(),
            self.v.as_deref_mut(),
            t,
        )?;
        let master = &self.master;
        with_f32_mut(var.as_tensor(), |w| w[run.clone()].copy_from_slice(master))
    }
}

/// `f` on the `f32` data of a contiguous CPU tensor, read in place (nothing copied).
pub fn with_f32(t: &Tensor, f: impl FnOnce(&[f32])) -> Result<()> {
    if t.dtype() != DType::F32 {
        bail!("ranks: offloaded tensors are f32")
    }
    let (storage, layout) = t.storage_and_layout();
    let Some((a, b)) = layout.contiguous_offsets() else {
        bail!("ranks: an offloaded tensor must be contiguous")
    };
    let Storage::Cpu(CpuStorage::F32(data)) = &*storage else {
        bail!("ranks: offloaded tensors live on the CPU")
    };
    f(&data[a..b]);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The host step gives the device step's bits, for every rule with state, on a run in the
    /// middle of a parameter, from a whole gradient and from a shard.
    #[test]
    fn the_host_step_equals_the_device_step() {
        use crate::step::OptimizerKind::*;
        let n = 37;
        let data: Vec<f32> = (0..n).map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.01).collect();
        let grad: Vec<f32> = (0..n).map(|i| ((i * 5 % 13) as f32 - 6.0) * 0.1).collect();
        let run = 10..29;
        for kind in [Sgd, SgdMomentum, Adam, Adamw] {
            let stepper = Stepper::new(kind, 1e-2).unwrap();
            let (m1, m2) = stepper.state();
            let dev = Var::from_slice(&data, n, &Device::Cpu).unwrap();
            let host = Var::from_slice(&data, n, &Device::Cpu).unwrap();
            let zeros = || Tensor::zeros(run.len(), DType::F32, &Device::Cpu).unwrap();
            let (m, v) = (m1.then(zeros), m2.then(zeros));
            let mut slot = HostSlot::new(&stepper, &host, &run).unwrap();
            let g = Tensor::from_slice(&grad, n, &Device::Cpu).unwrap();
            for t in 1..=3 {
                let view = dev.as_tensor().narrow(0, run.start, run.len()).unwrap();
                let gr = g
                    .narrow(0, run.start, run.len())
                    .unwrap()
                    .contiguous()
                    .unwrap();
                stepper
                    .apply(&view, &gr, m.as_ref(), v.as_ref(), t)
                    .unwrap();
                if t % 2 == 1 {
                    slot.step(&stepper, &host, &run, &g, false, t).unwrap();
                } else {
                    slot.step(&stepper, &host, &run, &gr, true, t).unwrap();
                }
            }
            let a = dev.as_tensor().to_vec1::<f32>().unwrap();
            let b = host.as_tensor().to_vec1::<f32>().unwrap();
            assert_eq!(a, b, "{kind:?}");
            assert_ne!(a, data, "{kind:?} stepped");
        }
    }
}
