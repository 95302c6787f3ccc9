//! Each computed verdict on hand-made rows on both sides of its criterion: one set of rows
//! where the claim holds and one where it does not, so a verdict that ignores its rows fails.

use super::*;

const MIB: u64 = 1 << 20;

fn eval(rows: &[Row], id: &str) -> Claim {
    evaluate_rows(rows, &BTreeMap::new())
        .into_iter()
        .find(|c| c.id == id)
        .expect("every id is evaluated")
}

fn row(phase: &str) -> Row {
    let mut r = Row::example();
    r.phase = crate::step::Phase::parse(phase).expect("a phase");
    r
}

/// `phase` rows of a batch sweep whose `retained_bytes` (and peak) are `f(B)`.
fn batch_sweep(phase: &str, batches: &[u64], f: impl Fn(u64) -> u64) -> Vec<Row> {
    batches
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            let mut r = row(phase);
            r.case = i as u64;
            r.batch = b;
            r.retained_bytes = Some(f(b) as i64);
            r.peak_bytes = Some(f(b));
            r
        })
        .collect()
}

/// I1: 4.004 B/param (f32) holds; a LLaMA row holds once its rotary tables (S_max·D·e =
/// 8·8·4 = 256 B) are counted apart, an older LLaMA row without `head_dim` is left out, and
/// 4.4 B/param does not hold. Llama-2-7B f16 is quoted by the formula (13.48 GB).
#[test]
fn i1_weights_with_rotary_tables_apart() {
    let init = |model: &str, retained: i64, head_dim: u64| {
        let mut r = row("init");
        r.model = model.into();
        r.case = retained as u64;
        r.head_dim = head_dim;
        r.retained_bytes = Some(retained);
        r
    };
    let c = eval(&[init("gpt", 4004, 8), init("llama", 4256, 8)], "I1");
    // The 14 GB half is the formula at full size: derived, not "holds".
    assert!(
        c.verdict
            .starts_with("derived: holds — every init within 0.10 % of e B/param (measured)"),
        "{c:?}"
    );
    assert!(c.predicted.contains("13.48 GB"), "{c:?}");
    let c = eval(&[init("llama", 4256, 0)], "I1");
    assert!(c.verdict.starts_with("open"), "{c:?}");
    let c = eval(&[init("gpt", 4400, 8)], "I1");
    assert!(
        c.verdict.starts_with("does not hold: off by up to 10.0 %"),
        "{c:?}"
    );
    // A measured Llama-2-7B f16 slice: 1000 parameters of 2 B and the rotary tables
    // S_max·D·e = 8·8·2 = 128 B (counted apart): 2128 B. The formula predicting the same checks
    // the slice; a formula 1 MiB off leaves it unchecked (partly).
    let slice = |predicted: i64| {
        let mut r = init("llama", 2128, 8);
        r.preset = "llama-2-7b".into();
        r.dtype = "f16".into();
        r.predicted_retained_bytes = Some(predicted);
        r
    };
    let c = eval(&[slice(2128)], "I1");
    assert!(c.verdict.contains("measured slice within 0 B"), "{c:?}");
    let c = eval(&[slice(2128 + (1 << 20))], "I1");
    assert!(c.verdict.starts_with("partly"), "{c:?}");
}

/// N4: L 3, B 2, T 4, f32. Without GQA (G·D = H = 16) a growth of 2·3·2·4·16·4 = 3,072 B
/// holds exactly; with one K/V head of width 8 the growth is 1,536 B and the seed's H form
/// overstates it ×2 (partly); 1,600 B is not exact.
#[test]
fn n4_cache_with_and_without_gqa() {
    let decode = |kv: u64, d: u64, retained: i64| {
        let mut r = row("decode");
        r.case = retained as u64;
        r.kv_cache = "on".into();
        r.weights = "model".into();
        r.decode_tokens = 4;
        (r.kv_heads, r.head_dim) = (kv, d);
        r.retained_bytes = Some(retained);
        r
    };
    let c = eval(&[decode(2, 8, 3072)], "N4");
    assert!(c.verdict.starts_with("holds exactly without GQA"), "{c:?}");
    let c = eval(&[decode(2, 8, 3072), decode(1, 8, 1536)], "N4");
    assert!(
        c.verdict.starts_with("partly") && c.verdict.contains("×2.0"),
        "{c:?}"
    );
    let c = eval(&[decode(1, 8, 1600)], "N4");
    assert!(c.verdict.starts_with("does not hold exactly"), "{c:?}");
}

/// B6: a full fine-tune's state of 16,000 B against LoRA's 4,400 (≤ ½: sharp) holds, with
/// Llama-2-70B predicted to fit 48 GiB at rank 8 on q, v only; LoRA's 12,000 is only partly.
#[test]
fn b6_lora_state_and_the_70b_card() {
    let case = |case: u64, rank: u64, [i, b, o]: [i64; 3]| {
        ["init", "backward", "optimizer"]
            .iter()
            .zip([i, b, o])
            .map(|(p, v)| {
                let mut r = row(p);
                r.case = case;
                r.lora_rank = rank;
                r.lora_targets = if rank > 0 {
                    "q,v".into()
                } else {
                    String::new()
                };
                r.lora_base = if rank > 0 { "op".into() } else { String::new() };
                r.retained_bytes = Some(v);
                r
            })
            .collect::<Vec<_>>()
    };
    let mut rows = case(0, 0, [4000, 4000, 8000]);
    rows.extend(case(1, 8, [4100, 100, 200]));
    let c = eval(&rows, "B6");
    assert!(
        c.verdict
            .starts_with("derived: holds — the model state drops 3.6×"),
        "{c:?}"
    );
    assert!(c.verdict.contains("fits 48 GiB with r8 q, v only"), "{c:?}");
    assert!(c.predicted.contains("r64 all"), "{c:?}");
    let mut rows = case(0, 0, [4000, 4000, 8000]);
    rows.extend(case(1, 8, [4000, 3000, 5000]));
    let c = eval(&rows, "B6");
    assert!(
        c.verdict.starts_with("partly: LoRA's model state is 75 %"),
        "{c:?}"
    );
}

