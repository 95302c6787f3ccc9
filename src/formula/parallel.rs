//! Beyond one device (issue 53), first part: the model states each rank holds under a parallel
//! layout, from the model's own tensor list ([`crate::model::config::Blocks`]), tensor by
//! tensor, to the element.
//!
//! A layout is `tp` tensor-parallel ranks × `pp` pipeline stages × `dp` data-parallel replicas
//! (`tp·pp·dp` GPUs), ZeRO stage `zero` over the data-parallel group, and `ep` expert-parallel
//! ranks inside it. What a rank holds, as Megatron-Core lays a model out:
//! - **Tensor parallel**: the column-parallel projections (q, k, v, gate, up, fc1; MLA's q_b and
//!   kv_b) hold `out/tp` rows (and their bias's share), the row-parallel ones (o, down, fc2)
//!   `in/tp` columns (their bias whole); K/V heads fewer than `tp` are replicated, one head a
//!   rank; norms, routers, the shared-expert gate and MLA's down-projections (q_a, kv_a) are
//!   whole on every rank; attention sinks split by head. The token table and the head are split
//!   by vocabulary (`⌈V/tp⌉` rows a rank: the vocabulary padded to a multiple of `tp`).
//! - **Pipeline parallel**: stage `s` holds its layers; the first the token (and position)
//!   table, the last the final norm and the head (a tied head: the last stage holds its own copy
//!   of the table, as Megatron keeps the two in step by an all-reduce). Layers split evenly;
//!   where `pp` does not divide them, every stage gets `⌈L/pp⌉` and the missing layers are taken
//!   from the outermost stages first (first, last, second, second-to-last, …), which carry the
//!   embedding and the head: Llama 3.1 405B's 126 layers over 16 stages are 7, 8 × 14, 7.
//! - **Expert parallel**: a mixture's experts split over `ep` ranks (`E/ep` each), each expert
//!   also split over `tp` (expert tensor parallelism equal to `tp`, Megatron-Core's default).
//! - **ZeRO** over the data-parallel group: stage 1 shards the optimizer state, 2 also the
//!   gradients, 3 also the weights ([`super::zero::shards`]); under mixed precision the
//!   weights are the f32 masters, which stage 1 shards with the state (the ZeRO paper's
//!   `K = 12` for Adam), the 16-bit working copy being made in the step's graph; an expert's
//!   states shard over its own data-parallel group, `dp/ep` ranks (its replicas).
//!
//! Bytes per parameter are the single device's (`e` for the weights and the gradients, f32
//! masters and gradients under mixed precision; the optimizer's state: Adam and AdamW `2e`, SGD
//! with momentum `e`, SGD none), or under mixed precision those of the regime `amp=` names
//! ([`Amp`]: autocast's, Megatron-Core's or DeepSpeed's, [`regime`]); ZeRO-3 adds each rank's
//! gathered layer ([`gathered_layer`]).
//!
//! Activations ([`stage_activations`]), for a dense LLaMA-family decoder: the training graph
//! one microbatch leaves on a rank, from the replay of the rank's shard (the same layer code at
//! the shard's shapes: heads, K/V heads, the MLP's width and the vocabulary split `tp` ways, the
//! hidden size whole, as tensor parallelism without sequence parallelism keeps the norms' and
//! the residual stream's activations on every rank), times the microbatches 1F1B keeps in
//! flight on stage `s`: `min(mb, pp − s)` (measured on real ranks: `memfit ranks --pp`); with `sp=on` the part tensor parallelism leaves
//! whole split by sequence too ([`sequence_parallel`]). Not in these figures: the backward's
//! transients ([`backward_transient`] bounds them for `--parallel search`), the collectives'
//! buffers (NCCL's; ZeRO-3's gathered layer is [`gathered_layer`]). A mixture of experts and
//! MLA split as their weights do ([`shard`]: each expert's width, MLA's heads; the router, the
//! dispatched tokens and MLA's latents whole on every rank), predicted by the same replay but
//! not measured on ranks (`ranks --tp` runs dense LLaMA-family blocks); sequence parallelism
//! over a mixture is refused by name.

use std::ops::Range;
use std::str::FromStr;

use super::transformer::Shape;
use super::zero;
use crate::model::config::{BlockTensor, Config};
use crate::step::{OptimizerKind, Phase};

/// A parallel layout: `tp × pp × dp` GPUs, ZeRO `zero` over `dp`, `ep` expert-parallel ranks,
/// `mb` microbatches a step through the pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Layout {
    pub tp: usize,
    pub pp: usize,
    pub dp: usize,
    pub zero: u8,
    pub ep: usize,
    pub mb: usize,
    /// Virtual stages a rank (Megatron's interleaved 1F1B, `--num-layers-per-virtual-pipeline-stage`):
    /// each of the `pp` ranks holds `vp` chunks of `L/(pp·vp)` layers, chunk `c` of rank `s`
    /// the model's virtual stage `c·pp + s`; 1: the non-interleaved schedule.
    pub vp: usize,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            tp: 1,
            pp: 1,
            dp: 1,
            zero: 0,
            ep: 1,
            mb: 1,
            vp: 1,
        }
    }
}

impl FromStr for Layout {
    type Err = String;

    /// `tp=8,pp=16,dp=4,zero=1,ep=1,mb=16` (any subset, any order; the rest 1, ZeRO 0).
    fn from_str(s: &str) -> Result<Self, String> {
        let mut l = Layout::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| {
                format!("--parallel: `{part}` is not KEY=VALUE (keys tp, pp, dp, zero, ep, mb, vp)")
            })?;
            let n: usize = v
                .parse()
                .map_err(|_| format!("--parallel: {k}={v}: the value must be a whole number"))?;
            match k {
                "tp" | "pp" | "dp" | "ep" | "mb" | "vp" if n == 0 => {
                    return Err(format!("--parallel: {k}=0: at least 1"));
                }
                "vp" => l.vp = n,
                "tp" => l.tp = n,
                "pp" => l.pp = n,
                "dp" => l.dp = n,
                "ep" => l.ep = n,
                "mb" => l.mb = n,
                "zero" if n <= 3 => l.zero = n as u8,
                "zero" => return Err(format!("--parallel: zero={n}: ZeRO stages are 0 to 3")),
                _ => {
                    return Err(format!(
                        "--parallel: unknown key `{k}` (keys tp, pp, dp, zero, ep, mb, vp)"
                    ));
                }
            }
        }
        Ok(l)
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Layout {
            tp,
            pp,
            dp,
            zero,
            ep,
            mb,
            vp,
        } = self;
        write!(f, "tp={tp},pp={pp},dp={dp},zero={zero},ep={ep},mb={mb}")?;
        if *vp > 1 {
            write!(f, ",vp={vp}")?;
        }
        Ok(())
    }
}

impl Layout {
    /// GPUs in all: `tp·pp·dp`.
    pub fn gpus(&self) -> usize {
        self.tp * self.pp * self.dp
    }

    /// Whether `cfg` can be laid out so, else why not (naming the sizes).
    pub fn check(&self, cfg: &Config) -> Result<(), String> {
        if cfg.vision.is_some() {
            return Err("--parallel: a ViT is not laid out over ranks (decoders only)".into());
        }
        if cfg.lora_rank > 0 {
            return Err("--parallel: LoRA is not laid out over ranks (full training only)".into());
        }
        let kv = cfg.kv_heads();
        if !cfg.heads.is_multiple_of(self.tp) {
            return Err(format!(
                "--parallel tp={}: the {} attention heads do not split into {} equal parts",
                self.tp, cfg.heads, self.tp
            ));
        }
        if kv >= self.tp && !kv.is_multiple_of(self.tp)
            || kv < self.tp && !self.tp.is_multiple_of(kv)
        {
            return Err(format!(
                "--parallel tp={}: the {kv} K/V heads neither split into {} parts nor replicate evenly over them",
                self.tp, self.tp
            ));
        }
        if self.pp > cfg.layers {
            return Err(format!(
                "--parallel pp={}: more stages than the model's {} layers",
                self.pp, cfg.layers
            ));
        }
        if self.vp > 1
            && (self.pp < 2
                || !cfg.layers.is_multiple_of(self.pp * self.vp)
                || !self.mb.is_multiple_of(self.pp))
        {
            return Err(format!(
                "--parallel vp={}: Megatron's interleaved schedule needs pp ≥ 2 (pp={}), the {} layers in pp·vp = {} equal chunks and the microbatches a multiple of pp (mb={})",
                self.vp,
                self.pp,
                cfg.layers,
                self.pp * self.vp,
                self.mb
            ));
        }
        if !self.dp.is_multiple_of(self.ep) {
            return Err(format!(
                "--parallel ep={}: the expert-parallel ranks must divide dp={} (experts are spread inside the data-parallel group)",
                self.ep, self.dp
            ));
        }
        let experts = cfg.llama.and_then(|l| l.moe).map(|m| m.experts);
        match experts {
            None if self.ep > 1 => Err(format!(
                "--parallel ep={}: the model has no mixture of experts",
                self.ep
            )),
            Some(e) if !e.is_multiple_of(self.ep) => Err(format!(
                "--parallel ep={}: the {e} experts do not split into {} equal parts",
                self.ep, self.ep
            )),
            _ => Ok(()),
        }
    }
}

