//! The backward block by block (`phase::by_block`: the boundary cut that moves a storage, the
//! seed that hands a gradient in) against candle's whole backward, on the device under test:
//! the same gradients for every parameter — bit for bit on the CPU (a tied weight, whose two
//! gradients are added in another order, within 1e-5 of its largest element), within 1e-5 on a
//! GPU, whose reductions may order their sums differently between two runs. [`compare`] is also
//! what `tests/by_block.rs` runs on every family and variant.

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

/// What [`compare`] found.
#[derive(Debug, Clone, Copy)]
pub struct Compared {
    /// Parameters with a gradient (in both backwards).
    pub gradients: usize,
    /// Gradients the by-block backward stored (its store holds parameters' only).
    pub stored: usize,
    /// The largest difference relative to its gradient's largest element.
    pub worst: f32,
}

/// The whole backward's and the by-block backward's gradients of `cfg` on `input` (LoRA: the
/// frozen model; `mixed`: the 16-bit working type) on the device under test: every parameter
/// has a gradient in both or in neither, of one shape, equal bit for bit — or, where sums may
/// be ordered differently (a tied weight's two gradients; a GPU's reductions), within
/// `inexact` of the gradient's largest element.
pub fn compare(
    name: &str,
    cfg: &Config,
    input: &Tensor,
    targets: &Tensor,
    mixed: Option<DType>,
    inexact: f32,
) -> Compared {
    let dev = dev();
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let model = Transformer::new(cfg, vb).expect("model");
    let model = if cfg.lora_rank > 0 {
        model.frozen().expect("frozen model")
    } else {
        model
    };
    let vars = varmap.all_vars();
    let whole = model
        .training_loss(input, targets, mixed)
        .and_then(|loss| loss.backward())
        .expect("whole backward");
    let fwd = by_block::forward(&model, mixed, input, targets).expect("by-block forward");
    let blocks = by_block::backward(&vars, fwd).expect("by-block backward");
    let may_differ = cfg.tied || !dev.is_cpu();
    let bits = |t: &Tensor| -> Vec<u32> {
        t.to_dtype(DType::F32)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1::<f32>())
            .expect("gradient values")
            .into_iter()
            .map(f32::to_bits)
            .collect()
    };
    let (mut gradients, mut worst) = (0, 0f32);
    for v in &vars {
        match (whole.get(v.as_tensor()), blocks.get(v.as_tensor())) {
            (None, None) => {}
            (Some(a), Some(b)) => {
                assert_eq!(a.dims(), b.dims(), "{name}: gradient shapes");
                let d = max_abs(&(a - b).unwrap());
                let m = max_abs(a).max(f32::MIN_POSITIVE);
                assert!(
                    d.is_finite() && m.is_finite(),
                    "{name}: a gradient is not finite"
                );
                if bits(a) != bits(b) {
                    assert!(
                        may_differ && d <= inexact * m,
                        "{name}: the gradient of a {:?} differs by {d} (of {m})",
                        a.dims()
                    );
                }
                worst = worst.max(d / m);
                gradients += 1;
            }
            (a, b) => panic!(
                "{name}: a gradient in one backward only (whole {}, by block {})",
                a.is_some(),
                b.is_some()
            ),
        }
    }
    println!("  {name}: {gradients} gradients, worst relative difference {worst:.2e}");
    Compared {
        gradients,
        stored: blocks.get_ids().count(),
        worst,
    }
}

/// A GPU's reductions may sum in another order between two runs.
const INEXACT: f32 = 1e-5;

pub fn by_block_gradients_equal_the_whole_backward() {
    let dev = dev();
    let gpt = Config {
        kernels: Kernels::Fused,
        ..Config::new(53, 30, 3, 3, 19)
    };
    let (tokens, targets) = synthetic_batch(2, 19, gpt.vocab, &dev).unwrap();
    compare("gpt", &gpt, &tokens, &targets, None, INEXACT);
    let mut tiny = llama::tiny();
    tiny.kernels = Kernels::Fused;
    tiny.tied = true;
    let (tokens, targets) = synthetic_batch(2, 17, tiny.vocab, &dev).unwrap();
    compare("llama tied", &tiny, &tokens, &targets, None, INEXACT);
    // 16-bit working copies: bf16 on a GPU, f16 on the CPU (candle's CPU matmul has no bf16).
    let half = if dev.is_cpu() {
        DType::F16
    } else {
        DType::BF16
    };
    tiny.tied = false;
    compare("llama mixed", &tiny, &tokens, &targets, Some(half), INEXACT);
    let sizes = vit::preset("vit-tiny").unwrap();
    let cfg = Config {
        kernels: Kernels::Fused,
        ..Config::vit(sizes)
    };
    let (images, labels) = vit::synthetic_batch(2, sizes.vision, cfg.vocab, &dev).unwrap();
    compare("vit", &cfg, &images, &labels, None, INEXACT);
}
