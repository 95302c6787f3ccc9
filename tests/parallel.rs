//! `predict --parallel`: each pipeline stage's rank's model states, checked against hand
//! arithmetic on the model's tensors (issue 53's goal: Llama 3.1 405B at TP 8 × PP 16 and
//! ZeRO-3 over 64 ranks), with a mixture of experts over expert-parallel ranks, and the layouts
//! a model cannot take refused by name.

mod common;

use serde_json::Value;

/// Llama 3.1 405B's shape: H 16384, 128 heads, 8 K/V heads of 128, I 53248, 126 layers,
/// V 128256, head untied.
const LLAMA_405B: &[&str] = &[
    "--model",
    "llama",
    "--hidden",
    "16384",
    "--heads",
    "128",
    "--kv-heads",
    "8",
    "--intermediate",
    "53248",
    "--layers",
    "126",
    "--vocab",
    "128256",
];

/// `predict ARGS --parallel LAYOUT --json`: the case's JSON, or the failure's stderr.
fn predict(args: &[&str], layout: &str) -> Result<Value, String> {
    run(
        args,
        layout,
        &["--batch", "1", "--seq", "4096", "--phases", "init"],
    )
}

/// `predict ARGS MORE --device cuda:0 --parallel LAYOUT --json`: the case's JSON, or the
/// failure's stderr.
fn run(args: &[&str], layout: &str, more: &[&str]) -> Result<Value, String> {
    let out = common::memfit()
        .arg("predict")
        .args(args)
        .args(more)
        .args(["--device", "cuda:0", "--parallel", layout, "--json"])
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let line = String::from_utf8(out.stdout).unwrap();
    Ok(serde_json::from_str(line.lines().next().unwrap()).unwrap())
}

