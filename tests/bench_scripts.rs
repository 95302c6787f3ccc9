//! The benchmark scripts (`scripts/bench-*.sh`), each once at a tiny size so they keep working:
//! the test's own binary in both roles (`MEMFIT_BENCH_BIN`, so nothing is built), and the
//! summaries checked for their tables. The figures of a smoke run are not benchmarks (the
//! scripts say so); BENCHMARKS.md has the real ones. One figure is checked because it cannot
//! depend on speed: valgrind massif's exact peak heap (`--peak-inaccuracy=0`) sees every byte
//! memfit's counting allocator sees, plus the C `malloc`s that bypass it, so it is at least
//! memfit's process peak and at most 1 MiB above it on a tiny case.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `scripts/NAME` at a tiny size with `env`; returns its stdout, after asserting success.
fn bench(name: &str, work: &Path, env: &[(&str, &str)]) -> String {
    let out = Command::new("bash")
        .arg(root().join("scripts").join(name))
        .env("MEMFIT_BENCH_BIN", env!("CARGO_BIN_EXE_memfit"))
        .env("RAYON_NUM_THREADS", "1")
        .env("WORK", work)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let (so, se) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "{name} failed ({}):\nstdout:\n{so}\nstderr:\n{se}",
        out.status
    );
    assert!(
        se.contains("smoke run"),
        "{name} did not say it is a smoke run:\n{se}"
    );
    so
}

#[test]
fn overhead_script_prints_its_tables() {
    let dir = tempfile::tempdir().unwrap();
    let so = bench(
        "bench-overhead.sh",
        dir.path(),
        &[
            ("PAIRS", "1"),
            ("BIG_PAIRS", "0"),
            ("SMALL_CASE", "--preset tiny --batch 1 --seq 8"),
            ("ISO_CASES", "2"),
            ("ISO_SEQS", "2"),
        ],
    );
    assert!(so.contains("== meter overhead"), "{so}");
    assert!(
        so.lines()
            .any(|l| l.starts_with("tiny-B1-S8 ") && l.contains("overhead  window")),
        "{so}"
    );
    assert!(
        so.contains("== isolation: a process per case (2 tiny inference cases, 2 ok)"),
        "{so}"
    );
    assert!(so.contains("spawn to hello"), "{so}");
}

#[test]
fn profilers_script_agrees_with_massif() {
    let dir = tempfile::tempdir().unwrap();
    let so = bench(
        "bench-profilers.sh",
        dir.path(),
        &[("CASE", "--preset tiny --batch 1 --seq 8")],
    );
    let grab = |prefix: &str| -> u64 {
        let line = so
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line in:\n{so}"));
        line[prefix.len()..]
            .split_whitespace()
            .next()
            .unwrap()
            .replace(',', "")
            .parse()
            .unwrap_or_else(|e| panic!("{line}: {e}"))
    };
    let memfit = grab("memfit (native)");
    let massif = grab("massif mem_heap_B");
    assert!(memfit > 0, "{so}");
    assert!(
        massif >= memfit && massif - memfit <= 1 << 20,
        "massif {massif} B vs memfit {memfit} B:\n{so}"
    );
    assert!(so.contains("heaptrack (2 decimals)"), "{so}");
}

#[test]
fn speed_script_prints_its_tables() {
    let dir = tempfile::tempdir().unwrap();
    let so = bench(
        "bench-speed.sh",
        dir.path(),
        &[
            ("DEFAULT_SWEEP", "0"),
            ("TINY_B", "1"),
            ("TINY_SEQS", "2"),
            ("SCALING", "0"),
            ("PREDICT_PRESET", "llama-tiny"),
            ("PREDICT_B", "1"),
            ("PREDICT_S", "16"),
        ],
    );
    assert!(so.contains("tiny sweep: 2 cases in"), "{so}");
    assert!(so.contains("cases/min"), "{so}");
    assert!(so.contains("predict llama-tiny B 1 S 16,"), "{so}");
}

/// The PyTorch comparison installs PyTorch, so CI only checks that it refuses to run there and
/// that the reference scripts (PyTorch's models, accelerate's estimate) compile.
#[test]
fn torch_scripts_stay_out_of_ci_and_compile() {
    let out = Command::new("bash")
        .arg(root().join("scripts/bench-torch.sh"))
        .env("CI", "1")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not in CI"));
    let saved = Command::new("bash")
        .arg(root().join("scripts/bench-saved.sh"))
        .env("CI", "1")
        .output()
        .unwrap();
    assert!(saved.status.success());
    assert!(String::from_utf8_lossy(&saved.stderr).contains("not in CI"));
    let py = Command::new("python3")
        .args(["-m", "py_compile"])
        .arg(root().join("scripts/torch_reference.py"))
        .arg(root().join("scripts/torch_saved.py"))
        .arg(root().join("scripts/accelerate_estimate.py"))
        .env(
            "PYTHONPYCACHEPREFIX",
            std::env::temp_dir().join("memfit-pycache"),
        )
        .status()
        .unwrap();
    assert!(py.success());
}

/// `bench-predict.sh` at a tiny size: a row per model with its sequence, both modes and the
/// ratio to the reference; a model memfit refuses is a row saying why.
#[test]
fn predict_script_prints_its_table() {
    let dir = tempfile::tempdir().unwrap();
    let so = bench(
        "bench-predict.sh",
        dir.path(),
        &[
            ("PRESETS", "llama-tiny vit-tiny"),
            ("CONFIGS", ""),
            ("REFERENCE", "llama-tiny"),
            ("RUNS", "1"),
        ],
    );
    assert!(
        so.contains("| llama-tiny | 112 |") && so.contains("| 1.0× |"),
        "{so}"
    );
    assert!(so.contains("| vit-tiny | image |"), "{so}");
    let o = Command::new("bash")
        .arg(root().join("scripts/bench-predict.sh"))
        .env("MEMFIT_BENCH_BIN", env!("CARGO_BIN_EXE_memfit"))
        .envs([
            ("PRESETS", "llama-tiny"),
            ("CONFIGS", ""),
            ("REFERENCE", "llama-tiny"),
            ("RUNS", "1"),
            ("SEQ", "100000"),
        ])
        .output()
        .unwrap();
    let so = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{so}");
    assert!(so.contains("| llama-tiny | 100000 | refused: "), "{so}");
}
