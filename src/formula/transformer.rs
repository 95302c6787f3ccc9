//! Formulas for the GPT decoder of [`crate::model::transformer`] on candle 0.11.1's CPU backend, f32.
//! The LLaMA family and the ViT share the weight, gradient, optimizer and load terms (their
//! parameter tensors come from `block_projections`); their forward, backward and inference
//! peaks come from the replay ([`super::replay`]). A LLaMA model's weights also hold the
//! rotary tables `2 · S_max · D/2 · e`; its KV cache grows by `2 · L · B · T · G · D · e`
//! (MLA: `L · B · T · (kv_lora_rank + qk_rope_head_dim) · e`; [`Shape::kv_bytes_per_token`]).
//!
//! Notation: B batch, S sequence, H hidden, A heads, L layers, V vocab, S_max position table,
//! P parameters, e bytes per element (4 for f32, 2 for bf16/f16). The activation closed form is
//! for f32 (bf16 cases take the replay: LayerNorm computes in f32 inside). On CUDA the
//! metadata terms are 0 and there is no gemm scratch: the pool sees tensor data only; what
//! CUDA kernels and cuBLAS allocate beyond that is left to the calibration fit (issue 6). "Metadata" is candle's per-tensor bookkeeping
//! (`Arc`s, layouts, shapes, graph nodes) that the counting allocator also sees.

use crate::device::{ElemType, ServingWeights};
use crate::model::frozen::{quantize_scratch, quantized_bytes};
use crate::model::shapes::{FP8_BLOCK, LoraBase, mxfp4_bytes};
use crate::model::transformer::{BlockTensor, LoraTarget};
use crate::optim::inplace;
use crate::step::{OptimizerKind, Phase};

pub use super::shape::{BLOCK_8BIT, Shape, lora_bits};

use super::Prediction;
use super::replay::{Replay, Serving, Training, replay, replay_serving, replay_training};

impl Shape {
    /// Bytes per parameter, gradient and optimizer-state element (f32 under mixed precision).
    pub fn e(&self) -> u64 {
        if self.mixed { 4 } else { self.elem.size() }
    }

    /// A CPU metadata term; on CUDA the pool never sees host bookkeeping.
    pub(crate) fn meta(&self, bytes: u64) -> u64 {
        if self.cpu { bytes } else { 0 }
    }

    /// The variables the model's `VarMap` holds: names and shapes (QLoRA's quantized
    /// projection weights are not variables any more; a tied head is the token table).
    pub fn named_variables(&self) -> Vec<(String, Vec<u64>)> {
        let Shape { h, v, s_max, .. } = *self;
        let r = self.lora_rank;
        let quantized = self.quantized_base().is_some();
        let llama = self.llama.is_some();
        let mut vars = match self.vision {
            None => vec![("wte.weight".to_string(), vec![v, h])],
            Some(vis) => vec![
                ("patch.weight".to_string(), vec![h, vis.patch_dim() as u64]),
                ("patch.bias".to_string(), vec![h]),
                ("cls".to_string(), vec![1, 1, h]),
                ("head.bias".to_string(), vec![v]),
            ],
        };
        if !llama {
            vars.push(("wpe".to_string(), vec![s_max, h]));
        }
        vars.push(("ln_f.weight".to_string(), vec![h]));
        if !llama {
            vars.push(("ln_f.bias".to_string(), vec![h]));
        }
        if !self.tied {
            vars.push(("head.weight".to_string(), vec![v, h]));
        }
        let blocks = self.blocks();
        for (i, tensors) in blocks.iter().enumerate() {
            for t in tensors {
                match t {
                    BlockTensor::Norm { path, size } => {
                        vars.push((format!("h.{i}.{path}.weight"), vec![*size as u64]));
                        if !llama {
                            vars.push((format!("h.{i}.{path}.bias"), vec![*size as u64]));
                        }
                    }
                    BlockTensor::Linear {
                        path,
                        inp,
                        out,
                        bias,
                    } => {
                        vars.push((
                            format!("h.{i}.{path}.weight"),
                            vec![*out as u64, *inp as u64],
                        ));
                        if *bias {
                            vars.push((format!("h.{i}.{path}.bias"), vec![*out as u64]));
                        }
                    }
                    BlockTensor::Vector { path, size } => {
                        vars.push((format!("h.{i}.{path}"), vec![*size as u64]));
                    }
                    BlockTensor::Proj { path, spec: p } => {
                        let (inp, out) = (p.inp as u64, p.out as u64);
                        if !quantized {
                            vars.push((format!("h.{i}.{path}.weight"), vec![out, inp]));
                        }
                        if p.bias {
                            vars.push((format!("h.{i}.{path}.bias"), vec![out]));
                        }
                        if self.has_lora(p.target) {
                            vars.push((format!("h.{i}.{path}.lora_a"), vec![r, inp]));
                            vars.push((format!("h.{i}.{path}.lora_b"), vec![out, r]));
                        }
                    }
                }
            }
        }
        vars
    }

