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
    run_on("cuda:0", args, layout, more)
}

/// [`run`] on `device`.
fn run_on(device: &str, args: &[&str], layout: &str, more: &[&str]) -> Result<Value, String> {
    common::json_of(common::memfit().arg("predict").args(args).args(more).args([
        "--device",
        device,
        "--parallel",
        layout,
        "--json",
    ]))
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
    let args = llama_405b_mixed();
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
    let args = llama_405b_mixed();
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

/// Megatron's interleaved 1F1B (`vp` chunks a rank): rank s keeps one more than
/// `(pp − s − 1)·2 + (vp − 1)·pp` microbatch chunks of `L/(pp·vp)` layers, so the first stage
/// holds Korthikanti et al.'s
/// `L·(1 + (pp − 1)/(pp·vp))` layers' graphs — 44 of Llama 3 8B's 32 at pp 4, vp 2 (32 without
/// interleaving), 38 at vp 4 — its chunks layers `c·pp + s`; the model states are the same
/// layer counts'. Refused where Megatron refuses it.
#[test]
fn interleaved_stages_keep_korthikantis_factor() {
    let args = ["--preset", "llama-3-8b", "--dtype", "bf16"];
    let plain = predict_train(&args, "pp=4,mb=8", "1", "1024");
    // One layer's graph: a middle stage's microbatch over its 8 layers.
    let layer = n(&acts(&plain)[1], "microbatch_graph_bytes") / 8;
    let first = |v: &Value| n(&acts(v)[0], "bytes");
    let embedding = first(&plain) - 4 * 8 * layer;
    for (vp, chunks, layers_kept) in [(2u64, 11u64, 44u64), (4, 19, 38)] {
        let v = predict_train(&args, &format!("pp=4,mb=8,vp={vp}"), "1", "1024");
        let a = acts(&v);
        assert_eq!(n(&a[0], "in_flight"), chunks, "vp {vp}");
        assert_eq!(
            layers_kept * 4,
            32 * (4 * vp + 3) / vp,
            "Korthikanti's factor"
        );
        // The embedding's output with every chunk-0 microbatch in flight (2·pp − 1 of them).
        assert_eq!(
            first(&v),
            layers_kept * layer + embedding / 4 * 7,
            "vp {vp}"
        );
        let r = &ranks(&v)[0];
        let c: Vec<(u64, u64)> = r["chunks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (n(c, "start"), n(c, "end")))
            .collect();
        let per = 32 / (4 * vp);
        assert_eq!(c.len() as u64, vp);
        assert!(
            c.iter()
                .enumerate()
                .all(|(i, &(a, b))| a == i as u64 * 4 * per && b - a == per)
        );
        assert_eq!(n(r, "weights_bytes"), n(&ranks(&plain)[0], "weights_bytes"));
        // The last rank's last chunk holds the head and the loss, once (one microbatch).
        assert_eq!(n(&a[3], "in_flight"), (vp - 1) * 4 + 1);
    }
    let err = predict(&args, "pp=4,mb=6,vp=2").unwrap_err();
    assert!(err.contains("a multiple of pp"), "{err}");
    let err = predict(&args, "pp=1,vp=2").unwrap_err();
    assert!(err.contains("pp ≥ 2"), "{err}");
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

/// A mixture of experts, MLA and layers of several kinds (DeepSeek-V2-Lite's dense first layer
/// and MLA; Gemma 3's sliding and global layers) on one rank: each kind's block from the
/// replay, so one rank of one stage is the single device's graph, to the byte.
#[test]
fn one_rank_of_a_mixture_or_mla_is_the_single_device_graph() {
    for preset in [
        "deepseek-v2-lite",
        "qwen3-30b-a3b",
        "gemma-3-1b",
        "mixtral-8x7b",
    ] {
        let args = ["--preset", preset, "--dtype", "bf16"];
        let v = predict_train(&args, "tp=1", "1", "512");
        assert_eq!(n(&acts(&v)[0], "bytes"), n(&v, "graph_bytes"), "{preset}");
    }
}

/// The wide Mixtral slice `memfit ranks --ep 2` measured (`results/cpu/ranks/`): `predict
/// --parallel dp=2,ep=2` replays rank 0's step (its 4 experts, the exchanges) on the rows a
/// routing moves. At the worst routing (every rank's tokens on the first two experts, rank 0's)
/// it bounds both measured ranks' graphs from above; balanced, it lies between them (they
/// received 524 and 500 of the 1,024 rows a layer pair moved); with every block recomputed,
/// the measured graph of both ranks. Over tp the split of a mixture is not modelled: its model
/// states are answered and the activations say why not.
#[test]
fn expert_parallel_activations_bound_the_measured_ranks() {
    let doc = ranks_doc("ranks-mixtral-e8-l2-ep2-n2.json");
    let forward = doc["windows"]
        .as_array()
        .unwrap()
        .iter()
        .position(|w| w == "forward")
        .unwrap();
    let measured: Vec<u64> = ranks_of(&doc)
        .iter()
        .map(|r| r["windows"][forward]["retained_bytes"].as_u64().unwrap())
        .collect();
    // On the CPU, as the ranks measured (its bookkeeping and gemm's packing buffers).
    let graph = |routing: &str| {
        let more = ["--dtype", "f32", "--threads", "1", "--routing", routing];
        let v = run_on("cpu", common::MIXTRAL_WIDE, "dp=2,ep=2", &more).unwrap();
        n(&acts(&v)[0], "microbatch_graph_bytes")
    };
    let (worst, balanced) = (graph("worst"), graph("balanced"));
    let (lo, hi) = (
        *measured.iter().min().unwrap(),
        *measured.iter().max().unwrap(),
    );
    assert!(
        worst >= hi,
        "worst routing {worst} under a measured rank's {hi}"
    );
    assert!(
        lo <= balanced && balanced <= hi,
        "balanced {balanced} outside the measured ranks' {lo}..{hi}"
    );
    // With every block recomputed (`--checkpoint 1`) a rank keeps each block's input only,
    // whatever its experts received: the same graph under either routing, the measured one of
    // both ranks (`ranks --ep 2 --checkpoint 1`) to its bookkeeping.
    let ckpt = ranks_doc("ranks-mixtral-e8-l2-ep2-ckpt1-n2.json");
    let recomputed = |routing: &str| {
        let more = [
            "--dtype",
            "f32",
            "--threads",
            "1",
            "--routing",
            routing,
            "--checkpoint",
            "1",
        ];
        let v = run_on("cpu", common::MIXTRAL_WIDE, "dp=2,ep=2", &more).unwrap();
        n(&acts(&v)[0], "microbatch_graph_bytes")
    };
    let (worst, balanced) = (recomputed("worst"), recomputed("balanced"));
    assert_eq!(worst, balanced);
    for r in ranks_of(&ckpt) {
        let m = r["windows"][forward]["retained_bytes"].as_u64().unwrap();
        assert!(
            m.abs_diff(worst) < 2048,
            "checkpointed: measured {m}, predicted {worst}"
        );
    }
    let v = predict_train(
        &["--preset", "mixtral-8x7b", "--dtype", "bf16"],
        "tp=2,dp=4,ep=4",
        "1",
        "512",
    );
    // Over tp 2 each expert is split too (expert tensor parallelism equal to tp): less than
    // the tp-1 rank's graph at the same ep, more than half of it (the router, the dispatched
    // tokens and the residual stream whole).
    let split = n(&acts(&v)[0], "bytes");
    let whole = n(
        &acts(&predict_train(
            &["--preset", "mixtral-8x7b", "--dtype", "bf16"],
            "tp=1,dp=8,ep=4",
            "1",
            "512",
        ))[0],
        "bytes",
    );
    assert!(whole / 2 < split && split < whole, "{split} of {whole}");
    assert_eq!(ranks(&v).len(), 1);
}

/// A mixture of experts and MLA over tp: the rank's graph is the single device's graph of
/// the model spelt with the rank's widths by hand — Mixtral's heads, K/V heads, experts' width
/// and vocabulary halved, the hidden size and the heads' width (64) kept; DeepSeek-V3's heads,
/// dense MLP, experts' and shared expert's widths and vocabulary halved, its latent ranks and
/// heads' widths kept — to the byte, in bf16 and f32. Sequence parallelism over a mixture is
/// refused by name (its dispatched tokens are gathered whole over tp).
#[test]
fn mixture_and_mla_over_tp_are_the_hand_split_model() {
    let graph = |args: &[&str], layout: &str| {
        let v = run(args, layout, &[]).unwrap();
        n(&acts(&v)[0], "bytes")
    };
    let with = |base: &[&'static str], sets: &[&'static str]| -> Vec<&'static str> {
        let mut v = base.to_vec();
        for s in sets {
            v.extend(["--hf-set", *s]);
        }
        v
    };
    let mixtral: &[&str] = common::MIXTRAL_WIDE;
    let ds_path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/deepseek_v3/config.json"
    );
    let ds: &[&str] = &[
        "--hf-config",
        ds_path,
        "--hf-set",
        "num_hidden_layers=3",
        "--batch",
        "2",
        "--seq",
        "16",
        "--optimizer",
        "adamw",
    ];
    // Each model with what its tp-2 rank splits spelt out by hand.
    let halvings: [(&str, &[&str], &[&str]); 2] = [
        (
            "mixtral",
            mixtral,
            &[
                "intermediate_size=256",
                "vocab_size=1024",
                "num_attention_heads=2",
                "num_key_value_heads=1",
                "head_dim=64",
            ],
        ),
        (
            "deepseek-v3",
            ds,
            &[
                "intermediate_size=24",
                "moe_intermediate_size=10",
                "vocab_size=32",
                "num_attention_heads=2",
                "num_key_value_heads=2",
            ],
        ),
    ];
    for dtype in ["bf16", "f32"] {
        for (name, base, halving) in halvings {
            let whole = [base, &["--dtype", dtype]].concat();
            let halved = [&with(base, halving)[..], &["--dtype", dtype]].concat();
            let (split, by_hand) = (graph(&whole, "tp=2"), graph(&halved, "tp=1"));
            assert_eq!(split, by_hand, "{name} {dtype}");
            assert!(split < graph(&whole, "tp=1"), "{name} {dtype}");
        }
    }
    let v = run(mixtral, "tp=2,sp=on", &[]).unwrap();
    assert!(v["parallel"]["activations"].is_null());
    let e = v["parallel"]["activations_missing"].as_str().unwrap();
    assert!(
        e.contains("sequence parallelism") && e.contains("mixture"),
        "{e}"
    );
}

/// `--parallel search`'s backward transient of an expert-parallel layout is its rank's own
/// (the replay of rank 0's step on the rows the routing moves), not one device's: under the
/// worst routing every rank's tokens reach rank 0's experts, so their temporaries grow with
/// ep. Qwen3-30B-A3B with a 1,024-token vocabulary (so that the head's logits do not hide the
/// experts'), B1 S2048 on 32 GPUs: the transient grows from ep 1 to 2 to 4; balanced, ep 4's
/// is below its worst.
#[test]
fn expert_parallel_transients_are_the_ranks_own() {
    let config = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/workloads/configs/qwen3-30b-a3b.json"
    );
    let transients = |routing: &str| -> std::collections::BTreeMap<u64, u64> {
        let args = [
            "--hf-config",
            config,
            "--hf-set",
            "vocab_size=1024",
            "--seq",
            "2048",
            "--precision",
            "mixed",
            "--routing",
            routing,
        ];
        let v = search(&args, "search,amp=megatron", "32", "80GiB");
        v["parallel_search"]["layouts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["layout"].as_str().unwrap().starts_with("tp=1,pp=1,"))
            .filter_map(|c| {
                let ep = c["layout"]
                    .as_str()
                    .unwrap()
                    .split(',')
                    .find_map(|kv| kv.strip_prefix("ep=").map(|e| e.parse::<u64>().unwrap()))?;
                Some((ep, c["transient_bytes"].as_u64()?))
            })
            .collect()
    };
    let worst = transients("worst");
    let (t1, t2, t4) = (worst[&1], worst[&2], worst[&4]);
    assert!(t1 < t2 && t2 < t4, "ep 1, 2, 4: {t1}, {t2}, {t4}");
    let balanced = transients("balanced");
    assert!(balanced[&4] < t4, "balanced {} vs worst {t4}", balanced[&4]);
}

/// A stored `memfit ranks` document of `results/cpu/ranks/`.
fn ranks_doc(name: &str) -> Value {
    let path = format!("{}/results/cpu/ranks/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn ranks_of(doc: &Value) -> &Vec<Value> {
    doc["ranks"].as_array().unwrap()
}

/// Llama 3.1 405B's shape in bf16 mixed precision with AdamW.
fn llama_405b_mixed() -> Vec<&'static str> {
    let mut args = LLAMA_405B.to_vec();
    args.extend([
        "--dtype",
        "bf16",
        "--precision",
        "mixed",
        "--optimizer",
        "adamw",
    ]);
    args
}

/// Megatron-Core's precision (`amp=megatron`) at TP 8 × PP 16: bf16 parameters (2 B), f32
/// main gradients (4 B), the optimizer's f32 master and two moments (12 B): 18 B a parameter,
/// `6 + 12/dp` with the distributed optimizer (`zero=1`). The middle stages' rank holds
/// 3,187,933,184 parameters (the hand count of `llama_405b_tp8_pp16_is_hand_arithmetic`):
/// 57,382,797,312 B = 53.44 GiB. Megatron's `theoretical_memory_usage.py` gives its "most
/// loaded shard" as `(126·layer + final norm)/16/8 + padded vocab·H/8` parameters × 18; memfit's
/// first stage differs from it by exactly three named terms: Megatron spreads the layers
/// evenly (7.875 a stage where memfit's first stage holds 7), divides the norms by tp (memfit
/// holds them whole on every rank), and pads the vocabulary to a multiple of 128·tp (129,024;
/// memfit pads to a multiple of tp: 128,256).
#[test]
fn llama_405b_tp8_pp16_megatron_is_hand_arithmetic() {
    let args = llama_405b_mixed();
    let v = predict(&args, "tp=8,pp=16,amp=megatron").unwrap();
    assert_eq!(v["parallel"]["precision"], "megatron");
    let r = ranks(&v);
    for (s, rank) in r.iter().enumerate() {
        let p = n(rank, "dense_params");
        assert_eq!(
            n(rank, "weights_bytes"),
            2 * p,
            "stage {s}: bf16 parameters"
        );
        assert_eq!(
            n(rank, "gradient_bytes"),
            4 * p,
            "stage {s}: f32 main grads"
        );
        assert_eq!(
            n(rank, "optimizer_state_bytes"),
            12 * p,
            "stage {s}: f32 master and moments"
        );
    }
    let mid = &r[1];
    let states =
        n(mid, "weights_bytes") + n(mid, "gradient_bytes") + n(mid, "optimizer_state_bytes");
    assert_eq!(states, 18 * 3_187_933_184);
    assert_eq!(states, 57_382_797_312);
    // Megatron's formula, term by term, against memfit's first stage.
    let (h, i, v, layers): (f64, f64, f64, f64) = (16384.0, 53248.0, 128256.0, 126.0);
    let layer = 2.0 * h * h * (1.0 + 8.0 / 128.0) + 2.0 * h * (i * 1.5 + 1.0);
    let padded = (v / 1024.0).ceil() * 1024.0;
    assert_eq!(padded, 129_024.0);
    let megatron = ((layers * layer + h) / 16.0 + padded * h) / 8.0;
    let first = n(&r[0], "dense_params") as f64;
    let norms = 2.0 * h;
    let named = (7.875 - 7.0) * layer / 8.0 // layers spread evenly
        + h / 8.0 / 16.0 // the final norm spread over the stages
        - 7.0 * norms * (1.0 - 1.0 / 8.0) // memfit's whole norms
        + (padded - v) * h / 8.0; // the vocabulary's padding
    assert!(
        (megatron - (first + named)).abs() < 1e-3,
        "{megatron} vs {first} + {named}"
    );
    // The distributed optimizer (zero=1) over 4 replicas: 6 + 12/4 B a parameter.
    let v = predict(&args, "tp=8,pp=16,dp=4,zero=1,amp=megatron").unwrap();
    let mid = &ranks(&v)[1];
    let p = 3_187_933_184u64;
    assert_eq!(n(mid, "weights_bytes"), 2 * p);
    assert_eq!(n(mid, "gradient_bytes"), 4 * p);
    assert_eq!(n(mid, "optimizer_state_bytes"), 12 * p / 4);
}

/// DeepSpeed's precision (`amp=deepspeed`) under ZeRO-2 and ZeRO-3 over 64 ranks, against
/// DeepSpeed's own estimators (`estimate_zero2_model_states_mem_needs` in
/// `deepspeed/runtime/zero/stage_1_and_2.py`: `4Ψ + int(16Ψ/N)` on the GPU without offload;
/// `estimate_zero3_model_states_mem_needs` in `stage3.py`: `4·largest_layer + int(18Ψ/N)`).
/// memfit holds the ZeRO paper's counts (16-bit parameters and gradients, `K = 12`): ZeRO-2
/// `2Ψ + 14Ψ/N`, ZeRO-3 `16Ψ/N` + the gathered layer (the largest tensor's 16-bit weight and
/// gradient: the token table, 128256 · 16384, the same `4·largest_layer` as DeepSpeed's). The
/// differences, named: DeepSpeed's ZeRO-2 estimate counts the 16-bit gradients whole (`2Ψ`
/// where memfit shards them, `2Ψ/N`) and both estimates count the f32 copy of the gradient
/// partition the optimizer step makes (`4Ψ/N`), ZeRO-3's in place of the 16-bit partition
/// (`2Ψ/N`). With those, equal to the rounding of the shards (each part rounded up by memfit,
/// the sum down by DeepSpeed: under 4 bytes).
#[test]
fn zero_2_and_3_under_deepspeed_are_its_estimators() {
    let args = llama_405b_mixed();
    let psi = 405_853_388_800u64;
    let gpus = 64u64;
    let largest = 128_256u64 * 16384;
    let within = |got: u64, want: u64, what: &str| {
        assert!(got.abs_diff(want) < 4, "{what}: {got} vs {want}");
    };
    // ZeRO-2.
    let v = predict(&args, "dp=64,zero=2,amp=deepspeed").unwrap();
    assert_eq!(v["parallel"]["precision"], "deepspeed");
    let r = &ranks(&v)[0];
    let memfit = n(r, "weights_bytes") + n(r, "gradient_bytes") + n(r, "optimizer_state_bytes");
    assert_eq!(n(r, "weights_bytes"), 2 * psi);
    assert_eq!(n(r, "gradient_bytes"), (2 * psi).div_ceil(gpus));
    assert_eq!(n(r, "optimizer_state_bytes"), (12 * psi).div_ceil(gpus));
    assert!(v["parallel"]["gathered_bytes"].is_null());
    let deepspeed2 = 4 * psi + 16 * psi / gpus;
    let whole_grads = 2 * psi - 2 * psi / gpus;
    let f32_grad_partition = 4 * psi / gpus;
    within(
        memfit + whole_grads + f32_grad_partition,
        deepspeed2,
        "ZeRO-2",
    );
    // ZeRO-3, with the gathered layer.
    let v = predict(&args, "dp=64,zero=3,amp=deepspeed").unwrap();
    let r = &ranks(&v)[0];
    let states = n(r, "weights_bytes") + n(r, "gradient_bytes") + n(r, "optimizer_state_bytes");
    within(states, 16 * psi / gpus, "ZeRO-3's 16Ψ/N");
    let gathered = v["parallel"]["gathered_bytes"][0].as_u64().unwrap();
    assert_eq!(gathered, 4 * largest);
    let deepspeed3 = 4 * largest + 18 * psi / gpus;
    within(
        states + gathered + 4 * psi / gpus - 2 * psi / gpus,
        deepspeed3,
        "ZeRO-3",
    );
    // 405B's states alone under ZeRO-3 over 64 ranks: 16·Ψ/64 = 94.48 GiB a rank.
    assert_eq!(16 * psi / gpus, 101_463_347_200);
}

/// ZeRO-3's gathered parameters, by hand, for Llama 3 8B in bf16 over 8 ranks. FSDP's units
/// (`gather=unit`, the default outside `amp=deepspeed`; what `memfit ranks --zero 3` measures):
/// while a unit's backward runs, its parameters and gradients whole and the next unit's
/// parameters prefetched, bounded by `(2·2 + 2)` B a parameter of the largest unit. Here that is
/// the head's unit (the final norm, 4,096, and the head, 128256 · 4096 = 525,336,576), larger
/// than a layer's 218,112,000 (q and o 4096², k and v 4096 · 1024, gate, up and down
/// 4096 · 14336, two norms). DeepSpeed's estimator (`gather=tensor`, its default under its
/// precision) counts the largest tensor's weight and gradient: `4 · 525,336,576`. Units never
/// count less than tensors.
#[test]
fn zero3_gathers_fsdp_units_or_deepspeeds_largest_tensor() {
    let args = ["--preset", "llama-3-8b", "--dtype", "bf16"];
    let gathered = |spec: &str| -> u64 {
        predict(&args, spec).unwrap()["parallel"]["gathered_bytes"][0]
            .as_u64()
            .unwrap()
    };
    let head_unit = 4096 + 128_256 * 4096u64;
    let layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096u64;
    assert_eq!(layer, 218_112_000);
    assert_eq!(gathered("dp=8,zero=3"), 6 * head_unit);
    assert_eq!(gathered("dp=8,zero=3,gather=unit"), 6 * head_unit);
    assert_eq!(gathered("dp=8,zero=3,gather=tensor"), 4 * 128_256 * 4096);
    // Over pipeline stages the middle ones hold layers only: a layer's unit.
    let v = predict(&args, "pp=4,dp=2,zero=3").unwrap();
    let per_stage: Vec<u64> = v["parallel"]["gathered_bytes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect();
    assert_eq!(per_stage[1], 6 * layer);
    assert_eq!(per_stage[2], 6 * layer);
    assert_eq!(per_stage[3], 6 * head_unit);
    // The first stage's largest unit is the embedding's table.
    assert_eq!(per_stage[0], 6 * 128_256 * 4096);
    let err = predict(&args, "dp=8,zero=3,gather=module").unwrap_err();
    assert!(err.contains("gather=module: unit or tensor"), "{err}");
}

/// ZeRO-Offload (`offload=optimizer`) under DeepSpeed's precision, against DeepSpeed's own
/// estimator with `cpu_offload=True` (`estimate_zero2_model_states_mem_needs` in
/// `stage_1_and_2.py`: GPU `2Ψ`; CPU per node `Ψ·max(4·total_gpus, 16)·1.5`). memfit's rank
/// keeps the 16-bit weights (`2Ψ`) and, ZeRO-2, its 16-bit gradient partition (`2Ψ/N`: the
/// ranks measure it kept until the step; DeepSpeed's estimate counts none) and no state on the
/// GPU; on the host the f32 gradient buffer and the f32 master + Adam's moments of its
/// partition, `16Ψ/N`. On one node of 4 GPUs that is `16Ψ` a node: DeepSpeed's CPU figure
/// without its `additional_buffer_factor` of 1.5 (above 4 GPUs DeepSpeed counts `4Ψ` a GPU,
/// the f32 copy each process loads the model through, a loading peak memfit does not model).
/// ZeRO-1's device keeps the gradients whole; ZeRO-3's shards the weights too. Offloading the
/// state lets `--parallel search` fit layouts it did not.
#[test]
fn zero_offload_under_deepspeed_is_its_estimator() {
    let args = llama_405b_mixed();
    let psi = 405_853_388_800u64;
    for gpus in [4u64, 64] {
        let v = predict(
            &args,
            &format!("dp={gpus},zero=2,amp=deepspeed,offload=optimizer"),
        )
        .unwrap();
        assert_eq!(v["parallel"]["offload"], true);
        let r = &ranks(&v)[0];
        assert_eq!(n(r, "weights_bytes"), 2 * psi);
        assert_eq!(n(r, "gradient_bytes"), (2 * psi).div_ceil(gpus));
        assert_eq!(n(r, "optimizer_state_bytes"), 0);
        let host = n(r, "host_bytes");
        // The f32 gradient buffer (4Ψ/N) and master + moments (12Ψ/N), each rounded up.
        assert_eq!(host, (4 * psi).div_ceil(gpus) + (12 * psi).div_ceil(gpus));
        let deepspeed_gpu = 2 * psi;
        assert_eq!(
            n(r, "weights_bytes") + n(r, "gradient_bytes") - (2 * psi).div_ceil(gpus),
            deepspeed_gpu
        );
        if gpus == 4 {
            let deepspeed_cpu_node = psi as f64 * (4 * gpus).max(16) as f64 * 1.5;
            let memfit_node = (gpus * host) as f64;
            assert!(
                (memfit_node * 1.5 - deepspeed_cpu_node).abs() < 64.0,
                "{memfit_node} × 1.5 vs {deepspeed_cpu_node}"
            );
        }
    }
    let v = predict(&args, "dp=8,zero=1,amp=deepspeed,offload=optimizer").unwrap();
    let r = &ranks(&v)[0];
    assert_eq!(n(r, "gradient_bytes"), 2 * psi);
    let v = predict(&args, "dp=8,zero=3,amp=deepspeed,offload=optimizer").unwrap();
    let r = &ranks(&v)[0];
    assert_eq!(n(r, "weights_bytes"), (2 * psi).div_ceil(8));
    assert_eq!(n(r, "optimizer_state_bytes"), 0);
    // Autocast's f32 masters are the parameters: the device keeps them whole, the host a
    // partition's f32 master beside the state.
    let v = predict(&args, "dp=8,zero=2,offload=optimizer").unwrap();
    let r = &ranks(&v)[0];
    assert_eq!(n(r, "weights_bytes"), 4 * psi);
    // Master and gradient buffer 4 B a parameter each, the two moments 8, over 8 ranks.
    assert_eq!(n(r, "host_bytes"), 2 * (4 * psi / 8) + 8 * psi / 8);
    let err = predict(&args, "dp=8,offload=optimizer").unwrap_err();
    assert!(err.contains("zero=1, 2 or 3"), "{err}");
}

/// `amp=` refuses a pure-precision case and an unknown regime, by name.
#[test]
fn precision_regimes_are_refused_by_name() {
    let err = predict(
        &["--preset", "llama-3-8b", "--dtype", "bf16"],
        "tp=2,amp=megatron",
    )
    .unwrap_err();
    assert!(err.contains("--precision mixed"), "{err}");
    let err = predict(&["--preset", "llama-3-8b"], "amp=apex").unwrap_err();
    assert!(err.contains("autocast, megatron or deepspeed"), "{err}");
}

/// Under `amp=megatron` and `amp=deepspeed` the activations are the pure 16-bit graph (no
/// per-microbatch weight copy, no f32 residual stream): on one rank, the pure bf16 case's
/// graph to the byte; autocast's stays the mixed case's own.
#[test]
fn sixteen_bit_regimes_keep_the_pure_graph() {
    let pure = ["--preset", "llama-3.2-1b", "--dtype", "bf16"];
    let mixed = [
        "--preset",
        "llama-3.2-1b",
        "--dtype",
        "bf16",
        "--precision",
        "mixed",
    ];
    let want = n(&predict_train(&pure, "tp=1", "2", "512"), "graph_bytes");
    for amp in ["megatron", "deepspeed"] {
        let v = predict_train(&mixed, &format!("tp=1,amp={amp}"), "2", "512");
        assert_eq!(n(&acts(&v)[0], "bytes"), want, "{amp}");
    }
    let v = predict_train(&mixed, "tp=1", "2", "512");
    assert_eq!(n(&acts(&v)[0], "bytes"), n(&v, "graph_bytes"));
    assert!(n(&v, "graph_bytes") > want);
}

/// Llama 3 70B's shape (H 8192, 64 heads, 8 K/V heads, I 28672, 80 layers, V 128256, head
/// untied): no preset, so its sizes.
const LLAMA_3_70B: &[&str] = &[
    "--model",
    "llama",
    "--hidden",
    "8192",
    "--heads",
    "64",
    "--kv-heads",
    "8",
    "--intermediate",
    "28672",
    "--layers",
    "80",
    "--vocab",
    "128256",
    "--tied",
    "off",
];

/// `predict ARGS --parallel SPEC --gpus G --fit-in BUDGET --json`: the case's JSON.
fn search(args: &[&str], spec: &str, gpus: &str, budget: &str) -> Value {
    let out = common::memfit()
        .arg("predict")
        .args(args)
        .args(["--batch", "1", "--device", "cuda:0", "--phases", "init"])
        .args([
            "--parallel",
            spec,
            "--gpus",
            gpus,
            "--fit-in",
            budget,
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(line.lines().next().unwrap()).unwrap()
}

/// `--parallel search` over 64 GPUs for Llama 3 70B (Megatron's precision, S 4096): every
/// layout of 64 GPUs (tp 1–8 dividing the heads, pp dividing what is left, ZeRO 0–3 where
/// dp > 1), each layout's worst rank the most any stage's rank of `--parallel LAYOUT` holds
/// (model states + ZeRO-3's gathered layer + the activations 1F1B keeps) plus one
/// microbatch's backward transient, the fitting ones first and each within the budget, the
/// others above it; answered in under a second.
#[test]
fn search_lists_the_layouts_that_fit_llama_3_70b() {
    let mut args = LLAMA_3_70B.to_vec();
    args.extend([
        "--seq",
        "4096",
        "--dtype",
        "bf16",
        "--precision",
        "mixed",
        "--optimizer",
        "adamw",
    ]);
    let t = std::time::Instant::now();
    let v = search(&args, "search,amp=megatron", "64", "80GiB");
    let took = t.elapsed();
    assert!(took.as_secs_f64() < 1.0, "{took:?}");
    let s = &v["parallel_search"];
    assert_eq!(s["precision"], "megatron");
    let all = s["layouts"].as_array().unwrap();
    // tp 1, 2, 4, 8 × pp dividing 64/tp (≤ 80 layers) × ZeRO 0–3 where dp > 1.
    let mut want = 0;
    for tp in [1u64, 2, 4, 8] {
        for pp in (1..=64 / tp).filter(|p| (64 / tp).is_multiple_of(*p)) {
            want += if 64 / tp / pp > 1 { 4 } else { 1 };
        }
    }
    assert_eq!(all.len(), want);
    let budget = 80u64 << 30;
    let fit: Vec<&Value> = all.iter().filter(|c| c["fits"] == true).collect();
    assert!(!fit.is_empty());
    // Fitting first, all of them.
    assert!(all[..fit.len()].iter().all(|c| c["fits"] == true));
    for c in all {
        let peak = n(c, "peak_bytes");
        assert_eq!(
            peak,
            n(c, "state_bytes") + n(c, "activation_bytes") + n(c, "transient_bytes")
        );
        assert_eq!(c["fits"] == true, peak <= budget, "{c}");
    }
    // A few layouts, checked against `--parallel LAYOUT`'s own stages.
    for c in fit.iter().copied().take(3).chain(all.iter().rev().take(2)) {
        let layout = c["layout"].as_str().unwrap();
        let one = predict_train(&args, &format!("{layout},amp=megatron"), "1", "4096");
        let r = ranks(&one);
        let a = acts(&one);
        let g = |s: usize| one["parallel"]["gathered_bytes"][s].as_u64().unwrap_or(0);
        let worst = (0..r.len())
            .map(|s| {
                n(&r[s], "weights_bytes")
                    + n(&r[s], "gradient_bytes")
                    + n(&r[s], "optimizer_state_bytes")
                    + g(s)
                    + n(&a[s], "bytes")
            })
            .max()
            .unwrap();
        assert_eq!(
            worst + n(c, "transient_bytes"),
            n(c, "peak_bytes"),
            "{layout}"
        );
    }
}

/// A mixture of experts over every layout the search tries: each layout said to fit has a
/// peak within the budget and each said not to, a peak (or its model states alone) beyond it;
/// layouts over tp are answered too (their experts split), none left unknown here.
#[test]
fn search_never_promises_a_layout_it_cannot_answer() {
    let args = [
        "--preset",
        "mixtral-8x7b",
        "--seq",
        "1024",
        "--dtype",
        "bf16",
        "--precision",
        "mixed",
    ];
    let v = search(&args, "search,amp=deepspeed", "16", "80GiB");
    let all = v["parallel_search"]["layouts"].as_array().unwrap();
    assert!(all.iter().any(|c| n(c, "tp") > 1));
    for c in all {
        match c["peak_bytes"].as_u64() {
            Some(peak) => assert_eq!(c["fits"] == true, peak <= 80 << 30, "{c}"),
            None => {
                assert_eq!(c["fits"], false, "{c}");
                assert!(n(c, "state_bytes") > 80 << 30, "{c}");
            }
        }
    }
    assert!(all.iter().any(|c| c["fits"] == true && n(c, "tp") > 1));
}

/// One LLaMA-like block's graph on a rank of `tp` (bf16, memfit's fused kernels): what the
/// middle stage of a four-layer, four-stage pipeline holds.
fn llama_block(dims: [u64; 6], attention: &str, tp: u64) -> u64 {
    let [h, a, g, i, s, b] = dims;
    let args = [
        "--model".to_string(),
        "llama".into(),
        "--hidden".into(),
        h.to_string(),
        "--heads".into(),
        a.to_string(),
        "--kv-heads".into(),
        g.to_string(),
        "--intermediate".into(),
        i.to_string(),
        "--layers".into(),
        "4".into(),
        "--vocab".into(),
        "32000".into(),
        "--dtype".into(),
        "bf16".into(),
        "--kernels".into(),
        "fused".into(),
        "--attention".into(),
        attention.into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let v = predict_train(
        &args,
        &format!("tp={tp},pp=4"),
        &b.to_string(),
        &s.to_string(),
    );
    // A middle stage of one layer: its block alone (its input stands in for the block's
    // output, freed once sent).
    n(&acts(&v)[1], "microbatch_graph_bytes")
}

/// Korthikanti et al. 2022 (Table 2), 16-bit, per layer: `s·b·h·(10 + 24/t + 5·a·s/(h·t))`
/// under tensor parallelism `t` (`34 + 5·a·s/h` at t = 1), against the replay's block on a
/// tensor-parallel rank of a LLaMA-like layer, every difference a named term, to the byte.
/// The paper's terms: unsplit, the two LayerNorms' inputs (4), their outputs (the QKV and
/// fc1 inputs, 4) and two 1-byte dropout masks (2); split, Q and K (4), V (2), the
/// out-projection's input (2), GeLU's input and output (16, the MLP 4h wide), and the
/// softmax's output (2as²b), its dropout mask (as²b) and the dropout's output (2as²b). The
/// replay's LLaMA block (RMSNorm, rotary, grouped K/V, SwiGLU of width I; candle's graph
/// holding every op's inputs):
/// - no dropout: the two masks (−2·sbh) and, with standard attention, the mask and the
///   dropout's output (−3·as²b);
/// - tiled (efficient) attention keeps no S×S tensor: its f32 log-sum-exp (4·asb) instead of
///   the softmax's output;
/// - the queries: the projection's output kept as the rotary's input (+2·sb·aD), where the
///   paper counts Q and the out-projection's input at width h (the attention's output is kept
///   once: the tiled attention writes it heads-merged, the standard one releases `P·v`'s
///   output once its merged copy exists);
/// - the keys and values at the K/V heads' width g·D (grouped-query attention), with the key
///   projection's output kept as the rotary's input (+2·sb·gD); the value projection's output
///   is released once its head-split copy exists (no copy where a rank holds one K/V head, the
///   split being a view then);
/// - SwiGLU: gate, up and their product (the down projection's input) at width I, `6·sbI`,
///   where GeLU keeps `16·sbh`;
/// - 16-bit elements: one the two-layer graph holds beyond the one-layer graph and its block,
///   and the one element a released tensor leaves on CUDA (the value projection's output
///   where it is copied, `P·v`'s output under standard attention).
#[test]
fn korthikanti_term_by_term_for_a_llama_like_layer() {
    // [H, A, G, I, S, B]: MHA at I = 4H (the paper's MLP width), Llama-2-7B's widths with
    // grouped K/V, and a narrow one at two sequences.
    let shapes = [
        [4096u64, 32, 32, 16384, 2048, 1],
        [4096, 32, 8, 11008, 2048, 1],
        [2048, 16, 4, 5632, 1024, 2],
    ];
    for dims in shapes {
        let [h, a, g, i, s, b] = dims;
        let d = h / a;
        let sbh = s * b * h;
        for attention in ["efficient", "standard"] {
            for t in [1u64, 2, 4] {
                let replay = llama_block(dims, attention, t);
                // The paper's, in bytes (every term divides exactly at these sizes).
                let paper_unsplit = 10 * sbh;
                let paper_split = 24 * sbh / t;
                let paper_scores = 5 * a * s * s * b / t;
                let paper = paper_unsplit + paper_split + paper_scores;
                // The named differences, as signed bytes.
                let masks = -2 * sbh as i64;
                let scores = match attention {
                    "efficient" => 4 * a * s * b / t,
                    _ => 2 * a * s * s * b / t,
                } as i64
                    - paper_scores as i64;
                let queries = ((6 * s * b * a * d) as i64 - (4 * sbh) as i64) / t as i64;
                // A rank's K/V heads (one, replicated, where fewer than t); with one, the
                // value's head split is a view: no copy, its projection's output the only one.
                let kv = (g / t).max(1);
                let keys_values = (6 * s * b * kv * d) as i64 - (4 * sbh / t) as i64;
                let mlp = ((6 * s * b * i) as i64 - (16 * sbh) as i64) / t as i64;
                let released = u64::from(kv > 1) + u64::from(attention == "standard");
                let element = 2 + 2 * released as i64;
                let explained =
                    paper as i64 + masks + scores + queries + keys_values + mlp + element;
                assert_eq!(
                    replay as i64, explained,
                    "{dims:?} {attention} t={t}: replay {replay}, paper {paper}"
                );
            }
        }
    }
}

/// A GPT-like layer (LayerNorm, biases, GeLU at 4H, no rotary), one device (the replay does
/// not split GPT's heads yet: their width is H/A): the block is the two-layer graph less the
/// one-layer graph. Against the paper's `34·sbh + 5·as²b`: no dropout masks (−2·sbh, and
/// −3·as²b with standard attention; tiled attention's 4·asb log-sum-exp instead of the
/// softmax's output), the 2-byte element, and one 2-byte element each tensor released in
/// place leaves on CUDA: the q, k and v projections' outputs (released once their head-split
/// copies exist), the biased o and fc2 projections' outputs (once added into the residual
/// stream) and, under standard attention, `P·v`'s output (once the heads are merged; the
/// tiled attention writes them merged).
#[test]
fn korthikanti_term_by_term_for_a_gpt_like_layer() {
    for [h, a, s, b] in [[4096u64, 32, 2048, 1], [2048, 16, 1024, 2]] {
        for attention in ["efficient", "standard"] {
            let graph = |layers: &str| {
                let args = [
                    "--model",
                    "gpt",
                    "--hidden",
                    &h.to_string(),
                    "--heads",
                    &a.to_string(),
                    "--layers",
                    layers,
                    "--vocab",
                    "32000",
                    "--max-seq",
                    &s.to_string(),
                    "--dtype",
                    "bf16",
                    "--kernels",
                    "fused",
                    "--attention",
                    attention,
                    "--batch",
                    &b.to_string(),
                    "--seq",
                    &s.to_string(),
                    "--device",
                    "cuda:0",
                    "--phases",
                    "forward",
                    "--json",
                ]
                .map(|x| x.to_string());
                let out = common::memfit()
                    .arg("predict")
                    .args(&args)
                    .output()
                    .unwrap();
                assert!(out.status.success());
                let v: Value = serde_json::from_slice(&out.stdout).unwrap();
                n(&v, "graph_bytes")
            };
            let replay = graph("2") - graph("1");
            let sbh = s * b * h;
            let paper = 34 * sbh + 5 * a * s * s * b;
            let scores = match attention {
                "efficient" => 4 * a * s * b,
                _ => 2 * a * s * s * b,
            } as i64
                - (5 * a * s * s * b) as i64;
            let released = 3 + 2 + i64::from(attention == "standard");
            let named = -2 * sbh as i64 + scores + 2 + 2 * released;
            assert_eq!(
                replay as i64,
                paper as i64 + named,
                "{h} {a} {s} {b} {attention}"
            );
        }
    }
}

/// Sequence parallelism (`sp=on`): the norms' and the residual stream's activations split
/// over tp by sequence too, so a block on a rank of `t` is the one-rank block's `1/t` (rounded
/// up), as Korthikanti et al.'s `s·b·h/t·(34 + 5·a·s/h)` divides every term of theirs; a
/// stage's input is split `t` ways as well. Where a rank holds one K/V head (no head-split
/// copy of the values) the answer stays at or above that.
#[test]
fn sequence_parallel_divides_the_whole_block() {
    for attention in ["efficient", "standard"] {
        let dims = [4096u64, 32, 32, 16384, 2048, 1];
        let one = llama_block(dims, attention, 1);
        for t in [2u64, 4] {
            let args = [
                "--model",
                "llama",
                "--hidden",
                "4096",
                "--heads",
                "32",
                "--kv-heads",
                "32",
                "--intermediate",
                "16384",
                "--layers",
                "4",
                "--vocab",
                "32000",
                "--dtype",
                "bf16",
                "--kernels",
                "fused",
                "--attention",
                attention,
            ];
            let v = predict_train(&args, &format!("tp={t},pp=4,sp=on"), "1", "2048");
            assert_eq!(v["parallel"]["sequence_parallel"], true);
            let block = n(&acts(&v)[1], "microbatch_graph_bytes");
            assert_eq!(block, one.div_ceil(t), "{attention} t={t}");
        }
    }
    // One K/V head a rank: at or above the one-rank block's share.
    let dims = [2048u64, 16, 4, 5632, 1024, 2];
    let one = llama_block(dims, "efficient", 1);
    let args = [
        "--model",
        "llama",
        "--hidden",
        "2048",
        "--heads",
        "16",
        "--kv-heads",
        "4",
        "--intermediate",
        "5632",
        "--layers",
        "4",
        "--vocab",
        "32000",
        "--dtype",
        "bf16",
        "--kernels",
        "fused",
    ];
    let v = predict_train(&args, "tp=4,pp=4,sp=on", "2", "1024");
    let block = n(&acts(&v)[1], "microbatch_graph_bytes");
    assert!(block >= one.div_ceil(4), "{block} {one}");
    let err = predict(&["--preset", "llama-3-8b"], "tp=2,sp=yes").unwrap_err();
    assert!(err.contains("on or off"), "{err}");
}

/// Llama 3.1 405B at TP 8 × PP 16, 16 microbatches of 8,192 tokens: the worst rank (stage 1,
/// 15 microbatches in flight of 8 layers) under each regime, pinned (the states are hand
/// arithmetic above; the activations are the replay's, pinned so that a change shows): autocast
/// 626,376,314,144 B (583.36 GiB: each microbatch's graph holds its own 16-bit weight copy and
/// an f32 residual stream), Megatron 376,052,909,232 B (350.23 GiB), DeepSpeed 369,677,042,864 B
/// (344.29 GiB), Megatron with sequence parallelism 150,560,244,072 B (140.22 GiB).
#[test]
fn llama_405b_worst_rank_under_each_regime() {
    let args = llama_405b_mixed();
    for (amp, want) in [
        ("autocast", 626_376_314_144u64),
        ("megatron", 376_052_909_232),
        ("deepspeed", 369_677_042_864),
        ("megatron,sp=on", 150_560_244_072),
    ] {
        let v = predict_train(&args, &format!("tp=8,pp=16,mb=16,amp={amp}"), "1", "8192");
        let r = ranks(&v);
        let a = acts(&v);
        let total = |s: usize| {
            n(&r[s], "weights_bytes")
                + n(&r[s], "gradient_bytes")
                + n(&r[s], "optimizer_state_bytes")
                + n(&a[s], "bytes")
        };
        let worst = (0..r.len()).max_by_key(|&s| total(s)).unwrap();
        assert_eq!(worst, 1, "{amp}");
        assert_eq!(total(worst), want, "{amp}");
    }
}

/// `predict ARGS --phases prefill,decode --parallel LAYOUT --fit-in 80GiB --json`'s serving
/// rank, or the failure's stderr.
fn serving(args: &[&str], layout: &str) -> Result<Value, String> {
    let more = [
        "--dtype",
        "bf16",
        "--batch",
        "1",
        "--seq",
        "4000",
        "--phases",
        "prefill,decode",
        "--fit-in",
        "80GiB",
    ];
    run(args, layout, &more).map(|v| v["parallel_serving"].clone())
}

/// Serving Llama-2-70B at TP 8 as vLLM shards it, by hand: a rank's layer holds q and o
/// `8192²/8` each, k and v `8192·1024/8` each (8 K/V heads, one a rank), gate, up and down
/// `8192·28672/8` each and two norms of 8192 whole: 106,971,136 parameters; 80 layers, the
/// vocab-parallel table and head `32000/8 · 8192` each, the final norm 8192: 8,623,235,072
/// parameters, 17,246,470,144 B in bf16, and the rotary tables every rank holds (cos and sin
/// of 4,096 positions × 64 frequencies in bf16: 1,048,576 B). One cached token a rank: `2 · 80 · 1 · 128 · 2` =
/// 40,960 B (the whole model's 327,680 B over 8). The capacity: the 80 GiB less the weights
/// and the prefill's activations (the replay's vocab-parallel embedding and gathered logits
/// among them), over 40,960 B a token, never more.
#[test]
fn serving_llama2_70b_tp8_is_hand_arithmetic() {
    let v = serving(&["--preset", "llama-2-70b"], "tp=8").unwrap();
    let layer = (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672) / 8 + 2 * 8192;
    assert_eq!(layer, 106_971_136);
    let params = 80 * layer + 2 * (32000 / 8) * 8192 + 8192;
    assert_eq!(n(&v, "params"), params);
    let weights = 17_246_470_144 + 2 * 4096 * 64 * 2;
    assert_eq!(n(&v, "weights_bytes"), weights);
    assert_eq!(
        (n(&v, "kv_heads"), &v["kv_replicated"]),
        (1, &Value::Bool(false))
    );
    assert_eq!(n(&v, "kv_bytes_per_token"), 40_960);
    assert_eq!(n(&v, "kv_bytes_per_sequence"), 40_960 * 4000);
    let free = (80u64 << 30) - weights - n(&v, "prefill_activation_bytes");
    assert_eq!(n(&v, "kv_capacity_tokens"), free / 40_960);
    assert_eq!(n(&v, "kv_capacity_sequences"), free / (40_960 * 4000));
    // One GPU: the whole cache a token, and the weights (128.5 GiB) leave no room at all.
    let one = serving(&["--preset", "llama-2-70b"], "tp=1").unwrap();
    assert_eq!(n(&one, "kv_bytes_per_token"), 8 * 40_960);
    assert_eq!(n(&one, "kv_capacity_tokens"), 0);
}

/// K/V heads fewer than the ranks are replicated, one a rank (Llama-3-8B's 8 at TP 16: 32
/// layers · 1 head of 128 · bf16, 16,384 B a token, the same as at TP 8); heads that neither
/// split nor divide are refused by name, as vLLM refuses them; a mixture of experts' activations
/// under a split are not modelled, so its capacity is unknown, never promised; serving under
/// another layout than tp is refused by name.
#[test]
fn serving_replicates_kv_heads_and_refuses_by_name() {
    let v = serving(&["--preset", "llama-3-8b"], "tp=16").unwrap();
    assert_eq!(
        (n(&v, "kv_heads"), &v["kv_replicated"]),
        (1, &Value::Bool(true))
    );
    assert_eq!(n(&v, "kv_bytes_per_token"), 2 * 32 * 128 * 2);
    let eight = serving(&["--preset", "llama-3-8b"], "tp=8").unwrap();
    assert_eq!(n(&eight, "kv_bytes_per_token"), 2 * 32 * 128 * 2);
    assert!(n(&v, "weights_bytes") < n(&eight, "weights_bytes"));
    let moe = serving(&["--preset", "qwen3-30b-a3b"], "tp=4").unwrap();
    // Qwen3-30B-A3B: 4 K/V heads, 48 layers of 128: at TP 4 one a rank.
    let token = 2 * 48 * 128 * 2;
    assert_eq!(n(&moe, "kv_bytes_per_token"), token);
    // Its experts split by width over tp (vLLM's default without expert parallelism): the
    // prefill's activations answered, and the capacity what the 80 GiB leave, never more.
    assert_eq!(moe["activations_missing"], Value::Null);
    let free = (80u64 << 30) - n(&moe, "weights_bytes") - n(&moe, "prefill_activation_bytes");
    assert_eq!(n(&moe, "kv_capacity_tokens"), free / token);
    let e = serving(&["--preset", "llama-2-70b"], "tp=3").unwrap_err();
    assert!(e.contains("do not split into 3 equal parts"), "{e}");
    let e = serving(&["--preset", "llama-3-8b"], "tp=2,pp=2").unwrap_err();
    assert!(e.contains("tensor parallelism only"), "{e}");
}
