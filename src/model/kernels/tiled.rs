//! The tiled attention's arithmetic, generic over [`Graph`] (candle's tensors and the replay's):
//! the forward [`TILE`] queries at a time and the backward that recomputes each tile's
//! probabilities from `lse` (see `model::tiled_attention`, which wraps them in a candle op).

use candle_core::{Result, bail};

use super::graph::Graph;

/// Queries per tile.
pub const TILE: usize = 128;

/// The tiled forward on detached q, k, v: the output `(B, A, S, D)` and `lse (B, A, S, 1)`.
pub fn forward<G: Graph>(q: &G, k: &G, v: &G, scale: f64, causal: bool) -> Result<(G, G)> {
    let s = q.dims()[2];
    let kt = k.t()?;
    let (mut outs, mut lses) = (Vec::new(), Vec::new());
    for i0 in (0..s).step_by(TILE) {
        let n = TILE.min(s - i0);
        // The replay: a full tile between the first and the last full one keeps only its
        // output and lse, and its temporaries are the last full tile's, reached lower (the
        // kept tiles only grow): those two are made without computing the tile.
        if skippable(i0, n, s) {
            let [b, a, _, d] = v.dims()[..] else {
                bail!("tiled attention: v is not (B, A, S, D)")
            };
            if let (Some(o), Some(l)) = (q.skipped(&[b, a, n, d]), q.skipped(&[b, a, n, 1])) {
                outs.push(o);
                lses.push(l);
                continue;
            }
        }
        let sc = scores(q, &kt, i0, n, scale, causal)?;
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
    Ok((out, lse))
}

/// A full tile strictly between the first and the last full tile of a sequence of `s`: the
/// replay may stand in for it ([`Graph::skipped`]).
fn skippable(i0: usize, n: usize, s: usize) -> bool {
    let last_full = (s / TILE).saturating_sub(1) * TILE;
    n == TILE && i0 > 0 && i0 < last_full
}

/// One tile's scaled (and causally masked) scores `q[i0..i0+n]·kᵀ·scale`.
fn scores<G: Graph>(q: &G, kt: &G, i0: usize, n: usize, scale: f64, causal: bool) -> Result<G> {
    let sc = q.narrow(2, i0, n)?.matmul(kt)?.affine(scale, 0.0)?;
    if !causal {
        return Ok(sc);
    }
    let keys = kt.dims()[3];
    let mask = sc.causal_mask(n, keys, i0)?;
    sc.broadcast_add(&mask)
}

/// The gradients of q, k, v from the forward's `out` and `lse` and the output's gradient.
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
    let s = q.dims()[2];
    let dsum = grad.mul(out)?.sum_last_keepdim()?;
    let (kt, vt) = (k.t()?, v.t()?);
    let mut dqs = Vec::new();
    let (mut dk, mut dv): (Option<G>, Option<G>) = (None, None);
    for i0 in (0..s).step_by(TILE) {
        let n = TILE.min(s - i0);
        // The replay: as in the forward, a middle full tile leaves only its `dQ` (the `dK`,
        // `dV` sums are replaced by sums of the same size).
        if skippable(i0, n, s)
            && let Some(dq) = q.skipped(&[q.dims()[0], q.dims()[1], n, k.dims()[3]])
        {
            dqs.push(dq);
            continue;
        }
        let sc = scores(q, &kt, i0, n, scale, causal)?;
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
    match (dk, dv) {
        (Some(dk), Some(dv)) => Ok((dq, dk, dv)),
        _ => bail!("tiled attention: an empty sequence"),
    }
}
