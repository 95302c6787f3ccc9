//! Symbolic tensors: candle 0.11.1's CPU memory behaviour, op by op, without the data.
//!
//! A [`Sym`] carries what decides memory in candle and nothing else: its shape and strides, the
//! storage it shares with its views, the op that made it (which holds its inputs alive) and
//! whether it is a variable. Each op allocates exactly what candle's CPU backend allocates for it
//! (a fresh output of `elements × dtype size` bytes; views such as `reshape` of a contiguous
//! tensor, `transpose`, `broadcast_as`, `narrow`, `squeeze` allocate nothing), and a storage is
//! freed when its last holder is dropped, exactly as candle's `Arc`s do. A [`Ledger`] counts the
//! live bytes and their high-water mark.
//!
//! [`backward`] is candle's `Tensor::backward` (candle-core 0.11.1 `src/backprop.rs`) transcribed
//! statement by statement for the ops the models use, so Rust's drop order reproduces candle's:
//! the topological order of `sorted_nodes`, `or_insert`'s zero tensors, the gradients of constant
//! operands that are computed and never removed, and — the largest effect — backward
//! temporaries that stay alive inside an accumulated gradient whenever they were computed from a
//! tracked forward tensor (their op records them), until that gradient's node is processed.
//!
//! The counts are of tensor *data*. candle's per-tensor bookkeeping (the `Arc<Tensor_>`, shape
//! and stride vectors, op nodes) is modelled as [`Ledger::meta_per_tensor`] bytes per live tensor
//! (measured; see `formula::transformer`).

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;

use crate::model::kernels::{Graph, Kernel};
pub use crate::timeline::{BOOKKEEPING, Event, WORKSPACE};

mod backward;
mod graph;
mod ledger;

pub use backward::{GradStore, backward};
pub use graph::*;
pub use ledger::*;

/// Element types the models use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    U8,
    U32,
    F32,
    /// bf16 or f16 (memory-wise the same).
    Half,
}

impl DType {
    /// candle's element type as the ledger counts it (f16 and bf16 alike).
    pub fn of(d: candle_core::DType) -> DType {
        match d {
            candle_core::DType::F32 => DType::F32,
            candle_core::DType::U32 => DType::U32,
            candle_core::DType::U8 => DType::U8,
            _ => DType::Half,
        }
    }

    pub fn size(self) -> u64 {
        match self {
            DType::U8 => 1,
            DType::U32 | DType::F32 => 4,
            DType::Half => 2,
        }
    }

    fn is_int(self) -> bool {
        matches!(self, DType::U8 | DType::U32)
    }
}

/// One allocation: freed when the last tensor sharing it is dropped.
#[derive(Debug)]
struct Storage {
    /// What it holds (a cut moves it out: [`Sym::cut`]).
    bytes: Cell<u64>,
    /// Its [`Event::id`].
    id: u64,
    ledger: Rc<Ledger>,
}

impl Drop for Storage {
    fn drop(&mut self) {
        self.ledger.free_as(self.bytes.get(), self.id);
    }
}

/// Shape and strides (candle's `Layout`, without the offset, which never matters for memory).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Layout {
    dims: Vec<usize>,
    strides: Vec<usize>,
}

impl Layout {
    fn contiguous(dims: &[usize]) -> Self {
        let mut strides = vec![1; dims.len()];
        for i in (0..dims.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * dims[i + 1];
        }
        Self {
            dims: dims.to_vec(),
            strides,
        }
    }

    /// candle's `Shape::is_contiguous`: dimensions of size 1 may have any stride.
    /// The same view with dimensions `a` and `b` swapped.
    fn transposed(&self, a: usize, b: usize) -> Layout {
        let mut l = self.clone();
        l.dims.swap(a, b);
        l.strides.swap(a, b);
        l
    }

    fn is_contiguous(&self) -> bool {
        let mut acc = 1;
        for (&stride, &dim) in self.strides.iter().zip(&self.dims).rev() {
            if dim > 1 && stride != acc {
                return false;
            }
            acc *= dim;
        }
        true
    }

    fn elems(&self) -> u64 {
        self.dims.iter().map(|&d| d as u64).product()
    }
}

