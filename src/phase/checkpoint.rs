//! Gradient checkpointing: segments of K blocks keep only their input during the forward and
//! are recomputed, one at a time, during the backward.
//!
//! Forward: the embedding and the blocks run on detached weights (no graph) and only each
//! segment's input `(B, S, H)` is kept; the last segment's output becomes a variable (a copy)
//! so the head (final LayerNorm, LM head, cross-entropy) is the only graph kept.
//! Backward: `loss.backward()` gives the head's gradients and the gradient of that variable;
//! then for each segment, last first: its input becomes a variable (a copy), the segment is
//! recomputed with the real weights, and `(out · grad_out).sum().backward()` gives the
//! segment's weight gradients and the gradient of its input, the next `grad_out`. The
//! embedding gets its gradients the same way. The gradients equal the plain backward's bit for
//! bit in f32 (tested): the same ops run on the same values, and the seeding product multiplies
//! by exactly 1.
//!
//! Under mixed precision ([`forward_mixed_with`]) as autocast under non-reentrant
//! checkpointing: the stem, tables, final norm and head are cast once (kept to the end of the
//! backward), each segment's blocks are cast when it runs and again when it is recomputed, so
//! no 16-bit copy of every block lives through the step; the gradients reach the f32 masters
//! through the recorded conversions.
//!
//! Memory: the forward keeps `⌈L/K⌉` segment inputs (`e·B·S·H` each) plus the head's graph and
//! its input copy; the backward peaks while recomputing one segment (K blocks' graph and their
//! backward temporaries) beside all gradients computed so far.

use candle_core::{Result, Tensor};

use crate::model::moe::Routing;
use crate::model::tensor_ops::{Autograd, Map, TensorOps};
use crate::model::transformer::{Masks, Transformer};

pub use crate::step::segments;

/// What the checkpointed forward keeps for its backward: the loss (its graph is the head's),
/// the head's input variable, each segment's input, the masks, and under mixed precision the
/// working copy of everything outside the blocks (its head's weight says the working type).
pub struct Forward<
    T: TensorOps = Tensor,
    R = crate::model::moe::HostRouting,
    C = crate::model::config::Config,
> {
    pub loss: T,
    head_in: T,
    inputs: Vec<T>,
    mask: Masks<T>,
    half: Option<Box<Transformer<T, R, C>>>,
}

/// The checkpointed forward with the model's own weights; `detached` is the model with its
/// weights detached (no graph).
pub fn forward<T: Autograd, R: Routing<T> + Clone, C>(
    model: &Transformer<T, R, C>,
    detached: &Transformer<T, R, C>,
    tokens: &T,
    targets: &T,
    k: usize,
) -> Result<Forward<T, R, C>> {
    run_forward(model, detached, tokens, targets, k, None)
}

/// The checkpointed forward under mixed precision with candle's tensors in `dtype`
/// ([`forward_mixed_with`]).
pub fn forward_mixed(
    model: &Transformer,
    dtype: candle_core::DType,
    tokens: &Tensor,
    targets: &Tensor,
    k: usize,
) -> Result<Forward> {
    forward_mixed_with(model, &|t: &Tensor| t.to_dtype(dtype), tokens, targets, k)
}

/// The checkpointed forward under mixed precision, as autocast runs it under non-reentrant
/// checkpointing: the stem, the tables, the final norm and the head cast once by `cast` (a
/// recorded conversion; kept until the backward, as autocast's matmuls keep their cast
/// weights), each segment's blocks cast as it runs (without a graph, freed after it) and again
/// when it is recomputed in the backward; the loss in f32. No working copy of every block
/// lives through the step.
pub fn forward_mixed_with<T: Autograd, R: Routing<T> + Clone, C: Clone>(
    model: &Transformer<T, R, C>,
    cast: &Map<'_, T>,
    tokens: &T,
    targets: &T,
    k: usize,
) -> Result<Forward<T, R, C>> {
    let half = model.working_copy(cast, &|t: &T| Ok(t.clone()), model.own.clone(), false)?;
    let detached = half.detached();
    let mut f = run_forward(&half, &detached, tokens, targets, k, Some(model))?;
    f.half = Some(Box::new(half));
    Ok(f)
}

