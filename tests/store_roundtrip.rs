//! Round trips through the three stores: JSONL journal, CSV, HDF5 (plus a foreign reader).

use std::io::Write;
#[cfg(feature = "hdf5")]
use std::process::Command;

use memfit::record::{Row, RunMeta, Status};
use memfit::store::{csv, hdf5, jsonl};

/// A row with every figure present, to be varied by the cases below.
fn base_row(case: u64, phase: &str) -> Row {
    Row {
        run_id: "20250101T120000Z".into(),
        case,
        model: "gpt".into(),
        preset: "tiny".into(),
        batch: 4,
        seq: 128,
        max_seq: 256,
        hidden: 256,
        heads: 4,
        layers: 2,
        vocab: 1024,
        image_px: 0,
        patch_px: 0,
        channels: 0,
        kv_heads: 4,
        head_dim: 64,
        intermediate: 1024,
        tied: "off".into(),
        biases: "qkv,o,mlp".into(),
        dtype: "f32".into(),
        checkpoint_dtype: "bf16".into(),
        device: "cpu".into(),
        optimizer: "adamw".into(),
        optimizer_block: 2048,
        checkpoint: 0,
        backward: "by-block".into(),
        decode_tokens: 0,
        kv_cache: "on".into(),
        weights: "model".into(),
        load: "read".into(),
        attention: "standard".into(),
        kernels: "fused".into(),
        flush_denormals: "on".into(),
        trim: "off".into(),
        lora_rank: 0,
        lora_targets: String::new(),
        lora_base: String::new(),
        precision: "pure".into(),
        phase: memfit::step::Phase::parse(phase).expect("a phase"),
        status: Status::Ok,
        error: None,
        params: 2_000_000,
        peak_bytes: Some(12_345_678),
        retained_bytes: Some(1_024),
        alloc_count: Some(321),
        predicted_peak_bytes: Some(12_000_000),
        predicted_retained_bytes: Some(0),
        cpu_user_s: Some(0.75),
        cpu_sys_s: Some(0.0625),
        wall_s: Some(0.5),
        rss_peak_bytes: Some(300_000_000),
        logits_rel_error: None,
        peak_meter: "cpu-allocator".into(),
        reserved_peak_bytes: None,
        device_used_bytes: None,
        nvml_process_peak_bytes: None,
        gpu_util_mean_pct: None,
        gpu_power_peak_w: None,
        nvml_samples_count: None,
        threads: 2,
        dataset: String::new(),
        workers: None,
        worker_kind: String::new(),
        prefetch: None,
        storage: String::new(),
        persistent: String::new(),
        epochs: None,
        crop_px: None,
        images: None,
        images_per_s: None,
        startup_s: None,
        tree_processes_count: None,
        tree_rss_peak_bytes: None,
        tree_rss_steady_bytes: None,
        pss_peak_bytes: None,
        pss_steady_bytes: None,
        h2d_pinned_bytes_per_s: None,
        h2d_pageable_bytes_per_s: None,
        trim_layer: "rss".into(),
        trim_before_bytes: Some(900_000_000),
        trim_after_bytes: Some(610_000_000),
        trim_live_bytes: Some(512_000_000),
        moe_routing: "3,0,5;4,4,0".into(),
        moe_tokens_max: Some(5),
        moe_tokens_min: Some(0),
        active_params: Some(1_000),
        kv_bytes_per_token: Some(4096),
        sliding_window: Some(4096),
        heap_start_bytes: Some(2_600_000_000),
    }
}

