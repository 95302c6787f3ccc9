//! Memory-efficient attention (CPU): softmax(q·kᵀ/√D [+ causal mask])·v without ever holding
//! the `(S, S)` score matrix. Causal for the GPT decoder (query `i` sees keys `0..=i`; with a
//! sliding window `W`, keys `i − W + 1 ..= i` only, the others never computed), full for the
//! ViT encoder (every query sees every key).
//!
//! A candle `CustomOp3` on q `(B, A, S, D)` and k, v `(B, G, S, D)` with `G` dividing `A`
//! (grouped-query attention: query head `h` of a batch row reads key/value head `h / (A/G)`,
//! so the keys and values are never repeated per query head), contiguous f32, f16 or bf16;
//! arithmetic in f32 (the exponentials a block of scores at a time by `simd::exp`, within 2 ulp
//! of the C library's), results stored in the inputs' type. The forward runs an online
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

use super::kernels::cpu::{Float, same};
use super::kernels::simd::{self, multiversion};

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

/// Keys scored at once, into a buffer on the stack (so the op allocates what it always did).
const BLOCK: usize = 64;

/// The longest row whose scores the backward's first pass keeps on the stack (scored once for
/// its statistics and its gradient; a longer row is scored twice, its statistics online).
const ROW: usize = 1024;

/// The online softmax of one query row `qi` against key head `kv` over `keys`, the keys
/// scored in blocks: returns the maximum `m` and sum `l`; `rescale(acc, r)` is called when
/// the running maximum grows (what `acc` summed so far times `r`), `each(acc, j, p)` with every
/// key's `p = e^(x_j − m)` at the maximum so far.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn online_softmax<T: Float, A: ?Sized>(
    qi: &[T],
    k: Rows<T>,
    kv: usize,
    keys: Range<usize>,
    scale: f32,
    acc: &mut A,
    rescale: impl Fn(&mut A, f32),
    each: impl Fn(&mut A, usize, f32),
) -> (f32, f32) {
    let mut xs = [0f32; BLOCK];
    let (mut m, mut l) = (f32::NEG_INFINITY, 0f32);
    let mut j0 = keys.start;
    while j0 < keys.end {
        let n = (keys.end - j0).min(BLOCK);
        let mut bm = f32::NEG_INFINITY;
        for (t, x) in xs[..n].iter_mut().enumerate() {
            *x = simd::dot(qi, k.row(kv, j0 + t)) * scale;
            bm = bm.max(*x);
        }
        if bm > m {
            let r = (m - bm).exp();
            l *= r;
            rescale(acc, r);
            m = bm;
        }
        xs[..n].iter_mut().for_each(|x| *x -= m);
        exp_in_place(&mut xs[..n]);
        for (t, &p) in xs[..n].iter().enumerate() {
            l += p;
            each(acc, j0 + t, p);
        }
        j0 += n;
    }
    (m, l)
}

/// `x ← eˣ` over a block of scores by [`simd::exp`] (a loop the compiler vectorises, within
/// 2 ulp of the C library's `expf`; arguments here are ≤ 0, those below −87 read as −87).
#[inline(always)]
fn exp_in_place(xs: &mut [f32]) {
    xs.iter_mut().for_each(|x| *x = simd::exp(*x));
}

/// One query row of one head: its softmax's `(m, l)`, `acc` left holding `Σ_j e^(x_j − m)·v_j`.
#[inline(always)]
fn attend_row<T: Float>(
    qi: &[T],
    k: Rows<T>,
    v: Rows<T>,
    kv: usize,
    keys: Range<usize>,
    scale: f32,
    acc: &mut [f32],
) -> (f32, f32) {
    acc.iter_mut().for_each(|x| *x = 0.0);
    online_softmax(qi, k, kv, keys, scale, acc, simd::scale, |acc, j, p| {
        simd::axpy(acc, p, v.row(kv, j))
    })
}