/// F1: a graph of 1000·B bytes is proportional (fixed part 0); 500,000 + 1000·B has a fixed
/// part of 98 % at B 8; a graph ∝ B² is not affine (R² < 0.999); two sizes decide nothing
/// (rows of efficient attention, which keeps no scores). Standard attention's scores are taken
/// out first: 1000·S + A·B·S²·L·4 (A 2, B 2, L 3, fused kernels) over S 8/16/32 holds, the
/// scores' share of the largest graph said; with composed ops six such tensors are.
#[test]
fn f1_affine_in_each_axis() {
    let efficient = |rows: Vec<Row>| -> Vec<Row> {
        rows.into_iter()
            .map(|mut r| {
                r.attention = "efficient".into();
                r
            })
            .collect()
    };
    let seq_sweep = |kernels: &str, copies: u64| -> Vec<Row> {
        [8u64, 16, 32]
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let mut r = row("forward");
                (r.case, r.seq, r.max_seq) = (i as u64, s, 32);
                (r.attention, r.kernels) = ("standard".into(), kernels.into());
                let g = 1000 * s + copies * 2 * 2 * s * s * 3 * 4;
                (r.retained_bytes, r.peak_bytes) = (Some(g as i64), Some(g));
                r
            })
            .collect()
    };
    for (kernels, copies) in [("fused", 1), ("composed", 6)] {
        let c = eval(&seq_sweep(kernels, copies), "F1");
        assert!(
            c.verdict
                .contains("proportional in S (standard attention) (1 sweep(s))")
                && c.verdict.starts_with("holds"),
            "{kernels}: {c:?}"
        );
        let share = 100.0 * (copies * 2 * 2 * 32 * 32 * 3 * 4) as f64
            / (1000 * 32 + copies * 2 * 2 * 32 * 32 * 3 * 4) as f64;
        assert!(
            c.measured
                .contains(&format!("({share:.1} % of the largest graph)")),
            "{c:?}"
        );
    }
    let batch_sweep =
        |phase: &str, batches: &[u64], f: fn(u64) -> u64| efficient(batch_sweep(phase, batches, f));
    let c = eval(&batch_sweep("forward", &[1, 2, 4, 8], |b| 1000 * b), "F1");
    assert!(c.verdict.starts_with("holds"), "{c:?}");
    assert!(
        c.verdict.contains("proportional in B (1 sweep(s))"),
        "{c:?}"
    );
    assert!(c.criterion.contains("R² ≥ 0.999"));
    let c = eval(
        &batch_sweep("forward", &[1, 2, 4, 8], |b| 500_000 + 1000 * b),
        "F1",
    );
    assert!(c.verdict.starts_with("does not hold"), "{c:?}");
    assert!(c.verdict.contains("fixed +98.4 %"), "{c:?}");
    let c = eval(
        &batch_sweep("forward", &[1, 2, 4, 8], |b| 1000 * b * b),
        "F1",
    );
    assert!(c.verdict.starts_with("does not hold"), "{c:?}");
    let c = eval(&batch_sweep("forward", &[1, 2], |b| 1000 * b), "F1");
    assert!(c.verdict.starts_with("open"), "{c:?}");
}

/// F4: a step of 1 MiB + 10 MiB per sequence: the per-sequence part is 80/81 of the B 8 peak
/// (holds); 100 MiB + 1 KiB per sequence: fixed part dominates (does not hold). A missing peak
/// is left out, not read as 0: B 1/2/4/8 with B 2 missing still fits exactly.
#[test]
fn f4_per_sequence_share() {
    let mut rows = batch_sweep("train-step", &[1, 2, 4, 8], |b| MIB + 10 * MIB * b);
    let c = eval(&rows, "F4");
    assert!(
        c.verdict
            .starts_with("holds: the per-sequence part is 99 %"),
        "{c:?}"
    );
    rows[1].peak_bytes = None;
    let c = eval(&rows, "F4");
    assert!(c.verdict.starts_with("holds"), "{c:?}");
    assert!(c.measured.contains("B 1/4/8"), "{c:?}");
    assert!(c.predicted.contains("R² 1.00000"), "{c:?}");
    let c = eval(
        &batch_sweep("train-step", &[1, 2, 4, 8], |b| 100 * MIB + 1024 * b),
        "F4",
    );
    assert!(
        c.verdict.starts_with("does not hold here: the fixed part"),
        "{c:?}"
    );
}

/// N1: an inference case keeping its logits (4·B·S·V = 640 B) holds; one keeping 1 MiB more
/// (a gradient left behind) does not.
#[test]
fn n1_only_the_logits_stay() {
    let mut r = row("inference");
    r.weights = "model".into();
    r.retained_bytes = Some(4 * 2 * 8 * 10);
    r.peak_bytes = Some(10_000);
    let c = eval(std::slice::from_ref(&r), "N1");
    assert!(c.verdict.starts_with("holds"), "{c:?}");
    r.retained_bytes = Some(640 + MIB as i64);
    let c = eval(&[r], "N1");
    assert!(c.verdict.starts_with("does not hold"), "{c:?}");
    assert!(c.verdict.contains("1.00 MiB beyond its logits"), "{c:?}");
}

/// N3: a read holding file + tensors (2×) and a map holding the tensors (1×) holds the
/// loading half; a read at 1.2× does not. Decoding at 2 threads with 1.8 cores busy holds the
/// CPU half; with 1.0 core busy it does not.
#[test]
fn n3_loading_and_decoding_cpu() {
    let load = |how: &str, peak: u64| {
        let mut r = row("load");
        r.load = how.into();
        r.preset = "gpt2-small".into();
        r.retained_bytes = Some(1000);
        r.peak_bytes = Some(peak);
        r
    };
    let decode = |threads: u64, cpu: f64| {
        let mut r = row("decode");
        r.run_id = format!("t{threads}");
        r.threads = threads;
        r.kv_cache = "on".into();
        r.decode_tokens = 16;
        r.wall_s = Some(1.0);
        r.cpu_user_s = Some(cpu);
        r.cpu_sys_s = Some(0.0);
        r
    };
    let c = eval(&[load("read", 2000), load("mmap", 1000)], "N3");
    assert!(
        c.verdict
            .starts_with("partly: a whole-file read holds the file"),
        "{c:?}"
    );
    assert!(c.verdict.contains("decoding CPU not measured"), "{c:?}");
    let c = eval(&[load("read", 1200), load("mmap", 1000)], "N3");
    assert!(
        c.verdict.starts_with("partly: loading: read 1.20×"),
        "{c:?}"
    );
    // A read without a memory-mapped twin (another preset) comes first: the pair still decides.
    let mut lone = load("read", 5000);
    lone.preset = "llama-tiny".into();
    let c = eval(&[lone, load("read", 2000), load("mmap", 1000)], "N3");
    assert!(
        c.verdict
            .starts_with("partly: a whole-file read holds the file"),
        "{c:?}"
    );
    let rows = [
        load("read", 2000),
        load("mmap", 1000),
        decode(1, 0.98),
        decode(2, 1.8),
    ];
    let c = eval(&rows, "N3");
    assert!(c.verdict.starts_with("holds"), "{c:?}");
    assert!(
        c.measured
            .contains("2: CPU 1.80 s, 1.80 cores busy, 32.0 tokens/s"),
        "{c:?}"
    );
    let rows = [
        load("read", 1200),
        load("mmap", 1000),
        decode(1, 0.98),
        decode(2, 1.0),
    ];
    let c = eval(&rows, "N3");
    assert!(c.verdict.starts_with("does not hold"), "{c:?}");
    assert!(
        c.verdict
            .contains("at 2 threads keeps only 1.00 cores busy"),
        "{c:?}"
    );
}