/// Three hand-built rows: an error row with no figures, a large-peak row with a negative
/// retained figure, and an ordinary ok row.
fn rows() -> Vec<Row> {
    let failed = Row {
        status: Status::Error,
        error: Some("shape mismatch: [4, 128] vs [4, 129] — ünïcode".into()),
        peak_bytes: None,
        retained_bytes: None,
        alloc_count: None,
        predicted_peak_bytes: None,
        predicted_retained_bytes: None,
        cpu_user_s: None,
        cpu_sys_s: None,
        wall_s: None,
        rss_peak_bytes: None,
        trim_layer: String::new(),
        trim_before_bytes: None,
        trim_after_bytes: None,
        trim_live_bytes: None,
        heap_start_bytes: None,
        ..base_row(0, "forward")
    };
    let large = Row {
        device: "cuda:0".into(),
        peak_meter: "cuda-pool".into(),
        reserved_peak_bytes: Some(71_000_000_000),
        device_used_bytes: Some(-2_097_152),
        nvml_process_peak_bytes: Some(71_500_000_000),
        gpu_util_mean_pct: Some(87.25),
        gpu_power_peak_w: Some(612.5),
        nvml_samples_count: Some(1_234),
        peak_bytes: Some(70_000_000_000),
        retained_bytes: Some(-4_096),
        predicted_peak_bytes: Some(69_000_000_000),
        predicted_retained_bytes: Some(-1),
        alloc_count: None,
        trim_layer: "cuda-pool-reserved".into(),
        trim_before_bytes: Some(71_000_000_000),
        trim_after_bytes: Some(69_994_000_000),
        trim_live_bytes: Some(69_990_000_000),
        ..base_row(1, "backward")
    };
    // A dataload row: every data column filled.
    let ok = Row {
        dataset: "data/synth".into(),
        workers: Some(2),
        worker_kind: "process".into(),
        prefetch: Some(8),
        storage: "mmap".into(),
        persistent: "off".into(),
        epochs: Some(3),
        crop_px: Some(224),
        images: Some(1_536),
        images_per_s: Some(211.25),
        startup_s: Some(0.375),
        tree_processes_count: Some(3),
        tree_rss_peak_bytes: Some(812_000_000),
        tree_rss_steady_bytes: Some(700_000_000),
        pss_peak_bytes: Some(640_000_000),
        pss_steady_bytes: Some(600_000_000),
        h2d_pinned_bytes_per_s: Some(5.0e10),
        h2d_pageable_bytes_per_s: Some(1.25e10),
        ..base_row(2, "dataload")
    };
    vec![failed, large, ok]
}

fn meta() -> RunMeta {
    RunMeta {
        run_id: "20250101T120000Z".into(),
        memfit_version: "0.1.0".into(),
        git_commit: "0123456789abcdef".into(),
        candle_version: "0.11.1".into(),
        cpu_model: "Test CPU @ 3.0GHz".into(),
        cores: 2,
        os: "linux".into(),
        device_name: "cpu".into(),
        threads: 2,
        workload: "<embedded default>".into(),
        cuda_context_bytes: None,
        device_memory_bytes: None,
        driver_version: None,
        cuda_version: None,
        cuda_pool_release_threshold: None,
        cublas_workspace_bytes: None,
        cluster: Default::default(),
    }
}

/// A CUDA run's metadata: the optional attributes are written and read back.
#[test]
#[cfg(feature = "hdf5")]
fn cuda_metadata_round_trips_and_cpu_metadata_stays_absent() {
    let dir = tempfile::tempdir().unwrap();
    let cuda = RunMeta {
        device_name: "NVIDIA H200".into(),
        cuda_context_bytes: Some(524_288_000),
        device_memory_bytes: Some(150_754_820_096),
        driver_version: Some("580.95.05".into()),
        cuda_version: Some("13.0".into()),
        cuda_pool_release_threshold: Some(u64::MAX),
        cublas_workspace_bytes: Some(32 << 20),
        ..meta()
    };
    for m in [cuda, meta()] {
        let path = dir.path().join("m.h5");
        hdf5::write(&path, &m, &rows()).unwrap();
        let (back, back_rows) = hdf5::read(&path).unwrap();
        assert_eq!(back, m);
        assert_eq!(back_rows, rows());
    }
}

#[test]
fn jsonl_append_twice_then_read_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.jsonl");
    let all = rows();
    {
        let mut journal = jsonl::Journal::open(&path).unwrap();
        journal.append(&all[..1]).unwrap();
    }
    {
        // Reopening appends; it must not truncate.
        let mut journal = jsonl::Journal::open(&path).unwrap();
        journal.append(&all[1..]).unwrap();
    }
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.lines().count(), 3);
    assert_eq!(jsonl::read(&path).unwrap(), all);
    assert_eq!(jsonl::to_bytes(&all).unwrap(), text.into_bytes());
}

#[test]
fn jsonl_ignores_blank_lines() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.jsonl");
    let all = rows();
    let mut bytes = b"\n".to_vec();
    bytes.extend(jsonl::to_bytes(&all[..1]).unwrap());
    bytes.extend(b"   \n\n");
    bytes.extend(jsonl::to_bytes(&all[1..]).unwrap());
    std::fs::write(&path, bytes).unwrap();
    assert_eq!(jsonl::read(&path).unwrap(), all);
}

#[test]
fn jsonl_corrupt_line_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.jsonl");
    let all = rows();
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(&jsonl::to_bytes(&all[..1]).unwrap())
        .unwrap();
    // Not a cut-short line (that is skipped): a wrong value in a whole line.
    file.write_all(b"{\"run_id\": \"x\", \"case\": oops}\n")
        .unwrap();
    file.write_all(&jsonl::to_bytes(&all[1..]).unwrap())
        .unwrap();
    drop(file);

    let err = jsonl::read(&path).unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("line 2"), "{msg}");
}

