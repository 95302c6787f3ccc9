//! The command line: help, the default run, a flag-only case, the stores it writes, and one
//! clear error per class of bad input (with nothing written).

mod common;

use common::{memfit, run_rows};
use memfit::step::Phase;
use predicates::prelude::*;

#[test]
fn help_carries_examples() {
    memfit()
        .arg("--help")
        .assert()
        .success()
        .stdout(predicate::str::contains("Example"));
    memfit()
        .args(["run", "--help"])
        .assert()
        .success()
        .stdout(predicate::str::contains("memfit run --model gpt --batch 3"));
}

/// `run --help` names every phase and every optimizer memfit has (the lists cannot drift from
/// the code).
#[test]
fn run_help_lists_every_phase_and_optimizer() {
    let out = memfit().args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout).replace('\n', " ");
    for p in memfit::phase::Phase::ALL {
        assert!(
            help.contains(p.as_str()),
            "--phases help lacks {}",
            p.as_str()
        );
    }
    for o in memfit::phase::OptimizerKind::ALL {
        assert!(
            help.contains(o.as_str()),
            "--optimizer help lacks {}",
            o.as_str()
        );
    }
}

#[test]
fn default_run_prints_the_table_and_writes_every_store() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    memfit()
        .args(["run", "--threads", "1", "--out"])
        .arg(&out)
        .assert()
        .success()
        .stdout(predicate::str::contains("predicted").and(predicate::str::contains("train-step")));
    let rows = memfit::store::jsonl::read(&out.join("results.jsonl")).unwrap();
    assert_eq!(rows.len(), 8 * 6, "8 default cases × 6 phases");
    assert!(rows.iter().all(|r| r.status == memfit::record::Status::Ok));
    assert!(rows.iter().all(|r| r.threads == 1));

    // HDF5 and CSV are derived from the journal and read back identical.
    let (meta, h5_rows) = memfit::store::hdf5::read(&out.join("results.h5")).unwrap();
    assert_eq!(h5_rows, rows);
    assert_eq!(meta.threads, 1);
    assert_eq!(meta.candle_version, "0.11.1");
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), rows.len() + 1);
    assert!(out.join("meta.json").exists());
}

#[test]
fn hdf5_opens_in_h5dump() {
    // A foreign reader is the point of the test: without it the test fails, never passes.
    assert!(
        which("h5dump").is_some(),
        "h5dump not on PATH: install hdf5-tools (scripts/setup.sh test does)"
    );
    let dir = tempfile::tempdir().unwrap();
    run_rows(
        dir.path(),
        &[
            "--preset", "tiny", "--batch", "1", "--seq", "8", "--phases", "init",
        ],
    );
    std::process::Command::new("h5dump")
        .arg("-H")
        .arg(dir.path().join("out/results.h5"))
        .output()
        .map(|o| {
            assert!(o.status.success());
            let text = String::from_utf8_lossy(&o.stdout);
            assert!(
                text.contains("peak_bytes") && text.contains("units"),
                "{text}"
            );
        })
        .unwrap();
}

fn which(cmd: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(cmd))
            .find(|f| f.is_file())
    })
}

#[test]
fn flag_only_case_with_grids() {
    let dir = tempfile::tempdir().unwrap();
    let rows = run_rows(
        dir.path(),
        &[
            "--model",
            "gpt",
            "--batch",
            "1,2",
            "--seq",
            "10",
            "--hidden",
            "12",
            "--heads",
            "3",
            "--layers",
            "1",
            "--vocab",
            "20",
            "--phases",
            "init,inference",
            "--optimizer",
            "sgd",
        ],
    );
    assert_eq!(rows.len(), 4);
    assert_eq!(
        rows.iter().map(|r| r.batch).collect::<Vec<_>>(),
        [1, 1, 2, 2]
    );
    assert!(rows.iter().all(|r| r.preset == "custom" && r.max_seq == 10));
}

/// Runs `memfit run ARGS` expecting failure, an error containing every needle, and no output.
fn rejects(args: &[&str], files: &[(&str, &str)], needles: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    let out = dir.path().join("out");
    let assert = memfit()
        .current_dir(dir.path())
        .arg("run")
        .args(args)
        .arg("--out")
        .arg(&out)
        .assert()
        .failure();
    let stderr = String::from_utf8_lossy(&assert.get_output().stderr).to_string();
    for n in needles {
        assert!(stderr.contains(n), "stderr lacks {n:?}: {stderr}");
    }
    assert!(!out.exists(), "bad input must write nothing");
}

