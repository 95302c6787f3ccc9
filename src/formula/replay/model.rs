//! The model on symbolic tensors: the model's own ([`crate::model::transformer`] run on
//! [`Sym`]), made of the replay's weights ([`Params`]) with the replay's mixture of experts
//! (routed as it is told) and the replay's variables beside it.

use std::rc::Rc;

use super::*;
use crate::model::mlp::Glu;
use crate::model::proj::Lora;
use crate::model::transformer::{Form, Stem};

/// The model's block attention, feed-forward part and block on symbolic tensors (the
/// replay's mixture of experts, which routes as it is told).
pub(super) type SelfAttention = crate::model::transformer::SelfAttention<Sym>;
pub(super) type Ffn = crate::model::transformer::Ffn<Sym, moe::Told>;
pub(super) type Block = crate::model::transformer::Block<Sym, moe::Told>;
/// The model's masks and cache of symbolic tensors.
pub type Masks = crate::model::transformer::Masks<Sym>;
pub type KvCache = crate::model::transformer::KvCache<Sym>;
/// The whole model on symbolic tensors, its variables beside it ([`Kept`]).
pub type Transformer = crate::model::transformer::Transformer<Sym, moe::Told, Kept>;

/// What the replay keeps beside its model: the variables (training: what has a gradient) and
/// the weights' type (the device is the ledger's).
#[derive(Debug, Clone)]
pub struct Kept {
    pub(super) vars: Vec<Sym>,
    pub(super) dtype: DType,
}

impl SelfAttention {
    pub(super) fn linears(&self) -> Vec<&Linear> {
        match self {
            SelfAttention::Mha(a) => vec![&a.q, &a.k, &a.v, &a.o],
            SelfAttention::Mla(a) => a.projs(),
        }
    }

    /// The weights of its norms (Qwen3's q/k norms, MLA's) and gpt-oss's sinks.
    pub(super) fn norm_weights(&self) -> Vec<Sym> {
        match self {
            SelfAttention::Mha(a) => {
                let mut v: Vec<Sym> = match &a.qk_norm {
                    Some((qn, kn)) => qn
                        .weights()
                        .into_iter()
                        .chain(kn.weights())
                        .cloned()
                        .collect(),
                    None => Vec::new(),
                };
                v.extend(a.sinks.clone());
                v
            }
            SelfAttention::Mla(a) => a.norm_weights().into_iter().cloned().collect(),
        }
    }
}

impl Ffn {
    pub(super) fn linears(&self) -> Vec<&Linear> {
        match self {
            Ffn::Dense(m) => m.projs(),
            Ffn::Moe(m) => m.linears(),
        }
    }
}

/// The block's projections in model order.
pub(super) fn linears(b: &Block) -> Vec<&Linear> {
    let mut v = b.attn.linears();
    v.extend(b.mlp.linears());
    v
}

/// Creates the weights: variables (training) or plain tensors (detached inference).
pub(super) struct Params<'a> {
    pub(super) ledger: &'a Rc<Ledger>,
    pub(super) vars: bool,
    pub(super) dtype: DType,
    /// LoRA: everything but the adapters is frozen.
    pub(super) lora: bool,
    /// How LoRA's projections are frozen.
    pub(super) base: LoraBase,
    /// Fused kernels (`model::kernels`).
    pub(super) fused: bool,
    /// On the CPU (a quantized weight's dequantize holds scratch there; CUDA's kernel none).
    pub(super) cpu: bool,
}

