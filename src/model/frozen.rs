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
//! FP8 weights (`lora_base`/`weights` `fp8`, DeepSeek-V3's and the `*-FP8` checkpoints' format)
//! are held as shipped: the e4m3 weight `(out, in)`, 1 B each, and an f32 inverse scale per
//! 128×128 block (`(⌈out/128⌉, ⌈in/128⌉)`), dequantized at each call straight into the
//! activations' type (`w = f8 · scale`, one pass, no f32 copy beside a 16-bit one: memfit's
//! loop on the CPU, its `memfit_fp8_dequant` kernel on CUDA).
//!
//! MXFP4 weights (`lora_base`/`weights` `mxfp4`, OCP Microscaling as gpt-oss ships its
//! experts) are held as shipped too: the e2m1 values, two per byte (`(out, in/2)` u8, the low
//! nibble first: element `2j` in bits 0–3, `2j + 1` in bits 4–7, bit 3 of a nibble its sign),
//! and a UE8M0 scale per 32 weights of a row (`(out, in/32)` u8, the weight `e2m1 ·
//! 2^(scale − 127)`), dequantized straight into the activations' type like FP8 (memfit's
//! loop on the CPU, its `memfit_mxfp4_dequant` kernel on CUDA). Quantizing follows the OCP MX
//! specification: a block's scale is `2^(⌊log₂ max|w|⌋ − 2)` (e2m1's largest power is 2²), each
//! value rounded to the nearest e2m1 value (ties to the even code), saturating at ±6.
//!
//! Memory per call (`r` rows, `in → out`, activations of `e` bytes): forward — a copy of the
//! input `e·r·in`, the dequantized weight `4·out·in` and, for 16-bit input, its cast
//! `e·out·in` beside it (quantized only; the f32 copy is dropped before the product), the
//! product `e·r·out` (+ gemm's packing on the CPU), then the bias sum `e·r·out` and the
//! returned copy `e·r·out`; backward — the dequantized weight (and its cast) and the input
//! gradient `e·r·in`.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{
    CpuStorage, CustomOp1, DType, Device, Layout, Result, Shape, Storage, Tensor, bail,
};

use super::shapes::{FP8_BLOCK, MXFP4_BLOCK};

/// A frozen weight `(out, in)`: dense, quantized in GGML blocks, or FP8 with block scales.
#[derive(Debug, Clone)]
pub enum FrozenWeight {
    Dense(Tensor),
    Quantized(Arc<QTensor>),
    /// e4m3 `(out, in)` and its f32 inverse scales ([`Fp8Weight`]).
    Fp8(Arc<Fp8Weight>),
    /// e2m1 pairs and UE8M0 scales ([`Mxfp4Weight`]).
    Mxfp4(Arc<Mxfp4Weight>),
}

/// An MXFP4 weight `(out, in)` as shipped: `blocks` `(out, in/2)` u8 (two e2m1 values a byte,
/// the low nibble first) and `scales` `(out, in/32)` u8 (UE8M0: `2^(s − 127)`).
#[derive(Debug)]
pub struct Mxfp4Weight {
    pub blocks: Tensor,
    pub scales: Tensor,
}

/// The e2m1 values of the codes 0–7 (a nibble's bit 3 is the sign).
pub const E2M1: [f32; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];

/// The e2m1 code (sign in bit 3) nearest `x`, ties to the even code, ±6 beyond.
fn e2m1_code(x: f32) -> u8 {
    let a = x.abs();
    let mut best = 0usize;
    for (i, &v) in E2M1.iter().enumerate().skip(1) {
        let (d, db) = ((a - v).abs(), (a - E2M1[best]).abs());
        if d < db || (d == db && i % 2 == 0) {
            best = i;
        }
    }
    best as u8
        | if x.is_sign_negative() && best > 0 {
            8
        } else {
            0
        }
}

/// The f32 value of an e2m1 nibble.
fn e2m1_value(nibble: u8) -> f32 {
    let v = E2M1[(nibble & 7) as usize];
    if nibble & 8 != 0 { -v } else { v }
}

