//! Serving with other weights (f16 copy, q8_0/q4_0 projections): every inference window
//! predicted, and the logits' error against the model's own weights recorded, growing as the
//! weights get coarser.

mod common;

use common::{exact_peak, pool_peak_near, run_rows};
use memfit::step::Phase;

#[test]
fn serving_weights_are_predicted_and_their_error_recorded() {
    let mut errors = Vec::new();
    for w in ["model", "f16", "q8_0", "q4_0"] {
        let dir = tempfile::tempdir().unwrap();
        let rows = run_rows(
            dir.path(),
            &[
                "--batch",
                "2",
                "--seq",
                "24",
                "--hidden",
                "64",
                "--heads",
                "2",
                "--layers",
                "2",
                "--vocab",
                "150",
                "--phases",
                "inference,prefill,decode",
                "--decode-tokens",
                "3",
                "--weights",
                w,
            ],
        );
        for r in &rows {
            assert_eq!(r.weights, w);
            assert!(
                exact_peak(r),
                "{w} {}: measured {:?} predicted {:?}",
                r.phase,
                r.peak_bytes,
                r.predicted_peak_bytes
            );
        }
        let inference = rows.iter().find(|r| r.phase == Phase::Inference).unwrap();
        match w {
            "model" => assert_eq!(inference.logits_rel_error, None),
            _ => errors.push(inference.logits_rel_error.expect("recorded")),
        }
    }
    // f16 < q8_0 < q4_0, none zero.
    assert!(
        errors[0] > 0.0 && errors[0] < errors[1] && errors[1] < errors[2],
        "{errors:?}"
    );
}

/// A prompt into an empty cache attends as the training forward does: with the efficient or
/// tiled attention the prefill keeps no S×S scores (the efficient one's peak falls below the
/// standard one's), and the replay predicts every serving phase (composed and fused kernels).
#[test]
fn prefill_uses_the_efficient_attention() {
    for kernels in ["composed", "fused"] {
        let mut peaks = Vec::new();
        for attention in ["standard", "efficient", "tiled"] {
            let dir = tempfile::tempdir().unwrap();
            let rows = run_rows(
                dir.path(),
                &[
                    "--batch",
                    "2",
                    "--seq",
                    "300",
                    "--hidden",
                    "64",
                    "--heads",
                    "4",
                    "--layers",
                    "2",
                    "--vocab",
                    "150",
                    "--phases",
                    "prefill,decode",
                    "--decode-tokens",
                    "3",
                    "--attention",
                    attention,
                    "--kernels",
                    kernels,
                ],
            );
            for r in &rows {
                assert_eq!(r.status, memfit::record::Status::Ok, "{r:?}");
                assert!(
                    exact_peak(r),
                    "{kernels} {attention} {}: measured {:?} predicted {:?}",
                    r.phase,
                    r.peak_bytes,
                    r.predicted_peak_bytes
                );
            }
            peaks.push(rows[0].peak_bytes.unwrap());
        }
        // Standard keeps B·A·S² probabilities (2·4·300²·4 B = 2.9 MB) at its peak; the
        // efficient attention none (the tiled one a tile of 128 queries' scores at a time,
        // which at S 300 is not less than the fused standard peak).
        assert!(peaks[1] < peaks[0], "{kernels}: {peaks:?}");
    }
}

