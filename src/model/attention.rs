//! Multi-head self-attention: standard (composed or fused probabilities), efficient (the CPU
//! op) or tiled (the composition of ordinary ops), with grouped-query K/V heads, rotary
//! positions, and its step with a key/value cache (`forward_cached`).

use candle_core::{Result, Tensor};

use super::config::{Config, ProjSpec};
use super::kernels::Kernel;
pub use super::mask::{causal_mask, windowed_mask};
use super::norm::Norm;
use super::proj::Proj;
use super::rotary;
use super::tensor_ops::{self, Map, TensorOps};
use super::weights::Weights;

/// `norm(x)` for an x nothing else reads: released when the norm holds its f32 copy instead
/// (transformers keeps a 16-bit projection's f32 copy, not the projection).
fn releasing<T: TensorOps>(norm: &Norm<T>, x: &T) -> Result<T> {
    let y = norm.forward(x)?;
    x.release_if(norm.holds_f32_copy(x))?;
    Ok(y)
}

/// Llama 4's `Llama4TextL2Norm` of `x` over its last dimension, `x·rsqrt(mean(x²) + eps)`, no
/// weight: the RMSNorm of `core`'s kernels with a detached weight of ones (transformers': the
/// normalisation in f32 of x's f32 copy, cast back, [`Kernel::RmsNormalise`]).
fn l2_norm<T: TensorOps>(x: &T, eps: f64, core: &Core) -> Result<T> {
    let xd = x.detach();
    let ones = super::norm::unit_weight(&xd)?;
    let eps = eps as f32;
    match (core.fused, core.torch) {
        (true, true) => {
            let x32 = xd.upcast()?;
            T::kernel(Kernel::RmsNormalise { eps }, &[x, &ones, &x32])
        }
        (true, false) => T::kernel(Kernel::RmsNorm { eps }, &[x, &ones]),
        (false, _) => tensor_ops::rms_norm_slow(x, &ones, eps),
    }
}

/// Llama 4's query temperature at position `pos` (transformers' f32 arithmetic):
/// `ln(1 + ⌊(pos + 1)/floor_scale⌋)·attn_scale + 1`.
pub fn temperature(pos: usize, floor_scale: f64, attn_scale: f64) -> f32 {
    ((pos as f32 + 1.0) / floor_scale as f32).floor().ln_1p() * attn_scale as f32 + 1.0
}

/// The rotary tables of a LLaMA model and the position of the first token: what a block needs
/// to embed positions.
#[derive(Debug)]
pub struct Rotary<'a, T = Tensor> {
    pub cos: &'a T,
    pub sin: &'a T,
    pub offset: usize,
}

impl<T> Clone for Rotary<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Rotary<'_, T> {}

impl<T: TensorOps> Rotary<'_, T> {
    /// `x (B, n, S, D)` rotated at positions `offset..offset + S`: the fused kernel, or the
    /// composed [`rotary::apply_rotary`].
    pub fn apply(&self, x: &T, fused: bool) -> Result<T> {
        let (d, width) = (x.dims()[3], 2 * self.cos.dims()[1]);
        if width < d {
            // A partial rotary (GLM-4.5): the first `width` of each head rotated, the rest
            // passed through, then joined (`cat`, as transformers' `apply_rotary_pos_emb`).
            // (The passed part copied first: candle joins contiguous parts into a contiguous
            // tensor, which the attention reads; the copy is freed once joined.)
            let r = self.apply(&x.narrow(3, 0, width)?, fused)?;
            let pass = x.narrow(3, width, d - width)?.contiguous()?;
            return T::cat(&[&r, &pass], 3);
        }
        if fused {
            let s = x.dims()[2];
            let cos = self.cos.narrow(0, self.offset, s)?;
            let sin = self.sin.narrow(0, self.offset, s)?;
            T::kernel(Kernel::Rotary, &[x, &cos, &sin])
        } else {
            rotary::apply_rotary(x, self.cos, self.sin, self.offset)
        }
    }
}

