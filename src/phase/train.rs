//! A training step's forward and backward, written once over [`Autograd`]: the runner runs them
//! on candle's tensors inside its metered windows, the replay (`formula::replay`) on symbolic
//! ones inside its ledger's. The forward is the whole graph to the loss, block by block
//! ([`by_block`]) or checkpointed ([`checkpoint`]); under mixed precision on a 16-bit working
//! copy of the weights (under transformers' kernels as autocast runs it: the norms, embedding
//! tables and residual stream f32, each projection casting its input) with the loss in f32.

use candle_core::Result;

use super::{by_block, checkpoint};
use crate::model::moe::Routing;
use crate::model::tensor_ops::{Autograd, Map};
use crate::model::transformer::Transformer;
pub use crate::step::Backward;

/// What a training forward leaves for the backward.
pub enum Graph<T: Autograd, R, C> {
    /// The whole graph, to the loss.
    Plain(T),
    ByBlock(by_block::Forward<T>),
    Checkpointed(checkpoint::Forward<T, R, C>),
}

/// The training forward: checkpointed with `k` blocks a segment (0: none), else block by
/// block or the whole graph as `backward` says. `cast`: mixed precision's recorded conversion
/// to the working type; the whole and by-block forwards run on a working copy of the weights
/// ([`Transformer::working_copy`]: kept until the loss, its conversions in the graph), the
/// checkpointed one casts a segment's blocks at a time ([`checkpoint::forward_mixed_with`]);
/// the loss in f32.
pub fn forward<T: Autograd, R: Routing<T> + Clone, C: Clone>(
    model: &Transformer<T, R, C>,
    cast: Option<&Map<'_, T>>,
    tokens: &T,
    targets: &T,
    k: usize,
    backward: Backward,
) -> Result<Graph<T, R, C>> {
    if k > 0 {
        return Ok(Graph::Checkpointed(match cast {
            Some(cast) => checkpoint::forward_mixed_with(model, cast, tokens, targets, k)?,
            None => checkpoint::forward(model, &model.detached(), tokens, targets, k)?,
        }));
    }
    let half = cast
        .map(|f| model.working_copy(f, &|t: &T| Ok(t.clone()), model.own.clone(), true))
        .transpose()?;
    Ok(match (backward, half) {
        (Backward::ByBlock, half) => {
            Graph::ByBlock(by_block::forward_on(model, half, tokens, targets)?)
        }
        (Backward::Whole, None) => {
            Graph::Plain(model.train_loss(&model.forward(tokens)?, targets)?)
        }
        (Backward::Whole, Some(half)) => {
            let logits = half.forward(tokens)?;
            Graph::Plain(model.train_loss(&logits.to_f32()?, targets)?)
        }
    })
}

/// The backward of any graph, keeping the gradients of the variables `vars` lists (asked for
/// after the whole graph's backward, so the list is not alive at its peak; before the others,
/// which need it from their start). The whole graph stays with the caller (the `backward`
/// window ends with it alive); the by-block and checkpointed ones are used up.
pub fn backward<T: Autograd, R: Routing<T> + Clone, C, V: AsRef<[T::Var]>>(
    model: &Transformer<T, R, C>,
    vars: impl FnOnce() -> V,
    graph: &mut Option<Graph<T, R, C>>,
    tokens: &T,
    k: usize,
) -> Result<T::Grads> {
    match graph.take() {
        Some(Graph::Plain(loss)) => {
            // `loss.backward()`, pruned to the parameters' gradients: candle also stores
            // gradients for constant operands (the causal mask's broadcast, a frozen weight)
            // and never removes them; they are freed here.
            let mut all = loss.backward()?;
            let mut grads = T::Grads::default();
            checkpoint::keep::<T>(&mut grads, &mut all, vars().as_ref())?;
            drop(all);
            *graph = Some(Graph::Plain(loss));
            Ok(grads)
        }
        Some(Graph::ByBlock(f)) => by_block::backward(vars().as_ref(), f),
        Some(Graph::Checkpointed(f)) => checkpoint::backward(model, vars().as_ref(), f, tokens, k),
        None => Err(candle_core::Error::Msg("backward without a forward".into())),
    }
}
