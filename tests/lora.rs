//! LoRA: only the adapters train (no gradient, no optimizer state, no change for the frozen
//! base), and the memory of every phase is predicted.

mod common;

use candle_core::{DType, Device};
use candle_nn::{VarBuilder, VarMap};
use common::{exact_peak, pool_peak_near, run_rows};
use memfit::model::transformer::{Config, LoraBase, LoraTarget, Transformer, synthetic_batch};
use memfit::optim::Opt;
use memfit::phase::OptimizerKind;
use memfit::step::Phase;

#[test]
fn only_adapters_train() {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let cfg = Config {
        lora_rank: 4,
        lora_targets: vec![LoraTarget::Q, LoraTarget::V, LoraTarget::Fc2],
        ..Config::new(50, 32, 2, 2, 16)
    };
    let model = Transformer::new(&cfg, VarBuilder::from_varmap(&varmap, DType::F32, &dev))
        .unwrap()
        .frozen()
        .unwrap();
    let (tokens, targets) = synthetic_batch(2, 16, 50, &dev).unwrap();
    let named: Vec<(String, candle_core::Var)> = {
        let data = varmap.data().lock().unwrap();
        let mut v: Vec<_> = data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    let adapters: Vec<_> = named.iter().filter(|(k, _)| k.contains("lora_")).collect();
    assert_eq!(
        adapters.len(),
        2 * 3 * 2,
        "A and B for 3 targets in 2 layers"
    );
    assert_eq!(cfg.lora_params(), 2 * (4 * 64 + 4 * 64 + 4 * 160));
    let before: Vec<Vec<f32>> = named
        .iter()
        .map(|(_, v)| v.as_tensor().flatten_all().unwrap().to_vec1().unwrap())
        .collect();
    let trainable: Vec<_> = adapters.iter().map(|(_, v)| v.clone()).collect();
    let mut opt = Opt::new(OptimizerKind::Adamw, trainable).unwrap();
    for _ in 0..3 {
        let loss = Transformer::loss(&model.forward(&tokens).unwrap(), &targets).unwrap();
        let grads = loss.backward().unwrap();
        for (name, v) in &named {
            let has = grads.get(v.as_tensor()).is_some();
            assert_eq!(has, name.contains("lora_"), "{name}: gradient {has}");
        }
        opt.step(&grads).unwrap();
    }
    for ((name, v), old) in named.iter().zip(&before) {
        let now: Vec<f32> = v.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(
            &now != old,
            name.contains("lora_"),
            "{name} changed: {}",
            &now != old
        );
    }
}

/// The frozen-linear op computes exactly what candle's matmul on detached weights computes:
/// the adapters' gradients agree bit for bit; only the memory differs.
#[test]
fn frozen_op_gradients_equal_detached_ones() {
    let dev = Device::Cpu;
    let (tokens, targets) = synthetic_batch(2, 16, 50, &dev).unwrap();
    let grads = |base: LoraBase| -> Vec<Vec<f32>> {
        let varmap = VarMap::new();
        let cfg = Config {
            lora_rank: 4,
            lora_targets: vec![LoraTarget::Q, LoraTarget::Fc1],
            lora_base: base,
            ..Config::new(50, 32, 2, 2, 16)
        };
        let model =
            Transformer::new(&cfg, VarBuilder::from_varmap(&varmap, DType::F32, &dev)).unwrap();
        // Same weights in both runs: overwrite every variable with a fixed pattern.
        let data = varmap.data().lock().unwrap();
        let mut names: Vec<_> = data.keys().cloned().collect();
        names.sort();
        for (i, n) in names.iter().enumerate() {
            let v = &data[n];
            let vals: Vec<f32> = (0..v.elem_count())
                .map(|j| (((i * 7919 + j * 104729) % 2003) as f32 / 2003.0 - 0.5) * 0.1)
                .collect();
            v.set(&candle_core::Tensor::from_vec(vals, v.shape(), &dev).unwrap())
                .unwrap();
        }
        let model = model.frozen().unwrap();
        let g = Transformer::loss(&model.forward(&tokens).unwrap(), &targets)
            .unwrap()
            .backward()
            .unwrap();
        names
            .iter()
            .filter(|n| n.contains("lora_"))
            .map(|n| {
                g.get(data[n].as_tensor())
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap()
            })
            .collect()
    };
    let (a, b) = (grads(LoraBase::Detach), grads(LoraBase::Op));
    assert_eq!(a.len(), 2 * 2 * 2);
    for (x, y) in a.iter().zip(&b) {
        assert!(x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()));
    }
}

