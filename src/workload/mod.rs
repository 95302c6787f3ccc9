//! Workloads: a TOML file (or flags) describing grids of cases.
//!
//! ```toml
//! name = "example"
//! threads = 1                 # optional; --threads overrides
//! [defaults]                  # applies to every [[grid]]
//! phases = ["init", "forward", "backward", "optimizer", "train-step", "inference"]
//! optimizer = "adamw"
//! [[grid]]                    # lists expand to their Cartesian product
//! preset = "tiny"
//! batch = [1, 2]
//! seq = [16, 33]
//! [[grid]]
//! batch = 3
//! seq = 100
//! hidden = 96
//! heads = 3
//! layers = 5
//! vocab = 300
//! ```
//!
//! Every key may be a single value or a list. Model sizes not given come from `preset`
//! (default `tiny`); a case that changes any size is recorded with preset `custom`, and its
//! position table is as long as its sequence. Flags given beside a file override that key in
//! every grid. Validation happens before anything runs, so bad input writes nothing.
//!
//! A grid whose phases include `dataload` is a data-pipeline grid (`dataload.rs`): it takes
//! only `dataload` and no model phase, expands `batch` (images per batch), `dataset`,
//! `workers`, `worker_kind`, `prefetch`, `storage`, `persistent`, `epochs`, `crop` and
//! `device`, and ignores the model keys. Every other grid ignores the data keys, so they never
//! multiply model cases (a `--workers` flag beside a model workload changes nothing there).

mod dataload;
mod keys;

pub use keys::{GridArgs, GridSpec};

use itertools::iproduct;
use serde::Deserialize;

use crate::device::{
    DeviceSpec, ElemType, HAS_CUDA, MAX_CUDA_ORDINAL, NO_CUDA, Precision, ServingWeights,
};
use crate::error::UserError;
use crate::model::ModelKind;
use crate::model::kernels::Kernels;
use crate::model::transformer::{self, Config, LoraBase, LoraTarget};
use crate::model::{hf_config, llama, vit};
use crate::step::Backward;
use crate::step::{OptimizerKind, Phase};

/// The embedded default workload (`workloads/default.toml`).
pub const DEFAULT_TOML: &str = include_str!("../../workloads/default.toml");

/// A scalar or a list in TOML.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T: Clone> OneOrMany<T> {
    pub fn to_vec(&self) -> Vec<T> {
        match self {
            OneOrMany::One(v) => vec![v.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

/// A workload file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadFile {
    pub name: Option<String>,
    pub description: Option<String>,
    pub threads: Option<i64>,
    /// Seconds one case may run before its process is killed (`--case-timeout`).
    pub case_timeout: Option<f64>,
    /// A folder for the memory timelines of the train steps (`--timeline` overrides it):
    /// `memfit run` writes each CPU case's measured one there (`case-N-train-step.json`),
    /// `memfit predict` the predicted ones (`predicted.json`, one trace process per case).
    pub timeline: Option<std::path::PathBuf>,
    #[serde(default)]
    pub defaults: GridSpec,
    #[serde(default)]
    pub grid: Vec<GridSpec>,
}

/// One fully resolved case.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub index: usize,
    pub model: ModelKind,
    pub preset: String,
    pub cfg: Config,
    pub batch: usize,
    pub seq: usize,
    pub dtype: ElemType,
    /// The `--hf-config` checkpoint's element type (`torch_dtype` / `dtype`), when it gives
    /// one: the default of `dtype`, except on the CPU, where candle has no bf16 matmul and a
    /// measured case runs f32 instead (its rows say both).
    pub checkpoint_dtype: Option<ElemType>,
    /// `Mixed`: f32 master weights, gradients and optimizer state; `dtype` is the 16-bit
    /// working type of weights copies and activations.
    pub precision: Precision,
    pub device: DeviceSpec,
    pub optimizer: OptimizerKind,
    /// Blocks per gradient-checkpoint segment; 0 = no checkpointing.
    pub checkpoint: usize,
    /// The backward: by block (the default) or the whole graph (`phase::by_block`); with
    /// checkpointing always by segment.
    pub backward: Backward,
    /// Elements per quantization block of `adamw-8bit`.
    pub optimizer_block: usize,
    /// Tokens the `decode` phase generates.
    pub decode_tokens: usize,
    /// Decode with a key/value cache (else recompute the prefix per token).
    pub kv_cache: bool,
    /// Weights of the inference phases.
    pub weights: ServingWeights,
    /// `load` phase: memory-map the file instead of reading it.
    pub load_mmap: bool,
    /// Requested phases, sorted in run order, no duplicates.
    pub phases: Vec<Phase>,
    /// `dataload` cases: the pipeline's settings (the model fields are unused).
    pub data: Option<crate::data::DataCase>,
    /// The CPU threads flush subnormal floats to zero (`phase::denormals`).
    pub flush_denormals: bool,
    /// The meters trim the heap around each window (`meter::rusage`, `meter::trim`); off:
    /// the RSS peak and trim figures are missing.
    pub trim: bool,
    /// The folder this case's measured timelines go to (`run --timeline`, or the workload's
    /// `timeline`): the train step's and the serving phases', CPU allocator events or the CUDA
    /// pool's samples. Set by `memfit run`, `None` from the expander.
    pub timeline: Option<std::path::PathBuf>,
}

/// The size limits (inclusive), defined beside the models they bound.
pub use crate::model::limits::*;

/// The cases whose `--hf-config` checkpoint says its element type, grouped by (checkpoint type,
/// the type the case runs in): the first case of each group and how many it holds, in order.
/// What `run` and `predict` say once per group.
pub fn checkpoint_dtypes(cases: &[Case]) -> Vec<(&Case, usize)> {
    let mut groups: Vec<(&Case, usize)> = Vec::new();
    for c in cases.iter().filter(|c| c.checkpoint_dtype.is_some()) {
        match groups
            .iter_mut()
            .find(|(g, _)| (g.checkpoint_dtype, g.dtype) == (c.checkpoint_dtype, c.dtype))
        {
            Some((_, n)) => *n += 1,
            None => groups.push((c, 1)),
        }
    }
    groups
}

/// Parses a workload file's text; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<WorkloadFile, UserError> {
    toml::from_str(text).map_err(|e| UserError::Syntax {
        origin: origin.to_string(),
        message: e.to_string().trim_end().to_string(),
    })
}

