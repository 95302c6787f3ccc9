//! The tiled attention's arithmetic, generic over [`Graph`] (candle's tensors and the replay's):
//! the forward [`TILE`] queries at a time and the backward that recomputes each tile's
//! probabilities from `lse` (see `model::tiled_attention`, which wraps them in a candle op).
//!
//! A sliding window (`window` > 0, causal): a tile of queries at positions `p0..p0+n` reads
//! only the keys `p0 + 1 − W .. p0 + n` ([`keys`]), so its scores are `(n, n + W − 1)` at most
//! instead of `(n, S)`: keys outside the window are neither computed nor kept. The backward adds
//! such a tile's `dK`, `dV` rows into the full-size sums in place ([`accumulate`]).

use candle_core::{Result, bail};

use super::graph::Graph;

/// Queries per tile.
pub const TILE: usize = 128;

/// q `(B, A, S, D)` read per key head, `(B, G, r·S, D)` with `r = A/G` (a view: a group's
/// query heads are contiguous); q itself when `G = A`.
fn grouped<G: Graph>(q: &G, g: usize) -> Result<G> {
    let d = q.dims();
    if d[1] == g {
        return Ok(q.clone());
    }
    if g == 0 || !d[1].is_multiple_of(g) {
        bail!("tiled attention: {} query heads over {g} key heads", d[1])
    }
    q.reshape(&[d[0], g, d[1] / g * d[2], d[3]])
}

/// The tiled forward on detached q `(B, A, S, D)`, k, v `(B, G, S, ·)` (`G` dividing `A`:
/// grouped-query attention reads each key head once for its `r = A/G` query heads, whose
/// rows are tiled as one `(r·S, D)` matrix): the output `(B, A, S, Dv)` and `lse (B, G, r·S,
/// 1)` in f32 (the scores, softmax and statistics are computed in f32, as PyTorch does).
#[allow(clippy::too_many_arguments)]
pub fn forward<G: Graph>(
    q: &G,
    k: &G,
    v: &G,
    scale: f64,
    causal: bool,
    window: usize,
) -> Result<(G, G)> {
    let (heads, s) = (q.dims()[1], q.dims()[2]);
    let q = grouped(q, k.dims()[1])?;
    let rows = q.dims()[2];
    let kt = k.t()?;
    let tiles = Tiles {
        rows,
        s,
        causal,
        window,
    };
    let (mut outs, mut lses) = (Vec::new(), Vec::new());
    for i0 in (0..rows).step_by(TILE) {
        let n = TILE.min(rows - i0);
        // The replay: a full tile between the first and the last full one keeps only its
        // output and lse, and its temporaries are at most the last full tile's (it reads no
        // more keys), reached lower (the kept tiles only grow): those two are made without
        // computing the tile.
        if tiles.skippable(i0, n) {
            let [b, g, _, d] = v.dims()[..] else {
                bail!("tiled attention: v is not (B, G, S, D)")
            };
            // (`lse` in f32, as the first tile's, which is never stood in for.)
            let lse0 = lses.first().unwrap_or(&q);
            if let (Some(o), Some(l)) = (q.skipped(&[b, g, n, d]), lse0.skipped(&[b, g, n, 1])) {
                outs.push(o);
                lses.push(l);
                continue;
            }
        }
        let (lo, hi) = tiles.keys(i0, n);
        // The softmax and its statistics in f32 (a copy of a 16-bit tile's scores), as
        // PyTorch's attention kernels keep them; the probabilities back in v's type for `P·v`.
        let sc = scores(&q, &kt, i0, n, scale, &tiles)?.to_f32()?;
        let m = sc.max_last_keepdim()?;
        let e = sc.broadcast_sub(&m)?.exp()?;
        drop(sc);
        let l = e.sum_last_keepdim()?;
        let p = e.broadcast_div(&l)?.to_dtype_of(v)?;
        drop(e);
        outs.push(p.matmul(&v.narrow(2, lo, hi - lo)?)?);
        drop(p);
        lses.push(l.log()?.add(&m)?);
    }
    drop(kt);
    let out = G::cat(&outs.iter().collect::<Vec<_>>(), 2)?;
    drop(outs);
    let lse = G::cat(&lses.iter().collect::<Vec<_>>(), 2)?;
    let out = ungrouped(out, heads, s)?;
    Ok((out, lse))
}

/// A grouped `(B, G, r·S, ·)` result back at the query heads `(B, A, S, ·)` (a view).
fn ungrouped<G: Graph>(x: G, heads: usize, s: usize) -> Result<G> {
    let d = x.dims();
    if d[1] == heads {
        return Ok(x);
    }
    x.reshape(&[d[0], heads, s, d[3]])
}

/// The tiling of a query-head group's `rows` (`r·S`, row `i` at position `i mod s`).
struct Tiles {
    rows: usize,
    s: usize,
    causal: bool,
    window: usize,
}

impl Tiles {
    /// The keys `lo..hi` the tile of `n` rows from `i0` reads: all of them, but with a sliding
    /// window the keys from the first query's window to the last query (a tile across two
    /// heads' rows reads all of them, its mask hides the rest).
    fn keys(&self, i0: usize, n: usize) -> (usize, usize) {
        let p0 = i0 % self.s;
        if !self.causal || self.window == 0 || p0 + n > self.s {
            return (0, self.s);
        }
        ((p0 + 1).saturating_sub(self.window), p0 + n)
    }