/// The layers of each of `pp` stages ([module docs](self): `⌈L/pp⌉` each, the missing ones
/// taken from the outermost stages first).
pub fn stage_layers(layers: usize, pp: usize) -> Vec<Range<usize>> {
    let per = layers.div_ceil(pp);
    let mut counts = vec![per; pp];
    let mut missing = per * pp - layers;
    let mut outer = 0;
    while missing > 0 {
        let s = if outer % 2 == 0 {
            outer / 2
        } else {
            pp - 1 - outer / 2
        };
        counts[s] -= 1;
        missing -= 1;
        outer += 1;
    }
    let mut start = 0;
    counts
        .into_iter()
        .map(|n| {
            let r = start..start + n;
            start += n;
            r
        })
        .collect()
}

/// Each pipeline rank's chunks of layers: its stage ([`stage_layers`]) with `vp` 1; with
/// `vp` > 1 (the interleaved schedule) chunk `c` of rank `s` is virtual stage `c·pp + s` of
/// the `pp·vp` equal ones.
pub fn stage_chunks(layers: usize, pp: usize, vp: usize) -> Vec<Vec<Range<usize>>> {
    if vp <= 1 {
        return stage_layers(layers, pp)
            .into_iter()
            .map(|r| vec![r])
            .collect();
    }
    let virtual_stages = stage_layers(layers, pp * vp);
    (0..pp)
        .map(|s| {
            (0..vp)
                .map(|c| virtual_stages[c * pp + s].clone())
                .collect()
        })
        .collect()
}

/// Parameters one rank holds of a block tensor under `tp` (and, for a routed expert, whether it
/// is one): `(dense, expert)` elements; an expert outside `experts` (this rank's) none.
fn tensor_share(
    t: &BlockTensor,
    tp: u64,
    kv_heads: u64,
    layer_norm: bool,
    experts: &Range<usize>,
) -> (u64, u64) {
    match t {
        BlockTensor::Norm { size, .. } => ((1 + u64::from(layer_norm)) * *size as u64, 0),
        BlockTensor::Linear { inp, out, bias, .. } => {
            ((*inp * *out) as u64 + u64::from(*bias) * *out as u64, 0)
        }
        BlockTensor::Vector { size, .. } => (*size as u64 / tp, 0),
        BlockTensor::Proj { path, spec } => {
            let (inp, out) = proj_share(path, spec.inp as u64, spec.out as u64, tp, kv_heads);
            let n = inp * out + u64::from(spec.bias) * out;
            match expert_index(path) {
                Some(e) => (0, if experts.contains(&e) { n } else { 0 }),
                None => (n, 0),
            }
        }
    }
}

/// A projection's `(in, out)` on a rank of `tp` (Megatron's split, [`tensor_share`]): the
/// column-parallel ones by output, the row-parallel ones by input, K/V one head a rank where
/// there are fewer than `tp`, MLA's down-projections (q_a, kv_a) whole.
fn proj_share(path: &str, inp: u64, out: u64, tp: u64, kv_heads: u64) -> (u64, u64) {
    match path.rsplit('.').next().unwrap_or(path) {
        "k" | "v" if kv_heads < tp => (inp, out / kv_heads),
        "q" | "k" | "v" | "q_b" | "kv_b" | "gate" | "up" | "fc1" => (inp, out / tp),
        "o" | "down" | "fc2" => (inp / tp, out),
        _ => (inp, out),
    }
}

/// A routed expert's index, from its path (`mlp.experts.{e}.…`).
fn expert_index(path: &str) -> Option<usize> {
    path.strip_prefix("mlp.experts.").map(|rest| {
        rest.split('.')
            .next()
            .and_then(|e| e.parse().ok())
            .expect("an expert's path holds its index")
    })
}

/// How one serving rank holds a mixture's experts ([`serving_weight_bytes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServingExperts {
    /// Expert parallelism: this many routed experts whole (the first ones); else every expert
    /// split over tp.
    pub held_whole: Option<usize>,
    /// The shared experts whole (vLLM's sequence-parallel mixture), else split over tp.
    pub shared_whole: bool,
}

/// The bytes of one serving rank's weights (a single pipeline stage) in the serving copy
/// `serve` of a model of `e` bytes an element, tensor by tensor as the serving replay builds
/// them: every block projection at its tp share ([`proj_share`]; experts as `experts` says)
/// quantized as `serve` says (FP8 e4m3 with an f32 scale per 128 × 128 block, MXFP4 a byte per
/// two values and one per 32, GGML's blocks; `mxfp4-experts` the routed experts only), its bias
/// in the model's type; norms, routers, sinks, the vocab-parallel table and head (`⌈V/tp⌉`
/// rows) and the final norm in the model's type (`f16`: 2 bytes). Metadata is not counted.
pub fn serving_weight_bytes(
    cfg: &Config,
    tp: usize,
    experts: ServingExperts,
    e: u64,
    serve: crate::device::ServingWeights,
) -> u64 {
    use crate::model::shapes::{FP8_BLOCK, LoraBase, mxfp4_bytes};
    let tp = tp as u64;
    let e = if serve == crate::device::ServingWeights::F16 {
        2
    } else {
        e
    };
    let kv = cfg.kv_heads() as u64;
    let layer_norm = cfg.llama.is_none();
    let proj = |inp: u64, out: u64, routed: bool| -> u64 {
        let base = match serve.quantized() {
            Some(_) if serve.experts_only() && !routed => None,
            q => q,
        };
        let n = inp * out;
        match base {
            None => e * n,
            Some(LoraBase::Fp8) => FP8_BLOCK.bytes(out as usize, inp as usize),
            Some(LoraBase::Mxfp4) => mxfp4_bytes(out as usize, inp as usize),
            Some(q) => match q.ggml() {
                Some(g) => crate::model::frozen::quantized_bytes(n, g),
                None => e * n,
            },
        }
    };
    let blocks = cfg.blocks();
    let mut bytes = 0;
    for l in 0..cfg.layers {
        for t in blocks.layer(l) {
            bytes += match t {
                BlockTensor::Proj { path, spec } => {
                    let (inp, out) = (spec.inp as u64, spec.out as u64);
                    let routed = expert_index(path);
                    let whole = match routed {
                        Some(i) => match experts.held_whole {
                            Some(held) if i >= held => continue,
                            Some(_) => true,
                            None => false,
                        },
                        None => experts.shared_whole && path.starts_with("mlp.shared."),
                    };
                    let (inp, out) = if whole {
                        (inp, out)
                    } else {
                        proj_share(path, inp, out, tp, kv)
                    };
                    proj(inp, out, routed.is_some()) + e * u64::from(spec.bias) * out
                }
                other => e * tensor_share(other, tp, kv, layer_norm, &(0..0)).0,
            };
        }
    }
    let (v, h) = (cfg.vocab as u64, cfg.hidden as u64);
    let table = v.div_ceil(tp) * h;
    let tables = if cfg.tied { 1 } else { 2 };
    let final_norm = if layer_norm { 2 * h } else { h };
    let positions = if layer_norm {
        cfg.max_seq as u64 * h
    } else {
        0
    };
    bytes + e * (tables * table + final_norm + positions)
}

/// The parameters one rank of `tp` holds of a mixture's shared experts (the tensors under
/// `mlp.shared.`, every layer): each split as [`tensor_share`] splits a dense MLP (gate and up
/// by rows, down by columns); whole at tp 1.
pub fn shared_expert_params(cfg: &Config, tp: usize) -> u64 {
    let blocks = cfg.blocks();
    let (kv, layer_norm) = (cfg.kv_heads() as u64, cfg.llama.is_none());
    (0..cfg.layers)
        .flat_map(|l| blocks.layer(l).iter())
        .filter(|t| matches!(t, BlockTensor::Proj { path, .. } if path.starts_with("mlp.shared.")))
        .map(|t| tensor_share(t, tp as u64, kv, layer_norm, &(0..0)).0)
        .sum()
}

