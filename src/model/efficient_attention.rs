//! Memory-efficient attention (CPU): softmax(q·kᵀ/√D [+ causal mask])·v without ever holding
//! the `(S, S)` score matrix. Causal for the GPT decoder (query `i` sees keys `0..=i`; with a
//! sliding window `W`, keys `i − W + 1 ..= i` only, the others never computed), full for the
//! ViT encoder (every query sees every key).
//!
//! A candle `CustomOp3` on q `(B, A, S, D)` and k, v `(B, G, S, D)` with `G` dividing `A`
//! (grouped-query attention: query head `h` of a batch row reads key/value head `h / (A/G)`,
//! so the keys and values are never repeated per query head), contiguous f32, f16 or bf16;
//! arithmetic in f32, results stored in the inputs' type. The forward runs an online
//! softmax per query row (running maximum and sum, rescaling the accumulator when the maximum
//! grows) and keeps nothing but its output `(B, A, S, D)`. The backward recomputes each row's
//! scores from q and k in two passes per head: by query row (the row's maximum, sum and
//! `dO·O`, kept in f32 per row, then `dQ_i = Σ_j dS_ij·k_j/√D`), and by key (`dK_j = Σ_i
//! dS_ij·q_i/√D`, `dV_j = Σ_i p_ij·dO_i`), with `dS = p·(dO·v − dO·O)`. Each gradient row is
//! accumulated in f32 and written once, so it allocates the three gradients (q's, k's and v's
//! shapes) in the inputs' type plus `3·r·S` f32 of row statistics per key head being
//! processed (the backward runs per key head over its `r = A/G` query heads' rows).
//!
//! Memory against the standard attention of `model::transformer`: the graph keeps `e·B·S·H` (the
//! output) instead of `6·e·A·B·S²` + `2·e·A·B·S` (scores, mask add, softmax pieces), so the
//! activations lose their `A·B·S²` term; the backward's peak loses it too. There is no CUDA
//! kernel: on CUDA the op fails with a clear error (a fused GPU kernel is out of scope).

use std::ops::Range;

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, bail};
use rayon::prelude::*;

use super::kernels::cpu::{Float, same, slice};

/// The op; `scale` is `1/√D`.
#[derive(Debug, Clone, Copy)]
pub struct EfficientAttention {
    pub scale: f32,
    /// Query `i` attends to keys `0..=i` (decoder); otherwise to all `S` keys (encoder).
    pub causal: bool,
    /// Causal only: a sliding window, query `i` attends to keys `i − window + 1 ..= i`; 0 for
    /// none.
    pub window: usize,
}

impl EfficientAttention {
    /// The keys query `i` attends to, of `s`.
    fn keys(&self, i: usize, s: usize) -> Range<usize> {
        match (self.causal, self.window) {
            (false, _) => 0..s,
            (true, 0) => 0..i + 1,
            (true, w) => (i + 1).saturating_sub(w)..i + 1,
        }
    }

    /// The queries that see key `j`, of `s`.
    fn queries(&self, j: usize, s: usize) -> Range<usize> {
        match (self.causal, self.window) {
            (false, _) => 0..s,
            (true, 0) => j..s,
            (true, w) => j..s.min(j + w),
        }
    }
}

fn dot<T: Float>(a: &[T], b: &[T]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x.f() * y.f()).sum()
}

/// A row's maximum and softmax denominator over `keys`.
fn row_stats<T: Float>(qi: &[T], k: &[T], keys: Range<usize>, d: usize, scale: f32) -> (f32, f32) {
    let mut m = f32::NEG_INFINITY;
    for j in keys.clone() {
        m = m.max(dot(qi, &k[j * d..(j + 1) * d]) * scale);
    }
    let mut l = 0.0;
    for j in keys {
        l += (dot(qi, &k[j * d..(j + 1) * d]) * scale - m).exp();
    }
    (m, l)
}

