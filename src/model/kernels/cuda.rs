//! The CUDA forwards of the fused kernels and of the in-place optimizer step: memfit's own
//! kernels (`fused.cu`, compiled to PTX by `build.rs` with nvcc for `CUDA_COMPUTE_CAP`, loaded
//! once per device through candle's `get_or_load_custom_func`), the products through candle's
//! cuBLAS matmul. Each forward allocates what the CPU kernel allocates, with one exception:
//! the cross-entropy keeps one f32 per row (`4·N` bytes) between its two launches.
//!
//! | op | launches | allocates |
//! |---|---|---|
//! | layer/RMS norm | `memfit_norm` (a block per row) | the output |
//! | attention probabilities | cuBLAS `q·kᵀ`, then `memfit_attn_softmax` in place | the output |
//! | cross-entropy | `memfit_ce_rows`, `memfit_ce_mean` | `4·N` (transient), the scalar |
//! | linear | cuBLAS `x·wᵀ`, then `memfit_add_bias` in place | the output |
//! | rotary | `memfit_rotary` (a thread per pair) | the output |
//! | optimizer updates | `memfit_axpby`, `memfit_adam_update` in place | nothing |
//! | FP8 weight dequantize | `memfit_fp8_dequant` (a thread per weight) | the output |
//! | MXFP4 weight dequantize | `memfit_mxfp4_dequant` (a thread per weight) | the output |

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{
    CudaSlice, CudaView, DeviceRepr, LaunchConfig, PushKernelArg,
};
use candle_core::cuda_backend::{CudaDType, WrapErr, kernel_name};
use candle_core::{CudaDevice, CudaStorage, DType, Layout, Result, Shape, WithDType, bail};

/// The PTX of `fused.cu`.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/fused.ptx"));
/// The module's name in candle's per-device cache of custom modules.
const MODULE: &str = "memfit-fused";
/// Threads per row block (`ROW_THREADS` in `fused.cu`).
const ROW_THREADS: u32 = 256;

/// What a kernel's element type must be.
pub trait Elem: CudaDType + DeviceRepr + WithDType {}
impl<T: CudaDType + DeviceRepr + WithDType> Elem for T {}

/// Calls `$f::<T>` with the storage's element type (f32, f16, bf16), or an error naming `$op`.
macro_rules! by_type {
    ($op:expr, into $dtype:expr, $f:ident($($arg:expr),*)) => {
        match $dtype {
            DType::F32 => $f::<f32>($($arg),*),
            DType::F16 => $f::<half::f16>($($arg),*),
            DType::BF16 => $f::<half::bf16>($($arg),*),
            other => bail!("{}: unsupported type {other:?}", $op),
        }
    };
    ($op:expr, $storage:expr, $f:ident($($arg:expr),*)) => {
        by_type!($op, into $storage.dtype(), $f($($arg),*))
    };
}

fn launch_rows(rows: usize) -> Result<LaunchConfig> {
    let Ok(rows) = u32::try_from(rows) else {
        bail!("{rows} rows are more than one CUDA launch takes")
    };
    Ok(LaunchConfig {
        grid_dim: (rows, 1, 1),
        block_dim: (ROW_THREADS, 1, 1),
        shared_mem_bytes: 0,
    })
}

fn launch_elems(n: usize) -> Result<LaunchConfig> {
    let Ok(n) = u32::try_from(n) else {
        bail!("{n} elements are more than one CUDA launch takes")
    };
    Ok(LaunchConfig::for_num_elems(n))
}

/// The contiguous elements of `l` in `s`, or an error naming `what`.
fn view<'a, T: Elem>(
    s: &'a CudaStorage,
    l: &Layout,
    op: &str,
    what: &str,
) -> Result<CudaView<'a, T>> {
    let data: &CudaSlice<T> = s.as_cuda_slice::<T>()?;
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(data.slice(a..b)),
        None => bail!("{op}: {what} must be contiguous"),
    }
}

fn i32_of(v: usize, op: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| candle_core::Error::Msg(format!("{op}: {v} is beyond i32")))
}

