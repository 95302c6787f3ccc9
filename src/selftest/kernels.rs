//! The fused kernels (`model::kernels`) against candle's composed ops: the same forward values
//! and the same gradients, per op in f32, f16 and bf16, and on whole models of every family (the
//! fused model and the composed model share their weights). Each comparison prints its
//! largest difference relative to the largest composed value, and fails on any non-finite
//! value (a max-based comparison alone would let NaN through).
//!
//! Run by `memfit selftest --device D` (on the GPU machine: the CUDA forwards of `fused.cu`
//! against candle's own CUDA ops) and by `tests/selftest.rs` (the CPU, or `MEMFIT_TEST_DEVICE`).

use crate::model::kernels::{self, Kernels};
use crate::model::transformer::{Config, Transformer, synthetic_batch};
use crate::model::{llama, rotary, vit};
use candle_core::quantized::GgmlDType;
use candle_core::{D, DType, Device, Tensor, Var};
use candle_nn::{VarBuilder, VarMap, ops};

use super::dev;

/// Deterministic values in about −1..1 (an LCG), shaped `dims`, in `dtype`.
fn data(dims: &[usize], seed: u64, dtype: DType) -> Tensor {
    let n: usize = dims.iter().product();
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let v: Vec<f32> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        })
        .collect();
    Tensor::from_vec(v, dims, &dev())
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

fn var(dims: &[usize], seed: u64, dtype: DType) -> Var {
    Var::from_tensor(&data(dims, seed, dtype)).unwrap()
}

/// Panics unless every value of `t` is finite (`what` names it): `max |a − b|` alone can skip
/// a NaN, since every comparison with one is false.
fn finite(t: &Tensor, what: &str) {
    let v: Vec<f32> = t
        .to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    if let Some(i) = v.iter().position(|x| !x.is_finite()) {
        panic!("{what}: element {i} of {} is {}", v.len(), v[i]);
    }
}

/// `max |a − b| / max |b|`, in f32.
fn rel(a: &Tensor, b: &Tensor) -> f32 {
    let a = a.to_dtype(DType::F32).unwrap();
    let b = b.to_dtype(DType::F32).unwrap();
    let diff = (a - &b).unwrap().abs().unwrap().max_all().unwrap();
    let scale = b.abs().unwrap().max_all().unwrap();
    diff.to_scalar::<f32>().unwrap() / scale.to_scalar::<f32>().unwrap().max(1e-30)
}

/// The largest relative difference accepted: about 20 units in the last place of the type.
fn tolerance(dtype: DType) -> f32 {
    match dtype {
        DType::F32 => 1e-5,
        DType::BF16 => 5e-2,
        _ => 1e-2,
    }
}

/// Runs the fused op on the args in `dtype` and the composed op on the same values in f32 (the
/// reference: candle's composed ops lose precision of their own in 16 bits — its f16 softmax
/// backward over 770 keys is off by 100 % of the largest gradient, where the fused op is within
/// 9·10⁻⁴ of f32), weights each output element by a fixed random tensor, and compares the
/// outputs and the gradients of every arg. `composed` must cast any tensor it captures to its
/// args' type.
fn compare(
    name: &str,
    args: &[Var],
    dtype: DType,
    fused: impl Fn(&[Tensor]) -> Tensor,
    composed: impl Fn(&[Tensor]) -> Tensor,
) {
    let ts: Vec<Tensor> = args.iter().map(|v| v.as_tensor().clone()).collect();
    let refs: Vec<Var> = args
        .iter()
        .map(|v| {
            Var::from_tensor(&v.as_tensor().to_dtype(DType::F32).unwrap().copy().unwrap()).unwrap()
        })
        .collect();
    let ts32: Vec<Tensor> = refs.iter().map(|v| v.as_tensor().clone()).collect();
    let (yf, yc) = (fused(&ts), composed(&ts32));
    let r = data(yc.dims(), 99, dtype);
    let r32 = r.to_dtype(DType::F32).unwrap();
    let loss = |y: &Tensor, r: &Tensor| (y * r).unwrap().sum_all().unwrap();
    let (gf, gc) = (
        loss(&yf, &r).backward().unwrap(),
        loss(&yc, &r32).backward().unwrap(),
    );
    let tol = tolerance(dtype);
    finite(&yf, &format!("{name} {dtype:?}: fused output"));
    finite(&yc, &format!("{name} {dtype:?}: composed output"));
    let out = rel(&yf, &yc);
    println!("{name} {dtype:?}: output {out:.2e}");
    assert!(out <= tol, "{name} {dtype:?}: outputs differ by {out}");
    for (i, (t, t32)) in ts.iter().zip(&ts32).enumerate() {
        let (Some(a), Some(b)) = (gf.get(t), gc.get(t32)) else {
            panic!("{name} {dtype:?}: arg {i} has no gradient")
        };
        finite(a, &format!("{name} {dtype:?}: fused gradient of arg {i}"));
        let e = rel(a, b);
        println!("{name} {dtype:?}: gradient of arg {i} {e:.2e}");
        assert!(e <= tol, "{name} {dtype:?}: gradient {i} differs by {e}");
    }
}