    /// Bytes of the safetensors file `VarMap::save` writes: an 8-byte length, the JSON header
    /// (tensors sorted by name, `{"name":{"dtype":…,"shape":[…],"data_offsets":[a,b]},…}`,
    /// padded with spaces to a multiple of 8), then the data.
    pub fn safetensors_file_bytes(&self) -> u64 {
        let mut vars = self.named_variables();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let dtype = match (self.mixed, self.elem) {
            (true, _) | (false, ElemType::F32) => "F32",
            (false, ElemType::F16) => "F16",
            (false, ElemType::Bf16) => "BF16",
        };
        let mut offset = 0;
        let entries: Vec<String> = vars
            .iter()
            .map(|(name, shape)| {
                let n = self.e() * shape.iter().product::<u64>();
                let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
                let e = format!(
                    "\"{name}\":{{\"dtype\":\"{dtype}\",\"shape\":[{}],\"data_offsets\":[{offset},{}]}}",
                    dims.join(","),
                    offset + n
                );
                offset += n;
                e
            })
            .collect();
        let header = (entries.join(",").len() as u64 + 2).next_multiple_of(8);
        8 + header + offset
    }

    /// The `load` phase: `read` holds the whole file beside the tensors made from it; `mmap`
    /// only the tensors (the mapping is not heap memory). Plus, on the CPU, the header's parsed
    /// form and the tensors' bookkeeping.
    pub fn load_bytes(&self, mmap: bool) -> (u64, u64) {
        let vars = self.named_variables();
        let data: u64 = vars
            .iter()
            .map(|(_, s)| self.e() * s.iter().product::<u64>())
            .sum();
        let kept = data + self.meta(LOAD_META_PER_TENSOR * vars.len() as u64);
        let file = if mmap {
            0
        } else {
            self.safetensors_file_bytes()
        };
        (kept + file, kept)
    }

    /// `P = 2VH + S_max·H + L(12H² + 13H) + 2H`, plus the LoRA adapters; ViT: the token
    /// table becomes the patch projection and class token `C·p²·H + 2H`, the head gains its
    /// bias `K` (see `model::vit`); LLaMA: no position table, RMSNorms `H` each, the block's
    /// projections as `model::llama` says; a tied head adds nothing.
    pub fn params(&self) -> u64 {
        let (before, after) = self.outside_param_sizes();
        let outside: u64 = before.iter().chain(&after).sum();
        outside + self.blocks().params() + self.lora_sizes().iter().sum::<u64>()
    }

    /// The quantized base of QLoRA's frozen projections (GGML blocks or FP8), if any.
    pub fn quantized_base(&self) -> Option<LoraBase> {
        (self.lora_rank > 0 && self.lora_base.quantized()).then_some(self.lora_base)
    }

    /// True when projection `t` has an adapter.
    pub fn has_lora(&self, t: LoraTarget) -> bool {
        self.lora_rank > 0 && self.lora_targets & lora_bits(&[t]) != 0
    }

    /// Elements of every adapter tensor (A then B per adapted projection, per layer).
    pub fn lora_sizes(&self) -> Vec<u64> {
        let r = self.lora_rank;
        let mut sizes = Vec::new();
        if r == 0 {
            return sizes;
        }
        for tensors in self.blocks().iter() {
            for t in tensors {
                if let BlockTensor::Proj { spec: p, .. } = t
                    && self.has_lora(p.target)
                {
                    sizes.extend([r * p.inp as u64, p.out as u64 * r]);
                }
            }
        }
        sizes
    }

    /// Elements of every tensor the optimizer updates: all parameters, or the adapters.
    pub fn trainable_sizes(&self) -> Vec<u64> {
        if self.lora_rank > 0 {
            self.lora_sizes()
        } else {
            self.param_tensor_sizes()
        }
    }

    /// Parameter tensors: 5 outside the blocks (ViT: 8), 16 per block (LLaMA: 2 norms and
    /// the projections' weights and biases).
    pub fn param_tensors(&self) -> u64 {
        let (before, after) = self.outside_param_sizes();
        (before.len() + after.len()) as u64 + self.blocks().param_tensors()
    }

    /// Parameter tensors of one block (on average over the blocks, rounded down).
    fn tensors_per_block(&self) -> u64 {
        self.blocks().param_tensors() / self.l.max(1)
    }

    /// A per-block metadata constant fitted on GPT's 16 tensors per block, scaled to this
    /// model's block.
    fn per_block_meta(&self, gpt_per_layer: u64) -> u64 {
        gpt_per_layer * self.tensors_per_block() / 16
    }