/// The attention itself, after the projections: scores, softmax and the weighted values,
/// standard (composed or fused), efficient or tiled, with its variant flags. Shared by
/// [`Attention`] and MLA ([`super::mla`]).
#[derive(Debug, Clone, Copy)]
pub struct Core {
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) efficient: bool,
    /// [`super::tiled_attention`].
    pub(crate) tiled: bool,
    /// [`super::kernels::attn_probs`] instead of the composed scores, mask and softmax.
    pub(crate) fused: bool,
    /// Kernels keeping what transformers keeps: the fused rotary op's input, which its
    /// backward never reads, released once rotated (transformers' `q·cos + rotate_half(q)·sin`
    /// keeps only the tables).
    pub(crate) torch: bool,
    /// A decoder (causal); the ViT encoder attends everywhere.
    pub(crate) causal: bool,
    /// A sliding window (keys per query, itself included); the cache keeps that many.
    pub(crate) window: Option<usize>,
    /// The attention scale is this over `√Dq` (DeepSeek under YaRN: `mscale²`; else 1).
    pub(crate) scale_mul: f64,
    /// The attention scale itself, whatever `Dq` (Gemma's `query_pre_attn_scalar^-½`).
    pub(crate) scale_abs: Option<f64>,
    /// Gemma 2's soft-capping of the scores ([`Core::attend_capped`]).
    pub(crate) softcap: Option<f64>,
    /// The window is a chunk (Llama 4): the mask tensor (made by the model) hides the other
    /// chunks, so the standard attention is composed whatever the kernels; the cache keeps the
    /// current chunk.
    pub(crate) chunked: bool,
}

impl Core {
    /// The variant flags of `cfg` for `heads` query and `kv_heads` key/value heads in layer
    /// `layer` (its window).
    pub(crate) fn new(cfg: &Config, layer: usize, heads: usize, kv_heads: usize) -> Self {
        Self {
            heads,
            kv_heads,
            efficient: cfg.efficient_attention,
            tiled: cfg.tiled_attention,
            fused: cfg.kernels.fused(),
            torch: cfg.kernels.torch(),
            causal: cfg.vision.is_none(),
            window: cfg.llama.and_then(|l| l.window_at(layer)),
            scale_mul: super::shapes::RopeScaling::softmax_scale(cfg.rope_scaling.as_ref()),
            scale_abs: cfg
                .llama
                .and_then(|l| l.variant.attention_scale)
                .map(|f| f.0),
            softcap: cfg.llama.and_then(|l| l.variant.attn_softcap).map(|f| f.0),
            chunked: cfg
                .llama
                .is_some_and(|l| l.variant.chunked_attention && l.window_at(layer).is_some()),
        }
    }

    /// The attention scale for queries of width `d`: `scale_mul / √d` (Gemma: its own).
    fn scale(&self, d: usize) -> f32 {
        self.scale_abs
            .unwrap_or_else(|| self.scale_mul / (d as f64).sqrt()) as f32
    }

