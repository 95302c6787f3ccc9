//! memfit's models compute the same function as the reference implementations: tiny models
//! built by transformers (`scripts/make-fixtures.py`: Llama with grouped-query attention;
//! Qwen3 with q/k norms and a head_dim other than hidden / heads; Mixtral, 4 experts, 2 per
//! token; Qwen3-MoE, 6 experts, 3 per token, q/k norms; Qwen2-MoE with a gated shared expert
//! and a dense layer; DeepSeek-V2 and V3 with multi-head latent attention, shared experts, a
//! dense first layer, greedy softmax and group-limited sigmoid routing; Phi-3 with its fused
//! projections and a sliding window; Gemma 3 with its four `1 + w` norms a block, GeGLU, scaled
//! embedding and a sliding layer on its own rotary base), their weights under memfit's
//! names and transformers' logits for a fixed input, stored in `tests/fixtures/<family>/`. memfit
//! reads the same `config.json`, loads the weights and must give the same logits, with candle's
//! composed ops and with the fused kernels. (Memory only means something if the model is the
//! model.)
//!
//! The gradients too (`gradients::<family>`, one test per fixture): each fixture also holds
//! targets and transformers' gradient of every parameter of the mean cross-entropy, computed
//! with the model in float64 (`grads.safetensors`, stored as f32; float32 where transformers
//! rounds to it whatever the model's type: the attention's softmax, the RMSNorms, some
//! routers). memfit's
//! f32 gradients on the fixture's weights, by the whole backward and block by block, with every
//! kernel set and attention the family builds, must be those parameters' and within 1e-4 of
//! each reference's largest element (they agree to within 1e-5). The one difference by design:
//! transformers' embedding gives the pad token's row no gradient (`padding_idx`), memfit's the
//! gradient of its uses; where the input holds the pad token (Phi-4-mini's fixture) that row is
//! left out.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use candle_nn::{VarBuilder, VarMap};
use common::max_abs;
use memfit::model::hf_config;
use memfit::model::kernels::Kernels;
use memfit::model::transformer::{Config, Transformer};
use memfit::phase::by_block;

fn fixture(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(family)
}

/// The fixture's `config.json` as memfit reads it.
fn config(family: &str) -> Config {
    hf_config::load(&fixture(family).join("config.json"))
        .expect("the fixture's config.json")
        .cfg
}

/// `cfg` built on the fixture's weights.
fn model(family: &str, cfg: &Config) -> Transformer {
    // SAFETY: the fixture is not modified while mapped.
    let vb = unsafe {
        VarBuilder::from_mmaped_safetensors(
            &[fixture(family).join("model.safetensors")],
            DType::F32,
            &Device::Cpu,
        )
    }
    .unwrap();
    Transformer::new(cfg, vb).unwrap()
}

/// The fixture's input tokens (u32) and transformers' logits `(B, S, V)`.
fn io(family: &str) -> (Tensor, Tensor) {
    let io = candle_core::safetensors::load(fixture(family).join("io.safetensors"), &Device::Cpu)
        .unwrap();
    (
        io["tokens"].to_dtype(DType::U32).unwrap(),
        io["logits"].clone(),
    )
}

/// `max |a − b|`.
fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    max_abs(&(a - b).unwrap())
}

/// The attentions every fixture is checked with: standard with each kind of kernel, then
/// the efficient op and the tiled composition (their own kernels; the rest fused), which
/// must apply the fixture's sliding windows too.
const ATTENTIONS: [(&str, Kernels, bool, bool); 5] = [
    ("composed", Kernels::Composed, false, false),
    ("fused", Kernels::Fused, false, false),
    ("transformers", Kernels::Transformers, false, false),
    ("efficient", Kernels::Fused, true, false),
    ("tiled", Kernels::Fused, false, true),
];

/// The fixture's config with one of [`ATTENTIONS`].
fn with(family: &str, (_, kernels, efficient, tiled): (&str, Kernels, bool, bool)) -> Config {
    Config {
        kernels,
        efficient_attention: efficient,
        tiled_attention: tiled,
        ..config(family)
    }
}

/// The largest difference from transformers' logits, relative to their largest magnitude.
fn logits_error(family: &str, attention: (&str, Kernels, bool, bool)) -> f32 {
    let cfg = with(family, attention);
    let model = model(family, &cfg);
    assert_eq!(
        model_params(&fixture(family)),
        cfg.params(),
        "{family}: the fixture's parameters are memfit's count"
    );
    let (tokens, want) = io(family);
    let got = model.forward(&tokens).unwrap();
    assert_eq!(got.dims(), want.dims(), "{family}");
    max_diff(&got, &want) / max_abs(&want)
}

/// Elements of every tensor in the fixture's weights.
fn model_params(dir: &std::path::Path) -> u64 {
    let w = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu).unwrap();
    w.values().map(|t| t.elem_count() as u64).sum()
}

