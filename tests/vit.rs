//! ViT: every phase measured against the formulas (the same tolerances as the decoder's), the
//! encoder's variants (non-causal efficient attention, checkpointing) giving the plain model's
//! gradients, and the workload's ViT rules.

mod common;

use candle_core::{DType, Device};
use candle_nn::{VarBuilder, VarMap};
use common::{exact_peak, exact_retained, memfit, run_rows};
use memfit::model::transformer::{Config, Transformer};
use memfit::model::vit::{self, Vision};
use memfit::phase::checkpoint;
use memfit::record::{Row, Status};
use memfit::step::Phase;

/// Every row ok and predicted to [`common::tolerance`] (1 %, one op's bookkeeping for small
/// figures), the weights after init too.
fn check(rows: &[Row], phases: usize) {
    assert_eq!(rows.len(), phases, "one row per phase");
    for r in rows {
        assert_eq!(r.status, Status::Ok, "{r:?}");
        assert!(
            exact_peak(r),
            "{} {} {}: measured {:?} predicted {:?}",
            r.preset,
            r.attention,
            r.phase,
            r.peak_bytes,
            r.predicted_peak_bytes
        );
    }
    let init = rows.iter().find(|r| r.phase == Phase::Init).unwrap();
    let retained = init.retained_bytes.unwrap() as u64;
    let weights = 4 * init.params;
    assert!(retained >= weights && exact_retained(init), "{init:?}");
}

/// Odd sizes: 24 px, patch 6 (16 patches, S = 17), 5 heads of 12, 3 blocks, 7 classes.
const ODD: &[&str] = &[
    "--model",
    "vit",
    "--image",
    "24",
    "--patch",
    "6",
    "--channels",
    "3",
    "--hidden",
    "60",
    "--heads",
    "5",
    "--layers",
    "3",
    "--classes",
    "7",
    "--batch",
    "3",
];

#[test]
fn odd_shape_every_phase() {
    let dir = tempfile::tempdir().unwrap();
    let rows = run_rows(dir.path(), ODD);
    check(&rows, 6);
    let fwd = rows.iter().find(|r| r.phase == Phase::Forward).unwrap();
    assert_eq!((fwd.seq, fwd.max_seq, fwd.vocab), (17, 17, 7));
    assert_eq!((fwd.image_px, fwd.patch_px, fwd.channels), (24, 6, 3));
    // `C·p²·H + 2H + S·H + L(12H² + 13H) + 2H + K·H + K`, worked by hand:
    // 6,480 + 120 + 1,020 + 3·(43,200 + 780) + 120 + 420 + 7 = 140,107.
    assert_eq!(fwd.params, 140_107);
    assert_eq!(odd_config().params(), 140_107);
}

/// A shape whose peaks are megabytes (64 px, patch 8: S = 65, H 128, one channel), where the
/// 1 % bound is tight, with SGD.
#[test]
fn larger_shape_sgd() {
    let dir = tempfile::tempdir().unwrap();
    let rows = run_rows(
        dir.path(),
        &[
            "--model",
            "vit",
            "--image",
            "64",
            "--patch",
            "8",
            "--channels",
            "1",
            "--hidden",
            "128",
            "--heads",
            "4",
            "--layers",
            "2",
            "--classes",
            "100",
            "--batch",
            "4",
            "--optimizer",
            "sgd",
        ],
    );
    check(&rows, 6);
    let bwd = rows.iter().find(|r| r.phase == Phase::Backward).unwrap();
    assert!(bwd.peak_bytes.unwrap() > 2 << 20, "{bwd:?}");
}

/// Checkpointing and the (non-causal) efficient attention on the encoder are predicted too.
#[test]
fn checkpointed_and_efficient_variants() {
    for extra in [
        &["--checkpoint", "1"][..],
        &["--attention", "efficient"][..],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut args = ODD.to_vec();
        args.extend_from_slice(extra);
        check(&run_rows(dir.path(), &args), 6);
    }
}

/// Mixed f16 precision: f32 masters, a 16-bit working copy (the images converted inside).
#[test]
fn mixed_f16() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = ODD.to_vec();
    args.extend_from_slice(&["--dtype", "f16", "--precision", "mixed"]);
    check(&run_rows(dir.path(), &args), 6);
}

fn odd_config() -> Config {
    Config::vit(vit::Sizes {
        vision: Vision {
            image: 24,
            patch: 6,
            channels: 3,
        },
        classes: 7,
        hidden: 60,
        heads: 5,
        layers: 3,
    })
}

