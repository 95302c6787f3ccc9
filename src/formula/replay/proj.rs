//! The model's projections (`model::proj::Proj`) made of symbolic tensors: the weights as the
//! replay allocates them (variables, frozen, LoRA's adapters, the quantized bytes a frozen
//! base holds). The forward is the model's own.

use super::Params;
use crate::formula::symbolic::{DType, FrozenSym, FrozenW, Sym};
use crate::model::frozen::{dequantize_scratch, quantized_bytes};
use crate::model::proj::{Lora, Proj};
use crate::model::shapes::{FP8_BLOCK, MXFP4_BLOCK};
use crate::model::transformer::{LoraBase, ProjSpec};

/// The model's projection on symbolic tensors.
pub(super) type Linear = Proj<Sym>;

impl Params<'_> {
    /// candle-nn's `Linear` `inp → out` (weight `(out, in)`, optional bias), not fused: the
    /// patch projection, the head, the routers.
    pub(super) fn plain(&self, inp: usize, out: usize, bias: bool) -> Linear {
        Proj {
            weight: self.tensor(&[out, inp]),
            bias: bias.then(|| self.tensor(&[out])),
            lora: None,
            frozen: None,
            fused: false,
        }
    }

    /// A projection `spec`, with an adapter of rank `r` when `r > 0`: the adapter is a
    /// variable, the base weights are frozen (not variables) under LoRA.
    pub(super) fn proj_of(&self, spec: &ProjSpec, r: usize) -> Linear {
        let (inp, out) = (spec.inp, spec.out);
        if !self.lora {
            return Proj {
                fused: self.fused,
                ..self.plain(inp, out, spec.bias)
            };
        }
        // Under LoRA every projection is frozen as `lora_base` says; adapted ones (r > 0) also
        // carry an adapter.
        let lora = (r > 0).then(|| Lora {
            a: self.adapter(&[r, inp]),
            b: self.adapter(&[out, r]),
            scale: 1.0,
        });
        let frozen = |weight: &Sym, held, scales| FrozenSym {
            weight: weight.clone(),
            scales,
            held,
            out,
            inp,
        };
        let (weight, frozen) = match self.base {
            LoraBase::Detach => (self.frozen(&[out, inp]), None),
            LoraBase::Op => {
                let w = self.frozen(&[out, inp]);
                let f = frozen(&w, FrozenW::Dense, None);
                (w, Some(f))
            }
            LoraBase::Fp8 => {
                let (r, c) = FP8_BLOCK.scales(out, inp);
                let w = Sym::new(self.ledger, &[out * inp], DType::U8);
                let scales = Sym::new(self.ledger, &[r, c], DType::F32);
                let f = frozen(&w, FrozenW::Fp8, Some(scales));
                (w, Some(f))
            }
            // The values (two a byte), then a UE8M0 scale per 32; dequantized as FP8 is.
            LoraBase::Mxfp4 => {
                let w = Sym::new(self.ledger, &[out * inp / 2], DType::U8);
                let scales = Sym::new(self.ledger, &[out * inp / MXFP4_BLOCK], DType::U8);
                let f = frozen(&w, FrozenW::Fp8, Some(scales));
                (w, Some(f))
            }
            q => {
                let q = q.ggml().expect("the other bases are dense or FP8");
                let n = (out * inp) as u64;
                let scratch = if self.cpu {
                    dequantize_scratch(n, q) as usize
                } else {
                    0
                };
                let w = Sym::new(self.ledger, &[quantized_bytes(n, q) as usize], DType::U8);
                let f = frozen(&w, FrozenW::Ggml { scratch }, None);
                (w, Some(f))
            }
        };
        Proj {
            weight,
            bias: spec.bias.then(|| self.frozen(&[out])),
            lora,
            frozen,
            fused: self.fused,
        }
    }
}