/// The op that produced a tracked tensor; it keeps its inputs alive.
#[derive(Debug)]
pub enum Op {
    Add(Sym, Sym),
    Sub(Sym, Sym),
    Mul(Sym, Sym),
    Div(Sym, Sym),
    Affine(Sym, f64),
    Matmul(Sym, Sym),
    Broadcast(Sym),
    Reshape(Sym),
    Transpose(Sym, usize, usize),
    /// `permute`: the dimensions in their new order.
    Permute(Sym, Vec<usize>),
    /// `Tensor::cat` along a dimension (recorded when any part is tracked).
    Cat(Vec<Sym>, usize),
    Copy(Sym),
    Narrow(Sym, usize, usize, usize),
    Sum(Sym, Vec<usize>),
    Max(Sym, Vec<usize>),
    Gather(Sym, Sym, usize),
    IndexSelect(Sym, Sym, usize),
    /// `index_add` with its result tracked (the mixture of experts adds each expert's output
    /// back): init, indexes, source, dim.
    IndexAdd(Sym, Sym, Sym, usize),
    Cmp(Sym),
    ToDType(Sym),
    Exp(Sym),
    Log(Sym),
    Sqr(Sym),
    Sqrt(Sym),
    Tanh(Sym),
    Gelu(Sym),
    /// `silu` (LLaMA's MLP), and the `neg` and `recip` its backward makes.
    Silu(Sym),
    Neg(Sym),
    Recip(Sym),
    Powf(Sym, f64),
    /// memfit's efficient attention (a candle `CustomOp3` on q, k, v).
    Attn(Sym, Sym, Sym),
    /// memfit's frozen linear (a `CustomOp1` on x): input, the dense weight or `None` when
    /// quantized (dequantized to `(out, in)` f32 per call), output width, and the bytes the CPU
    /// dequantize holds beside its f32 output (`frozen::dequantize_scratch`).
    /// The input, the dense weight (kept for the backward; `None` when quantized), how the
    /// weight is held, the output width.
    Frozen(Sym, Option<Sym>, FrozenW, usize),
    /// One of memfit's fused kernels (`model::kernels`, a `CustomOp1/2/3` on its args).
    Kernel(Kernel, Vec<Sym>),
    /// `model::kernels::boundary::seed`: a one-element op on a boundary tensor whose backward hands in
    /// the gradient from above (taken by the backward).
    Seed(Sym, std::cell::RefCell<Option<Sym>>),
    /// Tensor parallelism's `f` (`model::tensor_parallel`, a `CustomOp1` on ranks): a copy of
    /// its input whose backward all-reduces the gradient into a fresh tensor.
    TpEnter(Sym),
    /// Tensor parallelism's `g`: the input summed over the group into a fresh tensor; its
    /// backward hands the gradient on as it is.
    TpReduce(Sym),
    /// Sequence parallelism's all-gather along the sequence over `tp` ranks (a `CustomOp1` on
    /// ranks): `(B, s, H)` → a fresh `(B, tp·s, H)`; the backward reduce-scatters the gradient
    /// into a fresh `(B, s, H)`.
    SpGather(Sym, usize),
    /// Sequence parallelism's reduce-scatter along the sequence over `tp` ranks: `(B, S, H)` →
    /// a fresh `(B, S/tp, H)`; the backward all-gathers the gradient into a fresh `(B, S, H)`.
    SpScatter(Sym, usize),
}

impl Op {
    /// The op's name in a timeline ([`Event::label`]).
    pub fn name(&self) -> &'static str {
        match self {
            Op::Add(..) => "add",
            Op::Sub(..) => "sub",
            Op::Mul(..) => "mul",
            Op::Div(..) => "div",
            Op::Affine(..) => "affine",
            Op::Matmul(..) => "matmul",
            Op::Broadcast(..) => "broadcast",
            Op::Reshape(..) => "reshape",
            Op::Transpose(..) => "transpose",
            Op::Permute(..) => "permute",
            Op::Cat(..) => "cat",
            Op::Copy(..) => "copy",
            Op::Narrow(..) => "narrow",
            Op::Sum(..) => "sum",
            Op::Max(..) => "max",
            Op::Gather(..) => "gather",
            Op::IndexSelect(..) => "index-select",
            Op::IndexAdd(..) => "index-add",
            Op::Cmp(..) => "cmp",
            Op::ToDType(..) => "to-dtype",
            Op::Exp(..) => "exp",
            Op::Log(..) => "log",
            Op::Sqr(..) => "sqr",
            Op::Sqrt(..) => "sqrt",
            Op::Tanh(..) => "tanh",
            Op::Gelu(..) => "gelu",
            Op::Silu(..) => "silu",
            Op::Neg(..) => "neg",
            Op::Recip(..) => "recip",
            Op::Powf(..) => "powf",
            Op::Attn(..) => "efficient-attention",
            Op::Frozen(..) => "frozen-linear",
            Op::Kernel(k, _) => k.name(),
            Op::Seed(..) => "seed",
            Op::TpEnter(..) => "tp-f",
            Op::TpReduce(..) => "tp-g",
            Op::SpGather(..) => "sp-gather",
            Op::SpScatter(..) => "sp-scatter",
        }
    }
}

#[derive(Debug)]
struct Inner {
    id: u64,
    /// The ledger's tag when it was made ([`Ledger::set_tag`]): backward processes it there.
    tag: u32,
    layout: Layout,
    dtype: DType,
    storage: Rc<Storage>,
    op: Option<Op>,
    is_variable: bool,
    ledger: Rc<Ledger>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.ledger
            .free_as(self.ledger.meta_per_tensor, BOOKKEEPING);
    }
}

/// A symbolic tensor (cheap to clone, like candle's `Tensor`).
#[derive(Debug, Clone)]
pub struct Sym(Rc<Inner>);

impl Sym {
    fn make(
        ledger: &Rc<Ledger>,
        layout: Layout,
        dtype: DType,
        storage: Rc<Storage>,
        op: Option<Op>,
        is_variable: bool,
    ) -> Sym {
        ledger.alloc_as(ledger.meta_per_tensor, BOOKKEEPING, "bookkeeping");
        Sym(Rc::new(Inner {
            id: ledger.id(),
            tag: ledger.tag.get(),
            layout,
            dtype,
            storage,
            op,
            is_variable,
            ledger: ledger.clone(),
        }))
    }

    /// A fresh contiguous allocation (`from_storage`).
    fn fresh(ledger: &Rc<Ledger>, dims: &[usize], dtype: DType, op: Option<Op>) -> Sym {
        Sym::fresh_var(ledger, dims, dtype, op, false)
    }

