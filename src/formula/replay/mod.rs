//! The transformer of [`crate::model::transformer`] (GPT decoder, ViT encoder or the
//! LLaMA-family decoder of [`crate::model::llama`]) on [`Sym`] tensors: the backward and
//! inference predictions. For LLaMA the replay follows `rms_norm_slow` (x², mean, `+ eps`,
//! sqrt, divide, scale), the composed rotary embedding (two halves, four broadcast products, a
//! sub, an add and a `cat` per rotated tensor, the tables narrowed at the cache offset),
//! `repeat_kv` (one `cat` of `heads/kv_heads` copies), SiLU with candle's backward (`neg`,
//! `exp`, `+ 1`, `recip`, `1 − node`, two products and a sum, all recorded), and SwiGLU's
//! product.
//!
//! The code below is the model's code (and candle-nn's `Linear`, `Embedding`, `layer_norm_slow`,
//! `softmax`, `log_softmax`, `cross_entropy`) written again on symbolic tensors, statement for
//! statement, so that what is alive when matches candle: a temporary dies at the end of its
//! statement, a shadowed binding at the end of its scope, an operand passed by value (`x + a`)
//! when the operator returns. Keep it in step with `model/transformer.rs` and the family and layer
//! files beside it (`llama.rs`, `attention.rs`, `mlp.rs`, `moe.rs`, `mla.rs`, …); the exactness
//! tests fail when the two drift apart.
//!
//! The layers mirror the model's files: `proj.rs` (`model::proj`), `norm.rs`, `attention.rs`,
//! `mlp.rs`; the block, the model, checkpointing and the phases' windows are here.
//!
//! [`replay_training`], [`replay_serving`] and [`decode_step`] run a deep model through a few
//! layers of each run of identical layers (training: and a few experts of each run of experts
//! with the same token count) and extrapolate, exactly (`compress.rs`); the `_full` forms run
//! every layer, and the two agree byte for byte (tested). Every block (and expert) allocates
//! under its own ledger tag, so the ledger can record what each part reaches.
//!
//! Why replay rather than a closed form: candle's backward peak is where the most gradients and
//! backward temporaries overlap, and which point that is (the cross-entropy head, an attention
//! block's softmax, a GELU, the embeddings) moves with the shape. Replaying candle's own
//! algorithm on shapes gives that peak exactly; the closed forms in [`super::transformer`] give the
//! terms (weights, activations, gradients) and agree with the replay where both exist.

use std::rc::Rc;

use super::shape::Shape;
use super::symbolic::{DType, GradStore, Ledger, Sym, backward};
use crate::device::{ElemType, ServingWeights};
use crate::model::kernels::{Kernel, Kernels};
use crate::model::transformer::{LoraBase, MlpLayout, ProjSpec};
use crate::step::segments;

mod attention;
mod compress;
mod mla;
mod mlp;
mod moe;
mod norm;
mod proj;

use attention::{Attention, Core, Rotary};
use mlp::Mlp;
use norm::Norm;
use proj::Linear;

/// candle-nn `ops::log_softmax`.
fn log_softmax(xs: &Sym, d: usize) -> Sym {
    let max = xs.max_keepdim(d);
    let diff = xs.broadcast_sub(&max);
    let sum_exp = diff.exp().sum_keepdim(&[d]);
    diff.broadcast_sub(&sum_exp.log())
}

/// candle-nn `loss::cross_entropy` (log-softmax, then `nll`).
fn cross_entropy(inp: &Sym, target: &Sym) -> Sym {
    let inp = log_softmax(inp, 1);
    inp.gather(&target.unsqueeze(1), 1).sum_all().affine(-1.0)
}

/// `a + b` where `b` is passed by value: `b` is dropped when the operator returns.
fn add_owned(a: &Sym, b: Sym) -> Sym {
    let r = a.add(&b);
    drop(b);
    r
}

/// Mirror of the model's `SelfAttention`.
enum SelfAttention {
    Mha(Attention),
    Mla(mla::Mla),
}

impl SelfAttention {
    /// Mirror of the model's `SelfAttention::forward_add`.
    fn forward_add(
        &self,
        x: Sym,
        residual: &Sym,
        mask: Option<&Sym>,
        rotary: Option<Rotary>,
    ) -> Sym {
        let (y, o) = match self {
            SelfAttention::Mha(a) => (a.heads(&x, mask, rotary), &a.o),
            SelfAttention::Mla(a) => (a.heads(&x, mask, rotary), &a.o),
        };
        o.forward_add(y, x, residual)
    }

    /// Mirror of the model's `SelfAttention::forward_owned`.
    fn forward_owned(
        &self,
        x: Sym,
        mask: Option<&Sym>,
        rotary: Option<Rotary>,
        cache: Option<&mut Option<(Sym, Sym)>>,
    ) -> Sym {
        let (heads, o) = match (self, cache) {
            (SelfAttention::Mha(a), None) => (a.heads(&x, mask, rotary), &a.o),
            (SelfAttention::Mla(a), None) => (a.heads(&x, mask, rotary), &a.o),
            (SelfAttention::Mha(a), Some(c)) => (a.heads_cached(&x, mask, rotary, c), &a.o),
            (SelfAttention::Mla(a), Some(c)) => (a.heads_cached(&x, mask, rotary, c), &a.o),
        };
        drop(x);
        let y = o.forward(&heads);
        drop(heads);
        y
    }

    /// Mirror of the model's `SelfAttention::forward_cached_add`.
    fn forward_cached_add(
        &self,
        x: Sym,
        residual: &Sym,
        mask: Option<&Sym>,
        rotary: Option<Rotary>,
        cache: &mut Option<(Sym, Sym)>,
    ) -> Sym {
        let (y, o) = match self {
            SelfAttention::Mha(a) => (a.heads_cached(&x, mask, rotary, cache), &a.o),
            SelfAttention::Mla(a) => (a.heads_cached(&x, mask, rotary, cache), &a.o),
        };
        o.forward_add(y, x, residual)
    }

    fn linears(&self) -> Vec<&Linear> {
        match self {
            SelfAttention::Mha(a) => vec![&a.q, &a.k, &a.v, &a.o],
            SelfAttention::Mla(a) => a.linears(),
        }
    }

    /// The weights of its norms (Qwen3's q/k norms, MLA's) and gpt-oss's sinks.
    fn norm_weights(&self) -> Vec<Sym> {
        match self {
            SelfAttention::Mha(a) => {
                let mut v: Vec<Sym> = match &a.qk_norm {
                    Some((qn, kn)) => qn.weights().into_iter().chain(kn.weights()).collect(),
                    None => Vec::new(),
                };
                v.extend(a.sinks.clone());
                v
            }
            SelfAttention::Mla(a) => a.norm_weights(),
        }
    }

    fn map(&self, f: &dyn Fn(&Linear) -> Linear, w: &dyn Fn(&Sym) -> Sym) -> Self {
        match self {
            SelfAttention::Mha(a) => SelfAttention::Mha(a.map(f, w)),
            SelfAttention::Mla(a) => SelfAttention::Mla(a.map(f, w)),
        }
    }
}

/// Mirror of the model's `Ffn`: a block's dense MLP or mixture of experts.
enum Ffn {
    Dense(Box<Mlp>),
    Moe(Box<moe::Moe>),
}

