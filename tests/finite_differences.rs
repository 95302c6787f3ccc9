//! memfit's gradients against an independent reference: central finite differences of the loss
//! in f64. Most gradient tests compare memfit's paths with each other (fused with composed, by
//! block with whole, efficient with standard attention), so a gradient every path gets wrong
//! the same way — a router's renormalisation detached, a norm's weight skipped — passes them
//! all. Two tests look outside: `tests/reference.rs` compares every path's f32 gradients (each
//! kernel set and attention, both backwards, gpt-oss included) with transformers' on the
//! fixtures; this one checks the derivative itself, without trusting transformers'. Each
//! fixture family (transformers' configs and weights) is built in f64 with candle's composed
//! ops; for every parameter tensor `w` and a random direction `d`, the backward's `⟨∂L/∂w, d⟩`
//! must equal `(L(w + εd) − L(w − εd)) / 2ε`.
//!
//! gpt-oss is not here: its clamped SwiGLU is one fused op computing in f32 (no f64, and no
//! composed form to fall back on).
//!
//! Precision: a dense family computes in f64 throughout (agreement to ~1e-9 relative). A
//! mixture of experts scores its router in f32 (as the model does in every type), so the loss
//! moves in f32 steps there; ε is larger and the tolerance 1e-3 relative, still far below the
//! 40 % a detached renormaliser costs the router's gradient (Qwen3-Next, whose linear layers
//! curve the loss more, a smaller ε).

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use memfit::model::hf_config;
use memfit::model::kernels::Kernels;
use memfit::model::transformer::{Config, Transformer, synthetic_batch};

const FAMILIES: &[&str] = &[
    "llama",
    "llama_rope_llama3",
    "mistral",
    "phi3",
    "phi3_longrope",
    "phi3_partial",
    "qwen3",
    "qwen3_yarn",
    "qwen3_layer_types",
    "gemma3",
    "smollm3",
    "olmo2",
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "qwen3_moe_dense",
    "deepseek_v2",
    "deepseek_v3",
    "deepseek_v3_yarn",
    "glm4_moe",
    "gemma2",
    "llama4",
    "qwen3_next",
];

fn fixture(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(family)
}

/// The fixture's model in f64, its weights as variables (`varmap`).
fn model(family: &str) -> (Config, VarMap, Transformer) {
    let mut cfg = hf_config::load(&fixture(family).join("config.json"))
        .expect("the fixture's config.json")
        .cfg;
    cfg.kernels = Kernels::Composed;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F64, &Device::Cpu);
    let model = Transformer::new(&cfg, vb).unwrap();
    let weights =
        candle_core::safetensors::load(fixture(family).join("model.safetensors"), &Device::Cpu)
            .unwrap();
    for (name, var) in varmap.data().lock().unwrap().iter() {
        let w = weights
            .get(name)
            .unwrap_or_else(|| panic!("{family}: {name} is not in the fixture"));
        var.set(&w.to_dtype(DType::F64).unwrap()).unwrap();
    }
    (cfg, varmap, model)
}

fn loss(model: &Transformer, tokens: &Tensor, targets: &Tensor) -> Tensor {
    Transformer::loss(&model.forward(tokens).unwrap(), targets).unwrap()
}

fn scalar(t: &Tensor) -> f64 {
    t.to_scalar::<f64>().unwrap()
}

/// A direction of unit RMS for `var`, from a fixed seed.
fn direction(var: &Var, seed: u64) -> Tensor {
    let n = var.elem_count();
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let values: Vec<f64> = (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        })
        .collect();
    let rms = (values.iter().map(|v| v * v).sum::<f64>() / n as f64).sqrt();
    Tensor::from_vec(values, var.shape(), &Device::Cpu)
        .unwrap()
        .affine(1.0 / rms, 0.0)
        .unwrap()
}

/// The loss at the model's current weights and the routing it drew (tokens per expert, by
/// sparse layer).
fn loss_routed(
    model: &Transformer,
    tokens: &Tensor,
    targets: &Tensor,
) -> (f64, Option<Vec<Vec<usize>>>) {
    memfit::model::moe::routing_window();
    let l = scalar(&loss(model, tokens, targets));
    (l, memfit::model::moe::routing_snapshot())
}

