//! The default kernels' training graph beside what PyTorch + transformers' autograd saves for
//! the same model: per token per layer, the graph of a two-layer slice less that of a one-layer
//! slice over B·S, at real widths, B 1, S 512. PyTorch's figures were counted by
//! `scripts/torch_saved.py CONFIG --layers 1 --seq 512 --per-layer` (torch 2.9.1, transformers
//! 4.57.1, SDPA attention, on the CPU: every node's `_saved_*` tensors, one count per storage,
//! parameters excluded) on 2026-12-06; memfit's are `memfit predict`'s, on the CPU (f16: the
//! CPU's 16-bit type, bf16 and f16 the same bytes; f32). The goal of issue 51: within 5 % above
//! PyTorch's, never below by more than 2 %.

mod common;

/// `memfit predict` of `args` at `layers` layers, B 1, S 512, on the CPU: the graph bytes.
fn graph(args: &[&str], layers: usize) -> f64 {
    predict(args, layers, ["1", "512"], "cpu")["graph_bytes"]
        .as_u64()
        .unwrap() as f64
}

/// `memfit predict --json` of `args` at `layers` layers, `[B, S]`, on `device`: the case's
/// object.
fn predict(args: &[&str], layers: usize, [b, s]: [&str; 2], device: &str) -> serde_json::Value {
    let l = layers.to_string();
    let mut cmd = common::memfit();
    cmd.arg("predict");
    if !args.contains(&"--phases") {
        cmd.args(["--phases", "forward"]);
    }
    let out = cmd
        .args(args)
        .args(["--layers", &l, "--batch", b, "--seq", s])
        .args(["--device", device, "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let line = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(line.lines().next().unwrap()).unwrap()
}

/// What one more layer adds to the graph, per token: `predict`'s graph at two layers less
/// that at one, over B·S.
fn per_token_per_layer(args: &[&str], [b, s]: [&str; 2], device: &str) -> f64 {
    let g = |l| {
        predict(args, l, [b, s], device)["graph_bytes"]
            .as_u64()
            .unwrap() as f64
    };
    let tokens: f64 = b.parse::<f64>().unwrap() * s.parse::<f64>().unwrap();
    (g(2) - g(1)) / tokens
}

/// (what, memfit's args, PyTorch's saved bytes per token per layer).
const SLICES: [(&str, &[&str], f64); 7] = [
    // H 4096, I 14336, 32:8 heads: the norms' f32 copies and normalised values, q, k, v, the
    // attention's output and log-sum-exp, SwiGLU's four `(I)` tensors.
    (
        "Llama-3-8B widths, 16-bit",
        &[
            "--preset",
            "llama-3-8b",
            "--vocab",
            "32000",
            "--dtype",
            "f16",
        ],
        200_840.0,
    ),
    (
        "Llama-3-8B widths, f32",
        &[
            "--preset",
            "llama-3-8b",
            "--vocab",
            "32000",
            "--dtype",
            "f32",
        ],
        368_776.0,
    ),
    // 128 experts, top 8: the router's f32 softmax is kept as a composed chain (memfit keeps
    // more there), the experts' SwiGLU per routed token.
    (
        "Qwen3-30B-A3B widths, 16-bit",
        &["--preset", "qwen3-30b-a3b", "--dtype", "f16"],
        227_340.0,
    ),
    // The second layer is a mixture of experts after a dense first one; MLA.
    (
        "DeepSeek-V2-Lite widths, 16-bit",
        &["--preset", "deepseek-v2-lite", "--dtype", "f16"],
        279_988.0,
    ),
    // Four norms a block (each an f32 copy and an f32 normalised value); 1,024 B of PyTorch's
    // figure is the sliding layers' `(S, S)` mask SDPA saves, which memfit's attention never
    // makes.
    (
        "Gemma-3-1B widths, 16-bit",
        &["--preset", "gemma-3-1b", "--dtype", "f16"],
        113_244.0,
    ),
    // Mixed precision as autocast runs it (`torch_saved.py --autocast`: the f32 model under
    // `torch.autocast`): 851,968 B of the figure are the projections' 16-bit weight copies
    // (218,103,808 weights a layer × 2 B over 512 tokens), the rest the f32 residual stream's
    // norm inputs and normalised values, one 16-bit cast of the norm's output per projection
    // (q, k, v; gate, up), the 16-bit attention and SwiGLU. A 16-bit working copy throughout
    // (memfit before autocast was modelled) keeps 1,052,756 B: 0.96×.
    (
        "Llama-3-8B widths, mixed (autocast)",
        &[
            "--preset",
            "llama-3-8b",
            "--vocab",
            "32000",
            "--dtype",
            "f16",
            "--precision",
            "mixed",
        ],
        1_093_768.0,
    ),
    // Gemma's `(1 + w)` norms in f32, four a block; 1,024 B of PyTorch's figure is SDPA's saved
    // sliding mask, as above.
    (
        "Gemma-3-1B widths, mixed (autocast)",
        &[
            "--preset",
            "gemma-3-1b",
            "--dtype",
            "f16",
            "--precision",
            "mixed",
        ],
        226_524.0,
    ),
];

#[test]
fn graph_per_token_per_layer_is_pytorchs() {
    for (what, args, torch) in SLICES {
        let per = (graph(args, 2) - graph(args, 1)) / 512.0;
        let r = per / torch;
        println!("{what}: memfit {per:.0} B, PyTorch {torch:.0} B, {r:.3}×");
        assert!(
            (0.98..=1.05).contains(&r),
            "{what}: memfit keeps {per:.0} B per token per layer, PyTorch {torch:.0} ({r:.3}×)"
        );
    }
}

/// The lean kernels (`--kernels fused`) stay what they were: at Llama-3-8B widths in 16 bits,
/// 0.74× PyTorch's (no f32 copies, SwiGLU's three `(I)` tensors, the rotary op's input kept).
#[test]
fn the_lean_kernels_keep_less() {
    let args = [
        "--preset",
        "llama-3-8b",
        "--vocab",
        "32000",
        "--dtype",
        "f16",
        "--kernels",
        "fused",
    ];
    let per = (graph(&args, 2) - graph(&args, 1)) / 512.0;
    let r = per / SLICES[0].2;
    println!("lean: {per:.0} B per token per layer, {r:.3}× PyTorch's");
    assert!((0.70..0.80).contains(&r), "{per} B, {r}×");
}

/// The CUDA replay's graph (`--device cuda:0`, bf16, where the efficient attention is the tiled
/// composition) at Llama-3-8B widths beside PyTorch's 16-bit figure above (SDPA on the CPU;
/// bf16 and f16 the same bytes): 1.051× while the tiled attention wrote `(B, A, S, D)` and the
/// heads' merge kept a copy of it beside (+2·A·D B per token), and the value projection's
/// output stayed beside its head-split copy (+2·G·D); the op now writes `(B, S, A, D)` (the
/// merge a view) and the projection's output is released once copied: 200,864 B, 1.000×.
#[test]
fn the_cuda_graph_per_token_per_layer_is_pytorchs() {
    let args = [
        "--preset",
        "llama-3-8b",
        "--vocab",
        "32000",
        "--dtype",
        "bf16",
    ];
    let per = per_token_per_layer(&args, ["1", "512"], "cuda:0");
    let torch = SLICES[0].2;
    let r = per / torch;
    println!("CUDA replay: memfit {per:.0} B, PyTorch {torch:.0} B, {r:.4}×");
    assert!(
        (0.99..=1.01).contains(&r),
        "memfit's CUDA graph keeps {per:.0} B per token per layer, PyTorch {torch:.0} ({r:.4}×)"
    );
}

/// PyTorch eager's saved bytes per token per layer for memfit's GPT with its written-out
/// attention, f32, `small` B 4 S 128: `scripts/torch_saved.py small --layers 1 --per-layer
/// --attn eager --dtype f32 --batch 4 --seq 128` (the nanoGPT-style `scripts/torch_reference.py`
/// GPT that memfit's GPT answers for, not transformers' GPT-2; torch 2.9.1, Intel Xeon,
/// 2026-12-06): 18,448.02 B — the two LayerNorms' inputs 2,048, the three linear inputs (the
/// first norm's output, the merged heads, the second norm's output) 3,072, the fc2 input
/// (GELU's output) 4,096, GELU's input 4,096, q and kᵀ (contiguous copies) 2,048, the softmax
/// output `A·S·4` 2,048 and v's copy 1,024, the norms' statistics 16. SDPA: 16,416.
const EAGER_GPT_SMALL: f64 = 18_448.0;

/// The standard attention with fused kernels (lean and transformers') keeps what eager keeps:
/// q, k and v as their head-split copies (each projection's output released once copied),
/// the probabilities, the merged heads (`P·v`'s own output released once merged), and not the
/// biased output projections' (o, fc2) outputs, which the residual sum's node held only to
/// route the gradient (PyTorch's add saves nothing). 24,588 B (1.333×) before; 18,443.7 now
/// (PyTorch's norms save 16 B of statistics that memfit's recompute). The composed set keeps
/// candle's stock graph.
#[test]
fn standard_attention_keeps_what_eager_keeps() {
    for kernels in ["fused", "transformers"] {
        let args = [
            "--preset",
            "small",
            "--attention",
            "standard",
            "--kernels",
            kernels,
            "--dtype",
            "f32",
        ];
        let per = per_token_per_layer(&args, ["4", "128"], "cpu");
        let r = per / EAGER_GPT_SMALL;
        println!("{kernels}: memfit {per:.1} B, PyTorch eager {EAGER_GPT_SMALL} B, {r:.3}×");
        assert!(
            (0.98..=1.02).contains(&r),
            "{kernels}: {per:.1} B per token per layer, {r:.3}× eager's"
        );
    }
    let composed = [
        "--preset",
        "small",
        "--attention",
        "standard",
        "--kernels",
        "composed",
    ];
    let per = per_token_per_layer(&composed, ["4", "128"], "cpu");
    assert!(per / EAGER_GPT_SMALL > 2.5, "composed: {per:.1} B");
}

/// The phases beside PyTorch eager's (`results/cpu/torch-compare/torch.jsonl`, GPT small B4
/// S128 f32, eager: forward 47,223,848 B, train step 51,418,152; the same on this Intel Xeon):
/// the standard attention's predicted forward within issue 51's 1.1× and train step within
/// 1.2×, under the lean and the default kernels (before: fused 1.189× and 1.336×, transformers
/// 1.366× and 1.418×; now 0.922× and 1.092×, 1.100× and 1.173× — the default's 8 MiB more
/// are its loss: the logits beside the f32 log-probabilities, and the softmax beside them for
/// a moment in the forward). `predict` is the measured run within 0.1 % (`tests/exactness.rs`).
#[test]
fn standard_attention_phases_beside_eager() {
    for kernels in ["fused", "transformers"] {
        let v = predict(
            &[
                "--preset",
                "small",
                "--attention",
                "standard",
                "--kernels",
                kernels,
                "--dtype",
                "f32",
                "--optimizer",
                "adamw",
                "--phases",
                "forward,train-step",
            ],
            4,
            ["4", "128"],
            "cpu",
        );
        let peak = |phase: &str| {
            v["phase_peak_bytes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p[0] == phase)
                .unwrap()[1]
                .as_u64()
                .unwrap() as f64
        };
        let (fwd, step) = (
            peak("forward") / 47_223_848.0,
            peak("train-step") / 51_418_152.0,
        );
        println!("{kernels}: forward {fwd:.4}× eager, train step {step:.4}×");
        assert!(
            fwd <= 1.1 && step <= 1.2,
            "{kernels}: forward {fwd:.4}×, train step {step:.4}×"
        );
    }
}
