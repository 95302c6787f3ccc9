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
}