/// Every parameter tensor's directional derivative, backward against finite differences:
/// `(name, backward, finite differences)`; `None` for the finite differences when a step of
/// `eps` and of `eps / 10` both move a token to another expert (the loss jumps there).
fn derivatives(family: &str, eps: f64) -> Vec<(String, f64, Option<f64>)> {
    let (cfg, varmap, model) = model(family);
    let (tokens, targets) = synthetic_batch(2, 7, cfg.vocab, &Device::Cpu).unwrap();
    let (_, routing) = loss_routed(&model, &tokens, &targets);
    let grads = loss(&model, &tokens, &targets).backward().unwrap();
    let data = varmap.data().lock().unwrap();
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    let mut out = Vec::new();
    for (i, name) in names.into_iter().enumerate() {
        let var = &data[name];
        let d = direction(var, i as u64 + 1);
        let analytic = match grads.get(var.as_tensor()) {
            Some(g) => scalar(&(g * &d).unwrap().sum_all().unwrap()),
            None => 0.0,
        };
        let w = var.as_tensor().copy().unwrap();
        let at = |step: f64| {
            var.set(&(&w + d.affine(step, 0.0).unwrap()).unwrap())
                .unwrap();
            loss_routed(&model, &tokens, &targets)
        };
        let numeric = [eps, eps / 10.0].into_iter().find_map(|e| {
            let ((up, r_up), (down, r_down)) = (at(e), at(-e));
            (r_up == routing && r_down == routing).then(|| (up - down) / (2.0 * e))
        });
        var.set(&w).unwrap();
        out.push((name.clone(), analytic, numeric));
    }
    out
}

#[test]
fn every_gradient_equals_finite_differences() {
    let mut failures = Vec::new();
    let (mut worst_dense, mut worst_moe) = ((0.0f64, String::new()), (0.0f64, String::new()));
    let (mut checked, mut jumps) = (0, Vec::new());
    for family in FAMILIES {
        let cfg = hf_config::load(&fixture(family).join("config.json"))
            .unwrap()
            .cfg;
        let moe = cfg.llama.is_some_and(|l| l.moe.is_some());
        // The router's f32 scores: a larger step, a looser agreement (still far below what a
        // wrong gradient costs).
        // Qwen3-Next's linear layers (decays that are exponentials of cumulative sums, the
        // convolution's SiLU) curve the loss more: central differences at 1e-3 are 3.6 % off
        // along `ba`, at 3e-4 1.6 % along the convolution (a difference of order ε²); 1e-4.
        let (eps, rel, abs) = if *family == "qwen3_next" {
            (1e-4, 1e-2, 1e-3)
        } else if moe {
            (1e-3, 1e-2, 1e-3)
        } else {
            (1e-5, 1e-5, 1e-9)
        };
        let found = derivatives(family, eps);
        assert!(
            found.len() > 10,
            "{family}: {} parameter tensors",
            found.len()
        );
        for (name, a, n) in found {
            let Some(n) = n else {
                jumps.push(format!("{family} {name}"));
                continue;
            };
            checked += 1;
            let err = (a - n).abs();
            let scale = a.abs().max(n.abs());
            if err > rel * scale + abs {
                failures.push(format!(
                    "{family} {name}: backward {a:.9e}, finite differences {n:.9e}"
                ));
            }
            let r = err / scale.max(1e-12);
            let worst = if moe {
                &mut worst_moe
            } else {
                &mut worst_dense
            };
            if r > worst.0 && scale > 1e-3 {
                *worst = (r, format!("{family} {name}"));
            }
        }
    }
    eprintln!(
        "{checked} tensors; largest relative difference (|derivative| > 1e-3): dense {:.2e} ({}), \
         mixtures of experts {:.2e} ({}); {} with a routing jump: {jumps:?}",
        worst_dense.0,
        worst_dense.1,
        worst_moe.0,
        worst_moe.1,
        jumps.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // A jump only where a step moves a token: a few tensors, not a family's worth.
    assert!(
        jumps.len() * 20 <= checked,
        "{} jumps of {checked}",
        jumps.len()
    );
}