fn dataload(kind: &str, storage: &str, workers: u64, pss_mib: u64) -> Row {
    let mut r = row("dataload");
    r.case = workers + 10 * storage.len() as u64 + 100 * kind.len() as u64;
    r.model = String::new();
    r.batch = 16;
    r.worker_kind = kind.into();
    r.storage = storage.into();
    r.workers = Some(workers);
    r.prefetch = Some(if workers == 0 { 0 } else { 2 });
    r.epochs = Some(1);
    r.images = Some(256);
    r.crop_px = Some(224);
    r.persistent = "on".into();
    r.pss_peak_bytes = Some(pss_mib * MIB);
    r.peak_bytes = Some(pss_mib * MIB);
    r
}

/// Each row `n` times, as `n` runs of one workload (run ids `<id>0`, `<id>1`, …).
fn runs(rows: &[Row], n: usize) -> Vec<Row> {
    (0..n)
        .flat_map(|i| {
            rows.iter().map(move |r| {
                let mut r = r.clone();
                r.run_id = format!("{}{i}", r.run_id);
                r
            })
        })
        .collect()
}

/// D2, on three runs: a 50 MiB dataset; worker processes add 70 MiB each with `ram` (the dataset + 20 MiB),
/// 20 MiB streaming; threads 15 MiB either way: holds, copies, threads share. When a process
/// adds 20 MiB with `ram` too it does not copy (partly); with no growth at all it does not hold;
/// threads that each add the dataset leave it partly. One run decides nothing (open); a noisy
/// sample per configuration leaves the medians, and the verdict, as they were.
#[test]
fn d2_workers_copy_the_dataset() {
    let set = |proc_ram: u64, per_thread: u64| {
        let mut v = vec![
            dataload("main", "ram", 0, 60),
            dataload("main", "stream", 0, 10),
        ];
        for w in 1..=4 {
            v.push(dataload("process", "ram", w, 10 + proc_ram * w));
            v.push(dataload(
                "process",
                "stream",
                w,
                10 + per_thread.max(1) * w * 20 / 15,
            ));
        }
        for w in 1..=3 {
            v.push(dataload("thread", "ram", w, 60 + per_thread * w));
            v.push(dataload("thread", "stream", w, 10 + per_thread * w));
        }
        v
    };
    let c = eval(&set(70, 15), "D2");
    assert!(
        c.verdict.starts_with("open: RAM rises with workers")
            && c.verdict
                .contains("(undecided: a configuration has 1 sample(s), 3 needed"),
        "{c:?}"
    );
    let set = |proc_ram: u64, per_thread: u64| runs(&set(proc_ram, per_thread), 3);
    let c = eval(&set(70, 15), "D2");
    assert!(
        c.verdict.starts_with("holds: RAM rises with workers"),
        "{c:?}"
    );
    assert!(c.measured.contains("× ≥ 3 samples"), "{c:?}");
    // One wild sample (PSS doubled) in every configuration of the first run.
    let mut noisy = set(70, 15);
    for r in noisy.iter_mut().filter(|r| r.run_id.ends_with('0')) {
        r.pss_peak_bytes = r.pss_peak_bytes.map(|b| 2 * b);
    }
    assert_eq!(eval(&noisy, "D2").verdict, c.verdict);
    assert!(
        c.verdict
            .contains("a worker process copies the in-heap dataset"),
        "{c:?}"
    );
    assert!(c.verdict.contains("threads share it"), "{c:?}");
    let c = eval(&set(20, 15), "D2");
    assert!(c.verdict.starts_with("partly"), "{c:?}");
    assert!(c.verdict.contains("does not copy"), "{c:?}");
    let c = eval(&set(0, 0), "D2");
    assert!(c.verdict.starts_with("does not hold"), "{c:?}");
    // Threads that each add the dataset too (ram slope 65 MiB vs 15 streaming): partly.
    let mut v = set(70, 15);
    for r in v
        .iter_mut()
        .filter(|r| r.worker_kind == "thread" && r.storage == "ram")
    {
        let w = r.workers.unwrap();
        r.pss_peak_bytes = Some((60 + 65 * w) * MIB);
        r.peak_bytes = r.pss_peak_bytes;
    }
    let c = eval(&v, "D2");
    assert!(c.verdict.starts_with("partly"), "{c:?}");
    assert!(c.verdict.contains("threads do not share"), "{c:?}");
}

/// D3: one batch is 16·3·224²·4 = 9,633,792 B; a peak of three batches leaves two of
/// temporaries (holds); a quarter batch of temporaries is no high peak (partly); a peak of one
/// batch has none (does not hold).
#[test]
fn d3_temporaries_against_a_batch() {
    let batch = 9_633_792u64;
    let at = |peak: u64| {
        let mut r = dataload("main", "stream", 0, 10);
        r.peak_bytes = Some(peak);
        eval(&[r], "D3")
    };
    let c = at(3 * batch);
    assert!(
        c.verdict.starts_with("holds: the temporaries are 200 %"),
        "{c:?}"
    );
    let c = at(batch + batch / 4);
    assert!(c.verdict.starts_with("partly"), "{c:?}");
    assert!(c.verdict.contains("25 % of a batch"), "{c:?}");
    assert!(!c.verdict.contains("256–512"), "{c:?}");
    let c = at(batch);
    assert!(c.verdict.starts_with("does not hold"), "{c:?}");
}

/// F5: K 0 and K 1 train steps, three timed samples each (three runs). Every K 1 sample slower:
/// holds with its time cost; overlapping samples: partly (no cost shown); one sample: partly,
/// too few; a checkpointed peak above half of K 0's: does not hold.
#[test]
fn f5_memory_and_time_samples() {
    let step = |run: &str, k: u64, peak: u64, wall: f64| {
        let mut r = row("train-step");
        r.run_id = run.into();
        r.case = k;
        r.checkpoint = k;
        r.peak_bytes = Some(peak);
        r.wall_s = Some(wall);
        r
    };
    let set = |walls0: [f64; 3], walls1: [f64; 3], peak1: u64| {
        let mut v = Vec::new();
        for (i, run) in ["a", "b", "c"].iter().enumerate() {
            v.push(step(run, 0, 1000, walls0[i]));
            v.push(step(run, 1, peak1, walls1[i]));
        }
        v
    };
    let c = eval(&set([1.0, 1.1, 0.9], [1.3, 1.4, 1.2], 300), "F5");
    assert!(
        c.verdict
            .starts_with("holds: 3.3× less memory at K = 1; time +30 %"),
        "{c:?}"
    );
    assert!(
        c.measured.contains("K 0: 1.000 s (0.900–1.100, n 3)"),
        "{c:?}"
    );
    let c = eval(&set([1.0, 1.2, 0.9], [1.0, 1.1, 0.95], 300), "F5");
    assert!(
        c.verdict.starts_with("partly") && c.verdict.contains("no cost shown"),
        "{c:?}"
    );
    let c = eval(&set([1.0, 1.1, 0.9], [1.3, 1.4, 1.2], 300)[..2], "F5");
    assert!(
        c.verdict.starts_with("partly") && c.verdict.contains("too few"),
        "{c:?}"
    );
    let c = eval(&set([1.0, 1.1, 0.9], [1.3, 1.4, 1.2], 600), "F5");
    assert!(c.verdict.starts_with("does not hold"), "{c:?}");
}