/// Reads and parses a workload file.
pub fn load(path: &std::path::Path) -> Result<WorkloadFile, UserError> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| UserError::Unreadable {
        origin: origin.clone(),
        what: "workload file",
        message: e.to_string(),
    })?;
    parse(&text, &origin)
}

struct Ctx<'a> {
    origin: &'a str,
    grid: usize,
    /// Cases that are only predicted may name a device this build cannot run.
    predict_only: bool,
}

impl Ctx<'_> {
    fn key(&self, k: &str) -> String {
        format!("grid[{}].{k}", self.grid)
    }

    fn range(&self, k: &str, v: i64, lo: i64, hi: i64) -> Result<usize, UserError> {
        if v < lo || v > hi {
            return Err(UserError::OutOfRange {
                origin: self.origin.into(),
                key: self.key(k),
                value: v.to_string(),
                reason: if v <= 0 {
                    "sizes must be positive".into()
                } else {
                    "too large".into()
                },
                allowed: format!("{lo}..={hi}"),
            });
        }
        Ok(v as usize)
    }

    /// The names under `k` (`default` when absent), each parsed and checked, each value kept
    /// once in the order given; an empty list, an unknown name or a failed check is an error.
    fn choices<T: PartialEq>(
        &self,
        k: &str,
        names: &Option<OneOrMany<String>>,
        default: &str,
        (unknown, allowed): (&str, &str),
        parse: impl Fn(&str) -> Option<T>,
        check: impl Fn(&str, &T) -> Result<(), UserError>,
    ) -> Result<Vec<T>, UserError> {
        let names = names
            .as_ref()
            .map_or_else(|| vec![default.to_string()], OneOrMany::to_vec);
        if names.is_empty() {
            return Err(self.bad(k, "[]", "empty list", allowed));
        }
        let mut values = Vec::new();
        for name in &names {
            let value = parse(name).ok_or_else(|| self.bad(k, name, unknown, allowed))?;
            check(name, &value)?;
            if !values.contains(&value) {
                values.push(value);
            }
        }
        Ok(values)
    }

    /// The sizes under `k`, each checked against `lo..=hi`; `[default]` when the key is absent
    /// (`None`: the preset decides); an empty list is an error.
    fn list(
        &self,
        k: &str,
        v: &Option<OneOrMany<i64>>,
        default: Option<usize>,
        lo: i64,
        hi: i64,
    ) -> Result<Vec<Option<usize>>, UserError> {
        match v {
            None => Ok(vec![default]),
            Some(v) => {
                let v = v.to_vec();
                if v.is_empty() {
                    return Err(self.bad(k, "[]", "empty list", &format!("{lo}..={hi}")));
                }
                v.into_iter()
                    .map(|x| self.range(k, x, lo, hi).map(Some))
                    .collect()
            }
        }
    }

    /// [`Ctx::list`] for a key with a default value.
    fn values(
        &self,
        k: &str,
        v: &Option<OneOrMany<i64>>,
        default: usize,
        lo: i64,
        hi: i64,
    ) -> Result<Vec<usize>, UserError> {
        Ok(self
            .list(k, v, Some(default), lo, hi)?
            .into_iter()
            .flatten()
            .collect())
    }

    /// An `on`/`off` switch under `k` (default `on`), as booleans.
    fn on_off(&self, k: &str, names: &Option<OneOrMany<String>>) -> Result<Vec<bool>, UserError> {
        self.choices(
            k,
            names,
            "on",
            ("unknown setting", "on, off"),
            |name| match name {
                "on" => Some(true),
                "off" => Some(false),
                _ => None,
            },
            |_, _| Ok(()),
        )
    }

    fn bad(&self, k: &str, value: &str, reason: &str, allowed: &str) -> UserError {
        UserError::OutOfRange {
            origin: self.origin.into(),
            key: self.key(k),
            value: value.into(),
            reason: reason.into(),
            allowed: allowed.into(),
        }
    }
}

/// Expands the grids of `file` (with `flags` laid over every grid) into validated cases.
/// A file without `[[grid]]` tables is one grid made of its defaults.
/// The kernels a case runs without a `kernels` key or flag, on every device (`--help` prints
/// it from here).
pub const DEFAULT_KERNELS: &str = "transformers";

