//! Frozen projections for LoRA and QLoRA: `y = x·Wᵀ + b` whose backward gives the input its
//! gradient and the weight none.
//!
//! candle differentiates every operand of a matmul, frozen or not: a detached weight's
//! gradient is still computed and, belonging to no tracked node, stays in the gradient store
//! until the store is dropped (measured: LoRA on detached weights peaks above full training).
//! [`FrozenLinear`] is a candle `CustomOp1` on the input only, so the weight and bias are not
//! operands and get no gradient. Its weight is dense (`lora_base = "op"`) or quantized (QLoRA
//! and quantized serving: GGML's `q4_0`, `q8_0` blocks of 32 and GGUF's `q4_k`, `q6_k`
//! super-blocks of 256, candle's `QTensor`), dequantized to f32 on the input's device inside
//! each call (candle's CUDA kernels on a GPU), cast to the input's type when that is 16-bit,
//! and dropped after it.
//!
//! The forward is ordinary candle ops on a tensor made from a copy of the input's storage, on
//! any device and in f32, f16 or bf16 (where candle has the matmul: bf16 on CUDA only), and
//! hands back a copy of the result's storage; the backward (`grad·W`) is ordinary ops too.
//!
//! Memory per call (`r` rows, `in → out`, activations of `e` bytes): forward — a copy of the
//! input `e·r·in`, the dequantized weight `4·out·in` and, for 16-bit input, its cast
//! `e·out·in` beside it (quantized only; the f32 copy is dropped before the product), the
//! product `e·r·out` (+ gemm's packing on the CPU), then the bias sum `e·r·out` and the
//! returned copy `e·r·out`; backward — the dequantized weight (and its cast) and the input
//! gradient `e·r·in`.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Tensor, bail};

/// A frozen weight `(out, in)`: dense, or quantized in GGML blocks.
#[derive(Debug, Clone)]
pub enum FrozenWeight {
    Dense(Tensor),
    Quantized(Arc<QTensor>),
}

impl FrozenWeight {
    /// The weight for a product with `like` (its device and type): the same tensor, or a fresh
    /// dequantized copy (f32, then cast when `like` is 16-bit; the f32 copy dropped).
    fn dense(&self, like: &Tensor) -> Result<Tensor> {
        match self {
            FrozenWeight::Dense(t) => Ok(t.clone()),
            FrozenWeight::Quantized(q) => {
                let w = q.dequantize(like.device())?;
                if like.dtype() == DType::F32 {
                    Ok(w)
                } else {
                    w.to_dtype(like.dtype())
                }
            }
        }
    }

    /// Quantizes `w` (last dimension a multiple of the block size: 32 for Q4_0 and Q8_0, 256
    /// for the k-quants), on `w`'s device.
    pub fn quantize(w: &Tensor, dtype: GgmlDType) -> Result<Self> {
        Ok(FrozenWeight::Quantized(Arc::new(QTensor::quantize(
            w, dtype,
        )?)))
    }
}

/// Bytes of a GGML-quantized weight of `elems` elements: per block of `block_size()` weights,
/// `type_size()` bytes (Q4_0 18 / 32, Q8_0 34 / 32, Q4_K 144 / 256, Q6_K 210 / 256).
pub fn quantized_bytes(elems: u64, dtype: GgmlDType) -> u64 {
    elems / dtype.block_size() as u64 * dtype.type_size() as u64
}

/// Bytes the CPU holds beside a quantized weight's blocks while `QTensor::quantize` writes
/// them: `q4_k` pairs each super-block with its input slice in a `Vec` (as its dequantize does)
/// and makes a 32-byte `Vec` per sub-block (`make_qkx1_quants`); `q6_k` and the 32-weight
/// blocks quantize in place.
pub fn quantize_scratch(elems: u64, dtype: GgmlDType) -> u64 {
    let sub_block = if dtype == GgmlDType::Q4K { 32 } else { 0 };
    dequantize_scratch(elems, dtype) + sub_block
}