/// I2: f16 weights at 2.004 vs f32 at 4.004 B/param halve (partly: the trim is not measured);
/// at 3 B/param they do not.
#[test]
fn i2_half_precision() {
    let init = |dtype: &str, bytes: i64| {
        let mut r = row("init");
        r.case = dtype.len() as u64;
        r.dtype = dtype.into();
        r.retained_bytes = Some(bytes);
        r
    };
    let c = eval(&[init("f32", 4004), init("f16", 2004)], "I2");
    assert!(
        c.verdict.starts_with("partly: half precision halves it"),
        "{c:?}"
    );
    let c = eval(&[init("f32", 4004), init("f16", 3000)], "I2");
    assert!(c.verdict.starts_with("does not hold"), "{c:?}");
}

/// A window's row with the trim figures: `peak`/`retained` by the counting allocator (CPU) or
/// the pool's used bytes (CUDA), `before`/`after` what the layer held around the trim.
fn trimmed(
    layer: &str,
    case: u64,
    peak: u64,
    retained: u64,
    [before, after, live]: [u64; 3],
) -> Row {
    let mut r = row("train-step");
    r.case = case;
    r.preset = "gpt2-small".into();
    r.peak_bytes = Some(peak);
    r.retained_bytes = Some(retained as i64);
    r.trim_layer = layer.into();
    r.trim_before_bytes = Some(before);
    r.trim_after_bytes = Some(after);
    r.trim_live_bytes = Some(live);
    r
}

fn halves(f16_bytes: i64) -> Vec<Row> {
    ["f32", "f16"]
        .iter()
        .map(|d| {
            let mut r = row("init");
            r.case = 100 + d.len() as u64;
            r.dtype = (*d).into();
            r.retained_bytes = Some(if *d == "f32" { 4004 } else { f16_bytes });
            r
        })
        .collect()
}

/// I2 on the CPU: RSS 500 MiB with 300 MiB live heap holds 200 MiB beyond it; a trim to
/// 320 MiB gives back 180 MiB, 90 %: with f16 halving, the claim holds. RSS 500 → 490 MiB
/// (5 %) does not; alone (no f16 rows) that is "does not hold", beside f16 halving "partly".
/// A window leaving 10 MiB beyond the live heap decides nothing; a missing figure leaves the
/// row out instead of reading as 0.
#[test]
fn i2_malloc_trim() {
    let rss = |after: u64| {
        trimmed(
            "rss",
            1,
            1000 * MIB,
            10 * MIB,
            [500 * MIB, after * MIB, 300 * MIB],
        )
    };
    let mut rows = halves(2004);
    rows.push(rss(320));
    let c = eval(&rows, "I2");
    assert!(
        c.verdict.starts_with("holds: half precision halves it"),
        "{c:?}"
    );
    assert!(
        c.verdict.contains(
            "CPU: malloc_trim(0) returned 90 % of the RSS held beyond the live heap, RSS −180.00 MiB after train-step on gpt2-small"
        ),
        "{c:?}"
    );
    assert!(
        c.measured
            .contains("RSS 500.00 MiB → 320.00 MiB (−180.00 MiB), live 300.00 MiB"),
        "{c:?}"
    );
    // The window freed 990 MiB; 200 MiB of it were still held when it closed.
    assert!(
        c.measured
            .contains("the window freed 990.00 MiB: 790.00 MiB of it had left RSS"),
        "{c:?}"
    );
    assert!(c.criterion.contains("≥ 50 %"), "{c:?}");

    let c = eval(&[rss(490)], "I2");
    assert!(c.verdict.starts_with("does not hold"), "{c:?}");
    assert!(c.verdict.contains("returned 5 %"), "{c:?}");
    assert!(c.verdict.contains("half precision not measured"), "{c:?}");
    let mut rows = halves(2004);
    rows.push(rss(490));
    assert!(eval(&rows, "I2").verdict.starts_with("partly"));

    // Too little held beyond the live heap to tell: undecided, naming what would decide it.
    let small = trimmed("rss", 2, 50 * MIB, MIB, [310 * MIB, 309 * MIB, 300 * MIB]);
    let c = eval(std::slice::from_ref(&small), "I2");
    assert!(c.verdict.starts_with("open"), "{c:?}");
    assert!(c.verdict.contains("no window left ≥ 16.00 MiB"), "{c:?}");
    assert!(c.verdict.contains("gpt2-small"), "{c:?}");
    let mut rows = halves(2004);
    rows.push(small.clone());
    assert!(eval(&rows, "I2").verdict.starts_with("partly"));

    // The big window without its after-trim figure is left out: only the small one remains.
    let mut gone = rss(320);
    gone.trim_after_bytes = None;
    let c = eval(&[gone, small], "I2");
    assert!(c.verdict.contains("no window left"), "{c:?}");

    // Nothing but rows without the trim columns: the trim half is named as missing.
    let c = eval(&halves(2004), "I2");
    assert!(
        c.verdict.contains("freeing cached memory not measured"),
        "{c:?}"
    );
}

/// I2 on CUDA: the pool reserved 1000 MiB with 600 MiB used (400 MiB unused); a trim to
/// 620 MiB gives back 380 MiB, 95 % (holds), to 990 MiB only 10 MiB (does not hold). A pool
/// that held nothing unused has nothing to give back: undecided.
#[test]
fn i2_pool_trim() {
    let pool = |after: u64, live: u64| {
        let mut r = trimmed(
            "cuda-pool-reserved",
            3,
            700 * MIB,
            0,
            [1000 * MIB, after * MIB, live * MIB],
        );
        r.device = "cuda:0".into();
        r
    };
    let mut rows = halves(2004);
    rows.push(pool(620, 600));
    let c = eval(&rows, "I2");
    assert!(c.verdict.starts_with("holds"), "{c:?}");
    assert!(
        c.verdict
            .contains("cuMemPoolTrimTo returned 95 % of the pool's unused reservation"),
        "{c:?}"
    );
    assert!(!c.verdict.contains("CUDA pool not measured"), "{c:?}");
    let c = eval(&[pool(990, 600)], "I2");
    assert!(c.verdict.starts_with("does not hold"), "{c:?}");
    let c = eval(&[pool(1000, 1000)], "I2");
    assert!(c.verdict.starts_with("open"), "{c:?}");
    assert!(c.verdict.contains("nothing cached"), "{c:?}");
}