/// Quantizes rows of `inp` weights (`inp` a multiple of 32) into MXFP4: the packed values and
/// a UE8M0 scale per 32 (see the module docs).
fn mxfp4_quantize<T: Copy + Sync>(
    src: &[T],
    f: impl Fn(T) -> f32 + Sync,
    out: usize,
    inp: usize,
) -> (Vec<u8>, Vec<u8>) {
    use rayon::prelude::*;
    let groups = inp / MXFP4_BLOCK;
    let mut blocks = vec![0u8; out * inp / 2];
    let mut scales = vec![0u8; out * groups];
    blocks
        .par_chunks_mut(inp / 2)
        .zip(scales.par_chunks_mut(groups))
        .enumerate()
        .for_each(|(r, (brow, srow))| {
            for (g, s) in srow.iter_mut().enumerate() {
                let vals = &src[r * inp + g * MXFP4_BLOCK..r * inp + (g + 1) * MXFP4_BLOCK];
                let amax = vals.iter().fold(0f32, |m, &v| m.max(f(v).abs()));
                // UE8M0 holds 2^-127 ..= 2^127; an all-zero block keeps scale 1.
                let e = if amax > 0.0 && amax.is_finite() {
                    (amax.log2().floor() as i32 - 2).clamp(-127, 127)
                } else {
                    0
                };
                *s = (e + 127) as u8;
                let inv = (-e as f32).exp2();
                for (j, pair) in brow[g * 16..(g + 1) * 16].iter_mut().enumerate() {
                    let lo = e2m1_code(f(vals[2 * j]) * inv);
                    let hi = e2m1_code(f(vals[2 * j + 1]) * inv);
                    *pair = lo | hi << 4;
                }
            }
        });
    (blocks, scales)
}

/// Dequantizes MXFP4 rows of `inp` into `T` (by `of`).
fn mxfp4_dequantize<T: Copy + Send + Default>(
    blocks: &[u8],
    scales: &[u8],
    out: usize,
    inp: usize,
    of: impl Fn(f32) -> T + Sync,
) -> Vec<T> {
    use rayon::prelude::*;
    let groups = inp / MXFP4_BLOCK;
    let mut w = vec![T::default(); out * inp];
    w.par_chunks_mut(inp).enumerate().for_each(|(r, row)| {
        let (brow, srow) = (
            &blocks[r * inp / 2..(r + 1) * inp / 2],
            &scales[r * groups..(r + 1) * groups],
        );
        for (c, o) in row.iter_mut().enumerate() {
            let byte = brow[c / 2];
            let nibble = if c % 2 == 0 { byte & 0x0f } else { byte >> 4 };
            let scale = (srow[c / MXFP4_BLOCK] as i32 - 127) as f32;
            *o = of(e2m1_value(nibble) * scale.exp2());
        }
    });
    w
}

/// An FP8 weight as shipped: e4m3 `w` `(out, in)` and its f32 inverse scales `scale`
/// `(⌈out/128⌉, ⌈in/128⌉)` ([`FP8_BLOCK`]).
#[derive(Debug)]
pub struct Fp8Weight {
    pub w: Tensor,
    pub scale: Tensor,
}

/// e4m3's largest finite value: a block's largest magnitude maps to it.
const E4M3_MAX: f32 = 448.0;

/// The f32 value of each e4m3 byte.
fn e4m3_table() -> &'static [f32; 256] {
    static TABLE: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|b| float8::F8E4M3::from_bits(b as u8).to_f32()))
}

/// Quantizes rows of `inp` weights (`src`, read as f32 by `f`) into e4m3 and the block scales,
/// DeepSeek's way: per block, `scale = max|w| / 448` (1 for an all-zero block) and `q = w / scale`
/// rounded to e4m3.
fn fp8_quantize<T: Copy + Sync>(
    src: &[T],
    f: impl Fn(T) -> f32 + Sync,
    out: usize,
    inp: usize,
) -> (Vec<float8::F8E4M3>, Vec<f32>) {
    use rayon::prelude::*;
    let (br, bc) = (FP8_BLOCK.rows, FP8_BLOCK.cols);
    let (sr, sc) = FP8_BLOCK.scales(out, inp);
    let mut scales = vec![0f32; sr * sc];
    scales.par_chunks_mut(sc).enumerate().for_each(|(bi, row)| {
        for (bj, s) in row.iter_mut().enumerate() {
            let mut amax = 0f32;
            for r in bi * br..((bi + 1) * br).min(out) {
                for &v in &src[r * inp + bj * bc..(r * inp + (bj + 1) * bc).min((r + 1) * inp)] {
                    amax = amax.max(f(v).abs());
                }
            }
            *s = if amax > 0.0 { amax / E4M3_MAX } else { 1.0 };
        }
    });
    let mut q = vec![float8::F8E4M3::from_bits(0); out * inp];
    q.par_chunks_mut(inp).enumerate().for_each(|(r, row)| {
        let srow = &scales[r / br * sc..(r / br + 1) * sc];
        for (c, o) in row.iter_mut().enumerate() {
            *o = float8::F8E4M3::from_f32(f(src[r * inp + c]) / srow[c / bc]);
        }
    });
    (q, scales)
}

