//! Rows of a case: each phase's reading (or failure) beside the formula's prediction, one row
//! per asked phase. The case's own process builds them without predictions as its phases
//! finish ([`bare_row`]: a prediction replays the model symbolically, work whose memory would
//! count against the case's `--mem-budget`); `memfit run` adds the predictions ([`predict`])
//! and builds the rows a dead or killed process left out.

use crate::formula;
use crate::meter::Reading;
use crate::phase::Phase;
use crate::phase::runner::PhaseResult;
use crate::record::{Row, RunMeta, Status, StatusError, failure_of};
use crate::workload::Case;

/// Rows of a case that could not run at all: its first phase failed with `e` (true status),
/// the others `skipped`.
pub fn failed_rows(case: &Case, meta: &RunMeta, e: &anyhow::Error) -> Vec<Row> {
    let (status, msg) = failure_of(e);
    let first = case.phases.first().map_or("?", |p| p.as_str());
    case.phases
        .iter()
        .enumerate()
        .map(|(i, &phase)| {
            let err = if i == 0 {
                StatusError::error(status, msg.clone())
            } else {
                StatusError::skipped_after(first, &msg)
            };
            bare_row(case, meta, phase, &Err(err), "none")
        })
        .collect()
}

/// Rows of one case: measured figures, without the predictions.
pub fn case_rows(
    case: &Case,
    meta: &RunMeta,
    results: &[PhaseResult],
    peak_meter: &str,
) -> Vec<Row> {
    results
        .iter()
        .map(|res| bare_row(case, meta, res.phase, &res.outcome, peak_meter))
        .collect()
}

/// Fills in the formula's predictions of a model row (data-loading rows have none).
pub fn predict(case: &Case, row: &mut Row, threads: usize) {
    if case.data.is_some() {
        return;
    }
    // A mixture of experts: the routing the phase drew (balanced when not recorded).
    let routing = crate::model::moe::parse_routing(&row.moe_routing);
    let pred = formula::predict_routed(case, row.phase, threads, routing);
    row.predicted_peak_bytes = Some(pred.peak_bytes);
    row.predicted_retained_bytes = Some(pred.retained_bytes);
}

/// The row of one phase of `case`, with the formula's prediction.
pub fn row_of(
    case: &Case,
    meta: &RunMeta,
    phase: Phase,
    outcome: &anyhow::Result<Reading>,
    peak_meter: &str,
) -> Row {
    let mut row = bare_row(case, meta, phase, outcome, peak_meter);
    predict(case, &mut row, meta.threads as usize);
    row
}

/// What identifies `case` (its key for `--resume`, its work for `--deadline` and `--shard`):
/// a row of its first phase with nothing measured or predicted.
pub fn skeleton(case: &Case, meta: &RunMeta) -> Row {
    let none = Err(anyhow::anyhow!("not run"));
    bare_row(case, meta, case.phases[0], &none, "none")
}

