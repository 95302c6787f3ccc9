//! Floating-point operations per phase of the transformers of [`crate::model::transformer`]
//! (the GPT decoder, the ViT encoder and the dense LLaMA family: grouped-query attention and a
//! SwiGLU MLP, the block's products `2·n·L·(2·H·A·D + 2·H·G·D + 3·H·I)`, the attention's over
//! the query heads' width `A·D`; mixtures of experts, latent attention and sliding windows are
//! not counted and say so): the matrix
//! products only (`2·m·n·k` for an `(m, k) × (k, n)` product), which are all but a few percent
//! of the work at any useful size; LayerNorm, GELU, softmax, the embedding lookups and the
//! optimizer's element-wise update are not counted.
//!
//! Notation: B batch, S sequence, H hidden, A heads (D = H/A), L layers, V vocabulary, T decode
//! tokens. Derivation, following the model's code:
//!
//! - A block's projections on `n` token rows: q, k, v, o are `(n, H) × (H, H)`: `4 · 2nH²`;
//!   the MLP's fc1 `(n, H) × (H, 4H)` and fc2 `(n, 4H) × (4H, H)`: `2 · 8nH²`. Together
//!   `24·n·H²` per block.
//! - Standard attention (candle-nn's composition, scores materialised, the causal mask *added*
//!   so every score is computed): per batch row and head `q·kᵀ` is `(S, D) × (D, S)` and
//!   `p·v` is `(S, S) × (S, D)`: `2 · 2S²D`; over B·A: `4·B·S²·H` per block.
//!   memfit's efficient attention visits only keys `0..=i` for query `i`:
//!   `Σᵢ 4(i+1)D = 2S(S+1)D` per row and head, `2·B·S·(S+1)·H` per block.
//! - The LM head on `n` rows: `(n, H) × (H, V)`: `2·n·H·V`.
//!
//! So the training forward (and `inference`, the same forward without a graph) is
//! `F = L·(24·B·S·H² + attention) + 2·B·S·H·V`. With `P_mm = 12·L·H² + V·H` the parameters that
//! enter a product (neither the embeddings nor biases nor norms), `F = 2·(B·S)·P_mm + L·attention`.
//! Each product `Y = X·W` costs twice as much backward (`dX = dY·Wᵀ` and `dW = Xᵀ·dY`; candle
//! computes both for the attention products too, whose operands are both activations), so the
//! backward is `2F`; gradient checkpointing runs the blocks' forward once more inside the
//! backward (`F − head`). The training step is forward + backward: `3F` (+ the recomputation),
//! i.e. the familiar `≈ 6·P·tokens` plus the attention term `3·L·4·B·S²·H`.
//!
//! Generation (`forward_cached`, standard attention whatever the case's attention): the prefill
//! runs the blocks on all `B·S` prompt tokens and the head on the last position only:
//! `24·B·S·H²·L + 4·B·S²·H·L + 2·B·H·V`. Decoding token `t` (0-based) with the cache attends to
//! `S + t + 1` keys: `24·B·H²·L + 4·B·(S+t+1)·H·L + 2·B·H·V`; summed over T tokens
//! `T·(24·B·H²·L + 2·B·H·V) + 4·B·H·L·(T·S + T(T+1)/2)`. Without the cache every token runs the
//! whole prefix of `n = S+t+1` tokens: `Σₙ (24·B·n·H²·L + 4·B·n²·H·L + 2·B·H·V)`.
//!
//! ViT (`N = S − 1` patches of `C·p²` values, `K` classes in `V`): the patch projection
//! `(B·N, C·p²) × (C·p², H)` adds `2·B·N·C·p²·H`; the head sees the class token only,
//! `2·B·H·K`; the attention has no mask and memfit's efficient op visits every key
//! (`4·B·S²·H` per block either way). Checkpointing's backward recomputes the stem too (its
//! embedding is a product), so it adds the blocks' forward and the patch projection.
//!
//! Not modelled (the functions return why): LoRA (the adapters' products and the frozen op's
//! missing weight gradients), efficient attention's backward (it recomputes scores row by row),
//! and the phases without products (init, optimizer, load).

