//! `memfit predict`: every phase's memory for the cases of a workload (or flags), from the
//! formula module alone — nothing is run. Per case: the model state (weights, gradients,
//! optimizer state), the graph a training forward keeps, each phase's peak above its baseline,
//! the totals in use at the training step's and at inference's peak, and with `--fit-in` whether
//! the training step fits and the largest batch and sequence that would. For a decoder, the
//! serving answers: the serving weights, the key/value bytes per cached token, a prefill's
//! activations, and with `--fit-in` how many tokens of cache fit (vLLM's question) and the
//! longest context each of the case's sequences can reach.

use anyhow::Context;

use crate::cli::PredictArgs;
use crate::formula::budget;
use crate::formula::transformer::Shape;
use crate::phase::Phase;
use crate::units;
use std::io::Write;

fn human_bytes(b: u64) -> String {
    units::human_bytes(b as f64)
}
use crate::workload::{self, Case, WorkloadFile};

/// What `predict` says about one case.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CasePrediction {
    pub case: usize,
    /// With `--plot`: each asked phase among train step, inference, prefill and decode split
    /// by component ([`crate::formula::breakdown`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breakdown: Option<Vec<crate::formula::breakdown::Bar>>,
    /// `gpt` or `vit`.
    pub model: String,
    pub preset: String,
    pub batch: usize,
    pub seq: usize,
    pub params: u64,
    /// Parameters one token uses: a mixture of experts' router and `k` of its `E` experts per
    /// layer plus everything else; `params` for a dense model.
    pub active_params: u64,
    /// A mixture of experts: the routing the activation figures assume (no run has drawn
    /// one): `balanced` (`k·B·S/E` tokens per expert); absent for a dense model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routing: Option<String>,
    /// A mixture of experts with a budget: the routing the budget answers (fits, max batch,
    /// max sequence, KV capacity, max context) assume: `worst` (`--routing worst`, the
    /// default: safe whatever the tokens) or `balanced`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fit_routing: Option<String>,
    /// A mixture of experts: each phase's peak with the worst routing (every token of every
    /// forward on the same `k` experts), beside `phase_peak_bytes`' balanced routing: the two
    /// bounds a run's routing falls between.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst_routing_phase_peak_bytes: Option<Vec<(String, u64)>>,
    /// The backward the training figures assume: `by-block` (the default) or `whole`.
    pub backward: String,
    /// By block without checkpointing: the train step's peak with `--backward whole`
    /// (candle's `loss.backward()`, the whole graph kept until it returns), for comparison.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub whole_backward_train_step_bytes: Option<u64>,
    pub weights_bytes: u64,
    pub gradient_bytes: u64,
    pub optimizer_state_bytes: u64,
    pub graph_bytes: u64,
    /// Peak above its baseline, per phase of the case.
    pub phase_peak_bytes: Vec<(String, u64)>,
    /// Weights (after init: QLoRA's projections quantized) + the input batch + optimizer state +
    /// the training step's peak.
    pub train_total_bytes: u64,
    /// Weights + the inference forward's peak.
    pub inference_total_bytes: u64,
    /// On the CPU with a budget: the case process's own heap beyond its tensors that depends on
    /// this machine, gemm's per-thread packing slabs (`(threads + 1) ×` this CPU's L2 size,
    /// [`crate::formula::gemm::process_slab_bytes`]); the budget answers (fits, max batch, max
    /// sequence, KV capacity, max context) leave it out of the budget first. `max-batch`
    /// measures the whole part instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process_bytes: Option<u64>,
    pub fits: Option<bool>,
    /// With `--parallel`: each pipeline stage's rank.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parallel: Option<ParallelAnswer>,
    /// With `--parallel search --gpus N --fit-in B`: every layout's worst rank, best first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parallel_search: Option<ParallelSearch>,
    /// With `--parallel tp=T[,ep=E]` and serving phases (`--phases prefill,decode`): one
    /// tensor- (and expert-) parallel serving rank as vLLM runs it
    /// ([`crate::formula::serve_parallel`]: `ep`, `dp`, `experts_per_rank` and `expert_params`
    /// say the experts' split).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parallel_serving: Option<crate::formula::serve_parallel::ServeRank>,
    /// Largest batch whose training step fits the budget (0: not even batch 1).
    pub max_batch: Option<usize>,
    /// Largest sequence (≤ the position table) whose training step fits at the case's batch
    /// (0: not even 1 token).
    pub max_seq: Option<usize>,
    /// Decoders: what serving needs (`None` for a ViT).
    pub serving: Option<Serving>,
    /// With `--calibration`: each phase's peak corrected by the stored measurements.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibrated: Option<Vec<crate::fit::calibration::Calibrated>>,
    /// With `--calibration`: the software its rows were measured with against this binary's,
    /// and whether its constants come from another runtime.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration_runtime: Option<crate::fit::calibration::RuntimeCheck>,
}

pub use crate::formula::budget::Serving;

