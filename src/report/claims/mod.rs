//! The claims table: one function per claim ID of the seed note, each computing from the rows
//! it is given what was measured, what the formula (or the claim itself) predicts, and a
//! one-line verdict. A claim the rows cannot test says which workload would; no number here is
//! anything but a stored measurement, a stored prediction, or arithmetic on them (B5 and F3 say
//! when they are derived or predicted rather than measured). What is fitted or predicted
//! beyond the rows comes in from the caller: the `dataload` rows' RAM fits and throughput
//! curves ([`Fitted`], `crate::fit::dataload`) and the full-size figures
//! ([`FullSize`], `crate::formula::full_size`).

use std::collections::BTreeMap;

use crate::fit::dataload::{Curve, RamFit};
use crate::formula::full_size::{self, FullSize};
use crate::record::{Row, Status};
use crate::step::Phase;
use crate::units::human_bytes;

mod data;
mod forward;
mod inference;
mod training;

/// One line of the claims table.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Claim {
    pub id: &'static str,
    /// The claim, in short.
    pub claim: &'static str,
    /// The workloads whose rows were used (or the one that would test it).
    pub workload: String,
    pub measured: String,
    pub predicted: String,
    /// The rule the verdict follows from, with its thresholds.
    pub criterion: String,
    /// Starts with one of [`KINDS`]' words; the rest says why, with numbers from the rows.
    pub verdict: String,
}

/// The words a verdict starts with, in the order the summary counts them.
pub const KINDS: [&str; 6] = [
    "holds",
    "partly",
    "does not hold",
    "open",
    "derived",
    "not applicable",
];

impl Claim {
    /// The verdict's kind: the first of [`KINDS`] it starts with (`"other"` for none, which a
    /// test on the committed results forbids).
    pub fn kind(&self) -> &'static str {
        KINDS
            .iter()
            .find(|k| self.verdict.starts_with(*k))
            .copied()
            .unwrap_or("other")
    }
}

/// Every claim ID, in the seed note's order, with its short statement.
pub const IDS: [(&str, &str); 27] = [
    ("D1", "big datasets sit in RAM or are memory-mapped"),
    ("D2", "more loader workers, more RAM"),
    ("D3", "augmentation makes temporary images (RAM peaks)"),
    (
        "D4",
        "decoding/augmenting costs CPU; workers ≈ 0.5–0.8 × cores",
    ),
    ("D5", "loading barely touches GPU memory"),
    (
        "D6",
        "pinned memory speeds copies; persistent workers avoid re-spawns",
    ),
    ("F1", "activations ∝ batch × sequence × hidden × layers"),
    (
        "F2",
        "ViT-B/16, 224 px, batch 32: activations of several GB",
    ),
    ("F3", "an LLM at S 4096, B 4: activations over 20 GB"),
    ("F4", "a smaller batch is the most direct fix"),
    ("F5", "checkpointing trades compute for memory"),
    ("F6", "memory-efficient attention cuts attention memory"),
    ("B1", "gradients are as large as the parameters"),
    ("B2", "SGD keeps no state; Adam keeps 2 × the parameters"),
    (
        "B3",
        "AdamW + fp16 ≈ 6 × the 16-bit parameter memory: 12 B/param (2 + 2 + 8: 16-bit weights and gradients, f32 moments); literature 16–18 B",
    ),
    ("B4", "1 B parameters, fp16 + AdamW ≈ 18 GB"),
    (
        "B5",
        "ZeRO 2/3 shards state: memory falls with the GPU count",
    ),
    (
        "B6",
        "LoRA/QLoRA train small adapters: memory drops sharply",
    ),
    ("B7", "8-bit optimizer states halve optimizer memory"),
    ("I1", "weights ≈ parameters × bytes per element"),
    ("I2", "half precision halves it"),
    (
        "N1",
        "inference holds only parameters, inputs and activations",
    ),
    ("N2", "inference total ≈ 2 × parameter memory"),
    ("N3", "loading holds the model file in host RAM"),
    ("N4", "a KV cache costs 2 × L × B × S × H × bytes"),
    ("N5", "int8/int4 weights halve memory or more"),
    ("N6", "graph compilation speeds inference"),
];