use crate::record::Row;
use crate::step::Phase;

/// The sizes and variants the FLOP count depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlopCase {
    pub b: u64,
    pub s: u64,
    pub h: u64,
    pub l: u64,
    pub v: u64,
    pub checkpoint: u64,
    pub efficient: bool,
    pub lora: bool,
    pub decode_tokens: u64,
    pub kv_cache: bool,
    /// ViT: values per patch `C·p²` (0 for the decoder).
    pub patch_dim: u64,
    /// The query heads' width `A·D` (`H` for GPT and ViT).
    pub q_dim: u64,
    /// The key and value heads' width `G·D` (LLaMA's grouped-query attention; `H` for GPT).
    pub kv_dim: u64,
    /// The MLP's width `I` (`4H` for GPT and ViT).
    pub mlp: u64,
    /// The MLP is gated (LLaMA's SwiGLU: gate, up and down, three products; GPT's fc1, fc2 two).
    pub gated: bool,
    /// Why the case's products are not counted (mixture of experts, latent attention, sliding
    /// windows, rows without the width columns); `None` when they are.
    pub unmodelled: Option<&'static str>,
}

impl FlopCase {
    /// The case a stored row was measured on.
    pub fn of_row(r: &Row) -> Self {
        let h = r.hidden;
        let llama = r.model == "llama";
        let q_dim = if r.head_dim > 0 {
            r.heads * r.head_dim
        } else {
            h
        };
        let kv_dim = if r.head_dim > 0 && r.kv_heads > 0 {
            r.kv_heads * r.head_dim
        } else {
            q_dim
        };
        // A LLaMA row's cache holds `2·L·G·D·e` bytes a token unless its attention is latent
        // (MLA's `L·(kv_lora_rank + qk_rope_head_dim)·e`), for e of 2 or 4 bytes.
        let latent = r
            .kv_bytes_per_token
            .is_some_and(|k| ![2, 4].iter().any(|e| k == 2 * r.layers * kv_dim * e));
        let unmodelled = if !r.moe_routing.is_empty() {
            Some("a mixture of experts: the products per routed expert are not modelled")
        } else if r.sliding_window.is_some() {
            Some("sliding-window attention's products are not modelled")
        } else if llama && (r.head_dim == 0 || r.intermediate == 0) {
            Some("the row predates the head_dim and intermediate columns")
        } else if llama && latent {
            Some("multi-head latent attention's products are not modelled")
        } else {
            None
        };
        Self {
            q_dim,
            kv_dim,
            mlp: if r.intermediate > 0 {
                r.intermediate
            } else {
                4 * h
            },
            gated: llama,
            unmodelled,
            b: r.batch,
            s: r.seq,
            h: r.hidden,
            l: r.layers,
            v: r.vocab,
            checkpoint: r.checkpoint,
            efficient: r.attention == "efficient",
            lora: r.lora_rank > 0,
            decode_tokens: r.decode_tokens,
            kv_cache: r.kv_cache != "off",
            patch_dim: r.channels * r.patch_px * r.patch_px,
        }
    }

    fn vit(&self) -> bool {
        self.patch_dim > 0
    }

    /// The ViT's patch projection `2·B·N·C·p²·H` (0 for the decoder's embedding lookup).
    fn stem(&self) -> u64 {
        if self.vit() {
            2 * self.b * (self.s - 1) * self.patch_dim * self.h
        } else {
            0
        }
    }

    /// The projections of every block on `n` token rows: `2·n·L·(2·H·A·D + 2·H·G·D + m·H·I)`
    /// with `m` 3 for a gated MLP and 2 otherwise (`24·n·H²·L` for GPT).
    fn projections(&self, n: u64) -> u64 {
        let (h, mlp) = (self.h, if self.gated { 3 } else { 2 } * self.mlp);
        2 * n * self.l * h * (2 * self.q_dim + 2 * self.kv_dim + mlp)
    }