fn ranks(v: &Value) -> &Vec<Value> {
    v["parallel"]["ranks"].as_array().unwrap()
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

/// TP 8 × PP 16, mixed precision with AdamW (f32 masters and gradients, two f32 moments: 16 B a
/// parameter). One rank's block, by hand: q and o 16384²/8 each, k and v 16384·1024/8 each (8
/// K/V heads, one a rank), gate, up and down 16384·53248/8 each, two norms of 16384 whole:
/// 398,491,648. Stages of 7, 8 × 14, 7 layers; the first adds its share of the token table
/// (128256/8 · 16384 = 262,668,288), the last the final norm (16,384) and its share of the head.
#[test]
fn llama_405b_tp8_pp16_is_hand_arithmetic() {
    let mut args = LLAMA_405B.to_vec();
    args.extend([
        "--dtype",
        "bf16",
        "--precision",
        "mixed",
        "--optimizer",
        "adamw",
    ]);
    let v = predict(&args, "tp=8,pp=16").unwrap();
    assert_eq!(v["parallel"]["gpus"], 128);
    let r = ranks(&v);
    assert_eq!(r.len(), 16);
    let block = 2 * 16384 * 16384 / 8 + 2 * 16384 * 1024 / 8 + 3 * 16384 * 53248 / 8 + 2 * 16384;
    assert_eq!(block, 398_491_648u64);
    let table = 128256 / 8 * 16384;
    let want = |s: usize| match s {
        0 => 7 * block + table,
        15 => 7 * block + 16384 + table,
        _ => 8 * block,
    };
    for (s, rank) in r.iter().enumerate() {
        let p = n(rank, "dense_params");
        assert_eq!(p, want(s), "stage {s}");
        assert_eq!(n(rank, "expert_params"), 0);
        assert_eq!(n(rank, "weights_bytes"), 4 * p, "stage {s}: f32 masters");
        assert_eq!(n(rank, "gradient_bytes"), 4 * p, "stage {s}: f32 gradients");
        assert_eq!(
            n(rank, "optimizer_state_bytes"),
            8 * p,
            "stage {s}: two f32 moments"
        );
    }
    assert_eq!(n(&r[1], "dense_params"), 3_187_933_184);
    // Every rank's share, times the 8 tensor-parallel ranks, is the model with each norm held
    // 8 times over (2 a layer and the final one).
    let all: u64 = r.iter().map(|x| n(x, "dense_params")).sum::<u64>() * 8;
    let model = n(&v, "params");
    assert_eq!(model, 405_853_388_800);
    assert_eq!(all, model + 7 * (126 * 2 * 16384 + 16384));
}

/// ZeRO-3 over 64 data-parallel ranks: every model state sharded, 16 B a parameter / 64:
/// 94.5 GiB a rank, more than an 80 GiB GPU holds before any activation.
#[test]
fn llama_405b_zero3_over_64_ranks() {
    let mut args = LLAMA_405B.to_vec();
    args.extend([
        "--dtype",
        "bf16",
        "--precision",
        "mixed",
        "--optimizer",
        "adamw",
    ]);
    let v = predict(&args, "dp=64,zero=3").unwrap();
    let r = &ranks(&v)[0];
    let p = 405_853_388_800u64;
    assert_eq!(n(r, "weights_bytes"), (4 * p).div_ceil(64));
    assert_eq!(n(r, "gradient_bytes"), (4 * p).div_ceil(64));
    assert_eq!(n(r, "optimizer_state_bytes"), (8 * p).div_ceil(64));
    let total = n(r, "weights_bytes") + n(r, "gradient_bytes") + n(r, "optimizer_state_bytes");
    assert_eq!(total, 101_463_347_200);
    // ZeRO-1 and 2 shard less: the optimizer state with the f32 masters (the ZeRO paper's
    // K = 12), then the gradients too.
    let one_v = predict(&args, "dp=64,zero=1").unwrap();
    let one = &ranks(&one_v)[0];
    assert_eq!(n(one, "weights_bytes"), (4 * p).div_ceil(64));
    assert_eq!(n(one, "gradient_bytes"), 4 * p);
    assert_eq!(n(one, "optimizer_state_bytes"), (8 * p).div_ceil(64));
    // Pure bf16: the weights are the model itself, whole until stage 3.
    let mut pure = LLAMA_405B.to_vec();
    pure.extend(["--dtype", "bf16", "--optimizer", "adamw"]);
    let pure_v = predict(&pure, "dp=64,zero=2").unwrap();
    let r2 = &ranks(&pure_v)[0];
    assert_eq!(n(r2, "weights_bytes"), 2 * p);
    assert_eq!(n(r2, "gradient_bytes"), (2 * p).div_ceil(64));
    let two_v = predict(&args, "dp=64,zero=2").unwrap();
    let two = &ranks(&two_v)[0];
    assert_eq!(n(two, "gradient_bytes"), (4 * p).div_ceil(64));
}

/// Mixtral 8x7B over 8 expert-parallel ranks inside 8 data-parallel ones, pure bf16 with
/// AdamW (2 B weights and gradients, 4 B of moments): each rank holds one expert a layer
/// (3 · 4096 · 14336 each) and every dense tensor; under ZeRO-1 the dense moments shard over
/// the 8 replicas, an expert's over its own replicas (8 / 8 = 1: not at all).
#[test]
fn mixtral_experts_over_expert_parallel_ranks() {
    let args = [
        "--preset",
        "mixtral-8x7b",
        "--dtype",
        "bf16",
        "--optimizer",
        "adamw",
    ];
    let v = predict(&args, "dp=8,ep=8,zero=1").unwrap();
    let r = &ranks(&v)[0];
    let expert = 32 * 3 * 4096 * 14336u64;
    assert_eq!(n(r, "expert_params"), expert);
    // Per layer: q, o 4096², k, v 4096·1024, the router 4096·8, two norms; then the token
    // table and the head (32000 · 4096 each) and the final norm.
    let dense =
        32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 8 + 2 * 4096) + 2 * 32000 * 4096 + 4096u64;
    assert_eq!(n(r, "dense_params"), dense);
    assert_eq!(n(r, "weights_bytes"), 2 * (dense + expert));
    assert_eq!(n(r, "gradient_bytes"), 2 * (dense + expert));
    assert_eq!(
        n(r, "optimizer_state_bytes"),
        (4 * dense).div_ceil(8) + 4 * expert
    );
    // The model is all of it once: 8 ranks' experts and one rank's dense part.
    assert_eq!(n(&v, "params"), dense + 8 * expert);
}