/// What one rank of a pipeline stage holds.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StageRank {
    pub stage: usize,
    /// Its layers (with interleaved stages, its first chunk's: every chunk in `chunks`).
    pub layers: Range<usize>,
    /// With interleaved stages (`vp` > 1): its chunks of layers, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<Range<usize>>,
    /// Parameters it holds before ZeRO shards them: the dense ones (replicated over `dp`) and
    /// its experts' (replicated over `dp/ep`).
    pub dense_params: u64,
    pub expert_params: u64,
    /// Model states after ZeRO.
    pub weights_bytes: u64,
    pub gradient_bytes: u64,
    pub optimizer_state_bytes: u64,
    /// ZeRO-Offload (`offload=optimizer`): the rank's optimizer partition in host memory
    /// (master weights, f32 gradient buffer, state: [`zero::offloaded`]); the device's
    /// `optimizer_state_bytes` are then 0. Absent without offload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_bytes: Option<u64>,
}

impl StageRank {
    /// The layers it holds.
    pub fn layer_count(&self) -> usize {
        if self.chunks.is_empty() {
            self.layers.len()
        } else {
            self.chunks.iter().map(|c| c.len()).sum()
        }
    }

    pub fn params(&self) -> u64 {
        self.dense_params + self.expert_params
    }

    pub fn model_state_bytes(&self) -> u64 {
        self.weights_bytes + self.gradient_bytes + self.optimizer_state_bytes
    }
}

/// Bytes per parameter of the weights, the gradients and the optimizer's state (`e`: the
/// parameters' element size, 4 under mixed precision); `None` for an optimizer whose state is
/// not a whole number of bytes a parameter (8-bit AdamW's blocks).
pub fn rates(e: u64, opt: OptimizerKind) -> Option<(u64, u64, u64)> {
    let state = match opt {
        OptimizerKind::Sgd => 0,
        OptimizerKind::SgdMomentum => e,
        OptimizerKind::Adam | OptimizerKind::Adamw => 2 * e,
        OptimizerKind::Adamw8bit => return None,
    };
    Some((e, e, state))
}

/// One rank of each pipeline stage of `cfg` under `layout` (every rank of a stage holds the
/// same), with `(weights, gradients, optimizer state)` bytes a parameter `rates`. `masters`
/// (mixed precision): the weights are the f32 masters, which ZeRO shards with the optimizer's
/// state from stage 1 on (the ZeRO paper's `K = 12` for Adam: masters and two moments), the
/// 16-bit working copy being made in the step's graph.
pub fn stage_ranks(
    cfg: &Config,
    layout: &Layout,
    rates: (u64, u64, u64),
    masters: bool,
) -> Vec<StageRank> {
    stage_ranks_of(cfg, layout, rates, masters, None)
}

/// [`stage_ranks`], with ZeRO-Offload where `offload` is `Some(master_in_state)`: each rank's
/// optimizer partition in host memory ([`zero::offloaded`]; `master_in_state`: the state's
/// rate counts the f32 master already, as megatron's and deepspeed's regimes do).
pub fn stage_ranks_of(
    cfg: &Config,
    layout: &Layout,
    rates: (u64, u64, u64),
    masters: bool,
    offload: Option<bool>,
) -> Vec<StageRank> {
    stage_shares(cfg, layout)
        .into_iter()
        .enumerate()
        .map(|(s, shares)| {
            let StageShares {
                chunks,
                dense,
                expert,
                ..
            } = shares;
            let layers = chunks[0].clone();
            let chunks = if chunks.len() > 1 { chunks } else { Vec::new() };
            let (we, ge, oe) = rates;
            // (dense, expert) parameters and their data-parallel group.
            let groups = [
                (dense, layout.dp as u64),
                (expert, (layout.dp / layout.ep) as u64),
            ];
            let mut r = StageRank {
                stage: s,
                layers,
                chunks,
                dense_params: dense,
                expert_params: expert,
                weights_bytes: 0,
                gradient_bytes: 0,
                optimizer_state_bytes: 0,
                host_bytes: offload.map(|_| 0),
            };
            for (p, n) in groups {
                let states = (we * p, ge * p, oe * p);
                let (device, host) = match offload {
                    Some(master_in_state) => {
                        let (d, h) = zero::offloaded(layout.zero, n, states, p, master_in_state);
                        (d, h.0 + h.1 + h.2)
                    }
                    None => (zero::shards(layout.zero, n, states, masters), 0),
                };
                r.weights_bytes += device.0;
                r.gradient_bytes += device.1;
                r.optimizer_state_bytes += device.2;
                if let Some(h) = &mut r.host_bytes {
                    *h += host;
                }
            }
            r
        })
        .collect()
}

/// One tensor's elements on a rank: (dense, expert).
type Share = (u64, u64);

/// What one rank of a pipeline stage holds of the parameters: its layers, the `(dense,
/// expert)` elements of every tensor summed, and its largest tensor's elements.
struct StageShares {
    chunks: Vec<Range<usize>>,
    dense: u64,
    expert: u64,
    largest: u64,
    /// The largest FSDP unit's elements on the rank: a layer's tensors, the embedding's (the
    /// token table and GPT's positions) or the head's (the final norm and the head).
    unit: u64,
}

/// Each pipeline stage's layers and what one of its ranks holds of the parameter tensors
/// ([`StageShares`]): its layers' tensors ([`tensor_share`]; each kind of layer counted once),
/// then on the first stage the token table (`⌈V/tp⌉` rows) and GPT's position table (whole), on
/// the last the final norm's weight (and bias) and the head (a tied one's own copy past stage 0).
fn stage_shares(cfg: &Config, layout: &Layout) -> Vec<StageShares> {
    let tp = layout.tp as u64;
    let kv = cfg.kv_heads() as u64;
    let layer_norm = cfg.llama.is_none();
    let (v, h) = (cfg.vocab as u64, cfg.hidden as u64);
    let table = v.div_ceil(tp) * h;
    let experts = cfg.llama.and_then(|l| l.moe).map_or(0, |m| m.experts);
    // This rank's experts: the first `E/ep` (every expert-parallel rank holds as many).
    let mine = 0..experts / layout.ep;
    let blocks = cfg.blocks();
    // A layer's (dense, expert, largest), by its kind (the tensors' slice: one per kind).
    let mut kinds: Vec<(*const BlockTensor, (u64, u64, u64))> = Vec::new();
    let mut layer = |l: usize| {
        let tensors = blocks.layer(l);
        if let Some((_, got)) = kinds.iter().find(|(k, _)| *k == tensors.as_ptr()) {
            return *got;
        }
        let got = tensors
            .iter()
            .map(|t| tensor_share(t, tp, kv, layer_norm, &mine))
            .fold((0, 0, 0), |(d, e, m), (td, te)| {
                (d + td, e + te, m.max(td + te))
            });
        kinds.push((tensors.as_ptr(), got));
        got
    };
    let stages = stage_chunks(cfg.layers, layout.pp, layout.vp);
    let last = stages.len() - 1;
    stages
        .into_iter()
        .enumerate()
        .map(|(s, chunks)| {
            let mut shares: Vec<Share> = Vec::new();
            let mut out = StageShares {
                chunks: chunks.clone(),
                dense: 0,
                expert: 0,
                largest: 0,
                unit: 0,
            };
            for l in chunks.into_iter().flatten() {
                let (d, e, m) = layer(l);
                out.dense += d;
                out.expert += e;
                out.largest = out.largest.max(m);
                out.unit = out.unit.max(d + e);
            }
            if s == 0 {
                shares.push((table, 0));
                if layer_norm {
                    shares.push((cfg.max_seq as u64 * h, 0)); // GPT's positions, whole
                }
                // The embedding's unit.
                out.unit = out.unit.max(shares.iter().map(|(d, _)| d).sum());
            }
            if s == last {
                let norm = if layer_norm { 2 * h } else { h };
                shares.push((h, 0)); // the final norm
                if layer_norm {
                    shares.push((h, 0)); // its bias
                }
                // The head's unit: the final norm and the head (a tied head is the table, in
                // the embedding's unit on a single stage and whole in this one past it).
                out.unit = out.unit.max(norm + table);
                if !cfg.tied || last > 0 {
                    shares.push((table, 0)); // the head (a tied one's own copy past stage 0)
                }
            }
            for (d, e) in shares {
                out.dense += d;
                out.expert += e;
                out.largest = out.largest.max(d + e);
            }
            out
        })
        .collect()
}

