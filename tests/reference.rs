//! memfit's models compute the same function as the reference implementations: tiny models
//! built by transformers (`scripts/make-fixtures.py`: Llama with grouped-query attention;
//! Qwen3 with q/k norms and a head_dim other than hidden / heads; Mixtral, 4 experts, 2 per
//! token; Qwen3-MoE, 6 experts, 3 per token, q/k norms), their weights under memfit's
//! names and transformers' logits for a fixed input, stored in `tests/fixtures/<family>/`. memfit
//! reads the same `config.json`, loads the weights and must give the same logits, with candle's
//! composed ops and with the fused kernels. (Memory only means something if the model is the
//! model.)

use std::path::PathBuf;

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use memfit::model::hf_config;
use memfit::model::kernels::Kernels;
use memfit::model::transformer::{Config, Transformer};

fn fixture(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(family)
}

/// The largest difference from transformers' logits, relative to their largest magnitude.
fn logits_error(family: &str, kernels: Kernels) -> f32 {
    let dir = fixture(family);
    let hf = hf_config::load(&dir.join("config.json")).expect("the fixture's config.json");
    let dev = Device::Cpu;
    // SAFETY: the fixture is not modified while mapped.
    let vb = unsafe {
        VarBuilder::from_mmaped_safetensors(&[dir.join("model.safetensors")], DType::F32, &dev)
    }
    .unwrap();
    let cfg = Config {
        kernels,
        ..hf.cfg.clone()
    };
    let model = Transformer::new(&cfg, vb).unwrap();
    assert_eq!(
        model_params(&dir),
        cfg.params(),
        "{family}: the fixture's parameters are memfit's count"
    );
    let io = candle_core::safetensors::load(dir.join("io.safetensors"), &dev).unwrap();
    let tokens = io["tokens"].to_dtype(DType::U32).unwrap();
    let want = &io["logits"];
    let got = model.forward(&tokens).unwrap();
    assert_eq!(got.dims(), want.dims(), "{family}");
    let diff = (got - want)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    let scale = want
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    diff / scale
}

/// Elements of every tensor in the fixture's weights.
fn model_params(dir: &std::path::Path) -> u64 {
    let w = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
    w.values().map(|t| t.elem_count() as u64).sum()
}

fn check(family: &str) {
    for kernels in [Kernels::Composed, Kernels::Fused] {
        let e = logits_error(family, kernels);
        println!(
            "{family} {}: logits within {e:.2e} of transformers'",
            kernels.as_str()
        );
        assert!(
            e < 1e-4,
            "{family} {}: logits differ by {e}",
            kernels.as_str()
        );
    }
}

#[test]
fn llama_logits_equal_transformers() {
    check("llama");
}

#[test]
fn qwen3_logits_equal_transformers() {
    check("qwen3");
}

/// The comparison can fail: a model without Qwen3's q/k norms on the same weights does not
/// give transformers' logits.
#[test]
fn a_different_model_gives_different_logits() {
    let dir = fixture("qwen3");
    let hf = hf_config::load(&dir.join("config.json")).unwrap();
    let mut cfg = hf.cfg.clone();
    if let Some(l) = cfg.llama.as_mut() {
        l.qk_norm = false;
    }
    let dev = Device::Cpu;
    // SAFETY: as above.
    let vb = unsafe {
        VarBuilder::from_mmaped_safetensors(&[dir.join("model.safetensors")], DType::F32, &dev)
    }
    .unwrap();
    let model = Transformer::new(&cfg, vb).unwrap();
    let io = candle_core::safetensors::load(dir.join("io.safetensors"), &dev).unwrap();
    let tokens = io["tokens"].to_dtype(DType::U32).unwrap();
    let got = model.forward(&tokens).unwrap();
    let diff = (got - &io["logits"])
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(
        diff > 1e-2,
        "without q/k norms the logits still agree ({diff})"
    );
}

#[test]
fn mixtral_logits_equal_transformers() {
    check("mixtral");
}

#[test]
fn qwen3_moe_logits_equal_transformers() {
    check("qwen3_moe");
}

#[test]
fn mistral_sliding_window_logits_equal_transformers() {
    check("mistral");
}

/// Generation across the window: a prompt of 6 tokens (longer than the window of 4: it
/// attends under the windowed mask, the cache keeps its last 4), then one token at a time to
/// 11; each step's logits are transformers' full-forward logits at that
/// position, with the composed and the fused kernels; the cache never holds more than 4.
#[test]
fn mistral_decode_rolls_its_cache_across_the_window() {
    let dir = fixture("mistral");
    let hf = hf_config::load(&dir.join("config.json")).unwrap();
    let dev = Device::Cpu;
    let io = candle_core::safetensors::load(dir.join("io.safetensors"), &dev).unwrap();
    let tokens = io["tokens"].to_dtype(DType::U32).unwrap();
    let want = &io["logits"];
    for kernels in [Kernels::Composed, Kernels::Fused] {
        // SAFETY: as above.
        let vb = unsafe {
            VarBuilder::from_mmaped_safetensors(&[dir.join("model.safetensors")], DType::F32, &dev)
        }
        .unwrap();
        let cfg = Config {
            kernels,
            ..hf.cfg.clone()
        };
        let model = Transformer::new(&cfg, vb).unwrap();
        let mut cache = memfit::model::transformer::KvCache::default();
        let mut got = model
            .forward_cached(&tokens.narrow(1, 0, 6).unwrap(), &mut cache)
            .unwrap();
        for t in 6..=11 {
            let at = want.narrow(1, t - 1, 1).unwrap().squeeze(1).unwrap();
            let diff = (&got - &at)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(diff < 1e-4, "{kernels:?} position {}: {diff}", t - 1);
            let held = cache.layers[0].as_ref().unwrap().0.dim(2).unwrap();
            assert_eq!(
                held,
                t.min(4),
                "{kernels:?}: the cache holds the last W tokens"
            );
            if t < 11 {
                got = model
                    .forward_cached(&tokens.narrow(1, t, 1).unwrap(), &mut cache)
                    .unwrap();
            }
        }
    }
}
