//! Memory-efficient attention as a tiled composition of ordinary candle ops, so it runs on every
//! device (CUDA included) and in every float type: `--attention tiled`, and what `efficient`
//! means on CUDA (on the CPU `efficient` is the online-softmax op of
//! [`super::efficient_attention`]).
//!
//! q, k, v `(B, A, S, D)`, contiguous. The forward runs on detached tensors, [`TILE`] queries at
//! a time: scores `q_t·kᵀ·scale (B, A, T, S)` (plus the causal mask of the tile, made on the
//! device), their row maximum `m` and sum `l` of `exp(s − m)`, the probabilities and `P_t·v`;
//! the tiles' outputs are concatenated into `O`, and `lse = m + ln l (B, A, S, 1)`, in f32 like the softmax, is kept for
//! the backward. The graph node (a `CustomOp3` on q, k, v) keeps `O` and `lse` only: nothing
//! of size `S × S`. Its forward copies the precomputed `O` into its own output, one `B·S·H`
//! transient (a custom op must return a new storage), written `(B, S, A, Dv)`, the heads
//! last, so that merging the heads for the output projection is a view and `O` is kept once
//! (as PyTorch's attention kernels write it), not beside a merged copy.
//!
//! The backward recomputes each tile's probabilities from `lse`: `P_t = exp(s_t − lse_t)`,
//! `dV += P_tᵀ·dO_t`, `dP_t = dO_t·vᵀ`, `dS_t = P_t·(dP_t − rowsum(dO ⊙ O)_t)·scale`,
//! `dQ_t = dS_t·k`, `dK += dS_tᵀ·q_t`. Both passes are generic over [`Graph`], so the replay
//! predicts them by running the same functions on symbolic tensors. Peak beside the graph: a
//! few `B·A·T·S` tiles and the accumulated `dK`, `dV`.

use std::sync::Mutex;

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Storage, Tensor, bail};

use super::kernels::Kernel;
pub use super::kernels::tiled::{TILE, backward, forward};

/// Tiled attention with a backward: `softmax(q·kᵀ·scale [+ causal mask])·v` of q `(B, A, S,
/// D)`, k, v `(B, G, S, ·)`, written `(B, S, A, Dv)` (the heads last); with a sliding
/// `window` (> 0, causal) query `i` sees keys `i − window + 1 ..= i`, and a tile reads no key
/// outside its queries' windows.
pub fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f32,
    causal: bool,
    window: usize,
) -> Result<Tensor> {
    let (out, lse) = precompute(q, k, v, scale, causal, window)?;
    let op = TiledAttention {
        scale,
        causal,
        window,
        out: Mutex::new(Some(out)),
        lse,
    };
    q.apply_op3(k, v, op)
}

/// The tiled forward on detached q, k, v: the output and `lse` that the graph node (candle's
/// op, or the replay's kernel node) keeps or copies.
pub fn precompute<G: super::kernels::Graph>(
    q: &G,
    k: &G,
    v: &G,
    scale: f32,
    causal: bool,
    window: usize,
) -> Result<(G, G)> {
    forward(
        &q.detach(),
        &k.detach(),
        &v.detach(),
        scale as f64,
        causal,
        window,
    )
}

/// The graph node: the precomputed output (taken by the forward) and `lse`.
struct TiledAttention {
    scale: f32,
    causal: bool,
    window: usize,
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

/// The precomputed `O (B, A, S, Dv)` copied into a fresh `(B, S, A, Dv)` storage (the heads
/// last): the op's output.
fn heads_last<S>(src: &S, l: &Layout) -> Result<(S, Shape)>
where
    S: BackendStorage,
    S::Device: BackendDevice<Storage = S>,
{
    let l = l.transpose(1, 2)?;
    let mut dst = src.device().zeros_impl(l.shape(), src.dtype())?;
    src.copy_strided_src(&mut dst, 0, &l)?;
    Ok((dst, l.shape().clone()))
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
            Storage::Cpu(c) => heads_last(c, l),
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
            Storage::Cuda(c) => heads_last(c, l),
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
            window: self.window,
        };
        kernel.backward3(&[q, k, v, &self.lse], res, grad)
    }
}