impl Params<'_> {
    /// An RMSNorm (with `offset`, Gemma's `1 + w`) or a LayerNorm over `h` (the epsilon does
    /// not change memory, and the replay computes no values).
    pub(super) fn norm(&self, h: usize, rms: bool, offset: bool) -> Norm {
        if rms {
            Norm::Rms {
                weight: self.tensor(&[h]),
                eps: 0.0,
                fused: self.fused,
                offset,
            }
        } else {
            Norm::Layer {
                weight: self.tensor(&[h]),
                bias: self.tensor(&[h]),
                eps: 0.0,
                fused: self.fused,
            }
        }
    }

    pub(super) fn tensor(&self, dims: &[usize]) -> Sym {
        if self.lora {
            return self.frozen(dims);
        }
        if self.vars {
            Sym::var(self.ledger, dims, self.dtype)
        } else {
            Sym::new(self.ledger, dims, self.dtype)
        }
    }

    /// A weight that never trains.
    pub(super) fn frozen(&self, dims: &[usize]) -> Sym {
        Sym::new(self.ledger, dims, self.dtype)
    }

    /// A LoRA adapter tensor: a variable when training.
    pub(super) fn adapter(&self, dims: &[usize]) -> Sym {
        if self.vars {
            Sym::var(self.ledger, dims, self.dtype)
        } else {
            Sym::new(self.ledger, dims, self.dtype)
        }
    }
}

