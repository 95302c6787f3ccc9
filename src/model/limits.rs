//! Upper bounds of the sizes memfit accepts, wherever they come from (workload keys, flags,
//! a `config.json`): one place, read by the workload and the config reader.

/// Upper bounds of the size keys (inclusive).
pub const MAX_BATCH: i64 = 1 << 20;
pub const MAX_SEQ: i64 = 1 << 20;
pub const MAX_HIDDEN: i64 = 1 << 20;
pub const MAX_HEADS: i64 = 1 << 16;
pub const MAX_LAYERS: i64 = 1 << 14;
pub const MAX_VOCAB: i64 = 1 << 24;
pub const MAX_IMAGE: i64 = 1 << 16;
pub const MAX_CHANNELS: i64 = 1 << 10;
/// Routed experts of a mixture-of-experts layer (DeepSeek-V3 has 256).
pub const MAX_EXPERTS: i64 = 1 << 12;
/// Largest single tensor memfit will try: Rust allocations are limited to `isize::MAX` bytes.
pub const MAX_TENSOR_BYTES: u128 = isize::MAX as u128;