    /// Pairs of rotary tables (cos, sin) the model keeps: none outside LLaMA, one, and a
    /// second for Gemma's sliding layers (their own base).
    fn rotary_pairs(&self) -> u64 {
        self.llama
            .map_or(0, |l| 1 + u64::from(l.local_rope(self.l as usize)))
    }

    /// Bytes of the rotary tables (cos and sin, `S_max × D/2` each, in the weights' type).
    pub fn rotary_bytes(&self) -> u64 {
        match self.llama {
            None => 0,
            Some(l) => {
                // Gemma's sliding layers keep a second pair (their own base).
                self.rotary_pairs() * 2 * self.s_max * (l.rotary_width() as u64 / 2) * self.e()
            }
        }
    }

    /// Elements of the largest parameter tensor.
    pub fn largest_param(&self) -> u64 {
        self.param_tensor_sizes().into_iter().max().unwrap_or(0)
    }

    /// The synthetic batch the runner makes before any window: tokens and targets `(B, S)` u32
    /// for the decoder; images `(B, C, I, I)` f32 and classes `(B, 1)` u32 for a ViT.
    pub fn input_bytes(&self) -> u64 {
        match self.vision {
            None => 2 * 4 * self.b * self.s,
            Some(v) => 4 * self.b * (v.channels * v.image * v.image) as u64 + 4 * self.b,
        }
    }

    /// Weights after `init`: `e·P` plus the `VarMap`'s metadata (names, `Var`s, hash table).
    pub fn weights_bytes(&self) -> u64 {
        // LoRA adds its adapter variables and the frozen model's detached views.
        let lora_meta = if self.lora_rank > 0 {
            self.lora_sizes().len() as u64 * INIT_META_PER_VAR
                + self.param_tensors() * META_PER_TENSOR
        } else {
            0
        };
        self.e() * self.params()
            + self.rotary_bytes()
            + self.meta(
                INIT_META_FIXED
                    + self.per_block_meta(INIT_META_PER_LAYER) * self.l
                    + lora_meta
                    // The rotary tables.
                    + 2 * self.rotary_pairs() * META_PER_TENSOR,
            )
    }

    /// Tensor data the training forward keeps alive for backward (the graph), in bytes.
    ///
    /// Per block, in floats: LayerNorm (`layer_norm_slow`) 5·BSH + 6·BS each; q/k/v matmul and
    /// bias 6·BSH; head split `contiguous()` copies 3·BSH and the head merge 1·BSH (both skipped
    /// when A = 1 or S = 1, where the transposes are already contiguous); scores q·kᵀ, scale, mask add and
    /// the composed softmax (diff, exp, quotient) 6·A·B·S², its max and sum 2·A·B·S; attn×v,
    /// o-proj and bias, residual 4·BSH; fc1 + bias 8·BSH, GELU 4·BSH, fc2 + bias + residual 3·BSH.
    /// Total 39·BSH + 6·ABS² + 2·ABS + 12·BS (35·BSH when A = 1).
    /// Outside the blocks: embedding + position add 2·BSH, final LayerNorm 5·BSH + 6·BS, logits
    /// and log-softmax 4·BSV + 4·BS (max, its sum of exponentials and log, the gathered
    /// log-probabilities), the S² causal mask, and 2 scalars (the sum and the loss).
    ///
    /// ViT (no mask: 5·A·B·S² per block; N = S − 1 patches, K = v classes): the blocks as
    /// above, then outside them the patch copy B·N·C·p², the projection and its bias 2·BNH, the
    /// class token's broadcast copy BH, the concatenation and position add 2·BSH; the head sees
    /// the class token only: its copy BH, LayerNorm 5·BH + 6·B, logits and bias 2·BK,
    /// log-softmax 3·BK + 4·B, and the 2 scalars. Both BH copies are views when B = 1.
    pub fn activation_data_bytes(&self) -> u64 {
        let Shape {
            b, s, h, a, l, v, ..
        } = *self;
        let copies = if a == 1 || s == 1 { 0 } else { 4 * b * s * h };
        if let Some(vis) = self.vision {
            let n = s - 1;
            let per_layer =
                35 * b * s * h + copies + 5 * a * b * s * s + 2 * a * b * s + 12 * b * s;
            // The class token's copy and the head's copy are views when B = 1.
            let token_copy = if b == 1 { 0 } else { b * h };
            let stem = b * n * vis.patch_dim() as u64 + 2 * b * n * h + token_copy + 2 * b * s * h;
            let head = token_copy + 5 * b * h + 5 * b * v + 10 * b + 2;
            return 4 * (l * per_layer + stem + head);
        }
        let per_layer = 35 * b * s * h + copies + 6 * a * b * s * s + 2 * a * b * s + 12 * b * s;
        4 * (l * per_layer + 7 * b * s * h + s * s + 4 * b * s * v + 10 * b * s + 2)
    }