impl EfficientAttention {
    /// `r` query heads per key/value head (grouped-query attention: query head `h` reads key
    /// head `h / r`); every head `(S, D)`.
    fn forward<T: Float>(&self, [q, k, v]: [&[T]; 3], s: usize, d: usize, r: usize) -> Vec<T> {
        let scale = self.scale;
        let n = s * d;
        let mut out = vec![T::of(0.0); q.len()];
        out.par_chunks_mut(n).enumerate().for_each(|(h, o)| {
            let kv = h / r;
            let (q, k, v) = (
                &q[h * n..(h + 1) * n],
                &k[kv * n..(kv + 1) * n],
                &v[kv * n..(kv + 1) * n],
            );
            let mut acc = vec![0f32; d];
            for i in 0..s {
                let qi = &q[i * d..(i + 1) * d];
                let (mut m, mut l) = (f32::NEG_INFINITY, 0f32);
                acc.iter_mut().for_each(|x| *x = 0.0);
                for j in self.keys(i, s) {
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
                        *a += p * vj.f();
                    }
                }
                for (o, a) in o[i * d..(i + 1) * d].iter_mut().zip(&acc) {
                    *o = T::of(a / l);
                }
            }
        });
        out
    }

    /// The three gradients, each in its input's type and shape: per key/value head, its `r`
    /// query heads' rows (`r·S`, row `ρ` at position `ρ mod S`) are one block, so `dK` and
    /// `dV` sum over the group without a per-query-head copy.
    #[allow(clippy::type_complexity)]
    fn backward<T: Float>(
        &self,
        [q, k, v, o, g]: [&[T]; 5],
        s: usize,
        d: usize,
        r: usize,
    ) -> (Vec<T>, Vec<T>, Vec<T>) {
        let scale = self.scale;
        let (mut dq, mut dk, mut dv) = (
            vec![T::of(0.0); q.len()],
            vec![T::of(0.0); k.len()],
            vec![T::of(0.0); v.len()],
        );
        let n = s * d;
        dq.par_chunks_mut(r * n)
            .zip(dk.par_chunks_mut(n))
            .zip(dv.par_chunks_mut(n))
            .enumerate()
            .for_each(|(h, ((dq, dk), dv))| {
                let rq = h * r * n..(h + 1) * r * n;
                let rk = h * n..(h + 1) * n;
                let (q, k, v, o, g) = (
                    &q[rq.clone()],
                    &k[rk.clone()],
                    &v[rk],
                    &o[rq.clone()],
                    &g[rq],
                );
                // Pass 1, by query row: its statistics, then dQ_i.
                let mut stats = vec![(0f32, 0f32, 0f32); r * s];
                let mut acc = vec![0f32; d];
                for (row, st) in stats.iter_mut().enumerate() {
                    let (qi, gi) = (&q[row * d..(row + 1) * d], &g[row * d..(row + 1) * d]);
                    let keys = self.keys(row % s, s);
                    let (m, l) = row_stats(qi, k, keys.clone(), d, scale);
                    let di = dot(gi, &o[row * d..(row + 1) * d]);
                    *st = (m, l, di);
                    acc.iter_mut().for_each(|x| *x = 0.0);
                    for j in keys {
                        let (kj, vj) = (&k[j * d..(j + 1) * d], &v[j * d..(j + 1) * d]);
                        let p = (dot(qi, kj) * scale - m).exp() / l;
                        let ds = p * (dot(gi, vj) - di) * scale;
                        for (x, kv) in acc.iter_mut().zip(kj) {
                            *x += ds * kv.f();
                        }
                    }
                    for (x, a) in dq[row * d..(row + 1) * d].iter_mut().zip(&acc) {
                        *x = T::of(*a);
                    }
                }
                // Pass 2, by key: dK_j and dV_j over the group's queries that see key j.
                let mut acc_v = vec![0f32; d];
                for j in 0..s {
                    let (kj, vj) = (&k[j * d..(j + 1) * d], &v[j * d..(j + 1) * d]);
                    acc.iter_mut().for_each(|x| *x = 0.0);
                    acc_v.iter_mut().for_each(|x| *x = 0.0);
                    let queries = self.queries(j, s);
                    let rows = (0..r).flat_map(|head| queries.clone().map(move |i| head * s + i));
                    for row in rows {
                        let (m, l, di) = stats[row];
                        let (qi, gi) = (&q[row * d..(row + 1) * d], &g[row * d..(row + 1) * d]);
                        let p = (dot(qi, kj) * scale - m).exp() / l;
                        let ds = p * (dot(gi, vj) - di) * scale;
                        for ((x, xv), (qv, gv)) in
                            acc.iter_mut().zip(acc_v.iter_mut()).zip(qi.iter().zip(gi))
                        {
                            *x += ds * qv.f();
                            *xv += p * gv.f();
                        }
                    }
                    for ((x, xv), (a, av)) in dk[j * d..(j + 1) * d]
                        .iter_mut()
                        .zip(dv[j * d..(j + 1) * d].iter_mut())
                        .zip(acc.iter().zip(&acc_v))
                    {
                        *x = T::of(*a);
                        *xv = T::of(*av);
                    }
                }
            });
        (dq, dk, dv)
    }
}

