//! Fuzzing the workload parser and the case expander: 10,000 generated workload files — every
//! key, values of every type, in and out of range, valid names and junk, lists — must parse and
//! expand without a panic, and every error must name a key.

use memfit::workload::{self, GridSpec};
use proptest::prelude::*;

/// Every grid key (`GridSpec`'s fields).
const KEYS: &[&str] = &[
    "model",
    "preset",
    "batch",
    "seq",
    "max_seq",
    "hidden",
    "heads",
    "layers",
    "vocab",
    "optimizer",
    "phases",
    "dtype",
    "device",
    "checkpoint",
    "attention",
    "precision",
    "lora_rank",
    "lora_targets",
    "lora_base",
    "optimizer_block",
    "decode_tokens",
    "kv_cache",
    "weights",
    "load",
    "image",
    "patch",
    "channels",
    "classes",
    "dataset",
    "workers",
    "worker_kind",
    "prefetch",
    "storage",
    "persistent",
    "epochs",
    "crop",
];

/// Words the keys accept somewhere, and junk.
const WORDS: &[&str] = &[
    "gpt",
    "vit",
    "tiny",
    "small",
    "gpt2-small",
    "vit-tiny",
    "custom",
    "adamw",
    "sgd",
    "adamw-8bit",
    "init",
    "forward",
    "backward",
    "train-step",
    "inference",
    "prefill",
    "decode",
    "load",
    "dataload",
    "f32",
    "f16",
    "bf16",
    "cpu",
    "cuda:0",
    "cuda:x",
    "standard",
    "efficient",
    "pure",
    "mixed",
    "q",
    "v",
    "all",
    "fc1",
    "detach",
    "op",
    "q4_0",
    "on",
    "off",
    "model",
    "read",
    "mmap",
    "thread",
    "process",
    "ram",
    "stream",
    "",
    "??",
    "é",
    "1e3",
];

fn scalar() -> impl Strategy<Value = String> {
    prop_oneof![
        (-3i64..40).prop_map(|n| n.to_string()),
        prop_oneof![
            Just(0i64),
            Just(1 << 20),
            Just(1 << 40),
            Just(i64::MAX),
            Just(i64::MIN)
        ]
        .prop_map(|n| n.to_string()),
        prop::sample::select(WORDS).prop_map(|w| format!("{w:?}")),
        any::<bool>().prop_map(|b| b.to_string()),
        (-1e3f64..1e3).prop_map(|f| format!("{f:.2}")),
    ]
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => scalar(),
        1 => prop::collection::vec(scalar(), 0..3).prop_map(|v| format!("[{}]", v.join(", "))),
    ]
}

/// A value the key accepts (so that generated files also get deep into the expander).
fn valid(key: &'static str) -> BoxedStrategy<String> {
    let words = |w: &'static [&'static str]| {
        prop::sample::select(w)
            .prop_map(|w| format!("{w:?}"))
            .boxed()
    };
    match key {
        "model" => words(&["gpt", "vit"]),
        "preset" => words(&["tiny", "small", "vit-tiny", "gpt2-small"]),
        "optimizer" => words(&["sgd", "sgd-momentum", "adam", "adamw", "adamw-8bit"]),
        "phases" => prop::sample::subsequence(
            vec![
                "init",
                "forward",
                "backward",
                "optimizer",
                "train-step",
                "inference",
                "prefill",
                "decode",
                "load",
            ],
            1..4,
        )
        .prop_map(|v| format!("{v:?}"))
        .boxed(),
        "dtype" => words(&["f32", "f16"]),
        "device" => words(&["cpu"]),
        "attention" => words(&["standard", "efficient"]),
        "precision" => words(&["pure", "mixed"]),
        "lora_targets" => words(&["q", "all"]).prop_map(|w| format!("[{w}]")).boxed(),
        "lora_base" => words(&["detach", "op", "q4_0", "q8_0", "q4_k", "q6_k", "fp8"]),
        "kv_cache" | "persistent" => words(&["on", "off"]),
        "weights" => words(&["model", "f16", "q8_0", "q4_0", "q4_k", "q6_k", "fp8"]),
        "load" => words(&["read", "mmap"]),
        "dataset" => words(&["data/none"]),
        "worker_kind" => words(&["thread", "process"]),
        "storage" => words(&["ram", "mmap", "stream"]),
        _ => prop_oneof![
            (1i64..9).prop_map(|n| n.to_string()),
            (1i64..3).prop_map(|n| format!("[{n}, {}]", n * 2))
        ]
        .boxed(),
    }
}

fn table() -> impl Strategy<Value = Vec<(&'static str, String)>> {
    let entry = prop::sample::select(KEYS)
        .prop_flat_map(|k| prop_oneof![1 => value(), 3 => valid(k)].prop_map(move |v| (k, v)));
    prop::collection::vec(entry, 0..6)
}

/// A workload file: top-level keys, `[defaults]`, up to three `[[grid]]` tables.
fn workload_text() -> impl Strategy<Value = (String, Vec<&'static str>)> {
    (
        prop::option::of(-2i64..9),
        prop::option::of(prop_oneof![Just(-1.0f64), Just(0.0), Just(2.5), Just(1e12)]),
        table(),
        prop::collection::vec(table(), 0..3),
    )
        .prop_map(|(threads, timeout, defaults, grids)| {
            let mut text = String::new();
            let mut used = Vec::new();
            if let Some(t) = threads {
                text += &format!("threads = {t}\n");
                used.push("threads");
            }
            if let Some(t) = timeout {
                text += &format!("case_timeout = {t:?}\n");
                used.push("case_timeout");
            }
            let mut put = |text: &mut String, head: &str, kv: &[(&'static str, String)]| {
                *text += head;
                let mut seen = std::collections::HashSet::new();
                for (k, v) in kv {
                    // A key twice in a table is a TOML error of its own; keep one.
                    if seen.insert(*k) {
                        *text += &format!("{k} = {v}\n");
                        used.push(*k);
                    }
                }
            };
            put(&mut text, "[defaults]\n", &defaults);
            for g in &grids {
                put(&mut text, "[[grid]]\n", g);
            }
            (text, used)
        })
}

/// Generated files that expanded to cases (printed by the test, to see how deep it got).
static EXPANDED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[test]
fn some_generated_files_expand() {
    // Run the property first, then look at the count: a generator that only made broken
    // files would not test the expander.
    any_workload_parses_and_expands_without_a_panic_and_errors_name_a_key();
    let n = EXPANDED.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("{n} of 10000+ generated workloads expanded to cases");
    assert!(n >= 200, "only {n} generated workloads expanded");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn any_workload_parses_and_expands_without_a_panic_and_errors_name_a_key(
        (text, used) in workload_text()
    ) {
        let result = workload::parse(&text, "fuzz.toml").and_then(|file| {
            let flags = GridSpec::default();
            workload::expand_for_prediction(&file, &flags, "fuzz.toml")?;
            workload::expand(&file, &flags, "fuzz.toml")
        });
        if let Ok(cases) = &result {
            EXPANDED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            prop_assert!(!cases.is_empty());
        }
        if let Err(e) = result {
            let msg = e.to_string();
            prop_assert!(msg.starts_with("fuzz.toml"), "the file is named: {msg}");
            let names_a_key = used.iter().any(|k| msg.contains(k))
                || KEYS.iter().chain(&["threads", "case_timeout"]).any(|k| msg.contains(&format!("{k}`")));
            prop_assert!(names_a_key, "no key named in: {msg}\n--- input:\n{text}");
        }
    }
}