impl Ffn {
    /// Mirror of the model's `Ffn::forward_owned`.
    fn forward_owned(&self, x: Sym) -> Sym {
        let y = match self {
            Ffn::Dense(m) => m.forward(&x),
            Ffn::Moe(m) => m.forward(&x),
        };
        drop(x);
        y
    }

    /// Mirror of the model's `Ffn::forward_add`.
    fn forward_add(&self, x: Sym, residual: &Sym) -> Sym {
        match self {
            Ffn::Dense(m) => m.forward_add(x, residual),
            Ffn::Moe(m) => {
                let y = m.forward(&x);
                drop(x);
                add_owned(residual, y)
            }
        }
    }

    fn linears(&self) -> Vec<&Linear> {
        match self {
            Ffn::Dense(m) => m.linears(),
            Ffn::Moe(m) => m.linears(),
        }
    }

    fn map(&self, f: &dyn Fn(&Linear) -> Linear) -> Self {
        match self {
            Ffn::Dense(m) => Ffn::Dense(Box::new(m.map(f))),
            Ffn::Moe(m) => Ffn::Moe(Box::new(m.map(f))),
        }
    }
}

struct Block {
    ln1: Norm,
    attn: SelfAttention,
    ln2: Norm,
    mlp: Ffn,
    /// Gemma's norms after the attention and after the MLP.
    post: Option<(Norm, Norm)>,
    /// Its attention slides (takes the windowed mask).
    windowed: bool,
    /// Its ledger tag (`compress`): what it allocates, forward and backward, is its segment.
    tag: u32,
}

/// Mirror of the model's `Masks`.
#[derive(Default)]
pub struct Masks {
    full: Option<Sym>,
    sliding: Option<Sym>,
}

impl Masks {
    fn at(&self, windowed: bool) -> Option<&Sym> {
        if windowed {
            self.sliding.as_ref()
        } else {
            self.full.as_ref()
        }
    }
}

impl Block {
    fn forward(&self, x: &Sym, mask: Option<&Sym>, rotary: Option<Rotary>) -> Sym {
        if let Some(post) = &self.post {
            return self.sandwich(x, post, mask, rotary, None);
        }
        let x = self.attn.forward_add(self.ln1.forward(x), x, mask, rotary);
        self.mlp.forward_add(self.ln2.forward(&x), &x)
    }

    /// Mirror of the model's `Block::sandwich` (Gemma).
    fn sandwich(
        &self,
        x: &Sym,
        (ln1_post, ln2_post): &(Norm, Norm),
        mask: Option<&Sym>,
        rotary: Option<Rotary>,
        cache: Option<&mut Option<(Sym, Sym)>>,
    ) -> Sym {
        let y = self
            .attn
            .forward_owned(self.ln1.forward(x), mask, rotary, cache);
        let n = ln1_post.forward(&y);
        drop(y);
        let x = add_owned(x, n);
        let y = self.mlp.forward_owned(self.ln2.forward(&x));
        let n = ln2_post.forward(&y);
        drop(y);
        add_owned(&x, n)
    }

    fn forward_cached(
        &self,
        x: &Sym,
        mask: Option<&Sym>,
        rotary: Option<Rotary>,
        cache: &mut Option<(Sym, Sym)>,
    ) -> Sym {
        if let Some(post) = &self.post {
            return self.sandwich(x, post, mask, rotary, Some(cache));
        }
        let x = self
            .attn
            .forward_cached_add(self.ln1.forward(x), x, mask, rotary, cache);
        self.mlp.forward_add(self.ln2.forward(&x), &x)
    }

    /// The block's projections in model order.
    fn linears(&self) -> Vec<&Linear> {
        let mut v = self.attn.linears();
        v.extend(self.mlp.linears());
        v
    }
}

/// Creates the weights: variables (training) or plain tensors (detached inference).
struct Params<'a> {
    ledger: &'a Rc<Ledger>,
    vars: bool,
    dtype: DType,
    /// LoRA: everything but the adapters is frozen.
    lora: bool,
    /// How LoRA's projections are frozen.
    base: LoraBase,
    /// Fused kernels (`model::kernels`).
    fused: bool,
    /// On the CPU (a quantized weight's dequantize holds scratch there; CUDA's kernel none).
    cpu: bool,
}

impl Params<'_> {
    fn tensor(&self, dims: &[usize]) -> Sym {
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
    fn frozen(&self, dims: &[usize]) -> Sym {
        Sym::new(self.ledger, dims, self.dtype)
    }

    /// A LoRA adapter tensor: a variable when training.
    fn adapter(&self, dims: &[usize]) -> Sym {
        if self.vars {
            Sym::var(self.ledger, dims, self.dtype)
        } else {
            Sym::new(self.ledger, dims, self.dtype)
        }
    }
}

/// Mirror of the model's `Stem`.
enum Stem {
    Tokens(Sym),
    Patches {
        proj: Linear,
        cls: Sym,
        patch: usize,
    },
}

/// Mirror of `vit::patchify`: `(B, C, I, I)` → `(B, N, C·p²)` (the last reshape copies).
fn patchify(images: &Sym, p: usize) -> Sym {
    let d = images.dims();
    let (b, c, nh, nw) = (d[0], d[1], d[2] / p, d[3] / p);
    images
        .reshape(&[b, c, nh, p, nw, p])
        .permute(&[0, 2, 4, 1, 3, 5])
        .reshape(&[b, nh * nw, c * p * p])
}

/// The model's weights and forward.
pub struct Transformer {
    stem: Stem,
    wpe: Option<Sym>,
    /// LLaMA's rotary tables cos, sin `(S_max, D/2)`.
    rope: Option<(Sym, Sym)>,
    /// Gemma's sliding layers' own tables.
    rope_local: Option<(Sym, Sym)>,
    /// Gemma: the token embedding times √H (an affine copy).
    embed_scale: bool,
    /// gpt-oss: its attention adds the mask tensor whatever the kernels (the sinks' softmax is
    /// composed).
    sinks: bool,
    blocks: Vec<Block>,
    ln_f: Norm,
    head: Linear,
    tied: bool,
    hidden: usize,
    dtype: DType,
    vars: Vec<Sym>,
    kernels: Kernels,
    /// On CUDA (the fused cross-entropy keeps one f32 per row between its two launches).
    cuda: bool,
}

