//! Runs one case's phases on its device (the CPU or a CUDA GPU, the same code) and returns one
//! reading per requested phase. On CUDA every window ends with a device synchronize, so the
//! meters read finished work.

use anyhow::Context;
use candle_core::backprop::GradStore;
use candle_core::{D, DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};

use crate::device::{Precision, ServingWeights};
use crate::model::transformer::KvCache;
use crate::optim::Opt;
use crate::record::StatusError;

use super::Phase;
use super::by_block::Backward;
use super::{generate, train};
use crate::meter::{Meter, measure};
use crate::model::config::Config;
use crate::model::moe::HostRouting;
use crate::model::transformer::{Transformer, synthetic_batch};
use crate::model::vit;
use crate::workload::Case;

pub use crate::step::PhaseResult;

/// The training state a case builds up phase by phase.
struct Trainer {
    varmap: VarMap,
    model: Transformer,
    tokens: Tensor,
    targets: Tensor,
    /// Blocks per checkpoint segment; 0 = no checkpointing.
    checkpoint: usize,
    /// Without checkpointing: the whole graph's backward or block by block.
    backward: Backward,
    /// Mixed precision: the working element type of the forward.
    compute: Option<DType>,
    /// LoRA: only the adapters train.
    lora: bool,
}

impl Trainer {
    fn init(case: &Case, device: &Device) -> candle_core::Result<(VarMap, Transformer)> {
        let varmap = VarMap::new();
        // Mixed precision keeps f32 master weights; the 16-bit copies are made per forward.
        let param_dtype = match case.precision {
            Precision::Pure => case.dtype.candle(),
            Precision::Mixed => DType::F32,
        };
        let vb = VarBuilder::from_varmap(&varmap, param_dtype, device);
        let model = Transformer::new(&case.cfg, vb)?;
        // LoRA: the base weights are frozen (detached views), only the adapters train.
        let model = if case.cfg.lora_rank > 0 {
            let frozen = model.frozen()?;
            if case.cfg.lora_base.quantized() {
                // QLoRA keeps only the quantized copy of the projections' weights.
                let mut data = varmap.data().lock().expect("varmap lock");
                for (i, path, _) in case.cfg.all_projections() {
                    data.remove(&format!("h.{i}.{path}.weight"));
                }
            }
            frozen
        } else {
            model
        };
        Ok((varmap, model))
    }

    /// The case's optimizer over the trainable variables: in place with fused kernels.
    fn optimizer(&self, case: &Case) -> candle_core::Result<Opt> {
        Opt::build(
            case.optimizer,
            self.trainable(),
            case.optimizer_block,
            case.cfg.kernels.fused(),
        )
    }

    /// The variables the optimizer updates: all, or with LoRA the adapters only.
    fn trainable(&self) -> Vec<candle_core::Var> {
        if self.lora {
            let data = self.varmap.data().lock().expect("varmap lock");
            let mut names: Vec<&String> = data.keys().filter(|k| k.contains("lora_")).collect();
            names.sort();
            names.into_iter().map(|k| data[k].clone()).collect()
        } else {
            self.varmap.all_vars()
        }
    }