/// Every verdict of every claim on the empty set starts with a kind word.
#[test]
fn every_verdict_has_a_kind() {
    for c in evaluate_rows(&[], &BTreeMap::new()) {
        assert_ne!(c.kind(), "other", "{c:?}");
    }
}

/// One case's rows: `phase` → retained bytes, all in case `case` of run "r".
fn case_rows(case: u64, edit: impl Fn(&mut Row), phases: &[(&str, i64)]) -> Vec<Row> {
    phases
        .iter()
        .map(|&(phase, retained)| {
            let mut r = row(phase);
            r.case = case;
            edit(&mut r);
            r.retained_bytes = Some(retained);
            r.peak_bytes = Some(retained.max(0) as u64 + 100);
            r
        })
        .collect()
}

/// B1: gradients of 4004 B for 1000 f32 parameters hold (0.1 %); 4100 B (2.5 %) do not.
#[test]
fn b1_gradients_the_size_of_the_weights() {
    let c = eval(&case_rows(0, |_| {}, &[("backward", 4004)]), "B1");
    assert!(c.verdict.starts_with("holds (within 0.10 %"), "{c:?}");
    let c = eval(&case_rows(0, |_| {}, &[("backward", 4100)]), "B1");
    assert!(
        c.verdict.starts_with("does not hold: off by up to 2.5 %"),
        "{c:?}"
    );
}

/// B2: AdamW 8 B/param and SGD 0 hold; AdamW at 9 B/param does not.
#[test]
fn b2_optimizer_state() {
    let set = |adamw: i64| {
        let mut v = case_rows(0, |_| {}, &[("optimizer", adamw)]);
        v.extend(case_rows(
            1,
            |r| r.optimizer = "sgd".into(),
            &[("optimizer", 0)],
        ));
        v
    };
    assert!(eval(&set(8000), "B2").verdict.starts_with("holds"));
    let c = eval(&set(9000), "B2");
    assert!(
        c.verdict
            .starts_with("does not hold on these rows: adamw 9.000"),
        "{c:?}"
    );
}

/// AdamW model-state rows (init, backward, optimizer) of one f16 case per B/param given.
fn state_case(case: u64, precision: &str, bytes_per_param: [i64; 3]) -> Vec<Row> {
    let [w, g, o] = bytes_per_param.map(|b| b * 1000);
    case_rows(
        case,
        |r| {
            r.dtype = "f16".into();
            r.precision = precision.into();
        },
        &[("init", w), ("backward", g), ("optimizer", o)],
    )
}

/// Forward rows of f16, pure and mixed, at B 1 and 4 (1000 parameters): 5000 B per sequence,
/// 100 B whatever the batch, and in mixed precision a working copy of `copy` B/param more.
fn forwards(copy: f64) -> Vec<Row> {
    let mut v = Vec::new();
    for (i, precision) in ["pure", "mixed"].into_iter().enumerate() {
        for b in [1u64, 4] {
            let fixed = 100.0
                + if precision == "mixed" {
                    copy * 1000.0
                } else {
                    0.0
                };
            let mut r = row("forward");
            r.case = 100 + 10 * i as u64 + b;
            r.dtype = "f16".into();
            r.precision = precision.into();
            r.batch = b;
            r.retained_bytes = Some((fixed + 5000.0 * b as f64) as i64);
            r.peak_bytes = Some(r.retained_bytes.unwrap() as u64);
            v.push(r);
        }
    }
    v
}

/// B3 ("6×" = 12 B/param): pure 16-bit at 2 + 2 + 8 = 12 and mixed 4 + 4 + 8 + the measured
/// 2 B/param copy = 18 hold both halves; pure at 8 with mixed at 18 is partly (the
/// literature's half only); mixed at 20 + 2 with pure at 8 does not hold; a copy measured at
/// 4 B/param moves mixed 16 out of the literature's 16–18. Without the forward sweeps the copy
/// is not measured: open.
#[test]
fn b3_six_times_against_pure_and_mixed() {
    let set = |pure: [i64; 3], mixed: [i64; 3], copy: f64| {
        let mut v = state_case(0, "pure", pure);
        v.extend(state_case(1, "mixed", mixed));
        v.extend(forwards(copy));
        v
    };
    let c = eval(&set([2, 2, 8], [4, 4, 8], 2.0), "B3");
    assert!(c.verdict.starts_with("holds: pure 16-bit 12.0"), "{c:?}");
    assert!(
        c.measured
            .contains("working copy in the forward window: 2.00 B/param"),
        "{c:?}"
    );
    let c = eval(&set([2, 2, 4], [4, 4, 8], 2.0), "B3");
    assert!(c.verdict.starts_with("partly: pure 16-bit 8.0"), "{c:?}");
    assert!(
        c.verdict
            .contains("+ the 2.00 B/param working copy measured in the forward = 18.0 B/param (the literature's 16–18)"),
        "{c:?}"
    );
    let c = eval(&set([2, 2, 4], [4, 4, 12], 2.0), "B3");
    assert!(c.verdict.starts_with("does not hold"), "{c:?}");
    assert!(
        c.verdict
            .contains("= 22.0 B/param (outside the literature's 16–18)"),
        "{c:?}"
    );
    let c = eval(&set([2, 2, 4], [4, 4, 8], 4.0), "B3");
    assert!(c.verdict.starts_with("does not hold"), "{c:?}");
    let mut no_copy = state_case(0, "pure", [2, 2, 4]);
    no_copy.extend(state_case(1, "mixed", [4, 4, 8]));
    let c = eval(&no_copy, "B3");
    assert!(
        c.verdict
            .starts_with("open: the working copy is not measured"),
        "{c:?}"
    );
    let c = eval(&state_case(0, "pure", [2, 2, 4]), "B3");
    assert!(c.verdict.starts_with("open"), "{c:?}");
}

