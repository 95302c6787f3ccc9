//! A sweep split over machines: `run --shard I/N` gives every case to exactly one shard,
//! balanced by predicted cost; `merge` joins the shards' folders into one whose rows equal an
//! unsharded run's (memory figures identical on the CPU), keeps identical duplicates once,
//! refuses conflicting ones, and names unfinished shards.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use memfit::record::Row;

const CASES: &[&str] = &[
    "--model",
    "gpt",
    "--seq",
    "8,12",
    "--hidden",
    "16",
    "--heads",
    "2",
    "--layers",
    "1,2",
    "--vocab",
    "50",
    "--batch",
    "1,3",
    "--threads",
    "1",
    "--quiet",
];

fn memfit() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_memfit"));
    c.env("RAYON_NUM_THREADS", "1").env_remove("MEMFIT_FAULT");
    c
}

fn ok(c: &mut Command) -> String {
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn rows(dir: &Path) -> Vec<Row> {
    memfit::store::jsonl::read(&dir.join("results.jsonl")).unwrap()
}

/// Between two processes the backward's peak (and so the train step's) can differ by a few
/// hundred bytes: candle's gradient store is a `HashMap` with a random seed per process, so
/// the order gradients are summed and freed in varies (seen: 544 B on a 81 KB peak, also in
/// two unsharded runs). Every other figure is identical.
const BACKWARD_JITTER_BYTES: u64 = 1024;

fn assert_same_figures(a: &[Row], b: &[Row]) {
    let (fa, fb) = (figures(a), figures(b));
    assert_eq!(
        fa.keys().collect::<Vec<_>>(),
        fb.keys().collect::<Vec<_>>(),
        "the same case × phase rows"
    );
    for (k, (sa, pa, ra)) in &fa {
        let (sb, pb, rb) = &fb[k];
        assert_eq!((sa, ra), (sb, rb), "{k:?}");
        if k.1 == "backward" || k.1 == "train-step" {
            let d = pa.unwrap().abs_diff(pb.unwrap());
            assert!(d <= BACKWARD_JITTER_BYTES, "{k:?}: {pa:?} vs {pb:?}");
        } else {
            assert_eq!(pa, pb, "{k:?}");
        }
    }
}

/// (case, phase) → (status, peak, retained): what must not depend on sharding.
/// Status, peak and retained bytes of one row.
type Figures = (String, Option<u64>, Option<i64>);

fn figures(rows: &[Row]) -> BTreeMap<(u64, String), Figures> {
    rows.iter()
        .map(|r| {
            (
                (r.case, r.phase.to_string()),
                (
                    r.status.as_str().to_string(),
                    r.peak_bytes,
                    r.retained_bytes,
                ),
            )
        })
        .collect()
}

#[test]
fn shards_cover_every_case_once_and_merge_equals_an_unsharded_run() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ok(memfit()
        .arg("run")
        .args(CASES)
        .arg("--out")
        .arg(d.join("all")));
    let whole = rows(&d.join("all"));

    let mut shard_dirs = Vec::new();
    let mut seen = BTreeSet::new();
    for i in 0..3 {
        let out = d.join(format!("shard-{i}"));
        ok(memfit()
            .arg("run")
            .args(CASES)
            .args(["--shard", &format!("{i}/3"), "--out"])
            .arg(&out));
        for r in rows(&out) {
            assert!(seen.insert((r.case, r.phase)), "case {} twice", r.case);
        }
        let meta: memfit::record::RunMeta =
            serde_json::from_str(&std::fs::read_to_string(out.join("meta.json")).unwrap()).unwrap();
        assert_eq!(
            meta.cluster.shard.as_deref(),
            Some(format!("{i}/3").as_str())
        );
        shard_dirs.push(out);
    }
    assert_eq!(seen.len(), whole.len(), "every case × phase in some shard");

    let merged = d.join("merged");
    let report = ok(memfit()
        .arg("merge")
        .args(&shard_dirs)
        .arg("--out")
        .arg(&merged));
    assert!(report.contains("every shard complete"), "{report}");
    let m = rows(&merged);
    assert_same_figures(&m, &whole);
    let (meta, h5) = memfit::store::hdf5::read(&merged.join("results.h5")).unwrap();
    assert_eq!(h5, m);
    assert_eq!(
        meta.cluster.merged_from.len(),
        3,
        "every shard's metadata kept"
    );
    assert_eq!(std::fs::read_dir(merged.join("shards")).unwrap().count(), 3);
    // fit reads a merged folder like any other.
    ok(memfit().arg("fit").arg(&merged));

    // The same shard twice: identical rows, kept once.
    let again = d.join("again");
    let report = ok(memfit()
        .arg("merge")
        .args(&shard_dirs)
        .arg(&shard_dirs[0])
        .arg("--out")
        .arg(&again));
    assert!(
        report.contains("identical duplicate(s) kept once, 0 conflict(s)"),
        "{report}"
    );
    assert_eq!(rows(&again).len(), whole.len());

    // The unsharded run beside a shard: the same cases measured twice (other times) conflict.
    let o = memfit()
        .arg("merge")
        .arg(&shard_dirs[0])
        .arg(d.join("all"))
        .arg("--out")
        .arg(d.join("conflict"))
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("differ between folders") && err.contains("--on-conflict"),
        "{err}"
    );
    assert!(
        !d.join("conflict").join("results.jsonl").exists(),
        "nothing written"
    );
    let report = ok(memfit()
        .arg("merge")
        .arg(&shard_dirs[0])
        .arg(d.join("all"))
        .args(["--on-conflict", "last", "--out"])
        .arg(d.join("last")));
    assert!(report.contains("the last folder's row kept"), "{report}");
    assert_eq!(rows(&d.join("last")).len(), whole.len());
}

#[test]
fn list_cases_shows_the_balance_and_an_unfinished_shard_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let list = ok(memfit()
        .arg("run")
        .args(CASES)
        .args(["--shard", "1/2", "--list-cases"]));
    assert!(list.contains("← this shard"), "{list}");
    assert_eq!(
        list.lines()
            .filter(|l| l.trim_start().starts_with(char::is_numeric))
            .count(),
        8 + 2
    );
    assert!(!d.join("runs").exists());

    // A shard whose case 0 was killed mid-way: the merge names it.
    let out = d.join("s0");
    let o = memfit()
        .arg("run")
        .args(CASES)
        .args(["--shard", "0/1", "--out"])
        .arg(&out)
        .env("MEMFIT_FAULT", "kill@forward:0")
        .output()
        .unwrap();
    // Every row written, one case crashed: exit 3.
    assert_eq!(o.status.code(), Some(3));
    let report = ok(memfit()
        .arg("merge")
        .arg(&out)
        .arg("--out")
        .arg(d.join("m")));
    assert!(
        report.contains("incomplete shard(s)") && report.contains("case(s) 0 unfinished"),
        "{report}"
    );

    let o = memfit()
        .arg("run")
        .args(CASES)
        .args(["--shard", "2/2"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("`shard`"));
}
