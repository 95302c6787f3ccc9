//! Megatron-LM's conjugate collectives `f` and `g` ([`Collectives`]) written once over the
//! tensor trait: candle's tensors run them over MPI (`crate::ranks::tensor`, `memfit ranks
//! --tp`), the replay's symbolic tensors size them (`crate::formula::replay`), so the order in
//! which their tensors are made and freed is the same by construction. An interpreter gives
//! only the two ops' forwards ([`CollectiveOps`]).

use candle_core::Result;

use super::kernels::Kernel;
use super::tensor_ops::TensorOps;
use super::transformer::{Collectives, VocabParallel};

/// The two collective ops of tensor parallelism on one interpreter's tensors.
pub trait CollectiveOps: TensorOps {
    /// `f`'s forward: a copy of this tensor (an op makes its output), whose backward
    /// all-reduces the gradient over the group (copies it when `!reduce`).
    fn tp_enter(&self, reduce: bool) -> Result<Self>;
    /// `g`'s forward: this tensor summed over the group (copied when `!reduce`) into a fresh
    /// tensor of its shape; the identity backward.
    fn tp_reduce(&self, reduce: bool) -> Result<Self>;
    /// The whole vocabulary's log-sum-exp of each row of this rank's logits `(N, V/tp)`: the
    /// rows' maxima reduced to the group's maximum, the sums of `exp(x − max)` summed over the
    /// group, `max + ln(sum)`: a fresh `(N, 1)` f32 with no graph (three `N` vectors at once
    /// on the host while it is made).
    fn tp_logsumexp(&self) -> Result<Self>;
    /// Every rank's `(…, n)` concatenated along the last dimension in rank order, `(…, N·n)`
    /// (vLLM's `tensor_model_parallel_all_gather(x, dim=-1)`: the ranks' blocks gathered into a
    /// `(N, …, n)` buffer, then moved into a fresh tensor; the buffer freed); no graph.
    fn tp_gather_last(&self, tp: usize) -> Result<Self>;
    /// Sequence parallelism's `g` before a column-parallel sublayer: this rank's `(B, s, H)`
    /// rows all-gathered along the sequence into a fresh `(B, tp·s, H)`, whose backward
    /// reduce-scatters the gradient into a fresh `(B, s, H)`.
    fn sp_gather(&self, tp: usize) -> Result<Self>;
    /// Sequence parallelism's `ḡ` after a row-parallel sublayer: the partial `(B, S, H)` summed
    /// over the group and scattered along the sequence, this rank's fresh `(B, S/tp, H)`,
    /// whose backward all-gathers the gradient into a fresh `(B, S, H)`.
    fn sp_scatter(&self, tp: usize) -> Result<Self>;
}

/// Megatron's `f` and `g` around a block's sublayers.
#[derive(Debug, Clone, Copy)]
pub struct Megatron {
    /// `f`'s backward all-reduces (always, but to show the check catches its absence).
    pub f_all_reduce: bool,
    /// `g`'s forward all-reduces (always, but to show the serving check catches its absence:
    /// `ranks --tp-skip-g-all-reduce`).
    pub g_all_reduce: bool,
    /// Release the tensors no backward reads (the norm's output once copied, the partial and
    /// the reduced outputs once summed), as memfit's fused kernels do (`Kernels::fused`);
    /// with candle's composed ops every op's inputs stay in the graph, as stock candle keeps
    /// them.
    pub release: bool,
    /// Megatron's sequence parallelism over this many ranks (`None`: none): the residual
    /// stream, the norms and the embedding's output hold a `1/tp` run of the sequence; `f`
    /// becomes an all-gather along the sequence and `g` a reduce-scatter
    /// ([`CollectiveOps::sp_gather`], [`CollectiveOps::sp_scatter`]).
    pub sequence: Option<usize>,
}