fn wrap<T: Elem>(slice: CudaSlice<T>, dev: &CudaDevice) -> CudaStorage {
    CudaStorage::wrap_cuda_slice(slice, dev.clone())
}

/// LayerNorm (`b` given) or RMSNorm of rows of `n` into a fresh output.
pub fn norm(
    op: &str,
    x: (&CudaStorage, &Layout),
    w: (&CudaStorage, &Layout),
    b: Option<(&CudaStorage, &Layout)>,
    eps: f32,
) -> Result<(CudaStorage, Shape)> {
    fn go<T: Elem>(
        op: &str,
        x: (&CudaStorage, &Layout),
        w: (&CudaStorage, &Layout),
        b: Option<(&CudaStorage, &Layout)>,
        eps: f32,
    ) -> Result<CudaStorage> {
        let dev = x.0.device();
        let n = x.1.shape().dims().last().copied().unwrap_or(1).max(1);
        let xs = view::<T>(x.0, x.1, op, "the input")?;
        let ws = view::<T>(w.0, w.1, op, "the weight")?;
        // RMSNorm passes the weight in the bias's place; the kernel ignores it.
        let bs = match b {
            Some((s, l)) => view::<T>(s, l, op, "the bias")?,
            None => view::<T>(w.0, w.1, op, "the weight")?,
        };
        if ws.len() != n || bs.len() != n {
            bail!("{op}: weight of {} for rows of {n}", ws.len())
        }
        let rows = xs.len() / n;
        let func = dev.get_or_load_custom_func(&kernel_name::<T>("memfit_norm"), MODULE, PTX)?;
        // SAFETY: every element is written by the kernel.
        let mut out = unsafe { dev.alloc::<T>(xs.len())? };
        let (n32, centre) = (i32_of(n, op)?, i32::from(b.is_some()));
        let mut args = func.builder();
        args.arg(&xs).arg(&ws).arg(&bs).arg(&mut out);
        args.arg(&n32).arg(&eps).arg(&centre);
        // SAFETY: the arguments match `memfit_norm`'s signature.
        unsafe { args.launch(launch_rows(rows)?) }.w()?;
        Ok(wrap(out, dev))
    }
    let out = by_type!(op, x.0, go(op, x, w, b, eps))?;
    Ok((out, x.1.shape().clone()))
}

/// Scale, causal mask (a sliding `window` when > 0) and softmax, in place, of `p`'s rows of
/// `sk` (`sq` queries per head).
pub fn attn_softmax(
    p: &mut CudaStorage,
    sq: usize,
    sk: usize,
    scale: f32,
    causal: bool,
    window: usize,
) -> Result<()> {
    fn go<T: Elem>(
        p: &mut CudaStorage,
        sq: usize,
        sk: usize,
        scale: f32,
        causal: bool,
        window: usize,
    ) -> Result<()> {
        let op = "attn_probs";
        let dev = p.device().clone();
        let data = p.as_cuda_slice_mut::<T>()?;
        let rows = data.len() / sk.max(1);
        let func =
            dev.get_or_load_custom_func(&kernel_name::<T>("memfit_attn_softmax"), MODULE, PTX)?;
        let (sq, sk, causal) = (i32_of(sq, op)?, i32_of(sk, op)?, i32::from(causal));
        let window = i32_of(window, op)?;
        let mut args = func.builder();
        args.arg(data)
            .arg(&sq)
            .arg(&sk)
            .arg(&scale)
            .arg(&causal)
            .arg(&window);
        // SAFETY: the arguments match `memfit_attn_softmax`'s signature.
        unsafe { args.launch(launch_rows(rows)?) }.w()?;
        Ok(())
    }
    by_type!("attn_probs", p, go(p, sq, sk, scale, causal, window))
}