multiversion!(fn attend_row_fast<T: Float>(
    qi: &[T],
    k: Rows<T>,
    v: Rows<T>,
    kv: usize,
    keys: Range<usize>,
    scale: f32,
    acc: &mut [f32],
) -> (f32, f32) = attend_row);

/// A row's maximum and softmax denominator over `keys` of key head `hk`.
#[inline(always)]
fn row_stats<T: Float>(
    qi: &[T],
    k: Rows<T>,
    hk: usize,
    keys: Range<usize>,
    scale: f32,
) -> (f32, f32) {
    online_softmax(qi, k, hk, keys, scale, &mut (), |_, _| {}, |_, _, _| {})
}

/// Pass 1 of the backward for one query row (`qi`, its output's gradient `gi` and output `oi`):
/// its statistics `(m, l, dO·O)`, and `dQ_i·√D` accumulated into `acc`; a row of up to [`ROW`]
/// keys is scored once (its scores on the stack), a longer one twice.
#[inline(always)]
fn query_grad<T: Float>(
    [qi, gi, oi]: [&[T]; 3],
    k: Rows<T>,
    v: Rows<T>,
    hk: usize,
    keys: Range<usize>,
    scale: f32,
    acc: &mut [f32],
) -> (f32, f32, f32) {
    let di = simd::dot(gi, oi);
    acc.iter_mut().for_each(|x| *x = 0.0);
    // Key `j`'s term, its `e^(x_j − m)` = `e` over the row's sum `l`: `dS_ij·k_j`.
    let mut add = |j: usize, e: f32, l: f32| {
        let ds = e / l * (simd::dot(gi, v.row(hk, j)) - di) * scale;
        simd::axpy(acc, ds, k.row(hk, j));
    };
    if keys.len() <= ROW {
        // The row's scores once, on the stack: its maximum, its exponentials, their sum.
        let mut xs = [0f32; ROW];
        let xs = &mut xs[..keys.len()];
        let mut m = f32::NEG_INFINITY;
        for (t, x) in xs.iter_mut().enumerate() {
            *x = simd::dot(qi, k.row(hk, keys.start + t)) * scale;
            m = m.max(*x);
        }
        xs.iter_mut().for_each(|x| *x -= m);
        exp_in_place(xs);
        let l = xs.iter().fold(0f32, |l, e| l + e);
        for (t, &e) in xs.iter().enumerate() {
            add(keys.start + t, e, l);
        }
        return (m, l, di);
    }
    let (m, l) = row_stats(qi, k, hk, keys.clone(), scale);
    let mut es = [0f32; BLOCK];
    for j0 in keys.clone().step_by(BLOCK) {
        let es = &mut es[..(keys.end - j0).min(BLOCK)];
        for (t, e) in es.iter_mut().enumerate() {
            *e = simd::dot(qi, k.row(hk, j0 + t)) * scale - m;
        }
        exp_in_place(es);
        for (t, &e) in es.iter().enumerate() {
            add(j0 + t, e, l);
        }
    }
    (m, l, di)
}

multiversion!(fn query_grad_fast<T: Float>(
    rows: [&[T]; 3],
    k: Rows<T>,
    v: Rows<T>,
    hk: usize,
    keys: Range<usize>,
    scale: f32,
    acc: &mut [f32],
) -> (f32, f32, f32) = query_grad);