impl Transformer {
    /// Weights on `ledger`, as variables when `vars`, with the layers `slots` (real layer
    /// indices, in order, each with its tag): all of them ([`all_layers`]), or a compressed
    /// model ([`compress`]); a mixture of experts with the routed experts `experts` (indices
    /// among `E`), or all of them.
    fn with_layers(
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
        let gemma = shape.llama.and_then(|l| l.gemma);
        let norm = |n: usize, rms: bool| Norm::with_offset(&p, n, rms, gemma.is_some());
        let stem = match shape.vision {
            None => Stem::Tokens(p.tensor(&[v, h])),
            Some(vis) => Stem::Patches {
                proj: Linear::new(&p, vis.patch_dim(), h, true),
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
        };
        let lora = |spec: &ProjSpec| {
            if shape.has_lora(spec.target) {
                shape.lora_rank as usize
            } else {
                0
            }
        };
        let proj = |spec: &ProjSpec| Linear::proj(&p, spec, lora(spec));
        let swiglu_with = |pp: &Params, specs: &[ProjSpec]| Mlp::SwiGlu {
            gate: Linear::proj(pp, &specs[0], lora(&specs[0])),
            up: Linear::proj(pp, &specs[1], lora(&specs[1])),
            down: Linear::proj(pp, &specs[2], lora(&specs[2])),
            fused: shape.kernels.fused(),
            act: mlp::Glu::of(shape.llama.as_ref()),
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
                            (q_a, Norm::new(&p, r, true))
                        });
                        let q = next();
                        let kv_a = next();
                        let kv_a_norm = Norm::new(&p, m.kv_lora_rank, true);
                        SelfAttention::Mla(mla::Mla {
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
                            .filter(|l| l.oss)
                            .map(|_| p.tensor(&[shape.a as usize])),
                        head_dim: head_dim as usize,
                        core,
                    }),
                };
                let ln1_post = gemma.map(|_| norm(h, true));
                let ln2 = norm(h, llama);
                let mlp = match &lay.mlp {
                    MlpLayout::Moe {
                        shape: m,
                        expert,
                        shared,
                    } => {
                        // The router, each expert's gate, up, down, the shared experts, the
                        // shared gate (model order).
                        let router =
                            Linear::new(&p, h, m.experts, shape.llama.is_some_and(|l| l.oss));
                        let expert_ids: Vec<usize> =
                            experts.map_or_else(|| (0..m.experts).collect(), <[usize]>::to_vec);
                        let experts = expert_ids.iter().map(|_| expert_mlp(expert)).collect();
                        let shared_mlp = (!shared.is_empty()).then(|| expert_mlp(shared));
                        let shared_gate = (!shared.is_empty() && m.shared_gate)
                            .then(|| Linear::new(&p, h, 1, false));
                        let routing = shape
                            .routing
                            .as_ref()
                            .and_then(|r| r.get(sparse_index).cloned());
                        sparse_index += 1;
                        Ffn::Moe(Box::new(moe::Moe {
                            router,
                            experts,
                            expert_ids,
                            shared: shared_mlp,
                            shared_gate,
                            shape: *m,
                            routing,
                            worst: shape.worst_routing,
                            fused: shape.kernels.fused(),
                        }))
                    }
                    MlpLayout::Dense(specs) if llama => Ffn::Dense(Box::new(swiglu(specs))),
                    MlpLayout::Dense(specs) => Ffn::Dense(Box::new(Mlp::Gelu {
                        fc1: proj(&specs[0]),
                        fc2: proj(&specs[1]),
                        fused: shape.kernels.fused(),
                    })),
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
                out: v,
                inp: h,
                lora: None,
                frozen: None,
                scales: None,
                fused: shape.kernels.fused(),
            },
            _ => Linear {
                fused: shape.kernels.fused(),
                ..Linear::new(&p, h, v, shape.vision.is_some())
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
            all.extend(b.ln1.weights());
            for l in b.linears() {
                all.push(l.weight.clone());
                all.extend(l.bias.clone());
                if let Some((a, b)) = &l.lora {
                    all.extend([a.clone(), b.clone()]);
                }
            }
            all.extend(b.attn.norm_weights());
            all.extend(b.ln2.weights());
            if let Some((a, c)) = &b.post {
                all.extend(a.weights());
                all.extend(c.weights());
            }
        }
        all.extend(ln_f.weights());
        if !shape.tied {
            all.push(head.weight.clone());
            all.extend(head.bias.clone());
        }
        Self {
            stem,
            wpe,
            rope,
            rope_local,
            embed_scale: gemma.is_some(),
            sinks: shape.llama.is_some_and(|l| l.oss),
            blocks,
            ln_f,
            head,
            tied: shape.tied,
            hidden: h,
            dtype: param_dtype,
            vars: all,
            kernels: shape.kernels,
            cuda: !shape.cpu,
        }
    }

    /// Block `block`'s rotary tables at positions `offset..` (LLaMA; Gemma's sliding layers:
    /// their own).
    fn rotary(&self, block: &Block, offset: usize) -> Option<Rotary<'_>> {
        let tables = match &self.rope_local {
            Some(local) if block.windowed => Some(local),
            _ => self.rope.as_ref(),
        };
        tables.map(|(cos, sin)| Rotary { cos, sin, offset })
    }

    /// Mirror of the model's `tokens`: the embedding (Gemma: times √H, the rows freed).
    fn tokens(&self, wte: &Sym, input: &Sym) -> Sym {
        // candle-nn `Embedding::forward`.
        let mut final_dims = input.dims().to_vec();
        final_dims.push(self.hidden);
        let indexes = input.flatten_all();
        let values = wte.index_select(&indexes, 0);
        let e = values.reshape(&final_dims);
        drop((indexes, values));
        if !self.embed_scale {
            return e;
        }
        let x = e.affine(1.0);
        drop(e);
        x
    }

    /// The model's `forward`: `tokens (B, S)` u32 → logits `(B, S, V)`; ViT: images →
    /// `(B, 1, K)`.
    pub fn forward(&self, input: &Sym) -> Sym {
        let masks = self.input_mask(input);
        let mut x = self.embed(input);
        for block in &self.blocks {
            input.ledger().set_tag(block.tag);
            x = block.forward(&x, masks.at(block.windowed), self.rotary(block, 0));
        }
        input.ledger().set_tag(0);
        self.head_forward(&x)
    }

    /// Mirror of the model's `masks`: full first, then windowed, each when some layer uses it.
    fn masks(&self, tokens: &Sym, s: usize) -> Masks {
        let full = self
            .blocks
            .iter()
            .any(|b| !b.windowed)
            .then(|| self.mask(tokens, s));
        let sliding = self
            .blocks
            .iter()
            .any(|b| b.windowed)
            .then(|| self.mask(tokens, s));
        Masks { full, sliding }
    }

    /// Mirror of the model's `needs_mask`.
    fn needs_mask(&self) -> bool {
        !self.kernels.fused() || self.sinks
    }

    /// Mirror of the model's `input_mask`.
    pub fn input_mask(&self, input: &Sym) -> Masks {
        match self.stem {
            Stem::Tokens(_) if self.needs_mask() => self.masks(input, input.dims()[1]),
            _ => Masks::default(),
        }
    }

    /// Mirror of the model's `forward_cached`: the last position's logits `(B, V)`.
    pub fn forward_cached(&self, tokens: &Sym, cache: &mut Vec<Option<(Sym, Sym)>>) -> Sym {
        let Stem::Tokens(wte) = &self.stem else {
            panic!("generation replayed on a ViT (the workload refuses it)")
        };
        let s = tokens.dims()[1];
        let offset = match cache.first() {
            Some(Some((k, _))) => k.dims()[2],
            _ => 0,
        };
        if cache.len() != self.blocks.len() {
            *cache = (0..self.blocks.len()).map(|_| None).collect();
        }
        let masks = if s > 1 && self.needs_mask() {
            self.masks(tokens, s)
        } else {
            Masks::default()
        };
        let tokens_embedded = self.tokens(wte, tokens);
        // The model adds to a temporary: the embedding goes once the sum exists.
        let mut x = match &self.wpe {
            Some(wpe) => {
                let pos = wpe.narrow(0, offset, s);
                let x = tokens_embedded.broadcast_add(&pos);
                drop(tokens_embedded);
                x
            }
            None => tokens_embedded,
        };
        for (block, c) in self.blocks.iter().zip(cache.iter_mut()) {
            tokens.ledger().set_tag(block.tag);
            x = block.forward_cached(&x, masks.at(block.windowed), self.rotary(block, offset), c);
        }
        tokens.ledger().set_tag(0);
        let last = x.narrow(1, s - 1, 1).contiguous();
        drop(x);
        let logits = self.head_forward(&last);
        logits.squeeze(1)
    }

    /// The causal mask in the model's element type.
    pub fn mask(&self, tokens: &Sym, s: usize) -> Sym {
        Sym::new(tokens.ledger(), &[s, s], DType::F32).to_dtype(self.dtype)
    }

    /// Token plus position embedding; ViT: projected patches after the class token, plus
    /// position embedding.
    pub fn embed(&self, input: &Sym) -> Sym {
        match &self.stem {
            Stem::Tokens(wte) => {
                let s = input.dims()[1];
                match &self.wpe {
                    Some(wpe) => {
                        let pos = wpe.narrow(0, 0, s);
                        self.tokens(wte, input).broadcast_add(&pos)
                    }
                    None => self.tokens(wte, input),
                }
            }
            Stem::Patches { proj, cls, patch } => {
                let patches = patchify(&input.to_dtype(self.dtype), *patch);
                let x = proj.forward(&patches);
                drop(patches);
                let (b, h) = (x.dims()[0], x.dims()[2]);
                let cls = cls.broadcast_as(&[b, 1, h]).contiguous();
                let x = Sym::cat(&[&cls, &x], 1);
                drop(cls);
                x.broadcast_add(self.wpe.as_ref().expect("a ViT has a position table"))
            }
        }
    }

    /// Blocks `range` applied to `x`.
    pub fn blocks_forward(&self, x: &Sym, masks: &Masks, range: std::ops::Range<usize>) -> Sym {
        let mut x = x.clone();
        let ledger = x.ledger().clone();
        let outer = ledger.tag();
        for block in &self.blocks[range] {
            ledger.set_tag(block.tag);
            x = block.forward(&x, masks.at(block.windowed), self.rotary(block, 0));
        }
        ledger.set_tag(outer);
        x
    }

    /// Final LayerNorm and LM head (ViT: of the class token).
    pub fn head_forward(&self, x: &Sym) -> Sym {
        let x = match self.stem {
            Stem::Tokens(_) => self.ln_f.forward(x),
            Stem::Patches { .. } => self.ln_f.forward(&x.narrow(1, 0, 1).contiguous()),
        };
        self.head.forward(&x)
    }

    /// Mirror of the model's `cast`: every weight converted (recorded when a variable).
    pub fn cast(&self, dtype: DType) -> Transformer {
        self.map(&|t: &Sym| t.to_dtype(dtype), dtype)
    }

    /// The model with detached weights (views of the same storages, no graph).
    pub fn detached(&self) -> Transformer {
        self.map(&Sym::detach, self.dtype)
    }

    /// Mirror of the model's `map`: `f` on every weight (and the rotary tables), in model
    /// order; a tied head is the mapped token table.
    fn map(&self, f: &dyn Fn(&Sym) -> Sym, dtype: DType) -> Transformer {
        let lin = |l: &Linear| l.map(f, f);
        let rope = self.rope.as_ref().map(|(c, s)| (f(c), f(s)));
        let rope_local = self.rope_local.as_ref().map(|(c, s)| (f(c), f(s)));
        let stem = match &self.stem {
            Stem::Tokens(wte) => Stem::Tokens(f(wte)),
            Stem::Patches { proj, cls, patch } => Stem::Patches {
                proj: lin(proj),
                cls: f(cls),
                patch: *patch,
            },
        };
        let wpe = self.wpe.as_ref().map(f);
        let ledger = self.head.weight.ledger().clone();
        let blocks = self
            .blocks
            .iter()
            .map(|b| {
                ledger.set_tag(b.tag);
                let ln1 = b.ln1.map(f);
                let attn = b.attn.map(&lin, f);
                let ln1_post = b.post.as_ref().map(|p| p.0.map(f));
                let ln2 = b.ln2.map(f);
                let mlp = b.mlp.map(&lin);
                let post = ln1_post.zip(b.post.as_ref().map(|p| p.1.map(f)));
                Block {
                    ln1,
                    attn,
                    ln2,
                    mlp,
                    post,
                    windowed: b.windowed,
                    tag: b.tag,
                }
            })
            .collect();
        ledger.set_tag(0);
        let ln_f = self.ln_f.map(f);
        let head = match (&stem, self.tied) {
            (Stem::Tokens(wte), true) => Linear {
                weight: wte.clone(),
                bias: None,
                out: self.head.out,
                inp: self.head.inp,
                lora: None,
                frozen: None,
                scales: None,
                fused: self.head.fused,
            },
            _ => lin(&self.head),
        };
        Transformer {
            stem,
            wpe,
            rope,
            rope_local,
            embed_scale: self.embed_scale,
            sinks: self.sinks,
            blocks,
            ln_f,
            head,
            tied: self.tied,
            hidden: self.hidden,
            dtype,
            vars: Vec::new(),
            kernels: self.kernels,
            cuda: self.cuda,
        }
    }

    /// The model's `loss`: mean cross-entropy of the logits against `targets (B, S)`.
    pub fn loss(logits: &Sym, targets: &Sym) -> Sym {
        let (b, s, v) = (logits.dims()[0], logits.dims()[1], logits.dims()[2]);
        cross_entropy(&logits.reshape(&[b * s, v]), &targets.flatten_all())
    }

    /// Mirror of the model's `train_loss` (`loss_with` its kernels).
    pub fn train_loss(&self, logits: &Sym, targets: &Sym) -> Sym {
        if !self.kernels.fused() {
            return Transformer::loss(logits, targets);
        }
        let (b, s, v) = (logits.dims()[0], logits.dims()[1], logits.dims()[2]);
        let (logits, targets) = (logits.reshape(&[b * s, v]), targets.flatten_all());
        // CUDA: the per-row losses (f32) live until the mean is written.
        let rows = self
            .cuda
            .then(|| Sym::new(logits.ledger(), &[b * s], DType::F32));
        let loss = Sym::kernel(
            Kernel::CrossEntropy,
            &[&logits, &targets],
            &[],
            logits.dtype(),
        );
        drop(rows);
        loss
    }
}