fn statement(id: &str) -> &'static str {
    IDS.iter().find(|(i, _)| *i == id).map_or("", |(_, s)| s)
}

/// The fits of the `dataload` rows the claims quote (D2, D4), made by the caller with
/// `crate::fit::dataload` on the same rows as [`evaluate`]'s, every device (the claims pick
/// the CPU's).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fitted {
    /// [`crate::fit::dataload::ram_fits`].
    pub ram: Vec<RamFit>,
    /// [`crate::fit::dataload::curves`].
    pub curves: Vec<Curve>,
}

/// Evaluates every claim on `rows`; `workload_of` maps a run id to its workload's name and
/// `cores_of` to the machine's cores (the runs' `meta`), `fitted` holds the `dataload` fits of
/// `rows` and `full` the full-size figures.
pub fn evaluate(
    rows: &[Row],
    workload_of: &BTreeMap<String, String>,
    cores_of: &BTreeMap<String, u64>,
    fitted: &Fitted,
    full: &FullSize,
    ranks: &[crate::ranks::RanksDoc],
) -> Vec<Claim> {
    let ctx = Ctx {
        rows: rows.iter().filter(|r| r.status == Status::Ok).collect(),
        workload_of,
        cores_of,
        fitted,
        full,
        ranks,
    };
    IDS.iter().map(|(id, _)| ctx.claim(id)).collect()
}

struct Ctx<'a> {
    rows: Vec<&'a Row>,
    workload_of: &'a BTreeMap<String, String>,
    /// Run id → the machine's cores (D4's advice is in cores).
    cores_of: &'a BTreeMap<String, u64>,
    /// The `dataload` fits of the rows, made before any claim.
    fitted: &'a Fitted,
    /// The full-size figures, computed before any claim.
    full: &'a FullSize,
    /// The multi-rank runs (`memfit ranks`): claim B5 measured.
    ranks: &'a [crate::ranks::RanksDoc],
}

fn mb(b: f64) -> String {
    human_bytes(b)
}

fn elem(r: &Row) -> f64 {
    match r.dtype.as_str() {
        "f16" | "bf16" => 2.0,
        _ => 4.0,
    }
}

fn ret(r: &Row) -> Option<f64> {
    r.retained_bytes.map(|v| v as f64)
}

/// Plain full training: no LoRA, no checkpointing, standard attention (the scores the
/// textbook activation formulas count), pure precision.
fn plain(r: &Row) -> bool {
    full_state(r) && r.attention == "standard"
}

/// Full training's model state, whatever the attention (it changes activations only): no
/// LoRA, no checkpointing, pure precision.
fn full_state(r: &Row) -> bool {
    r.lora_rank == 0 && r.checkpoint == 0 && r.precision != "mixed"
}

/// A label for a config: preset (or H/L) with B and S.
fn label(r: &Row) -> String {
    let shape = if r.preset == "custom" {
        format!("H{} L{}", r.hidden, r.layers)
    } else {
        r.preset.clone()
    };
    format!("{shape} B{} S{}", r.batch, r.seq)
}

/// A config's label without one axis (the one a sweep varies): shape, B, S and dtype, and
/// the attention kind when it is not the standard one.
fn label_without(r: &Row, axis: &str) -> String {
    let mut parts = vec![
        if r.preset == "custom" || axis == "hidden" || axis == "layers" {
            let h = if axis == "hidden" {
                String::new()
            } else {
                format!("H{} ", r.hidden)
            };
            let l = if axis == "layers" {
                String::new()
            } else {
                format!("L{}", r.layers)
            };
            let name = if r.preset == "custom" { "" } else { &r.preset };
            format!("{name} {h}{l}").trim().to_string()
        } else {
            format!("{} L{}", r.preset, r.layers)
        },
    ];
    if axis != "batch" {
        parts.push(format!("B{}", r.batch));
    }
    if axis != "seq" {
        parts.push(format!("S{}", r.seq));
    }
    parts.push(r.dtype.clone());
    if r.attention == "efficient" && axis != "seq" {
        parts.push("efficient attention".into());
    }
    parts.join(" ")
}

