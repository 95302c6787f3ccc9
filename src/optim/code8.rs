//! The 8-bit "dynamic" code of the blockwise-quantized optimizer states.
//!
//! A block of values is divided by its largest magnitude (stored as an f32 scale) and each
//! quotient in [−1, 1] is stored as the byte whose code value is nearest. The code is non-linear
//! like the dynamic tree code of the 8-bit-optimizer literature: after the sign bit (signed
//! code only), the number of leading zero bits `e` chooses the decade 10^−e, the first one bit
//! ends it, and the remaining bits are a linear fraction within that decade. Large values get
//! fine linear steps, small ones keep their order of magnitude down to ~10^−6 (signed) or
//! 10^−7 (unsigned, used for Adam's non-negative second moment).
//!
//! Decoding a byte `c` with `w` value bits (7 signed, 8 unsigned): `r` = the value bits; `r = 0`
//! is 0; otherwise `e` = leading zeros of `r` in `w` bits, `f = w − 1 − e` fraction bits,
//! `value = 10^−e · (0.1 + 0.9 · (frac + 1) / 2^f)` with `frac` the low `f` bits, so each decade's
//! top value is exactly 10^−e and 1.0 is representable.

/// A sorted code table and its byte for each entry.
#[derive(Debug, Clone)]
pub struct Code {
    /// Code values in ascending order.
    values: Vec<f32>,
    /// The byte of each entry of `values`.
    bytes: Vec<u8>,
    /// Value of each byte.
    table: [f32; 256],
}

impl Code {
    /// The signed code (Adam's first moment, momentum).
    pub fn signed() -> Self {
        Self::build(true)
    }

    /// The unsigned code (Adam's second moment).
    pub fn unsigned() -> Self {
        Self::build(false)
    }

    fn build(signed: bool) -> Self {
        let w = if signed { 7 } else { 8 };
        let mut table = [0f32; 256];
        for c in 0..=255u32 {
            let r = c & ((1 << w) - 1);
            let mag = if r == 0 {
                0.0
            } else {
                let e = r.leading_zeros() - (32 - w);
                let f = w - 1 - e;
                let frac = r & ((1 << f) - 1);
                10f64.powi(-(e as i32)) * (0.1 + 0.9 * (frac as f64 + 1.0) / (1u64 << f) as f64)
            };
            let negative = signed && c & 0x80 != 0;
            table[c as usize] = if negative { -mag as f32 } else { mag as f32 };
        }
        let mut order: Vec<u8> = (0..=255u8).collect();
        order.sort_by(|&a, &b| table[a as usize].total_cmp(&table[b as usize]));
        // Duplicates (the signed code's −0) keep the first byte.
        order.dedup_by(|a, b| table[*a as usize] == table[*b as usize]);
        Self {
            values: order.iter().map(|&c| table[c as usize]).collect(),
            bytes: order,
            table,
        }
    }

    /// The value of byte `c`.
    #[inline]
    pub fn decode(&self, c: u8) -> f32 {
        self.table[c as usize]
    }

    /// The byte whose value is nearest to `x` (ties to the smaller magnitude's neighbour below).
    #[inline]
    pub fn encode(&self, x: f32) -> u8 {
        let i = self.values.partition_point(|&v| v < x);
        if i == 0 {
            return self.bytes[0];
        }
        if i == self.values.len() {
            return self.bytes[i - 1];
        }
        let (lo, hi) = (self.values[i - 1], self.values[i]);
        if x - lo <= hi - x {
            self.bytes[i - 1]
        } else {
            self.bytes[i]
        }
    }

    /// Number of distinct values.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// Quantizes `xs` block by block into `codes` (one byte each) and `scales` (one absmax per
/// block).
pub fn quantize(code: &Code, xs: &[f32], block: usize, codes: &mut [u8], scales: &mut [f32]) {
    for (b, chunk) in xs.chunks(block).enumerate() {
        let absmax = chunk.iter().fold(0f32, |m, x| m.max(x.abs()));
        scales[b] = absmax;
        let inv = if absmax > 0.0 { 1.0 / absmax } else { 0.0 };
        for (i, &x) in chunk.iter().enumerate() {
            codes[b * block + i] = code.encode(x * inv);
        }
    }
}

/// Inverse of [`quantize`] for one block: `out[i] = decode(codes[i]) · scale`.
pub fn dequantize_block(code: &Code, codes: &[u8], scale: f32, out: &mut [f32]) {
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = code.decode(c) * scale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_cover_their_range_with_exact_ends() {
        let s = Code::signed();
        let u = Code::unsigned();
        assert_eq!(s.len(), 255, "256 bytes, +0 and −0 merged");
        assert_eq!(u.len(), 256);
        assert_eq!(s.decode(s.encode(1.0)), 1.0);
        assert_eq!(s.decode(s.encode(-1.0)), -1.0);
        assert_eq!(s.decode(s.encode(0.0)), 0.0);
        assert_eq!(u.decode(u.encode(1.0)), 1.0);
        // The smallest non-zero magnitudes: 10^-6 (signed, 7 value bits), 10^-7 (unsigned).
        fn smallest(c: &Code) -> f32 {
            (0..=255u8)
                .map(|b| c.decode(b).abs())
                .filter(|&v| v > 0.0)
                .fold(1.0, f32::min)
        }
        assert!((smallest(&s) - 1e-6).abs() < 1e-12);
        assert!((smallest(&u) - 1e-7).abs() < 1e-13);
    }

    #[test]
    fn relative_error_is_bounded_per_decade() {
        let s = Code::signed();
        // In the top decade the step is 0.9/64: half a step of error at most.
        for i in 0..1000 {
            let x = 0.1 + 0.9 * i as f32 / 999.0;
            let y = s.decode(s.encode(x));
            assert!((x - y).abs() <= 0.9 / 64.0 / 2.0 + 1e-6, "{x} → {y}");
        }
        // Signs survive and order is kept.
        assert!(s.decode(s.encode(-0.37)) < 0.0);
        assert!(s.decode(s.encode(0.02)) < s.decode(s.encode(0.03)));
    }

    #[test]
    fn blockwise_round_trip() {
        let s = Code::signed();
        let xs: Vec<f32> = (0..10).map(|i| (i as f32 - 4.5) * 0.3).collect();
        let (mut codes, mut scales) = (vec![0u8; 10], vec![0f32; 3]);
        quantize(&s, &xs, 4, &mut codes, &mut scales);
        assert_eq!(scales, vec![-xs[0], xs[7], xs[9]]);
        let mut back = vec![0f32; 4];
        dequantize_block(&s, &codes[..4], scales[0], &mut back);
        assert_eq!(back[0], xs[0], "the block's absmax is exact");
        for (x, y) in xs[..4].iter().zip(&back) {
            assert!((x - y).abs() <= 1.35 * 0.9 / 64.0, "{x} vs {y}");
        }
    }
}
