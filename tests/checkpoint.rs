//! Gradient checkpointing gives the plain backward's gradients bit for bit (f32, CPU), for
//! every segment length, and its memory is predicted like the plain path's.

mod common;

use candle_core::{DType, Device};
use candle_nn::{VarBuilder, VarMap};
use common::{exact_peak, run_rows};
use memfit::model::transformer::{Config, Transformer, synthetic_batch};
use memfit::phase::checkpoint;

#[test]
fn checkpointed_gradients_equal_the_plain_ones_bit_for_bit() {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let model = Transformer::new(&Config::new(50, 24, 3, 5, 12), vb).unwrap();
    let (tokens, targets) = synthetic_batch(2, 11, 50, &dev).unwrap();
    let vars = varmap.all_vars();
    let plain = Transformer::loss(&model.forward(&tokens).unwrap(), &targets)
        .unwrap()
        .backward()
        .unwrap();
    for k in [1, 2, 3, 5] {
        let detached = model.detached();
        let fwd = checkpoint::forward(&model, &detached, &tokens, &targets, k).unwrap();
        let ckpt = checkpoint::backward(&model, &vars, fwd, &tokens, k).unwrap();
        for v in &vars {
            let a = plain.get(v.as_tensor()).expect("plain gradient");
            let b = ckpt.get(v.as_tensor()).expect("checkpointed gradient");
            let (a, b) = (
                a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            );
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "K = {k}: a gradient differs"
            );
        }
        assert_eq!(
            ckpt.get_ids().count(),
            vars.len(),
            "K = {k}: only parameter gradients"
        );
    }
}

/// A tied head (the LM head is the token embedding): the head's and the embedding's
/// gradients of the one weight are summed, as the plain backward sums them, for every segment
/// length and with candle's composed ops and the fused kernels.
#[test]
fn checkpointed_gradients_of_a_tied_embedding_are_summed() {
    use memfit::model::kernels::Kernels;
    let dev = Device::Cpu;
    for kernels in [Kernels::Composed, Kernels::Fused] {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
        let mut cfg = memfit::model::llama::tiny();
        cfg.tied = true;
        cfg.kernels = kernels;
        let model = Transformer::new(&cfg, vb).unwrap();
        let (tokens, targets) = synthetic_batch(2, 11, cfg.vocab, &dev).unwrap();
        let vars = varmap.all_vars();
        let plain = model
            .train_loss(&model.forward(&tokens).unwrap(), &targets)
            .unwrap()
            .backward()
            .unwrap();
        for k in [1, 2] {
            let detached = model.detached();
            let fwd = checkpoint::forward(&model, &detached, &tokens, &targets, k).unwrap();
            let ckpt = checkpoint::backward(&model, &vars, fwd, &tokens, k).unwrap();
            for v in &vars {
                let a = plain.get(v.as_tensor()).expect("plain gradient");
                let b = ckpt.get(v.as_tensor()).expect("checkpointed gradient");
                let d = (a - b)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap();
                let m = a
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap();
                assert!(
                    d <= 1e-6 * m.max(1e-6),
                    "{kernels:?} K = {k}: a gradient {:?} differs by {d} (largest {m})",
                    v.shape()
                );
            }
        }
    }
}

#[test]
fn checkpointed_memory_is_predicted() {
    for k in ["1", "2", "3"] {
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
                "3",
                "--vocab",
                "300",
                "--checkpoint",
                k,
                "--phases",
                "forward,backward,train-step",
            ],
        );
        for r in &rows {
            assert_eq!(r.checkpoint.to_string(), k);
            assert!(
                exact_peak(r),
                "K = {k} {}: measured {:?} predicted {:?}",
                r.phase,
                r.peak_bytes,
                r.predicted_peak_bytes
            );
        }
    }
}

/// Mixed precision with checkpointing (f16 working copy, f32 masters, fused and composed
/// kernels): the masters' gradients equal the plain mixed backward's bit for bit, and only
/// the masters get gradients.
#[test]
fn mixed_precision_checkpointed_gradients_equal_the_plain_mixed_ones() {
    use memfit::model::kernels::Kernels;
    let dev = Device::Cpu;
    for kernels in [Kernels::Composed, Kernels::Fused] {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
        let cfg = Config {
            kernels,
            ..Config::new(50, 24, 3, 4, 12)
        };
        let model = Transformer::new(&cfg, vb).unwrap();
        let (tokens, targets) = synthetic_batch(2, 11, 50, &dev).unwrap();
        let vars = varmap.all_vars();
        let half = model.cast(DType::F16).unwrap();
        let logits = half.forward(&tokens).unwrap().to_dtype(DType::F32).unwrap();
        let plain = half
            .train_loss(&logits, &targets)
            .unwrap()
            .backward()
            .unwrap();
        for k in [1, 3] {
            let fwd = checkpoint::forward_mixed(&model, DType::F16, &tokens, &targets, k).unwrap();
            let ckpt = checkpoint::backward(&model, &vars, fwd, &tokens, k).unwrap();
            assert_eq!(ckpt.get_ids().count(), vars.len(), "{kernels:?} K = {k}");
            for v in &vars {
                let a = plain.get(v.as_tensor()).expect("plain gradient");
                let b = ckpt.get(v.as_tensor()).expect("checkpointed gradient");
                assert_eq!(b.dtype(), DType::F32, "the masters' gradients are f32");
                let (a, b) = (
                    a.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                    b.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
                );
                assert!(
                    a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{kernels:?} K = {k}: a gradient differs"
                );
            }
        }
    }
}

/// Under mixed precision checkpointing lowers the train step, as in PyTorch: no 16-bit copy of
/// every block lives from the forward to the end of the backward (each segment's blocks are
/// cast as it runs and again as it is recomputed), so what checkpointing saves is not spent on
/// the copies. Measured and predicted, both below the uncheckpointed step.
#[test]
fn mixed_precision_checkpointing_lowers_the_train_step() {
    let dir = tempfile::tempdir().unwrap();
    let rows = run_rows(
        dir.path(),
        &[
            "--batch",
            "2",
            "--seq",
            "64",
            "--hidden",
            "128",
            "--heads",
            "4",
            "--layers",
            "4",
            "--vocab",
            "300",
            "--dtype",
            "f16",
            "--precision",
            "mixed",
            "--checkpoint",
            "0,1",
            "--phases",
            "train-step",
        ],
    );
    let step = |k: u64| {
        let r = rows
            .iter()
            .find(|r| r.checkpoint == k)
            .expect("a train-step row");
        assert!(exact_peak(r), "{r:?}");
        (r.peak_bytes.unwrap(), r.predicted_peak_bytes.unwrap())
    };
    let (plain, checkpointed) = (step(0), step(1));
    assert!(
        checkpointed.0 < plain.0 && checkpointed.1 < plain.1,
        "checkpointed {checkpointed:?} vs plain {plain:?} (measured, predicted)"
    );
}