    /// Queries `(B, A, S, Dq)` against keys `(B, G, S, Dq)` and values `(B, G, S, Dv)` at the
    /// same positions: the tiled, efficient or standard attention, each reading the keys and
    /// values at their own head count (but the composed standard attention, which repeats
    /// them to the query heads as candle-transformers does); the heads merged to `(B, S,
    /// A·Dv)`. The scale is `1/√Dq`.
    pub(crate) fn attend_any<T: TensorOps>(&self, q: T, k: T, v: T, mask: Option<&T>) -> Result<T> {
        if let Some(c) = self.softcap {
            return self.attend_capped(q, k, v, mask, c);
        }
        if self.chunked && (self.efficient || self.tiled) {
            candle_core::bail!(
                "chunked attention (Llama 4) is built into the standard attention only, not the efficient or tiled one"
            )
        }
        let (b, s, d) = (q.dims()[0], q.dims()[2], q.dims()[3]);
        let dv = v.dims()[3];
        if self.tiled {
            let scale = self.scale(d);
            // The op writes `(B, S, A, Dv)`: merging the heads is a view, so the output is
            // kept once (by the op and the output projection).
            let y = T::tiled_attention(&q, &k, &v, scale, self.causal, self.window())?;
            drop((q, k, v));
            return y.reshape(&[b, s, self.heads * dv]);
        }
        if self.efficient {
            // The op takes q, k, v of one shape: narrower values are padded with zeros to
            // `Dq` and the output cut back (as transformers does for flash attention).
            let v = if dv < d {
                let vd = v.dims();
                let pad = v.zeros(&[vd[0], vd[1], vd[2], d - dv])?;
                let padded = T::cat(&[&v, &pad], 3)?;
                drop((v, pad));
                padded
            } else {
                v
            };
            // A decoder is causal whether or not a mask tensor is passed (fused kernels pass
            // none). The op writes `(B, S, A, D)`: merging the heads is a view.
            let scale = self.scale(d);
            let y = T::efficient_attention(&q, &k, &v, scale, self.causal, self.window())?;
            drop((q, k, v));
            let y = if dv < d {
                y.narrow(3, 0, dv)?.contiguous()?
            } else {
                y
            };
            return y.reshape(&[b, s, self.heads * dv]);
        }
        self.attend(q, k, v, mask)
    }

    /// `softmax(q·kᵀ/√Dq + mask)·v` with the heads merged back to `(B, S, A·Dv)`; each
    /// intermediate is freed as soon as the next exists. `k`, `v` `(B, G, T, ·)` at their own
    /// head count.
    ///
    /// Fused: the probabilities in one op ([`super::kernels::attn_probs`]), causal for a decoder
    /// (no mask tensor: a single cached query sees every key, a prompt is masked), made per
    /// key head `(B, G, r·Sq, T)` for its `r` query heads, so `P·v` reads each value head
    /// once. Composed: k and v repeated to the query heads ([`rotary::repeat_kv`]), then
    /// candle's scores, mask and softmax (a chunked layer's, whatever the kernels).
    pub(crate) fn attend<T: TensorOps>(&self, q: T, k: T, v: T, mask: Option<&T>) -> Result<T> {
        let (b, s, d) = (q.dims()[0], q.dims()[2], q.dims()[3]);
        let dv = v.dims()[3];
        if self.fused && !self.chunked {
            let scale = self.scale(d);
            let probs = T::attn_probs(&q, &k, scale, self.causal, self.window)?;
            drop((q, k));
            let y = probs.matmul(&v)?;
            drop((probs, v));
            let y = if self.kv_heads == self.heads {
                y
            } else {
                y.reshape(&[b, self.heads, s, dv])?
            };
            // The heads merged (a copy the output projection reads), then `P·v`'s own output
            // released: neither the product's backward (P and v) nor the copy's reads it, and
            // PyTorch frees it once merged.
            let heads = y.transpose(1, 2)?;
            let copies = !heads.is_contiguous();
            let merged = heads.reshape(&[b, s, self.heads * dv])?;
            drop(heads);
            y.release_if(copies)?;
            return Ok(merged);
        }
        let (k, v) = self.repeat(k, v)?;
        let scores = self.scores(&q, &k)?;
        drop((q, k));
        // The unmasked scores stay (a shadowed binding) until the attention returns.
        let scores = match mask {
            Some(m) => scores.broadcast_add(m)?,
            None => scores,
        };
        let probs = tensor_ops::softmax_last(&scores)?;
        drop(scores);
        let y = probs.matmul(&v)?;
        drop((probs, v));
        y.transpose(1, 2)?.reshape(&[b, s, self.heads * dv])
    }

    /// `(q.matmul(&k.t()?)? * scale)?`: the product passed by value to `*`, freed once scaled.
    fn scores<T: TensorOps>(&self, q: &T, k: &T) -> Result<T> {
        let d = q.dims()[3];
        let product = q.matmul(&k.t()?)?;
        let scaled = product.affine(f64::from(self.scale(d)), 0.0)?;
        drop(product);
        Ok(scaled)
    }