/// One layer of a (possibly compressed) model: its index in the full model and its tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    layer: usize,
    tag: u32,
}

/// What the checkpointed forward keeps (mirror of `phase::checkpoint::Forward`).
struct CkptForward {
    loss: Sym,
    head_in: Sym,
    inputs: Vec<Sym>,
    mask: Masks,
    /// Mixed precision's working copy (mirror of `Forward::half`).
    half: Option<Transformer>,
}

/// Mirror of `phase::checkpoint::forward`.
fn ckpt_forward(
    model: &Transformer,
    detached: &Transformer,
    tokens: &Sym,
    targets: &Sym,
    k: usize,
    f32_loss: bool,
) -> CkptForward {
    let mask = model.input_mask(tokens);
    let mut x = detached.embed(tokens);
    let mut inputs = Vec::new();
    for seg in segments(model.blocks.len(), k) {
        inputs.push(x.clone());
        x = detached.blocks_forward(&x, &mask, seg);
    }
    let head_in = x.var_from();
    drop(x);
    let logits = model.head_forward(&head_in);
    let loss = if f32_loss {
        model.train_loss(&logits.to_dtype(DType::F32), targets)
    } else {
        model.train_loss(&logits, targets)
    };
    drop(logits);
    CkptForward {
        loss,
        head_in,
        inputs,
        mask,
        half: None,
    }
}