pub fn predict(args: &PredictArgs) -> anyhow::Result<()> {
    let (file, origin) = match &args.workload {
        Some(path) => (workload::load(path)?, path.display().to_string()),
        None if args.grid.has_grid_flags() => (WorkloadFile::default(), "flags".to_string()),
        None => (
            workload::parse(workload::DEFAULT_TOML, "<embedded default>")?,
            "<embedded default>".to_string(),
        ),
    };
    let mut cases = workload::expand_for_prediction(&file, &args.grid.grid_flags(), &origin)?;
    // dataload cases build no model: nothing to predict (their RAM formula is fitted from
    // measurements, `memfit fit`).
    cases.retain(|c| c.data.is_none());
    if let Some(path) = &args.plot
        && crate::store::picture::Format::of(path).is_none()
    {
        anyhow::bail!("--plot {}: give an .svg or a .png file", path.display());
    }
    let budget = args
        .fit_in
        .as_deref()
        .map(|v| units::parse_size(v, "fit-in"))
        .transpose()?;
    let spec = args
        .parallel
        .as_deref()
        .map(|s| s.parse::<crate::formula::parallel::ParallelSpec>())
        .transpose()
        .map_err(|e| anyhow::anyhow!(e))?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let calibration = args
        .calibration
        .as_deref()
        .map(crate::fit::calibration::load)
        .transpose()?;
    // `--timeline FILE`, or the workload's `timeline` folder (its `predicted.json`).
    let timeline = match (&args.timeline, &file.timeline) {
        (Some(path), _) => Some(path.clone()),
        (None, Some(dir)) => {
            std::fs::create_dir_all(dir).with_context(|| {
                format!("{origin}: timeline {}: creating the folder", dir.display())
            })?;
            Some(dir.join("predicted.json"))
        }
        (None, None) => None,
    };
    if let Some(path) = &timeline {
        write_timelines(path, &cases, threads)?;
    }

    // Every case first, so a calibration that lacks a case's rows fails before any output.
    let mut predictions = Vec::with_capacity(cases.len());
    for case in &cases {
        let mut p = predict_case(case, threads, budget, args.routing.worst());
        match spec {
            Some(spec) if spec.search => {
                let (Some(budget), Some(gpus)) = (budget, args.gpus) else {
                    anyhow::bail!(
                        "--parallel search: give --fit-in (the memory of one GPU) and --gpus (how many)"
                    );
                };
                p.parallel_search = Some(parallel_search(
                    case,
                    &spec,
                    gpus,
                    budget,
                    args.routing.worst(),
                    threads,
                )?);
            }
            Some(spec) => {
                let serving = case
                    .phases
                    .iter()
                    .any(|ph| matches!(ph, Phase::Prefill | Phase::Decode));
                // With serving phases `ep` is vLLM's (the experts over tp × dp serving ranks),
                // not Megatron's training layout (ep inside dp): no training answer for it.
                if !(serving && spec.layout.ep > 1) {
                    p.parallel = Some(parallel_answer_sp(
                        case,
                        &spec,
                        args.routing.worst(),
                        threads,
                    )?);
                }
                if serving {
                    p.parallel_serving = Some(parallel_serving(
                        case,
                        &spec,
                        budget.map(|b| b.saturating_sub(p.process_bytes.unwrap_or(0))),
                        args.routing.worst(),
                        threads,
                    )?);
                }
            }
            None => {}
        }
        if args.plot.is_some() {
            p.breakdown = Some(crate::formula::breakdown::bars(case, threads));
        }
        if let Some(c) = &calibration {
            p.calibrated = Some(c.apply(
                &case.device.to_string(),
                case.dtype.as_str(),
                &p.phase_peak_bytes,
            )?);
            p.calibration_runtime = Some(c.runtime_check());
        }
        predictions.push(p);
    }
    if let Some(path) = &args.plot {
        write_plot(path, &cases, &predictions, budget)?;
    }
    if let Some(c) = &calibration
        && !args.json
    {
        let check = c.runtime_check();
        let with: Vec<String> = check
            .calibrated_with
            .iter()
            .map(|r| r.to_string())
            .collect();
        if check.other_runtime {
            println!(
                "calibration: constants measured with {}; this is {}: another runtime, they may not hold",
                if with.is_empty() {
                    "an unrecorded runtime (no meta.json beside the rows)".to_string()
                } else {
                    with.join("; ")
                },
                check.predicting_with
            );
        } else if check.other_commit {
            println!(
                "calibration: constants measured with {}; this is {}: the same releases, another commit",
                with.join("; "),
                check.predicting_with
            );
        } else {
            println!(
                "calibration: constants measured with {} (this binary)",
                with.join("; ")
            );
        }
    }
    let any_fit = predictions.iter().any(|p| p.fits.is_some());
    if !args.json {
        dtype_lines(&cases);
        println!(
            "{:>4} {:<14} {:>5} {:>6} {:>5} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}{}",
            "case",
            "preset",
            "B",
            "S",
            "dtype",
            "weights",
            "grads",
            "opt state",
            "graph",
            "train total",
            "infer total",
            "train step",
            if any_fit { "  fits  max B" } else { "" }
        );
    }
    let legend = !args.json && !predictions.is_empty();
    for (p, case) in predictions.into_iter().zip(&cases) {
        if args.json {
            println!("{}", serde_json::to_string(&p)?);
        } else {
            let step = p
                .phase_peak_bytes
                .iter()
                .find(|(ph, _)| ph == "train-step")
                .map_or("-".to_string(), |(_, b)| human_bytes(*b));
            let fit = match (p.fits, p.max_batch, p.max_seq) {
                (Some(f), Some(m), Some(ms)) => {
                    format!("  {:<5} {m:>5}  (max S {ms})", if f { "yes" } else { "no" })
                }
                _ => String::new(),
            };
            println!(
                "{:>4} {:<14} {:>5} {:>6} {:>5} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12}{fit}",
                p.case,
                p.preset,
                p.batch,
                p.seq,
                case.dtype.as_str(),
                human_bytes(p.weights_bytes),
                human_bytes(p.gradient_bytes),
                human_bytes(p.optimizer_state_bytes),
                human_bytes(p.graph_bytes),
                human_bytes(p.train_total_bytes),
                human_bytes(p.inference_total_bytes),
                step,
            );
            if let Some(w) = p.whole_backward_train_step_bytes {
                println!(
                    "       backward by block (the default): train step {step}; with --backward whole (the graph kept until the backward ends): {}",
                    human_bytes(w)
                );
            }
            if let Some(r) = &p.routing {
                let worst = p
                    .worst_routing_phase_peak_bytes
                    .iter()
                    .flatten()
                    .map(|(ph, b)| format!("{ph} {}", human_bytes(*b)))
                    .collect::<Vec<_>>()
                    .join(", ");
                let fit = p.fit_routing.as_deref().map_or(String::new(), |f| {
                    format!("; the budget answers assume {f} routing (--routing)")
                });
                println!(
                    "       mixture of experts: {} parameters, {} active per token; routing {r}; worst-case peaks: {worst}{fit}",
                    p.params, p.active_params
                );
            }
            if let Some(sv) = &p.serving {
                let budget = match (
                    sv.kv_capacity_tokens,
                    sv.kv_capacity_sequences,
                    sv.max_context,
                ) {
                    (Some(c), Some(n), Some(t)) => format!(
                        "; in the budget: {c} cached tokens, {n} sequence(s) of {} at once (vLLM's counts, per layer kind), context {t} per sequence at B {}",
                        p.seq, p.batch
                    ),
                    _ => String::new(),
                };
                let latent = sv
                    .kv_bytes_per_token_decompressed
                    .map_or(String::new(), |d| {
                        format!(" latent ({} decompressed)", human_bytes(d))
                    });
                let state = sv.state_bytes_per_sequence.map_or(String::new(), |s| {
                    format!(
                        " and a fixed state of {} per sequence (linear layers)",
                        human_bytes(s)
                    )
                });
                let held = match sv.weights.as_str() {
                    "model" => String::new(),
                    "fp8" => " (fp8: e4m3 projections with an f32 scale per 128×128 block, the rest in the model's type)".to_string(),
                    "mxfp4" => " (mxfp4: e2m1 projections, two a byte, with a power-of-two scale per 32, the rest in the model's type)".to_string(),
                    w => format!(" ({w})"),
                };
                println!(
                    "       serving: weights {}{held}, KV {} per token{latent}{state} ({} for one sequence of {}), prefill activations {}{budget}",
                    human_bytes(sv.weights_bytes),
                    human_bytes(sv.kv_bytes_per_token),
                    human_bytes(sv.kv_bytes_per_sequence),
                    p.seq,
                    human_bytes(sv.prefill_activation_bytes),
                );
                if let Some(d) = sv.decode_step_bytes_decompressed {
                    let context = match (sv.max_context, sv.max_context_decompressed) {
                        (Some(a), Some(b)) => format!("; max context {a} ({b} decompressed)"),
                        _ => String::new(),
                    };
                    println!(
                        "       MLA decode step at {} cached tokens: {} over the latent (absorbed, the default), {} decompressed (transformers' form){context}",
                        p.seq,
                        human_bytes(sv.decode_step_bytes),
                        human_bytes(d),
                    );
                }
            }
            if let Some(par) = &p.parallel {
                print_parallel(par);
            }
            if let Some(search) = &p.parallel_search {
                print_search(search);
            }
            if let Some(sv) = &p.parallel_serving {
                print_parallel_serving(sv, p.seq, p.batch);
            }
            for c in p.calibrated.iter().flatten() {
                println!(
                    "       {:<10} analytical {:>12}  calibrated {:>12}  ({} rows; held out mean/max {}; by size {})",
                    c.phase,
                    human_bytes(c.analytical_bytes),
                    human_bytes(c.calibrated_bytes),
                    c.rows,
                    c.held_out_pct
                        .map_or("— (under 3 rows)".into(), |(a, m)| format!(
                            "5-fold {a:.3}/{m:.3} %"
                        )),
                    match (c.by_size_pct, c.by_size_fit_params) {
                        (Some((a, m)), Some(p)) => format!(
                            "{a:.3}/{m:.3} % (fitted on configs ≤ {p} parameters, tested on the larger)"
                        ),
                        _ => "— (one config size)".into(),
                    }
                );
            }
        }
    }
    if legend {
        println!("{LEGEND}");
    }
    Ok(())
}