/// Dequantizes e4m3 rows of `inp` with their block scales into `T` (by `of`).
fn fp8_dequantize<T: Copy + Send + Default>(
    q: &[float8::F8E4M3],
    scales: &[f32],
    out: usize,
    inp: usize,
    of: impl Fn(f32) -> T + Sync,
) -> Vec<T> {
    use rayon::prelude::*;
    let table = e4m3_table();
    let (br, bc) = (FP8_BLOCK.rows, FP8_BLOCK.cols);
    let sc = inp.div_ceil(bc);
    let mut w = vec![T::default(); out * inp];
    w.par_chunks_mut(inp).enumerate().for_each(|(r, row)| {
        let srow = &scales[r / br * sc..(r / br + 1) * sc];
        let qrow = &q[r * inp..(r + 1) * inp];
        for (c, o) in row.iter_mut().enumerate() {
            *o = of(table[qrow[c].to_bits() as usize] * srow[c / bc]);
        }
    });
    w
}

impl FrozenWeight {
    /// The weight for a product with `like` (its device and type): the same tensor, or a fresh
    /// dequantized copy (f32, then cast when `like` is 16-bit; the f32 copy dropped).
    fn dense(&self, like: &Tensor) -> Result<Tensor> {
        self.dense_as(like.dtype(), like.device())
    }

    /// The dense weight in `dtype` on `device` (see [`FrozenWeight::dense`]).
    pub(crate) fn dense_as(&self, dtype: DType, device: &Device) -> Result<Tensor> {
        match self {
            FrozenWeight::Dense(t) => Ok(t.clone()),
            FrozenWeight::Quantized(q) => {
                let w = q.dequantize(device)?;
                if dtype == DType::F32 {
                    Ok(w)
                } else {
                    w.to_dtype(dtype)
                }
            }
            FrozenWeight::Fp8(f) => fp8_dense(&f.w, &f.scale, dtype),
            FrozenWeight::Mxfp4(m) => mxfp4_dense(&m.blocks, &m.scales, dtype),
        }
    }

    /// Quantizes `w` `(out, in)` (`in` a multiple of 32) to MXFP4, on `w`'s device (on CUDA
    /// through the host, as [`FrozenWeight::quantize_fp8`]). The result holds
    /// [`super::shapes::mxfp4_bytes`] bytes; nothing else stays.
    pub fn quantize_mxfp4(w: &Tensor) -> Result<Self> {
        let (out, inp) = w.dims2()?;
        if inp % MXFP4_BLOCK != 0 {
            bail!("mxfp4: a row of {inp} weights is not a whole number of blocks of {MXFP4_BLOCK}")
        }
        let (blocks, scales) = on_host(w, &Mxfp4Quantize { out, inp }, "mxfp4")?;
        Ok(FrozenWeight::Mxfp4(Arc::new(Mxfp4Weight {
            blocks: Tensor::from_vec(blocks, (out, inp / 2), w.device())?,
            scales: Tensor::from_vec(scales, (out, inp / MXFP4_BLOCK), w.device())?,
        })))
    }