    /// Standard attention with gpt-oss's sinks `(A)`: the scaled, masked scores beside each
    /// head's sink logit (a contiguous `(B, A, Sq, 1)` copy, then one `cat`), a softmax over
    /// both, the sink's column dropped (a view), then `· v`; composed whatever the kernels (the
    /// fused probabilities, the efficient op and the tiled composition have no sink yet:
    /// refused).
    pub(crate) fn attend_sinks<T: TensorOps>(
        &self,
        q: T,
        k: T,
        v: T,
        mask: Option<&T>,
        sinks: &T,
    ) -> Result<T> {
        if self.efficient || self.tiled {
            candle_core::bail!(
                "attention sinks (gpt-oss) are built into the standard attention only, not the efficient or tiled one"
            )
        }
        let (b, s) = (q.dims()[0], q.dims()[2]);
        let dv = v.dims()[3];
        let (k, v) = self.repeat(k, v)?;
        let scores = self.scores(&q, &k)?;
        drop((q, k));
        // The unmasked scores stay (a shadowed binding) until the attention returns.
        let scores = match mask {
            Some(m) => scores.broadcast_add(m)?,
            None => scores,
        };
        let t = scores.dims()[3];
        let sink = sinks
            .reshape(&[1, self.heads, 1, 1])?
            .broadcast_as(&[b, self.heads, s, 1])?
            .contiguous()?;
        let all = T::cat(&[&scores, &sink], 3)?;
        drop((scores, sink));
        let probs = tensor_ops::softmax_last(&all)?;
        drop(all);
        let kept = probs.narrow(3, 0, t)?;
        drop(probs);
        let y = kept.matmul(&v)?;
        drop((kept, v));
        y.transpose(1, 2)?.reshape(&[b, s, self.heads * dv])
    }

    /// Standard attention with Gemma 2's soft-capped scores, as transformers' eager attention:
    /// the scaled scores capped (`c·tanh(s/c)`, [`tensor_ops::soft_cap`]), the mask added, a
    /// softmax, then `· v`; composed whatever the kernels (the fused probabilities, the
    /// efficient op and the tiled composition have no cap: refused).
    pub(crate) fn attend_capped<T: TensorOps>(
        &self,
        q: T,
        k: T,
        v: T,
        mask: Option<&T>,
        cap: f64,
    ) -> Result<T> {
        if self.efficient || self.tiled {
            candle_core::bail!(
                "attention soft-capping (Gemma 2) is built into the standard attention only, not the efficient or tiled one"
            )
        }
        let (b, s) = (q.dims()[0], q.dims()[2]);
        let dv = v.dims()[3];
        let (k, v) = self.repeat(k, v)?;
        let scores = self.scores(&q, &k)?;
        drop((q, k));
        let capped = tensor_ops::soft_cap(scores, cap, self.torch)?;
        let masked = match mask {
            Some(m) => {
                let x = capped.broadcast_add(m)?;
                drop(capped);
                x
            }
            None => capped,
        };
        let probs = tensor_ops::softmax_last(&masked)?;
        drop(masked);
        let y = probs.matmul(&v)?;
        drop((probs, v));
        y.transpose(1, 2)?.reshape(&[b, s, self.heads * dv])
    }

    /// [`Core::attend_any`] runs the efficient CPU op, which reads q, k and v through their
    /// strides (no contiguous head split needed).
    pub(crate) fn reads_strided(&self) -> bool {
        self.efficient && !self.tiled
    }

    /// The sliding window as the kernels take it (0 for none).
    fn window(&self) -> usize {
        self.window.unwrap_or(0)
    }

    /// Keys and values `(B, G, T, ·)` repeated to the query heads ([`rotary::repeat_kv`]).
    fn repeat<T: TensorOps>(&self, k: T, v: T) -> Result<(T, T)> {
        let group = self.heads / self.kv_heads;
        Ok((rotary::repeat_kv(k, group)?, rotary::repeat_kv(v, group)?))
    }
}

