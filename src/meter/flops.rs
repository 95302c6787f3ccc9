//! The CPU's peak FLOP/s, measured (not a [`super::Meter`] around a phase's window: a benchmark
//! of its own, run only by `memfit report --measure-cpu-peak`, the denominator of the CPU's
//! "% of peak" in the report's hardware comparison).
//!
//! How: f32 matrix products of random `n × n` candle tensors on the CPU (candle's gemm, on
//! rayon's threads), each timed alone after one warm-up product of its size; one product is
//! `2·n³` FLOPs, and the figure is the best rate over every timed product (the best, because
//! other processes only ever slow a sample down). The sizes and repetitions are [`SIZES`].

use candle_core::{Device, Tensor};

/// `(n, timed products)`: twenty 1024³ and five 2048³ products.
pub const SIZES: [(usize, usize); 2] = [(1024, 20), (2048, 5)];

/// What [`cpu_matmul_peak`] times, in words.
pub fn method() -> String {
    let parts: Vec<String> = SIZES
        .iter()
        .map(|(n, reps)| format!("{reps} × {n}³"))
        .collect();
    format!("best of {} f32 candle matmuls", parts.join(" and "))
}

/// f32 matmul FLOP/s of this host: the best of [`SIZES`]' timed candle products after a
/// warm-up of each size.
pub fn cpu_matmul_peak() -> anyhow::Result<f64> {
    let mut best = 0f64;
    for (n, reps) in SIZES {
        let a = Tensor::randn(0f32, 1.0, (n, n), &Device::Cpu)?;
        let b = Tensor::randn(0f32, 1.0, (n, n), &Device::Cpu)?;
        a.matmul(&b)?;
        for _ in 0..reps {
            let t = std::time::Instant::now();
            let c = a.matmul(&b)?;
            let s = t.elapsed().as_secs_f64();
            drop(c);
            best = best.max(2.0 * (n as f64).powi(3) / s);
        }
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    /// The words the report prints name exactly what is timed.
    #[test]
    fn method_names_the_sizes() {
        assert_eq!(
            super::method(),
            "best of 20 × 1024³ and 5 × 2048³ f32 candle matmuls"
        );
    }
}