    /// The graph: [`Shape::activation_data_bytes`] plus graph metadata.
    pub fn activation_bytes(&self) -> u64 {
        self.activation_data_bytes() + self.meta(GRAPH_META_FIXED + GRAPH_META_PER_LAYER * self.l)
    }

    /// Gradients of all parameters after pruning the store: `e·P` plus metadata.
    pub fn gradient_bytes(&self) -> u64 {
        if self.lora_rank > 0 {
            let sizes = self.lora_sizes();
            return self.e() * sizes.iter().sum::<u64>()
                + self.meta(GRAD_META_PER_TENSOR * sizes.len() as u64);
        }
        self.e() * self.params()
            + self.meta(GRAD_META_FIXED + self.per_block_meta(GRAD_META_PER_LAYER) * self.l)
    }

    /// Elements of every parameter tensor, in model order (a tied head is the token table).
    pub fn param_tensor_sizes(&self) -> Vec<u64> {
        let (before, after) = self.outside_param_sizes();
        let mut sizes = before;
        sizes.extend(self.blocks().param_sizes());
        sizes.extend(after);
        sizes
    }

    /// Elements of the parameter tensors outside the blocks: those made before them (token
    /// table or patch projection and class token, position table) and after (final norm,
    /// head, the classifier's bias).
    fn outside_param_sizes(&self) -> (Vec<u64>, Vec<u64>) {
        let Shape { h, v, s_max, .. } = *self;
        let llama = self.llama.is_some();
        let mut before = match self.vision {
            None => vec![v * h],
            Some(vis) => vec![vis.patch_dim() as u64 * h, h, h],
        };
        if !llama {
            before.push(s_max * h);
        }
        let mut after = vec![h]; // ln_f
        if !llama {
            after.push(h);
        }
        if !self.tied {
            after.push(v * h); // head
        }
        if self.vision.is_some() {
            after.push(v); // the classifier's bias
        }
        (before, after)
    }

    /// Optimizer state (see `crate::optim`): SGD none; SGD with momentum `e·P`; Adam and AdamW
    /// `2e·P`; 8-bit AdamW `Σ_t 2·(n_t + 4⌈n_t/block⌉)`. Plus, on the CPU, the metadata of the
    /// state tensors.
    pub fn optimizer_state_bytes(&self, opt: OptimizerKind) -> u64 {
        let sizes = self.trainable_sizes();
        let (p, t) = (sizes.iter().sum::<u64>(), sizes.len() as u64);
        if self.in_place_step(opt) {
            // `optim::inplace`: candle's state tensors and one slot per parameter tensor.
            let slots = self.meta(inplace::SLOT_BYTES * t);
            return slots
                + match opt {
                    OptimizerKind::SgdMomentum => {
                        self.e() * p + self.meta(inplace::STATE_META_PER_TENSOR * t)
                    }
                    OptimizerKind::Adam | OptimizerKind::Adamw => {
                        2 * self.e() * p + self.meta(2 * inplace::STATE_META_PER_TENSOR * t)
                    }
                    _ => 0,
                };
        }
        match opt {
            OptimizerKind::Sgd => 0,
            OptimizerKind::SgdMomentum => self.e() * p + self.meta(INIT_META_PER_VAR * t),
            OptimizerKind::Adam | OptimizerKind::Adamw => {
                2 * self.e() * p + self.meta(2 * INIT_META_PER_VAR * t)
            }
            OptimizerKind::Adamw8bit => {
                sizes
                    .iter()
                    .map(|&n| state_bytes_8bit(n, self.block))
                    .sum::<u64>()
                    + self.meta(
                        4 * META_PER_STATE_TENSOR_8BIT * t
                            + crate::optim::adamw8bit::object_bytes(),
                    )
            }
        }
    }

