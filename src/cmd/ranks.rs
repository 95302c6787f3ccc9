//! `memfit ranks`: one data-parallel rank of a training case per process (or, `--tp N`, one
//! tensor-parallel shard: [`crate::ranks::tensor`]; `--pp N`, one pipeline stage:
//! [`crate::ranks::pipeline`]), launched by `mpirun -np N` or `srun -n N` ([`crate::ranks`]);
//! rank 0 prints every rank's windows, measured beside predicted.

use std::rc::Rc;

use anyhow::{Context, ensure};

use crate::cli::RanksArgs;
use crate::ranks::comm::Comm;
use crate::ranks::pipeline::{PipePlan, PipelineDoc, StageReport};
use crate::ranks::{self, Plan, RankReport, Window};
use crate::units::human_bytes;
use crate::workload::{self, WorkloadFile};

/// The ranks' group: MPI's world in a build with the `ranks` feature, else one process (and
/// an error when a launcher started several).
fn open_comm() -> anyhow::Result<Box<dyn Comm>> {
    #[cfg(feature = "ranks")]
    {
        let mpi = ranks::comm::Mpi::init().context("MPI was initialised already")?;
        Ok(Box::new(mpi))
    }
    #[cfg(not(feature = "ranks"))]
    {
        for var in ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"] {
            if let Ok(n) = std::env::var(var)
                && n.trim() != "1"
            {
                anyhow::bail!(
                    "memfit ranks: {var}={n}, but this memfit was built without MPI (build with `--features ranks`; Debian: libopenmpi-dev and libclang-dev)"
                );
            }
        }
        Ok(Box::new(ranks::comm::Solo))
    }
}

/// The MPI library the ranks talk through.
fn library() -> String {
    #[cfg(feature = "ranks")]
    {
        ranks::comm::Mpi::library()
    }
    #[cfg(not(feature = "ranks"))]
    {
        "none (one process; built without the `ranks` feature)".to_string()
    }
}

