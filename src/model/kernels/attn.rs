//! Attention probabilities as one op: `P = softmax(q·kᵀ·scale + causal mask)` from q
//! `(B, A, Sq, D)` and k `(B, G, Sk, D)` to `(B, G, r·Sq, Sk)`, with `G` dividing `A` and `r =
//! A/G` (grouped-query attention: query head `a` reads key head `a / r`, as transformers'
//! `repeat_kv` arranges them; `(B, A, Sq, Sk)` when `G = A`). The `r` query heads of a group
//! are read as one `(r·Sq, D)` matrix (their rows are contiguous), so the keys are never
//! copied per query head: `B·G` products `(r·Sq, D)·(D, Sk)`, row `i` at position `i mod
//! Sq`; `P·v` then reads each value head once. The scores are never a graph
//! node: the product is written by candle's own gemm into the output buffer, then scaled,
//! masked and normalised in place. The graph keeps q, k (which the model keeps anyway) and P,
//! as PyTorch's eager attention keeps its softmax output; there is no mask tensor and no mask
//! gradient. With `causal`, query `i` sees keys `0..=i + Sk − Sq` (the decoder; with a cache
//! the new queries sit at the end).

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use super::Kernel;
use super::cpu::{Float, rows};

/// `softmax(q·kᵀ·scale [+ causal mask])` with a fused backward; q `(B, A, Sq, D)` and k
/// `(B, G, Sk, D)` contiguous, `G` dividing `A`. With a
/// `window` (a causal sliding window), query `i` sees only the keys `i − window + 1 ..= i`.
pub fn attn_probs(
    q: &Tensor,
    k: &Tensor,
    scale: f32,
    causal: bool,
    window: Option<usize>,
) -> Result<Tensor> {
    q.apply_op2(
        k,
        AttnProbsOp {
            scale,
            causal,
            window: window.unwrap_or(0),
        },
    )
}

struct AttnProbsOp {
    scale: f32,
    causal: bool,
    window: usize,
}

/// The visible keys `lo..hi` of row `r` (query `r % sq` of its head) over `sk` keys.
fn visible(r: usize, sq: usize, sk: usize, causal: bool, window: usize) -> (usize, usize) {
    if !causal {
        return (0, sk);
    }
    let hi = r % sq + 1 + (sk - sq);
    let lo = if window > 0 {
        hi.saturating_sub(window)
    } else {
        0
    };
    (lo, hi)
}

/// Scale, mask and softmax one row of scores in place; keys `lo..hi` are visible.
fn softmax_row<T: Float>(row: &mut [T], (lo, hi): (usize, usize), scale: f32) {
    let (before, rest) = row.split_at_mut(lo.min(row.len()));
    before.iter_mut().for_each(|v| *v = T::of(0.0));
    let (seen, hidden) = rest.split_at_mut((hi - lo).min(rest.len()));
    let mut m = f32::NEG_INFINITY;
    for v in seen.iter() {
        m = m.max(v.f() * scale);
    }
    let mut sum = 0.0;
    for v in seen.iter_mut() {
        let e = (v.f() * scale - m).exp();
        sum += e;
        *v = T::of(e);
    }
    for v in seen.iter_mut() {
        *v = T::of(v.f() / sum);
    }
    hidden.iter_mut().for_each(|v| *v = T::of(0.0));
}

impl AttnProbsOp {
    /// The products `B·G`, the rows of each `r·Sq`, the keys `Sk`, the head size `D`, and
    /// q's layout seen as `(B, G, r·Sq, D)` (the rank of k's, as candle's matmul wants).
    fn dims(&self, l1: &Layout, l2: &Layout) -> Result<(usize, usize, usize, usize, Layout)> {
        let (b, a, sq, d) = l1.shape().dims4()?;
        let (b2, g, sk, d2) = l2.shape().dims4()?;
        if (b, d) != (b2, d2) || g == 0 || !a.is_multiple_of(g) || (self.causal && sk < sq) {
            candle_core::bail!(
                "attn_probs: q {:?} and k {:?} do not match",
                l1.shape(),
                l2.shape()
            )
        }
        if !l1.is_contiguous() {
            candle_core::bail!("attn_probs: q must be contiguous")
        }
        let rows = a / g * sq;
        let lq = Layout::contiguous_with_offset((b, g, rows, d), l1.start_offset());
        Ok((b * g, rows, sk, d, lq))
    }

    fn softmax<T: Float>(&self, p: &mut [T], sq: usize, sk: usize) {
        let (causal, scale, window) = (self.causal, self.scale, self.window);
        rows(p, sk, |r, row| {
            softmax_row(row, visible(r, sq, sk, causal, window), scale)
        });
    }

    fn kernel(&self) -> Kernel {
        Kernel::AttnProbs {
            scale: self.scale,
            causal: self.causal,
            window: self.window,
        }
    }
}

impl CustomOp2 for AttnProbsOp {
    fn name(&self) -> &'static str {
        self.kernel().name()
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (bg, rows, sk, d, lq) = self.dims(l1, l2)?;
        let (b, sq, g) = (
            l1.shape().dims()[0],
            l1.shape().dims()[2],
            l2.shape().dims()[1],
        );
        let mut p = s1.matmul(s2, (bg, rows, sk, d), &lq, &l2.transpose(2, 3)?)?;
        match &mut p {
            CpuStorage::F32(v) => self.softmax(v, sq, sk),
            CpuStorage::F16(v) => self.softmax(v, sq, sk),
            CpuStorage::BF16(v) => self.softmax(v, sq, sk),
            other => candle_core::bail!("attn_probs: unsupported type {:?}", other.dtype()),
        }
        Ok((p, Shape::from_dims(&[b, g, rows, sk])))
    }

    /// cuBLAS's `q·kᵀ` into the output, then the scale, mask and softmax in place.
    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let (bg, rows, sk, d, lq) = self.dims(l1, l2)?;
        let (b, sq, g) = (
            l1.shape().dims()[0],
            l1.shape().dims()[2],
            l2.shape().dims()[1],
        );
        let mut p = s1.matmul(s2, (bg, rows, sk, d), &lq, &l2.transpose(2, 3)?)?;
        super::cuda::attn_softmax(&mut p, sq, sk, self.scale, self.causal, self.window)?;
        Ok((p, Shape::from_dims(&[b, g, rows, sk])))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        self.kernel().backward2(&[q, k], res, grad)
    }
}