/// The attention a case runs without an `attention` key or flag, on every device.
pub const DEFAULT_ATTENTION: &str = "efficient";

/// The backward a case runs without a `backward` key or flag.
pub const DEFAULT_BACKWARD: &str = "by-block";

pub fn expand(file: &WorkloadFile, flags: &GridSpec, origin: &str) -> Result<Vec<Case>, UserError> {
    expand_with(file, flags, origin, false)
}

/// [`expand`] for cases that are only predicted (`memfit predict`): a CUDA device is accepted
/// even by a build without the `cuda` feature.
pub fn expand_for_prediction(
    file: &WorkloadFile,
    flags: &GridSpec,
    origin: &str,
) -> Result<Vec<Case>, UserError> {
    expand_with(file, flags, origin, true)
}

fn expand_with(
    file: &WorkloadFile,
    flags: &GridSpec,
    origin: &str,
    predict_only: bool,
) -> Result<Vec<Case>, UserError> {
    let grids: Vec<GridSpec> = if file.grid.is_empty() {
        vec![GridSpec::default()]
    } else {
        file.grid.clone()
    };
    let mut cases = Vec::new();
    for (gi, g) in grids.iter().enumerate() {
        let spec = file.defaults.overlay(g).overlay(flags);
        let ctx = Ctx {
            origin,
            grid: gi,
            predict_only,
        };
        expand_grid(&spec, &ctx, &mut cases)?;
    }
    Ok(cases)
}

