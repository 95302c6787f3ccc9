//! Reference measurements by another framework, stored beside memfit's rows: `torch.jsonl`
//! (written by `scripts/torch-compare.sh` from `scripts/torch_reference.py`), one JSON line
//! per model configuration, attention kind and phase. memfit never measures these itself; the
//! report reads them to put memfit's phases beside PyTorch's.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Deserialize;

/// The file name the reference lines are stored under, in a result folder.
pub const FILE: &str = "torch.jsonl";

/// One phase of one configuration measured by PyTorch.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ReferenceRow {
    /// `init`, `forward`, `backward`, `optimizer`, `train-step`, `inference` (memfit's names).
    pub phase: String,
    /// Median step seconds.
    pub wall_s: f64,
    /// Bytes above the phase's start at its peak (`None`: not measured).
    pub peak_bytes: Option<u64>,
    /// Bytes the phase still holds at its end (e.g. the forward's saved tensors; below 0 when
    /// it frees what existed before it, as a backward frees the saved tensors).
    #[serde(default)]
    pub retained_bytes: Option<i64>,
    /// The PyTorch version.
    pub torch: String,
    /// `eager` (attention written out) or `sdpa` (`scaled_dot_product_attention`).
    pub attention: String,
    pub device: String,
    pub dtype: String,
    pub threads: u64,
    /// Parameters of the model (equal to memfit's for the same configuration).
    pub params: u64,
    pub batch: u64,
    /// Tokens per sequence (a ViT: patches + 1, as memfit's rows).
    pub seq: u64,
    /// The preset, or the config.json it was built from.
    pub model: String,
    /// How the time was taken: `timed before any profiled run` (torch_reference.py since the
    /// profiler's cost was found); `None` in files written before, whose times were taken
    /// after profiled runs (up to 15× slower) and are not compared.
    #[serde(default)]
    pub time_method: Option<String>,
    /// The CPU PyTorch ran on (`/proc/cpuinfo`'s model name); `None` in older files.
    #[serde(default)]
    pub cpu_model: Option<String>,
    /// The memfit run stored in the same folder (its `meta.json`'s `run_id`), set by [`read`];
    /// empty when the file has no run beside it. The report compares times with that run's
    /// rows only.
    #[serde(default)]
    pub run_id: String,
}

/// The marker of times taken without the profiler's cost (see [`ReferenceRow::time_method`]).
pub const TIMED_CLEAN: &str = "timed before any profiled run";

/// Every `torch.jsonl` under `p` (itself, or in it and the folders below), in name order.
pub fn files(p: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    collect(p, &mut out);
    out
}

fn collect(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_file() {
        if p.file_name().is_some_and(|n| n == FILE) {
            out.push(p.to_path_buf());
        }
        return;
    }
    let Ok(rd) = std::fs::read_dir(p) else { return };
    let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    entries.sort();
    for e in entries {
        if e.is_dir() || e.file_name().is_some_and(|n| n == FILE) {
            collect(&e, out);
        }
    }
}

/// The lines of one reference file, each given the `run_id` of the run stored beside it
/// (`meta.json` in the same folder); a malformed line is an error naming the file and line.
pub fn read(path: &Path) -> anyhow::Result<Vec<ReferenceRow>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let run_id = super::meta_beside(path)?.map_or_else(String::new, |m| m.run_id);
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let mut r: ReferenceRow = serde_json::from_str(l).with_context(|| {
                format!(
                    "{} line {}: not a reference row (torch_reference.py's JSON line)",
                    path.display(),
                    i + 1
                )
            })?;
            r.run_id = run_id.clone();
            Ok(r)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_lines_and_names_a_bad_one() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(FILE);
        let line = r#"{"phase": "forward", "wall_s": 0.5, "wall_min_s": 0.4, "wall_max_s": 0.6, "peak_bytes": 1000, "retained_bytes": 900, "torch": "2.9.1", "attention": "eager", "device": "cpu", "dtype": "f32", "threads": 2, "params": 10, "batch": 1, "seq": 8, "model": "small", "layers": null}"#;
        std::fs::write(&p, format!("{line}\n\n{line}\n")).unwrap();
        let rows = read(&p).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].retained_bytes, Some(900));
        assert_eq!(files(dir.path()), vec![p.clone()]);
        std::fs::write(&p, format!("{line}\n{{\"phase\": 3}}\n")).unwrap();
        let err = format!("{:#}", read(&p).unwrap_err());
        assert!(err.contains("line 2") && err.contains(FILE), "{err}");
    }
}
