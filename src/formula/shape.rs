//! The shape of a case as the formulas see it: sizes in u64 and every variant that changes
//! memory. The formulas themselves are in [`super::transformer`] (closed forms) and
//! [`super::replay`] (candle replayed on shapes).

use crate::device::{ElemType, ServingWeights};
use crate::model::config::{Blocks, Config, LayerLayout, layer_layout};
use crate::model::kernels::Kernels;
use crate::model::llama::Llama;
use crate::model::transformer::{LoraBase, LoraTarget, ProjSpec, block_projections};
use crate::model::vit::Vision;
use crate::workload::Case;

/// Elements per block of the 8-bit optimizer by default.
pub const BLOCK_8BIT: u64 = 2048;

/// The bit set of LoRA targets.
pub fn lora_bits(targets: &[LoraTarget]) -> u16 {
    targets.iter().fold(0, |m, t| {
        m | 1
            << LoraTarget::ALL
                .iter()
                .position(|x| x == t)
                .expect("a target")
    })
}

/// The shape of a case, in u64 for the arithmetic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub b: u64,
    pub s: u64,
    pub h: u64,
    pub a: u64,
    pub l: u64,
    pub v: u64,
    pub s_max: u64,
    /// Element type of weights, activations, gradients and optimizer state.
    pub elem: ElemType,
    /// Blocks per gradient-checkpoint segment (0 = off).
    pub checkpoint: u64,
    /// Without checkpointing, the backward block by block (`phase::by_block`).
    pub by_block: bool,
    /// Efficient attention (no `(S, S)` scores).
    pub efficient: bool,
    /// The tiled attention composition (`model::tiled_attention`).
    pub tiled: bool,
    /// Mixed precision: f32 parameters, gradients and optimizer state; `elem` activations.
    pub mixed: bool,
    /// LoRA rank (0 = off) and the adapted projections.
    pub lora_rank: u64,
    /// One bit per [`LoraTarget`] (its index in `LoraTarget::ALL`).
    pub lora_targets: u16,
    /// How LoRA's projections are frozen.
    pub lora_base: LoraBase,
    /// Elements per quantization block of `adamw-8bit`.
    pub block: u64,
    /// Tokens the decode phase generates, and whether it keeps a key/value cache.
    pub decode_tokens: u64,
    pub kv_cache: bool,
    /// Weights the inference phases serve with.
    pub serve: ServingWeights,
    /// The load phase memory-maps the file.
    pub load_mmap: bool,
    /// The CPU backend (host metadata is counted, gemm packs) or CUDA (the pool sees tensor
    /// data only).
    pub cpu: bool,
    /// A ViT (images cut into patches; `s` = patches + 1, `v` = classes), or the decoder.
    pub vision: Option<Vision>,
    /// A LLaMA-family decoder ([`crate::model::llama`]), or GPT/ViT.
    pub llama: Option<Llama>,
    /// The LM head is the token embedding.
    pub tied: bool,
    /// Fused kernels or candle's composed ops.
    pub kernels: Kernels,
    /// A mixture of experts: tokens per expert per layer as a run drew them (a row's
    /// `moe_routing`); `None`: balanced (`k·T/E` each).
    pub routing: Option<std::sync::Arc<Vec<Vec<usize>>>>,
    /// A mixture of experts without a recorded routing: the worst case (every token of every
    /// forward on the same `k` experts) instead of balanced.
    pub worst_routing: bool,
    /// A tensor-parallel rank (its shard's widths): the blocks run Megatron's `f` (a copy whose
    /// backward all-reduces the gradient into a fresh tensor; the identity without a graph)
    /// and `g` (each sublayer's partial output summed into a fresh tensor before the residual
    /// sum), as `ranks --tp` trains and serves (`--phases prefill,decode`) and vLLM serves.
    pub tp_collectives: bool,
    /// The ranks of a tensor-parallel rank whose token table and head hold its run of the
    /// vocabulary (`v` is the run's length): Megatron's vocab-parallel embedding (the masked
    /// lookup, then `g`), `f` before the head and the vocab-parallel loss, as `ranks --tp`
    /// trains, and the last positions' logits gathered, as it serves (vLLM's
    /// `ParallelLMHead`; [`crate::model::transformer::VocabParallel`]).
    /// `1`: the vocabulary whole.
    pub vocab_parallel: usize,
    /// A tensor-parallel rank under Megatron's sequence parallelism over its
    /// [`Shape::vocab_parallel`] ranks (`ranks --tp N --sp`): the residual stream, the norms and
    /// the embedding's output hold a `1/N` run of the sequence, `f` an all-gather along it and
    /// `g` a reduce-scatter.
    pub sequence_parallel: bool,
}

