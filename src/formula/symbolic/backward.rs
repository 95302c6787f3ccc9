//! candle's backward on symbolic tensors: [`backward`] is candle-core 0.11.1's
//! `Tensor::backward` (`src/backprop.rs`) transcribed statement by statement for the ops the
//! models use, its gradients held in a [`GradStore`] as candle's are, so that Rust's drop order
//! reproduces candle's (see the parent module).

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use super::*;

/// candle's `GradStore`.
#[derive(Debug, Default)]
pub struct GradStore(HashMap<u64, Sym>);

impl GradStore {
    pub fn get(&self, t: &Sym) -> Option<&Sym> {
        self.0.get(&t.id())
    }
    pub fn remove(&mut self, t: &Sym) -> Option<Sym> {
        self.0.remove(&t.id())
    }
    pub fn get_id(&self, id: u64) -> Option<&Sym> {
        self.0.get(&id)
    }
    pub fn insert(&mut self, t: &Sym, g: Sym) -> Option<Sym> {
        self.0.insert(t.id(), g)
    }
    fn or_insert(&mut self, t: &Sym) -> &mut Sym {
        match self.0.entry(t.id()) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(t.zeros_like()),
        }
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

// `broadcast_back` of backprop.rs.
fn broadcast_back(arg: &Sym, node: &Sym, reduced_dims: &[usize]) -> Sym {
    if arg.dims().len() == node.dims().len() {
        node.broadcast_as(arg.dims())
    } else {
        node.reshape(reduced_dims).broadcast_as(arg.dims())
    }
}

/// candle 0.11.1's `Tensor::backward`, statement by statement (default: gradients detached).
pub fn backward(root: &Sym) -> GradStore {
    let sorted_nodes = root.sorted_nodes();
    let ledger = root.ledger().clone();
    let outer_tag = ledger.tag();
    let mut grads = GradStore::default();
    grads.insert(root, root.ones_like().contiguous());
    for node in sorted_nodes.iter() {
        if node.is_variable() {
            continue;
        }
        // What processing a node allocates is its part's (the replay's segments).
        ledger.set_tag(node.tag());
        // The removed gradient lives to the end of the iteration beside its detached copy.
        let grad_removed = grads
            .remove(node)
            .expect("internal error: gradient not populated");
        let grad = grad_removed.detach();
        let Some(op) = node.op() else { continue };
        // Op-less tensors made while differentiating this node (`zeros_like`, gradients built
        // from storage) are labelled by it in a trace.
        ledger.context.set(op.name());
        match op {
            Op::Add(lhs, rhs) => {
                let s = grads.or_insert(lhs);
                *s = s.add(&grad);
                let s = grads.or_insert(rhs);
                *s = s.add(&grad);
            }
            Op::Sub(lhs, rhs) => {
                let s = grads.or_insert(lhs);
                *s = s.add(&grad);
                let s = grads.or_insert(rhs);
                *s = s.sub(&grad);
            }
            Op::Mul(lhs, rhs) => {
                let lhs_grad = grad.mul(rhs);
                let s = grads.or_insert(lhs);
                *s = s.add(&lhs_grad);
                let rhs_grad = grad.mul(lhs);
                let s = grads.or_insert(rhs);
                *s = s.add(&rhs_grad);
            }
            Op::Div(lhs, rhs) => {
                let lhs_grad = grad.div(rhs);
                let s = grads.or_insert(lhs);
                *s = s.add(&lhs_grad);
                let rhs_grad = grad.mul(lhs).div(&rhs.sqr());
                let s = grads.or_insert(rhs);
                *s = s.sub(&rhs_grad);
            }
            Op::Matmul(lhs, rhs) => {
                let lhs_grad = grad.matmul(&rhs.t());
                let s = grads.or_insert(lhs);
                *s = s.add(&lhs_grad);
                let rhs_grad = lhs.t().matmul(&grad);
                let s = grads.or_insert(rhs);
                *s = s.add(&rhs_grad);
            }
            Op::Broadcast(arg) => {
                let (arg_dims, node_dims) = (arg.dims(), node.dims());
                let left_dims = node_dims.len() - arg_dims.len();
                let mut sum_dims: Vec<usize> = (0..left_dims).collect();
                for (dim, (nd, ad)) in node_dims[left_dims..].iter().zip(arg_dims).enumerate() {
                    if nd != ad {
                        sum_dims.push(dim + left_dims)
                    }
                }
                let mut arg_grad = grad.sum_keepdim(&sum_dims);
                for _ in 0..left_dims {
                    arg_grad = arg_grad.squeeze(0)
                }
                let s = grads.or_insert(arg);
                *s = s.add(&arg_grad.broadcast_as(s.dims()));
            }
            Op::Sum(arg, reduced_dims) => {
                let grad = broadcast_back(arg, &grad, reduced_dims);
                let s = grads.or_insert(arg);
                *s = s.add(&grad);
            }
            Op::Max(arg, reduced_dims) => {
                let node = broadcast_back(arg, node, reduced_dims);
                let grad = broadcast_back(arg, &grad, reduced_dims);
                let grad = node.eq(arg).to_dtype(grad.dtype()).mul(&grad);
                let s = grads.or_insert(arg);
                *s = s.add(&grad.broadcast_as(s.dims()));
            }
            Op::Gather(arg, indexes, _) => {
                let s = grads.or_insert(arg);
                *s = s.scatter_add(indexes, &grad);
            }
            Op::IndexSelect(arg, indexes, _) => {
                let s = grads.or_insert(arg);
                let indexes = indexes.contiguous();
                *s = s.index_add(&indexes, &grad);
            }
            Op::IndexAdd(init, indexes, src, dim) => {
                let s = grads.or_insert(init);
                *s = s.add(&grad);
                let src_grad = grad.index_select(indexes, *dim);
                let s = grads.or_insert(src);
                *s = s.add(&src_grad);
            }
            Op::Narrow(arg, dim, start, len) => {
                let (dim, start, len) = (*dim, *start, *len);
                let arg_dims = arg.dims();
                let left_pad = (start != 0).then(|| {
                    let mut dims = arg_dims.to_vec();
                    dims[dim] = start;
                    Sym::new(grad.ledger(), &dims, grad.dtype())
                });
                let right = arg_dims[dim] - start - len;
                let right_pad = (right != 0).then(|| {
                    let mut dims = arg_dims.to_vec();
                    dims[dim] = right;
                    Sym::new(grad.ledger(), &dims, grad.dtype())
                });
                let arg_grad = match (left_pad, right_pad) {
                    (None, None) => grad.clone(),
                    (Some(l), None) => Sym::cat(&[&l, &grad], dim),
                    (None, Some(r)) => Sym::cat(&[&grad, &r], dim),
                    (Some(l), Some(r)) => Sym::cat(&[&l, &grad, &r], dim),
                };
                let s = grads.or_insert(arg);
                *s = s.add(&arg_grad);
            }
            Op::Attn(q, k, v) => {
                // The op's backward returns three fresh gradients; each is added to its
                // operand's and dropped before the next (`if let Some(g) = …` in candle).
                let (g1, g2, g3) = (q.zeros_like(), k.zeros_like(), v.zeros_like());
                for (arg, g) in [(q, g1), (k, g2), (v, g3)] {
                    let s = grads.or_insert(arg);
                    *s = s.add(&g);
                    drop(g);
                }
            }
            Op::Frozen(arg, dense, held, out) => {
                // bwd: the dense weight (dequantized when quantized) and grad·W.
                let inp = arg.dims()[1];
                // A quantized weight is not read: only its size and how it is held matter.
                let wd = match dense {
                    Some(w) => w.clone(),
                    None => frozen_dense(grad.ledger(), arg, *held, *out, inp, grad.dtype()),
                };
                let arg_grad = grad.matmul(&wd);
                drop(wd);
                let s = grads.or_insert(arg);
                *s = s.add(&arg_grad);
            }
            Op::Kernel(kernel, args) => {
                // candle's `CustomOpN` arm: `bwd` returns every gradient, then each is added to
                // its arg's (constant args included) and dropped before the next.
                let refs: Vec<&Sym> = args.iter().collect();
                let gs = kernel
                    .backward(&refs, node, &grad)
                    .expect("symbolic backward");
                for (arg, g) in args.iter().zip(gs) {
                    if let Some(g) = g {
                        let s = grads.or_insert(arg);
                        *s = s.add(&g);
                        drop(g);
                    }
                }
            }
            Op::Seed(arg, g) => {
                // The seed's `bwd` takes the gradient; it dies after the sum.
                let taken = g.borrow_mut().take();
                if let Some(arg_grad) = taken {
                    let s = grads.or_insert(arg);
                    *s = s.add(&arg_grad);
                }
            }
            Op::Cmp(_) => {}
            Op::ToDType(arg) => {
                let s = grads.or_insert(arg);
                *s = s.add(&grad.to_dtype(arg.dtype()));
            }
            Op::Copy(arg) => {
                let s = grads.or_insert(arg);
                *s = s.add(&grad);
            }
            Op::TpEnter(arg) => {
                // `ranks::tensor::EnterOp::bwd`: the gradient made contiguous, all-reduced into
                // a fresh tensor (the contiguous copy dropped on return), then added to the
                // arg's as candle's `CustomOp1` arm does.
                let reduced = {
                    let c = grad.contiguous();
                    c.zeros_like()
                };
                let s = grads.or_insert(arg);
                *s = s.add(&reduced);
            }
            Op::TpReduce(arg) => {
                // `ReduceOp::bwd`: the gradient itself.
                let s = grads.or_insert(arg);
                *s = s.add(&grad);
            }
            Op::SpGather(arg, tp) | Op::SpScatter(arg, tp) => {
                // `ranks::tensor`'s sequence ops' `bwd`: the gradient made contiguous, then the
                // other collective into a fresh tensor (the copy dropped on return), added to
                // the arg's as candle's `CustomOp1` arm does.
                let gather = arg.dims()[1] > grad.dims()[1];
                let back = {
                    let c = grad.contiguous();
                    c.sp_resized(*tp, gather, None)
                };
                let s = grads.or_insert(arg);
                *s = s.add(&back);
            }
            Op::Affine(arg, mul) => {
                let arg_grad = grad.affine(*mul);
                let s = grads.or_insert(arg);
                *s = s.add(&arg_grad);
            }
            Op::Log(arg) => {
                let s = grads.or_insert(arg);
                *s = s.add(&grad.div(arg));
            }
            Op::Tanh(arg) => {
                let s = grads.or_insert(arg);
                let minus_dtanh = node.sqr().affine(1.0);
                *s = s.sub(&grad.mul(&minus_dtanh));
            }
            Op::Exp(arg) => {
                let s = grads.or_insert(arg);
                *s = s.add(&grad.mul(node));
            }
            Op::Reshape(arg) => {
                let arg_grad = grad.reshape(arg.dims());
                let s = grads.or_insert(arg);
                *s = s.add(&arg_grad);
            }
            Op::Gelu(arg) => {
                let s = grads.or_insert(arg);
                let cube = arg.powf(3.);
                let tanh = cube.affine(0.0356774).add(&arg.affine(0.797885)).tanh();
                let gelu_grad = tanh
                    .affine(0.5)
                    .add(
                        &cube
                            .affine(0.0535161)
                            .add(&arg.affine(0.398942))
                            .mul(&tanh.powf(2.).affine(-1.)),
                    )
                    .affine(1.0);
                *s = s.add(&grad.mul(&gelu_grad));
            }
            Op::Silu(arg) => {
                let s = grads.or_insert(arg);
                // d/dx silu = sigmoid(x) · (1 − node) + node; every temporary is recorded
                // (computed from tracked tensors), so it lives inside the gradient.
                let sigmoid_arg = arg.neg().exp().affine(1.0).recip();
                let silu_grad = sigmoid_arg.mul(&node.affine(-1.0)).add(node);
                *s = s.add(&grad.mul(&silu_grad));
            }
            Op::Neg(arg) => {
                let s = grads.or_insert(arg);
                *s = s.sub(&grad);
            }
            Op::Recip(arg) => {
                let s = grads.or_insert(arg);
                let arg_grad = grad.div(&arg.sqr());
                *s = s.sub(&arg_grad);
            }
            Op::Powf(arg, e) => {
                let arg_grad = grad.mul(&arg.powf(e - 1.)).affine(*e);
                let s = grads.or_insert(arg);
                *s = s.add(&arg_grad);
            }
            Op::Sqr(arg) => {
                let arg_grad = arg.mul(&grad).affine(2.);
                let s = grads.or_insert(arg);
                *s = s.add(&arg_grad);
            }
            Op::Sqrt(arg) => {
                let arg_grad = grad.div(node).affine(0.5);
                let s = grads.or_insert(arg);
                *s = s.add(&arg_grad);
            }
            Op::Transpose(arg, d1, d2) => {
                let arg_grad = grad.transpose(*d1, *d2);
                let s = grads.or_insert(arg);
                *s = s.add(&arg_grad);
            }
            Op::Permute(arg, order) => {
                let mut inverse = vec![0; order.len()];
                for (i, &d) in order.iter().enumerate() {
                    inverse[d] = i;
                }
                let arg_grad = grad.permute(&inverse);
                let s = grads.or_insert(arg);
                *s = s.add(&arg_grad);
            }
            Op::Cat(parts, dim) => {
                let mut start = 0;
                for part in parts {
                    let len = part.dims()[*dim];
                    let part_grad = grad.narrow(*dim, start, len);
                    let s = grads.or_insert(part);
                    *s = s.add(&part_grad);
                    start += len;
                }
            }
        }
    }
    ledger.set_tag(outer_tag);
    grads
}