    fn fresh_var(
        ledger: &Rc<Ledger>,
        dims: &[usize],
        dtype: DType,
        op: Option<Op>,
        is_variable: bool,
    ) -> Sym {
        let layout = Layout::contiguous(dims);
        let bytes = layout.elems() * dtype.size();
        let id = ledger.storage_id();
        let label = match (&op, ledger.context.get()) {
            (Some(op), _) => op.name(),
            (None, "") => "tensor",
            (None, during) => during,
        };
        ledger.alloc_as(bytes, id, label);
        let storage = Rc::new(Storage {
            bytes: Cell::new(bytes),
            id,
            ledger: ledger.clone(),
        });
        Sym::make(ledger, layout, dtype, storage, op, is_variable)
    }

    /// A new tensor without op (`Tensor::zeros`, `from_vec`, …).
    pub fn new(ledger: &Rc<Ledger>, dims: &[usize], dtype: DType) -> Sym {
        Sym::fresh(ledger, dims, dtype, None)
    }

    /// A variable (a `Var`'s tensor).
    pub fn var(ledger: &Rc<Ledger>, dims: &[usize], dtype: DType) -> Sym {
        Sym::fresh_var(ledger, dims, dtype, None, true)
    }

    fn view_with(&self, layout: Layout, op: Option<Op>, is_variable: bool) -> Sym {
        Sym::make(
            &self.0.ledger,
            layout,
            self.0.dtype,
            self.0.storage.clone(),
            op,
            is_variable,
        )
    }

    pub fn ledger(&self) -> &Rc<Ledger> {
        &self.0.ledger
    }

    pub fn id(&self) -> u64 {
        self.0.id
    }

    /// The tag it was made under ([`Ledger::set_tag`]).
    pub fn tag(&self) -> u32 {
        self.0.tag
    }

    pub fn dims(&self) -> &[usize] {
        &self.0.layout.dims
    }

    pub fn dtype(&self) -> DType {
        self.0.dtype
    }

