//! D1–D6: the data pipeline's host RAM and CPU, from `dataload` rows.

use super::*;
use crate::fit::dataload::median;
use crate::step::Phase;

/// D2: RAM rises with workers when every fitted per-worker slope, less [`D2_SIGMAS`] standard
/// errors (its ≈ 95 % lower bound), is at least this (bytes); a worker copies the dataset when
/// the `ram` slope exceeds the `stream` slope by at least half the dataset's in-heap size (D1's
/// main-thread `ram` − `stream` PSS), and threads share it when theirs differ by at most a
/// tenth of it. The fits are over each configuration's median of ≥ [`D2_SAMPLES`] samples.
const D2_MIN_SLOPE: f64 = 1024.0 * 1024.0;
const D2_SIGMAS: f64 = 2.0;
/// D2 and D4: the samples (runs) each configuration needs before they decide.
const D2_SAMPLES: usize = 3;
const D4_SAMPLES: usize = D2_SAMPLES;
/// D3: augmentation temporaries are a "high peak" when at least one batch's bytes.
const D3_HIGH: f64 = 1.0;
/// D4: the CPU per image is "constant" across worker kinds within this ratio (max/min).
const D4_CONSTANT: f64 = 1.3;
/// D4: the advice's workers (⌈0.5·cores⌉ to ⌊0.8·cores⌋, at least one) suffice for a pipeline
/// when its images/s there reach this share of its best (the curves' saturation share).
const D4_ENOUGH: f64 = 0.95;
/// D4: each half decides only outside this relative band around its limit (a ratio within
/// 5 % above 1.3, a share within 5 % below 95 %, is undecided: run-to-run noise is that size).
const D4_MARGIN: f64 = 0.05;
/// D5: "barely" when the device pool's peak is at most this many batches.
const D5_BATCHES: f64 = 4.0;
/// D5: the loading windows on the device it needs before it decides.
const D5_SAMPLES: usize = 3;
/// D6: the samples each side of a persistent on/off configuration needs before it decides.
const D6_SAMPLES: usize = 3;
/// D6: persistent workers are faster (or slower) when the medians differ by more than this
/// share and they win (or lose) at least [`D6_SUPERIORITY`] of the (on, off) sample pairs;
/// else the configuration shows no difference.
const D6_MARGIN: f64 = 0.05;
/// D6: the share of (on, off) sample pairs a side must win.
const D6_SUPERIORITY: f64 = 0.75;

/// One persistent on/off configuration's outcome.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Persist {
    Faster,
    Slower,
    Same,
    /// Fewer than [`D6_SAMPLES`] on a side.
    Undecided,
}

