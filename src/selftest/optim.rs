//! The in-place optimizers (`optim::inplace`) take the same steps as the ones they replace
//! (candle-nn's SGD and AdamW, memfit's momentum SGD) on the same gradients, in f32 and f16, on
//! the device under test (on CUDA: the updates of `fused.cu`).

use crate::optim::Opt;
use crate::phase::OptimizerKind;
use candle_core::backprop::GradStore;
use candle_core::{DType, Tensor, Var};

use super::dev;

fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) as f32 / (1u64 << 31) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Parameters of three shapes (one with a strided gradient), in `dtype`.
fn params(dtype: DType) -> Vec<Var> {
    [(vec![7, 5], 1), (vec![13], 2), (vec![4, 6], 3)]
        .into_iter()
        .map(|(dims, seed)| {
            let n = dims.iter().product();
            let t = Tensor::from_vec(values(n, seed, 1.0), dims, &dev())
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            Var::from_tensor(&t).unwrap()
        })
        .collect()
}

/// Gradients for `vars` at step `k`, of magnitude 0.25–0.5 (so that f16's `(1 − β₂)·g²`
/// stays representable: smaller ones underflow to 0 and both AdamWs divide by 0 in pure f16);
/// the third is a transposed (strided) view.
fn grads(vars: &[Var], k: u64) -> GradStore {
    let values = |n, seed, _| -> Vec<f32> {
        values(n, seed, 1.0)
            .into_iter()
            .map(|v| v.signum() * (0.25 + 0.25 * v.abs()))
            .collect()
    };
    let mut g = GradStore::default();
    for (i, v) in vars.iter().enumerate() {
        let dims = v.dims().to_vec();
        let t = if i == 2 {
            let (a, b) = (dims[0], dims[1]);
            Tensor::from_vec(values(a * b, 100 + k, 0.5), (b, a), &dev())
                .unwrap()
                .t()
                .unwrap()
        } else {
            Tensor::from_vec(values(v.elem_count(), 10 * k + i as u64, 0.5), dims, &dev()).unwrap()
        };
        assert_eq!(t.is_contiguous(), i != 2);
        g.insert(v.as_tensor(), t.to_dtype(v.dtype()).unwrap());
    }
    g
}

pub fn in_place_steps_equal_the_reference_steps() {
    for dtype in [DType::F32, DType::F16] {
        for kind in [
            OptimizerKind::Sgd,
            OptimizerKind::SgdMomentum,
            OptimizerKind::Adam,
            OptimizerKind::Adamw,
        ] {
            let (a, b) = (params(dtype), params(dtype));
            let mut reference = Opt::build(kind, a.clone(), 2048, false).unwrap();
            let mut in_place = Opt::build(kind, b.clone(), 2048, true).unwrap();
            assert!(matches!(in_place, Opt::InPlace(_)));
            for k in 0..6 {
                reference.step(&grads(&a, k)).unwrap();
                in_place.step(&grads(&b, k)).unwrap();
            }
            let tol = if dtype == DType::F32 { 1e-6 } else { 2e-3 };
            for (x, y) in a.iter().zip(&b) {
                let (x, y) = (
                    x.to_dtype(DType::F32).unwrap(),
                    y.to_dtype(DType::F32).unwrap(),
                );
                let diff = (&x - &y)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap();
                let scale = x
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap();
                println!(
                    "{kind:?} {dtype:?}: largest difference {:.2e}",
                    diff / scale
                );
                assert!(
                    scale.is_finite(),
                    "{kind:?} {dtype:?}: the reference diverged"
                );
                assert!(diff <= tol * scale, "{kind:?} {dtype:?}: {diff} of {scale}");
            }
        }
    }
}

/// The steps move the weights (a step that did nothing would pass the comparison above).
pub fn in_place_steps_change_the_weights() {
    let vars = params(DType::F32);
    let before: Vec<Vec<f32>> = vars
        .iter()
        .map(|v| v.flatten_all().unwrap().to_vec1().unwrap())
        .collect();
    let mut opt = Opt::build(OptimizerKind::Adamw, vars.clone(), 2048, true).unwrap();
    opt.step(&grads(&vars, 0)).unwrap();
    for (v, b) in vars.iter().zip(before) {
        let after: Vec<f32> = v.flatten_all().unwrap().to_vec1().unwrap();
        assert!(
            after.iter().zip(&b).all(|(x, y)| x != y),
            "a weight did not move"
        );
    }
}
