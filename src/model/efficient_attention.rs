//! Memory-efficient attention (CPU): softmax(q·kᵀ/√D [+ causal mask])·v without ever holding
//! the `(S, S)` score matrix. Causal for the GPT decoder (query `i` sees keys `0..=i`), full
//! for the ViT encoder (every query sees every key).
//!
//! A candle `CustomOp3` on q, k, v `(B, A, S, D)` (contiguous f32). The forward runs an online
//! softmax per query row (running maximum and sum, rescaling the accumulator when the maximum
//! grows) and keeps nothing but its output `(B, A, S, D)`. The backward recomputes each row's
//! scores from q and k (the row's maximum and sum first, then the probabilities) and
//! accumulates `dV += p·dO`, `dS = p·(dO·v − dO·O)`, `dQ += dS·k/√D`, `dK += dS·q/√D`, so it
//! allocates only the three gradients `(B, A, S, D)` plus one row of scratch per thread.
//!
//! Memory against the standard attention of `model::transformer`: the graph keeps `e·B·S·H` (the
//! output) instead of `6·e·A·B·S²` + `2·e·A·B·S` (scores, mask add, softmax pieces), so the
//! activations lose their `A·B·S²` term; the backward's peak loses it too. There is no CUDA
//! kernel: on CUDA the op fails with a clear error (a fused GPU kernel is out of scope).

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor, bail};
use rayon::prelude::*;

/// The op; `scale` is `1/√D`.
#[derive(Debug, Clone, Copy)]
pub struct EfficientAttention {
    pub scale: f32,
    /// Query `i` attends to keys `0..=i` (decoder); otherwise to all `S` keys (encoder).
    pub causal: bool,
}

impl EfficientAttention {
    /// Keys query `i` attends to, of `s`.
    fn keys(&self, i: usize, s: usize) -> usize {
        if self.causal { i + 1 } else { s }
    }
}

fn contiguous_f32<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> Result<&'a [f32]> {
    let CpuStorage::F32(v) = s else {
        bail!("efficient attention: {what} must be f32")
    };
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&v[a..b]),
        None => bail!("efficient attention: {what} must be contiguous"),
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// A row's maximum and softmax denominator over keys `0..n`.
fn row_stats(qi: &[f32], k: &[f32], n: usize, d: usize, scale: f32) -> (f32, f32) {
    let mut m = f32::NEG_INFINITY;
    for j in 0..n {
        m = m.max(dot(qi, &k[j * d..(j + 1) * d]) * scale);
    }
    let mut l = 0.0;
    for j in 0..n {
        l += (dot(qi, &k[j * d..(j + 1) * d]) * scale - m).exp();
    }
    (m, l)
}