pub fn ranks(args: &RanksArgs) -> anyhow::Result<()> {
    let cases = workload::expand(&WorkloadFile::default(), &args.grid.grid_flags(), "flags")?;
    ensure!(
        cases.len() == 1,
        "memfit ranks: the flags make {} cases; give one (no comma lists)",
        cases.len()
    );
    let case = &cases[0];
    ensure!(
        args.zero == Some(3) || args.fsdp_prefetch == crate::cli::FsdpPrefetch::Backward,
        "memfit ranks: --fsdp-prefetch none without --zero 3 (only ZeRO 3 gathers parameters)"
    );
    ensure!(
        args.zero == Some(3) || args.fsdp_reshard_after_forward == crate::cli::OnOff::On,
        "memfit ranks: --fsdp-reshard-after-forward off without --zero 3 (only ZeRO 3 gathers parameters)"
    );
    ensure!(
        args.zero == Some(3) || args.fsdp_forward_prefetch == crate::cli::OnOff::Off,
        "memfit ranks: --fsdp-forward-prefetch on without --zero 3 (only ZeRO 3 gathers parameters)"
    );
    ensure!(
        args.zero == Some(3) || args.hsdp.is_none(),
        "memfit ranks: --hsdp without --zero 3 (hybrid sharding is ZeRO 3's)"
    );
    if args.sp {
        ensure!(
            args.tp > 1
                && args.zero.unwrap_or(0) < 3
                && args.pp.is_none()
                && args.ep == 1
                && !ranks::serve::serves(case),
            "memfit ranks --sp: sequence parallelism runs beside --tp N (2 or more) in training, with --zero 0, 1 or 2 (not beside --pp, --ep, --zero 3 or serving phases)"
        );
        ensure!(
            case.seq.is_multiple_of(args.tp),
            "memfit ranks --sp: the sequence {} does not split into {} equal runs (give --seq a multiple of --tp)",
            case.seq,
            args.tp
        );
    }
    ensure!(
        args.sp || !args.sp_skip_norm_all_reduce,
        "memfit ranks: --sp-skip-norm-all-reduce without --sp"
    );
    if ranks::serve::serves(case) {
        return serve(case, args);
    }
    ensure!(
        !args.tp_skip_g_all_reduce,
        "memfit ranks: --tp-skip-g-all-reduce without --phases prefill,decode (serving)"
    );
    if let Some(stages) = args.pp {
        ensure!(
            args.tp == 1,
            "memfit ranks --pp {stages} --tp {}: pipeline and tensor parallelism are not run together on ranks",
            args.tp
        );
        ensure!(
            args.offload == crate::cli::Offload::None,
            "memfit ranks --pp {stages} --offload: ZeRO-Offload runs with data parallelism alone (--zero 1, 2 or 3)"
        );
        return pipeline(case, args, stages);
    }
    if args.ep > 1 {
        ensure!(
            args.tp == 1 && args.pp.is_none(),
            "memfit ranks --ep {} --tp/--pp: expert parallelism is not run together with tensor or pipeline parallelism on ranks",
            args.ep
        );
        ensure!(
            args.offload == crate::cli::Offload::None,
            "memfit ranks --ep {} --offload: ZeRO-Offload runs with data parallelism alone (--zero 1, 2 or 3)",
            args.ep
        );
        return expert_parallel(case, args);
    }
    ensure!(
        !args.ep_skip_dispatch_backward && !args.ep_skip_expert_scaling,
        "memfit ranks: --ep-skip-dispatch-backward or --ep-skip-expert-scaling without --ep"
    );
    let zero = args.zero.unwrap_or(if args.tp > 1 { 0 } else { 1 });
    ranks::check_case(case, zero)?;
    let offload = args.offload == crate::cli::Offload::Optimizer;
    ensure!(
        !offload || (args.tp == 1 && (1..=3).contains(&zero)),
        "memfit ranks --offload optimizer: ZeRO-Offload runs with --zero 1, 2 or 3 and data parallelism alone (here --zero {zero}, --tp {})",
        args.tp
    );
    if args.tp > 1 {
        ranks::tensor::check_tp(case, args.tp)?;
    }
    ensure!(
        args.tp > 1 || !args.tp_skip_f_all_reduce,
        "memfit ranks: --tp-skip-f-all-reduce without --tp"
    );
    ensure!(
        !args.zero3_skip_tied_second_use || (zero == 3 && case.cfg.tied),
        "memfit ranks: --zero3-skip-tied-second-use without --zero 3 and a tied head"
    );
    if zero == 3 {
        ranks::fsdp::check_fsdp(case)?;
    }
    crate::machine::pin_threads(args.threads)?;
    let comm: Rc<dyn Comm> = Rc::from(open_comm()?);
    if let Some(s) = args.hsdp {
        ensure!(
            zero == 3 && s >= 1 && (comm.size() / args.tp).is_multiple_of(s),
            "memfit ranks --hsdp {s}: hybrid sharding runs with --zero 3, its shard group (1 to {n}) dividing the {n} ranks holding the same parameters (the ranks launched over --tp)",
            n = comm.size() / args.tp
        );
    }
    let plan = Plan {
        zero,
        check: args.check,
        threads: args.threads,
        tp: args.tp,
        sp: args.sp,
        sp_norm_all_reduce: !args.sp_skip_norm_all_reduce,
        f_all_reduce: !args.tp_skip_f_all_reduce,
        tied_second_use: !args.zero3_skip_tied_second_use,
        prefetch: args.fsdp_prefetch == crate::cli::FsdpPrefetch::Backward,
        ep: 1,
        ep_dispatch_backward: true,
        ep_expert_scaling: true,
        offload,
        reshard_after_forward: args.fsdp_reshard_after_forward == crate::cli::OnOff::On,
        forward_prefetch: args.fsdp_forward_prefetch == crate::cli::OnOff::On,
        hsdp: args.hsdp.unwrap_or(0),
    };
    let report = if args.tp > 1 && zero < 3 {
        ranks::tensor::run_tp_rank(case, plan, comm.clone())
    } else {
        ranks::run_rank(case, plan, comm.as_ref())
    }
    .with_context(|| format!("rank {} of {}", comm.rank(), comm.size()))?;
    let Some(reports) = gather::<RankReport>(comm.as_ref(), &report)? else {
        return Ok(());
    };
    let mut doc = ranks::RanksDoc::new(case, zero, args.tp, args.threads, library(), reports);
    doc.sp = args.sp;
    if zero == 3 {
        doc.fsdp_prefetch = Some(prefetch_name(args.fsdp_prefetch).to_string());
        doc.hsdp_shard_group = args.hsdp.filter(|&s| s < doc.ranks.len() / args.tp);
        doc.fsdp_reshard_after_forward = Some(on_off(args.fsdp_reshard_after_forward).to_string());
        doc.fsdp_forward_prefetch = Some(on_off(args.fsdp_forward_prefetch).to_string());
    }
    if offload {
        doc.offload = Some("optimizer".into());
        doc.layers.insert(
            "host".into(),
            "host arena (ZeRO-Offload's optimizer partition: System-allocated, outside the counting allocator), relative to each window's start".into(),
        );
    }
    if !emit(args, &doc)? {
        print_table(case, args, zero, &doc.ranks);
    }
    Ok(())
}

