//! `memfit ranks` on real ranks (issue 53): data parallelism over MPI (`mpirun`), ZeRO 0, 1 and
//! 2 over 2 and 4 processes on this machine. Every rank's windows within the CPU tolerance of
//! its prediction, its averaged gradients and its weights after two steps equal (to float
//! rounding) to one process training on the whole global batch, and claim B5 measured: the
//! optimizer state a rank holds falls as 1/N with the ranks. Tensor parallelism (`--tp`) on a
//! LLaMA with grouped K/V heads: every window within tolerance, each rank's shard of the
//! gradients and weights equal to the slices of one process's, and the check failing when `f`
//! does not all-reduce its gradient; with checkpointing, and beside 2 data-parallel replicas
//! under ZeRO 0, 1 and 2 (4 ranks). ZeRO 3 (`--zero 3`, FSDP's FULL_SHARD): every window within
//! tolerance, the check passing, and failing without a tied table's second use. Expert
//! parallelism (`--ep`) on a Mixtral slice over 2 and 4 ranks: every window within tolerance,
//! every rank's gradients and weights those of one process on the global batch with every
//! expert, and the check failing without the dispatch's backward exchange or the experts'
//! gradient scaling. ZeRO-Offload (`--offload optimizer`): the optimizer partition in the host
//! arena exactly as predicted, the device's optimizer window only bookkeeping.
//!
//! Built only with the `ranks` feature (scripts/test.sh turns it on; scripts/setup.sh test
//! installs Open MPI).
#![cfg(feature = "ranks")]

mod common;

use std::process::Command;

use serde_json::Value;

/// A GPT of 2 blocks (H 96, 3 heads, V 300), 2 rows of 32 tokens a rank, AdamW.
const GPT: &[&str] = &[
    "--hidden",
    "96",
    "--heads",
    "3",
    "--layers",
    "2",
    "--vocab",
    "300",
    "--batch",
    "2",
    "--seq",
    "32",
    "--optimizer",
    "adamw",
];

/// A LLaMA of 2 blocks with grouped K/V heads (H 64, 4 heads, 2 K/V heads, I 160, V 256).
const LLAMA: &[&str] = &[
    "--model",
    "llama",
    "--hidden",
    "64",
    "--heads",
    "4",
    "--kv-heads",
    "2",
    "--intermediate",
    "160",
    "--layers",
    "2",
    "--vocab",
    "256",
    "--batch",
    "2",
    "--seq",
    "24",
    "--optimizer",
    "adamw",
];

/// [`LLAMA`] at S 96 instead of 24: where 1 % of a window exceeds the few KB of bookkeeping the
/// replay leaves out (the checkpointed forward's, the collectives' ops').
fn llama_at_s96() -> Vec<&'static str> {
    LLAMA
        .iter()
        .map(|&a| if a == "24" { "96" } else { a })
        .collect()
}

/// `mpirun -np N memfit ranks ARGS --zero Z --check --json`: the JSON document rank 0 prints.
fn ranks(n: usize, zero: u8, args: &[&str]) -> Value {
    run(n, args, &["--zero", &zero.to_string()])
}

/// `mpirun -np N memfit ranks ARGS --tp N MORE --check --json`.
fn tensor_parallel(n: usize, args: &[&str], more: &[&str]) -> Value {
    let tp = n.to_string();
    let split: Vec<&str> = ["--tp", &tp]
        .into_iter()
        .chain(more.iter().copied())
        .collect();
    run(n, args, &split)
}

/// `mpirun -np N memfit ranks ARGS SPLIT --check --json`: the JSON document rank 0 prints.
fn run(n: usize, args: &[&str], split: &[&str]) -> Value {
    let exe = assert_cmd::cargo::cargo_bin("memfit");
    let out = Command::new("mpirun")
        .args(["--oversubscribe", "--bind-to", "none", "-np"])
        .arg(n.to_string())
        .arg(&exe)
        .arg("ranks")
        .args(args)
        .args(split)
        .args(["--check", "--json"])
        // Open MPI refuses root unless told twice (CI runs as root).
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .expect("mpirun runs (scripts/setup.sh test installs openmpi-bin)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "mpirun -np {n} memfit ranks {args:?} {split:?}: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}"))
}

fn i(v: &Value) -> i64 {
    v.as_i64().unwrap_or_else(|| panic!("not a count: {v}"))
}

