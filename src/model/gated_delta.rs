//! Qwen3-Next's linear attention, Gated DeltaNet (transformers' `Qwen3NextGatedDeltaNet`,
//! 4.57.1, as it runs without flash-linear-attention and causal-conv1d: its torch fallbacks
//! `torch_chunk_gated_delta_rule`, `torch_recurrent_gated_delta_rule` and
//! `torch_causal_conv1d_update`), written once over [`TensorOps`] so that candle's autograd
//! differentiates it and the replay predicts it.
//!
//! Shapes (B batch, S sequence, H hidden; `nk` key heads of `dk`, `nv` value heads of `dv`,
//! `r = nv/nk`; `C = 2·nk·dk + nv·dv` the convolution's channels, `K` its kernel):
//! `x (B, S, H)` → `qkvz (B, S, nk, 2dk + 2r·dv)` and `ba (B, S, nk, 2r)`, split per key head
//! into q, k `(B, S, nk·dk)`, v, z `(B, S, nv·dv)`, b, a `(B, S, nv)`; q, k, v joined
//! `(B, S, C)`, convolved depthwise and causally (`Σ_k x[t − K + 1 + k]·w[k]`, then SiLU),
//! split again; `β = σ(b)`, `g = −exp(A_log)·softplus(a + dt_bias)`; q and k repeated to the
//! value heads and L2-normalised; the gated delta rule gives `(B, S, nv, dv)`, RMS-normalised
//! per head and multiplied by `silu(z)`, then `out` `(B, S, H)`.
//!
//! The delta rule: in training and prefill transformers' chunked form (the sequence padded to
//! chunks of 64; within a chunk the decays' cumulative sums, here a product with a triangle of
//! ones, and the inverse of `I + strict_lower(β·k·kᵀ ⊙ decay)` by forward substitution, row by
//! row as transformers' loop; then chunk by chunk through the state `(B, nv, dk, dv)`); in
//! decode (one token on a cached state) the recurrent step. Computed in f32 (transformers'
//! `.to(torch.float32)`), the output cast back. The convolution is composed as `K` shifted
//! products (transformers: `conv1d`); the cumulative sum as a matmul (transformers: `cumsum`).
//!
//! The cache of a linear layer is `(conv, state)`: the last `K` inputs of the convolution
//! `(B, K, C)` (transformers keeps `(B, C, K)`) and the recurrent state `(B, nv, dk, dv)` in
//! f32, as transformers' `Qwen3NextDynamicCache`; neither grows with the context.

use candle_core::{Result, Tensor};
use candle_nn::Init;

use super::config::{Config, ProjSpec};
use super::norm::Norm;
use super::proj::Proj;
use super::shapes::GatedDelta;
use super::tensor_ops::{Map, TensorOps};
use super::weights::Weights;

/// transformers' chunk of the chunked delta rule.
pub const CHUNK: usize = 64;

/// The L2 norm's epsilon (`l2norm`'s, FLA's).
const L2_EPS: f64 = 1e-6;

/// One Gated DeltaNet layer.
#[derive(Debug, Clone)]
pub struct GatedDeltaNet<T: TensorOps = Tensor> {
    pub(crate) qkvz: Proj<T>,
    pub(crate) ba: Proj<T>,
    /// The depthwise convolution's weight `(K, C)` (transformers' `conv1d.weight (C, 1, K)`
    /// transposed).
    pub(crate) conv: T,
    pub(crate) dt_bias: T,
    pub(crate) a_log: T,
    /// `Qwen3NextRMSNormGated` over a value head (its weight plain, not zero-centred).
    pub(crate) norm: Norm<T>,
    pub(crate) out: Proj<T>,
    pub(crate) shape: GatedDelta,
}

/// `x·rsqrt(Σx² + ε)` over the last dimension (transformers' `l2norm`).
fn l2norm<T: TensorOps>(x: &T) -> Result<T> {
    let inv = x
        .sqr()?
        .sum_last_keepdim()?
        .affine(1.0, L2_EPS)?
        .sqrt()?
        .recip()?;
    x.broadcast_mul(&inv)
}