    pub fn is_variable(&self) -> bool {
        self.0.is_variable
    }

    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }

    pub fn op(&self) -> Option<&Op> {
        self.0.op.as_ref()
    }

    pub(crate) fn track_op(&self) -> bool {
        self.0.is_variable || self.0.op.is_some()
    }

    fn op1(&self, f: impl FnOnce(Sym) -> Op) -> Option<Op> {
        self.track_op().then(|| f(self.clone()))
    }

    fn op2(&self, rhs: &Sym, f: impl FnOnce(Sym, Sym) -> Op) -> Option<Op> {
        (self.track_op() || rhs.track_op()).then(|| f(self.clone(), rhs.clone()))
    }

    fn out(&self, dims: &[usize], dtype: DType, op: Option<Op>) -> Sym {
        Sym::fresh(self.ledger(), dims, dtype, op)
    }

    // ---- creation --------------------------------------------------------------------------

    pub fn zeros_like(&self) -> Sym {
        Sym::new(self.ledger(), self.dims(), self.0.dtype)
    }

    pub fn ones_like(&self) -> Sym {
        self.zeros_like()
    }

    /// `detach`: a tensor without op sharing the storage (the same tensor if already detached).
    pub fn detach(&self) -> Sym {
        if self.0.op.is_none() && !self.0.is_variable {
            self.clone()
        } else {
            self.view_with(self.0.layout.clone(), None, false)
        }
    }

    /// `model::kernels::boundary::cut`: the storage moved (nothing allocated) into a new variable of
    /// this shape; `self` keeps its op and an empty storage (one element on CUDA, where an
    /// allocation cannot be empty).
    pub fn cut(&self, cuda: bool) -> Sym {
        let ledger = self.ledger();
        let bytes = self.0.storage.bytes.get();
        let left = if cuda { self.0.dtype.size() } else { 0 };
        let (old, id) = (self.0.storage.id, ledger.storage_id());
        ledger.note(old, left as i64 - bytes as i64, "");
        ledger.note(id, bytes as i64, "cut");
        ledger.alloc(left);
        self.0.storage.bytes.set(left);
        let storage = Rc::new(Storage {
            bytes: Cell::new(bytes),
            id,
            ledger: ledger.clone(),
        });
        Sym::make(
            ledger,
            Layout::contiguous(self.dims()),
            self.0.dtype,
            storage,
            None,
            true,
        )
    }

    /// `model::kernels::boundary::release`: when this one covers its storage whole, the storage
    /// freed in place (one element left on CUDA); otherwise nothing.
    pub fn release(&self, cuda: bool) {
        let bytes = self.0.storage.bytes.get();
        let size = self.0.dtype.size();
        let count: usize = self.dims().iter().product();
        if count as u64 * size != bytes || bytes == 0 {
            return;
        }
        let left = if cuda { size } else { 0 };
        let ledger = self.ledger();
        ledger.alloc_as(left, self.0.storage.id, "");
        ledger.free_as(bytes, self.0.storage.id);
        self.0.storage.bytes.set(left);
    }

    /// `model::kernels::boundary::seed`: a one-element tensor whose backward hands `grad` to `self`.
    pub fn seed(&self, grad: Sym) -> Sym {
        let op = Op::Seed(self.clone(), std::cell::RefCell::new(Some(grad)));
        Sym::fresh(self.ledger(), &[], self.0.dtype, Some(op))
    }

    /// `Var::from_tensor`: the same tensor if it is a variable, else a copy made a variable.
    pub fn var_from(&self) -> Sym {
        if self.0.is_variable {
            return self.clone();
        }
        Sym::fresh_var(self.ledger(), self.dims(), self.0.dtype, None, true)
    }

    // ---- element-wise ----------------------------------------------------------------------

    fn binary(&self, rhs: &Sym, f: fn(Sym, Sym) -> Op) -> Sym {
        assert_eq!(self.dims(), rhs.dims(), "binary op shapes");
        let op = self.op2(rhs, f);
        self.out(self.dims(), self.0.dtype, op)
    }

    pub fn add(&self, rhs: &Sym) -> Sym {
        self.binary(rhs, Op::Add)
    }
    pub fn sub(&self, rhs: &Sym) -> Sym {
        self.binary(rhs, Op::Sub)
    }
    pub fn mul(&self, rhs: &Sym) -> Sym {
        self.binary(rhs, Op::Mul)
    }
    pub fn div(&self, rhs: &Sym) -> Sym {
        self.binary(rhs, Op::Div)
    }

    fn broadcast_binary(&self, rhs: &Sym, f: fn(&Sym, &Sym) -> Sym) -> Sym {
        let shape = broadcast_shape(self.dims(), rhs.dims());
        match (shape != self.dims(), shape != rhs.dims()) {
            (true, true) => f(&self.broadcast_as(&shape), &rhs.broadcast_as(&shape)),
            (false, true) => f(self, &rhs.broadcast_as(&shape)),
            (true, false) => f(&self.broadcast_as(&shape), rhs),
            (false, false) => f(self, rhs),
        }
    }

    pub fn broadcast_add(&self, rhs: &Sym) -> Sym {
        self.broadcast_binary(rhs, Sym::add)
    }
    pub fn broadcast_sub(&self, rhs: &Sym) -> Sym {
        self.broadcast_binary(rhs, Sym::sub)
    }
    pub fn broadcast_mul(&self, rhs: &Sym) -> Sym {
        self.broadcast_binary(rhs, Sym::mul)
    }
    pub fn broadcast_div(&self, rhs: &Sym) -> Sym {
        self.broadcast_binary(rhs, Sym::div)
    }

    fn unary(&self, f: fn(Sym) -> Op) -> Sym {
        let op = self.op1(f);
        self.out(self.dims(), self.0.dtype, op)
    }

    /// `x * mul + add` (also candle's `tensor * f64`, `f64 - tensor`, `tensor + f64`).
    pub fn affine(&self, mul: f64) -> Sym {
        let op = self.op1(|a| Op::Affine(a, mul));
        self.out(self.dims(), self.0.dtype, op)
    }
    pub fn exp(&self) -> Sym {
        self.unary(Op::Exp)
    }
    pub fn log(&self) -> Sym {
        self.unary(Op::Log)
    }
    pub fn sqr(&self) -> Sym {
        self.unary(Op::Sqr)
    }
    pub fn sqrt(&self) -> Sym {
        self.unary(Op::Sqrt)
    }
    pub fn tanh(&self) -> Sym {
        self.unary(Op::Tanh)
    }
    pub fn gelu(&self) -> Sym {
        self.unary(Op::Gelu)
    }
    pub fn silu(&self) -> Sym {
        self.unary(Op::Silu)
    }
    pub fn neg(&self) -> Sym {
        self.unary(Op::Neg)
    }
    pub fn recip(&self) -> Sym {
        self.unary(Op::Recip)
    }
    pub fn powf(&self, e: f64) -> Sym {
        let op = self.op1(|a| Op::Powf(a, e));
        self.out(self.dims(), self.0.dtype, op)
    }

    /// `eq`: a `u8` mask.
    pub fn eq(&self, rhs: &Sym) -> Sym {
        assert_eq!(self.dims(), rhs.dims(), "cmp shapes");
        let op = self.op1(Op::Cmp);
        self.out(self.dims(), DType::U8, op)
    }

    /// `to_dtype`: the same tensor when the type does not change, else a converted copy.
    pub fn to_dtype(&self, dtype: DType) -> Sym {
        if dtype == self.0.dtype {
            return self.clone();
        }
        let op = self.op1(Op::ToDType);
        self.out(self.dims(), dtype, op)
    }

    // ---- matmul and reductions -------------------------------------------------------------

    pub fn matmul(&self, rhs: &Sym) -> Sym {
        let (a, b) = (self.dims(), rhs.dims());
        let n = a.len();
        assert!(
            n >= 2 && b.len() == n && a[n - 1] == b[n - 2],
            "matmul {a:?} {b:?}"
        );
        let mut dims = a[..n - 2].to_vec();
        dims.extend([a[n - 2], b[n - 1]]);
        let op = self.op2(rhs, Op::Matmul);
        // candle allocates the output, then gemm its packing buffer for the call.
        let out = self.out(&dims, self.0.dtype, op);
        self.ledger()
            .gemm_pack(&self.0.layout, &rhs.0.layout, self.0.dtype);
        out
    }

    pub fn sum_keepdim(&self, sum_dims: &[usize]) -> Sym {
        let mut dims = self.dims().to_vec();
        for &d in sum_dims {
            dims[d] = 1;
        }
        let op = self.op1(|a| Op::Sum(a, dims.clone()));
        self.out(&dims, self.0.dtype, op)
    }

    /// `sum` without keepdim (`sum_all` is `sum` over every dimension).
    pub fn sum(&self, sum_dims: &[usize]) -> Sym {
        self.sum_keepdim(sum_dims).squeeze_dims(sum_dims)
    }

    pub fn sum_all(&self) -> Sym {
        let all: Vec<usize> = (0..self.dims().len()).collect();
        self.sum(&all)
    }

    pub fn max_keepdim(&self, dim: usize) -> Sym {
        let mut dims = self.dims().to_vec();
        dims[dim] = 1;
        let op = self.op1(|a| Op::Max(a, dims.clone()));
        self.out(&dims, self.0.dtype, op)
    }

    /// `q.apply_op3(k, v, EfficientAttention)` for q `(B, A, S, D)`: an output `(B, S, A, D)`
    /// (heads last).
    pub fn efficient_attention(&self, k: &Sym, v: &Sym) -> Sym {
        let op = (self.track_op() || k.track_op() || v.track_op())
            .then(|| Op::Attn(self.clone(), k.clone(), v.clone()));
        let d = self.dims();
        self.out(&[d[0], d[2], d[1], d[3]], self.0.dtype, op)
    }

    /// `x.apply_op1(FrozenLinear)` for `x (r, in)` with the weight `w` held as `held` (dense
    /// `(out, in)`, or the quantized bytes): see `model::frozen` for the allocations.
    pub fn frozen_linear(&self, w: &Sym, held: FrozenW, out: usize, bias: Option<&Sym>) -> Sym {
        let (rows, inp) = (self.dims()[0], self.dims()[1]);
        let l = self.ledger().clone();
        let x = Sym::new(&l, &[rows, inp], self.0.dtype);
        let wd = frozen_dense(&l, w, held, out, inp, self.0.dtype);
        let y = x.matmul(&wd.t());
        drop((x, wd));
        let y = match bias {
            Some(b) => {
                let z = y.broadcast_add(b);
                drop(y);
                z
            }
            None => y,
        };
        let dense = (held == FrozenW::Dense).then(|| w.clone());
        let op = self.op1(|a| Op::Frozen(a, dense, held, out));
        let res = self.out(&[rows, out], self.0.dtype, op);
        drop(y);
        res
    }

    /// A fused kernel's output (`model::kernels`): one fresh `dims` tensor of `dtype`, recorded
    /// when any arg is tracked.
    pub fn kernel(kernel: Kernel, args: &[&Sym], dims: &[usize], dtype: DType) -> Sym {
        let op = args
            .iter()
            .any(|a| a.track_op())
            .then(|| Op::Kernel(kernel, args.iter().map(|&a| a.clone()).collect()));
        args[0].out(dims, dtype, op)
    }

    /// `model::kernels::attn_probs`: the `q·kᵀ` gemm writes the output (and packs in its
    /// scratch; q read per key head as `(B, G, r·Sq, D)`), then the softmax runs in place.
    pub fn attn_probs(&self, k: &Sym, scale: f32, causal: bool) -> Sym {
        let d = self.dims();
        let kd = k.dims();
        let dims = [d[0], kd[1], d[1] / kd[1] * d[2], kd[2]];
        let kernel = Kernel::AttnProbs {
            scale,
            causal,
            window: 0,
        };
        let out = Sym::kernel(kernel, &[self, k], &dims, self.0.dtype);
        let lq = Layout::contiguous(&[d[0], kd[1], d[1] / kd[1] * d[2], d[3]]);
        self.ledger()
            .gemm_pack(&lq, &k.0.layout.transposed(2, 3), self.0.dtype);
        out
    }

    /// `model::kernels::linear_scaled`: `(self (n, in)·wᵀ) ⊙ s`, then scaled in place.
    pub fn fused_linear_scaled(&self, w: &Sym, s: &Sym) -> Sym {
        self.fused_product(Kernel::LinearScaled, w, &[s])
    }

    /// `model::kernels::linear_no_bias`: `self (…, in)·wᵀ`.
    pub fn fused_linear_no_bias(&self, w: &Sym) -> Sym {
        self.fused_product(Kernel::LinearNoBias, w, &[])
    }

    /// `model::kernels::linear_add`: `x + self (…, in)·wᵀ`, x added in place.
    pub fn fused_linear_add(&self, w: &Sym, x: &Sym) -> Sym {
        self.fused_product(Kernel::LinearAdd, w, &[x])
    }

    /// `model::kernels::linear`: `self (…, in)·wᵀ + b` (as candle's `Linear` on `(rows, in)`),
    /// the bias added in place.
    pub fn fused_linear(&self, w: &Sym, b: &Sym) -> Sym {
        self.fused_product(Kernel::Linear, w, &[b])
    }

    /// The projection ops of `model::kernels::linear`: `self (…, in)·wᵀ` written by one gemm
    /// call on `(rows, in)` into the output (args self, w, then `rest`), finished in place.
    pub(super) fn fused_product(&self, kernel: Kernel, w: &Sym, rest: &[&Sym]) -> Sym {
        let mut dims = self.dims().to_vec();
        let inp = *dims.last().expect("a dimension");
        let rows = dims.iter().product::<usize>() / inp.max(1);
        *dims.last_mut().expect("a dimension") = w.dims()[0];
        let mut args = vec![self, w];
        args.extend_from_slice(rest);
        let y = Sym::kernel(kernel, &args, &dims, self.0.dtype);
        let la = Layout::contiguous(&[rows, inp]);
        self.ledger()
            .gemm_pack(&la, &w.0.layout.transposed(0, 1), self.0.dtype);
        y
    }

    /// `argmax` over the last dimension: a fresh `u32` tensor without it (never tracked).
    pub fn argmax_last(&self) -> Sym {
        let dims = &self.dims()[..self.dims().len() - 1];
        self.out(dims, DType::U32, None)
    }

    pub fn gather(&self, indexes: &Sym, dim: usize) -> Sym {
        let op = self.op2(indexes, |a, i| Op::Gather(a, i, dim));
        self.out(indexes.dims(), self.0.dtype, op)
    }

    pub fn index_select(&self, indexes: &Sym, dim: usize) -> Sym {
        let mut dims = self.dims().to_vec();
        dims[dim] = indexes.dims()[0];
        let op = self.op2(indexes, |a, i| Op::IndexSelect(a, i, dim));
        self.out(&dims, self.0.dtype, op)
    }

    /// `index_add` and `scatter_add`: a copy of `self` updated in place (the backward uses them
    /// only on untracked gradients, so no op is recorded).
    fn updated_copy(&self) -> Sym {
        self.out(self.dims(), self.0.dtype, None)
    }

    pub fn index_add(&self, _indexes: &Sym, _src: &Sym) -> Sym {
        self.updated_copy()
    }

    /// `index_add` along `dim` in a forward: a fresh copy of `self` with `src` added at the
    /// rows `indexes`, recorded when `self` or `src` is tracked.
    pub fn index_add_tracked(&self, indexes: &Sym, src: &Sym, dim: usize) -> Sym {
        let op = (self.track_op() || src.track_op())
            .then(|| Op::IndexAdd(self.clone(), indexes.clone(), src.clone(), dim));
        self.out(self.dims(), self.0.dtype, op)
    }

    pub fn scatter_add(&self, _indexes: &Sym, _src: &Sym) -> Sym {
        self.updated_copy()
    }

    /// `Tensor::cat` of same-rank tensors along `dim`: one fresh output (candle's
    /// `cat_contiguous` or `cat0`; callers make the parts contiguous, as the model does).
    pub fn cat(parts: &[&Sym], dim: usize) -> Sym {
        // candle returns the one part itself (no copy, no op).
        if let [only] = parts {
            return (*only).clone();
        }
        let mut dims = parts[0].dims().to_vec();
        dims[dim] = parts.iter().map(|p| p.dims()[dim]).sum();
        let op = parts
            .iter()
            .any(|p| p.track_op())
            .then(|| Op::Cat(parts.iter().map(|&p| p.clone()).collect(), dim));
        parts[0].out(&dims, parts[0].0.dtype, op)
    }

    // ---- views -----------------------------------------------------------------------------

    pub fn broadcast_as(&self, shape: &[usize]) -> Sym {
        let added = shape.len() - self.dims().len();
        let mut strides = vec![0; added];
        for (&dst, (&src, &st)) in shape[added..]
            .iter()
            .zip(self.dims().iter().zip(&self.0.layout.strides))
        {
            strides.push(if dst == src { st } else { 0 });
        }
        let layout = Layout {
            dims: shape.to_vec(),
            strides,
        };
        let op = self.op1(Op::Broadcast);
        self.view_with(layout, op, false)
    }

    pub fn broadcast_left(&self, left: &[usize]) -> Sym {
        let mut dims = left.to_vec();
        dims.extend(self.dims());
        self.broadcast_as(&dims)
    }

    pub fn transpose(&self, d1: usize, d2: usize) -> Sym {
        if d1 == d2 {
            return self.clone();
        }
        let layout = self.0.layout.transposed(d1, d2);
        let op = self.op1(|a| Op::Transpose(a, d1, d2));
        self.view_with(layout, op, false)
    }

    /// `permute`: a view with the dimensions reordered as `order` says.
    pub fn permute(&self, order: &[usize]) -> Sym {
        let l = &self.0.layout;
        let layout = Layout {
            dims: order.iter().map(|&i| l.dims[i]).collect(),
            strides: order.iter().map(|&i| l.strides[i]).collect(),
        };
        let op = self.op1(|a| Op::Permute(a, order.to_vec()));
        self.view_with(layout, op, false)
    }

    pub fn t(&self) -> Sym {
        let n = self.dims().len();
        self.transpose(n - 2, n - 1)
    }

    /// A view when contiguous, else a copy; either way the op is `Reshape`.
    pub fn reshape(&self, dims: &[usize]) -> Sym {
        let elems: u64 = dims.iter().map(|&d| d as u64).product();
        assert_eq!(
            elems,
            self.0.layout.elems(),
            "reshape {:?} → {dims:?}",
            self.dims()
        );
        let op = self.op1(Op::Reshape);
        if self.is_contiguous() {
            self.view_with(Layout::contiguous(dims), op, false)
        } else {
            self.out(dims, self.0.dtype, op)
        }
    }

    pub fn flatten_all(&self) -> Sym {
        if self.dims().len() <= 1 {
            return self.clone();
        }
        let n: usize = self.dims().iter().product();
        self.reshape(&[n])
    }

    /// Tensor parallelism's `f` forward: a fresh copy, recorded when this one is tracked.
    pub fn tp_enter_op(&self) -> Sym {
        let op = self.op1(Op::TpEnter);
        self.out(self.dims(), self.0.dtype, op)
    }

    /// Tensor parallelism's `g` forward: the sum over the group in a fresh tensor, recorded
    /// when this one is tracked.
    pub fn tp_reduce_op(&self) -> Sym {
        let op = self.op1(Op::TpReduce);
        self.out(self.dims(), self.0.dtype, op)
    }

    /// Sequence parallelism's all-gather forward over `tp` ranks ([`Op::SpGather`]; recorded
    /// when tracked): [`Sym::sp_resized`] to `tp` times the rows.
    pub fn sp_gather_op(&self, tp: usize) -> Sym {
        let op = self.op1(|a| Op::SpGather(a, tp));
        self.sp_resized(tp, true, op)
    }

    /// Sequence parallelism's reduce-scatter forward over `tp` ranks ([`Op::SpScatter`]):
    /// [`Sym::sp_resized`] to a `tp`-th of the rows.
    pub fn sp_scatter_op(&self, tp: usize) -> Sym {
        let op = self.op1(|a| Op::SpScatter(a, tp));
        self.sp_resized(tp, false, op)
    }

    /// `ranks::tensor`'s sequence collectives on a `(B, S, H)`: the fresh output with dim 1
    /// `tp` times longer (`gather`) or shorter, and with `B > 1` the host vector the rows are
    /// reordered through first (the ranks' blocks are runs of dim 1 in each row; MPI's buffers
    /// are whole runs): `tp·B·s·H` floats for the gather (held beside the output), `B·S·H` for
    /// the scatter (made before the output).
    pub fn sp_resized(&self, tp: usize, gather: bool, op: Option<Op>) -> Sym {
        let mut dims = self.dims().to_vec();
        dims[1] = if gather { dims[1] * tp } else { dims[1] / tp };
        let ledger = self.ledger();
        let bytes = self.0.dtype.size() as usize;
        let whole = bytes
            * dims
                .iter()
                .product::<usize>()
                .max(self.0.layout.elems() as usize);
        let reorder = (dims[0] > 1).then(|| ledger.host(whole));
        let out = self.out(&dims, self.0.dtype, op);
        drop(reorder);
        out
    }

    pub fn contiguous(&self) -> Sym {
        if self.is_contiguous() {
            self.clone()
        } else {
            let op = self.op1(Op::Copy);
            self.out(self.dims(), self.0.dtype, op)
        }
    }

    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Sym {
        if start == 0 && self.dims()[dim] == len {
            return self.clone();
        }
        let mut layout = self.0.layout.clone();
        layout.dims[dim] = len;
        let op = self.op1(|a| Op::Narrow(a, dim, start, len));
        self.view_with(layout, op, false)
    }

    pub fn squeeze(&self, dim: usize) -> Sym {
        if self.dims()[dim] != 1 {
            return self.clone();
        }
        let mut layout = self.0.layout.clone();
        layout.dims.remove(dim);
        layout.strides.remove(dim);
        let op = self.op1(Op::Reshape);
        self.view_with(layout, op, false)
    }

    fn squeeze_dims(self, dims: &[usize]) -> Sym {
        match dims {
            [] => self,
            [i] => self.squeeze(*i),
            dims => {
                let kept: Vec<usize> = self
                    .dims()
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| !dims.contains(i))
                    .map(|(_, &d)| d)
                    .collect();
                self.reshape(&kept)
            }
        }
    }

    pub fn unsqueeze(&self, dim: usize) -> Sym {
        let mut layout = self.0.layout.clone();
        let stride = layout.strides.get(dim).copied().unwrap_or(1);
        layout.dims.insert(dim, 1);
        layout.strides.insert(dim, stride);
        let op = self.op1(Op::Reshape);
        self.view_with(layout, op, false)
    }

    // ---- backprop --------------------------------------------------------------------------

    /// candle's `sorted_nodes`: a post-order DFS (lhs before rhs), reversed.
    pub fn sorted_nodes(&self) -> Vec<Sym> {
        fn walk(node: &Sym, nodes: &mut Vec<Sym>, seen: &mut HashMap<u64, bool>) -> bool {
            if let Some(&tg) = seen.get(&node.id()) {
                return tg;
            }
            let mut track = false;
            if node.is_variable() {
                track = true;
            } else if node.dtype().is_int() {
            } else if let Some(op) = node.op() {
                for child in op.walked_inputs() {
                    track |= walk(child, nodes, seen);
                }
            }
            seen.insert(node.id(), track);
            if track {
                nodes.push(node.clone());
            }
            track
        }
        let mut nodes = Vec::new();
        walk(self, &mut nodes, &mut HashMap::new());
        nodes.reverse();
        nodes
    }
}