/// The row of one phase of `case`, without the prediction.
pub fn bare_row(
    case: &Case,
    meta: &RunMeta,
    phase: Phase,
    outcome: &anyhow::Result<Reading>,
    peak_meter: &str,
) -> Row {
    let (status, error, mut reading) = match outcome {
        Ok(r) => (Status::Ok, None, r.clone()),
        Err(e) => {
            let (status, msg) = failure_of(e);
            (status, Some(msg), Reading::default())
        }
    };
    let figures = reading.data.take();
    let row = Row {
        run_id: meta.run_id.clone(),
        case: case.index as u64,
        model: case.model.as_str().into(),
        preset: case.preset.clone(),
        batch: case.batch as u64,
        seq: case.seq as u64,
        max_seq: case.cfg.max_seq as u64,
        hidden: case.cfg.hidden as u64,
        heads: case.cfg.heads as u64,
        layers: case.cfg.layers as u64,
        vocab: case.cfg.vocab as u64,
        image_px: case.cfg.vision.map_or(0, |v| v.image as u64),
        patch_px: case.cfg.vision.map_or(0, |v| v.patch as u64),
        channels: case.cfg.vision.map_or(0, |v| v.channels as u64),
        kv_heads: case.cfg.kv_heads() as u64,
        head_dim: case.cfg.head_dim() as u64,
        intermediate: case
            .cfg
            .llama
            .map_or(4 * case.cfg.hidden, |l| l.intermediate) as u64,
        tied: if case.cfg.tied { "on" } else { "off" }.into(),
        biases: biases(&case.cfg),
        dtype: case.dtype.to_string(),
        checkpoint_dtype: case
            .checkpoint_dtype
            .map_or(String::new(), |d| d.to_string()),
        device: case.device.to_string(),
        optimizer: case.optimizer.as_str().into(),
        optimizer_block: case.optimizer_block as u64,
        checkpoint: case.checkpoint as u64,
        backward: case.backward.as_str().into(),
        decode_tokens: case.decode_tokens as u64,
        kv_cache: if case.kv_cache { "on" } else { "off" }.into(),
        weights: case.weights.as_str().into(),
        load: if case.load_mmap { "mmap" } else { "read" }.into(),
        precision: case.precision.as_str().into(),
        lora_rank: case.cfg.lora_rank as u64,
        lora_targets: case
            .cfg
            .lora_targets
            .iter()
            .map(|t| t.as_str())
            .collect::<Vec<_>>()
            .join(","),
        lora_base: if case.cfg.lora_rank > 0 {
            case.cfg.lora_base.as_str().into()
        } else {
            String::new()
        },
        attention: case.cfg.attention_name().into(),
        kernels: case.cfg.kernels.as_str().into(),
        flush_denormals: if case.flush_denormals { "on" } else { "off" }.into(),
        trim: if case.trim { "on" } else { "off" }.into(),
        phase,
        status,
        error,
        params: case.cfg.params(),
        peak_bytes: reading.peak_bytes,
        retained_bytes: reading.retained_bytes,
        alloc_count: reading.alloc_count,
        predicted_peak_bytes: None,
        predicted_retained_bytes: None,
        cpu_user_s: reading.cpu_user_s,
        cpu_sys_s: reading.cpu_sys_s,
        wall_s: reading.wall_s,
        rss_peak_bytes: reading.rss_peak_bytes,
        logits_rel_error: reading.logits_rel_error,
        peak_meter: peak_meter.into(),
        reserved_peak_bytes: reading.reserved_peak_bytes,
        device_used_bytes: reading.device_used_bytes,
        nvml_process_peak_bytes: reading.nvml_process_peak_bytes,
        gpu_util_mean_pct: reading.gpu_util_mean_pct,
        gpu_power_peak_w: reading.gpu_power_peak_w,
        nvml_samples_count: reading.nvml_samples_count,
        threads: meta.threads,
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
        trim_layer: reading.trim_layer.unwrap_or_default().into(),
        trim_before_bytes: reading.trim_before_bytes,
        trim_after_bytes: reading.trim_after_bytes,
        trim_live_bytes: reading.trim_live_bytes,
        heap_start_bytes: reading.heap_start_bytes,
        moe_routing: reading
            .moe_routing
            .as_deref()
            .map(crate::model::moe::format_routing)
            .unwrap_or_default(),
        moe_tokens_max: reading
            .moe_routing
            .as_ref()
            .and_then(|r| r.iter().flatten().max().map(|&n| n as u64)),
        moe_tokens_min: reading
            .moe_routing
            .as_ref()
            .and_then(|r| r.iter().flatten().min().map(|&n| n as u64)),
        active_params: case.data.is_none().then(|| case.cfg.active_params()),
        kv_bytes_per_token: (case.cfg.vision.is_none() && case.data.is_none())
            .then(|| crate::formula::transformer::Shape::of(case).kv_bytes_per_token()),
        sliding_window: case
            .cfg
            .llama
            .filter(|l| !l.mixed_windows())
            .and_then(|l| l.sliding_window)
            .map(|w| w as u64),
    };
    match &case.data {
        Some(d) => crate::data::bench::row(row, d, figures),
        None => row,
    }
}

/// Which projections of a block carry biases: `qkv`, `o`, `mlp` (comma-separated), or `none`.
pub fn biases(cfg: &crate::model::transformer::Config) -> String {
    let (qkv, o, mlp) = cfg
        .llama
        .map_or((true, true, true), |l| (l.qkv_bias, l.o_bias, l.mlp_bias));
    let v: Vec<&str> = [(qkv, "qkv"), (o, "o"), (mlp, "mlp")]
        .iter()
        .filter(|x| x.0)
        .map(|x| x.1)
        .collect();
    if v.is_empty() {
        "none".into()
    } else {
        v.join(",")
    }
}