    /// A full tile strictly between the first and the last full tile that reads no more keys
    /// than the last full one: the replay may stand in for it ([`Graph::skipped`]).
    fn skippable(&self, i0: usize, n: usize) -> bool {
        let last_full = (self.rows / TILE).saturating_sub(1) * TILE;
        let width = |i| {
            let (lo, hi) = self.keys(i, TILE);
            hi - lo
        };
        n == TILE && i0 > 0 && i0 < last_full && width(i0) <= width(last_full)
    }
}

/// One tile's scaled (and masked) scores `q[i0..i0+n]·kᵀ[lo..hi]·scale` over its keys
/// ([`Tiles::keys`]), row `i` of the grouped q at position `i mod s`.
fn scores<G: Graph>(q: &G, kt: &G, i0: usize, n: usize, scale: f64, tiles: &Tiles) -> Result<G> {
    let (lo, hi) = tiles.keys(i0, n);
    let sc = q
        .narrow(2, i0, n)?
        .matmul(&kt.narrow(3, lo, hi - lo)?)?
        .affine(scale, 0.0)?;
    if !tiles.causal {
        return Ok(sc);
    }
    let mask = sc.causal_mask(n, hi - lo, i0, tiles.s, lo, tiles.window)?;
    sc.broadcast_add(&mask)
}

/// The running sum `acc` of a key gradient `(B, G, S, D)` with one tile's part for keys
/// `lo..lo + w`: the part itself or a fresh sum when it covers every key (as without a
/// window), else added into the sum's rows in place (a zero sum made first).
fn accumulate<G: Graph>(acc: Option<G>, part: G, lo: usize, s: usize) -> Result<G> {
    let w = part.dims()[2];
    if lo == 0 && w == s {
        return match acc {
            None => Ok(part),
            Some(a) => a.add(&part),
        };
    }
    let acc = match acc {
        Some(a) => a,
        None => {
            let mut dims = part.dims();
            dims[2] = s;
            part.zeros(&dims)?
        }
    };
    let sum = acc.narrow(2, lo, w)?.add(&part)?;
    drop(part);
    acc.slice_set(&sum, 2, lo)?;
    Ok(acc)
}

/// The gradients of q, k, v from the forward's `out` and `lse` and the output's gradient
/// (grouped keys and values as in [`forward`]: their gradients sum their query heads').
/// `out` and `grad` `(B, A, S, Dv)` in any layout (the op's `(B, S, A, Dv)` output transposed):
/// `rowsum(dO ⊙ O)` reads them as they are, and the tiles read a contiguous copy of `grad`
/// (itself when it already is).
#[allow(clippy::too_many_arguments)]
pub fn backward<G: Graph>(
    q: &G,
    k: &G,
    v: &G,
    out: &G,
    lse: &G,
    grad: &G,
    scale: f64,
    causal: bool,
    window: usize,
) -> Result<(G, G, G)> {
    let (heads, s) = (q.dims()[1], q.dims()[2]);
    let g = k.dims()[1];
    let dsum = grad.mul(out)?.sum_last_keepdim()?.to_f32()?;
    let dsum = grouped(&dsum, g)?;
    let grad = grad.contiguous()?;
    let (q, grad) = (grouped(q, g)?, grouped(&grad, g)?);
    let rows = q.dims()[2];
    let tiles = Tiles {
        rows,
        s,
        causal,
        window,
    };
    let (kt, vt) = (k.t()?, v.t()?);
    let mut dqs = Vec::new();
    let (mut dk, mut dv): (Option<G>, Option<G>) = (None, None);
    for i0 in (0..rows).step_by(TILE) {
        let n = TILE.min(rows - i0);
        // The replay: as in the forward, a middle full tile leaves only its `dQ` (the `dK`,
        // `dV` sums are replaced by sums of the same size).
        if tiles.skippable(i0, n)
            && let Some(dq) = q.skipped(&[q.dims()[0], g, n, k.dims()[3]])
        {
            dqs.push(dq);
            continue;
        }
        let (lo, hi) = tiles.keys(i0, n);
        // The probabilities and `dS` in f32 (from the f32 `lse`), each product's operand in
        // the inputs' type.
        let sc = scores(&q, &kt, i0, n, scale, &tiles)?.to_f32()?;
        let p = sc.broadcast_sub(&lse.narrow(2, i0, n)?)?.exp()?;
        drop(sc);
        let g = grad.narrow(2, i0, n)?;
        let dv_t = p.to_dtype_of(&g)?.t()?.matmul(&g)?;
        dv = Some(accumulate(dv, dv_t, lo, s)?);
        let dp = g.matmul(&vt.narrow(3, lo, hi - lo)?)?.to_f32()?;
        drop(g);
        let t = dp.broadcast_sub(&dsum.narrow(2, i0, n)?)?;
        drop(dp);
        let ds = t.mul(&p)?.affine(scale, 0.0)?.to_dtype_of(&q)?;
        drop((t, p));
        dqs.push(ds.matmul(&k.narrow(2, lo, hi - lo)?)?);
        let dk_t = ds.t()?.matmul(&q.narrow(2, i0, n)?)?;
        drop(ds);
        dk = Some(accumulate(dk, dk_t, lo, s)?);
    }
    drop((kt, vt, dsum));
    let dq = G::cat(&dqs.iter().collect::<Vec<_>>(), 2)?;
    drop(dqs);
    let dq = ungrouped(dq, heads, s)?;
    match (dk, dv) {
        (Some(dk), Some(dv)) => Ok((dq, dk, dv)),
        _ => bail!("tiled attention: an empty sequence"),
    }
}