impl Op {
    /// The inputs `sorted_nodes` walks into, in its order.
    fn walked_inputs(&self) -> Vec<&Sym> {
        match self {
            Op::Add(a, b)
            | Op::Sub(a, b)
            | Op::Mul(a, b)
            | Op::Div(a, b)
            | Op::Matmul(a, b)
            | Op::Gather(a, b, _)
            | Op::IndexSelect(a, b, _) => vec![a, b],
            Op::Attn(q, k, v) | Op::IndexAdd(q, k, v, _) => vec![q, k, v],
            Op::Cat(parts, _) | Op::Kernel(_, parts) => parts.iter().collect(),
            Op::Frozen(x, ..)
            | Op::Seed(x, _)
            | Op::TpEnter(x)
            | Op::TpReduce(x)
            | Op::SpGather(x, _)
            | Op::SpScatter(x, _) => vec![x],
            Op::ToDType(a) => {
                if a.dtype().is_int() {
                    vec![]
                } else {
                    vec![a]
                }
            }
            Op::Affine(a, _)
            | Op::Broadcast(a)
            | Op::Reshape(a)
            | Op::Transpose(a, _, _)
            | Op::Permute(a, _)
            | Op::Copy(a)
            | Op::Narrow(a, _, _, _)
            | Op::Sum(a, _)
            | Op::Max(a, _)
            | Op::Cmp(a)
            | Op::Exp(a)
            | Op::Log(a)
            | Op::Sqr(a)
            | Op::Sqrt(a)
            | Op::Tanh(a)
            | Op::Gelu(a)
            | Op::Silu(a)
            | Op::Neg(a)
            | Op::Recip(a)
            | Op::Powf(a, _) => vec![a],
        }
    }
}