/// The element types an op is checked in: f32, f16 and bf16 (bf16 on the CPU only for ops
/// without a matmul: candle 0.11.1's CPU matmul has no bf16).
fn dtypes(matmul: bool) -> Vec<DType> {
    let mut d = vec![DType::F32, DType::F16];
    if !matmul || !dev().is_cpu() {
        d.push(DType::BF16);
    }
    d
}

pub fn layer_norm_matches_layer_norm_slow() {
    for dtype in dtypes(false) {
        let args = [
            var(&[2, 5, 24], 1, dtype),
            var(&[24], 2, dtype),
            var(&[24], 3, dtype),
        ];
        compare(
            "layer_norm",
            &args,
            dtype,
            |a| kernels::layer_norm(&a[0], &a[1], &a[2], 1e-5).unwrap(),
            |a| ops::layer_norm_slow(&a[0], &a[1], &a[2], 1e-5).unwrap(),
        );
    }
}

pub fn rms_norm_matches_rms_norm_slow() {
    for dtype in dtypes(false) {
        let args = [var(&[3, 4, 32], 4, dtype), var(&[32], 5, dtype)];
        compare(
            "rms_norm",
            &args,
            dtype,
            |a| kernels::rms_norm(&a[0], &a[1], 1e-5).unwrap(),
            |a| ops::rms_norm_slow(&a[0], &a[1], 1e-5).unwrap(),
        );
    }
}

pub fn gelu_matches_candle_gelu() {
    for dtype in dtypes(false) {
        // Wider than −1..1, to reach the tails.
        let x = Var::from_tensor(&(data(&[4, 7, 33], 6, dtype) * 4.0).unwrap()).unwrap();
        compare(
            "gelu",
            &[x],
            dtype,
            |a| kernels::gelu(&a[0]).unwrap(),
            |a| a[0].gelu().unwrap(),
        );
    }
}

pub fn silu_mul_matches_silu_times_up() {
    for dtype in dtypes(false) {
        let g = Var::from_tensor(&(data(&[2, 9, 40], 7, dtype) * 3.0).unwrap()).unwrap();
        let args = [g, var(&[2, 9, 40], 8, dtype)];
        compare(
            "silu_mul",
            &args,
            dtype,
            |a| kernels::silu_mul(&a[0], &a[1]).unwrap(),
            |a| (a[0].silu().unwrap() * &a[1]).unwrap(),
        );
    }
}

/// gpt-oss's clamped SwiGLU against its composition from candle's ops (`minimum`, `clamp`,
/// the sigmoid composed): gate and up spread over ±10, so both clamps cut (forward and
/// gradients).
pub fn oss_glu_matches_its_composition() {
    for dtype in dtypes(false) {
        let g = Var::from_tensor(&(data(&[2, 9, 40], 41, dtype) * 10.0).unwrap()).unwrap();
        let u = Var::from_tensor(&(data(&[2, 9, 40], 42, dtype) * 10.0).unwrap()).unwrap();
        compare(
            "oss_glu",
            &[g, u],
            dtype,
            |a| kernels::oss_glu(&a[0], &a[1]).unwrap(),
            |a| {
                let g = a[0].minimum(7.0).unwrap();
                let u = a[1].clamp(-7.0, 7.0).unwrap();
                let s = ((g.affine(-1.702, 0.0).unwrap().exp().unwrap() + 1.0).unwrap())
                    .recip()
                    .unwrap();
                ((u + 1.0).unwrap() * (g * s).unwrap()).unwrap()
            },
        );
    }
}

/// The fused linear with and without a bias against candle-nn's `Linear`.
pub fn linear_matches_candle_nn_linear() {
    for dtype in dtypes(true) {
        let args = [
            var(&[3, 5, 24], 13, dtype),
            var(&[40, 24], 14, dtype),
            var(&[40], 15, dtype),
        ];
        compare(
            "linear",
            &args,
            dtype,
            |a| kernels::linear(&a[0], &a[1], &a[2]).unwrap(),
            |a| {
                use candle_core::Module;
                candle_nn::Linear::new(a[1].clone(), Some(a[2].clone()))
                    .forward(&a[0])
                    .unwrap()
            },
        );
        compare(
            "linear without bias",
            &args[..2],
            dtype,
            |a| kernels::linear_no_bias(&a[0], &a[1]).unwrap(),
            |a| {
                use candle_core::Module;
                candle_nn::Linear::new(a[1].clone(), None)
                    .forward(&a[0])
                    .unwrap()
            },
        );
    }
}