fn expand_grid(spec: &GridSpec, ctx: &Ctx, cases: &mut Vec<Case>) -> Result<(), UserError> {
    // A Hugging Face config gives the family and the sizes; else the family is given, or that
    // of the preset (a `vit-…` preset means ViT, a LLaMA one LLaMA).
    let hf = match &spec.hf_config {
        None if spec.hf_set.is_some() => {
            return Err(ctx.bad(
                "hf_set",
                &spec
                    .hf_set
                    .as_ref()
                    .map(|v| v.join(" "))
                    .unwrap_or_default(),
                "changes to a config file without hf_config",
                "hf_set beside hf_config",
            ));
        }
        None => None,
        Some(path) => {
            if let Some(p) = &spec.preset {
                return Err(ctx.bad(
                    "preset",
                    p,
                    "a preset beside hf_config (the config gives the sizes)",
                    "one of preset, hf_config",
                ));
            }
            let sets = spec.hf_set.as_deref().unwrap_or_default();
            Some(hf_config::load_with(std::path::Path::new(path), sets)?)
        }
    };
    let family_of = |name: &str| {
        if vit::PRESETS.contains(&name) {
            ModelKind::Vit
        } else if llama::presets().contains(&name) {
            ModelKind::Llama
        } else {
            ModelKind::Gpt
        }
    };
    let given = match spec.model.as_deref() {
        None => None,
        Some("gpt") => Some(ModelKind::Gpt),
        Some("vit") => Some(ModelKind::Vit),
        Some("llama") => Some(ModelKind::Llama),
        Some(other) => return Err(ctx.bad("model", other, "unknown model", "gpt, vit, llama")),
    };
    let model = match (&hf, given) {
        (Some(hf), Some(m)) if hf.kind != m => {
            return Err(ctx.bad(
                "model",
                m.as_str(),
                &format!(
                    "hf_config's model_type = {} is the {} family",
                    hf.model_type,
                    hf.kind.as_str()
                ),
                hf.kind.as_str(),
            ));
        }
        (Some(hf), _) => hf.kind,
        (None, Some(m)) => m,
        (None, None) => spec.preset.as_deref().map_or(ModelKind::Gpt, family_of),
    };
    let presets = match model {
        ModelKind::Gpt => transformer::PRESETS.to_vec(),
        ModelKind::Vit => vit::PRESETS.to_vec(),
        ModelKind::Llama => llama::presets(),
    };
    let (preset_name, preset) = match &hf {
        Some(hf) => {
            let path = spec.hf_config.as_deref().unwrap_or_default();
            let stem = std::path::Path::new(path)
                .file_stem()
                .map_or("config".into(), |s| s.to_string_lossy().to_string());
            // The changes name the slice: `hf:deepseek-v2-lite[num_hidden_layers=2]`.
            let name = match spec.hf_set.as_deref() {
                Some(sets) if !sets.is_empty() => format!("hf:{stem}[{}]", sets.join(",")),
                _ => format!("hf:{stem}"),
            };
            (name, hf.cfg.clone())
        }
        None => {
            let name = spec.preset.clone().unwrap_or_else(|| presets[0].into());
            let cfg = Config::preset(&name)
                .filter(|_| family_of(&name) == model)
                .ok_or_else(|| {
                    ctx.bad(
                        "preset",
                        &name,
                        &format!("unknown preset for model = {}", model.as_str()),
                        &presets.join(", "),
                    )
                })?;
            (name, cfg)
        }
    };
    // Keys that belong to another family are refused rather than ignored.
    let vision_keys = [
        ("image", spec.image.is_some()),
        ("patch", spec.patch.is_some()),
        ("channels", spec.channels.is_some()),
        ("classes", spec.classes.is_some()),
    ];
    let token_keys = [
        ("seq", spec.seq.is_some()),
        ("max_seq", spec.max_seq.is_some()),
        ("vocab", spec.vocab.is_some()),
        ("tied", spec.tied.is_some()),
    ];
    let llama_keys = [
        ("kv_heads", spec.kv_heads.is_some()),
        ("head_dim", spec.head_dim.is_some()),
        ("intermediate", spec.intermediate.is_some()),
        ("attention_bias", spec.attention_bias.is_some()),
    ];
    if model != ModelKind::Llama
        && let Some((k, _)) = llama_keys.iter().find(|(_, set)| *set)
    {
        return Err(ctx.bad(k, "set", "a LLaMA key on another family", "model = llama"));
    }
    match model {
        ModelKind::Gpt | ModelKind::Llama => {
            if let Some((k, _)) = vision_keys.iter().find(|(_, set)| *set) {
                let family = if model == ModelKind::Gpt {
                    "GPT"
                } else {
                    "LLaMA"
                };
                return Err(ctx.bad(
                    k,
                    "set",
                    &format!("a ViT key on a {family} case"),
                    "model = vit",
                ));
            }
        }
        ModelKind::Vit => {
            if let Some((k, _)) = token_keys.iter().find(|(_, set)| *set) {
                return Err(ctx.bad(
                    k,
                    "set",
                    "a ViT's sequence is its patches + 1 and its outputs are classes",
                    "image, patch, channels, classes",
                ));
            }
        }
    }
    let device_name = spec.device.clone().unwrap_or_else(|| "cpu".into());
    let device = DeviceSpec::parse(&device_name).ok_or_else(|| {
        ctx.bad(
            "device",
            &device_name,
            "unknown device",
            &format!("cpu, cuda, cuda:0..={MAX_CUDA_ORDINAL}"),
        )
    })?;
    if device.is_cuda() && !HAS_CUDA && !ctx.predict_only {
        return Err(ctx.bad("device", &device_name, NO_CUDA, "cpu"));
    }
    // The checkpoint's element type (`torch_dtype` / `dtype` of --hf-config) is the default;
    // where this device cannot run it (bf16 on the CPU) a measured case runs f32 and its rows
    // say what the checkpoint holds (`checkpoint_dtype`); a prediction answers in it anyway.
    let checkpoint_dtype = hf.as_ref().and_then(|h| h.dtype);
    let default_dtype = match checkpoint_dtype {
        Some(ElemType::Bf16) if device == DeviceSpec::Cpu && !ctx.predict_only => ElemType::F32,
        Some(d) => d,
        None => ElemType::F32,
    };
    let dtypes = ctx.choices(
        "dtype",
        &spec.dtype,
        default_dtype.as_str(),
        ("unknown element type", ElemType::NAMES),
        ElemType::parse,
        |name, &dtype| {
            if device == DeviceSpec::Cpu
                && dtype == ElemType::Bf16
                && !(ctx.predict_only && spec.dtype.is_none())
            {
                return Err(ctx.bad(
                    "dtype",
                    name,
                    "candle's CPU matmul has no bf16",
                    "f32, f16 on cpu; f32, bf16, f16 on cuda",
                ));
            }
            Ok(())
        },
    )?;
    let phases: Vec<Phase> = match &spec.phases {
        None => Phase::DEFAULT.to_vec(),
        Some(list) => {
            let mut ps = Vec::new();
            for p in list {
                let ph = Phase::parse(p)
                    .ok_or_else(|| ctx.bad("phases", p, "unknown phase", &Phase::names()))?;
                if !ps.contains(&ph) {
                    ps.push(ph);
                }
            }
            if ps.is_empty() {
                return Err(ctx.bad("phases", "[]", "no phase given", &Phase::names()));
            }
            if model == ModelKind::Vit
                && let Some(p) = ps
                    .iter()
                    .find(|p| matches!(p, Phase::Prefill | Phase::Decode))
            {
                return Err(ctx.bad(
                    "phases",
                    p.as_str(),
                    "generation needs a decoder, not a ViT",
                    "init, forward, backward, optimizer, train-step, inference, load",
                ));
            }
            ps.sort();
            ps
        }
    };
    if phases.contains(&Phase::Dataload) {
        return dataload::expand(spec, ctx, &phases, device, cases);
    }
    let optimizers = ctx.choices(
        "optimizer",
        &spec.optimizer,
        "adamw",
        ("unknown optimizer", &OptimizerKind::names()),
        OptimizerKind::parse,
        |_, _| Ok(()),
    )?;

    let batches = ctx.list("batch", &spec.batch, Some(1), 1, MAX_BATCH)?;
    let seqs = ctx.list("seq", &spec.seq, None, 1, MAX_SEQ)?;
    let max_seqs = ctx.list("max_seq", &spec.max_seq, None, 1, MAX_SEQ)?;
    let hiddens = ctx.list("hidden", &spec.hidden, None, 1, MAX_HIDDEN)?;
    let heads = ctx.list("heads", &spec.heads, None, 1, MAX_HEADS)?;
    let layers = ctx.list("layers", &spec.layers, None, 1, MAX_LAYERS)?;
    let vocabs = ctx.list("vocab", &spec.vocab, None, 1, MAX_VOCAB)?;
    let images = ctx.list("image", &spec.image, None, 1, MAX_IMAGE)?;
    let patches = ctx.list("patch", &spec.patch, None, 1, MAX_IMAGE)?;
    let channels = ctx.list("channels", &spec.channels, None, 1, MAX_CHANNELS)?;
    let classes = ctx.list("classes", &spec.classes, None, 1, MAX_VOCAB)?;
    let visions: Vec<_> = iproduct!(&images, &patches, &channels, &classes).collect();
    let precisions = ctx.choices(
        "precision",
        &spec.precision,
        "pure",
        ("unknown precision", "pure, mixed"),
        Precision::parse,
        |name, &p| {
            if p == Precision::Mixed && dtypes.contains(&ElemType::F32) {
                return Err(ctx.bad(
                    "precision",
                    name,
                    "mixed precision needs a 16-bit dtype (its f32 part is the master copy)",
                    "dtype = f16 or bf16 with precision = mixed",
                ));
            }
            Ok(())
        },
    )?;
    // (efficient op, tiled composition): `efficient` is the CPU op on the CPU and the tiled
    // composition on CUDA, where the op has no kernel.
    // gpt-oss's attention sinks, Gemma 2's soft-capped scores and Llama 4's chunks are built
    // into the standard attention only: its default for them.
    let standard_only = preset
        .llama
        .as_ref()
        .and_then(|l| l.standard_attention_only());
    let attentions = ctx.choices(
        "attention",
        &spec.attention,
        if standard_only.is_some() {
            "standard"
        } else {
            DEFAULT_ATTENTION
        },
        ("unknown attention", "standard, efficient, tiled"),
        |name| match name {
            "standard" => Some((false, false)),
            "efficient" if device.is_cuda() => Some((false, true)),
            "efficient" => Some((true, false)),
            "tiled" => Some((false, true)),
            _ => None,
        },
        |name, &(efficient, tiled)| match standard_only {
            Some((why, allowed)) if efficient || tiled => {
                Err(ctx.bad("attention", name, why, allowed))
            }
            _ => Ok(()),
        },
    )?;
    // Fused is the default on every device (CPU loops, or `fused.cu` on CUDA).
    let kernel_choices = ctx.choices(
        "kernels",
        &spec.kernels,
        DEFAULT_KERNELS,
        ("unknown kernels", Kernels::NAMES),
        Kernels::parse,
        |_, _| Ok(()),
    )?;
    // Subnormals flushed by default: the same memory, a backward up to 3.7× faster on the
    // CPU (SmolLM2-135M, BENCHMARKS § 4), results changed only below 2⁻¹²⁶.
    let flushes = ctx.choices(
        "flush_denormals",
        &spec.flush_denormals,
        "on",
        ("unknown setting", "on, off"),
        |name| match name {
            "on" => Some(true),
            "off" => Some(false),
            _ => None,
        },
        |_, _| Ok(()),
    )?;
    // One axis for both (the product macro takes at most twelve).
    let trims = ctx.choices(
        "trim",
        &spec.trim,
        "on",
        ("unknown setting", "on, off"),
        |name| match name {
            "on" => Some(true),
            "off" => Some(false),
            _ => None,
        },
        |_, _| Ok(()),
    )?;
    let backwards = ctx.choices(
        "backward",
        &spec.backward,
        DEFAULT_BACKWARD,
        ("unknown backward", Backward::NAMES),
        Backward::parse,
        |_, _| Ok(()),
    )?;
    let kernel_flush: Vec<(Kernels, bool, bool, Backward)> =
        iproduct!(&kernel_choices, &flushes, &trims, &backwards)
            .map(|(&k, &f, &t, &b)| (k, f, t, b))
            .collect();
    let lora_ranks = ctx.values("lora_rank", &spec.lora_rank, 0, 0, MAX_HIDDEN)?;
    let mut lora_targets: Vec<LoraTarget> = Vec::new();
    let family_targets: Vec<LoraTarget> = preset.projections().iter().map(|p| p.target).collect();
    let target_names = preset.lora_target_names();
    for name in spec
        .lora_targets
        .clone()
        .unwrap_or_else(|| vec!["q".into(), "v".into()])
    {
        if name == "all" {
            lora_targets = family_targets.clone();
            continue;
        }
        let t = LoraTarget::parse(&name)
            .filter(|t| family_targets.contains(t))
            .ok_or_else(|| {
                ctx.bad(
                    "lora_targets",
                    &name,
                    &format!("not a projection of model = {}", model.as_str()),
                    target_names,
                )
            })?;
        if !lora_targets.contains(&t) {
            lora_targets.push(t);
        }
    }
    if lora_targets.is_empty() {
        return Err(ctx.bad("lora_targets", "[]", "empty list", target_names));
    }
    // A checkpoint shipped in FP8 (hf_config's `quantization_config`): LoRA freezes its base
    // as shipped, and serving holds it so, unless the key says otherwise.
    let shipped = match &hf {
        Some(h) => h.shipped,
        None => spec.preset.as_deref().and_then(llama::preset_shipped),
    };
    let shipped_fp8 = shipped == Some(hf_config::Shipped::Fp8);
    // gpt-oss ships its experts in MXFP4: served so unless the key says otherwise.
    let shipped_mxfp4 = shipped == Some(hf_config::Shipped::Mxfp4Experts);
    // CUDA's default is candle's own matmul (the frozen-linear op runs there too).
    let lora_bases = ctx.choices(
        "lora_base",
        &spec.lora_base,
        if shipped_fp8 {
            "fp8"
        } else if device.is_cuda() {
            "detach"
        } else {
            "op"
        },
        ("unknown LoRA base", LoraBase::NAMES),
        LoraBase::parse,
        |_, _| Ok(()),
    )?;
    let optimizer_blocks =
        ctx.values("optimizer_block", &spec.optimizer_block, 2048, 1, 1 << 24)?;
    let decode_tokens = ctx.values("decode_tokens", &spec.decode_tokens, 16, 1, MAX_SEQ)?;
    let kv_caches = ctx.on_off("kv_cache", &spec.kv_cache)?;
    let decodes = phases.contains(&Phase::Decode);
    let loads = ctx.choices(
        "load",
        &spec.load,
        "read",
        ("unknown load mode", "read, mmap"),
        |name| match name {
            "read" => Some(false),
            "mmap" => Some(true),
            _ => None,
        },
        |_, _| Ok(()),
    )?;
    let weights = ctx.choices(
        "weights",
        &spec.weights,
        if shipped_fp8 && lora_ranks.iter().all(|&r| r == 0) {
            "fp8"
        } else if shipped_mxfp4 && lora_ranks.iter().all(|&r| r == 0) {
            "mxfp4-experts"
        } else {
            "model"
        },
        ("unknown weights", ServingWeights::NAMES),
        ServingWeights::parse,
        |name, &w| {
            let quantized = w.quantized().is_some();
            if quantized && lora_ranks.iter().any(|&r| r > 0) {
                return Err(ctx.bad(
                    "weights",
                    name,
                    "quantized serving of a LoRA model is not supported",
                    "model, f16",
                ));
            }
            Ok(())
        },
    )?;
    let checkpoints = ctx.values("checkpoint", &spec.checkpoint, 0, 0, MAX_LAYERS)?;

    // One case per combination, the axes in this order (the last varies fastest); each check
    // runs on the first combination it concerns.
    let kv_heads = ctx.list("kv_heads", &spec.kv_heads, None, 1, MAX_HEADS)?;
    let head_dims = ctx.list("head_dim", &spec.head_dim, None, 2, MAX_HIDDEN)?;
    let intermediates = ctx.list("intermediate", &spec.intermediate, None, 1, MAX_HIDDEN)?;
    let tieds = match &spec.tied {
        None => vec![None],
        Some(_) => ctx
            .on_off("tied", &spec.tied)?
            .into_iter()
            .map(Some)
            .collect(),
    };
    let biases = match &spec.attention_bias {
        None => vec![None],
        Some(_) => ctx
            .choices(
                "attention_bias",
                &spec.attention_bias,
                "off",
                ("unknown setting", "off, qkv, on"),
                |name| match name {
                    "off" => Some((false, false)),
                    "qkv" => Some((true, false)),
                    "on" => Some((true, true)),
                    _ => None,
                },
                |_, _| Ok(()),
            )?
            .into_iter()
            .map(Some)
            .collect(),
    };
    let archs: Vec<_> = iproduct!(&kv_heads, &head_dims, &intermediates, &tieds, &biases).collect();
    let shapes = iproduct!(
        &batches,
        &seqs,
        &max_seqs,
        &hiddens,
        &heads,
        &layers,
        &vocabs,
        &visions,
        &archs,
        &optimizers
    );
    for (
        &b,
        &s,
        &ms,
        &h,
        &a,
        &l,
        &v,
        &(&img, &p, &c, &k),
        &(&g, &hd, &inter, &tied, &bias),
        &opt,
    ) in shapes
    {
        // A preset with only its depth changed keeps its name (a slice of it: the `layers`
        // column says how many blocks); any other size key makes it `custom`.
        let custom = [ms, h, a, v, img, p, c, k, g, hd, inter]
            .iter()
            .any(Option::is_some)
            || tied.is_some()
            || bias.is_some()
            || (s.is_some() && spec.preset.is_none() && hf.is_none());
        let mut cfg = preset.clone();
        if let Some(mut vis) = cfg.vision {
            vis.image = img.unwrap_or(vis.image);
            vis.patch = p.unwrap_or(vis.patch);
            vis.channels = c.unwrap_or(vis.channels);
            if vis.patch > vis.image || vis.image % vis.patch != 0 {
                return Err(ctx.bad(
                    "patch",
                    &vis.patch.to_string(),
                    &format!("does not divide image = {}", vis.image),
                    "a divisor of image",
                ));
            }
            cfg.vision = Some(vis);
            cfg.max_seq = vis.seq();
            cfg.vocab = k.unwrap_or(cfg.vocab);
        }
        if let Some(h) = h {
            cfg.hidden = h;
        }
        if let Some(a) = a {
            cfg.heads = a;
        }
        if let Some(l) = l {
            cfg.layers = l;
        }
        if let Some(v) = v {
            cfg.vocab = v;
        }
        if let Some(t) = tied {
            cfg.tied = t;
        }
        if let Some(mut ll) = cfg.llama {
            if let Some(g) = g {
                ll.kv_heads = g;
            }
            if let Some(i) = inter {
                ll.intermediate = i;
            }
            if let Some((qkv, o)) = bias {
                ll.qkv_bias = qkv;
                ll.o_bias = o;
            }
            ll.head_dim = match (hd, ll.mla) {
                // MLA: `head_dim` is the rotary part's width, one of its latent sizes.
                (Some(d), Some(_)) => {
                    return Err(ctx.bad(
                        "head_dim",
                        &d.to_string(),
                        "multi-head latent attention sizes its heads with qk_nope_head_dim, \
                         qk_rope_head_dim and v_head_dim",
                        "no head_dim with an MLA model (change those fields with hf_set)",
                    ));
                }
                (None, Some(m)) => m.qk_rope_head_dim,
                (Some(d), None) => d,
                // New widths without a head_dim: hidden / heads.
                (None, None) if h.is_some() || a.is_some() => {
                    if cfg.hidden % cfg.heads != 0 {
                        return Err(ctx.bad(
                            "heads",
                            &cfg.heads.to_string(),
                            &format!(
                                "hidden = {} is not divisible by heads (give head_dim)",
                                cfg.hidden
                            ),
                            "a divisor of hidden, or a head_dim",
                        ));
                    }
                    cfg.hidden / cfg.heads
                }
                (None, None) => ll.head_dim,
            };
            // A partial rotary (GLM-4.5, Phi-4-mini, Qwen3-Next) keeps its fraction of a head
            // that changed width.
            let old = cfg.llama.map_or(ll.head_dim, |o| o.head_dim);
            if let Some(w) = ll.variant.partial_rotary
                && ll.head_dim != old
            {
                let scaled = w * ll.head_dim;
                if scaled % old != 0 || (scaled / old) % 2 != 0 || scaled / old == 0 {
                    return Err(ctx.bad(
                        "head_dim",
                        &ll.head_dim.to_string(),
                        &format!(
                            "the model rotates {w} of each head's {old} dimensions, which is no \
                             even part of {}",
                            ll.head_dim
                        ),
                        &format!("a head_dim whose {w}/{old} is a whole, even number"),
                    ));
                }
                ll.variant.partial_rotary = Some(scaled / old);
            }
            if ll.head_dim % 2 != 0 {
                return Err(ctx.bad(
                    "head_dim",
                    &ll.head_dim.to_string(),
                    "the rotary embedding rotates pairs",
                    "an even head_dim",
                ));
            }
            if cfg.heads % ll.kv_heads != 0 {
                return Err(ctx.bad(
                    "kv_heads",
                    &ll.kv_heads.to_string(),
                    &format!("does not divide heads = {}", cfg.heads),
                    "a divisor of heads",
                ));
            }
            cfg.llama = Some(ll);
        }
        let seq = match cfg.vision {
            Some(vis) => vis.seq(),
            None => s.unwrap_or(cfg.max_seq.min(64)),
        };
        cfg.max_seq = if let Some(ms) = ms {
            ms
        } else if custom && spec.preset.is_none() && hf.is_none() && cfg.vision.is_none() {
            // A custom shape gets a position table as long as its sequence.
            seq
        } else {
            cfg.max_seq
        };
        if cfg.llama.is_none() && cfg.hidden % cfg.heads != 0 {
            return Err(ctx.bad(
                "heads",
                &cfg.heads.to_string(),
                &format!("hidden = {} is not divisible by heads", cfg.hidden),
                "a divisor of hidden",
            ));
        }
        if seq > cfg.max_seq {
            return Err(ctx.bad(
                "seq",
                &seq.to_string(),
                "longer than the position table",
                &format!("1..={} (max_seq)", cfg.max_seq),
            ));
        }
        let batch = b.expect("batch has a default");
        check_bytes(&cfg, batch, seq, ctx)?;
        let variants = iproduct!(
            &loads,
            &weights,
            &decode_tokens,
            &kv_caches,
            &optimizer_blocks,
            &lora_bases,
            &lora_ranks,
            &precisions,
            &attentions,
            &kernel_flush,
            &checkpoints,
            &dtypes
        );
        for (
            &load_mmap,
            &serve,
            &decode,
            &kv_cache,
            &optimizer_block,
            &lora_base,
            &rank,
            &precision,
            &(efficient, tiled),
            &(kernels, flush_denormals, trim, backward),
            &k,
            &dtype,
        ) in variants
        {
            // Decoding needs positions for the new tokens.
            let mut cfg = cfg.clone();
            if decodes {
                if custom && ms.is_none() && hf.is_none() {
                    cfg.max_seq = seq + decode;
                } else if seq + decode > cfg.max_seq {
                    return Err(ctx.bad(
                        "decode_tokens",
                        &decode.to_string(),
                        "prompt + new tokens exceed the position table",
                        &format!("1..={} (max_seq - seq)", cfg.max_seq.saturating_sub(seq)),
                    ));
                }
            }
            if rank > cfg.hidden {
                return Err(ctx.bad(
                    "lora_rank",
                    &rank.to_string(),
                    "a rank above the hidden size",
                    &format!("0..={} (hidden)", cfg.hidden),
                ));
            }
            let moe = cfg.llama.and_then(|l| l.moe).is_some();
            // LoRA on a mixture of experts: adapters on the experts' (and shared experts')
            // projections it targets; the router stays frozen.
            if moe && rank > 0 && lora_base.quantized() {
                return Err(ctx.bad(
                    "lora_base",
                    lora_base.as_str(),
                    "QLoRA over a mixture of experts is not built yet",
                    "op, detach with a mixture-of-experts model",
                ));
            }
            if !moe && serve.experts_only() {
                return Err(ctx.bad(
                    "weights",
                    serve.as_str(),
                    "the experts alone in MXFP4, in a model without experts",
                    "mxfp4 (every block projection) or model, f16 for a dense model",
                ));
            }
            if moe && serve.quantized().is_some_and(|q| q.ggml().is_some()) {
                return Err(ctx.bad(
                    "weights",
                    serve.as_str(),
                    "GGML-quantized serving of a mixture of experts is not built yet",
                    "model, f16, fp8, mxfp4 with a mixture-of-experts model",
                ));
            }
            if k > cfg.layers {
                return Err(ctx.bad(
                    "checkpoint",
                    &k.to_string(),
                    "more blocks per segment than the model has",
                    &format!("0..={} (layers)", cfg.layers),
                ));
            }
            // A checkpointed backward runs segment by segment: there is no whole graph.
            if k > 0 && backward == Backward::Whole {
                return Err(ctx.bad(
                    "backward",
                    "whole",
                    &format!(
                        "checkpoint = {k} runs the backward segment by segment (there is no whole graph to keep)"
                    ),
                    "by-block with checkpoint > 0, or checkpoint = 0",
                ));
            }
            let quantized = serve.quantized().or((rank > 0).then_some(lora_base));
            // With `mxfp4-experts` only the experts' projections are cut into blocks.
            let held = |path: &str| {
                !serve.experts_only()
                    || rank > 0
                    || path.contains("experts.")
                    || path.contains("mlp.shared.")
            };
            if let Some((q, block)) = quantized.and_then(|q| q.row_block().map(|b| (q, b)))
                && let Some((_, _, p)) = cfg
                    .all_projections()
                    .iter()
                    .find(|p| held(&p.1) && p.2.inp % block != 0)
            {
                let key = if rank > 0 { "lora_base" } else { "weights" };
                return Err(ctx.bad(
                    key,
                    if rank > 0 {
                        lora_base.as_str()
                    } else {
                        serve.as_str()
                    },
                    &format!(
                        "a {} block holds {block} weights of a row: {}'s input width {} is not a multiple of {block}",
                        q.as_str(), p.path, p.inp
                    ),
                    &format!(
                        "model, f16, or a block type whose block divides every projection input ({block} does not)"
                    ),
                ));
            }
            // The frozen-linear op runs in the activations' type; mixed precision's per-forward
            // 16-bit copies would have to cover the frozen weights too, which it does not model.
            if rank > 0 && lora_base != LoraBase::Detach && precision == Precision::Mixed {
                return Err(ctx.bad(
                    "lora_base",
                    lora_base.as_str(),
                    "the frozen-linear op (and QLoRA's blocks) with mixed precision",
                    "detach with precision mixed, or precision pure",
                ));
            }
            cases.push(Case {
                index: cases.len(),
                model,
                preset: if custom {
                    "custom".into()
                } else {
                    preset_name.clone()
                },
                cfg: Config {
                    efficient_attention: efficient,
                    tiled_attention: tiled,
                    kernels,
                    lora_rank: rank,
                    lora_targets: if rank > 0 {
                        lora_targets.clone()
                    } else {
                        Vec::new()
                    },
                    lora_base,
                    ..cfg.clone()
                },
                batch,
                seq,
                dtype,
                checkpoint_dtype,
                precision,
                device,
                optimizer: opt,
                checkpoint: k,
                backward,
                optimizer_block,
                decode_tokens: if decodes { decode } else { 0 },
                kv_cache,
                weights: serve,
                load_mmap,
                phases: phases.clone(),
                data: None,
                flush_denormals,
                trim,
                timeline: None,
            });
        }
    }
    Ok(())
}

