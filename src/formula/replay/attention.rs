//! Mirror of `model::attention`: the composed softmax, rotary positions, `repeat_kv`, and
//! standard (composed or fused), efficient and tiled attention with its cached step.

use super::norm::Norm;
use super::proj::Linear;
use crate::formula::symbolic::Sym;
use crate::model::kernels::Kernel;

/// candle-nn `ops::softmax` (composed).
pub(super) fn softmax(xs: &Sym, dim: usize) -> Sym {
    let max = xs.max_keepdim(dim);
    let diff = xs.broadcast_sub(&max);
    let num = diff.exp();
    let den = num.sum_keepdim(&[dim]);
    num.broadcast_div(&den)
}

/// Mirror of `model::rotary::apply_rotary`.
pub(super) fn apply_rotary(x: &Sym, cos: &Sym, sin: &Sym, offset: usize) -> Sym {
    let (s, d) = (x.dims()[2], x.dims()[3]);
    let cos = cos.narrow(0, offset, s);
    let sin = sin.narrow(0, offset, s);
    let x1 = x.narrow(3, 0, d / 2);
    let x2 = x.narrow(3, d / 2, d / 2);
    let (a, b) = (x1.broadcast_mul(&cos), x2.broadcast_mul(&sin));
    let r1 = a.sub(&b);
    drop((a, b));
    let (a, b) = (x2.broadcast_mul(&cos), x1.broadcast_mul(&sin));
    let r2 = a.add(&b);
    drop((a, b));
    Sym::cat(&[&r1, &r2], 3)
}

/// Mirror of `model::rotary::repeat_kv` (candle-transformers' `utils::repeat_kv`).
pub(super) fn repeat_kv(x: Sym, n: usize) -> Sym {
    if n == 1 {
        return x;
    }
    let d = x.dims().to_vec();
    let parts: Vec<&Sym> = vec![&x; n];
    Sym::cat(&parts, 2).reshape(&[d[0], d[1] * n, d[2], d[3]])
}

/// The rotary tables and the first position (mirror of the model's `Rotary`).
#[derive(Clone, Copy)]
pub(super) struct Rotary<'a> {
    pub(super) cos: &'a Sym,
    pub(super) sin: &'a Sym,
    pub(super) offset: usize,
}

/// Mirror of the model's attention `Core`.
#[derive(Clone, Copy)]
pub(super) struct Core {
    pub(super) heads: usize,
    pub(super) kv_heads: usize,
    pub(super) efficient: bool,
    pub(super) tiled: bool,
    pub(super) fused: bool,
    pub(super) causal: bool,
    /// A sliding window: the cache keeps the last W keys and values.
    pub(super) window: Option<usize>,
}

impl Core {
    /// Mirror of `Core::attend_any`.
    pub(super) fn attend_any(&self, q: Sym, k: Sym, v: Sym, mask: Option<&Sym>) -> Sym {
        if self.tiled {
            // Mirror of `tiled_attention::attention`: the tiled forward on detached views, then
            // the node's copy of the output (the precomputed one freed inside its forward).
            let (b, s, d) = (q.dims()[0], q.dims()[2], q.dims()[3]);
            let dv = v.dims()[3];
            let scale = (1.0 / (d as f64).sqrt()) as f32;
            let (out, lse) = crate::model::tiled_attention::forward(
                &q.detach(),
                &k.detach(),
                &v.detach(),
                scale as f64,
                self.causal,
                self.window.unwrap_or(0),
            )
            .expect("symbolic tiled attention");
            let kernel = Kernel::TiledAttention {
                scale,
                causal: self.causal,
                window: self.window.unwrap_or(0),
            };
            let y = Sym::kernel(kernel, &[&q, &k, &v, &lse], out.dims(), out.dtype());
            drop((out, lse, q, k, v));
            return y.transpose(1, 2).reshape(&[b, s, self.heads * dv]);
        }
        if self.efficient {
            let (b, s, d) = (q.dims()[0], q.dims()[2], q.dims()[3]);
            let dv = v.dims()[3];
            let v = if dv < d {
                let vd = v.dims().to_vec();
                let pad = Sym::new(v.ledger(), &[vd[0], vd[1], vd[2], d - dv], v.dtype());
                let padded = Sym::cat(&[&v, &pad], 3);
                drop((v, pad));
                padded
            } else {
                v
            };
            let y = q.efficient_attention(&k, &v);
            drop((q, k, v));
            let y = if dv < d {
                y.narrow(3, 0, dv).contiguous()
            } else {
                y
            };
            return y.reshape(&[b, s, self.heads * dv]);
        }
        self.attend(q, k, v, mask)
    }

