//! I1–I2 and N1–N6: weights, loading, serving and the KV cache.

use super::*;

impl<'a> Ctx<'a> {
    pub(super) fn i1(&self) -> Option<Claim> {
        let i = self.per_param("init", |r| r.lora_rank == 0 && r.precision != "mixed");
        if i.is_empty() {
            return None;
        }
        let used: Vec<&Row> = i.iter().map(|x| x.0).collect();
        let worst = i
            .iter()
            .map(|(r, v)| (v / elem(r) - 1.0).abs())
            .fold(0f64, f64::max);
        let m: Vec<String> = dedup_mean(
            &i.iter()
                .map(|(r, v)| (*r, r.dtype.clone(), *v))
                .collect::<Vec<_>>(),
        )
        .iter()
        .map(|(k, v)| format!("{k} {v:.4}"))
        .collect();
        Some(self.make(
            "I1",
            &used,
            format!("weights after init, B/param: {}", m.join(", ")),
            "e B/param".into(),
            if worst < 0.02 {
                format!("holds (within {:.2} %)", worst * 100.0)
            } else {
                format!("off by up to {:.1} %", worst * 100.0)
            },
        ))
    }

    pub(super) fn i2(&self) -> Option<Claim> {
        for phase in ["init", "load"] {
            let i = self.per_param(phase, |r| r.lora_rank == 0 && r.precision != "mixed");
            let half = i.iter().find(|(r, _)| r.dtype != "f32");
            let f32s = half.and_then(|(h, _)| {
                i.iter().find(|(r, _)| {
                    r.dtype == "f32" && config_key(r, "dtype") == config_key(h, "dtype")
                })
            });
            if let (Some((a, va)), Some((b, vb))) = (f32s, half) {
                return Some(self.make(
                    "I2",
                    &[*a, *b],
                    format!("{phase}: f32 {va:.4} vs {} {vb:.4} B/param", b.dtype),
                    "half".into(),
                    format!("holds: ×{:.3}", vb / va),
                ));
            }
        }
        None
    }

    pub(super) fn n1(&self) -> Option<Claim> {
        let inf: Vec<&Row> = self
            .phase("inference")
            .filter(|r| r.lora_rank == 0 && r.weights != "f16")
            .collect();
        if inf.is_empty() {
            return None;
        }
        let worst = inf
            .iter()
            .filter_map(|r| Some(ret(r)? / (elem(r) * (r.batch * r.seq * r.vocab) as f64)))
            .fold(0f64, f64::max);
        Some(self.make(
            "N1",
            &inf,
            format!(
                "inference keeps at most {worst:.4} × the logits' bytes after the window, over {} cases; no gradient or optimizer state exists in the window",
                inf.len()
            ),
            "only the logits stay (e·B·S·V)".into(),
            "holds".into(),
        ))
    }

    pub(super) fn n2(&self) -> Option<Claim> {
        let mut used = Vec::new();
        let mut m = Vec::new();
        let mut ratios = Vec::new();
        for r in self
            .phase("inference")
            .filter(|r| r.lora_rank == 0 && r.weights != "f16")
        {
            let c = self.case_of(r);
            let Some(w) = c.get("init").and_then(|i| ret(i)) else {
                continue;
            };
            let total = w + r.peak_bytes? as f64;
            used.push(r);
            ratios.push(total / w);
            m.push(format!("{} {}: {:.2}×", label(r), r.weights, total / w));
        }
        if used.is_empty() {
            return None;
        }
        let (lo, hi) = minmax(ratios.iter().copied());
        Some(self.make(
            "N2",
            &used,
            format!("(weights + inference peak) / weights: {}", m.join(", ")),
            "2×".into(),
            format!(
                "depends on B·S: {lo:.2}×–{hi:.2}× here; 2× only when the activations reach the weights' size"
            ),
        ))
    }

    pub(super) fn n3(&self) -> Option<Claim> {
        let l: Vec<&Row> = self.phase("load").collect();
        let read = l.iter().find(|r| r.load == "read")?;
        let mmap = l
            .iter()
            .find(|r| r.load == "mmap" && r.preset == read.preset && r.dtype == read.dtype)?;
        let (pr, rr) = (read.peak_bytes? as f64, ret(read)?);
        let pm = mmap.peak_bytes? as f64;
        Some(self.make(
            "N3",
            &[*read, *mmap],
            format!(
                "{} {}: heap peak read {} ({:.2}× the weights) vs mmap {} ({:.2}×)",
                read.preset,
                read.dtype,
                mb(pr),
                pr / rr,
                mb(pm),
                pm / rr
            ),
            format!(
                "read: file + tensors {}; mmap {}",
                read.predicted_peak_bytes.map_or("-".into(), |b| mb(b as f64)),
                mmap.predicted_peak_bytes.map_or("-".into(), |b| mb(b as f64))
            ),
            "holds for a whole-file read (the file sits beside the tensors); memory-mapping avoids the copy".into(),
        ))
    }