#[test]
fn jsonl_reopen_after_torn_write_keeps_new_rows_readable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.jsonl");
    let all = rows();
    let mut bytes = jsonl::to_bytes(&all[..1]).unwrap();
    bytes.extend(b"{\"run_id\": \"torn"); // a crash in the middle of a line
    std::fs::write(&path, bytes).unwrap();

    let mut journal = jsonl::Journal::open(&path).unwrap();
    journal.append(&all[1..]).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[1], "{\"run_id\": \"torn");
    // The torn line is skipped (and reported by line); every whole row reads back.
    let (read, torn) = jsonl::read_lenient(&path).unwrap();
    assert_eq!(torn, vec![2]);
    assert_eq!(read, all);
    assert_eq!(jsonl::read(&path).unwrap(), all);
    let tail: Row = serde_json::from_str(lines[3]).unwrap();
    assert_eq!(tail, all[2]);
}

#[test]
fn csv_has_header_one_line_per_row_and_empty_cells_for_none() {
    let all = rows();
    let bytes = csv::to_bytes(&all).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1 + all.len());
    assert_eq!(lines[0], csv::columns().join(","));
    // The header agrees with the one the csv crate derives from Row's serde description.
    let mut auto = ::csv::Writer::from_writer(Vec::new());
    auto.serialize(&all[2]).unwrap();
    let auto = String::from_utf8(auto.into_inner().unwrap()).unwrap();
    assert_eq!(auto.lines().next().unwrap(), lines[0]);
    assert!(lines[0].starts_with("run_id,case,model,"), "{}", lines[0]);
    assert!(
        lines[0].ends_with(
            ",rss_peak_bytes,logits_rel_error,peak_meter,reserved_peak_bytes,device_used_bytes,\
             nvml_process_peak_bytes,gpu_util_mean_pct,gpu_power_peak_w,nvml_samples_count,\
             dataset,workers,worker_kind,prefetch,storage,persistent,epochs,crop_px,images,\
             images_per_s,startup_s,tree_processes_count,tree_rss_peak_bytes,tree_rss_steady_bytes,\
             pss_peak_bytes,pss_steady_bytes,h2d_pinned_bytes_per_s,h2d_pageable_bytes_per_s,\
             trim_layer,trim_before_bytes,trim_after_bytes,trim_live_bytes,moe_routing,\
             moe_tokens_max,moe_tokens_min,active_params,kv_bytes_per_token,sliding_window,heap_start_bytes,threads"
        ),
        "{}",
        lines[0]
    );

    let mut reader = ::csv::Reader::from_reader(text.as_bytes());
    let header = reader.headers().unwrap().clone();
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let records: Vec<::csv::StringRecord> = reader.records().map(|r| r.unwrap()).collect();
    assert_eq!(records.len(), 3);
    for record in &records {
        assert_eq!(record.len(), header.len());
    }
    // Row 0: every optional figure is None → empty cell.
    for name in [
        "peak_bytes",
        "retained_bytes",
        "alloc_count",
        "predicted_peak_bytes",
        "predicted_retained_bytes",
        "cpu_user_s",
        "cpu_sys_s",
        "wall_s",
        "rss_peak_bytes",
        "trim_layer",
        "trim_before_bytes",
        "trim_after_bytes",
        "trim_live_bytes",
        "heap_start_bytes",
    ] {
        assert_eq!(&records[0][col(name)], "", "{name}");
    }
    assert_eq!(&records[0][col("status")], "error");
    assert!(records[0][col("error")].starts_with("shape mismatch"));
    assert_eq!(&records[1][col("peak_bytes")], "70000000000");
    assert_eq!(&records[1][col("retained_bytes")], "-4096");
    assert_eq!(&records[1][col("alloc_count")], "");
    assert_eq!(&records[2][col("error")], "");
    assert_eq!(&records[2][col("status")], "ok");

    // Deserialising the CSV gives the rows back.
    let back: Vec<Row> = ::csv::Reader::from_reader(text.as_bytes())
        .deserialize()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(back, all);
}

#[test]
fn csv_write_puts_the_bytes_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rows.csv");
    let all = rows();
    std::fs::write(&path, "old content").unwrap();
    csv::write(&path, &all).unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), csv::to_bytes(&all).unwrap());
    // No temporary file is left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

    let empty = csv::to_bytes(&[]).unwrap();
    assert_eq!(String::from_utf8(empty).unwrap().lines().count(), 1);
}

