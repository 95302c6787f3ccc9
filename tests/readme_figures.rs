//! Figures the README and BENCHMARKS.md quote from the committed results, read again from them
//! (issue: figures that cannot go stale). Each test names the doc line it checks and fails when
//! either the line or the rows move apart.

mod common;

use std::path::{Path, PathBuf};

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The rows of every `results.jsonl` under `dir` (a folder of `results/`).
fn rows_under(dir: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(rows_under(&p));
        } else if p.file_name().is_some_and(|n| n == "results.jsonl") {
            let text = std::fs::read_to_string(&p).unwrap();
            out.extend(
                text.lines()
                    .map(|l| serde_json::from_str::<Value>(l).unwrap()),
            );
        }
    }
    out
}

/// `doc` (a file at the root) still says `line`.
fn doc_says(doc: &str, line: &str) {
    let text = std::fs::read_to_string(root().join(doc)).unwrap();
    assert!(
        text.contains(line),
        "{doc} no longer says {line:?}: update this test with it"
    );
}

/// Asserts `within(row, |measured − predicted| B, relative %)` for every finished row of `dir`
/// that `wanted` picks and has both figures; returns how many there were.
fn check_rows(
    dir: &str,
    wanted: impl Fn(&Value) -> bool,
    within: impl Fn(&Value, u64, f64) -> bool,
) -> usize {
    let mut seen = 0;
    for r in rows_under(&root().join(dir)) {
        if r["status"] != "ok" || !wanted(&r) {
            continue;
        }
        let (Some(m), Some(p)) = (r["peak_bytes"].as_u64(), r["predicted_peak_bytes"].as_u64())
        else {
            continue;
        };
        let (diff, rel) = (m.abs_diff(p), m.abs_diff(p) as f64 / m as f64 * 100.0);
        assert!(
            within(&r, diff, rel),
            "{} {} case {}: measured {m}, predicted {p}: {diff} B, {rel:.4} %",
            r["preset"],
            r["phase"],
            r["case"]
        );
        seen += 1;
    }
    seen
}

/// README's "GPT-2 small (B 1, S 128): every phase of every committed CPU row within 0.01 %".
#[test]
fn gpt2_small_every_phase_row() {
    doc_says(
        "README.md",
        "GPT-2 small (B 1, S 128): every phase of every committed CPU row within 0.01 %",
    );
    let seen = check_rows(
        "results/cpu",
        |r| r["preset"] == "gpt2-small" && r["device"] == "cpu",
        |_, _, rel| rel <= 0.01,
    );
    assert!(seen >= 6, "only {seen} GPT-2 small rows committed");
}

/// BENCHMARKS.md § 4: "memfit's fused rows are predicted by the replay within 0.40 % on every
/// phase" (the stored torch-compare rows).
#[test]
fn torch_compare_fused_rows_within_their_bound() {
    doc_says(
        "BENCHMARKS.md",
        "memfit's fused rows are predicted by the replay within 0.40 % on every phase",
    );
    let seen = check_rows(
        "results/cpu/torch-compare",
        |r| r["kernels"] == "fused",
        |_, _, rel| rel <= 0.40,
    );
    assert!(seen >= 30, "only {seen} fused torch-compare rows");
}