/// How a mixed-precision step holds its states and its graph under `--parallel` (the key
/// `amp=`; pure precision holds everything in its type, whatever the layout).
/// - `autocast` (the default: what memfit's own training step runs and its ranks measure): f32
///   masters as the parameters, f32 gradients, the optimizer's state in f32; a 16-bit working
///   copy made in each microbatch's graph, the residual stream in f32 (transformers' kernels).
///   ZeRO shards the masters with the state from stage 1 (the ZeRO paper's `K = 12`).
/// - `megatron` (Megatron-Core, `--bf16` with `accumulate_allreduce_grads_in_fp32`): 16-bit
///   parameters (2 B), f32 main gradients (4 B), the optimizer's f32 master copy and its state
///   (Adam: 4 + 8 = 12 B); activations the pure 16-bit graph (no per-microbatch weight copy).
///   `zero=1` is the distributed optimizer (the 12 B sharded over dp: Megatron's
///   `theoretical_memory_usage.py`, `18` B a parameter without it, `6 + 12/dp` with it); 2 and
///   3 are Megatron-Core FSDP's `optim_grads` and `optim_grads_params`.
/// - `deepspeed` (DeepSpeed's ZeRO with `bf16`/`fp16` enabled): 16-bit parameters and
///   gradients (2 B each), the optimizer's f32 master and state (12 B for Adam); the pure 16-bit
///   graph. ZeRO-1 `4Ψ + 12Ψ/N`, ZeRO-2 `2Ψ + 14Ψ/N`, ZeRO-3 `16Ψ/N` (the ZeRO paper's
///   counts; DeepSpeed's estimators add terms named in `tests/parallel.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Amp {
    #[default]
    Autocast,
    Megatron,
    Deepspeed,
}

impl Amp {
    pub fn as_str(self) -> &'static str {
        match self {
            Amp::Autocast => "autocast",
            Amp::Megatron => "megatron",
            Amp::Deepspeed => "deepspeed",
        }
    }
}

/// `--parallel`'s value: one layout (`tp=8,pp=16,amp=megatron`) or `search` (with
/// `--fit-in` and `--gpus`: every layout of that many GPUs, [`search`]), and the precision
/// regime ([`Amp`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParallelSpec {
    pub layout: Layout,
    pub amp: Amp,
    /// `search`: the layout's tp, pp, dp, zero and ep are enumerated; its `mb` is the
    /// microbatches a step (`mb=` given, else each layout's `pp`).
    pub search: bool,
    /// `mb=` given explicitly.
    pub mb_given: bool,
    /// `sp=on`: sequence parallelism ([`sequence_parallel`]).
    pub sp: bool,
    /// `offload=optimizer`: ZeRO-Offload, each rank's optimizer partition in host memory
    /// ([`stage_ranks_of`]; ZeRO 1 to 3).
    pub offload: bool,
    /// `gather=unit|tensor`: how ZeRO-3 gathers ([`Gathering`]); `None`: by the precision
    /// ([`Gathering::of`]).
    pub gather: Option<Gathering>,
}

impl ParallelSpec {
    /// How ZeRO-3 gathers: `gather=` where given, else by the precision regime.
    pub fn gathering(&self) -> Gathering {
        self.gather.unwrap_or(Gathering::of(self.amp))
    }
}

impl FromStr for ParallelSpec {
    type Err = String;

    /// [`Layout`]'s keys, plus `amp=autocast|megatron|deepspeed`, `sp=on|off` and the word
    /// `search`.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut amp = Amp::default();
        let mut sp = false;
        let mut offload = false;
        let mut gather = None;
        let mut search = false;
        let mut mb_given = false;
        let mut rest = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part == "search" {
                search = true;
                continue;
            }
            match part.split_once('=') {
                Some(("amp", v)) => {
                    amp = match v {
                        "autocast" => Amp::Autocast,
                        "megatron" => Amp::Megatron,
                        "deepspeed" => Amp::Deepspeed,
                        _ => {
                            return Err(format!(
                                "--parallel amp={v}: autocast, megatron or deepspeed"
                            ));
                        }
                    }
                }
                Some(("offload", v)) => {
                    offload = match v {
                        "optimizer" => true,
                        "none" => false,
                        _ => return Err(format!("--parallel offload={v}: optimizer or none")),
                    }
                }
                Some(("gather", v)) => {
                    gather = Some(match v {
                        "unit" => Gathering::Fsdp,
                        "tensor" => Gathering::DeepSpeed,
                        _ => return Err(format!("--parallel gather={v}: unit or tensor")),
                    })
                }
                Some(("sp", v)) => {
                    sp = match v {
                        "on" => true,
                        "off" => false,
                        _ => return Err(format!("--parallel sp={v}: on or off")),
                    }
                }
                Some((k, _)) if search_fixed(k) => {
                    mb_given |= k == "mb";
                    rest.push(part);
                }
                _ => rest.push(part),
            }
        }
        let layout: Layout = rest.join(",").parse()?;
        if search
            && let Some(k) = rest
                .iter()
                .filter_map(|p| p.split_once('=').map(|(k, _)| k))
                .find(|k| !search_fixed(k))
        {
            return Err(format!(
                "--parallel search: `{k}` is enumerated by the search (give amp=, sp=, offload=, gather= and mb= only)"
            ));
        }
        if offload && !search && layout.zero == 0 {
            return Err(
                "--parallel offload=optimizer: ZeRO-Offload needs zero=1, 2 or 3 (DeepSpeed offloads the partitioned optimizer)".into(),
            );
        }
        Ok(ParallelSpec {
            layout,
            amp,
            search,
            mb_given,
            sp,
            offload,
            gather,
        })
    }
}

fn search_fixed(k: &str) -> bool {
    k == "mb"
}

/// The model states' bytes a parameter and where ZeRO shards them, under a precision regime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Regime {
    /// `(weights, gradients, optimizer state)` bytes a parameter, for [`stage_ranks`].
    pub rates: (u64, u64, u64),
    /// ZeRO shards the weights with the optimizer's state from stage 1 (autocast's f32
    /// masters are the parameters).
    pub masters: bool,
    /// The graph is autocast's (a 16-bit working copy made in each microbatch's graph, the
    /// residual stream in f32), else the pure graph of the element type.
    pub graph_mixed: bool,
    /// The optimizer state's rate counts the f32 master copy (megatron's and deepspeed's).
    pub master_in_state: bool,
    /// What the answer says about it.
    pub name: &'static str,
}

/// The regime `amp` of a step whose parameters are `elem` bytes (`mixed`: mixed precision)
/// with optimizer `opt`; `Err` naming why not (a 16-bit regime asked of pure precision, or an
/// optimizer whose state is not a whole number of bytes a parameter).
pub fn regime(amp: Amp, mixed: bool, elem: u64, opt: OptimizerKind) -> Result<Regime, String> {
    let whole = |e| {
        rates(e, opt).ok_or_else(|| {
            format!(
                "--parallel: the {} optimizer's state is not a whole number of bytes a parameter (use adam, adamw, sgd or sgd-momentum)",
                opt.as_str()
            )
        })
    };
    match (amp, mixed) {
        (Amp::Autocast, false) => Ok(Regime {
            rates: whole(elem)?,
            masters: false,
            graph_mixed: false,
            master_in_state: false,
            name: "pure: weights, gradients, optimizer state and activations in the model's type",
        }),
        (Amp::Autocast, true) => Ok(Regime {
            rates: whole(4)?,
            masters: true,
            graph_mixed: true,
            master_in_state: false,
            name: "autocast (amp=autocast, the default): f32 masters as the parameters, f32 gradients and optimizer state, a 16-bit working copy made in each microbatch's graph",
        }),
        (_, false) => Err(format!(
            "--parallel amp={}: a mixed-precision regime; give --precision mixed with a 16-bit --dtype",
            amp.as_str()
        )),
        (Amp::Megatron, true) => {
            let (_, _, state) = whole(4)?;
            Ok(Regime {
                rates: (elem, 4, 4 + state),
                masters: false,
                graph_mixed: false,
                master_in_state: true,
                name: "megatron (amp=megatron): 16-bit parameters, f32 main gradients, the optimizer's f32 master copy and state; activations the pure 16-bit graph",
            })
        }
        (Amp::Deepspeed, true) => {
            let (_, _, state) = whole(4)?;
            Ok(Regime {
                rates: (elem, elem, 4 + state),
                masters: false,
                graph_mixed: false,
                master_in_state: true,
                name: "deepspeed (amp=deepspeed): 16-bit parameters and gradients, the optimizer's f32 master copy and state; activations the pure 16-bit graph",
            })
        }
    }
}

