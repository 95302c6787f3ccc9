//! Figures the README and BENCHMARKS.md quote from the committed results, read again from them
//! (issue: figures that cannot go stale). Each test names the README line it checks and fails when either the
//! line or the rows move apart.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every row of every committed `results/cpu/**/results.jsonl`.
fn committed_rows() -> Vec<serde_json::Value> {
    fn walk(dir: &Path, out: &mut Vec<serde_json::Value>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.file_name().is_some_and(|n| n == "results.jsonl") {
                let text = std::fs::read_to_string(&p).unwrap();
                out.extend(text.lines().map(|l| serde_json::from_str(l).unwrap()));
            }
        }
    }
    let mut rows = Vec::new();
    walk(&root().join("results/cpu"), &mut rows);
    rows
}

/// The README's accuracy row for `prefill` and `decode`: every committed CPU row within
/// 1.8 KiB of its prediction, prefill within 0.06 %, decode within 0.24 %.
#[test]
fn prefill_and_decode_accuracy_row() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(
        readme.contains("| ≤ 1.8 KiB; prefill ≤ 0.06 %, decode ≤ 0.24 % (a step of 83 KB)"),
        "README's prefill/decode row changed: update this test with it"
    );
    let mut seen = 0;
    for r in committed_rows() {
        let phase = r["phase"].as_str().unwrap_or_default();
        if !matches!(phase, "prefill" | "decode") || r["device"] != "cpu" || r["status"] != "ok" {
            continue;
        }
        let (Some(m), Some(p)) = (r["peak_bytes"].as_u64(), r["predicted_peak_bytes"].as_u64())
        else {
            continue;
        };
        let (diff, rel) = (m.abs_diff(p), m.abs_diff(p) as f64 / m as f64 * 100.0);
        let bound = if phase == "prefill" { 0.06 } else { 0.24 };
        assert!(
            diff <= 1843 && rel <= bound,
            "{phase} case {} ({}): measured {m}, predicted {p}: {diff} B, {rel:.3} %",
            r["case"],
            r["preset"]
        );
        seen += 1;
    }
    assert!(seen >= 10, "only {seen} prefill/decode rows committed");
}

/// The README's "GPT-2 small (B 1, S 128): every phase of every committed CPU row within
/// 0.01 %".
#[test]
fn gpt2_small_every_phase_row() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(
        readme.contains(
            "GPT-2 small (B 1, S 128): every phase of every committed CPU row within 0.01 %"
        ),
        "README's GPT-2 small line changed: update this test with it"
    );
    let mut seen = 0;
    for r in committed_rows() {
        if r["preset"] != "gpt2-small" || r["device"] != "cpu" || r["status"] != "ok" {
            continue;
        }
        let (Some(m), Some(p)) = (r["peak_bytes"].as_u64(), r["predicted_peak_bytes"].as_u64())
        else {
            continue;
        };
        let rel = m.abs_diff(p) as f64 / m as f64 * 100.0;
        assert!(
            rel <= 0.01,
            "{} case {}: measured {m}, predicted {p}: {rel:.4} %",
            r["phase"],
            r["case"]
        );
        seen += 1;
    }
    assert!(seen >= 6, "only {seen} GPT-2 small rows committed");
}

/// BENCHMARKS.md § 4: "memfit's fused rows are predicted by the replay within 0.39 % on every
/// phase" (the stored torch-compare rows).
#[test]
fn torch_compare_fused_rows_within_their_bound() {
    let bench = std::fs::read_to_string(root().join("BENCHMARKS.md")).unwrap();
    assert!(
        bench.contains(
            "memfit's fused rows are predicted by the replay within 0.39 % on every phase"
        ),
        "BENCHMARKS.md's line changed: update this test with it"
    );
    let text =
        std::fs::read_to_string(root().join("results/cpu/torch-compare/results.jsonl")).unwrap();
    let mut seen = 0;
    for line in text.lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap();
        if r["kernels"] != "fused" || r["status"] != "ok" {
            continue;
        }
        let (Some(m), Some(p)) = (r["peak_bytes"].as_u64(), r["predicted_peak_bytes"].as_u64())
        else {
            continue;
        };
        let rel = m.abs_diff(p) as f64 / m as f64 * 100.0;
        assert!(
            rel <= 0.39,
            "{} {}: measured {m}, predicted {p}: {rel:.3} %",
            r["preset"],
            r["phase"]
        );
        seen += 1;
    }
    assert!(seen >= 30, "only {seen} fused torch-compare rows");
}