/// The projection into the residual (`x + h·wᵀ` as one op) against candle-nn's `Linear`
/// (no bias) plus the residual, gradients of h, w and x included; with a frozen (detached)
/// weight it computes no weight gradient and still passes h's and x's.
pub fn linear_add_matches_the_projection_and_sum() {
    use candle_core::Module;
    for dtype in dtypes(true) {
        let args = [
            var(&[3, 5, 24], 41, dtype),
            var(&[40, 24], 42, dtype),
            var(&[3, 5, 40], 43, dtype),
        ];
        compare(
            "linear_add",
            &args,
            dtype,
            |a| kernels::linear_add(&a[0], &a[1], &a[2]).unwrap(),
            |a| {
                let y = candle_nn::Linear::new(a[1].clone(), None)
                    .forward(&a[0])
                    .unwrap();
                (&a[2] + y).unwrap()
            },
        );
        let (h, w, x) = (&args[0], args[1].as_tensor().detach(), &args[2]);
        let y = kernels::linear_add(h.as_tensor(), &w, x.as_tensor()).unwrap();
        let g = y.sum_all().unwrap().backward().unwrap();
        assert!(
            g.get(&w).is_none(),
            "linear_add {dtype:?}: a frozen weight got a gradient"
        );
        assert!(g.get(h.as_tensor()).is_some() && g.get(x.as_tensor()).is_some());
    }
}

/// The mixture of experts' fused ops against their compositions: an expert's down projection
/// times its routing weights (`(h·wᵀ) ⊙ s`, with s a contiguous `(n, 1)` and, as the model
/// passes it, a column of the `(n, E)` weights), and the combine (rows added into `(T, H)`
/// zeros at their tokens, a token hit twice), gradients included.
pub fn moe_ops_match_their_compositions() {
    use candle_core::Module;
    let (n, inp, out, experts, t) = (7, 24, 40, 4, 5);
    for dtype in dtypes(true) {
        let down = |a: &[Tensor], s: &Tensor| {
            candle_nn::Linear::new(a[1].clone(), None)
                .forward(&a[0])
                .unwrap()
                .broadcast_mul(s)
                .unwrap()
        };
        let args = [
            var(&[n, inp], 51, dtype),
            var(&[out, inp], 52, dtype),
            var(&[n, 1], 53, dtype),
        ];
        compare(
            "linear_scaled",
            &args,
            dtype,
            |a| kernels::linear_scaled(&a[0], &a[1], &a[2]).unwrap(),
            |a| down(a, &a[2]),
        );
        let args = [
            var(&[n, inp], 54, dtype),
            var(&[out, inp], 55, dtype),
            var(&[n, experts], 56, dtype),
        ];
        let col = |w: &Tensor| w.narrow(1, 2, 1).unwrap();
        compare(
            "linear_scaled, a column of the routing weights",
            &args,
            dtype,
            |a| kernels::linear_scaled(&a[0], &a[1], &col(&a[2])).unwrap(),
            |a| down(a, &col(&a[2])),
        );
        let ids = Tensor::from_vec(vec![0u32, 3, 1, 3, 4, 0, 2], n, &dev()).unwrap();
        compare(
            "scatter_rows",
            &[var(&[n, out], 57, dtype)],
            dtype,
            |a| kernels::scatter_rows(&a[0], &ids, t).unwrap(),
            |a| {
                Tensor::zeros((t, out), a[0].dtype(), &dev())
                    .unwrap()
                    .index_add(&ids, &a[0], 0)
                    .unwrap()
            },
        );
    }
}

