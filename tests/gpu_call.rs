//! The GPU call (`scripts/gpu-run.sh` through the device tool) within its limits, checked here
//! on the CPU: the build is packed as the call carries it (`scripts/gpu-pack.sh`: what travels
//! measured against a limit) and unpacked by the same script the GPU side uses
//! (`scripts/gpu-unpack.sh`, checksums checked); the dry run writes at most 8 files to `$OUT`
//! (≤ 16 MiB each, ≤ 2 folders down, plain names), `scripts/gpu-collect.sh` rebuilds the
//! results from them, and the GPU workload covers every model family and variant that runs on
//! CUDA while its CPU stand-in keeps the same grids.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use memfit::workload::{self, GridSpec};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn toml_of(name: &str) -> toml::Value {
    let text = std::fs::read_to_string(root().join("workloads").join(name)).unwrap();
    text.parse().unwrap()
}

fn keys(t: &toml::Value) -> BTreeSet<String> {
    t.as_table().unwrap().keys().cloned().collect()
}

#[test]
fn the_cpu_stand_in_keeps_the_gpu_sweeps_grids_and_keys() {
    for (gpu, cpu) in [
        ("gpu-h200.toml", "gpu-h200-cpu.toml"),
        ("gpu-dataload.toml", "gpu-dataload-cpu.toml"),
    ] {
        let (g, c) = (toml_of(gpu), toml_of(cpu));
        assert_eq!(
            keys(&g["defaults"]),
            keys(&c["defaults"]),
            "{cpu}: [defaults]"
        );
        let (gg, cg) = (g["grid"].as_array().unwrap(), c["grid"].as_array().unwrap());
        assert_eq!(gg.len(), cg.len(), "{cpu}: as many grids as {gpu}");
        for (i, (a, b)) in gg.iter().zip(cg).enumerate() {
            assert_eq!(
                keys(a),
                keys(b),
                "{cpu}: grid {i} has other keys than {gpu}'s"
            );
        }
        assert_eq!(c["defaults"]["device"].as_str(), Some("cpu"));
    }
}

#[test]
fn the_gpu_workload_covers_every_family_and_cuda_variant() {
    let text = std::fs::read_to_string(root().join("workloads/gpu-h200.toml")).unwrap();
    let file = workload::parse(&text, "gpu-h200.toml").unwrap();
    let cases =
        workload::expand_for_prediction(&file, &GridSpec::default(), "gpu-h200.toml").unwrap();
    let set = |f: &dyn Fn(&workload::Case) -> String| -> BTreeSet<String> {
        cases.iter().map(f).collect()
    };
    let phases: BTreeSet<String> = cases
        .iter()
        .flat_map(|c| c.phases.iter().map(|p| p.as_str().to_string()))
        .collect();
    let want = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let all_phases: Vec<&str> = memfit::phase::Phase::ALL
        .iter()
        .filter(|p| **p != memfit::phase::Phase::Dataload)
        .map(|p| p.as_str())
        .collect();
    assert_eq!(phases, want(&all_phases), "every model phase");
    assert_eq!(
        set(&|c| c.model.as_str().into()),
        want(&["gpt", "llama", "vit"])
    );
    assert_eq!(set(&|c| c.dtype.to_string()), want(&["bf16", "f16", "f32"]));
    let opts: Vec<&str> = memfit::phase::OptimizerKind::ALL
        .iter()
        .map(|o| o.as_str())
        .collect();
    assert_eq!(set(&|c| c.optimizer.as_str().into()), want(&opts));
    assert_eq!(
        set(&|c| c.precision.as_str().into()),
        want(&["mixed", "pure"])
    );
    assert!(cases.iter().any(|c| c.checkpoint > 0), "checkpointing");
    assert!(cases.iter().any(|c| c.cfg.lora_rank > 0), "LoRA");
    assert_eq!(set(&|c| c.kv_cache.to_string()), want(&["false", "true"]));
    assert_eq!(
        set(&|c| c.weights.as_str().into()),
        want(&[
            "f16",
            "fp8",
            "model",
            "mxfp4",
            "mxfp4-experts",
            "q4_0",
            "q4_k",
            "q6_k",
            "q8_0"
        ])
    );
    let lora_bases: BTreeSet<String> = cases
        .iter()
        .filter(|c| c.cfg.lora_rank > 0)
        .map(|c| c.cfg.lora_base.as_str().to_string())
        .collect();
    assert_eq!(
        lora_bases,
        want(&["detach", "fp8", "mxfp4", "op", "q4_0", "q4_k"])
    );
    assert!(
        cases.iter().any(|c| c
            .cfg
            .llama
            .is_some_and(|l| l.variant.sandwich_norms && l.local_rope(c.cfg.layers))),
        "a Gemma 3 with sliding and full layers"
    );
    assert!(
        cases.iter().any(|c| c
            .cfg
            .llama
            .is_some_and(|l| l.variant.attention_sinks && l.moe.is_some())),
        "a gpt-oss"
    );
    assert_eq!(set(&|c| c.load_mmap.to_string()), want(&["false", "true"]));
    assert!(
        file.case_timeout.is_some(),
        "a case time limit for the call"
    );
}

