//! `memfit report` on a small generated result set: the files it writes, the claims table with
//! every claim ID, the hardware comparison with two sets; and `memfit predict --calibration` on
//! the same rows (applied, and refused where the calibration has no rows).

mod common;

use common::{memfit, run_rows};
use predicates::prelude::*;

/// A tiny decoder over three batch sizes, every phase but load, two optimizers, both caches.
fn results(dir: &std::path::Path) -> std::path::PathBuf {
    let rows = run_rows(
        dir,
        &[
            "--hidden",
            "16",
            "--heads",
            "2",
            "--layers",
            "1",
            "--vocab",
            "50",
            "--seq",
            "8",
            "--batch",
            "1,2,3",
            "--optimizer",
            "sgd,adamw",
            "--kv-cache",
            "on,off",
            "--decode-tokens",
            "2",
            "--phases",
            "init,forward,backward,optimizer,train-step,inference,prefill,decode",
        ],
    );
    assert!(rows.len() == 3 * 2 * 2 * 8, "{} rows", rows.len());
    dir.join("out")
}

#[test]
fn report_writes_markdown_html_plots_and_every_claim() {
    let dir = tempfile::tempdir().unwrap();
    let res = results(dir.path());
    let out = dir.path().join("rep");
    memfit()
        .arg("report")
        .arg(&res)
        .arg(res.join("results.jsonl"))
        .arg("--out")
        .arg(&out)
        .assert()
        .success()
        .stdout(predicate::str::contains("report.md"));
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    for section in [
        "## Environment",
        "## Per phase",
        "## Fits with held-out errors",
        "## Textbook formulas",
        "## Claims",
        "## Hardware comparison",
        "## Plots",
    ] {
        assert!(md.contains(section), "report.md lacks {section}");
    }
    // Every claim ID, once, as the first cell of a row of the claims table.
    let claims = &md[md.find("## Claims").unwrap()..md.find("## Hardware").unwrap()];
    for (id, _) in memfit::report::claims::IDS {
        assert_eq!(
            claims.matches(&format!("\n| {id} |")).count(),
            1,
            "claim {id} in the claims table"
        );
    }
    // Data-loading claims have no rows here: said, not invented.
    assert!(claims.contains("| D1 |") && claims.contains("not measured in these results"));
    // B1 is measured on these rows: no "not measured" in its line.
    let b1 = claims.lines().find(|l| l.starts_with("| B1 |")).unwrap();
    assert!(
        b1.contains("B/param") && !b1.contains("not measured"),
        "{b1}"
    );
    // Two sets side by side in the hardware comparison.
    let label = res.display().to_string();
    assert!(md.contains(&format!("{label} achieved")));
    assert!(md.contains(&format!("{} achieved", res.join("results.jsonl").display())));
    // Plots as SVG and PNG, inlined in the HTML.
    for name in [
        "predicted_vs_measured",
        "memory_vs_batch",
        "breakdown",
        "kv_cache",
        "optimizers",
    ] {
        let svg = std::fs::read_to_string(out.join(format!("{name}.svg"))).unwrap();
        assert!(svg.contains("<svg"), "{name}.svg");
        let png = std::fs::read(out.join(format!("{name}.png"))).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "{name}.png");
        assert!(md.contains(&format!("({name}.svg)")));
    }
    assert!(html.starts_with("<!DOCTYPE html>") && html.matches("<svg").count() >= 5);
    assert!(!html.contains("<img"), "the HTML needs no other file");
    assert!(
        html.contains("measured peak (MiB)"),
        "axis labels with units"
    );
}

#[test]
fn report_refuses_a_missing_folder() {
    let dir = tempfile::tempdir().unwrap();
    memfit()
        .args(["report", "no/such/results", "--out"])
        .arg(dir.path())
        .assert()
        .failure()
        .stderr(
            predicate::str::contains("no/such/results").and(predicate::str::contains("no such")),
        );
}

#[test]
fn predict_calibrates_from_stored_rows_and_refuses_what_they_lack() {
    let dir = tempfile::tempdir().unwrap();
    let res = results(dir.path());
    let shape = [
        "predict",
        "--hidden",
        "16",
        "--heads",
        "2",
        "--layers",
        "1",
        "--vocab",
        "50",
        "--seq",
        "8",
        "--batch",
        "5",
        "--threads",
        "1",
        "--calibration",
    ];
    memfit().args(shape).arg(&res).assert().success().stdout(
        predicate::str::contains("calibrated")
            .and(predicate::str::contains("train-step analytical"))
            .and(predicate::str::contains("held out mean/max")),
    );
    // The calibration holds CPU f32 rows only.
    memfit()
        .args(shape)
        .arg(&res)
        .args(["--device", "cuda:0", "--dtype", "bf16"])
        .assert()
        .failure()
        .stderr(
            predicate::str::contains("no measured rows for phase")
                .and(predicate::str::contains("on cuda in bf16"))
                .and(predicate::str::contains("init/cpu/f32")),
        );
}