/// The forward of `model`'s head over segments run on `detached`; under mixed precision
/// (`masters`: the f32 model, `model` its working copy without blocks) each segment's blocks
/// are the masters' cast to the working type without a graph, and the loss is in f32.
fn run_forward<T: Autograd, R: Routing<T> + Clone, C>(
    model: &Transformer<T, R, C>,
    detached: &Transformer<T, R, C>,
    tokens: &T,
    targets: &T,
    k: usize,
    masters: Option<&Transformer<T, R, C>>,
) -> Result<Forward<T, R, C>> {
    // A mixed-precision working copy has no blocks: the masters' say which masks and how
    // many segments.
    let blocks = masters.map_or(&model.blocks, |m| &m.blocks);
    let mask = model.input_mask_for(blocks, tokens)?;
    let mut x = detached.embed(tokens)?;
    let mut inputs = Vec::new();
    for seg in segments(blocks.len(), k) {
        inputs.push(x.clone());
        x = match masters {
            None => detached.blocks_forward(&x, &mask, seg)?,
            Some(masters) => {
                let f = |t: &T| t.detach().to_dtype_of(&model.head.weight);
                let kept = |t: &T| Ok(t.detach());
                let blocks = masters.working_blocks(seg.clone(), &f, &kept)?;
                detached.blocks_forward_with(&blocks, &x, &mask)?
            }
        };
    }
    let head_in = x.var_from()?;
    drop(x);
    let logits = model.head_forward(&head_in)?;
    let loss = if masters.is_some() {
        model.train_loss(&logits.to_f32()?, targets)?
    } else {
        model.train_loss(&logits, targets)?
    };
    drop(logits);
    Ok(Forward {
        loss,
        head_in,
        inputs,
        mask,
        half: None,
    })
}

/// Moves the gradients of `vars` from `from` into `into`; a weight used twice (a tied head's
/// token table) has its two gradients summed.
pub(crate) fn keep<T: Autograd>(
    into: &mut T::Grads,
    from: &mut T::Grads,
    vars: &[T::Var],
) -> Result<()> {
    for v in vars {
        let v = T::var_tensor(v);
        if let Some(g) = T::take_grad(from, v) {
            let g = match T::take_grad(into, v) {
                Some(prev) => {
                    let sum = prev.add(&g)?;
                    drop((prev, g));
                    sum
                }
                None => g,
            };
            T::put_grad(into, v, g);
        }
    }
    Ok(())
}

/// The checkpointed backward: the head's, then each segment recomputed with the real weights
/// (last first, each in its first block's segment), then the embedding's; the gradients of
/// `vars` kept.
pub fn backward<T: Autograd, R: Routing<T> + Clone, C>(
    model: &Transformer<T, R, C>,
    vars: &[T::Var],
    fwd: Forward<T, R, C>,
    tokens: &T,
    k: usize,
) -> Result<T::Grads> {
    let Forward {
        loss,
        head_in,
        mut inputs,
        mask,
        half,
    } = fwd;
    let masters = model;
    let model = half.as_deref().unwrap_or(model);
    let mut grads = T::Grads::default();
    let mut all = loss.backward()?;
    let mut grad_out = T::take_grad(&mut all, &head_in).ok_or_else(|| {
        candle_core::Error::Msg("checkpoint: no gradient for the head input".into())
    })?;
    keep::<T>(&mut grads, &mut all, vars)?;
    drop((all, loss, head_in));
    let outer = tokens.segment();
    for seg in segments(masters.blocks.len(), k).into_iter().rev() {
        tokens.set_segment(masters.blocks[seg.start].tag);
        let xin = inputs.pop().expect("one input per segment").var_from()?;
        let out = match &half {
            None => model.blocks_forward(&xin, &mask, seg)?,
            // The segment's blocks cast again, recorded: their gradients reach the masters.
            Some(half) => {
                let f = |t: &T| t.to_dtype_of(&half.head.weight);
                let kept = |t: &T| Ok(t.clone());
                let blocks = masters.working_blocks(seg.clone(), &f, &kept)?;
                model.blocks_forward_with(&blocks, &xin, &mask)?
            }
        };
        let mut all = out.mul(&grad_out)?.sum_all()?.backward()?;
        drop(out);
        grad_out = T::take_grad(&mut all, &xin).ok_or_else(|| {
            candle_core::Error::Msg("checkpoint: no gradient for a segment input".into())
        })?;
        keep::<T>(&mut grads, &mut all, vars)?;
    }
    tokens.set_segment(outer);
    let x0 = model.embed(tokens)?;
    let mut all = x0.mul(&grad_out)?.sum_all()?.backward()?;
    keep::<T>(&mut grads, &mut all, vars)?;
    Ok(grads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_cover_every_block_once() {
        assert_eq!(segments(5, 2), vec![0..2, 2..4, 4..5]);
        assert_eq!(segments(4, 4), vec![0..4]);
        assert_eq!(segments(3, 1), vec![0..1, 1..2, 2..3]);
        assert_eq!(segments(3, 7), vec![0..3]);
    }
}