/// GGUF's k-quants (`q4_k`, `q6_k`: super-blocks of 256 weights), FP8 with 128×128 block scales
/// and MXFP4 (e2m1 with a power-of-two scale per 32; both dequantized straight into the
/// activations' type), and 16-bit activations
/// through the frozen-linear op (the weights dequantized on the device, cast to the
/// activations' type): every serving window predicted (on the CPU to the byte, up to metadata;
/// on CUDA within the pool's factor), the logits' error recorded and smaller for 6 bits than for
/// 4. A projection input that is not a multiple of 256 is refused for the k-quants.
fn k_quants_and_half_activations(device: &str) {
    let half = if device == "cpu" { "f16" } else { "bf16" };
    let mut errors = std::collections::HashMap::new();
    for (dtype, w) in [
        ("f32", "q4_k"),
        ("f32", "q6_k"),
        (half, "q8_0"),
        (half, "q4_k"),
        ("f32", "fp8"),
        (half, "fp8"),
        ("f32", "mxfp4"),
        (half, "mxfp4"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let rows = run_rows(
            dir.path(),
            &[
                "--device",
                device,
                "--batch",
                "2",
                "--seq",
                "16",
                "--hidden",
                "256",
                "--heads",
                "4",
                "--layers",
                "1",
                "--vocab",
                "150",
                "--dtype",
                dtype,
                "--phases",
                "inference,prefill,decode",
                "--decode-tokens",
                "2",
                "--weights",
                w,
            ],
        );
        assert_eq!(rows.len(), 3, "{rows:?}");
        for r in &rows {
            assert_eq!(r.status, memfit::record::Status::Ok, "{r:?}");
            assert_eq!((r.weights.as_str(), r.dtype.as_str()), (w, dtype));
            let ok = if device == "cpu" {
                exact_peak(r)
            } else {
                pool_peak_near(r)
            };
            assert!(
                ok,
                "{device} {dtype} {w} {}: measured {:?} predicted {:?}",
                r.phase, r.peak_bytes, r.predicted_peak_bytes
            );
        }
        let inference = rows.iter().find(|r| r.phase == Phase::Inference).unwrap();
        let e = inference.logits_rel_error.expect("recorded");
        assert!(e > 0.0 && e < 0.5, "{dtype} {w}: {e}");
        errors.insert((dtype, w), e);
    }
    assert!(
        errors[&("f32", "q6_k")] < errors[&("f32", "q4_k")],
        "{errors:?}"
    );
}

on_each_device!(k_quants, k_quants_and_half_activations);

/// Mixtures of experts served as FP8 checkpoints ship them (Qwen3-MoE's and DeepSeek-V3's
/// fixtures: attention — MLA's latent projections included —, experts and shared experts in FP8,
/// routers and norms dense), and in MXFP4 (Qwen3-MoE's fixture with experts 32 wide, a whole
/// MXFP4 block a row; gpt-oss's with its experts alone in MXFP4, as it ships them): every serving window predicted from the
/// recorded routing, decode over the latent with `kv_b` dequantized for the step, and the
/// logits' error recorded.
fn mixtures_of_experts_in_fp8(device: &str) {
    let half = if device == "cpu" { "f16" } else { "bf16" };
    // MXFP4 cuts rows into blocks of 32: Qwen3-MoE's experts (24 wide) widened for it; the
    // others as their fixtures are.
    for (family, format, width) in [
        ("qwen3_moe", "fp8", "moe_intermediate_size=24"),
        ("deepseek_v3", "fp8", "moe_intermediate_size=20"),
        ("qwen3_moe", "mxfp4", "moe_intermediate_size=32"),
        // gpt-oss as shipped: its experts alone in MXFP4 (48 wide in the fixture: 64 here).
        ("gpt_oss", "mxfp4-experts", "intermediate_size=64"),
    ] {
        let cfg = format!(
            "{}/tests/fixtures/{family}/config.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let dir = tempfile::tempdir().unwrap();
        let rows = run_rows(
            dir.path(),
            &[
                "--device",
                device,
                "--hf-config",
                &cfg,
                "--batch",
                "2",
                "--seq",
                "16",
                "--dtype",
                half,
                "--phases",
                "inference,prefill,decode",
                "--decode-tokens",
                "3",
                "--weights",
                format,
                "--hf-set",
                width,
            ],
        );
        assert_eq!(rows.len(), 3, "{rows:?}");
        for r in &rows {
            assert_eq!(r.status, memfit::record::Status::Ok, "{r:?}");
            assert_eq!(r.weights, format);
            let ok = if device == "cpu" {
                exact_peak(r)
            } else {
                pool_peak_near(r)
            };
            assert!(
                ok,
                "{device} {family} {format} {}: measured {:?} predicted {:?}",
                r.phase, r.peak_bytes, r.predicted_peak_bytes
            );
        }
        let e = rows[0].logits_rel_error.expect("recorded");
        assert!(e > 0.0 && e < 1.0, "{family}: {e}");
    }
}

on_each_device!(moe_fp8, mixtures_of_experts_in_fp8);

/// Generation on two threads: the warm-up runs a prompt and a decode step too, so the second
/// pool thread's gemm packing (512 KiB, first reached by generation's shapes) is allocated
/// before the windows, and every serving window is predicted to the byte as on one thread (was
/// 524,264 B above the prediction in the decode window: an under-estimate).
#[test]
fn generation_on_two_threads_is_predicted() {
    for model in ["gpt", "llama"] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        common::memfit()
            .env("RAYON_NUM_THREADS", "2")
            .args(["run", "--model", model, "--hidden", "256", "--heads", "4"])
            .args([
                "--layers", "2", "--vocab", "150", "--batch", "2", "--seq", "16",
            ])
            .args([
                "--phases",
                "inference,prefill,decode",
                "--decode-tokens",
                "2",
            ])
            .args(["--threads", "2", "--quiet", "--out"])
            .arg(&out)
            .assert()
            .success();
        let rows = memfit::store::jsonl::read(&out.join("results.jsonl")).unwrap();
        assert_eq!(rows.len(), 3);
        for r in &rows {
            assert!(
                exact_peak(r),
                "{model} {}: measured {:?} predicted {:?}",
                r.phase,
                r.peak_bytes,
                r.predicted_peak_bytes
            );
        }
    }
}