/// `--ep N`: expert parallelism inside data parallelism ([`crate::ranks::expert`]).
fn expert_parallel(case: &crate::workload::Case, args: &RanksArgs) -> anyhow::Result<()> {
    let zero = args.zero.unwrap_or(0);
    ranks::check_case(case, zero)?;
    ranks::expert::check_ep(case, zero, args.ep)?;
    crate::machine::pin_threads(args.threads)?;
    let comm: Rc<dyn Comm> = Rc::from(open_comm()?);
    let plan = Plan {
        zero,
        check: args.check,
        threads: args.threads,
        tp: 1,
        sp: false,
        sp_norm_all_reduce: true,
        f_all_reduce: true,
        tied_second_use: true,
        prefetch: false,
        ep: args.ep,
        ep_dispatch_backward: !args.ep_skip_dispatch_backward,
        ep_expert_scaling: !args.ep_skip_expert_scaling,
        offload: false,
        reshard_after_forward: true,
        forward_prefetch: false,
        hsdp: 0,
    };
    let report = ranks::expert::run_ep_rank(case, plan, comm.clone())
        .with_context(|| format!("rank {} of {}", comm.rank(), comm.size()))?;
    let Some(reports) = gather::<(RankReport, ranks::expert::EpRouting)>(comm.as_ref(), &report)?
    else {
        return Ok(());
    };
    let (reports, routing): (Vec<_>, Vec<_>) = reports.into_iter().unzip();
    let mut doc = ranks::RanksDoc::new(case, zero, 1, args.threads, library(), reports);
    doc.ep = args.ep;
    doc.layers.insert(
        "ep_routing".into(),
        "rows each rank's exchanges moved, counted by the rank (not a memory figure)".into(),
    );
    doc.ep_routing = routing;
    if !emit(args, &doc)? {
        print_table(case, args, zero, &doc.ranks);
        for (r, e) in doc.ep_routing.iter().enumerate() {
            println!(
                "  rank {r}: experts {}..{}, rows received per expert by sparse layer {:?} (train-step {:?}), sent per rank {:?}",
                e.experts[0],
                e.experts[1],
                e.received_rows,
                e.train_step_received_rows,
                e.sent_rows
            );
        }
    }
    Ok(())
}