/// Query heads per key/value head of q `(B, A, S, D)` and k, v `(B, G, S, D)`, checked.
fn group(q: &Shape, k: &Shape, v: &Shape) -> Result<usize> {
    let (b, a, s, d) = q.dims4()?;
    let (b2, g, s2, d2) = k.dims4()?;
    if (b, s, d) != (b2, s2, d2) || k != v || g == 0 || !a.is_multiple_of(g) {
        bail!("efficient attention: q {q:?}, k {k:?}, v {v:?} do not match")
    }
    Ok(a / g)
}

impl CustomOp3 for EfficientAttention {
    fn name(&self) -> &'static str {
        match (self.causal, self.window) {
            (false, _) => "efficient-attention",
            (true, 0) => "efficient-causal-attention",
            (true, _) => "efficient-windowed-attention",
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
        let (_b, _a, s, d) = l1.shape().dims4()?;
        let r = group(l1.shape(), l2.shape(), l3.shape())?;
        let op = self.name();
        macro_rules! run {
            ($t:ty, $q:expr) => {{
                let q = slice($q, l1, "efficient attention", "q")?;
                let k = slice(same::<$t>(op, s2)?, l2, "efficient attention", "k")?;
                let v = slice(same::<$t>(op, s3)?, l3, "efficient attention", "v")?;
                let out = self.forward::<$t>([q, k, v], s, d, r);
                <$t as candle_core::WithDType>::to_cpu_storage_owned(out)
            }};
        }
        let out = match s1 {
            CpuStorage::F32(q) => run!(f32, q),
            CpuStorage::F16(q) => run!(half::f16, q),
            CpuStorage::BF16(q) => run!(half::bf16, q),
            _ => bail!("efficient attention: q must be f32, f16 or bf16"),
        };
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        if !q.device().is_cpu() {
            bail!("efficient attention: the backward runs on the CPU only")
        }
        let dev = q.device().clone();
        let grad = grad.contiguous()?;
        let (sq, lq) = q.storage_and_layout();
        let (sk, lk) = k.storage_and_layout();
        let (sv, lv) = v.storage_and_layout();
        let (so, lo) = out.storage_and_layout();
        let (sg, lg) = grad.storage_and_layout();
        fn cpu<'a>(s: &'a candle_core::Storage, w: &str) -> Result<&'a CpuStorage> {
            match s {
                candle_core::Storage::Cpu(c) => Ok(c),
                _ => bail!("efficient attention: {w} is not on the CPU"),
            }
        }
        let (cq, ck, cv, co, cg) = (
            cpu(&sq, "q")?,
            cpu(&sk, "k")?,
            cpu(&sv, "v")?,
            cpu(&so, "out")?,
            cpu(&sg, "grad")?,
        );
        let (_b, _a, s, d) = lq.shape().dims4()?;
        let r = group(lq.shape(), lk.shape(), lv.shape())?;
        let (shape, kv_shape) = (lq.shape().clone(), lk.shape().clone());
        let op = self.name();
        macro_rules! run {
            ($t:ty) => {{
                let slices = [
                    slice(same::<$t>(op, cq)?, lq, "efficient attention", "q")?,
                    slice(same::<$t>(op, ck)?, lk, "efficient attention", "k")?,
                    slice(same::<$t>(op, cv)?, lv, "efficient attention", "v")?,
                    slice(same::<$t>(op, co)?, lo, "efficient attention", "out")?,
                    slice(same::<$t>(op, cg)?, lg, "efficient attention", "grad")?,
                ];
                let (dq, dk, dv) = self.backward::<$t>(slices, s, d, r);
                drop((sq, sk, sv, so, sg));
                (
                    Tensor::from_vec(dq, shape.clone(), &dev)?,
                    Tensor::from_vec(dk, kv_shape.clone(), &dev)?,
                    Tensor::from_vec(dv, kv_shape, &dev)?,
                )
            }};
        }
        let (dq, dk, dv) = match cq {
            CpuStorage::F32(_) => run!(f32),
            CpuStorage::F16(_) => run!(half::f16),
            CpuStorage::BF16(_) => run!(half::bf16),
            _ => bail!("efficient attention: q must be f32, f16 or bf16"),
        };
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}
