//! ZeRO (claim B5), derived, not measured: per-GPU model-state bytes when N data-parallel GPUs
//! shard the optimizer state (stage 1), also the gradients (stage 2), also the weights (stage 3).
//!
//! From one device's measured weights W, gradients G and optimizer state O:
//! stage 0 (plain data parallel) `W + G + O`; stage 1 `W + G + O/N`; stage 2 `W + (G + O)/N`;
//! stage 3 `(W + G + O)/N` (each shard rounded up to a whole byte). Activations and the
//! communication buffers ZeRO adds are not included: this is the model state only, and memfit
//! has no multi-GPU machine to measure it on.

/// Model-state bytes per GPU for ZeRO `stage` (0–3) over `gpus` GPUs.
pub fn per_gpu_bytes(stage: u8, gpus: u64, weights: u64, grads: u64, state: u64) -> u64 {
    assert!(gpus >= 1, "at least one GPU");
    let shard = |b: u64| b.div_ceil(gpus);
    match stage {
        0 => weights + grads + state,
        1 => weights + grads + shard(state),
        2 => weights + shard(grads + state),
        3 => shard(weights + grads + state),
        _ => panic!("ZeRO stages are 0 to 3"),
    }
}

/// [`per_gpu_bytes`] part by part: ZeRO `stage`'s shares of `(weights, gradients, state)` on
/// each of `gpus` GPUs, each rounded up to a whole byte (the state sharded from stage 1, the
/// gradients from 2, the weights from 3 — or, f32 `masters` of mixed precision, the ZeRO
/// paper's `K = 12` for Adam, with the state from stage 1). `predict --parallel`'s per-rank
/// states ([`super::parallel`]).
pub fn shards(stage: u8, gpus: u64, (w, g, o): (u64, u64, u64), masters: bool) -> (u64, u64, u64) {
    assert!(gpus >= 1, "at least one GPU");
    let at = |from: u8, b: u64| if stage >= from { b.div_ceil(gpus) } else { b };
    (at(if masters { 1 } else { 3 }, w), at(2, g), at(1, o))
}

/// ZeRO-Offload (DeepSpeed's `offload_optimizer: {device: cpu}`): where ZeRO `stage`'s model
/// states lie over `gpus` data-parallel ranks when each rank's optimizer partition is in host
/// memory — `((weights, gradients, optimizer state) on the device, (master weights, gradient
/// buffer, optimizer state) on the host)`, each rounded up to a whole byte. The device keeps
/// [`shards`]' weights and gradients (stage 2: its gradient partition, as the ranks keep it
/// until the step; DeepSpeed's estimator counts none: it copies each reduced bucket out during
/// the backward) and no state; the host the partition of an f32 master copy of the `params`
/// (none where `master_in_state`: the state `o` counts it already, as 16-bit regimes' does),
/// an f32 gradient buffer and the state.
pub fn offloaded(
    stage: u8,
    gpus: u64,
    (w, g, o): (u64, u64, u64),
    params: u64,
    master_in_state: bool,
) -> ((u64, u64, u64), (u64, u64, u64)) {
    let (dw, dg, _) = shards(stage, gpus, (w, g, o), false);
    let part = |b: u64| b.div_ceil(gpus);
    let master = if master_in_state { 0 } else { part(4 * params) };
    ((dw, dg, 0), (master, part(4 * params), part(o)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1 B parameters, bf16 weights and gradients (2 GB each), f32 master weights + Adam
    /// moments (12 GB), 8 GPUs: 16, 5.5, 3.75 and 2 GB per GPU for stages 0–3.
    #[test]
    fn the_textbook_example() {
        let (w, g, o) = (2_000_000_000, 2_000_000_000, 12_000_000_000);
        assert_eq!(per_gpu_bytes(0, 8, w, g, o), 16_000_000_000);
        assert_eq!(per_gpu_bytes(1, 8, w, g, o), 5_500_000_000);
        assert_eq!(per_gpu_bytes(2, 8, w, g, o), 3_750_000_000);
        assert_eq!(per_gpu_bytes(3, 8, w, g, o), 2_000_000_000);
        // One GPU: nothing to shard.
        assert_eq!(per_gpu_bytes(3, 1, w, g, o), 16_000_000_000);
        // Shards round up.
        assert_eq!(per_gpu_bytes(3, 3, 1, 0, 0), 1);
    }

    /// ZeRO-Offload of 1 B f32 parameters with Adam over 4 ranks: the device 4 GB of weights
    /// and 4 GB (stage 1) or 1 GB (stage 2) of gradients, no state; the host 1 GB each of
    /// master, gradient buffer and 2 GB of moments. A 16-bit regime's state holds its master.
    #[test]
    fn offload_moves_the_partition_to_the_host() {
        let p = 1_000_000_000;
        let f32 = (4 * p, 4 * p, 8 * p);
        let host = (p, p, 2 * p);
        assert_eq!(offloaded(1, 4, f32, p, false), ((4 * p, 4 * p, 0), host));
        assert_eq!(offloaded(2, 4, f32, p, false), ((4 * p, p, 0), host));
        let bf16 = (2 * p, 2 * p, 12 * p);
        assert_eq!(
            offloaded(2, 4, bf16, p, true),
            ((2 * p, p / 2, 0), (0, p, 3 * p))
        );
    }
}