/// Mirror of `checkpoint::keep`: a tied weight's two gradients summed.
fn keep(into: &mut GradStore, from: &mut GradStore, vars: &[Sym]) {
    for v in vars {
        if let Some(g) = from.remove(v) {
            let g = match into.remove(v) {
                Some(prev) => {
                    let sum = prev.add(&g);
                    drop((prev, g));
                    sum
                }
                None => g,
            };
            into.insert(v, g);
        }
    }
}

/// Mirror of `phase::checkpoint::backward`.
fn ckpt_backward(model: &Transformer, fwd: CkptForward, tokens: &Sym, k: usize) -> GradStore {
    let CkptForward {
        loss,
        head_in,
        mut inputs,
        mask,
        half,
    } = fwd;
    let vars = model.vars.clone();
    let model = half.as_ref().unwrap_or(model);
    let mut grads = GradStore::default();
    let mut all = backward(&loss);
    let mut grad_out = all.remove(&head_in).expect("head input gradient");
    keep(&mut grads, &mut all, &vars);
    drop((all, loss, head_in));
    let ledger = tokens.ledger().clone();
    for seg in segments(model.blocks.len(), k).into_iter().rev() {
        // The segment's work is its first block's part.
        ledger.set_tag(model.blocks[seg.start].tag);
        let xin = inputs.pop().expect("one input per segment").var_from();
        let out = model.blocks_forward(&xin, &mask, seg);
        let mut all = backward(&out.mul(&grad_out).sum_all());
        drop(out);
        grad_out = all.remove(&xin).expect("segment input gradient");
        keep(&mut grads, &mut all, &vars);
    }
    ledger.set_tag(0);
    let x0 = model.embed(tokens);
    let mut all = backward(&x0.mul(&grad_out).sum_all());
    keep(&mut grads, &mut all, &vars);
    grads
}

/// A boundary of the by-block forward (mirror of `by_block::Boundary`).
struct Boundary {
    made: Sym,
    var: u64,
}

/// Mirror of `by_block::boundary`.
fn boundary(x: Sym, cuda: bool) -> (Sym, Option<Boundary>) {
    if !x.track_op() {
        return (x, None);
    }
    let var = x.cut(cuda);
    let id = var.id();
    (var, Some(Boundary { made: x, var: id }))
}

/// What the by-block forward keeps (mirror of `by_block::Forward`).
struct ByBlockForward {
    loss: Sym,
    cuts: Vec<Option<Boundary>>,
}

/// Mirror of `by_block::forward` (`half`: mixed precision's 16-bit type).
fn by_block_forward(
    model: &Transformer,
    half: Option<DType>,
    tokens: &Sym,
    targets: &Sym,
) -> ByBlockForward {
    let copy = half.map(|d| model.cast(d));
    let run = copy.as_ref().unwrap_or(model);
    let masks = run.input_mask(tokens);
    let mut x = run.embed(tokens);
    let layers = run.blocks.len();
    let mut cuts = Vec::with_capacity(layers + 1);
    // A boundary is cut as the part that made it (the embedding's under tag 0, a block's
    // under its tag), so that each layer's work stays its own ([`compress`]).
    let ledger = tokens.ledger().clone();
    for i in 0..layers {
        ledger.set_tag(if i == 0 { 0 } else { run.blocks[i - 1].tag });
        let (input, cut) = boundary(x, model.cuda);
        ledger.set_tag(0);
        cuts.push(cut);
        x = run.blocks_forward(&input, &masks, i..i + 1);
    }
    ledger.set_tag(run.blocks.last().map_or(0, |b| b.tag));
    let (input, cut) = boundary(x, model.cuda);
    ledger.set_tag(0);
    cuts.push(cut);
    let logits = run.head_forward(&input);
    drop(input);
    let loss = match half {
        Some(_) => model.train_loss(&logits.to_dtype(DType::F32), targets),
        None => model.train_loss(&logits, targets),
    };
    drop(logits);
    drop(masks);
    drop(copy);
    ByBlockForward { loss, cuts }
}

/// Mirror of `by_block::take_cut`.
fn take_cut(all: &GradStore, below: Option<&Option<Boundary>>) -> Option<Sym> {
    match below {
        Some(Some(b)) => Some(all.get_id(b.var).expect("boundary gradient").clone()),
        _ => None,
    }
}

/// Mirror of `by_block::backward`; `tags`: each boundary's part (the embedding's 0, then the
/// blocks'), under which its seed and backward allocate.
fn by_block_backward(model: &Transformer, fwd: ByBlockForward) -> GradStore {
    let ByBlockForward { loss, mut cuts } = fwd;
    let vars = model.vars.clone();
    let ledger = loss.ledger().clone();
    let mut grads = GradStore::default();
    let mut all = backward(&loss);
    drop(loss);
    let mut upstream = take_cut(&all, cuts.last());
    keep(&mut grads, &mut all, &vars);
    drop(all);
    while let Some(Some(b)) = cuts.pop() {
        // Boundary i is block i's input: the part below it is block i − 1 (or the embedding).
        let part = cuts.len();
        ledger.set_tag(if part == 0 {
            0
        } else {
            model.blocks[part - 1].tag
        });
        let g = upstream
            .take()
            .expect("a gradient for every tracked boundary");
        let root = b.made.seed(g);
        drop(b);
        let mut all = backward(&root);
        drop(root);
        upstream = take_cut(&all, cuts.last());
        keep(&mut grads, &mut all, &vars);
    }
    ledger.set_tag(0);
    grads
}

/// Replayed peaks of one case, in bytes above each window's baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replay {
    /// Training forward: its peak, and the graph it keeps for backward.
    pub forward_peak: u64,
    pub forward_retained: u64,
    /// `loss.backward()` peak above the graph.
    pub backward_peak: u64,
    /// What backward leaves after pruning the store to the parameters' gradients, minus what
    /// it used up (the checkpointed forward's kept tensors).
    pub backward_retained: i64,
    /// No-graph forward to the logits: peak and what stays (the logits).
    pub inference_peak: u64,
    pub inference_retained: u64,
    /// Prefill (the prompt into the key/value cache) and decode (T tokens), above their
    /// baselines; decode's retained is the cache growth (or the grown prefix without a cache).
    pub prefill_peak: u64,
    pub prefill_retained: u64,
    pub decode_peak: u64,
    pub decode_retained: i64,
}

