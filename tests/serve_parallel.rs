//! `predict --parallel tp=T,ep=E --phases prefill,decode`: one expert-parallel serving rank as
//! vLLM runs it with `--enable-expert-parallel` (`formula::serve_parallel::serve_rank_ep`),
//! checked against hand arithmetic on the models' configs: the attention, dense layers, shared
//! experts, table and head as the tensor-parallel rank holds them, the routed experts whole,
//! `⌈E/ep⌉` a sparse layer; the cache a token as at `tp`; the capacity what the budget leaves;
//! and the layouts vLLM does not run refused by name.

mod common;

use serde_json::Value;

/// `predict --hf-config workloads/configs/CONFIG.json --batch 1 --seq 4096 --phases
/// prefill,decode --device cuda:0 --json MORE`'s case, or the failure's stderr.
fn predict(config: &str, more: &[&str]) -> Result<Value, String> {
    common::json_of(
        common::memfit()
            .arg("predict")
            .args(["--hf-config", &format!("workloads/configs/{config}.json")])
            .args([
                "--batch",
                "1",
                "--seq",
                "4096",
                "--phases",
                "prefill,decode",
            ])
            .args(["--device", "cuda:0", "--json"])
            .args(more),
    )
}

/// [`predict`] with `--parallel LAYOUT --fit-in BUDGET MORE`: its serving rank.
fn serving(config: &str, layout: &str, budget: &str, more: &[&str]) -> Result<Value, String> {
    let more: Vec<&str> = ["--parallel", layout, "--fit-in", budget]
        .into_iter()
        .chain(more.iter().copied())
        .collect();
    Ok(predict(config, &more)?["parallel_serving"].clone())
}