    /// The training forward (`phase::train`): under mixed precision on a 16-bit working copy
    /// of the weights (recorded conversions, so the gradients reach the f32 masters), the loss
    /// in f32.
    fn forward(&self) -> candle_core::Result<Graph> {
        let cast = self.compute.map(|d| move |t: &Tensor| t.to_dtype(d));
        let cast = cast
            .as_ref()
            .map(|f| f as &crate::model::tensor_ops::Map<'_, Tensor>);
        let (k, backward) = (self.checkpoint, self.backward);
        train::forward(&self.model, cast, &self.tokens, &self.targets, k, backward)
    }

    /// The backward of any graph (`phase::train`): the plain graph stays with the caller (the
    /// `backward` window ends with it alive), the by-block and checkpointed ones are used up.
    fn backward(&self, graph: &mut Option<Graph>) -> candle_core::Result<GradStore> {
        let vars = || self.varmap.all_vars();
        train::backward(&self.model, vars, graph, &self.tokens, self.checkpoint)
    }

    fn train_step(&self, opt: &mut Opt) -> candle_core::Result<()> {
        use crate::meter::cpu_alloc::mark;
        mark(0);
        let mut graph = Some(self.forward()?);
        mark(1);
        let grads = self.backward(&mut graph)?;
        drop(graph);
        mark(2);
        opt.step(&grads)
    }
}

/// A window's allocation events (`meter::cpu_alloc`) as a timeline
/// ([`crate::timeline::classify`]: each allocation made in a stage and alive at its
/// end is that stage's kept bytes — the forward's activations, the backward's gradients, the
/// cache prefill and decode leave; the others temporaries), written to
/// `dir/case-N-PHASE.json`. A train step's stages are its marks; a serving phase is one stage.
/// On CUDA the window's pool samples instead, marked with its exact peak (the last of
/// `results`, the window just measured).
fn write_measured_timeline(
    dir: &std::path::Path,
    case: &Case,
    phase: Phase,
    baseline: u64,
    results: &[PhaseResult],
) -> anyhow::Result<()> {
    use crate::meter::cpu_alloc::{EVENTS, STAGES, take_events};
    use crate::store::timeline::{write_sampled_trace_file, write_trace_file};
    use crate::timeline::of_addresses;
    let name = format!(
        "case {}: {} B{} S{} {} {} (measured)",
        case.index,
        case.preset,
        case.batch,
        case.seq,
        case.dtype.as_str(),
        phase.as_str().replace('-', " ")
    );
    let path = dir.join(format!("case-{}-{}.json", case.index, phase.as_str()));
    if case.device != crate::device::DeviceSpec::Cpu {
        // CUDA: the pool's samples of the window (its exact peak is the row's `peak_bytes`).
        let Some(s) = crate::meter::pool_timeline::take() else {
            eprintln!(
                "warning: --timeline: {} of case {}: the pool was not sampled (a device without memory pools?)",
                phase.as_str(),
                case.index
            );
            return Ok(());
        };
        let peak = last_peak(results, phase);
        return write_sampled_trace_file(&path, &name, s.baseline_bytes, &s.samples, peak)
            .with_context(|| format!("--timeline: writing {}", path.display()));
    }
    let (raw, marks) = take_events().map_err(|n| {
        anyhow::anyhow!(
            "--timeline: the {} made {n} allocation events, more than the {EVENTS} recorded",
            phase.as_str()
        )
    })?;
    let marks: Vec<(usize, &'static str)> = match phase {
        Phase::TrainStep => marks
            .iter()
            .zip(STAGES)
            .filter_map(|(m, stage)| m.map(|m| (m, stage)))
            .collect(),
        p => vec![(0, p.as_str())],
    };
    let mut t = of_addresses(&raw, &marks);
    t.baseline_bytes = baseline;
    write_trace_file(&path, &[(name, t)])
        .with_context(|| format!("--timeline: writing {}", path.display()))
}

/// `dir` when the case runs on the CPU (whose allocator records events; CUDA samples its pool).
fn on_cpu<'p>(case: &Case, dir: Option<&'p std::path::Path>) -> Option<&'p std::path::Path> {
    dir.filter(|_| case.device == crate::device::DeviceSpec::Cpu)
}

/// The peak of the `phase` window just measured (the last result, when it is that phase's).
fn last_peak(results: &[PhaseResult], phase: Phase) -> Option<u64> {
    match results.last() {
        Some(PhaseResult {
            phase: p,
            outcome: Ok(r),
        }) if *p == phase => r.peak_bytes,
        _ => None,
    }
}

/// Runs `body` with the counting allocator's events recorded (when `dir` is given), noting the
/// bytes alive as it starts in `baseline`.
fn recording(
    dir: Option<&std::path::Path>,
    baseline: &mut u64,
    body: &mut dyn FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    if dir.is_some() {
        *baseline = crate::meter::cpu_alloc::current();
        crate::meter::cpu_alloc::start_events();
    }
    let r = body();
    crate::meter::cpu_alloc::stop_events();
    r
}

/// What a training forward leaves for the backward.
type Graph = train::Graph<Tensor, HostRouting, Config>;

/// The case's synthetic input and targets: tokens `(B, S)` for the decoder, images
/// `(B, C, I, I)` and classes `(B, 1)` for a ViT.
fn synthetic_input(case: &Case, device: &Device) -> candle_core::Result<(Tensor, Tensor)> {
    match case.cfg.vision {
        None => synthetic_batch(case.batch, case.seq, case.cfg.vocab, device),
        Some(v) => vit::synthetic_batch(case.batch, v, case.cfg.vocab, device),
    }
}

