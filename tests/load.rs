//! Loading weights from safetensors: the file's size is predicted to the byte, and the load
//! phase's memory (read: file + tensors; mmap: tensors) within the metadata allowance.

mod common;

use candle_core::{DType, Device};
use candle_nn::{VarBuilder, VarMap};
use common::{exact_peak, exact_retained, run_rows};
use memfit::formula::transformer::Shape;
use memfit::model::transformer::{Config, LoraTarget, Transformer};

#[test]
fn safetensors_file_size_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    for (cfg, lora) in [
        (Config::new(300, 64, 4, 2, 32), false),
        (
            Config {
                lora_rank: 4,
                lora_targets: vec![LoraTarget::Q, LoraTarget::Fc2],
                ..Config::new(100, 32, 2, 3, 16)
            },
            true,
        ),
    ] {
        let varmap = VarMap::new();
        let _model = Transformer::new(
            &cfg,
            VarBuilder::from_varmap(&varmap, DType::F32, &Device::Cpu),
        )
        .unwrap();
        let path = dir.path().join("w.safetensors");
        varmap.save(&path).unwrap();
        let mut shape = Shape::new(
            1,
            cfg.max_seq as u64,
            cfg.hidden as u64,
            cfg.heads as u64,
            cfg.layers as u64,
            cfg.vocab as u64,
            cfg.max_seq as u64,
        );
        if lora {
            shape.lora_rank = 4;
            shape.lora_targets = memfit::formula::transformer::lora_bits(&cfg.lora_targets);
        }
        let size = std::fs::metadata(&path).unwrap().len();
        assert_eq!(size, shape.safetensors_file_bytes(), "lora {lora}");
    }
}

#[test]
fn load_phase_is_predicted() {
    for mode in ["read", "mmap"] {
        let dir = tempfile::tempdir().unwrap();
        let rows = run_rows(
            dir.path(),
            &[
                "--batch", "1", "--seq", "40", "--hidden", "96", "--heads", "3", "--layers", "2",
                "--vocab", "500", "--phases", "load", "--load", mode,
            ],
        );
        let r = &rows[0];
        assert_eq!(r.load, mode);
        assert!(
            exact_peak(r),
            "{mode}: {:?} vs {:?}",
            r.peak_bytes,
            r.predicted_peak_bytes
        );
        assert!(
            exact_retained(r),
            "{mode}: retained {:?} vs {:?}",
            r.retained_bytes,
            r.predicted_retained_bytes
        );
    }
}