/// `--tp N --phases prefill,decode`: serving with tensor parallelism ([`crate::ranks::serve`]).
fn serve(case: &crate::workload::Case, args: &RanksArgs) -> anyhow::Result<()> {
    ensure!(
        args.zero.is_none() && args.pp.is_none() && args.ep == 1,
        "memfit ranks --phases prefill,decode: serving on ranks runs with --tp only (no --zero, --pp or --ep)"
    );
    ensure!(
        !args.tp_skip_f_all_reduce,
        "memfit ranks --tp-skip-f-all-reduce: serving has no backward (use --tp-skip-g-all-reduce)"
    );
    ensure!(
        args.offload == crate::cli::Offload::None,
        "memfit ranks --phases prefill,decode --offload: serving has no optimizer to offload"
    );
    ranks::serve::check_serve(case, args.tp)?;
    crate::machine::pin_threads(args.threads)?;
    let comm: Rc<dyn Comm> = Rc::from(open_comm()?);
    ensure!(
        comm.size() == args.tp,
        "memfit ranks --tp {}: launched on {} ranks (mpirun -np {})",
        args.tp,
        comm.size(),
        args.tp
    );
    let plan = ranks::serve::ServePlan {
        check: args.check,
        threads: args.threads,
        g_all_reduce: !args.tp_skip_g_all_reduce,
    };
    let report = ranks::serve::run_serve_rank(case, plan, comm.clone())
        .with_context(|| format!("rank {} of {}", comm.rank(), comm.size()))?;
    let Some(reports) = gather::<(RankReport, ranks::serve::ServeRank)>(comm.as_ref(), &report)?
    else {
        return Ok(());
    };
    let (reports, serving): (Vec<_>, Vec<_>) = reports.into_iter().unzip();
    let mut doc = ranks::RanksDoc::new(case, 0, args.tp, args.threads, library(), reports);
    doc.windows = ranks::serve::WINDOWS
        .iter()
        .map(|w| w.to_string())
        .collect();
    doc.layers.insert(
        "serve".into(),
        "each rank's cache: its tensors' data bytes (measured) beside kv_bytes_per_token × tokens (predicted); the logits check".into(),
    );
    doc.serve = Some(ranks::serve::Serve {
        decode_tokens: case.decode_tokens,
        kv_cache: case.kv_cache,
        g_all_reduce: plan.g_all_reduce,
        ranks: serving,
    });
    if emit(args, &doc)? {
        return Ok(());
    }
    println!(
        "{} ranks, serving with tensor parallel over {} (each rank one shard and its K/V heads, every rank the same prompt; the token table and head vocab-parallel, the logits gathered) ({}), {} B{} S{}, {} decode tokens, {} thread(s) a rank",
        doc.ranks.len(),
        args.tp,
        doc.mpi_library,
        case.preset,
        case.batch,
        case.seq,
        case.decode_tokens,
        args.threads
    );
    print_windows(
        "rank",
        &ranks::serve::WINDOWS,
        doc.ranks.iter().map(|r| (r.rank, &r.windows[..])),
    );
    for (r, s) in doc
        .ranks
        .iter()
        .zip(&doc.serve.as_ref().expect("set above").ranks)
    {
        println!(
            "  rank {}: weights {} ({}); {} K/V heads, {} B a token; cache after prefill {} ({}), after decode {} ({}){}; RSS peak {}",
            r.rank,
            r.states.weights_bytes,
            r.states.predicted_weights_bytes,
            s.kv_heads,
            s.kv_bytes_per_token,
            s.kv_cache_bytes_after_prefill,
            s.predicted_kv_cache_bytes_after_prefill,
            s.kv_cache_bytes_after_decode,
            s.predicted_kv_cache_bytes_after_decode,
            s.logits_rel_diff.map_or(String::new(), |d| format!(
                "; logits against one process's whole model within {d:.2e}"
            )),
            r.rss_peak_bytes
                .map_or("—".into(), |b| human_bytes(b as f64))
        );
    }
    Ok(())
}