#[test]
fn unknown_key_names_file_and_key() {
    rejects(
        &["w.toml"],
        &[("w.toml", "[[grid]]\nbatchsize = 2\n")],
        &["w.toml", "batchsize"],
    );
}

#[test]
fn zero_and_negative_sizes() {
    rejects(
        &["w.toml"],
        &[("w.toml", "[[grid]]\nbatch = 0\n")],
        &["w.toml", "grid[0].batch", "1..="],
    );
    rejects(&["--seq", "-4"], &[], &["flags", "seq", "-4", "1..="]);
    rejects(&["--threads", "0"], &[], &["threads", "1..=1024"]);
}

/// An empty list of names is refused like an empty list of sizes, not expanded to no cases.
#[test]
fn empty_name_lists() {
    rejects(
        &["w.toml"],
        &[("w.toml", "[[grid]]\nkv_cache = []\n")],
        &["w.toml", "grid[0].kv_cache", "empty list", "on, off"],
    );
    rejects(
        &["w.toml"],
        &[("w.toml", "[[grid]]\nweights = []\n")],
        &["w.toml", "grid[0].weights", "empty list"],
    );
    rejects(
        &["w.toml"],
        &[("w.toml", "[[grid]]\noptimizer = []\n")],
        &["w.toml", "grid[0].optimizer", "empty list", "adamw"],
    );
}

/// LoRA's frozen-linear op and QLoRA's blocks run in the activations' type (f32, f16, bf16)
/// but not under mixed precision, whose per-forward 16-bit copies do not cover them: such a
/// case would only record error rows, so it is refused before anything runs.
#[test]
fn lora_frozen_op_refuses_mixed_precision() {
    rejects(
        &["w.toml"],
        &[(
            "w.toml",
            "[[grid]]\nlora_rank = 4\ndtype = \"f16\"\nprecision = \"mixed\"\n",
        )],
        &[
            "w.toml",
            "grid[0].lora_base",
            "op",
            "mixed precision",
            "detach",
        ],
    );
    rejects(
        &[
            "--lora-rank",
            "4",
            "--lora-base",
            "q4_0",
            "--dtype",
            "f16",
            "--precision",
            "mixed",
        ],
        &[],
        &["lora_base", "q4_0", "mixed precision"],
    );
}

/// The k-quants pack 256 weights of a row per super-block, MXFP4 32: a projection whose input
/// is not a multiple is named in the refusal (q4_0's 32 fit the first model).
#[test]
fn k_quant_blocks_need_inputs_of_256() {
    rejects(
        &["--hidden", "64", "--heads", "2", "--weights", "q4_k"],
        &[],
        &[
            "weights",
            "q4_k",
            "256",
            "input width 64",
            "not a multiple of 256",
        ],
    );
    rejects(
        &[
            "--hidden",
            "64",
            "--heads",
            "2",
            "--lora-rank",
            "4",
            "--lora-base",
            "q6_k",
        ],
        &[],
        &["lora_base", "q6_k", "not a multiple of 256"],
    );
    // MXFP4's scale covers 32 weights of a row: a 48-wide input is refused by name.
    rejects(
        &["--hidden", "48", "--heads", "2", "--weights", "mxfp4"],
        &[],
        &["weights", "mxfp4", "input width 48", "not a multiple of 32"],
    );
}

#[test]
fn hidden_not_divisible_by_heads() {
    rejects(
        &["--hidden", "10", "--heads", "3"],
        &[],
        &["heads", "divisible"],
    );
}

#[test]
fn overflowing_byte_count() {
    rejects(
        &[
            "--batch", "1048576", "--seq", "1048576", "--heads", "4", "--hidden", "8",
        ],
        &[],
        &["overflows"],
    );
}