    /// Mirror of `Core::attend`.
    pub(super) fn attend(&self, q: Sym, k: Sym, v: Sym, mask: Option<&Sym>) -> Sym {
        let (b, s) = (q.dims()[0], q.dims()[2]);
        let dv = v.dims()[3];
        if self.fused {
            let d = q.dims()[3];
            let scale = (1.0 / (d as f64).sqrt()) as f32;
            let probs = q.attn_probs(&k, scale, self.causal);
            drop((q, k));
            let y = probs.matmul(&v);
            drop((probs, v));
            let y = if self.kv_heads == self.heads {
                y
            } else {
                y.reshape(&[b, self.heads, s, dv])
            };
            return y.transpose(1, 2).reshape(&[b, s, self.heads * dv]);
        }
        let (k, v) = self.repeat(k, v);
        // `(q.matmul(&k.t())? * scale)?`: the product is passed by value to `*`.
        let scores = {
            let m = q.matmul(&k.t());
            let r = m.affine(1.0);
            drop(m);
            r
        };
        drop((q, k));
        // The unmasked scores stay (a shadowed binding) until the attention returns.
        let scores = match mask {
            Some(m) => scores.broadcast_add(m),
            None => scores,
        };
        let probs = softmax(&scores, 3);
        drop(scores);
        let y = probs.matmul(&v);
        drop((probs, v));
        y.transpose(1, 2).reshape(&[b, s, self.heads * dv])
    }

    /// Mirror of `Core::attend_sinks`.
    pub(super) fn attend_sinks(
        &self,
        q: Sym,
        k: Sym,
        v: Sym,
        mask: Option<&Sym>,
        sinks: &Sym,
    ) -> Sym {
        let (b, s) = (q.dims()[0], q.dims()[2]);
        let dv = v.dims()[3];
        let (k, v) = self.repeat(k, v);
        // `(q.matmul(&k.t())? * scale)?`: the product is passed by value to `*`.
        let scores = {
            let m = q.matmul(&k.t());
            let r = m.affine(1.0);
            drop(m);
            r
        };
        drop((q, k));
        // The unmasked scores stay (a shadowed binding) until the attention returns.
        let scores = match mask {
            Some(m) => scores.broadcast_add(m),
            None => scores,
        };
        let t = scores.dims()[3];
        let sink = sinks
            .reshape(&[1, self.heads, 1, 1])
            .broadcast_as(&[b, self.heads, s, 1])
            .contiguous();
        let all = Sym::cat(&[&scores, &sink], 3);
        drop((scores, sink));
        let probs = softmax(&all, 3);
        drop(all);
        let kept = probs.narrow(3, 0, t);
        drop(probs);
        let y = kept.matmul(&v);
        drop((kept, v));
        y.transpose(1, 2).reshape(&[b, s, self.heads * dv])
    }

    /// Mirror of `Core::repeat`.
    fn repeat(&self, k: Sym, v: Sym) -> (Sym, Sym) {
        let group = self.heads / self.kv_heads;
        (repeat_kv(k, group), repeat_kv(v, group))
    }
}

/// Mirror of `attention::append`.
pub(super) fn append(prev: Option<(Sym, Sym)>, a: Sym, b: Sym) -> (Sym, Sym) {
    match prev {
        None => (a, b),
        Some((pa, pb)) => {
            let a = Sym::cat(&[&pa, &a], 2);
            drop(pa);
            let b = Sym::cat(&[&pb, &b], 2);
            (a, b)
        }
    }
}

impl Rotary<'_> {
    /// Mirror of the model's `Rotary::apply`.
    pub(super) fn apply(&self, t: &Sym, fused: bool) -> Sym {
        if fused {
            let s = t.dims()[2];
            Sym::kernel(
                Kernel::Rotary,
                &[
                    t,
                    &self.cos.narrow(0, self.offset, s),
                    &self.sin.narrow(0, self.offset, s),
                ],
                t.dims(),
                t.dtype(),
            )
        } else {
            apply_rotary(t, self.cos, self.sin, self.offset)
        }
    }
}