/// What the table's columns hold, printed under it.
pub const LEGEND: &str = "\
columns: weights, grads, opt state = the model state in the case's dtype (parameters, their
  gradients, the optimizer's moments; mixed precision: f32 masters beside 16-bit copies); graph =
  what a training forward keeps for the backward; train step = the training step's peak above
  what it starts from (weights, optimizer state, the batch): the graph, the gradients as they are
  made, the temporaries; train total = weights + optimizer state + the batch + train step, all
  a training step holds at its peak: the figure to hold against a GPU's memory; infer total =
  weights + an inference forward's peak; fits, max B (max S) with --fit-in, for cases that
  train: whether train total fits the budget, and the largest batch (sequence) that would.";

/// Where each case's element type comes from: the `--hf-config` checkpoint's (said once per
/// type), or `--dtype` over it.
/// `--parallel tp=T[,ep=E]` with serving phases: one serving rank
/// ([`crate::formula::serve_parallel`]): tensor parallelism, with vLLM's expert parallelism
/// beside it (`ep` a multiple of `tp`: `E/T` data-parallel attention replicas; `dp=` may say
/// the same); pipeline parallel serving is not answered. A mixture of experts' activations
/// assume the routing `--routing` asks (`worst`).
fn parallel_serving(
    case: &Case,
    spec: &crate::formula::parallel::ParallelSpec,
    budget: Option<u64>,
    worst: bool,
    threads: usize,
) -> anyhow::Result<crate::formula::serve_parallel::ServeRank> {
    let l = spec.layout;
    anyhow::ensure!(
        l.pp == 1 && l.zero == 0 && !spec.sp && (l.dp == 1 || l.ep > 1),
        "--parallel {} with --phases prefill/decode: serving is answered for tensor parallelism only, with vLLM's expert parallelism beside it (tp=T or tp=T,ep=E; pipeline parallel, ZeRO and data-parallel serving without ep are not modelled)",
        l
    );
    anyhow::ensure!(
        l.dp == 1 || l.dp * l.tp == l.ep,
        "--parallel {l} with --phases prefill/decode: vLLM's expert-parallel group is tp × dp ranks, so dp={} with tp={} means ep={} (give tp=T,ep=E alone: dp is E/T)",
        l.dp,
        l.tp,
        l.dp * l.tp
    );
    anyhow::ensure!(
        case.cfg.vision.is_none(),
        "--parallel with --phases prefill/decode: a ViT does not generate"
    );
    let shape = Shape::of(case);
    let shape = Shape {
        worst_routing: worst && shape.llama.is_some_and(|l| l.moe.is_some()),
        ..shape
    };
    crate::formula::serve_parallel::serve_rank_ep(&case.cfg, &shape, l.tp, l.ep, budget, threads)
        .map_err(|e| anyhow::anyhow!(e))
}