impl Transformer {
    /// Weights on `ledger`, as variables when `vars`, with the layers `slots` (real layer
    /// indices, in order, each with its tag): all of them ([`all_layers`]), or a compressed
    /// model ([`compress`]); a mixture of experts with the routed experts `experts` (indices
    /// among `E`), or all of them.
    pub(super) fn with_layers(
        ledger: &Rc<Ledger>,
        shape: &Shape,
        vars: bool,
        slots: &[Slot],
        experts: Option<&[usize]>,
    ) -> Self {
        // Activations' type; under mixed precision the variables stay f32 (the working copy
        // is made by `cast`), a serving copy (`vars` false) is 16-bit.
        // A serving copy (`vars` false) takes the case's serving weights: an f16 copy, or the
        // projections quantized behind the frozen-linear op.
        let serve = if vars {
            ServingWeights::Model
        } else {
            shape.serve
        };
        let dtype = if shape.elem == ElemType::F32 && serve != ServingWeights::F16 {
            DType::F32
        } else {
            DType::Half
        };
        let param_dtype = if shape.mixed && vars {
            DType::F32
        } else {
            dtype
        };
        let (lora, base) = match serve.quantized() {
            Some(_) if serve.experts_only() => (false, shape.lora_base),
            Some(q) => (true, q),
            None => (shape.lora_rank > 0, shape.lora_base),
        };
        let p = Params {
            ledger,
            vars,
            dtype: param_dtype,
            lora,
            base,
            fused: shape.kernels.fused(),
            cpu: shape.cpu,
        };
        // The experts' projections (held quantized alone with `mxfp4-experts`).
        let p_expert = Params {
            lora: lora || serve.experts_only(),
            base: serve.quantized().unwrap_or(base),
            ..p
        };
        let (h, v, s_max) = (shape.h as usize, shape.v as usize, shape.s_max as usize);
        let llama = shape.llama.is_some();
        // The rotary tables are buffers (never variables), in the weights' type.
        let rope = shape.llama.map(|l| {
            let half = l.head_dim / 2;
            (
                Sym::new(ledger, &[s_max, half], param_dtype),
                Sym::new(ledger, &[s_max, half], param_dtype),
            )
        });
        // Gemma's sliding layers' own tables (after the global ones).
        let rope_local = shape
            .llama
            .filter(|l| l.local_rope(shape.l as usize))
            .map(|l| {
                let half = l.head_dim / 2;
                (
                    Sym::new(ledger, &[s_max, half], param_dtype),
                    Sym::new(ledger, &[s_max, half], param_dtype),
                )
            });
        let variant = shape.llama.map(|l| l.variant).unwrap_or_default();
        let norm = |n: usize, rms: bool| p.norm(n, rms, variant.unit_offset_norms);
        let stem = match shape.vision {
            None => Stem::Tokens(p.tensor(&[v, h])),
            Some(vis) => Stem::Patches {
                proj: p.linear(vis.patch_dim(), h, true),
                cls: p.tensor(&[1, 1, h]),
                patch: vis.patch,
            },
        };
        let wpe = (!llama).then(|| p.tensor(&[s_max, h]));
        let (kv_heads, head_dim) = shape.kv_dims();
        let core = Core {
            heads: shape.a as usize,
            kv_heads: kv_heads as usize,
            efficient: shape.efficient,
            tiled: shape.tiled,
            fused: shape.kernels.fused(),
            causal: shape.vision.is_none(),
            window: None,
            // The scale changes no allocation.
            scale_mul: 1.0,
            scale_abs: None,
        };
        let lora = |spec: &ProjSpec| {
            if shape.has_lora(spec.target) {
                shape.lora_rank as usize
            } else {
                0
            }
        };
        let proj = |spec: &ProjSpec| p.proj(spec, lora(spec));
        let swiglu_with = |pp: &Params, specs: &[ProjSpec]| Mlp::SwiGlu {
            gate: pp.proj(&specs[0], lora(&specs[0])),
            up: pp.proj(&specs[1], lora(&specs[1])),
            down: pp.proj(&specs[2], lora(&specs[2])),
            fused: shape.kernels.fused(),
            act: Glu::of(shape.llama.as_ref()),
        };
        let swiglu = |specs: &[ProjSpec]| swiglu_with(&p, specs);
        let expert_mlp = |specs: &[ProjSpec]| swiglu_with(&p_expert, specs);
        // The routing a row recorded is per sparse layer, in layer order.
        let mut sparse_index = 0;
        let blocks: Vec<Block> = slots
            .iter()
            .map(|&Slot { layer, tag }| {
                ledger.set_tag(tag);
                let lay = shape.layer_layout(layer as u64);
                let window = shape.llama.and_then(|l| l.window_at(layer));
                let core = Core { window, ..core };
                let ln1 = norm(h, llama);
                let attn = match shape.llama.and_then(|l| l.mla) {
                    Some(m) => {
                        let mut it = lay.attn.iter();
                        let mut next = || proj(it.next().expect("an MLA projection"));
                        let q_a = m.q_lora_rank.map(|r| {
                            let q_a = next();
                            (q_a, p.norm(r, true, false))
                        });
                        let q = next();
                        let kv_a = next();
                        let kv_a_norm = p.norm(m.kv_lora_rank, true, false);
                        SelfAttention::Mla(Mla {
                            q,
                            q_a,
                            kv_a,
                            kv_a_norm,
                            kv_b: next(),
                            o: next(),
                            shape: m,
                            core: Core {
                                kv_heads: shape.a as usize,
                                ..core
                            },
                        })
                    }
                    None => SelfAttention::Mha(Attention {
                        q: proj(&lay.attn[0]),
                        k: proj(&lay.attn[1]),
                        v: proj(&lay.attn[2]),
                        o: proj(&lay.attn[3]),
                        qk_norm: shape.llama.filter(|l| l.qk_norm).map(|_| {
                            (norm(head_dim as usize, true), norm(head_dim as usize, true))
                        }),
                        sinks: shape
                            .llama
                            .filter(|l| l.variant.attention_sinks)
                            .map(|_| p.tensor(&[shape.a as usize])),
                        head_dim: head_dim as usize,
                        core,
                    }),
                };
                let ln1_post = variant.sandwich_norms.then(|| norm(h, true));
                let ln2 = norm(h, llama);
                let mlp = match &lay.mlp {
                    MlpLayout::Moe {
                        shape: m,
                        expert,
                        shared,
                    } => {
                        // The router, each expert's gate, up, down, the shared experts, the
                        // shared gate (model order).
                        let router = p.linear(
                            h,
                            m.experts,
                            shape.llama.is_some_and(|l| l.variant.router_bias),
                        );
                        let expert_ids: Vec<usize> =
                            experts.map_or_else(|| (0..m.experts).collect(), <[usize]>::to_vec);
                        let experts = expert_ids.iter().map(|_| expert_mlp(expert)).collect();
                        let shared_mlp = (!shared.is_empty()).then(|| expert_mlp(shared));
                        let shared_gate =
                            (!shared.is_empty() && m.shared_gate).then(|| p.linear(h, 1, false));
                        let routing = shape
                            .routing
                            .as_ref()
                            .and_then(|r| r.get(sparse_index).cloned());
                        sparse_index += 1;
                        Ffn::Moe(Box::new(moe::Moe {
                            router,
                            experts,
                            shared: shared_mlp,
                            shared_gate,
                            shape: *m,
                            fused: shape.kernels.fused(),
                            routing: moe::Told {
                                expert_ids,
                                routing,
                                worst: shape.worst_routing,
                            },
                        }))
                    }
                    MlpLayout::Dense(specs) if llama => Ffn::Dense(swiglu(specs)),
                    MlpLayout::Dense(specs) => Ffn::Dense(Mlp::Gelu {
                        fc1: proj(&specs[0]),
                        fc2: proj(&specs[1]),
                        fused: shape.kernels.fused(),
                    }),
                };
                let post = ln1_post.map(|a| (a, norm(h, true)));
                Block {
                    ln1,
                    attn,
                    ln2,
                    mlp,
                    post,
                    windowed: window.is_some(),
                    tag,
                }
            })
            .collect();
        ledger.set_tag(0);
        let ln_f = norm(h, llama);
        let head = match (&stem, shape.tied) {
            (Stem::Tokens(wte), true) => Linear {
                weight: wte.clone(),
                bias: None,
                lora: None,
                frozen: None,
                fused: shape.kernels.fused(),
            },
            _ => Linear {
                fused: shape.kernels.fused(),
                ..p.linear(h, v, shape.vision.is_some())
            },
        };
        let mut all = match &stem {
            Stem::Tokens(wte) => vec![wte.clone()],
            Stem::Patches { proj, cls, .. } => {
                let mut v = vec![proj.weight.clone()];
                v.extend(proj.bias.clone());
                v.push(cls.clone());
                v
            }
        };
        all.extend(wpe.clone());
        for b in &blocks {
            all.extend(b.ln1.weights().into_iter().cloned());
            for l in linears(b) {
                all.push(l.weight.clone());
                all.extend(l.bias.clone());
                if let Some(Lora { a, b, .. }) = &l.lora {
                    all.extend([a.clone(), b.clone()]);
                }
            }
            all.extend(b.attn.norm_weights());
            all.extend(b.ln2.weights().into_iter().cloned());
            if let Some((a, c)) = &b.post {
                all.extend(a.weights().into_iter().cloned());
                all.extend(c.weights().into_iter().cloned());
            }
        }
        all.extend(ln_f.weights().into_iter().cloned());
        if !shape.tied {
            all.push(head.weight.clone());
            all.extend(head.bias.clone());
        }
        ledger.cuda.set(!shape.cpu);
        Self {
            stem,
            wpe,
            rope,
            rope_local,
            blocks,
            ln_f,
            head,
            form: Form {
                kernels: shape.kernels,
                max_seq: None,
                embed_scale: variant.embed_scaled.then(|| (h as f64).sqrt()),
                sliding_window: shape.llama.and_then(|l| l.sliding_window),
                sinks: shape.llama.is_some_and(|l| l.variant.attention_sinks),
                tied: shape.tied,
            },
            own: Kept {
                vars: all,
                dtype: param_dtype,
            },
        }
    }

    /// The model's `cast`: every weight converted (recorded when a variable).
    pub fn cast(&self, dtype: DType) -> Transformer {
        let f = |t: &Sym| Ok(t.to_dtype(dtype));
        let own = Kept {
            vars: Vec::new(),
            dtype,
        };
        self.map_with(&f, &f, own).sure()
    }

    /// The model with detached weights (views of the same storages, no graph).
    pub fn detached(&self) -> Transformer {
        let f = |t: &Sym| Ok(t.detach());
        let own = Kept {
            vars: Vec::new(),
            dtype: self.own.dtype,
        };
        self.map_with(&f, &f, own).sure()
    }
}