/// `x` with `pad` zeros appended along `dim` (contiguous; `x` itself when none).
fn pad<T: TensorOps>(x: &T, dim: usize, pad: usize) -> Result<T> {
    if pad == 0 {
        return Ok(x.clone());
    }
    let mut d = x.dims();
    d[dim] = pad;
    let z = x.zeros(&d)?;
    T::cat(&[x, &z], dim)
}

impl<T: TensorOps> GatedDeltaNet<T> {
    /// `projs` are the layer's qkvz and out ([`super::config::linear_attn_projections`]).
    pub(crate) fn new<W: Weights<Tensor = T>>(
        cfg: &Config,
        shape: GatedDelta,
        projs: &[ProjSpec],
        w: &W,
    ) -> Result<Self> {
        let nv = shape.value_heads;
        Ok(Self {
            qkvz: w.proj(&projs[0], cfg)?,
            ba: w.pp("ba").linear(cfg.hidden, 2 * nv, false)?,
            conv: w.weight(
                &[shape.conv_kernel, shape.conv_dim()],
                "conv",
                Init::Randn {
                    mean: 0.0,
                    stdev: 0.02,
                },
            )?,
            dt_bias: w.weight(&[nv], "dt_bias", Init::Const(1.0))?,
            a_log: w.weight(&[nv], "a_log", Init::Const(0.0))?,
            norm: Norm::rms_eps(shape.value_dim, cfg.layer_norm_eps, cfg, &w.pp("norm"))?,
            out: w.proj(&projs[1], cfg)?,
            shape,
        })
    }

    /// A copy with `base` on the weights, `norm` on the gated norm's and `adapter` on LoRA's.
    pub(crate) fn map(
        &self,
        base: &Map<'_, T>,
        adapter: &Map<'_, T>,
        norm: &Map<'_, T>,
    ) -> Result<Self> {
        Ok(Self {
            qkvz: self.qkvz.map(base, adapter)?,
            ba: self.ba.map(base, adapter)?,
            conv: base(&self.conv)?,
            dt_bias: norm(&self.dt_bias)?,
            a_log: norm(&self.a_log)?,
            norm: self.norm.map(norm)?,
            out: self.out.map(base, adapter)?,
            shape: self.shape,
        })
    }