/// Layouts a model cannot take are refused by name.
#[test]
fn impossible_layouts_are_refused_by_name() {
    let cases: [(&[&str], &str, &str); 5] = [
        (&["--preset", "llama-3-8b"], "tp=3", "32 attention heads"),
        (
            &["--preset", "llama-3-8b"],
            "ep=2,dp=2",
            "no mixture of experts",
        ),
        (&["--preset", "mixtral-8x7b"], "ep=3,dp=3", "8 experts"),
        (&["--preset", "llama-3-8b"], "pp=64", "32 layers"),
        (
            &["--preset", "llama-3-8b", "--optimizer", "adamw-8bit"],
            "tp=2",
            "adamw-8bit",
        ),
    ];
    for (args, layout, says) in cases {
        let err = predict(args, layout).unwrap_err();
        assert!(err.contains(says), "{args:?} {layout}: {err}");
    }
    let err = predict(&["--preset", "llama-3-8b"], "tp=2,cp=2").unwrap_err();
    assert!(err.contains("unknown key `cp`"), "{err}");
}

/// `predict ARGS --parallel LAYOUT --json` at B `b`, S `s` with every training phase.
fn predict_train(args: &[&str], layout: &str, b: &str, s: &str) -> Value {
    run(args, layout, &["--batch", b, "--seq", s]).unwrap()
}

fn acts(v: &Value) -> &Vec<Value> {
    v["parallel"]["activations"]
        .as_array()
        .unwrap_or_else(|| panic!("{}", v["parallel"]))
}

/// One rank, one stage: the activations are the single device's graph, to the byte (the
/// replay's graph is a block's times the layers plus what lies outside the blocks).
#[test]
fn one_rank_is_the_single_device_graph() {
    for dtype in ["bf16", "f32"] {
        let args = ["--preset", "llama-3.2-1b", "--dtype", dtype];
        let v = predict_train(&args, "tp=1", "2", "512");
        let a = &acts(&v)[0];
        assert_eq!(n(a, "in_flight"), 1);
        assert_eq!(n(a, "bytes"), n(&v, "graph_bytes"), "{dtype}");
    }
}

/// 1F1B: stage s keeps `min(mb, pp − s)` microbatches, the first stage `pp` of them (issue
/// 53's goal: its activations are the microbatches in flight times one microbatch's).
#[test]
fn the_first_stage_keeps_pp_microbatches() {
    let args = ["--preset", "llama-3-8b", "--dtype", "bf16"];
    let v = predict_train(&args, "tp=2,pp=4,mb=8", "1", "1024");
    let a = acts(&v);
    assert_eq!(a.len(), 4);
    for (s, x) in a.iter().enumerate() {
        assert_eq!(n(x, "in_flight"), 4 - s as u64, "stage {s}");
        assert_eq!(
            n(x, "bytes"),
            n(x, "in_flight") * n(x, "microbatch_graph_bytes")
        );
    }
    // The middle stages hold the same layers' graph a microbatch.
    assert_eq!(
        n(&a[1], "microbatch_graph_bytes"),
        n(&a[2], "microbatch_graph_bytes")
    );
    // Fewer microbatches than stages: at most mb in flight.
    let v = predict_train(&args, "pp=4,mb=2", "1", "1024");
    let f: Vec<u64> = acts(&v).iter().map(|x| n(x, "in_flight")).collect();
    assert_eq!(f, [2, 2, 2, 1]);
}

/// Tensor parallelism splits the heads' and the MLP's activations and keeps the norms' and the
/// residual stream's whole: a block's graph per rank is `R + S/tp`, so its fall from tp 1 to 2
/// is twice its fall from 2 to 4 (to the bytes the replay's rounding leaves: none here).
#[test]
fn tensor_parallel_splits_what_megatron_splits() {
    let args = ["--preset", "llama-3-8b", "--dtype", "bf16"];
    let block = |tp: usize| {
        let v = predict_train(&args, &format!("tp={tp},pp=32"), "1", "1024");
        n(&acts(&v)[1], "microbatch_graph_bytes") as i64
    };
    let (one, two, four) = (block(1), block(2), block(4));
    assert!(one > two && two > four, "{one} {two} {four}");
    assert_eq!(one - two, 2 * (two - four), "{one} {two} {four}");
}

/// Where the split of the activations is not modelled, the model states are still answered
/// and the activations are absent with the reason.
#[test]
fn a_mixture_of_experts_has_no_activations_per_rank_yet() {
    let v = predict_train(
        &["--preset", "mixtral-8x7b", "--dtype", "bf16"],
        "dp=8,ep=8",
        "1",
        "512",
    );
    assert!(v["parallel"]["activations"].is_null());
    let why = v["parallel"]["activations_missing"].as_str().unwrap();
    assert!(why.contains("mixture of experts"), "{why}");
    assert_eq!(ranks(&v).len(), 1);
}
