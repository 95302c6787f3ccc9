//! Multi-head latent attention (DeepSeek-V2, V3): keys and values come from a compressed
//! latent `c` of `kv_lora_rank` per token, and the key's rotary part is one head shared by all
//! heads, so a cache need keep only `c` and that rotary key: `(kv_lora_rank + qk_rope_head_dim)`
//! elements per token per layer (what vLLM and SGLang store), against `A·(qk_head + v_head)`
//! for the decompressed keys and values transformers' cache keeps.
//!
//! Shapes (B batch, S sequence, H hidden, A heads, n = `qk_nope_head_dim`, r =
//! `qk_rope_head_dim`, dq = n + r, dv = `v_head_dim`, L = `kv_lora_rank`, R = `q_lora_rank`):
//! - queries: `q (H → A·dq)`, or `q_b(norm(q_a(x)))` (`H → R → A·dq`, an RMSNorm over R) →
//!   `(B, A, S, dq)`, split into `q_nope (…, n)` and `q_pe (…, r)`;
//! - `kv_a (H → L + r)` → `c (B, S, L)` (RMSNorm `kv_a_norm`) and `k_pe (B, 1, S, r)`;
//! - `q_pe` and `k_pe` rotated: de-interleaved (a copy, as transformers' DeepSeek-V3 does
//!   with `rope_interleave`), then the model's rotary embedding over r (the dot products equal
//!   DeepSeek-V2's complex interleaved form);
//! - `kv_b (L → A·(n + dv))` of the latent, made contiguous per head `(B, A, T, n + dv)` →
//!   `k_nope (B, A, T, n)`, `v (B, A, T, dv)` (a copy); keys `cat(k_nope, k_pe copied to the A
//!   heads)`, queries `cat(q_nope, q_pe)`, both
//!   `(…, dq)`; the attention of [`super::attention::Core`] with scale `1/√dq`; `o (A·dv → H)`.
//!
//! The cache ([`super::transformer::KvCache`]) keeps, per layer, the normalised latent
//! `(B, 1, T, L)` and the rotated `k_pe (B, 1, T, r)`. A decode step (one new token over a
//! cache) attends over the latent itself, as vLLM, SGLang and FlashMLA do (the absorbed form):
//! with `kv_b`'s weight viewed as `W_uk (A, n, L)` and `W_uv (A, dv, L)`, the query's nope part
//! is projected into the latent, `q_lat = q_nope·W_uk (B, A, 1, L)`, and the step is a
//! multi-query attention with one key head `[c | k_pe] (B, 1, T, L + r)` and one value head
//! `c`: `softmax([q_lat | q_pe]·[c | k_pe]ᵀ/√(n + r))·c = o_lat (B, A, 1, L)`, then
//! `o_lat·W_uvᵀ (B, A, 1, dv)` into `o`. Its transients are the joined key `(B, 1, T, L + r)` and
//! the scores `(B, A, 1, T)`: per cached token about one layer's latent, where the decompressed
//! form holds `A·(n + dv + dq + dv)` (DeepSeek-V3: ≈ 128 KiB per token per layer in bf16).
//! `decompressed_decode` ([`MlaShape`]) keeps transformers' form, which decompresses the whole
//! cache through `kv_b` each step (a transient `(B, T, A·(n + dv))` and the keys and values made
//! from it); so does a `kv_b` with a LoRA adapter or a quantized (frozen) weight, which has no
//! dense weight to absorb. A prompt (prefill) attends in the decompressed form either way, as
//! the serving engines do.
//!
//! Parameters per layer: `H·A·dq` (or `H·R + R + R·A·dq`) + `H·(L + r)` + `L` +
//! `L·A·(n + dv)` + `A·dv·H`, plus biases on `q_a`, `kv_a` and `o` with `attention_bias`.
//! LoRA targets: `q` (or `q_a` and `q_b`) is q, `kv_a` is k, `kv_b` is v, `o` is o.

use candle_core::{Result, Tensor};

use super::attention::{Core, Rotary};
use super::config::{Config, ProjSpec};
use super::norm::Norm;
use super::proj::Proj;
pub use super::shapes::MlaShape;
use super::tensor_ops::{Map, TensorOps};
use super::weights::Weights;

/// Epsilon of MLA's inner norms: transformers makes them with its default 1e-6, not
/// `rms_norm_eps`.
pub const INNER_EPS: f64 = 1e-6;