/// Mean cross-entropy of logits `(N, V)` against u32 targets `(N)`: a scalar of the logits' type.
pub fn cross_entropy(
    x: (&CudaStorage, &Layout),
    t: (&CudaStorage, &Layout),
) -> Result<(CudaStorage, Shape)> {
    fn go<T: Elem>(x: (&CudaStorage, &Layout), t: (&CudaStorage, &Layout)) -> Result<CudaStorage> {
        let op = "cross_entropy";
        let dev = x.0.device();
        let (n, v) = x.1.shape().dims2()?;
        let xs = view::<T>(x.0, x.1, op, "logits")?;
        let ts = view::<u32>(t.0, t.1, op, "targets")?;
        if ts.len() != n {
            bail!("{op}: {} targets for {n} rows", ts.len())
        }
        // SAFETY: every row's loss is written by `memfit_ce_rows`.
        let mut rows = unsafe { dev.alloc::<f32>(n)? };
        let func = dev.get_or_load_custom_func(&kernel_name::<T>("memfit_ce_rows"), MODULE, PTX)?;
        let v32 = i32_of(v, op)?;
        let mut args = func.builder();
        args.arg(&xs).arg(&ts).arg(&mut rows).arg(&v32);
        // SAFETY: the arguments match `memfit_ce_rows`'s signature.
        unsafe { args.launch(launch_rows(n)?) }.w()?;
        // SAFETY: written by `memfit_ce_mean`.
        let mut out = unsafe { dev.alloc::<T>(1)? };
        let func = dev.get_or_load_custom_func(&kernel_name::<T>("memfit_ce_mean"), MODULE, PTX)?;
        let n32 = i32_of(n, op)?;
        let mut args = func.builder();
        args.arg(&rows).arg(&mut out).arg(&n32);
        // SAFETY: the arguments match `memfit_ce_mean`'s signature.
        unsafe { args.launch(launch_rows(1)?) }.w()?;
        drop(rows);
        Ok(wrap(out, dev))
    }
    let out = by_type!("cross_entropy", x.0, go(x, t))?;
    Ok((out, Shape::from_dims(&[])))
}

/// `y[i] += b[i % out]`, in place over all of `y`.
pub fn add_bias(y: &mut CudaStorage, b: (&CudaStorage, &Layout), out: usize) -> Result<()> {
    fn go<T: Elem>(y: &mut CudaStorage, b: (&CudaStorage, &Layout), out: usize) -> Result<()> {
        let op = "linear";
        let dev = y.device().clone();
        let bs = view::<T>(b.0, b.1, op, "the bias")?;
        let data = y.as_cuda_slice_mut::<T>()?;
        let total = data.len();
        let func =
            dev.get_or_load_custom_func(&kernel_name::<T>("memfit_add_bias"), MODULE, PTX)?;
        let out = i32_of(out, op)?;
        let mut args = func.builder();
        args.arg(data).arg(&bs).arg(&total).arg(&out);
        // SAFETY: the arguments match `memfit_add_bias`'s signature.
        unsafe { args.launch(launch_elems(total)?) }.w()?;
        Ok(())
    }
    by_type!("linear", y, go(y, b, out))
}

/// Block-scaled e4m3 weights `(rows, cols)` (128×128 blocks, f32 scales `(⌈rows/128⌉,
/// ⌈cols/128⌉)`) into a fresh `dtype` output.
pub fn fp8_dequant(
    w: (&CudaStorage, &Layout),
    s: (&CudaStorage, &Layout),
    rows: usize,
    cols: usize,
    dtype: DType,
) -> Result<CudaStorage> {
    fn go<T: Elem>(
        w: (&CudaStorage, &Layout),
        s: (&CudaStorage, &Layout),
        rows: usize,
        cols: usize,
    ) -> Result<CudaStorage> {
        let op = "fp8";
        let dev = w.0.device();
        let q: &CudaSlice<float8::F8E4M3> = w.0.as_cuda_slice()?;
        let q = match w.1.contiguous_offsets() {
            Some((a, b)) if b - a == rows * cols => q.slice(a..b),
            _ => bail!("{op}: the weight must be contiguous"),
        };
        let scales = view::<f32>(s.0, s.1, op, "the scales")?;
        let scale_cols = cols.div_ceil(128);
        if scales.len() != rows.div_ceil(128) * scale_cols {
            bail!(
                "{op}: {} scales for a ({rows}, {cols}) weight",
                scales.len()
            )
        }
        let n = rows * cols;
        let func =
            dev.get_or_load_custom_func(&kernel_name::<T>("memfit_fp8_dequant"), MODULE, PTX)?;
        // SAFETY: every element is written by the kernel.
        let mut out = unsafe { dev.alloc::<T>(n)? };
        let mut args = func.builder();
        args.arg(&q)
            .arg(&scales)
            .arg(&mut out)
            .arg(&rows)
            .arg(&cols)
            .arg(&scale_cols);
        // SAFETY: the arguments match `memfit_fp8_dequant`'s signature.
        unsafe { args.launch(launch_elems(n)?) }.w()?;
        Ok(wrap(out, dev))
    }
    by_type!("fp8", into dtype, go(w, s, rows, cols))
}

