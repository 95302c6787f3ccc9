//! Helpers shared by the integration tests: run the `memfit` binary in a fresh folder and read
//! its journal.
#![allow(dead_code)]

use std::path::Path;

use assert_cmd::Command;
use memfit::record::Row;

/// A `memfit` command pinned to one thread (memory figures do not depend on it, but times and
/// the gemm scratch do).
pub fn memfit() -> Command {
    let mut c = Command::cargo_bin("memfit").expect("memfit binary");
    c.env("RAYON_NUM_THREADS", "1");
    c
}

/// Runs `memfit run ARGS --out DIR/out --threads 1 --quiet` and returns the journal's rows.
pub fn run_rows(dir: &Path, args: &[&str]) -> Vec<Row> {
    let out = dir.join("out");
    memfit()
        .arg("run")
        .args(args)
        .args(["--threads", "1", "--quiet", "--out"])
        .arg(&out)
        .assert()
        .success();
    memfit::store::jsonl::read(&out.join("results.jsonl")).expect("journal reads back")
}

/// |measured − predicted| ≤ rel·measured + abs.
pub fn within(row: &Row, rel: f64, abs: u64) -> bool {
    let m = row.peak_bytes.expect("measured") as f64;
    let p = row.predicted_peak_bytes.expect("predicted") as f64;
    (m - p).abs() <= rel * m + abs as f64
}