/// Multi-head latent attention.
#[derive(Debug, Clone)]
pub struct Mla<T: TensorOps = Tensor> {
    /// `q`, or `q_a` with its norm and `q_b`.
    pub(crate) q: Proj<T>,
    pub(crate) q_a: Option<(Proj<T>, Norm<T>)>,
    pub(crate) kv_a: Proj<T>,
    pub(crate) kv_a_norm: Norm<T>,
    pub(crate) kv_b: Proj<T>,
    pub(crate) o: Proj<T>,
    pub(crate) shape: MlaShape,
    pub(crate) core: Core,
}

impl<T: TensorOps> Mla<T> {
    /// Layer `layer`'s attention.
    pub(crate) fn new<W: Weights<Tensor = T>>(
        cfg: &Config,
        layer: usize,
        m: MlaShape,
        projs: &[ProjSpec],
        w: &W,
    ) -> Result<Self> {
        let p = |i: usize| w.proj(&projs[i], cfg);
        let (q_a, q) = match m.q_lora_rank {
            None => (None, p(0)?),
            Some(r) => {
                let q_a = p(0)?;
                let norm = Norm::rms_eps(r, INNER_EPS, cfg, &w.pp("q_a_norm"))?;
                (Some((q_a, norm)), p(1)?)
            }
        };
        let i = usize::from(m.q_lora_rank.is_some());
        let kv_a = p(i + 1)?;
        let kv_a_norm = Norm::rms_eps(m.kv_lora_rank, INNER_EPS, cfg, &w.pp("kv_a_norm"))?;
        Ok(Self {
            q,
            q_a,
            kv_a,
            kv_a_norm,
            kv_b: p(i + 2)?,
            o: p(i + 3)?,
            shape: m,
            core: Core::new(cfg, layer, cfg.heads, cfg.heads),
        })
    }
}

impl Mla {
    pub(crate) fn projs_mut(&mut self) -> Vec<&mut Proj> {
        let mut v = Vec::new();
        if let Some((q_a, _)) = &mut self.q_a {
            v.push(q_a);
        }
        v.extend([&mut self.q, &mut self.kv_a, &mut self.kv_b, &mut self.o]);
        v
    }
}

impl<T: TensorOps> Mla<T> {
    /// A copy with `base` on the weights, `norm` on the norms' and `adapter` on LoRA's A and
    /// B.
    pub(crate) fn map(
        &self,
        base: &Map<'_, T>,
        adapter: &Map<'_, T>,
        norm: &Map<'_, T>,
    ) -> Result<Self> {
        self.map_parts(&|p| p.map(base, adapter), norm)
    }

    /// The projections in model order.
    pub fn projs(&self) -> Vec<&Proj<T>> {
        let mut v = Vec::new();
        if let Some((q_a, _)) = &self.q_a {
            v.push(q_a);
        }
        v.extend([&self.q, &self.kv_a, &self.kv_b, &self.o]);
        v
    }

    /// The inner norms' weights.
    pub fn norm_weights(&self) -> Vec<&T> {
        let mut v = Vec::new();
        if let Some((_, n)) = &self.q_a {
            v.extend(n.weights());
        }
        v.extend(self.kv_a_norm.weights());
        v
    }

    /// A copy with `f` on the projections and `w` on the norms' weights.
    pub fn map_parts<U: TensorOps>(
        &self,
        f: &dyn Fn(&Proj<T>) -> Result<Proj<U>>,
        w: &dyn Fn(&T) -> Result<U>,
    ) -> Result<Mla<U>> {
        Ok(Mla {
            q: f(&self.q)?,
            q_a: match &self.q_a {
                None => None,
                Some((p, n)) => Some((f(p)?, n.map(w)?)),
            },
            kv_a: f(&self.kv_a)?,
            kv_a_norm: self.kv_a_norm.map(w)?,
            kv_b: f(&self.kv_b)?,
            o: f(&self.o)?,
            shape: self.shape,
            core: self.core,
        })
    }

