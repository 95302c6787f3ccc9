//! Efficient attention: the same loss and gradients as the standard attention (within f32
//! rounding, bound stated below), and a graph without the A·B·S² terms.

use candle_core::{DType, Device};
use candle_nn::{VarBuilder, VarMap};
use memfit::formula::replay::replay;
use memfit::formula::transformer::Shape;
use memfit::model::kernels::Kernels;
use memfit::model::transformer::{Config, Transformer, synthetic_batch};

/// Both attentions on the same weights (one VarMap), with either kernel set around the
/// efficient one: the loss agrees to 1e-6 relative and every
/// gradient element to 1e-5 of the largest gradient element of the model (measured 8.9e-7).
/// The online softmax sums in another order, so bit equality is not expected; the k biases'
/// gradients are mathematically zero (softmax ignores a per-row shift) and both are ~1e-9 noise.
#[test]
fn gradients_match_standard_attention() {
    // Composed and fused kernels around the efficient attention (fused passes no mask tensor:
    // the decoder must stay causal all the same), and the tiled composition.
    for (kernels, tiled) in [
        (Kernels::Composed, false),
        (Kernels::Fused, false),
        (Kernels::Fused, true),
    ] {
        compare_to_standard(kernels, tiled);
    }
}

fn compare_to_standard(kernels: Kernels, tiled: bool) {
    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let cfg = Config::new(60, 48, 4, 2, 37);
    let standard =
        Transformer::new(&cfg, VarBuilder::from_varmap(&varmap, DType::F32, &dev)).unwrap();
    let efficient = Transformer::new(
        &Config {
            efficient_attention: !tiled,
            tiled_attention: tiled,
            kernels,
            ..cfg.clone()
        },
        VarBuilder::from_varmap(&varmap, DType::F32, &dev),
    )
    .unwrap();
    let (tokens, targets) = synthetic_batch(3, 37, 60, &dev).unwrap();
    let loss_s = Transformer::loss(&standard.forward(&tokens).unwrap(), &targets).unwrap();
    let loss_e = Transformer::loss(&efficient.forward(&tokens).unwrap(), &targets).unwrap();
    let (ls, le) = (
        loss_s.to_scalar::<f32>().unwrap(),
        loss_e.to_scalar::<f32>().unwrap(),
    );
    assert!(
        ((ls - le) / ls).abs() < 1e-6,
        "{kernels:?} tiled={tiled}: loss {ls} vs {le}"
    );
    let (gs, ge) = (loss_s.backward().unwrap(), loss_e.backward().unwrap());
    let (mut largest, mut worst) = (0f32, 0f32);
    for v in varmap.all_vars() {
        let a = gs
            .get(v.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let b = ge
            .get(v.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        largest = a.iter().fold(largest, |m, x| m.max(x.abs()));
        worst = a
            .iter()
            .zip(&b)
            .fold(worst, |m, (x, y)| m.max((x - y).abs()));
    }
    eprintln!(
        "{kernels:?} tiled={tiled}: worst gradient difference {worst:e}, largest gradient {largest:e}"
    );
    assert!(
        worst <= 1e-5 * largest,
        "{kernels:?} tiled={tiled}: {worst} vs {largest}"
    );
}

/// The replayed graph of efficient attention is the standard one minus exactly
/// `4·L·(6·A·B·S² + 2·A·B·S + 4·B·S·H) + 4·S²` bytes: no A·B·S² term is left, not even the
/// causal mask's S² (no graph node holds it any more), and neither the contiguous head splits
/// of q, k, v nor the merged heads' copy (the op reads the projections through their strides
/// and writes `(B, S, A, D)`; with one head they are views on both sides).
#[test]
fn no_abs2_term_in_the_graph() {
    for (b, s, h, a, l, v) in [
        (2, 64, 64, 4, 2, 100),
        (1, 97, 96, 3, 3, 50),
        (3, 16, 32, 1, 1, 20),
    ] {
        let standard = Shape::new(b, s, h, a, l, v, s);
        let efficient = Shape {
            efficient: true,
            ..standard.clone()
        };
        let rs = replay(&standard, 0, None);
        let re = replay(&efficient, 0, None);
        // One head: the split and the merge are views already (a dimension of 1 has no stride).
        let split = if a > 1 { 4 * b * s * h } else { 0 };
        assert_eq!(
            rs.forward_retained - re.forward_retained,
            4 * l * (6 * a * b * s * s + 2 * a * b * s + split) + 4 * s * s,
            "B {b} S {s} H {h} A {a} L {l}"
        );
    }
}