/// `--parallel tp=T`'s serving line under a case.
fn print_parallel_serving(
    sv: &crate::formula::serve_parallel::ServeRank,
    seq: usize,
    batch: usize,
) {
    let activations = match (sv.prefill_activation_bytes, &sv.activations_missing) {
        (Some(a), _) => format!(
            "prefill activations {}, decode peak {}",
            human_bytes(a),
            human_bytes(sv.decode_peak_bytes.unwrap_or(0)),
        ),
        (None, Some(why)) => format!("activations unknown ({why})"),
        (None, None) => "activations unknown".to_string(),
    };
    let capacity = match (sv.kv_capacity_tokens, sv.kv_capacity_sequences) {
        (Some(t), Some(n)) => format!(
            "; in the budget (taken whole: apply vLLM's gpu_memory_utilization yourself): {t} cached tokens, {n} sequence(s) of {seq}"
        ),
        _ => String::new(),
    };
    let layout = match (sv.ep, sv.experts_per_rank) {
        (1, _) => format!("tp={}", sv.tp),
        (ep, Some(n)) => format!(
            "tp={},ep={ep} ({} attention replica(s) of tp={}; {n} whole routed expert(s) a layer on the worst rank, {} parameters)",
            sv.tp, sv.dp, sv.tp, sv.expert_params
        ),
        (ep, None) => format!("tp={},ep={ep}", sv.tp),
    };
    let activations = match (sv.ep, sv.dp, sv.prefill_activation_bytes) {
        (1, _, _) | (_, _, None) => activations,
        (_, 1, Some(_)) => format!(
            "{activations}; one replica: nothing gathered, each sparse layer's output all-reduced over tp"
        ),
        (_, dp, Some(_)) => format!(
            "{activations}; each sparse layer on the tokens of all {dp} replicas gathered (vLLM's allgather_reducescatter)"
        ),
    };
    println!(
        "       serving {layout} per rank (vLLM: vocab-parallel table and head, each rank its K/V heads): {} parameters, weights {} ({}); {} K/V head(s){} a rank, KV {} per token ({} for one sequence of {seq}); {activations} at B {batch}{capacity}",
        sv.params,
        human_bytes(sv.weights_bytes),
        sv.weights,
        sv.kv_heads,
        if sv.kv_replicated {
            " (replicated)"
        } else {
            ""
        },
        human_bytes(sv.kv_bytes_per_token),
        human_bytes(sv.kv_bytes_per_sequence),
    );
}

