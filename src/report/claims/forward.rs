//! F1–F6: activations against batch, sequence, checkpointing and attention.

use super::*;
use crate::step::Phase;

/// An axis a sweep varies: config key, symbol, value.
type Axis = (&'static str, &'static str, fn(&Row) -> u64);

/// F1: a sweep is proportional when the line through it fits (R² at least this) and passes
/// near the origin (its fixed part at most this share of the largest value, in percent).
const F1_R2: f64 = 0.999;
const F1_FIXED_PCT: f64 = 5.0;
const F1_CRITERION: &str = "per sweep of ≥ 3 sizes (others equal), standard attention's A·B·S²·L scores (×6 with composed ops) taken out first: affine fit R² ≥ 0.999 and fixed part ≤ 5 % of the largest size's graph";

const F3_CRITERION: &str = "> 20 GB at B 4 × S 4096: one block measured on the real width (two depths); the per-block formula must match it within 1 % before it carries the block to full size (a derived figure)";

/// F3: the per-block formula carries the measured block to full size only when it matches the
/// measured block within this share (stated before looking at the rows).
const F3_BLOCK_TOLERANCE: f64 = 0.01;

/// F5: checkpointing saves memory when its smallest peak is at most this share of K 0's; the
/// time cost is shown when every sample at that K is slower than every K 0 sample, with at
/// least this many samples each.
const F5_MEMORY: f64 = 0.5;
const F5_SAMPLES: usize = 3;
const F5_CRITERION: &str = "memory: smallest train-step peak ≤ 50 % of K 0's; time: ≥ 3 wall samples per K, a cost when every sample at that K is slower than every K 0 sample";

/// F4: the train-step peak is affine in B (R² at least this) and the per-sequence part is at
/// least this share of the peak at the largest batch.
const F4_R2: f64 = 0.999;
const F4_SHARE: f64 = 0.5;
const F4_CRITERION: &str = "the batch sweep of ≥ 3 sizes with the largest peak: affine fit R² ≥ 0.999 and the per-sequence part ≥ 50 % of the largest batch's peak (halving B then cuts ≥ 25 %)";

