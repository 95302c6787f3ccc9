//! Predictions pinned before the model and its replay are refactored (issue 50): `memfit predict
//! --json` of every preset and shipped config on `cuda:0` (no figure depends on the host), in
//! f32 and bf16, composed and fused kernels, standard and efficient (tiled, on CUDA) attention,
//! and for a model of each family mixed precision, checkpointing, the whole backward, LoRA and
//! QLoRA, quantized and FP8/MXFP4 serving, decode with and without the cache, and the fixtures'
//! Hugging Face configs. The predictions must stay byte-identical through a refactor
//! (`tests/snapshots/predict.jsonl`, one JSON object per case).
//!
//! A change that means to move a prediction regenerates the file
//! (`MEMFIT_SNAPSHOT=update cargo test --test snapshot`) and says in its commit which figures
//! moved and why; the test prints the first cases that differ. A new preset enters the workload
//! by itself (the lists come from the families) and fails until the file is regenerated.

mod common;

use std::fmt::Write as _;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

const TRAIN: &str = r#"["init", "forward", "backward", "optimizer", "train-step", "inference"]"#;
const SERVE: &str = r#"["init", "inference", "prefill", "decode"]"#;

/// The presets pinned, in the order the snapshot lists them (a new preset is added here, at the
/// end: `every_preset_is_pinned`).
const PINNED: &[&str] = &[
    "tiny",
    "small",
    "gpt2-small",
    "gpt2-medium",
    "llama-7b-shape",
    "vit-tiny",
    "vit-s16",
    "vit-b16",
    "vit-l16",
    "llama-tiny",
    "llama-2-7b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3.2-1b",
    "mistral-7b",
    "phi-3-mini",
    "qwen2-0.5b",
    "qwen3-8b",
    "qwen3-30b-a3b",
    "gemma-3-1b",
    "gemma-3-27b",
    "gpt-oss-20b",
    "mixtral-8x7b",
    "deepseek-v2-lite",
    "tinyllama-1.1b",
    "smollm2-135m",
    "llama-4-scout-17b-16e",
    "qwen3-next-80b-a3b",
    "gemma-2-2b",
    "smollm3-3b",
];

/// Every preset memfit has (GPT, ViT, the LLaMA line's and the families') is pinned.
#[test]
fn every_preset_is_pinned() {
    let all: Vec<&str> = memfit::model::config::PRESETS
        .iter()
        .chain(memfit::model::vit::PRESETS)
        .copied()
        .chain(memfit::model::llama::presets())
        .collect();
    for p in &all {
        assert!(PINNED.contains(p), "{p} is not in the snapshot's PINNED");
    }
    assert_eq!(all.len(), PINNED.len());
}