    /// Quantizes `w` `(out, in)` to e4m3 with an f32 scale per 128×128 block, on `w`'s device
    /// (on CUDA through the host: a host copy of `w`, quantized there, both parts uploaded).
    /// The result holds `FP8_BLOCK.bytes(out, in)` bytes; nothing else stays.
    pub fn quantize_fp8(w: &Tensor) -> Result<Self> {
        let (out, inp) = w.dims2()?;
        let (sr, sc) = FP8_BLOCK.scales(out, inp);
        let (q, scales) = on_host(w, &Fp8Quantize { out, inp }, "fp8")?;
        Ok(FrozenWeight::Fp8(Arc::new(Fp8Weight {
            w: Tensor::from_vec(q, (out, inp), w.device())?,
            scale: Tensor::from_vec(scales, (sr, sc), w.device())?,
        })))
    }

    /// Quantizes `w` (last dimension a multiple of the block size: 32 for Q4_0 and Q8_0, 256
    /// for the k-quants), on `w`'s device.
    pub fn quantize(w: &Tensor, dtype: GgmlDType) -> Result<Self> {
        Ok(FrozenWeight::Quantized(Arc::new(QTensor::quantize(
            w, dtype,
        )?)))
    }
}

/// A quantizer of `(out, in)` rows generic in the element it reads (`f` widens each to f32).
trait Quantize {
    type Out;
    fn run<T: Copy + Sync>(&self, src: &[T], f: impl Fn(T) -> f32 + Sync) -> Self::Out;
}

/// [`fp8_quantize`]'s rows.
struct Fp8Quantize {
    out: usize,
    inp: usize,
}

impl Quantize for Fp8Quantize {
    type Out = (Vec<float8::F8E4M3>, Vec<f32>);
    fn run<T: Copy + Sync>(&self, src: &[T], f: impl Fn(T) -> f32 + Sync) -> Self::Out {
        fp8_quantize(src, f, self.out, self.inp)
    }
}

/// [`mxfp4_quantize`]'s rows.
struct Mxfp4Quantize {
    out: usize,
    inp: usize,
}

impl Quantize for Mxfp4Quantize {
    type Out = (Vec<u8>, Vec<u8>);
    fn run<T: Copy + Sync>(&self, src: &[T], f: impl Fn(T) -> f32 + Sync) -> Self::Out {
        mxfp4_quantize(src, f, self.out, self.inp)
    }
}

/// `q` over `w`'s elements (f32, f16 or bf16) on the host: a contiguous view of a CPU weight,
/// a host copy of a CUDA one, freed before the parts are made into tensors.
fn on_host<Q: Quantize>(w: &Tensor, q: &Q, op: &str) -> Result<Q::Out> {
    let host = if w.device().is_cpu() {
        w.contiguous()?
    } else {
        w.to_device(&Device::Cpu)?
    };
    let (s, l) = host.storage_and_layout();
    let Some((a, b)) = l.contiguous_offsets() else {
        bail!("{op}: the weight must be contiguous")
    };
    Ok(match &*s {
        Storage::Cpu(CpuStorage::F32(d)) => q.run(&d[a..b], |v| v),
        Storage::Cpu(CpuStorage::F16(d)) => q.run(&d[a..b], |v| v.to_f32()),
        Storage::Cpu(CpuStorage::BF16(d)) => q.run(&d[a..b], |v| v.to_f32()),
        _ => bail!("{op}: the weight must be f32, f16 or bf16"),
    })
}

/// A dequantize loop generic in the element it writes (`of` rounds each f32 value into it).
trait Dequantize {
    fn values<T: Copy + Send + Default>(&self, of: impl Fn(f32) -> T + Sync) -> Vec<T>;
}

/// e4m3 rows with their block scales ([`fp8_dequantize`]).
struct Fp8Rows<'a> {
    q: &'a [float8::F8E4M3],
    s: &'a [f32],
    out: usize,
    inp: usize,
}

impl Dequantize for Fp8Rows<'_> {
    fn values<T: Copy + Send + Default>(&self, of: impl Fn(f32) -> T + Sync) -> Vec<T> {
        fp8_dequantize(self.q, self.s, self.out, self.inp, of)
    }
}

/// MXFP4 rows: packed values and scales ([`mxfp4_dequantize`]).
struct Mxfp4Rows<'a> {
    q: &'a [u8],
    s: &'a [u8],
    out: usize,
    inp: usize,
}