/// README's textbook paragraph: each formula's mean and max error and its case count, as
/// `memfit fit` evaluates them on the committed CPU rows (`fit::textbook::evaluate`).
#[test]
fn textbook_paragraph() {
    let rows: Vec<memfit::record::Row> = common::journals_under(&root().join("results/cpu"))
        .iter()
        .flat_map(|p| memfit::store::jsonl::read(p).unwrap())
        .collect();
    let all = memfit::fit::textbook::evaluate(&rows);
    let get = |formula: &str| {
        all.iter()
            .find(|t| t.formula == formula)
            .unwrap_or_else(|| panic!("{formula}"))
    };
    let text = std::fs::read_to_string(root().join("README.md"))
        .unwrap()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let mut stale = Vec::new();
    for (formula, said) in [
        (
            "Korthikanti 34+5as/h",
            "by {mean} % on average ({max} % max, {n} cases)",
        ),
        (
            "inference ≈ 2×P (N2)",
            "peak by {mean} % ({max} %, {n} cases)",
        ),
        (
            "Adam 2×P (B2)",
            "holds within {mean} % ({max} %, {n} cases)",
        ),
        (
            "16 B/param (mixed AdamW)",
            "AdamW within {mean} % ({max} %, {n} cases)",
        ),
        (
            "KV cache 2·L·B·T·G·D·e (GQA)",
            "is exact ({mean} %, {n} cases:",
        ),
        (
            "KV cache 2·L·B·T·H·e (N4)",
            "misses it by {mean} % ({max} %)",
        ),
    ] {
        let t = get(formula);
        let line = said
            .replace("{mean}", &format!("{:.2}", t.mean_pct))
            .replace("{max}", &format!("{:.2}", t.max_pct))
            .replace("{n}", &t.cases.to_string());
        if !text.contains(&line) {
            stale.push(format!("{formula}: {line:?} ({t:?})"));
        }
    }
    assert!(
        stale.is_empty(),
        "README's textbook paragraph should say:\n{}",
        stale.join("\n")
    );
}

/// The rows each line of README's accuracy table describes, by the line's first cell.
type Picks = fn(&Value) -> bool;
const ACCURACY_TABLE: [(&str, Picks); 13] = [
    ("`init`", |r| r["phase"] == "init"),
    ("`forward`", |r| r["phase"] == "forward"),
    ("`optimizer`", |r| r["phase"] == "optimizer"),
    ("`backward`", |r| r["phase"] == "backward"),
    ("`train-step`", |r| r["phase"] == "train-step"),
    ("`backward`, `train-step` by block", |r| {
        r["backward"] == "by-block"
            && matches!(r["phase"].as_str(), Some("backward" | "train-step"))
    }),
    ("checkpointed `forward`, `backward`, `train-step`", |r| {
        r["checkpoint"].as_u64().unwrap_or(0) > 0
            && matches!(
                r["phase"].as_str(),
                Some("forward" | "backward" | "train-step")
            )
    }),
    ("LoRA / QLoRA, every phase", |r| {
        r["lora_rank"].as_u64().unwrap_or(0) > 0
    }),
    ("`load`", |r| r["phase"] == "load"),
    ("`prefill`, `decode`", |r| {
        matches!(r["phase"].as_str(), Some("prefill" | "decode"))
    }),
    ("efficient attention, every phase", |r| {
        r["attention"] == "efficient"
    }),
    ("`inference`", |r| r["phase"] == "inference"),
    ("ViT, every phase", |r| r["model"] == "vit"),
];

/// `n` with thousands separators.
fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// README's accuracy table: each line's last cell is the worst error, in bytes and in per cent
/// of the measured peak, over every committed CPU row the line describes (and how many), as
/// computed here from `results/cpu` (a failure prints every line's cell as it should read).
#[test]
fn accuracy_table_is_the_committed_rows() {
    let rows: Vec<Value> = rows_under(&root().join("results/cpu"))
        .into_iter()
        .filter(|r| r["status"] == "ok" && r["device"] == "cpu")
        .filter(|r| r["peak_bytes"].is_u64() && r["predicted_peak_bytes"].is_u64())
        .collect();
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let table = &readme[readme
        .find("| phase | formula | worst error, every committed CPU row")
        .expect("README's accuracy table")..];
    let table = &table[..table.find("\n\n").unwrap_or(table.len())];
    let mut wrong = Vec::new();
    let mut cells = Vec::new();
    for (label, picks) in ACCURACY_TABLE {
        let (mut bytes, mut pct, mut n) = (0u64, 0f64, 0usize);
        for r in rows.iter().filter(|r| picks(r)) {
            let (m, p) = (
                r["peak_bytes"].as_u64().unwrap(),
                r["predicted_peak_bytes"].as_u64().unwrap(),
            );
            bytes = bytes.max(m.abs_diff(p));
            pct = pct.max(m.abs_diff(p) as f64 / m.max(1) as f64 * 100.0);
            n += 1;
        }
        assert!(n > 0, "{label}: no committed rows");
        let cell = format!("≤ {} B; ≤ {pct:.2} % ({n} rows)", thousands(bytes));
        let line = table
            .lines()
            .find(|l| l.starts_with(&format!("| {label} |")));
        if !line.is_some_and(|l| l.ends_with(&format!("| {cell} |"))) {
            wrong.push(label);
        }
        cells.push(format!("{label}: {cell}"));
    }
    assert!(
        wrong.is_empty(),
        "README's accuracy table is stale for {wrong:?}; the cells should read:\n{}",
        cells.join("\n")
    );
}