/// The frozen-linear op (`model::frozen`: LoRA's `op` base, QLoRA and quantized serving) on
/// the device under test against candle's matmul on the same weights: dense, and dequantized
/// from every block type memfit stores (q4_0, q8_0, q4_k, q6_k, FP8 with block scales and
/// MXFP4). The op's input gradient is
/// compared; its weight and bias are frozen (no gradient, by construction).
pub fn frozen_linear_matches_a_matmul_on_its_weights() {
    use crate::model::frozen::{FrozenLinear, FrozenWeight};
    let half = if dev().is_cuda() {
        DType::BF16
    } else {
        DType::F16
    };
    for dtype in [DType::F32, half] {
        let w = data(&[40, 256], 3, DType::F32);
        let b = data(&[40], 4, dtype);
        let x = var(&[6, 256], 5, dtype);
        let dense = FrozenWeight::Dense(w.to_dtype(dtype).unwrap());
        let mut weights = vec![("op".to_string(), dense, w.to_dtype(dtype).unwrap())];
        for q in [
            GgmlDType::Q4_0,
            GgmlDType::Q8_0,
            GgmlDType::Q4K,
            GgmlDType::Q6K,
        ] {
            let fw = FrozenWeight::quantize(&w, q).unwrap();
            let FrozenWeight::Quantized(qt) = &fw else {
                unreachable!()
            };
            let deq = qt.dequantize(&dev()).unwrap().to_dtype(dtype).unwrap();
            weights.push((format!("{q:?}"), fw, deq));
        }
        // FP8 with 128×128 block scales (memfit's own dequantize: a loop on the CPU, its
        // kernel on CUDA) against candle's e4m3 → f32 cast times the block's scale.
        let fw = FrozenWeight::quantize_fp8(&w).unwrap();
        let FrozenWeight::Fp8(f) = &fw else {
            unreachable!()
        };
        let scale = f.scale.reshape((1, 2, 1)).unwrap();
        let deq =
            f.w.to_dtype(DType::F32)
                .unwrap()
                .reshape((40, 2, 128))
                .unwrap()
                .broadcast_mul(&scale)
                .unwrap()
                .reshape((40, 256))
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
        weights.push(("fp8".to_string(), fw, deq));
        // MXFP4 (memfit's loop on the CPU, its kernel on CUDA) against a host decode written
        // as transformers' `convert_moe_packed_tensors` does: a signed table of the 16 nibbles,
        // the low nibble first, times `2^(scale − 127)`.
        let fw = FrozenWeight::quantize_mxfp4(&w).unwrap();
        let FrozenWeight::Mxfp4(m) = &fw else {
            unreachable!()
        };
        const LUT: [f32; 16] = [
            0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
        ];
        let blocks: Vec<u8> = m.blocks.flatten_all().unwrap().to_vec1().unwrap();
        let scales: Vec<u8> = m.scales.flatten_all().unwrap().to_vec1().unwrap();
        let host: Vec<f32> = blocks
            .iter()
            .enumerate()
            .flat_map(|(i, &b)| {
                let s = (scales[i * 2 / 32] as f32 - 127.0).exp2();
                [LUT[(b & 0x0f) as usize] * s, LUT[(b >> 4) as usize] * s]
            })
            .collect();
        let deq = Tensor::from_vec(host, (40, 256), &dev())
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        weights.push(("mxfp4".to_string(), fw, deq));
        for (name, fw, deq) in weights {
            let op = || FrozenLinear {
                weight: fw.clone(),
                bias: Some(b.clone()),
            };
            compare(
                &format!("frozen-linear {name}"),
                std::slice::from_ref(&x),
                dtype,
                |t| t[0].apply_op1(op()).unwrap(),
                |t| {
                    let dt = t[0].dtype();
                    t[0].matmul(&deq.to_dtype(dt).unwrap().t().unwrap())
                        .unwrap()
                        .broadcast_add(&b.to_dtype(dt).unwrap())
                        .unwrap()
                },
            );
        }
    }
}

/// The rotary op against the composed rotation, on a contiguous `(B, n, S, D)` input and on
/// the head split's strided view (`(B, S, n·D)` seen as `(B, S, n, D)ᵀ`, as the fused
/// attention passes it), whose gradient must reach the unsplit tensor.
pub fn rotary_matches_apply_rotary() {
    for dtype in dtypes(false) {
        let (s_max, d, offset, s) = (20, 16, 5, 9);
        let (cos, sin) = rotary::rotary_tables(s_max, d, 10_000.0, None, dtype, &dev()).unwrap();
        let fused = |x: &Tensor| {
            let (c, sn) = (
                cos.narrow(0, offset, s).unwrap(),
                sin.narrow(0, offset, s).unwrap(),
            );
            let y = kernels::rotary(x, &c, &sn).unwrap();
            assert!(y.is_contiguous(), "the rotary op's output is contiguous");
            y
        };
        let composed = |x: &Tensor| {
            let dt = x.dtype();
            let (c, sn) = (cos.to_dtype(dt).unwrap(), sin.to_dtype(dt).unwrap());
            rotary::apply_rotary(x, &c, &sn, offset).unwrap()
        };
        compare(
            "rotary",
            &[var(&[2, 3, s, d], 22, dtype)],
            dtype,
            |a| fused(&a[0]),
            |a| composed(&a[0]),
        );
        let split = |x: &Tensor| x.reshape((2, s, 3, d)).unwrap().transpose(1, 2).unwrap();
        compare(
            "rotary of a strided head split",
            &[var(&[2, s, 3 * d], 23, dtype)],
            dtype,
            |a| fused(&split(&a[0])),
            |a| composed(&split(&a[0]).contiguous().unwrap()),
        );
    }
}

/// The composed attention probabilities: `softmax(q·kᵀ·scale + mask)` with queries at the
/// end of the keys when `causal`.
fn composed_probs(q: &Tensor, k: &Tensor, scale: f64, causal: bool) -> Tensor {
    windowed_probs(q, k, scale, causal, 0)
}