/// Every configuration field but `skip`, to find rows that differ in one axis only.
pub fn config_key(r: &Row, skip: &str) -> String {
    config_key_without(r, &[skip])
}

/// Every configuration field but those in `skip` (`"run"` and `"threads"` included).
pub fn config_key_without(r: &Row, skip: &[&str]) -> String {
    let f = |name: &str, v: String| {
        if skip.contains(&name) {
            "*".to_string()
        } else {
            v
        }
    };
    [
        f("run", r.run_id.clone()),
        f("model", r.model.clone()),
        f("batch", r.batch.to_string()),
        f("seq", r.seq.to_string()),
        f("max_seq", r.max_seq.to_string()),
        f("hidden", r.hidden.to_string()),
        f("heads", r.heads.to_string()),
        f("layers", r.layers.to_string()),
        f("vocab", r.vocab.to_string()),
        f(
            "arch",
            format!(
                "{} {} {} {} {}",
                r.kv_heads, r.head_dim, r.intermediate, r.tied, r.biases
            ),
        ),
        f("dtype", r.dtype.clone()),
        f("device", r.device.clone()),
        f("optimizer", r.optimizer.clone()),
        f("optimizer_block", r.optimizer_block.to_string()),
        f("checkpoint", r.checkpoint.to_string()),
        f("decode_tokens", r.decode_tokens.to_string()),
        f("kv_cache", r.kv_cache.clone()),
        f("weights", r.weights.clone()),
        f("load", r.load.clone()),
        f("attention", r.attention.clone()),
        f(
            "lora",
            format!("{} {} {}", r.lora_rank, r.lora_targets, r.lora_base),
        ),
        f("precision", r.precision.clone()),
        f("phase", r.phase.to_string()),
        f("threads", r.threads.to_string()),
    ]
    .join("|")
}

/// Rows of `phase` grouped by every field but `axis` (the run id included), sorted by `x`;
/// only groups where `axis` takes at least two values.
pub fn sweeps<'a>(
    rows: &[&'a Row],
    phase: Phase,
    axis: &str,
    x: impl Fn(&Row) -> u64,
) -> Vec<Vec<&'a Row>> {
    let mut by: BTreeMap<String, Vec<&Row>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.phase == phase) {
        by.entry(config_key(r, axis)).or_default().push(r);
    }
    by.into_values()
        .filter_map(|mut v| {
            v.sort_by_key(|r| x(r));
            v.dedup_by_key(|r| x(r));
            (v.len() >= 2).then_some(v)
        })
        .collect()
}

impl<'a> Ctx<'a> {
    fn phase(&self, phase: Phase) -> impl Iterator<Item = &'a Row> + '_ {
        self.rows.iter().copied().filter(move |r| r.phase == phase)
    }

    fn workloads(&self, used: &[&Row]) -> String {
        let mut names: Vec<&str> = used
            .iter()
            .map(|r| {
                self.workload_of
                    .get(&r.run_id)
                    .map_or(r.run_id.as_str(), |s| s.as_str())
            })
            .collect();
        names.sort();
        names.dedup();
        names.join(", ")
    }

    /// The rows of the same run and case as `r`, by phase.
    fn case_of(&self, r: &Row) -> BTreeMap<&'a str, &'a Row> {
        self.rows
            .iter()
            .filter(|o| o.run_id == r.run_id && o.case == r.case)
            .map(|o| (o.phase.as_str(), *o))
            .collect()
    }

    fn make(
        &self,
        id: &'static str,
        used: &[&Row],
        measured: String,
        predicted: String,
        criterion: &str,
        verdict: String,
    ) -> Claim {
        Claim {
            id,
            claim: statement(id),
            workload: self.workloads(used),
            measured,
            predicted,
            criterion: criterion.to_string(),
            verdict,
        }
    }

