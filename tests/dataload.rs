//! Data loading (claims D1–D6): the synthetic dataset is deterministic, the pipeline's batches
//! have the right shapes and value ranges and do not depend on who makes them (main thread,
//! threads, processes), the process-tree meter counts a child's memory (PSS once for shared
//! pages), and a worker-count sweep runs end to end.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{memfit, run_rows};
use memfit::data::dataset::{self, Format, Spec};
use memfit::data::pipeline::value_range;
use memfit::data::workers::run_epochs;
use memfit::data::{DataCase, Storage, WorkerKind};
use memfit::meter::proctree::{process_mem, tree_mem};
use memfit::record::Status;

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_memfit"))
}

fn small(dir: &Path, count: usize, seed: u64) -> dataset::Manifest {
    dataset::make(
        dir,
        &Spec {
            seed,
            count,
            min_px: 40,
            max_px: 72,
            formats: vec![Format::Jpeg, Format::Png],
        },
    )
    .unwrap()
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir.join("images"))
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn dataset_bytes_depend_only_on_the_seed() {
    let t = tempfile::tempdir().unwrap();
    let (a, b, c) = (t.path().join("a"), t.path().join("b"), t.path().join("c"));
    let ma = small(&a, 6, 11);
    let mb = small(&b, 6, 11);
    small(&c, 6, 12);
    assert_eq!(ma, mb);
    let pack = |d: &Path| std::fs::read(d.join("pack.bin")).unwrap();
    assert_eq!(pack(&a), pack(&b));
    assert_ne!(pack(&a), pack(&c));
    assert_eq!(files(&a), files(&b));
    // Loose files and the pack hold the same encodings; formats alternate.
    let p = pack(&a);
    for (e, (name, bytes)) in ma.entries.iter().zip(files(&a)) {
        assert!(e.file.ends_with(&name));
        assert_eq!(
            &p[e.offset as usize..(e.offset + e.len) as usize],
            &bytes[..]
        );
    }
    assert_eq!(ma.entries[0].format, Format::Jpeg);
    assert_eq!(ma.entries[1].format, Format::Png);
    assert_eq!(ma.pack_bytes as usize, p.len());
    // A second make into the same folder is refused.
    assert!(
        dataset::make(
            &a,
            &Spec {
                seed: 11,
                count: 6,
                min_px: 40,
                max_px: 72,
                formats: vec![Format::Png]
            }
        )
        .is_err()
    );
}

fn case(dir: &Path, workers: usize, kind: WorkerKind, storage: Storage) -> DataCase {
    DataCase {
        dataset: dir.to_path_buf(),
        workers,
        kind,
        prefetch: 2,
        storage,
        persistent: false,
        epochs: 2,
        batch: 5,
        crop: 24,
        seed: 3,
    }
}

fn batches(c: &DataCase) -> Vec<(u64, usize, Vec<f32>)> {
    let mut out = Vec::new();
    let stats = run_epochs(c, &exe(), |epoch, data, n| {
        out.push((epoch, n, data));
        Ok(())
    })
    .unwrap();
    assert_eq!(stats.images, 2 * 12);
    assert_eq!(stats.batches as usize, out.len());
    out
}

#[test]
fn batches_have_their_shapes_ranges_and_do_not_depend_on_the_workers() {
    let t = tempfile::tempdir().unwrap();
    small(t.path(), 12, 5);
    let main = batches(&case(t.path(), 0, WorkerKind::Thread, Storage::Ram));
    // 12 images in batches of 5 → 5, 5, 2 per epoch, two epochs.
    let sizes: Vec<(u64, usize)> = main.iter().map(|(e, n, _)| (*e, *n)).collect();
    assert_eq!(sizes, vec![(0, 5), (0, 5), (0, 2), (1, 5), (1, 5), (1, 2)]);
    let plane = 24 * 24;
    for (_, n, data) in &main {
        assert_eq!(data.len(), n * 3 * plane);
        for img in data.chunks_exact(3 * plane) {
            for c in 0..3 {
                let (lo, hi) = value_range(c);
                let ch = &img[c * plane..(c + 1) * plane];
                assert!(
                    ch.iter()
                        .all(|v| v.is_finite() && *v >= lo - 1e-5 && *v <= hi + 1e-5)
                );
                let (mn, mx) = ch
                    .iter()
                    .fold((f32::MAX, f32::MIN), |(a, b), v| (a.min(*v), b.max(*v)));
                assert!(mx > mn, "a channel of real content is not constant");
            }
        }
    }
    // Epochs differ (shuffle and augmentation), the same epoch is reproduced exactly by every
    // worker arrangement and storage mode.
    assert_ne!(main[0].2, main[3].2);
    for (w, kind, storage) in [
        (2, WorkerKind::Thread, Storage::Mmap),
        (1, WorkerKind::Thread, Storage::Stream),
        (2, WorkerKind::Process, Storage::Ram),
        (2, WorkerKind::Process, Storage::Mmap),
        (1, WorkerKind::Process, Storage::Stream),
    ] {
        let mut c = case(t.path(), w, kind, storage);
        c.persistent = w == 2;
        assert_eq!(batches(&c), main, "{w} {kind:?} {storage:?}");
    }
}