/// B4: mixed 16 B/param + the measured 2 B copy = 18 GB per 1 B parameters holds; 20 + 2 does
/// not, nor 16 + a 6 B copy; without the copy measured it is open.
#[test]
fn b4_one_billion_parameters_mixed() {
    let set = |mixed: [i64; 3], copy: f64| {
        let mut v = state_case(0, "mixed", mixed);
        v.extend(forwards(copy));
        v
    };
    let c = eval(&set([4, 4, 8], 2.0), "B4");
    assert!(
        c.verdict.starts_with(
            "holds for mixed precision: 16.0 GB of state + the 2.00 GB working copy = 18.0 GB"
        ),
        "{c:?}"
    );
    let c = eval(&set([4, 4, 12], 2.0), "B4");
    assert!(
        c.verdict
            .starts_with("does not hold for mixed precision: 20.0 GB"),
        "{c:?}"
    );
    let c = eval(&set([4, 4, 8], 6.0), "B4");
    assert!(c.verdict.starts_with("does not hold"), "{c:?}");
    let c = eval(&state_case(0, "mixed", [4, 4, 8]), "B4");
    assert!(c.verdict.starts_with("open"), "{c:?}");
}

/// B7 (1000 parameters): 8-bit AdamW at 2 B/param beside AdamW's measured 8 holds (≤ ½ of
/// its moments at 2 B, 4 B/param, + 5 %); at 3 it does not; beside a measured AdamW state of
/// 12 (16-bit equivalent 6) the same 3 holds — the verdict follows the measured state; a
/// measured f16 AdamW state of 5 B/param is used when present.
#[test]
fn b7_eight_bit_state() {
    let set = |adamw: i64, eight: i64| {
        let mut v = case_rows(0, |_| {}, &[("optimizer", adamw)]);
        v.extend(case_rows(
            1,
            |r| r.optimizer = "adamw-8bit".into(),
            &[("optimizer", eight)],
        ));
        v
    };
    let c = eval(&set(8000, 2000), "B7");
    assert!(
        c.verdict.starts_with("holds against 16-bit states"),
        "{c:?}"
    );
    assert!(c.verdict.contains("the cut is 4.0×"), "{c:?}");
    let c = eval(&set(8000, 3000), "B7");
    assert!(
        c.verdict.starts_with("does not hold: 8-bit state 3.000"),
        "{c:?}"
    );
    let c = eval(&set(12000, 3000), "B7");
    assert!(c.verdict.starts_with("holds"), "{c:?}");
    let mut with_half = set(8000, 2600);
    with_half.extend(case_rows(
        2,
        |r| r.dtype = "f16".into(),
        &[("optimizer", 5000)],
    ));
    let c = eval(&with_half, "B7");
    assert!(
        c.measured.contains("measured f16 AdamW state 5.000"),
        "{c:?}"
    );
    assert!(c.verdict.starts_with("holds"), "{c:?}");
}

/// N2: weights 1000 B and an inference peak of 1000 B (2×) holds; 3000 B (4×) does not; one
/// of each is partly.
#[test]
fn n2_twice_the_weights() {
    let case = |case: u64, peak: u64| {
        let mut v = case_rows(
            case,
            |r| r.weights = "model".into(),
            &[("init", 1000), ("inference", 0)],
        );
        v[1].peak_bytes = Some(peak);
        v
    };
    assert!(
        eval(&case(0, 1000), "N2")
            .verdict
            .starts_with("holds: 2.00×–2.00×")
    );
    let c = eval(&case(0, 3000), "N2");
    assert!(c.verdict.starts_with("does not hold: 4.00×–4.00×"), "{c:?}");
    let mut both = case(0, 1000);
    both.extend(case(1, 3000));
    let c = eval(&both, "N2");
    assert!(c.verdict.starts_with("partly: 1 of 2 cases"), "{c:?}");
}

/// D1: the main thread's `ram` PSS 60 MiB against `stream` 10 MiB holds; equal does not.
#[test]
fn d1_dataset_held_in_ram() {
    let c = eval(
        &[
            dataload("main", "ram", 0, 60),
            dataload("main", "stream", 0, 10),
        ],
        "D1",
    );
    assert!(c.verdict.starts_with("holds: holding"), "{c:?}");
    assert!(c.verdict.contains("50.00 MiB more"), "{c:?}");
    let c = eval(
        &[
            dataload("main", "ram", 0, 10),
            dataload("main", "stream", 0, 10),
        ],
        "D1",
    );
    assert!(c.verdict.starts_with("does not hold"), "{c:?}");
}

/// D4 on a 4-core machine (the advice: 2–3 workers), three runs: 2.5 ms of CPU per image in
/// every kind and processes that reach their best images/s at 2 workers hold; saturating only at 4 workers
/// (2 workers give 60 %) is partly, as is 2.5 ms against 5 ms per image; without the runs'
/// cores the advice is not tested (partly); both failing does not hold.
#[test]
fn d4_cpu_per_image_and_the_advice() {
    let rows = |process_ms: f64, at2: f64| {
        let mut v: Vec<Row> = [("main", 0, 2.5, 50.0), ("thread", 2, 2.5, 100.0)]
            .into_iter()
            .chain([1, 2, 4].map(|w| {
                let ips = match w {
                    1 => 50.0,
                    2 => at2,
                    _ => 100.0,
                };
                ("process", w, process_ms, ips)
            }))
            .map(|(kind, w, ms, ips)| {
                let mut r = dataload(kind, "ram", w, 10);
                r.cpu_user_s = Some(ms * 1e-3 * 256.0);
                r.cpu_sys_s = Some(0.0);
                r.wall_s = Some(256.0 / ips);
                r.images_per_s = Some(ips);
                r
            })
            .collect();
        for r in &mut v {
            r.run_id = "d".into();
        }
        v
    };
    // One run: nothing decided.
    let one = BTreeMap::from([("d".to_string(), 4u64)]);
    let c = evaluate_rows_on(&rows(2.5, 99.0), &BTreeMap::new(), &one)
        .into_iter()
        .find(|c| c.id == "D4")
        .unwrap();
    assert!(
        c.verdict.starts_with(
            "open: the CPU per image is undecided (2.50–2.50 ms on 1 sample(s) a configuration, 3 needed); the advice (0.5–0.8 × 4 cores = 2–3 worker(s)) is undecided: 99–100 % of each pipeline's best images/s on 1 sample(s) a worker count"
        ),
        "{c:?}"
    );
    let rows = |process_ms: f64, at2: f64| runs(&rows(process_ms, at2), 3);
    let four: BTreeMap<String, u64> = (0..3).map(|i| (format!("d{i}"), 4)).collect();
    let eval4 = |rows: &[Row]| {
        evaluate_rows_on(rows, &BTreeMap::new(), &four)
            .into_iter()
            .find(|c| c.id == "D4")
            .unwrap()
    };
    // Within the margins (1.34× against 1.3 × 1.05; 92 % against 95 % × 0.95): undecided.
    let c = eval4(&rows(3.35, 99.0));
    assert!(
        c.verdict.starts_with(
            "partly: the CPU per image is undecided (2.50–3.35 ms, 1.340×: within 5 % above the 1.3× limit)"
        ),
        "{c:?}"
    );
    let c = eval4(&rows(2.5, 92.0));
    assert!(
        c.verdict.starts_with("partly: it is CPU work")
            && c.verdict.contains("is undecided: 92–100 % of each pipeline's best images/s, within 5 % below the 95 % share"),
        "{c:?}"
    );
    let c = eval4(&rows(3.35, 92.0));
    assert!(c.verdict.starts_with("open"), "{c:?}");
    // One wild run (every CPU figure doubled, every rate halved) leaves the medians.
    let mut noisy = rows(2.5, 99.0);
    for r in noisy.iter_mut().filter(|r| r.run_id == "d0") {
        r.cpu_user_s = r.cpu_user_s.map(|x| 2.0 * x);
        r.images_per_s = r.images_per_s.map(|x| x / 2.0);
    }
    assert_eq!(eval4(&noisy).verdict, eval4(&rows(2.5, 99.0)).verdict);
    let c = eval4(&rows(2.5, 99.0));
    assert!(
        c.verdict.starts_with(
            "holds: it is CPU work (a constant 2.50–2.50 ms per image, so more images/s means more CPU); the advice (0.5–0.8 × 4 cores = 2–3 worker(s)) reaches 99–100 %"
        ),
        "{c:?}"
    );
    let c = eval4(&rows(2.5, 60.0));
    assert!(
        c.verdict.starts_with("partly: it is CPU work")
            && c.verdict
                .contains("reaches only 60–100 % of the best images/s"),
        "{c:?}"
    );
    let c = eval4(&rows(5.0, 99.0));
    assert!(
        c.verdict
            .starts_with("partly: the CPU per image differs between kinds (2.50–5.00 ms)"),
        "{c:?}"
    );
    let c = eval4(&rows(5.0, 60.0));
    assert!(c.verdict.starts_with("does not hold"), "{c:?}");
    let c = eval(&rows(2.5, 99.0), "D4");
    assert!(
        c.verdict.starts_with("partly: it is CPU work")
            && c.verdict.contains("the advice is not tested"),
        "{c:?}"
    );
}