impl Dequantize for Mxfp4Rows<'_> {
    fn values<T: Copy + Send + Default>(&self, of: impl Fn(f32) -> T + Sync) -> Vec<T> {
        mxfp4_dequantize(self.q, self.s, self.out, self.inp, of)
    }
}

/// The loop's output as one fresh `(out, in)` CPU tensor of `dtype` (f32, f16 or bf16).
fn cpu_dense(d: &impl Dequantize, dtype: DType, shape: (usize, usize), op: &str) -> Result<Tensor> {
    let cpu = &Device::Cpu;
    match dtype {
        DType::F32 => Tensor::from_vec(d.values(|v| v), shape, cpu),
        DType::F16 => Tensor::from_vec(d.values(half::f16::from_f32), shape, cpu),
        DType::BF16 => Tensor::from_vec(d.values(half::bf16::from_f32), shape, cpu),
        d => bail!("{op}: no dequantize into {d:?}"),
    }
}

/// A kernel's fresh output storage as an `(out, in)` tensor outside any graph.
#[cfg(feature = "cuda")]
fn cuda_dense(s: candle_core::CudaStorage, shape: (usize, usize)) -> Tensor {
    Tensor::from_storage(
        Storage::Cuda(s),
        shape,
        candle_core::op::BackpropOp::none(),
        false,
    )
}

/// The dense `(out, in)` weight of e4m3 `w` and its block scales, in `dtype`, on their device:
/// one fresh tensor, nothing beside it.
fn fp8_dense(w: &Tensor, scale: &Tensor, dtype: DType) -> Result<Tensor> {
    let (out, inp) = w.dims2()?;
    let (ws, wl) = w.storage_and_layout();
    let (ss, sl) = scale.storage_and_layout();
    match (&*ws, &*ss) {
        (Storage::Cpu(CpuStorage::F8E4M3(q)), Storage::Cpu(CpuStorage::F32(s))) => {
            let (Some((a, b)), Some((c, d))) = (wl.contiguous_offsets(), sl.contiguous_offsets())
            else {
                bail!("fp8: weight and scales must be contiguous")
            };
            let rows = Fp8Rows {
                q: &q[a..b],
                s: &s[c..d],
                out,
                inp,
            };
            cpu_dense(&rows, dtype, (out, inp), "fp8")
        }
        #[cfg(feature = "cuda")]
        (Storage::Cuda(q), Storage::Cuda(s)) => Ok(cuda_dense(
            super::kernels::cuda::fp8_dequant((q, wl), (s, sl), out, inp, dtype)?,
            (out, inp),
        )),
        _ => bail!("fp8: an e4m3 weight with f32 scales on one device"),
    }
}

