//! Hugging Face `config.json` input: the shipped presets have their published parameter
//! counts, flags override fields, and every field memfit cannot honour is an error naming the
//! file and the field.

mod common;

use common::memfit;
use memfit::model::hf_config;
use memfit::model::llama;
use memfit::model::transformer::Config;
use predicates::str::contains;

/// Published parameter counts: Llama-2-7B, Llama-3-8B and Mistral-7B as in the issue (the
/// models' cards / `model.num_parameters()`); Llama-2-70B 68,976,648,192, Llama-3.2-1B
/// 1,235,814,400, Qwen2-0.5B 494,032,768, TinyLlama-1.1B 1,100,048,384 and SmolLM2-135M
/// 134,515,008 are transformers' `num_parameters()` of the same configs (tied embeddings
/// counted once); Qwen3-8B 8,190,735,360 (q/k norms included; the arithmetic is in its
/// config's `_memfit` note); Qwen3-30B-A3B 30,532,122,624 and Mixtral-8x7B 46,702,792,704
/// (every expert counted; the active counts in `active_params_are_the_routed_share`);
/// DeepSeek-V2-Lite 15,706,484,224 (transformers' `DeepseekV2ForCausalLM` of the same config
/// on the meta device; its card's "15.7B"); Phi-3-mini 3,821,079,552 (transformers 4.57.1's
/// `Phi3ForCausalLM` of the shipped config on the meta device; its card's "3.8B").
#[test]
fn presets_have_the_published_parameter_counts() {
    for (name, want) in [
        ("llama-2-7b", 6_738_415_616u64),
        ("llama-2-70b", 68_976_648_192),
        ("llama-3-8b", 8_030_261_248),
        ("llama-3.2-1b", 1_235_814_400),
        ("mistral-7b", 7_241_732_096),
        ("phi-3-mini", 3_821_079_552),
        ("qwen2-0.5b", 494_032_768),
        ("qwen3-8b", 8_190_735_360),
        ("qwen3-30b-a3b", 30_532_122_624),
        ("mixtral-8x7b", 46_702_792_704),
        ("deepseek-v2-lite", 15_706_484_224),
        ("tinyllama-1.1b", 1_100_048_384),
        ("smollm2-135m", 134_515_008),
        ("gemma-3-1b", 999_885_952),
        ("gemma-3-27b", 27_009_346_304),
        ("gpt-oss-20b", 20_914_757_184),
        // transformers' Llama4TextConfig() and Qwen3NextConfig() (Scout's text model and
        // Qwen3-Next-80B-A3B), counted on the meta device.
        ("llama-4-scout-17b-16e", 107_769_861_120),
        ("qwen3-next-80b-a3b", 79_674_391_296),
        // transformers' Gemma2Config() and SmolLM3Config() (Gemma-2-2B's and SmolLM3-3B's
        // shapes), counted on the meta device.
        ("gemma-2-2b", 2_614_341_888),
        ("smollm3-3b", 3_075_098_624),
    ] {
        let cfg = Config::preset(name).unwrap_or_else(|| panic!("{name} is a preset"));
        assert_eq!(cfg.params(), want, "{name}");
        // The formula module's count is the model's.
        let shape = memfit::formula::transformer::Shape {
            llama: cfg.llama,
            tied: cfg.tied,
            ..memfit::formula::transformer::Shape::new(
                1,
                1,
                cfg.hidden as u64,
                cfg.heads as u64,
                cfg.layers as u64,
                cfg.vocab as u64,
                cfg.max_seq as u64,
            )
        };
        assert_eq!(shape.params(), want, "{name} (formula)");
    }
    assert!(llama::presets().iter().all(|p| Config::preset(p).is_some()));
}

/// Every preset that names a published model has its parameter count: GPT-2 small and medium
/// (tied heads: transformers' `num_parameters()` of `gpt2`, `gpt2-medium`), ViT-S/16, B/16 and
/// L/16 at 224 px with 1000 classes (timm's `vit_*_patch16_224` counts); the LLaMA family's in
/// `presets_have_the_published_parameter_counts`. `llama-7b-shape` names a shape, not a model
/// (LLaMA-7B's sizes in GPT-2's layers; `llama-2-7b` is LLaMA): its count is its own. The
/// test-sized ones (tiny, small, vit-tiny, llama-tiny) name none. A new preset must be listed.
#[test]
fn every_preset_is_what_it_is_called() {
    let published = [
        ("gpt2-small", 124_439_808u64),
        ("gpt2-medium", 354_823_168),
        ("vit-s16", 22_050_664),
        ("vit-b16", 86_567_656),
        ("vit-l16", 304_326_632),
        // V·H (tokens) + S·H (positions) + 2H + V·H (the untied head) + 32 blocks of 12H² + 13H.
        ("llama-7b-shape", 6_723_084_288),
    ];
    let test_sized = ["tiny", "small", "vit-tiny", "llama-tiny"];
    for name in memfit::model::config::PRESETS
        .iter()
        .chain(memfit::model::vit::PRESETS)
    {
        let cfg = Config::preset(name).unwrap();
        match published.iter().find(|(n, _)| n == name) {
            Some((_, want)) => assert_eq!(cfg.params(), *want, "{name}"),
            None => assert!(test_sized.contains(name), "{name}: no published count"),
        }
    }
    // GPT-2's heads are tied, as in its config.json.
    assert!(Config::preset("gpt2-small").unwrap().tied);
    let gpt2 = r#"{"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12,
        "vocab_size": 50257, "n_positions": 1024, "activation_function": "gelu_new"}"#;
    assert_eq!(
        hf_config::parse(gpt2, "gpt2.json").unwrap().cfg,
        Config::preset("gpt2-small").unwrap()
    );
}

/// Active parameters per token: the router and `k` experts of each layer (Qwen3-30B-A3B's
/// card: 3.3B of 30.5B), the whole model for a dense one.
#[test]
fn active_params_are_the_routed_share() {
    for (name, want) in [
        ("qwen3-30b-a3b", 3_353_032_704u64),
        ("mixtral-8x7b", 12_879_925_248),
        // 26 sparse layers × 58 idle experts × 3·2048·1408 fewer (its card's "2.4B" leaves
        // out the 209,715,200 of the token table).
        ("deepseek-v2-lite", 2_661_150_208),
        ("llama-3-8b", 8_030_261_248),
    ] {
        assert_eq!(
            Config::preset(name).unwrap().active_params(),
            want,
            "{name}"
        );
    }
}

#[test]
fn gpt2_and_vit_configs_map_onto_the_existing_families() {
    let gpt2 = r#"{"model_type": "gpt2", "n_embd": 768, "n_head": 12, "n_layer": 12,
        "vocab_size": 50257, "n_positions": 1024, "activation_function": "gelu_new",
        "n_inner": null}"#;
    let hf = hf_config::parse(gpt2, "gpt2.json").unwrap();
    assert_eq!(hf.kind, memfit::model::ModelKind::Gpt);
    // GPT-2 ties its head: 124,439,808 parameters (transformers' num_parameters()).
    assert_eq!(hf.cfg.params(), 124_439_808);
    let vit = r#"{"model_type": "vit", "hidden_size": 768, "num_hidden_layers": 12,
        "num_attention_heads": 12, "intermediate_size": 3072, "image_size": 224,
        "patch_size": 16, "num_channels": 3, "num_labels": 1000, "hidden_act": "gelu"}"#;
    let hf = hf_config::parse(vit, "vit.json").unwrap();
    assert_eq!(hf.kind, memfit::model::ModelKind::Vit);
    let b16 = Config::preset("vit-b16").unwrap();
    assert_eq!(hf.cfg.vision, b16.vision);
    assert_eq!(hf.cfg.params(), b16.params());
    assert_eq!(hf.cfg.params(), 86_567_656);
}