    /// Peak temporaries of one optimizer step, beside its state: candle's AdamW builds its
    /// update from unfused per-tensor ops whose results stay referenced until the parameter is
    /// written, 14 tensors the size of the largest parameter; SGD's `θ − lr·g` and momentum's
    /// `μ·v + g` / `θ − lr·v` need 2; 8-bit AdamW's host copies `10·n + 8⌈n/block⌉ + 8·block`
    /// bytes for the largest tensor (f32 θ; `max(12n, …)` for 16-bit θ on the CPU).
    pub fn optimizer_step_temp_bytes(&self, opt: OptimizerKind) -> u64 {
        let n = self.trainable_sizes().into_iter().max().unwrap_or(0);
        if self.in_place_step(opt) {
            // `optim::inplace`: every update is written into θ and its state.
            return 0;
        }
        match opt {
            OptimizerKind::Sgd | OptimizerKind::SgdMomentum => 2 * self.e() * n,
            OptimizerKind::Adam | OptimizerKind::Adamw => {
                // The fitted metadata is per block of 16 tensors; LoRA's few adapters scale it.
                let meta = if self.lora_rank > 0 {
                    OPT_META_PER_LAYER / 16 * self.lora_sizes().len() as u64
                } else {
                    OPT_META_FIXED + self.per_block_meta(OPT_META_PER_LAYER) * self.l
                };
                14 * self.e() * n + self.meta(meta)
            }
            OptimizerKind::Adamw8bit => {
                let host = 10 * n + 8 * n.div_ceil(self.block) + 8 * self.block;
                let half = self.e() == 2;
                match (self.cpu, half) {
                    // The f32 copies of a 16-bit θ pass through an f32 tensor: g's host copy
                    // (4n) + θ's f32 tensor (4n) + θ's host copy (4n) at once.
                    (true, true) => host.max(12 * n),
                    (true, false) => host,
                    // On CUDA the host copies are not device memory: θ's f32 upload (4n) and,
                    // for 16-bit θ, its conversion (2n).
                    (false, false) => 4 * n,
                    (false, true) => 6 * n,
                }
            }
        }
    }

    /// The update's transient bytes inside a steady-state train step: the optimizer's step
    /// temporaries without AdamW's per-tensor state metadata ([`OPT_META_PER_LAYER`], which
    /// the optimizer phase's window sees because it creates the state, and a train step's
    /// does not: its optimizer exists before). This point is the train step's peak wherever
    /// the backward keeps less than the gradients plus the step's scratch (fused kernels on
    /// small batches: measured within 2.1 KB on `small` B1 S16 and a 3-block ViT).
    pub fn train_step_update_bytes(&self, opt: OptimizerKind) -> u64 {
        if self.in_place_step(opt) {
            return 0;
        }
        match opt {
            OptimizerKind::Adam | OptimizerKind::Adamw => {
                let n = self.trainable_sizes().into_iter().max().unwrap_or(0);
                14 * self.e() * n + self.meta(OPT_META_FIXED)
            }
            _ => self.optimizer_step_temp_bytes(opt),
        }
    }

    /// Whether the runner steps `opt` in place (`optim::inplace`): with fused kernels, for every
    /// optimizer but `adamw-8bit`.
    pub fn in_place_step(&self, opt: OptimizerKind) -> bool {
        self.kernels.fused() && opt != OptimizerKind::Adamw8bit
    }

    /// The cross-entropy head's backward point, in closed form (the replay finds it too):
    /// the log-softmax and `nll` backward hold 7 tensors of `B·S·V` at once (the gradient being
    /// processed, the accumulated gradients of both `broadcast_sub` operands, and `or_insert`'s
    /// zero tensors that `add` replaces). Where the vocabulary dominates this is the backward
    /// peak.
    pub fn backward_head_bytes(&self) -> u64 {
        7 * self.e() * self.b * self.s * self.v
    }

    /// Backward, inference and the graph from replaying candle on symbolic tensors
    /// ([`super::replay`]), with [`META_PER_TENSOR`] bytes of bookkeeping per live tensor
    /// and gemm's packing buffers for candle running on `threads` threads.
    pub fn replay(&self, threads: usize) -> Replay {
        replay(
            self,
            self.meta(META_PER_TENSOR),
            self.cpu.then_some(threads),
        )
    }

    /// The training part of [`Shape::replay`] (forward, backward), remembered per shape and
    /// thread count ([`memo`]): a question such as `predict`'s asks for the same case's
    /// phases several times.
    pub fn replay_training(&self, threads: usize) -> Training {
        super::memo::training(self, threads, || {
            replay_training(
                self,
                self.meta(META_PER_TENSOR),
                self.cpu.then_some(threads),
            )
        })
    }

    /// The serving part of [`Shape::replay`] (inference, prefill, decode), remembered like
    /// [`Shape::replay_training`].
    pub fn replay_serving(&self, threads: usize) -> Serving {
        super::memo::serving(self, threads, || {
            replay_serving(
                self,
                self.meta(META_PER_TENSOR),
                self.cpu.then_some(threads),
            )
        })
    }

    /// Bytes of keys and values one cached token adds: `2 · L · G · D · e` (G K/V heads of
    /// width D; G = A and D = H/A outside LLaMA), e the serving activations' bytes; MLA's
    /// latent cache `L · (kv_lora_rank + qk_rope_head_dim) · e`.
    pub fn kv_bytes_per_token(&self) -> u64 {
        let e = self.kv_elem_bytes();
        match self.llama.and_then(|l| l.mla) {
            // MLA: the latent and the shared rotary key.
            Some(m) => self.l * m.latent_per_token() as u64 * e,
            None => {
                let (g, d) = self.kv_dims();
                2 * self.cached_layers() * g * d * e
            }
        }
    }

