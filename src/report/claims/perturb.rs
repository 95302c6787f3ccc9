//! Every verdict is decided by its data (issue 24 item 6, issue 33 item 3). On the committed
//! results (`results/cpu`, read as `memfit report` reads them), each claim's measured figures —
//! the ones its criterion reads, on the rows it reads, every half that has rows here — are
//! scaled, and its verdict must become the kind the scaling pushes it to ([`Probe::expect`]: the
//! direction, not just any change); a derived claim's figures must follow the measured ones it
//! is derived from. A claim no measured figure can change says so: open (no rows), derived
//! (from what, in its criterion or verdict) or not applicable. Halves that need a GPU (D5, D6's
//! pinned copies, I2's pool trim) have no committed rows to scale.

use crate::step::Phase;
use std::sync::OnceLock;

use super::*;

/// One perturbation: what it scales, by how much, on which rows, and what it must do to its
/// claim's verdict: the kind it must become (the direction the scaled figure pushes the
/// criterion), or [`FIGURES`]: the same kind with other figures (a derived claim, whose numbers
/// follow the measured ones).
struct Probe {
    what: &'static str,
    factor: f64,
    expect: &'static str,
    apply: fn(&mut Row, f64),
}

fn scale_u(v: &mut Option<u64>, f: f64) {
    *v = v.map(|x| (x as f64 * f) as u64);
}

fn scale_i(v: &mut Option<i64>, f: f64) {
    *v = v.map(|x| (x as f64 * f) as i64);
}

fn scale_f(v: &mut Option<f64>, f: f64) {
    *v = v.map(|x| x * f);
}

