//! The backward block by block (`phase::by_block`: the boundary cut that moves a storage, the
//! seed that hands a gradient in) against candle's whole backward, on the device under test:
//! the same gradients for every parameter — bit for bit on the CPU, within 1e-5 of the largest
//! on a GPU, whose reductions may order their sums differently between two runs.

use candle_core::{DType, Tensor};
use candle_nn::{VarBuilder, VarMap};

use crate::model::kernels::Kernels;
use crate::model::transformer::{Config, Transformer, synthetic_batch};
use crate::model::{llama, vit};
use crate::phase::by_block;

use super::dev;

fn max_abs(t: &Tensor) -> f32 {
    t.abs()
        .and_then(|t| t.max_all())
        .and_then(|t| t.to_dtype(DType::F32))
        .and_then(|t| t.to_scalar::<f32>())
        .expect("a finite reduction")
}

/// Whole and by-block gradients of `cfg` (f32, fused kernels; `mixed`: the 16-bit working
/// type) on `input`.
fn compare(name: &str, cfg: Config, input: &Tensor, targets: &Tensor, mixed: Option<DType>) {
    let dev = dev();
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let model = Transformer::new(&cfg, vb).expect("model");
    let vars = varmap.all_vars();
    let loss = match mixed {
        None => model.train_loss(&model.forward(input).unwrap(), targets),
        Some(d) => {
            let half = model.cast(d).unwrap();
            let logits = half.forward(input).unwrap();
            model.train_loss(&logits.to_dtype(DType::F32).unwrap(), targets)
        }
    }
    .expect("loss");
    let whole = loss.backward().expect("whole backward");
    drop(loss);
    let fwd = by_block::forward(&model, mixed, input, targets).expect("by-block forward");
    let blocks = by_block::backward(&vars, fwd).expect("by-block backward");
    let exact = dev.is_cpu() && !cfg.tied;
    let mut worst = 0f32;
    for v in &vars {
        match (whole.get(v.as_tensor()), blocks.get(v.as_tensor())) {
            (None, None) => {}
            (Some(a), Some(b)) => {
                let d = max_abs(&(a - b).unwrap());
                let m = max_abs(a).max(f32::MIN_POSITIVE);
                assert!(
                    d.is_finite() && m.is_finite(),
                    "{name}: a gradient is not finite"
                );
                if exact {
                    assert!(
                        d == 0.0,
                        "{name}: a gradient of {:?} differs by {d}",
                        a.dims()
                    );
                } else {
                    assert!(
                        d <= 1e-5 * m,
                        "{name}: a gradient of {:?} differs by {d} of {m}",
                        a.dims()
                    );
                }
                worst = worst.max(d / m);
            }
            (a, b) => panic!(
                "{name}: a gradient in one backward only (whole {}, by block {})",
                a.is_some(),
                b.is_some()
            ),
        }
    }
    println!(
        "  {name}: {} gradients, worst relative difference {worst:.2e}",
        vars.len()
    );
}

pub fn by_block_gradients_equal_the_whole_backward() {
    let dev = dev();
    let gpt = Config {
        kernels: Kernels::Fused,
        ..Config::new(53, 30, 3, 3, 19)
    };
    let (tokens, targets) = synthetic_batch(2, 19, gpt.vocab, &dev).unwrap();
    compare("gpt", gpt, &tokens, &targets, None);
    let mut tiny = llama::tiny();
    tiny.kernels = Kernels::Fused;
    tiny.tied = true;
    let (tokens, targets) = synthetic_batch(2, 17, tiny.vocab, &dev).unwrap();
    compare("llama tied", tiny.clone(), &tokens, &targets, None);
    // 16-bit working copies: bf16 on a GPU, f16 on the CPU (candle's CPU matmul has no bf16).
    let half = if dev.is_cpu() {
        DType::F16
    } else {
        DType::BF16
    };
    tiny.tied = false;
    compare("llama mixed", tiny, &tokens, &targets, Some(half));
    let sizes = vit::preset("vit-tiny").unwrap();
    let cfg = Config {
        kernels: Kernels::Fused,
        ..Config::vit(sizes)
    };
    let (images, labels) = vit::synthetic_batch(2, sizes.vision, cfg.vocab, &dev).unwrap();
    compare("vit", cfg, &images, &labels, None);
}
