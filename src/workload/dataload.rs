//! Data-pipeline grids: `phases = ["dataload"]` (alone). Keys and their ranges:
//!
//! | key | values | default |
//! |---|---|---|
//! | `dataset` | a folder written by `memfit dataset make` (must exist) | required |
//! | `batch` | images per batch, 1..=4096 | 32 |
//! | `workers` | 0..=256 (0 = the main thread) | 0 |
//! | `worker_kind` | thread, process | thread |
//! | `prefetch` | batches ahead per worker, 1..=64 | 2 |
//! | `storage` | ram, mmap, stream | ram |
//! | `persistent` | on, off | on |
//! | `epochs` | 1..=1000 | 2 |
//! | `crop` | 8..=1024 px | 224 |
//!
//! Lists expand; the last key below varies fastest: batch, crop, epochs, storage, persistent,
//! prefetch, worker_kind, workers. With `workers = 0`, `worker_kind`, `prefetch` and
//! `persistent` do not apply: one case per remaining combination (the first values given).

use itertools::iproduct;

use super::{Case, Ctx, OneOrMany};
use crate::data::{DataCase, Storage, WorkerKind};
use crate::device::{DeviceSpec, ElemType, Precision, ServingWeights};
use crate::error::UserError;
use crate::model::ModelKind;
use crate::model::transformer::Config;
use crate::step::{OptimizerKind, Phase};

pub(super) fn expand(
    spec: &super::GridSpec,
    ctx: &Ctx,
    phases: &[Phase],
    device: DeviceSpec,
    cases: &mut Vec<Case>,
) -> Result<(), UserError> {
    if phases != [Phase::Dataload] {
        return Err(ctx.bad(
            "phases",
            &phases
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            "dataload builds no model and runs alone",
            "[\"dataload\"], or model phases without it",
        ));
    }
    let dataset = spec.dataset.clone().ok_or_else(|| {
        ctx.bad(
            "dataset",
            "(none)",
            "a dataload grid needs its dataset",
            "a folder written by `memfit dataset make --out DIR`",
        )
    })?;
    let path = std::path::PathBuf::from(&dataset);
    if !path.join(crate::data::dataset::MANIFEST).is_file() {
        return Err(ctx.bad(
            "dataset",
            &dataset,
            "no manifest.json there",
            "a folder written by `memfit dataset make --out DIR`",
        ));
    }
    // Each value once, in the order given.
    let ints = |k: &str, v: &Option<OneOrMany<i64>>, default: usize, lo: i64, hi: i64| {
        let mut out: Vec<usize> = Vec::new();
        for x in ctx.values(k, v, default, lo, hi)? {
            if !out.contains(&x) {
                out.push(x);
            }
        }
        Ok::<_, UserError>(out)
    };
    let batches = ints("batch", &spec.batch, 32, 1, 4096)?;
    let workers = ints("workers", &spec.workers, 0, 0, 256)?;
    let prefetches = ints("prefetch", &spec.prefetch, 2, 1, 64)?;
    let epochs = ints("epochs", &spec.epochs, 2, 1, 1000)?;
    let crops = ints("crop", &spec.crop, 224, 8, 1024)?;
    let kinds = ctx.choices(
        "worker_kind",
        &spec.worker_kind,
        "thread",
        ("unknown worker kind", WorkerKind::NAMES),
        WorkerKind::parse,
        |_, _| Ok(()),
    )?;
    let storages = ctx.choices(
        "storage",
        &spec.storage,
        "ram",
        ("unknown storage", Storage::NAMES),
        Storage::parse,
        |_, _| Ok(()),
    )?;
    let persistents = ctx.on_off("persistent", &spec.persistent)?;
    let tiny = Config::preset("tiny").expect("the tiny preset exists");
    let grid = iproduct!(
        &batches,
        &crops,
        &epochs,
        &storages,
        &persistents,
        &prefetches,
        &kinds,
        &workers
    );
    for (&batch, &crop, &epochs, &storage, &persistent, &prefetch, &kind, &w) in grid {
        let main = w == 0;
        if main && (kind != kinds[0] || prefetch != prefetches[0] || persistent != persistents[0]) {
            continue;
        }
        cases.push(Case {
            index: cases.len(),
            model: ModelKind::Gpt,
            preset: String::new(),
            cfg: tiny.clone(),
            batch,
            seq: 0,
            dtype: ElemType::F32,
            checkpoint_dtype: None,
            precision: Precision::Pure,
            device,
            optimizer: OptimizerKind::Adamw,
            checkpoint: 0,
            backward: crate::step::Backward::ByBlock,
            optimizer_block: 0,
            decode_tokens: 0,
            kv_cache: false,
            weights: ServingWeights::Model,
            load_mmap: false,
            phases: vec![Phase::Dataload],
            data: Some(DataCase {
                dataset: path.clone(),
                workers: w,
                kind: if main { WorkerKind::Thread } else { kind },
                prefetch: if main { 0 } else { prefetch },
                storage,
                persistent: main || persistent,
                epochs,
                batch,
                crop: crop as u32,
                seed: 0,
            }),
            flush_denormals: false,
            trim: true,
            timeline: None,
        });
    }
    Ok(())
}