    fn missing(&self, id: &'static str, would: &str) -> Claim {
        Claim {
            id,
            claim: statement(id),
            workload: "—".into(),
            measured: format!("not measured in these results: {would}"),
            predicted: "—".into(),
            criterion: "—".into(),
            verdict: format!("open: {would} decide it"),
        }
    }

    fn claim(&self, id: &'static str) -> Claim {
        let c = match id {
            "D1" => self.d1(),
            "D2" => self.d2(),
            "D3" => self.d3(),
            "D4" => self.d4(),
            "D5" => self.d5(),
            "D6" => self.d6(),
            "F1" => self.f1(),
            "F2" => self.f2(),
            "F3" => self.f3(),
            "F4" => self.f4(),
            "F5" => self.f5(),
            "F6" => self.f6(),
            "B1" => self.b1(),
            "B2" => self.b2(),
            "B3" => self.b3(),
            "B4" => self.b4(),
            "B5" => self.b5(),
            "B6" => self.b6(),
            "B7" => self.b7(),
            "I1" => self.i1(),
            "I2" => self.i2(),
            "N1" => self.n1(),
            "N2" => self.n2(),
            "N3" => self.n3(),
            "N4" => self.n4(),
            "N5" => self.n5(),
            "N6" => return self.n6(),
            _ => None,
        };
        c.unwrap_or_else(|| self.missing(id, would(id)))
    }
}

pub use crate::fit::line::Affine;

/// `a/b/c` of a list.
fn slash<T: ToString>(v: impl IntoIterator<Item = T>) -> String {
    v.into_iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join("/")
}

fn minmax(v: impl Iterator<Item = f64>) -> (f64, f64) {
    v.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
        (a.min(x), b.max(x))
    })
}

/// Mean value per label, in first-seen order.
fn dedup_mean(v: &[(&Row, String, f64)]) -> Vec<(String, f64)> {
    let mut out: Vec<(String, f64, usize)> = Vec::new();
    for (_, k, x) in v {
        match out.iter_mut().find(|(l, _, _)| l == k) {
            Some(e) => {
                e.1 += x;
                e.2 += 1;
            }
            None => out.push((k.clone(), *x, 1)),
        }
    }
    out.into_iter().map(|(k, s, n)| (k, s / n as f64)).collect()
}

/// The workload that would test a claim the rows do not cover.
fn would(id: &str) -> &'static str {
    match id {
        "D5" => {
            "`dataload` rows on a CUDA device (`workloads/gpu-dataload.toml`, run by `scripts/gpu-run.sh`) would"
        }
        "D1" | "D2" | "D3" | "D4" | "D6" => {
            "`dataload` rows (`workloads/seed-dataload.toml`) would"
        }
        "F1" => {
            "forward rows differing only in batch or sequence (`seed-attention`, `seed-checkpoint`) would"
        }
        "F2" => "a ViT-B/16 forward at 224 px (`seed-vit`) would",
        "F3" => "two depths of a LLaMA-7B-sized slice (`seed-f3-slice`) would",
        "F4" => "train-step rows at several batch sizes (`seed-checkpoint`) would",
        "F5" => "train-step rows at several checkpoint segment lengths (`seed-checkpoint`) would",
        "F6" => "standard and efficient attention at the same shape (`seed-attention`) would",
        "B1" | "B2" | "B7" => "`seed-optimizers` would",
        "B3" | "B4" | "B5" => {
            "`seed-precision` (init, backward and optimizer of AdamW in f16 pure and mixed) would"
        }
        "B6" => "`seed-lora` would",
        "I1" => "init rows (the default workload) would",
        "I2" => "f32 and f16 init or load rows (`seed-precision`, `seed-load`) would",
        "N1" | "N2" => "init and inference rows of one case (the default workload) would",
        "N3" => "`seed-load` (read and mmap) would",
        "N4" => "`seed-decode` would",
        "N5" => "`seed-quantized` would",
        _ => "no workload",
    }
}