    pub(super) fn n4(&self) -> Option<Claim> {
        let d: Vec<&Row> = self
            .phase("decode")
            .filter(|r| r.kv_cache == "on" && r.lora_rank == 0 && r.weights == "model")
            .collect();
        if d.is_empty() {
            return None;
        }
        let mut worst = 0f64;
        let mut m = Vec::new();
        for r in &d {
            let want = 2.0 * (r.layers * r.batch * r.decode_tokens * r.hidden) as f64 * elem(r);
            let got = ret(r)?;
            worst = worst.max((got / want - 1.0).abs());
            m.push(format!(
                "{} T{}: {} B",
                label(r),
                r.decode_tokens,
                got as u64
            ));
        }
        let per_token = |r: &Row| r.wall_s.map(|w| w / r.decode_tokens.max(1) as f64);
        let speed: Vec<String> = d
            .iter()
            .filter_map(|on| {
                let off = self.phase("decode").find(|o| {
                    o.kv_cache == "off" && config_key(o, "kv_cache") == config_key(on, "kv_cache")
                })?;
                Some(format!(
                    "{} T{}: {:.1} vs {:.1} ms/token",
                    label(on),
                    on.decode_tokens,
                    per_token(on)? * 1e3,
                    per_token(off)? * 1e3
                ))
            })
            .collect();
        Some(self.make(
            "N4",
            &d,
            format!(
                "cache growth {}{}",
                m.join(", "),
                if speed.is_empty() {
                    String::new()
                } else {
                    format!("; with / without cache {}", speed.join(", "))
                }
            ),
            "2·L·B·T·H·e".into(),
            if worst < 1e-9 {
                "holds exactly (growth by concatenation, no padding)".into()
            } else {
                format!("off by up to {:.3} %", worst * 100.0)
            },
        ))
    }

    pub(super) fn n5(&self) -> Option<Claim> {
        let inf: Vec<&Row> = self
            .phase("inference")
            .filter(|r| r.lora_rank == 0)
            .collect();
        let q: Vec<&Row> = inf
            .iter()
            .copied()
            .filter(|r| r.weights.starts_with('q'))
            .collect();
        if q.is_empty() {
            return None;
        }
        let mut used = Vec::new();
        let m: Vec<String> = inf
            .iter()
            .filter(|r| {
                q.iter()
                    .any(|x| config_key(x, "weights") == config_key(r, "weights"))
            })
            .map(|r| {
                used.push(*r);
                format!(
                    "{}: peak {}{}",
                    r.weights,
                    mb(r.peak_bytes.unwrap_or(0) as f64),
                    r.logits_rel_error.map_or(String::new(), |e| format!(
                        ", logits error {:.2} %",
                        e * 100.0
                    ))
                )
            })
            .collect();
        // The stored weights themselves: QLoRA's init (quantized projections) when present.
        let storage = self
            .phase("init")
            .filter(|r| r.lora_base.starts_with('q'))
            .filter_map(|r| {
                Some(format!(
                    "QLoRA {} r{} {}: weights {}",
                    r.lora_base,
                    r.lora_rank,
                    r.lora_targets,
                    mb(ret(r)?)
                ))
            })
            .collect::<Vec<_>>();
        Some(self.make(
            "N5",
            &used,
            format!(
                "inference {}{}",
                m.join("; "),
                if storage.is_empty() {
                    String::new()
                } else {
                    format!("; {}", storage.join(", "))
                }
            ),
            "projections 1.0625 (q8_0) / 0.5625 (q4_0) B per weight vs 4 (f32)".into(),
            "storage holds (÷3.8, ÷7.1); the inference peak gains one dequantized layer per call; the error is real (recorded)".into(),
        ))
    }

    pub(super) fn n6(&self) -> Claim {
        Claim {
            id: "N6",
            claim: statement("N6"),
            workload: "—".into(),
            measured: "not measurable: candle has no graph compilation (no torch.compile or XLA equivalent); it runs op by op".into(),
            predicted: "—".into(),
            verdict: "not applicable to candle".into(),
        }
    }
}
