//! Measured peaks against the formula module on small configs, odd ones included. Each config
//! runs in its own `memfit` process, so the process-wide allocator counters see one case only.

mod common;

use common::{exact_peak, exact_retained, run_rows};
use memfit::step::Phase;

/// Every case twice: with candle's composed ops and with memfit's fused kernels.
fn check(args: &[&str]) {
    for kernels in ["composed", "fused"] {
        let mut with = args.to_vec();
        with.extend(["--kernels", kernels]);
        check_one(&with);
    }
}

fn check_one(args: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let rows = run_rows(dir.path(), args);
    assert_eq!(rows.len(), 6, "one row per phase");
    for r in &rows {
        assert_eq!(r.status, memfit::record::Status::Ok, "{r:?}");
        assert!(
            exact_peak(r),
            "{args:?} {}: measured {:?} predicted {:?}",
            r.phase,
            r.peak_bytes,
            r.predicted_peak_bytes
        );
    }
    // Weights: parameters × bytes per element exactly (f32 masters under mixed precision), plus
    // metadata only.
    let init = rows.iter().find(|r| r.phase == Phase::Init).unwrap();
    let e = if init.dtype == "f16" && init.precision == "pure" {
        2
    } else {
        4
    };
    let weights = e * init.params;
    let retained = init.retained_bytes.unwrap() as u64;
    // The metadata beyond `params × e` (the VarMap, the names, the tensor handles: 15–26 KB
    // here) is the formula's within the same tolerance.
    assert!(retained >= weights && exact_retained(init), "{init:?}");
}

#[test]
fn odd_heads_odd_seq() {
    check(&[
        "--batch", "2", "--seq", "77", "--hidden", "120", "--heads", "5", "--layers", "3",
        "--vocab", "1000",
    ]);
}

#[test]
fn batch_one_three_heads() {
    check(&[
        "--batch", "1", "--seq", "33", "--hidden", "96", "--heads", "3", "--layers", "2",
        "--vocab", "300",
    ]);
}

#[test]
fn single_head_sgd() {
    check(&[
        "--batch",
        "3",
        "--seq",
        "50",
        "--hidden",
        "48",
        "--heads",
        "1",
        "--layers",
        "2",
        "--vocab",
        "97",
        "--optimizer",
        "sgd",
    ]);
}

/// Deep and wide with a small vocabulary: the backward peak is inside the blocks (attention
/// and GELU temporaries beside the accumulated gradients), not at the head.
#[test]
fn backward_peak_inside_the_blocks() {
    check(&[
        "--batch", "2", "--seq", "64", "--hidden", "256", "--heads", "4", "--layers", "4",
        "--vocab", "128",
    ]);
}

/// Efficient attention: no score matrix in the graph; every phase still predicted.
#[test]
fn efficient_attention_odd_shape() {
    check(&[
        "--batch",
        "2",
        "--seq",
        "77",
        "--hidden",
        "120",
        "--heads",
        "5",
        "--layers",
        "3",
        "--vocab",
        "1000",
        "--attention",
        "efficient",
    ]);
}

/// Sliding windows inside the efficient op and the tiled composition (a Mistral-like config,
/// grouped-query, window 40 of S 300: the tiles after the first read 167 keys, the op skips
/// the others): every phase predicted, and the prompt and decode steps too (the prompt
/// through the windowed op, the cache kept at the last 40 tokens).
#[test]
fn windows_inside_efficient_and_tiled_attention() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mistral.json");
    std::fs::write(&path, common::windowed_json("40", 512)).unwrap();
    for attention in ["efficient", "tiled"] {
        check(&[
            "--hf-config",
            path.to_str().unwrap(),
            "--batch",
            "1",
            "--seq",
            "300",
            "--attention",
            attention,
        ]);
        let out = tempfile::tempdir().unwrap();
        let rows = run_rows(
            out.path(),
            &[
                "--hf-config",
                path.to_str().unwrap(),
                "--batch",
                "2",
                "--seq",
                "300",
                "--phases",
                "prefill,decode",
                "--decode-tokens",
                "3",
                "--attention",
                attention,
            ],
        );
        assert_eq!(rows.len(), 2);
        for r in &rows {
            assert_eq!(r.status, memfit::record::Status::Ok, "{r:?}");
            assert!(
                exact_peak(r),
                "{attention} {}: measured {:?} predicted {:?}",
                r.phase,
                r.peak_bytes,
                r.predicted_peak_bytes
            );
        }
    }
}