/// [`evaluate`] with what `memfit report` computes for it: the `dataload` fits of `rows` and
/// the full-size figures (computed once).
#[cfg(test)]
fn evaluate_rows(rows: &[Row], workload_of: &BTreeMap<String, String>) -> Vec<Claim> {
    evaluate_rows_on(rows, workload_of, &BTreeMap::new())
}

/// [`evaluate_rows`] with the runs' cores.
#[cfg(test)]
fn evaluate_rows_on(
    rows: &[Row],
    workload_of: &BTreeMap<String, String>,
    cores_of: &BTreeMap<String, u64>,
) -> Vec<Claim> {
    static FULL: std::sync::OnceLock<FullSize> = std::sync::OnceLock::new();
    let full = FULL.get_or_init(|| FullSize::compute().expect("the full-size figures"));
    let fitted = Fitted {
        ram: crate::fit::dataload::ram_fits(rows),
        curves: crate::fit::dataload::curves(rows),
    };
    evaluate(rows, workload_of, cores_of, &fitted, full, &[])
}

#[cfg(test)]
mod perturb;
#[cfg(test)]
mod sides;

#[cfg(test)]
mod tests {
    use super::*;

    fn row(phase: &str, optimizer: &str, retained: i64) -> Row {
        let mut r = Row::example();
        r.phase = crate::step::Phase::parse(phase).expect("a phase");
        r.optimizer = optimizer.into();
        r.retained_bytes = Some(retained);
        r.peak_bytes = Some(retained.max(0) as u64 + 100);
        r
    }

    /// Worked by hand: 1000 parameters; gradients 4004 B → 4.004 B/param (0.1 % over 4);
    /// AdamW state 8000 B → 8.000, SGD 0; a decode of T 5 with the cache, L 3, B 2, H 16, f32
    /// grows by 2·3·2·5·16·4 = 3840 B exactly.
    #[test]
    fn claims_from_hand_made_rows() {
        let mut sgd = row("optimizer", "sgd", 0);
        sgd.case = 1;
        let mut dec = row("decode", "adamw", 3840);
        dec.case = 2;
        dec.decode_tokens = 5;
        dec.kv_cache = "on".into();
        dec.weights = "model".into();
        let rows = vec![
            row("backward", "adamw", 4004),
            row("optimizer", "adamw", 8000),
            sgd,
            dec,
        ];
        let c = evaluate_rows(&rows, &BTreeMap::from([("r".into(), "hand".into())]));
        let get = |id: &str| c.iter().find(|c| c.id == id).unwrap();
        assert!(
            get("B1").measured.contains("f32 4.0040–4.0040"),
            "{:?}",
            get("B1")
        );
        assert!(get("B1").verdict.starts_with("holds (within 0.10 %"));
        assert_eq!(get("B1").workload, "hand");
        assert!(
            get("B2").measured.contains("adamw 8.000") && get("B2").measured.contains("sgd 0.000")
        );
        assert!(get("B2").verdict.starts_with("holds"));
        assert!(
            get("N4").measured.contains("T5: 3840 B")
                && get("N4").verdict.starts_with("holds exactly")
        );
        // Off by one byte: no longer exact.
        let mut off = rows.clone();
        off[3].retained_bytes = Some(3841);
        let c = evaluate_rows(&off, &BTreeMap::new());
        assert!(
            c.iter()
                .find(|c| c.id == "N4")
                .unwrap()
                .verdict
                .starts_with("does not hold exactly")
        );
    }

    #[test]
    fn every_id_once_and_missing_says_why() {
        let c = evaluate_rows(&[], &BTreeMap::new());
        assert_eq!(c.len(), IDS.len());
        for (claim, (id, _)) in c.iter().zip(IDS) {
            assert_eq!(claim.id, id);
        }
        let d1 = &c[0];
        assert!(d1.measured.starts_with("not measured in these results:"));
        assert!(
            c.iter()
                .find(|c| c.id == "N6")
                .unwrap()
                .measured
                .contains("candle has no graph compilation")
        );
        assert!(
            c.iter()
                .find(|c| c.id == "B1")
                .unwrap()
                .measured
                .contains("seed-optimizers")
        );
    }
}