/// How ZeRO-3 gathers the parameters, for the bytes it holds whole beside the shards
/// ([`gathered_layer`]; `--parallel gather=tensor|unit`, by default DeepSpeed's under
/// `amp=deepspeed` and FSDP's otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gathering {
    /// DeepSpeed's estimator (`estimate_zero3_model_states_mem_needs`: `4·largest_layer`, the
    /// largest module's parameters as a 16-bit weight and gradient): the largest tensor.
    DeepSpeed,
    /// PyTorch FSDP's units with its default `BACKWARD_PRE` prefetch, as `memfit ranks --zero 3`
    /// measures them: while a unit's backward runs, its parameters and their gradients whole
    /// (before the reduce-scatter) and the next unit's parameters whole — bounded by
    /// `(2w + g)` bytes a parameter of the largest unit (a layer, the embedding or the head).
    Fsdp,
}

impl Gathering {
    /// DeepSpeed's count under its precision (`amp=deepspeed`), FSDP's otherwise.
    pub fn of(amp: Amp) -> Self {
        match amp {
            Amp::Deepspeed => Gathering::DeepSpeed,
            Amp::Autocast | Amp::Megatron => Gathering::Fsdp,
        }
    }
}

/// ZeRO-3's gathered parameters on each pipeline stage's rank, held whole over the
/// data-parallel group while used, beside the shards (tensor-parallel shares; an embedding or
/// head share included), at `(w, g)` bytes a parameter of weight and gradient: DeepSpeed's
/// largest tensor's weight and gradient, or FSDP's largest unit twice and its gradient once
/// ([`Gathering`]); none below stage 3 or over one replica.
pub fn gathered_layer(
    cfg: &Config,
    layout: &Layout,
    (w, g): (u64, u64),
    how: Gathering,
) -> Vec<u64> {
    stage_shares(cfg, layout)
        .into_iter()
        .map(|shares| {
            if layout.zero < 3 || layout.dp == 1 {
                return 0;
            }
            match how {
                Gathering::DeepSpeed => shares.largest * (w + g),
                Gathering::Fsdp => shares.unit * (2 * w + g),
            }
        })
        .collect()
}

/// One pipeline stage's rank's activations ([module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StageActivations {
    /// What one microbatch's forward keeps on the rank for its backward.
    pub microbatch_graph_bytes: u64,
    /// Microbatches kept at once under 1F1B: `min(mb, pp − stage)`.
    pub in_flight: usize,
    /// `in_flight × microbatch_graph_bytes`.
    pub bytes: u64,
}

/// The shard a tensor-parallel rank runs of `shape` with `layers` layers: heads, K/V heads
/// (one a rank where fewer than `tp`), the MLP's width (a mixture's experts', shared experts'
/// and dense layers' alike) and the vocabulary (`⌈V/tp⌉`) split, the hidden size, the heads'
/// width, a mixture's router and MLA's latents whole. `Err` naming what is not split yet:
/// linear attention, GPT past `tp` 1 and ViT (their heads' width is `H/A`).
pub fn shard(shape: &Shape, tp: usize, layers: usize) -> Result<Shape, String> {
    // Nothing split: a GPT's stage is its own layers (measured: `memfit ranks --pp`).
    if tp == 1 && shape.llama.is_none() && shape.vision.is_none() {
        return Ok(Shape {
            l: layers as u64,
            ..shape.clone()
        });
    }
    if tp == 1 {
        // Whole layers on the rank (a mixture's experts set by the caller: [`shard_graph_ep`]).
        if shape.llama.is_none() {
            return Err("activations per rank are modelled for LLaMA-family decoders only".into());
        }
        return Ok(Shape {
            l: layers as u64,
            ..shape.clone()
        });
    }
    let (attention, mut llama) = shard_attention(shape, tp)?;
    // A mixture's experts each split over tp (expert tensor parallelism equal to tp,
    // Megatron-Core's default), as are its shared experts and its dense layers' MLP; the
    // router whole, every token routed on every rank.
    llama.intermediate = split_width("MLP's width", llama.intermediate, tp)?;
    if let Some(m) = llama.moe.as_mut() {
        m.shared = split_width("shared experts' width", m.shared, tp)?;
        m.dense_width = split_width("dense layers' MLP width", m.dense_width, tp)?;
    }
    Ok(Shape {
        l: layers as u64,
        llama: Some(llama),
        ..attention
    })
}

/// What every tensor-parallel shard of `shape` splits alike (training's [`shard`] and vLLM's
/// expert-parallel serving rank): the heads, the K/V heads (one a rank where fewer than `tp`)
/// and the vocabulary (`⌈V/tp⌉`); MLA's down-projections and latents whole, its
/// up-projections and o by head. The shard and its LLaMA part, whose MLP widths the caller
/// splits as its layout does. `Err` naming what is not split: linear attention, a model
/// outside the LLaMA family, heads not splitting into `tp` equal parts.
pub fn shard_attention(
    shape: &Shape,
    tp: usize,
) -> Result<(Shape, crate::model::shapes::Llama), String> {
    let Some(l) = shape.llama else {
        return Err("activations per rank are modelled for LLaMA-family decoders only".into());
    };
    if l.variant.gated_delta.is_some() {
        return Err(format!(
            "activations per rank are not modelled yet for linear attention split over tp={tp} (tp=1 is)"
        ));
    }
    split_width("attention heads", shape.a as usize, tp)?;
    let mut llama = l;
    llama.kv_heads = (l.kv_heads / tp).max(1);
    Ok((
        Shape {
            a: shape.a / tp as u64,
            v: shape.v.div_ceil(tp as u64),
            llama: Some(llama),
            ..shape.clone()
        },
        llama,
    ))
}

/// `n / tp`, or why `n` (the `what`) does not split into `tp` equal parts.
pub fn split_width(what: &str, n: usize, tp: usize) -> Result<usize, String> {
    if n.is_multiple_of(tp) {
        Ok(n / tp)
    } else {
        Err(format!(
            "the {what} {n} does not split into {tp} equal parts"
        ))
    }
}

/// One microbatch's graph on a tensor-parallel rank, in parts ([`shard_graph`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ShardGraph {
    /// One block's graph: the replay's two-layer graph less its one-layer graph.
    pub block: u64,
    /// What the one-layer graph holds beyond its block: the embedding's output, the final
    /// norm, the head and the loss (the last stage's).
    pub outside: u64,
    /// What the embedding's graph keeps beyond its output, on the first stage (within
    /// [`Self::outside`], the last stage's, when one stage holds everything): candle keeps the
    /// token lookup's output as the operand of GPT's position add and of Gemma's `√H` scaling
    /// (PyTorch frees it; their backwards read neither), `B·S·H`; none for a LLaMA.
    pub embedding: u64,
    /// What a stage sends the next and keeps as its input, `B·S·H` in the residual stream's
    /// type (split by sequence under `sp`): inside [`Self::block`] (as the block before's
    /// output) wherever a stage holds it.
    pub input: u64,
    /// Where the layers differ (a mixture's dense and sparse layers, MLA, linear attention):
    /// each layer's block, in layer order, in place of [`Self::block`]; empty where every
    /// layer is alike.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub layer_blocks: Vec<u64>,
}

impl ShardGraph {
    /// The blocks of `layers`: each layer's where they differ, else `block` each.
    pub fn blocks(&self, layers: &Range<usize>) -> u64 {
        if self.layer_blocks.is_empty() {
            layers.len() as u64 * self.block
        } else {
            layers.clone().map(|l| self.layer_blocks[l]).sum()
        }
    }
}

/// The graph one microbatch of `shape` leaves on a rank of `tp` tensor-parallel ranks
/// ([`shard`]), from the replay's one- and two-layer graphs of the shard.
pub fn shard_graph(
    shape: &Shape,
    tp: usize,
    opt: OptimizerKind,
    threads: usize,
) -> Result<ShardGraph, String> {
    shard_graph_ep(shape, tp, 1, opt, threads)
}