fn gradients(varmap: &VarMap, g: &candle_core::backprop::GradStore) -> Vec<(String, Vec<f32>)> {
    let data = varmap.data().lock().unwrap();
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    names
        .into_iter()
        .map(|n| {
            let t = g
                .get(data[n].as_tensor())
                .unwrap_or_else(|| panic!("no gradient for {n}"));
            (
                n.clone(),
                t.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            )
        })
        .collect()
}

/// Every parameter gets a gradient (patch projection, class token, positions, classifier
/// included); the checkpointed backward gives the same bits; the efficient attention (without
/// the causal mask) agrees within 1e-5 of the largest gradient element.
#[test]
fn gradients_of_the_variants() {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let cfg = odd_config();
    let model = Transformer::new(&cfg, VarBuilder::from_varmap(&varmap, DType::F32, &dev)).unwrap();
    let efficient = Transformer::new(
        &Config {
            efficient_attention: true,
            ..cfg.clone()
        },
        VarBuilder::from_varmap(&varmap, DType::F32, &dev),
    )
    .unwrap();
    let (images, targets) = vit::synthetic_batch(3, cfg.vision.unwrap(), 7, &dev).unwrap();
    let logits = model.forward(&images).unwrap();
    assert_eq!(logits.dims(), &[3, 1, 7]);
    let plain = Transformer::loss(&logits, &targets)
        .unwrap()
        .backward()
        .unwrap();
    let reference = gradients(&varmap, &plain);
    assert_eq!(reference.len() as u64, cfg.param_tensors());
    for (name, g) in &reference {
        assert!(g.iter().any(|x| *x != 0.0), "{name}: all-zero gradient");
    }

    let vars = varmap.all_vars();
    for k in [1, 2, 3] {
        let fwd = checkpoint::forward(&model, &model.detached(), &images, &targets, k).unwrap();
        let ckpt = checkpoint::backward(&model, &vars, fwd, &images, k).unwrap();
        for ((name, a), (_, b)) in reference.iter().zip(gradients(&varmap, &ckpt)) {
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "K = {k}: {name} differs"
            );
        }
    }

    let eff = Transformer::loss(&efficient.forward(&images).unwrap(), &targets)
        .unwrap()
        .backward()
        .unwrap();
    let (mut largest, mut worst) = (0f32, 0f32);
    for ((_, a), (_, b)) in reference.iter().zip(gradients(&varmap, &eff)) {
        largest = a.iter().fold(largest, |m, x| m.max(x.abs()));
        worst = a
            .iter()
            .zip(&b)
            .fold(worst, |m, (x, y)| m.max((x - y).abs()));
    }
    eprintln!("worst gradient difference {worst:e}, largest gradient {largest:e}");
    assert!(worst <= 1e-5 * largest, "{worst} vs {largest}");
}

/// The workload's ViT rules: each refusal names the key and what is allowed.
#[test]
fn workload_rules() {
    let cases: [(&[&str], &str); 5] = [
        (&["--model", "vit", "--seq", "10"], "grid[0].seq"),
        (
            &["--model", "vit", "--image", "30", "--patch", "8"],
            "does not divide image",
        ),
        (
            &["--preset", "vit-tiny", "--phases", "prefill"],
            "needs a decoder",
        ),
        (
            &["--model", "gpt", "--image", "32"],
            "a ViT key on a GPT case",
        ),
        (
            &["--model", "gpt", "--preset", "vit-b16"],
            "unknown preset for model = gpt",
        ),
    ];
    for (args, needle) in cases {
        let out = memfit().arg("predict").args(args).assert().failure();
        let err = String::from_utf8_lossy(&out.get_output().stderr).to_string();
        assert!(err.contains(needle), "{args:?}: {err}");
    }
    // A vit-… preset alone means a ViT, whose sequence is patches + 1.
    let out = memfit()
        .args(["predict", "--preset", "vit-b16", "--batch", "2", "--json"])
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert!(text.contains("\"vit\""), "{text}");
    assert!(text.contains("86567656"), "{text}");
}

/// ViT-B/16 at 224 px with 1000 classes: 86,567,656 parameters (the reference implementation's
/// count), 197 positions.
#[test]
fn vit_b16_parameter_count() {
    let b16 = Config::preset("vit-b16").unwrap();
    assert_eq!(b16.max_seq, 197);
    assert_eq!(b16.params(), 86_567_656);
    for name in vit::PRESETS {
        let cfg = Config::preset(name).unwrap();
        assert_eq!(cfg.max_seq, cfg.vision.unwrap().seq(), "{name}");
    }
}
