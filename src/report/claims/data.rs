//! D1–D6: the data pipeline's host RAM and CPU, from `dataload` rows.

use super::*;

impl<'a> Ctx<'a> {
    /// `dataload` rows on `device_cpu` (true: the CPU; false: CUDA).
    fn dataload(&self, device_cpu: bool) -> Vec<&'a Row> {
        self.phase("dataload")
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
            match (ram, stream) {
                (Some(r), Some(s)) if r > s => format!(
                    "holds: holding (or mapping and reading) the dataset costs {} more than streaming it",
                    mb((r - s) as f64)
                ),
                _ => "no difference between storage modes here".into(),
            },
        ))
    }

    pub(super) fn d2(&self) -> Option<Claim> {
        let d = self.dataload(true);
        let fits: Vec<crate::data::fit::RamFit> =
            crate::data::fit::ram_fits(&d.iter().map(|r| (*r).clone()).collect::<Vec<Row>>())
                .into_iter()
                .filter(|f| f.measure == "pss")
                .collect();
        if fits.is_empty() {
            return None;
        }
        let m: Vec<String> = fits
            .iter()
            .map(|f| {
                format!(
                    "{} {}: {} + {}·workers (R² {:.3})",
                    f.worker_kind,
                    f.storage,
                    mb(f.base_bytes),
                    mb(f.per_worker_bytes),
                    f.r2
                )
            })
            .collect();
        let per = |kind: &str, st: &str| {
            fits.iter()
                .find(|f| f.worker_kind == kind && f.storage == st)
                .map(|f| f.per_worker_bytes)
        };
        let verdict = match (per("process", "ram"), per("process", "stream")) {
            (Some(r), Some(s)) => format!(
                "holds: a worker process adds {} when the data is in its heap, {} when streaming; threads share the data",
                mb(r),
                mb(s)
            ),
            _ => "RAM per worker fitted; see the measured column".into(),
        };
        Some(self.make(
            "D2",
            &d,
            m.join("; "),
            "PSS = base + per-worker·workers (+ in-flight batches)".into(),
            verdict,
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
        Some(self.make(
            "D3",
            &[r],
            format!(
                "main thread, streaming: heap peak {} = one batch {} + {} of temporaries",
                mb(peak),
                mb(batch),
                mb(peak - batch)
            ),
            "—".into(),
            format!(
                "holds in kind: the temporaries are {:.0} % of a batch at 256–512 px sources; they grow with the source resolution",
                100.0 * (peak - batch) / batch
            ),
        ))
    }

    pub(super) fn d4(&self) -> Option<Claim> {
        let d = self.dataload(true);
        let per_image = |kind: &str| {
            let v: Vec<f64> = d
                .iter()
                .filter(|r| r.worker_kind == kind)
                .filter_map(|r| Some((r.cpu_user_s? + r.cpu_sys_s?) / r.images? as f64))
                .collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        let m: Vec<String> = ["main", "thread", "process"]
            .iter()
            .filter_map(|k| Some(format!("{k} {:.2} ms", 1e3 * per_image(k)?)))
            .collect();
        if m.is_empty() {
            return None;
        }
        let curves =
            crate::data::fit::curves(&d.iter().map(|r| (*r).clone()).collect::<Vec<Row>>());
        let sat: Vec<String> = curves
            .iter()
            .map(|c| format!("{} {}: {}", c.worker_kind, c.storage, c.saturation_workers))
            .collect();
        Some(self.make(
            "D4",
            &d,
            format!(
                "CPU (user + sys) per image: {}; workers reaching 95 % of the best images/s: {}",
                m.join(", "),
                sat.join(", ")
            ),
            "workers ≈ 0.5–0.8 × cores".into(),
            {
                let mut at: Vec<u64> = curves.iter().map(|c| c.saturation_workers).collect();
                at.sort_unstable();
                at.dedup();
                let sat = match at.as_slice() {
                    [n] => format!("every pipeline saturates at {n} worker(s)"),
                    _ => "the saturation point differs between pipelines (shared cores?)".into(),
                };
                format!(
                    "holds that it is CPU work (a constant cost per image, so more images/s means more CPU); {sat}, to compare with the machine's cores (environment section)"
                )
            },
        ))
    }

    pub(super) fn d5(&self) -> Option<Claim> {
        let d = self.dataload(false);
        let peak = d.iter().filter_map(|r| r.peak_bytes).max()?;
        Some(self.make(
            "D5",
            &d,
            format!("device pool peak while loading: {}", mb(peak as f64)),
            "—".into(),
            "the device holds only the batches moved to it".into(),
        ))
    }

    pub(super) fn d6(&self) -> Option<Claim> {
        let d = self.dataload(true);
        let mut faster = (0, 0);
        let pairs: Vec<String> = d
            .iter()
            .filter(|r| r.persistent == "on")
            .filter_map(|on| {
                let off = d.iter().find(|o| {
                    o.persistent == "off"
                        && (
                            o.worker_kind.as_str(),
                            o.workers,
                            o.storage.as_str(),
                            o.epochs,
                        ) == (
                            on.worker_kind.as_str(),
                            on.workers,
                            on.storage.as_str(),
                            on.epochs,
                        )
                })?;
                let (a, b) = (on.images_per_s?, off.images_per_s?);
                if a > b {
                    faster.0 += 1;
                } else {
                    faster.1 += 1;
                }
                Some(format!(
                    "{} w{}: {a:.0} vs {b:.0} images/s",
                    on.worker_kind, on.workers?
                ))
            })
            .collect();
        let copies = self
            .dataload(false)
            .iter()
            .find_map(|r| Some((r.h2d_pinned_bytes_per_s?, r.h2d_pageable_bytes_per_s?)));
        let pinned: Vec<String> = copies
            .iter()
            .map(|(p, q)| format!("pinned {}/s vs pageable {}/s", mb(*p), mb(*q)))
            .collect();
        let persistent_verdict = match faster {
            (0, 0) => "persistent workers: not measured".to_string(),
            (n, 0) => format!("persistent workers faster in all {n} pairs"),
            (0, n) => format!("persistent workers slower in all {n} pairs"),
            (a, b) => format!(
                "persistent workers: no consistent difference ({a} pairs faster, {b} slower: the cores were shared)"
            ),
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
            format!("{persistent_verdict}; {pinned_verdict}"),
        ))
    }
}