/// The packing buffer of one of the `gemm` calls candle makes for `self · rhs` (one call per
/// batch element, or one for all when `rhs` is shared by the batch).
fn gemm_scratch(la: &Layout, ra: &Layout, dtype: DType, threads: usize) -> u64 {
    let r = la.dims.len();
    let (m, k, n) = (la.dims[r - 2], la.dims[r - 1], ra.dims[r - 1]);
    let skip = |l: &Layout, whole: usize| -> Option<usize> {
        match (&l.strides[..r - 2], &l.dims[..r - 2]) {
            ([], _) => Some(whole),
            ([st], _) => Some(*st),
            ([s1, st], [_, d1]) if *s1 == st * d1 => Some(*st),
            ([_, st], [d0, _]) if *d0 == 1 => Some(*st),
            ([st, _], [_, d1]) if *d1 == 1 => Some(*st),
            _ => None,
        }
    };
    let batch: usize = la.dims[..r - 2].iter().product();
    let m = match (skip(la, m * k), skip(ra, n * k)) {
        (Some(a), Some(0)) if a == m * k => batch * m,
        _ => m,
    };
    let lhs = (la.strides[r - 1], la.strides[r - 2]);
    let rhs = (ra.strides[r - 1], ra.strides[r - 2]);
    match dtype {
        DType::Half => super::gemm::scratch_bytes_f16(m, n, k, lhs, rhs, threads),
        _ => super::gemm::scratch_bytes(m, n, k, lhs, rhs, threads),
    }
}