/// [`shard_graph`] on a rank of `ep` expert-parallel ranks (a mixture of experts, each expert
/// split over `tp` as [`shard`] splits it; the routing `shape` asks: its `worst_routing` or balanced): the replay of the rank's own
/// step ([`crate::formula::replay::replay_training_ep`]: its `E/ep` experts, the exchanges'
/// buffers) on the rows that routing moves, rank 0 the one receiving the most. Where the
/// layers differ (a mixture's dense and sparse layers, MLA, linear attention) each kind's
/// block comes from the replay up to and including a layer of that kind
/// ([`ShardGraph::layer_blocks`]).
pub fn shard_graph_ep(
    shape: &Shape,
    tp: usize,
    ep: usize,
    opt: OptimizerKind,
    threads: usize,
) -> Result<ShardGraph, String> {
    let graph_of = |layers: usize| -> Result<u64, String> {
        let s = shard(shape, tp, layers)?;
        if ep > 1 {
            let rows = expert_rows(&s, ep)?;
            let t = crate::formula::replay::replay_training_ep(
                &s,
                s.meta(super::transformer::META_PER_TENSOR),
                s.cpu.then_some(threads),
                0,
                ep,
                rows,
            );
            return Ok(t.forward_retained);
        }
        Ok(s.predict(Phase::Forward, opt, threads)
            .retained_bytes
            .max(0) as u64)
    };
    // Each layer count's graph once (kinds and the part outside the blocks share them).
    let memo = std::cell::RefCell::new(std::collections::BTreeMap::new());
    let graph = |layers: usize| -> Result<u64, String> {
        if let Some(&g) = memo.borrow().get(&layers) {
            return Ok(g);
        }
        let g = graph_of(layers)?;
        memo.borrow_mut().insert(layers, g);
        Ok(g)
    };
    let l = shape.l as usize;
    let kinds = layer_kinds(shape);
    let uniform = kinds.iter().all(|&k| k == kinds[0]);
    let (block, outside, layer_blocks) = if uniform || l < 2 {
        let (one, two) = (graph(1)?, graph(2)?);
        let block = two.saturating_sub(one);
        (block, one.saturating_sub(block), Vec::new())
    } else {
        // Each kind's block: the replay to its first layer past the first (or the first,
        // from an empty model) less the replay before it.
        let mut per_kind = std::collections::BTreeMap::new();
        for (i, &k) in kinds.iter().enumerate() {
            if per_kind.contains_key(&k) {
                continue;
            }
            let at = (i.max(1)..l).find(|&j| kinds[j] == k).unwrap_or(i);
            per_kind.insert(k, graph(at + 1)?.saturating_sub(graph(at)?));
        }
        let blocks: Vec<u64> = kinds.iter().map(|k| per_kind[k]).collect();
        let outside = graph(1)?.saturating_sub(blocks[0]);
        (blocks[0], outside, blocks)
    };
    // The residual stream's type: f32 under autocast (mixed precision, transformers' kernels).
    let e = if shape.mixed && shape.kernels.torch() {
        4
    } else {
        shape.elem.size()
    };
    let kept_lookup = shape.llama.is_none_or(|l| l.variant.embed_scaled);
    let input = shape.b * shape.s * shape.h * e;
    Ok(ShardGraph {
        block,
        outside,
        embedding: if kept_lookup { input } else { 0 },
        input,
        layer_blocks,
    })
}

/// The layers from the first that hold one of each kind ([`layer_kinds`]), at least 2.
fn kinds_covered(shape: &Shape) -> usize {
    let kinds = layer_kinds(shape);
    let firsts = (0..kinds.len()).filter(|&i| !kinds[..i].contains(&kinds[i]));
    firsts.map(|i| i + 1).max().unwrap_or(0).max(2)
}

/// Each layer's kind: layers of one kind have the same layout (projections, dense or sparse
/// MLP) and attention (full, sliding or linear).
fn layer_kinds(shape: &Shape) -> Vec<usize> {
    let mut seen: Vec<(crate::model::config::LayerLayout, bool)> = Vec::new();
    (0..shape.l)
        .map(|i| {
            let key = (
                shape.layer_layout(i),
                shape
                    .llama
                    .is_some_and(|l| l.window_at(i as usize).is_some()),
            );
            seen.iter().position(|k| *k == key).unwrap_or_else(|| {
                seen.push(key);
                seen.len() - 1
            })
        })
        .collect()
}

/// The rows each sparse layer of `shape` moves on rank 0 of `ep` expert-parallel ranks under
/// the routing `shape` asks (each rank routing its `B·S` tokens alike: worst, every rank's
/// tokens on the same first `k` experts, which rank 0 holds; or balanced).
fn expert_rows(
    shape: &Shape,
    ep: usize,
) -> Result<Vec<crate::formula::replay::expert::LayerRows>, String> {
    let Some(m) = shape.llama.and_then(|l| l.moe) else {
        return Err("ep > 1 on a model without a mixture of experts".into());
    };
    if !m.experts.is_multiple_of(ep) {
        return Err(format!(
            "the {} experts do not split into {ep} equal parts",
            m.experts
        ));
    }
    let t = (shape.b * shape.s) as usize;
    let sent = crate::formula::replay::moe_counts(t, m, shape.worst_routing);
    let held = m.experts / ep;
    let from = vec![sent[..held].to_vec(); ep];
    let sparse = (0..shape.l as usize).filter(|&i| m.sparse(i)).count();
    Ok(vec![
        crate::formula::replay::expert::LayerRows { sent, from };
        sparse
    ])
}

/// Sequence parallelism (Megatron's `--sequence-parallel`, Korthikanti et al. 2022 §4.2.2):
/// the part of a block's graph tensor parallelism leaves whole on every rank (the norms'
/// inputs and outputs, the residual stream: what the shard's block keeps whatever `tp`) is
/// split over the `tp` ranks by sequence, and so is a stage's input. That part, `R`, comes
/// from the replay's blocks at `tp` 1 and `tp`: a block is `R + S/tp`, so
/// `R = (tp·block(tp) − block(1)) / (tp − 1)`; the block under sequence parallelism is
/// `R/tp + (block(tp) − R)`. Where the split is not linear (a rank holding one K/V head makes
/// no head-split copy of the values) this keeps the tp-1 rate for that tensor: an answer
/// above the exact one, never below. The last stage's part outside the blocks (embedding
/// output, final norm, head, loss) is left whole (above the exact figure too).
pub fn sequence_parallel(g: &ShardGraph, one: &ShardGraph, tp: usize) -> ShardGraph {
    if tp == 1 {
        return g.clone();
    }
    let t = tp as u64;
    let split = |block: u64, one: u64| {
        let whole = ((t * block).saturating_sub(one) / (t - 1)).min(block);
        whole.div_ceil(t) + (block - whole)
    };
    ShardGraph {
        block: split(g.block, one.block),
        outside: g.outside,
        embedding: g.embedding,
        input: g.input.div_ceil(t),
        layer_blocks: g
            .layer_blocks
            .iter()
            .zip(&one.layer_blocks)
            .map(|(&b, &o)| split(b, o))
            .collect(),
    }
}

/// [`shard_graph`], with sequence parallelism where `sp` ([`sequence_parallel`]).
pub fn shard_graph_sp(
    shape: &Shape,
    tp: usize,
    ep: usize,
    sp: bool,
    opt: OptimizerKind,
    threads: usize,
) -> Result<ShardGraph, String> {
    let g = shard_graph_ep(shape, tp, ep, opt, threads)?;
    if !sp || tp == 1 {
        return Ok(g);
    }
    if shape.llama.is_some_and(|l| l.moe.is_some()) {
        // The tokens a mixture's experts take are gathered whole over the tp group before the
        // dispatch (Megatron's), which the linear split below would divide.
        return Err(format!(
            "sequence parallelism is not modelled for a mixture of experts over tp={tp}"
        ));
    }
    let one = shard_graph(shape, 1, opt, threads)?;
    Ok(sequence_parallel(&g, &one, tp))
}

/// Each stage's activations of `layers` layers under `layout` from one microbatch's graph
/// on the shard ([`stage_activations`]).
pub fn stage_activations_of(
    g: &ShardGraph,
    layers: usize,
    layout: &Layout,
) -> Vec<StageActivations> {
    if layout.vp > 1 {
        return interleaved_activations(g, layers, layout);
    }
    let stages = stage_layers(layers, layout.pp);
    let last = stages.len() - 1;
    stages
        .iter()
        .enumerate()
        .map(|(s, layers)| {
            // Below the last stage the stage's input (the received activation, or the first
            // stage's embedding output) takes the place of its last block's output, which is
            // freed once sent (Megatron's `deallocate_output_tensor`): measured on real ranks
            // (`memfit ranks --pp`).
            let ends = match (s == 0, s == last) {
                (_, true) if s == 0 => g.outside,
                (_, true) => g.outside.saturating_sub(g.embedding),
                (true, false) => g.embedding,
                (false, false) => 0,
            };
            let mb = g.blocks(layers) + ends;
            let in_flight = layout.mb.min(layout.pp - s);
            StageActivations {
                microbatch_graph_bytes: mb,
                in_flight,
                bytes: mb * in_flight as u64,
            }
        })
        .collect()
}

