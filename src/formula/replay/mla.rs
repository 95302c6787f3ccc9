//! Mirror of `model::mla`: multi-head latent attention, its latent cache, decode steps over
//! the latent (the absorbed form) and the decompression of the others.

use super::attention::{Core, Rotary};
use super::proj::Linear;
use super::{Norm, lift};
use crate::formula::symbolic::Sure;
use crate::formula::symbolic::Sym;
use crate::model::mla::MlaShape;

pub(super) struct Mla {
    pub(super) q: Linear,
    pub(super) q_a: Option<(Linear, Norm)>,
    pub(super) kv_a: Linear,
    pub(super) kv_a_norm: Norm,
    pub(super) kv_b: Linear,
    pub(super) o: Linear,
    pub(super) shape: MlaShape,
    pub(super) core: Core,
}

/// Mirror of `mla::heads_first`.
fn heads_first(x: &Sym, a: usize, d: usize) -> Sym {
    let (b, s) = (x.dims()[0], x.dims()[1]);
    if s == 1 {
        return x.reshape(&[b, a, 1, d]);
    }
    x.reshape(&[b, s, a, d]).transpose(1, 2).contiguous()
}

/// Mirror of `mla::rotate`: the de-interleaving copy, then the rotary embedding.
fn rotate(x: &Sym, rotary: Rotary, fused: bool) -> Sym {
    let d = x.dims().to_vec();
    let (b, n, s, r) = (d[0], d[1], d[2], d[3]);
    let halves = x
        .reshape(&[b, n, s, r / 2, 2])
        .transpose(3, 4)
        .reshape(&[b, n, s, r]);
    rotary.apply(&halves, fused).sure()
}

impl Mla {
    /// Mirror of `Mla::latent`.
    fn latent(&self, x: &Sym, rotary: Rotary) -> (Sym, Sym, Sym) {
        let (b, s) = (x.dims()[0], x.dims()[1]);
        let m = &self.shape;
        let (a, n, r, l) = (
            self.core.heads,
            m.qk_nope_head_dim,
            m.qk_rope_head_dim,
            m.kv_lora_rank,
        );
        let q = match &self.q_a {
            None => self.q.forward(x).sure(),
            Some((q_a, norm)) => {
                let qa = norm.forward(&q_a.forward(x).sure()).sure();
                self.q.forward(&qa).sure()
            }
        };
        let q = heads_first(&q, a, n + r);
        let q_nope = q.narrow(3, 0, n);
        let q_pe = rotate(&q.narrow(3, n, r), rotary, self.core.fused);
        let q = Sym::cat(&[&q_nope, &q_pe], 3);
        drop((q_nope, q_pe));
        let ckv = self.kv_a.forward(x).sure();
        let c = self
            .kv_a_norm
            .forward(&ckv.narrow(2, 0, l).contiguous())
            .sure()
            .reshape(&[b, 1, s, l]);
        let k_pe = ckv.narrow(2, l, r).reshape(&[b, 1, s, r]);
        drop(ckv);
        let k_pe = rotate(&k_pe, rotary, self.core.fused);
        (q, c, k_pe)
    }

    /// Mirror of `Mla::decompress`.
    fn decompress(&self, c: &Sym, k_pe: &Sym) -> (Sym, Sym) {
        let (b, t) = (c.dims()[0], c.dims()[2]);
        let m = &self.shape;
        let (a, n, r, dv) = (
            self.core.heads,
            m.qk_nope_head_dim,
            m.qk_rope_head_dim,
            m.v_head_dim,
        );
        let kv = heads_first(&self.kv_b.forward(&c.squeeze(1)).sure(), a, n + dv);
        let k_nope = kv.narrow(3, 0, n);
        let k_pe = k_pe.broadcast_as(&[b, a, t, r]).contiguous();
        let k = Sym::cat(&[&k_nope, &k_pe], 3);
        drop((k_nope, k_pe));
        let v = kv.narrow(3, n, dv).contiguous();
        (k, v)
    }

    /// Mirror of the model's `Mla::heads`.
    pub(super) fn heads(&self, x: &Sym, mask: Option<&Sym>, rotary: Option<Rotary>) -> Sym {
        let rotary = rotary.expect("MLA has rotary tables");
        let (q, c, k_pe) = self.latent(x, rotary);
        let (k, v) = self.decompress(&c, &k_pe);
        drop((c, k_pe));
        self.core.attend_any(q, k, v, mask).sure()
    }