/// `len` contiguous bytes of `s` (`op` and `what` name them in the error).
fn bytes<'a>(
    s: &'a CudaStorage,
    l: &Layout,
    len: usize,
    op: &str,
    what: &str,
) -> Result<CudaView<'a, u8>> {
    let data: &CudaSlice<u8> = s.as_cuda_slice()?;
    match l.contiguous_offsets() {
        Some((a, e)) if e - a == len => Ok(data.slice(a..e)),
        _ => bail!("{op}: {what} must be contiguous, {len} bytes"),
    }
}

/// MXFP4 weights `(rows, cols)`: `blocks` `(rows, cols/2)` u8 (two e2m1 values a byte) and
/// `scales` `(rows, cols/32)` u8 (UE8M0), into a fresh `dtype` output.
pub fn mxfp4_dequant(
    b: (&CudaStorage, &Layout),
    s: (&CudaStorage, &Layout),
    rows: usize,
    cols: usize,
    dtype: DType,
) -> Result<CudaStorage> {
    fn go<T: Elem>(
        b: (&CudaStorage, &Layout),
        s: (&CudaStorage, &Layout),
        rows: usize,
        cols: usize,
    ) -> Result<CudaStorage> {
        let op = "mxfp4";
        let dev = b.0.device();
        let blocks = bytes(b.0, b.1, rows * cols / 2, op, "the values")?;
        let scales = bytes(s.0, s.1, rows * cols / 32, op, "the scales")?;
        let n = rows * cols;
        let func =
            dev.get_or_load_custom_func(&kernel_name::<T>("memfit_mxfp4_dequant"), MODULE, PTX)?;
        // SAFETY: every element is written by the kernel.
        let mut out = unsafe { dev.alloc::<T>(n)? };
        let mut args = func.builder();
        args.arg(&blocks)
            .arg(&scales)
            .arg(&mut out)
            .arg(&rows)
            .arg(&cols);
        // SAFETY: the arguments match `memfit_mxfp4_dequant`'s signature.
        unsafe { args.launch(launch_elems(n)?) }.w()?;
        Ok(wrap(out, dev))
    }
    by_type!("mxfp4", into dtype, go(b, s, rows, cols))
}

/// SwiGLU on contiguous gate and up: `silu(g)·u` (with `oss`, gpt-oss's clamped form) into a
/// fresh output (`grad` absent), or its backward (`grad` given): `[d/d gate; d/d up]` into one
/// fresh `2·n` output.
pub fn silu_mul(
    g: (&CudaStorage, &Layout),
    u: (&CudaStorage, &Layout),
    grad: Option<(&CudaStorage, &Layout)>,
    oss: bool,
) -> Result<CudaStorage> {
    fn go<T: Elem>(
        g: (&CudaStorage, &Layout),
        u: (&CudaStorage, &Layout),
        grad: Option<(&CudaStorage, &Layout)>,
        oss: bool,
    ) -> Result<CudaStorage> {
        let op = "silu_mul";
        let dev = g.0.device();
        let gs = view::<T>(g.0, g.1, op, "gate")?;
        let us = view::<T>(u.0, u.1, op, "up")?;
        let n = gs.len();
        let name = match (grad.is_some(), oss) {
            (true, false) => "memfit_silu_mul_grad",
            (false, false) => "memfit_silu_mul",
            (true, true) => "memfit_oss_glu_grad",
            (false, true) => "memfit_oss_glu",
        };
        let func = dev.get_or_load_custom_func(&kernel_name::<T>(name), MODULE, PTX)?;
        let outputs = if grad.is_some() { 2 * n } else { n };
        // SAFETY: every element is written by the kernel.
        let mut out = unsafe { dev.alloc::<T>(outputs)? };
        let mut args = func.builder();
        args.arg(&gs).arg(&us);
        let ds = grad.map(|d| view::<T>(d.0, d.1, op, "grad")).transpose()?;
        if let Some(ds) = &ds {
            args.arg(ds);
        }
        args.arg(&mut out).arg(&n);
        // SAFETY: the arguments match the kernel's signature.
        unsafe { args.launch(launch_elems(n)?) }.w()?;
        Ok(wrap(out, dev))
    }
    by_type!("silu_mul", g.0, go(g, u, grad, oss))
}

