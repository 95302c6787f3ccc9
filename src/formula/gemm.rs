//! The transient packing buffer of candle's CPU matmul (the `gemm` 0.19 crate).
//!
//! Each `gemm` call may allocate one buffer for packed operands, freed before it returns, so it
//! adds to a peak only while its matmul runs: `round₁₂₈(4·kc·nc)` when the right operand is
//! packed, plus `round₁₂₈(4·kc·MR·⌈m/MR⌉)` when the left one is pre-packed (sizes in `gemm`'s own
//! orientation: candle's row-major output makes `gemm` compute the transposed product, so its
//! `m` is candle's `n`). `kc`, `nc` come from `gemm-common`'s cache-aware `kernel_params` on this
//! machine, `MR × NR` is the microkernel (x86-64 with FMA: 16 × 6). Tiny products (`m·n ≤ 256`
//! with unit strides), matrix–vector products and `k ≤ 2` need no buffer. This mirrors
//! `gemm_common::gemm::gemm_basic_generic` for `f32`; on CPUs other than x86-64 the microkernel
//! shape differs and the value is an estimate.

use gemm_common::cache::{KernelParams, kernel_params};
use gemm_common::gemm::{CACHELINE_ALIGN, get_rhs_packing_threshold};

/// Bytes of the `L2_SLAB` that `gemm-common` keeps per thread: a buffer of this CPU's L2 size
/// (`CACHE_INFO[1]`), allocated on the thread's first product that packs the left operand in
/// place and held until the thread ends. The warm-up leaves one in every thread that ran a
/// matmul, so it sits outside every phase window yet inside the process's heap.
pub fn thread_slab_bytes() -> u64 {
    gemm_common::cache::CACHE_INFO[1].cache_bytes as u64
}

/// The case process's slabs with candle at `threads` threads: one per rayon worker and one in
/// the calling thread (a product run with one thread packs there), `(threads + 1) ·`
/// [`thread_slab_bytes`]: the part of a CPU case's heap that depends on this machine's caches.
pub fn process_slab_bytes(threads: usize) -> u64 {
    (threads as u64 + 1) * thread_slab_bytes()
}

/// Microkernel of `gemm-f32` 0.19 on this CPU: (lanes N, MR, NR, has horizontal kernels).
fn microkernel() -> (usize, usize, usize, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("fma") {
            return (8, 16, 6, true);
        }
    }
    (1, 2, 4, false)
}

fn round_up(bytes: usize, align: usize) -> usize {
    bytes.div_ceil(align) * align
}

/// Strides of one matmul operand's last two dimensions: (column stride, row stride).
pub type Strides = (usize, usize);

/// Bytes of `gemm-f16`'s buffer for an f16 product: it always packs the right operand (in
/// f32), pre-packs the left one under the same condition as f32, and has no tiny-product path.
pub fn scratch_bytes_f16(
    m: usize,
    n: usize,
    k: usize,
    lhs: Strides,
    rhs: Strides,
    threads: usize,
) -> u64 {
    scratch(false, m, n, k, lhs, rhs, threads)
}

/// Bytes of `gemm`'s packing buffer for candle's `(m × k) · (k × n)` f32 product with the given
/// operand strides; `threads` is candle's thread count (`RAYON_NUM_THREADS`).
pub fn scratch_bytes(
    m: usize,
    n: usize,
    k: usize,
    lhs: Strides,
    rhs: Strides,
    threads: usize,
) -> u64 {
    scratch(true, m, n, k, lhs, rhs, threads)
}

/// Both crates' buffer rule; `f32` selects `gemm-f32`'s extra paths (tiny products without a
/// buffer, small-size block sizes, a conditional right-operand pack).
fn scratch(
    f32: bool,
    m: usize,
    n: usize,
    k: usize,
    lhs: Strides,
    rhs: Strides,
    threads: usize,
) -> u64 {
    if m == 0 || n == 0 || k == 0 {
        return 0;
    }
    // candle's destination is row-major (column stride 1 < row stride n): gemm transposes the
    // problem when n > 1, and the destination is then column-major.
    let (m, n, (lhs_cs, lhs_rs), (_, rhs_rs)) = if 1 < n {
        (n, m, (rhs.1, rhs.0), (lhs.1, lhs.0))
    } else {
        (m, n, lhs, rhs)
    };
    let (lanes, mr, nr, horizontal) = microkernel();
    if f32 && horizontal && lhs_cs == 1 && rhs_rs == 1 && m * n <= 16 * 16 {
        return 0;
    }
    // k ≤ 2 and matrix–vector products take paths without a buffer.
    if k <= 2 {
        return 0;
    }
    if n <= 1 && (lhs_rs == 1 || (lhs_cs == 1 && rhs_rs == 1)) {
        return 0;
    }
    if m <= 1 && rhs_rs == 1 && lhs_cs == 1 {
        return 0;
    }
    let f = std::mem::size_of::<f32>();
    let KernelParams { kc, mc, nc } = if f32 && m <= 64 && n <= 64 {
        let kc = k.min(512);
        let alloc = gemm_common::cache::CACHE_INFO[1].cache_bytes / f;
        KernelParams {
            kc,
            mc: (alloc / kc) / mr * mr,
            nc: n.next_multiple_of(nr),
        }
    } else {
        kernel_params(m, n, k, mr, nr, f)
    };
    let nc = if nc > 0 {
        nc
    } else if threads > 1 {
        n.next_multiple_of(nr)
    } else {
        128 * nr
    };
    let pack_rhs = !f32
        || (rhs_rs != 1 && m > 2 * mr)
        || (rhs_rs == 1 && m > get_rhs_packing_threshold() * mr);
    let prepack_lhs = m <= 2 * mc && (m % lanes != 0 || lhs_rs != 1);
    if !pack_rhs && !prepack_lhs {
        return 0;
    }
    let rhs_bytes = if pack_rhs { kc * nr * (nc / nr) * f } else { 0 };
    let lhs_bytes = if prepack_lhs {
        kc * mr * m.div_ceil(mr) * f
    } else {
        0
    };
    (round_up(rhs_bytes, CACHELINE_ALIGN) + round_up(lhs_bytes, CACHELINE_ALIGN)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// candle's `x (33×96) · wᵀ` with `w (48×96)`: gemm computes the transposed 48×33 product
    /// (both ≤ 64: kc = k = 96), pre-packs its left operand (row stride 96 ≠ 1) in
    /// ⌈48/16⌉ = 3 panels of kc × MR = 96 × 16 floats: 18,432 B (measured 18,432 B + 165 B of
    /// other small allocations on an AVX2 machine).
    #[test]
    fn prepacked_lhs_of_a_linear_layer() {
        if microkernel() != (8, 16, 6, true) {
            return; // the hand-worked value is for x86-64 with FMA
        }
        assert_eq!(scratch_bytes(33, 48, 96, (1, 96), (96, 1), 1), 18_432);
    }

    #[test]
    fn no_buffer_for_tiny_products_vectors_and_shallow_k() {
        assert_eq!(scratch_bytes(4, 4, 64, (1, 64), (64, 1), 1), 0);
        assert_eq!(scratch_bytes(1, 300, 96, (1, 96), (96, 1), 1), 0);
        assert_eq!(scratch_bytes(100, 100, 2, (1, 2), (2, 1), 1), 0);
    }
}
