//! `init` on CUDA with 16-bit weights: candle 0.11.1 draws random numbers on CUDA in f32 only
//! (`Device::rand_normal_f64` / `rand_uniform_f64` draw an f32 tensor, then cast it), so each
//! randomly initialised variable of `n` elements briefly holds f32 beside what is already made:
//! - a normal draw (`Init::Randn`, Kaiming): `4·n'` bytes (`n'` = `n` rounded up to even:
//!   cuRAND's normal generator makes pairs, so an odd draw allocates `n + 1`), then the cast's
//!   `2·n` beside it: `4·n' + 2·n`;
//! - a uniform draw (`Init::Uniform`, a bias's ±1/√fan_in): cuRAND fills `[0, 1)` and, the bounds
//!   not being (0, 1), candle's `rand_uniform` runs an affine into a second f32 buffer while the
//!   first lives: `8·n` (the cast after it holds `4·n + 2·n`, less);
//! - constants (`Init::Const` 0 or 1: LayerNorm, LoRA's B) are made in the 16-bit type directly.
//!
//! The window's peak is therefore `max_i (Σ_{j<i} 2·n_j + t_i)` with `t_i` the variable's
//! transient above (`4·n'_i + 2·n_i`, `8·n_i`, `2·n_i`), over the variables in the
//! order the model creates them (`Transformer::new`): the stem (GPT: `wte` normal; ViT: the
//! patch projection's weight normal and bias uniform, then `cls` normal), `wpe` normal, per
//! block `ln1` (constants), `q, k, v, o` (each: LoRA A normal and B constant when adapted,
//! then the weight normal (Kaiming) and the bias uniform), `ln2`, `fc1`, `fc2`, then `ln_f`
//! and the head (GPT: weight normal, no bias; ViT: weight normal, bias uniform). For GPT-2
//! small in bf16 that is 248.9 MB of weights plus the head's 154.4 MB f32 draw. A LLaMA has no
//! position table and RMSNorm weights only, its rotary tables (made first, held throughout),
//! its block's projections (`Shape::projections`), and no head variable when tied.
//!
//! Not modelled, as they change no peak: an op on a strided (non-contiguous) layout uploads its
//! dims and strides (a few dozen bytes) through the pool, and the draws of cuRAND's generator
//! state live outside the pool (made when the device opens).

use super::shape::Shape;
use crate::model::transformer::BlockTensor;

/// How a variable is initialised.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Draw {
    Normal,
    Uniform,
    Const,
}

impl Shape {
    /// The model's variables in creation order: elements and how each is drawn.
    fn creation_order(&self) -> Vec<(u64, Draw)> {
        let Shape { h, v, s_max, .. } = *self;
        let r = self.lora_rank;
        let llama = self.llama.is_some();
        let mut vars = Vec::new();
        match self.vision {
            None => vars.push((v * h, Draw::Normal)),
            Some(vis) => {
                vars.push((h * vis.patch_dim() as u64, Draw::Normal));
                vars.push((h, Draw::Uniform));
                vars.push((h, Draw::Normal));
            }
        }
        if !llama {
            vars.push((s_max * h, Draw::Normal));
        }
        // LayerNorm: weight and bias; RMSNorm: weight only (constants either way).
        let norm = |vars: &mut Vec<(u64, Draw)>| {
            vars.push((h, Draw::Const));
            if !llama {
                vars.push((h, Draw::Const));
            }
        };
        for t in self.blocks().tensors() {
            match t {
                BlockTensor::Norm { size, .. } => {
                    vars.push((*size as u64, Draw::Const));
                    if !llama {
                        vars.push((*size as u64, Draw::Const));
                    }
                }
                BlockTensor::Linear { inp, out, bias, .. } => {
                    vars.push(((inp * out) as u64, Draw::Normal));
                    if *bias {
                        vars.push((*out as u64, Draw::Uniform));
                    }
                }
                BlockTensor::Vector { size, .. } => vars.push((*size as u64, Draw::Const)),
                BlockTensor::Proj { spec: p, .. } => {
                    let (inp, out) = (p.inp as u64, p.out as u64);
                    if self.has_lora(p.target) {
                        vars.push((r * inp, Draw::Normal));
                        vars.push((out * r, Draw::Const));
                    }
                    vars.push((out * inp, Draw::Normal));
                    if p.bias {
                        vars.push((out, Draw::Uniform));
                    }
                }
            }
        }
        norm(&mut vars);
        if !self.tied {
            vars.push((v * h, Draw::Normal));
        }
        if self.vision.is_some() {
            vars.push((v, Draw::Uniform));
        }
        vars
    }