#[test]
fn lora_memory_is_predicted() {
    for (targets, base) in [
        ("q,v", "op"),
        ("all", "op"),
        ("q,v", "detach"),
        ("all", "q4_0"),
        ("all", "q8_0"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let rows = run_rows(
            dir.path(),
            &[
                "--batch",
                "2",
                "--seq",
                "40",
                "--hidden",
                "64",
                "--heads",
                "4",
                "--layers",
                "2",
                "--vocab",
                "300",
                "--lora-rank",
                "8",
                "--lora-targets",
                targets,
                "--lora-base",
                base,
            ],
        );
        for r in &rows {
            assert_eq!(r.lora_base, base, "{r:?}");
            assert!(
                exact_peak(r),
                "{targets} {base} {}: measured {:?} predicted {:?}",
                r.phase,
                r.peak_bytes,
                r.predicted_peak_bytes
            );
        }
        // The optimizer keeps state for the adapters only: 8 bytes per adapter parameter.
        let opt = rows.iter().find(|r| r.phase == Phase::Optimizer).unwrap();
        let base = 2 * 300 * 64 + 40 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64;
        let adapter_params = opt.params - base;
        let state = opt.retained_bytes.unwrap() as u64;
        assert!(
            state >= 8 * adapter_params && common::exact_retained(opt),
            "{state}: {opt:?}"
        );
    }
}

/// QLoRA over GGUF's k-quants (super-blocks of 256), over FP8 with 128×128 block scales (an
/// FP8 checkpoint's base as shipped), over MXFP4 (e2m1 with a scale per 32), and QLoRA and the frozen-base op in
/// 16-bit (the dequantized weight cast to the activations' type; the backward's input gradient
/// from `grad·W`): every phase predicted (on the CPU within the tolerances above; on CUDA within
/// the pool's factor), and the quantized weights kept after init ordered by bits per weight.
fn qlora_k_quants_and_half(device: &str) {
    let half = if device == "cpu" { "f16" } else { "bf16" };
    let mut kept = std::collections::HashMap::new();
    for (dtype, base) in [
        ("f32", "q4_k"),
        ("f32", "q6_k"),
        (half, "q4_0"),
        (half, "q4_k"),
        (half, "op"),
        ("f32", "fp8"),
        (half, "fp8"),
        ("f32", "mxfp4"),
        (half, "mxfp4"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let rows = run_rows(
            dir.path(),
            &[
                "--device",
                device,
                "--batch",
                "2",
                "--seq",
                "16",
                "--hidden",
                "256",
                "--heads",
                "4",
                "--layers",
                "2",
                "--vocab",
                "300",
                "--dtype",
                dtype,
                "--lora-rank",
                "8",
                "--lora-targets",
                "all",
                "--lora-base",
                base,
            ],
        );
        assert!(rows.len() >= 5, "{rows:?}");
        for r in &rows {
            assert_eq!(r.status, memfit::record::Status::Ok, "{r:?}");
            assert_eq!((r.lora_base.as_str(), r.dtype.as_str()), (base, dtype));
            let ok = match (device, r.phase.as_str()) {
                ("cpu", _) => exact_peak(r),
                _ => pool_peak_near(r),
            };
            assert!(
                ok,
                "{device} {dtype} {base} {}: measured {:?} predicted {:?}",
                r.phase, r.peak_bytes, r.predicted_peak_bytes
            );
        }
        let init = rows.iter().find(|r| r.phase == Phase::Init).unwrap();
        kept.insert((dtype, base), init.retained_bytes.unwrap());
    }
    // 4.5 < 6.56 bits per weight; 16-bit dense weights keep the most.
    assert!(kept[&("f32", "q4_k")] < kept[&("f32", "q6_k")], "{kept:?}");
    assert!(kept[&(half, "q4_k")] < kept[&(half, "op")], "{kept:?}");
    // FP8: 8 bits and an f32 per 128×128 block (8.002 bits per weight), the same in either
    // activation type.
    assert!(kept[&(half, "q4_k")] < kept[&(half, "fp8")], "{kept:?}");
    assert!(kept[&(half, "fp8")] < kept[&(half, "op")], "{kept:?}");
    // MXFP4: 4 bits and a byte per 32 (4.25 bits per weight), below Q4_K's 4.5.
    assert!(kept[&(half, "mxfp4")] < kept[&(half, "q4_k")], "{kept:?}");
}

on_each_device!(qlora_blocks, qlora_k_quants_and_half);