/// D5: CUDA loading windows' pool peaks in batches (B·3·crop²·4 bytes): fewer than three
/// windows decide nothing; three within 4 batches hold; one beyond does not.
#[test]
fn d5_device_pool_while_loading() {
    let windows = |peaks_in_batches: &[f64]| -> Vec<Row> {
        peaks_in_batches
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let mut r = dataload("thread", "ram", 2 * i as u64, 10);
                r.device = "cuda:0".into();
                r.batch = 32;
                r.peak_bytes = Some((k * (32 * 3 * 224 * 224 * 4) as f64) as u64);
                r
            })
            .collect()
    };
    let c = eval(&windows(&[1.0, 2.0]), "D5");
    assert!(
        c.verdict
            .starts_with("open: 2 loading window(s) on the device, 3 needed"),
        "{c:?}"
    );
    let c = eval(&windows(&[1.0, 2.0, 3.5]), "D5");
    assert!(
        c.verdict
            .starts_with("holds: the device holds 3.50 batches at most over 3 windows"),
        "{c:?}"
    );
    let c = eval(&windows(&[1.0, 6.0, 2.0]), "D5");
    assert!(
        c.verdict
            .starts_with("does not hold: the device holds 6.00 batches (2 workers)"),
        "{c:?}"
    );
}

/// D6: each persistent on/off configuration decides on ≥ 3 samples a side — the medians more
/// than 5 % apart and one side faster in ≥ 75 % of the sample pairs. Single pairs decide
/// nothing; noise within the margin is no difference; pinned copies need a GPU row.
#[test]
fn d6_persistent_and_pinned() {
    // `on` and `off` images/s samples of one configuration (`workers` apart from others).
    let config = |workers: u64, on: &[f64], off: &[f64]| {
        let mut v = Vec::new();
        for (i, (side, ips)) in on
            .iter()
            .map(|x| ("on", *x))
            .chain(off.iter().map(|x| ("off", *x)))
            .enumerate()
        {
            let mut r = dataload("process", "ram", workers, 10);
            r.case = 1000 * workers + i as u64;
            r.persistent = side.into();
            r.images_per_s = Some(ips);
            v.push(r);
        }
        v
    };
    let c = eval(&config(2, &[600.0], &[500.0]), "D6");
    assert!(
        c.verdict.starts_with(
            "open: persistent workers: undecided (fewer than 3 samples a side in each of 1 configurations); pinned memory: needs a GPU"
        ),
        "{c:?}"
    );
    let faster = config(2, &[600.0, 590.0, 610.0], &[500.0, 520.0, 490.0]);
    let c = eval(&faster, "D6");
    assert!(
        c.verdict.starts_with(
            "partly: persistent workers faster in all 1 configurations; pinned memory: needs a GPU"
        ),
        "{c:?}"
    );
    assert!(
        c.measured
            .contains("+20 %, faster in 100 % of the sample pairs"),
        "{c:?}"
    );
    let c = eval(
        &config(2, &[500.0, 520.0, 490.0], &[600.0, 590.0, 610.0]),
        "D6",
    );
    assert!(
        c.verdict.starts_with(
            "does not hold: persistent workers not faster in any of 1 configurations (1 slower"
        ),
        "{c:?}"
    );
    // Noise: medians 3 % apart, or 20 % apart with the samples interleaved (one outlier run).
    let c = eval(
        &config(2, &[515.0, 500.0, 530.0], &[500.0, 495.0, 505.0]),
        "D6",
    );
    assert!(
        c.verdict.contains("1 without a difference beyond ±5 %"),
        "{c:?}"
    );
    let c = eval(
        &config(2, &[600.0, 400.0, 620.0], &[500.0, 610.0, 480.0]),
        "D6",
    );
    assert!(
        c.verdict.contains("1 without a difference beyond ±5 %"),
        "{c:?}"
    );
    // A GPU row's pinned copies faster: with persistent faster too, it holds.
    let mut rows = faster.clone();
    let mut gpu = dataload("process", "ram", 2, 10);
    gpu.case = 5000;
    gpu.device = "cuda:0".into();
    gpu.h2d_pinned_bytes_per_s = Some(20e9);
    gpu.h2d_pageable_bytes_per_s = Some(10e9);
    rows.push(gpu);
    let c = eval(&rows, "D6");
    assert!(c.verdict.starts_with("holds:"), "{c:?}");
    assert!(c.verdict.contains("pinned copies 2.00× faster"), "{c:?}");
    // One configuration faster, one without a difference: partly, no cause asserted.
    let mut mixed = faster;
    mixed.extend(config(4, &[515.0, 500.0, 530.0], &[500.0, 495.0, 505.0]));
    let c = eval(&mixed, "D6");
    assert!(
        c.verdict.starts_with(
            "partly: persistent workers faster in 1 of 2 configurations (0 slower, 1 without a difference beyond ±5 %; why is not measured here)"
        ),
        "{c:?}"
    );
}