    /// The layers whose cache grows a token at a time: all but Qwen3-Next's linear layers.
    pub fn cached_layers(&self) -> u64 {
        let linear = (0..self.l as usize)
            .filter(|&i| self.llama.is_some_and(|l| l.linear_at(i).is_some()))
            .count();
        self.l - linear as u64
    }

    /// What one sequence keeps whatever its length: Qwen3-Next's linear layers' state, each
    /// the convolution's last `K` inputs `(K, C)` in the cache's type and the recurrent state
    /// `(nv, dk, dv)` in f32 (transformers computes and keeps it in f32 whatever the model's
    /// type); 0 without linear layers.
    pub fn state_bytes_per_sequence(&self) -> u64 {
        let e = self.kv_elem_bytes();
        (0..self.l as usize)
            .filter_map(|i| self.llama.and_then(|l| l.linear_at(i)))
            .map(|g| {
                (g.conv_kernel * g.conv_dim()) as u64 * e
                    + (g.value_heads * g.key_dim * g.value_dim) as u64 * 4
            })
            .sum()
    }

    /// MLA: what one cached token of one sequence costs decompressed (keys and values per
    /// head, `L·A·(dq + dv)·e`, what transformers' cache keeps); `None` for other attention.
    pub fn kv_bytes_per_token_decompressed(&self) -> Option<u64> {
        let m = self.llama.and_then(|l| l.mla)?;
        Some(self.l * m.decompressed_per_token(self.a as usize) as u64 * self.kv_elem_bytes())
    }

    /// Bytes of one cached element: the serving copy's type.
    pub fn kv_elem_bytes(&self) -> u64 {
        match (self.serve, self.elem) {
            (ServingWeights::F16, _) | (_, ElemType::F16 | ElemType::Bf16) => 2,
            _ => 4,
        }
    }

    /// [`super::replay::decode_step`] with this backend's metadata and gemm buffers: the
    /// serving weights, a cache of `cached` tokens per sequence, and one step's peak above them.
    pub fn decode_step(&self, cached: u64, threads: usize) -> (u64, u64, u64) {
        super::replay::decode_step(
            self,
            cached as usize,
            self.meta(META_PER_TENSOR),
            self.cpu.then_some(threads),
        )
    }

    /// The closed-form activations describe the plain f32 graph with standard attention. A
    /// ViT's forward ends in a head of `B·K` floats, so the packing buffer of an earlier matmul
    /// can stand above the final graph: its forward peak comes from the replay, which models
    /// the buffers (the graph it keeps equals the closed form, tested).
    fn closed_form_forward(&self) -> bool {
        self.elem == ElemType::F32
            && !self.kernels.fused()
            && self.checkpoint == 0
            && !self.efficient
            && !self.tiled
            && self.lora_rank == 0
            && self.vision.is_none()
            && self.llama.is_none()
    }

    /// What a training step holds at its peak: the weights after init (QLoRA's projections
    /// already GGML blocks), the input batch, the optimizer state and the step's peak above them.
    pub fn train_total_bytes(&self, opt: OptimizerKind, threads: usize) -> u64 {
        self.predict(Phase::Init, opt, threads)
            .retained_bytes
            .max(0) as u64
            + self.input_bytes()
            + self.optimizer_state_bytes(opt)
            + self.predict(Phase::TrainStep, opt, threads).peak_bytes
    }

    /// The peak of building the model: its weights; 16-bit weights on CUDA draw each random
    /// tensor in f32, then cast (`cuda_half_init_peak`).
    fn build_peak(&self) -> u64 {
        if !self.cpu && !self.mixed && self.elem.size() == 2 {
            self.cuda_half_init_peak()
        } else {
            self.weights_bytes() + self.meta(INIT_PEAK_META)
        }
    }