/// The figures a claim decides on, scaled so that its criterion should tip.
fn probes(id: &str) -> Vec<Probe> {
    let p = |what, factor, expect, apply| Probe {
        what,
        factor,
        expect,
        apply,
    };
    match id {
        "D1" => vec![p(
            "main-thread `stream` PSS peak",
            4.0,
            "does not hold",
            |r, f| {
                if r.phase == Phase::Dataload && r.worker_kind == "main" && r.storage == "stream" {
                    scale_u(&mut r.pss_peak_bytes, f)
                }
            },
        )],
        "D2" => vec![p(
            "PSS peak of worker processes holding the data in RAM",
            0.5,
            "partly",
            |r, f| {
                if r.phase == Phase::Dataload && r.worker_kind == "process" && r.storage == "ram" {
                    scale_u(&mut r.pss_peak_bytes, f)
                }
            },
        )],
        "D3" => [(0.5, "does not hold"), (2.0, "holds")]
            .map(|(k, e)| {
                p("main-thread streaming heap peak", k, e, |r: &mut Row, f| {
                    if r.phase == Phase::Dataload
                        && r.worker_kind == "main"
                        && r.storage == "stream"
                    {
                        scale_u(&mut r.peak_bytes, f)
                    }
                })
            })
            .into(),
        "D4" => vec![
            p(
                "worker processes' CPU seconds",
                2.0,
                "does not hold",
                |r, f| {
                    if r.phase == Phase::Dataload && r.worker_kind == "process" {
                        scale_f(&mut r.cpu_user_s, f);
                        scale_f(&mut r.cpu_sys_s, f);
                    }
                },
            ),
            p("images/s at one worker", 2.0, "holds", |r, f| {
                if r.phase == Phase::Dataload && r.workers == Some(1) {
                    scale_f(&mut r.images_per_s, f)
                }
            }),
        ],
        "D6" => vec![p(
            "images/s with persistent workers",
            0.5,
            "does not hold",
            |r, f| {
                if r.phase == Phase::Dataload && r.persistent == "on" {
                    scale_f(&mut r.images_per_s, f)
                }
            },
        )],
        "F1" => vec![p(
            "the forward graph at B 8 and at S 256",
            2.0,
            "partly",
            |r, f| {
                if r.phase == Phase::Forward && (r.batch == 8 || r.seq == 256) {
                    scale_i(&mut r.retained_bytes, f)
                }
            },
        )],
        "F2" => vec![p(
            "ViT-B/16 forward graphs",
            0.1,
            "does not hold",
            |r, f| {
                if r.phase == Phase::Forward && r.model == "vit" {
                    scale_i(&mut r.retained_bytes, f)
                }
            },
        )],
        "F3" => vec![p(
            "the two-block forward graph at H 4096",
            2.0,
            "open",
            |r, f| {
                if r.phase == Phase::Forward && r.hidden == 4096 && r.layers == 2 {
                    scale_i(&mut r.retained_bytes, f)
                }
            },
        )],
        "F4" => vec![p(
            "the train-step peak at B 8",
            0.5,
            "does not hold",
            |r, f| {
                if r.phase == Phase::TrainStep && r.batch == 8 {
                    scale_u(&mut r.peak_bytes, f)
                }
            },
        )],
        "F5" => vec![
            p(
                "checkpointed train-step peaks",
                10.0,
                "does not hold",
                |r, f| {
                    if r.phase == Phase::TrainStep && r.checkpoint > 0 {
                        scale_u(&mut r.peak_bytes, f)
                    }
                },
            ),
            p(
                "checkpointed train-step wall times",
                0.33,
                "partly",
                |r, f| {
                    if r.phase == Phase::TrainStep && r.checkpoint > 0 {
                        scale_f(&mut r.wall_s, f)
                    }
                },
            ),
        ],
        "F6" => vec![p(
            "efficient attention's forward graph",
            2.0,
            "does not hold",
            |r, f| {
                if r.phase == Phase::Forward && r.attention == "efficient" {
                    scale_i(&mut r.retained_bytes, f)
                }
            },
        )],
        "B1" => [(0.5, "does not hold"), (2.0, "does not hold")]
            .map(|(k, e)| {
                p("gradients kept after backward", k, e, |r: &mut Row, f| {
                    if r.phase == Phase::Backward {
                        scale_i(&mut r.retained_bytes, f)
                    }
                })
            })
            .into(),
        "B2" => vec![p("AdamW's state", 0.5, "does not hold", |r, f| {
            if r.phase == Phase::Optimizer && r.optimizer == "adamw" {
                scale_i(&mut r.retained_bytes, f)
            }
        })],
        "B3" => vec![
            p("pure 16-bit AdamW state", 2.0, "holds", |r, f| {
                if r.phase == Phase::Optimizer && r.dtype != "f32" && r.precision != "mixed" {
                    scale_i(&mut r.retained_bytes, f)
                }
            }),
            p(
                "mixed-precision AdamW state",
                2.0,
                "does not hold",
                |r, f| {
                    if r.phase == Phase::Optimizer && r.precision == "mixed" {
                        scale_i(&mut r.retained_bytes, f)
                    }
                },
            ),
            p(
                "mixed-precision forward graph at B 1",
                2.0,
                "does not hold",
                |r, f| {
                    if r.phase == Phase::Forward && r.precision == "mixed" && r.batch == 1 {
                        scale_i(&mut r.retained_bytes, f)
                    }
                },
            ),
        ],
        "B4" => [(0.5, "does not hold"), (2.0, "does not hold")]
            .map(|(k, e)| {
                p("mixed-precision AdamW state", k, e, |r: &mut Row, f| {
                    if r.phase == Phase::Optimizer && r.precision == "mixed" {
                        scale_i(&mut r.retained_bytes, f)
                    }
                })
            })
            .into(),
        "B6" => vec![p(
            "the full fine-tune's weights, gradients and state",
            0.15,
            "partly",
            // The gradients are the forward's retained bytes plus the backward's (negative by
            // block: the activations released): both scale so that the gradients do.
            |r, f| {
                if r.lora_rank == 0
                    && matches!(
                        r.phase.as_str(),
                        "init" | "forward" | "backward" | "optimizer"
                    )
                {
                    scale_i(&mut r.retained_bytes, f)
                }
            },
        )],
        "B7" => vec![p("8-bit AdamW's state", 2.0, "does not hold", |r, f| {
            if r.phase == Phase::Optimizer && r.optimizer == "adamw-8bit" {
                scale_i(&mut r.retained_bytes, f)
            }
        })],
        "I1" => vec![p("weights after init", 1.5, "partly", |r, f| {
            if r.phase == Phase::Init {
                scale_i(&mut r.retained_bytes, f)
            }
        })],
        "I2" => vec![
            p(
                "16-bit weights after init and load",
                2.0,
                "partly",
                |r, f| {
                    if matches!(r.phase, Phase::Init | Phase::Load) && r.dtype != "f32" {
                        scale_i(&mut r.retained_bytes, f)
                    }
                },
            ),
            // The trim half: what `malloc_trim(0)` gave back (RSS before − after), scaled.
            p("what malloc_trim gave back", 0.1, "partly", |r, f| {
                if r.trim_layer == "rss"
                    && let (Some(before), Some(after)) = (r.trim_before_bytes, r.trim_after_bytes)
                {
                    let back = before.saturating_sub(after) as f64 * f;
                    r.trim_after_bytes = Some(before - back as u64);
                }
            }),
        ],
        // Derived from the measured bytes per parameter: the figures follow them, the kind stays.
        "B5" => vec![p("mixed-precision AdamW state", 2.0, FIGURES, |r, f| {
            if r.phase == Phase::Optimizer && r.precision == "mixed" {
                scale_i(&mut r.retained_bytes, f)
            }
        })],
        "N1" => vec![p("what inference keeps", 3.0, "does not hold", |r, f| {
            if r.phase == Phase::Inference {
                scale_i(&mut r.retained_bytes, f)
            }
        })],
        "N2" => vec![p("inference peaks", 1e-4, "does not hold", |r, f| {
            if r.phase == Phase::Inference {
                scale_u(&mut r.peak_bytes, f)
            }
        })],
        "N3" => vec![
            p("read-loading peaks", 0.5, "does not hold", |r, f| {
                if r.phase == Phase::Load && r.load == "read" {
                    scale_u(&mut r.peak_bytes, f)
                }
            }),
            p("multi-threaded decode CPU seconds", 3.0, "holds", |r, f| {
                if r.phase == Phase::Decode && r.threads > 1 {
                    scale_f(&mut r.cpu_user_s, f)
                }
            }),
        ],
        "N4" => vec![p(
            "the cache's growth in decode",
            2.0,
            "does not hold",
            |r, f| {
                if r.phase == Phase::Decode {
                    scale_i(&mut r.retained_bytes, f)
                }
            },
        )],
        "N5" => vec![
            // Both halves at once (each alone leaves the other failing): the quantized peaks
            // halved and every QLoRA base ×0.7 (int8 against 16-bit then halves too).
            p(
                "quantized inference peaks, with the QLoRA weights ×0.7",
                0.5,
                "holds",
                |r, f| {
                    if r.phase == Phase::Inference && r.weights.starts_with('q') {
                        scale_u(&mut r.peak_bytes, f)
                    }
                    if r.phase == Phase::Init && r.lora_base.starts_with('q') {
                        scale_i(&mut r.retained_bytes, 0.7)
                    }
                },
            ),
            p("QLoRA's quantized weights", 4.0, "does not hold", |r, f| {
                if r.phase == Phase::Init && r.lora_base.starts_with('q') {
                    scale_i(&mut r.retained_bytes, f)
                }
            }),
        ],
        _ => Vec::new(),
    }
}