/// On the CPU, a small matmul on every thread of the pool: each thread's first packing product
/// makes gemm's per-thread packing slab (this CPU's L2 size), which would otherwise appear in
/// whichever window first gives that thread work (`probe matmul` measured it in 11 of 16 runs
/// at n = 384 and 512 on 2 threads). Nothing on other devices.
pub fn warm_pool_threads(device: &Device) -> anyhow::Result<()> {
    if device.is_cpu() {
        rayon::broadcast(|_| -> candle_core::Result<()> {
            let a = Tensor::ones((64, 64), DType::F32, device)?;
            a.matmul(&a).map(drop)
        })
        .into_iter()
        .collect::<candle_core::Result<Vec<_>>>()?;
    }
    Ok(())
}

/// One unmetered step on a throwaway model of the case's shape, plus a small matmul on every
/// pool thread: first-use allocations (gemm scratch, thread-locals) happen here. The step is a
/// training step when a training phase is asked (forward, backward, optimizer, train step);
/// otherwise only the serving forwards run, so that a case that serves a model holds no
/// gradients or optimizer state it never asked for (a gpt-oss-20b slice whose weights fit
/// was killed here by its training step's 4× the weights).
pub fn warm_up(case: &Case, device: &Device) -> anyhow::Result<()> {
    warm_pool_threads(device)?;
    let (varmap, model) = Trainer::init(case, device)?;
    let (tokens, targets) = synthetic_input(case, device)?;
    let t = Trainer {
        varmap,
        model,
        tokens,
        targets,
        checkpoint: case.checkpoint,
        backward: case.backward,
        compute: (case.precision == Precision::Mixed).then(|| case.dtype.candle()),
        lora: case.cfg.lora_rank > 0,
    };
    if case.phases.iter().any(|p| p.trains()) {
        let mut opt = t.optimizer(case)?;
        t.train_step(&mut opt)?;
    }
    let detached = t.model.detached();
    let _ = detached.forward(&t.tokens)?;
    // Generation's shapes (a prompt into a cache, then one token per sequence) reach gemm
    // paths and pool threads that the step does not (measured: a second thread's 512 KiB of
    // packing first allocated inside the decode window at 2 threads).
    if case.phases.contains(&Phase::Prefill) || case.phases.contains(&Phase::Decode) {
        let mut cache = KvCache::default();
        let next = detached
            .forward_cached(&t.tokens, &mut cache)?
            .argmax(D::Minus1)?
            .unsqueeze(1)?;
        drop(detached.forward_cached(&next, &mut cache)?);
    }
    Ok(())
}

/// Told where a case is, before each asked phase's window opens, with the results so far (all
/// final): the warm-up step is announced as the first asked phase, since it prepares that
/// window. The per-case process ([`crate::sweep`]) streams them to `memfit run`, so that a
/// crash loses only the phase that was running.
pub type Observer<'a> = dyn Fn(Phase, &[PhaseResult]) + 'a;

/// Runs the case's phases in order; returns one result per requested phase. Stops at the first
/// failure: that phase gets the failure's status (`oom`, `error`), every later requested phase
/// `skipped`, naming it.
pub fn run_case(case: &Case, meters: &mut [Box<dyn Meter>]) -> Vec<PhaseResult> {
    run_case_observed(case, meters, &|_, _| {})
}

/// [`run_case`], telling `observe` before each window.
pub fn run_case_observed(
    case: &Case,
    meters: &mut [Box<dyn Meter>],
    observe: &Observer,
) -> Vec<PhaseResult> {
    let mut results = Vec::new();
    if let Err(e) = run_chain(case, meters, &mut results, observe) {
        let failed_at = results.len();
        let (status, msg) = crate::record::failure_of(&e);
        let failed = case.phases.get(failed_at).map_or("?", |p| p.as_str());
        for (i, &phase) in case.phases.iter().enumerate().skip(failed_at) {
            let error = if i == failed_at {
                StatusError::error(status, msg.clone())
            } else {
                StatusError::skipped_after(failed, &msg)
            };
            results.push(PhaseResult {
                phase,
                outcome: Err(error),
            });
        }
    }
    results
}