/// The snapshot's workload: one grid per preset (every kernel set and attention it accepts, f32
/// and bf16), the variants on a model of each family, the fixtures' configs.
fn workload() -> String {
    let mut w = String::from("[defaults]\ndevice = \"cuda:0\"\nbatch = 1\n\n");
    for p in PINNED {
        let vit = p.starts_with("vit-");
        // gpt-oss's sinks, Llama 4's chunks and Gemma 2's soft-capped scores are built into
        // the standard attention only.
        let attention =
            if *p == "gpt-oss-20b" || p.starts_with("llama-4") || p.starts_with("gemma-2-") {
                r#"["standard"]"#
            } else {
                r#"["standard", "efficient"]"#
            };
        let _ = writeln!(
            w,
            "[[grid]]\npreset = \"{p}\"\n{}dtype = [\"f32\", \"bf16\"]\nkernels = [\"composed\", \"fused\"]\nattention = {attention}\nphases = {TRAIN}\n",
            if vit { "" } else { "seq = 128\n" }
        );
    }
    // Training variants on a decoder of each kind (dense GPT, LLaMA, MoE, MLA) and a ViT.
    for p in [
        "gpt2-small",
        "llama-3-8b",
        "qwen3-30b-a3b",
        "deepseek-v2-lite",
        "gemma-3-1b",
        "vit-b16",
    ] {
        let seq = if p.starts_with("vit-") {
            ""
        } else {
            "seq = 512\n"
        };
        let _ = writeln!(
            w,
            "[[grid]]\npreset = \"{p}\"\n{seq}dtype = \"bf16\"\nprecision = [\"pure\", \"mixed\"]\ncheckpoint = [0, 1]\nphases = {TRAIN}\n"
        );
        let _ = writeln!(
            w,
            "[[grid]]\npreset = \"{p}\"\n{seq}dtype = \"bf16\"\nbackward = \"whole\"\nphases = {TRAIN}\n"
        );
        // QLoRA over a mixture of experts is not built.
        let bases = if matches!(p, "qwen3-30b-a3b" | "deepseek-v2-lite") {
            r#"["detach", "op"]"#
        } else {
            r#"["detach", "op", "q4_0", "fp8"]"#
        };
        let _ = writeln!(
            w,
            "[[grid]]\npreset = \"{p}\"\n{seq}dtype = \"bf16\"\nlora_rank = 8\nlora_targets = [\"all\"]\nlora_base = {bases}\nphases = {TRAIN}\n"
        );
    }
    // Serving: weights as held, the cache on and off, a longer context.
    for p in [
        "llama-3-8b",
        "qwen3-30b-a3b",
        "deepseek-v2-lite",
        "mistral-7b",
    ] {
        // GGML-quantized serving of a mixture of experts is not built.
        let weights = if matches!(p, "qwen3-30b-a3b" | "deepseek-v2-lite") {
            r#"["model", "f16", "fp8", "mxfp4"]"#
        } else {
            r#"["model", "f16", "q8_0", "q4_0", "fp8", "mxfp4"]"#
        };
        let _ = writeln!(
            w,
            "[[grid]]\npreset = \"{p}\"\nseq = [512, 4000]\ndtype = \"bf16\"\nweights = {weights}\ndecode_tokens = 4\nphases = {SERVE}\n"
        );
        let _ = writeln!(
            w,
            "[[grid]]\npreset = \"{p}\"\nseq = 512\ndtype = \"bf16\"\nkv_cache = [\"on\", \"off\"]\ndecode_tokens = 4\nphases = {SERVE}\n"
        );
    }
    // gpt-oss as shipped (its experts in MXFP4).
    let _ = writeln!(
        w,
        "[[grid]]\npreset = \"gpt-oss-20b\"\nseq = [512, 4000]\ndtype = \"bf16\"\ndecode_tokens = 4\nphases = {SERVE}\n"
    );
    // The fixtures' configs (transformers' own files), in their f32 and in bf16.
    let mut fixtures: Vec<PathBuf> = std::fs::read_dir(root().join("tests/fixtures"))
        .unwrap()
        .map(|e| e.unwrap().path().join("config.json"))
        .filter(|p| p.is_file())
        .collect();
    fixtures.sort();
    for f in fixtures {
        let rel = f.strip_prefix(root()).unwrap().display().to_string();
        // gpt-oss's sinks, Gemma 2's capped scores and Llama 4's chunks: the standard
        // attention only.
        let attention = if ["gpt_oss", "gemma2", "llama4"]
            .iter()
            .any(|f| rel.contains(f))
        {
            r#"["standard"]"#
        } else {
            r#"["standard", "efficient"]"#
        };
        let _ = writeln!(
            w,
            "[[grid]]\nhf_config = \"{rel}\"\nseq = 16\ndtype = [\"f32\", \"bf16\"]\nattention = {attention}\ndecode_tokens = 3\nphases = [\"init\", \"forward\", \"backward\", \"optimizer\", \"train-step\", \"inference\", \"prefill\", \"decode\"]\n"
        );
    }
    w
}

/// `memfit predict WORKLOAD --json --threads 2 EXTRA` against the pinned `file`.
fn pinned(file: &str, workload: &str, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let toml = dir.path().join("snapshot.toml");
    std::fs::write(&toml, workload).unwrap();
    let out = common::memfit()
        .current_dir(root())
        .arg("predict")
        .arg(&toml)
        .args(["--json", "--threads", "2"])
        .args(extra)
        .assert()
        .success();
    let got = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    let path = root().join("tests/snapshots").join(file);
    if std::env::var("MEMFIT_SNAPSHOT").as_deref() == Ok("update") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    let (g, w): (Vec<&str>, Vec<&str>) = (got.lines().collect(), want.lines().collect());
    let differ: Vec<String> = g
        .iter()
        .zip(&w)
        .enumerate()
        .filter(|(_, (a, b))| a != b)
        .take(3)
        .map(|(i, (a, b))| format!("case {i}:\n  now:    {a}\n  pinned: {b}"))
        .collect();
    assert!(
        differ.is_empty() && g.len() == w.len(),
        "{} of {} predictions differ from tests/snapshots/{file} ({} now, {} pinned); if the \
         change means it, regenerate with MEMFIT_SNAPSHOT=update and say which moved:\n{}",
        g.iter().zip(&w).filter(|(a, b)| a != b).count() + g.len().abs_diff(w.len()),
        g.len().max(w.len()),
        g.len(),
        w.len(),
        differ.join("\n")
    );
}

#[test]
fn predictions_are_pinned() {
    pinned("predict.jsonl", &workload(), &[]);
}

/// The budget answers (fits, max batch, max sequence, KV capacity, max context) of every case,
/// at 80 GiB, worst and balanced routing.
#[test]
fn budget_answers_are_pinned() {
    let w = workload();
    pinned("predict-fit-in-80GiB.jsonl", &w, &["--fit-in", "80GiB"]);
    pinned(
        "predict-fit-in-80GiB-balanced.jsonl",
        &w,
        &["--fit-in", "80GiB", "--routing", "balanced"],
    );
}