    /// Mirror of the model's `Mla::heads_cached`.
    pub(super) fn heads_cached(
        &self,
        x: &Sym,
        mask: Option<&Sym>,
        rotary: Option<Rotary>,
        cache: &mut Option<(Sym, Sym)>,
    ) -> Sym {
        let rotary = rotary.expect("MLA has rotary tables");
        let (q, c, k_pe) = self.latent(x, rotary);
        let first = cache.is_none();
        let (c, k_pe) = crate::model::attention::append(cache.take(), c, k_pe).sure();
        if !first
            && q.dims()[2] == 1
            && let Some(w) = self.absorbable(q.dtype())
        {
            let y = self.absorbed_step(q, &c, &k_pe, &w);
            *cache = Some((c, k_pe));
            return y;
        }
        let (k, v) = self.decompress(&c, &k_pe);
        *cache = Some((c, k_pe));
        if first && q.dims()[2] > 1 {
            self.core.attend_any(q, k, v, mask).sure()
        } else {
            self.core.attend(q, k, v, mask).sure()
        }
    }

    /// Mirror of `Mla::absorbable`.
    fn absorbable(&self, dtype: crate::formula::symbolic::DType) -> Option<Sym> {
        let p = &self.kv_b;
        if self.shape.decompressed_decode || p.lora.is_some() {
            return None;
        }
        Some(super::proj::dense_weight(p, dtype))
    }

    /// Mirror of `Mla::absorbed_step`.
    fn absorbed_step(&self, q: Sym, c: &Sym, k_pe: &Sym, w: &Sym) -> Sym {
        let (b, a) = (q.dims()[0], q.dims()[1]);
        let m = &self.shape;
        let (n, r, dv, l) = (
            m.qk_nope_head_dim,
            m.qk_rope_head_dim,
            m.v_head_dim,
            m.kv_lora_rank,
        );
        let w = w.reshape(&[a, n + dv, l]);
        let q_nope = q
            .narrow(3, 0, n)
            .reshape(&[b, a, n])
            .transpose(0, 1)
            .contiguous();
        let q_lat = q_nope.matmul(&w.narrow(1, 0, n));
        drop(q_nope);
        let q_lat = q_lat.transpose(0, 1).reshape(&[b, a, 1, l]);
        let scale = ((l + r) as f64 / (n + r) as f64).sqrt();
        let q_abs = {
            let joined = Sym::cat(&[&q_lat, &q.narrow(3, n, r)], 3);
            let scaled = joined.affine(scale);
            drop(joined);
            scaled
        };
        drop((q_lat, q));
        let k_abs = Sym::cat(&[c, k_pe], 3);
        let core = Core {
            kv_heads: 1,
            ..self.core
        };
        let y = core.attend(q_abs, k_abs, c.clone(), None).sure();
        let o_lat = y.reshape(&[b, a, l]).transpose(0, 1).contiguous();
        drop(y);
        let out = o_lat.matmul(&w.narrow(1, n, dv).transpose(1, 2));
        drop(o_lat);
        out.transpose(0, 1).reshape(&[b, 1, a * dv])
    }

    /// The projections in model order.
    pub(super) fn linears(&self) -> Vec<&Linear> {
        let mut v = Vec::new();
        if let Some((q_a, _)) = &self.q_a {
            v.push(q_a);
        }
        v.extend([&self.q, &self.kv_a, &self.kv_b, &self.o]);
        v
    }

    /// The norms' weights.
    pub(super) fn norm_weights(&self) -> Vec<Sym> {
        let mut v = Vec::new();
        if let Some((_, n)) = &self.q_a {
            v.extend(n.weights().into_iter().cloned());
        }
        v.extend(self.kv_a_norm.weights().into_iter().cloned());
        v
    }

    pub(super) fn map(&self, f: &dyn Fn(&Linear) -> Linear, w: &dyn Fn(&Sym) -> Sym) -> Self {
        Mla {
            q: f(&self.q),
            q_a: self.q_a.as_ref().map(|(p, n)| (f(p), lift(n, w))),
            kv_a: f(&self.kv_a),
            kv_a_norm: lift(&self.kv_a_norm, w),
            kv_b: f(&self.kv_b),
            o: f(&self.o),
            shape: self.shape,
            core: self.core,
        }
    }
}
