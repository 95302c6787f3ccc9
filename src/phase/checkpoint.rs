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
//! Under mixed precision ([`forward_mixed`]) the segments run on the 16-bit working copy,
//! which lives from the forward to the end of the backward; the gradients reach the f32
//! masters through its recorded conversions.
//!
//! Memory: the forward keeps `⌈L/K⌉` segment inputs (`e·B·S·H` each) plus the head's graph and
//! its input copy; the backward peaks while recomputing one segment (K blocks' graph and their
//! backward temporaries) beside all gradients computed so far.

use candle_core::backprop::GradStore;
use candle_core::{Result, Tensor, Var};

use crate::model::transformer::Transformer;

pub use crate::step::segments;

/// What the checkpointed forward keeps for the backward.
pub struct Forward {
    pub loss: Tensor,
    /// The head's input, a variable so its gradient is computed.
    head_in: Var,
    /// Each segment's input, detached.
    inputs: Vec<Tensor>,
    mask: crate::model::transformer::Masks,
    /// Mixed precision: the 16-bit working copy the forward ran on and the backward
    /// recomputes with (its conversions recorded, so gradients reach the f32 masters); it
    /// lives until the backward ends (boxed: the model struct is large beside the rest).
    half: Option<Box<Transformer>>,
}

/// Checkpointed forward to the loss. `detached` is `model.detached()` (same storage).
pub fn forward(
    model: &Transformer,
    detached: &Transformer,
    tokens: &Tensor,
    targets: &Tensor,
    k: usize,
) -> Result<Forward> {
    run_forward(model, detached, tokens, targets, k, false)
}

/// Checkpointed forward under mixed precision: the `dtype` working copy of `model` is made
/// first (as the plain mixed forward makes it), the segments run on its detached views, the
/// head on the copy, the loss in f32.
pub fn forward_mixed(
    model: &Transformer,
    dtype: candle_core::DType,
    tokens: &Tensor,
    targets: &Tensor,
    k: usize,
) -> Result<Forward> {
    let half = model.cast(dtype)?;
    let detached = half.detached();
    let mut f = run_forward(&half, &detached, tokens, targets, k, true)?;
    f.half = Some(Box::new(half));
    Ok(f)
}

fn run_forward(
    model: &Transformer,
    detached: &Transformer,
    tokens: &Tensor,
    targets: &Tensor,
    k: usize,
    f32_loss: bool,
) -> Result<Forward> {
    let mask = model.input_mask(tokens)?;
    let mut x = detached.embed(tokens)?;
    let mut inputs = Vec::new();
    for seg in segments(model.config().layers, k) {
        inputs.push(x.clone());
        x = detached.blocks_forward(&x, &mask, seg)?;
    }
    let head_in = Var::from_tensor(&x)?;
    drop(x);
    let logits = model.head_forward(head_in.as_tensor())?;
    let loss = if f32_loss {
        model.train_loss(&logits.to_dtype(candle_core::DType::F32)?, targets)?
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

/// Moves the gradients of `vars` from `from` into `into`; a weight used in two places (a tied
/// head is the token embedding: the head's gradient first, the embedding's last) gets the sum,
/// as the plain backward sums them.
pub(crate) fn keep(into: &mut GradStore, from: &mut GradStore, vars: &[Var]) -> Result<()> {
    for v in vars {
        if let Some(g) = from.remove(v.as_tensor()) {
            let g = match into.remove(v.as_tensor()) {
                Some(prev) => {
                    let sum = prev.add(&g)?;
                    drop((prev, g));
                    sum
                }
                None => g,
            };
            into.insert(v.as_tensor(), g);
        }
    }
    Ok(())
}

/// Checkpointed backward: every parameter's gradient, nothing else.
pub fn backward(
    model: &Transformer,
    vars: &[Var],
    fwd: Forward,
    tokens: &Tensor,
    k: usize,
) -> Result<GradStore> {
    let Forward {
        loss,
        head_in,
        mut inputs,
        mask,
        half,
    } = fwd;
    let model = half.as_deref().unwrap_or(model);
    let mut grads = GradStore::default();
    let mut all = loss.backward()?;
    let mut grad_out = all.remove(head_in.as_tensor()).ok_or_else(|| {
        candle_core::Error::Msg("checkpoint: no gradient for the head input".into())
    })?;
    keep(&mut grads, &mut all, vars)?;
    drop((all, loss, head_in));
    for seg in segments(model.config().layers, k).into_iter().rev() {
        let xin = Var::from_tensor(&inputs.pop().expect("one input per segment"))?;
        let out = model.blocks_forward(xin.as_tensor(), &mask, seg)?;
        let mut all = out.mul(&grad_out)?.sum_all()?.backward()?;
        drop(out);
        grad_out = all.remove(xin.as_tensor()).ok_or_else(|| {
            candle_core::Error::Msg("checkpoint: no gradient for a segment input".into())
        })?;
        keep(&mut grads, &mut all, vars)?;
    }
    let x0 = model.embed(tokens)?;
    let mut all = x0.mul(&grad_out)?.sum_all()?.backward()?;
    keep(&mut grads, &mut all, vars)?;
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