impl<'a> Ctx<'a> {
    pub(super) fn f1(&self) -> Option<Claim> {
        let fw: Vec<&Row> = self
            .phase(Phase::Forward)
            .filter(|r| r.lora_rank == 0 && r.checkpoint == 0 && r.precision != "mixed")
            .collect();
        let axes: [Axis; 4] = [
            ("batch", "B", |r| r.batch),
            ("seq", "S", |r| r.seq),
            ("hidden", "H", |r| r.hidden),
            ("layers", "L", |r| r.layers),
        ];
        let mut used = Vec::new();
        let mut measured = Vec::new();
        // Per axis (and attention kind for S): sweeps judged, sweeps that pass, the worst.
        let mut judged: BTreeMap<String, (usize, usize, String)> = BTreeMap::new();
        let mut two_point = 0;
        for (axis, sym, x) in axes {
            for s in sweeps(&fw, Phase::Forward, axis, x) {
                // Standard attention keeps `A·B·S²` scores per layer beside the part the claim is
                // about (the fused kernel its probabilities; candle's composed ops six such
                // tensors): that known term is taken out before the line is fitted, and its share
                // of the largest graph is said.
                let quadratic = |r: &Row| -> f64 {
                    if r.attention == "standard" {
                        let e = if r.dtype == "f32" { 4.0 } else { 2.0 };
                        let copies = if r.kernels == "composed" { 6.0 } else { 1.0 };
                        copies * (r.heads * r.batch * r.seq * r.seq * r.layers) as f64 * e
                    } else {
                        0.0
                    }
                };
                let pts: Vec<(f64, f64)> = s
                    .iter()
                    .filter_map(|r| Some((x(r) as f64, ret(r)? - quadratic(r))))
                    .collect();
                let s2_share = s
                    .last()
                    .and_then(|r| Some(100.0 * quadratic(r) / ret(r)?))
                    .filter(|&p| p > 0.0);
                if pts.len() < 3 {
                    two_point += 1;
                    continue;
                }
                let Some(a) = Affine::fit(&pts) else { continue };
                let (xmax, ymax) = pts[pts.len() - 1];
                let fixed_pct = 100.0 * a.fixed / ymax;
                let ok = a.r2 >= F1_R2 && fixed_pct.abs() <= F1_FIXED_PCT;
                used.extend(s.iter().copied());
                let what = if axis == "seq" {
                    format!("{sym} ({} attention)", s[0].attention)
                } else {
                    sym.to_string()
                };
                measured.push(format!(
                    "{what} {} on {}: graph {}{}; affine R² {:.5}, fixed part {fixed_pct:+.1} % of the {sym} {xmax} value",
                    slash(pts.iter().map(|p| p.0)),
                    label_without(s[0], axis),
                    slash(pts.iter().map(|p| mb(p.1))),
                    s2_share.map_or(String::new(), |p| format!(
                        " less the attention scores' A·B·S²·L ({p:.1} % of the largest graph)"
                    )),
                    a.r2
                ));
                let e = judged.entry(what).or_insert((0, 0, String::new()));
                e.0 += 1;
                if ok {
                    e.1 += 1;
                } else if e.2.is_empty() {
                    e.2 = format!("R² {:.5}, fixed {fixed_pct:+.1} %", a.r2);
                }
            }
        }
        if judged.is_empty() {
            if two_point == 0 {
                return None;
            }
            return Some(self.make(
                "F1",
                &used,
                format!("{two_point} sweep(s) of two sizes only: a line through two points always fits"),
                "activations = (per-unit part) × the axis".into(),
                F1_CRITERION,
                "open: sweeps of three or more sizes (`seed-checkpoint`'s B 1/2/4/8, `seed-attention`'s S 64/128/256) would decide it".into(),
            ));
        }
        let parts: Vec<String> = judged
            .iter()
            .map(|(what, (n, ok, worst))| {
                if ok == n {
                    format!("proportional in {what} ({n} sweep(s))")
                } else {
                    format!(
                        "not proportional in {what} ({} of {n} fail: {worst})",
                        n - ok
                    )
                }
            })
            .collect();
        let all = judged.values().all(|(n, ok, _)| n == ok);
        let none = judged.values().all(|(_, ok, _)| *ok == 0);
        let swept: Vec<&str> = judged.keys().map(|k| &k[..1]).collect();
        let unswept: Vec<&str> = ["B", "S", "H", "L"]
            .into_iter()
            .filter(|a| !swept.contains(a))
            .collect();
        let kind = if all && unswept.is_empty() {
            "holds"
        } else if all {
            "holds for the axes swept"
        } else if none {
            "does not hold"
        } else {
            "partly"
        };
        Some(self.make(
            "F1",
            &used,
            measured.join("; "),
            "activations = (per-unit part) × the axis; standard attention adds A·B·S² scores per layer (the fused kernel's probabilities; 6 such tensors with candle's composed ops)".into(),
            F1_CRITERION,
            format!(
                "{kind}: {}{}",
                parts.join("; "),
                if unswept.is_empty() {
                    String::new()
                } else {
                    format!("; {} not swept at three or more sizes", unswept.join(", "))
                }
            ),
        ))
    }

    pub(super) fn f2(&self) -> Option<Claim> {
        // ViT-B/16's shape at 224 px (any classes), plain training forward.
        let mut v: Vec<&Row> = self
            .phase(Phase::Forward)
            .filter(|r| {
                r.model == "vit"
                    && plain(r)
                    && (r.image_px, r.patch_px, r.hidden, r.layers) == (224, 16, 768, 12)
            })
            .collect();
        v.sort_by_key(|r| (r.dtype.clone(), r.batch));
        let big = v.iter().copied().max_by_key(|r| r.batch)?;
        let per_image = ret(big)? / big.batch as f64;
        let m: Vec<String> = v
            .iter()
            .filter_map(|r| Some(format!("{} B{}: graph {}", r.dtype, r.batch, mb(ret(r)?))))
            .collect();
        let p: Vec<String> = v
            .iter()
            .filter_map(|r| {
                Some(format!(
                    "B{}: {}",
                    r.batch,
                    mb(r.predicted_retained_bytes? as f64)
                ))
            })
            .collect();
        let at32 = if big.batch >= 32 {
            format!("{} measured at batch {}", mb(ret(big)?), big.batch)
        } else {
            format!(
                "{} at batch 32 by the linear per-image term",
                mb(32.0 * per_image)
            )
        };
        let verdict = if per_image * 32.0 >= 1e9 {
            format!("holds: {at32}, {} per image", mb(per_image))
        } else {
            format!("does not hold here: {at32}")
        };
        Some(self.make(
            "F2",
            &v,
            m.join("; "),
            p.join("; "),
            "graph at B 32 ≥ 1 GB (measured at B 32, else the largest batch's per-image part × 32)",
            verdict,
        ))
    }