/// Every file under `dir`: its path relative to `dir` and its size.
fn files(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                let rel = p.strip_prefix(dir).unwrap().to_path_buf();
                out.push((rel, e.metadata().unwrap().len()));
            }
        }
    }
    out.sort();
    out
}

/// `scripts/gpu-pack.sh` on this build into `dist`, at xz's fastest level (the layout is the
/// call's; only the ratio differs); its output (the travelling total) returned.
fn pack(dist: &Path, limit_mib: &str) -> std::process::Output {
    Command::new(root().join("scripts/gpu-pack.sh"))
        .arg(env!("CARGO_BIN_EXE_memfit"))
        .arg(dist)
        .env("MEMFIT_XZ_LEVEL", "-0")
        .env("MEMFIT_TRAVEL_LIMIT_MIB", limit_mib)
        .output()
        .unwrap()
}

/// The packed layout: the archives MANIFEST lists with their sizes and checksums, the total
/// that would travel, and a refusal above the limit.
#[test]
fn the_pack_lists_what_travels_and_refuses_too_much() {
    let tmp = tempfile::tempdir().unwrap();
    let dist = tmp.path().join("dist");
    let o = pack(&dist, "40");
    let stdout = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let manifest = std::fs::read_to_string(dist.join("MANIFEST")).unwrap();
    let entry = manifest
        .lines()
        .find(|l| l.starts_with("memfit.xz "))
        .unwrap_or_else(|| panic!("{manifest}"));
    let bytes: u64 = entry.split(' ').nth(1).unwrap().parse().unwrap();
    assert_eq!(
        bytes,
        std::fs::metadata(dist.join("memfit.xz")).unwrap().len()
    );
    // The tree's own share stays small enough to leave room for the CUDA build (8.6 MiB packed)
    // under gpu-pack.sh's 40 MiB: results and fixtures that grow without bound fail here. (22:
    // 20.1 MiB on 2026-12-06 evening, of which 6.2 are the fixtures, 5.6 results/cpu and 3.0
    // docs/report; 18.5 that morning.)
    let tree_mib: f64 = stdout
        .split("travel: tree ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        tree_mib <= 22.0,
        "the tree that travels to the GPU is {tree_mib} MiB (at most 22)"
    );
    assert!(dist.join("BUILD").is_file());
    // This CPU build links libhdf5, so its chain is packed beside it (the CUDA build has none).
    assert!(manifest.contains("lib.tar.xz "), "{manifest}");

    let o = pack(&tmp.path().join("dist2"), "1");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("over the 1 MiB limit"), "{err}");

    // A damaged archive is named by the unpack, not loaded.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dist.join("memfit.xz"))
        .unwrap();
    std::io::Write::write_all(&mut f, b"x").unwrap();
    let o = Command::new(root().join("scripts/gpu-unpack.sh"))
        .arg(&dist)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("memfit.xz is") && err.contains("MANIFEST says"),
        "{err}"
    );
}