/// `--parallel`'s lines under a case: one per run of pipeline stages holding alike.
fn print_parallel(par: &ParallelAnswer) {
    println!(
        "       parallel {} ({} GPUs), per rank by pipeline stage: model states{}",
        par.layout,
        par.gpus,
        match &par.activations_missing {
            None => " and the activations 1F1B keeps (the backward's transients and the collectives' buffers not included):".to_string(),
            Some(why) => format!(" ({why}):"),
        }
    );
    println!(
        "         precision {}{}",
        par.precision_means,
        if par.sequence_parallel {
            "; sequence parallel: the norms' and the residual stream's activations split over tp"
        } else {
            ""
        }
    );
    if par.offload {
        println!(
            "         ZeRO-Offload: each rank's optimizer partition (f32 master, f32 gradient buffer, state) in host memory, stepped there; the device keeps weights and gradients"
        );
    }
    let act = |i: usize| par.activations.as_ref().map(|a| a[i]);
    let gathered = |i: usize| par.gathered_bytes.as_ref().map_or(0, |g| g[i]);
    let mut i = 0;
    while i < par.ranks.len() {
        let r = &par.ranks[i];
        let same = |j: usize| {
            let o = &par.ranks[j];
            o.layer_count() == r.layer_count()
                && o.params() == r.params()
                && o.model_state_bytes() == r.model_state_bytes()
                && act(j) == act(i)
                && gathered(j) == gathered(i)
        };
        let mut j = i + 1;
        while j < par.ranks.len() && same(j) {
            j += 1;
        }
        let activations = act(i).map_or(String::new(), |a| {
            let held = if r.chunks.is_empty() {
                format!(
                    "{} microbatch(es) of {}",
                    a.in_flight,
                    human_bytes(a.microbatch_graph_bytes)
                )
            } else {
                format!(
                    "{} microbatch chunks in flight, one microbatch through its {} chunks {}",
                    a.in_flight,
                    r.chunks.len(),
                    human_bytes(a.microbatch_graph_bytes)
                )
            };
            format!(
                "; activations {} ({held}): {} in all",
                human_bytes(a.bytes),
                human_bytes(r.model_state_bytes() + gathered(i) + a.bytes)
            )
        });
        let gather = match gathered(i) {
            0 => String::new(),
            g => format!(" + ZeRO-3's gathered layer {}", human_bytes(g)),
        };
        let stages = if j - i == 1 {
            format!("stage {i}")
        } else {
            format!("stages {i}–{}", j - 1)
        };
        println!(
            "         {stages} ({} layers{}): {} parameters; weights {}, grads {}, opt state {}: {}{gather}{activations}",
            r.layer_count(),
            if j - i == 1 && !r.chunks.is_empty() {
                let c: Vec<String> = r
                    .chunks
                    .iter()
                    .map(|c| format!("{}–{}", c.start, c.end.saturating_sub(1)))
                    .collect();
                format!(" in {} chunks, {}", c.len(), c.join(", "))
            } else if j - i == 1 {
                format!(", {}–{}", r.layers.start, r.layers.end.saturating_sub(1))
            } else {
                " each".to_string()
            },
            r.params(),
            human_bytes(r.weights_bytes),
            human_bytes(r.gradient_bytes),
            human_bytes(r.optimizer_state_bytes),
            human_bytes(r.model_state_bytes()),
        );
        if let Some(h) = r.host_bytes {
            println!(
                "           host (ZeRO-Offload: the rank's optimizer partition, f32 master, gradient buffer and state): {}",
                human_bytes(h)
            );
        }
        i = j;
    }
}

fn dtype_lines(cases: &[Case]) {
    for (c, _) in workload::checkpoint_dtypes(cases) {
        match c.checkpoint_dtype {
            Some(ck) if ck == c.dtype => println!(
                "dtype {}: the checkpoint's (its config's torch_dtype / dtype); --dtype answers for another",
                c.dtype
            ),
            Some(ck) => println!(
                "dtype {}: as --dtype asks; the checkpoint holds {ck}",
                c.dtype
            ),
            None => {}
        }
    }
}

/// `--plot FILE.svg|png`: every case's phases as stacked bars by component
/// ([`crate::formula::breakdown`]), the budget as a line.
fn write_plot(
    path: &std::path::Path,
    cases: &[Case],
    predictions: &[CasePrediction],
    budget: Option<u64>,
) -> anyhow::Result<()> {
    use crate::formula::breakdown::COMPONENTS;
    use crate::store::breakdown::{Group, picture};
    use crate::store::picture::Format;
    let format = Format::of(path).expect("checked before predicting");
    let groups: Vec<Group> = cases
        .iter()
        .zip(predictions)
        .map(|(c, p)| Group {
            label: format!("{} B{} S{} {}", c.preset, c.batch, c.seq, c.dtype.as_str()),
            bars: p
                .breakdown
                .iter()
                .flatten()
                .map(|b| (b.phase, b.bytes))
                .collect(),
        })
        .collect();
    if groups.iter().all(|g| g.bars.is_empty()) {
        anyhow::bail!(
            "--plot {}: no case asks for a train step, inference, prefill or decode",
            path.display()
        );
    }
    let title = "Predicted memory by phase and component";
    let mut out = std::io::BufWriter::new(anyhow::Context::with_context(
        std::fs::File::create(path),
        || format!("writing {}", path.display()),
    )?);
    picture(title, &COMPONENTS, &groups, budget).write(&mut out, format)?;
    out.flush()?;
    eprintln!(
        "plot: {} bar(s) of {} case(s) → {}",
        groups.iter().map(|g| g.bars.len()).sum::<usize>(),
        groups.len(),
        path.display()
    );
    Ok(())
}

/// `--timeline FILE`: every case's predicted train step and serving phases
/// ([`crate::formula::timeline`]), one trace process each.
fn write_timelines(path: &std::path::Path, cases: &[Case], threads: usize) -> anyhow::Result<()> {
    use crate::formula::timeline;
    use crate::store::picture::Format;
    let picture = match path.extension().and_then(|e| e.to_str()) {
        Some("json") => None,
        _ => Some(Format::of(path).ok_or_else(|| {
            anyhow::anyhow!(
                "--timeline {}: give a .json file (Chrome/Perfetto trace events) or an .svg or .png (a picture)",
                path.display()
            )
        })?),
    };
    let mut timelines = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let shape = Shape::of(case);
        let mut of_case = Vec::new();
        if case.phases.contains(&Phase::TrainStep) {
            of_case.push((
                "train step",
                timeline::train_step(&shape, case.optimizer, threads),
            ));
        }
        for (phase, t) in timeline::serving(&shape, &case.phases, threads) {
            of_case.push((phase.as_str(), t));
        }
        for (phase, t) in of_case {
            let (peak, at) = t.peak();
            let (op, layer) = t.peak_op();
            eprintln!(
                "timeline: case {i} {phase}, {} events, peak {} at {op} ({layer}, {})",
                t.samples.len(),
                human_bytes(peak),
                t.samples.get(at).map_or("-", |s| s.stage)
            );
            timelines.push((
                format!(
                    "case {i}: {} B{} S{} {} {} {phase} (predicted)",
                    case.preset,
                    case.batch,
                    case.seq,
                    case.dtype.as_str(),
                    case.device
                ),
                t,
            ));
        }
    }
    if timelines.is_empty() {
        anyhow::bail!(
            "--timeline: no case asks for a train step, inference, prefill or decode (add one to --phases)"
        );
    }
    if picture.is_some() && timelines.len() > 1 {
        anyhow::bail!(
            "--timeline {}: a picture draws one timeline and these cases make {}; use a .json trace (one process each) or ask for one case and phase",
            path.display(),
            timelines.len()
        );
    }
    let file = std::fs::File::create(path)
        .map_err(|e| anyhow::anyhow!("--timeline {}: {e}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    match picture {
        Some(format) => {
            let (name, t) = &timelines[0];
            timeline::picture(name, t).write(&mut out, format)?;
        }
        None => timeline::write_trace(&mut out, &timelines)?,
    }
    out.flush()?;
    Ok(())
}

