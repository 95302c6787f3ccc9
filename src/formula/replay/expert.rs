//! An expert-parallel rank's mixture of experts on symbolic tensors (`ranks::expert`, the
//! candle forward it mirrors statement by statement): the rank's tokens routed over every
//! expert, the rows sent and the rows received at the sizes the rank's run recorded
//! ([`LayerRows`]), the exchanges as [`Kernel::Exchange`] (their reordering buffers, and the
//! exchange the other way in the backward), the held experts on the rows they received.
//!
//! [`Gathered`]: an expert-parallel serving rank as vLLM runs one with its default all-to-all
//! backend (`allgather_reducescatter`): every rank's tokens gathered, the held experts on them,
//! the outputs reduce-scattered home.

use super::moe::Told;
use crate::formula::symbolic::{DType, Sym};
use crate::model::kernels::Kernel;
use crate::model::moe::{Moe, MoeParallel, Routing};
use crate::model::tensor_ops::TensorOps;

/// The rows one sparse layer's forward moved on a rank.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerRows {
    /// The rank's tokens per expert (all `E`): the rows it sends, in expert order.
    pub sent: Vec<usize>,
    /// `from[s][j]`: the rows rank `s` sent this rank for its `j`-th expert.
    pub from: Vec<Vec<usize>>,
}

/// The replay's [`MoeParallel`]: each sparse layer's forward on the rows [`LayerRows`] gives
/// that layer (again when a checkpointed backward recomputes it: the rank's routing is the
/// same, its weights unchanged).
#[derive(Debug)]
pub struct ExpertParallel {
    rank: usize,
    ranks: usize,
    layers: Vec<LayerRows>,
}

impl ExpertParallel {
    pub fn new(rank: usize, ranks: usize, layers: Vec<LayerRows>) -> Self {
        ExpertParallel {
            rank,
            ranks,
            layers,
        }
    }
}

impl MoeParallel<Sym, Told> for ExpertParallel {
    fn forward(&self, moe: &Moe<Sym, Told>, x: &Sym) -> candle_core::Result<Sym> {
        let layer = moe.routing.sparse;
        let Some(rows) = self.layers.get(layer) else {
            candle_core::bail!("replay --ep: no recorded rows for sparse layer {layer}")
        };
        // The rank's own tokens over every expert.
        let every = Told {
            expert_ids: (0..moe.shape.experts).collect(),
            routing: Some(rows.sent.clone()),
            worst: false,
            sparse: layer,
        };
        let ledger = x.ledger().clone();
        let first = self.rank * (moe.shape.experts / self.ranks);
        forward(moe, x, &every, rows, first, |n| {
            ledger.host(4 * n).into_tensor(&[n], DType::U32)
        })
    }
}

/// The forward of `ranks::expert::ExpertParallel`, statement by statement, routed by `every`
/// (the rank's tokens over all `E`), its held experts (the first `first`) on the rows `rows`
/// says they received; `ids(n)` makes `n` u32 ids from a host vector.
fn forward<T: TensorOps, R: Routing<T>>(
    moe: &Moe<T, R>,
    x: &T,
    every: &R,
    rows: &LayerRows,
    first: usize,
    ids: impl Fn(usize) -> T,
) -> candle_core::Result<T> {
    let d = x.dims();
    let (t, h) = (d[0] * d[1], d[2]);
    let xs = x.reshape(&[t, h])?;
    let (weights, routed) = moe.routed_by(every, &xs, x)?;
    let total: usize = rows.sent.iter().sum();
    let per = rows.from.first().map_or(0, Vec::len);
    let received: Vec<usize> = (0..per)
        .map(|j| rows.from.iter().map(|f| f[j]).sum())
        .collect();
    let r: usize = received.iter().sum();
    // Every token's ids in expert order (one host vector), then each expert's list freed.
    let all = every.combine(x, 0, total);
    drop(routed);
    let ids_all = R::combined_ids(all, total, x)?;
    // The rows to the owners, each exchange holding its reordering buffer.
    let to_owners = Kernel::Exchange {
        rows: r,
        temp: r,
        back_rows: total,
        back_temp: r,
    };
    let x_send = xs.index_select(&ids_all, 0)?;
    let x_recv = T::kernel(to_owners, &[&x_send])?;
    x_send.release_if(true)?;
    drop(x_send);
    let w_send = weights.index_select(&ids_all, 0)?;
    let w_recv = T::kernel(to_owners, &[&w_send])?;
    w_send.release_if(true)?;
    drop((w_send, weights));
    let home = Kernel::Exchange {
        rows: total,
        temp: r,
        back_rows: r,
        back_temp: r,
    };
    moe.expert_parallel_tail(
        x,
        xs,
        [x_recv, w_recv],
        received,
        first,
        |_, n| Ok(ids(n)),
        |y| T::kernel(home, &[y]),
        ids_all,
    )
}

