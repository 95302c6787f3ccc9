//! The additive attention masks, made on the device: causal, causal with a sliding window, and
//! chunked (Llama 4).
//! Below the attention and the kernels, which both make them.

use candle_core::{Device, Result, Tensor};

/// The additive causal mask of `rows` queries, the first at position `first_row`, over `cols`
/// keys: f32 `(rows, cols)`, 0 where the key is at or before the query, −∞ after.
pub fn causal_mask(rows: usize, cols: usize, first_row: usize, device: &Device) -> Result<Tensor> {
    windowed_mask(rows, cols, first_row, None, device)
}

/// The additive mask of one tile of a query-head group's rows read as one matrix
/// (grouped-query attention): row `first_row + i` is the query at position `(first_row + i)
/// mod period`, column `j` the key at position `first_key + j` of `cols` keys; −∞ for a key
/// after the query or, with a sliding `window` (> 0), `window` or more positions before it.
pub fn grouped_causal_mask(
    rows: usize,
    cols: usize,
    first_row: usize,
    period: usize,
    first_key: usize,
    window: usize,
    device: &Device,
) -> Result<Tensor> {
    // An exact-size iterator: the Vec (which the tensor keeps) has no spare capacity.
    let mask: Vec<f32> = (0..rows * cols)
        .map(|k| {
            let (i, j) = ((k / cols + first_row) % period, k % cols + first_key);
            if j > i || (window > 0 && i - j >= window) {
                f32::NEG_INFINITY
            } else {
                0.
            }
        })
        .collect();
    Tensor::from_vec(mask, (rows, cols), device)
}

/// [`causal_mask`] with a sliding `window`: also −∞ for keys `window` or more positions before
/// the query (query `i` sees `i − window + 1 ..= i`, as transformers' sliding-window mask).
pub fn windowed_mask(
    rows: usize,
    cols: usize,
    first_row: usize,
    window: Option<usize>,
    device: &Device,
) -> Result<Tensor> {
    // One period past the last row: the positions are the rows' own.
    let period = first_row + rows.max(1);
    grouped_causal_mask(
        rows,
        cols,
        first_row,
        period,
        0,
        window.unwrap_or(0),
        device,
    )
}

/// The additive chunked mask's value for the query at position `query` and the key at `key`
/// (Llama 4's `attention_chunk_size` `chunk`, transformers' `chunked_causal_mask_function`): 0
/// when the key is in the query's chunk and not after it, −∞ otherwise.
pub fn chunked(query: usize, key: usize, chunk: usize) -> f32 {
    if key > query || key / chunk != query / chunk {
        f32::NEG_INFINITY
    } else {
        0.
    }
}