    /// The layer before `out`: `x (B, S, H)` → `(B, S, nv·dv)`; with a cache `(conv, state)`
    /// (see the module), a single token on a cached state takes the recurrent step, anything
    /// else the chunked rule (from the cached state, if any), and the cache is replaced.
    pub(crate) fn heads(&self, x: &T, cache: Option<&mut Option<(T, T)>>) -> Result<T> {
        let g = self.shape;
        let (b, s) = (x.dims()[0], x.dims()[1]);
        let (nk, nv, dk, dv) = (g.key_heads, g.value_heads, g.key_dim, g.value_dim);
        let r = nv / nk;
        let (kd, vd, c, kk) = (g.key_width(), g.value_width(), g.conv_dim(), g.conv_kernel);
        // The projections, split per key head as transformers' `fix_query_key_value_ordering`.
        let qkvz = self
            .qkvz
            .forward(x)?
            .reshape(&[b, s, nk, 2 * dk + 2 * r * dv])?;
        let part = |t: &T, at: usize, len: usize, width: usize| -> Result<T> {
            t.narrow(3, at, len)?.reshape(&[b, s, width])
        };
        let q = part(&qkvz, 0, dk, kd)?;
        let k = part(&qkvz, dk, dk, kd)?;
        let v = part(&qkvz, 2 * dk, r * dv, vd)?;
        let z = part(&qkvz, 2 * dk + r * dv, r * dv, vd)?;
        drop(qkvz);
        let ba = self.ba.forward(x)?.reshape(&[b, s, nk, 2 * r])?;
        let beta_in = part(&ba, 0, r, nv)?;
        let a = part(&ba, r, r, nv)?;
        drop(ba);
        let mixed = T::cat(&[&q, &k, &v], 2)?;
        drop((q, k, v));
        // The convolution's inputs before these: zeros, or the cached last K.
        let (prev_conv, prev_state) = match cache.as_ref().and_then(|c| c.as_ref()) {
            Some((conv, state)) => (Some(conv.clone()), Some(state.clone())),
            None => (None, None),
        };
        let head = match &prev_conv {
            Some(conv) => conv.narrow(1, 1, kk - 1)?,
            None => mixed.zeros(&[b, kk - 1, c])?,
        };
        let xp = T::cat(&[&head, &mixed], 1)?;
        drop((head, mixed));
        let conv_out = self.convolve(&xp, s)?;
        let new_conv = cache
            .is_some()
            .then(|| -> Result<T> {
                // transformers keeps the last K inputs (zeros before the first).
                let t = xp.dims()[1];
                xp.narrow(1, t - kk, kk)?.contiguous()
            })
            .transpose()?;
        drop(xp);
        let q = conv_out.narrow(2, 0, kd)?.reshape(&[b, s, nk, dk])?;
        let k = conv_out.narrow(2, kd, kd)?.reshape(&[b, s, nk, dk])?;
        let v = conv_out.narrow(2, 2 * kd, vd)?.reshape(&[b, s, nv, dv])?;
        drop(conv_out);
        let beta = super::moe::sigmoid(&beta_in)?;
        drop(beta_in);
        let gate = self.decay(&a)?;
        drop(a);
        let (q, k) = if r > 1 {
            let rep = |t: T| -> Result<T> {
                t.unsqueeze(3)?
                    .broadcast_as(&[b, s, nk, r, dk])?
                    .reshape(&[b, s, nv, dk])
            };
            (rep(q)?, rep(k)?)
        } else {
            (q, k)
        };
        let one_step = s == 1 && prev_state.is_some();
        let (y, state) = if one_step {
            self.recurrent(q, k, v, gate, beta, prev_state.expect("a state"))?
        } else {
            self.chunked(q, k, v, gate, beta, prev_state)?
        };
        if let Some(cache) = cache {
            *cache = Some((new_conv.expect("a cache"), state));
        }
        // The gated RMSNorm per value head, times silu(z).
        let n = self.norm.forward(&y)?;
        drop(y);
        let z = z.reshape(&[b, s, nv, dv])?;
        let gz = z.upcast()?.silu()?;
        drop(z);
        let out = n.upcast()?.mul(&gz)?;
        drop(gz);
        let out = out.to_dtype_of(&n)?;
        drop(n);
        out.reshape(&[b, s, vd])
    }

    /// The depthwise causal convolution and SiLU: `xp (B, K − 1 + S, C)` (the earlier inputs
    /// first) → `(B, S, C)`, `Σ_k xp[t + k]·w[k]`.
    fn convolve(&self, xp: &T, s: usize) -> Result<T> {
        let kk = self.shape.conv_kernel;
        let w = self.conv.to_dtype_of(xp)?;
        let mut acc: Option<T> = None;
        for j in 0..kk {
            let term = xp.narrow(1, j, s)?.broadcast_mul(&w.narrow(0, j, 1)?)?;
            acc = Some(match acc {
                None => term,
                Some(a) => {
                    let sum = a.add(&term)?;
                    drop((a, term));
                    sum
                }
            });
        }
        let y = acc.expect("a kernel of at least one tap");
        y.silu()
    }

    /// `g = −exp(A_log)·softplus(a + dt_bias)` in f32, `(B, S, nv)`.
    fn decay(&self, a: &T) -> Result<T> {
        let a32 = a.upcast()?;
        let dt = self.dt_bias.to_dtype_of(&a32)?;
        let sp = a32.broadcast_add(&dt)?.exp()?.affine(1.0, 1.0)?.log()?;
        let rate = self.a_log.to_dtype_of(&a32)?.exp()?.neg()?;
        sp.broadcast_mul(&rate)
    }