/// README's F3 example (a LLaMA-7B-shaped GPT at B 4 × S 4096 in bf16 on CUDA, without and with
/// checkpointing every block): its graph and training-step figures are what `memfit predict`
/// says now.
#[test]
fn f3_example_is_the_prediction() {
    let out = common::memfit()
        .args([
            "predict",
            "--preset",
            "llama-7b-shape",
            "--batch",
            "4",
            "--seq",
            "4096",
        ])
        .args([
            "--dtype",
            "bf16",
            "--device",
            "cuda",
            "--checkpoint",
            "0,1",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let cases: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(cases.len(), 2);
    let gib = |c: &Value, k: &str| {
        format!(
            "{:.2} GiB",
            c[k].as_u64().unwrap() as f64 / (1u64 << 30) as f64
        )
    };
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    for line in [
        format!(
            "the default attention (the tiled one on CUDA) keeps {} of activations",
            gib(&cases[0], "graph_bytes")
        ),
        format!(
            "brings the graph to {} and the training step to {} ({}",
            gib(&cases[1], "graph_bytes"),
            gib(&cases[1], "train_total_bytes"),
            gib(&cases[0], "train_total_bytes")
        ),
    ] {
        assert!(
            flat.contains(&line),
            "README no longer says {line:?}: update it"
        );
    }
}

/// README's quick-start table is the committed default run's GPT-2 small rows as `memfit run`
/// prints them (`results/cpu-xeon/default`, every column), and it names the machine its meta
/// records: on failure the expected block is printed.
#[test]
fn quick_start_table_is_the_committed_rows() {
    let dir = root().join("results/cpu-xeon/default");
    let meta: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
    assert!(
        meta["cpu_model"].as_str().unwrap().contains("Xeon"),
        "{meta}"
    );
    assert_eq!(meta["cores"], 2);
    doc_says(
        "README.md",
        "runs in 19 s on a 2-core Intel Xeon (2 threads",
    );
    let rows = memfit::store::jsonl::read(&dir.join("results.jsonl")).unwrap();
    assert!(
        rows.iter()
            .all(|r| r.preset != "gpt2-small" || r.tied == "on")
    );
    let lines: Vec<String> = rows
        .iter()
        .filter(|r| r.preset == "gpt2-small")
        .map(memfit::report::table::line)
        .collect();
    assert!(lines.len() >= 6, "{} GPT-2 small rows", lines.len());
    let block = format!("{}\n{}", memfit::report::table::header(), lines.join("\n"));
    let text = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(
        text.contains(&block),
        "README's quick-start table is not the committed rows; it should read:\n{block}"
    );
}

/// README's "Size your model" example is this binary's output for its command, every line.
#[test]
fn size_your_model_example_is_the_output() {
    let args = [
        "predict",
        "--hf-config",
        "workloads/configs/llama-3-8b.json",
        "--batch",
        "1",
        "--seq",
        "4096",
        "--device",
        "cuda:0",
        "--fit-in",
        "80GiB",
    ];
    doc_says("README.md", &format!("memfit {}", args.join(" ")));
    let out = common::memfit()
        .current_dir(root())
        .args(args)
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert!(text.contains("dtype bf16: the checkpoint's"), "{text}");
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(
        readme.contains(&format!("```\n{}```", text)),
        "README's size-your-model block is not this output; it should read:\n{text}"
    );
}