/// The prediction of one case (and, with a budget, the largest batch that fits). A mixture of
/// experts' budget answers assume the worst routing when `worst_fit` (the safe answer), else
/// balanced routing.
pub fn predict_case(
    case: &Case,
    threads: usize,
    budget: Option<u64>,
    worst_fit: bool,
) -> CasePrediction {
    let shape = Shape::of(case);
    let moe = case.cfg.llama.and_then(|l| l.moe).is_some();
    // What the budget answers are computed on.
    let fit = Shape {
        worst_routing: moe && worst_fit,
        ..shape.clone()
    };
    let at = |phase| shape.predict(phase, case.optimizer, threads).peak_bytes;
    // The weights after init: QLoRA's projections are GGML blocks by then.
    let weights = |s: &Shape| {
        s.predict(Phase::Init, case.optimizer, threads)
            .retained_bytes
            .max(0) as u64
    };
    let train_total = |s: &Shape| s.train_total_bytes(case.optimizer, threads);
    // On the CPU the budget caps the whole process: its machine-dependent part comes first.
    let process_bytes = (budget.is_some() && !case.device.is_cuda())
        .then(|| crate::formula::gemm::process_slab_bytes(threads));
    let budget = budget.map(|b| b.saturating_sub(process_bytes.unwrap_or(0)));
    // The training answers only where the case trains (a serving-only --phases asks none).
    let trains = case.phases.iter().any(|p| p.trains());
    let (fits, max_batch, max_seq) = match budget {
        Some(b) if trains => (
            Some(budget::fits(&fit, b, case.optimizer, threads)),
            Some(budget::max_batch(&fit, b, case.optimizer, threads, 0) as usize),
            Some(budget::max_seq(&fit, b, case.optimizer, threads) as usize),
        ),
        _ => (None, None, None),
    };
    let serving = shape
        .vision
        .is_none()
        .then(|| budget::serving(&shape, &fit, threads, budget));
    let whole_backward_train_step_bytes =
        (trains && shape.by_block && shape.checkpoint == 0).then(|| {
            Shape {
                by_block: false,
                ..shape.clone()
            }
            .predict(Phase::TrainStep, case.optimizer, threads)
            .peak_bytes
        });
    CasePrediction {
        backward: case.backward.as_str().into(),
        whole_backward_train_step_bytes,
        case: case.index,
        model: case.model.as_str().to_string(),
        preset: case.preset.clone(),
        batch: case.batch,
        seq: case.seq,
        params: shape.params(),
        active_params: case.cfg.active_params(),
        fit_routing: (moe && budget.is_some())
            .then(|| if worst_fit { "worst" } else { "balanced" }.to_string()),
        routing: case
            .cfg
            .llama
            .and_then(|l| l.moe)
            .map(|m| {
                format!(
                    "balanced: {}·B·S/{} tokens per expert (the figures shown; worst case: every expert a token, the first {} as full as possible)",
                    m.top_k, m.experts, m.top_k
                )
            }),
        worst_routing_phase_peak_bytes: case.cfg.llama.and_then(|l| l.moe).map(|_| {
            let worst = Shape {
                worst_routing: true,
                ..shape.clone()
            };
            case.phases
                .iter()
                .map(|&p| {
                    (
                        p.as_str().to_string(),
                        worst.predict(p, case.optimizer, threads).peak_bytes,
                    )
                })
                .collect()
        }),
        weights_bytes: weights(&shape),
        gradient_bytes: shape.gradient_bytes(),
        optimizer_state_bytes: shape.optimizer_state_bytes(case.optimizer),
        graph_bytes: shape
            .predict(Phase::Forward, case.optimizer, threads)
            .retained_bytes
            .max(0) as u64,
        phase_peak_bytes: case
            .phases
            .iter()
            .map(|&ph| (ph.as_str().to_string(), at(ph)))
            .collect(),
        train_total_bytes: train_total(&shape),
        process_bytes,
        // The serving process: the serving copy's weights (`--weights`), a ViT's own.
        inference_total_bytes: serving
            .as_ref()
            .map_or_else(|| weights(&shape), |sv| sv.weights_bytes)
            + at(Phase::Inference),
        fits,
        parallel: None,
        parallel_search: None,
        parallel_serving: None,
        max_batch,
        max_seq,
        serving,
        calibrated: None,
        breakdown: None,
        calibration_runtime: None,
    }
}