/// A layer's cache pair `prev` (if any) with the new `(a, b)` appended along the sequence
/// (`Tensor::cat`, new allocations; the old first part is freed before the second is made).
pub(crate) fn append<T: TensorOps>(prev: Option<(T, T)>, a: T, b: T) -> Result<(T, T)> {
    match prev {
        None => Ok((a, b)),
        Some((pa, pb)) => {
            let a = T::cat(&[&pa, &a], 2)?;
            drop(pa);
            let b = T::cat(&[&pb, &b], 2)?;
            Ok((a, b))
        }
    }
}

/// Multi-head causal self-attention with separate q, k, v, o projections; with `kv_heads` <
/// `heads` (LLaMA's grouped-query attention) k and v have fewer heads and are repeated before
/// the scores ([`rotary::repeat_kv`]).
#[derive(Debug, Clone)]
pub struct Attention<T: TensorOps = Tensor> {
    pub(crate) q: Proj<T>,
    pub(crate) k: Proj<T>,
    pub(crate) v: Proj<T>,
    pub(crate) o: Proj<T>,
    /// Qwen3's RMSNorms of each query and key head (`q_norm`, `k_norm`), before the rotary.
    pub(crate) qk_norm: Option<(Norm<T>, Norm<T>)>,
    /// OLMo 2's q/k norms: over the whole projection, before the heads are split.
    pub(crate) qk_whole: bool,
    /// gpt-oss's attention sinks: a logit per query head ([`Core::attend_sinks`]).
    pub(crate) sinks: Option<T>,
    /// Llama 4's weightless L2 norm of each query and key head, its epsilon ([`l2_norm`]).
    pub(crate) l2_eps: Option<f64>,
    /// Llama 4's query temperature `(floor_scale, attn_scale)` ([`temperature`]).
    pub(crate) temperature: Option<(f64, f64)>,
    /// Qwen3-Next's output gate: q projects each head and its gate, and the attention's
    /// output is multiplied by `sigmoid(gate)` ([`Attention::gated`]).
    pub(crate) output_gate: bool,
    pub(crate) head_dim: usize,
    pub(crate) core: Core,
}

impl<T: TensorOps> Attention<T> {
    /// `projs` are the block's q, k, v, o; `layer` its index.
    pub(crate) fn new<W: Weights<Tensor = T>>(
        cfg: &Config,
        layer: usize,
        projs: &[ProjSpec],
        w: &W,
    ) -> Result<Self> {
        let p = |i: usize| w.proj(&projs[i], cfg);
        Ok(Self {
            q: p(0)?,
            k: p(1)?,
            v: p(2)?,
            o: p(3)?,
            qk_norm: match cfg.llama {
                Some(l) if l.qk_norm => {
                    let (q, k) = l.qk_norm_sizes(cfg.heads);
                    Some((
                        Norm::rms(q, cfg, &w.pp("q_norm"))?,
                        Norm::rms(k, cfg, &w.pp("k_norm"))?,
                    ))
                }
                _ => None,
            },
            qk_whole: cfg.llama.is_some_and(|l| l.variant.qk_norm_whole),
            sinks: match cfg.llama {
                Some(l) if l.variant.attention_sinks => {
                    Some(w.weight(&[cfg.heads], "sinks", candle_nn::Init::Const(0.0))?)
                }
                _ => None,
            },
            l2_eps: cfg
                .llama
                .filter(|l| l.variant.qk_l2_norm && !l.nope_at(layer))
                .map(|_| cfg.layer_norm_eps),
            temperature: cfg
                .llama
                .filter(|l| l.nope_at(layer))
                .and_then(|l| l.variant.attn_temperature)
                .map(|(floor, scale)| (floor.0, scale.0)),
            output_gate: cfg.llama.is_some_and(|l| l.variant.attn_output_gate),
            head_dim: cfg.head_dim(),
            core: Core::new(cfg, layer, cfg.heads, cfg.kv_heads()),
        })
    }
}

