//! Megatron-LM's vocab-parallel embedding and loss as ops (`memfit ranks --tp`): a rank holds
//! rows `start..start + rows` of the token table (and of the head: its logits are the columns
//! `start..start + rows` of the whole vocabulary's), as `VocabParallelEmbedding`,
//! `ColumnParallelLinear` and `vocab_parallel_cross_entropy` hold them.
//!
//! - [`vocab_embedding`]: the rank's rows looked up, zeros where another rank holds the token
//!   (Megatron's masked lookup; the sum over the group is the model's `g`, outside the op); the
//!   backward writes the table's gradient `(rows, H)` once.
//! - [`vocab_cross_entropy`]: this rank's part of the mean loss, `(1/N)·Σ (lse − x[t])` over
//!   the rows whose target it holds, from the whole vocabulary's log-sum-exp `lse (N, 1)` (made
//!   by the group's collectives before the op and held by its node; the sum of the parts over
//!   the group is the model's `g`). The node keeps the logits and `lse`, as Megatron's keeps
//!   its softmax in the logits' storage; the backward writes `g/N·(exp(x − lse) − 1 at the
//!   target)` in one pass.
//!
//! f32 only (the ranks train in f32); the replay sizes them in any type.

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};

use super::Kernel;
use super::cpu::slice;

/// The rows of `table (rows, H)` at `ids (n)` u32 less `start`, zeros where an id is not one
/// of this rank's rows: `(n, H)`.
pub fn vocab_embedding(table: &Tensor, ids: &Tensor, start: usize) -> Result<Tensor> {
    table.apply_op2(ids, VocabEmbeddingOp { start })
}

/// This rank's part of the mean cross-entropy of `logits (N, rows)` (columns `start..` of the
/// vocabulary) against `targets (N)` u32, from the whole vocabulary's `lse (N, 1)`.
pub fn vocab_cross_entropy(
    logits: &Tensor,
    targets: &Tensor,
    lse: &Tensor,
    start: usize,
) -> Result<Tensor> {
    logits.apply_op3(targets, lse, VocabCrossEntropyOp { start })
}

fn f32s<'a>(s: &'a CpuStorage, l: &Layout, op: &str, what: &str) -> Result<&'a [f32]> {
    match s {
        CpuStorage::F32(d) => slice(d, l, op, what),
        _ => candle_core::bail!("{op}: {what} must be f32 (the ranks train in f32)"),
    }
}

fn u32s<'a>(s: &'a CpuStorage, l: &Layout, op: &str, what: &str) -> Result<&'a [u32]> {
    match s {
        CpuStorage::U32(d) => slice(d, l, op, what),
        _ => candle_core::bail!("{op}: {what} must be u32"),
    }
}

/// `id − start` when it is one of the `rows` rows from `start`.
fn local(id: u32, start: usize, rows: usize) -> Option<usize> {
    (id as usize).checked_sub(start).filter(|&r| r < rows)
}

struct VocabEmbeddingOp {
    start: usize,
}

impl CustomOp2 for VocabEmbeddingOp {
    fn name(&self) -> &'static str {
        Kernel::VocabEmbedding { start: self.start }.name()
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (rows, h) = l1.shape().dims2()?;
        let table = f32s(s1, l1, op, "table")?;
        let ids = u32s(s2, l2, op, "ids")?;
        let mut out = vec![0f32; ids.len() * h];
        for (o, &id) in out.chunks_mut(h).zip(ids) {
            if let Some(r) = local(id, self.start, rows) {
                o.copy_from_slice(&table[r * h..(r + 1) * h]);
            }
        }
        Ok((CpuStorage::F32(out), Shape::from_dims(&[ids.len(), h])))
    }

    fn bwd(
        &self,
        table: &Tensor,
        ids: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Kernel::VocabEmbedding { start: self.start }.backward2(&[table, ids], res, grad)
    }
}

/// The table's gradient: `(rows, H)` zeros with row `i` of `grad (n, H)` added at `ids[i] −
/// start` where that is one of the rows (in the ids' order, as candle's `index_add`).
pub(crate) struct VocabRowsGradOp {
    pub rows: usize,
    pub start: usize,
}

impl CustomOp2 for VocabRowsGradOp {
    fn name(&self) -> &'static str {
        "tp-vocab-embedding-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let op = self.name();
        let (_, h) = l1.shape().dims2()?;
        let grad = f32s(s1, l1, op, "grad")?;
        let ids = u32s(s2, l2, op, "ids")?;
        let mut out = vec![0f32; self.rows * h];
        for (g, &id) in grad.chunks(h).zip(ids) {
            if let Some(r) = local(id, self.start, self.rows) {
                for (o, g) in out[r * h..(r + 1) * h].iter_mut().zip(g) {
                    *o += g;
                }
            }
        }
        Ok((CpuStorage::F32(out), Shape::from_dims(&[self.rows, h])))
    }
}

struct VocabCrossEntropyOp {
    start: usize,
}