/// Every rank's report, as JSON over one all-gather, on rank 0 (`None` on the others).
fn gather<R: serde::Serialize + serde::de::DeserializeOwned>(
    comm: &dyn Comm,
    report: &R,
) -> anyhow::Result<Option<Vec<R>>> {
    let all = comm.all_gather_bytes(&serde_json::to_vec(report)?);
    if comm.rank() != 0 {
        return Ok(None);
    }
    let reports = all
        .iter()
        .enumerate()
        .map(|(r, b)| serde_json::from_slice(b).with_context(|| format!("rank {r}'s report")))
        .collect::<anyhow::Result<Vec<R>>>()?;
    Ok(Some(reports))
}

/// The document written to `--out` and, with `--json`, printed (then `true`: no table).
fn emit(args: &RanksArgs, doc: &impl serde::Serialize) -> anyhow::Result<bool> {
    let json = serde_json::to_string_pretty(doc)?;
    if let Some(path) = &args.out {
        std::fs::write(path, format!("{json}\n"))
            .with_context(|| format!("--out {}: writing", path.display()))?;
    }
    if args.json {
        println!("{json}");
    }
    Ok(args.json)
}

/// Each rank's windows, measured (the counting allocator) beside predicted, with the process
/// layer; `who` names a rank (`rank`, `stage`), `names` the windows.
fn print_windows<'a>(
    who: &str,
    names: &[&str],
    reports: impl Iterator<Item = (usize, &'a [Window])>,
) {
    println!(
        "layer: the counting allocator, each window relative to its start; RSS: the process (MPI's buffers included)"
    );
    let (a, b) = (
        who.len(),
        names.iter().map(|n| n.len()).max().unwrap_or(0).max(6),
    );
    println!(
        "{who:>a$} {:<b$} {:>12} {:>12} {:>8} {:>13} {:>13} {:>10}",
        "window", "peak", "predicted", "diff", "retained", "predicted", "RSS"
    );
    for (rank, windows) in reports {
        for (name, w) in names.iter().zip(windows) {
            println!(
                "{rank:>a$} {name:<b$} {:>12} {:>12} {:>8} {:>13} {:>13} {:>10}",
                w.peak_bytes,
                w.predicted_peak_bytes,
                w.peak_bytes as i64 - w.predicted_peak_bytes as i64,
                w.retained_bytes,
                w.predicted_retained_bytes,
                w.rss_bytes.map_or("—".into(), |b| human_bytes(b as f64)),
            );
        }
    }
}

/// `--pp S`: a pipeline stage a rank ([`crate::ranks::pipeline`]).
fn pipeline(case: &crate::workload::Case, args: &RanksArgs, stages: usize) -> anyhow::Result<()> {
    let plan = PipePlan {
        microbatches: args.microbatches,
        check: args.check,
        threads: args.threads,
    };
    ensure!(
        args.zero.is_none(),
        "memfit ranks --pp {stages} --zero: a pipeline runs one data-parallel replica here (its stages are not sharded by ZeRO); leave --zero out"
    );
    ranks::pipeline::check_pipeline(case, stages, plan)?;
    crate::machine::pin_threads(args.threads)?;
    let comm = open_comm()?;
    ensure!(
        comm.size() == stages,
        "memfit ranks --pp {stages}: {} ranks were launched; launch one a stage (mpirun -np {stages})",
        comm.size()
    );
    let report = ranks::pipeline::run_stage(case, plan, comm.as_ref())
        .with_context(|| format!("stage {} of {}", comm.rank(), comm.size()))?;
    let Some(reports) = gather::<StageReport>(comm.as_ref(), &report)? else {
        return Ok(());
    };
    let doc = PipelineDoc::new(case, plan, library(), reports);
    if !emit(args, &doc)? {
        print_pipeline(case, &doc);
    }
    Ok(())
}

