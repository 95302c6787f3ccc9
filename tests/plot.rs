//! `memfit predict --plot FILE.svg`: a stacked bar per phase and case, split by component, with
//! the budget line.

mod common;

use common::memfit;

/// Each bar sums to the prediction it splits, and its parts are the formulas' own: the train
/// step to `train_total_bytes` (weights after init, optimizer state, then the step's peak split
/// as its timeline stands there), inference to `inference_total_bytes`, prefill to the serving
/// weights plus the prefill's peak with the cache `B·S` tokens, decode to the serving weights,
/// the cache at the last step (`B·(S + T − 1)` tokens) and that step; a sliding layer's cache
/// stops at its window. The SVG draws every bar with its phase, each case's label and the
/// budget line; a file that is not .svg is refused before anything runs.
#[test]
fn plot_bars_split_the_predictions_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("p.svg");
    let (b, s, t) = (2u64, 40u64, 5u64);
    let out = memfit()
        .args([
            "predict", "--model", "llama", "--hidden", "64", "--heads", "4",
        ])
        .args([
            "--kv-heads",
            "2",
            "--layers",
            "3",
            "--vocab",
            "120",
            "--seq",
            "40",
        ])
        .args(["--batch", "2", "--decode-tokens", "5", "--threads", "1"])
        .args(["--phases", "train-step,inference,prefill,decode"])
        .args(["--fit-in", "48MiB", "--json", "--plot"])
        .arg(&svg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let p: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let bars = p["breakdown"].as_array().expect("bars with --plot");
    let bar = |phase: &str| -> Vec<u64> {
        bars.iter()
            .find(|b| b["phase"] == phase)
            .unwrap_or_else(|| panic!("{phase}: {p}"))["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect()
    };
    let sum = |v: &[u64]| v.iter().sum::<u64>();
    let peak = |phase: &str| {
        p["phase_peak_bytes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e[0] == phase)
            .unwrap()[1]
            .as_u64()
            .unwrap()
    };
    let u = |v: &serde_json::Value| v.as_u64().unwrap();
    // [weights, optimizer state, gradients, activations, KV cache, temporaries, other]
    let train = bar("train step");
    assert_eq!(sum(&train), u(&p["train_total_bytes"]));
    assert_eq!(train[1], u(&p["optimizer_state_bytes"]));
    assert!(train[3] > 0 && train[5] > 0 && train[4] == 0, "{train:?}");
    let inference = bar("inference");
    assert_eq!(sum(&inference), u(&p["inference_total_bytes"]));
    let serving = u(&p["serving"]["weights_bytes"]);
    assert_eq!(inference[0], serving);
    let per_token = u(&p["serving"]["kv_bytes_per_token"]);
    // 3 layers × K and V × 2 K/V heads × 16 wide × 4 B.
    assert_eq!(per_token, 3 * 2 * 2 * 16 * 4);
    let prefill = bar("prefill");
    assert_eq!((prefill[0], prefill[4]), (serving, b * s * per_token));
    assert_eq!(sum(&prefill), serving + peak("prefill"));
    let decode = bar("decode");
    assert_eq!(
        (decode[0], decode[4]),
        (serving, b * (s + t - 1) * per_token)
    );
    assert!(decode[5] > 0);
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(text.starts_with("<svg"), "{text}");
    for label in [
        "train step",
        "inference",
        "prefill",
        "decode",
        "budget 48.00 MiB",
    ] {
        assert!(text.contains(label), "{label}");
    }
    assert!(text.contains("custom B2 S40 f32"), "the case's label");
    assert_eq!(text.matches("<title>").count(), {
        bars.iter()
            .map(|b| {
                b["bytes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|v| v.as_u64() != Some(0))
                    .count()
            })
            .sum::<usize>()
    });
    // A window: Mistral's layers keep at most W tokens each.
    let out = memfit()
        .args([
            "predict",
            "--preset",
            "mistral-7b",
            "--layers",
            "2",
            "--seq",
            "5000",
        ])
        .args([
            "--dtype",
            "bf16",
            "--device",
            "cuda:0",
            "--decode-tokens",
            "4",
        ])
        .args(["--phases", "prefill,decode", "--json", "--plot"])
        .arg(&svg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kv = m["breakdown"][0]["bytes"][4].as_u64().unwrap();
    let per_token = m["serving"]["kv_bytes_per_token"].as_u64().unwrap();
    assert_eq!(kv, 4096 * per_token, "the window caps the cache");
    memfit()
        .args(["predict", "--layers", "1", "--plot", "p.gif"])
        .assert()
        .failure()
        .stderr(predicates::str::contains("give an .svg or a .png file"));
}

/// The README's picture: `memfit predict README_PLOT docs/plot-llama-3-8b.svg`.
const README_PLOT: &str = "--preset llama-3-8b --seq 4096 --batch 1,4 --dtype bf16 --device cuda:0 \
     --phases train-step,inference,prefill,decode --fit-in 80GiB --plot";

/// The README's picture is this build's prediction: regenerated and compared byte for byte (the
/// command of [`README_PLOT`] rewrites it).
#[test]
fn the_readme_plot_is_this_builds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.svg");
    memfit()
        .arg("predict")
        .args(README_PLOT.split_whitespace())
        .arg(&path)
        .assert()
        .success();
    let committed = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/plot-llama-3-8b.svg");
    assert!(
        std::fs::read(&path).unwrap() == std::fs::read(committed).unwrap(),
        "docs/plot-llama-3-8b.svg is stale: regenerate it (see this test's doc)"
    );
    let svg = std::fs::read_to_string(&path).unwrap();
    for quoted in ["76.43 GiB", "19.12 GiB", "budget 80.00 GiB"] {
        assert!(svg.contains(quoted), "the README quotes {quoted}");
    }
}