impl CustomOp3 for VocabCrossEntropyOp {
    fn name(&self) -> &'static str {
        Kernel::VocabCrossEntropy { start: self.start }.name()
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
        let op = self.name();
        let (n, v) = l1.shape().dims2()?;
        let x = f32s(s1, l1, op, "logits")?;
        let t = u32s(s2, l2, op, "targets")?;
        let lse = f32s(s3, l3, op, "lse")?;
        if t.len() != n || lse.len() != n {
            candle_core::bail!(
                "{op}: {} targets and {} lse for {n} rows",
                t.len(),
                lse.len()
            )
        }
        let mut total = 0f64;
        for (i, (&target, &lse)) in t.iter().zip(lse).enumerate() {
            if let Some(c) = local(target, self.start, v) {
                total += (lse - x[i * v + c]) as f64;
            }
        }
        Ok((
            CpuStorage::F32(vec![(total / n as f64) as f32]),
            Shape::from_dims(&[]),
        ))
    }

    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        lse: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        Kernel::VocabCrossEntropy { start: self.start }.backward3(
            &[logits, targets, lse],
            res,
            grad,
        )
    }
}

/// The logits' gradient `scale·(exp(x − lse) − 1 at the local target)`, one pass.
pub(crate) struct VocabCeGradOp {
    pub start: usize,
    pub scale: f32,
}

impl CustomOp3 for VocabCeGradOp {
    fn name(&self) -> &'static str {
        "tp-vocab-cross-entropy-grad"
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
        let op = self.name();
        let (n, v) = l1.shape().dims2()?;
        let x = f32s(s1, l1, op, "logits")?;
        let t = u32s(s2, l2, op, "targets")?;
        let lse = f32s(s3, l3, op, "lse")?;
        let mut out = vec![0f32; n * v];
        for (i, (o, x)) in out.chunks_mut(v).zip(x.chunks(v)).enumerate() {
            for (o, x) in o.iter_mut().zip(x) {
                *o = (x - lse[i]).exp() * self.scale;
            }
            if let Some(c) = local(t[i], self.start, v) {
                o[c] -= self.scale;
            }
        }
        Ok((CpuStorage::F32(out), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    /// On one rank holding the whole vocabulary (`lse` from the logits themselves) the ops
    /// are candle-nn's embedding and the fused cross-entropy: the same values and gradients;
    /// over two halves, the parts sum to the whole and each half's gradient is the whole's
    /// columns.
    #[test]
    fn halves_sum_to_the_whole_vocabulary() -> Result<()> {
        let dev = Device::Cpu;
        let (n, v, h) = (6, 8, 3);
        let table = Var::from_tensor(&Tensor::randn(0f32, 1., (v, h), &dev)?)?;
        let ids = Tensor::new(&[1u32, 7, 0, 4, 4, 5], &dev)?;
        let logits = Var::from_tensor(&Tensor::randn(0f32, 1., (n, v), &dev)?)?;
        let targets = Tensor::new(&[3u32, 6, 0, 7, 2, 4], &dev)?;
        let lse = {
            let x = logits.as_tensor().detach();
            let m = x.max_keepdim(1)?;
            (x.broadcast_sub(&m)?.exp()?.sum_keepdim(1)?.log()? + m)?
        };
        // The whole vocabulary.
        let e = table.as_tensor().embedding(&ids)?;
        let l = super::super::cross_entropy(logits.as_tensor(), &targets)?;
        let gw = (e.sum_all()? + l.clone())?.backward()?;
        let (de, dl) = (
            gw.get(table.as_tensor()).unwrap().to_vec2::<f32>()?,
            gw.get(logits.as_tensor()).unwrap().to_vec2::<f32>()?,
        );
        // Two halves.
        let mut loss = 0f32;
        for (r, start) in [0, v / 2].into_iter().enumerate() {
            let t = table.as_tensor().narrow(0, start, v / 2)?;
            let tv = Var::from_tensor(&t)?;
            let x = Var::from_tensor(&logits.as_tensor().narrow(1, start, v / 2)?)?;
            let part_e = vocab_embedding(tv.as_tensor(), &ids, start)?;
            let part_l = vocab_cross_entropy(x.as_tensor(), &targets, &lse, start)?;
            loss += part_l.to_scalar::<f32>()?;
            let g = (part_e.sum_all()? + part_l)?.backward()?;
            let gt = g.get(tv.as_tensor()).unwrap().to_vec2::<f32>()?;
            let gx = g.get(x.as_tensor()).unwrap().to_vec2::<f32>()?;
            for (i, row) in gt.iter().enumerate() {
                assert_eq!(row, &de[start + i], "rank {r}: the table's row {i}");
            }
            for (row, whole) in gx.iter().zip(&dl) {
                for (a, b) in row.iter().zip(&whole[start..start + v / 2]) {
                    assert!((a - b).abs() < 1e-6, "rank {r}: {a} against {b}");
                }
            }
        }
        assert!((loss - l.to_scalar::<f32>()?).abs() < 1e-5);
        Ok(())
    }
}