fn print_pipeline(case: &crate::workload::Case, doc: &PipelineDoc) {
    println!(
        "{} stages, {} microbatches of B{} S{} a step (1F1B), {}, {} ({})",
        doc.stages,
        doc.microbatches,
        case.batch,
        case.seq,
        case.preset,
        case.optimizer.as_str(),
        doc.mpi_library
    );
    print_windows(
        "stage",
        &ranks::pipeline::WINDOWS,
        doc.ranks.iter().map(|r| (r.rank, &r.windows[..])),
    );
    println!(
        "activations: one microbatch's graph, and at the schedule's fullest (measured / predicted):"
    );
    for r in &doc.ranks {
        println!(
            "  stage {} (layers {}..{}): one {} / {}; {} in flight {} / {} ({} predicted in flight); parameters {} / {}",
            r.rank,
            r.layers[0],
            r.layers[1],
            r.microbatch_graph_bytes,
            r.predicted_microbatch_graph_bytes,
            r.in_flight,
            r.in_flight_graph_bytes,
            r.predicted_in_flight_graph_bytes,
            r.predicted_in_flight,
            r.params,
            r.predicted_params,
        );
        let order: Vec<String> = r
            .schedule
            .iter()
            .map(|e| format!("{}{}", e.op, e.microbatch))
            .collect();
        println!("    order {}", order.join(" "));
        if let Some(c) = r.check {
            println!(
                "    against one process on the global batch: gradients within {:.2e}, weights after two steps within {:.2e}",
                c.gradient_rel_diff, c.weight_rel_diff
            );
        }
    }
}

/// An on/off flag's value as the command line spells it.
fn on_off(v: crate::cli::OnOff) -> &'static str {
    match v {
        crate::cli::OnOff::On => "on",
        crate::cli::OnOff::Off => "off",
    }
}

/// `--fsdp-prefetch`'s value as the command line spells it.
fn prefetch_name(p: crate::cli::FsdpPrefetch) -> &'static str {
    match p {
        crate::cli::FsdpPrefetch::Backward => "backward",
        crate::cli::FsdpPrefetch::None => "none",
    }
}