fn broadcast_shape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let da = if i + a.len() >= n {
                a[i + a.len() - n]
            } else {
                1
            };
            let db = if i + b.len() >= n {
                b[i + b.len() - n]
            } else {
                1
            };
            assert!(da == db || da == 1 || db == 1, "broadcast {a:?} {b:?}");
            da.max(db)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger() -> Rc<Ledger> {
        Ledger::new(0, None)
    }

    #[test]
    fn views_share_storage_and_the_last_holder_frees_it() {
        let l = ledger();
        let x = Sym::new(&l, &[2, 3, 4], DType::F32);
        assert_eq!(l.current(), 96);
        let t = x.transpose(1, 2);
        let r = x.reshape(&[6, 4]);
        let b = x.unsqueeze(0).broadcast_as(&[5, 2, 3, 4]);
        assert_eq!(l.current(), 96, "views allocate nothing");
        drop(x);
        drop((r, b));
        assert_eq!(l.current(), 96, "the transpose still holds the storage");
        // A non-contiguous reshape copies; contiguous() copies a transpose.
        let c = t.contiguous();
        let rr = t.reshape(&[24]);
        assert_eq!(l.current(), 3 * 96);
        drop((t, c, rr));
        assert_eq!(l.current(), 0);
    }

    #[test]
    fn tracked_ops_keep_their_inputs_alive() {
        let l = ledger();
        let w = Sym::var(&l, &[4], DType::F32);
        let tmp = w.exp(); // tracked: w is a variable
        let out = tmp.affine(2.0);
        drop(tmp);
        assert_eq!(l.current(), 3 * 16, "exp stays alive inside affine's op");
        drop(out);
        assert_eq!(l.current(), 16);
        let c = Sym::new(&l, &[4], DType::F32);
        let tmp = c.exp(); // untracked: nothing recorded
        let out = tmp.affine(2.0);
        drop(tmp);
        assert_eq!(l.current(), 3 * 16);
        drop(out);
    }

    /// `y = sum(w · x)` with a variable `w` and a constant `x` (4 floats each), worked by hand
    /// from candle's backward (bytes above the graph):
    /// ones (4) → the `Reshape` node gives `Sum` its gradient (4) → `Sum` gives `Mul` its
    /// gradient g (16). At `Mul`: g 16 + `g·x` 16 + w's zeros 16 + w's sum 16 (zeros freed)
    /// + `g·w` 16 (tracked: it records `w` and g) + x's zeros 16 + x's sum 16 = 96 at the peak.
    ///
    /// x's sum records its operands, so x's zeros, `g·w` and g outlive the loop: 80 B remain.
    #[test]
    fn backward_of_a_product_by_hand() {
        let l = ledger();
        let w = Sym::var(&l, &[4], DType::F32);
        let x = Sym::new(&l, &[4], DType::F32);
        let y = w.mul(&x).sum_all();
        let base = l.reset_peak();
        assert_eq!(base, 16 + 16 + 16 + 4);
        let grads = backward(&y);
        assert_eq!(l.peak() - base, 96);
        assert_eq!(l.current() - base, 80);
        assert!(grads.get(&w).is_some());
        assert!(
            grads.get(&x).is_some(),
            "candle keeps the constant's gradient"
        );
        assert_eq!(grads.len(), 2);
        drop(grads);
        assert_eq!(
            l.current(),
            base,
            "everything else belonged to the gradients"
        );
    }

    #[test]
    fn sorted_nodes_is_reverse_post_order() {
        let l = ledger();
        let w = Sym::var(&l, &[2], DType::F32);
        let a = w.exp();
        let b = a.log();
        let c = a.add(&b);
        let ids: Vec<u64> = c.sorted_nodes().iter().map(|n| n.id()).collect();
        assert_eq!(ids, vec![c.id(), b.id(), a.id(), w.id()]);
    }
}