    pub(super) fn f3(&self) -> Option<Claim> {
        // Slices of a 7B model at its real width (H 4096, A 32): two depths at one (B, S)
        // give one block's activations, measured. Llama-2-7B's own blocks (SwiGLU, RoPE) when
        // present, else the GPT with LLaMA's widths (`llama-7b-shape`).
        let at_width = |model: &str| -> Vec<&'a Row> {
            self.phase(Phase::Forward)
                .filter(|r| r.model == model && plain(r) && r.hidden == 4096 && r.heads == 32)
                .collect()
        };
        let pair_in = |slice: &[&'a Row]| {
            slice.iter().find_map(|a| {
                slice
                    .iter()
                    .find(|b| {
                        b.layers > a.layers
                            && (b.batch, b.seq, &b.dtype, &b.run_id, &b.preset)
                                == (a.batch, a.seq, &a.dtype, &a.run_id, &a.preset)
                    })
                    .map(|b| (*a, *b))
            })
        };
        let llama = at_width("llama");
        let gpt = at_width("gpt");
        let (slice, pair, preset) = match pair_in(&llama) {
            Some(p) => (llama, Some(p), "llama-2-7b"),
            None => {
                let p = pair_in(&gpt);
                (gpt, p, "llama-7b-shape")
            }
        };
        let (full, checkpointed, per_block) = self.full.b4_s4096(preset);
        let carried = format!(
            "{preset}, B 4 × S 4096, 32 blocks, bf16: graph {} with standard attention, {} checkpointing every block",
            mb(full as f64),
            mb(checkpointed as f64)
        );
        let Some((a, b)) = pair else {
            return Some(Claim {
                id: "F3",
                claim: statement("F3"),
                workload: "`memfit predict --preset llama-2-7b --batch 4 --seq 4096 --dtype bf16 --device cuda --checkpoint 0,1`".into(),
                measured: "not measured in these results (seed-llama-real measures one- and two-block slices of Llama-2-7B)".into(),
                predicted: carried,
                criterion: F3_CRITERION.into(),
                verdict: "open: holds by the formulas, not measured here".into(),
            });
        };
        let dl = (b.layers - a.layers) as f64;
        let block = (ret(b)? - ret(a)?) / dl;
        let block_pred = (b.predicted_retained_bytes? - a.predicted_retained_bytes?) as f64 / dl;
        let per_block = per_block as f64;
        Some(self.make(
            "F3",
            &slice,
            format!(
                "{}, {} B{} S{}: graph L{} {} / L{} {} → one block {}",
                a.preset,
                a.dtype,
                a.batch,
                a.seq,
                a.layers,
                mb(ret(a)?),
                b.layers,
                mb(ret(b)?),
                mb(block)
            ),
            format!(
                "one block {} at the slice; f32 block at B 4 × S 4096 {}; {carried}",
                mb(block_pred),
                mb(per_block)
            ),
            F3_CRITERION,
            {
                // The measured slice decides whether the formula may carry it: a miss beyond the
                // tolerance leaves the full-size claim open.
                let miss = (block_pred - block).abs();
                let share = miss / block.abs().max(1.0);
                let checked = format!(
                    "the per-block formula is within {miss:.0} B ({:.4} %) of the measured block (tolerance {:.0} %)",
                    share * 100.0,
                    F3_BLOCK_TOLERANCE * 100.0
                );
                if share > F3_BLOCK_TOLERANCE {
                    format!(
                        "open: {checked}, so it does not carry the block to B 4 × S 4096"
                    )
                } else if per_block > 20e9 {
                    format!(
                        "derived: holds by far at full size: one block alone is {} at B 4 × S 4096 (f32), the whole bf16 graph {}; {checked}",
                        mb(per_block),
                        mb(full as f64)
                    )
                } else if full as f64 > 20e9 {
                    format!(
                        "derived: holds for the whole model: {} in bf16 (one f32 block {}); {checked}",
                        mb(full as f64),
                        mb(per_block)
                    )
                } else {
                    format!(
                        "derived: does not hold: the whole bf16 graph is {}; {checked}",
                        mb(full as f64)
                    )
                }
            },
        ))
    }

    pub(super) fn f4(&self) -> Option<Claim> {
        let ts: Vec<&Row> = self.phase(Phase::TrainStep).filter(|r| plain(r)).collect();
        // Only measured peaks: a row without one is left out, never counted as 0.
        let sweeps: Vec<Vec<(&Row, f64)>> = sweeps(&ts, Phase::TrainStep, "batch", |r| r.batch)
            .into_iter()
            .map(|s| {
                s.into_iter()
                    .filter_map(|r| Some((r, r.peak_bytes? as f64)))
                    .collect::<Vec<_>>()
            })
            .filter(|s| s.len() >= 3)
            .collect();
        let top = |s: &Vec<(&Row, f64)>| s.last().map_or(0.0, |p| p.1);
        let best = sweeps.iter().max_by(|a, b| top(a).total_cmp(&top(b)))?;
        let pts: Vec<(f64, f64)> = best.iter().map(|(r, y)| (r.batch as f64, *y)).collect();
        let f = Affine::fit(&pts)?;
        let (bmax, pmax) = pts[pts.len() - 1];
        let share = f.slope * bmax / pmax;
        let halved = 1.0 - f.at(bmax / 2.0) / pmax;
        let rows: Vec<&Row> = best.iter().map(|p| p.0).collect();
        Some(self.make(
            "F4",
            &rows,
            format!(
                "train-step peak of {} at B {}: {}{}",
                label_without(rows[0], "batch"),
                slash(rows.iter().map(|r| r.batch)),
                slash(pts.iter().map(|p| mb(p.1))),
                if sweeps.len() > 1 {
                    format!(" ({} other batch sweep(s) with smaller peaks not used)", sweeps.len() - 1)
                } else {
                    String::new()
                }
            ),
            format!(
                "affine: {} fixed + {} per sequence (R² {:.5})",
                mb(f.fixed),
                mb(f.slope),
                f.r2
            ),
            F4_CRITERION,
            if f.r2 < F4_R2 {
                format!("does not hold as stated: the peak is not affine in B (R² {:.5})", f.r2)
            } else if share >= F4_SHARE {
                format!(
                    "holds: the per-sequence part is {:.0} % of the B {bmax} peak; halving B cuts the peak by {:.0} %",
                    share * 100.0,
                    halved * 100.0
                )
            } else {
                format!(
                    "does not hold here: the fixed part dominates (per-sequence part {:.0} % of the B {bmax} peak; halving B cuts {:.0} %)",
                    share * 100.0,
                    halved * 100.0
                )
            },
        ))
    }

    pub(super) fn f5(&self) -> Option<Claim> {
        let ts: Vec<&Row> = self
            .phase(Phase::TrainStep)
            .filter(|r| r.lora_rank == 0)
            .collect();
        let s = sweeps(&ts, Phase::TrainStep, "checkpoint", |r| r.checkpoint);
        let best = s.into_iter().max_by_key(|v| v.len())?;
        let off = best.iter().find(|r| r.checkpoint == 0)?;
        let min = best
            .iter()
            .filter(|r| r.peak_bytes.is_some())
            .min_by_key(|r| r.peak_bytes)?;
        let (p0, p1) = (off.peak_bytes? as f64, min.peak_bytes? as f64);
        // Every timed sample of a K: the same configuration in any run (same threads).
        let samples = |k: &Row| -> Vec<f64> {
            let key = config_key_without(k, &["run"]);
            let mut v: Vec<f64> = ts
                .iter()
                .filter(|r| config_key_without(r, &["run"]) == key)
                .filter_map(|r| r.wall_s)
                .collect();
            v.sort_by(f64::total_cmp);
            v
        };
        let mut used: Vec<&Row> = best.clone();
        used.extend(ts.iter().copied().filter(|r| {
            best.iter()
                .any(|b| config_key_without(r, &["run"]) == config_key_without(b, &["run"]))
        }));
        let stat = |v: &[f64]| {
            (!v.is_empty()).then(|| {
                let m = if v.len() % 2 == 1 {
                    v[v.len() / 2]
                } else {
                    (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
                };
                (m, v[0], v[v.len() - 1], v.len())
            })
        };
        let times: Vec<String> = best
            .iter()
            .map(|r| match stat(&samples(r)) {
                None => format!("K {}: —", r.checkpoint),
                Some((m, lo, hi, n)) => {
                    format!("K {}: {m:.3} s ({lo:.3}–{hi:.3}, n {n})", r.checkpoint)
                }
            })
            .collect();
        let memory_ok = p1 <= F5_MEMORY * p0;
        let time = match (stat(&samples(off)), stat(&samples(min))) {
            (Some(a), Some(b)) if a.3 >= F5_SAMPLES && b.3 >= F5_SAMPLES => {
                let cost = (b.0 / a.0 - 1.0) * 100.0;
                if b.1 > a.2 {
                    (
                        Some(true),
                        format!(
                            "time +{cost:.0} % (median; every K {} sample slower than every K 0 one)",
                            min.checkpoint
                        ),
                    )
                } else if b.2 < a.1 {
                    (
                        Some(false),
                        format!("time {cost:+.0} %: faster, every sample"),
                    )
                } else {
                    (
                        Some(false),
                        format!(
                            "time {cost:+.0} % (median), within the samples' spread: no cost shown"
                        ),
                    )
                }
            }
            (Some(a), Some(b)) => (
                None,
                format!(
                    "time {:+.0} % from {} and {} sample(s): too few to decide (`seed-f5-time`, run three times, would)",
                    (b.0 / a.0 - 1.0) * 100.0,
                    a.3,
                    b.3
                ),
            ),
            _ => (None, "time not recorded".into()),
        };
        let mem = format!("{:.1}× less memory at K = {}", p0 / p1, min.checkpoint);
        let verdict = match (memory_ok, time.0) {
            (true, Some(true)) => format!("holds: {mem}; {}", time.1),
            (true, _) => format!("partly: {mem}; {}", time.1),
            (false, _) => format!(
                "does not hold: the smallest peak is {:.0} % of K 0's; {}",
                100.0 * p1 / p0,
                time.1
            ),
        };
        Some(self.make(
            "F5",
            &used,
            format!(
                    "train-step peak, K = {}: {}; wall {}",
                    slash(best.iter().map(|r| r.checkpoint)),
                    slash(
                        best.iter()
                            .map(|r| r.peak_bytes.map_or("—".into(), |b| mb(b as f64)))
                    ),
                    times.join(", ")
                ),
            format!(
                    "formula peaks {}",
                    slash(
                        best.iter()
                            .map(|r| r.predicted_peak_bytes.map_or("—".into(), |b| mb(b as f64)))
                    )
                ),
            F5_CRITERION,
            verdict,
        ))
    }

    pub(super) fn f6(&self) -> Option<Claim> {
        // Checkpointed forwards keep only the segment inputs: attention changes nothing there.
        let fw: Vec<&Row> = self
            .phase(Phase::Forward)
            .filter(|r| r.lora_rank == 0 && r.checkpoint == 0)
            .collect();
        let pairs = sweeps(&fw, Phase::Forward, "attention", |r| {
            (r.attention == "efficient") as u64
        });
        let mut used = Vec::new();
        let mut m = Vec::new();
        let mut predicted = Vec::new();
        let mut ratios = Vec::new();
        for p in &pairs {
            let (st, ef) = (p[0], p[1]);
            let (a, b) = (ret(st)?, ret(ef)?);
            used.extend([st, ef]);
            m.push(format!("S {}: graph {} → {}", st.seq, mb(a), mb(b)));
            ratios.push(a / b);
            // What the rows' own prediction (the replay of their kernels) says for the pair.
            if let (Some(pa), Some(pb)) = (st.predicted_retained_bytes, ef.predicted_retained_bytes)
            {
                predicted.push(format!(
                    "S {}: {} → {} ({} kernels)",
                    st.seq,
                    mb(pa as f64),
                    mb(pb as f64),
                    st.kernels
                ));
            }
        }
        if m.is_empty() {
            return None;
        }
        let max = ratios.iter().fold(0f64, |x, v| x.max(*v));
        let min = ratios.iter().fold(f64::INFINITY, |x, v| x.min(*v));
        Some(self.make(
            "F6",
            &used,
            format!("standard → efficient: {}", m.join("; ")),
            if predicted.is_empty() {
                "—".into()
            } else {
                format!(
                    "the rows' predicted graphs (their kernels replayed; efficient attention keeps no A·B·S² term): {}",
                    predicted.join("; ")
                )
            },
            "memory: the efficient graph is smaller at every shape; compute: needs a fused GPU kernel",
            if min > 1.0 {
                format!(
                    "holds for memory ({min:.2}×–{max:.2}× smaller graph); compute not tested (a CPU op, no fused GPU kernel)"
                )
            } else {
                format!("does not hold: the efficient graph is not smaller at every shape (ratio down to {min:.2}×)")
            },
        ))
    }
}
