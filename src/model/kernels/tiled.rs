//! The tiled attention's arithmetic, generic over [`Graph`] (candle's tensors and the replay's):
//! the forward [`TILE`] queries at a time and the backward that recomputes each tile's
//! probabilities from `lse` (see `model::tiled_attention`, which wraps them in a candle op).

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
/// 1)`.
pub fn forward<G: Graph>(q: &G, k: &G, v: &G, scale: f64, causal: bool) -> Result<(G, G)> {
    let (heads, s) = (q.dims()[1], q.dims()[2]);
    let q = grouped(q, k.dims()[1])?;
    let rows = q.dims()[2];
    let kt = k.t()?;
    let (mut outs, mut lses) = (Vec::new(), Vec::new());
    for i0 in (0..rows).step_by(TILE) {
        let n = TILE.min(rows - i0);
        // The replay: a full tile between the first and the last full one keeps only its
        // output and lse, and its temporaries are the last full tile's, reached lower (the
        // kept tiles only grow): those two are made without computing the tile.
        if skippable(i0, n, rows) {
            let [b, g, _, d] = v.dims()[..] else {
                bail!("tiled attention: v is not (B, G, S, D)")
            };
            if let (Some(o), Some(l)) = (q.skipped(&[b, g, n, d]), q.skipped(&[b, g, n, 1])) {
                outs.push(o);
                lses.push(l);
                continue;
            }
        }
        let sc = scores(&q, &kt, i0, n, scale, causal, s)?;
        let m = sc.max_last_keepdim()?;
        let e = sc.broadcast_sub(&m)?.exp()?;
        drop(sc);
        let l = e.sum_last_keepdim()?;
        let p = e.broadcast_div(&l)?;
        drop(e);
        outs.push(p.matmul(v)?);
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

/// A full tile strictly between the first and the last full tile of a sequence of `s`: the
/// replay may stand in for it ([`Graph::skipped`]).
fn skippable(i0: usize, n: usize, s: usize) -> bool {
    let last_full = (s / TILE).saturating_sub(1) * TILE;
    n == TILE && i0 > 0 && i0 < last_full
}

/// One tile's scaled (and causally masked) scores `q[i0..i0+n]·kᵀ·scale`, row `i` of the
/// grouped q at position `i mod s`.
fn scores<G: Graph>(
    q: &G,
    kt: &G,
    i0: usize,
    n: usize,
    scale: f64,
    causal: bool,
    s: usize,
) -> Result<G> {
    let sc = q.narrow(2, i0, n)?.matmul(kt)?.affine(scale, 0.0)?;
    if !causal {
        return Ok(sc);
    }
    let keys = kt.dims()[3];
    let mask = sc.causal_mask(n, keys, i0, s)?;
    sc.broadcast_add(&mask)
}

/// The gradients of q, k, v from the forward's `out` and `lse` and the output's gradient
/// (grouped keys and values as in [`forward`]: their gradients sum their query heads').
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
) -> Result<(G, G, G)> {
    let (heads, s) = (q.dims()[1], q.dims()[2]);
    let g = k.dims()[1];
    let (q, out, grad) = (grouped(q, g)?, grouped(out, g)?, grouped(grad, g)?);
    let rows = q.dims()[2];
    let dsum = grad.mul(&out)?.sum_last_keepdim()?;
    drop(out);
    let (kt, vt) = (k.t()?, v.t()?);
    let mut dqs = Vec::new();
    let (mut dk, mut dv): (Option<G>, Option<G>) = (None, None);
    for i0 in (0..rows).step_by(TILE) {
        let n = TILE.min(rows - i0);
        // The replay: as in the forward, a middle full tile leaves only its `dQ` (the `dK`,
        // `dV` sums are replaced by sums of the same size).
        if skippable(i0, n, rows)
            && let Some(dq) = q.skipped(&[q.dims()[0], g, n, k.dims()[3]])
        {
            dqs.push(dq);
            continue;
        }
        let sc = scores(&q, &kt, i0, n, scale, causal, s)?;
        let p = sc.broadcast_sub(&lse.narrow(2, i0, n)?)?.exp()?;
        drop(sc);
        let g = grad.narrow(2, i0, n)?;
        let dv_t = p.t()?.matmul(&g)?;
        dv = Some(match dv {
            None => dv_t,
            Some(a) => a.add(&dv_t)?,
        });
        let dp = g.matmul(&vt)?;
        drop(g);
        let t = dp.broadcast_sub(&dsum.narrow(2, i0, n)?)?;
        drop(dp);
        let ds = t.mul(&p)?.affine(scale, 0.0)?;
        drop((t, p));
        dqs.push(ds.matmul(k)?);
        let dk_t = ds.t()?.matmul(&q.narrow(2, i0, n)?)?;
        drop(ds);
        dk = Some(match dk {
            None => dk_t,
            Some(a) => a.add(&dk_t)?,
        });
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