#[test]
#[cfg(feature = "hdf5")]
fn hdf5_write_then_read_gives_the_same_rows_and_meta() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.h5");
    let all = rows();
    hdf5::write(&path, &meta(), &all).unwrap();
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    let (m, back) = hdf5::read(&path).unwrap();
    assert_eq!(m, meta());
    assert_eq!(back, all);

    // Overwriting an existing file replaces it.
    hdf5::write(&path, &meta(), &all[..1]).unwrap();
    assert_eq!(hdf5::read(&path).unwrap().1, all[..1].to_vec());

    // Zero rows round-trip too.
    hdf5::write(&path, &meta(), &[]).unwrap();
    assert_eq!(hdf5::read(&path).unwrap(), (meta(), Vec::new()));
}

/// A file written before the trim columns existed reads them as not measured (empty layer,
/// missing figures), not as zeros.
#[test]
#[cfg(feature = "hdf5")]
fn hdf5_without_the_trim_columns_reads_them_as_missing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.h5");
    let all = rows();
    hdf5::write(&path, &meta(), &all).unwrap();
    {
        let f = ::hdf5::File::open_rw(&path).unwrap();
        let g = f.group("rows").unwrap();
        for name in [
            "trim_layer",
            "trim_before_bytes",
            "trim_after_bytes",
            "trim_live_bytes",
            "heap_start_bytes",
        ] {
            g.unlink(name).unwrap();
        }
    }
    let (_, back) = hdf5::read(&path).unwrap();
    assert_eq!(back.len(), all.len());
    for (b, a) in back.iter().zip(&all) {
        assert_eq!(b.trim_layer, "");
        assert_eq!(
            (b.trim_before_bytes, b.trim_after_bytes, b.trim_live_bytes),
            (None, None, None)
        );
        assert_eq!(b.heap_start_bytes, None);
        let cleared = Row {
            trim_layer: String::new(),
            trim_before_bytes: None,
            trim_after_bytes: None,
            trim_live_bytes: None,
            heap_start_bytes: None,
            ..a.clone()
        };
        assert_eq!(*b, cleared);
    }
}

#[test]
#[cfg(feature = "hdf5")]
fn hdf5_refuses_values_that_would_come_back_different() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.h5");
    let too_big = Row {
        peak_bytes: Some(u64::MAX),
        ..base_row(7, "forward")
    };
    let msg = format!("{:#}", hdf5::write(&path, &meta(), &[too_big]).unwrap_err());
    assert!(msg.contains("peak_bytes"), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(!path.exists());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

    let nan = Row {
        wall_s: Some(f64::NAN),
        ..base_row(8, "forward")
    };
    let msg = format!("{:#}", hdf5::write(&path, &meta(), &[nan]).unwrap_err());
    assert!(msg.contains("wall_s"), "{msg}");
    assert!(!path.exists());
}

#[test]
#[cfg(feature = "hdf5")]
fn hdf5_read_errors_name_file_and_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.h5");
    hdf5::write(&path, &meta(), &rows()).unwrap();
    {
        let file = ::hdf5::File::open_rw(&path).unwrap();
        file.group("rows").unwrap().unlink("wall_s").unwrap();
    }
    let msg = format!("{:#}", hdf5::read(&path).unwrap_err());
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    assert!(msg.contains("/rows/wall_s"), "{msg}");
}

#[test]
#[cfg(feature = "hdf5")]
fn hdf5_is_readable_by_h5dump() {
    // A foreign reader is the point of the test: without it the test fails, never passes.
    assert!(
        Command::new("h5dump").arg("--version").output().is_ok(),
        "h5dump is not on PATH: install hdf5-tools (scripts/setup.sh test does)"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.h5");
    hdf5::write(&path, &meta(), &rows()).unwrap();

    let out = Command::new("h5dump")
        .arg("-H")
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "h5dump failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("GROUP \"rows\""), "{stdout}");
    assert!(stdout.contains("DATASET \"peak_bytes\""), "{stdout}");
    assert!(stdout.contains("ATTRIBUTE \"units\""), "{stdout}");
    assert!(stdout.contains("ATTRIBUTE \"schema_version\""), "{stdout}");

    // The values themselves, as a foreign reader sees them.
    let out = Command::new("h5dump")
        .args(["-d", "/rows/peak_bytes"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("-1, 70000000000, 12345678"), "{stdout}");
}

/// A build without the `hdf5` feature (the GPU machine's) refuses HDF5 with the way out named,
/// and never writes a file.
#[test]
#[cfg(not(feature = "hdf5"))]
fn without_hdf5_the_store_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.h5");
    let err = hdf5::write(&path, &meta(), &rows())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("built without HDF5") && err.contains("memfit convert"),
        "{err}"
    );
    assert!(!path.exists());
}