/// [`stage_activations_of`] under Megatron's interleaved 1F1B (`vp` chunks a rank): rank `s`
/// runs `(pp − s − 1)·2 + (vp − 1)·pp` forwards of microbatch chunks ahead (capped at the
/// `mb·vp` there are) and one more before its first backward, its `k`-th forward on chunk
/// `(k / pp) mod vp` (Megatron's `get_model_chunk_id`): at that point every chunk it ran holds
/// its layers' graph of that microbatch — the first chunk of rank 0 the embedding's output too,
/// the last chunk of the last rank the head and the loss. Korthikanti et al.'s first stage:
/// `L·(1 + (pp − 1)/(pp·vp))` layers' graphs. `in_flight` counts microbatch chunks, and
/// `microbatch_graph_bytes` is one microbatch through every chunk of the rank.
fn interleaved_activations(
    g: &ShardGraph,
    layers: usize,
    layout: &Layout,
) -> Vec<StageActivations> {
    let (pp, vp) = (layout.pp, layout.vp);
    let chunks = stage_chunks(layers, pp, vp);
    chunks
        .iter()
        .enumerate()
        .map(|(s, chunks)| {
            let ends = |c: usize| match (s, c) {
                (0, 0) => g.embedding,
                _ if s == pp - 1 && c == vp - 1 => g.outside.saturating_sub(g.embedding),
                _ => 0,
            };
            let graph = |c: usize| g.blocks(&chunks[c]) + ends(c);
            let warmup = ((pp - s - 1) * 2 + (vp - 1) * pp).min(layout.mb * vp);
            let in_flight = (warmup + 1).min(layout.mb * vp);
            let bytes = (0..in_flight).map(|k| graph((k / pp) % vp)).sum();
            StageActivations {
                microbatch_graph_bytes: (0..vp).map(graph).sum(),
                in_flight,
                bytes,
            }
        })
        .collect()
}

/// Each pipeline stage's rank's activations of `shape` under `layout`
/// ([module docs](self)): a block's graph on the shard is the replay's two-layer graph less its
/// one-layer graph (its work and its output); the last stage adds what the one-layer graph
/// holds beyond its block (the embedding's output, the final norm, the head and the loss); on
/// the others the stage's input (the received activation, or the embedding's output) stands in
/// for the last block's output, freed once sent. Measured on real ranks (`memfit ranks --pp`).
pub fn stage_activations(
    shape: &Shape,
    layout: &Layout,
    opt: OptimizerKind,
    threads: usize,
) -> Result<Vec<StageActivations>, String> {
    let g = shard_graph(shape, layout.tp, opt, threads)?;
    Ok(stage_activations_of(&g, shape.l as usize, layout))
}

/// The largest transient one microbatch's backward makes on a rank of `tp` (the temporaries,
/// workspace and bookkeeping of the replay's train step of the two-layer shard at their
/// maximum, the optimizer step left out): added whole to the graph at its fullest, it bounds
/// the backward's peak from above.
pub fn backward_transient(
    shape: &Shape,
    tp: usize,
    opt: OptimizerKind,
    threads: usize,
) -> Result<u64, String> {
    let s = shard(shape, tp, kinds_covered(shape))?;
    let t = super::timeline::train_step(&s, opt, threads);
    Ok(t.samples
        .iter()
        .filter(|x| x.stage != "optimizer")
        .map(transient_bytes)
        .max()
        .unwrap_or(0))
}

/// [`backward_transient`] on rank 0 of `ep` expert-parallel ranks (a mixture at tp 1): from the
/// replay of that rank's own step ([`crate::formula::replay::trace_training_ep`]: its `E/ep`
/// experts, the exchanges' buffers) on the rows the routing `shape` asks moves
/// ([`expert_rows`]; worst: every rank's tokens on rank 0's experts, so its experts' temporaries
/// are `ep` times one device's). `ep` 1 is [`backward_transient`].
pub fn backward_transient_ep(
    shape: &Shape,
    tp: usize,
    ep: usize,
    opt: OptimizerKind,
    threads: usize,
) -> Result<u64, String> {
    if ep == 1 {
        return backward_transient(shape, tp, opt, threads);
    }
    let s = shard(shape, tp, kinds_covered(shape))?;
    let rows = expert_rows(&s, ep)?;
    let (_, events) = crate::formula::replay::trace_training_ep(
        &s,
        s.meta(super::transformer::META_PER_TENSOR),
        s.cpu.then_some(threads),
        ep,
        rows,
    );
    Ok(crate::timeline::classify(&events)
        .samples
        .iter()
        .filter(|x| x.stage != "optimizer")
        .map(transient_bytes)
        .max()
        .unwrap_or(0))
}

/// A sample's temporaries, workspace and bookkeeping: what is neither kept (the cache, the
/// activations) nor a gradient.
fn transient_bytes(x: &crate::timeline::Sample) -> u64 {
    use crate::timeline::{ACTIVATIONS, GRADIENTS, KV};
    x.bytes
        .iter()
        .enumerate()
        .filter(|(i, _)| ![KV, ACTIVATIONS, GRADIENTS].contains(i))
        .map(|(_, b)| *b)
        .sum()
}

/// The largest transient of each part's backward on a rank of `tp` (from the replay's train
/// step of the two-layer shard, as [`backward_transient`]): the temporaries, workspace and
/// bookkeeping a sample holds beyond the part's start, plus the gradients the part has made so
/// far (they stay transient where the part's gradients are added into accumulated ones: a
/// pipeline's microbatches). The gradient handed in from above is not in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct PartTransients {
    /// The head's backward (the loss, the logits, the final norm): the last stage's.
    pub head: u64,
    /// A block's.
    pub block: u64,
    /// The embedding's (the token table's gradient): the first stage's.
    pub embedding: u64,
}

/// [`PartTransients`] of `shape` on a rank of `tp`.
pub fn part_transients(
    shape: &Shape,
    tp: usize,
    opt: OptimizerKind,
    threads: usize,
) -> Result<PartTransients, String> {
    use crate::timeline::GRADIENTS;
    let s = shard(shape, tp, 2)?;
    let t = super::timeline::train_step(&s, opt, threads);
    let mut out = PartTransients {
        head: 0,
        block: 0,
        embedding: 0,
    };
    // Each part's bytes are counted from the part's start: what an earlier part made and
    // still holds (a tied head's gradient of the table, a temporary until the embedding's is
    // summed into it) is not the part's. A part is its layer tag; outside the blocks (tag 0),
    // the head before any block, the embedding after them.
    let (mut seen_block, mut part) = (false, None);
    let (mut start, mut prev) = ((0u64, 0u64), (0u64, 0u64));
    for x in t.samples.iter().filter(|x| x.stage == "backward") {
        seen_block |= x.tag > 0;
        if part != Some((x.tag, seen_block)) {
            part = Some((x.tag, seen_block));
            start = prev;
        }
        let other = transient_bytes(x);
        prev = (other, x.bytes[GRADIENTS]);
        let v = other.saturating_sub(start.0) + x.bytes[GRADIENTS].saturating_sub(start.1);
        let slot = match (x.tag, seen_block) {
            (0, false) => &mut out.head,
            (0, true) => &mut out.embedding,
            _ => &mut out.block,
        };
        *slot = (*slot).max(v);
    }
    Ok(out)
}

/// Every layout of `gpus` GPUs `cfg` can take: `tp` a divisor of the GPUs up to 8 that
/// splits the heads (as [`Layout::check`] asks), `pp` a divisor of what is left up to the
/// layers (uneven stages as [`stage_layers`] splits them), `dp` the rest, ZeRO 0–3 (only 0
/// over one replica), `ep` each divisor of `dp` that splits a mixture's experts (1 for a dense
/// model); `mb` microbatches a step, or each layout's `pp` (any `mb ≥ pp` keeps the same
/// memory: 1F1B's first stage holds `pp`).
pub fn layouts(cfg: &Config, gpus: usize, mb: Option<usize>) -> Vec<Layout> {
    let divisors = |n: usize| (1..=n).filter(move |d| n.is_multiple_of(*d));
    let experts = cfg.llama.and_then(|l| l.moe).map(|m| m.experts);
    let mut out = Vec::new();
    for tp in divisors(gpus).filter(|&t| t <= 8) {
        for pp in divisors(gpus / tp).filter(|&p| p <= cfg.layers) {
            let dp = gpus / tp / pp;
            let eps: Vec<usize> = match experts {
                None => vec![1],
                Some(e) => divisors(dp).filter(|x| e.is_multiple_of(*x)).collect(),
            };
            for ep in eps {
                for zero in 0..=if dp > 1 { 3 } else { 0 } {
                    let l = Layout {
                        tp,
                        pp,
                        dp,
                        zero,
                        ep,
                        mb: mb.unwrap_or(pp),
                        vp: 1,
                    };
                    if l.check(cfg).is_ok() {
                        out.push(l);
                    }
                }
            }
        }
    }
    out
}