/// vLLM's expert-parallel serving forward of a mixture of experts with its default all-to-all
/// backend, `allgather_reducescatter` (`vllm/config/parallel.py`, `ParallelConfig.all2all_backend`;
/// `AgRsAll2AllManager` in `vllm/distributed/device_communicators/all2all.py`): the rank's
/// `(T, H)` tokens all-gathered over the `dp` attention replicas (`all_gatherv` into a fresh
/// `(dp·T, H)`, the router's logits with them: `dispatch_router_logits`), the mixture's own
/// forward ([`Moe::forward_held`]: routed over all `E`, the held experts expert by expert) on
/// the `dp·T` rows, its `(dp·T, H)` output reduce-scattered into a fresh `(T, H)`
/// (`reduce_scatterv`). With `tp > 1` vLLM runs the mixture sequence-parallel
/// (`ParallelConfig.use_sequence_parallel_moe`; `sequence_parallel_chunk` in the models'
/// MoE blocks): each rank takes its `⌈T/tp⌉` rows of the replicated tokens (a view here), the
/// gather is over all `tp·dp` ranks' chunks, the reduce-scatter returns the chunk, and
/// `tensor_model_parallel_all_gather` rebuilds the `(T, H)` (fresh); memfit's block then adds
/// its `g` after the mixture as after any sublayer (vLLM skips that all-reduce in this mode: one
/// `(T, H)` more than vLLM holds). The router runs here on the gathered rows (vLLM runs it on
/// the rank's own and gathers its logits: the same rows after the gather), and the shared
/// experts, which vLLM runs on the rank's own rows before the dispatch, run on the gathered ones
/// (an answer above vLLM's, never below). No collective holds a host buffer.
#[derive(Debug)]
pub struct Gathered {
    /// Attention replicas whose tokens a rank's experts take (vLLM's `dp`; `ep = tp·dp`).
    pub dp: usize,
    /// Tensor-parallel ranks of a replica (the sequence-parallel chunks).
    pub tp: usize,
}

impl MoeParallel<Sym, Told> for Gathered {
    fn forward(&self, moe: &Moe<Sym, Told>, x: &Sym) -> candle_core::Result<Sym> {
        let d = x.dims();
        let (b, s, h) = (d[0], d[1], d[2]);
        let t = b * s;
        let chunk = t.div_ceil(self.tp);
        let rows = self.dp * self.tp * chunk;
        let collective = |rows| Kernel::Exchange {
            rows,
            temp: 0,
            back_rows: 0,
            back_temp: 0,
        };
        let xs = x.reshape(&[t, h]);
        let mine = if self.tp > 1 {
            xs.narrow(0, 0, chunk.min(t))
        } else {
            xs.clone()
        };
        drop(xs);
        let gathered = <Sym as TensorOps>::kernel(collective(rows), &[&mine])?;
        drop(mine);
        let all = gathered.reshape(&[rows, 1, h]);
        drop(gathered);
        let y = moe.forward_held(&all)?;
        drop(all);
        let ys = y.reshape(&[rows, h]);
        drop(y);
        let home = <Sym as TensorOps>::kernel(collective(chunk), &[&ys])?;
        drop(ys);
        if self.tp == 1 {
            return Ok(home.reshape(&[b, s, h]));
        }
        let whole = <Sym as TensorOps>::kernel(collective(self.tp * chunk), &[&home])?;
        drop(home);
        Ok(whole.narrow(0, 0, t).reshape(&[b, s, h]))
    }
}