/// The document's window names, in order.
fn window_names(doc: &Value) -> Vec<&str> {
    doc["windows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect()
}

/// A window's retained bytes within the tolerance of their prediction.
fn assert_retained(w: &Value, what: &str) {
    let (m, p) = (i(&w["retained_bytes"]), i(&w["predicted_retained_bytes"]));
    assert!(
        m.abs_diff(p) <= common::tolerance(m.unsigned_abs()),
        "{what}: retained measured {m}, predicted {p}"
    );
}

/// A rank's gradients and weights equal (to float rounding) to one process's.
fn assert_as_one_process(rep: &Value, what: &str) {
    let (g, wt) = check_of(rep);
    assert!(
        g < 1e-5 && wt < 1e-5,
        "{what} differs from one process on the global batch: gradients {g:e}, weights {wt:e}"
    );
}

/// A rank's check: (gradients, weights) relative differences.
fn check_of(rep: &Value) -> (f64, f64) {
    let c = &rep["check"];
    (
        c["gradient_rel_diff"].as_f64().unwrap(),
        c["weight_rel_diff"].as_f64().unwrap(),
    )
}

/// Every rank's every window within the tolerance of its prediction, and its gradients and
/// weights equal to the single process's.
fn check_all(doc: &Value, n: usize, what: &str) {
    let names = window_names(doc);
    let reports = doc["ranks"].as_array().unwrap();
    assert_eq!(reports.len(), n, "{what}: one report per rank");
    for (r, rep) in reports.iter().enumerate() {
        assert_eq!(u(&rep["rank"]) as usize, r);
        for (name, w) in names.iter().zip(rep["windows"].as_array().unwrap()) {
            let (m, p) = (u(&w["peak_bytes"]), u(&w["predicted_peak_bytes"]));
            assert!(
                common::exact(&format!("{what} rank {r} {name} peak"), m, p),
                "{what}: rank {r} {name}: peak measured {m}, predicted {p}"
            );
            assert_retained(w, &format!("{what}: rank {r} {name}"));
        }
        assert_as_one_process(rep, &format!("{what}: rank {r}"));
    }
}

#[test]
fn zero_stages_on_two_ranks_as_predicted_and_as_one_process() {
    for zero in 0..=2 {
        check_all(&ranks(2, zero, GPT), 2, &format!("gpt zero {zero}"));
    }
    check_all(&ranks(2, 2, LLAMA), 2, "llama zero 2");
}

/// Claim B5, measured: the optimizer state per rank at 1, 2 and 4 ranks (ZeRO 1) and the
/// gradients kept per rank (ZeRO 2).
#[test]
fn b5_state_falls_as_one_over_ranks() {
    let state = |doc: &Value, r: usize| i(&doc["ranks"][r]["states"]["optimizer_state_bytes"]);
    let grads = |doc: &Value, r: usize| i(&doc["ranks"][r]["states"]["gradient_bytes"]);
    let one = ranks(1, 1, LLAMA);
    let s1 = state(&one, 0);
    for n in [2usize, 4] {
        let doc = ranks(n, 1, LLAMA);
        check_all(&doc, n, &format!("llama zero 1 × {n}"));
        let total: i64 = (0..n).map(|r| state(&doc, r)).sum();
        for r in 0..n {
            // Each rank 1/N of the state: to a tensor's rounding and its metadata.
            let share = s1 as f64 / n as f64;
            let s = state(&doc, r) as f64;
            assert!(
                (s - share).abs() / share < 0.05,
                "{n} ranks: rank {r} holds {s} B of state, 1/{n} of one rank's {s1} is {share}"
            );
        }
        // Together the ranks hold one copy of the state, plus each rank's bookkeeping.
        assert!(
            total >= s1 && (total - s1) as f64 / (s1 as f64) < 0.05,
            "{n} ranks hold {total} B of state together, one rank {s1}"
        );
        let z2 = ranks(n, 2, LLAMA);
        let g1 = grads(&one, 0) as f64;
        let g = grads(&z2, 0) as f64;
        assert!(
            (g - g1 / n as f64).abs() / (g1 / n as f64) < 0.05,
            "ZeRO 2 × {n}: rank 0 keeps {g} B of gradients, one rank {g1}"
        );
    }
}

/// ZeRO-Offload (`--offload optimizer`) at stages 1, 2 and 3 over 2 ranks: every device window as
/// predicted and the ranks as one process; the optimizer partition in the host arena —
/// exactly its predicted bytes (master, gradient buffer and both moments of the rank's runs:
/// 4 f32 a parameter's run, so twice the state the same rank keeps on the device without
/// offload), made in the `optimizer` window and nothing in the others —, while the device's
/// `optimizer` window keeps only the slots' bookkeeping. Refused, by name, at stage 0.
#[test]
fn zero_offload_keeps_the_partition_on_the_host_as_predicted() {
    for zero in ["1", "2", "3"] {
        let doc = run(2, GPT, &["--zero", zero, "--offload", "optimizer"]);
        assert_eq!(doc["offload"], "optimizer");
        check_all(&doc, 2, &format!("gpt zero {zero} offload"));
        let plain = ranks(2, zero.parse().unwrap(), GPT);
        let names = window_names(&doc);
        for r in 0..2 {
            let rep = &doc["ranks"][r];
            let mut host_windows = 0;
            for (name, w) in names.iter().zip(rep["windows"].as_array().unwrap()) {
                let h = &w["host"];
                if h.is_null() {
                    continue;
                }
                host_windows += 1;
                let (m, p) = (u(&h["peak_bytes"]), u(&h["predicted_peak_bytes"]));
                let (mr, pr) = (i(&h["retained_bytes"]), i(&h["predicted_retained_bytes"]));
                assert_eq!((m, mr), (p, pr), "zero {zero} rank {r} {name}: host layer");
                assert_eq!(
                    m > 0,
                    *name == "optimizer",
                    "zero {zero} rank {r} {name}: {m}"
                );
            }
            // reduce, optimizer, gather, train-step; ZeRO 3: optimizer, train-step.
            assert_eq!(host_windows, if zero == "3" { 2 } else { 4 }, "zero {zero}");
            let state = |d: &Value| i(&d["ranks"][r]["states"]["optimizer_state_bytes"]);
            let host = &rep["states"]["host"];
            let bytes = i(&host["bytes"]);
            let parts: i64 = [
                "predicted_master_bytes",
                "predicted_gradient_bytes",
                "predicted_optimizer_state_bytes",
            ]
            .iter()
            .map(|k| i(&host[k]))
            .sum();
            // The formula shards the whole model, the ranks each tensor: within a few bytes a
            // tensor.
            assert!(
                bytes.abs_diff(parts) < 4096,
                "zero {zero} rank {r}: host {bytes} B, the formula's parts {parts}"
            );
            let plain_state = state(&plain);
            // The data of the state without offload (its tensors' bookkeeping aside), twice.
            let plain_data = i(&plain["ranks"][r]["states"]["predicted_optimizer_state_bytes"]);
            assert!(
                bytes.abs_diff(2 * plain_data) < 4096,
                "zero {zero} rank {r}: host {bytes} B, the state's data without offload {plain_data}"
            );
            assert!(
                state(&doc) * 100 < plain_state,
                "zero {zero} rank {r}: the device keeps {} B in the optimizer window, {plain_state} without offload",
                state(&doc)
            );
        }
    }
    let out = Command::new(assert_cmd::cargo::cargo_bin("memfit"))
        .arg("ranks")
        .args(GPT)
        .args(["--zero", "0", "--offload", "optimizer"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "--zero 0 --offload ran");
    assert!(err.contains("--zero 1, 2 or 3"), "{err}");
}

/// ZeRO 3 (FSDP's FULL_SHARD) over 2 ranks, a GPT whose head is tied to the token table and an
/// untied LLaMA: every window within the tolerance of its prediction (the replay of the same
/// unit-by-unit step), the gradients (every rank's shards gathered) and the weights after two
/// steps those of one process on the global batch; a rank holds half the weights ZeRO 2's
/// does. Without the tied table's second use (the embedding's gradient), the check says so.
#[test]
fn zero3_on_two_ranks_as_predicted_and_as_one_process() {
    let tied: Vec<&str> = GPT.iter().copied().chain(["--tied", "on"]).collect();
    let doc = ranks(2, 3, &tied);
    assert_eq!(
        window_names(&doc),
        [
            "init",
            "shard",
            "forward",
            "backward",
            "optimizer",
            "train-step"
        ]
    );
    check_all(&doc, 2, "gpt tied zero 3");
    assert_eq!(doc["fsdp_prefetch"], "backward");
    let llama = ranks(2, 3, LLAMA);
    check_all(&llama, 2, "llama zero 3");
    // Without the backward prefetch one unit is whole at a time: the backward's peak falls,
    // measured and predicted alike, and the check still passes.
    let alone = run(2, LLAMA, &["--zero", "3", "--fsdp-prefetch", "none"]);
    assert_eq!(alone["fsdp_prefetch"], "none");
    check_all(&alone, 2, "llama zero 3 without prefetch");
    let backward = |d: &Value, r: usize, f: &str| u(&d["ranks"][r]["windows"][3][f]);
    for r in 0..2 {
        for f in ["peak_bytes", "predicted_peak_bytes"] {
            assert!(
                backward(&llama, r, f) > backward(&alone, r, f),
                "rank {r}: the backward's {f} with the prefetch {} vs without {}",
                backward(&llama, r, f),
                backward(&alone, r, f)
            );
        }
    }
    // With the forward prefetch (FSDP's forward_prefetch=True) the next unit is whole while a
    // unit's forward runs: the forward's peak rises, by no more than one block's parameters
    // (the largest unit: q, k, v, o, gate, up, down and two norms of LLAMA's widths), measured
    // and predicted alike; what the forward keeps and the backward do not move, and the check
    // still passes.
    let ahead = run(2, LLAMA, &["--zero", "3", "--fsdp-forward-prefetch", "on"]);
    assert_eq!(ahead["fsdp_forward_prefetch"], "on");
    assert_eq!(llama["fsdp_forward_prefetch"], "off");
    check_all(&ahead, 2, "llama zero 3 with the forward prefetch");
    let block = 4 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 160 + 2 * 64);
    let at = |d: &Value, r: usize, w: usize, f: &str| i(&d["ranks"][r]["windows"][w][f]);
    for r in 0..2 {
        for f in ["peak_bytes", "predicted_peak_bytes"] {
            let rise = at(&ahead, r, 2, f) - at(&llama, r, 2, f);
            assert!(
                rise > 0 && rise <= block,
                "rank {r} {f}: the forward prefetch raises the forward's peak by {rise} B (a block is {block})"
            );
        }
        for (w, f) in [
            (2, "retained_bytes"),
            (3, "peak_bytes"),
            (3, "retained_bytes"),
        ] {
            assert_eq!(
                at(&ahead, r, w, f),
                at(&llama, r, w, f),
                "rank {r} window {w} {f}"
            );
        }
    }
    // FSDP's reshard_after_forward=False (SHARD_GRAD_OP): every unit kept whole from its
    // forward to its backward. The forward keeps the whole model's weights beside the shards
    // (its retained bytes rise by the parameters less nothing: the runs stay), the backward
    // gathers nothing again, measured and predicted alike, and the check still passes.
    let kept = run(
        2,
        LLAMA,
        &["--zero", "3", "--fsdp-reshard-after-forward", "off"],
    );
    assert_eq!(kept["fsdp_reshard_after_forward"], "off");
    check_all(
        &kept,
        2,
        "llama zero 3 without resharding after the forward",
    );
    let window = |d: &Value, r: usize, w: usize, f: &str| i(&d["ranks"][r]["windows"][w][f]);
    let params = 4 * u(&llama["case"]["params"]) as i64;
    for r in 0..2 {
        for f in ["retained_bytes", "predicted_retained_bytes"] {
            let rise = window(&kept, r, 2, f) - window(&llama, r, 2, f);
            assert!(
                (rise - params).abs() < params / 50,
                "rank {r} {f}: the forward keeps {rise} B more, the parameters are {params}"
            );
        }
        for f in ["peak_bytes", "predicted_peak_bytes"] {
            assert!(
                window(&kept, r, 3, f) < window(&llama, r, 3, f),
                "rank {r} {f}: the backward gathers nothing again"
            );
        }
    }
    let weights = |d: &Value, r: usize| i(&d["ranks"][r]["states"]["weights_bytes"]) as f64;
    let z2 = ranks(2, 2, &tied);
    for r in 0..2 {
        let (w3, w2) = (weights(&doc, r), weights(&z2, r));
        assert!(
            (w3 - w2 / 2.0).abs() / (w2 / 2.0) < 0.05,
            "rank {r}: ZeRO 3 holds {w3} B of weights, ZeRO 2 {w2}"
        );
    }
    // Hybrid sharding (FSDP's HYBRID_SHARD) with shard groups of one rank over 2 ranks: each
    // rank holds every parameter (a group of one), the gradients averaged over the replicas
    // by the second all-reduce (without it each rank's would be its own microbatch's and the
    // check would say so); every window as predicted, the tied table's two uses too.
    let hybrid = run(2, &tied, &["--zero", "3", "--hsdp", "1"]);
    assert_eq!(hybrid["hsdp_shard_group"], 1);
    check_all(&hybrid, 2, "gpt tied zero 3 hybrid, groups of 1");
    let weights3 = |d: &Value, r: usize| i(&d["ranks"][r]["states"]["weights_bytes"]) as f64;
    for r in 0..2 {
        let (h, w) = (weights3(&hybrid, r), weights3(&doc, r));
        assert!(
            (h - 2.0 * w).abs() / h < 0.05,
            "rank {r}: a group of one holds {h} B of weights, a group of two {w}"
        );
    }
    let broken = run(2, &tied, &["--zero", "3", "--zero3-skip-tied-second-use"]);
    assert_caught(&broken, "the tied table without its second use");
}

/// Every rank's gradients far from one process's: the check catches `what`.
fn assert_caught(broken: &Value, what: &str) {
    for (r, (g, _)) in checks(broken).into_iter().enumerate() {
        assert!(
            g > 1e-3,
            "rank {r}: {what}, yet gradients within {g:e} of one process"
        );
    }
}

/// The check's relative differences of every rank: (gradients, weights).
fn checks(doc: &Value) -> Vec<(f64, f64)> {
    doc["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(check_of)
        .collect()
}

/// Tensor parallelism over 2 ranks, K/V heads grouped (4 over 2: one K/V head a rank): every
/// window as predicted, each rank's shard of the gradients and of the weights after two steps
/// the slices of one process's (the token table's and head's rows included: vocab-parallel);
/// each rank holds half the whole model (the blocks, the table and the head halved; the norms
/// and rotary tables whole), its gradients Megatron's rank's (`stage_ranks` at tp 2) to their
/// bookkeeping. Without `f`'s backward all-reduce, the gradient reaching the norms and the
/// residual stream is one rank's part only, and the check says so.
#[test]
fn tensor_parallel_llama_on_two_ranks_as_predicted_and_as_one_process() {
    let doc = tensor_parallel(2, LLAMA, &[]);
    assert_eq!(u(&doc["tp"]), 2);
    assert_eq!(u(&doc["zero"]), 0);
    check_all(&doc, 2, "llama tp 2");
    // Stock candle's composed ops: nothing released, f's and g's inputs kept beside their
    // outputs. (S 96: at S 24 the backward's peak, 266 KB, falls where the graph holds many
    // small tensors, whose bookkeeping candle charges ≈ 10 % above the replay's 240 B each:
    // 3.2 KB, over 1 %.)
    let long = llama_at_s96();
    let composed = tensor_parallel(2, &long, &["--kernels", "composed"]);
    check_all(&composed, 2, "llama tp 2 composed");
    // Gradient checkpointing: the collectives run again in each segment's recomputation, and
    // there (not in the checkpointed forward) hold their tensors; with composed ops `f`'s and
    // `g`'s kept inputs are 4·B·S·H floats a block (196,608 B at S 96, beyond the 1 %
    // tolerance of every window), so a prediction that kept them in the forward, or left them
    // out of the recomputation, fails. (S 96: the checkpointed forward's peak is ≈ 2.4 KB
    // above the replay's in one process too, over 1 % of the S 24 figure.)
    for kernels in ["composed", "transformers"] {
        for segment in ["1", "2"] {
            let doc = tensor_parallel(2, &long, &["--kernels", kernels, "--checkpoint", segment]);
            check_all(
                &doc,
                2,
                &format!("llama tp 2 {kernels} checkpoint {segment}"),
            );
        }
    }
    let whole = ranks(1, 0, LLAMA);
    let st = |d: &Value, r: usize, k: &str| i(&d["ranks"][r]["states"][k]);
    // H 64, I 160, 2 layers: each rank holds half of q, k, v, o, gate, up, down (the blocks'
    // 2·(2·64·64 + 2·32·64 + 3·160·64) = 86,016 elements) and half of the untied table and
    // head (2·256·64), the norms whole. A replicated table and head would be 65,536 B more.
    let halved = 4 * ((86_016 + 2 * 256 * 64) / 2);
    for r in 0..2 {
        let d = st(&whole, 0, "weights_bytes") - st(&doc, r, "weights_bytes");
        assert!(
            (d - halved).abs() < 4096,
            "rank {r} holds {d} B less than the whole model, the halved model is {halved}"
        );
        let (g, p) = (
            st(&doc, r, "gradient_bytes"),
            st(&doc, r, "predicted_gradient_bytes"),
        );
        assert!(
            g >= p && (g - p) < 8192,
            "rank {r}: gradients {g} B, Megatron's vocab-parallel rank {p} B"
        );
    }
    let broken = tensor_parallel(2, LLAMA, &["--tp-skip-f-all-reduce"]);
    assert_caught(&broken, "f without its all-reduce");
}

/// Megatron's sequence parallelism beside tp 2 (`--sp`): the residual stream, the norms and
/// the embedding's output a half of the sequence on each rank, each sublayer's input
/// all-gathered along it and each output reduce-scattered (B 2: the rows reordered through a
/// host buffer around MPI's whole runs), the norms' gradients all-reduced after the backward.
/// Every window as predicted, with checkpointing too and beside 2 replicas under ZeRO 1; each
/// rank's gradients and weights the slices of one process's; the forward keeps less than
/// without `--sp` (the residual stream's and the norms' tensors halved). Without the norms'
/// all-reduce their gradients are one half's, and the check says so.
#[test]
fn sequence_parallel_beside_tp_as_predicted_and_as_one_process() {
    let plain = tensor_parallel(2, LLAMA, &[]);
    let doc = tensor_parallel(2, LLAMA, &["--sp"]);
    assert_eq!(doc["sp"], Value::Bool(true));
    check_all(&doc, 2, "llama tp 2 sp");
    let kept = |d: &Value| i(&d["ranks"][0]["windows"][1]["retained_bytes"]);
    // 2 layers × (the two norms' inputs and outputs and the residual sums) of B·S·H floats a
    // half fewer: at least 2·4·(2·24·64/2)·4 B.
    assert!(
        kept(&plain) - kept(&doc) > 2 * 4 * (2 * 24 * 64 / 2) * 4,
        "the forward keeps {} B with --sp, {} B without",
        kept(&doc),
        kept(&plain)
    );
    let long = llama_at_s96();
    for kernels in ["composed", "transformers"] {
        let doc = tensor_parallel(
            2,
            &long,
            &["--sp", "--kernels", kernels, "--checkpoint", "1"],
        );
        check_all(&doc, 2, &format!("llama tp 2 sp {kernels} checkpoint 1"));
    }
    let replicas = run(4, LLAMA, &["--tp", "2", "--sp", "--zero", "1"]);
    check_all(&replicas, 4, "llama tp 2 sp × dp 2 zero 1");
    let broken = tensor_parallel(2, LLAMA, &["--sp", "--sp-skip-norm-all-reduce"]);
    assert_caught(
        &broken,
        "sequence parallelism without the norms' all-reduce",
    );
}

/// Tensor parallelism beside data parallelism: 4 ranks as 2 replicas of a tp-2 model (tp
/// innermost), each replica on its own rows of the global batch, under ZeRO 0, 1, 2 and 3 over
/// the replicas (Megatron's distributed optimizer beside tp; at 3, FSDP's FULL_SHARD of each tp
/// shard, torchtitan's 2-D layout). Every window as predicted (the shard's replay under the
/// replicas' ZeRO arithmetic, FSDP's units at 3), each rank's shard of the averaged gradients
/// (its run under ZeRO) and of the weights after two steps the slices of one process's on the
/// global batch. Up to ZeRO 2 a rank holds the same shard as a tp-2 rank with one replica;
/// ZeRO 1 halves its optimizer state (to each tensor's run and bookkeeping), ZeRO 2 its
/// gradients too, ZeRO 3 its weights too (the rotary tables and bookkeeping whole), measured
/// and predicted.
#[test]
fn tensor_parallel_beside_data_parallel_as_predicted_and_as_one_process() {
    let alone = tensor_parallel(2, LLAMA, &[]);
    let st = |d: &Value, r: usize, k: &str| i(&d["ranks"][r]["states"][k]);
    for zero in 0..=3u8 {
        let z = zero.to_string();
        let doc = run(4, LLAMA, &["--tp", "2", "--zero", &z]);
        assert_eq!((u(&doc["tp"]), u(&doc["zero"])), (2, zero as u64));
        check_all(&doc, 4, &format!("llama tp 2 × dp 2 zero {zero}"));
        for r in 0..4 {
            let what = format!("zero {zero} rank {r}");
            // Predicted: the tp-2 rank's states, sharded over the 2 replicas as ZeRO shards
            // them (the weights at ZeRO 3, the gradients from 2, the state from 1).
            for (k, from) in [("weights", 3), ("gradient", 2), ("optimizer_state", 1)] {
                let key = format!("predicted_{k}_bytes");
                let (p, p1) = (st(&doc, r, &key), st(&alone, r % 2, &key));
                let want = if zero >= from { (p1 + 1) / 2 } else { p1 };
                assert_eq!(p, want, "{what}: {k} predicted {p}, the tp-2 rank's {p1}");
            }
            let measured = |k: &str| {
                let (x, whole) = (st(&doc, r, k) as f64, st(&alone, r % 2, k) as f64);
                (x - whole / 2.0).abs() / (whole / 2.0)
            };
            let (w, g, s) = (
                measured("weights_bytes"),
                measured("gradient_bytes"),
                measured("optimizer_state_bytes"),
            );
            assert_eq!(s < 0.05, zero >= 1, "{what}: state {s}");
            assert_eq!(g < 0.05, zero >= 2, "{what}: gradients {g}");
            // ZeRO 3's weights: half the shard's parameters, the rotary tables whole.
            assert_eq!(w < 0.15, zero == 3, "{what}: weights {w}");
        }
    }
    // HYBRID_SHARD beside tp, shard groups of one: each replica holds its whole shard and
    // all-reduces it over the other; as predicted and as one process. (S 96: the backward
    // frees the forward's ≈ 2.2 KB of the collectives' op bookkeeping the replay does not
    // charge, over 1 % of the S 24 figure.)
    let long = llama_at_s96();
    let hybrid = run(4, &long, &["--tp", "2", "--zero", "3", "--hsdp", "1"]);
    assert_eq!(u(&hybrid["hsdp_shard_group"]), 1);
    check_all(&hybrid, 4, "llama tp 2 × dp 2 zero 3 hsdp 1");
}

/// Serving with tensor parallelism over 2 ranks (`--tp 2 --phases init,prefill,decode`), K/V
/// heads grouped (4 over 2: one K/V head cached a rank): every window (the shard built, the
/// prompt into the cache, 4 greedy tokens) within tolerance of the replay of the rank's shard
/// with its collectives; each rank's weights vLLM's (the table and head vocab-parallel) and its
/// cache half the whole model's, as predicted; the logits (the prefill's and a cached step's,
/// gathered from the ranks' runs of the vocabulary) those of one process's whole model. Without `g`'s
/// all-reduce each rank sums only its own heads and MLP columns, and the check says so.
#[test]
fn tensor_parallel_serving_on_two_ranks_as_predicted_and_as_one_process() {
    let serving = ["--phases", "init,prefill,decode", "--decode-tokens", "4"];
    let doc = tensor_parallel(2, LLAMA, &serving);
    assert_eq!(window_names(&doc), ["init", "prefill", "decode"]);
    let reports = doc["ranks"].as_array().unwrap();
    let serve = doc["serve"]["ranks"].as_array().unwrap();
    assert_eq!((reports.len(), serve.len()), (2, 2));
    // 2 layers, 1 K/V head of width 16 a rank, f32: 2·2·1·16·4 = 256 B a token; B2 S24, then 4
    // tokens more a row.
    for (r, (rep, s)) in reports.iter().zip(serve).enumerate() {
        for (name, w) in ["init", "prefill", "decode"]
            .iter()
            .zip(rep["windows"].as_array().unwrap())
        {
            let (m, p) = (u(&w["peak_bytes"]), u(&w["predicted_peak_bytes"]));
            assert!(
                common::exact(&format!("serve tp 2 rank {r} {name} peak"), m, p),
                "serve tp 2: rank {r} {name}: peak measured {m}, predicted {p}"
            );
            assert_retained(w, &format!("serve tp 2: rank {r} {name}"));
        }
        // vLLM's vocab-parallel rank (`stage_ranks` at tp 2), plus the rotary tables and the
        // tensors' bookkeeping (12,278 B); a replicated table and head would be 65,536 B more.
        let (w, p) = (
            i(&rep["states"]["weights_bytes"]),
            i(&rep["states"]["predicted_weights_bytes"]),
        );
        assert!(
            w >= p && w - p < 16_384,
            "rank {r}: weights {w} B, vLLM's rank {p} B"
        );
        assert_eq!(u(&s["kv_heads"]), 1);
        assert_eq!(u(&s["kv_bytes_per_token"]), 256);
        assert_eq!(u(&s["kv_cache_bytes_after_prefill"]), 256 * 2 * 24);
        assert_eq!(
            u(&s["predicted_kv_cache_bytes_after_prefill"]),
            256 * 2 * 24
        );
        assert_eq!(u(&s["kv_cache_bytes_after_decode"]), 256 * 2 * 28);
        let d = s["logits_rel_diff"].as_f64().unwrap();
        assert!(d < 1e-5, "rank {r}: logits within {d:e} of one process's");
    }
    // Without a cache the decode recomputes the prefix (on caches of its own): as predicted,
    // the prefill's cache left as it was.
    let recompute = tensor_parallel(2, LLAMA, &[&serving[..], &["--kv-cache", "off"]].concat());
    for (r, rep) in recompute["ranks"].as_array().unwrap().iter().enumerate() {
        let w = &rep["windows"][2];
        let (m, p) = (u(&w["peak_bytes"]), u(&w["predicted_peak_bytes"]));
        assert!(
            common::exact(&format!("serve recompute tp 2 rank {r} decode peak"), m, p),
            "serve tp 2 --kv-cache off: rank {r} decode: peak measured {m}, predicted {p}"
        );
        let s = &recompute["serve"]["ranks"][r];
        assert_eq!(u(&s["kv_cache_bytes_after_decode"]), 256 * 2 * 24);
        assert_eq!(u(&s["predicted_kv_cache_bytes_after_decode"]), 256 * 2 * 24);
    }
    // A narrow MLP (I/tp 64 under H 256): `g`'s partial and reduced outputs make the prefill's
    // peak (the replay without them says 98 KB less).
    let narrow = [
        "--model",
        "llama",
        "--hidden",
        "256",
        "--heads",
        "4",
        "--kv-heads",
        "2",
        "--intermediate",
        "128",
        "--layers",
        "2",
        "--vocab",
        "64",
        "--batch",
        "2",
        "--seq",
        "64",
    ];
    let doc = tensor_parallel(2, &narrow, &serving);
    for (r, rep) in doc["ranks"].as_array().unwrap().iter().enumerate() {
        let w = &rep["windows"][1];
        let (m, p) = (u(&w["peak_bytes"]), u(&w["predicted_peak_bytes"]));
        assert!(
            common::exact(&format!("serve narrow tp 2 rank {r} prefill peak"), m, p),
            "narrow serve tp 2: rank {r} prefill: peak measured {m}, predicted {p}"
        );
    }
    let broken = tensor_parallel(
        2,
        LLAMA,
        &[&serving[..], &["--tp-skip-g-all-reduce"]].concat(),
    );
    assert_eq!(broken["serve"]["g_all_reduce"], Value::Bool(false));
    for (r, s) in broken["serve"]["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        let d = s["logits_rel_diff"].as_f64().unwrap();
        assert!(
            d > 1e-2,
            "rank {r}: g without its all-reduce, yet logits within {d:e} of one process's"
        );
    }
}

/// `--tp` refuses, by name, what it does not split: GPT, heads that do not split into equal
/// parts (SmolLM2-135M's 9 over 3 at 2), a training vocabulary that does not split into equal
/// runs; nothing panics.
#[test]
fn tensor_parallel_refuses_what_it_does_not_split() {
    let gpt = [
        "--hidden", "16", "--heads", "2", "--layers", "1", "--vocab", "50", "--seq", "8",
    ];
    let smol = ["--preset", "smollm2-135m", "--layers", "1", "--seq", "8"];
    let odd_seq: Vec<&str> = LLAMA
        .iter()
        .map(|&a| if a == "24" { "25" } else { a })
        .collect();
    let odd_vocab: Vec<&str> = LLAMA
        .iter()
        .map(|&a| if a == "256" { "255" } else { a })
        .collect();
    for (args, more, says) in [
        (&gpt[..], &["--tp", "2"][..], "LLaMA-family dense decoders"),
        (
            &smol[..],
            &["--tp", "2"][..],
            "9 query heads over 3 K/V heads",
        ),
        (LLAMA, &["--tp-skip-f-all-reduce"][..], "without --tp"),
        (
            LLAMA,
            &["--phases", "prefill,decode"][..],
            "serving on ranks runs with --tp",
        ),
        (
            LLAMA,
            &["--tp", "2", "--phases", "forward,prefill"][..],
            "serving on ranks runs init, prefill and decode",
        ),
        (
            LLAMA,
            &["--tp", "4", "--phases", "prefill,decode"][..],
            "K/V heads are not replicated here",
        ),
        (LLAMA, &["--tp-skip-g-all-reduce"][..], "without --phases"),
        (
            &odd_vocab[..],
            &["--tp", "2"][..],
            "255 does not split into 2 equal runs",
        ),
        (
            LLAMA,
            &["--sp"][..],
            "sequence parallelism runs beside --tp N",
        ),
        (
            LLAMA,
            &["--tp", "2", "--sp", "--zero", "3"][..],
            "not beside --pp, --ep, --zero 3",
        ),
        (
            &odd_seq[..],
            &["--tp", "2", "--sp"][..],
            "25 does not split into 2 equal runs",
        ),
    ] {
        let out = Command::new(assert_cmd::cargo::cargo_bin("memfit"))
            .arg("ranks")
            .args(args)
            .args(more)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{more:?} ran");
        assert!(err.contains(says), "{more:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// `mpirun -np S memfit ranks ARGS --pp S --microbatches M --check --json`.
fn pipeline(stages: usize, m: usize, args: &[&str]) -> Value {
    let (s, m) = (stages.to_string(), m.to_string());
    run(stages, args, &["--pp", &s, "--microbatches", &m])
}

/// Megatron's 1F1B order for stage `s` of `n` with `m` microbatches.
fn one_f_one_b(s: usize, n: usize, m: usize) -> Vec<String> {
    let warmup = (n - s - 1).min(m);
    let mut order: Vec<String> = (0..warmup).map(|i| format!("F{i}")).collect();
    for i in 0..m - warmup {
        order.push(format!("F{}", warmup + i));
        order.push(format!("B{i}"));
    }
    order.extend((m - warmup..m).map(|i| format!("B{i}")));
    order
}

/// Every stage of a pipeline: the schedule is 1F1B; one microbatch's graph and the graph at
/// the schedule's fullest (`min(M, S − s)` microbatches: the first stage holds `S`) as
/// `formula::parallel::stage_activations` predicts them; the stage's weights and optimizer
/// state as predicted; the step's peak at or under its bound (to the tolerance) and within 25 %
/// of it; its gradients
/// and weights equal to one process's on the whole global batch.
fn check_pipeline(doc: &Value, n: usize, m: usize, what: &str) {
    let reports = doc["ranks"].as_array().unwrap();
    assert_eq!(reports.len(), n, "{what}: one report per stage");
    let names = window_names(doc);
    for (s, rep) in reports.iter().enumerate() {
        let order: Vec<String> = rep["schedule"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| format!("{}{}", e["op"].as_str().unwrap(), u(&e["microbatch"])))
            .collect();
        assert_eq!(order, one_f_one_b(s, n, m), "{what}: stage {s}'s order");
        let in_flight = u(&rep["in_flight"]) as usize;
        assert_eq!(in_flight, m.min(n - s), "{what}: stage {s} in flight");
        assert_eq!(u(&rep["predicted_in_flight"]) as usize, in_flight);
        for (k, p) in [
            ("microbatch_graph_bytes", "predicted_microbatch_graph_bytes"),
            ("in_flight_graph_bytes", "predicted_in_flight_graph_bytes"),
        ] {
            let (mv, pv) = (i(&rep[k]) as u64, u(&rep[p]));
            assert!(
                common::exact(&format!("{what} stage {s} {k}"), mv, pv),
                "{what}: stage {s} {k}: measured {mv}, predicted {pv}"
            );
        }
        assert_eq!(
            u(&rep["params"]),
            u(&rep["predicted_params"]),
            "{what}: stage {s} parameters"
        );
        for (name, w) in names.iter().zip(rep["windows"].as_array().unwrap()) {
            let (mv, pv) = (u(&w["peak_bytes"]), u(&w["predicted_peak_bytes"]));
            match *name {
                "init" | "optimizer" => assert!(
                    common::exact(&format!("{what} stage {s} {name} peak"), mv, pv),
                    "{what}: stage {s} {name}: peak measured {mv}, predicted {pv}"
                ),
                // The step's peak is bounded (every microbatch in flight whole): never below
                // the measurement by more than the tolerance, above it by under 25 %.
                _ => assert!(
                    mv <= pv + common::tolerance(mv) && (pv as f64) < 1.25 * mv as f64,
                    "{what}: stage {s} {name}: peak measured {mv}, bound {pv}"
                ),
            }
            assert_retained(w, &format!("{what}: stage {s} {name}"));
        }
        assert_as_one_process(rep, &format!("{what}: stage {s}"));
    }
}

/// Two stages, four microbatches of a LLaMA; three of a GPT, whose tied head's gradient is
/// summed between the first and the last stage.
#[test]
fn pipeline_of_two_stages_as_predicted_and_as_one_process() {
    check_pipeline(&pipeline(2, 4, LLAMA), 2, 4, "llama pp 2");
    check_pipeline(&pipeline(2, 3, GPT), 2, 3, "gpt pp 2");
}

/// A Mixtral slice (the `tests/fixtures/mixtral` config widened: H 64, 4 experts of width 128,
/// 2 per token, 2 sparse layers, V 512), 2 rows of 32 tokens a rank, AdamW.
const MIXTRAL: &[&str] = &[
    "--hf-config",
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/mixtral/config.json"
    ),
    "--hf-set",
    "hidden_size=64",
    "--hf-set",
    "intermediate_size=128",
    "--hf-set",
    "vocab_size=512",
    "--hf-set",
    "max_position_embeddings=64",
    "--batch",
    "2",
    "--seq",
    "32",
    "--optimizer",
    "adamw",
];

/// Expert parallelism inside data parallelism over 2 ranks and 4, on the Mixtral slice (2
/// experts a rank, then 1) and on the wide one (4, then 2): every window within the tolerance of its prediction (the replay of the rank's model
/// on the rows its experts received, plus what the exchanges keep), every rank's gradients and
/// weights after two steps those of one process training the global batch with every expert;
/// each rank receives every row routed to its experts (the rows every rank sent it, summed,
/// are its received rows: k·T of each rank's T tokens in all); a rank holds the dense part and
/// 1/N of the experts; candle's composed ops and the whole backward at once too. Without the
/// dispatch's backward exchange (the rows' gradient never reaches home) or without the experts'
/// gradient divided by the ranks, the check fails.
#[test]
fn expert_parallel_mixtral_as_predicted_and_as_one_process() {
    let ep = |args: &[&str], n: usize, more: &[&str]| {
        // ZeRO 0 unless `more` says (`--ep`'s default).
        let split: Vec<String> = ["--ep".to_string(), n.to_string()]
            .into_iter()
            .chain(more.iter().map(|s| s.to_string()))
            .collect();
        let split: Vec<&str> = split.iter().map(String::as_str).collect();
        run(n, args, &split)
    };
    let weights = |d: &Value, r: usize| i(&d["ranks"][r]["states"]["weights_bytes"]);
    // (args, what, tokens a rank, hidden, experts, width)
    for (args, what, tokens, h, e, w) in [
        (MIXTRAL, "mixtral", 2 * 32, 64, 4, 128),
        (common::MIXTRAL_WIDE, "mixtral wide", 2 * 64, 256, 8, 512),
    ] {
        let whole = ranks(1, 0, args);
        for n in [2usize, 4] {
            let doc = ep(args, n, &[]);
            assert_eq!(u(&doc["ep"]), n as u64);
            check_all(&doc, n, &format!("{what} ep {n}"));
            let routing = doc["ep_routing"].as_array().unwrap();
            assert_eq!(routing.len(), n);
            let (k, layers) = (2, 2);
            for layer in 0..layers {
                let mut received_total = 0;
                for (r, e) in routing.iter().enumerate() {
                    let sent: Vec<u64> = e["sent_rows"][layer]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(u)
                        .collect();
                    assert_eq!(sent.iter().sum::<u64>(), (k * tokens) as u64, "rank {r}");
                    // What every rank sent rank r is what rank r received.
                    let to_r: u64 = routing.iter().map(|o| u(&o["sent_rows"][layer][r])).sum();
                    let got: u64 = e["received_rows"][layer]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(u)
                        .sum();
                    assert_eq!(to_r, got, "layer {layer} rank {r}");
                    received_total += got;
                }
                assert_eq!(received_total, (n * k * tokens) as u64);
            }
            // Each rank holds the whole model less (1 − 1/N) of the experts: 2 layers × E experts
            // × 3·H·I elements, 4 B each (and a few hundred bytes of bookkeeping a variable).
            let experts = 4 * (layers * e * 3 * h * w) as i64;
            let fewer = experts - experts / n as i64;
            // The variables it lacks, each a few hundred bytes of bookkeeping (< 512 B).
            let vars = (layers * e * 3) as i64;
            let slack = 512 * (vars - vars / n as i64);
            for r in 0..n {
                let d = weights(&whole, 0) - weights(&doc, r);
                assert!(
                    (d - fewer).abs() < slack,
                    "{what} ep {n} rank {r} holds {d} B less than the whole model, the experts it lacks are {fewer}"
                );
            }
        }
    }
    // Stock candle's composed ops (nothing released but what the exchanges release) and the
    // whole graph's backward at once.
    let other = ["--kernels", "composed", "--backward", "whole"];
    check_all(
        &ep(common::MIXTRAL_WIDE, 2, &other),
        2,
        "mixtral wide ep 2 composed, whole backward",
    );
    for mutation in ["--ep-skip-dispatch-backward", "--ep-skip-expert-scaling"] {
        let broken = ep(MIXTRAL, 2, &[mutation]);
        assert_caught(&broken, mutation);
    }
    // Every block recomputed in the backward (`--checkpoint 1`): each sparse layer's
    // exchanges run again in its recomputation (the same routing, the same rows), the replay
    // takes each layer's recorded rows again; every window as predicted, the check passes, and
    // the forward keeps far less than without.
    let recomputed = ep(common::MIXTRAL_WIDE, 2, &["--checkpoint", "1"]);
    check_all(&recomputed, 2, "mixtral wide ep 2, every block recomputed");
    let kept = |d: &Value, r: usize| i(&d["ranks"][r]["windows"][1]["retained_bytes"]);
    let plain_ep = ep(common::MIXTRAL_WIDE, 2, &[]);
    for r in 0..2 {
        assert!(
            kept(&recomputed, r) * 3 < kept(&plain_ep, r),
            "rank {r}: the checkpointed forward keeps {} B, without {}",
            kept(&recomputed, r),
            kept(&plain_ep, r)
        );
    }
    // ZeRO 1 and 2 beside expert parallelism (DeepSpeed-MoE's and Megatron-Core's layout):
    // the dense part's state (ZeRO 2: its gradients too) sharded over the ranks, each
    // expert's whole on its owner (its data-parallel group is that rank alone). Every window
    // as predicted, the check passes, and what falls is the dense part's, measured as
    // predicted.
    let at = |d: &Value, r: usize, k: &str| i(&d["ranks"][r]["states"][k]);
    let mut by_stage = vec![plain_ep];
    for zero in ["1", "2"] {
        let doc = ep(common::MIXTRAL_WIDE, 2, &["--zero", zero]);
        assert_eq!(u(&doc["zero"]), zero.parse::<u64>().unwrap());
        check_all(&doc, 2, &format!("mixtral wide ep 2 zero {zero}"));
        by_stage.push(doc);
    }
    for r in 0..2 {
        for (k, stages) in [
            ("optimizer_state_bytes", [0, 1]),
            ("gradient_bytes", [1, 2]),
        ] {
            let [lo, hi] = stages.map(|z| &by_stage[z]);
            let fell = at(lo, r, k) - at(hi, r, k);
            let predicted =
                at(lo, r, &format!("predicted_{k}")) - at(hi, r, &format!("predicted_{k}"));
            assert!(
                predicted > 0 && (fell - predicted).abs() < predicted / 100,
                "rank {r} {k}: fell {fell} B from ZeRO {} to {}, predicted {predicted}",
                stages[0],
                stages[1]
            );
        }
    }
}

/// `--ep` refuses, by name, what it does not split: experts that do not divide (4 over 3),
/// a dense model, ZeRO beside it, tensor parallelism beside it; the testing flags without it.
#[test]
fn expert_parallel_refuses_what_it_does_not_split() {
    for (args, more, says) in [
        (
            MIXTRAL,
            &["--ep", "3"][..],
            "--ep must divide the experts: 2, 4",
        ),
        (LLAMA, &["--ep", "2"][..], "splits a mixture of experts"),
        (MIXTRAL, &["--ep", "2", "--zero", "3"][..], "ZeRO 0, 1 or 2"),
        (MIXTRAL, &["--ep", "2", "--tp", "2"][..], "not run together"),
        (MIXTRAL, &["--ep-skip-expert-scaling"][..], "without --ep"),
    ] {
        let out = Command::new(assert_cmd::cargo::cargo_bin("memfit"))
            .arg("ranks")
            .args(args)
            .args(more)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{more:?} ran");
        assert!(err.contains(says), "{more:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// Data parallelism (ZeRO 0) on the wide Mixtral slice, whose untrained router leaves an expert
/// without a token on one rank here (that rank's `reduce` then holds the expert's zero
/// gradient: 1,572,864 B above the bucket): every rank reduces every variable that has a
/// gradient on any rank, so the collectives match (before, the rank skipped it: Open MPI's
/// `MPI_ERR_TRUNCATE`, then a crash) and the ranks train as one process on the global batch;
/// every window within tolerance of its prediction at the rank's measured routing (the zero
/// gradients included).
#[test]
fn data_parallel_moe_with_an_unused_expert_as_one_process() {
    check_all(&ranks(2, 0, common::MIXTRAL_WIDE), 2, "mixtral wide zero 0");
}
