//! Generation written once over the tensor trait: the prompt into the key/value cache
//! (`prefill`), then greedy tokens (`decode`), with the cache or recomputing the whole prefix
//! each time. The runner runs them in its metered windows, the replay on its ledger.

use candle_core::Result;

use crate::model::moe::Routing;
use crate::model::tensor_ops::TensorOps;
use crate::model::transformer::{KvCache, Transformer};

/// The prompt `tokens` through the model into `cache`: the greedy next token `(B,)`.
pub fn prefill<T: TensorOps, R: Routing<T> + Clone, C>(
    model: &Transformer<T, R, C>,
    tokens: &T,
    cache: &mut KvCache<T>,
) -> Result<T> {
    let logits = model.forward_cached(tokens, cache)?;
    logits.argmax_last()
}

/// `n` greedy tokens after `next`: each through the model over `cache` (`kv_cache`), or
/// appended to `prefix` and the whole prefix run again; the last one.
pub fn decode<T: TensorOps, R: Routing<T> + Clone, C>(
    model: &Transformer<T, R, C>,
    mut next: T,
    prefix: &mut T,
    cache: &mut KvCache<T>,
    n: usize,
    kv_cache: bool,
) -> Result<T> {
    for _ in 0..n {
        let token = next.unsqueeze(1)?;
        let logits = if kv_cache {
            model.forward_cached(&token, cache)?
        } else {
            *prefix = T::cat(&[&*prefix, &token], 1)?;
            model.forward_cached(prefix, &mut KvCache::default())?
        };
        drop(token);
        next = logits.argmax_last()?;
    }
    Ok(next)
}
