//! Frozen projections for LoRA and QLoRA: `y = x·Wᵀ + b` whose backward gives the input its
//! gradient and the weight none.
//!
//! candle differentiates every operand of a matmul, frozen or not: a detached weight's
//! gradient is still computed and, belonging to no tracked node, stays in the gradient store
//! until the store is dropped (measured: LoRA on detached weights peaks above full training).
//! [`FrozenLinear`] is a candle `CustomOp1` on the input only, so the weight and bias are not
//! operands and get no gradient. Its weight is dense (`lora_base = "op"`) or quantized (QLoRA:
//! `q4_0`, `q8_0`, candle's GGML block formats, dequantized to f32 inside each call and dropped
//! after it).
//!
//! Memory per call (CPU, f32, `r` rows, `in → out`): forward — a copy of the input `4·r·in`,
//! the dequantized weight `4·out·in` (quantized only), the product `4·r·out` (+ gemm's packing),
//! then the bias sum `4·r·out` and the returned copy `4·r·out`; backward — the dequantized
//! weight (quantized only) and the input gradient `4·r·in`.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{CpuStorage, CustomOp1, Device, Layout, Result, Shape, Tensor, bail};

/// A frozen weight `(out, in)`: dense, or quantized in GGML blocks.
#[derive(Debug, Clone)]
pub enum FrozenWeight {
    Dense(Tensor),
    Quantized(Arc<QTensor>),
}

impl FrozenWeight {
    /// The weight as an f32 tensor: the same tensor, or a fresh dequantized copy.
    fn dense(&self) -> Result<Tensor> {
        match self {
            FrozenWeight::Dense(t) => Ok(t.clone()),
            FrozenWeight::Quantized(q) => q.dequantize(&Device::Cpu),
        }
    }

    /// Quantizes `w` (last dimension a multiple of the block size: 32 for Q4_0 and Q8_0).
    pub fn quantize(w: &Tensor, dtype: GgmlDType) -> Result<Self> {
        Ok(FrozenWeight::Quantized(Arc::new(QTensor::quantize(
            w, dtype,
        )?)))
    }
}

/// Bytes of a GGML-quantized `(out, in)` weight: Q4_0 18 B and Q8_0 34 B per block of 32.
pub fn quantized_bytes(elems: u64, dtype: GgmlDType) -> u64 {
    let per_block = match dtype {
        GgmlDType::Q4_0 => 18,
        GgmlDType::Q8_0 => 34,
        _ => panic!("memfit's QLoRA stores q4_0 or q8_0"),
    };
    elems / 32 * per_block
}

/// `x (r, in) → x·Wᵀ + b (r, out)` with a gradient for x only.
#[derive(Debug, Clone)]
pub struct FrozenLinear {
    pub weight: FrozenWeight,
    pub bias: Option<Tensor>,
}

impl CustomOp1 for FrozenLinear {
    fn name(&self) -> &'static str {
        "frozen-linear"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(data) = storage else {
            bail!("frozen linear: the input must be f32")
        };
        let Some((a, b)) = layout.contiguous_offsets() else {
            bail!("frozen linear: the input must be contiguous")
        };
        let (rows, inp) = layout.shape().dims2()?;
        let x = Tensor::from_slice(&data[a..b], (rows, inp), &Device::Cpu)?;
        let w = self.weight.dense()?;
        let y = x.matmul(&w.t()?)?;
        drop((x, w));
        let y = match &self.bias {
            Some(bias) => {
                let z = y.broadcast_add(bias)?;
                drop(y);
                z
            }
            None => y,
        };
        let out = y.dim(1)?;
        let v = y.flatten_all()?.to_vec1::<f32>()?;
        drop(y);
        Ok((CpuStorage::F32(v), Shape::from((rows, out))))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let w = self.weight.dense()?;
        Ok(Some(grad.matmul(&w)?))
    }
}