    /// The attention products of every block over B sequences of `s` queries and keys (the
    /// query heads' width `A·D`: each query head's scores and weighted values, whatever head
    /// of keys it reads).
    fn attention(&self, s: u64, efficient: bool) -> u64 {
        if efficient && !self.vit() {
            2 * self.b * s * (s + 1) * self.q_dim * self.l
        } else {
            4 * self.b * s * s * self.q_dim * self.l
        }
    }

    /// `2·n·H·V`: the LM head on `n` rows.
    fn head(&self, n: u64) -> u64 {
        2 * n * self.h * self.v
    }

    /// The blocks' forward over the batch.
    pub fn blocks_forward(&self) -> u64 {
        self.projections(self.b * self.s) + self.attention(self.s, self.efficient)
    }

    /// `F`: the training (or inference) forward to the logits of every position (a ViT's:
    /// of the class token).
    pub fn forward(&self) -> u64 {
        let rows = if self.vit() { self.b } else { self.b * self.s };
        self.stem() + self.blocks_forward() + self.head(rows)
    }

    /// The FLOPs of `phase`, or why they are not counted.
    pub fn phase(&self, phase: Phase) -> Result<u64, &'static str> {
        if let Some(why) = self.unmodelled
            && !matches!(phase, Phase::Init | Phase::Optimizer | Phase::Load)
        {
            return Err(why);
        }
        let training = |f: &dyn Fn() -> u64| {
            if self.lora {
                Err("LoRA's adapter products are not modelled")
            } else {
                Ok(f())
            }
        };
        match phase {
            Phase::Forward => training(&|| self.forward()),
            Phase::Backward | Phase::TrainStep if self.efficient => {
                Err("efficient attention's backward (scores recomputed per row) is not modelled")
            }
            Phase::Backward => training(&|| self.backward()),
            Phase::TrainStep => training(&|| self.forward() + self.backward()),
            Phase::Inference if self.lora => Err("LoRA's adapter products are not modelled"),
            Phase::Inference => Ok(self.forward()),
            Phase::Prefill if self.lora => Err("LoRA's adapter products are not modelled"),
            Phase::Prefill => Ok(self.prefill()),
            Phase::Decode if self.lora => Err("LoRA's adapter products are not modelled"),
            Phase::Decode => Ok(self.decode()),
            Phase::Init | Phase::Optimizer | Phase::Load => {
                Err("no matrix products (element-wise work only)")
            }
            Phase::Dataload => Err("not a model phase"),
        }
    }

    /// `2F`, plus the blocks' forward again under checkpointing.
    fn backward(&self) -> u64 {
        2 * self.forward()
            + if self.checkpoint > 0 {
                self.blocks_forward() + self.stem()
            } else {
                0
            }
    }

    fn prefill(&self) -> u64 {
        self.projections(self.b * self.s) + self.attention(self.s, false) + self.head(self.b)
    }

    fn decode(&self) -> u64 {
        let (b, s, q, l, t) = (self.b, self.s, self.q_dim, self.l, self.decode_tokens);
        if self.kv_cache {
            t * (self.projections(b) + self.head(b)) + 4 * b * q * l * (t * s + t * (t + 1) / 2)
        } else {
            (s + 1..=s + t)
                .map(|n| self.projections(b * n) + self.attention(n, false) + self.head(b))
                .sum()
        }
    }
}