    /// Init under QLoRA. The model is built in full (`build_peak`), then each block projection
    /// in model order is quantized by `QTensor::quantize`: an f32 copy of a 16-bit weight
    /// (`4·n`; none for f32), the zeroed blocks, then the blocks written — on the CPU in place
    /// (`q` bytes, with `frozen::quantize_scratch` beside them); on CUDA quantized on the host
    /// and uploaded into a second buffer while the zeroed one lives, each padded by
    /// `512/block · type_size` bytes (candle's row padding) — and a 1-element placeholder of the
    /// weights' type, with their bookkeeping ([`QUANT_META_PER_PROJ`]). The full weights (and
    /// their variables' bookkeeping) go after the last one.
    /// Peak: `max(build, weights + max_i(Σ_{j<i} kept_j + transient_i))`.
    fn qlora_init(&self) -> Prediction {
        let base = self.quantized_base().expect("QLoRA");
        let e = self.elem.size();
        let (mut kept, mut peak, mut proj_elems, mut projs) = (0u64, 0u64, 0u64, 0u64);
        let block = self.projections();
        for _ in 0..self.l {
            for p in &block {
                let n = (p.inp * p.out) as u64;
                let (qb, transient, meta) = match base.ggml() {
                    Some(q) => {
                        let (bs, ts) = (q.block_size() as u64, q.type_size() as u64);
                        let pad = if self.cpu { 0 } else { 512 / bs * ts };
                        let qb = quantized_bytes(n, q) + pad;
                        let f32_copy = if e == 4 { 0 } else { 4 * n };
                        let blocks = if self.cpu {
                            qb + quantize_scratch(n, q)
                        } else {
                            2 * qb
                        };
                        (qb, f32_copy + blocks, QUANT_META_PER_PROJ)
                    }
                    // FP8 and MXFP4: quantized on the host straight from the weight's elements
                    // (on CUDA from a host copy), each of the two parts uploaded once.
                    None => {
                        let qb = if base == LoraBase::Mxfp4 {
                            mxfp4_bytes(p.out, p.inp)
                        } else {
                            FP8_BLOCK.bytes(p.out, p.inp)
                        };
                        (qb, qb, FP8_META_PER_PROJ)
                    }
                };
                peak = peak.max(kept + transient);
                kept += qb + e + self.meta(meta);
                proj_elems += n;
                projs += 1;
            }
        }
        let w = self.weights_bytes();
        // Removing the projections' variables from the `VarMap` frees their weights and their
        // bookkeeping.
        let freed = e * proj_elems + self.meta(INIT_META_PER_VAR) * projs;
        Prediction {
            peak_bytes: self.build_peak().max(w + peak.max(kept)),
            retained_bytes: (w + kept - freed) as i64,
        }
    }

    pub fn predict(&self, phase: Phase, opt: OptimizerKind, threads: usize) -> Prediction {
        let step = self.gradient_bytes() + self.train_step_update_bytes(opt);
        let t = || self.replay_training(threads);
        let sv = || self.replay_serving(threads);
        match phase {
            // QLoRA: the projection weights exist until quantized, then only their GGML blocks
            // (and a 1-element placeholder each) stay; `qlora_init` says how the peak is met.
            Phase::Init if self.quantized_base().is_some() => self.qlora_init(),
            Phase::Init => Prediction {
                peak_bytes: self.build_peak(),
                retained_bytes: self.weights_bytes() as i64,
            },
            // f32: the closed form; bf16/f16: the replay (LayerNorm computes in f32 inside).
            Phase::Forward if self.closed_form_forward() => Prediction {
                peak_bytes: self.activation_bytes(),
                retained_bytes: self.activation_bytes() as i64,
            },
            Phase::Forward => Prediction {
                peak_bytes: t().forward_peak,
                retained_bytes: t().forward_retained as i64,
            },
            Phase::Backward => Prediction {
                peak_bytes: t().backward_peak,
                retained_bytes: t().backward_retained,
            },
            Phase::Optimizer => Prediction {
                // The state's own metadata is inside the step's fitted metadata constant.
                peak_bytes: match opt {
                    // In place: the state (created in the window) and the list of trainable
                    // Vars it was built from; the step allocates nothing.
                    _ if self.in_place_step(opt) => {
                        let t = self.trainable_sizes().len() as u64;
                        self.optimizer_state_bytes(opt) + self.meta(inplace::VAR_BYTES * t)
                    }
                    // AdamW's state metadata is inside the step's fitted metadata constant.
                    OptimizerKind::Adam | OptimizerKind::Adamw => {
                        2 * self.e() * self.trainable_sizes().iter().sum::<u64>()
                    }
                    _ => self.optimizer_state_bytes(opt),
                } + self.optimizer_step_temp_bytes(opt),
                retained_bytes: self.optimizer_state_bytes(opt) as i64,
            },
            // Forward and backward on top of each other, or later the gradients beside the
            // optimizer's step temporaries (the graph is dropped before the step).
            Phase::TrainStep => Prediction {
                peak_bytes: {
                    let t = t();
                    (t.forward_retained + t.backward_peak)
                        .max(t.forward_peak)
                        .max(step)
                },
                retained_bytes: 0,
            },
            Phase::Inference => Prediction {
                peak_bytes: sv().inference_peak,
                retained_bytes: sv().inference_retained as i64,
            },
            Phase::Prefill => Prediction {
                peak_bytes: sv().prefill_peak,
                retained_bytes: sv().prefill_retained as i64,
            },
            Phase::Load => {
                let (peak, kept) = self.load_bytes(self.load_mmap);
                Prediction {
                    peak_bytes: peak,
                    retained_bytes: kept as i64,
                }
            }
            Phase::Decode => Prediction {
                peak_bytes: sv().decode_peak,
                retained_bytes: sv().decode_retained,
            },
            // The data pipeline builds no model: nothing of it is allocated. Its rows carry no
            // prediction (`sweep::rows::predict` skips them); its RAM model is fitted from measurements
            // (`crate::data`, docs/claims.md D2).
            Phase::Dataload => Prediction {
                peak_bytes: 0,
                retained_bytes: 0,
            },
        }
    }
}
// Metadata constants: fitted on the measured residuals (bytes the allocator sees beyond the
// tensor data: `Arc`s, layouts, shapes, graph nodes, `VarMap` names and hash table). They are
// small next to any real model and are documented, not derived.