/// Mirror of the runner's prefill and decode windows: their peaks and what they keep.
fn generation(
    ledger: &Rc<Ledger>,
    model: &Transformer,
    tokens: &Sym,
    shape: &Shape,
) -> (u64, u64, u64, i64) {
    let mut cache: Vec<Option<(Sym, Sym)>> = Vec::new();
    let base = ledger.reset_peak();
    ledger.set_stage("prefill");
    let next = {
        let logits = model.forward_cached(tokens, &mut cache);
        logits.argmax_last()
    };
    let prefill_peak = ledger.window_peak(base);
    let prefill_retained = ledger.current() - base;
    let base = ledger.reset_peak();
    ledger.set_stage("decode");
    let mut next = next;
    let mut prefix = tokens.clone();
    for _ in 0..shape.decode_tokens {
        let token = next.unsqueeze(1);
        let logits = if shape.kv_cache {
            model.forward_cached(&token, &mut cache)
        } else {
            prefix = Sym::cat(&[&prefix, &token], 1);
            model.forward_cached(&prefix, &mut Vec::new())
        };
        drop(token);
        next = logits.argmax_last();
    }
    let decode_peak = ledger.window_peak(base);
    let decode_retained = ledger.current() as i64 - base as i64;
    ledger.set_stage("done");
    drop((cache, next, prefix));

    (prefill_peak, prefill_retained, decode_peak, decode_retained)
}

