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

/// The CPU's exactness bound: every phase within 12 KiB, absolute (the README's claim).
pub const EXACT_BYTES: u64 = 12 * 1024;

/// On CUDA the pool sees tensor data only — the tensors the formula counts — so its peak is near
/// the prediction: within a factor of two (a meter that reads nothing or everything on the
/// device fails here).
pub fn pool_peak_near(row: &Row) -> bool {
    let m = row.peak_bytes.expect("measured");
    let p = row.predicted_peak_bytes.expect("predicted");
    m >= p / 2 && m <= 2 * p + (64 << 20)
}

/// True when this test binary can run CUDA cases: built with `cuda` and a device answers.
pub fn cuda_available() -> bool {
    cfg!(feature = "cuda") && memfit::device::DeviceSpec::Cuda(0).candle().is_ok()
}

/// Called by a CUDA test variant that found no device: says so on stderr (cargo shows it with
/// `--nocapture`), and fails when `MEMFIT_REQUIRE_CUDA=1` (set it on a GPU machine so a missing
/// device can never pass silently).
pub fn cuda_missing() {
    if std::env::var("MEMFIT_REQUIRE_CUDA").as_deref() == Ok("1") {
        panic!("MEMFIT_REQUIRE_CUDA=1 but no CUDA device answers");
    }
    eprintln!("SKIPPED: no CUDA device (set MEMFIT_REQUIRE_CUDA=1 to make this a failure)");
}

/// Defines a module `$name` with two tests running `$body(device)`: `cpu` with `"cpu"` and
/// `cuda` with `"cuda:0"`. Without the `cuda` feature the CUDA variant is `#[ignore]`d, so the
/// test report lists it as ignored, never as passed; with it but no device it reports itself
/// skipped (see [`cuda_missing`]).
#[macro_export]
macro_rules! on_each_device {
    ($name:ident, $body:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            #[test]
            fn cpu() {
                ($body)("cpu")
            }

            #[test]
            #[cfg_attr(not(feature = "cuda"), ignore = "built without the cuda feature")]
            fn cuda() {
                if $crate::common::cuda_available() {
                    ($body)("cuda:0")
                } else {
                    $crate::common::cuda_missing()
                }
            }
        }
    };
}

/// The device the numeric tests (`tests/selftest.rs`) run on: `MEMFIT_TEST_DEVICE`, `cpu` (the
/// default) or `cuda:N` (a build with the `cuda` feature; the GPU call runs the same checks as
/// `memfit selftest --device cuda:0`, see scripts/gpu-run.sh).
pub fn test_device() -> candle_core::Device {
    match std::env::var("MEMFIT_TEST_DEVICE").as_deref() {
        Err(_) | Ok("cpu") => candle_core::Device::Cpu,
        Ok(name) => {
            let n = name
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| panic!("MEMFIT_TEST_DEVICE={name}: cpu or cuda:N"));
            candle_core::Device::new_cuda(n)
                .unwrap_or_else(|e| panic!("MEMFIT_TEST_DEVICE={name}: {e}"))
        }
    }
}

/// The largest absolute element of an f32 tensor.
pub fn max_abs(t: &candle_core::Tensor) -> f32 {
    t.abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

/// A small Mistral-like `config.json` (H 64, 4 query heads over 2 key heads, 2 layers, V 200)
/// with `sliding_window` `window` (`null` for none) and `max_position_embeddings` `positions`.
pub fn windowed_json(window: &str, positions: usize) -> String {
    format!(
        r#"{{"model_type": "mistral", "hidden_size": 64, "intermediate_size": 96,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
        "vocab_size": 200, "max_position_embeddings": {positions}, "sliding_window": {window},
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
        "tie_word_embeddings": false}}"#
    )
}

/// Every `results.jsonl` under `dir` (folders searched), in no particular order.
pub fn journals_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.file_name().is_some_and(|n| n == "results.jsonl") {
                out.push(p);
            }
        }
    }
    out
}

/// The headless Chromium the report tests drive (`scripts/setup.sh test` installs it), with the
/// flags that keep it off the network and out of the user's profile (`profile`).
pub fn chromium(profile: &Path) -> std::process::Command {
    let path = Path::new("/usr/bin/chromium");
    assert!(
        path.exists(),
        "/usr/bin/chromium missing: install chromium (scripts/setup.sh test does)"
    );
    let mut c = std::process::Command::new(path);
    c.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    c
}

/// A Chrome/Perfetto trace's stacked `bytes` counter (`--timeline`): each event's total over its
/// categories, in order.
#[allow(dead_code)]
pub fn trace_totals(trace: &serde_json::Value) -> Vec<u64> {
    trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "C" && e["name"] == "bytes")
        .map(|e| {
            e["args"]
                .as_object()
                .unwrap()
                .values()
                .map(|b| b.as_u64().unwrap())
                .sum()
        })
        .collect()
}