#[test]
fn the_dry_run_brings_back_everything_within_the_out_limits() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let exe = env!("CARGO_BIN_EXE_memfit");
    // The build travels packed, as on the GPU call.
    let dist = tmp.path().join("dist");
    let o = pack(&dist, "64");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(root().join("scripts/gpu-run.sh"))
        .env("MEMFIT_GPU_DRY_RUN", "1")
        .env("MEMFIT_GPU_DIST", &dist)
        .env("MEMFIT_GPU_BUDGET_S", "400")
        .env("OUT", &out)
        .env("TMPDIR", tmp.path())
        .env("RAYON_NUM_THREADS", "2")
        .output()
        .unwrap();
    let log = format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(o.status.success(), "{log}");

    // The call's limits on what comes back.
    let got = files(&out);
    assert!(got.len() <= 8, "at most 8 files: {got:?}");
    for (p, size) in &got {
        assert!(
            p.components().count() <= 3,
            "at most two folders down: {p:?}"
        );
        let name = p.file_name().unwrap().to_str().unwrap();
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || ".-_".contains(c)),
            "a plain name: {name}"
        );
        assert!(*size <= 16 << 20, "{p:?}: {size} bytes");
    }
    assert!(got.iter().map(|f| f.1).sum::<u64>() <= 64 << 20);
    let names: BTreeSet<String> = got.iter().map(|f| f.0.display().to_string()).collect();
    let want: BTreeSet<String> = [
        "dataload.log",
        "machine.txt",
        "results.tar.gz",
        "smoke.log",
        "sweep.log",
        "time.txt",
        "torch.log",
    ]
    .map(String::from)
    .into();
    assert_eq!(names, want);
    let time = std::fs::read_to_string(out.join("time.txt")).unwrap();
    for step in [
        "smoke: exit 0",
        "sweep: exit 0",
        "dataload: exit 0",
        "torch: exit 0",
        "pack: ",
    ] {
        assert!(time.contains(step), "{step}: {time}");
    }
    let smoke = std::fs::read_to_string(out.join("smoke.log")).unwrap();
    assert!(smoke.contains("smoke check: ok"), "{smoke}");
    assert!(time.contains("smoke-extra: exit 0"), "{time}");
    // The self-checks ran in the call, every one, with the unpacked binary.
    let n = memfit::selftest::CHECKS.len();
    assert!(
        smoke.contains(&format!("selftest on cpu: {n} of {n} checks ok")),
        "{smoke}"
    );
    assert!(time.contains("tests: exit 0"), "{time}");
    assert!(dist.join("bin/memfit").is_file() && dist.join("UNPACKED").is_file());
    let machine = std::fs::read_to_string(out.join("machine.txt")).unwrap();
    assert!(machine.contains("travel: tree "), "{machine}");
    // The bare-matmul probe, twice: on the CPU its window's peak beyond the output is gemm's
    // packing buffer as `formula::gemm` models it, plus the output tensor's bookkeeping (its
    // layout and storage handle: a few hundred bytes, seen 80–272 B).
    let probes: Vec<serde_json::Value> = smoke
        .lines()
        .filter(|l| l.starts_with("{\"device\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(probes.len(), 2, "{smoke}");
    for p in &probes {
        let extra = p["beyond_output_bytes"].as_i64().unwrap()
            - p["predicted_scratch_bytes"].as_i64().unwrap();
        assert!((0..=512).contains(&extra), "{p}");
    }

    // Back here: collected into a run folder, CSV and HDF5 rebuilt from the journals.
    let results = tmp.path().join("results");
    let o = Command::new(root().join("scripts/gpu-collect.sh"))
        .arg(&out)
        .env("MEMFIT_BIN", exe)
        .env("MEMFIT_RESULTS", &results)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let dst = PathBuf::from(stdout.lines().last().unwrap().trim());
    assert!(dst.starts_with(&results), "{dst:?}");
    let cpu = std::fs::read_to_string(root().join("workloads/gpu-h200-cpu.toml")).unwrap();
    let file = workload::parse(&cpu, "gpu-h200-cpu.toml").unwrap();
    let cases = workload::expand(&file, &GridSpec::default(), "gpu-h200-cpu.toml").unwrap();
    let phases: usize = cases.iter().map(|c| c.phases.len()).sum();
    for (sub, n) in [
        ("", phases),
        ("smoke", 6),
        ("smoke-release0", 6),
        ("dataload", 2),
    ] {
        let d = dst.join(sub);
        let rows = memfit::store::jsonl::read(&d.join("results.jsonl")).unwrap();
        assert_eq!(rows.len(), n, "{d:?}");
        assert!(
            rows.iter().all(|r| r.status == memfit::record::Status::Ok),
            "{d:?}: {:?}",
            rows.iter().find(|r| r.status != memfit::record::Status::Ok)
        );
        let (_, from_h5) = memfit::store::hdf5::read(&d.join("results.h5")).unwrap();
        assert_eq!(from_h5, rows, "{d:?}: HDF5 rebuilt from the journal");
        assert!(d.join("results.csv").is_file() && d.join("meta.json").is_file());
    }
    for log in ["machine.txt", "sweep.log", "time.txt"] {
        assert!(dst.join(log).is_file(), "{log}");
    }
}

/// A call killed mid-sweep (its time limit, a hung command) still brings back every case that
/// finished: the archive in `$OUT` is re-packed, atomically, whenever the sweep's journal grows.
/// The dry run is killed (SIGKILL to its whole process group, as the device tool's limit does)
/// once the archive holds a finished case of the main sweep; the archive must then unpack and
/// hold those rows, each final.
#[test]
fn a_call_killed_mid_sweep_brings_back_its_finished_cases() {
    use std::os::unix::process::CommandExt;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let mut child = Command::new(root().join("scripts/gpu-run.sh"))
        .env("MEMFIT_GPU_DRY_RUN", "1")
        .env("MEMFIT_BIN", env!("CARGO_BIN_EXE_memfit"))
        .env("MEMFIT_GPU_BUDGET_S", "400")
        .env("OUT", &out)
        .env("TMPDIR", tmp.path())
        .env("RAYON_NUM_THREADS", "2")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let unpack = |into: &Path| -> Option<Vec<memfit::record::Row>> {
        let _ = std::fs::remove_dir_all(into);
        std::fs::create_dir_all(into).unwrap();
        let ok = Command::new("tar")
            .arg("-C")
            .arg(into)
            .arg("-xzf")
            .arg(out.join("results.tar.gz"))
            .stderr(std::process::Stdio::null())
            .status()
            .ok()?
            .success();
        let journal = into.join("results/run/results.jsonl");
        (ok && journal.is_file()).then(|| memfit::store::jsonl::read(&journal).unwrap())
    };
    let probe = tmp.path().join("probe");
    let t0 = std::time::Instant::now();
    let mut seen = 0;
    while t0.elapsed().as_secs() < 300 {
        if let Some(rows) = unpack(&probe)
            && !rows.is_empty()
        {
            seen = rows.len();
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the dry run ended before a case of its sweep was in the archive"
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    assert!(seen > 0, "no finished case in the archive after 300 s");
    // SAFETY: kill(2) on the child's process group, which this test created.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    child.wait().unwrap();
    let back = tmp.path().join("back");
    let rows = unpack(&back).expect("the archive unpacks after the kill");
    assert!(
        rows.len() >= seen,
        "{} rows after the kill, {seen} before",
        rows.len()
    );
    assert!(
        rows.iter().all(|r| r.status.is_final()),
        "{:?}",
        rows.iter().find(|r| !r.status.is_final())
    );
}
