//! The model on symbolic tensors: the blocks are the model's own ([`crate::model::transformer`]
//! run on [`Sym`]), made of the replay's weights ([`Params`]); the stems, the head and the
//! losses of the GPT, ViT and LLaMA families are still stated here (issue 50).

use std::rc::Rc;

use super::*;
use crate::model::mlp::Glu;
use crate::model::proj::Lora;

/// candle-nn `ops::log_softmax`.
pub(super) fn log_softmax(xs: &Sym, d: usize) -> Sym {
    let max = xs.max_keepdim(d);
    let diff = xs.broadcast_sub(&max);
    let sum_exp = diff.exp().sum_keepdim(&[d]);
    diff.broadcast_sub(&sum_exp.log())
}

/// candle-nn `loss::cross_entropy` (log-softmax, then `nll`).
pub(super) fn cross_entropy(inp: &Sym, target: &Sym) -> Sym {
    let inp = log_softmax(inp, 1);
    inp.gather(&target.unsqueeze(1), 1).sum_all().affine(-1.0)
}

/// The model's block attention, feed-forward part and block on symbolic tensors (the
/// replay's mixture of experts, which routes as it is told).
pub(super) type SelfAttention = crate::model::transformer::SelfAttention<Sym>;
pub(super) type Ffn = crate::model::transformer::Ffn<Sym, moe::Moe>;
type ModelBlock = crate::model::transformer::Block<Sym, moe::Moe>;

impl crate::model::transformer::MoeLayer<Sym> for moe::Moe {
    fn forward(&self, x: &Sym) -> candle_core::Result<Sym> {
        Ok(moe::Moe::forward(self, x))
    }
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