fn run_chain(
    case: &Case,
    meters: &mut [Box<dyn Meter>],
    results: &mut Vec<PhaseResult>,
    observe: &Observer,
) -> anyhow::Result<()> {
    let device = case
        .device
        .candle()
        .with_context(|| format!("opening device {}", case.device))?;
    let last = *case
        .phases
        .iter()
        .max()
        .context("the case asks for no phase")?;
    observe(case.phases[0], results);
    warm_up(case, &device).context("the unmetered warm-up step before the first window")?;

    let metered = |phase: Phase,
                   results: &mut Vec<PhaseResult>,
                   meters: &mut [Box<dyn Meter>],
                   f: &mut dyn FnMut() -> anyhow::Result<()>|
     -> anyhow::Result<()> {
        if case.phases.contains(&phase) {
            observe(phase, results);
            crate::model::moe::routing_window();
            let ((), mut reading) = measure(meters, || {
                f()?;
                // Queued GPU work belongs to this window (a no-op on the CPU).
                device.synchronize()?;
                Ok(())
            })
            .with_context(|| format!("phase {}", phase.as_str()))?;
            // The routing this window's forward drew (a backward's: its forward's).
            reading.moe_routing = crate::model::moe::routing_snapshot();
            results.push(PhaseResult {
                phase,
                outcome: Ok(reading),
            });
            Ok(())
        } else {
            f().with_context(|| format!("phase {} (unmetered)", phase.as_str()))
        }
    };

    // init
    let mut built = None;
    metered(Phase::Init, results, meters, &mut || {
        built = Some(Trainer::init(case, &device)?);
        Ok(())
    })?;
    let (varmap, model) = built.take().expect("init ran");
    let (tokens, targets) = synthetic_input(case, &device)?;
    let t = Trainer {
        varmap,
        model,
        tokens,
        targets,
        checkpoint: case.checkpoint,
        backward: case.backward,
        compute: (case.precision == Precision::Mixed).then(|| case.dtype.candle()),
        lora: case.cfg.lora_rank > 0,
    };
    if last == Phase::Init {
        return Ok(());
    }

    let mut opt = None;
    if last >= Phase::Forward
        && case
            .phases
            .iter()
            .any(|&p| p <= Phase::Optimizer && p > Phase::Init)
    {
        // forward
        let mut graph = None;
        metered(Phase::Forward, results, meters, &mut || {
            graph = Some(t.forward()?);
            Ok(())
        })?;
        // backward
        let mut grads = None;
        if last >= Phase::Backward {
            metered(Phase::Backward, results, meters, &mut || {
                grads = Some(t.backward(&mut graph)?);
                Ok(())
            })?;
        }
        drop(graph);
        // optimizer
        if last >= Phase::Optimizer {
            let g = grads.take().expect("backward ran");
            metered(Phase::Optimizer, results, meters, &mut || {
                let mut o = t.optimizer(case)?;
                o.step(&g)?;
                opt = Some(o);
                Ok(())
            })?;
        }
    }
    let wants = |p: Phase| case.phases.contains(&p);
    if wants(Phase::TrainStep) {
        let mut opt = match opt {
            Some(o) => o,
            None => {
                // The optimizer's state belongs to the steady state the step starts from.
                let mut o = t.optimizer(case)?;
                t.train_step(&mut o)?;
                o
            }
        };
        let traced = case.timeline.as_deref();
        let mut baseline = 0;
        metered(Phase::TrainStep, results, meters, &mut || {
            recording(on_cpu(case, traced), &mut baseline, &mut || {
                Ok(t.train_step(&mut opt)?)
            })
        })?;
        if let Some(dir) = traced {
            write_measured_timeline(dir, case, Phase::TrainStep, baseline, results)?;
        }
    }
    if last < Phase::Inference {
        return Ok(());
    }
    // The serving copy is made before the windows. Serving the model in mixed precision means
    // serving its 16-bit copy.
    let own = || -> candle_core::Result<Transformer> {
        match t.compute {
            None => Ok(t.model.detached()),
            Some(dtype) => t.model.detached().cast(dtype),
        }
    };
    let detached = match case.weights {
        ServingWeights::Model => own()?,
        ServingWeights::F16 => t.model.detached().cast(DType::F16)?,
        q => t.model.serving(
            q.quantized().expect("the other weights are dense"),
            q.experts_only(),
        )?,
    };
    let mut logits = None;
    let traced = case.timeline.as_deref();
    if wants(Phase::Inference) {
        let mut baseline = 0;
        metered(Phase::Inference, results, meters, &mut || {
            recording(on_cpu(case, traced), &mut baseline, &mut || {
                logits = Some(detached.forward(&t.tokens)?);
                Ok(())
            })
        })?;
        if let Some(dir) = traced {
            write_measured_timeline(dir, case, Phase::Inference, baseline, results)?;
        }
    }
    // Other weights than the model's: how far the logits moved (after the window).
    if case.weights != ServingWeights::Model && case.phases.contains(&Phase::Inference) {
        let served = logits.take().expect("inference ran").to_dtype(DType::F32)?;
        let reference = own()?.forward(&t.tokens)?.to_dtype(DType::F32)?;
        let norm = |x: &Tensor| -> candle_core::Result<f64> {
            Ok(x.sqr()?.sum_all()?.to_scalar::<f32>()?.sqrt() as f64)
        };
        let rel = norm(&(served - &reference)?)? / norm(&reference)?;
        if let Some(PhaseResult {
            phase: Phase::Inference,
            outcome: Ok(reading),
        }) = results.last_mut()
        {
            reading.logits_rel_error = Some(rel);
        }
    }
    drop(logits);
    if wants(Phase::Prefill) || wants(Phase::Decode) {
        generate(case, &t, &detached, results, meters, &metered, traced)?;
    }
    if wants(Phase::Load) {
        load(case, &t, &device, results, meters, &metered)?;
    }
    Ok(())
}