/// `--parallel`'s answer for one case: the layout and each pipeline stage's rank.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ParallelAnswer {
    pub layout: String,
    pub gpus: usize,
    /// The precision regime (`amp=`; [`crate::formula::parallel::Amp`]): `autocast`,
    /// `megatron`, `deepspeed`, or `pure` without mixed precision.
    pub precision: String,
    /// What the regime holds, in words.
    pub precision_means: String,
    /// `sp=on`: the norms' and the residual stream's activations split over tp by sequence.
    pub sequence_parallel: bool,
    /// `offload=optimizer`: ZeRO-Offload, each rank's optimizer partition in host memory
    /// (each rank's `host_bytes`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub offload: bool,
    pub ranks: Vec<crate::formula::parallel::StageRank>,
    /// ZeRO-3: each stage's rank's gathered parameters (DeepSpeed's largest tensor's whole
    /// weight and gradient under `amp=deepspeed`, else FSDP's largest unit whole twice and its
    /// gradient once: [`crate::formula::parallel::gathered_layer`]); absent below stage 3.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gathered_bytes: Option<Vec<u64>>,
    /// Each stage's rank's activations (the graph its microbatches in flight keep), where the
    /// split is modelled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activations: Option<Vec<crate::formula::parallel::StageActivations>>,
    /// Why there are none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activations_missing: Option<String>,
}

/// The model states of each pipeline stage's rank of `case` under `layout`
/// ([`crate::formula::parallel`]).
pub fn parallel_answer(
    case: &Case,
    layout: &crate::formula::parallel::Layout,
    amp: crate::formula::parallel::Amp,
    threads: usize,
) -> anyhow::Result<ParallelAnswer> {
    let spec = crate::formula::parallel::ParallelSpec {
        layout: *layout,
        amp,
        search: false,
        mb_given: false,
        sp: false,
        offload: false,
        gather: None,
    };
    parallel_answer_sp(case, &spec, true, threads)
}

/// [`parallel_answer`] for `spec`'s layout and precision, with sequence parallelism where it
/// says `sp` and ZeRO-Offload where it says `offload` (each rank's optimizer partition in host
/// memory); a mixture's activations at the worst routing where `worst`, else balanced.
pub fn parallel_answer_sp(
    case: &Case,
    spec: &crate::formula::parallel::ParallelSpec,
    worst: bool,
    threads: usize,
) -> anyhow::Result<ParallelAnswer> {
    use crate::formula::parallel;
    let (layout, amp, sp, offload) = (&spec.layout, spec.amp, spec.sp, spec.offload);
    let what = |e: String| anyhow::anyhow!("case {}: {e}", case.index);
    layout.check(&case.cfg).map_err(what)?;
    let shape = Shape::of(case);
    let regime =
        parallel::regime(amp, shape.mixed, shape.elem.size(), case.optimizer).map_err(what)?;
    // The graph the regime keeps: autocast's, or the pure graph of the element type.
    let graph = Shape {
        mixed: regime.graph_mixed,
        worst_routing: worst && shape.llama.is_some_and(|l| l.moe.is_some()),
        ..shape.clone()
    };
    let acts = parallel::shard_graph_sp(&graph, layout.tp, layout.ep, sp, case.optimizer, threads)
        .map(|g| parallel::stage_activations_of(&g, case.cfg.layers, layout));
    let (w, g, _) = regime.rates;
    Ok(ParallelAnswer {
        sequence_parallel: sp,
        offload,
        layout: layout.to_string(),
        gpus: layout.gpus(),
        precision: if shape.mixed { amp.as_str() } else { "pure" }.to_string(),
        precision_means: regime.name.to_string(),
        gathered_bytes: (layout.zero == 3)
            .then(|| parallel::gathered_layer(&case.cfg, layout, (w, g), spec.gathering())),
        ranks: parallel::stage_ranks_of(
            &case.cfg,
            layout,
            regime.rates,
            regime.masters,
            offload.then_some(regime.master_in_state),
        ),
        activations_missing: acts.as_ref().err().cloned(),
        activations: acts.ok(),
    })
}

/// `--parallel search`'s answer for one case.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ParallelSearch {
    pub gpus: usize,
    pub budget_bytes: u64,
    pub precision: String,
    pub precision_means: String,
    /// `sp=on`: every layout with sequence parallelism.
    pub sequence_parallel: bool,
    /// `offload=optimizer`: every layout with ZeRO-Offload (ZeRO 1 to 3).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub offload: bool,
    /// Every layout, best first ([`crate::formula::parallel::rank_candidates`]).
    pub layouts: Vec<crate::formula::parallel::Candidate>,
    /// Why some layouts' activations are unknown (by tensor-parallel size).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub activations_missing: Vec<(usize, String)>,
}

