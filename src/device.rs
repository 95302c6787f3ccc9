//! Where a case runs and in which element type: `cpu` or `cuda:N`, `f32`, `bf16` or `f16`.
//!
//! The CPU backend runs `f32` only (candle 0.11.1's CPU matmul has no `bf16`, and memfit's CPU
//! formulas are for `f32`). `cuda:N` needs a memfit built with the `cuda` feature
//! (`scripts/build-cuda.sh`); other builds refuse it when the workload is read, with that hint.

use std::fmt;

/// A device a case can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceSpec {
    Cpu,
    Cuda(usize),
}

/// Highest CUDA ordinal accepted.
pub const MAX_CUDA_ORDINAL: usize = 63;

impl DeviceSpec {
    /// `cpu`, `cuda` (= `cuda:0`) or `cuda:N`; `None` for anything else.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "cpu" => Some(Self::Cpu),
            "cuda" => Some(Self::Cuda(0)),
            _ => {
                let n: usize = s.strip_prefix("cuda:")?.parse().ok()?;
                (n <= MAX_CUDA_ORDINAL).then_some(Self::Cuda(n))
            }
        }
    }

    /// The `--device` flag of a command: [`parse`](Self::parse), or an error naming the flag.
    pub fn from_flag(s: &str) -> Result<Self, crate::error::UserError> {
        Self::parse(s).ok_or_else(|| crate::error::UserError::OutOfRange {
            origin: "flags".into(),
            key: "device".into(),
            value: s.into(),
            reason: "unknown device".into(),
            allowed: "cpu, cuda, cuda:N".into(),
        })
    }

    pub fn is_cuda(self) -> bool {
        matches!(self, Self::Cuda(_))
    }

    /// The candle device (CUDA needs the `cuda` feature).
    pub fn candle(self) -> candle_core::Result<candle_core::Device> {
        match self {
            Self::Cpu => Ok(candle_core::Device::Cpu),
            #[cfg(feature = "cuda")]
            Self::Cuda(n) => cuda::open(n),
            #[cfg(not(feature = "cuda"))]
            Self::Cuda(_) => Err(candle_core::Error::Msg(NO_CUDA.into())),
        }
    }
}