/// The tiled attention composition (two tiles of queries), f32 and f16.
#[test]
fn tiled_attention_two_tiles() {
    for dtype in ["f32", "f16"] {
        check(&[
            "--batch",
            "1",
            "--seq",
            "150",
            "--hidden",
            "64",
            "--heads",
            "2",
            "--layers",
            "2",
            "--vocab",
            "200",
            "--attention",
            "tiled",
            "--dtype",
            dtype,
        ]);
    }
}

/// Efficient attention in f16 (arithmetic in f32 inside the op, stored in f16).
#[test]
fn efficient_attention_f16() {
    check(&[
        "--batch",
        "2",
        "--seq",
        "45",
        "--hidden",
        "64",
        "--heads",
        "4",
        "--layers",
        "2",
        "--vocab",
        "300",
        "--dtype",
        "f16",
        "--attention",
        "efficient",
    ]);
}

/// f16 on the CPU: everything in 16 bits (candle's AdamW keeps f16 moments), gemm-f16's packing.
#[test]
fn pure_f16() {
    check(&[
        "--batch", "2", "--seq", "40", "--hidden", "64", "--heads", "4", "--layers", "2",
        "--vocab", "300", "--dtype", "f16",
    ]);
}

/// Mixed precision: f32 master weights, gradients and AdamW state; an f16 working copy.
#[test]
fn mixed_f16() {
    check(&[
        "--batch",
        "2",
        "--seq",
        "40",
        "--hidden",
        "64",
        "--heads",
        "4",
        "--layers",
        "2",
        "--vocab",
        "300",
        "--dtype",
        "f16",
        "--precision",
        "mixed",
    ]);
}

/// Mixed precision with checkpointing: the stem's and head's working copies live from the
/// forward to the end of the backward; each segment's blocks are cast as it runs and again as
/// it is recomputed.
#[test]
fn mixed_f16_checkpointed() {
    check(&[
        "--batch",
        "2",
        "--seq",
        "40",
        "--hidden",
        "64",
        "--heads",
        "4",
        "--layers",
        "3",
        "--vocab",
        "300",
        "--dtype",
        "f16",
        "--precision",
        "mixed",
        "--checkpoint",
        "1",
    ]);
}

#[test]
fn small_preset() {
    check(&["--preset", "small", "--batch", "2", "--seq", "64"]);
}

/// Where the vocabulary dominates, the composed whole backward's peak is the cross-entropy
/// head's, derived exactly: 7 tensors of B·S·V floats (see `formula::transformer::Shape::backward_head_bytes`).
#[test]
fn backward_head_point_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    let rows = run_rows(
        dir.path(),
        &[
            "--batch",
            "2",
            "--seq",
            "64",
            "--hidden",
            "64",
            "--heads",
            "2",
            "--layers",
            "1",
            "--vocab",
            "8192",
            "--phases",
            "forward,backward",
            "--kernels",
            "composed",
            "--backward",
            "whole",
        ],
    );
    let bwd = rows.iter().find(|r| r.phase == Phase::Backward).unwrap();
    assert!(exact_peak(bwd), "{bwd:?}");
    assert_eq!(
        bwd.peak_bytes,
        Some(7 * 4 * 2 * 64 * 8192 + 4108),
        "{bwd:?}"
    );
}