/// Bytes the CPU holds beside the f32 output of a quantized weight's dequantize: `q4_k` pairs
/// each super-block with its output slice in a `Vec` (`utils::group_for_dequantization`, one
/// pointer and one slice, 24 B each); the others write in place. CUDA's dequantize kernels hold
/// nothing.
pub fn dequantize_scratch(elems: u64, dtype: GgmlDType) -> u64 {
    const PAIR: u64 = std::mem::size_of::<(&u8, &[f32])>() as u64;
    match dtype {
        GgmlDType::Q4K => elems / 256 * PAIR,
        GgmlDType::Q4_0 | GgmlDType::Q8_0 | GgmlDType::Q6K => 0,
        d => unreachable!("memfit quantizes to q4_0, q8_0, q4_k or q6_k, not {d:?}"),
    }
}

/// `x (r, in) → x·Wᵀ + b (r, out)` with a gradient for x only.
#[derive(Debug, Clone)]
pub struct FrozenLinear {
    pub weight: FrozenWeight,
    pub bias: Option<Tensor>,
}

impl FrozenLinear {
    /// The product on ordinary tensors: `x·Wᵀ (+ b)`, `x` dropped as soon as it is used.
    fn apply(&self, x: Tensor) -> Result<Tensor> {
        let w = self.weight.dense(&x)?;
        let y = x.matmul(&w.t()?)?;
        drop((x, w));
        match &self.bias {
            Some(bias) => {
                let z = y.broadcast_add(bias)?;
                drop(y);
                Ok(z)
            }
            None => Ok(y),
        }
    }
}

/// A contiguous `(rows, in)` input's elements as a tensor of their own (a copy).
fn cpu_input(storage: &CpuStorage, layout: &Layout) -> Result<Tensor> {
    let Some((a, b)) = layout.contiguous_offsets() else {
        bail!("frozen linear: the input must be contiguous")
    };
    let (rows, inp) = layout.shape().dims2()?;
    match storage {
        CpuStorage::F32(d) => Tensor::from_slice(&d[a..b], (rows, inp), &Device::Cpu),
        CpuStorage::F16(d) => Tensor::from_slice(&d[a..b], (rows, inp), &Device::Cpu),
        CpuStorage::BF16(d) => Tensor::from_slice(&d[a..b], (rows, inp), &Device::Cpu),
        _ => bail!("frozen linear: the input must be f32, f16 or bf16"),
    }
}

impl CustomOp1 for FrozenLinear {
    fn name(&self) -> &'static str {
        "frozen-linear"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let x = cpu_input(storage, layout)?;
        let rows = x.dim(0)?;
        let y = self.apply(x)?;
        let out = y.dim(1)?;
        let flat = y.flatten_all()?;
        let v = match y.dtype() {
            DType::F32 => CpuStorage::F32(flat.to_vec1()?),
            DType::F16 => CpuStorage::F16(flat.to_vec1()?),
            DType::BF16 => CpuStorage::BF16(flat.to_vec1()?),
            d => bail!("frozen linear: unexpected {d:?} output"),
        };
        drop((flat, y));
        Ok((v, Shape::from((rows, out))))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        storage: &candle_core::CudaStorage,
        layout: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::Storage;
        use candle_core::backend::BackendStorage;
        use candle_core::op::BackpropOp;
        // A copy of the input's elements (as the CPU path makes), as a tensor. `try_clone`
        // copies the whole buffer: the op's inputs (`rows(x)` of a projection's input) are
        // tensors of their own in memfit's models, so that is exactly the input.
        let (rows, inp) = layout.shape().dims2()?;
        let x = match layout.contiguous_offsets() {
            Some((0, n)) if n == rows * inp => storage.try_clone(layout)?,
            _ => bail!("frozen linear: the input must be contiguous from its start"),
        };
        let x = Tensor::from_storage(Storage::Cuda(x), (rows, inp), BackpropOp::none(), false);
        let y = self.apply(x)?;
        let out = y.dim(1)?;
        // The result's storage handed back as a copy (the tensor's own is shared behind it).
        let copy = {
            let (s, l) = y.storage_and_layout();
            match &*s {
                Storage::Cuda(c) => c.try_clone(l)?,
                _ => bail!("frozen linear: the product left the device"),
            }
        };
        drop(y);
        Ok((copy, Shape::from((rows, out))))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let w = self.weight.dense(grad)?;
        Ok(Some(grad.matmul(&w)?))
    }
}