/// F2: ViT-B/16 forwards whose graph is 40 MB per image reach 1.28 GB at B 32 (holds); at
/// 20 MB per image 0.64 GB (does not), both carried from batch 8.
#[test]
fn f2_vit_b16_at_batch_32() {
    let vit = |per_image: u64| {
        let mut v = batch_sweep("forward", &[1, 8], |b| b * per_image);
        for r in &mut v {
            r.model = "vit".into();
            (r.image_px, r.patch_px, r.hidden, r.layers) = (224, 16, 768, 12);
        }
        v
    };
    let c = eval(&vit(40_000_000), "F2");
    assert!(c.verdict.starts_with("holds:"), "{c:?}");
    assert!(
        c.verdict
            .contains("at batch 32 by the linear per-image term"),
        "{c:?}"
    );
    let c = eval(&vit(20_000_000), "F2");
    assert!(c.verdict.starts_with("does not hold here"), "{c:?}");
}

/// F6: an efficient graph of 60 % of the standard one at each S holds; one shape where it is
/// larger does not.
#[test]
fn f6_efficient_attention_smaller() {
    let pairs = |worse_at_256: bool| {
        let mut v = Vec::new();
        for (i, s) in [128u64, 256].into_iter().enumerate() {
            for (j, attention) in ["standard", "efficient"].into_iter().enumerate() {
                let mut r = row("forward");
                r.case = (2 * i + j) as u64;
                r.seq = s;
                r.attention = attention.into();
                let standard = 1000 * s;
                let bytes = match (j, worse_at_256 && s == 256) {
                    (0, _) => standard,
                    (_, false) => standard * 6 / 10,
                    (_, true) => standard * 11 / 10,
                };
                r.retained_bytes = Some(bytes as i64);
                r.predicted_retained_bytes = Some(bytes as i64 + 8);
                v.push(r);
            }
        }
        v
    };
    let c = eval(&pairs(false), "F6");
    assert!(
        c.verdict.starts_with("holds for memory (1.67×–1.67×"),
        "{c:?}"
    );
    // The predicted column is the rows' own predictions, not a formula of other kernels.
    assert!(
        c.predicted
            .contains("S 128: 125.01 KiB → 75.01 KiB (composed kernels)"),
        "{c:?}"
    );
    let c = eval(&pairs(true), "F6");
    assert!(
        c.verdict
            .starts_with("does not hold: the efficient graph is not smaller"),
        "{c:?}"
    );
}

/// N5: a QLoRA init whose weights are 40 % of the same LoRA case's with f32 frozen projections
/// holds, told apart by preset, rank and targets; at 60 % it does not; a q4_0 inference peak
/// 1.5× the same case's with the model's weights leaves it partly.
#[test]
fn n5_quantized_storage() {
    let set_peaks = |q4_bytes: i64, q_peak: u64, model_peak: u64| {
        let lora = |case: u64, base: &str, retained: i64| {
            let mut r = row("init");
            r.case = case;
            r.lora_rank = 8;
            r.lora_targets = "q,v".into();
            r.lora_base = base.into();
            r.retained_bytes = Some(retained);
            r
        };
        let mut inf = row("inference");
        inf.case = 9;
        inf.weights = "q4_0".into();
        inf.peak_bytes = Some(q_peak);
        let mut model = inf.clone();
        model.case = 10;
        model.weights = "model".into();
        model.peak_bytes = Some(model_peak);
        vec![
            lora(0, "detach", 1000),
            lora(1, "q4_0", q4_bytes),
            inf,
            model,
        ]
    };
    let set = |q4_bytes: i64| set_peaks(q4_bytes, 5000, 6000);
    let c = eval(&set(400), "N5");
    assert!(
        c.verdict.starts_with(
            "holds: storage halves (against f32 custom q4_0 r8 q,v ×0.400; no 16-bit pair"
        ),
        "{c:?}"
    );
    let c = eval(&set_peaks(400, 9000, 6000), "N5");
    assert!(c.verdict.starts_with("partly: storage halves"), "{c:?}");
    assert!(c.verdict.contains("×1.50"), "{c:?}");
    let c = eval(&set(600), "N5");
    assert!(
        c.verdict.starts_with(
            "does not hold: storage does not halve (against f32 custom q4_0 r8 q,v ×0.600"
        ),
        "{c:?}"
    );
    // int8 against 16-bit weights: the same model in f16, its projections in q8_0 (34 B per
    // 32 weights against 64 B) — ×0.66 with 16-bit embeddings: that half does not halve.
    let mut rows = set(400);
    for (case, base, retained) in [(20, "op", 900), (21, "q8_0", 600)] {
        let mut r = rows[0].clone();
        r.case = case;
        r.dtype = "f16".into();
        r.lora_base = base.into();
        r.retained_bytes = Some(retained);
        rows.push(r);
    }
    let c = eval(&rows, "N5");
    assert!(
        c.verdict.starts_with(
            "partly: storage halves in 1 of 2 pairs (against f32 custom q4_0 r8 q,v ×0.400; against 16-bit custom q8_0 r8 q,v ×0.667"
        ),
        "{c:?}"
    );
}

/// F3: two depths of a 7B-wide GPT slice. The formula's block matching the measured one within
/// 1 % lets it carry the block to full size (derived); a formula 5 % off leaves F3 open.
#[test]
fn f3_carries_the_block_only_when_the_formula_matches_the_slice() {
    let slice = |predicted_block: i64| -> Vec<Row> {
        [(1u64, 600_000_000i64), (2, 1_100_000_000)]
            .iter()
            .enumerate()
            .map(|(i, &(layers, retained))| {
                let mut r = row("forward");
                r.case = i as u64;
                r.model = "gpt".into();
                r.preset = "llama-7b-shape".into();
                r.hidden = 4096;
                r.heads = 32;
                r.layers = layers;
                r.batch = 1;
                r.seq = 1024;
                r.retained_bytes = Some(retained);
                r.peak_bytes = Some(retained as u64);
                // The measured block is 500 MB; the formula's is `predicted_block`.
                r.predicted_retained_bytes = Some(100_000_000 + layers as i64 * predicted_block);
                r
            })
            .collect()
    };
    let good = eval(&slice(500_100_000), "F3");
    assert_eq!(good.kind(), "derived", "{}", good.verdict);
    assert!(good.verdict.contains("0.0200 %"), "{}", good.verdict);
    let off = eval(&slice(525_000_000), "F3");
    assert_eq!(off.kind(), "open", "{}", off.verdict);
    assert!(off.verdict.contains("5.0000 %"), "{}", off.verdict);
}