impl Attention {
    pub(crate) fn projs_mut(&mut self) -> Vec<&mut Proj> {
        vec![&mut self.q, &mut self.k, &mut self.v, &mut self.o]
    }
}

impl<T: TensorOps> Attention<T> {
    /// A copy with `base` on the weights and sinks, `norm` on the q/k norms' weights and
    /// `adapter` on LoRA's A and B.
    pub(crate) fn map(
        &self,
        base: &Map<'_, T>,
        adapter: &Map<'_, T>,
        norm: &Map<'_, T>,
    ) -> Result<Self> {
        Ok(Attention {
            q: self.q.map(base, adapter)?,
            k: self.k.map(base, adapter)?,
            v: self.v.map(base, adapter)?,
            o: self.o.map(base, adapter)?,
            qk_norm: match &self.qk_norm {
                Some((qn, kn)) => Some((qn.map(norm)?, kn.map(norm)?)),
                None => None,
            },
            qk_whole: self.qk_whole,
            sinks: self.sinks.as_ref().map(base).transpose()?,
            l2_eps: self.l2_eps,
            temperature: self.temperature,
            output_gate: self.output_gate,
            head_dim: self.head_dim,
            core: self.core,
        })
    }

    /// `x (B, S, H)`, `mask (S, S)` with 0 on and below the diagonal and −∞ above (decoder),
    /// or none (encoder: every position attends to every position).
    pub fn forward(&self, x: &T, mask: Option<&T>, rotary: Option<Rotary<T>>) -> Result<T> {
        self.o.forward(&self.heads(x, mask, rotary)?)
    }

    /// [`Attention::forward`] before the output projection: the heads merged, `(B, S, A·D)`.
    pub(crate) fn heads(&self, x: &T, mask: Option<&T>, rotary: Option<Rotary<T>>) -> Result<T> {
        let (q, k, v, gate) = self.qkv(x, rotary, self.core.reads_strided(), 0)?;
        let y = match &self.sinks {
            Some(sinks) => self.core.attend_sinks(q, k, v, mask, sinks)?,
            None => self.core.attend_any(q, k, v, mask)?,
        };
        gated(y, gate)
    }

    /// The query projection of `x`, and with an output gate ([`Attention::output_gate`]) its
    /// gate: the projection `(B, S, A·2D)` split per head into the query `(B, S, A·D)` and
    /// the gate `(B, S, A·D)` (copies, as transformers' `chunk` then `reshape`).
    fn query(&self, x: &T) -> Result<(T, Option<T>)> {
        let y = self.q.forward(x)?;
        if !self.output_gate {
            return Ok((y, None));
        }
        let (b, s, d) = (x.dims()[0], x.dims()[1], self.head_dim);
        let a = self.core.heads;
        let heads = y.reshape(&[b, s, a, 2 * d])?;
        drop(y);
        let q = heads.narrow(3, 0, d)?.reshape(&[b, s, a * d])?;
        let gate = heads.narrow(3, d, d)?.reshape(&[b, s, a * d])?;
        Ok((q, Some(gate)))
    }