/// Every layout of `gpus` GPUs for `case` ([`crate::formula::parallel::layouts`]), each
/// layout's worst rank against `budget`. The replay runs once per tensor-parallel size (the
/// shard's graph and its backward's transient); the rest is arithmetic on the model's tensors.
fn parallel_search(
    case: &Case,
    spec: &crate::formula::parallel::ParallelSpec,
    gpus: usize,
    budget: u64,
    worst: bool,
    threads: usize,
) -> anyhow::Result<ParallelSearch> {
    use crate::formula::parallel;
    let what = |e: String| anyhow::anyhow!("case {}: {e}", case.index);
    let shape = Shape::of(case);
    let regime =
        parallel::regime(spec.amp, shape.mixed, shape.elem.size(), case.optimizer).map_err(what)?;
    let graph = Shape {
        mixed: regime.graph_mixed,
        worst_routing: worst && shape.llama.is_some_and(|l| l.moe.is_some()),
        ..shape.clone()
    };
    let mut all = parallel::layouts(&case.cfg, gpus, spec.mb_given.then_some(spec.layout.mb));
    if spec.offload {
        // ZeRO-Offload offloads the partitioned optimizer: ZeRO 1 to 3 (over one replica,
        // stage 1: a partition of one).
        all = all
            .into_iter()
            .filter_map(|l| match (l.zero, l.dp) {
                (0, 1) => Some(parallel::Layout { zero: 1, ..l }),
                (0, _) => None,
                _ => Some(l),
            })
            .collect();
    }
    if all.is_empty() {
        return Err(what(format!(
            "--parallel search: no layout of {gpus} GPUs splits this model (tp ≤ 8 dividing the heads, pp ≤ the layers)"
        )));
    }
    // By (tp, ep): the shard's graph and its backward's transient.
    type Known = Result<(parallel::ShardGraph, u64), String>;
    let mut per_tp: std::collections::BTreeMap<(usize, usize), Known> = Default::default();
    let mut transients: std::collections::BTreeMap<(usize, usize), Result<u64, String>> =
        Default::default();
    let (w, g, _) = regime.rates;
    let mut layouts = Vec::with_capacity(all.len());
    for l in &all {
        let known = per_tp.entry((l.tp, l.ep)).or_insert_with(|| {
            let sg =
                parallel::shard_graph_sp(&graph, l.tp, l.ep, spec.sp, case.optimizer, threads)?;
            // The transient of the rank's own step: its experts' rows under the routing.
            let t = transients
                .entry((l.tp, l.ep))
                .or_insert_with(|| {
                    parallel::backward_transient_ep(&graph, l.tp, l.ep, case.optimizer, threads)
                })
                .clone()?;
            Ok((sg, t))
        });
        let ranks = parallel::stage_ranks_of(
            &case.cfg,
            l,
            regime.rates,
            regime.masters,
            spec.offload.then_some(regime.master_in_state),
        );
        let gathered = parallel::gathered_layer(&case.cfg, l, (w, g), spec.gathering());
        let acts = known
            .as_ref()
            .ok()
            .map(|(sg, t)| (parallel::stage_activations_of(sg, case.cfg.layers, l), *t));
        layouts.push(parallel::candidate(
            l,
            &ranks,
            &gathered,
            acts.as_ref().map(|(a, t)| (a.as_slice(), *t)),
            budget,
        ));
    }
    parallel::rank_candidates(&mut layouts);
    Ok(ParallelSearch {
        gpus,
        budget_bytes: budget,
        precision: if shape.mixed {
            spec.amp.as_str()
        } else {
            "pure"
        }
        .to_string(),
        precision_means: regime.name.to_string(),
        sequence_parallel: spec.sp,
        offload: spec.offload,
        layouts,
        activations_missing: {
            // One line a tp (the reason is the split's, whatever the ep).
            let mut why: Vec<(usize, String)> = per_tp
                .into_iter()
                .filter_map(|((tp, _), r)| r.err().map(|e| (tp, e)))
                .collect();
            why.dedup_by_key(|(tp, _)| *tp);
            why
        },
    })
}

/// `--parallel search`'s lines under a case: the layouts that fit, best first, then how many
/// are unknown and how many do not fit (the closest few named).
fn print_search(s: &ParallelSearch) {
    let fit: Vec<_> = s.layouts.iter().filter(|c| c.fits == Some(true)).collect();
    let unknown: Vec<_> = s.layouts.iter().filter(|c| c.fits.is_none()).collect();
    let no: Vec<_> = s.layouts.iter().filter(|c| c.fits == Some(false)).collect();
    println!(
        "       parallel search over {} GPUs of {}: {} layouts; {} fit, {} unknown, {} do not fit (worst rank: model states + ZeRO-3's gathered layer + the activations 1F1B keeps + one microbatch's backward transient; collectives' buffers not included)",
        s.gpus,
        human_bytes(s.budget_bytes),
        s.layouts.len(),
        fit.len(),
        unknown.len(),
        no.len()
    );
    println!(
        "         precision {}{}",
        s.precision_means,
        if s.sequence_parallel {
            "; sequence parallel"
        } else {
            ""
        }
    );
    if s.offload {
        println!(
            "         ZeRO-Offload: each rank's optimizer partition in host memory (its bytes a rank beside each layout, not held against the budget)"
        );
    }
    let line = |tag: &str, c: &crate::formula::parallel::Candidate| {
        let detail = match (c.activation_bytes, c.transient_bytes, c.peak_bytes) {
            (Some(a), Some(t), Some(p)) => format!(
                "states {} + activations {} + transient {} = {}",
                human_bytes(c.state_bytes),
                human_bytes(a),
                human_bytes(t),
                human_bytes(p)
            ),
            _ => format!("states {}, activations unknown", human_bytes(c.state_bytes)),
        };
        let host = c.host_bytes.map_or(String::new(), |h| {
            format!("; host {} a rank", human_bytes(h))
        });
        println!(
            "         {tag:<7} {:<40} worst rank stage {}: {detail}{host}",
            c.layout, c.worst_stage
        );
    };
    for c in &fit {
        line("fits", c);
    }
    for c in &unknown {
        line("unknown", c);
    }
    for c in no.iter().take(if fit.is_empty() { 5 } else { 0 }) {
        line("no", c);
    }
    for (tp, why) in &s.activations_missing {
        println!("         tp={tp}: activations unknown: {why}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        let p = |s| units::parse_size(s, "fit-in");
        assert_eq!(p("80GiB").unwrap(), 80 << 30);
        assert_eq!(p("24G").unwrap(), 24 << 30);
        assert_eq!(p("512 MiB").unwrap(), 512 << 20);
        assert_eq!(p("1.5TB").unwrap(), 1_500_000_000_000);
        assert_eq!(p("1000B").unwrap(), 1000);
        assert!(p("1000").is_err());
        assert!(p("lots").is_err());
        assert!(p("-3G").is_err());
        assert!(p("0").is_err());
    }
}