/// A worker process on `dataset` in `storage` mode; returns it once it has served one job of
/// `indices` (so its dataset is open and those images were read).
fn worker(dataset: &Path, storage: &str, indices: &str) -> std::process::Child {
    let mut child = Command::new(exe())
        .args(["dataload-worker", "--dataset"])
        .arg(dataset)
        .args(["--storage", storage, "--crop", "16", "--seed", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.as_mut().unwrap(), "0 0 {indices}").unwrap();
    child.stdin.as_mut().unwrap().flush().unwrap();
    let out = child.stdout.as_mut().unwrap();
    let mut head = [0u8; 16];
    out.read_exact(&mut head).unwrap();
    let n = u64::from_ne_bytes(head[8..].try_into().unwrap());
    assert_ne!(n, u64::MAX, "the worker reported an error");
    let mut body = vec![0u8; n as usize * 4];
    out.read_exact(&mut body).unwrap();
    child
}

fn stop(mut child: std::process::Child) {
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
}

#[test]
fn process_tree_memory_counts_a_child_and_shared_pages_once() {
    let t = tempfile::tempdir().unwrap();
    // Noisy PNGs: ≈ 3 bytes per pixel, a pack of a few MiB.
    let m = dataset::make(
        t.path(),
        &Spec {
            seed: 9,
            count: 24,
            min_px: 192,
            max_px: 192,
            formats: vec![Format::Png],
        },
    )
    .unwrap();
    let pack = m.pack_bytes;
    assert!(pack > 2 << 20, "pack of {pack} B");
    let all: Vec<String> = (0..24).map(|i| i.to_string()).collect();
    let all = all.join(",");

    // ram: the child reads the whole pack into its heap: private, touched bytes.
    let child = worker(t.path(), "ram", "0");
    let pid = child.id();
    let mine = process_mem(pid).unwrap();
    assert!(
        mine.rss_bytes >= pack,
        "child RSS {} < pack {pack}",
        mine.rss_bytes
    );
    assert!(
        mine.pss_bytes >= pack,
        "child PSS {} < pack {pack}",
        mine.pss_bytes
    );
    let (tree, n) = tree_mem(std::process::id());
    assert!(n >= 2, "the tree holds this process and the child");
    assert!(
        tree.rss_bytes
            >= mine.rss_bytes + process_mem(std::process::id()).map_or(0, |m| m.rss_bytes) / 2
    );
    stop(child);

    // mmap: two children map the same pack and read every image: its pages are resident in
    // both (RSS counts them twice) but shared (PSS once).
    let a = worker(t.path(), "mmap", &all);
    let b = worker(t.path(), "mmap", &all);
    let (ma, mb) = (process_mem(a.id()).unwrap(), process_mem(b.id()).unwrap());
    let rss = ma.rss_bytes + mb.rss_bytes;
    let pss = ma.pss_bytes + mb.pss_bytes;
    assert!(
        rss - pss >= pack * 9 / 10,
        "RSS {rss} − PSS {pss} should hold at least one pack ({pack} B) counted twice"
    );
    assert!(ma.rss_bytes >= pack && mb.rss_bytes >= pack);
    stop(a);
    stop(b);
}

#[test]
fn worker_sweep_runs_end_to_end_and_bad_input_names_the_key() {
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    memfit()
        .args(["dataset", "make", "--out"])
        .arg(&data)
        .args(["--count", "10", "--size", "40-64", "--seed", "2"])
        .assert()
        .success();
    let d = data.to_str().unwrap();
    let rows = run_rows(
        t.path(),
        &[
            "--phases",
            "dataload",
            "--dataset",
            d,
            "--workers",
            "0,1,2",
            "--worker-kind",
            "thread,process",
            "--batch",
            "4",
            "--crop",
            "16",
            "--epochs",
            "2",
            "--storage",
            "mmap",
        ],
    );
    // workers 0 once, then 1 and 2 for each kind.
    let got: Vec<(u64, &str)> = rows
        .iter()
        .map(|r| (r.workers.unwrap(), r.worker_kind.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, "main"),
            (1, "thread"),
            (2, "thread"),
            (1, "process"),
            (2, "process")
        ]
    );
    for r in &rows {
        assert_eq!(r.status, Status::Ok, "{:?}", r.error);
        assert_eq!(r.phase, memfit::step::Phase::Dataload);
        assert_eq!(r.images, Some(20));
        assert!(r.images_per_s.unwrap() > 0.0);
        assert!(r.pss_peak_bytes.unwrap() > 0);
        assert!(r.tree_rss_peak_bytes.unwrap() >= r.pss_peak_bytes.unwrap() / 2);
        assert!(r.tree_processes_count.unwrap() >= 1);
        assert_eq!(r.predicted_peak_bytes, None);
        assert_eq!(r.h2d_pinned_bytes_per_s, None, "no device copy on the CPU");
        assert_eq!(
            (r.storage.as_str(), r.crop_px, r.epochs),
            ("mmap", Some(16), Some(2))
        );
    }
    // The CSV and HDF5 stores carry the data columns.
    let csv = std::fs::read_to_string(t.path().join("out/results.csv")).unwrap();
    assert!(
        csv.lines()
            .next()
            .unwrap()
            .contains("workers,worker_kind,prefetch,storage")
    );
    let (_, back) = memfit::store::hdf5::read(&t.path().join("out/results.h5")).unwrap();
    assert_eq!(back, rows);

    // Bad input: no dataset, a missing folder, dataload beside model phases.
    for (args, needle) in [
        (vec!["--phases", "dataload"], "grid[0].dataset"),
        (
            vec!["--phases", "dataload", "--dataset", "/nonexistent/x"],
            "no manifest.json",
        ),
        (
            vec!["--phases", "dataload,init", "--dataset", d],
            "runs alone",
        ),
        (
            vec!["--phases", "dataload", "--dataset", d, "--workers", "-1"],
            "grid[0].workers",
        ),
        (
            vec!["--phases", "dataload", "--dataset", d, "--storage", "disk"],
            "ram, mmap, stream",
        ),
    ] {
        let out = memfit()
            .arg("run")
            .args(&args)
            .arg("--out")
            .arg(t.path().join("bad"))
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!t.path().join("bad/results.jsonl").exists());
    }
}