    /// The queries `(B, A, S, D)` and the keys and values `(B, G, S, D)` of `x (B, S, H)`,
    /// contiguous; with q/k norms, queries and keys normalised per head; with rotary tables,
    /// then rotated.
    ///
    /// Fused kernels with rotary tables: q and k are normalised (Qwen3) on the `(B, S, n, D)`
    /// view of their projection and rotated from the transposed view (the rotary op reads it
    /// strided and writes `(B, n, S, D)`), so no contiguous copy of the head split is made or
    /// kept; the composed path splits with a copy first (as candle-transformers does).
    ///
    /// `strided` (the efficient CPU op, which reads its operands through their strides): the
    /// head split is the transposed view of the projection, never copied, so the graph keeps
    /// the projection's output alone.
    ///
    /// Llama 4: the rotary layers' heads L2-normalised before they are rotated (the rotation
    /// keeps each head's norm, so this is transformers' norm after it), the NoPE layers'
    /// queries tempered at positions `pos..` ([`temperature`]).
    fn qkv(
        &self,
        x: &T,
        rotary: Option<Rotary<T>>,
        strided: bool,
        pos: usize,
    ) -> Result<(T, T, T, Option<T>)> {
        let (b, s) = (x.dims()[0], x.dims()[1]);
        let d = self.head_dim;
        // The head split: the transposed view, or a contiguous copy of it. With fused kernels
        // the projection's output is released once copied (the copy's node holds it only to
        // route the gradient; no backward reads it), so the graph keeps the copy alone, as
        // PyTorch's eager attention keeps its matmul's copy and frees the projection's output;
        // the composed set keeps both, as candle's stock ops do.
        let split = |t: T, n: usize| -> Result<T> {
            let heads = t.reshape(&[b, s, n, d])?.transpose(1, 2)?;
            if strided {
                return Ok(heads);
            }
            let copies = !heads.is_contiguous();
            let copy = heads.contiguous()?;
            drop(heads);
            t.release_if(self.core.fused && copies && t.is_contiguous())?;
            Ok(copy)
        };
        // OLMo 2: the projections normalised whole, before the heads are split.
        let project = |p: &Proj<T>, norm: Option<&Norm<T>>| -> Result<T> {
            let y = p.forward(x)?;
            match norm {
                Some(n) if self.qk_whole => releasing(n, &y),
                _ => Ok(y),
            }
        };
        let (qn, kn) = match &self.qk_norm {
            Some((qn, kn)) => (Some(qn), Some(kn)),
            None => (None, None),
        };
        let (q_proj, gate) = self.query(x)?;
        let q_proj = match qn {
            Some(n) if self.qk_whole => releasing(n, &q_proj)?,
            _ => q_proj,
        };
        if let (Some(r), true) = (rotary, self.core.fused) {
            let heads = |t: T, n: usize| t.reshape(&[b, s, n, d]);
            let (q, k) = (
                heads(q_proj, self.core.heads)?,
                heads(project(&self.k, kn)?, self.core.kv_heads)?,
            );
            let (q, k) = match (&self.qk_norm, self.qk_whole) {
                (Some((qn, kn)), false) => (releasing(qn, &q)?, releasing(kn, &k)?),
                _ => (q, k),
            };
            let (q, k) = self.l2(q, k)?;
            let rotate = |t: &T| -> Result<T> {
                let y = r.apply(&t.transpose(1, 2)?, true)?;
                t.release_if(self.core.torch)?;
                Ok(y)
            };
            let (q, k) = (rotate(&q)?, rotate(&k)?);
            let q = self.temper(q, pos)?;
            let v = split(self.v.forward(x)?, self.core.kv_heads)?;
            return Ok((q, k, v, gate));
        }
        let rotate = |t: T| -> Result<T> {
            match rotary {
                None => Ok(t),
                Some(r) => r.apply(&t, self.core.fused),
            }
        };
        let (q, k) = (
            split(q_proj, self.core.heads)?,
            split(project(&self.k, kn)?, self.core.kv_heads)?,
        );
        // Qwen3: each head normalised over D (the layout does not change a last-dim norm).
        let (q, k) = match (&self.qk_norm, self.qk_whole) {
            (Some((qn, kn)), false) => (qn.forward(&q)?, kn.forward(&k)?),
            _ => (q, k),
        };
        let (q, k) = self.l2(q, k)?;
        let q = self.temper(rotate(q)?, pos)?;
        let k = rotate(k)?;
        let v = split(self.v.forward(x)?, self.core.kv_heads)?;
        Ok((q, k, v, gate))
    }

    /// Llama 4's L2 norm of the query and key heads (with `l2_eps`), each input freed once
    /// normalised.
    fn l2(&self, q: T, k: T) -> Result<(T, T)> {
        match self.l2_eps {
            None => Ok((q, k)),
            Some(eps) => Ok((l2_norm(&q, eps, &self.core)?, l2_norm(&k, eps, &self.core)?)),
        }
    }