/// Rejects cases whose largest tensor (or the whole parameter set) cannot be addressed.
fn check_bytes(cfg: &Config, batch: usize, seq: usize, ctx: &Ctx) -> Result<(), UserError> {
    let (b, s, h, a, v) = (
        batch as u128,
        seq as u128,
        cfg.hidden as u128,
        cfg.heads as u128,
        cfg.vocab as u128,
    );
    // Every size is ≤ 2^24, so the parameter count (≤ 2^14 layers of a few 2^40) fits u64.
    let params = cfg.params() as u128;
    let mlp = cfg.llama.map_or(4 * h, |l| l.intermediate as u128);
    let image = cfg.vision.map_or(0, |vis| {
        4 * b * (vis.channels * vis.image * vis.image) as u128
    });
    let checks: [(&str, &str, u128); 5] = [
        (
            "seq",
            "attention scores batch × heads × seq² × 4 B",
            4 * b * a * s * s,
        ),
        ("vocab", "logits batch × seq × vocab × 4 B", 4 * b * s * v),
        (
            "batch",
            "MLP activations batch × seq × MLP width × 4 B",
            4 * b * s * mlp,
        ),
        ("hidden", "parameters × 4 B", 4 * params),
        ("image", "images batch × channels × image² × 4 B", image),
    ];
    for (key, what, bytes) in checks {
        if bytes > MAX_TENSOR_BYTES {
            return Err(ctx.bad(
                key,
                &format!("{bytes} B"),
                &format!("the byte count of {what} overflows"),
                &format!("configs whose tensors stay ≤ {MAX_TENSOR_BYTES} B"),
            ));
        }
    }
    Ok(())
}