    pub(super) fn map(&self, f: &dyn Fn(&Linear) -> Linear, w: &dyn Fn(&Sym) -> Sym) -> Self {
        match self {
            SelfAttention::Mha(a) => SelfAttention::Mha(attention::map(a, f, w)),
            SelfAttention::Mla(a) => SelfAttention::Mla(mla::map(a, f, w)),
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

    pub(super) fn map(&self, f: &dyn Fn(&Linear) -> Linear) -> Self {
        match self {
            Ffn::Dense(m) => Ffn::Dense(m.map_projs(&|p| Ok(f(p))).sure()),
            Ffn::Moe(m) => Ffn::Moe(Box::new(m.map(f))),
        }
    }
}

/// A block of the model with what the replay adds: whether it slides and its ledger tag.
pub(super) struct Block {
    pub(super) block: ModelBlock,
    /// Its attention slides (takes the windowed mask).
    pub(super) windowed: bool,
    /// Its ledger tag (`compress`): what it allocates, forward and backward, is its segment.
    pub(super) tag: u32,
}

impl std::ops::Deref for Block {
    type Target = ModelBlock;
    fn deref(&self) -> &ModelBlock {
        &self.block
    }
}

/// Mirror of the model's `Masks`.
#[derive(Default)]
pub struct Masks {
    pub(super) full: Option<Sym>,
    pub(super) sliding: Option<Sym>,
}

impl Masks {
    pub(super) fn at(&self, windowed: bool) -> Option<&Sym> {
        if windowed {
            self.sliding.as_ref()
        } else {
            self.full.as_ref()
        }
    }
}

impl Block {
    pub(super) fn forward(&self, x: &Sym, mask: Option<&Sym>, rotary: Option<Rotary>) -> Sym {
        self.block.forward(x, mask, rotary).sure()
    }

    pub(super) fn forward_cached(
        &self,
        x: &Sym,
        mask: Option<&Sym>,
        rotary: Option<Rotary>,
        cache: &mut Option<(Sym, Sym)>,
    ) -> Sym {
        self.block.forward_cached(x, mask, rotary, cache).sure()
    }

    /// The block's projections in model order.
    pub(super) fn linears(&self) -> Vec<&Linear> {
        let mut v = self.attn.linears();
        v.extend(self.mlp.linears());
        v
    }
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

/// Mirror of the model's `Stem`.
pub(super) enum Stem {
    Tokens(Sym),
    Patches {
        proj: Linear,
        cls: Sym,
        patch: usize,
    },
}

/// Mirror of `vit::patchify`: `(B, C, I, I)` → `(B, N, C·p²)` (the last reshape copies).
pub(super) fn patchify(images: &Sym, p: usize) -> Sym {
    let d = images.dims();
    let (b, c, nh, nw) = (d[0], d[1], d[2] / p, d[3] / p);
    images
        .reshape(&[b, c, nh, p, nw, p])
        .permute(&[0, 2, 4, 1, 3, 5])
        .reshape(&[b, nh * nw, c * p * p])
}

/// The model's weights and forward.
pub struct Transformer {
    pub(super) stem: Stem,
    pub(super) wpe: Option<Sym>,
    /// LLaMA's rotary tables cos, sin `(S_max, D/2)`.
    pub(super) rope: Option<(Sym, Sym)>,
    /// Gemma's sliding layers' own tables.
    pub(super) rope_local: Option<(Sym, Sym)>,
    /// Gemma: the token embedding times √H (an affine copy).
    pub(super) embed_scale: bool,
    /// gpt-oss: its attention adds the mask tensor whatever the kernels (the sinks' softmax is
    /// composed).
    pub(super) sinks: bool,
    pub(super) blocks: Vec<Block>,
    pub(super) ln_f: Norm,
    pub(super) head: Linear,
    pub(super) tied: bool,
    pub(super) hidden: usize,
    pub(super) dtype: DType,
    pub(super) vars: Vec<Sym>,
    pub(super) kernels: Kernels,
    /// On CUDA (the fused cross-entropy keeps one f32 per row between its two launches).
    pub(super) cuda: bool,
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
        let gemma = shape.llama.and_then(|l| l.gemma);
        let norm = |n: usize, rms: bool| p.norm(n, rms, gemma.is_some());
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
                        let router = p.linear(h, m.experts, shape.llama.is_some_and(|l| l.oss));
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
                            expert_ids,
                            shared: shared_mlp,
                            shared_gate,
                            shape: *m,
                            routing,
                            worst: shape.worst_routing,
                            fused: shape.kernels.fused(),
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
                    block: ModelBlock {
                        ln1,
                        attn,
                        ln2,
                        mlp,
                        post,
                    },
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
            for l in b.linears() {
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
    pub(super) fn rotary(&self, block: &Block, offset: usize) -> Option<Rotary<'_>> {
        let tables = match &self.rope_local {
            Some(local) if block.windowed => Some(local),
            _ => self.rope.as_ref(),
        };
        tables.map(|(cos, sin)| Rotary { cos, sin, offset })
    }

    /// Mirror of the model's `tokens`: the embedding (Gemma: times √H, the rows freed).
    pub(super) fn tokens(&self, wte: &Sym, input: &Sym) -> Sym {
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
    pub(super) fn masks(&self, tokens: &Sym, s: usize) -> Masks {
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
    pub(super) fn needs_mask(&self) -> bool {
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
                let x = proj.forward(&patches).sure();
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
            Stem::Tokens(_) => self.ln_f.forward(x).sure(),
            Stem::Patches { .. } => self.ln_f.forward(&x.narrow(1, 0, 1).contiguous()).sure(),
        };
        self.head.forward(&x).sure()
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
    pub(super) fn map(&self, f: &dyn Fn(&Sym) -> Sym, dtype: DType) -> Transformer {
        let lin = |l: &Linear| proj::map(l, f, f);
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
                let ln1 = lift(&b.ln1, f);
                let attn = b.attn.map(&lin, f);
                let ln1_post = b.post.as_ref().map(|p| lift(&p.0, f));
                let ln2 = lift(&b.ln2, f);
                let mlp = b.mlp.map(&lin);
                let post = ln1_post.zip(b.post.as_ref().map(|p| lift(&p.1, f)));
                Block {
                    block: ModelBlock {
                        ln1,
                        attn,
                        ln2,
                        mlp,
                        post,
                    },
                    windowed: b.windowed,
                    tag: b.tag,
                }
            })
            .collect();
        ledger.set_tag(0);
        let ln_f = lift(&self.ln_f, f);
        let head = match (&stem, self.tied) {
            (Stem::Tokens(wte), true) => Linear {
                weight: wte.clone(),
                bias: None,
                lora: None,
                frozen: None,
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
