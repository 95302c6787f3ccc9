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

/// `memfit ARGS`' first JSON line (a `--json` case), or its stderr when it fails.
pub fn json_of(cmd: &mut Command) -> Result<serde_json::Value, String> {
    let out = cmd.output().unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let line = String::from_utf8(out.stdout).unwrap();
    Ok(serde_json::from_str(line.lines().next().unwrap()).unwrap())
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

/// One op's bookkeeping, the one absolute allowance of the memory tests. candle keeps, per live
/// tensor on the CPU, an `Arc<Tensor_>` with its layout's shape and stride vectors and its op
/// node: ≈ 256 B (208 B per graph node; `Tensor::zeros` costs its data + ≈ 256 B). The replay
/// charges 240 B per live tensor, so what is left between a measured and a predicted figure is
/// the few tens of bytes each tensor's metadata differs by, and where the peak falls between two
/// ops, the tensors of one op: at most 8 tensors (a fused backward's outputs and temporaries)
/// × 256 B = 2 KiB. A figure of 200 KiB or more is held to 1 % instead.
pub const OP_BOOKKEEPING: u64 = 8 * 256;

/// The tolerance for a CPU figure of `m` bytes: 1 % of it, or [`OP_BOOKKEEPING`] when that is
/// more (small figures).
pub fn tolerance(m: u64) -> u64 {
    (m / 100).max(OP_BOOKKEEPING)
}

/// |measured − predicted| ≤ [`tolerance`]`(measured)`. With `MEMFIT_TOLERANCE_LOG` set, every
/// check appends one line (test, what, measured, predicted, tolerance) to that file: how close
/// the suite's figures are, measured (with `MEMFIT_TOLERANCE_SURVEY=1` too, every check passes,
/// so a survey sees every figure of every test).
pub fn exact(what: &str, m: u64, p: u64) -> bool {
    let tol = tolerance(m);
    let survey = std::env::var("MEMFIT_TOLERANCE_SURVEY").as_deref() == Ok("1");
    if let Some(path) = std::env::var_os("MEMFIT_TOLERANCE_LOG") {
        use std::io::Write;
        let test = std::thread::current().name().unwrap_or("?").to_string();
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{test}\t{what}\t{m}\t{p}\t{tol}");
        }
    }
    survey || m.abs_diff(p) <= tol
}

/// A row's peak against its prediction, to [`tolerance`].
pub fn exact_peak(row: &Row) -> bool {
    exact(
        &format!("{} {} {} peak", row.preset, row.attention, row.phase),
        row.peak_bytes.expect("measured"),
        row.predicted_peak_bytes.expect("predicted"),
    )
}

/// A row's retained bytes against their prediction, to [`tolerance`].
pub fn exact_retained(row: &Row) -> bool {
    let m = row.retained_bytes.expect("measured retained");
    let p = row.predicted_retained_bytes.expect("predicted retained");
    m >= 0
        && p >= 0
        && exact(
            &format!("{} {} {} retained", row.preset, row.attention, row.phase),
            m as u64,
            p as u64,
        )
}

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

/// The slice widened until its backward peaks inside the sparse layers' exchanges (H 256, 8
/// experts of width 512, V 2048, 2 rows of 64 tokens a rank): the replay of the exchanges'
/// backward is what keeps the backward's peak within tolerance here (`tests/ranks.rs`);
/// `memfit ranks --ep 2` measured it (`results/cpu/ranks/ranks-mixtral-e8-l2-ep2-n2.json`).
pub const MIXTRAL_WIDE: &[&str] = &[
    "--hf-config",
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/mixtral/config.json"
    ),
    "--hf-set",
    "hidden_size=256",
    "--hf-set",
    "intermediate_size=512",
    "--hf-set",
    "num_local_experts=8",
    "--hf-set",
    "vocab_size=2048",
    "--hf-set",
    "max_position_embeddings=128",
    "--batch",
    "2",
    "--seq",
    "64",
    "--optimizer",
    "adamw",
];
