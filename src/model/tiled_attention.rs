//! Memory-efficient attention as a tiled composition of ordinary candle ops, so it runs on every
//! device (CUDA included) and in every float type: `--attention tiled`, and what `efficient`
//! means on CUDA (on the CPU `efficient` is the online-softmax op of
//! [`super::efficient_attention`]).
//!
//! q, k, v `(B, A, S, D)`, contiguous. The forward runs on detached tensors, [`TILE`] queries at
//! a time: scores `q_t·kᵀ·scale (B, A, T, S)` (plus the causal mask of the tile, made on the
//! device), their row maximum `m` and sum `l` of `exp(s − m)`, the probabilities and `P_t·v`;
//! the tiles' outputs are concatenated into `O`, and `lse = m + ln l (B, A, S, 1)` is kept for
//! the backward. The graph node (a `CustomOp3` on q, k, v) keeps `O` and `lse` only: nothing
//! of size `S × S` (its forward copies the precomputed `O` into its own output, one `B·S·H`
//! transient, since a custom op must return a new storage).
//!
//! The backward recomputes each tile's probabilities from `lse`: `P_t = exp(s_t − lse_t)`,
//! `dV += P_tᵀ·dO_t`, `dP_t = dO_t·vᵀ`, `dS_t = P_t·(dP_t − rowsum(dO ⊙ O)_t)·scale`,
//! `dQ_t = dS_t·k`, `dK += dS_tᵀ·q_t`. Both passes are generic over [`Graph`], so the replay
//! predicts them by running the same functions on symbolic tensors. Peak beside the graph: a
//! few `B·A·T·S` tiles and the accumulated `dK`, `dV`.

use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Storage, Tensor, bail};

use super::kernels::{Graph, Kernel};

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

/// Tiled attention with a backward: `softmax(q·kᵀ·scale [+ causal mask])·v`.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, scale: f32, causal: bool) -> Result<Tensor> {
    let (out, lse) = forward(&q.detach(), &k.detach(), &v.detach(), scale as f64, causal)?;
    let op = TiledAttention {
        scale,
        causal,
        out: Mutex::new(Some(out)),
        lse,
    };
    q.apply_op3(k, v, op)
}

/// The graph node: the precomputed output (taken by the forward) and `lse`.
struct TiledAttention {
    scale: f32,
    causal: bool,
    out: Mutex<Option<Tensor>>,
    lse: Tensor,
}

impl TiledAttention {
    fn take(&self) -> Result<Tensor> {
        match self.out.lock().map(|mut o| o.take()) {
            Ok(Some(o)) => Ok(o),
            _ => bail!("tiled attention: the forward ran twice"),
        }
    }
}

impl CustomOp3 for TiledAttention {
    fn name(&self) -> &'static str {
        "tiled-attention"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let out = self.take()?;
        let (st, l) = out.storage_and_layout();
        match &*st {
            Storage::Cpu(c) => Ok((c.try_clone(l)?, l.shape().clone())),
            _ => bail!("tiled attention: the output is not on the CPU"),
        }
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
        _: &candle_core::CudaStorage,
        _: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        let out = self.take()?;
        let (st, l) = out.storage_and_layout();
        match &*st {
            Storage::Cuda(c) => Ok((c.try_clone(l)?, l.shape().clone())),
            _ => bail!("tiled attention: the output is not on the GPU"),
        }
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let kernel = Kernel::TiledAttention {
            scale: self.scale,
            causal: self.causal,
        };
        kernel.backward3(&[q, k, v, &self.lse], res, grad)
    }
}
