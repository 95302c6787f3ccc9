//! The two candle ops a block-by-block backward ([`crate::phase::by_block`]) cuts the graph
//! with, the candle side of `Autograd::cut` and `Autograd::seed`: [`cut`] moves a boundary
//! tensor's storage into a new variable (an in-place op on public candle API, no copy), and
//! [`seed`] is a one-element op on the boundary whose backward hands in the gradient from above.

use std::sync::Mutex;

use candle_core::backend::BackendStorage;
use candle_core::op::BackpropOp;
use candle_core::{
    CpuStorage, CustomOp1, DType, InplaceOp1, Layout, Result, Shape, Storage, Tensor,
};

/// Moves `x`'s storage into a new variable of its shape (no copy); `x` keeps its op and an
/// empty storage (one element on CUDA, where an allocation cannot be empty). `x` must cover its
/// storage whole, contiguous from offset 0, and nothing may read that storage afterwards: a
/// block's residual sum (a fresh output), the embedding's output (fresh, or — without position
/// embeddings — a reshape of the lookup's output, whose backward reads neither).
pub fn cut(x: &Tensor) -> Result<Tensor> {
    let op = CutOp(Mutex::new(None));
    x.inplace_op1(&op)?;
    let storage =
        op.0.into_inner()
            .map_err(|_| candle_core::Error::Msg("by-block cut: poisoned".into()))?
            .ok_or_else(|| candle_core::Error::Msg("by-block cut: nothing moved".into()))?;
    Ok(Tensor::from_storage(
        storage,
        x.shape().clone(),
        BackpropOp::none(),
        true,
    ))
}

/// Frees `x`'s storage in place (one element is left on CUDA) when `x` covers it whole, so a
/// graph node that holds `x` for the gradient's route but whose backward never reads it keeps
/// no bytes of it (what PyTorch's autograd would not have saved). Anything else left as it is.
/// Nothing may read `x` afterwards.
pub fn release(x: &Tensor) -> Result<()> {
    x.inplace_op1(&ReleaseOp)
}

struct ReleaseOp;

impl InplaceOp1 for ReleaseOp {
    fn name(&self) -> &'static str {
        "release"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> Result<()> {
        macro_rules! free {
            ($v:ident) => {
                if whole(l, $v.len()) {
                    drop(std::mem::take($v));
                }
            };
        }
        match s {
            CpuStorage::F32(v) => free!(v),
            CpuStorage::F16(v) => free!(v),
            CpuStorage::BF16(v) => free!(v),
            CpuStorage::F64(v) => free!(v),
            _ => {}
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &mut candle_core::CudaStorage, l: &Layout) -> Result<()> {
        use candle_core::cuda_backend::CudaStorageSlice as S;
        let dev = s.device.clone();
        macro_rules! free {
            ($v:ident, $t:ty) => {
                if whole(l, $v.len()) {
                    let one = dev.alloc_zeros::<$t>(1)?;
                    drop(std::mem::replace($v, one));
                }
            };
        }
        match &mut s.slice {
            S::F32(v) => free!(v, f32),
            S::F16(v) => free!(v, half::f16),
            S::BF16(v) => free!(v, half::bf16),
            S::F64(v) => free!(v, f64),
            _ => {}
        }
        Ok(())
    }
}

/// Whether a layout covers all `len` elements of its storage (from offset 0, any strides).
fn whole(l: &Layout, len: usize) -> bool {
    l.start_offset() == 0 && l.shape().elem_count() == len
}

struct CutOp(Mutex<Option<Storage>>);

impl CutOp {
    fn whole(l: &Layout, len: usize) -> Result<()> {
        if !l.is_contiguous() || !whole(l, len) {
            candle_core::bail!(
                "by-block cut: the tensor does not own its storage alone ({:?}, {len} elements)",
                l
            )
        }
        Ok(())
    }

    fn put(&self, s: Storage) -> Result<()> {
        *self
            .0
            .lock()
            .map_err(|_| candle_core::Error::Msg("by-block cut: poisoned".into()))? = Some(s);
        Ok(())
    }
}

impl InplaceOp1 for CutOp {
    fn name(&self) -> &'static str {
        "by-block-cut"
    }

