//! `memfit merge DIR… --out DIR`: one run folder from the folders of a sharded sweep
//! (`memfit run --shard I/N`, e.g. the tasks of a Slurm job array).
//!
//! Rows are keyed by their case (every case field and the device: `sweep::resume::case_key`)
//! and phase. A key seen twice with identical rows (run id aside) is kept once; with different
//! rows it is a conflict: the merge lists them and refuses, unless `--on-conflict first|last`
//! says which folder wins (in the order given). The merged `meta.json` is the first folder's,
//! with every folder's metadata in `cluster.merged_from` (the HDF5 file's `cluster`
//! attribute: each shard's host, device, run id, Slurm job and array ids); CSV and HDF5 are
//! rebuilt. A shard is reported incomplete when a case it planned (`cluster.planned_cases`)
//! has no row, or a row that is not final (`timeout`, `crashed`). `fit`, `report` and
//! `predict --calibration` read a merged folder like any other.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Context;

use crate::cli::MergeArgs;
use crate::error::UserError;
use crate::record::{Row, RunMeta};
use crate::store;
use crate::sweep::resume::case_key;

/// Which folder wins a conflicting row.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Wins {
    Refuse,
    First,
    Last,
}

pub fn merge(args: &MergeArgs) -> anyhow::Result<()> {
    let wins = match args.on_conflict.as_deref() {
        None | Some("refuse") => Wins::Refuse,
        Some("first") => Wins::First,
        Some("last") => Wins::Last,
        Some(other) => {
            return Err(UserError::OutOfRange {
                origin: "flags".into(),
                key: "on-conflict".into(),
                value: other.into(),
                reason: "says which folder's row wins a conflict".into(),
                allowed: "refuse, first, last".into(),
            }
            .into());
        }
    };
    let out_journal = args.out.join("results.jsonl");
    if out_journal.exists() {
        return Err(UserError::Output {
            path: out_journal.display().to_string(),
            message: "a journal is already there; choose another --out".into(),
        }
        .into());
    }
    let mut metas = Vec::new();
    let mut merged: Vec<Row> = Vec::new();
    let mut at: HashMap<(String, crate::step::Phase), (usize, usize)> = HashMap::new();
    let (mut duplicates, mut conflicts) = (0usize, Vec::new());
    let mut incomplete = Vec::new();
    for (d, dir) in args.dirs.iter().enumerate() {
        let meta = read_meta(dir)?;
        let rows = store::jsonl::read(&dir.join("results.jsonl"))?;
        // Incomplete: a planned case without rows, or with a row that is not final.
        let mut missing = Vec::new();
        for &c in &meta.cluster.planned_cases {
            let mine: Vec<&Row> = rows.iter().filter(|r| r.case == c).collect();
            if mine.is_empty() || mine.iter().any(|r| !r.status.is_final()) {
                missing.push(c);
            }
        }
        if !missing.is_empty() {
            incomplete.push(format!(
                "{} (shard {}): case(s) {} unfinished",
                dir.display(),
                meta.cluster.shard.as_deref().unwrap_or("-"),
                missing
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for row in rows {
            let key = (case_key(&row), row.phase);
            match at.get(&key) {
                None => {
                    at.insert(key, (merged.len(), d));
                    merged.push(row);
                }
                Some(&(i, from)) => {
                    if same_measurement(&merged[i], &row) {
                        duplicates += 1;
                    } else {
                        conflicts.push(format!(
                            "case {} {} in {} and {}",
                            row.case,
                            row.phase,
                            args.dirs[from].display(),
                            dir.display()
                        ));
                        if wins == Wins::Last {
                            merged[i] = row;
                            at.insert(key, (i, d));
                        }
                    }
                }
            }
        }
        metas.push(meta);
    }
    if !conflicts.is_empty() && wins == Wins::Refuse {
        anyhow::bail!(
            "{} row(s) differ between folders (nothing written; --on-conflict first|last says which wins):\n  {}",
            conflicts.len(),
            conflicts.join("\n  ")
        );
    }
    let mut meta = metas[0].clone();
    meta.cluster.merged_from = metas.clone();
    meta.cluster.shard = None;
    meta.cluster.planned_cases = Vec::new();
    std::fs::create_dir_all(&args.out).map_err(|e| UserError::Output {
        path: args.out.display().to_string(),
        message: format!("cannot create the output folder: {e}"),
    })?;
    let shards = args.out.join("shards");
    std::fs::create_dir_all(&shards).with_context(|| format!("creating {}", shards.display()))?;
    for (i, (dir, m)) in args.dirs.iter().zip(&metas).enumerate() {
        let name = format!("{i:03}-{}.meta.json", m.run_id);
        std::fs::write(shards.join(&name), serde_json::to_string_pretty(m)? + "\n")
            .with_context(|| format!("keeping {}'s meta.json", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(&meta)? + "\n";
    std::fs::write(args.out.join("meta.json"), text)
        .with_context(|| format!("writing {}", args.out.join("meta.json").display()))?;
    store::jsonl::Journal::open(&out_journal)?.append(&merged)?;
    store::csv::write(&args.out.join("results.csv"), &merged)?;
    if store::hdf5::AVAILABLE {
        store::hdf5::write(&args.out.join("results.h5"), &meta, &merged)?;
    }
    println!(
        "merged {} folder(s) into {}: {} row(s), {} identical duplicate(s) kept once, {} conflict(s){}",
        args.dirs.len(),
        args.out.display(),
        merged.len(),
        duplicates,
        conflicts.len(),
        match wins {
            Wins::Refuse => String::new(),
            Wins::First => " (the first folder's row kept)".into(),
            Wins::Last => " (the last folder's row kept)".into(),
        }
    );
    if incomplete.is_empty() {
        println!("every shard complete");
    } else {
        println!("incomplete shard(s):");
        for i in &incomplete {
            println!("  {i}");
        }
    }
    Ok(())
}

/// The same row measured once (the run id may differ).
fn same_measurement(a: &Row, b: &Row) -> bool {
    let mut b = b.clone();
    b.run_id = a.run_id.clone();
    *a == b
}

fn read_meta(dir: &Path) -> anyhow::Result<RunMeta> {
    let p = dir.join("meta.json");
    let text = std::fs::read_to_string(&p).map_err(|e| UserError::Unreadable {
        origin: p.display().to_string(),
        what: "run folder",
        message: format!("{e} (a run folder holds results.jsonl and meta.json)"),
    })?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))
}