/// Pass 2 of the backward for key `j` of key head `hk` (`kj`, `vj`): `dK_j` into `acc` and
/// `dV_j` into `acc_v` over the `queries` that see it in each of the group's `r` query heads
/// (`[hk, r, S]`; row `t·S + i` of `stats` is query head `hk·r + t` at position `i`).
#[inline(always)]
fn key_grad<T: Float>(
    [kj, vj]: [&[T]; 2],
    [q, g]: [Rows<T>; 2],
    queries: Range<usize>,
    [hk, r, s]: [usize; 3],
    stats: &[(f32, f32, f32)],
    scale: f32,
    [acc, acc_v]: [&mut [f32]; 2],
) {
    acc.iter_mut().for_each(|x| *x = 0.0);
    acc_v.iter_mut().for_each(|x| *x = 0.0);
    let mut es = [0f32; BLOCK];
    for t in 0..r {
        let h = hk * r + t;
        for i0 in queries.clone().step_by(BLOCK) {
            let es = &mut es[..(queries.end - i0).min(BLOCK)];
            for (u, e) in es.iter_mut().enumerate() {
                *e = simd::dot(q.row(h, i0 + u), kj) * scale - stats[t * s + i0 + u].0;
            }
            exp_in_place(es);
            for (u, e) in es.iter().enumerate() {
                let i = i0 + u;
                let (_, l, di) = stats[t * s + i];
                let (qi, gi) = (q.row(h, i), g.row(h, i));
                let p = e / l;
                let ds = p * (simd::dot(gi, vj) - di) * scale;
                simd::axpy(acc, ds, qi);
                simd::axpy(acc_v, p, gi);
            }
        }
    }
}

multiversion!(fn key_grad_fast<T: Float>(
    kv: [&[T]; 2],
    qg: [Rows<T>; 2],
    queries: Range<usize>,
    group: [usize; 3],
    stats: &[(f32, f32, f32)],
    scale: f32,
    accs: [&mut [f32]; 2],
) -> () = key_grad);

/// The rows of a 4-d operand read through its strides (its last dimension contiguous), so the
/// op takes the transposed head split of a projection without a contiguous copy: row `(h, i)`
/// of head `h` (batch and head flattened, `heads` per batch row) at position `i` starts at
/// `start + (h / heads)·sb + (h mod heads)·sh + i·ss`.
#[derive(Debug, Clone, Copy)]
struct Rows<'a, T> {
    data: &'a [T],
    start: usize,
    sb: usize,
    sh: usize,
    ss: usize,
    heads: usize,
    d: usize,
}

impl<'a, T> Rows<'a, T> {
    /// `layout` of dims `(B, n, S, D)` (`heads_last`: `(B, S, n, D)`), any strides but a
    /// contiguous last dimension.
    fn new(data: &'a [T], layout: &Layout, heads_last: bool, what: &str) -> Result<Self> {
        let (dims, st) = (layout.dims(), layout.stride());
        if dims.len() != 4 || (dims[3] > 1 && st[3] != 1) {
            bail!(
                "efficient attention: {what} {dims:?} (strides {st:?}) needs a contiguous last dimension"
            )
        }
        let (h, s) = if heads_last { (2, 1) } else { (1, 2) };
        Ok(Self {
            data,
            start: layout.start_offset(),
            sb: st[0],
            sh: st[h],
            ss: st[s],
            heads: dims[h],
            d: dims[3],
        })
    }

    #[inline(always)]
    fn row(&self, h: usize, i: usize) -> &'a [T] {
        let o = self.start + (h / self.heads) * self.sb + (h % self.heads) * self.sh + i * self.ss;
        &self.data[o..o + self.d]
    }
}

impl EfficientAttention {
    /// `r` query heads per key/value head (grouped-query attention: query head `h` reads key
    /// head `h / r`); q `(B, A, S, D)`, k and v `(B, G, S, D)` read through their strides.
    /// The output is written `(B, S, A, D)` (heads last, so merging the heads is a view), in
    /// parallel over its `B·S` positions.
    fn forward<T: Float>(&self, [q, k, v]: [Rows<T>; 3], s: usize, r: usize, len: usize) -> Vec<T> {
        let (scale, d, a) = (self.scale, q.d, q.heads);
        let mut out = vec![T::of(0.0); len];
        out.par_chunks_mut(a * d).enumerate().for_each_init(
            || vec![0f32; d],
            |acc, (c, o)| {
                let (b, i) = (c / s, c % s);
                for hh in 0..a {
                    let h = b * a + hh;
                    let keys = self.keys(i, s);
                    let (_, l) = attend_row_fast(q.row(h, i), k, v, h / r, keys, scale, acc);
                    for (o, a) in o[hh * d..(hh + 1) * d].iter_mut().zip(acc.iter()) {
                        *o = T::of(a / l);
                    }
                }
            },
        );
        out
    }