    fn cpu_fwd(&self, s: &mut CpuStorage, l: &Layout) -> Result<()> {
        macro_rules! take {
            ($v:ident, $variant:ident) => {{
                Self::whole(l, $v.len())?;
                CpuStorage::$variant(std::mem::take($v))
            }};
        }
        let taken = match s {
            CpuStorage::F32(v) => take!(v, F32),
            CpuStorage::F16(v) => take!(v, F16),
            CpuStorage::BF16(v) => take!(v, BF16),
            CpuStorage::F64(v) => take!(v, F64),
            other => candle_core::bail!("by-block cut: {:?} activations", other.dtype()),
        };
        self.put(Storage::Cpu(taken))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(&self, s: &mut candle_core::CudaStorage, l: &Layout) -> Result<()> {
        use candle_core::cuda_backend::CudaStorageSlice as S;
        let dev = s.device.clone();
        macro_rules! take {
            ($v:ident, $t:ty, $variant:ident) => {{
                Self::whole(l, $v.len())?;
                let one = dev.alloc_zeros::<$t>(1)?;
                S::$variant(std::mem::replace($v, one))
            }};
        }
        let taken = match &mut s.slice {
            S::F32(v) => take!(v, f32, F32),
            S::F16(v) => take!(v, half::f16, F16),
            S::BF16(v) => take!(v, half::bf16, BF16),
            S::F64(v) => take!(v, f64, F64),
            _ => candle_core::bail!("by-block cut: {:?} activations", s.dtype()),
        };
        self.put(Storage::Cuda(candle_core::CudaStorage {
            slice: taken,
            device: dev,
        }))
    }
}

/// A one-element tensor whose backward hands `grad` to `x` (the gradient of `x` from above).
/// Its forward does not read `x` (a cut tensor's storage is empty).
pub fn seed(x: &Tensor, grad: Tensor) -> Result<Tensor> {
    if grad.shape() != x.shape() {
        candle_core::bail!(
            "by-block seed: gradient {:?} for {:?}",
            grad.shape(),
            x.shape()
        )
    }
    x.apply_op1(SeedOp(Mutex::new(Some(grad))))
}

/// The gradient is taken by the backward (freed as soon as it is added to `x`'s).
struct SeedOp(Mutex<Option<Tensor>>);

impl CustomOp1 for SeedOp {
    fn name(&self) -> &'static str {
        "by-block-seed"
    }

    fn cpu_fwd(&self, s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        let one = match s.dtype() {
            DType::F32 => CpuStorage::F32(vec![0.0]),
            DType::F16 => CpuStorage::F16(vec![half::f16::ZERO]),
            DType::BF16 => CpuStorage::BF16(vec![half::bf16::ZERO]),
            DType::F64 => CpuStorage::F64(vec![0.0]),
            d => candle_core::bail!("by-block seed: {d:?} activations"),
        };
        Ok((one, Shape::from(())))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        _l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        use candle_core::cuda_backend::CudaStorageSlice as S;
        let dev = s.device.clone();
        let slice = match s.dtype() {
            DType::F32 => S::F32(dev.alloc_zeros::<f32>(1)?),
            DType::F16 => S::F16(dev.alloc_zeros::<half::f16>(1)?),
            DType::BF16 => S::BF16(dev.alloc_zeros::<half::bf16>(1)?),
            DType::F64 => S::F64(dev.alloc_zeros::<f64>(1)?),
            d => candle_core::bail!("by-block seed: {d:?} activations"),
        };
        Ok((
            candle_core::CudaStorage { slice, device: dev },
            Shape::from(()),
        ))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, _grad: &Tensor) -> Result<Option<Tensor>> {
        let g = self
            .0
            .lock()
            .map_err(|_| candle_core::Error::Msg("by-block seed: poisoned".into()))?
            .take();
        match g {
            Some(g) => Ok(Some(g)),
            None => candle_core::bail!("by-block seed: backpropagated twice"),
        }
    }
}