#[test]
fn missing_file_and_unknown_names() {
    rejects(&["nope.toml"], &[], &["nope.toml", "cannot read"]);
    rejects(&["--preset", "huge"], &[], &["preset", "huge", "tiny"]);
    rejects(&["--phases", "fwd"], &[], &["phases", "fwd", "train-step"]);
    rejects(
        &["--device", "gpu0"],
        &[],
        &["device", "gpu0", "cuda:0..=63"],
    );
    rejects(&["--dtype", "f64"], &[], &["dtype", "f64", "bf16"]);
    rejects(&["--dtype", "bf16"], &[], &["dtype", "bf16", "no bf16"]);
    rejects(
        &["--precision", "mixed"],
        &[],
        &["precision", "mixed", "16-bit dtype"],
    );
    rejects(
        &["--attention", "flash"],
        &[],
        &["attention", "flash", "efficient"],
    );
    rejects(
        &["--layers", "2", "--checkpoint", "3"],
        &[],
        &["checkpoint", "3", "0..=2"],
    );
    rejects(
        &["--optimizer", "lion"],
        &[],
        &["optimizer", "lion", "adamw-8bit"],
    );
}

/// A CPU-only build refuses CUDA cases up front and says how to get the CUDA binary.
#[cfg(not(feature = "cuda"))]
#[test]
fn cpu_build_refuses_cuda_with_a_hint() {
    rejects(
        &["--device", "cuda:0"],
        &[],
        &["device", "cuda:0", "scripts/build-cuda.sh"],
    );
}

#[test]
fn existing_journal_is_not_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    run_rows(
        dir.path(),
        &["--phases", "init", "--batch", "1", "--seq", "8"],
    );
    memfit()
        .args(["run", "--phases", "init", "--out"])
        .arg(dir.path().join("out"))
        .assert()
        .failure()
        .stderr(predicate::str::contains("results.jsonl"));
}

/// The CUDA build cannot start without the NVIDIA driver; its launcher says so and points to
/// the CPU build (this machine has no driver; skipped where one is installed).
#[test]
fn cuda_launcher_without_a_driver_points_to_the_cpu_build() {
    let cache = std::process::Command::new("ldconfig").arg("-p").output();
    if cache.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so.1")) {
        eprintln!("SKIPPED: an NVIDIA driver is installed here");
        return;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(root.join("scripts/memfit-cuda"))
        .arg("--version")
        .env("LD_LIBRARY_PATH", "")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no NVIDIA driver") && err.contains("scripts/run.sh"),
        "{err}"
    );
}