/// A metered window of `run_chain` (or the unmetered run of a phase the case did not ask for).
type Metered<'a> = dyn Fn(
        Phase,
        &mut Vec<PhaseResult>,
        &mut [Box<dyn Meter>],
        &mut dyn FnMut() -> anyhow::Result<()>,
    ) -> anyhow::Result<()>
    + 'a;

/// prefill (the prompt fills the key/value cache; the greedy next token is kept), then decode
/// (T greedy tokens, with the cache or recomputing the whole prefix each time).
fn generate(
    case: &Case,
    t: &Trainer,
    detached: &Transformer,
    results: &mut Vec<PhaseResult>,
    meters: &mut [Box<dyn Meter>],
    metered: &Metered,
    traced: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let mut cache = KvCache::default();
    let mut next = None;
    let mut baseline = 0;
    metered(Phase::Prefill, results, meters, &mut || {
        recording(on_cpu(case, traced), &mut baseline, &mut || {
            next = Some(generate::prefill(detached, &t.tokens, &mut cache)?);
            Ok(())
        })
    })?;
    let asked = |p: Phase| case.phases.contains(&p);
    if let Some(dir) = traced.filter(|_| asked(Phase::Prefill)) {
        write_measured_timeline(dir, case, Phase::Prefill, baseline, results)?;
    }
    if !asked(Phase::Decode) {
        return Ok(());
    }
    let mut prefix = t.tokens.clone();
    let (n, kv) = (case.decode_tokens, case.kv_cache);
    metered(Phase::Decode, results, meters, &mut || {
        recording(on_cpu(case, traced), &mut baseline, &mut || {
            let first = next.take().expect("prefill ran");
            next = Some(generate::decode(
                detached,
                first,
                &mut prefix,
                &mut cache,
                n,
                kv,
            )?);
            Ok(())
        })
    })?;
    if let Some(dir) = traced {
        write_measured_timeline(dir, case, Phase::Decode, baseline, results)?;
    }
    drop((cache, next, prefix));
    Ok(())
}

/// load: every variable saved to a safetensors file (outside the window), then read back whole
/// (`read`) or from a memory map (`mmap`); the loaded tensors are what stays.
fn load(
    case: &Case,
    t: &Trainer,
    device: &Device,
    results: &mut Vec<PhaseResult>,
    meters: &mut [Box<dyn Meter>],
    metered: &Metered,
) -> anyhow::Result<()> {
    let path = std::env::temp_dir().join(format!(
        "memfit-{}-{}.safetensors",
        std::process::id(),
        case.index
    ));
    t.varmap.save(&path)?;
    let mut loaded = None;
    let outcome = metered(Phase::Load, results, meters, &mut || {
        let tensors = if case.load_mmap {
            // SAFETY: the file is ours, written above and not modified while mapped.
            let st = unsafe { candle_core::safetensors::MmapedSafetensors::new(&path)? };
            let names: Vec<String> = st.tensors().into_iter().map(|(n, _)| n).collect();
            let mut tensors = std::collections::HashMap::new();
            for n in names {
                let tensor = st.load(&n, device)?;
                tensors.insert(n, tensor);
            }
            tensors
        } else {
            candle_core::safetensors::load(&path, device)?
        };
        loaded = Some(tensors);
        Ok(())
    });
    let _ = std::fs::remove_file(&path);
    outcome?;
    drop(loaded);
    Ok(())
}