/// [`composed_probs`] with a sliding window (`window` > 0, causal): query `i` of `Sq`, at
/// position `i + Sk − Sq`, sees keys `pos − window + 1 ..= pos`; the mask written out here.
fn windowed_probs(q: &Tensor, k: &Tensor, scale: f64, causal: bool, window: usize) -> Tensor {
    let scores = (q.matmul(&k.t().unwrap()).unwrap() * scale).unwrap();
    let scores = if causal {
        let (sq, sk) = (q.dim(2).unwrap(), k.dim(2).unwrap());
        let mask: Vec<f32> = (0..sq * sk)
            .map(|i| {
                let (pos, key) = (i / sk + (sk - sq), i % sk);
                if key > pos || (window > 0 && pos - key >= window) {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
            .collect();
        let mask = Tensor::from_vec(mask, (sq, sk), &dev())
            .unwrap()
            .to_dtype(q.dtype())
            .unwrap();
        scores.broadcast_add(&mask).unwrap()
    } else {
        scores
    };
    ops::softmax(&scores, D::Minus1).unwrap()
}

/// A sliding window (query `i` sees `i − W + 1 ..= i`): the fused probabilities against the
/// composed softmax with memfit's windowed mask, and the mask against a hand-written one.
pub fn attn_probs_with_a_sliding_window() {
    let mask = crate::model::attention::windowed_mask(4, 4, 0, Some(2), &Device::Cpu).unwrap();
    let inf = f32::NEG_INFINITY;
    assert_eq!(
        mask.to_vec2::<f32>().unwrap(),
        vec![
            vec![0., inf, inf, inf],
            vec![0., 0., inf, inf],
            vec![inf, 0., 0., inf],
            vec![inf, inf, 0., 0.],
        ]
    );
    for (sq, sk, w) in [(11, 11, 4), (3, 9, 5)] {
        for dtype in dtypes(true) {
            let d = 8;
            let scale = 1.0 / (d as f64).sqrt();
            let args = [
                var(&[2, 3, sq, d], 21, dtype),
                var(&[2, 3, sk, d], 22, dtype),
            ];
            compare(
                &format!("attn_probs {sq}x{sk} window {w}"),
                &args,
                dtype,
                |a| kernels::attn_probs(&a[0], &a[1], scale as f32, true, Some(w)).unwrap(),
                |a| {
                    let scores = (a[0].matmul(&a[1].t().unwrap()).unwrap() * scale).unwrap();
                    let m =
                        crate::model::attention::windowed_mask(sq, sk, sk - sq, Some(w), &dev())
                            .unwrap()
                            .to_dtype(a[0].dtype())
                            .unwrap();
                    ops::softmax(&scores.broadcast_add(&m).unwrap(), D::Minus1).unwrap()
                },
            );
        }
    }
}

pub fn attn_probs_match_the_composed_softmax() {
    // (queries, keys, causal): a decoder, a prompt after a cache, an encoder.
    for (sq, sk, causal) in [(11, 11, true), (4, 13, true), (9, 9, false)] {
        for dtype in dtypes(true) {
            let d = 8;
            let scale = 1.0 / (d as f64).sqrt();
            let args = [
                var(&[2, 3, sq, d], 9, dtype),
                var(&[2, 3, sk, d], 10, dtype),
            ];
            compare(
                &format!("attn_probs {sq}x{sk} causal={causal}"),
                &args,
                dtype,
                |a| kernels::attn_probs(&a[0], &a[1], scale as f32, causal, None).unwrap(),
                |a| composed_probs(&a[0], &a[1], scale, causal),
            );
        }
    }
}

/// Rows wider than a CUDA block's 1024 threads: the norms, GELU and SiLU·mul at H = 1536 (the
/// norms' one-pass backward reduces a row across the block and each column over every row), and the
/// attention probabilities over 770 keys (a prompt after a cache, and a full causal square),
/// in every type. A kernel that reduced only one block's share of a row passes the narrow
/// checks above and fails here.
pub fn wide_rows_match_the_composed_ops() {
    let h = 1536;
    for dtype in dtypes(false) {
        let args = [
            var(&[2, 3, h], 31, dtype),
            var(&[h], 32, dtype),
            var(&[h], 33, dtype),
        ];
        compare(
            "layer_norm H 1536",
            &args,
            dtype,
            |a| kernels::layer_norm(&a[0], &a[1], &a[2], 1e-5).unwrap(),
            |a| ops::layer_norm_slow(&a[0], &a[1], &a[2], 1e-5).unwrap(),
        );
        let args = [var(&[2, 3, h], 34, dtype), var(&[h], 35, dtype)];
        compare(
            "rms_norm H 1536",
            &args,
            dtype,
            |a| kernels::rms_norm(&a[0], &a[1], 1e-5).unwrap(),
            |a| ops::rms_norm_slow(&a[0], &a[1], 1e-5).unwrap(),
        );
        let args = [Var::from_tensor(&(data(&[2, 3, h], 40, dtype) * 3.0).unwrap()).unwrap()];
        compare(
            "gelu H 1536",
            &args,
            dtype,
            |a| kernels::gelu(&a[0]).unwrap(),
            |a| a[0].gelu().unwrap(),
        );
        let g = Var::from_tensor(&(data(&[2, 3, h], 36, dtype) * 3.0).unwrap()).unwrap();
        let args = [g, var(&[2, 3, h], 37, dtype)];
        compare(
            "silu_mul H 1536",
            &args,
            dtype,
            |a| kernels::silu_mul(&a[0], &a[1]).unwrap(),
            |a| (a[0].silu().unwrap() * &a[1]).unwrap(),
        );
    }
    for (sq, sk) in [(5, 770), (770, 770)] {
        for dtype in dtypes(true) {
            let d = 8;
            let scale = 1.0 / (d as f64).sqrt();
            let args = [
                var(&[1, 2, sq, d], 38, dtype),
                var(&[1, 2, sk, d], 39, dtype),
            ];
            compare(
                &format!("attn_probs {sq}x{sk} causal"),
                &args,
                dtype,
                |a| kernels::attn_probs(&a[0], &a[1], scale as f32, true, None).unwrap(),
                |a| composed_probs(&a[0], &a[1], scale, true),
            );
        }
    }
}

/// memfit's efficient attention (online softmax, two-pass backward) against the composed
/// `softmax(q·kᵀ·scale + mask)·v`, in f32 and f16, causal, causal with a sliding window of 4
/// and of 1 (each query sees itself only), and not causal.
pub fn efficient_attention_matches_the_composed_attention() {
    use crate::model::efficient_attention::EfficientAttention;
    if !dev().is_cpu() {
        println!("efficient attention: a CPU op (CUDA runs the tiled composition), skipped");
        return;
    }
    for (causal, window) in [(true, 0), (true, 4), (true, 1), (false, 0)] {
        for dtype in dtypes(true) {
            let (s, d) = (13, 8);
            let scale = 1.0 / (d as f64).sqrt();
            let args = [
                var(&[2, 3, s, d], 16, dtype),
                var(&[2, 3, s, d], 17, dtype),
                var(&[2, 3, s, d], 18, dtype),
            ];
            let op = EfficientAttention {
                scale: scale as f32,
                causal,
                window,
            };
            // Contiguous operands, and the transposed head split of a `(B, S, n, D)` tensor
            // (what the model passes: read through its strides, never copied).
            for strided in [false, true] {
                let view = |x: &Tensor| {
                    if strided {
                        let t = x.transpose(1, 2).unwrap().contiguous().unwrap();
                        t.transpose(1, 2).unwrap()
                    } else {
                        x.clone()
                    }
                };
                compare(
                    &format!(
                        "efficient attention causal={causal} window {window} strided={strided}"
                    ),
                    &args,
                    dtype,
                    |a| op.apply(&view(&a[0]), &view(&a[1]), &view(&a[2])).unwrap(),
                    |a| {
                        windowed_probs(&a[0], &a[1], scale, causal, window)
                            .matmul(&a[2])
                            .unwrap()
                    },
                );
            }
        }
    }
}

/// The tiled attention composition (several tiles: S = 300 > 2·TILE), in f32 and f16,
/// causal, causal with sliding windows of 100 (under a tile: later tiles read `TILE + 99`
/// keys from the middle of the sequence) and 200, and not causal, against the composed
/// attention.
pub fn tiled_attention_matches_the_composed_attention() {
    use crate::model::tiled_attention;
    let s = 2 * tiled_attention::TILE + 44;
    for (causal, window) in [(true, 0), (true, 100), (true, 200), (false, 0)] {
        for dtype in dtypes(true) {
            let d = 8;
            let scale = 1.0 / (d as f64).sqrt();
            let args = [
                var(&[1, 2, s, d], 19, dtype),
                var(&[1, 2, s, d], 20, dtype),
                var(&[1, 2, s, d], 21, dtype),
            ];
            compare(
                &format!("tiled attention causal={causal} window {window}"),
                &args,
                dtype,
                |a| {
                    tiled_attention::attention(&a[0], &a[1], &a[2], scale as f32, causal, window)
                        .unwrap()
                        .transpose(1, 2)
                        .unwrap()
                },
                |a| {
                    windowed_probs(&a[0], &a[1], scale, causal, window)
                        .matmul(&a[2])
                        .unwrap()
                },
            );
        }
    }
}

/// Grouped-query attention without repeated keys: the fused probabilities with `P·v` per key
/// head, the efficient op (on the CPU) and the tiled composition, each on q `(B, 6, S, D)`
/// against k, v `(B, 2, S, D)`, equal to the composed attention on keys and values repeated
/// to the query heads (`repeat_kv`, as candle-transformers and transformers do), gradients of
/// k and v included (they sum their three query heads'). A prompt after a cache for the
/// probabilities (`Sq` < `Sk`), several tiles with rows spanning two heads for the tiled one.
pub fn grouped_attention_matches_repeated_keys() {
    let (b, heads, groups, d) = (2, 6, 2, 8);
    let r = heads / groups;
    let scale = 1.0 / (d as f64).sqrt();
    let repeated = |a: &[Tensor], causal: bool, window: usize| {
        let k = rotary::repeat_kv(a[1].clone(), r).unwrap();
        let v = rotary::repeat_kv(a[2].clone(), r).unwrap();
        windowed_probs(&a[0], &k, scale, causal, window)
            .matmul(&v)
            .unwrap()
    };
    for dtype in dtypes(true) {
        for (sq, sk) in [(11, 11), (4, 13)] {
            let args = [
                var(&[b, heads, sq, d], 31, dtype),
                var(&[b, groups, sk, d], 32, dtype),
                var(&[b, groups, sk, d], 33, dtype),
            ];
            compare(
                &format!("grouped attn_probs {sq}x{sk}"),
                &args,
                dtype,
                |a| {
                    let p = kernels::attn_probs(&a[0], &a[1], scale as f32, true, None).unwrap();
                    assert_eq!(p.dims(), [b, groups, r * sq, sk]);
                    p.matmul(&a[2]).unwrap().reshape((b, heads, sq, d)).unwrap()
                },
                |a| repeated(a, true, 0),
            );
        }
        let s = 2 * crate::model::tiled_attention::TILE / r + 17;
        // A window of 30: tiles within one head read keys from the middle; a tile across two
        // heads' rows reads them all.
        for (causal, window) in [(true, 0), (true, 30), (false, 0)] {
            let args = [
                var(&[b, heads, s, d], 34, dtype),
                var(&[b, groups, s, d], 35, dtype),
                var(&[b, groups, s, d], 36, dtype),
            ];
            compare(
                &format!("grouped tiled attention S {s} causal={causal} window {window}"),
                &args,
                dtype,
                |a| {
                    crate::model::tiled_attention::attention(
                        &a[0],
                        &a[1],
                        &a[2],
                        scale as f32,
                        causal,
                        window,
                    )
                    .unwrap()
                    .transpose(1, 2)
                    .unwrap()
                },
                |a| repeated(a, causal, window),
            );
            if dev().is_cpu() {
                let op = crate::model::efficient_attention::EfficientAttention {
                    scale: scale as f32,
                    causal,
                    window,
                };
                compare(
                    &format!("grouped efficient attention S {s} causal={causal} window {window}"),
                    &args,
                    dtype,
                    |a| op.apply(&a[0], &a[1], &a[2]).unwrap(),
                    |a| repeated(a, causal, window),
                );
            }
        }
    }
}

pub fn cross_entropy_matches_candle_nn() {
    for dtype in dtypes(false) {
        let x = Var::from_tensor(&(data(&[12, 50], 11, dtype) * 3.0).unwrap()).unwrap();
        let targets: Vec<u32> = (0..12).map(|i| (i * 7 % 50) as u32).collect();
        let t = Tensor::new(targets, &dev()).unwrap();
        let (lf, lc) = (
            kernels::cross_entropy(x.as_tensor(), &t).unwrap(),
            candle_nn::loss::cross_entropy(x.as_tensor(), &t).unwrap(),
        );
        let tol = tolerance(dtype);
        let out = rel(&lf, &lc);
        let g = rel(
            lf.backward().unwrap().get(x.as_tensor()).unwrap(),
            lc.backward().unwrap().get(x.as_tensor()).unwrap(),
        );
        println!("cross_entropy {dtype:?}: loss {out:.2e}, gradient {g:.2e}");
        assert!(
            out <= tol && g <= tol,
            "{dtype:?}: loss {out}, gradient {g}"
        );
    }
}

/// A target out of range is an error on the CPU (a NaN loss on CUDA, where the targets are not
/// read back), never a read past the row.
pub fn cross_entropy_refuses_a_target_beyond_the_vocabulary() {
    let x = data(&[2, 5], 12, DType::F32);
    let t = Tensor::new(&[1u32, 5], &dev()).unwrap();
    if !dev().is_cpu() {
        let loss = kernels::cross_entropy(&x, &t).unwrap();
        assert!(loss.to_scalar::<f32>().unwrap().is_nan());
        return;
    }
    let err = kernels::cross_entropy(&x, &t).unwrap_err().to_string();
    assert!(err.contains("target 5 of row 1"), "{err}");
}

/// The fused and the composed model on the same weights: the same loss and, for every
/// parameter, the same gradient (none missing, none zero).
/// [`whole_model_with`] for each fused kernel set: the lean one and transformers'.
fn whole_model(name: &str, cfg: Config, input: &Tensor, targets: &Tensor) {
    for kernels in [Kernels::Fused, Kernels::Transformers] {
        let name = format!("{name} {}", kernels.as_str());
        whole_model_with(&name, kernels, cfg.clone(), input, targets);
    }
}

fn whole_model_with(name: &str, kernels: Kernels, cfg: Config, input: &Tensor, targets: &Tensor) {
    let dev = dev();
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let composed = Transformer::new(
        &Config {
            kernels: Kernels::Composed,
            ..cfg.clone()
        },
        vb.clone(),
    )
    .unwrap();
    let fused = Transformer::new(&Config { kernels, ..cfg }, vb).unwrap();
    let lc = composed
        .train_loss(&composed.forward(input).unwrap(), targets)
        .unwrap();
    let lf = fused
        .train_loss(&fused.forward(input).unwrap(), targets)
        .unwrap();
    let loss = rel(&lf, &lc);
    assert!(loss <= 1e-5, "{name}: loss differs by {loss}");
    let (gc, gf) = (lc.backward().unwrap(), lf.backward().unwrap());
    let data = varmap.data().lock().unwrap();
    let max_abs = |t: &Tensor| {
        t.abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    };
    // Gradients that are zero in exact arithmetic (the key bias: a constant added to every
    // key leaves the softmax unchanged) are rounding noise in both (the weights are drawn
    // afresh each run); they are compared against 1e-2 of the model's largest gradient
    // instead of their own size.
    let largest = data
        .values()
        .filter_map(|v| gc.get(v.as_tensor()))
        .map(max_abs)
        .fold(0f32, f32::max);
    let mut worst = (0f32, String::new());
    for (pname, v) in data.iter() {
        let (Some(a), Some(b)) = (gf.get(v.as_tensor()), gc.get(v.as_tensor())) else {
            panic!("{name}: {pname} has no gradient")
        };
        let norm = a
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(norm > 0.0, "{name}: {pname}'s fused gradient is all zeros");
        let diff = max_abs(&(a - b).unwrap());
        let e = diff / max_abs(b).max(1e-2 * largest);
        if e > worst.0 {
            worst = (e, pname.clone());
        }
    }
    println!(
        "{name}: {} parameters, loss {loss:.2e}, worst gradient {:.2e} ({})",
        data.len(),
        worst.0,
        worst.1
    );
    assert!(
        worst.0 <= 1e-4,
        "{name}: {} differs by {}",
        worst.1,
        worst.0
    );
}

pub fn gpt_fused_gradients_equal_composed() {
    let cfg = Config::new(53, 30, 3, 2, 19);
    let (tokens, targets) = synthetic_batch(2, 19, cfg.vocab, &dev()).unwrap();
    whole_model("gpt", cfg, &tokens, &targets);
}

pub fn llama_fused_gradients_equal_composed() {
    let cfg = llama::tiny();
    let (tokens, targets) = synthetic_batch(2, 17, cfg.vocab, &dev()).unwrap();
    whole_model("llama", cfg, &tokens, &targets);
}

pub fn vit_fused_gradients_equal_composed() {
    let sizes = vit::preset("vit-tiny").unwrap();
    let cfg = Config::vit(sizes);
    let (images, labels) = vit::synthetic_batch(2, sizes.vision, cfg.vocab, &dev()).unwrap();
    whole_model("vit", cfg, &images, &labels);
}

/// Multi-head latent attention decoding over the latent (the absorbed form, memfit's default)
/// against the decompressed form on the same weights: a DeepSeek-V3-like config (q
/// compression, 4 heads, kv_lora_rank 16, nope 8, rope 4, v 6; dense), a prompt of 5 tokens,
/// then 4 steps one token at a time, each step's logits compared, with candle's composed ops
/// and with the fused kernels.
pub fn mla_absorbed_decode_matches_decompressed() {
    let dev = dev();
    let json = r#"{"model_type": "deepseek_v3", "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
        "vocab_size": 64, "max_position_embeddings": 32, "q_lora_rank": 24,
        "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6,
        "n_routed_experts": null, "rms_norm_eps": 1e-6, "hidden_act": "silu"}"#;
    let base = crate::model::hf_config::parse(json, "<selftest>")
        .unwrap()
        .cfg;
    let (tokens, _) = synthetic_batch(2, 9, base.vocab, &dev).unwrap();
    for kernels in [Kernels::Composed, Kernels::Fused] {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
        let with = |decompressed: bool| {
            let mut cfg = Config {
                kernels,
                ..base.clone()
            };
            if let Some(l) = cfg.llama.as_mut() {
                l.mla.as_mut().unwrap().decompressed_decode = decompressed;
            }
            Transformer::new(&cfg, vb.clone()).unwrap()
        };
        let (absorbed, decompressed) = (with(false), with(true));
        let mut caches = [
            crate::model::transformer::KvCache::default(),
            crate::model::transformer::KvCache::default(),
        ];
        for t in 5..=9 {
            let input = if t == 5 {
                tokens.narrow(1, 0, 5).unwrap()
            } else {
                tokens.narrow(1, t - 1, 1).unwrap()
            };
            let [ca, cd] = &mut caches;
            let a = absorbed.forward_cached(&input, ca).unwrap();
            let d = decompressed.forward_cached(&input, cd).unwrap();
            finite(&a, &format!("mla {kernels:?} step {t}: absorbed logits"));
            let e = rel(&a, &d);
            println!("mla {kernels:?} tokens {t}: absorbed against decompressed {e:.2e}");
            assert!(
                e <= 1e-5,
                "mla {kernels:?} tokens {t}: logits differ by {e}"
            );
        }
    }
}