/// A CUDA device's UUID (`cuDeviceGetUuid`, 16 bytes) as NVML names it:
/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`. NVML numbers devices in PCI order, CUDA by
/// `CUDA_VISIBLE_DEVICES` and speed, so the ordinal is not NVML's index: the UUID is.
pub fn nvml_uuid(bytes: [u8; 16]) -> String {
    let h: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        h[0..4].concat(),
        h[4..6].concat(),
        h[6..8].concat(),
        h[8..10].concat(),
        h[10..16].concat()
    )
}

/// Bytes of the fixed cuBLAS workspace memfit gives each CUDA device (32 MiB, cuBLAS's advice
/// for Hopper): allocated once with `cuMemAlloc`, outside the memory pool the peak meter reads.
/// Without it cuBLAS ≥ 12.2 allocates its workspace from the current pool, and every window
/// with a matmul could see tens of MiB that are not tensors.
pub const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// The environment variable that sets the CUDA pool's release threshold for a run.
pub const POOL_RELEASE_VAR: &str = "MEMFIT_CUDA_POOL_RELEASE";

/// The default pool's release threshold (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`) from
/// [`POOL_RELEASE_VAR`]: unset or `keep`, `u64::MAX` (freed blocks stay in the pool, as PyTorch's
/// caching allocator keeps them, so the trim after a window measures what the pool cached);
/// `0`, CUDA's default (freed blocks go back at every synchronisation). The run's meta records
/// the value (`cuda_pool_release_threshold`).
pub fn pool_release_threshold(value: Option<&str>) -> Result<u64, crate::error::UserError> {
    match value {
        None | Some("keep") => Ok(u64::MAX),
        Some("0") => Ok(0),
        Some(v) => Err(crate::error::UserError::OutOfRange {
            origin: "environment".into(),
            key: POOL_RELEASE_VAR.into(),
            value: v.into(),
            reason: "the CUDA pool's release threshold".into(),
            allowed: "keep (the default), 0".into(),
        }),
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use candle_core::cuda_backend::cudarc::{cublas, driver::result};
    use candle_core::{Device, Result};

    /// One open device per ordinal in this process: the meters' setup and the runner share it
    /// (one CUDA stream and cuBLAS handle, one workspace).
    static OPEN: Mutex<BTreeMap<usize, Device>> = Mutex::new(BTreeMap::new());

    pub fn open(n: usize) -> Result<Device> {
        let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(d) = open.get(&n) {
            return Ok(d.clone());
        }
        let dev = Device::new_cuda(n)?;
        set_cublas_workspace(&dev)?;
        open.insert(n, dev.clone());
        Ok(dev)
    }

    /// [`super::CUBLAS_WORKSPACE_BYTES`] from `cuMemAlloc`, handed to the device's cuBLAS
    /// handle. The buffer lives as long as the process (the device stays open above).
    fn set_cublas_workspace(dev: &Device) -> Result<()> {
        let cuda = dev.as_cuda_device()?;
        let ctx = cuda.cuda_stream().context().clone();
        ctx.bind_to_thread()
            .map_err(|e| candle_core::Error::Msg(format!("binding the CUDA context: {e}")))?;
        let bytes = super::CUBLAS_WORKSPACE_BYTES;
        // SAFETY: a plain allocation on the bound context, never freed (see above).
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(|e| {
            candle_core::Error::Msg(format!("cuMemAlloc of the cuBLAS workspace: {e}"))
        })?;
        let blas = cuda.cublas_handle();
        // SAFETY: the handle is live (held by the device) and the buffer is `bytes` long.
        let status = unsafe {
            cublas::sys::cublasSetWorkspace_v2(*blas.handle(), ptr as *mut core::ffi::c_void, bytes)
        };
        if status != cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            candle_core::bail!("cublasSetWorkspace_v2: {status:?}")
        }
        Ok(())
    }
}

/// Why a CPU-only build refuses `cuda:N`, and what to do.
pub const NO_CUDA: &str = "this memfit was built without the cuda feature: build the CUDA binary \
    with scripts/build-cuda.sh (or cargo build --release --features cuda)";

/// True when this binary can run CUDA cases.
pub const HAS_CUDA: bool = cfg!(feature = "cuda");

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => write!(f, "cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// How the element type is used: `pure` (weights, activations, gradients and optimizer state
/// all in it) or `mixed` (f32 master weights, gradients and optimizer state; a 16-bit working
/// copy of the weights and 16-bit activations; the loss in f32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Precision {
    Pure,
    Mixed,
}

impl Precision {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pure" => Some(Self::Pure),
            "mixed" => Some(Self::Mixed),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pure => "pure",
            Self::Mixed => "mixed",
        }
    }
}

/// The weights the inference phases (inference, prefill, decode) serve with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServingWeights {
    /// The trained model's own weights (its dtype; the 16-bit copy under mixed precision).
    Model,
    /// An f16 copy.
    F16,
    /// The block projections as GGML Q8_0 / Q4_0 blocks, or GGUF's Q4_K / Q6_K k-quant
    /// super-blocks, through the frozen-linear op (dequantized per call, on the device).
    Q8_0,
    Q4_0,
    Q4K,
    Q6K,
    /// FP8 e4m3 with an f32 scale per 128×128 block (how DeepSeek-V3 and the `*-FP8`
    /// checkpoints ship their projections).
    Fp8,
    /// MXFP4: e2m1 values with a power-of-two scale per 32.
    Mxfp4,
    /// The experts' projections in MXFP4, everything else the model's own (how gpt-oss ships
    /// its checkpoints).
    Mxfp4Experts,
}