fn check(family: &str) {
    for attention in ATTENTIONS {
        let e = logits_error(family, attention);
        let name = attention.0;
        println!("{family} {name}: logits within {e:.2e} of transformers'");
        assert!(e < 1e-4, "{family} {name}: logits differ by {e}");
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

/// The comparison can fail: a model without Qwen3's q/k norms, or Phi-3 without its window of
/// 5 (the 11-token input reaches past it), on the same weights does not give transformers'
/// logits.
#[test]
fn a_different_model_gives_different_logits() {
    type Change = fn(&mut memfit::model::llama::Llama);
    let changes: [(&str, &str, Change); 2] = [
        ("qwen3", "without q/k norms", |l| l.qk_norm = false),
        ("phi3", "without its window", |l| l.sliding_window = None),
    ];
    for (family, what, change) in changes {
        let mut cfg = config(family);
        change(cfg.llama.as_mut().unwrap());
        let (tokens, want) = io(family);
        let got = model(family, &cfg).forward(&tokens).unwrap();
        let diff = max_diff(&got, &want);
        assert!(
            diff > 1e-2,
            "{family} {what}: the logits still agree ({diff})"
        );
    }
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
fn qwen3_moe_listed_dense_layer_logits_equal_transformers() {
    check("qwen3_moe_dense");
}

#[test]
fn qwen2_moe_shared_expert_and_dense_layer_logits_equal_transformers() {
    check("qwen2_moe");
}

#[test]
fn deepseek_v2_mla_logits_equal_transformers() {
    check("deepseek_v2");
}

#[test]
fn deepseek_v3_mla_sigmoid_group_routing_logits_equal_transformers() {
    check("deepseek_v3");
}

/// Generation with the cache on the fixture's input: a prompt of `prompt` tokens, then one
/// token at a time to the input's end; after each step `at(t, logits, want, cache)` with `t` the
/// tokens seen, the last position's logits and transformers' full-forward logits there.
fn generate(
    family: &str,
    cfg: &Config,
    prompt: usize,
    mut at: impl FnMut(usize, &Tensor, &Tensor, &memfit::model::transformer::KvCache),
) {
    let (tokens, want) = io(family);
    let len = tokens.dim(1).unwrap();
    let model = model(family, cfg);
    let mut cache = memfit::model::transformer::KvCache::default();
    let mut got = model
        .forward_cached(&tokens.narrow(1, 0, prompt).unwrap(), &mut cache)
        .unwrap();
    for t in prompt..=len {
        let want_t = want.narrow(1, t - 1, 1).unwrap().squeeze(1).unwrap();
        at(t, &got, &want_t, &cache);
        if t < len {
            got = model
                .forward_cached(&tokens.narrow(1, t, 1).unwrap(), &mut cache)
                .unwrap();
        }
    }
}

/// MLA's latent cache: a prompt of 5 tokens, then one token at a time; each step's logits are
/// transformers' full-forward logits at that position, and each layer's cache holds the
/// latent `(B, 1, T, kv_lora_rank)` and the shared rotary key `(B, 1, T, r)`, nothing per head.
/// Decode steps attend over the latent (the absorbed form, the default) and, with
/// `decompressed_decode`, through the decompressed keys and values.
#[test]
fn deepseek_decode_from_the_latent_cache() {
    for family in ["deepseek_v2", "deepseek_v3"] {
        for (kernels, decompressed) in [
            (Kernels::Composed, false),
            (Kernels::Fused, false),
            (Kernels::Composed, true),
            (Kernels::Fused, true),
        ] {
            let mut cfg = Config {
                kernels,
                ..config(family)
            };
            if let Some(l) = cfg.llama.as_mut() {
                l.mla.as_mut().unwrap().decompressed_decode = decompressed;
            }
            let mla = cfg.llama.unwrap().mla.unwrap();
            generate(family, &cfg, 5, |t, got, at, cache| {
                let diff = max_diff(got, at) / max_abs(at);
                assert!(
                    diff < 1e-4,
                    "{family} {kernels:?} position {}: {diff}",
                    t - 1
                );
                let (c, k_pe) = cache.layers[0].as_ref().unwrap();
                assert_eq!(c.dims(), &[2, 1, t, mla.kv_lora_rank]);
                assert_eq!(k_pe.dims(), &[2, 1, t, mla.qk_rope_head_dim]);
            });
        }
    }
}

/// Per-layer attention types (`layer_types`: layer 0 full, layer 1 a window of 4): the
/// logits, and generation from a 6-token prompt to 11 where only the sliding layer's cache
/// stops at 4 tokens.
#[test]
fn qwen3_layer_types_full_and_sliding_layers() {
    check("qwen3_layer_types");
    for kernels in [Kernels::Composed, Kernels::Fused] {
        let cfg = Config {
            kernels,
            ..config("qwen3_layer_types")
        };
        let l = cfg.llama.unwrap();
        assert_eq!((l.window_at(0), l.window_at(1)), (None, Some(4)));
        generate("qwen3_layer_types", &cfg, 6, |t, got, at, cache| {
            let diff = max_diff(got, at) / max_abs(at);
            assert!(diff < 1e-4, "{kernels:?} position {}: {diff}", t - 1);
            let held = |i: usize| cache.layers[i].as_ref().unwrap().0.dim(2).unwrap();
            assert_eq!((held(0), held(1)), (t, t.min(4)), "{kernels:?}");
        });
    }
}

/// Gemma 3 (`gemma3_text`): `1 + w` norms, four a block, GeGLU, the embedding times √H, q/k
/// norms, the attention scale `query_pre_attn_scalar^-½` (24, head_dim 16), layer 0 sliding
/// (window 4) with its own rotary base, layer 1 full with the global base under linear
/// scaling, the head tied: logits in every attention, the parameter count, and generation from
/// a 6-token prompt to 11 (the sliding layer's cache stops at 4 tokens, the full layer's grows).
#[test]
fn gemma3_logits_equal_transformers() {
    check("gemma3");
    let cfg = config("gemma3");
    let l = cfg.llama.unwrap();
    let v = l.variant;
    assert!(v.unit_offset_norms && v.sandwich_norms && v.gelu_glu && v.embed_scaled);
    assert!(l.qk_norm && cfg.tied);
    assert_eq!((l.window_at(0), l.window_at(1)), (Some(4), None));
    for attention in ATTENTIONS {
        let cfg = with("gemma3", attention);
        let name = attention.0;
        generate("gemma3", &cfg, 6, |t, got, at, cache| {
            let diff = max_diff(got, at) / max_abs(at);
            assert!(diff < 1e-4, "gemma3 {name} position {}: {diff}", t - 1);
            let held = |i: usize| cache.layers[i].as_ref().unwrap().0.dim(2).unwrap();
            assert_eq!((held(0), held(1)), (t.min(4), t), "gemma3 {name}");
        });
    }
}

/// Each of Gemma 3's differences is seen by the comparison: the same weights without one of
/// them do not give transformers' logits.
#[test]
fn gemma3_without_one_of_its_parts_differs() {
    use memfit::model::shapes::Factor;
    type Change = fn(&mut Config);
    let changes: [(&str, Change); 7] = [
        ("the sliding layers' own rotary base", |c| {
            let v = &mut c.llama.as_mut().unwrap().variant;
            v.local_rope_theta = Some(Factor(c.rope_theta));
        }),
        ("query_pre_attn_scalar", |c| {
            let v = &mut c.llama.as_mut().unwrap().variant;
            v.attention_scale = Some(Factor(16f64.powf(-0.5)));
        }),
        ("the norms' 1 + w", |c| {
            c.llama.as_mut().unwrap().variant.unit_offset_norms = false
        }),
        ("GeGLU", |c| {
            c.llama.as_mut().unwrap().variant.gelu_glu = false
        }),
        ("the embedding's √H", |c| {
            c.llama.as_mut().unwrap().variant.embed_scaled = false
        }),
        ("the rope scaling on the full layer", |c| {
            c.rope_scaling = None
        }),
        ("the window", |c| {
            c.llama.as_mut().unwrap().sliding_window = None
        }),
    ];
    let (tokens, want) = io("gemma3");
    for (what, change) in changes {
        let mut cfg = config("gemma3");
        change(&mut cfg);
        let got = model("gemma3", &cfg).forward(&tokens).unwrap();
        let diff = max_diff(&got, &want) / max_abs(&want);
        assert!(
            diff > 1e-3,
            "gemma3 without {what}: the logits still agree ({diff})"
        );
    }
}

/// gpt-oss: attention sinks (a learned logit per head beside the keys), q/k/v/o biases, layer 0
/// sliding over 4 tokens and layer 1 full, YaRN (not truncated), a biased router (2 of 4
/// experts), biased experts with the clamped SwiGLU (this fixture's gates pass 7 and its ups
/// ±7): the logits with the composed, the fused and transformers' kernels (the sinks' softmax is composed in
/// both), the parameter count, and generation from 6 tokens to 11 (the sliding layer's cache
/// stops at 4). The efficient and tiled attention have no sink and refuse by name; the same
/// weights without gpt-oss's parts give other logits.
#[test]
fn gpt_oss_logits_equal_transformers() {
    for attention in &ATTENTIONS[..3] {
        let e = logits_error("gpt_oss", *attention);
        println!(
            "gpt_oss {}: logits within {e:.2e} of transformers'",
            attention.0
        );
        assert!(e < 1e-4, "gpt_oss {}: logits differ by {e}", attention.0);
        let cfg = with("gpt_oss", *attention);
        generate("gpt_oss", &cfg, 6, |t, got, at, cache| {
            let diff = max_diff(got, at) / max_abs(at);
            assert!(
                diff < 1e-4,
                "gpt_oss {} position {}: {diff}",
                attention.0,
                t - 1
            );
            let held = |i: usize| cache.layers[i].as_ref().unwrap().0.dim(2).unwrap();
            assert_eq!((held(0), held(1)), (t.min(4), t), "gpt_oss {}", attention.0);
        });
    }
    let (tokens, want) = io("gpt_oss");
    for attention in &ATTENTIONS[3..] {
        let cfg = with("gpt_oss", *attention);
        let err = model("gpt_oss", &cfg)
            .forward(&tokens)
            .unwrap_err()
            .to_string();
        assert!(err.contains("sinks"), "{}: {err}", attention.0);
    }
    let v = config("gpt_oss").llama.unwrap().variant;
    assert!(v.attention_sinks && v.router_bias && v.clamped_glu);
    type Change = fn(&mut memfit::model::shapes::Variant);
    let parts: [(&str, Change); 3] = [
        ("the sinks", |v| v.attention_sinks = false),
        ("the router's bias", |v| v.router_bias = false),
        ("the clamped SwiGLU", |v| v.clamped_glu = false),
    ];
    for (what, change) in parts {
        let mut cfg = config("gpt_oss");
        change(&mut cfg.llama.as_mut().unwrap().variant);
        let got = model("gpt_oss", &cfg).forward(&tokens).unwrap();
        let diff = max_diff(&got, &want) / max_abs(&want);
        assert!(
            diff > 1e-3,
            "gpt_oss without {what}: the logits still agree ({diff})"
        );
    }
}

#[test]
fn mistral_sliding_window_logits_equal_transformers() {
    check("mistral");
}

/// Phi-3: transformers' fused `qkv_proj` and `gate_up_proj` rows split into memfit's q, k, v and
/// gate, up (`scripts/make-fixtures.py`), GQA 4:2 and a sliding window of 5 over 11 tokens.
/// SmolLM3: its NoPE layer (layer 1 of the fixture) does not rotate; rotating it too, on the
/// same weights, does not give transformers' logits.
#[test]
fn smollm3_logits_equal_transformers() {
    check("smollm3");
    let mut cfg = config("smollm3");
    cfg.llama.as_mut().unwrap().variant.nope_layers = 0;
    let (tokens, want) = io("smollm3");
    let diff = max_diff(&model("smollm3", &cfg).forward(&tokens).unwrap(), &want);
    assert!(
        diff > 1e-2,
        "smollm3 rotating every layer: the logits still agree ({diff})"
    );
}

/// OLMo 2: its norms after each half only and its q/k norms over the whole projection; with
/// the q/k norms over each head instead (the same weights, reshaped), the logits differ.
#[test]
fn olmo2_logits_equal_transformers() {
    check("olmo2");
    let mut cfg = config("olmo2");
    let l = cfg.llama.as_ref().unwrap();
    assert!(l.variant.post_norms_only && l.variant.qk_norm_whole && l.qk_norm);
    // Without its q/k norms (their weights left unread) the logits differ.
    cfg.llama.as_mut().unwrap().qk_norm = false;
    let (tokens, want) = io("olmo2");
    let vb = unsafe {
        VarBuilder::from_mmaped_safetensors(
            &[fixture("olmo2").join("model.safetensors")],
            DType::F32,
            &Device::Cpu,
        )
    }
    .unwrap();
    let got = Transformer::new(&cfg, vb)
        .unwrap()
        .forward(&tokens)
        .unwrap();
    let diff = max_diff(&got, &want);
    assert!(
        diff > 1e-2,
        "olmo2 without q/k norms: the logits still agree ({diff})"
    );
}

/// GLM-4.5: the rotary over the first half of each head (the rest passed through), q/k/v
/// biases without one on o, per-head q/k norms, DeepSeek-V3's grouped sigmoid router with a
/// shared expert, layer 0 dense; its parameters are the fixture's tensors. Rotating each head
/// whole, on the same weights, gives other logits.
#[test]
fn glm4_moe_logits_equal_transformers() {
    check("glm4_moe");
    let mut cfg = config("glm4_moe");
    assert_eq!(cfg.params(), model_params(&fixture("glm4_moe")));
    let l = cfg.llama.as_mut().unwrap();
    assert!(l.qk_norm && l.qkv_bias && !l.o_bias);
    assert_eq!(l.variant.partial_rotary, Some(8));
    l.variant.partial_rotary = None;
    let (tokens, want) = io("glm4_moe");
    let diff = max_diff(&model("glm4_moe", &cfg).forward(&tokens).unwrap(), &want);
    assert!(
        diff > 1e-2,
        "glm4_moe rotating each head whole: the logits still agree ({diff})"
    );
}

/// Llama 4's text model (`llama4_text`): layers 0 and 2 chunked (4 tokens, the input spans
/// three chunks) with the weightless q/k L2 norm and llama3-scaled rotary, layer 1 NoPE, full
/// and tempered (floor_scale 2, attn_scale 0.5), layers 0 and 1 a mixture of 4 experts, top 1,
/// the sigmoid weight on the expert's input, plus a shared expert, layer 2 dense (48 wide):
/// the logits with every kernel set in the standard attention (the chunk mask composed in
/// each), the efficient and tiled attentions refused by name, the parameter count, and
/// generation from a 6-token prompt to 11 in which a chunked layer's cache holds its current
/// chunk only (`(t − 1) mod 4 + 1` tokens) and the full layer's grows.
#[test]
fn llama4_logits_equal_transformers() {
    for attention in &ATTENTIONS[..3] {
        let e = logits_error("llama4", *attention);
        println!(
            "llama4 {}: logits within {e:.2e} of transformers'",
            attention.0
        );
        assert!(e < 1e-4, "llama4 {}: logits differ by {e}", attention.0);
    }
    let (tokens, _) = io("llama4");
    for attention in &ATTENTIONS[3..] {
        let cfg = with("llama4", *attention);
        let err = model("llama4", &cfg)
            .forward(&tokens)
            .unwrap_err()
            .to_string();
        assert!(err.contains("chunked attention"), "{}: {err}", attention.0);
    }
    let cfg = config("llama4");
    assert_eq!(cfg.params(), model_params(&fixture("llama4")));
    let l = cfg.llama.unwrap();
    let v = l.variant;
    assert!(v.chunked_attention && v.qk_l2_norm && !l.qk_norm);
    assert_eq!(v.nope_layers, 0b010);
    assert!(v.attn_temperature.is_some());
    assert_eq!(
        (l.window_at(0), l.window_at(1), l.window_at(2)),
        (Some(4), None, Some(4))
    );
    let moe = l.moe.unwrap();
    assert!(moe.input_scaled && moe.sparse(0) && moe.sparse(1) && !moe.sparse(2));
    assert_eq!(
        (moe.experts, moe.top_k, moe.shared, moe.dense_width),
        (4, 1, 20, 48)
    );
    for attention in &ATTENTIONS[..3] {
        let cfg = with("llama4", *attention);
        let name = attention.0;
        generate("llama4", &cfg, 6, |t, got, at, cache| {
            let diff = max_diff(got, at) / max_abs(at);
            assert!(diff < 1e-4, "llama4 {name} position {}: {diff}", t - 1);
            let held = |i: usize| cache.layers[i].as_ref().unwrap().0.dim(2).unwrap();
            let chunk = (t - 1) % 4 + 1;
            assert_eq!(
                (held(0), held(1), held(2)),
                (chunk, t, chunk),
                "llama4 {name}"
            );
        });
    }
}

/// Each of Llama 4's parts is seen by the comparison: the same weights without one of them
/// (the chunks, the NoPE layer, the q/k L2 norm, the temperature, the routing weight on the
/// expert's input rather than its output) do not give transformers' logits.
#[test]
fn llama4_without_one_of_its_parts_differs() {
    type Change = fn(&mut Config);
    let changes: [(&str, Change); 5] = [
        ("the chunks", |c| {
            let l = c.llama.as_mut().unwrap();
            (l.sliding_window, l.full_layers, l.variant.chunked_attention) = (None, 0, false);
        }),
        ("the NoPE layer", |c| {
            c.llama.as_mut().unwrap().variant.nope_layers = 0
        }),
        ("the q/k L2 norm", |c| {
            c.llama.as_mut().unwrap().variant.qk_l2_norm = false
        }),
        ("the temperature", |c| {
            c.llama.as_mut().unwrap().variant.attn_temperature = None
        }),
        ("the routing weight on the input", |c| {
            let l = c.llama.as_mut().unwrap();
            l.moe.as_mut().unwrap().input_scaled = false;
        }),
    ];
    let (tokens, want) = io("llama4");
    for (what, change) in changes {
        let mut cfg = config("llama4");
        change(&mut cfg);
        let got = model("llama4", &cfg).forward(&tokens).unwrap();
        let diff = max_diff(&got, &want) / max_abs(&want);
        println!("llama4 without {what}: logits differ by {diff:.2e}");
        assert!(
            diff > 1e-3,
            "llama4 without {what}: the logits still agree ({diff})"
        );
    }
}

/// Qwen3-Next (`qwen3_next`): layers 0 and 2 Gated DeltaNet (2 key heads of 8 repeated to 4
/// value heads of 8, a convolution of 4, the chunked delta rule over one padded chunk), 1 and
/// 3 full attention with the output gate, q/k norms and a quarter of each head rotated; the
/// zero-centred norms; a mixture of 4 experts, top 2, with a gated shared expert on layers 0 to
/// 2, layer 3 dense: the logits in every kernel set and attention (the full layers' efficient
/// and tiled attentions; the linear layers have none), the parameter count, and generation
/// from a 6-token prompt to 11 in which each linear layer's state stays the same size (its
/// convolution's last 4 inputs, its recurrent state) while the full layers' caches grow.
#[test]
fn qwen3_next_logits_equal_transformers() {
    check("qwen3_next");
    let cfg = config("qwen3_next");
    assert_eq!(cfg.params(), model_params(&fixture("qwen3_next")));
    let l = cfg.llama.unwrap();
    let v = l.variant;
    assert!(v.unit_offset_norms && v.attn_output_gate && l.qk_norm);
    assert_eq!(v.partial_rotary, Some(4));
    let g = v.gated_delta.unwrap();
    assert_eq!(
        (
            g.key_heads,
            g.value_heads,
            g.key_dim,
            g.value_dim,
            g.conv_kernel,
            g.layers
        ),
        (2, 4, 8, 8, 4, 0b0101)
    );
    let moe = l.moe.unwrap();
    assert!(moe.shared_gate && moe.norm_topk && moe.sparse(2) && !moe.sparse(3));
    assert_eq!(
        (moe.experts, moe.top_k, moe.shared, moe.dense_width),
        (4, 2, 24, 48)
    );
    for attention in ATTENTIONS {
        let cfg = with("qwen3_next", attention);
        let name = attention.0;
        generate("qwen3_next", &cfg, 6, |t, got, at, cache| {
            let diff = max_diff(got, at) / max_abs(at);
            assert!(diff < 1e-4, "qwen3_next {name} position {}: {diff}", t - 1);
            let dims = |i: usize| {
                let (a, b) = cache.layers[i].as_ref().unwrap();
                (a.dims().to_vec(), b.dims().to_vec())
            };
            for i in [0, 2] {
                assert_eq!(dims(i), (vec![2, 4, 64], vec![2, 4, 8, 8]), "{name}");
            }
            for i in [1, 3] {
                assert_eq!(dims(i).0, vec![2, 2, t, 16], "qwen3_next {name}");
            }
        });
    }
}

/// Qwen3-Next's chunked delta rule across chunks: on the fixture's weights, 150 tokens (three
/// chunks of 64, the last padded) through the training forward give at every position the
/// logits of a 1-token prompt decoded one token at a time (the recurrent step on the state
/// the previous token left), so the state carried from chunk to chunk is the recurrence's.
#[test]
fn qwen3_next_chunks_equal_the_recurrence() {
    let cfg = Config {
        max_seq: 160,
        ..config("qwen3_next")
    };
    let (tokens, _) =
        memfit::model::transformer::synthetic_batch(1, 150, cfg.vocab, &Device::Cpu).unwrap();
    let model = model("qwen3_next", &cfg);
    let whole = model.forward(&tokens).unwrap();
    let mut cache = memfit::model::transformer::KvCache::default();
    let mut worst = 0f32;
    for t in 0..150 {
        let got = model
            .forward_cached(&tokens.narrow(1, t, 1).unwrap(), &mut cache)
            .unwrap();
        let want = whole.narrow(1, t, 1).unwrap().squeeze(1).unwrap();
        worst = worst.max(max_diff(&got, &want) / max_abs(&want));
    }
    println!("qwen3_next: 150 tokens chunked against recurrent, within {worst:.2e}");
    assert!(
        worst < 1e-4,
        "qwen3_next: chunked and recurrent differ by {worst}"
    );
}

/// Each of Qwen3-Next's parts is seen by the comparison: the same weights without one of them
/// (the output gate's sigmoid is replaced by nothing only by changing the model, so: the
/// zero-centred norms, the partial rotary, the linear layers as full attention) do not give
/// transformers' logits.
#[test]
fn qwen3_next_without_one_of_its_parts_differs() {
    type Change = fn(&mut Config);
    let changes: [(&str, Change); 2] = [
        ("the zero-centred norms", |c| {
            c.llama.as_mut().unwrap().variant.unit_offset_norms = false
        }),
        ("the partial rotary", |c| {
            c.llama.as_mut().unwrap().variant.partial_rotary = Some(8)
        }),
    ];
    let (tokens, want) = io("qwen3_next");
    for (what, change) in changes {
        let mut cfg = config("qwen3_next");
        change(&mut cfg);
        let got = model("qwen3_next", &cfg).forward(&tokens).unwrap();
        let diff = max_diff(&got, &want) / max_abs(&want);
        println!("qwen3_next without {what}: logits differ by {diff:.2e}");
        assert!(
            diff > 1e-3,
            "qwen3_next without {what}: the logits still agree ({diff})"
        );
    }
}

/// Gemma 2: Gemma 3's block without q/k norms, layer 0 sliding and layer 1 full, and its
/// soft-capped attention scores and logits (at 1.5 and 2, where they bite on these weights),
/// in the standard attention with every kernel set (the capped scores composed in each); the
/// efficient and tiled attentions refuse by name. Without either cap, on the same weights, the
/// logits differ.
#[test]
fn gemma2_logits_equal_transformers() {
    for attention in &ATTENTIONS[..3] {
        let e = logits_error("gemma2", *attention);
        println!(
            "gemma2 {}: logits within {e:.2e} of transformers'",
            attention.0
        );
        assert!(e < 1e-4, "gemma2 {}: logits differ by {e}", attention.0);
    }
    let (tokens, want) = io("gemma2");
    for attention in &ATTENTIONS[3..] {
        let cfg = with("gemma2", *attention);
        let err = model("gemma2", &cfg)
            .forward(&tokens)
            .unwrap_err()
            .to_string();
        assert!(err.contains("soft-capping"), "{}: {err}", attention.0);
    }
    let cfg = config("gemma2");
    assert_eq!(cfg.params(), model_params(&fixture("gemma2")));
    type Change = fn(&mut memfit::model::shapes::Variant);
    let changes: [(&str, Change); 2] = [
        ("the attention's cap", |v| v.attn_softcap = None),
        ("the logits' cap", |v| v.final_softcap = None),
    ];
    for (what, change) in changes {
        let mut cfg = config("gemma2");
        change(&mut cfg.llama.as_mut().unwrap().variant);
        let got = model("gemma2", &cfg).forward(&tokens).unwrap();
        let diff = max_diff(&got, &want) / max_abs(&want);
        assert!(
            diff > 1e-3,
            "gemma2 without {what}: the logits still agree ({diff})"
        );
    }
}

/// Phi-4-mini's Phi-3: the rotary over the first `int(0.75 · 8)` = 6 of each head, the rest
/// passed through, the head tied; rotating each head whole gives other logits.
#[test]
fn phi3_partial_rotary_logits_equal_transformers() {
    check("phi3_partial");
    let mut cfg = config("phi3_partial");
    let l = cfg.llama.as_mut().unwrap();
    assert_eq!(l.variant.partial_rotary, Some(6));
    l.variant.partial_rotary = None;
    let (tokens, want) = io("phi3_partial");
    let diff = max_diff(
        &model("phi3_partial", &cfg).forward(&tokens).unwrap(),
        &want,
    );
    assert!(
        diff > 1e-2,
        "phi3_partial rotating each head whole: the logits still agree ({diff})"
    );
}

#[test]
fn phi3_logits_equal_transformers() {
    check("phi3");
}

/// Phi-3's window applies in generation too: a prompt of 7 tokens, then one token at a time to
/// 11, each step's logits transformers' at that position; the cache holds the last 5.
#[test]
fn phi3_decode_across_the_window() {
    decode_across_the_window("phi3", 7, 5);
}

/// `family`'s generation from a prompt of `prompt` tokens to the fixture's 11 with every
/// attention: each step's logits transformers' full-forward logits at that position, the cache
/// never above the window `w`.
fn decode_across_the_window(family: &str, prompt: usize, w: usize) {
    for attention in ATTENTIONS {
        let cfg = with(family, attention);
        let name = attention.0;
        generate(family, &cfg, prompt, |t, got, at, cache| {
            let diff = max_diff(got, at);
            assert!(diff < 1e-4, "{family} {name} position {}: {diff}", t - 1);
            let held = cache.layers[0].as_ref().unwrap().0.dim(2).unwrap();
            assert_eq!(
                held,
                t.min(w),
                "{family} {name}: the cache holds the last W tokens"
            );
        });
    }
}

/// Generation across the window: a prompt of 6 tokens (longer than the window of 4: it
/// attends under the windowed mask, the cache keeps its last 4), then one token at a time to
/// 11; each step's logits are transformers' full-forward logits at that
/// position, with the composed and the fused kernels; the cache never holds more than 4.
#[test]
fn mistral_decode_rolls_its_cache_across_the_window() {
    decode_across_the_window("mistral", 6, 4);
}

/// Rope scaling as transformers computes its angles: Llama 3.1's `llama3` (a smoothed band,
/// the rest divided), Qwen3 under YaRN (a ramp between interpolation and extrapolation, cos and
/// sin times its attention factor), DeepSeek-V3's YaRN (its attention scale times `mscale²`)
/// and Phi-3's LongRoPE (per-frequency factors, an attention factor): the logits equal
/// transformers' in every attention, and the same weights with the default angles do not.
#[test]
fn rope_scaling_logits_equal_transformers() {
    for family in [
        "llama_rope_llama3",
        "qwen3_yarn",
        "deepseek_v3_yarn",
        "phi3_longrope",
    ] {
        assert!(config(family).rope_scaling.is_some(), "{family}");
        check(family);
        let cfg = Config {
            rope_scaling: None,
            ..config(family)
        };
        let (tokens, want) = io(family);
        let got = model(family, &cfg).forward(&tokens).unwrap();
        let diff = max_diff(&got, &want) / max_abs(&want);
        assert!(
            diff > 1e-3,
            "{family} without its rope scaling: the logits still agree ({diff})"
        );
    }
}

/// transformers' gradients (`grads.safetensors`): the targets `(B, S)` (u32) and, by memfit's
/// names, every parameter's gradient of the mean cross-entropy (computed in f64, stored as f32,
/// compared in f64; an expert no token chose has a zero one).
fn reference_gradients(family: &str) -> (Tensor, HashMap<String, Tensor>) {
    let mut g =
        candle_core::safetensors::load(fixture(family).join("grads.safetensors"), &Device::Cpu)
            .unwrap();
    let targets = g
        .remove("targets")
        .expect("the fixture's targets")
        .to_dtype(DType::U32)
        .unwrap();
    let g = g
        .into_iter()
        .map(|(k, v)| (k, v.to_dtype(DType::F64).unwrap()))
        .collect();
    (targets, g)
}

/// memfit's gradients of the mean cross-entropy of `targets` under `cfg`, in f32 on the
/// fixture's weights (every one a variable) and tokens, by the whole backward (`training_loss`,
/// then `backward`) or block by block (`phase::by_block`), by name: every parameter of the
/// model, `None` where no gradient reached it (an expert no token chose).
fn memfit_gradients(
    family: &str,
    cfg: &Config,
    targets: &Tensor,
    by_block: bool,
) -> HashMap<String, Option<Tensor>> {
    let varmap = VarMap::new();
    let model = Transformer::new(
        cfg,
        VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
    )
    .unwrap();
    let weights =
        candle_core::safetensors::load(fixture(family).join("model.safetensors"), &Device::Cpu)
            .unwrap();
    let data = varmap.data().lock().unwrap();
    for (name, var) in data.iter() {
        let w = weights
            .get(name)
            .unwrap_or_else(|| panic!("{family}: memfit's {name} is not in the fixture"));
        var.set(w).unwrap();
    }
    let (tokens, _) = io(family);
    let grads = if by_block {
        let vars: Vec<_> = data.values().cloned().collect();
        let fwd = by_block::forward(&model, None, &tokens, targets).unwrap();
        by_block::backward(&vars, fwd).unwrap()
    } else {
        model
            .training_loss(&tokens, targets, None)
            .and_then(|loss| loss.backward())
            .unwrap()
    };
    data.iter()
        .map(|(name, var)| (name.clone(), grads.get(var.as_tensor()).cloned()))
        .collect()
}

/// `max |t|` in f64.
fn max_abs_f64(t: &Tensor) -> f64 {
    t.abs()
        .and_then(|t| t.max_all())
        .and_then(|t| t.to_dtype(DType::F64))
        .and_then(|t| t.to_scalar::<f64>())
        .unwrap()
}

/// How far a gradient may be from transformers', relative to the reference's largest element:
/// memfit's f32 gradients come within 1e-5 of the f64 reference, a wrong one (a router's
/// renormalisation detached) misses it by 1e-1 and more.
const GRADIENT_TOLERANCE: f64 = 1e-4;
/// How far, absolutely, where the reference is all zeros: the experts no token chose (three of
/// GLM-4.5's fixture's eight in layer 1, two of Qwen2-MoE's four), whose gradient memfit must
/// leave at zero too.
const ZERO_GRADIENT: f64 = 1e-7;

/// The pad token (`pad_token_id` in the fixture's `config.json`) where the input holds it.
/// transformers' embedding (`nn.Embedding(.., padding_idx=pad_token_id)`) gives its row no
/// gradient from the input; memfit's embedding has no padding index and gives that row the
/// gradient of its uses, as for any token.
fn pad_in_input(family: &str) -> Option<u32> {
    let text = std::fs::read_to_string(fixture(family).join("config.json")).unwrap();
    let conf: serde_json::Value = serde_json::from_str(&text).unwrap();
    let pad = u32::try_from(conf["pad_token_id"].as_u64()?).unwrap();
    let (tokens, _) = io(family);
    let tokens = tokens.flatten_all().unwrap().to_vec1::<u32>().unwrap();
    tokens.contains(&pad).then_some(pad)
}

/// `t` without row `row`.
fn without_row(t: &Tensor, row: u32) -> Tensor {
    let keep: Vec<u32> = (0..t.dim(0).unwrap() as u32)
        .filter(|&r| r != row)
        .collect();
    let keep = Tensor::new(keep, t.device()).unwrap();
    t.index_select(&keep, 0).unwrap()
}

/// memfit's f32 gradients against transformers' f64 ones (`grads.safetensors`) for every
/// attention of [`ATTENTIONS`] the family builds (gpt-oss and Gemma 2: the standard one with
/// each kernel set; the others refuse by name) and both backwards, whole and by block: the
/// same parameters, of the same shapes, and each gradient within [`GRADIENT_TOLERANCE`] of
/// the reference's largest element. Prints the worst tensor of each combination. Where the
/// input holds the pad token ([`pad_in_input`]: Phi-4-mini's fixture), the token table's row
/// for it differs by design and is printed, not checked; the rest of the table is.
fn gradients_equal_transformers(family: &str) {
    let (targets, want) = reference_gradients(family);
    let pad = pad_in_input(family);
    if let Some(p) = pad {
        let table = &want["wte.weight"];
        let row = table.get(p as usize).unwrap();
        println!(
            "{family}: the pad token {p} is in the input; transformers' gradient of its row \
             (largest {:.3e}, the whole table's {:.3e}) is not compared",
            max_abs_f64(&row),
            max_abs_f64(table)
        );
    }
    let mut want_names: Vec<&String> = want.keys().collect();
    want_names.sort();
    let standard_only = config(family)
        .llama
        .and_then(|l| l.standard_attention_only())
        .is_some();
    let (mut failures, mut rows, mut pad_rows) = (Vec::new(), Vec::new(), Vec::new());
    for attention in ATTENTIONS {
        let cfg = with(family, attention);
        if standard_only && (cfg.efficient_attention || cfg.tiled_attention) {
            continue;
        }
        for by_block in [false, true] {
            let backward = if by_block { "by-block" } else { "whole" };
            let case = format!("{family} {} {backward}", attention.0);
            let got = memfit_gradients(family, &cfg, &targets, by_block);
            let mut got_names: Vec<&String> = got.keys().collect();
            got_names.sort();
            assert_eq!(
                got_names, want_names,
                "{case}: memfit's parameters are transformers'"
            );
            // The worst tensor: (relative difference, name, difference, reference's largest).
            let (mut worst, mut bad) = ((0f64, "", 0f64, 0f64), 0);
            for (name, reference) in &want {
                let mut g = match &got[name] {
                    Some(g) => {
                        assert_eq!(g.dims(), reference.dims(), "{case} {name}");
                        g.to_dtype(DType::F64).unwrap()
                    }
                    None => reference.zeros_like().unwrap(),
                };
                let mut reference = reference.clone();
                if let (Some(p), "wte.weight") = (pad, name.as_str()) {
                    let d = max_abs_f64(
                        &(g.get(p as usize).unwrap() - reference.get(p as usize).unwrap()).unwrap(),
                    );
                    pad_rows.push(format!("{} {backward} {d:.3e}", attention.0));
                    (g, reference) = (without_row(&g, p), without_row(&reference, p));
                }
                let d = max_abs_f64(&(&g - &reference).unwrap());
                let m = max_abs_f64(&reference);
                let (r, passes) = if m > 0.0 {
                    (d / m, d <= GRADIENT_TOLERANCE * m)
                } else {
                    (d, d <= ZERO_GRADIENT)
                };
                let r = if r.is_nan() { f64::INFINITY } else { r };
                bad += usize::from(!passes);
                if r >= worst.0 {
                    worst = (r, name.as_str(), d, m);
                }
            }
            let (r, name, d, m) = worst;
            if bad > 0 {
                failures.push(format!(
                    "{case}: {bad} of {} gradients differ by more than {GRADIENT_TOLERANCE:e} of \
                     their largest element; the most {name}, by {d:.3e} of {m:.3e} ({r:.2e})",
                    want.len()
                ));
            }
            rows.push(format!("{} {backward} {r:.1e} ({name})", attention.0));
        }
    }
    println!(
        "{family} gradients against transformers': {}",
        rows.join("; ")
    );
    if !pad_rows.is_empty() {
        println!(
            "{family}: the pad token's row of the token table differs by {}",
            pad_rows.join("; ")
        );
    }
    assert!(
        failures.is_empty(),
        "{family}: gradients differ from transformers':\n{}",
        failures.join("\n")
    );
}

/// One gradient test per fixture family (`gradients::<family>`), and the list of them.
macro_rules! gradient_tests {
    ($($family:ident),* $(,)?) => {
        const GRADIENT_FAMILIES: &[&str] = &[$(stringify!($family)),*];
        mod gradients {
            $(
                #[test]
                fn $family() {
                    super::gradients_equal_transformers(stringify!($family));
                }
            )*
        }
    };
}

gradient_tests!(
    llama,
    llama_rope_llama3,
    mistral,
    phi3,
    phi3_longrope,
    phi3_partial,
    qwen3,
    qwen3_yarn,
    qwen3_layer_types,
    gemma2,
    gemma3,
    smollm3,
    olmo2,
    mixtral,
    qwen2_moe,
    qwen3_moe,
    qwen3_moe_dense,
    deepseek_v2,
    deepseek_v3,
    deepseek_v3_yarn,
    glm4_moe,
    gpt_oss,
    llama4,
    qwen3_next,
);

/// Every fixture in `tests/fixtures` has its gradient test.
#[test]
fn every_fixture_has_a_gradient_test() {
    let mut dirs: Vec<String> = std::fs::read_dir(fixture(""))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    dirs.sort();
    let mut tested = GRADIENT_FAMILIES.to_vec();
    tested.sort();
    assert_eq!(dirs, tested);
}