    /// Peak of `init` for 16-bit weights on CUDA: the held 16-bit variables plus the f32 draw
    /// of the one being made (see the module doc).
    pub fn cuda_half_init_peak(&self) -> u64 {
        let e = self.elem.size();
        // What the weights hold beyond the variables (a LLaMA's rotary tables, made first;
        // their own making is not modelled).
        let mut held = self.weights_bytes().saturating_sub(e * self.params());
        let mut peak = 0u64;
        for (n, draw) in self.creation_order() {
            let transient = match draw {
                Draw::Normal => 4 * n.next_multiple_of(2) + e * n,
                // The draw and the affine's output, both f32 (the cast comes after, smaller).
                Draw::Uniform => (8 * n).max(4 * n + e * n),
                Draw::Const => e * n,
            };
            peak = peak.max(held + transient);
            held += e * n;
        }
        peak
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::ElemType;

    fn bf16_cuda(mut s: Shape) -> Shape {
        s.elem = ElemType::Bf16;
        s.cpu = false;
        s
    }

    #[test]
    fn the_creation_order_holds_every_parameter() {
        let mut shapes = vec![
            Shape::new(1, 128, 768, 12, 12, 50257, 1024),
            Shape::new(2, 7, 24, 3, 2, 31, 9),
        ];
        for name in ["llama-tiny", "smollm2-135m", "llama-3.2-1b"] {
            let cfg = crate::model::transformer::Config::preset(name).expect("a llama preset");
            let mut s = Shape::new(
                1,
                8,
                cfg.hidden as u64,
                cfg.heads as u64,
                cfg.layers as u64,
                cfg.vocab as u64,
                cfg.max_seq as u64,
            );
            s.llama = cfg.llama;
            s.tied = cfg.tied;
            shapes.push(s);
        }
        for s in shapes {
            let total: u64 = s.creation_order().iter().map(|v| v.0).sum();
            assert_eq!(total, s.params());
        }
    }

    #[test]
    fn gpt2_small_bf16_peaks_at_the_head_draw() {
        let s = bf16_cuda(Shape::new(1, 128, 768, 12, 12, 50257, 1024));
        // The head (50257 × 768, created last) drawn in f32 on top of every 16-bit weight.
        let head = 50257 * 768;
        assert_eq!(s.cuda_half_init_peak(), 2 * s.params() + 4 * head);
        assert_eq!(4 * head, 154_389_504);
    }

    /// A uniform draw (a bias) holds its f32 draw and the affine's f32 output at once: 8 B per
    /// element, above a normal draw's 4 + 2. With one channel of width 1 the head's bias (as
    /// many elements as its weight, made last) is the peak.
    #[test]
    fn a_uniform_draw_holds_two_f32_buffers() {
        let mut s = bf16_cuda(Shape::new(1, 5, 1, 1, 1, 1000, 5));
        s.vision = Some(crate::model::vit::Vision {
            image: 8,
            patch: 4,
            channels: 3,
        });
        let v = 1000;
        assert_eq!(s.cuda_half_init_peak(), 2 * (s.params() - v) + 8 * v);
        assert_eq!(s.creation_order().last(), Some(&(v, Draw::Uniform)));
    }

    #[test]
    fn an_early_large_draw_can_top_the_end() {
        // A ViT with 32-px patches and tiny blocks: the patch projection (H × 3·32², made
        // first) drawn in f32 is the peak, far above the 16-bit weights at the end.
        let mut s = bf16_cuda(Shape::new(1, 5, 8, 2, 1, 3, 5));
        s.vision = Some(crate::model::vit::Vision {
            image: 64,
            patch: 32,
            channels: 3,
        });
        let patch = 8 * 3 * 32 * 32;
        assert_eq!(s.cuda_half_init_peak(), 2 * patch + 4 * patch);
        assert!(s.cuda_half_init_peak() > 2 * s.params() + 4 * 3 * 8);
        let total: u64 = s.creation_order().iter().map(|v| v.0).sum();
        assert_eq!(total, s.params());
    }

    /// QLoRA's init on CUDA (q4_0, GPT H 256, L 2: per layer four 256² projections of 36,864 B
    /// and two 256×1024 of 147,456 B): each block buffer padded by 512/32·18 = 288 B, the last
    /// projection's zeroed and written buffers both live at the peak; in bf16 the build's own
    /// peak (each tensor drawn in f32) when that is higher.
    #[test]
    fn qlora_init_on_cuda_pads_each_block_buffer_and_holds_two_at_once() {
        use crate::model::transformer::LoraBase;
        use crate::step::{OptimizerKind, Phase};
        let mut cpu = Shape::new(1, 8, 256, 4, 2, 300, 64);
        cpu.lora_rank = 8;
        cpu.lora_targets = u16::MAX;
        cpu.lora_base = LoraBase::Q4_0;
        let mut cuda = cpu.clone();
        cuda.cpu = false;
        let init = |s: &Shape| s.predict(Phase::Init, OptimizerKind::Adamw, 1);
        let (c, g) = (init(&cpu), init(&cuda));
        // The weights as built (the CPU's count host metadata too), and the projections' f32.
        let (wc, wg) = (cpu.weights_bytes(), cuda.weights_bytes());
        let proj = 4 * 2 * (4 * 65_536 + 2 * 262_144);
        let q = 2 * (4 * 36_864 + 2 * 147_456);
        // Kept: the blocks and twelve 4-byte placeholders (f32), on the CPU with their
        // bookkeeping, on CUDA each block buffer padded; the CPU frees the twelve variables'
        // bookkeeping with their weights.
        let meta = 12 * super::super::transformer::QUANT_META_PER_PROJ;
        let var_meta = 12 * super::super::transformer::INIT_META_PER_VAR;
        let (kept_c, kept_g) = (q + 12 * 4 + meta, q + 12 * 288 + 12 * 4);
        assert_eq!(c.peak_bytes, wc + kept_c);
        assert_eq!(c.retained_bytes, (wc - proj - var_meta + kept_c) as i64);
        assert_eq!(g.retained_bytes, (wg - proj + kept_g) as i64);
        // The last (fc2) zeroed and written buffers both live, its placeholder not yet made.
        assert_eq!(g.peak_bytes, wg + kept_g - 4 + 147_456 + 288);
        let bf = bf16_cuda(cuda.clone());
        assert!(init(&bf).peak_bytes >= bf.cuda_half_init_peak());
        assert!(init(&bf).peak_bytes > bf.weights_bytes() + q);
        assert!(init(&bf).peak_bytes < init(&cuda).peak_bytes);
    }
}