    /// q, k `(B, S, nv, dk)`, v `(B, S, nv, dv)` → heads first in f32 `(B, nv, S, ·)`, q and k
    /// L2-normalised, q scaled by `dk^-½`; g, β `(B, S, nv)` → `(B, nv, S)`.
    #[allow(clippy::type_complexity)]
    fn heads_first(&self, q: T, k: T, v: T, g: T, beta: T) -> Result<(T, T, T, T, T)> {
        let first = |t: T| -> Result<T> { t.transpose(1, 2)?.contiguous()?.upcast() };
        let q = l2norm(&q)?;
        let k = l2norm(&k)?;
        let scale = 1.0 / (self.shape.key_dim as f64).sqrt();
        let q = first(q)?.affine(scale, 0.0)?;
        Ok((q, first(k)?, first(v)?, first(g)?, first(beta)?))
    }

    /// transformers' `torch_chunk_gated_delta_rule`: `(y (B, S, nv, dv), state)`.
    fn chunked(&self, q: T, k: T, v: T, g: T, beta: T, state: Option<T>) -> Result<(T, T)> {
        let out_like = v.clone();
        let (q, k, v, g, beta) = self.heads_first(q, k, v, g, beta)?;
        let d = q.dims();
        let (b, nv, s, dk) = (d[0], d[1], d[2], d[3]);
        let dv = v.dims()[3];
        let padding = (CHUNK - s % CHUNK) % CHUNK;
        let (t, n) = (s + padding, (s + padding) / CHUNK);
        let q = pad(&q, 2, padding)?;
        let k = pad(&k, 2, padding)?;
        let v = pad(&v, 2, padding)?;
        let g = pad(&g, 2, padding)?;
        let beta = pad(&beta, 2, padding)?.unsqueeze(3)?;
        let v_beta = v.broadcast_mul(&beta)?;
        let k_beta = k.broadcast_mul(&beta)?;
        drop((v, beta));
        // (B·nv, n, C, ·): candle's matmul takes at most two batch dimensions.
        let bh = b * nv;
        let chunks = |x: T, w: usize| x.reshape(&[bh, n, CHUNK, w]);
        let (q, k) = (chunks(q, dk)?, chunks(k, dk)?);
        let (k_beta, v_beta) = (chunks(k_beta, dk)?, chunks(v_beta, dv)?);
        debug_assert_eq!(t, n * CHUNK);
        // The decays' cumulative sums within each chunk: g times a triangle of ones.
        let upper = g.host_table(&[CHUNK, CHUNK], &|i| f32::from(i / CHUNK <= i % CHUNK))?;
        let g = g
            .reshape(&[bh * n, CHUNK])?
            .matmul(&upper)?
            .reshape(&[bh, n, CHUNK])?;
        drop(upper);
        let tril = g.host_table(&[CHUNK, CHUNK], &|i| f32::from(i % CHUNK <= i / CHUNK))?;
        let strict = g.host_table(&[CHUNK, CHUNK], &|i| f32::from(i % CHUNK < i / CHUNK))?;
        let decay = g
            .unsqueeze(3)?
            .broadcast_sub(&g.unsqueeze(2)?)?
            .broadcast_mul(&tril)?
            .exp()?
            .broadcast_mul(&tril)?;
        let attn = k_beta
            .matmul(&k.transpose(2, 3)?)?
            .mul(&decay)?
            .broadcast_mul(&strict)?
            .neg()?;
        let attn = solve(&attn)?;
        let eye = g.host_table(&[CHUNK, CHUNK], &|i| f32::from(i % CHUNK == i / CHUNK))?;
        let attn = attn.broadcast_add(&eye)?;
        drop(eye);
        let value = attn.matmul(&v_beta)?;
        drop(v_beta);
        let k_cumdecay = attn.matmul(&k_beta.broadcast_mul(&g.exp()?.unsqueeze(3)?)?)?;
        drop((attn, k_beta));
        let mut state = match state {
            Some(st) => st.reshape(&[bh, dk, dv])?,
            None => q.zeros(&[bh, dk, dv])?,
        };
        let mut outs = Vec::with_capacity(n);
        let at = |x: &T, i: usize| -> Result<T> { x.narrow(1, i, 1)?.squeeze(1)?.contiguous() };
        for i in 0..n {
            let (q_i, k_i, v_i) = (at(&q, i)?, at(&k, i)?, at(&value, i)?);
            let g_i = g.narrow(1, i, 1)?.squeeze(1)?;
            let scores = q_i
                .matmul(&k_i.transpose(1, 2)?)?
                .mul(&at(&decay, i)?)?
                .broadcast_mul(&tril)?;
            let v_prime = at(&k_cumdecay, i)?.matmul(&state)?;
            let v_new = v_i.sub(&v_prime)?;
            drop((v_i, v_prime));
            let inter = q_i
                .broadcast_mul(&g_i.exp()?.unsqueeze(2)?)?
                .matmul(&state)?;
            let y = inter.add(&scores.matmul(&v_new)?)?;
            drop((inter, scores));
            outs.push(y);
            let last = g_i.narrow(1, CHUNK - 1, 1)?;
            let kept = state.broadcast_mul(&last.exp()?.unsqueeze(2)?)?;
            let k_decayed = k_i.broadcast_mul(&last.broadcast_sub(&g_i)?.exp()?.unsqueeze(2)?)?;
            let added = k_decayed.transpose(1, 2)?.matmul(&v_new)?;
            state = kept.add(&added)?;
        }
        drop((q, k, value, k_cumdecay, decay, tril, strict, g));
        let y = T::cat_owned(&outs, 1)?;
        drop(outs);
        let y = y.reshape(&[b, nv, t, dv])?;
        let y = y.narrow(2, 0, s)?.transpose(1, 2)?.contiguous()?;
        let y = y.to_dtype_of(&out_like)?;
        Ok((y, state.reshape(&[b, nv, dk, dv])?))
    }