impl<'a> Ctx<'a> {
    /// `dataload` rows on `device_cpu` (true: the CPU; false: CUDA).
    fn dataload(&self, device_cpu: bool) -> Vec<&'a Row> {
        self.phase(Phase::Dataload)
            .filter(|r| (r.device == "cpu") == device_cpu && r.workers.is_some())
            .collect()
    }

    pub(super) fn d1(&self) -> Option<Claim> {
        let d = self.dataload(true);
        let at = |kind: &str, w: u64, storage: &str| {
            d.iter()
                .copied()
                .filter(|r| r.worker_kind == kind && r.workers == Some(w) && r.storage == storage)
                .filter_map(|r| r.pss_peak_bytes)
                .max()
        };
        let main: Vec<String> = ["ram", "mmap", "stream"]
            .iter()
            .filter_map(|st| Some(format!("{st} {}", mb(at("main", 0, st)? as f64))))
            .collect();
        if main.is_empty() {
            return None;
        }
        let four: Vec<String> = ["ram", "mmap", "stream"]
            .iter()
            .filter_map(|st| Some(format!("{st} {}", mb(at("process", 4, st)? as f64))))
            .collect();
        let (ram, stream) = (at("main", 0, "ram"), at("main", 0, "stream"));
        Some(self.make(
            "D1",
            &d,
            format!(
                "process-tree PSS peak, main thread: {}; 4 worker processes: {}",
                main.join(", "),
                four.join(", ")
            ),
            "—".into(),
            "main thread: `ram` PSS peak − `stream` PSS peak ≥ 1 MiB (the dataset is held)",
            match (ram, stream) {
                (Some(r), Some(s)) if r >= s + (1 << 20) => format!(
                    "holds: holding (or mapping and reading) the dataset costs {} more than streaming it",
                    mb((r - s) as f64)
                ),
                (Some(r), Some(s)) => format!(
                    "does not hold: `ram` {} vs `stream` {}",
                    mb(r as f64),
                    mb(s as f64)
                ),
                _ => "open: `ram` and `stream` main-thread rows (`seed-dataload`) would decide it".into(),
            },
        ))
    }

    pub(super) fn d2(&self) -> Option<Claim> {
        let d = self.dataload(true);
        // The fits of `d`: each fit's group is one device's rows (its main-thread rows
        // included), so the CPU's fits over every row are the fits over `d`.
        let fits: Vec<&RamFit> = self
            .fitted
            .ram
            .iter()
            .filter(|f| f.device == "cpu" && f.measure == "pss")
            .collect();
        if fits.is_empty() {
            return None;
        }
        let m: Vec<String> = fits
            .iter()
            .map(|f| {
                format!(
                    "{} {}: {} + ({} ± {})·workers (R² {:.3}, {} configurations × ≥ {} samples)",
                    f.worker_kind,
                    f.storage,
                    mb(f.base_bytes),
                    mb(f.per_worker_bytes),
                    mb(f.stderr[1]),
                    f.r2,
                    f.points,
                    f.samples
                )
            })
            .collect();
        let per = |kind: &str, st: &str| {
            fits.iter()
                .find(|f| f.worker_kind == kind && f.storage == st)
                .map(|f| f.per_worker_bytes)
        };
        let samples = fits.iter().map(|f| f.samples).min().unwrap_or(0);
        let rises = fits
            .iter()
            .all(|f| f.per_worker_bytes - D2_SIGMAS * f.stderr[1] >= D2_MIN_SLOPE);
        // The main thread's PSS peak, the median over its samples.
        let held = |st: &str| {
            let v: Vec<f64> = d
                .iter()
                .filter(|r| r.worker_kind == "main" && r.storage == st)
                .filter_map(|r| Some(r.pss_peak_bytes? as f64))
                .collect();
            (!v.is_empty()).then(|| median(&v))
        };
        let dataset = match (held("ram"), held("stream")) {
            (Some(r), Some(s)) if r > s => Some(r - s),
            _ => None,
        };
        let mut parts = Vec::new();
        let copies = match (per("process", "ram"), per("process", "stream"), dataset) {
            (Some(r), Some(s), Some(ds)) => {
                let c = r - s >= 0.5 * ds;
                parts.push(format!(
                    "a worker process {} the in-heap dataset ({} per process with `ram`, {} streaming; dataset {})",
                    if c { "copies" } else { "does not copy" },
                    mb(r),
                    mb(s),
                    mb(ds)
                ));
                Some(c)
            }
            _ => None,
        };
        let threads_share = match (per("thread", "ram"), per("thread", "stream"), dataset) {
            (Some(r), Some(s), Some(ds)) => {
                let sh = (r - s).abs() <= 0.1 * ds;
                parts.push(format!(
                    "threads {} it ({} vs {} per thread)",
                    if sh { "share" } else { "do not share" },
                    mb(r),
                    mb(s)
                ));
                Some(sh)
            }
            _ => None,
        };
        // It holds as the claim's explanation goes: worker processes each copy the in-heap
        // dataset while threads share it. Threads that copy it too (or processes that do not)
        // leave the rise unexplained: partly.
        let kind = match (samples >= D2_SAMPLES, rises, copies, threads_share) {
            (false, ..) => "open",
            (true, true, Some(true), Some(true) | None) => "holds",
            (true, true, _, _) => "partly",
            (true, false, _, _) => "does not hold",
        };
        let undecided = if samples < D2_SAMPLES {
            format!(
                " (undecided: a configuration has {samples} sample(s), {D2_SAMPLES} needed; `scripts/results-cpu.sh` runs seed-dataload three times)"
            )
        } else {
            String::new()
        };
        Some(self.make(
            "D2",
            &d,
            m.join("; "),
            "PSS = base + per-worker·workers (+ in-flight batches)".into(),
            "fitted over each configuration's median of ≥ 3 samples (runs); every fit's per-worker slope − 2 standard errors ≥ 1 MiB; a process copies when its `ram` slope − `stream` slope ≥ ½ the dataset (D1's `ram` − `stream`); threads share when theirs differ by ≤ ⅒ of it; holds when slopes rise, processes copy and threads (when measured) share",
            format!(
                "{kind}: RAM {} with workers{}{}{undecided}",
                if rises { "rises" } else { "does not rise in every pipeline" },
                if parts.is_empty() { "" } else { "; " },
                parts.join("; ")
            ),
        ))
    }

    pub(super) fn d3(&self) -> Option<Claim> {
        // The main thread streaming from files: the heap peak above one batch is the decode
        // and augmentation temporaries.
        let d = self.dataload(true);
        let r = d
            .iter()
            .copied()
            .find(|r| r.worker_kind == "main" && r.storage == "stream")?;
        let batch = (r.batch * 3 * r.crop_px? * r.crop_px? * 4) as f64;
        let peak = r.peak_bytes? as f64;
        let temp = peak - batch;
        Some(self.make(
            "D3",
            &[r],
            format!(
                "main thread, streaming: heap peak {} = one batch {} + {} of temporaries",
                mb(peak),
                mb(batch),
                mb(temp)
            ),
            "—".into(),
            "temporaries (heap peak − one batch of B·3·crop²·4 bytes) ≥ one batch: a high peak; > 0: temporaries without a high peak",
            if temp >= D3_HIGH * batch {
                format!("holds: the temporaries are {:.0} % of a batch", 100.0 * temp / batch)
            } else if temp > 0.0 {
                format!(
                    "partly: temporary images exist ({}, {:.0} % of a batch) but are no high peak at this dataset's source sizes",
                    mb(temp),
                    100.0 * temp / batch
                )
            } else {
                "does not hold: the heap peak is one batch, no temporaries".into()
            },
        ))
    }

    pub(super) fn d4(&self) -> Option<Claim> {
        let d = self.dataload(true);
        // Decoding and augmenting: re-spawned workers' start-up (D6's `persistent = off`) is
        // not work per image, as the throughput curves leave it out.
        // Per kind: the mean over its configurations of each one's median over its samples.
        type Config<'k> = (&'k str, Option<u64>, Option<u64>, Option<u64>, Option<u64>);
        let mut by_config: BTreeMap<(&str, Config), Vec<f64>> = BTreeMap::new();
        for r in d.iter().filter(|r| r.persistent != "off") {
            if let (Some(u), Some(s), Some(n)) = (r.cpu_user_s, r.cpu_sys_s, r.images) {
                let key = (
                    r.storage.as_str(),
                    r.workers,
                    r.prefetch,
                    r.epochs,
                    r.images,
                );
                by_config
                    .entry((r.worker_kind.as_str(), key))
                    .or_default()
                    .push((u + s) / n as f64);
            }
        }
        let per_image = |kind: &str| {
            let v: Vec<f64> = by_config
                .iter()
                .filter(|((k, _), _)| *k == kind)
                .map(|(_, v)| median(v))
                .collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        let cpu_samples = by_config.values().map(Vec::len).min().unwrap_or(0);
        let m: Vec<String> = ["main", "thread", "process"]
            .iter()
            .filter_map(|k| Some(format!("{k} {:.2} ms", 1e3 * per_image(k)?)))
            .collect();
        if m.is_empty() {
            return None;
        }
        // `d`'s curves: the CPU's groups (as D2's fits).
        let curves: Vec<&Curve> = self
            .fitted
            .curves
            .iter()
            .filter(|c| c.device == "cpu")
            .collect();
        let curve_samples = curves.iter().map(|c| c.samples).min().unwrap_or(0);
        let sat: Vec<String> = curves
            .iter()
            .map(|c| format!("{} {}: {}", c.worker_kind, c.storage, c.saturation_workers))
            .collect();
        // The advice in workers, from the cores of the machine the rows ran on (one figure,
        // or none when the runs disagree or do not say).
        let mut cores: Vec<u64> = d
            .iter()
            .filter_map(|r| self.cores_of.get(&r.run_id).copied())
            .filter(|&c| c > 0)
            .collect();
        cores.sort_unstable();
        cores.dedup();
        let advice = match cores.as_slice() {
            [c] => {
                let lo = ((0.5 * *c as f64).ceil() as u64).max(1);
                let hi = ((0.8 * *c as f64).floor() as u64).max(lo);
                Some((*c, lo, hi))
            }
            _ => None,
        };
        // Per pipeline: the best images/s at the advice's workers against its best anywhere.
        let reach: Vec<(&Curve, f64)> = advice
            .map(|(_, lo, hi)| {
                curves
                    .iter()
                    .filter_map(|c| {
                        let best = c.points.iter().map(|p| p.1).fold(0f64, f64::max);
                        let at = c
                            .points
                            .iter()
                            .filter(|p| (lo..=hi).contains(&p.0))
                            .map(|p| p.1)
                            .fold(f64::NAN, f64::max);
                        (best > 0.0 && at.is_finite()).then_some((*c, at / best))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let advice_text = match advice {
            None => "cores of the runs: unknown or differing".to_string(),
            Some((c, lo, hi)) => format!(
                "0.5–0.8 × {c} cores = {} worker(s)",
                if lo == hi {
                    lo.to_string()
                } else {
                    format!("{lo}–{hi}")
                }
            ),
        };
        let reach_text: Vec<String> = reach
            .iter()
            .map(|(c, x)| format!("{} {} {:.0} %", c.worker_kind, c.storage, 100.0 * x))
            .collect();
        Some(self.make(
            "D4",
            &d,
            format!(
                "CPU (user + sys) per image: {}; workers reaching 95 % of the best images/s: {}; images/s at the advice ({advice_text}) against each pipeline's best: {}",
                m.join(", "),
                sat.join(", "),
                if reach_text.is_empty() { "—".into() } else { reach_text.join(", ") }
            ),
            "workers ≈ 0.5–0.8 × cores".into(),
            "on each configuration's median of ≥ 3 samples (runs): CPU work: the CPU per image is constant across worker kinds (max ≤ 1.3 × min; > 1.3 × 1.05 differs; between: undecided); the advice: at ⌈0.5·cores⌉–⌊0.8·cores⌋ workers (≥ 1) every pipeline reaches ≥ 95 % of its best images/s (< 95 % × 0.95 fails; between: undecided); holds when both do, partly when one does, open when neither is decided",
            {
                let mut at: Vec<u64> = curves.iter().map(|c| c.saturation_workers).collect();
                at.sort_unstable();
                at.dedup();
                let sat = match at.as_slice() {
                    [n] => format!("every pipeline saturates at {n} worker(s)"),
                    _ => "the saturation point differs between pipelines".into(),
                };
                let costs: Vec<f64> = ["main", "thread", "process"]
                    .iter()
                    .filter_map(|k| per_image(k))
                    .collect();
                let (lo, hi) = minmax(costs.iter().copied());
                let cpu_work = if cpu_samples < D4_SAMPLES {
                    None
                } else if hi <= D4_CONSTANT * lo {
                    Some(true)
                } else if hi > D4_CONSTANT * (1.0 + D4_MARGIN) * lo {
                    Some(false)
                } else {
                    None
                };
                let cpu_text = match cpu_work {
                    Some(true) => format!(
                        "it is CPU work (a constant {:.2}–{:.2} ms per image, so more images/s means more CPU)",
                        lo * 1e3,
                        hi * 1e3
                    ),
                    Some(false) => format!(
                        "the CPU per image differs between kinds ({:.2}–{:.2} ms)",
                        lo * 1e3,
                        hi * 1e3
                    ),
                    None if cpu_samples < D4_SAMPLES => format!(
                        "the CPU per image is undecided ({:.2}–{:.2} ms on {cpu_samples} sample(s) a configuration, {D4_SAMPLES} needed)",
                        lo * 1e3,
                        hi * 1e3
                    ),
                    None => format!(
                        "the CPU per image is undecided ({:.2}–{:.2} ms, {:.3}×: within {:.0} % above the {D4_CONSTANT}× limit)",
                        lo * 1e3,
                        hi * 1e3,
                        hi / lo,
                        D4_MARGIN * 100.0
                    ),
                };
                let (wlo, whi) = reach
                    .iter()
                    .fold((f64::INFINITY, 0f64), |(a, b), (_, x)| (a.min(*x), b.max(*x)));
                let enough = if reach.is_empty() || curve_samples < D4_SAMPLES {
                    None
                } else if wlo >= D4_ENOUGH {
                    Some(true)
                } else if wlo < D4_ENOUGH * (1.0 - D4_MARGIN) {
                    Some(false)
                } else {
                    None
                };
                let advice_verdict = match enough {
                    None if reach.is_empty() => {
                        format!("the advice is not tested: no pipeline ran at {advice_text}")
                    }
                    None if curve_samples < D4_SAMPLES => format!(
                        "the advice ({advice_text}) is undecided: {:.0}–{:.0} % of each pipeline's best images/s on {curve_samples} sample(s) a worker count, {D4_SAMPLES} needed",
                        100.0 * wlo,
                        100.0 * whi
                    ),
                    None => format!(
                        "the advice ({advice_text}) is undecided: {:.0}–{:.0} % of each pipeline's best images/s, within {:.0} % below the 95 % share",
                        100.0 * wlo,
                        100.0 * whi,
                        D4_MARGIN * 100.0
                    ),
                    Some(true) => format!(
                        "the advice ({advice_text}) reaches {:.0}–{:.0} % of each pipeline's best images/s; {sat}",
                        100.0 * wlo,
                        100.0 * whi
                    ),
                    Some(false) => format!(
                        "the advice ({advice_text}) reaches only {:.0}–{:.0} % of the best images/s: {sat}, with a consumer that does no training work (the advice leaves cores to the training step)",
                        100.0 * wlo,
                        100.0 * whi
                    ),
                };
                // Both halves decided and met: holds; none met and one failed: does not hold;
                // nothing decided: open.
                let kind = match (cpu_work, enough) {
                    (Some(true), Some(true)) => "holds",
                    (None, None) => "open",
                    (Some(false) | None, Some(false) | None) => "does not hold",
                    _ => "partly",
                };
                format!("{kind}: {cpu_text}; {advice_verdict}")
            },
        ))
    }

    pub(super) fn d5(&self) -> Option<Claim> {
        let d = self.dataload(false);
        // Each CUDA loading window's pool peak in batches of B·3·crop²·4 bytes.
        let samples: Vec<(&Row, f64, f64)> = d
            .iter()
            .filter_map(|r| {
                let batch = (r.batch * 3 * r.crop_px? * r.crop_px? * 4) as f64;
                Some((*r, r.peak_bytes? as f64, batch))
            })
            .collect();
        let &(top, peak, batch) = samples
            .iter()
            .max_by(|a, b| (a.1 / a.2).total_cmp(&(b.1 / b.2)))?;
        let worst = peak / batch;
        Some(self.make(
            "D5",
            &d,
            format!(
                "device pool peak while loading, {} window(s): at most {} = {worst:.2} batches of {} ({} workers)",
                samples.len(),
                mb(peak),
                mb(batch),
                top.workers.unwrap_or(0)
            ),
            "—".into(),
            "over ≥ 3 loading windows on the device, each pool peak ≤ 4 batches (B·3·crop²·4 bytes: the batch being copied, the prefetched ones and the one consumed)",
            if samples.len() < D5_SAMPLES {
                format!(
                    "open: {} loading window(s) on the device, {D5_SAMPLES} needed (the worst holds {worst:.2} batches)",
                    samples.len()
                )
            } else if worst <= D5_BATCHES {
                format!(
                    "holds: the device holds {worst:.2} batches at most over {} windows",
                    samples.len()
                )
            } else {
                format!(
                    "does not hold: the device holds {worst:.2} batches ({} workers)",
                    top.workers.unwrap_or(0)
                )
            },
        ))
    }

    pub(super) fn d6(&self) -> Option<Claim> {
        let d = self.dataload(true);
        // Each configuration's images/s samples, persistent on and off (every run's rows).
        type Key<'k> = (&'k str, Option<u64>, &'k str, Option<u64>, Option<u64>);
        let mut groups: BTreeMap<Key, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
        for r in d
            .iter()
            .filter(|r| matches!(r.persistent.as_str(), "on" | "off"))
        {
            let Some(ips) = r.images_per_s else { continue };
            let g = groups
                .entry((
                    r.worker_kind.as_str(),
                    r.workers,
                    r.storage.as_str(),
                    r.epochs,
                    r.prefetch,
                ))
                .or_default();
            if r.persistent == "on" {
                g.0.push(ips);
            } else {
                g.1.push(ips);
            }
        }
        let mut outcomes = Vec::new();
        let pairs: Vec<String> = groups
            .iter()
            .filter(|(_, (on, off))| !on.is_empty() && !off.is_empty())
            .map(|((kind, workers, _, _, _), (on, off))| {
                let (a, b) = (median(on), median(off));
                let rel = a / b - 1.0;
                // The share of (on, off) sample pairs in which persistent workers were faster
                // (the probability of superiority; ties count half).
                let wins: f64 = on
                    .iter()
                    .flat_map(|x| off.iter().map(move |y| (x, y)))
                    .map(|(x, y)| match x.total_cmp(y) {
                        std::cmp::Ordering::Greater => 1.0,
                        std::cmp::Ordering::Equal => 0.5,
                        std::cmp::Ordering::Less => 0.0,
                    })
                    .sum::<f64>()
                    / (on.len() * off.len()) as f64;
                let o = if on.len() < D6_SAMPLES || off.len() < D6_SAMPLES {
                    Persist::Undecided
                } else if rel > D6_MARGIN && wins >= D6_SUPERIORITY {
                    Persist::Faster
                } else if rel < -D6_MARGIN && 1.0 - wins >= D6_SUPERIORITY {
                    Persist::Slower
                } else {
                    Persist::Same
                };
                outcomes.push(o);
                format!(
                    "{kind} w{}: {a:.0} vs {b:.0} images/s (medians of {} and {}, {:+.0} %, faster in {:.0} % of the sample pairs: {})",
                    workers.unwrap_or(0),
                    on.len(),
                    off.len(),
                    rel * 100.0,
                    wins * 100.0,
                    match o {
                        Persist::Faster => "faster",
                        Persist::Slower => "slower",
                        Persist::Same => "no difference beyond the margin",
                        Persist::Undecided => "undecided",
                    }
                )
            })
            .collect();
        let count = |o: Persist| outcomes.iter().filter(|x| **x == o).count();
        let (fast, slow, same) = (
            count(Persist::Faster),
            count(Persist::Slower),
            count(Persist::Same),
        );
        let decided = fast + slow + same;
        let copies = self
            .dataload(false)
            .iter()
            .find_map(|r| Some((r.h2d_pinned_bytes_per_s?, r.h2d_pageable_bytes_per_s?)));
        let pinned: Vec<String> = copies
            .iter()
            .map(|(p, q)| format!("pinned {}/s vs pageable {}/s", mb(*p), mb(*q)))
            .collect();
        let persistent_ok = match (decided, fast) {
            (0, _) => None,
            (n, f) if f == n => Some(true),
            (_, 0) => Some(false),
            _ => None,
        };
        let pinned_ok = copies.map(|(p, q)| p > q);
        let kind = match (persistent_ok, pinned_ok) {
            // Nothing decided: too few samples and no GPU row.
            (None, None) if decided == 0 => "open",
            (Some(true), Some(true)) => "holds",
            (Some(false), Some(false)) | (Some(false), None) | (None, Some(false)) => {
                "does not hold"
            }
            _ => "partly",
        };
        let persistent_verdict = if pairs.is_empty() {
            "persistent workers: not measured".to_string()
        } else if decided == 0 {
            format!(
                "persistent workers: undecided (fewer than {D6_SAMPLES} samples a side in each of {} configurations)",
                pairs.len()
            )
        } else if fast == decided {
            format!("persistent workers faster in all {decided} configurations")
        } else if fast == 0 {
            format!(
                "persistent workers not faster in any of {decided} configurations ({slow} slower, {same} without a difference beyond ±{:.0} %)",
                D6_MARGIN * 100.0
            )
        } else {
            format!(
                "persistent workers faster in {fast} of {decided} configurations ({slow} slower, {same} without a difference beyond ±{:.0} %; why is not measured here)",
                D6_MARGIN * 100.0
            )
        };
        let pinned_verdict = match copies {
            None => "pinned memory: needs a GPU".to_string(),
            Some((p, q)) if p > q => format!("pinned copies {:.2}× faster: holds", p / q),
            Some((p, q)) => format!(
                "pinned copies {:.2}× the pageable rate: does not hold here",
                p / q
            ),
        };
        if pairs.is_empty() && pinned.is_empty() {
            return None;
        }
        Some(self.make(
            "D6",
            &d,
            format!(
                "persistent on vs off: {}; {}",
                if pairs.is_empty() { "—".into() } else { pairs.join(", ") },
                pinned
                    .first()
                    .cloned()
                    .unwrap_or_else(|| "host→device copies: not measured (CUDA only)".into())
            ),
            "—".into(),
            "persistent: per on/off configuration with ≥ 3 samples a side, persistent workers' median images/s above the re-spawned ones' by more than 5 % and faster in ≥ 75 % of the (on, off) sample pairs, in every configuration; pinned: pinned bytes/s > pageable",
            format!("{kind}: {persistent_verdict}; {pinned_verdict}"),
        ))
    }
}