/// One layout's worst rank in a search ([`layouts`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Candidate {
    pub layout: String,
    pub tp: usize,
    pub pp: usize,
    pub dp: usize,
    pub zero: u8,
    pub ep: usize,
    pub mb: usize,
    /// The stage whose rank holds the most (`peak_bytes`, or the model states where the
    /// activations are unknown).
    pub worst_stage: usize,
    /// That rank's model states and ZeRO-3's gathered layer.
    pub state_bytes: u64,
    /// Its activations (microbatches in flight × one's graph) and one microbatch's backward
    /// transient; `None` where the split of the activations is not modelled.
    pub activation_bytes: Option<u64>,
    pub transient_bytes: Option<u64>,
    /// `state + activations + transient`, the most any rank holds; `None` when unknown.
    pub peak_bytes: Option<u64>,
    /// `Some(true)`: every rank's peak within the budget; `Some(false)`: some rank's peak (or
    /// its model states alone) above it; `None`: unknown (activations not modelled, states
    /// within the budget).
    pub fits: Option<bool>,
    /// ZeRO-Offload: the most host memory a rank's offloaded partition takes (not held
    /// against the GPU's budget); absent without offload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_bytes: Option<u64>,
}

/// The worst rank of `layout`: per stage, `states[s] + gathered[s]` and, where known, the
/// activations and the transient; the stage with the largest total (states alone where the
/// activations are unknown).
pub fn candidate(
    layout: &Layout,
    ranks: &[StageRank],
    gathered: &[u64],
    acts: Option<(&[StageActivations], u64)>,
    budget: u64,
) -> Candidate {
    let states: Vec<u64> = ranks
        .iter()
        .zip(gathered)
        .map(|(r, g)| r.model_state_bytes() + g)
        .collect();
    let total = |s: usize| acts.map(|(a, t)| states[s] + a[s].bytes + t);
    let worst = (0..states.len())
        .max_by_key(|&s| (total(s).unwrap_or(states[s]), std::cmp::Reverse(s)))
        .unwrap_or(0);
    let peak = total(worst);
    let max_states = states.iter().copied().max().unwrap_or(0);
    Candidate {
        layout: layout.to_string(),
        tp: layout.tp,
        pp: layout.pp,
        dp: layout.dp,
        zero: layout.zero,
        ep: layout.ep,
        mb: layout.mb,
        worst_stage: worst,
        state_bytes: states[worst],
        activation_bytes: acts.map(|(a, _)| a[worst].bytes),
        transient_bytes: acts.map(|(_, t)| t),
        peak_bytes: peak,
        fits: match peak {
            Some(p) => Some(p <= budget),
            None if max_states > budget => Some(false),
            None => None,
        },
        host_bytes: ranks.iter().filter_map(|r| r.host_bytes).max(),
    }
}

/// Best first: those that fit, fewest model-parallel ranks (`tp·pp`: the least
/// communication on the critical path), then the lowest ZeRO stage, then the most headroom;
/// then the unknown; then those that do not fit, smallest peak first.
pub fn rank_candidates(c: &mut [Candidate]) {
    let class = |x: &Candidate| match x.fits {
        Some(true) => 0,
        None => 1,
        Some(false) => 2,
    };
    c.sort_by_key(|x| {
        let bytes = x.peak_bytes.unwrap_or(x.state_bytes);
        match class(x) {
            2 => (2, 0, 0, bytes, x.ep),
            k => (k, x.tp * x.pp, x.zero, bytes, x.ep),
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_parse_and_refuse_by_name() {
        let l: Layout = "tp=8, pp=16,zero=1".parse().unwrap();
        assert_eq!((l.tp, l.pp, l.dp, l.zero, l.ep, l.mb), (8, 16, 1, 1, 1, 1));
        assert_eq!(l.gpus(), 128);
        assert_eq!(l.to_string(), "tp=8,pp=16,dp=1,zero=1,ep=1,mb=1");
        for (bad, says) in [
            ("tp=0", "at least 1"),
            ("zero=4", "0 to 3"),
            ("cp=2", "unknown key `cp`"),
            ("tp", "KEY=VALUE"),
            ("dp=x", "whole number"),
        ] {
            let e = bad.parse::<Layout>().unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    /// `amp=`, `sp=` and `search` beside the layout's keys; search refuses what it enumerates.
    #[test]
    fn parallel_specs_parse() {
        let p: ParallelSpec = "tp=8,pp=16,amp=megatron,sp=on".parse().unwrap();
        assert_eq!(
            (p.layout.tp, p.layout.pp, p.amp, p.sp, p.search),
            (8, 16, Amp::Megatron, true, false)
        );
        let p: ParallelSpec = "search,mb=32".parse().unwrap();
        assert!(p.search && p.mb_given && p.layout.mb == 32 && p.amp == Amp::Autocast);
        let e = "search,tp=8".parse::<ParallelSpec>().unwrap_err();
        assert!(e.contains("enumerated"), "{e}");
        let e = "amp=fp8".parse::<ParallelSpec>().unwrap_err();
        assert!(e.contains("autocast, megatron or deepspeed"), "{e}");
        let p: ParallelSpec = "dp=4,zero=2,offload=optimizer".parse().unwrap();
        assert!(p.offload && p.layout.zero == 2);
        let p: ParallelSpec = "search,offload=optimizer".parse().unwrap();
        assert!(p.offload && p.search);
        let e = "dp=4,offload=optimizer"
            .parse::<ParallelSpec>()
            .unwrap_err();
        assert!(e.contains("zero=1, 2 or 3"), "{e}");
        let e = "dp=4,zero=1,offload=nvme"
            .parse::<ParallelSpec>()
            .unwrap_err();
        assert!(e.contains("optimizer or none"), "{e}");
    }

    /// A block `R + S/t` with sequence parallelism is `R/t + S/t`; the input split `t` ways.
    #[test]
    fn sequence_parallel_splits_the_whole_part() {
        let (r, s_) = (800u64, 2400u64);
        let one = ShardGraph {
            block: r + s_,
            outside: 5,
            embedding: 0,
            input: 100,
            layer_blocks: vec![r + s_, 2 * (r + s_)],
        };
        let four = ShardGraph {
            block: r + s_ / 4,
            outside: 5,
            embedding: 0,
            input: 100,
            layer_blocks: vec![r + s_ / 4, 2 * (r + s_ / 4)],
        };
        let sp = sequence_parallel(&four, &one, 4);
        assert_eq!(
            sp,
            ShardGraph {
                block: (r + s_) / 4,
                outside: 5,
                embedding: 0,
                input: 25,
                // Each layer's block split alike (the second layer twice the first).
                layer_blocks: vec![(r + s_) / 4, 2 * (r + s_) / 4],
            }
        );
        assert_eq!(sequence_parallel(&one, &one, 1), one);
    }

    /// Llama 3.1 405B's 126 layers over 16 stages: 7, 8 × 14, 7 (the paper's layout); an even
    /// split stays even; the missing layers come off the outermost stages in turn.
    #[test]
    fn stages_split_their_layers() {
        let s = stage_layers(126, 16);
        let n: Vec<usize> = s.iter().map(|r| r.len()).collect();
        assert_eq!(n[0], 7);
        assert_eq!(n[15], 7);
        assert!(n[1..15].iter().all(|&k| k == 8));
        assert_eq!(s.last().unwrap().end, 126);
        assert_eq!(
            stage_layers(32, 4)
                .iter()
                .map(|r| r.len())
                .collect::<Vec<_>>(),
            [8, 8, 8, 8]
        );
        assert_eq!(
            stage_layers(10, 4)
                .iter()
                .map(|r| r.len())
                .collect::<Vec<_>>(),
            [2, 3, 3, 2]
        );
        assert_eq!(
            stage_layers(9, 4)
                .iter()
                .map(|r| r.len())
                .collect::<Vec<_>>(),
            [2, 2, 3, 2]
        );
    }
}
