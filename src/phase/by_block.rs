//! The backward block by block (`--backward by-block`, the default): each block's graph is
//! dropped as soon as its gradients are taken, so the activations it saved are freed as the
//! backward passes them — what PyTorch's autograd does with a node's saved tensors — where
//! candle's `loss.backward()` (`--backward whole`) keeps the whole graph until it returns.
//!
//! Forward (the same ops on the same values as the whole forward): the embedding, then each
//! block, then the head, each recording its own graph. At every boundary the tensor a block (or
//! the embedding) made is **cut**: its storage is moved, without a copy, into a new variable
//! that the next part reads ([`cut`], an in-place op on public candle API), so the parts' graphs
//! are disjoint and the next part's backward yields the boundary's gradient. The made tensor
//! keeps its op (its storage is empty from then on; nothing reads it: a block ends in a residual
//! sum, whose backward reads only the upstream gradient). A boundary that is not tracked (the
//! frozen embedding's output under LoRA) is passed on as it is: nothing below it needs a
//! gradient, as in the whole backward.
//!
//! Backward: `loss.backward()` through the head gives its weights' gradients and the gradient of
//! the last cut; the head's graph is dropped. Then, for each part from the top, a **seed**
//! ([`seed`], a one-element op on the made tensor whose backward hands in the gradient from
//! above) is backpropagated: the part's weights' gradients and its input cut's gradient come
//! out, and the part's graph is dropped. A weight used twice (a tied head) gets the sum of its
//! two gradients, as in the whole backward ([`super::checkpoint::keep`]).
//!
//! The gradients equal the whole backward's bit for bit (tested per family): the same nodes
//! are processed in the same order within each part, and a boundary's gradient reaches the
//! made tensor as `0 + g`, which is `g` exactly.
//!
//! Memory: the forward keeps what the whole forward keeps (the cuts hold the values the next
//! block's graph would have kept; nothing is copied). The backward's peak is where the head's
//! or a block's backward temporaries meet everything not yet freed: the graphs of the parts
//! below, the gradients so far and the boundary gradient (`e·B·S·H`, plus the seed's
//! placeholder and sum for a moment). Compared with the whole backward, every part above the
//! one being processed has been freed.
//!
//! With gradient checkpointing the backward is already segment by segment
//! ([`super::checkpoint`]); `--backward whole` with checkpointing is refused.

use candle_core::{DType, Result, Tensor};

pub use crate::model::kernels::boundary::{cut, seed};
use crate::model::moe::Routing;
use crate::model::tensor_ops::Autograd;
use crate::model::transformer::Transformer;

use super::checkpoint::keep;

pub use crate::step::Backward;

/// A boundary between two parts: the tensor the lower part made (its storage moved out), the
/// id of the variable that holds its values now (the upper part's input), and the lower part's
/// segment (the embedding's: the outer one; a block's: its tag).
pub(crate) struct Boundary<T: Autograd> {
    pub(crate) made: T,
    var: T::Id,
    pub(crate) part: u32,
}

/// What the forward leaves for the backward.
pub struct Forward<T: Autograd = Tensor> {
    pub(crate) loss: T,
    /// The boundaries from the bottom (the embedding's output) to the top (the head's
    /// input); `None` where the tensor was not tracked.
    pub(crate) cuts: Vec<Option<Boundary<T>>>,
}

/// Cuts `x` where it is tracked, in the segment of the part that made it: `(the upper part's
/// input, the boundary)`.
pub(crate) fn boundary<T: Autograd>(x: T, part: u32) -> Result<(T, Option<Boundary<T>>)> {
    if !x.tracked() {
        return Ok((x, None));
    }
    let outer = x.segment();
    x.set_segment(part);
    let var = x.cut()?;
    x.set_segment(outer);
    let id = var.grad_id();
    Ok((
        var,
        Some(Boundary {
            made: x,
            var: id,
            part,
        }),
    ))
}

/// The block-by-block forward with the model's own weights, or under mixed precision
/// (`dtype`) on a 16-bit working copy with the loss in f32.
pub fn forward(
    model: &Transformer,
    dtype: Option<DType>,
    tokens: &Tensor,
    targets: &Tensor,
) -> Result<Forward> {
    let half = dtype.map(|d| model.working(d)).transpose()?;
    forward_on(model, half, tokens, targets)
}

/// [`forward`] on `half`, mixed precision's working copy when given (dropped once the loss
/// exists: its conversions are recorded in the graph).
pub fn forward_on<T: Autograd, R: Routing<T> + Clone, C>(
    model: &Transformer<T, R, C>,
    half: Option<Transformer<T, R, C>>,
    tokens: &T,
    targets: &T,
) -> Result<Forward<T>> {
    let run = half.as_ref().unwrap_or(model);
    let masks = run.input_mask(tokens)?;
    let mut x = run.embed(tokens)?;
    let layers = run.blocks.len();
    let mut cuts = Vec::with_capacity(layers + 1);
    // A boundary is cut as the part that made it (the embedding's in the outer segment, a
    // block's in its own), so that each layer's work stays its own.
    let outer = tokens.segment();
    for i in 0..layers {
        let part = if i == 0 { outer } else { run.blocks[i - 1].tag };
        let (input, cut) = boundary(x, part)?;
        cuts.push(cut);
        x = run.blocks_forward(&input, &masks, i..i + 1)?;
    }
    let part = run.blocks.last().map_or(outer, |b| b.tag);
    let (input, cut) = boundary(x, part)?;
    cuts.push(cut);
    let logits = run.head_forward(&input)?;
    drop(input);
    let loss = match half {
        Some(_) => model.train_loss(&logits.to_f32()?, targets)?,
        None => model.train_loss(&logits, targets)?,
    };
    Ok(Forward { loss, cuts })
}

/// The backward block by block: the head's first, then each boundary seeded with its gradient
/// and differentiated alone (in the segment of the part below it), each graph freed before the
/// next; the gradients of `vars` kept.
pub fn backward<T: Autograd>(vars: &[T::Var], fwd: Forward<T>) -> Result<T::Grads> {
    let Forward { loss, mut cuts } = fwd;
    let mut grads = T::Grads::default();
    let outer = loss.segment();
    let mut all = loss.backward()?;
    drop(loss);
    let mut upstream = take_cut::<T>(&all, cuts.last())?;
    keep::<T>(&mut grads, &mut all, vars)?;
    drop(all);
    while let Some(Some(b)) = cuts.pop() {
        b.made.set_segment(b.part);
        let g = upstream
            .take()
            .expect("a gradient for every tracked boundary");
        let root = b.made.seed(g)?;
        drop(b);
        let mut all = root.backward()?;
        drop(root);
        upstream = take_cut::<T>(&all, cuts.last())?;
        keep::<T>(&mut grads, &mut all, vars)?;
    }
    // Back to the outer segment (when the loop stopped above an untracked boundary it is
    // still a block's); the variables outlive the loop, and any tensor reaches the ledger.
    if let Some(first) = vars.first() {
        T::var_tensor(first).set_segment(outer);
    }
    Ok(grads)
}

/// The gradient of the boundary below (the next to seed), when it is tracked.
pub(crate) fn take_cut<T: Autograd>(
    all: &T::Grads,
    below: Option<&Option<Boundary<T>>>,
) -> Result<Option<T>> {
    match below {
        Some(Some(b)) => T::grad_of(all, b.var)
            .map(Some)
            .ok_or_else(|| candle_core::Error::Msg("by-block: no gradient for a boundary".into())),
        _ => Ok(None),
    }
}