impl Shape {
    pub fn of(case: &Case) -> Self {
        Self {
            b: case.batch as u64,
            s: case.seq as u64,
            h: case.cfg.hidden as u64,
            a: case.cfg.heads as u64,
            l: case.cfg.layers as u64,
            v: case.cfg.vocab as u64,
            s_max: case.cfg.max_seq as u64,
            elem: case.dtype,
            checkpoint: case.checkpoint as u64,
            by_block: case.backward == crate::step::Backward::ByBlock,
            efficient: case.cfg.efficient_attention,
            tiled: case.cfg.tiled_attention,
            mixed: case.precision == crate::device::Precision::Mixed,
            lora_rank: case.cfg.lora_rank as u64,
            lora_targets: lora_bits(&case.cfg.lora_targets),
            lora_base: case.cfg.lora_base,
            block: case.optimizer_block as u64,
            decode_tokens: case.decode_tokens as u64,
            kv_cache: case.kv_cache,
            serve: case.weights,
            load_mmap: case.load_mmap,
            cpu: !case.device.is_cuda(),
            vision: case.cfg.vision,
            llama: case.cfg.llama,
            tied: case.cfg.tied,
            kernels: case.cfg.kernels,
            routing: None,
            worst_routing: false,
            tp_collectives: false,
            vocab_parallel: 1,
            sequence_parallel: false,
        }
    }

    /// An f32 CPU shape.
    pub fn new(b: u64, s: u64, h: u64, a: u64, l: u64, v: u64, s_max: u64) -> Self {
        Self {
            b,
            s,
            h,
            a,
            l,
            v,
            s_max,
            elem: ElemType::F32,
            checkpoint: 0,
            by_block: false,
            efficient: false,
            tiled: false,
            mixed: false,
            lora_rank: 0,
            lora_targets: 0,
            lora_base: LoraBase::Op,
            block: BLOCK_8BIT,
            decode_tokens: 0,
            kv_cache: true,
            serve: ServingWeights::Model,
            load_mmap: false,
            cpu: true,
            vision: None,
            llama: None,
            tied: false,
            kernels: Kernels::Composed,
            routing: None,
            worst_routing: false,
            tp_collectives: false,
            vocab_parallel: 1,
            sequence_parallel: false,
        }
    }

    /// The projections of one block (`model::transformer::block_projections`), in u64.
    pub fn projections(&self) -> Vec<ProjSpec> {
        block_projections(self.h as usize, self.a as usize, self.llama.as_ref())
    }

    /// Every block's tensors (`model::config::Blocks`).
    pub fn blocks(&self) -> std::rc::Rc<Blocks> {
        Blocks::of(
            self.h as usize,
            self.a as usize,
            self.llama.as_ref(),
            self.l as usize,
        )
    }

    /// Layer `layer`'s layout (`model::config::layer_layout`).
    pub fn layer_layout(&self, layer: u64) -> LayerLayout {
        layer_layout(
            self.h as usize,
            self.a as usize,
            self.llama.as_ref(),
            layer as usize,
        )
    }

    /// The model's `Config` of this shape (the values that change no allocation, the norms'
    /// epsilon and the rotary base, at their defaults): what the replay builds.
    pub fn config(&self) -> Config {
        Config {
            efficient_attention: self.efficient,
            tiled_attention: self.tiled,
            lora_rank: self.lora_rank as usize,
            lora_targets: LoraTarget::ALL
                .iter()
                .copied()
                .filter(|t| self.lora_targets & lora_bits(&[*t]) != 0)
                .collect(),
            lora_base: self.lora_base,
            vision: self.vision,
            llama: self.llama,
            tied: self.tied,
            kernels: self.kernels,
            ..Config::new(
                self.v as usize,
                self.h as usize,
                self.a as usize,
                self.l as usize,
                self.s_max as usize,
            )
        }
    }

    /// K/V heads and head width (`A` and `H/A` outside LLaMA).
    pub fn kv_dims(&self) -> (u64, u64) {
        match self.llama {
            None => (self.a, self.h / self.a),
            Some(l) => (l.kv_heads as u64, l.head_dim as u64),
        }
    }
}
