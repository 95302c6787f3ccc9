//! Mirror of `model::proj`: candle-nn's `Linear`, the fused linear, the frozen-linear op and
//! LoRA adapters, on symbolic tensors.

use super::Params;
use crate::formula::symbolic::{DType, FrozenW, Sym, frozen_dense};
use crate::model::frozen::{dequantize_scratch, quantized_bytes};
use crate::model::shapes::{FP8_BLOCK, MXFP4_BLOCK};
use crate::model::transformer::{LoraBase, ProjSpec};

/// Mirror of `proj::rows`: `x (…, in)` as `(N, in)`.
fn rows(x: &Sym) -> Sym {
    let inp = *x
        .dims()
        .last()
        .expect("a projection's input has a last dimension");
    let n: usize = x.dims().iter().product();
    x.reshape(&[n / inp, inp])
}

/// Mirror of `proj::out_dims`.
fn out_dims(x: &Sym, out: usize) -> Vec<usize> {
    let mut d = x.dims().to_vec();
    *d.last_mut().expect("a last dimension") = out;
    d
}

/// candle-nn's `Linear` (weight `(out, in)`, optional bias).
pub(super) struct Linear {
    pub(super) weight: Sym,
    pub(super) bias: Option<Sym>,
    /// Output and input widths (the weight's; a quantized weight is only bytes).
    pub(super) out: usize,
    pub(super) inp: usize,
    /// LoRA adapter A `(r, in)`, B `(out, r)` (the model's `Proj`).
    pub(super) lora: Option<(Sym, Sym)>,
    /// The base runs as `FrozenLinear` (the weight is then what it holds: dense, GGML's bytes,
    /// or FP8's e4m3 bytes with `scales`).
    pub(super) frozen: Option<FrozenW>,
    /// FP8's block scales `(⌈out/128⌉, ⌈in/128⌉)` f32.
    pub(super) scales: Option<Sym>,
    /// A block projection (or the head) with fused kernels: one `kernels::linear` op (with a
    /// bias) or `kernels::linear_no_bias` (without, contiguous input).
    pub(super) fused: bool,
}

impl Linear {
    pub(super) fn new(p: &Params, inp: usize, out: usize, bias: bool) -> Self {
        Self {
            weight: p.tensor(&[out, inp]),
            bias: bias.then(|| p.tensor(&[out])),
            out,
            inp,
            lora: None,
            frozen: None,
            scales: None,
            fused: false,
        }
    }

    /// A projection `spec`, with an adapter of rank `r` when `r > 0`: the adapter is a
    /// variable, the base weights are frozen (not variables) under LoRA.
    pub(super) fn proj(p: &Params, spec: &ProjSpec, r: usize) -> Self {
        let (inp, out) = (spec.inp, spec.out);
        if !p.lora {
            return Self {
                fused: p.fused,
                ..Self::new(p, inp, out, spec.bias)
            };
        }
        // Under LoRA every projection is frozen as `lora_base` says; adapted ones (r > 0) also
        // carry an adapter.
        let lora = (r > 0).then(|| (p.adapter(&[r, inp]), p.adapter(&[out, r])));
        let (weight, frozen, scales) = match p.base {
            LoraBase::Detach => (p.frozen(&[out, inp]), None, None),
            LoraBase::Op => (p.frozen(&[out, inp]), Some(FrozenW::Dense), None),
            LoraBase::Fp8 => {
                let (r, c) = FP8_BLOCK.scales(out, inp);
                (
                    Sym::new(p.ledger, &[out * inp], DType::U8),
                    Some(FrozenW::Fp8),
                    Some(Sym::new(p.ledger, &[r, c], DType::F32)),
                )
            }
            // The values (two a byte), then a UE8M0 scale per 32; dequantized as FP8 is.
            LoraBase::Mxfp4 => (
                Sym::new(p.ledger, &[out * inp / 2], DType::U8),
                Some(FrozenW::Fp8),
                Some(Sym::new(p.ledger, &[out * inp / MXFP4_BLOCK], DType::U8)),
            ),
            q => {
                let q = q.ggml().expect("the other bases are dense or FP8");
                let n = (out * inp) as u64;
                let scratch = if p.cpu {
                    dequantize_scratch(n, q) as usize
                } else {
                    0
                };
                (
                    Sym::new(p.ledger, &[quantized_bytes(n, q) as usize], DType::U8),
                    Some(FrozenW::Ggml { scratch }),
                    None,
                )
            }
        };
        Self {
            weight,
            bias: spec.bias.then(|| p.frozen(&[out])),
            out,
            inp,
            lora,
            frozen,
            scales,
            fused: p.fused,
        }
    }