/// Each refusal names the file and the field.
#[test]
fn errors_name_the_file_and_the_field() {
    let base = r#""hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 100, "max_position_embeddings": 128"#;
    for (body, field) in [
        (
            format!(r#"{{"model_type": "mamba", {base}}}"#),
            "model_type",
        ),
        (
            format!(r#"{{"model_type": "llama", {base}, "num_key_value_heads": 3}}"#),
            "num_key_value_heads",
        ),
        (
            r#"{"model_type": "llama", "hidden_size": 64}"#.to_string(),
            "intermediate_size",
        ),
        (
            format!(r#"{{"model_type": "llama", {base}, "rope_theta": "big"}}"#),
            "rope_theta",
        ),
        (
            format!(r#"{{"model_type": "mistral", {base}, "num_local_experts": 8}}"#),
            "num_local_experts",
        ),
        (
            format!(r#"{{"model_type": "llama", {base}, "hidden_act": "gelu"}}"#),
            "hidden_act",
        ),
        (
            r#"{"model_type": "llama", "hidden_size": "64"}"#.to_string(),
            "hidden_size",
        ),
        (
            format!(r#"{{"model_type": "gpt_oss", {base}, "output_router_logits": true}}"#),
            "output_router_logits",
        ),
        (
            format!(
                r#"{{"model_type": "qwen3", {base}, "sliding_window": 8,
                "layer_types": ["sliding_attention", "full_attention"]}}"#
            ),
            "layer_types",
        ),
        (
            format!(r#"{{"model_type": "llama", {base}, "rope_scaling": {{"rope_type": "ntk"}}}}"#),
            "rope_scaling",
        ),
        (
            format!(
                r#"{{"model_type": "mixtral", {base}, "num_local_experts": 4,
                "num_experts_per_tok": 2, "output_router_logits": true}}"#
            ),
            "output_router_logits",
        ),
        (
            format!(
                r#"{{"model_type": "deepseek_v2", {base}, "kv_lora_rank": 16,
                "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
                "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                "topk_method": "noaux_tc"}}"#
            ),
            "topk_method",
        ),
        (
            format!(
                r#"{{"model_type": "deepseek_v3", {base}, "kv_lora_rank": 16,
                "qk_nope_head_dim": 8, "qk_rope_head_dim": 3, "v_head_dim": 8}}"#
            ),
            "qk_rope_head_dim",
        ),
        (
            // A partial rotary whose width is odd (int(16 · 0.7) = 11).
            format!(r#"{{"model_type": "phi3", {base}, "partial_rotary_factor": 0.7}}"#),
            "partial_rotary_factor",
        ),
        (
            format!(r#"{{"model_type": "phi3", {base}, "resid_pdrop": 0.1}}"#),
            "resid_pdrop",
        ),
        (
            format!(r#"{{"model_type": "llama", {base}, "attention_dropout": 0.1}}"#),
            "attention_dropout",
        ),
        (
            format!(r#"{{"model_type": "gemma3", "text_config": {{{base}}}}}"#),
            "model_type",
        ),
        (
            format!(r#"{{"model_type": "gemma3_text", {base}, "hidden_activation": "silu"}}"#),
            "hidden_activation",
        ),
        (
            format!(r#"{{"model_type": "gemma3_text", {base}, "final_logit_softcapping": 30.0}}"#),
            "final_logit_softcapping",
        ),
        (
            format!(r#"{{"model_type": "gemma3_text", {base}, "attn_logit_softcapping": 50.0}}"#),
            "attn_logit_softcapping",
        ),
        (
            format!(
                r#"{{"model_type": "gemma3_text", {base}, "use_bidirectional_attention": true}}"#
            ),
            "use_bidirectional_attention",
        ),
    ] {
        let err = hf_config::parse(&body, "cfg.json").unwrap_err().to_string();
        assert!(err.starts_with("cfg.json"), "{err}");
        assert!(err.contains(&format!("`{field}`")), "{field}: {err}");
    }
}

/// `memfit predict --json ARGS`: the first case's object.
fn predict_json(args: &[&str]) -> serde_json::Value {
    let out = memfit()
        .arg("predict")
        .arg("--json")
        .args(args)
        .assert()
        .success();
    let line = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    serde_json::from_str(line.lines().next().unwrap()).unwrap()
}

/// `memfit predict --json` of `args`: each phase's predicted peak.
fn phase_peaks(args: &[&str]) -> std::collections::HashMap<String, u64> {
    predict_json(args)["phase_peak_bytes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_str().unwrap().to_string(), p[1].as_u64().unwrap()))
        .collect()
}

/// A sliding window applies in every attention, whatever the config's source: Mistral-7B's
/// window of 4096 passed at S 8192 from its file and from the preset, and in the tiled
/// attention (what `efficient` runs on CUDA) a window makes a tile read fewer keys, so the
/// predicted train step and prefill of a config with a window of 128 at S 2048 sit below the
/// same config's without one (the efficient CPU op keeps its output only: its train step is
/// equal, its prefill lower by the cache, which keeps the last 128 tokens only).
#[test]
fn a_sliding_window_applies_in_every_attention() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mistral.json");
    std::fs::write(&path, llama::preset_json("mistral-7b").unwrap()).unwrap();
    for attention in ["standard", "efficient", "tiled"] {
        memfit()
            .args(["predict", "--hf-config"])
            .arg(&path)
            .args([
                "--seq",
                "8192",
                "--phases",
                "init",
                "--attention",
                attention,
            ])
            .assert()
            .success();
        memfit()
            .args(["predict", "--preset", "mistral-7b", "--seq", "8192"])
            .args(["--phases", "init", "--attention", attention])
            .assert()
            .success();
    }
    let (windowed, full) = (dir.path().join("w.json"), dir.path().join("full.json"));
    std::fs::write(&windowed, common::windowed_json("128", 4096)).unwrap();
    std::fs::write(&full, common::windowed_json("null", 4096)).unwrap();
    for (attention, device) in [
        ("tiled", "cpu"),
        ("efficient", "cuda:0"),
        ("efficient", "cpu"),
    ] {
        let peaks = |p: &std::path::Path| {
            phase_peaks(&[
                "--hf-config",
                p.to_str().unwrap(),
                "--seq",
                "2048",
                "--attention",
                attention,
                "--device",
                device,
                "--phases",
                "train-step,prefill",
            ])
        };
        let (w, f) = (peaks(&windowed), peaks(&full));
        for phase in ["train-step", "prefill"] {
            let (w, f) = (w[phase], f[phase]);
            println!("{attention} on {device} {phase}: window {w} B, none {f} B");
            if device == "cpu" && attention == "efficient" && phase == "train-step" {
                assert_eq!(w, f, "{phase}");
            } else {
                assert!(w < f, "{attention} on {device} {phase}: {w} vs {f}");
            }
        }
    }
}

/// A two-block slice of Llama-2-7B from its config file: the flags override the file.
#[test]
fn flags_override_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("llama-2-7b.json");
    std::fs::write(&path, llama::preset_json("llama-2-7b").unwrap()).unwrap();
    let out = memfit()
        .args([
            "predict",
            "--json",
            "--layers",
            "2",
            "--seq",
            "16",
            "--hf-config",
        ])
        .arg(&path)
        .args(["--phases", "init"])
        .assert()
        .success();
    let text = String::from_utf8(out.get_output().stdout.clone()).unwrap();
    let v: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    // 2·V·H + 2 blocks of 202,383,360 + the final norm.
    assert_eq!(v["params"], 2 * 32000 * 4096 + 2 * 202_383_360 + 4096);
    assert_eq!(v["model"], "llama");
    // A missing file is an error naming it.
    memfit()
        .args(["predict", "--hf-config", "no/such/config.json"])
        .assert()
        .failure()
        .stderr(contains("no/such/config.json"));
}

/// A `quantization_config` memfit does not hold as shipped is refused, never ignored: the error
/// names the file, the field and the method (MXFP4, GPTQ, an unknown one), and says how to size
/// the unquantized model instead (`--hf-set quantization_config=null`), which then gives the same
/// model as a config without the field.
#[test]
fn a_quantization_config_is_refused_by_name() {
    let base: serde_json::Value =
        serde_json::from_str(llama::preset_json("llama-3-8b").unwrap()).unwrap();
    let with = |q: serde_json::Value| {
        let mut c = base.clone();
        c["quantization_config"] = q;
        c.to_string()
    };
    for (q, named) in [
        (
            serde_json::json!({"quant_method": "mxfp4"}),
            "`mxfp4` (MXFP4",
        ),
        (
            serde_json::json!({"quant_method": "gptq", "bits": 4}),
            "`gptq` (4-bit integer",
        ),
        (serde_json::json!({"quant_method": "hqq"}), "`hqq`"),
        (serde_json::json!({"bits": 4}), "(no quant_method)"),
    ] {
        let err = hf_config::parse(&with(q), "q.json")
            .unwrap_err()
            .to_string();
        assert!(err.contains("q.json"), "{err}");
        assert!(err.contains("quantization_config"), "{err}");
        assert!(err.contains(named), "{err}");
        assert!(err.contains("--hf-set quantization_config=null"), "{err}");
    }
    let text = with(serde_json::json!({"quant_method": "mxfp4"}));
    let set = hf_config::parse_with(&text, "q.json", &["quantization_config=null".into()]).unwrap();
    let plain = hf_config::parse(&base.to_string(), "plain.json").unwrap();
    assert_eq!(set.cfg, plain.cfg);
    assert_eq!(set.shipped, None);
}

/// `quant_method: fp8` is read as shipped (DeepSeek-V3's and the `*-FP8` checkpoints' e4m3 with
/// 128×128 block scales): the model's sizes unchanged, its projections held in FP8; a block
/// size, format or activation scheme memfit does not hold is refused by its key, as is keeping a
/// block projection dense; `modules_to_not_convert` naming parts memfit keeps dense is read;
/// `dequantize: true` asks for the dense model.
#[test]
fn an_fp8_quantization_config_is_read_as_shipped() {
    use hf_config::Shipped;
    let base: serde_json::Value =
        serde_json::from_str(llama::preset_json("llama-3-8b").unwrap()).unwrap();
    let parse = |q: serde_json::Value| {
        let mut c = base.clone();
        c["quantization_config"] = q;
        hf_config::parse(&c.to_string(), "q.json")
    };
    let plain = hf_config::parse(&base.to_string(), "plain.json").unwrap();
    for q in [
        serde_json::json!({"quant_method": "fp8"}),
        serde_json::json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                           "weight_block_size": [128, 128]}),
        serde_json::json!({"quant_method": "fp8", "weight_block_size": [128, 128],
                           "modules_to_not_convert": ["lm_head", "model.layers.0.mlp.gate",
                                                      "model.layers.3.input_layernorm"]}),
    ] {
        let got = parse(q.clone()).unwrap_or_else(|e| panic!("{q}: {e}"));
        assert_eq!(got.shipped, Some(Shipped::Fp8), "{q}");
        assert_eq!(got.cfg, plain.cfg, "{q}");
    }
    let dense = parse(serde_json::json!({"quant_method": "fp8", "dequantize": true})).unwrap();
    assert_eq!(dense.shipped, None);
    for (q, key) in [
        (
            serde_json::json!({"quant_method": "fp8", "weight_block_size": [64, 64]}),
            "quantization_config.weight_block_size",
        ),
        (
            serde_json::json!({"quant_method": "fp8", "fmt": "e5m2"}),
            "quantization_config.fmt",
        ),
        (
            serde_json::json!({"quant_method": "fp8", "activation_scheme": "static"}),
            "quantization_config.activation_scheme",
        ),
        (
            serde_json::json!({"quant_method": "fp8",
                               "modules_to_not_convert": ["model.layers.0.self_attn.q_proj"]}),
            "quantization_config.modules_to_not_convert",
        ),
    ] {
        let err = parse(q.clone()).unwrap_err().to_string();
        assert!(err.contains("q.json") && err.contains(key), "{q}: {err}");
    }
}

/// transformers ≥ 4.56 writes `dtype` where older versions wrote `torch_dtype`: both are read,
/// and two that disagree are refused.
#[test]
fn dtype_and_torch_dtype_are_both_read() {
    let base: serde_json::Value =
        serde_json::from_str(llama::preset_json("llama-3-8b").unwrap()).unwrap();
    let with = |fields: &[(&str, &str)]| {
        let mut c = base.clone();
        c.as_object_mut().unwrap().remove("torch_dtype");
        for (k, v) in fields {
            c[*k] = serde_json::Value::from(*v);
        }
        hf_config::parse(&c.to_string(), "d.json")
    };
    use memfit::device::ElemType;
    assert_eq!(
        with(&[("dtype", "bfloat16")]).unwrap().dtype,
        Some(ElemType::Bf16)
    );
    assert_eq!(
        with(&[("torch_dtype", "float16")]).unwrap().dtype,
        Some(ElemType::F16)
    );
    assert_eq!(
        with(&[("torch_dtype", "float32"), ("dtype", "float32")])
            .unwrap()
            .dtype,
        Some(ElemType::F32)
    );
    assert_eq!(with(&[]).unwrap().dtype, None);
    let err = with(&[("torch_dtype", "float16"), ("dtype", "bfloat16")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("dtype") && err.contains("disagrees"), "{err}");
    let err = with(&[("dtype", "int8")]).unwrap_err().to_string();
    assert!(err.contains("`dtype`") || err.contains("dtype"), "{err}");
}

/// Fields a config leaves out take transformers 4.57's defaults (its `configuration_*.py`), and
/// the semantics are transformers': Mistral's window 4096 unless `sliding_window: null`;
/// Qwen2's `max_window_layers` 28 and window 4096 when `use_sliding_window`; Qwen3-MoE's window
/// in every layer; DeepSeek-V3's 256 experts, 8 per token, 1 shared of 2048, 3 dense layers
/// first; DeepSeek-V2's 2 shared experts and no renormalisation whatever `norm_topk_prob`
/// says; Qwen2-MoE's shared expert 5632 wide; a `scoring_func` transformers does not build is
/// refused by name.
#[test]
fn absent_fields_take_transformers_defaults() {
    let base = r#""hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 30,
        "num_attention_heads": 4, "vocab_size": 100, "max_position_embeddings": 128"#;
    let llama = |body: String| {
        hf_config::parse(&body, "cfg.json")
            .unwrap_or_else(|e| panic!("{e}"))
            .cfg
            .llama
            .unwrap()
    };
    let mistral = llama(format!(r#"{{"model_type": "mistral", {base}}}"#));
    assert_eq!(mistral.window_at(0), Some(4096));
    let unwindowed = llama(format!(
        r#"{{"model_type": "mistral", {base}, "sliding_window": null}}"#
    ));
    assert_eq!(unwindowed.window_at(0), None);
    let qwen2 = llama(format!(
        r#"{{"model_type": "qwen2", {base}, "use_sliding_window": true}}"#
    ));
    assert_eq!(
        qwen2.window_at(27),
        None,
        "layers below 28 attend to everything"
    );
    assert_eq!(qwen2.window_at(28), Some(4096));
    let moe = r#""num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16"#;
    let qwen3_moe = llama(format!(
        r#"{{"model_type": "qwen3_moe", {base}, {moe}, "use_sliding_window": true,
        "sliding_window": 64, "max_window_layers": 10}}"#
    ));
    assert!((0..30).all(|i| qwen3_moe.window_at(i) == Some(64)));
    let qwen2_moe = llama(format!(r#"{{"model_type": "qwen2_moe", {base}, {moe}}}"#));
    assert_eq!(qwen2_moe.moe.unwrap().shared, 5632);
    let mla = r#""kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
        "v_head_dim": 8"#;
    let v3 = llama(format!(r#"{{"model_type": "deepseek_v3", {base}, {mla}}}"#))
        .moe
        .unwrap();
    assert_eq!(
        (
            v3.experts,
            v3.top_k,
            v3.shared,
            v3.first_dense,
            v3.norm_topk
        ),
        (256, 8, 2048, 3, true)
    );
    let v2 = llama(format!(
        r#"{{"model_type": "deepseek_v2", {base}, {mla}, "num_experts_per_tok": 2,
        "moe_intermediate_size": 16, "norm_topk_prob": true}}"#
    ))
    .moe
    .unwrap();
    assert_eq!(
        (v2.experts, v2.shared, v2.first_dense, v2.norm_topk),
        (64, 32, 0, false)
    );
    let err = hf_config::parse(
        &format!(
            r#"{{"model_type": "deepseek_v2", {base}, {mla}, "num_experts_per_tok": 2,
            "moe_intermediate_size": 16, "scoring_func": "sigmoid"}}"#
        ),
        "cfg.json",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("`scoring_func`"), "{err}");
}

/// MLA decodes over the latent (the absorbed form) by default: DeepSeek-V3's decode step grows
/// by ≤ 0.1 × the latent cache per cached token (its working set per token ≤ 1.1 × the cache:
/// measured here as the step's growth from 4096 to 8192 tokens), where transformers'
/// decompressed form grows by more than twice the whole cache; at 80 GiB DeepSeek-V2-Lite's
/// eight sequences reach a longer context over the latent than decompressed.
#[test]
fn mla_decode_attends_over_the_latent() {
    let v3 = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/workloads/configs/deepseek-v3-bf16.json"
    );
    let common = "--batch 1 --dtype bf16 --device cuda:0 --phases prefill,decode --seq";
    let at = |seq: &str| {
        let mut args = vec!["--hf-config", v3];
        args.extend(common.split_whitespace());
        args.push(seq);
        predict_json(&args)["serving"].clone()
    };
    let (a, b) = (at("4096"), at("8192"));
    let latent = a["kv_bytes_per_token"].as_u64().unwrap();
    let grow = |key: &str| (b[key].as_u64().unwrap() - a[key].as_u64().unwrap()) / 4096;
    let (absorbed, decompressed) = (
        grow("decode_step_bytes"),
        grow("decode_step_bytes_decompressed"),
    );
    assert!(
        10 * absorbed <= latent,
        "{absorbed} B per token over a {latent} B latent"
    );
    assert!(decompressed > 2 * latent, "{decompressed} vs {latent}");
    let lite = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/workloads/configs/deepseek-v2-lite.json"
    );
    let mut args = vec!["--hf-config", lite];
    args.extend(
        "--hf-set max_position_embeddings=1048576 --batch 8 --seq 8192 --dtype bf16 \
         --device cuda:0 --phases prefill,decode --fit-in 80GiB"
            .split_whitespace(),
    );
    let s = &predict_json(&args)["serving"];
    let (ctx, ctx_d) = (
        s["max_context"].as_u64().unwrap(),
        s["max_context_decompressed"].as_u64().unwrap(),
    );
    assert!(ctx > ctx_d + ctx_d / 4, "{ctx} vs {ctx_d} decompressed");
}

/// DeepSeek-V3 as shipped (`workloads/configs/deepseek-v3.json`, its `quantization_config`
/// fp8): the serving weights are the checkpoint's layout to the byte — every block projection
/// `out·in` bytes of e4m3 plus an f32 per 128×128 block (`kv_a_proj_with_mqa`'s 576 rows: 5
/// blocks, the last partial), everything else bf16 — counted here tensor by tensor from the
/// config, plus the rotary tables memfit holds (`S_max × 32` twice in bf16), less the routers'
/// f32 correction biases (memfit keeps them on the host). About half of the bf16 model, which
/// training still holds (upcast), and which `--weights model` asks for.
#[test]
fn deepseek_v3_fp8_serving_weights_are_the_checkpoint_layout() {
    let cfg = format!(
        "{}/workloads/configs/deepseek-v3.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let predict = |extra: &[&str]| serving_prediction(&["--hf-config", &cfg], extra);
    let (h, l, v, heads) = (7168u64, 61u64, 129_280u64, 128u64);
    let (q_rank, kv_rank, nope, rope, dv) = (1536u64, 512u64, 128u64, 64u64, 128u64);
    let (inter, moe_inter, experts, dense_layers) = (18_432u64, 2048u64, 256u64, 3u64);
    let fp8 = |o: u64, i: u64| o * i + 4 * o.div_ceil(128) * i.div_ceil(128);
    let mut layout = 2 * v * h * 2 + 2 * h; // embeddings, head, final norm
    for layer in 0..l {
        layout += 2 * 2 * h; // the two norms
        layout += fp8(q_rank, h) + 2 * q_rank + fp8(heads * (nope + rope), q_rank);
        layout += fp8(kv_rank + rope, h) + 2 * kv_rank + fp8(heads * (nope + dv), kv_rank);
        layout += fp8(h, heads * dv);
        let mlp = |w: u64| 2 * fp8(w, h) + fp8(h, w);
        layout += if layer < dense_layers {
            mlp(inter)
        } else {
            2 * experts * h + 4 * experts + experts * mlp(moe_inter) + mlp(moe_inter)
        };
    }
    assert_eq!(layout, 673_150_611_808, "626.92 GiB");
    let rotary = 2 * 163_840 * (rope / 2) * 2;
    let biases = (l - dense_layers) * 4 * experts;
    let shipped = predict(&[]);
    assert_eq!(shipped["serving"]["weights"], "fp8");
    assert_eq!(
        shipped["serving"]["weights_bytes"].as_u64().unwrap(),
        layout + rotary - biases
    );
    let dense = predict(&["--weights", "model"]);
    assert_eq!(dense["serving"]["weights"], "model");
    let d = dense["serving"]["weights_bytes"].as_u64().unwrap() as f64;
    let ratio = shipped["serving"]["weights_bytes"].as_u64().unwrap() as f64 / d;
    assert!((0.5..0.52).contains(&ratio), "{ratio}");
    assert_eq!(shipped["weights_bytes"], dense["weights_bytes"]);
}

/// A Gemma 3 config that names only its type is transformers 4.57.1's `Gemma3TextConfig()`:
/// 2,628,658,432 parameters (`Gemma3ForCausalLM` on the meta device), layers 5, 11, 17, 23 full
/// and the others sliding over 4096 tokens (`sliding_window_pattern` 6), the head tied; a
/// `layer_types` list overrides the pattern.
#[test]
fn gemma3_defaults_are_transformers() {
    let parsed = hf_config::parse(r#"{"model_type": "gemma3_text"}"#, "cfg.json").unwrap();
    let cfg = parsed.cfg;
    assert_eq!(cfg.params(), 2_628_658_432);
    assert!(cfg.tied);
    let l = cfg.llama.unwrap();
    let v = l.variant;
    assert_eq!(
        (v.attention_scale.unwrap().0, v.local_rope_theta.unwrap().0),
        (256f64.powf(-0.5), 10_000.0)
    );
    assert!(v.unit_offset_norms && v.sandwich_norms && v.gelu_glu && v.embed_scaled && l.qk_norm);
    assert_eq!(cfg.rope_theta, 1_000_000.0);
    let full: Vec<usize> = (0..26).filter(|&i| l.window_at(i).is_none()).collect();
    assert_eq!(full, [5, 11, 17, 23]);
    assert_eq!(l.window_at(0), Some(4096));
    let types = r#"["full_attention", "sliding_attention"]"#;
    let two = hf_config::parse(
        &format!(
            r#"{{"model_type": "gemma3_text", "num_hidden_layers": 2, "layer_types": {types}}}"#
        ),
        "cfg.json",
    )
    .unwrap()
    .cfg
    .llama
    .unwrap();
    assert_eq!((two.window_at(0), two.window_at(1)), (None, Some(4096)));
}

/// gpt-oss: a config that names only its type is transformers 4.57.1's `GptOssConfig()`
/// (gpt-oss-120b's sizes: 116,829,156,672 parameters on the meta device), with 24 layers and 32
/// experts gpt-oss-20b's 20,914,757,184; even layers slide over 128 tokens, odd ones attend to
/// everything; biases on q, k, v, o, the router and the experts. The standard attention is its
/// default; the efficient and tiled ones (no sinks yet) are refused by name.
#[test]
fn gpt_oss_defaults_and_its_attention() {
    let parse = |body: &str| hf_config::parse(body, "cfg.json").unwrap().cfg;
    let big = parse(r#"{"model_type": "gpt_oss"}"#);
    assert_eq!(big.params(), 116_829_156_672);
    let small =
        parse(r#"{"model_type": "gpt_oss", "num_hidden_layers": 24, "num_local_experts": 32}"#);
    assert_eq!(small.params(), 20_914_757_184);
    let l = small.llama.unwrap();
    assert!(
        l.variant.attention_sinks
            && l.variant.router_bias
            && l.variant.clamped_glu
            && l.qkv_bias
            && l.o_bias
            && l.mlp_bias
            && !small.tied
    );
    assert_eq!(
        (l.window_at(0), l.window_at(1), l.window_at(23)),
        (Some(128), None, None)
    );
    let m = l.moe.unwrap();
    assert_eq!((m.experts, m.top_k, m.norm_topk), (32, 4, true));
    let cfg = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/gpt_oss/config.json"
    );
    let out = memfit()
        .args([
            "predict",
            "--json",
            "--hf-config",
            cfg,
            "--phases",
            "prefill",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for attention in ["efficient", "tiled"] {
        memfit()
            .args(["predict", "--hf-config", cfg, "--attention", attention])
            .assert()
            .failure()
            .stderr(contains("attention` = "))
            .stderr(contains("sinks"));
    }
}

/// `memfit predict --json` of `model`'s serving phases in bf16 on CUDA at S 4096, with `extra`.
fn serving_prediction(model: &[&str], extra: &[&str]) -> serde_json::Value {
    let out = memfit()
        .arg("predict")
        .args(model)
        .args([
            "--dtype", "bf16", "--device", "cuda:0", "--seq", "4096", "--json",
        ])
        .args(["--phases", "inference,prefill,decode"])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// gpt-oss-20b as shipped (`quantization_config` mxfp4, its experts alone): served by default
/// with `mxfp4-experts`, whose weights are the checkpoint's layout to the byte — the experts'
/// 19,110,297,600 weights at 17 B per 32 and the other 1,804,459,584 parameters in bf16,
/// 13,761,264,768 B — plus memfit's two rotary tables (131,072 × 32 × 2 B each); `--weights
/// model` holds it all in bf16 (3.03× that).
#[test]
fn gpt_oss_mxfp4_serving_weights_are_the_checkpoint_layout() {
    let predict = |extra: &[&str]| serving_prediction(&["--preset", "gpt-oss-20b"], extra);
    let (experts, others) = (19_110_297_600u64, 20_914_757_184u64 - 19_110_297_600);
    let layout = experts / 32 * 17 + 2 * others;
    assert_eq!(layout, 13_761_264_768);
    let rotary = 2 * 131_072 * 32 * 2;
    let shipped = predict(&[]);
    assert_eq!(shipped["serving"]["weights"], "mxfp4-experts");
    assert_eq!(
        shipped["serving"]["weights_bytes"].as_u64().unwrap(),
        layout + rotary
    );
    let dense = predict(&["--weights", "model"]);
    let d = dense["serving"]["weights_bytes"].as_u64().unwrap();
    assert_eq!(d, 2 * (experts + others) + rotary);
}

/// Every key of a config is read, listed as changing no memory, or refused naming the file and
/// the key: a misspelt `--hf-set` field, an unknown key, a listed key set to a value that does
/// change memory; a misspelling names the key it is near.
#[test]
fn every_key_is_read_listed_or_refused() {
    let base = r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
        "max_position_embeddings": 128, "bos_token_id": 1, "use_cache": true,
        "architectures": ["LlamaForCausalLM"], "initializer_range": 0.02,
        "pretraining_tp": 1, "_name_or_path": "x", "output_attentions": false"#;
    let ok = format!("{base}}}");
    let params = hf_config::parse(&ok, "ok.json").unwrap().cfg.params();
    // --hf-set of a misspelt field: refused, naming the key meant (before, the full model was
    // sized under the slice's label).
    let e = hf_config::parse_with(&ok, "ok.json", &["num_hiden_layers=1".into()])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ok.json")
            && e.contains("`num_hiden_layers`")
            && e.contains("num_hidden_layers`?"),
        "{e}"
    );
    // Spelt right, it sizes the slice.
    let one = hf_config::parse_with(&ok, "ok.json", &["num_hidden_layers=1".into()]).unwrap();
    assert!(one.cfg.params() < params);
    // A key no reader reads and no list names.
    let e = hf_config::parse(
        &format!(r#"{base}, "interleave_moe_layer_step": 2}}"#),
        "c.json",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("c.json") && e.contains("interleave_moe_layer_step"),
        "{e}"
    );
    // A listed key that changes memory when set.
    let e = hf_config::parse(
        &format!(r#"{base}, "output_hidden_states": true}}"#),
        "c.json",
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("output_hidden_states") && e.contains("keeps"),
        "{e}"
    );
    // A key that is another family's (GPT-2's) is not the llama reader's.
    assert!(hf_config::parse(&format!(r#"{base}, "n_embd": 64}}"#), "c.json").is_err());
    // Every listed key has a reason.
    for n in memfit::model::hf_keys::COMMON {
        assert!(n.why.len() > 10, "{}", n.key);
    }
}

/// The type is checked first: a newer MoE type is refused as an unknown type, naming what it
/// needs and the supported types, never suggesting a relabel; a MoE field in a dense type says
/// the file is not the model it names.
#[test]
fn an_unknown_type_is_refused_as_unknown() {
    for t in ["phimoe", "cohere", "xyz"] {
        let text = format!(
            r#"{{"model_type": "{t}", "hidden_size": 64, "num_local_experts": 16,
            "num_experts": 8, "interleave_moe_layer_step": 1}}"#
        );
        let e = hf_config::parse(&text, "new.json").unwrap_err().to_string();
        assert!(
            e.contains("new.json") && e.contains("unknown model type"),
            "{t}: {e}"
        );
        assert!(
            e.contains("deepseek_v3, kimi_k2"),
            "the supported types: {e}"
        );
        assert!(
            !e.contains("mixture-of-experts model_type"),
            "no relabel advice: {e}"
        );
    }
    let e = hf_config::parse(
        r#"{"model_type": "llama", "hidden_size": 64, "num_experts": 8}"#,
        "dense.json",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("num_experts") && e.contains("is dense"), "{e}");
}

/// Kimi-K2 ships DeepSeek-V3's architecture under `kimi_k2`: read as shipped (FP8 blocks), the
/// same model as the same file relabelled `deepseek_v3`.
#[test]
fn kimi_k2_is_deepseek_v3_under_its_own_name() {
    let kimi = r#"{"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
        "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
        "num_hidden_layers": 61, "num_attention_heads": 64, "num_key_value_heads": 64,
        "n_shared_experts": 1, "n_routed_experts": 384, "routed_scaling_factor": 2.827,
        "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64, "v_head_dim": 128,
        "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1,
        "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 1,
        "norm_topk_prob": true, "scoring_func": "sigmoid", "aux_loss_alpha": 0.001,
        "seq_aux": true, "max_position_embeddings": 131072, "rope_theta": 50000.0,
        "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0,
            "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096, "type": "yarn"},
        "vocab_size": 163840, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
        "num_nextn_predict_layers": 0, "pretraining_tp": 1,
        "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
            "quant_method": "fp8", "weight_block_size": [128, 128]}}"#;
    let k = hf_config::parse(kimi, "kimi.json").unwrap();
    let v3 = hf_config::parse(&kimi.replace("kimi_k2", "deepseek_v3"), "v3.json").unwrap();
    assert_eq!(k.cfg, v3.cfg);
    assert_eq!(k.model_type, "kimi_k2");
    assert_eq!(k.shipped, Some(hf_config::Shipped::Fp8));
    assert_eq!(k.dtype, Some(memfit::device::ElemType::Bf16));
    // 384 experts of 3·7168·2048 in 60 sparse layers, 8 of them active per token.
    let idle = 60 * (384 - 8) * 3 * 7168 * 2048u64;
    assert_eq!(k.cfg.params() - k.cfg.active_params(), idle);
}

/// Dropout is refused in every family (GPT-2's shipped 0.1, ViT's), with how to size the model
/// without it.
#[test]
fn dropout_is_refused_in_every_family() {
    let gpt2 = r#"{"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2,
        "vocab_size": 100, "n_positions": 32, "activation_function": "gelu_new""#;
    let vit = r#"{"model_type": "vit", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 256, "image_size": 32,
        "patch_size": 8"#;
    let llama = r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
        "max_position_embeddings": 128"#;
    for (base, key) in [
        (gpt2, "attn_pdrop"),
        (gpt2, "resid_pdrop"),
        (gpt2, "embd_pdrop"),
        (vit, "hidden_dropout_prob"),
        (vit, "attention_probs_dropout_prob"),
        (llama, "attention_dropout"),
    ] {
        assert!(
            hf_config::parse(&format!("{base}}}"), "m.json").is_ok(),
            "{key}"
        );
        assert!(
            hf_config::parse(&format!(r#"{base}, "{key}": 0.0}}"#), "m.json").is_ok(),
            "{key} 0"
        );
        let e = hf_config::parse(&format!(r#"{base}, "{key}": 0.1}}"#), "m.json")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("m.json")
                && e.contains(key)
                && e.contains("dropout")
                && e.contains("--hf-set"),
            "{e}"
        );
    }
}

/// The checkpoint's element type is `predict`'s default and is said with the answer; `--dtype`
/// overrides it; a bf16 checkpoint measured on the CPU runs f32 and its rows say so.
#[test]
fn the_checkpoint_dtype_is_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bf16.json");
    std::fs::write(
        &path,
        r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100,
        "max_position_embeddings": 128, "torch_dtype": "bfloat16"}"#,
    )
    .unwrap();
    let p = path.to_str().unwrap();
    let weights = |args: &[&str]| {
        predict_json(&[&["--hf-config", p, "--seq", "8", "--phases", "init"], args].concat())
            ["weights_bytes"]
            .as_u64()
            .unwrap()
    };
    let (bf16, f32) = (weights(&[]), weights(&["--dtype", "f32"]));
    // Two bytes a parameter against four (the rotary tables and metadata aside).
    let params = hf_config::load(&path).unwrap().cfg.params();
    assert!(
        f32 - bf16 >= 2 * params && f32 - bf16 < 2 * params + 16_384,
        "{bf16} {f32}"
    );
    let cuda = |args: &[&str]| weights(&[&["--device", "cuda:0"], args].concat());
    assert!(cuda(&["--dtype", "f32"]) - cuda(&[]) >= 2 * params);
    // The table says whose type it is.
    let out = memfit()
        .args([
            "predict",
            "--hf-config",
            p,
            "--seq",
            "8",
            "--fit-in",
            "1GiB",
        ])
        .assert()
        .success();
    let text = String::from_utf8_lossy(&out.get_output().stdout).to_string();
    assert!(text.contains("dtype bf16: the checkpoint's"), "{text}");
    // Measured on the CPU: f32, the rows saying the checkpoint holds bf16.
    let rows = common::run_rows(
        dir.path(),
        &[
            "--hf-config",
            p,
            "--batch",
            "1",
            "--seq",
            "8",
            "--phases",
            "init",
        ],
    );
    assert!(!rows.is_empty());
    for r in &rows {
        assert_eq!(
            (r.dtype.as_str(), r.checkpoint_dtype.as_str()),
            ("f32", "bf16")
        );
    }
}

/// SmolLM3: a config that names only its type is transformers 4.57.1's `SmolLM3Config()`
/// (3,075,098,624 parameters on the meta device, the head tied), every fourth layer NoPE; with
/// `use_sliding_window` and a window the NoPE layers slide and the others do not (its
/// `layer_types`); `no_rope_layers` says per layer, and anything but 0 or 1 in it is refused.
#[test]
fn smollm3_defaults_and_its_nope_layers() {
    let cfg = hf_config::parse(r#"{"model_type": "smollm3"}"#, "cfg.json")
        .unwrap()
        .cfg;
    assert_eq!(cfg.params(), 3_075_098_624);
    assert!(cfg.tied);
    assert_eq!(cfg.rope_theta, 2_000_000.0);
    let l = cfg.llama.unwrap();
    let nope: Vec<usize> = (0..36).filter(|&i| l.nope_at(i)).collect();
    assert_eq!(nope, [3, 7, 11, 15, 19, 23, 27, 31, 35]);
    assert!((0..36).all(|i| l.window_at(i).is_none()));
    let sliding = hf_config::parse(
        r#"{"model_type": "smollm3", "num_hidden_layers": 8, "use_sliding_window": true, "sliding_window": 4096}"#,
        "cfg.json",
    )
    .unwrap()
    .cfg
    .llama
    .unwrap();
    let windows: Vec<Option<usize>> = (0..8).map(|i| sliding.window_at(i)).collect();
    assert_eq!(
        windows,
        [None, None, None, Some(4096), None, None, None, Some(4096)]
    );
    let listed = hf_config::parse(
        r#"{"model_type": "smollm3", "num_hidden_layers": 3, "no_rope_layers": [0, 1, 1]}"#,
        "cfg.json",
    )
    .unwrap()
    .cfg
    .llama
    .unwrap();
    assert_eq!(
        (0..3).map(|i| listed.nope_at(i)).collect::<Vec<_>>(),
        [true, false, false]
    );
    for bad in [r#"[1, 2]"#, r#"[1]"#, r#""all""#] {
        let err = hf_config::parse(
            &format!(
                r#"{{"model_type": "smollm3", "num_hidden_layers": 2, "no_rope_layers": {bad}}}"#
            ),
            "cfg.json",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("no_rope_layers") && err.contains("cfg.json"),
            "{err}"
        );
    }
}

/// Gemma 2: a config that names only its type is transformers 4.57.1's `Gemma2Config()`
/// (Gemma-2-2B's shape: 2,614,341,888 parameters on the meta device), both soft-caps on (50 on
/// the scores, 30 on the logits), even layers sliding over 4096 and odd ones full, the head
/// tied; `predict` answers with the standard attention, and refuses the efficient one by name.
#[test]
fn gemma2_defaults_caps_and_its_attention() {
    let cfg = hf_config::parse(r#"{"model_type": "gemma2"}"#, "cfg.json")
        .unwrap()
        .cfg;
    assert_eq!(cfg.params(), 2_614_341_888);
    assert!(cfg.tied);
    let l = cfg.llama.unwrap();
    assert_eq!(l.variant.attn_softcap.map(|f| f.0), Some(50.0));
    assert_eq!(l.variant.final_softcap.map(|f| f.0), Some(30.0));
    assert_eq!(l.sliding_window, Some(4096));
    assert_eq!(l.full_layers & 0b1111, 0b1010);
    assert!(!l.qk_norm && l.variant.sandwich_norms && l.variant.unit_offset_norms);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, r#"{"model_type": "gemma2", "num_hidden_layers": 2}"#).unwrap();
    let run = |extra: &[&str]| {
        common::memfit()
            .args(["predict", "--hf-config"])
            .arg(&path)
            .args([
                "--batch", "1", "--seq", "64", "--phases", "forward", "--json",
            ])
            .args(extra)
            .output()
            .unwrap()
    };
    let ok = run(&[]);
    assert!(ok.status.success(), "{ok:?}");
    let bad = run(&["--attention", "efficient"]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("soft-capped"),
        "{err}"
    );
    // Gemma-2-9B's shape with the keys its released config carries beside transformers'
    // (`hidden_act` next to `hidden_activation`, `sliding_window_size`, which transformers'
    // Gemma 2 does not read): 9,241,705,984 parameters, transformers' count on the meta device.
    let nine = r#"{"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336,
        "num_attention_heads": 16, "num_hidden_layers": 42, "num_key_value_heads": 8,
        "head_dim": 256, "hidden_act": "gelu_pytorch_tanh",
        "hidden_activation": "gelu_pytorch_tanh", "sliding_window": 4096,
        "sliding_window_size": 4096, "cache_implementation": "hybrid", "vocab_size": 256000,
        "final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0,
        "query_pre_attn_scalar": 256, "max_position_embeddings": 8192}"#;
    assert_eq!(
        hf_config::parse(nine, "cfg.json").unwrap().cfg.params(),
        9_241_705_984
    );
}

/// GLM-4.5 (`glm4_moe`): `Glm4MoeConfig()`'s defaults are GLM-4.5-Air's shape; with the
/// `head_dim` (128) and `attention_bias` (true) of its config, transformers 4.57.1 counts
/// 106,852,245,504 parameters on the meta device, and memfit the same (active: 13,424,123,904
/// with the embedding and the head, 12.18 B without: the "12B active" of its card). The
/// rotary covers 64 of each head's 128; a factor whose part (truncated, as transformers') is odd
/// is refused, naming the file and the key.
#[test]
fn glm4_moe_air_shape_and_its_partial_rotary() {
    let air = r#"{"model_type": "glm4_moe", "head_dim": 128, "attention_bias": true}"#;
    let hf = hf_config::parse(air, "cfg.json").unwrap();
    assert_eq!(hf.cfg.params(), 106_852_245_504);
    let l = hf.cfg.llama.unwrap();
    assert_eq!(l.variant.partial_rotary, Some(64));
    assert!(l.qkv_bias && !l.o_bias && !l.qk_norm);
    let moe = l.moe.unwrap();
    assert_eq!((moe.experts, moe.top_k, moe.first_dense), (128, 8, 1));
    assert_eq!(moe.shared, 1408);
    // transformers' `int(head_dim · factor)`: 0.3 rotates 38 of 128, 0.35 an odd 44.8 → 44
    // (even: accepted), 0.1 an odd 12.8 → 12; 0.18 → 23, odd: refused.
    let with = |factor: &str| {
        let text = format!(
            r#"{{"model_type": "glm4_moe", "head_dim": 128, "partial_rotary_factor": {factor}}}"#
        );
        hf_config::parse(&text, "cfg.json")
    };
    let width = |factor: &str| {
        with(factor)
            .unwrap()
            .cfg
            .llama
            .unwrap()
            .variant
            .partial_rotary
    };
    assert_eq!(width("0.3"), Some(38));
    assert_eq!(width("1.0"), None);
    let err = with("0.18").unwrap_err().to_string();
    assert!(
        err.contains("partial_rotary_factor") && err.contains("cfg.json"),
        "{err}"
    );
    // Where transformers rotates each head whole (Llama), a partial rotary is refused by name.
    let phi = r#"{"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
        "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 64,
        "max_position_embeddings": 32, "partial_rotary_factor": 0.5}"#;
    let err = hf_config::parse(phi, "cfg.json").unwrap_err().to_string();
    assert!(err.contains("partial_rotary_factor"), "{err}");
}

/// OLMo 2: a config that names only its type is transformers 4.57.1's `Olmo2Config()`
/// (6,888,624,128 parameters on the meta device: no norms before the halves, two after, q/k
/// norms 4096 wide), the head untied; `mlp_bias` true is refused (its MLP has none).
#[test]
fn olmo2_defaults_and_its_norms() {
    let cfg = hf_config::parse(r#"{"model_type": "olmo2"}"#, "cfg.json")
        .unwrap()
        .cfg;
    assert_eq!(cfg.params(), 6_888_624_128);
    assert!(!cfg.tied);
    let l = cfg.llama.unwrap();
    assert!(l.qk_norm && l.variant.post_norms_only && l.variant.qk_norm_whole);
    assert_eq!(l.kv_heads, 32);
    let err = hf_config::parse(r#"{"model_type": "olmo2", "mlp_bias": true}"#, "cfg.json")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("mlp_bias") && err.contains("cfg.json"),
        "{err}"
    );
}

/// Llama-4-Scout-17B-16E's `text_config` as its published `config.json` gives it (the keys
/// memfit reads or ignores by name; `no_rope_layers: []` is transformers' "every fourth layer
/// NoPE"), its `max_position_embeddings` (10,485,760) set to 2²⁰, memfit's limit (a size of
/// the rotary tables only: the count is unchanged).
const SCOUT: &str = r#"{"model_type": "llama4_text", "max_position_embeddings": 1048576,
    "torch_dtype": "bfloat16", "hidden_size": 5120, "intermediate_size": 8192,
    "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
    "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048, "num_local_experts": 16,
    "num_experts_per_tok": 1, "interleave_moe_layer_step": 1, "use_qk_norm": true,
    "attention_chunk_size": 8192, "attn_temperature_tuning": true, "floor_scale": 8192,
    "attn_scale": 0.1, "rope_theta": 500000.0, "rms_norm_eps": 1e-05, "hidden_act": "silu",
    "rope_scaling": {"factor": 16.0, "high_freq_factor": 1.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "no_rope_layers": [], "bos_token_id": 200000, "eos_token_id": [200001, 200007, 200008],
    "pad_token_id": 200018, "for_llm_compressor": false, "router_aux_loss_coef": 0.001,
    "router_jitter_noise": 0.0, "output_router_logits": false, "attention_bias": false,
    "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": true,
    "tie_word_embeddings": false}"#;

/// Llama 4's text model (`llama4_text`): `Llama4TextConfig()`'s defaults and Scout's published
/// text config are Llama-4-Scout-17B-16E's shape, 107,769,861,120 parameters as transformers
/// 4.57.1 counts `Llama4ForCausalLM` on the meta device, and memfit the same; active per token
/// 17,172,894,720 (1 of 16 experts a layer, the shared expert, attention, norms, the embedding
/// and the head: the "17B" of its name; 16,138,408,960 without the embedding). Maverick's shape
/// (128 experts on every second layer, the others dense 16384 wide, no q/k norm):
/// 400,711,848,960, 17,184,691,200 active (16,150,205,440 without the embedding). Scout's
/// layers: every fourth NoPE (full attention, tempered), the others chunked by 8192. The
/// multimodal `llama4` is refused naming the vision tower and how to size the text model.
#[test]
fn llama4_scout_and_maverick_counts() {
    let scout = hf_config::parse(SCOUT, "cfg.json").unwrap().cfg;
    let defaults = hf_config::parse(r#"{"model_type": "llama4_text"}"#, "cfg.json")
        .unwrap()
        .cfg;
    for cfg in [&scout, &defaults] {
        assert_eq!(cfg.params(), 107_769_861_120);
        assert_eq!(cfg.active_params(), 17_172_894_720);
        let l = cfg.llama.unwrap();
        assert!(l.variant.chunked_attention && l.variant.qk_l2_norm);
        assert_eq!((l.window_at(0), l.window_at(3)), (Some(8192), None));
        assert_eq!(l.variant.nope_layers.count_ones(), 12);
    }
    assert_eq!(
        scout.active_params() - (scout.vocab * scout.hidden) as u64,
        16_138_408_960
    );
    let maverick = hf_config::parse(
        r#"{"model_type": "llama4_text", "num_local_experts": 128,
            "interleave_moe_layer_step": 2, "use_qk_norm": false}"#,
        "cfg.json",
    )
    .unwrap()
    .cfg;
    assert_eq!(maverick.params(), 400_711_848_960);
    assert_eq!(maverick.active_params(), 17_184_691_200);
    let moe = maverick.llama.unwrap().moe.unwrap();
    assert!(!moe.sparse(0) && moe.sparse(1) && moe.dense_width == 16384);
    let err = hf_config::parse(r#"{"model_type": "llama4"}"#, "cfg.json")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("vision tower") && err.contains("llama4_text"),
        "{err}"
    );
    // A NoPE layer made chunked while its queries are tempered is refused by name.
    let chunked_nope = r#"{"model_type": "llama4_text", "num_hidden_layers": 4,
        "layer_types": ["chunked_attention", "chunked_attention", "chunked_attention",
                        "chunked_attention"]}"#;
    let err = hf_config::parse(chunked_nope, "cfg.json")
        .unwrap_err()
        .to_string();
    assert!(err.contains("layer_types"), "{err}");
    // No chunk size: every layer attends to everything.
    let unchunked = r#"{"model_type": "llama4_text", "attention_chunk_size": null}"#;
    let l = hf_config::parse(unchunked, "cfg.json")
        .unwrap()
        .cfg
        .llama
        .unwrap();
    assert!(!l.variant.chunked_attention && l.window_at(0).is_none());
}

/// Serving Scout in bf16, by hand: a token costs `2·G·D·e` = 2·8·128·2 = 4,096 B in each of the
/// 48 layers (196,608 B); the 36 chunked layers keep at most one chunk (8192 tokens) of a
/// sequence, the 12 NoPE layers all of it, so one sequence of 32,768 tokens keeps
/// 36·8192·4096 + 12·32768·4096 = 1,207,959,552 + 1,610,612,736 = 2,818,572,288 B (2.625 GiB;
/// 6 GiB without the chunks). In 80 GiB beside the bf16 weights (2 B a parameter, 200.7 GiB
/// alone, with the rotary tables 200.99 GiB) no sequence fits: 0 tokens, 0 sequences, context 0.
#[test]
fn llama4_scout_kv_per_layer_kind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, SCOUT).unwrap();
    let path = path.to_str().unwrap();
    let mut args = vec!["--hf-config", path];
    args.extend(
        "--batch 1 --seq 32768 --dtype bf16 --device cuda:0 --phases prefill,decode \
         --fit-in 80GiB"
            .split_whitespace(),
    );
    let s = predict_json(&args)["serving"].clone();
    let u = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k}: {s}"));
    let per_layer = 2 * 8 * 128 * 2;
    assert_eq!(u("kv_bytes_per_token"), 48 * per_layer);
    let per_sequence = 36 * 8192 * per_layer + 12 * 32768 * per_layer;
    assert_eq!(per_sequence, 2_818_572_288);
    assert_eq!(u("kv_bytes_per_sequence"), per_sequence);
    assert!(u("weights_bytes") >= 2 * 107_769_861_120);
    assert!(u("weights_bytes") > 80 << 30);
    for k in ["kv_capacity_tokens", "kv_capacity_sequences", "max_context"] {
        assert_eq!(u(k), 0, "{k}: {s}");
    }
}

/// Qwen3-Next-80B-A3B-Instruct's published `config.json` (the keys memfit reads or ignores by
/// name; `use_sliding_window` is a stray attribute `Qwen3NextConfig` never reads).
const QWEN3_NEXT_80B: &str = r#"{"architectures": ["Qwen3NextForCausalLM"],
    "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 151643,
    "decoder_sparse_step": 1, "eos_token_id": 151645, "full_attention_interval": 4,
    "head_dim": 256, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5120, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "max_position_embeddings": 262144, "mlp_only_layers": [], "model_type": "qwen3_next",
    "moe_intermediate_size": 512, "norm_topk_prob": true, "num_attention_heads": 16,
    "num_experts": 512, "num_experts_per_tok": 10, "num_hidden_layers": 48,
    "num_key_value_heads": 2, "output_router_logits": false, "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 10000000,
    "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "transformers_version": "4.57.0.dev0", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936}"#;

/// Qwen3-Next (`qwen3_next`): `Qwen3NextConfig()`'s defaults and Qwen3-Next-80B-A3B's published
/// config are one shape, 79,674,391,296 parameters as transformers 4.57.1 counts
/// `Qwen3NextForCausalLM(Qwen3NextConfig())` on the meta device, and memfit the same; active
/// per token 3,874,929,408 (10 of 512 experts a layer, the shared expert and its gate, both
/// attentions, the norms, the embedding and the head: the "A3B" of its name; 3,563,764,480
/// without the embedding). Every fourth layer full attention (12), the other 36 Gated DeltaNet
/// (16 key heads, 32 value heads of 128, a convolution of 4); the full layers' q projection
/// doubled for the output gate, a quarter of each 256-wide head rotated.
#[test]
fn qwen3_next_80b_counts() {
    let published = hf_config::parse(QWEN3_NEXT_80B, "cfg.json").unwrap().cfg;
    let defaults = hf_config::parse(r#"{"model_type": "qwen3_next"}"#, "cfg.json")
        .unwrap()
        .cfg;
    for cfg in [&published, &defaults] {
        assert_eq!(cfg.params(), 79_674_391_296);
        assert_eq!(cfg.active_params(), 3_874_929_408);
        let l = cfg.llama.unwrap();
        let g = l.variant.gated_delta.unwrap();
        assert_eq!(g.layers.count_ones(), 36);
        assert!(l.linear_at(2).is_some() && l.linear_at(3).is_none());
        assert_eq!(
            (
                g.key_heads,
                g.value_heads,
                g.key_dim,
                g.value_dim,
                g.conv_kernel
            ),
            (16, 32, 128, 128, 4)
        );
        assert_eq!(l.variant.partial_rotary, Some(64));
        assert!(l.variant.attn_output_gate && l.variant.unit_offset_norms && l.qk_norm);
    }
    assert_eq!(
        published.active_params() - (published.vocab * published.hidden) as u64,
        3_563_764_480
    );
    // A list of layer types overrides the interval; another type is refused by name.
    let listed = r#"{"model_type": "qwen3_next", "num_hidden_layers": 2,
        "layer_types": ["full_attention", "linear_attention"]}"#;
    let l = hf_config::parse(listed, "cfg.json")
        .unwrap()
        .cfg
        .llama
        .unwrap();
    assert_eq!(l.variant.gated_delta.unwrap().layers, 0b10);
    let sliding = r#"{"model_type": "qwen3_next", "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "linear_attention"]}"#;
    let err = hf_config::parse(sliding, "cfg.json")
        .unwrap_err()
        .to_string();
    assert!(err.contains("layer_types"), "{err}");
}

/// Serving Qwen3-Next-80B-A3B in bf16, by hand: only the 12 full layers keep tokens, `2·G·D·e`
/// = 2·2·256·2 = 2,048 B each, 24,576 B a token; each of the 36 linear layers keeps a fixed
/// state per sequence whatever its length: the convolution's last 4 inputs of its
/// 2·16·128 + 32·128 = 8,192 channels in bf16 (65,536 B) and the recurrent state 32·128·128 in
/// f32, as transformers computes and keeps it (2,097,152 B): 36 · 2,162,688 = 77,856,768 B
/// (74.25 MiB). One sequence of 32,768 tokens: 32,768 · 24,576 + 77,856,768 = 883,163,136 B
/// (842.25 MiB). Beside the bf16 weights (2 B a parameter, 148.4 GiB) nothing fits in 80 GiB.
/// With FP8 weights (`--weights fp8`, 80,406,101,504 B) and balanced routing a 32k prefill's
/// activations (5.2 GiB) leave nothing either: the answer is the budget's arithmetic, checked.
#[test]
fn qwen3_next_80b_fixed_state_and_kv() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, QWEN3_NEXT_80B).unwrap();
    let path = path.to_str().unwrap();
    let run = |extra: &str| {
        let mut args = vec!["--hf-config", path];
        args.extend(
            "--batch 1 --seq 32768 --dtype bf16 --device cuda:0 --phases prefill,decode \
             --fit-in 80GiB"
                .split_whitespace(),
        );
        args.extend(extra.split_whitespace());
        predict_json(&args)["serving"].clone()
    };
    let state = 36 * (4 * 8192 * 2 + 32 * 128 * 128 * 4);
    assert_eq!(state, 77_856_768);
    let per_sequence = 32768 * 24_576 + state;
    assert_eq!(per_sequence, 883_163_136);
    for (extra, weights) in [
        ("", 2 * 79_674_391_296),
        ("--weights fp8 --routing balanced", 0),
    ] {
        let s = run(extra);
        let u = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k}: {s}"));
        assert_eq!(u("kv_bytes_per_token"), 12 * 2 * 2 * 256 * 2);
        assert_eq!(u("state_bytes_per_sequence"), state);
        assert_eq!(u("kv_bytes_per_sequence"), per_sequence);
        assert!(u("weights_bytes") >= weights);
        let free = (80u64 << 30).saturating_sub(u("weights_bytes") + u("prefill_activation_bytes"));
        assert_eq!(
            u("kv_capacity_sequences"),
            free / per_sequence,
            "{extra}: {s}"
        );
        assert_eq!(u("kv_capacity_sequences"), 0, "{extra}: {s}");
    }
}