/// Achieved FLOP/s of a row: its phase's FLOPs over its wall time.
pub fn achieved(r: &Row) -> Result<f64, &'static str> {
    let flops = FlopCase::of_row(r).phase(r.phase)?;
    match r.wall_s {
        Some(w) if w > 0.0 => Ok(flops as f64 / w),
        _ => Err("no wall time"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> FlopCase {
        FlopCase {
            b: 2,
            s: 4,
            h: 8,
            l: 1,
            v: 10,
            checkpoint: 0,
            efficient: false,
            lora: false,
            decode_tokens: 2,
            kv_cache: true,
            patch_dim: 0,
            q_dim: 8,
            kv_dim: 8,
            mlp: 32,
            gated: false,
            unmodelled: None,
        }
    }

    /// A LLaMA block by hand: B 2, S 4, H 8, A 2 of D 4 (A·D 8), G 1 (G·D 4), SwiGLU I 12,
    /// L 1, V 10. q `(8, 8) × (8, 8)` and o: 2 · 2·8·8·8 = 2048; k, v `(8, 8) × (8, 4)`:
    /// 2 · 2·8·8·4 = 1024; gate, up `(8, 8) × (8, 12)` and down: 3 · 2·8·8·12 = 4608; scores
    /// and p·v per batch row and query head (4): 2 · 4 · 2·4·4·4 = 1024; head 1280. Forward
    /// 9984. A mixture of experts, latent attention or a window: not counted, and said why.
    #[test]
    fn llama_by_hand() {
        let c = FlopCase {
            kv_dim: 4,
            mlp: 12,
            gated: true,
            ..tiny()
        };
        assert_eq!(
            c.phase(Phase::Forward),
            Ok(2048 + 1024 + 4608 + 1024 + 1280)
        );
        let mut r = Row::example();
        (r.model, r.phase) = ("llama".into(), Phase::Forward);
        (r.batch, r.seq, r.hidden, r.heads, r.kv_heads, r.head_dim) = (2, 4, 8, 2, 1, 4);
        (r.layers, r.vocab, r.intermediate) = (1, 10, 12);
        (r.attention, r.kv_bytes_per_token) = ("standard".into(), Some(2 * 4 * 4));
        assert_eq!(
            FlopCase::of_row(&r).phase(Phase::Forward),
            c.phase(Phase::Forward)
        );
        let mut moe = r.clone();
        moe.moe_routing = "3,5".into();
        assert!(FlopCase::of_row(&moe).phase(Phase::Forward).is_err());
        let mut mla = r.clone();
        mla.kv_bytes_per_token = Some(4 * 20);
        assert!(FlopCase::of_row(&mla).phase(Phase::Forward).is_err());
        let mut window = r;
        window.sliding_window = Some(2);
        assert!(FlopCase::of_row(&window).phase(Phase::Forward).is_err());
    }

    /// A ViT worked by hand: B 2, 4 patches of C·p² = 12 values (S 5), H 8, L 1, K 3 classes.
    /// Patch projection `(8, 12) × (12, 8)`: 2·8·12·8 = 1536; q, k, v, o on 10 rows:
    /// 4 · 2·10·8·8 = 5120; fc1 and fc2: 2 · 2·10·8·32 = 10,240; scores and p·v, no mask,
    /// per batch row and head (2 heads: 4 of them) 2 · 2·5·5·4 = 400 → 1600; classifier on the
    /// 2 class tokens `(2, 8) × (8, 3)`: 96. Forward 18,592 (the efficient op the same: every
    /// key); backward 37,184; with a checkpoint per block the backward recomputes the stem and
    /// the block, 1536 + 16,960.
    #[test]
    fn vit_by_hand() {
        let v = FlopCase {
            b: 2,
            s: 5,
            h: 8,
            l: 1,
            v: 3,
            patch_dim: 12,
            ..tiny()
        };
        assert_eq!(v.phase(Phase::Forward), Ok(18_592));
        assert_eq!(v.phase(Phase::Backward), Ok(37_184));
        let eff = FlopCase {
            efficient: true,
            ..v
        };
        assert_eq!(eff.phase(Phase::Forward), Ok(18_592));
        let ck = FlopCase { checkpoint: 1, ..v };
        assert_eq!(ck.phase(Phase::Backward), Ok(37_184 + 1536 + 16_960));
    }

    /// Worked by hand for B 2, S 4, H 8, A 2 (D 4), L 1, V 10, product by product:
    /// q, k, v, o `(8, 8) × (8, 8)`: 4 · 2·8·8·8 = 4096; fc1 `(8, 8) × (8, 32)` and fc2
    /// `(8, 32) × (32, 8)`: 2 · 2·8·32·8 = 8192; scores `(4, 4) × (4, 4)` and p·v per batch row
    /// and head (4 of them): 2 · 4 · 2·4·4·4 = 1024; head `(8, 8) × (8, 10)`: 2·8·10·8 = 1280.
    /// Forward 4096 + 8192 + 1024 + 1280 = 14,592; backward 29,184; train step 43,776, which is
    /// 6·P_mm·tokens (P_mm = 12·64 + 80 = 848, 8 tokens: 40,704) + 3·1024.
    #[test]
    fn training_phases_by_hand() {
        let c = tiny();
        assert_eq!(c.phase(Phase::Forward), Ok(14_592));
        assert_eq!(c.phase(Phase::Inference), Ok(14_592));
        assert_eq!(c.phase(Phase::Backward), Ok(29_184));
        assert_eq!(c.phase(Phase::TrainStep), Ok(43_776));
        assert_eq!(6 * 848 * 8 + 3 * 1024, 43_776);
        // Checkpointing recomputes the block (everything but the head: 13,312) once more.
        let ck = FlopCase {
            checkpoint: 1,
            ..tiny()
        };
        assert_eq!(ck.phase(Phase::Backward), Ok(29_184 + 13_312));
        assert!(c.phase(Phase::Optimizer).is_err() && c.phase(Phase::Init).is_err());
        let lora = FlopCase { lora: true, ..c };
        assert!(lora.phase(Phase::TrainStep).is_err());
    }

    /// Efficient attention computes only the causal half: per row and head Σᵢ 4(i+1)·D =
    /// 4·(1+2+3+4)·4 = 160, times 4 rows·heads = 640 instead of 1024.
    #[test]
    fn efficient_attention_counts_the_causal_half() {
        let c = FlopCase {
            efficient: true,
            ..tiny()
        };
        assert_eq!(c.phase(Phase::Forward), Ok(14_592 - 1024 + 640));
        assert!(c.phase(Phase::Backward).is_err());
    }

    /// Generation, by hand: prefill = projections on 8 rows (12,288) + attention (1024) + the
    /// head on the last position of 2 rows (2·2·8·10 = 320) = 13,632. Decoding 2 tokens with
    /// the cache: token 0 attends to 5 keys: 24·2·64 = 3072 + 4·2·5·8 = 320 + 320 = 3712;
    /// token 1 to 6 keys: 3072 + 384 + 320 = 3776; 7488 in all. Without the cache: prefixes of
    /// 5 and 6 tokens: 15,360 + 1600 + 320 = 17,280 and 18,432 + 2304 + 320 = 21,056; 38,336.
    #[test]
    fn generation_by_hand() {
        let c = tiny();
        assert_eq!(c.phase(Phase::Prefill), Ok(13_632));
        assert_eq!(c.phase(Phase::Decode), Ok(7488));
        let off = FlopCase {
            kv_cache: false,
            ..c
        };
        assert_eq!(off.phase(Phase::Decode), Ok(38_336));
    }

    /// Achieved FLOP/s is the phase's FLOPs over the row's wall time; phases without products
    /// and rows without a time say so instead of giving a number.
    #[test]
    fn achieved_from_a_row() {
        let mut r = Row::example();
        (r.seq, r.max_seq, r.hidden, r.layers) = (4, 4, 8, 1);
        r.phase = Phase::Forward;
        r.wall_s = Some(0.5);
        assert_eq!(achieved(&r), Ok(14_592.0 * 2.0));
        r.phase = Phase::Optimizer;
        assert!(achieved(&r).is_err());
        r.phase = Phase::Forward;
        r.wall_s = None;
        assert_eq!(achieved(&r), Err("no wall time"));
    }

    /// GPT-2 small's train step at B 1, S 128: 6·P_mm·tokens + attention, with
    /// P_mm = 12·12·768² + 50257·768 = 123,532,032 → 6·P_mm·128 = 94,872,600,576, attention
    /// 3·12·4·128²·768 = 1,811,939,328: 96.68 GFLOP.
    #[test]
    fn gpt2_small_train_step() {
        let c = FlopCase {
            b: 1,
            s: 128,
            h: 768,
            l: 12,
            v: 50257,
            q_dim: 768,
            kv_dim: 768,
            mlp: 3072,
            ..tiny()
        };
        assert_eq!(
            c.phase(Phase::TrainStep),
            Ok(94_872_600_576 + 1_811_939_328)
        );
    }
}