    /// `Proj::map`: `base` on weight and bias, `adapter` on A and B.
    pub(super) fn map(&self, base: &dyn Fn(&Sym) -> Sym, adapter: &dyn Fn(&Sym) -> Sym) -> Self {
        Self {
            weight: base(&self.weight),
            bias: self.bias.as_ref().map(base),
            out: self.out,
            inp: self.inp,
            lora: self.lora.as_ref().map(|(a, b)| (adapter(a), adapter(b))),
            frozen: self.frozen,
            scales: self.scales.as_ref().map(base),
            fused: self.fused,
        }
    }

    /// `Proj::forward`: the linear layer (or the frozen-linear op), plus `scale·(x·Aᵀ)·Bᵀ`
    /// with an adapter.
    pub(super) fn forward(&self, x: &Sym) -> Sym {
        let y = match (self.frozen, &self.bias) {
            (None, Some(b)) if self.fused => x.fused_linear(&self.weight, b),
            (None, None) if self.fused && x.is_contiguous() => x.fused_linear_no_bias(&self.weight),
            (None, _) => self.linear_forward(x),
            (Some(held), _) => rows(x)
                .frozen_linear(&self.weight, held, self.out, self.bias.as_ref())
                .reshape(&out_dims(x, self.out)),
        };
        match &self.lora {
            None => y,
            Some((a, b)) => {
                let down = rows(x).matmul(&a.t());
                let up = down.matmul(&b.t()).reshape(&out_dims(x, b.dims()[0]));
                // `y + (up * scale)?`: both operands passed by value.
                let scaled = up.affine(1.0);
                drop(up);
                let r = y.add(&scaled);
                drop((y, scaled));
                r
            }
        }
    }

    /// Mirror of `FrozenWeight::dense_as` (or the dense weight itself): `(out, in)` in `dtype`.
    pub(super) fn dense_weight(&self, dtype: DType) -> Sym {
        let held = self.frozen.unwrap_or(FrozenW::Dense);
        frozen_dense(
            self.weight.ledger(),
            &self.weight,
            held,
            self.out,
            self.inp,
            dtype,
        )
    }

    /// Mirror of `Proj::adds_in_place`: fused, dense, no bias, no adapter.
    fn adds_in_place(&self) -> bool {
        self.fused && self.frozen.is_none() && self.lora.is_none() && self.bias.is_none()
    }

    /// `Proj::forward_scaled`: `forward(&h) ⊙ s`, h freed before the scaling; one op when
    /// fused, dense, without bias or adapter, on a contiguous h.
    pub(super) fn forward_scaled(&self, h: Sym, s: &Sym) -> Sym {
        if self.adds_in_place() && h.is_contiguous() {
            return h.fused_linear_scaled(&self.weight, s);
        }
        let y = self.forward(&h);
        drop(h);
        y.broadcast_mul(s)
    }

    /// `Proj::forward_add`: `residual + forward(&h)`, h and `input` freed before the sum; one
    /// op when fused, dense, without bias or adapter.
    pub(super) fn forward_add(&self, h: Sym, input: Sym, residual: &Sym) -> Sym {
        if self.adds_in_place() && h.is_contiguous() && residual.is_contiguous() {
            drop(input);
            return h.fused_linear_add(&self.weight, residual);
        }
        // `residual + y`: y passed by value.
        let y = self.forward(&h);
        drop((h, input));
        let r = residual.add(&y);
        drop(y);
        r
    }

    /// candle-nn's `Linear::forward`.
    pub(super) fn linear_forward(&self, x: &Sym) -> Sym {
        let x = match *x.dims() {
            [bsize, m, k] => {
                if x.is_contiguous() {
                    let w = self.weight.t();
                    let n = w.dims()[1];
                    x.reshape(&[bsize * m, k])
                        .matmul(&w)
                        .reshape(&[bsize, m, n])
                } else {
                    let w = self.weight.broadcast_left(&[bsize]).t();
                    x.matmul(&w)
                }
            }
            _ => {
                let w = self.weight.t();
                x.matmul(&w)
            }
        };
        match &self.bias {
            None => x,
            Some(bias) => x.broadcast_add(bias),
        }
    }
}