/// The dense `(out, in)` weight of MXFP4 `blocks` `(out, in/2)` and `scales` `(out, in/32)`, in
/// `dtype`, on their device: one fresh tensor, nothing beside it.
fn mxfp4_dense(blocks: &Tensor, scales: &Tensor, dtype: DType) -> Result<Tensor> {
    let (out, half) = blocks.dims2()?;
    let inp = 2 * half;
    let (bs, bl) = blocks.storage_and_layout();
    let (ss, sl) = scales.storage_and_layout();
    match (&*bs, &*ss) {
        (Storage::Cpu(CpuStorage::U8(q)), Storage::Cpu(CpuStorage::U8(s))) => {
            let (Some((a, b)), Some((c, d))) = (bl.contiguous_offsets(), sl.contiguous_offsets())
            else {
                bail!("mxfp4: values and scales must be contiguous")
            };
            let rows = Mxfp4Rows {
                q: &q[a..b],
                s: &s[c..d],
                out,
                inp,
            };
            cpu_dense(&rows, dtype, (out, inp), "mxfp4")
        }
        #[cfg(feature = "cuda")]
        (Storage::Cuda(q), Storage::Cuda(s)) => Ok(cuda_dense(
            super::kernels::cuda::mxfp4_dequant((q, bl), (s, sl), out, inp, dtype)?,
            (out, inp),
        )),
        _ => bail!("mxfp4: u8 values and scales on one device"),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// e4m3fn's values as the OCP FP8 spec gives them (bias 7, no infinities, S.1111.111 NaN).
    #[test]
    fn e4m3_table_is_the_spec() {
        let t = e4m3_table();
        for (bits, want) in [
            (0x00u8, 0.0f32),
            (0x01, 2f32.powi(-9)), // smallest subnormal
            (0x07, 7.0 * 2f32.powi(-9)),
            (0x08, 2f32.powi(-6)), // smallest normal
            (0x38, 1.0),
            (0x3c, 1.5),
            (0x7e, 448.0),
            (0xb8, -1.0),
            (0xfe, -448.0),
        ] {
            assert_eq!(t[bits as usize], want, "{bits:#04x}");
        }
        assert!(t[0x7f].is_nan() && t[0xff].is_nan());
    }

    /// Quantized by blocks of 128×128 (a `(200, 300)` weight: 2 × 3 blocks, the last of each
    /// dimension partial): each block's largest magnitude maps to 448 and its scale is
    /// `max/448`; the dequantized weight is exactly `e4m3 · scale`, within e4m3's half-ulp
    /// (2⁻⁴ relative, or half the subnormal step) of the original; an all-zero block gets scale
    /// 1; the parts hold `FP8_BLOCK.bytes` bytes.
    /// MXFP4 as gpt-oss ships it (transformers' `convert_moe_packed_tensors`): the low nibble
    /// is the even element, bit 3 the sign, the value `e2m1 · 2^(scale − 127)`; quantizing puts a
    /// block's largest magnitude in [4, 8) before rounding (saturating at 6), rounds to the
    /// nearest e2m1 value with ties to the even code, round-trips values already on the grid
    /// exactly, and the parts hold `mxfp4_bytes` bytes.
    #[test]
    fn mxfp4_layout_and_round_trip() {
        // One row of 32: byte 0 = 0x9F (element 0 the low nibble 0xF = −6, element 1 0x9 =
        // −0.5), byte 1 = 0x72 (1.0, 6.0), the rest 0; scale 2^(130 − 127) = 8.
        let mut packed = vec![0u8; 16];
        packed[0] = 0x9F;
        packed[1] = 0x72;
        let blocks = Tensor::from_vec(packed, (1, 16), &Device::Cpu).unwrap();
        let scales = Tensor::from_vec(vec![130u8], (1, 1), &Device::Cpu).unwrap();
        let d: Vec<f32> = mxfp4_dense(&blocks, &scales, DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(&d[..4], &[-48.0, -4.0, 8.0, 48.0]);
        assert!(d[4..].iter().all(|&v| v == 0.0));
        // Ties to the even code: 0.25 → 0, 0.75 → 1, 1.25 → 1, 1.75 → 2, 2.5 → 2, 3.5 → 4,
        // 5 → 4; beyond 6 saturates.
        for (x, want) in [
            (0.25f32, 0.0f32),
            (0.75, 1.0),
            (1.25, 1.0),
            (1.75, 2.0),
            (2.5, 2.0),
            (3.5, 4.0),
            (5.0, 4.0),
            (7.9, 6.0),
            (-2.6, -3.0),
        ] {
            assert_eq!(e2m1_value(e2m1_code(x)), want, "{x}");
        }
        let (out, inp) = (3usize, 96usize);
        let w: Vec<f32> = (0..out * inp)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3 * (1 + i / 40) as f32)
            .collect();
        let t = Tensor::from_vec(w.clone(), (out, inp), &Device::Cpu).unwrap();
        let FrozenWeight::Mxfp4(m) = FrozenWeight::quantize_mxfp4(&t).unwrap() else {
            panic!("mxfp4")
        };
        assert_eq!(m.blocks.dims(), &[3, 48]);
        assert_eq!(m.scales.dims(), &[3, 3]);
        let bytes = m.blocks.elem_count() + m.scales.elem_count();
        assert_eq!(bytes as u64, super::super::shapes::mxfp4_bytes(out, inp));
        let sc: Vec<Vec<u8>> = m.scales.to_vec2().unwrap();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let d: Vec<f32> = mxfp4_dense(&m.blocks, &m.scales, dtype)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            for (r, srow) in sc.iter().enumerate() {
                for (g, &s) in srow.iter().enumerate() {
                    let range = r * inp + g * 32..r * inp + (g + 1) * 32;
                    let amax = w[range.clone()].iter().fold(0f32, |a, &v| a.max(v.abs()));
                    let scale = (s as f32 - 127.0).exp2();
                    assert_eq!(scale, (amax.log2().floor() - 2.0).exp2(), "({r}, {g})");
                    for i in range {
                        let x = w[i] / scale;
                        // Within half the grid's step at x (1 above 4, 0.5 in [2, 4), 0.25
                        // below 2), or saturated.
                        let step = if x.abs() >= 4.0 {
                            1.0
                        } else if x.abs() >= 2.0 {
                            0.5
                        } else {
                            0.25
                        };
                        let q = d[i] / scale;
                        assert!(
                            (q - x).abs() <= step || (x.abs() > 6.0 && q.abs() == 6.0),
                            "{dtype:?} ({r}, {i}): {} → {}",
                            w[i],
                            d[i]
                        );
                    }
                }
            }
        }
        // Values on the grid come back exactly.
        let grid: Vec<f32> = (0..64)
            .map(|i| E2M1[i % 8] * if i % 3 == 0 { -0.25 } else { 0.25 })
            .collect();
        let t = Tensor::from_vec(grid.clone(), (2, 32), &Device::Cpu).unwrap();
        let back: Vec<f32> = FrozenWeight::quantize_mxfp4(&t)
            .unwrap()
            .dense_as(DType::F32, &Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        assert_eq!(back, grid);
    }

    #[test]
    fn fp8_blocks_round_trip() {
        let (out, inp) = (200usize, 300usize);
        let mut w: Vec<f32> = (0..out * inp)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3 * (1 + i / 9000) as f32)
            .collect();
        for r in 128..200 {
            for c in 256..300 {
                w[r * inp + c] = 0.0;
            }
        }
        let t = Tensor::from_vec(w.clone(), (out, inp), &Device::Cpu).unwrap();
        let FrozenWeight::Fp8(f) = FrozenWeight::quantize_fp8(&t).unwrap() else {
            panic!("fp8")
        };
        let (q, scale) = (f.w.clone(), f.scale.clone());
        assert_eq!(q.dtype(), DType::F8E4M3);
        assert_eq!(scale.dims(), &[2, 3]);
        let bytes = q.elem_count() + 4 * scale.elem_count();
        assert_eq!(bytes as u64, FP8_BLOCK.bytes(out, inp));
        let s: Vec<Vec<f32>> = scale.to_vec2().unwrap();
        assert_eq!(s[1][2], 1.0, "an all-zero block");
        for (bi, row) in s.iter().enumerate() {
            for (bj, &sc) in row.iter().enumerate() {
                let amax = (bi * 128..((bi + 1) * 128).min(out))
                    .flat_map(|r| (bj * 128..((bj + 1) * 128).min(inp)).map(move |c| (r, c)))
                    .map(|(r, c)| w[r * inp + c].abs())
                    .fold(0f32, f32::max);
                if amax > 0.0 {
                    assert_eq!(sc, amax / 448.0, "block ({bi}, {bj})");
                }
            }
        }
        let qv: Vec<u8> = q
            .to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
            .iter()
            .map(|&x| float8::F8E4M3::from_f32(x).to_bits())
            .collect();
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let d = fp8_dense(&q, &scale, dtype).unwrap();
            assert_eq!(d.dtype(), dtype);
            let d: Vec<f32> = d
                .to_dtype(DType::F32)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            for r in 0..out {
                for c in 0..inp {
                    let sc = s[r / 128][c / 128];
                    let exact = e4m3_table()[qv[r * inp + c] as usize] * sc;
                    let got = d[r * inp + c];
                    let cast = match dtype {
                        DType::F16 => half::f16::from_f32(exact).to_f32(),
                        DType::BF16 => half::bf16::from_f32(exact).to_f32(),
                        _ => exact,
                    };
                    assert_eq!(got, cast, "({r}, {c}) {dtype:?}");
                    if dtype == DType::F32 {
                        let x = w[r * inp + c];
                        let tol = (x.abs() / 16.0).max(sc * 2f32.powi(-10));
                        assert!((got - x).abs() <= tol, "({r}, {c}): {x} → {got}");
                    }
                }
            }
        }
    }
}
