//! AdamW with 8-bit blockwise-quantized moments.
//!
//! Each parameter tensor's first moment m and second moment v are stored as one byte per element
//! in the non-linear codes of [`super::code8`] (signed for m, unsigned for v), with one f32
//! absmax scale per block of `block` elements, on the parameter's device. A step, per tensor:
//! copy θ and g to host f32 vectors and the codes and scales to host vectors; for each block,
//! dequantize m and v into two block buffers, apply the AdamW update in f32, and quantize the
//! block back with its new absmax; write θ back (`Var::set`) and replace the state tensors.
//!
//! State bytes: `Σ_t 2·(n_t + 4·⌈n_t/block⌉)`. Step temporaries, largest tensor n (host memory,
//! which on the CPU backend is the device): `4n` (g) + `4n` (θ) + `2n` (codes) + `8⌈n/block⌉`
//! (scales) + `8·block` (block buffers).

use candle_core::backprop::GradStore;
use candle_core::{DType, Result, Tensor, Var};
use candle_nn::Optimizer;

use super::code8::{Code, dequantize_block, quantize};

#[derive(Debug, Clone, Copy)]
pub struct Params {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// Elements per quantization block.
    pub block: usize,
}

impl Default for Params {
    /// candle-nn's AdamW defaults, blocks of 2048.
    fn default() -> Self {
        Self {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            block: 2048,
        }
    }
}

/// Quantized moments of one parameter tensor.
struct State {
    var: Var,
    m_codes: Tensor,
    m_scales: Tensor,
    v_codes: Tensor,
    v_scales: Tensor,
}

pub struct AdamW8bit {
    states: Vec<State>,
    params: Params,
    step_t: i32,
    signed: Code,
    unsigned: Code,
}

/// Host bytes of the optimizer object itself (it lives in a `Box`; its two code tables' sorted
/// copies are inside the per-tensor metadata constant of the formula).
pub fn object_bytes() -> u64 {
    std::mem::size_of::<AdamW8bit>() as u64
}

/// Bytes of the state of a tensor of `n` elements: two code arrays and two scale arrays.
pub fn state_bytes(n: u64, block: u64) -> u64 {
    2 * (n + 4 * n.div_ceil(block))
}

impl Optimizer for AdamW8bit {
    type Config = Params;

    fn new(vars: Vec<Var>, params: Params) -> Result<Self> {
        if params.block == 0 {
            candle_core::bail!("adamw-8bit: the block size must be at least 1");
        }
        let states = vars
            .into_iter()
            .filter(|v| v.dtype().is_float())
            .map(|var| {
                let n = var.elem_count();
                let nb = n.div_ceil(params.block);
                let dev = var.device().clone();
                Ok(State {
                    m_codes: Tensor::zeros(n, DType::U8, &dev)?,
                    m_scales: Tensor::zeros(nb, DType::F32, &dev)?,
                    v_codes: Tensor::zeros(n, DType::U8, &dev)?,
                    v_scales: Tensor::zeros(nb, DType::F32, &dev)?,
                    var,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            states,
            params,
            step_t: 0,
            signed: Code::signed(),
            unsigned: Code::unsigned(),
        })
    }

    fn learning_rate(&self) -> f64 {
        self.params.lr
    }

    fn set_learning_rate(&mut self, lr: f64) {
        self.params.lr = lr;
    }

    fn step(&mut self, grads: &GradStore) -> Result<()> {
        self.step_t += 1;
        let p = self.params;
        let (b1, b2) = (p.beta1 as f32, p.beta2 as f32);
        let scale_m = (1.0 / (1.0 - p.beta1.powi(self.step_t))) as f32;
        let scale_v = (1.0 / (1.0 - p.beta2.powi(self.step_t))) as f32;
        let decay = (1.0 - p.lr * p.weight_decay) as f32;
        let (lr, eps) = (p.lr as f32, p.eps as f32);
        for s in &mut self.states {
            let Some(g) = grads.get(s.var.as_tensor()) else {
                continue;
            };
            let theta_t = s.var.as_detached_tensor();
            let (dtype, shape, dev) = (
                theta_t.dtype(),
                theta_t.shape().clone(),
                theta_t.device().clone(),
            );
            let g: Vec<f32> = g.flatten_all()?.to_dtype(DType::F32)?.to_vec1()?;
            let mut theta: Vec<f32> = theta_t.flatten_all()?.to_dtype(DType::F32)?.to_vec1()?;
            drop(theta_t);
            let mut m_codes: Vec<u8> = s.m_codes.to_vec1()?;
            let mut v_codes: Vec<u8> = s.v_codes.to_vec1()?;
            let mut m_scales: Vec<f32> = s.m_scales.to_vec1()?;
            let mut v_scales: Vec<f32> = s.v_scales.to_vec1()?;
            let mut mb = vec![0f32; p.block];
            let mut vb = vec![0f32; p.block];
            for (b, start) in (0..theta.len()).step_by(p.block).enumerate() {
                let end = (start + p.block).min(theta.len());
                let len = end - start;
                dequantize_block(
                    &self.signed,
                    &m_codes[start..end],
                    m_scales[b],
                    &mut mb[..len],
                );
                dequantize_block(
                    &self.unsigned,
                    &v_codes[start..end],
                    v_scales[b],
                    &mut vb[..len],
                );
                for i in 0..len {
                    let gi = g[start + i];
                    let m = b1 * mb[i] + (1.0 - b1) * gi;
                    let v = b2 * vb[i] + (1.0 - b2) * gi * gi;
                    mb[i] = m;
                    vb[i] = v;
                    let update = (m * scale_m) / ((v * scale_v).sqrt() + eps);
                    theta[start + i] = theta[start + i] * decay - lr * update;
                }
                quantize(
                    &self.signed,
                    &mb[..len],
                    p.block,
                    &mut m_codes[start..end],
                    &mut m_scales[b..=b],
                );
                quantize(
                    &self.unsigned,
                    &vb[..len],
                    p.block,
                    &mut v_codes[start..end],
                    &mut v_scales[b..=b],
                );
            }
            drop((g, mb, vb));
            let n = theta.len();
            let nb = m_scales.len();
            s.var
                .set(&Tensor::from_vec(theta, shape, &dev)?.to_dtype(dtype)?)?;
            s.m_codes = Tensor::from_vec(m_codes, n, &dev)?;
            s.v_codes = Tensor::from_vec(v_codes, n, &dev)?;
            s.m_scales = Tensor::from_vec(m_scales, nb, &dev)?;
            s.v_scales = Tensor::from_vec(v_scales, nb, &dev)?;
        }
        Ok(())
    }
}