fn print_table(case: &crate::workload::Case, args: &RanksArgs, zero: u8, reports: &[RankReport]) {
    let split = if args.ep > 1 {
        format!(
            "expert parallel over {} inside data parallel (each rank the dense part whole, 1/{} of the experts, its own microbatch; rows exchanged by all-to-all){}",
            args.ep,
            args.ep,
            match zero {
                0 => String::new(),
                z => format!(
                    "; ZeRO {z} over the dense part (each expert's state whole on its owner)"
                ),
            }
        )
    } else if args.tp > 1 {
        let dp = reports.len() / args.tp;
        format!(
            "tensor parallel over {}{} (each rank one shard, every rank of a group the same batch; the token table and head vocab-parallel){}",
            args.tp,
            if args.sp {
                " with sequence parallelism (the residual stream, norms and embedding output a 1/tp run of the sequence)"
            } else {
                ""
            },
            match (dp, zero) {
                (1, _) => String::new(),
                (d, 0) => format!(
                    " × {d} data-parallel replicas (tp innermost), gradients all-reduced over them"
                ),
                (d, z) => format!(
                    " × {d} data-parallel replicas (tp innermost), ZeRO {z} over them{}",
                    match args.hsdp.filter(|&s| z == 3 && s < d) {
                        Some(s) => format!(
                            " (HYBRID_SHARD: shard groups of {s}, each run replicated over {} groups)",
                            d / s
                        ),
                        None => String::new(),
                    }
                ),
            }
        )
    } else if zero == 3 {
        format!(
            "ZeRO 3 (FSDP {}: every parameter sharded, each unit gathered while it runs{}; backward prefetch {}, forward prefetch {})",
            match (
                args.hsdp.filter(|&s| s < reports.len()),
                args.fsdp_reshard_after_forward
            ) {
                (Some(s), _) => format!(
                    "HYBRID_SHARD, shard groups of {s} ranks, each run replicated over {} groups",
                    reports.len() / s
                ),
                (None, crate::cli::OnOff::On) => "FULL_SHARD".to_string(),
                (None, crate::cli::OnOff::Off) => "SHARD_GRAD_OP".to_string(),
            },
            if args.fsdp_reshard_after_forward == crate::cli::OnOff::On {
                ""
            } else {
                " and kept whole from its forward to its backward"
            },
            prefetch_name(args.fsdp_prefetch),
            on_off(args.fsdp_forward_prefetch)
        )
    } else if args.offload == crate::cli::Offload::Optimizer {
        format!(
            "ZeRO {zero} with ZeRO-Offload (each rank's optimizer partition in host memory, stepped there)"
        )
    } else {
        format!("ZeRO {zero}")
    };
    println!(
        "{} ranks, {} ({}), {} B{} S{} per rank, {}, {} thread(s) a rank",
        reports.len(),
        split,
        library(),
        case.preset,
        case.batch,
        case.seq,
        case.optimizer.as_str(),
        args.threads
    );
    print_windows(
        "rank",
        ranks::windows_of_stage(zero),
        reports.iter().map(|r| (r.rank, &r.windows[..])),
    );
    if args.tp > 1 {
        println!(
            "model states entering the optimizer, measured (formula::parallel::stage_ranks at tp {}: Megatron's rank, its table and head vocab-parallel):",
            args.tp
        );
    } else {
        println!("model states entering the optimizer, measured (formula::zero's data bytes):");
    }
    for r in reports {
        let s = r.states;
        println!(
            "  rank {}: weights {} ({}), gradients {} ({}), optimizer state {} ({}); RSS peak {}",
            r.rank,
            s.weights_bytes,
            s.predicted_weights_bytes,
            s.gradient_bytes,
            s.predicted_gradient_bytes,
            s.optimizer_state_bytes,
            s.predicted_optimizer_state_bytes,
            r.rss_peak_bytes
                .map_or("—".into(), |b| human_bytes(b as f64))
        );
        if let Some(h) = s.host {
            println!(
                "  rank {}: host (offloaded partition) {} ({}: master {}, gradient buffer {}, optimizer state {})",
                r.rank,
                h.bytes,
                h.predicted_master_bytes
                    + h.predicted_gradient_bytes
                    + h.predicted_optimizer_state_bytes,
                h.predicted_master_bytes,
                h.predicted_gradient_bytes,
                h.predicted_optimizer_state_bytes
            );
        }
        if let Some(c) = r.check {
            println!(
                "  rank {}: against one process on the global batch: gradients within {:.2e}, weights after two steps within {:.2e}",
                r.rank, c.gradient_rel_diff, c.weight_rel_diff
            );
        }
    }
    print_host_windows(ranks::windows_of_stage(zero), reports);
}

/// With `--offload optimizer`: each rank's host-arena layer of the windows that have one,
/// measured beside predicted.
fn print_host_windows(names: &[&str], reports: &[RankReport]) {
    if reports
        .iter()
        .all(|r| r.windows.iter().all(|w| w.host.is_none()))
    {
        return;
    }
    println!("layer: the host arena (the offloaded partition), each window relative to its start");
    println!(
        "rank {:<10} {:>12} {:>12} {:>8} {:>13} {:>13}",
        "window", "peak", "predicted", "diff", "retained", "predicted"
    );
    for r in reports {
        for (name, w) in names.iter().zip(&r.windows) {
            let Some(h) = w.host else { continue };
            println!(
                "{:>4} {name:<10} {:>12} {:>12} {:>8} {:>13} {:>13}",
                r.rank,
                h.peak_bytes,
                h.predicted_peak_bytes,
                h.peak_bytes as i64 - h.predicted_peak_bytes as i64,
                h.retained_bytes,
                h.predicted_retained_bytes
            );
        }
    }
}