/// A derived claim's expectation ([`Probe::expect`]): its kind stays, its figures move.
const FIGURES: &str = "the same kind, other figures";

type Committed = (Vec<Row>, BTreeMap<String, String>, BTreeMap<String, u64>);

/// The committed results and their runs' workloads and cores.
fn committed() -> &'static Committed {
    static SET: OnceLock<Committed> = OnceLock::new();
    SET.get_or_init(|| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("results/cpu");
        let set = crate::report::load_set(&path).expect("the committed results");
        let workload_of = set
            .metas
            .iter()
            .map(|m| (m.run_id.clone(), m.workload.clone()))
            .collect();
        let cores_of = set
            .metas
            .iter()
            .map(|m| (m.run_id.clone(), m.cores))
            .collect();
        (set.rows, workload_of, cores_of)
    })
}

fn claims_of(rows: &[Row]) -> Vec<Claim> {
    let (_, workload_of, cores_of) = committed();
    evaluate_rows_on(rows, workload_of, cores_of)
}

#[test]
fn every_verdict_changes_with_the_figures_it_decides_on() {
    let (rows, _, _) = committed();
    let base = claims_of(rows);
    let mut failures = Vec::new();
    for c in &base {
        let probes = probes(c.id);
        if matches!(c.kind(), "open" | "not applicable") {
            assert!(
                probes.is_empty(),
                "{}: {} on the committed rows but has probes",
                c.id,
                c.kind()
            );
            continue;
        }
        if c.kind() == "derived" && probes.is_empty() {
            // Derived from nothing measured here (F3's full size when its slice is absent).
            assert!(
                c.criterion.contains("from") || c.verdict.contains("from"),
                "{}: derived without saying from what: {c:?}",
                c.id
            );
            continue;
        }
        assert!(
            !probes.is_empty(),
            "{}: a verdict ({}) with no perturbation that tests it",
            c.id,
            c.kind()
        );
        for pr in probes {
            let mut perturbed = rows.clone();
            let before: Vec<Row> = perturbed.clone();
            perturbed.iter_mut().for_each(|r| (pr.apply)(r, pr.factor));
            assert_ne!(before, perturbed, "{}: {} changes no row", c.id, pr.what);
            let after = claims_of(&perturbed)
                .into_iter()
                .find(|x| x.id == c.id)
                .unwrap();
            // The table of the closing note: `cargo test --lib perturb -- --nocapture`.
            eprintln!(
                "{}: {} ×{}: {} → {}",
                c.id,
                pr.what,
                pr.factor,
                c.kind(),
                after.kind()
            );
            let expect = pr.expect;
            let ok = if expect == FIGURES {
                after.kind() == c.kind()
                    && (after.measured != c.measured || after.predicted != c.predicted)
            } else {
                after.kind() == expect
            };
            if !ok {
                failures.push(format!(
                    "{}: {} ×{}: {} → {}, expected {expect}: {}",
                    c.id,
                    pr.what,
                    pr.factor,
                    c.kind(),
                    after.kind(),
                    after.verdict
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
