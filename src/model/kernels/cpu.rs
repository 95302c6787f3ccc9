//! The CPU side of the fused kernels: element types, contiguous slices, row loops. Every
//! kernel reads its inputs in their type, accumulates in f32, and writes one fresh output.

use candle_core::{CpuStorage, Layout, Result, bail};
use half::{bf16, f16};
use rayon::prelude::*;

/// The floating types the kernels run in, as f32 for the arithmetic.
pub trait Float: candle_core::WithDType {
    fn f(self) -> f32;
    fn of(v: f32) -> Self;
}

impl Float for f32 {
    fn f(self) -> f32 {
        self
    }
    fn of(v: f32) -> Self {
        v
    }
}

impl Float for f16 {
    fn f(self) -> f32 {
        self.to_f32()
    }
    fn of(v: f32) -> Self {
        f16::from_f32(v)
    }
}

impl Float for bf16 {
    fn f(self) -> f32 {
        self.to_f32()
    }
    fn of(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

/// The contiguous elements of `layout` in `data`, or an error naming `what`.
pub fn slice<'a, T>(data: &'a [T], layout: &Layout, op: &str, what: &str) -> Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((a, b)) => Ok(&data[a..b]),
        None => bail!("{op}: {what} must be contiguous"),
    }
}

/// Rows of `n` computed in parallel (serially when there are few).
pub fn rows<T: Float>(out: &mut [T], n: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    if out.len() / n.max(1) <= 32 {
        out.chunks_mut(n).enumerate().for_each(|(i, r)| f(i, r));
    } else {
        out.par_chunks_mut(n).enumerate().for_each(|(i, r)| f(i, r));
    }
}

/// A vector of `len` elements, uninitialised-free (zeroed) and exactly sized.
pub fn zeros<T: Float>(len: usize) -> Vec<T> {
    vec![T::of(0.0); len]
}

/// Calls `$body` with `$t` bound to the element type of `$storage` (f32, f16, bf16) and
/// `$v` to its data; other types are an error naming `$op`.
macro_rules! dispatch {
    ($op:expr, $storage:expr, |$v:ident: $t:ident| $body:expr) => {
        match $storage {
            candle_core::CpuStorage::F32($v) => {
                type $t = f32;
                $body
            }
            candle_core::CpuStorage::F16($v) => {
                type $t = half::f16;
                $body
            }
            candle_core::CpuStorage::BF16($v) => {
                type $t = half::bf16;
                $body
            }
            other => candle_core::bail!(
                "{}: unsupported type {:?}",
                $op,
                candle_core::backend::BackendStorage::dtype(other)
            ),
        }
    };
}
pub(crate) use dispatch;

/// The `T` data of a second operand, which must have the first's type (candle's
/// `CpuStorage::as_slice`, its error prefixed with the op's name).
pub fn same<'a, T: candle_core::WithDType>(op: &str, s: &'a CpuStorage) -> Result<&'a [T]> {
    s.as_slice::<T>()
        .map_err(|e| candle_core::Error::Msg(format!("{op}: {e}")))
}