/// GELU's (tanh) backward on contiguous x and the output's gradient into a fresh output.
pub fn gelu_grad(x: (&CudaStorage, &Layout), dy: (&CudaStorage, &Layout)) -> Result<CudaStorage> {
    fn go<T: Elem>(x: (&CudaStorage, &Layout), dy: (&CudaStorage, &Layout)) -> Result<CudaStorage> {
        let op = "gelu";
        let dev = x.0.device();
        let xs = view::<T>(x.0, x.1, op, "x")?;
        let ds = view::<T>(dy.0, dy.1, op, "grad")?;
        let n = xs.len();
        if ds.len() != n {
            bail!("{op}: x of {n} elements, its gradient of {}", ds.len())
        }
        let func =
            dev.get_or_load_custom_func(&kernel_name::<T>("memfit_gelu_grad"), MODULE, PTX)?;
        // SAFETY: every element is written by the kernel.
        let mut out = unsafe { dev.alloc::<T>(n)? };
        let mut args = func.builder();
        args.arg(&xs).arg(&ds).arg(&mut out).arg(&n);
        // SAFETY: the arguments match `memfit_gelu_grad`'s signature.
        unsafe { args.launch(launch_elems(n)?) }.w()?;
        Ok(wrap(out, dev))
    }
    by_type!("gelu", x.0, go(x, dy))
}

/// A norm's backward (`model::kernels::norm::NormGradOp`): rows of `n` of contiguous x, w and
/// the output's gradient into one fresh `(rows + 1 + centre, n)` output — dx, then dw (and db
/// with `centre`) — through an f32 `(rows, 2)` buffer of the rows' mean and rstd, freed on
/// return (as on the CPU).
pub fn norm_grad(
    x: (&CudaStorage, &Layout),
    w: (&CudaStorage, &Layout),
    g: (&CudaStorage, &Layout),
    eps: f32,
    centre: bool,
) -> Result<CudaStorage> {
    fn go<T: Elem>(
        x: (&CudaStorage, &Layout),
        w: (&CudaStorage, &Layout),
        g: (&CudaStorage, &Layout),
        eps: f32,
        centre: bool,
    ) -> Result<CudaStorage> {
        let op = "norm backward";
        let dev = x.0.device();
        let n = x.1.shape().dims().last().copied().unwrap_or(1).max(1);
        let xs = view::<T>(x.0, x.1, op, "x")?;
        let ws = view::<T>(w.0, w.1, op, "the weight")?;
        let gs = view::<T>(g.0, g.1, op, "grad")?;
        if ws.len() != n || gs.len() != xs.len() {
            bail!(
                "{op}: x {:?}, weight of {}, grad of {}",
                x.1.shape(),
                ws.len(),
                gs.len()
            )
        }
        let rows = xs.len() / n;
        let extra = 1 + usize::from(centre);
        // SAFETY: every element is written by the kernels (db's row only with `centre`, and
        // only then does it exist).
        let mut out = unsafe { dev.alloc::<T>((rows + extra) * n)? };
        // SAFETY: every element is written by `memfit_norm_grad_x`.
        let mut stats = unsafe { dev.alloc::<f32>(2 * rows)? };
        let (n32, c) = (i32_of(n, op)?, i32::from(centre));
        let fx =
            dev.get_or_load_custom_func(&kernel_name::<T>("memfit_norm_grad_x"), MODULE, PTX)?;
        let mut args = fx.builder();
        args.arg(&xs)
            .arg(&ws)
            .arg(&gs)
            .arg(&mut out)
            .arg(&mut stats);
        args.arg(&n32).arg(&eps).arg(&c);
        // SAFETY: the arguments match `memfit_norm_grad_x`'s signature.
        unsafe { args.launch(launch_rows(rows)?) }.w()?;
        {
            let mut tail = out.slice_mut(rows * n..);
            let (mut dw, mut db) = tail.split_at_mut(n);
            let fw =
                dev.get_or_load_custom_func(&kernel_name::<T>("memfit_norm_grad_w"), MODULE, PTX)?;
            let mut args = fw.builder();
            args.arg(&xs).arg(&gs).arg(&stats).arg(&mut dw).arg(&mut db);
            args.arg(&n32).arg(&rows).arg(&c);
            // SAFETY: the arguments match `memfit_norm_grad_w`'s signature.
            unsafe { args.launch(launch_elems(n)?) }.w()?;
        }
        drop(stats);
        Ok(wrap(out, dev))
    }
    by_type!("norm backward", x.0, go(x, w, g, eps, centre))
}