impl CustomOp3 for EfficientAttention {
    fn name(&self) -> &'static str {
        if self.causal {
            "efficient-causal-attention"
        } else {
            "efficient-attention"
        }
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (q, k, v) = (
            contiguous_f32(s1, l1, "q")?,
            contiguous_f32(s2, l2, "k")?,
            contiguous_f32(s3, l3, "v")?,
        );
        let (_b, _a, s, d) = l1.shape().dims4()?;
        if l2.shape() != l1.shape() || l3.shape() != l1.shape() {
            bail!("efficient attention: q, k, v shapes differ")
        }
        let scale = self.scale;
        let mut out = vec![0f32; q.len()];
        out.par_chunks_mut(s * d).enumerate().for_each(|(h, o)| {
            let (q, k, v) = (
                &q[h * s * d..(h + 1) * s * d],
                &k[h * s * d..(h + 1) * s * d],
                &v[h * s * d..(h + 1) * s * d],
            );
            let mut acc = vec![0f32; d];
            for i in 0..s {
                let qi = &q[i * d..(i + 1) * d];
                let (mut m, mut l) = (f32::NEG_INFINITY, 0f32);
                acc.iter_mut().for_each(|x| *x = 0.0);
                for j in 0..self.keys(i, s) {
                    let x = dot(qi, &k[j * d..(j + 1) * d]) * scale;
                    if x > m {
                        let r = (m - x).exp();
                        l *= r;
                        acc.iter_mut().for_each(|a| *a *= r);
                        m = x;
                    }
                    let p = (x - m).exp();
                    l += p;
                    for (a, vj) in acc.iter_mut().zip(&v[j * d..(j + 1) * d]) {
                        *a += p * vj;
                    }
                }
                for (o, a) in o[i * d..(i + 1) * d].iter_mut().zip(&acc) {
                    *o = a / l;
                }
            }
        });
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        if q.dtype() != DType::F32 || !q.device().is_cpu() {
            bail!("efficient attention: the backward runs on the CPU in f32 only")
        }
        let dev = q.device().clone();
        let grad = grad.contiguous()?;
        let (sq, lq) = q.storage_and_layout();
        let (sk, lk) = k.storage_and_layout();
        let (sv, lv) = v.storage_and_layout();
        let (so, lo) = out.storage_and_layout();
        let (sg, lg) = grad.storage_and_layout();
        fn cpu<'a>(s: &'a candle_core::Storage, l: &Layout, w: &str) -> Result<&'a [f32]> {
            match s {
                candle_core::Storage::Cpu(c) => contiguous_f32(c, l, w),
                _ => bail!("efficient attention: {w} is not on the CPU"),
            }
        }
        let (q, k, v, o, g) = (
            cpu(&sq, lq, "q")?,
            cpu(&sk, lk, "k")?,
            cpu(&sv, lv, "v")?,
            cpu(&so, lo, "out")?,
            cpu(&sg, lg, "grad")?,
        );
        let (_b, _a, s, d) = lq.shape().dims4()?;
        let scale = self.scale;
        let (mut dq, mut dk, mut dv) = (
            vec![0f32; q.len()],
            vec![0f32; q.len()],
            vec![0f32; q.len()],
        );
        let n = s * d;
        dq.par_chunks_mut(n)
            .zip(dk.par_chunks_mut(n))
            .zip(dv.par_chunks_mut(n))
            .enumerate()
            .for_each(|(h, ((dq, dk), dv))| {
                let r = h * n..(h + 1) * n;
                let (q, k, v, o, g) = (
                    &q[r.clone()],
                    &k[r.clone()],
                    &v[r.clone()],
                    &o[r.clone()],
                    &g[r],
                );
                for i in 0..s {
                    let (qi, gi) = (&q[i * d..(i + 1) * d], &g[i * d..(i + 1) * d]);
                    let keys = self.keys(i, s);
                    let (m, l) = row_stats(qi, k, keys, d, scale);
                    let di = dot(gi, &o[i * d..(i + 1) * d]);
                    for j in 0..keys {
                        let (kj, vj) = (&k[j * d..(j + 1) * d], &v[j * d..(j + 1) * d]);
                        let p = (dot(qi, kj) * scale - m).exp() / l;
                        for (x, gv) in dv[j * d..(j + 1) * d].iter_mut().zip(gi) {
                            *x += p * gv;
                        }
                        let ds = p * (dot(gi, vj) - di) * scale;
                        for (x, kv) in dq[i * d..(i + 1) * d].iter_mut().zip(kj) {
                            *x += ds * kv;
                        }
                        for (x, qv) in dk[j * d..(j + 1) * d].iter_mut().zip(qi) {
                            *x += ds * qv;
                        }
                    }
                }
            });
        let shape = lq.shape().clone();
        drop((sq, sk, sv, so, sg));
        Ok((
            Some(Tensor::from_vec(dq, shape.clone(), &dev)?),
            Some(Tensor::from_vec(dk, shape.clone(), &dev)?),
            Some(Tensor::from_vec(dv, shape, &dev)?),
        ))
    }
}
