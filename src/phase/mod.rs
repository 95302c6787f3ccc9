//! Phases: each runs one piece of a training or serving step inside a metered window.
//!
//! A case runs its phases in the fixed order below, after an unmetered warm-up on a throwaway
//! copy of the same model (a training step when a training phase is asked, else the serving
//! forwards alone: [`runner::warm_up`]), so gemm's per-thread scratch buffers and other
//! first-use allocations are out of the way. Phases that were not asked for but are
//! needed by later ones still run, unmetered. What each window contains:
//!
//! | phase | window | baseline holds |
//! |---|---|---|
//! | `init` | `VarMap` + model construction: weights materialised and initialised | nothing of the case |
//! | `forward` | training forward to the mean cross-entropy loss; the graph is kept | weights, input batch |
//! | `backward` | block by block (the default: [`by_block`], each part's graph dropped once its gradients are taken, so the window ends without the graph) or `loss.backward()` over the whole graph (`--backward whole`: the graph is still alive when the window ends), pruned to the parameters' gradients | weights, graph (activations) |
//! | `optimizer` | creating the optimizer (its state) and its first `step` | weights, gradients |
//! | `train-step` | a steady-state step: forward, backward, drop the graph, `step`, drop the gradients | weights, optimizer state |
//! | `inference` | forward to the logits with the serving weights (no graph) | weights, optimizer state |
//! | `prefill` | the prompt through the model, filling the key/value cache; greedy next token | weights |
//! | `decode` | `decode_tokens` greedy tokens (with the cache, or recomputing the prefix) | weights, the prompt's cache |
//! | `load` | the weights read back from a safetensors file (whole, or memory-mapped) | weights, the file on disk |
//! | `dataload` | epochs of the image pipeline (`crate::data::bench`); no model | nothing of the case |
//!
//! `peak_bytes` is the window's high-water mark above its baseline; `retained_bytes` is what
//! is still allocated when it closes (for `forward` the graph, for `backward` the gradients —
//! minus the graph it used up, by block or checkpointed ([`crate::record::Row::gradient_bytes`]) —
//! for `optimizer` its state, for `inference` the logits, for `prefill` the cache, for `decode`
//! the cache's growth, for `load` the loaded tensors). The default phase list is the first six;
//! `prefill`, `decode` and `load` run when asked for.

pub mod by_block;
pub mod checkpoint;
pub mod denormals;
pub mod generate;
pub mod runner;
pub mod train;

pub use crate::step::{OptimizerKind, Phase};