impl ServingWeights {
    pub const NAMES: &'static str = "model, f16, q8_0, q4_0, q4_k, q6_k, fp8, mxfp4, mxfp4-experts";

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "model" => Some(Self::Model),
            "f16" => Some(Self::F16),
            "q8_0" => Some(Self::Q8_0),
            "q4_0" => Some(Self::Q4_0),
            "q4_k" => Some(Self::Q4K),
            "q6_k" => Some(Self::Q6K),
            "fp8" => Some(Self::Fp8),
            "mxfp4" => Some(Self::Mxfp4),
            "mxfp4-experts" => Some(Self::Mxfp4Experts),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Model => "model",
            Self::F16 => "f16",
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
            Self::Q4K => "q4_k",
            Self::Q6K => "q6_k",
            Self::Fp8 => "fp8",
            Self::Mxfp4 => "mxfp4",
            Self::Mxfp4Experts => "mxfp4-experts",
        }
    }

    /// The frozen base the quantized weights serve through; `None` for dense weights.
    pub fn quantized(self) -> Option<crate::model::shapes::LoraBase> {
        use crate::model::shapes::LoraBase;
        match self {
            Self::Model | Self::F16 => None,
            Self::Q8_0 => Some(LoraBase::Q8_0),
            Self::Q4_0 => Some(LoraBase::Q4_0),
            Self::Q4K => Some(LoraBase::Q4K),
            Self::Q6K => Some(LoraBase::Q6K),
            Self::Fp8 => Some(LoraBase::Fp8),
            Self::Mxfp4 | Self::Mxfp4Experts => Some(LoraBase::Mxfp4),
        }
    }

    /// Only a mixture of experts' expert projections are held quantized; attention, routers,
    /// embeddings and the head stay the model's own.
    pub fn experts_only(self) -> bool {
        self == Self::Mxfp4Experts
    }
}

pub use crate::model::shapes::ElemType;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_release_threshold_is_keep_or_zero() {
        assert_eq!(pool_release_threshold(None).unwrap(), u64::MAX);
        assert_eq!(pool_release_threshold(Some("keep")).unwrap(), u64::MAX);
        assert_eq!(pool_release_threshold(Some("0")).unwrap(), 0);
        let e = pool_release_threshold(Some("1GiB"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(POOL_RELEASE_VAR) && e.contains("keep (the default), 0"),
            "{e}"
        );
    }

    #[test]
    fn uuids_print_as_nvml_names_them() {
        let b = [
            0x8f, 0x2c, 0x1a, 0x00, 0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x02,
            0x03, 0x04,
        ];
        assert_eq!(nvml_uuid(b), "GPU-8f2c1a00-1234-5678-9abc-def001020304");
    }

    #[test]
    fn devices_parse_and_print() {
        assert_eq!(DeviceSpec::parse("cpu"), Some(DeviceSpec::Cpu));
        assert_eq!(DeviceSpec::parse("cuda"), Some(DeviceSpec::Cuda(0)));
        assert_eq!(DeviceSpec::parse("cuda:3"), Some(DeviceSpec::Cuda(3)));
        assert_eq!(DeviceSpec::parse("cuda:64"), None);
        assert_eq!(DeviceSpec::parse("cuda:-1"), None);
        assert_eq!(DeviceSpec::parse("gpu"), None);
        assert_eq!(DeviceSpec::Cuda(2).to_string(), "cuda:2");
    }

    #[test]
    fn elem_types() {
        assert_eq!(ElemType::parse("bf16").map(ElemType::size), Some(2));
        assert_eq!(ElemType::parse("f32").map(ElemType::size), Some(4));
        assert_eq!(ElemType::parse("f64"), None);
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn a_cpu_build_refuses_cuda_with_the_hint() {
        let e = DeviceSpec::Cuda(0).candle().unwrap_err().to_string();
        assert!(e.contains("scripts/build-cuda.sh"), "{e}");
    }
}
