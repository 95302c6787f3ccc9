//! The CPU kernels' inner loops in a form the compiler vectorises, compiled twice: for the
//! build's baseline (SSE2 on x86-64) and for AVX2, chosen at run time ([`multiversion!`]). The
//! arithmetic is the same in both: no fused multiply-add (Rust never contracts `a·b + c`), the
//! same eight-lane partial sums in the same order, so a result does not depend on the CPU it
//! ran on (the suite runs on AMD and Intel alike).

use super::cpu::Float;

/// Lanes of the partial sums of [`dot`]: one AVX register of f32, two SSE ones.
const LANES: usize = 8;

/// `Σ a_i·b_i` in f32 over the shorter of the two, in [`LANES`] partial sums added pairwise.
#[inline(always)]
pub fn dot<T: Float>(a: &[T], b: &[T]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l].f() * y[l].f();
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x.f() * y.f();
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `acc += p·x`, element by element.
#[inline(always)]
pub fn axpy<T: Float>(acc: &mut [f32], p: f32, x: &[T]) {
    for (a, x) in acc.iter_mut().zip(x) {
        *a += p * x.f();
    }
}

/// `acc ·= r`, element by element.
#[inline(always)]
pub fn scale(acc: &mut [f32], r: f32) {
    for a in acc.iter_mut() {
        *a *= r;
    }
}

/// `eˣ` in f32 without a library call, so a loop of it vectorises: Cephes' `expf` (range
/// reduction by `n = round(x·log₂e)`, a degree-6 polynomial on `|r| ≤ ln 2 / 2`, `2ⁿ` from
/// the exponent bits), within 2 ulp of the correctly rounded value on `[−87, 88]`; `x` is
/// clamped there (`e⁻⁸⁷ ≈ 1.6·10⁻³⁸`, `e⁸⁸ ≈ 1.7·10³⁸`: no subnormal or infinite result).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts (Cody–Waite), so `x − n·ln 2` is exact to f32.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5·2²³: adding and subtracting it rounds to the nearest integer.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let n = (x * LOG2E + ROUND) - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `σ(x) = 1 / (1 + e⁻ˣ)` through [`exp`].
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// Defines `fn $name<T: Float>(args) -> ret` calling the `#[inline(always)]` `$body` compiled
/// with AVX2 where the CPU has it (checked once per call: a cached load), else as built.
/// `$body` holds the whole hot loop, so one call does enough work to hide the dispatch.
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident<$t:ident: Float>($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty = $body:ident) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name<$t: $crate::model::kernels::cpu::Float>($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2")]
                #[allow(clippy::too_many_arguments)]
                fn avx2<$t: $crate::model::kernels::cpu::Float>($($arg: $ty),*) -> $ret {
                    $body($($arg),*)
                }
                if std::is_x86_feature_detected!("avx2") {
                    // SAFETY: the CPU has AVX2, the only feature `avx2` was compiled for.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $body($($arg),*)
        }
    };
}
pub(crate) use multiversion;

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
    }

    #[test]
    fn dot_matches_a_wide_sum_at_every_length() {
        for n in 0..40 {
            let a: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
            let d = dot(&a, &b) as f64;
            assert!((d - naive(&a, &b)).abs() < 1e-5, "n {n}: {d}");
        }
    }

    #[test]
    fn dot_reads_the_shorter_operand() {
        assert_eq!(dot(&[1f32, 2.0, 3.0], &[1f32, 1.0]), 3.0);
    }

    #[test]
    fn exp_is_within_two_ulp_of_the_library() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let (a, b) = (exp(x), x.exp());
            let ulp = (a.to_bits() as i64 - b.to_bits() as i64).abs();
            assert!(ulp <= 2, "exp({x}): {a} against {b} ({ulp} ulp)");
            x += 0.013;
        }
        assert_eq!(exp(-200.0), (-87f32).exp());
        assert!(exp(200.0).is_finite());
        assert!((sigmoid(0.0) - 0.5).abs() < 1e-7 && sigmoid(-100.0) < 1e-37);
    }

    multiversion!(fn dot_mv<T: Float>(a: &[T], b: &[T]) -> f32 = dot);

    #[test]
    fn both_versions_give_the_same_bits() {
        let a: Vec<f32> = (0..67).map(|i| (i as f32 * 0.731).sin() * 3.0).collect();
        let b: Vec<f32> = (0..67).map(|i| (i as f32 * 0.291).cos() / 7.0).collect();
        assert_eq!(dot_mv(&a, &b).to_bits(), dot(&a, &b).to_bits());
        let mut x = vec![0.5f32; 67];
        let mut y = x.clone();
        axpy(&mut x, 0.3, &a);
        multiversion!(fn axpy_mv<T: Float>(acc: &mut [f32], p: f32, x: &[T]) -> () = axpy);
        axpy_mv(&mut y, 0.3, &a);
        assert_eq!(x, y);
    }
}