/// `VarMap` + model metadata outside the blocks. Refitted 2026-12-05 by least squares on a GPT
/// (H 64, V 300) at L = 1–8, 12, 16: the measured metadata beyond `4·P` is 2,657 + 5,949·L B,
/// residuals within ±1.41 KB (the hash table's and `Vec`s' doublings, two-digit layer names);
/// the earlier 2,500 + 4,800·L under-estimated by ≈ 1.1 KB per block (23 % of the metadata).
pub const INIT_META_FIXED: u64 = 2_657;
/// `VarMap` + model metadata per block (GPT's 16 tensors; scaled per tensor for other blocks).
pub const INIT_META_PER_LAYER: u64 = 5_949;
/// What building a model allocates and frees at its end, above the weights it keeps: the init
/// window's peak is the retained bytes + this, measured 183 B on every CPU init row (GPT, LLaMA,
/// MoE, MLA) and 181 B for a ViT.
pub const INIT_PEAK_META: u64 = 183;
/// Metadata per parameter tensor of a `Var` created by an optimizer.
pub const INIT_META_PER_VAR: u64 = 272;
/// Graph metadata outside the blocks (fit, residual ≤ 2.2 KiB over 40 configs).
pub const GRAPH_META_FIXED: u64 = 8_882;
/// Graph metadata per block.
pub const GRAPH_META_PER_LAYER: u64 = 22_270;
/// Gradient-store metadata (measured 5,840 B at L = 1; +4,420 B per block).
pub const GRAD_META_FIXED: u64 = 1_420;
/// Gradient-store metadata per gradient tensor (LoRA's few adapter gradients).
pub const GRAD_META_PER_TENSOR: u64 = 280;
/// Gradient-store metadata per block.
pub const GRAD_META_PER_LAYER: u64 = 4_420;
/// AdamW step metadata (measured 14,912 B at L = 1, 23,712 B at L = 2, 41,312 B at L = 4).
pub const OPT_META_FIXED: u64 = 6_112;
/// AdamW step metadata per block.
pub const OPT_META_PER_LAYER: u64 = 8_800;
/// Bytes of the 8-bit optimizer's state for a tensor of `n` elements.
pub fn state_bytes_8bit(n: u64, block: u64) -> u64 {
    crate::optim::adamw8bit::state_bytes(n, block)
}
/// Metadata per state tensor of the 8-bit optimizer (four per parameter tensor).
pub const META_PER_STATE_TENSOR_8BIT: u64 = 272;

/// Bookkeeping per quantized projection (CPU), measured: its `QTensor` (176 B: the `Arc`, the
/// boxed block storage, the shape) and the 1-element placeholder tensor that replaces the
/// weight (252 B with its 4 data bytes, counted apart), less the detached view it replaces:
/// 244 B per projection after `Transformer::frozen`, of which 4 are the placeholder's data. Not
/// modelled: the runner's list of the projections' names (≈ 120 B per projection) that lives
/// while it removes their variables, at init's peak.
pub const QUANT_META_PER_PROJ: u64 = 240;

/// Bookkeeping per FP8 projection (CPU), measured: its e4m3 and scale tensors behind their `Arc`
/// and the placeholder, less the detached view they replace (368 B more than a GGML
/// projection's [`QUANT_META_PER_PROJ`]; the same residual as q8_0's at init).
pub const FP8_META_PER_PROJ: u64 = 608;

/// Bookkeeping per loaded tensor (its name in the map, the tensor, the parsed header entry).
pub const LOAD_META_PER_TENSOR: u64 = 300;

/// Bookkeeping per live tensor in the replay (`Arc<Tensor_>`, shape and stride vectors, op
/// node): fitted on the replay's residuals, which stay under 8 KiB over the tested configs.
pub const META_PER_TENSOR: u64 = 240;