/// One decode step of the serving model over a key/value cache already holding `cached`
/// tokens per sequence (the case's batch): the serving weights' bytes (with metadata), the
/// cache's bytes, and the step's peak above them (the grown cache, the keys and values
/// repeated to the query heads for one layer at a time, the scores of one query).
pub fn decode_step(
    shape: &Shape,
    cached: usize,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> (u64, u64, u64) {
    decode_step_compressed(shape, cached, meta_per_tensor, gemm_threads)
        .unwrap_or_else(|| decode_step_full(shape, cached, meta_per_tensor, gemm_threads))
}

/// [`decode_step`] compressed ([`compressed`]).
fn decode_step_compressed(
    shape: &Shape,
    cached: usize,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> Option<(u64, u64, u64)> {
    compressed(
        shape,
        meta_per_tensor,
        gemm_threads,
        false,
        |l, slots, _| decode_step_on(l, shape, cached, slots),
    )
}

/// [`decode_step`] through every layer.
fn decode_step_full(
    shape: &Shape,
    cached: usize,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> (u64, u64, u64) {
    let ledger = Ledger::new(meta_per_tensor, gemm_threads);
    decode_step_on(&ledger, shape, cached, &all_layers(shape))
}

/// [`decode_step`] of the layers `slots` on `ledger`.
fn decode_step_on(
    ledger: &Rc<Ledger>,
    shape: &Shape,
    cached: usize,
    slots: &[Slot],
) -> (u64, u64, u64) {
    let model = Transformer::with_layers(ledger, shape, false, slots, None);
    let weights = ledger.current();
    let (g, d) = shape.kv_dims();
    let b = shape.b as usize;
    // Keys and values `(B, G, T, D)`; MLA: the latent `(B, 1, T, L)` and the shared rotary
    // key `(B, 1, T, r)`.
    let (kd, vd) = match shape.llama.and_then(|l| l.mla) {
        Some(m) => (
            [b, 1, cached, m.kv_lora_rank],
            [b, 1, cached, m.qk_rope_head_dim],
        ),
        None => (
            [b, g as usize, cached, d as usize],
            [b, g as usize, cached, d as usize],
        ),
    };
    // A sliding layer's cache holds the last W tokens.
    let mut cache: Vec<Option<(Sym, Sym)>> = slots
        .iter()
        .map(|&Slot { layer, tag }| {
            ledger.set_tag(tag);
            let t = shape
                .llama
                .and_then(|l| l.window_at(layer))
                .map_or(cached, |w| cached.min(w));
            let (mut kd, mut vd) = (kd, vd);
            kd[2] = t;
            vd[2] = t;
            Some((
                Sym::new(ledger, &kd, model.dtype),
                Sym::new(ledger, &vd, model.dtype),
            ))
        })
        .collect();
    ledger.set_tag(0);
    let token = Sym::new(ledger, &[shape.b as usize, 1], DType::U32);
    let cache_bytes = ledger.current() - weights;
    let base = ledger.reset_peak();
    let logits = model.forward_cached(&token, &mut cache);
    let peak = ledger.window_peak(base);
    drop((logits, cache, token));
    (weights, cache_bytes, peak)
}

/// The runner's synthetic input and targets: tokens and next tokens `(B, S)`, or images
/// `(B, C, I, I)` f32 and classes `(B, 1)`.
fn inputs(ledger: &Rc<Ledger>, shape: &Shape) -> (Sym, Sym) {
    let (b, s) = (shape.b as usize, shape.s as usize);
    match shape.vision {
        None => (
            Sym::new(ledger, &[b, s], DType::U32),
            Sym::new(ledger, &[b, s], DType::U32),
        ),
        Some(v) => (
            Sym::new(ledger, &[b, v.channels, v.image, v.image], DType::F32),
            Sym::new(ledger, &[b, 1], DType::U32),
        ),
    }
}

/// The training forward and backward of one case, in bytes above each window's baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Training {
    pub forward_peak: u64,
    pub forward_retained: u64,
    pub backward_peak: u64,
    pub backward_retained: i64,
}

/// The serving model's windows: the inference forward, prefill and decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Serving {
    pub inference_peak: u64,
    pub inference_retained: u64,
    pub prefill_peak: u64,
    pub prefill_retained: u64,
    pub decode_peak: u64,
    pub decode_retained: i64,
}

/// Replays the training forward and backward, and the inference forward, of `shape`.
/// `meta_per_tensor` is the bookkeeping charged per live tensor.
pub fn replay(shape: &Shape, meta_per_tensor: u64, gemm_threads: Option<usize>) -> Replay {
    let t = replay_training(shape, meta_per_tensor, gemm_threads);
    let s = replay_serving(shape, meta_per_tensor, gemm_threads);
    Replay {
        forward_peak: t.forward_peak,
        forward_retained: t.forward_retained,
        backward_peak: t.backward_peak,
        backward_retained: t.backward_retained,
        inference_peak: s.inference_peak,
        inference_retained: s.inference_retained,
        prefill_peak: s.prefill_peak,
        prefill_retained: s.prefill_retained,
        decode_peak: s.decode_peak,
        decode_retained: s.decode_retained,
    }
}

/// The training forward and backward of `shape` (the forward, backward and train-step phases),
/// through a few layers of each long run of identical layers ([`compress`]); byte for byte
/// [`replay_training_full`].
pub fn replay_training(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> Training {
    training_compressed(shape, meta_per_tensor, gemm_threads)
        .unwrap_or_else(|| replay_training_full(shape, meta_per_tensor, gemm_threads))
}

/// A replay's figures in a fixed order, as [`compressed`] extrapolates them, and which of them
/// are window peaks: `(figure, window)`.
trait Figures: Sized {
    const PEAKS: &'static [(usize, usize)];
    fn to_vec(&self) -> Vec<i128>;
    fn from_vec(f: &[i128]) -> Self;
}

impl Figures for Training {
    const PEAKS: &'static [(usize, usize)] = &[(0, 0), (2, 1)];
    fn to_vec(&self) -> Vec<i128> {
        vec![
            self.forward_peak as i128,
            self.forward_retained as i128,
            self.backward_peak as i128,
            self.backward_retained as i128,
        ]
    }
    fn from_vec(f: &[i128]) -> Self {
        Training {
            forward_peak: f[0] as u64,
            forward_retained: f[1] as u64,
            backward_peak: f[2] as u64,
            backward_retained: f[3] as i64,
        }
    }
}

impl Figures for Serving {
    const PEAKS: &'static [(usize, usize)] = &[(0, 0), (2, 1), (4, 2)];
    fn to_vec(&self) -> Vec<i128> {
        vec![
            self.inference_peak as i128,
            self.inference_retained as i128,
            self.prefill_peak as i128,
            self.prefill_retained as i128,
            self.decode_peak as i128,
            self.decode_retained as i128,
        ]
    }
    fn from_vec(f: &[i128]) -> Self {
        Serving {
            inference_peak: f[0] as u64,
            inference_retained: f[1] as u64,
            prefill_peak: f[2] as u64,
            prefill_retained: f[3] as u64,
            decode_peak: f[4] as u64,
            decode_retained: f[5] as i64,
        }
    }
}

/// [`decode_step`]'s weights, cache and step peak (one window).
impl Figures for (u64, u64, u64) {
    const PEAKS: &'static [(usize, usize)] = &[(2, 0)];
    fn to_vec(&self) -> Vec<i128> {
        vec![self.0 as i128, self.1 as i128, self.2 as i128]
    }
    fn from_vec(f: &[i128]) -> Self {
        (f[0] as u64, f[1] as u64, f[2] as u64)
    }
}

/// `run` (a replay of the layers, and routed experts, it is given on a recording ledger) at
/// every corner of `shape`'s [`compress::Plan`], extrapolated to the real depth (`experts`:
/// compress the experts too). `None` when nothing is compressed or the corners disagree.
fn compressed<F: Figures>(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
    experts: bool,
    run: impl Fn(&Rc<Ledger>, &[Slot], Option<&[usize]>) -> F,
) -> Option<F> {
    let plan = compress::Plan::of(shape, experts)?;
    let corners: Vec<compress::Corner> = plan
        .corners()
        .map(|c| {
            let (slots, experts, parts) = plan.slots(c);
            let ledger = Ledger::new(meta_per_tensor, gemm_threads);
            ledger.record();
            let figures = run(&ledger, &slots, experts.as_deref()).to_vec();
            compress::Corner {
                figures,
                windows: ledger.recorded(),
                parts,
            }
        })
        .collect();
    compress::extrapolate(&plan, &corners, F::PEAKS).map(|f| F::from_vec(&f))
}

/// [`replay_training`] compressed ([`compressed`]).
fn training_compressed(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> Option<Training> {
    compressed(shape, meta_per_tensor, gemm_threads, true, |l, slots, e| {
        training_on(l, shape, slots, e)
    })
}

/// The training replay through every layer.
pub fn replay_training_full(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> Training {
    let ledger = Ledger::new(meta_per_tensor, gemm_threads);
    let slots = all_layers(shape);
    training_on(&ledger, shape, &slots, None)
}

/// [`replay_training_full`] recording every change of the live bytes ([`Ledger::start_trace`]):
/// the stages `setup` (the model and the batch, before the window), `forward`, `backward` and
/// `done` (the gradients dropped).
pub fn trace_training(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> (Training, Vec<crate::formula::symbolic::Event>) {
    let ledger = Ledger::new(meta_per_tensor, gemm_threads);
    ledger.start_trace();
    let slots = all_layers(shape);
    let t = training_on(&ledger, shape, &slots, None);
    (t, ledger.take_trace())
}

/// Every layer of `shape`, tagged by its index + 1.
fn all_layers(shape: &Shape) -> Vec<Slot> {
    (0..shape.l as usize)
        .map(|layer| Slot {
            layer,
            tag: layer as u32 + 1,
        })
        .collect()
}

/// The training replay of the layers `slots` on `ledger`.
fn training_on(
    ledger: &Rc<Ledger>,
    shape: &Shape,
    slots: &[Slot],
    experts: Option<&[usize]>,
) -> Training {
    ledger.set_stage("setup");
    let model = Transformer::with_layers(ledger, shape, true, slots, experts);
    let (tokens, targets) = inputs(ledger, shape);
    let k = shape.checkpoint as usize;
    let base = ledger.reset_peak();
    ledger.set_stage("forward");
    let (forward_peak, forward_retained, backward_peak, backward_retained);
    if k == 0 && shape.by_block {
        let fwd = by_block_forward(
            &model,
            shape.mixed.then_some(DType::Half),
            &tokens,
            &targets,
        );
        forward_peak = ledger.window_peak(base);
        forward_retained = ledger.current() - base;
        let base = ledger.reset_peak();
        ledger.set_stage("backward");
        let grads = by_block_backward(&model, fwd);
        backward_peak = ledger.window_peak(base);
        backward_retained = ledger.current() as i64 - base as i64;
        ledger.set_stage("done");
        drop(grads);
    } else if k == 0 {
        let loss = if shape.mixed {
            // The runner's mixed-precision loss: a 16-bit working copy, the loss in f32.
            let half = model.cast(DType::Half);
            let logits = half.forward(&tokens);
            model.train_loss(&logits.to_dtype(DType::F32), &targets)
        } else {
            model.train_loss(&model.forward(&tokens), &targets)
        };
        forward_peak = ledger.window_peak(base);
        forward_retained = ledger.current() - base;
        let base = ledger.reset_peak();
        ledger.set_stage("backward");
        let mut all = backward(&loss);
        backward_peak = ledger.window_peak(base);
        let kept: Vec<Sym> = model.vars.iter().filter_map(|v| all.remove(v)).collect();
        drop(all);
        backward_retained = ledger.current() as i64 - base as i64;
        ledger.set_stage("done");
        drop(loss);
        drop(kept);
    } else {
        let fwd = if shape.mixed {
            // Mirror of `checkpoint::forward_mixed`.
            let half = model.cast(DType::Half);
            let detached = half.detached();
            let mut f = ckpt_forward(&half, &detached, &tokens, &targets, k, true);
            f.half = Some(half);
            f
        } else {
            let detached = model.detached();
            ckpt_forward(&model, &detached, &tokens, &targets, k, false)
        };
        forward_peak = ledger.window_peak(base);
        forward_retained = ledger.current() - base;
        let base = ledger.reset_peak();
        ledger.set_stage("backward");
        let grads = ckpt_backward(&model, fwd, &tokens, k);
        backward_peak = ledger.window_peak(base);
        backward_retained = ledger.current() as i64 - base as i64;
        ledger.set_stage("done");
        drop(grads);
    }
    Training {
        forward_peak,
        forward_retained,
        backward_peak,
        backward_retained,
    }
}

/// The serving model of `shape`: its inference forward, then (a decoder) prefill and decode;
/// compressed as [`replay_training`] is, byte for byte [`replay_serving_full`].
pub fn replay_serving(shape: &Shape, meta_per_tensor: u64, gemm_threads: Option<usize>) -> Serving {
    serving_compressed(shape, meta_per_tensor, gemm_threads)
        .unwrap_or_else(|| replay_serving_full(shape, meta_per_tensor, gemm_threads))
}

/// [`replay_serving`] compressed ([`compressed`]).
fn serving_compressed(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> Option<Serving> {
    compressed(
        shape,
        meta_per_tensor,
        gemm_threads,
        false,
        |l, slots, _| serving_on(l, shape, slots),
    )
}

/// [`replay_serving_full`] recording every change of the live bytes ([`Ledger::start_trace`]):
/// the stages `setup` (the serving model and the prompt), `inference`, `between` (its logits
/// dropped), `prefill`, `decode` and `done`.
pub fn trace_serving(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> (Serving, Vec<crate::formula::symbolic::Event>) {
    let ledger = Ledger::new(meta_per_tensor, gemm_threads);
    ledger.start_trace();
    let s = serving_on(&ledger, shape, &all_layers(shape));
    (s, ledger.take_trace())
}

/// The serving replay through every layer.
pub fn replay_serving_full(
    shape: &Shape,
    meta_per_tensor: u64,
    gemm_threads: Option<usize>,
) -> Serving {
    let ledger = Ledger::new(meta_per_tensor, gemm_threads);
    serving_on(&ledger, shape, &all_layers(shape))
}

/// The serving replay of the layers `slots` on `ledger`.
fn serving_on(ledger: &Rc<Ledger>, shape: &Shape, slots: &[Slot]) -> Serving {
    ledger.set_stage("setup");
    let model = Transformer::with_layers(ledger, shape, false, slots, None);
    let (tokens, _) = inputs(ledger, shape);
    let base = ledger.reset_peak();
    ledger.set_stage("inference");
    let logits = model.forward(&tokens);
    let inference_peak = ledger.window_peak(base);
    let inference_retained = ledger.current() - base;
    ledger.set_stage("between");
    drop(logits);
    // A ViT does not generate (the workload refuses prefill and decode).
    let (prefill_peak, prefill_retained, decode_peak, decode_retained) = match shape.vision {
        None => generation(ledger, &model, &tokens, shape),
        Some(_) => (0, 0, 0, 0),
    };
    Serving {
        inference_peak,
        inference_retained,
        prefill_peak,
        prefill_retained,
        decode_peak,
        decode_retained,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(b: u64, s: u64, h: u64, a: u64, l: u64, v: u64) -> Shape {
        Shape::new(b, s, h, a, l, v, s)
    }

    /// The replayed graph is the closed form's activation data, byte for byte, on shapes with
    /// one head, odd heads, odd sequence lengths and a position table longer than the sequence.
    #[test]
    fn replayed_graph_equals_the_closed_form() {
        let mut shapes = vec![
            shape(2, 77, 120, 5, 3, 1000),
            shape(1, 33, 96, 3, 2, 300),
            shape(3, 50, 48, 1, 2, 97),
            shape(1, 1, 8, 2, 1, 5),
        ];
        let mut long = shape(2, 10, 16, 2, 2, 30);
        long.s_max = 64;
        shapes.push(long);
        for s in shapes {
            let r = replay(&s, 0, None);
            assert_eq!(r.forward_retained, s.activation_data_bytes(), "{s:?}");
        }
    }

    /// The same for ViT shapes: odd heads, one head, batch 1 (no class-token copy), one
    /// channel.
    #[test]
    fn replayed_vit_graph_equals_the_closed_form() {
        use crate::model::vit::Vision;
        for (b, image, patch, channels, h, a, l, k) in [
            (3, 24, 6, 3, 60, 5, 3, 7),
            (1, 32, 8, 3, 96, 3, 2, 10),
            (2, 16, 4, 1, 32, 1, 2, 5),
        ] {
            let vis = Vision {
                image,
                patch,
                channels,
            };
            let s = vis.seq() as u64;
            let mut shape = Shape::new(b, s, h, a, l, k, s);
            shape.vision = Some(vis);
            let r = replay(&shape, 0, None);
            assert_eq!(
                r.forward_retained,
                shape.activation_data_bytes(),
                "{shape:?}"
            );
        }
    }

    /// Where the vocabulary dominates, the backward peak is the closed-form head point.
    #[test]
    fn head_point_matches_the_closed_form() {
        let s = shape(2, 64, 64, 2, 1, 8192);
        let r = replay(&s, 0, None);
        assert_eq!(r.backward_peak, s.backward_head_bytes());
    }

    /// After pruning, backward leaves exactly the parameters' gradients (4 bytes each).
    #[test]
    fn backward_leaves_the_gradients() {
        for s in [shape(2, 77, 120, 5, 3, 1000), shape(3, 50, 48, 1, 2, 97)] {
            let r = replay(&s, 0, None);
            assert_eq!(r.backward_retained, 4 * s.params() as i64, "{s:?}");
        }
    }

    /// The tiled attention's middle tiles stood in for (`Graph::skipped`) give what computing
    /// every tile gives, byte for byte: training and serving, causal and not, sequences of
    /// one tile, two, a partial last tile and many, CPU and CUDA.
    #[test]
    fn tiles_stood_in_for_are_exact() {
        use crate::formula::symbolic::replay_every_tile;
        use crate::model::tiled_attention::TILE;
        // Training and serving of `s` (tiled, 2 decode tokens), fast and computing every tile.
        let check = |mut s: Shape, cpu: bool, what: &str| {
            s.tiled = true;
            s.cpu = cpu;
            s.decode_tokens = 2;
            let gemm = cpu.then_some(2);
            let both = || {
                (
                    replay_training_full(&s, 240, gemm),
                    replay_serving_full(&s, 240, gemm),
                )
            };
            let fast = both();
            replay_every_tile(true);
            let every = both();
            replay_every_tile(false);
            assert_eq!(fast, every, "{what}, cpu {cpu}");
        };
        for s_len in [5, TILE, 2 * TILE + 3, 4 * TILE, 5 * TILE + 37] {
            for cpu in [true, false] {
                check(
                    shape(2, s_len as u64, 24, 3, 2, 50),
                    cpu,
                    &format!("S {s_len}"),
                );
            }
        }
        let mut vit = shape(2, 17, 24, 3, 2, 10);
        vit.vision = Some(crate::model::vit::Vision {
            image: 64,
            patch: 4,
            channels: 3,
        });
        vit.s = 257;
        vit.s_max = 257;
        vit.tiled = true;
        let fast = replay_training_full(&vit, 240, None);
        replay_every_tile(true);
        let every = replay_training_full(&vit, 240, None);
        replay_every_tile(false);
        assert_eq!(fast, every, "ViT (not causal)");
        // Sliding windows (the Mistral fixture: 4 query heads over 2 key heads), shorter and
        // longer than a tile: the tiles' key ranges grow, then slide; a tile across two heads'
        // rows reads every key (wider than the last full tile: computed, not stood in for).
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/mistral/config.json");
        let cfg = crate::model::hf_config::load(&path).unwrap().cfg;
        for window in [4, 100, 300] {
            for s_len in [TILE, 2 * TILE + 3, 5 * TILE + 37] {
                for cpu in [true, false] {
                    let mut s = Shape::new(2, s_len as u64, 32, 4, 2, 64, s_len as u64);
                    let mut llama = cfg.llama.unwrap();
                    llama.sliding_window = Some(window);
                    s.llama = Some(llama);
                    check(s, cpu, &format!("window {window}, S {s_len}"));
                }
            }
        }
    }

    /// Inference keeps only the logits.
    #[test]
    fn inference_keeps_the_logits() {
        let s = shape(2, 40, 64, 4, 2, 500);
        let r = replay(&s, 0, None);
        assert_eq!(r.inference_retained, 4 * 2 * 40 * 500);
        assert!(r.inference_peak > r.inference_retained);
    }
}
