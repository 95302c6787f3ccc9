//! Pieces the LLaMA family's attention shares, whatever the model: the rotary tables, the
//! composed "rotate half" rotary embedding, and the repetition of K/V heads to the query heads
//! (grouped-query attention).

use candle_core::{DType, Device, Result, Tensor};

use super::shapes::RopeScaling;
use super::tensor_ops::TensorOps;

/// The rotary tables `cos`, `sin`, each `(S_max, D/2)`: angle `p · f_j` for position `p` and
/// inverse frequency `f_j = θ^(−2j/D)` (or as `scaling` stretches it, cos and sin then times its
/// attention factor), computed in f64, rounded to f32, then converted to `dtype` (as
/// candle-transformers' llama does).
pub fn rotary_tables(
    max_seq: usize,
    head_dim: usize,
    theta: f64,
    scaling: Option<&RopeScaling>,
    dtype: DType,
    device: &Device,
) -> Result<(Tensor, Tensor)> {
    let half = head_dim / 2;
    let (inv_freq, factor) = RopeScaling::inv_freq(scaling, head_dim, theta);
    let angle = |k: usize| (k / half) as f64 * inv_freq[k % half];
    // Exact-size iterators: the Vecs the tensors keep have no spare capacity.
    let cos: Vec<f32> = (0..max_seq * half)
        .map(|k| (angle(k).cos() * factor) as f32)
        .collect();
    let sin: Vec<f32> = (0..max_seq * half)
        .map(|k| (angle(k).sin() * factor) as f32)
        .collect();
    let cos = Tensor::from_vec(cos, (max_seq, half), device)?.to_dtype(dtype)?;
    let sin = Tensor::from_vec(sin, (max_seq, half), device)?.to_dtype(dtype)?;
    Ok((cos, sin))
}

/// The rotary embedding of `x (B, n, S, D)` at positions `offset..offset + S`, "rotate half":
/// `[x₁·cos − x₂·sin, x₂·cos + x₁·sin]` with `x₁, x₂` the two halves of the last dimension.
/// Each product and sum is a fresh `(B, n, S, D/2)` tensor, the result a fresh `(B, n, S, D)`;
/// the products are dropped as soon as their sum exists.
pub fn apply_rotary<T: TensorOps>(x: &T, cos: &T, sin: &T, offset: usize) -> Result<T> {
    let (s, d) = (x.dims()[2], x.dims()[3]);
    let cos = cos.narrow(0, offset, s)?;
    let sin = sin.narrow(0, offset, s)?;
    let x1 = x.narrow(3, 0, d / 2)?;
    let x2 = x.narrow(3, d / 2, d / 2)?;
    let (a, b) = (x1.broadcast_mul(&cos)?, x2.broadcast_mul(&sin)?);
    let r1 = a.sub(&b)?;
    drop((a, b));
    let (a, b) = (x2.broadcast_mul(&cos)?, x1.broadcast_mul(&sin)?);
    let r2 = a.add(&b)?;
    drop((a, b));
    T::cat(&[&r1, &r2], 3)
}

/// candle-transformers' `utils::repeat_kv`: `(B, G, T, D)` → `(B, G·n, T, D)` by a `cat` of
/// `n` copies along T and a reshape (the same tensor when `n` is 1).
pub fn repeat_kv<T: TensorOps>(x: T, n: usize) -> Result<T> {
    if n == 1 {
        return Ok(x);
    }
    let d = x.dims();
    T::cat(&vec![&x; n], 2)?.reshape(&[d[0], d[1] * n, d[2], d[3]])
}