pub(super) struct Attention {
    pub(super) q: Linear,
    pub(super) k: Linear,
    pub(super) v: Linear,
    pub(super) o: Linear,
    /// Qwen3's q/k norms (mirror of the model's `qk_norm`).
    pub(super) qk_norm: Option<(Norm, Norm)>,
    /// gpt-oss's sinks `(A)`.
    pub(super) sinks: Option<Sym>,
    pub(super) head_dim: usize,
    pub(super) core: Core,
}

impl Attention {
    /// Mirror of the model's `Attention::heads`.
    pub(super) fn heads(&self, x: &Sym, mask: Option<&Sym>, rotary: Option<Rotary>) -> Sym {
        let (q, k, v) = self.qkv(x, rotary, self.core.efficient && !self.core.tiled);
        match &self.sinks {
            Some(sinks) => self.core.attend_sinks(q, k, v, mask, sinks),
            None => self.core.attend_any(q, k, v, mask),
        }
    }

    /// Mirror of the model's `Attention::qkv`.
    pub(super) fn qkv(&self, x: &Sym, rotary: Option<Rotary>, strided: bool) -> (Sym, Sym, Sym) {
        let (b, s) = (x.dims()[0], x.dims()[1]);
        let d = self.head_dim;
        let split = |t: Sym, n: usize| -> Sym {
            let t = t.reshape(&[b, s, n, d]).transpose(1, 2);
            if strided { t } else { t.contiguous() }
        };
        if let (Some(r), true) = (rotary, self.core.fused) {
            let heads = |t: Sym, n: usize| t.reshape(&[b, s, n, d]);
            let (q, k) = (
                heads(self.q.forward(x), self.core.heads),
                heads(self.k.forward(x), self.core.kv_heads),
            );
            let (q, k) = match &self.qk_norm {
                Some((qn, kn)) => (qn.forward(&q), kn.forward(&k)),
                None => (q, k),
            };
            let q = r.apply(&q.transpose(1, 2), true);
            let k = r.apply(&k.transpose(1, 2), true);
            let v = split(self.v.forward(x), self.core.kv_heads);
            return (q, k, v);
        }
        let rotate = |t: Sym| -> Sym {
            match rotary {
                None => t,
                Some(r) => r.apply(&t, self.core.fused),
            }
        };
        let (q, k) = (
            split(self.q.forward(x), self.core.heads),
            split(self.k.forward(x), self.core.kv_heads),
        );
        let (q, k) = match &self.qk_norm {
            Some((qn, kn)) => (qn.forward(&q), kn.forward(&k)),
            None => (q, k),
        };
        let q = rotate(q);
        let k = rotate(k);
        let v = split(self.v.forward(x), self.core.kv_heads);
        (q, k, v)
    }

    /// Mirror of the model's `Attention::forward_cached`.
    pub(super) fn heads_cached(
        &self,
        x: &Sym,
        mask: Option<&Sym>,
        rotary: Option<Rotary>,
        cache: &mut Option<(Sym, Sym)>,
    ) -> Sym {
        let (q, k, v) = self.qkv(x, rotary, false);
        let first = cache.is_none();
        let (k, v) = append(cache.take(), k, v);
        let kept = match self.core.window {
            Some(w) if k.dims()[2] > w => {
                let t = k.dims()[2];
                let kk = k.narrow(2, t - w, w).contiguous();
                let kv = v.narrow(2, t - w, w).contiguous();
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
        if let Some(sinks) = &self.sinks {
            self.core.attend_sinks(q, k, v, mask, sinks)
        } else if first && q.dims()[2] > 1 {
            self.core.attend_any(q, k, v, mask)
        } else {
            self.core.attend(q, k, v, mask)
        }
    }

    /// `f` on the projections, `w` on the q/k norms' weights, in model order.
    pub(super) fn map(&self, f: &dyn Fn(&Linear) -> Linear, w: &dyn Fn(&Sym) -> Sym) -> Self {
        Attention {
            q: f(&self.q),
            k: f(&self.k),
            v: f(&self.v),
            o: f(&self.o),
            qk_norm: self.qk_norm.as_ref().map(|(qn, kn)| (qn.map(w), kn.map(w))),
            sinks: self.sinks.as_ref().map(w),
            head_dim: self.head_dim,
            core: self.core,
        }
    }
}