impl<T: CollectiveOps> Collectives<T> for Megatron {
    fn enter(&self, x: T) -> Result<T> {
        // Sequence parallelism gathers the sequence, with a graph or without (a checkpointed
        // forward's detached segments).
        let y = match self.sequence {
            Some(tp) => x.sp_gather(tp)?,
            // Serving, or a checkpointed forward (no graph recorded): `f` is the identity with
            // no backward, nothing to copy (vLLM's forward has no `f` at all).
            None if !x.tracked() => return Ok(x),
            None => x.tp_enter(self.f_all_reduce)?,
        };
        // No backward reads the norm's output (the norm's reads its input; f's none).
        x.release_if(self.release)?;
        Ok(y)
    }

    fn reduce_add(&self, y: T, residual: &T) -> Result<T> {
        let r = match self.sequence {
            Some(tp) => y.sp_scatter(tp)?,
            None => y.tp_reduce(self.g_all_reduce)?,
        };
        // The projection's backward reads its input and weight, g's and the sum's nothing.
        y.release_if(self.release)?;
        drop(y);
        let sum = residual.add(&r)?;
        r.release_if(self.release)?;
        Ok(sum)
    }
}

/// Megatron's vocab-parallel embedding, head and loss ([`VocabParallel`]) on a rank whose
/// table and head hold the vocabulary's rows `start..start + V/tp`:
/// - the embedding (`VocabParallelEmbedding`): the masked lookup
///   ([`Kernel::VocabEmbedding`]) then `g`; the partial rows released once summed (no backward
///   reads them) under `megatron.release`;
/// - the head (a `ColumnParallelLinear` gathering nothing): `f` on the final norm's output;
///   serving (vLLM's `ParallelLMHead` and `LogitsProcessor`) gathers the last positions'
///   logits from every rank;
/// - the loss (`vocab_parallel_cross_entropy`): the whole vocabulary's log-sum-exp over the
///   group ([`CollectiveOps::tp_logsumexp`]), this rank's part of the mean
///   ([`Kernel::VocabCrossEntropy`], whose node keeps the logits and the log-sum-exp), then
///   `g` on the scalar: the whole loss on every rank, whose gradient reaches each part as it
///   is.
#[derive(Debug, Clone, Copy)]
pub struct MegatronVocab {
    /// The first row of the vocabulary this rank holds.
    pub start: usize,
    /// The ranks the vocabulary is split over (serving gathers their logits).
    pub tp: usize,
    pub megatron: Megatron,
}

impl<T: CollectiveOps> VocabParallel<T> for MegatronVocab {
    fn embed(&self, table: &T, tokens: &T) -> Result<T> {
        let mut dims = tokens.dims();
        let ids = tokens.reshape(&[dims.iter().product()])?;
        let rows = T::kernel(Kernel::VocabEmbedding { start: self.start }, &[table, &ids])?;
        drop(ids);
        dims.push(table.dims()[1]);
        let part = rows.reshape(&dims)?;
        drop(rows);
        // Under sequence parallelism the rows are reduce-scattered along the sequence.
        let whole = match self.megatron.sequence {
            Some(tp) => part.sp_scatter(tp)?,
            None => part.tp_reduce(self.megatron.g_all_reduce)?,
        };
        // The lookup's backward reads the ids, g's nothing.
        part.release_if(self.megatron.release)?;
        drop(part);
        Ok(whole)
    }

    fn enter(&self, x: T) -> Result<T> {
        Collectives::<T>::enter(&self.megatron, x)
    }

    fn gather(&self, logits: T) -> Result<T> {
        logits.tp_gather_last(self.tp)
    }

    fn loss(&self, logits: &T, targets: &T) -> Result<T> {
        let d = logits.dims();
        let (x, t) = (
            logits.reshape(&[d[0] * d[1], d[2]])?,
            targets.reshape(&[d[0] * d[1]])?,
        );
        let lse = x.tp_logsumexp()?;
        let part = T::kernel(
            Kernel::VocabCrossEntropy { start: self.start },
            &[&x, &t, &lse],
        )?;
        drop((x, t, lse));
        part.tp_reduce(true)
    }
}
