//! Mixed precision trains through the f16 working copy into f32 master weights.

use candle_core::{DType, Device};
use candle_nn::{VarBuilder, VarMap};
use memfit::model::transformer::{Config, Transformer, synthetic_batch};
use memfit::optim::Opt;
use memfit::phase::OptimizerKind;

#[test]
fn mixed_precision_updates_f32_masters_and_learns() {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let model = Transformer::new(
        &Config::new(64, 32, 2, 2, 16),
        VarBuilder::from_varmap(&varmap, DType::F32, &dev),
    )
    .unwrap();
    let (tokens, targets) = synthetic_batch(4, 16, 64, &dev).unwrap();
    let mut opt = Opt::new(OptimizerKind::Adamw, varmap.all_vars()).unwrap();
    let mut losses = Vec::new();
    for _ in 0..30 {
        let half = model.cast(DType::F16).unwrap();
        let logits = half.forward(&tokens).unwrap();
        assert_eq!(logits.dtype(), DType::F16);
        let loss = Transformer::loss(&logits.to_dtype(DType::F32).unwrap(), &targets).unwrap();
        losses.push(loss.to_scalar::<f32>().unwrap());
        let grads = loss.backward().unwrap();
        for v in varmap.all_vars() {
            let g = grads
                .get(v.as_tensor())
                .expect("every master weight gets a gradient");
            assert_eq!(
                g.dtype(),
                DType::F32,
                "gradients reach the f32 masters in f32"
            );
        }
        opt.step(&grads).unwrap();
    }
    assert!(
        losses[29] < 0.9 * losses[0],
        "{} → {}",
        losses[0],
        losses[29]
    );
}