    /// The queries `(B, A, S, D)` at positions `pos..` tempered (Llama 4's NoPE layers), the
    /// untempered ones freed.
    fn temper(&self, q: T, pos: usize) -> Result<T> {
        let Some((floor, scale)) = self.temperature else {
            return Ok(q);
        };
        let s = q.dims()[2];
        let factors = q.host_table(&[s, 1], &|i| temperature(pos + i, floor, scale))?;
        let y = q.broadcast_mul(&factors)?;
        drop((q, factors));
        Ok(y)
    }

    /// Inference with a key/value cache `(B, G, T, D)` each (at the K/V heads): the new keys
    /// and values are appended (`Tensor::cat`, a new allocation; the old cache is freed
    /// after), and the queries attend to every cached position (`mask` only for a prompt of
    /// several tokens); only the composed attention repeats them to the query heads, for
    /// this step only.
    pub fn forward_cached(
        &self,
        x: &T,
        mask: Option<&T>,
        rotary: Option<Rotary<T>>,
        cache: &mut Option<(T, T)>,
    ) -> Result<T> {
        self.o.forward(&self.heads_cached(x, mask, rotary, cache)?)
    }

    /// [`Attention::forward_cached`] before the output projection.
    pub(crate) fn heads_cached(
        &self,
        x: &T,
        mask: Option<&T>,
        rotary: Option<Rotary<T>>,
        cache: &mut Option<(T, T)>,
    ) -> Result<T> {
        // The tokens before these: a full layer's cache holds them all (Llama 4's tempered
        // NoPE layers are full).
        let pos = cache.as_ref().map_or(0, |(k, _)| k.dims()[2]);
        let (q, k, v, gate) = self.qkv(x, rotary, false, pos)?;
        let first = cache.is_none();
        // A chunked layer whose cache holds a whole chunk: the new token starts the next one,
        // and the old chunk goes.
        let prev = match (cache.take(), self.core.chunked, self.core.window) {
            (Some((pk, _)), true, Some(c)) if pk.dims()[2] >= c => None,
            (prev, _, _) => prev,
        };
        let (k, v) = append(prev, k, v)?;
        // A sliding window: the cache keeps the last W keys and values (a copy each). A prompt
        // attends to all of its keys (the windowed mask or kernel hides the old ones); a
        // single new token to the kept W, and the longer tensors go. A chunk: the cache keeps
        // the current chunk's tokens, the last `(T − 1) mod W + 1`.
        let t = k.dims()[2];
        let keep = match self.core.window {
            Some(w) if self.core.chunked => Some((t - 1) % w + 1),
            w => w,
        };
        let kept = match keep {
            Some(w) if t > w => {
                let kk = k.narrow(2, t - w, w)?.contiguous()?;
                let kv = v.narrow(2, t - w, w)?.contiguous()?;
                (kk, kv)
            }
            _ => (k.clone(), v.clone()),
        };
        let (k, v) = if q.dims()[2] == 1 {
            drop((k, v));
            kept.clone()
        } else {
            (k, v)
        };
        *cache = Some(kept);
        // A prompt into an empty cache attends as the training forward does (the tiled or
        // efficient attention when the case asks for it).
        let y = if let Some(sinks) = &self.sinks {
            self.core.attend_sinks(q, k, v, mask, sinks)?
        } else if first && q.dims()[2] > 1 {
            self.core.attend_any(q, k, v, mask)?
        } else {
            self.core.attend(q, k, v, mask)?
        };
        gated(y, gate)
    }
}

/// The attention's merged heads `y (B, S, A·D)` times `sigmoid(gate)` (Qwen3-Next's output
/// gate), y and the gate freed once used; `y` itself without a gate.
fn gated<T: TensorOps>(y: T, gate: Option<T>) -> Result<T> {
    match gate {
        None => Ok(y),
        Some(g) => {
            let s = super::moe::sigmoid(&g)?;
            drop(g);
            let out = y.mul(&s)?;
            drop((y, s));
            Ok(out)
        }
    }
}