fn n(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

const GIB: u64 = 1 << 30;

/// The rotary tables every rank holds beside its parameters: cos and sin of `positions` ×
/// `frequencies` (half the rotated width), in bf16.
fn rotary(positions: u64, frequencies: u64) -> u64 {
    2 * positions * frequencies * 2
}

/// The capacity a budget leaves: `(budget − weights − prefill activations) / KV a token`
/// (every layer full attention: one kind).
fn capacity(v: &Value, budget: u64) -> u64 {
    let used = n(v, "weights_bytes") + n(v, "prefill_activation_bytes");
    budget.saturating_sub(used) / n(v, "kv_bytes_per_token")
}

/// Qwen3-30B-A3B at tp=1,ep=8 (8 data-parallel attention replicas, DeepSeek's serving
/// layout), by hand from its config: a layer's attention q and o `2048·4096` each, k and v
/// `2048·512` each (4 K/V heads of 128), the q/k norms 128 each, the two norms 2048 each, the
/// router `2048·128`, all whole (tp 1); 16 of its 128 experts whole, `3·2048·768` each; 48
/// layers; the table and the untied head `151936·2048` each (whole at tp 1), the final norm
/// 2048. In bf16 2 B a parameter; one cached token `2·48·4·128·2` B (every K/V head: tp 1).
#[test]
fn qwen3_30b_a3b_tp1_ep8_is_hand_arithmetic() {
    let v = serving("qwen3-30b-a3b", "tp=1,ep=8", "72GiB", &[]).unwrap();
    let dense_layer = 2 * 2048 * 4096 + 2 * 2048 * 512 + 2 * 128 + 2 * 2048 + 2048 * 128;
    let expert = 3 * 2048 * 768;
    let experts = 48 * 16 * expert;
    let params = 48 * dense_layer + experts + 2 * 151_936 * 2048 + 2048;
    assert_eq!(experts, 3_623_878_656);
    assert_eq!(params, 5_164_972_032);
    assert_eq!(
        (n(&v, "ep"), n(&v, "dp"), n(&v, "experts_per_rank")),
        (8, 8, 16)
    );
    assert_eq!(n(&v, "expert_params"), experts);
    assert_eq!(n(&v, "params"), params);
    // 2 B a parameter (the checkpoint is bf16) and the tables of 40,960 positions × 64.
    assert_eq!(n(&v, "weights_bytes"), 2 * params + rotary(40_960, 64));
    assert_eq!(n(&v, "kv_heads"), 4);
    assert_eq!(n(&v, "kv_bytes_per_token"), 2 * 48 * 4 * 128 * 2);
    assert_eq!(n(&v, "kv_bytes_per_sequence"), 2 * 48 * 4 * 128 * 2 * 4096);
    // The gathers of the experts' tokens are in the replay.
    assert!(v["activations_missing"].is_null());
    let acts = n(&v, "prefill_activation_bytes");
    assert!(acts > 0);
    assert_eq!(n(&v, "kv_capacity_tokens"), capacity(&v, 72 * GIB));
    assert_eq!(
        n(&v, "kv_capacity_sequences"),
        n(&v, "kv_capacity_tokens") / 4096
    );
    // ep=16: 8 experts a rank, the dense part unchanged; the experts' work on the tokens of
    // twice the replicas gathered, so more activations.
    let w = serving("qwen3-30b-a3b", "tp=1,ep=16", "72GiB", &[]).unwrap();
    assert_eq!(n(&w, "experts_per_rank"), 8);
    assert_eq!(n(&w, "params"), params - experts / 2);
    assert_eq!(n(&w, "kv_bytes_per_token"), n(&v, "kv_bytes_per_token"));
    assert!(n(&w, "prefill_activation_bytes") > acts);
}

/// DeepSeek-V3 at tp=1 over 8 and 16 expert-parallel ranks, by hand from its config (the
/// parameters memfit's model holds: the routing's correction bias is not one): a layer's MLA
/// `q_a 7168·1536, its norm 1536, q_b 1536·128·192, kv_a 7168·576, its norm 512, kv_b
/// 512·128·256, o 128·128·7168` and two norms of 7168, all whole; the first 3 layers' dense
/// MLP `3·7168·18432`; the 58 sparse layers' router `256·7168`, the shared expert
/// `3·7168·2048` whole, and `256/ep` routed experts `3·7168·2048` each; the table and the
/// head `129280·7168` each, the final norm 7168. MLA's latent whole: `61·(512 + 64)·2` B a
/// token.
#[test]
fn deepseek_v3_tp1_ep8_and_ep16_are_hand_arithmetic() {
    let h: u64 = 7168;
    let mla = h * 1536 + 1536 + 1536 * 128 * 192 + h * 576 + 512 + 512 * 128 * 256 + 128 * 128 * h;
    let dense_mlp = 3 * h * 18432;
    let expert = 3 * h * 2048;
    let sparse = 256 * h + expert; // the router and the shared expert
    let table = 129_280 * h;
    let whole = 61 * (mla + 2 * h) + 3 * dense_mlp + 58 * sparse + 2 * table + h;
    for (ep, held, want) in [(8, 32, 98_856_229_888u64), (16, 16, 57_986_931_712)] {
        // The model's own type (the FP8 checkpoint's blocks per rank are the test below's).
        let v = serving(
            "deepseek-v3",
            &format!("tp=1,ep={ep}"),
            "120GiB",
            &["--weights", "model"],
        )
        .unwrap();
        let params = whole + 58 * held * expert;
        assert_eq!(params, want, "ep={ep}");
        assert_eq!(n(&v, "experts_per_rank"), held, "ep={ep}");
        assert_eq!(n(&v, "expert_params"), 58 * held * expert, "ep={ep}");
        assert_eq!(n(&v, "params"), params, "ep={ep}");
        // bf16, and the tables of 163,840 positions × 32 (MLA rotates 64 of each head).
        assert_eq!(
            n(&v, "weights_bytes"),
            2 * params + rotary(163_840, 32),
            "ep={ep}"
        );
        assert_eq!(n(&v, "kv_bytes_per_token"), 61 * (512 + 64) * 2, "ep={ep}");
        assert_eq!(
            n(&v, "kv_capacity_tokens"),
            capacity(&v, 120 * GIB),
            "ep={ep}"
        );
        // 184.13 GiB of weights at ep=8 leave nothing in 120 GiB; 108.01 GiB at ep=16 do.
        assert_eq!(n(&v, "kv_capacity_tokens") == 0, ep == 8, "ep={ep}");
    }
}

/// The capacity only grows with the budget, and the worst routing holds no less than the
/// balanced one (the gathered tokens are the same; the experts' share of them is not).
#[test]
fn capacity_is_monotone_in_the_budget_and_worst_routing_bounds_balanced() {
    let mut last = 0;
    for budget in ["12GiB", "24GiB", "48GiB", "72GiB", "80GiB"] {
        let v = serving("qwen3-30b-a3b", "tp=1,ep=8", budget, &[]).unwrap();
        let tokens = n(&v, "kv_capacity_tokens");
        assert!(tokens >= last, "{budget}: {tokens} < {last}");
        last = tokens;
    }
    assert!(last > 0);
    let worst = serving("qwen3-30b-a3b", "tp=1,ep=8", "72GiB", &[]).unwrap();
    let balanced = serving(
        "qwen3-30b-a3b",
        "tp=1,ep=8",
        "72GiB",
        &["--routing", "balanced"],
    )
    .unwrap();
    assert!(
        n(&worst, "prefill_activation_bytes") > n(&balanced, "prefill_activation_bytes"),
        "{worst} {balanced}"
    );
    assert!(n(&worst, "kv_capacity_tokens") < n(&balanced, "kv_capacity_tokens"));
}

/// Mixtral-8x7B at tp=2,ep=8 (4 attention replicas of 2: vLLM's sequence-parallel mixture):
/// its attention split as the tp=2 rank holds it (q and o `4096²/2`, k and v `4096·1024/2`,
/// norms and router whole), one of its 8 experts whole (`3·4096·14336`), the table and head
/// `32000/2·4096` each; its activations the tp shard's with the chunks of all 8 ranks gathered,
/// more than at tp=2,ep=2 (one replica, nothing gathered). DeepSeek-V3 at tp=8,ep=16 (2
/// replicas): MLA split 8 ways, the shared expert whole (the sequence-parallel mixture's
/// `disable_tp`), 16 routed experts whole; its latent cache whole on every rank, its capacity
/// what the budget leaves beside the rank's weights and activations.
#[test]
fn tp_and_ep_together_weights_by_hand() {
    let v = serving("mixtral-8x7b", "tp=2,ep=8", "72GiB", &[]).unwrap();
    let layer = (2 * 4096 * 4096 + 2 * 4096 * 1024) / 2 + 2 * 4096 + 4096 * 8;
    let expert = 3 * 4096 * 14336;
    let params = 32 * (layer + expert) + 2 * 32000 / 2 * 4096 + 4096;
    assert_eq!(
        (
            n(&v, "tp"),
            n(&v, "ep"),
            n(&v, "dp"),
            n(&v, "experts_per_rank")
        ),
        (2, 8, 4, 1)
    );
    assert_eq!(n(&v, "params"), params);
    assert_eq!(n(&v, "weights_bytes"), 2 * params + rotary(32_768, 64));
    assert_eq!(n(&v, "kv_bytes_per_token"), 2 * 32 * 4 * 128 * 2);
    assert!(v["activations_missing"].is_null());
    assert_eq!(n(&v, "kv_capacity_tokens"), capacity(&v, 72 * GIB));
    let one = serving("mixtral-8x7b", "tp=2,ep=2", "72GiB", &[]).unwrap();
    assert!(n(&v, "prefill_activation_bytes") > n(&one, "prefill_activation_bytes"));
    // dp= may say what ep=E/T says; nothing else.
    let same = serving("mixtral-8x7b", "tp=2,dp=4,ep=8", "72GiB", &[]).unwrap();
    assert_eq!(same, v);

    let d = serving("deepseek-v3", "tp=8,ep=16", "72GiB", &[]).unwrap();
    let h: u64 = 7168;
    let mla = h * 1536
        + 1536
        + 1536 * 128 * 192 / 8
        + h * 576
        + 512
        + 512 * 128 * 256 / 8
        + 128 * 128 / 8 * h;
    let ds_expert = 3 * h * 2048;
    let params = 61 * (mla + 2 * h)
        + 3 * (3 * h * 18432 / 8)
        + 58 * (256 * h + ds_expert + 16 * ds_expert)
        + 2 * 129_280 / 8 * h
        + h;
    assert_eq!(n(&d, "params"), params);
    assert_eq!(n(&d, "kv_bytes_per_token"), 61 * (512 + 64) * 2);
    // MLA's heads split over tp, its latent whole: the prefill's activations answered, the
    // capacity what the 72 GiB leave.
    assert_eq!(d["activations_missing"], Value::Null);
    assert_eq!(n(&d, "kv_capacity_tokens"), capacity(&d, 72 * GIB));
}

/// Mixtral-8x7B at tp=8,ep=8 (one replica: vLLM's `-tp 8 --enable-expert-parallel`): its
/// attention split 8 ways (one K/V head a rank), one expert whole a rank, by hand; nothing
/// gathered, so its activations are the tp shard's with whole experts, and the capacity what
/// 72 GiB leave. Qwen3-30B-A3B at tp=4,ep=4: a rank's activations below one GPU's whole model
/// (the attention split), and below tp=1,ep=4's (four replicas' tokens gathered there).
#[test]
fn one_replica_ep_equal_to_tp_is_the_tp_shard_with_whole_experts() {
    let v = serving("mixtral-8x7b", "tp=8,ep=8", "72GiB", &[]).unwrap();
    let layer = (2 * 4096 * 4096 + 2 * 4096 * 1024) / 8 + 2 * 4096 + 4096 * 8;
    let params = 32 * (layer + 3 * 4096 * 14336) + 2 * 32000 / 8 * 4096 + 4096;
    assert_eq!((n(&v, "dp"), n(&v, "experts_per_rank")), (1, 1));
    assert_eq!(n(&v, "params"), params);
    assert_eq!(n(&v, "kv_bytes_per_token"), 2 * 32 * 128 * 2);
    assert!(v["activations_missing"].is_null());
    assert_eq!(n(&v, "kv_capacity_tokens"), capacity(&v, 72 * GIB));
    let acts = |layout| {
        n(
            &serving("qwen3-30b-a3b", layout, "72GiB", &[]).unwrap(),
            "prefill_activation_bytes",
        )
    };
    let (tp4, one, gathered) = (acts("tp=4,ep=4"), acts("tp=1"), acts("tp=1,ep=4"));
    assert!(tp4 < one && one < gathered, "{tp4} {one} {gathered}");
}

/// An expert split vLLM does not run is refused by name: ep not a multiple of tp, a dense
/// model with ep > 1, a dp that is not ep/tp.
#[test]
fn layouts_vllm_does_not_serve_are_refused_by_name() {
    let e = serving("qwen3-30b-a3b", "tp=4,ep=6", "72GiB", &[]).unwrap_err();
    assert!(e.contains("ep must be a multiple of tp"), "{e}");
    let e = serving("llama-3-8b", "tp=1,ep=2", "72GiB", &[]).unwrap_err();
    assert!(e.contains("no mixture of experts"), "{e}");
    let e = serving("qwen3-30b-a3b", "tp=1,dp=4,ep=8", "72GiB", &[]).unwrap_err();
    assert!(e.contains("means ep=4"), "{e}");
}

/// The rank's weights are the serving copy's, tensor by tensor: a quantized checkpoint's
/// projections as shipped (DeepSeek-V3's FP8 e4m3 with an f32 scale per 128 × 128 block,
/// gpt-oss's MXFP4 experts), the rest in the model's type. One rank of tp 1 holds what the
/// single device's serving copy holds, but for its tensors' bookkeeping (under 1 MiB). Between
/// DeepSeek-V3's ep 8 and ep 16 the worst rank holds 16 routed experts fewer in each of the 58
/// sparse layers, each `gate`, `up` (2048 × 7168) and `down` (7168 × 2048) in FP8:
/// `2048·7168 + 4·16·56` bytes a projection.
#[test]
fn serving_ranks_hold_the_checkpoints_quantized_copy() {
    let single = |config: &str| -> (String, u64) {
        let v = predict(config, &[]).unwrap();
        (
            v["serving"]["weights"].as_str().unwrap().to_string(),
            n(&v["serving"], "weights_bytes"),
        )
    };
    for (config, copy) in [
        ("deepseek-v3", "fp8"),
        ("gpt-oss-20b", "mxfp4-experts"),
        ("qwen3-30b-a3b", "model"),
    ] {
        let (name, whole) = single(config);
        assert_eq!(name, copy, "{config}");
        let rank = serving(config, "tp=1", "80GiB", &[]).unwrap();
        assert_eq!(rank["weights"], copy, "{config}");
        let w = n(&rank, "weights_bytes");
        assert!(
            w <= whole && whole - w < 1 << 20,
            "{config}: one rank of tp 1 holds {w} B, the single device's serving copy {whole}"
        );
    }
    let ep8 = serving("deepseek-v3", "tp=1,ep=8", "80GiB", &[]).unwrap();
    let ep16 = serving("deepseek-v3", "tp=1,ep=16", "80GiB", &[]).unwrap();
    let fp8_proj = 2048 * 7168 + 4 * 16 * 56u64;
    assert_eq!(
        n(&ep8, "weights_bytes") - n(&ep16, "weights_bytes"),
        58 * 16 * 3 * fp8_proj
    );
    // The same rank in the model's type (`--weights model`, bf16): 2 B a parameter and the
    // rotary tables (under 64 MiB), nearly twice the FP8 copy.
    let bf16 = serving(
        "deepseek-v3",
        "tp=1,ep=16",
        "80GiB",
        &["--weights", "model"],
    )
    .unwrap();
    assert_eq!(bf16["weights"], "model");
    let (w, p) = (n(&bf16, "weights_bytes"), n(&bf16, "params"));
    assert!(
        w >= 2 * p && w - 2 * p < 64 << 20,
        "{w} B for {p} parameters"
    );
    assert!(n(&ep16, "weights_bytes") * 18 < w * 10);
}