/// Each row `r` of `y (rows, out)` times `s[r·stride]` (a strided column, `s`'s layout), in
/// place.
pub fn scale_rows(y: &mut CudaStorage, s: (&CudaStorage, &Layout), out: usize) -> Result<()> {
    fn go<T: Elem>(y: &mut CudaStorage, s: (&CudaStorage, &Layout), out: usize) -> Result<()> {
        let op = "linear-scaled";
        let dev = y.device().clone();
        let sd: &CudaSlice<T> = s.0.as_cuda_slice::<T>()?;
        let ss = sd.slice(s.1.start_offset()..);
        let stride = s.1.stride()[0];
        let data = y.as_cuda_slice_mut::<T>()?;
        let total = data.len();
        let func =
            dev.get_or_load_custom_func(&kernel_name::<T>("memfit_scale_rows"), MODULE, PTX)?;
        let out = i32_of(out, op)?;
        let mut args = func.builder();
        args.arg(data).arg(&ss).arg(&total).arg(&out).arg(&stride);
        // SAFETY: the arguments match `memfit_scale_rows`'s signature.
        unsafe { args.launch(launch_elems(total)?) }.w()?;
        Ok(())
    }
    by_type!("linear-scaled", y, go(y, s, out))
}

/// x `(B, n, S, 2h)` rotated by the tables `(S, h)`, into a fresh output.
pub fn rotary(
    x: (&CudaStorage, &Layout),
    cos: (&CudaStorage, &Layout),
    sin: (&CudaStorage, &Layout),
    nsh: [usize; 3],
    strides: [usize; 3],
) -> Result<CudaStorage> {
    fn go<T: Elem>(
        x: (&CudaStorage, &Layout),
        cos: (&CudaStorage, &Layout),
        sin: (&CudaStorage, &Layout),
        [n, s, h]: [usize; 3],
        [s0, s1, s2]: [usize; 3],
    ) -> Result<CudaStorage> {
        let op = "rotary";
        let dev = x.0.device();
        // x may be strided (a head split's view): from its first element on.
        let xd: &CudaSlice<T> = x.0.as_cuda_slice::<T>()?;
        let xs = xd.slice(x.1.start_offset()..);
        let cs = view::<T>(cos.0, cos.1, op, "cos")?;
        let ss = view::<T>(sin.0, sin.1, op, "sin")?;
        let len = x.1.shape().elem_count();
        // SAFETY: every pair is written by the kernel.
        let mut out = unsafe { dev.alloc::<T>(len)? };
        let pairs = len / 2;
        let func = dev.get_or_load_custom_func(&kernel_name::<T>("memfit_rotary"), MODULE, PTX)?;
        let (n, s, h) = (i32_of(n, op)?, i32_of(s, op)?, i32_of(h, op)?);
        let mut args = func.builder();
        args.arg(&xs).arg(&cs).arg(&ss).arg(&mut out);
        args.arg(&n).arg(&s).arg(&h).arg(&pairs);
        args.arg(&s0).arg(&s1).arg(&s2);
        // SAFETY: the arguments match `memfit_rotary`'s signature.
        unsafe { args.launch(launch_elems(pairs)?) }.w()?;
        Ok(wrap(out, dev))
    }
    by_type!("rotary", x.0, go(x, cos, sin, nsh, strides))
}