    /// The three gradients, contiguous in their inputs' type and shape: per key/value head,
    /// its `r` query heads' rows (`r·S`, row `ρ` of query head `hk·r + ρ/S` at position
    /// `ρ mod S`) are one block, so `dK` and `dV` sum over the group without a per-query-head
    /// copy. `o` and `g` (the output and its gradient) are `(B, S, A, D)`.
    #[allow(clippy::type_complexity)]
    fn backward<T: Float>(
        &self,
        [q, k, v, o, g]: [Rows<T>; 5],
        s: usize,
        r: usize,
        [q_len, kv_len]: [usize; 2],
    ) -> (Vec<T>, Vec<T>, Vec<T>) {
        let (scale, d) = (self.scale, q.d);
        let (mut dq, mut dk, mut dv) = (
            vec![T::of(0.0); q_len],
            vec![T::of(0.0); kv_len],
            vec![T::of(0.0); kv_len],
        );
        let n = s * d;
        dq.par_chunks_mut(r * n)
            .zip(dk.par_chunks_mut(n))
            .zip(dv.par_chunks_mut(n))
            .enumerate()
            .for_each(|(hk, ((dq, dk), dv))| {
                let head = |row: usize| (hk * r + row / s, row % s);
                // Pass 1, by query row: its statistics, then dQ_i.
                let mut stats = vec![(0f32, 0f32, 0f32); r * s];
                let mut acc = vec![0f32; d];
                for (row, st) in stats.iter_mut().enumerate() {
                    let (h, i) = head(row);
                    let rows = [q.row(h, i), g.row(h, i), o.row(h, i)];
                    *st = query_grad_fast(rows, k, v, hk, self.keys(i, s), scale, &mut acc);
                    for (x, a) in dq[row * d..(row + 1) * d].iter_mut().zip(&acc) {
                        *x = T::of(*a);
                    }
                }
                // Pass 2, by key: dK_j and dV_j over the group's queries that see key j.
                let mut acc_v = vec![0f32; d];
                for j in 0..s {
                    let kv = [k.row(hk, j), v.row(hk, j)];
                    let (group, queries) = ([hk, r, s], self.queries(j, s));
                    let accs = [&mut acc[..], &mut acc_v[..]];
                    key_grad_fast(kv, [q, g], queries, group, &stats, scale, accs);
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

impl EfficientAttention {
    /// The attention of q `(B, A, S, D)` over k, v `(B, G, S, D)` (any strides with a
    /// contiguous last dimension), as a `(B, A, S, D)` view of the op's `(B, S, A, D)` output.
    pub fn apply(&self, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Tensor> {
        q.apply_op3(k, v, *self)?.transpose(1, 2)
    }
}

impl CustomOp3 for EfficientAttention {
    fn name(&self) -> &'static str {
        match (self.causal, self.window) {
            (false, _) => "efficient-attention",
            (true, 0) => "efficient-causal-attention",
            (true, _) => "efficient-windowed-attention",
        }
    }

    /// q `(B, A, S, D)`, k and v `(B, G, S, D)` → `(B, S, A, D)`.
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (b, a, s, d) = l1.shape().dims4()?;
        let r = group(l1.shape(), l2.shape(), l3.shape())?;
        let op = self.name();
        macro_rules! run {
            ($t:ty, $q:expr) => {{
                let rows = [
                    Rows::new($q.as_slice(), l1, false, "q")?,
                    Rows::new(same::<$t>(op, s2)?, l2, false, "k")?,
                    Rows::new(same::<$t>(op, s3)?, l3, false, "v")?,
                ];
                let out = self.forward::<$t>(rows, s, r, b * s * a * d);
                <$t as candle_core::WithDType>::to_cpu_storage_owned(out)
            }};
        }
        let out = match s1 {
            CpuStorage::F32(q) => run!(f32, q),
            CpuStorage::F16(q) => run!(half::f16, q),
            CpuStorage::BF16(q) => run!(half::bf16, q),
            _ => bail!("efficient attention: q must be f32, f16 or bf16"),
        };
        Ok((out, Shape::from((b, s, a, d))))
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
        let (_b, _a, s, _d) = lq.shape().dims4()?;
        let r = group(lq.shape(), lk.shape(), lv.shape())?;
        let (shape, kv_shape) = (lq.shape().clone(), lk.shape().clone());
        let lens = [shape.elem_count(), kv_shape.elem_count()];
        let op = self.name();
        macro_rules! run {
            ($t:ty) => {{
                let rows = [
                    Rows::new(same::<$t>(op, cq)?, lq, false, "q")?,
                    Rows::new(same::<$t>(op, ck)?, lk, false, "k")?,
                    Rows::new(same::<$t>(op, cv)?, lv, false, "v")?,
                    Rows::new(same::<$t>(op, co)?, lo, true, "out")?,
                    Rows::new(same::<$t>(op, cg)?, lg, true, "grad")?,
                ];
                let (dq, dk, dv) = self.backward::<$t>(rows, s, r, lens);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `dQ_i·√D` of one query row against a reference in f64, for a row short enough to keep
    /// its scores on the stack and for one longer than [`ROW`] (statistics online, scored twice):
    /// both paths give the same gradient and the same statistics.
    #[test]
    fn query_grad_short_and_long_rows_match_f64() {
        let (d, n) = (8, ROW + 77);
        // A deterministic spread of values in [−1, 1).
        let fill = |seed: usize, len: usize| -> Vec<f32> {
            (0..len)
                .map(|i| (((i * 7919 + seed * 104_729) % 2003) as f32 / 1001.5) - 1.0)
                .collect()
        };
        let (k, v) = (fill(1, n * d), fill(2, n * d));
        let (qi, gi, oi) = (fill(3, d), fill(4, d), fill(5, d));
        fn rows(data: &[f32], d: usize) -> Rows<'_, f32> {
            Rows {
                data,
                start: 0,
                sb: data.len(),
                sh: data.len(),
                ss: d,
                heads: 1,
                d,
            }
        }
        let scale = 0.5f32;
        for keys in [0..ROW, 0..n, 40..n] {
            let mut acc = vec![0f32; d];
            let (m, l, di) = query_grad(
                [&qi[..], &gi[..], &oi[..]],
                rows(&k, d),
                rows(&v, d),
                0,
                keys.clone(),
                scale,
                &mut acc,
            );
            // The reference: every score, its softmax and dS in f64.
            let dot = |a: &[f32], b: &[f32]| {
                a.iter()
                    .zip(b)
                    .map(|(x, y)| *x as f64 * *y as f64)
                    .sum::<f64>()
            };
            let x: Vec<f64> = keys
                .clone()
                .map(|j| dot(&qi, &k[j * d..(j + 1) * d]) * scale as f64)
                .collect();
            let mx = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = x.iter().map(|x| (x - mx).exp()).sum();
            let di64 = dot(&gi, &oi);
            let mut want = vec![0f64; d];
            for (t, j) in keys.clone().enumerate() {
                let p = (x[t] - mx).exp() / sum;
                let ds = p * (dot(&gi, &v[j * d..(j + 1) * d]) - di64) * scale as f64;
                for (w, kk) in want.iter_mut().zip(&k[j * d..(j + 1) * d]) {
                    *w += ds * *kk as f64;
                }
            }
            assert!(((m as f64) - mx).abs() < 1e-6, "{keys:?}: max {m} vs {mx}");
            assert!(
                ((l as f64) - sum).abs() / sum < 1e-5,
                "{keys:?}: sum {l} vs {sum}"
            );
            assert!(((di as f64) - di64).abs() < 1e-5);
            let size = want.iter().fold(0f64, |a, w| a.max(w.abs()));
            for (a, w) in acc.iter().zip(&want) {
                assert!(
                    (*a as f64 - w).abs() <= 1e-5 * size.max(1e-3),
                    "{keys:?}: {a} vs {w}"
                );
            }
        }
    }
}