    /// transformers' `torch_recurrent_gated_delta_rule` for one token on `state`.
    fn recurrent(&self, q: T, k: T, v: T, g: T, beta: T, state: T) -> Result<(T, T)> {
        let out_like = v.clone();
        let (q, k, v, g, beta) = self.heads_first(q, k, v, g, beta)?;
        // (B, nv, 1, ·) rows; g and β (B, nv, 1) → (B, nv, 1, 1).
        let decayed = state.broadcast_mul(&g.exp()?.unsqueeze(3)?)?;
        drop(state);
        let kv_mem = k.matmul(&decayed)?;
        let delta = v.sub(&kv_mem)?.broadcast_mul(&beta.unsqueeze(3)?)?;
        drop(kv_mem);
        let state = decayed.add(&k.transpose(2, 3)?.matmul(&delta)?)?;
        drop(decayed);
        let y = q.matmul(&state)?.transpose(1, 2)?.contiguous()?;
        Ok((y.to_dtype_of(&out_like)?, state))
    }
}

/// transformers' loop over the rows of a chunk's `(…, C, C)` strictly lower matrix `A`:
/// `row_i ← row_i + row_i·T[:i, :i]` with `T` the rows already done, i.e. `(I − A)⁻¹ − I`,
/// row by row (each row a product with the rows above it, then joined).
fn solve<T: TensorOps>(a: &T) -> Result<T> {
    let d = a.dims();
    let rank = d.len();
    let c = d[rank - 1];
    let mut t = a.narrow(rank - 2, 0, 1)?.contiguous()?;
    for i in 1..c {
        let row = a
            .narrow(rank - 2, i, 1)?
            .narrow(rank - 1, 0, i)?
            .contiguous()?;
        let sub = t.narrow(rank - 1, 0, i)?.contiguous()?;
        let new = row.add(&row.matmul(&sub)?)?;
        drop((row, sub));
        let new = pad(&new, rank - 1, c - i)?;
        let next = T::cat(&[&t, &new], rank - 2)?;
        drop((t, new));
        t = next;
    }
    Ok(t)
}