/// The contiguous elements of a parameter being updated in place.
fn dst_len(l: &Layout, n: usize) -> Result<(usize, usize)> {
    match l.contiguous_offsets() {
        Some((a, b)) if b <= n => Ok((a, b)),
        _ => bail!("in-place optimizer: the parameter must be contiguous"),
    }
}

/// `d ← a·d + b·x` (`b·x²` with `square`), in place.
pub fn axpby(
    d: (&mut CudaStorage, &Layout),
    x: (&CudaStorage, &Layout),
    a: f32,
    b: f32,
    square: bool,
) -> Result<()> {
    fn go<T: Elem>(
        d: (&mut CudaStorage, &Layout),
        x: (&CudaStorage, &Layout),
        a: f32,
        b: f32,
        square: bool,
    ) -> Result<()> {
        let op = "in-place optimizer";
        let dev = d.0.device().clone();
        let xs = view::<T>(x.0, x.1, op, "an operand")?;
        let data = d.0.as_cuda_slice_mut::<T>()?;
        let (lo, hi) = dst_len(d.1, data.len())?;
        if hi - lo != xs.len() {
            bail!("{op}: operands of different sizes")
        }
        let mut dst = data.slice_mut(lo..hi);
        let func = dev.get_or_load_custom_func(&kernel_name::<T>("memfit_axpby"), MODULE, PTX)?;
        let (n, square) = (hi - lo, i32::from(square));
        let mut args = func.builder();
        args.arg(&mut dst)
            .arg(&xs)
            .arg(&n)
            .arg(&a)
            .arg(&b)
            .arg(&square);
        // SAFETY: the arguments match `memfit_axpby`'s signature.
        unsafe { args.launch(launch_elems(n)?) }.w()?;
        Ok(())
    }
    by_type!("in-place optimizer", d.0, go(d, x, a, b, square))
}

/// AdamW's weight update `d ← d·decay − lr·(m·sm)/(√(v·sv) + eps)`, in place.
#[allow(clippy::too_many_arguments)]
pub fn adam_update(
    d: (&mut CudaStorage, &Layout),
    m: (&CudaStorage, &Layout),
    v: (&CudaStorage, &Layout),
    [lr, decay, sm, sv, eps]: [f32; 5],
) -> Result<()> {
    fn go<T: Elem>(
        d: (&mut CudaStorage, &Layout),
        m: (&CudaStorage, &Layout),
        v: (&CudaStorage, &Layout),
        k: [f32; 5],
    ) -> Result<()> {
        let op = "in-place optimizer";
        let dev = d.0.device().clone();
        let ms = view::<T>(m.0, m.1, op, "an operand")?;
        let vs = view::<T>(v.0, v.1, op, "an operand")?;
        let data = d.0.as_cuda_slice_mut::<T>()?;
        let (lo, hi) = dst_len(d.1, data.len())?;
        if hi - lo != ms.len() || hi - lo != vs.len() {
            bail!("{op}: operands of different sizes")
        }
        let mut dst = data.slice_mut(lo..hi);
        let func =
            dev.get_or_load_custom_func(&kernel_name::<T>("memfit_adam_update"), MODULE, PTX)?;
        let n = hi - lo;
        let mut args = func.builder();
        args.arg(&mut dst).arg(&ms).arg(&vs).arg(&n);
        for c in &k {
            args.arg(c);
        }
        // SAFETY: the arguments match `memfit_adam_update`'s signature.
        unsafe { args.launch(launch_elems(n)?) }.w()?;
        Ok(())
    }
    by_type!(
        "in-place optimizer",
        d.0,
        go(d, m, v, [lr, decay, sm, sv, eps])
    )
}
