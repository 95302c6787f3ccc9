//! `memfit run --resume`: which cases of a workload an existing journal already holds.
//!
//! A case is identified by every case field of its rows and the device — everything but the
//! run id, the case index, the phase and the measured or predicted figures ([`case_key`]). It
//! is *finished* when the journal holds one row for each of its asked phases and none of them
//! is `timeout` or `crashed` ([`crate::record::Status::is_final`]). Finished cases are not run
//! again; the rows of unfinished ones (a case killed mid-way, a case cut by a full disk) are
//! moved to `superseded.jsonl` beside the journal before the case runs again, so every case's
//! rows are in the journal exactly once. Rows of cases the workload does not contain are kept.

use std::collections::{HashMap, HashSet};

use crate::record::Row;
use crate::step::Phase;

/// Fields that describe what was measured, not which case: left out of the key.
const NOT_KEY: &[&str] = &[
    "run_id",
    "case",
    "phase",
    "status",
    "error",
    "params",
    "peak_bytes",
    "retained_bytes",
    "alloc_count",
    "predicted_peak_bytes",
    "predicted_retained_bytes",
    "cpu_user_s",
    "cpu_sys_s",
    "wall_s",
    "rss_peak_bytes",
    "logits_rel_error",
    "peak_meter",
    "reserved_peak_bytes",
    "device_used_bytes",
    "nvml_process_peak_bytes",
    "gpu_util_mean_pct",
    "gpu_power_peak_w",
    "nvml_samples_count",
    "images",
    "images_per_s",
    "startup_s",
    "tree_processes_count",
    "tree_rss_peak_bytes",
    "tree_rss_steady_bytes",
    "pss_peak_bytes",
    "pss_steady_bytes",
    "h2d_pinned_bytes_per_s",
    "h2d_pageable_bytes_per_s",
    "trim_layer",
    "trim_before_bytes",
    "trim_after_bytes",
    "trim_live_bytes",
    "heap_start_bytes",
];

/// The case a row belongs to, as a string: its case fields (and device) as compact JSON.
pub fn case_key(row: &Row) -> String {
    let mut v = serde_json::to_value(row).expect("a row serialises");
    if let Some(m) = v.as_object_mut() {
        for k in NOT_KEY {
            m.remove(*k);
        }
    }
    v.to_string()
}

/// What an existing journal means for a resumed run.
#[derive(Debug, Default)]
pub struct Prior {
    /// Rows to keep in the journal (finished cases, and cases this workload does not have).
    pub kept: Vec<Row>,
    /// Rows of unfinished cases of this workload: set aside, the case runs again.
    pub superseded: Vec<Row>,
    /// Keys of the workload's cases that are finished.
    pub finished: HashSet<String>,
}

/// Splits `rows` for a workload whose cases have the keys and asked phases in `cases`.
pub fn split(rows: Vec<Row>, cases: &[(String, Vec<Phase>)]) -> Prior {
    let mut by_key: HashMap<String, Vec<&Row>> = HashMap::new();
    for r in &rows {
        by_key.entry(case_key(r)).or_default().push(r);
    }
    let asked: HashMap<&str, &Vec<Phase>> = cases.iter().map(|(k, p)| (k.as_str(), p)).collect();
    let mut finished = HashSet::new();
    for (key, phases) in cases {
        let Some(have) = by_key.get(key) else {
            continue;
        };
        let complete = have.len() == phases.len()
            && phases.iter().all(|p| {
                have.iter()
                    .filter(|r| r.phase == *p)
                    .all(|r| r.status.is_final())
                    && have.iter().any(|r| r.phase == *p)
            });
        if complete {
            finished.insert(key.clone());
        }
    }
    let mut prior = Prior {
        finished,
        ..Prior::default()
    };
    for r in rows {
        let key = case_key(&r);
        if asked.contains_key(key.as_str()) && !prior.finished.contains(&key) {
            prior.superseded.push(r);
        } else {
            prior.kept.push(r);
        }
    }
    prior
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Status;

    fn row(batch: u64, phase: &str, status: Status) -> Row {
        Row {
            batch,
            phase: Phase::parse(phase).expect("a phase"),
            status,
            peak_bytes: Some(batch * 100),
            wall_s: Some(0.5),
            ..Row::example()
        }
    }

    #[test]
    fn the_key_ignores_figures_and_phase_but_not_case_fields() {
        let a = row(2, "init", Status::Ok);
        let mut b = row(2, "forward", Status::Error);
        b.run_id = "other".into();
        b.case = 7;
        assert_eq!(case_key(&a), case_key(&b));
        assert_ne!(case_key(&a), case_key(&row(3, "init", Status::Ok)));
        let mut c = row(2, "init", Status::Ok);
        c.device = "cuda:0".into();
        assert_ne!(case_key(&a), case_key(&c));
    }

    #[test]
    fn unfinished_cases_are_set_aside_and_others_kept() {
        let phases = vec![Phase::Init, Phase::Forward];
        let k = |b| case_key(&row(b, "init", Status::Ok));
        let cases = vec![
            (k(1), phases.clone()),
            (k(2), phases.clone()),
            (k(3), phases.clone()),
            (k(4), phases.clone()),
        ];
        let rows = vec![
            // 1: finished (an oom is final)
            row(1, "init", Status::Ok),
            row(1, "forward", Status::Oom),
            // 2: killed mid-way
            row(2, "init", Status::Ok),
            row(2, "forward", Status::Crashed),
            // 3: a phase missing (the disk filled)
            row(3, "init", Status::Ok),
            // 9: not in this workload
            row(9, "init", Status::Ok),
        ];
        let p = split(rows, &cases);
        assert_eq!(p.finished, HashSet::from([k(1)]));
        assert_eq!(p.kept.len(), 3, "case 1's two rows and case 9's");
        assert_eq!(p.superseded.len(), 3);
        assert!(p.superseded.iter().all(|r| r.batch == 2 || r.batch == 3));
    }
}
