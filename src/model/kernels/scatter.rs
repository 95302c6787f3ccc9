//! The mixture of experts' combine as one op: the routed experts' scaled outputs `y (k·T, H)`
//! (concatenated, expert after expert) added into a `(T, H)` output at their tokens `ids (k·T)`
//! u32. candle's `zeros.index_add(ids, y)` is a graph node holding the zeros it copied, a
//! `(T, H)` tensor per sparse layer kept until the backward; here the node holds y and ids
//! (what the backward reads: `dy = g[ids]`, a row gather). Forward: zeros then candle's own
//! `index_add` into a new output (the zeros freed when the op returns), on every device.

use candle_core::backend::{BackendDevice, BackendStorage};
use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use super::Kernel;

/// `out (rows, H) = Σ` of y's rows at their `ids`; y `(n, H)`, ids `(n)` u32.
pub fn scatter_rows(y: &Tensor, ids: &Tensor, rows: usize) -> Result<Tensor> {
    y.apply_op2(ids, ScatterRowsOp { rows })
}

struct ScatterRowsOp {
    rows: usize,
}

impl ScatterRowsOp {
    fn shape(&self, l1: &Layout, l2: &Layout) -> Result<Shape> {
        let (n, h) = l1.shape().dims2()?;
        if l2.shape().dims() != [n] {
            candle_core::bail!(
                "{}: y {:?} and ids {:?}",
                Kernel::ScatterRows { rows: self.rows }.name(),
                l1.shape(),
                l2.shape()
            )
        }
        Ok(Shape::from_dims(&[self.rows, h]))
    }

    /// Zeros, then the device's own `index_add` of y's rows into a new output.
    fn run<B: BackendStorage>(&self, y: &B, ly: &Layout, ids: &B, li: &Layout) -> Result<(B, Shape)>
    where
        B::Device: BackendDevice<Storage = B>,
    {
        let shape = self.shape(ly, li)?;
        let zeros = y.device().zeros_impl(&shape, y.dtype())?;
        let out = zeros.index_add(&Layout::contiguous(&shape), ids, li, y, ly, 0)?;
        Ok((out, shape))
    }
}

impl CustomOp2 for ScatterRowsOp {
    fn name(&self) -> &'static str {
        Kernel::ScatterRows { rows: self.rows }.name()
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.run(s1, l1, s2, l2)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        self.run(s1, l1, s2, l2)
    }

    fn bwd(
        &self,
        y: &Tensor,
        ids: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        Kernel::ScatterRows { rows: self.rows }.backward2(&[y, ids], res, grad)
    }
}
