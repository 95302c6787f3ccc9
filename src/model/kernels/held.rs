//! A two-arg kernel's candle op whose graph node holds tensors besides its args: what
//! transformers' autograd saves and memfit's lean op would not keep ([`super::Kernels::Transformers`]).
//! The forward is the inner op's; the backward is [`Kernel::backward`] on the args followed by
//! the held tensors (which get no gradient), as the replay's node, which keeps them as args.

use candle_core::{CpuStorage, CustomOp2, Layout, Result, Shape, Tensor};

use super::Kernel;

pub(crate) struct Held<O> {
    pub op: O,
    pub kernel: Kernel,
    pub held: Vec<Tensor>,
}

impl<O: CustomOp2> CustomOp2 for Held<O> {
    fn name(&self) -> &'static str {
        self.kernel.name()
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        self.op.cpu_fwd(s1, l1, s2, l2)
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        self.op.cuda_fwd(s1, l1, s2, l2)
    }

    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let mut args = vec![a, b];
        args.extend(self.held.iter());
        self.kernel.backward2(&args, res, grad)
    }
}