    /// The queries `(B, A, S, dq)` (rotated), the normalised latent `(B, 1, S, L)` and the
    /// rotated shared key `(B, 1, S, r)` of `x (B, S, H)`.
    fn latent(&self, x: &T, rotary: Rotary<T>) -> Result<(T, T, T)> {
        let (b, s) = (x.dims()[0], x.dims()[1]);
        let m = &self.shape;
        let (a, n, r, l) = (
            self.core.heads,
            m.qk_nope_head_dim,
            m.qk_rope_head_dim,
            m.kv_lora_rank,
        );
        let q = match &self.q_a {
            None => self.q.forward(x)?,
            Some((q_a, norm)) => {
                let qa = norm.forward(&q_a.forward(x)?)?;
                self.q.forward(&qa)?
            }
        };
        // Contiguous before the split, so that the `cat`s below copy once into a contiguous
        // result (candle's `cat` of strided parts returns a strided view).
        let q = heads_first(&q, a, n + r)?;
        let q_nope = q.narrow(3, 0, n)?;
        let q_pe = rotate(&q.narrow(3, n, r)?, rotary, self.core.fused)?;
        let q = T::cat(&[&q_nope, &q_pe], 3)?;
        drop((q_nope, q_pe));
        let ckv = self.kv_a.forward(x)?;
        // A reshape, not `unsqueeze`: candle's `unsqueeze` grows its shape and stride Vecs
        // (capacity 6 for 4 dims), 32 bytes the cache would carry for the rest of the run.
        let c = self
            .kv_a_norm
            .forward(&ckv.narrow(2, 0, l)?.contiguous()?)?
            .reshape(&[b, 1, s, l])?;
        let k_pe = ckv.narrow(2, l, r)?.reshape(&[b, 1, s, r])?;
        drop(ckv);
        let k_pe = rotate(&k_pe, rotary, self.core.fused)?;
        Ok((q, c, k_pe))
    }

    /// Keys `(B, A, T, dq)` and values `(B, A, T, dv)` decompressed from the latent
    /// `(B, 1, T, L)` and the shared rotary key `(B, 1, T, r)`.
    fn decompress(&self, c: &T, k_pe: &T) -> Result<(T, T)> {
        let (b, t) = (c.dims()[0], c.dims()[2]);
        let m = &self.shape;
        let (a, n, r, dv) = (
            self.core.heads,
            m.qk_nope_head_dim,
            m.qk_rope_head_dim,
            m.v_head_dim,
        );
        let kv = heads_first(&self.kv_b.forward(&c.squeeze(1)?)?, a, n + dv)?;
        let k_nope = kv.narrow(3, 0, n)?;
        let k_pe = k_pe.broadcast_as(&[b, a, t, r])?.contiguous()?;
        let k = T::cat(&[&k_nope, &k_pe], 3)?;
        drop((k_nope, k_pe));
        let v = kv.narrow(3, n, dv)?.contiguous()?;
        Ok((k, v))
    }

    pub fn forward(&self, x: &T, mask: Option<&T>, rotary: Option<Rotary<T>>) -> Result<T> {
        self.o.forward(&self.heads(x, mask, rotary)?)
    }

    /// [`Mla::forward`] before the output projection.
    pub(crate) fn heads(&self, x: &T, mask: Option<&T>, rotary: Option<Rotary<T>>) -> Result<T> {
        let rotary = rotary.expect("MLA is a LLaMA-family attention (rotary tables)");
        let (q, c, k_pe) = self.latent(x, rotary)?;
        let (k, v) = self.decompress(&c, &k_pe)?;
        drop((c, k_pe));
        self.core.attend_any(q, k, v, mask)
    }

    /// Inference with the latent cache: the new latent and shared key appended (a `cat`
    /// each), then the whole cache decompressed for this step.
    pub fn forward_cached(
        &self,
        x: &T,
        mask: Option<&T>,
        rotary: Option<Rotary<T>>,
        cache: &mut Option<(T, T)>,
    ) -> Result<T> {
        self.o.forward(&self.heads_cached(x, mask, rotary, cache)?)
    }

    /// [`Mla::forward_cached`] before the output projection.
    pub(crate) fn heads_cached(
        &self,
        x: &T,
        mask: Option<&T>,
        rotary: Option<Rotary<T>>,
        cache: &mut Option<(T, T)>,
    ) -> Result<T> {
        let rotary = rotary.expect("MLA is a LLaMA-family attention (rotary tables)");
        let (q, c, k_pe) = self.latent(x, rotary)?;
        let first = cache.is_none();
        let (c, k_pe) = super::attention::append(cache.take(), c, k_pe)?;
        if !first
            && q.dims()[2] == 1
            && let Some(w) = self.absorbable(&q)?
        {
            let y = self.absorbed_step(q, &c, &k_pe, &w)?;
            *cache = Some((c, k_pe));
            return Ok(y);
        }
        let (k, v) = self.decompress(&c, &k_pe)?;
        *cache = Some((c, k_pe));
        if first && q.dims()[2] > 1 {
            self.core.attend_any(q, k, v, mask)
        } else {
            self.core.attend(q, k, v, mask)
        }
    }