/// A mixture of experts' `--fit-in` answers assume the worst routing unless `--routing
/// balanced` is asked for, and say which; with the worst routing they promise no more than with
/// the balanced one (here strictly less: a Mixtral slice whose experts outweigh its attention).
#[test]
fn fit_in_answers_assume_the_worst_routing_by_default() {
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mixtral/config.json");
    let ask = |routing: Option<&str>| {
        let mut cmd = memfit();
        cmd.arg("predict")
            .arg("--hf-config")
            .arg(&fixture)
            .args(["--hf-set", "intermediate_size=4096"])
            .args(["--hf-set", "max_position_embeddings=512"])
            .args(["--batch", "4", "--seq", "64", "--threads", "1", "--json"])
            .args(["--fit-in", "64MiB"]);
        if let Some(r) = routing {
            cmd.args(["--routing", r]);
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let (default, worst, balanced) = (ask(None), ask(Some("worst")), ask(Some("balanced")));
    assert_eq!(default, worst);
    assert_eq!(worst["fit_routing"], "worst");
    assert_eq!(balanced["fit_routing"], "balanced");
    // The figures shown stay the balanced routing's either way.
    assert_eq!(worst["phase_peak_bytes"], balanced["phase_peak_bytes"]);
    let answers = |p: &serde_json::Value| {
        [
            p["max_batch"].as_u64().unwrap(),
            p["max_seq"].as_u64().unwrap(),
            p["serving"]["kv_capacity_tokens"].as_u64().unwrap(),
            p["serving"]["max_context"].as_u64().unwrap(),
        ]
    };
    let (w, b) = (answers(&worst), answers(&balanced));
    assert!(w.iter().zip(&b).all(|(w, b)| w <= b), "{w:?} vs {b:?}");
    assert!(w.iter().zip(&b).any(|(w, b)| w < b), "{w:?} vs {b:?}");
    // A dense model has no routing to assume.
    let out = memfit()
        .args([
            "predict",
            "--preset",
            "llama-tiny",
            "--json",
            "--fit-in",
            "1GiB",
        ])
        .output()
        .unwrap();
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(p.get("fit_routing").is_none(), "{p}");
}

/// `max-batch --routing`: a mixture of experts' predicted batch assumes the worst routing by
/// default and says so; it promises less than the balanced routing's, and never more than the
/// trials find (they run the model's own untrained router, drawn afresh in each run, which
/// spreads tokens unevenly and differently every time: train-step peaks of 13.85–14.37 MB at
/// batch 6 over three runs here, and at a 24 MiB budget the balanced answer named 6 where 5
/// fit, which is why it is not the default). At 64 MiB the two answers are batches apart here
/// (worst 21, balanced 25, 25 found), so the strict order holds on another CPU too.
#[test]
fn max_batch_assumes_the_worst_routing_by_default() {
    let fixture =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/mixtral/config.json");
    let ask = |routing: &str| {
        let out = memfit()
            .arg("max-batch")
            .arg("--hf-config")
            .arg(&fixture)
            .args(["--hf-set", "intermediate_size=1024"])
            .args([
                "--seq",
                "32",
                "--budget",
                "64MiB",
                "--routing",
                routing,
                "--json",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let (worst, balanced) = (ask("worst"), ask("balanced"));
    assert_eq!(worst["routing"], "worst", "{worst}");
    assert_eq!(balanced["routing"], "balanced", "{balanced}");
    let n = |m: &serde_json::Value, k: &str| m[k].as_u64().unwrap_or_else(|| panic!("{k}: {m}"));
    assert!(n(&worst, "predicted") >= 1, "{worst}");
    assert!(
        n(&worst, "predicted") < n(&balanced, "predicted"),
        "{worst} vs {balanced}"
    );
    assert!(n(&worst, "predicted") <= n(&worst, "found"), "{worst}");
}

/// KV capacity per layer kind (vLLM's hybrid allocator): a sliding-window layer keeps at most
/// its window of each sequence, so more tokens of context fit than the per-token cost alone
/// says once `--seq` passes the window: the one windowed layer of two (window 4) at S 16 makes
/// a sequence cost 10 tokens' worth of both layers, and every sliding layer (Mistral's
/// fixture, window 4) 4 tokens' worth.
#[test]
fn kv_capacity_counts_each_layer_kind() {
    for (fixture, tokens_worth) in [("qwen3_layer_types", 10), ("mistral", 4)] {
        let config = format!(
            "{}/tests/fixtures/{fixture}/config.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let out = memfit()
            .args(["predict", "--hf-config", &config])
            .args(["--batch", "1", "--seq", "16", "--threads", "1", "--json"])
            .args(["--fit-in", "64MiB"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let sv = &p["serving"];
        let u = |k: &str| sv[k].as_u64().unwrap_or_else(|| panic!("{k}: {sv}"));
        let per_token = u("kv_bytes_per_token");
        let per_sequence = u("kv_bytes_per_sequence");
        assert_eq!(per_sequence, tokens_worth * per_token, "{fixture}: {sv}");
        // On the CPU the budget holds the process's gemm slabs first.
        let process = p["process_bytes"]
            .as_u64()
            .expect("a CPU budget's process part");
        let free = (64u64 << 20) - process - u("weights_bytes") - u("prefill_activation_bytes");
        assert_eq!(
            u("kv_capacity_tokens"),
            free * 16 / per_sequence,
            "{fixture}"
        );
        assert_eq!(u("kv_capacity_sequences"), free / per_sequence, "{fixture}");
        assert!(
            u("kv_capacity_tokens") > free / per_token,
            "{fixture}: {sv}"
        );
    }
}

/// `predict` runs nothing and agrees with the predictions `run` stores; `--fit-in` answers.
#[test]
fn predict_agrees_with_run_and_answers_fit_in() {
    let args = [
        "--batch", "2", "--seq", "33", "--hidden", "96", "--heads", "3", "--layers", "2",
        "--vocab", "300",
    ];
    let dir = tempfile::tempdir().unwrap();
    let rows = run_rows(dir.path(), &args);
    let out = memfit()
        .arg("predict")
        .args(args)
        .args(["--threads", "1", "--json", "--fit-in", "1GiB"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let phases = p["phase_peak_bytes"].as_array().unwrap();
    assert_eq!(phases.len(), rows.len());
    for (ph, r) in phases.iter().zip(&rows) {
        assert_eq!(ph[0].as_str().unwrap(), r.phase.as_str());
        assert_eq!(ph[1].as_u64(), r.predicted_peak_bytes, "{}", r.phase);
    }
    assert_eq!(p["params"].as_u64(), Some(rows[0].params));
    assert_eq!(p["fits"], serde_json::json!(true));
    assert!(p["max_batch"].as_u64().unwrap() >= 2);
    // The backward the figures assume, and the whole backward's train step beside it, which is
    // what `run --backward whole` predicts (and stores).
    assert_eq!(p["backward"], serde_json::json!("by-block"));
    let whole_rows = run_rows(
        &dir.path().join("whole"),
        &[&args[..], &["--backward", "whole"]].concat(),
    );
    let whole_step = whole_rows
        .iter()
        .find(|r| r.phase == Phase::TrainStep)
        .unwrap();
    assert_eq!(
        p["whole_backward_train_step_bytes"].as_u64(),
        whole_step.predicted_peak_bytes
    );
    let step = rows.iter().find(|r| r.phase == Phase::TrainStep).unwrap();
    assert!(step.predicted_peak_bytes < whole_step.predicted_peak_bytes);
    // A budget below the weights: does not fit, not even at batch 1.
    let out = memfit()
        .arg("predict")
        .args(args)
        .args(["--json", "--fit-in", "100KiB"])
        .output()
        .unwrap();
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(p["fits"], serde_json::json!(false));
    assert_eq!(p["max_batch"], serde_json::json!(0));
    // Bad budgets are user errors naming the flag.
    memfit()
        .args(["predict", "--fit-in", "lots"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("fit-in").and(predicate::str::contains("lots")));
}

/// `fit` reads a run folder (never measures) and fits each phase; the forward graph is linear
/// in the decoder features, so its fit is near exact and the held-out errors small. With the
/// lean fused kernels: under the default (transformers') set, an f32 forward's peak moves
/// between the blocks and the loss's softmax and log-probabilities (three `(N, V)` f32 at once)
/// as the shapes change, a maximum of two planes that no single plane fits to r² 0.999.
#[test]
fn fit_reads_results_and_fits_the_forward() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    memfit()
        .args([
            "run",
            "--kernels",
            "fused",
            "--batch",
            "1,2,3",
            "--seq",
            "16,40",
            "--hidden",
            "32,64",
            "--heads",
            "2",
            "--layers",
            "1",
            "--vocab",
            "50",
            "--phases",
            "forward",
            "--threads",
            "1",
            "--quiet",
            "--out",
        ])
        .arg(&out)
        .assert()
        .success();
    let o = memfit()
        .args(["fit", "--json"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let lines: Vec<serde_json::Value> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let groups: Vec<&serde_json::Value> =
        lines.iter().filter(|v| v.get("phase").is_some()).collect();
    assert_eq!(groups.len(), 1);
    // The textbook activations formula is evaluated on the same forward rows.
    let korthikanti = lines
        .iter()
        .find(|v| v["formula"] == "Korthikanti 34+5as/h")
        .expect("textbook line");
    assert_eq!(korthikanti["cases"], 12);
    let g = &groups[0];
    assert_eq!(g["phase"], "forward");
    assert_eq!(g["rows"], 12);
    assert!(g["r2"].as_f64().unwrap() > 0.999, "{g}");
    let kfold = g["kfold"].as_array().unwrap();
    assert!(kfold[1].as_f64().unwrap() < 10.0, "{g}");
    // Per component: the forward's activations and every window's peak, from the 12 rows'
    // own predictions, none under-estimated.
    for component in ["activations", "step peaks"] {
        let c = lines
            .iter()
            .find(|v| v["component"] == component)
            .unwrap_or_else(|| panic!("{component}"));
        assert_eq!(
            (c["rows"].as_u64(), c["under"].as_u64()),
            (Some(12), Some(0)),
            "{c}"
        );
        // Tiny rows: what is left is bookkeeping, within one op's (2 KiB).
        assert!(c["worst_under_bytes"].as_f64().unwrap() <= 2048.0, "{c}");
        assert!(c["max_abs_pct"].as_f64().unwrap() < 5.0, "{c}");
    }
    memfit()
        .args(["fit", "no/such/dir"])
        .assert()
        .failure()
        .stderr(predicate::str::contains("no/such/dir"));
}

/// `max-batch` predicts, then verifies in child processes under the allocator's budget; on
/// these shapes the formula's answer is the found one (budget trials: found passes, found + 1
/// fails).
#[test]
fn max_batch_finds_the_predicted_batch() {
    let out = memfit()
        .args([
            "max-batch",
            "--hidden",
            "96",
            "--heads",
            "3",
            "--layers",
            "2",
            "--vocab",
            "300",
            "--seq",
            "64",
            "--budget",
            "32MiB",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let (predicted, found) = (
        m["predicted"].as_u64().unwrap(),
        m["found"].as_u64().unwrap(),
    );
    assert!(found >= 1);
    // The prediction adds the case process's own heap, measured on this machine (gemm's
    // per-thread packing buffers kept from the warm-up, sized by this CPU's caches; thread
    // pools: 1,073,238 B at 1 thread on an AMD EPYC), so it names exactly the batch the trials
    // find on any CPU. The tensors alone named one batch more than fits at 12 of 13 budgets
    // there, two on an Intel Xeon with AVX-512.
    assert_eq!(found, predicted, "{m}");
    let overhead = m["process_overhead_bytes"].as_i64().expect("measured");
    assert!(overhead > 0, "{m}");
    assert!(m["formula_predicted"].as_u64().unwrap() >= predicted, "{m}");
    let trials = m["trials"].as_array().unwrap();
    let verdict = |b: u64| {
        trials
            .iter()
            .find(|t| t["batch"].as_u64() == Some(b))
            .map(|t| t["fits"].as_bool().unwrap())
    };
    assert_eq!(verdict(found), Some(true), "{m}");
    assert_eq!(verdict(found + 1), Some(false), "{m}");
    // `predict --fit-in` runs nothing: it leaves this CPU's gemm slabs (2 × its L2 at one
    // thread) out of the budget, and promises no more than the trials found.
    let out = memfit()
        .args(["predict", "--hidden", "96", "--heads", "3", "--layers", "2"])
        .args(["--vocab", "300", "--seq", "64", "--threads", "1", "--json"])
        .args(["--fit-in", "32MiB"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let slabs = p["process_bytes"].as_u64().expect("the CPU's process part");
    assert!(
        slabs > 0 && slabs <= overhead as u64,
        "{p}: measured {overhead}"
    );
    let promised = p["max_batch"].as_u64().unwrap();
    assert!(
        promised <= found,
        "predict promises {promised}, {found} fits: {p}"
    );
    // The budget really binds: the same case far above it fails because of the budget (the
    // allocator's refusal, or a row recorded out of memory), and runs under a large budget.
    let case = [
        "run",
        "--hidden",
        "96",
        "--heads",
        "3",
        "--layers",
        "2",
        "--vocab",
        "300",
        "--seq",
        "64",
        "--batch",
        "64",
        "--phases",
        "train-step",
        "--quiet",
        "--threads",
        "1",
    ];
    let tmp = tempfile::tempdir().unwrap();
    let over = memfit()
        .args(case)
        .args(["--mem-budget", "32MiB", "--out"])
        .arg(tmp.path().join("o"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&over.stderr);
    let journal = memfit::store::jsonl::read(&tmp.path().join("o/results.jsonl")).ok();
    let oom_row = journal
        .iter()
        .flatten()
        .any(|r| r.phase == Phase::TrainStep && r.status == memfit::record::Status::Oom);
    assert!(
        (!over.status.success() && stderr.contains("memory allocation of")) || oom_row,
        "the budget's own failure expected: {over:?}"
    );
    memfit()
        .args(case)
        .args(["--mem-budget", "4GiB", "--out"])
        .arg(tmp.path().join("ok"))
        .assert()
        .success();
}

/// The help texts of flags whose behaviour depends on the device say the default the expander
/// applies (one source: `workload::DEFAULT_KERNELS`, `DEFAULT_ATTENTION`), and that default is
/// what a case gets on the CPU and on CUDA alike (predicted here: a CUDA case is expanded for
/// prediction without a GPU).
#[test]
fn help_texts_state_the_defaults_each_device_gets() {
    use memfit::model::kernels::Kernels;
    use memfit::workload::{self, DEFAULT_ATTENTION, DEFAULT_KERNELS, GridSpec, WorkloadFile};
    for cmd in ["run", "predict"] {
        let o = common::memfit().args([cmd, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&o.stdout)
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            help.contains(&format!("default {DEFAULT_KERNELS} on every device")),
            "{cmd} --help: {help}"
        );
        assert!(
            help.contains(&format!("default {DEFAULT_ATTENTION} on every device")),
            "{cmd} --help"
        );
        assert!(!help.contains("the default on CUDA"), "{cmd} --help");
    }
    for device in ["cpu", "cuda:0"] {
        let flags = GridSpec {
            preset: Some("tiny".into()),
            device: Some(device.into()),
            ..GridSpec::default()
        };
        let cases =
            workload::expand_for_prediction(&WorkloadFile::default(), &flags, "flags").unwrap();
        assert!(!cases.is_empty());
        for c in &cases {
            assert_eq!(
                c.cfg.kernels,
                Kernels::parse(DEFAULT_KERNELS).unwrap(),
                "{device}"
            );
            let standard = !c.cfg.efficient_attention && !c.cfg.tiled_attention;
            assert_eq!(standard, DEFAULT_ATTENTION == "standard", "{device}");
        }
    }
}

/// A size without a unit is refused (is `80` bytes or GiB?), naming the flag and the units, and
/// so is zero; before, `--fit-in 80` answered for 80 bytes ("fits no, max B 0").
#[test]
fn sizes_without_a_unit_or_zero_are_refused() {
    for (args, value) in [
        (vec!["predict", "--preset", "tiny", "--fit-in", "80"], "80"),
        (
            vec!["predict", "--preset", "tiny", "--fit-in", "0GiB"],
            "0GiB",
        ),
        (
            vec![
                "max-batch",
                "--preset",
                "tiny",
                "--seq",
                "8",
                "--budget",
                "512",
            ],
            "512",
        ),
        (
            vec!["run", "--preset", "tiny", "--seq", "8", "--mem-budget", "0"],
            "0",
        ),
    ] {
        let out = memfit().args(&args).assert().failure();
        let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
        assert!(
            err.contains(&format!("= {value} is out of range")) && err.contains("GiB"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// `memfit ranks` refuses, by name, what it does not run on ranks: a 16-bit case (ranks train
/// in f32), ZeRO stage 3 with checkpointing, ZeRO 3's testing flag elsewhere, LoRA, 8-bit AdamW, several cases, a pipeline of more stages than
/// layers, of one stage, with ZeRO or without microbatches; nothing panics.
#[test]
fn ranks_refuses_what_it_does_not_run() {
    let tiny = [
        "ranks", "--hidden", "16", "--heads", "2", "--layers", "1", "--vocab", "50", "--seq", "8",
    ];
    for (more, says) in [
        (vec!["--dtype", "f16"], "ranks train in f32"),
        (
            vec!["--zero", "3", "--checkpoint", "1"],
            "not run under ZeRO 3",
        ),
        (
            vec!["--zero3-skip-tied-second-use"],
            "without --zero 3 and a tied head",
        ),
        (vec!["--lora-rank", "4"], "ViT or LoRA"),
        (vec!["--optimizer", "adamw-8bit"], "adamw-8bit's blocks"),
        (vec!["--batch", "1,2"], "give one"),
        (vec!["--pp", "2"], "cannot fill 2 stages"),
        (vec!["--pp", "1"], "2 stages or more"),
        (vec!["--pp", "2", "--zero", "1"], "leave --zero out"),
        (
            vec!["--pp", "2", "--microbatches", "0"],
            "1 microbatch or more",
        ),
    ] {
        let out = memfit().args(tiny).args(&more).assert().failure();
        let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
        assert!(err.contains(says), "{more:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