    /// `kv_b`'s dense weight `(A·(n + dv), L)` in `like`'s type when decode steps attend over
    /// the latent: not under `decompressed_decode`, nor with a LoRA adapter. A frozen base (FP8
    /// or GGML blocks as shipped) is dequantized for the step, as its projection is at each
    /// call.
    fn absorbable(&self, like: &T) -> Result<Option<T>> {
        let p = &self.kv_b;
        if self.shape.decompressed_decode || p.lora.is_some() {
            return Ok(None);
        }
        Ok(Some(match &p.frozen {
            None => p.weight.clone(),
            Some(f) => T::frozen_dense(f, like)?,
        }))
    }

    /// One decode step over the latent cache `c (B, 1, T, L)`, `k_pe (B, 1, T, r)` for the
    /// queries `q (B, A, 1, n + r)`: the absorbed form of the module docs, heads merged
    /// `(B, 1, A·dv)`.
    fn absorbed_step(&self, q: T, c: &T, k_pe: &T, w: &T) -> Result<T> {
        let (b, a) = (q.dims()[0], q.dims()[1]);
        let m = &self.shape;
        let (n, r, dv, l) = (
            m.qk_nope_head_dim,
            m.qk_rope_head_dim,
            m.v_head_dim,
            m.kv_lora_rank,
        );
        let w = w.reshape(&[a, n + dv, l])?;
        // Per head, `(A, B, n) × (A, n, L)`: the weight's rows read in place.
        let q_nope = q
            .narrow(3, 0, n)?
            .reshape(&[b, a, n])?
            .transpose(0, 1)?
            .contiguous()?;
        let q_lat = q_nope.matmul(&w.narrow(1, 0, n)?)?;
        drop(q_nope);
        let q_lat = q_lat.transpose(0, 1)?.reshape(&[b, a, 1, l])?;
        // The core scales by 1/√(L + r); MLA's scale is 1/√(n + r).
        let scale = ((l + r) as f64 / (n + r) as f64).sqrt();
        let q_abs = {
            let joined = T::cat(&[&q_lat, &q.narrow(3, n, r)?], 3)?;
            let scaled = joined.affine(scale, 0.0)?;
            drop(joined);
            scaled
        };
        drop((q_lat, q));
        let k_abs = T::cat(&[c, k_pe], 3)?;
        let core = Core {
            kv_heads: 1,
            ..self.core
        };
        let y = core.attend(q_abs, k_abs, c.clone(), None)?;
        let o_lat = y.reshape(&[b, a, l])?.transpose(0, 1)?.contiguous()?;
        drop(y);
        let out = o_lat.matmul(&w.narrow(1, n, dv)?.transpose(1, 2)?)?;
        drop(o_lat);
        out.transpose(0, 1)?.reshape(&[b, 1, a * dv])
    }
}

/// `x (B, S, A·d)` → `(B, A, S, d)` contiguous with natural strides (a copy; a pure reshape
/// when S is 1, where candle would keep a transposed view with an odd stride that its `cat`
/// cannot copy in one piece).
fn heads_first<T: TensorOps>(x: &T, a: usize, d: usize) -> Result<T> {
    let (b, s) = (x.dims()[0], x.dims()[1]);
    if s == 1 {
        return x.reshape(&[b, a, 1, d]);
    }
    x.reshape(&[b, s, a, d])?.transpose(1, 2)?.contiguous()
}

/// `x (B, n, S, r)` (a view) de-interleaved — pairs `(x₀, x₁), (x₂, x₃), …` to the halves
/// `(x₀, x₂, …), (x₁, x₃, …)`, one copy — then rotated as the model's other rotary
/// embeddings.
fn rotate<T: TensorOps>(x: &T, rotary: Rotary<T>, fused: bool) -> Result<T> {
    let d = x.dims();
    let (b, n, s, r) = (d[0], d[1], d[2], d[3]);
    let halves = x
        .reshape(&[b, n, s, r / 2, 2])?
        .transpose(3, 4)?
        .reshape(&[b, n, s, r])?;
    rotary.apply(&halves, fused)
}
