//! The backward drivers on symbolic tensors, mirrors of `phase::checkpoint` (the checkpointed
//! forward and its segment-by-segment backward) and `phase::by_block` (each block's graph freed
//! once its gradients are taken).

use super::*;

/// One layer of a (possibly compressed) model: its index in the full model and its tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot {
    pub(super) layer: usize,
    pub(super) tag: u32,
}

/// What the checkpointed forward keeps (mirror of `phase::checkpoint::Forward`).
pub(super) struct CkptForward {
    pub(super) loss: Sym,
    pub(super) head_in: Sym,
    pub(super) inputs: Vec<Sym>,
    pub(super) mask: Masks,
    /// Mixed precision's working copy (mirror of `Forward::half`).
    pub(super) half: Option<Transformer>,
}

/// Mirror of `phase::checkpoint::forward`.
pub(super) fn ckpt_forward(
    model: &Transformer,
    detached: &Transformer,
    tokens: &Sym,
    targets: &Sym,
    k: usize,
    f32_loss: bool,
) -> CkptForward {
    let mask = model.input_mask(tokens).sure();
    let mut x = detached.embed(tokens).sure();
    let mut inputs = Vec::new();
    for seg in segments(model.blocks.len(), k) {
        inputs.push(x.clone());
        x = detached.blocks_forward(&x, &mask, seg).sure();
    }
    let head_in = x.var_from();
    drop(x);
    let logits = model.head_forward(&head_in).sure();
    let loss = if f32_loss {
        model
            .train_loss(&logits.to_dtype(DType::F32), targets)
            .sure()
    } else {
        model.train_loss(&logits, targets).sure()
    };
    drop(logits);
    CkptForward {
        loss,
        head_in,
        inputs,
        mask,
        half: None,
    }
}

/// Mirror of `checkpoint::keep`: a tied weight's two gradients summed.
pub(super) fn keep(into: &mut GradStore, from: &mut GradStore, vars: &[Sym]) {
    for v in vars {
        if let Some(g) = from.remove(v) {
            let g = match into.remove(v) {
                Some(prev) => {
                    let sum = prev.add(&g);
                    drop((prev, g));
                    sum
                }
                None => g,
            };
            into.insert(v, g);
        }
    }
}

/// Mirror of `phase::checkpoint::backward`.
pub(super) fn ckpt_backward(
    model: &Transformer,
    fwd: CkptForward,
    tokens: &Sym,
    k: usize,
) -> GradStore {
    let CkptForward {
        loss,
        head_in,
        mut inputs,
        mask,
        half,
    } = fwd;
    let vars = model.own.vars.clone();
    let model = half.as_ref().unwrap_or(model);
    let mut grads = GradStore::default();
    let mut all = backward(&loss);
    let mut grad_out = all.remove(&head_in).expect("head input gradient");
    keep(&mut grads, &mut all, &vars);
    drop((all, loss, head_in));
    let ledger = tokens.ledger().clone();
    for seg in segments(model.blocks.len(), k).into_iter().rev() {
        // The segment's work is its first block's part.
        ledger.set_tag(model.blocks[seg.start].tag);
        let xin = inputs.pop().expect("one input per segment").var_from();
        let out = model.blocks_forward(&xin, &mask, seg).sure();
        let mut all = backward(&out.mul(&grad_out).sum_all());
        drop(out);
        grad_out = all.remove(&xin).expect("segment input gradient");
        keep(&mut grads, &mut all, &vars);
    }
    ledger.set_tag(0);
    let x0 = model.embed(tokens).sure();
    let mut all = backward(&x0.mul(&grad_out).sum_all());
    keep(&mut grads, &mut all, &vars);
    grads
}

/// A boundary of the by-block forward (mirror of `by_block::Boundary`).
pub(super) struct Boundary {
    pub(super) made: Sym,
    pub(super) var: u64,
}

/// Mirror of `by_block::boundary`.
pub(super) fn boundary(x: Sym, cuda: bool) -> (Sym, Option<Boundary>) {
    if !x.track_op() {
        return (x, None);
    }
    let var = x.cut(cuda);
    let id = var.id();
    (var, Some(Boundary { made: x, var: id }))
}

/// What the by-block forward keeps (mirror of `by_block::Forward`).
pub(super) struct ByBlockForward {
    pub(super) loss: Sym,
    pub(super) cuts: Vec<Option<Boundary>>,
}

/// Mirror of `by_block::forward` (`half`: mixed precision's 16-bit type).
pub(super) fn by_block_forward(
    model: &Transformer,
    half: Option<DType>,
    tokens: &Sym,
    targets: &Sym,
) -> ByBlockForward {
    let copy = half.map(|d| model.cast(d));
    let run = copy.as_ref().unwrap_or(model);
    let masks = run.input_mask(tokens).sure();
    let mut x = run.embed(tokens).sure();
    let layers = run.blocks.len();
    let mut cuts = Vec::with_capacity(layers + 1);
    // A boundary is cut as the part that made it (the embedding's under tag 0, a block's
    // under its tag), so that each layer's work stays its own ([`compress`]).
    let ledger = tokens.ledger().clone();
    for i in 0..layers {
        ledger.set_tag(if i == 0 { 0 } else { run.blocks[i - 1].tag });
        let (input, cut) = boundary(x, model.own.cuda);
        ledger.set_tag(0);
        cuts.push(cut);
        x = run.blocks_forward(&input, &masks, i..i + 1).sure();
    }
    ledger.set_tag(run.blocks.last().map_or(0, |b| b.tag));
    let (input, cut) = boundary(x, model.own.cuda);
    ledger.set_tag(0);
    cuts.push(cut);
    let logits = run.head_forward(&input).sure();
    drop(input);
    let loss = match half {
        Some(_) => model
            .train_loss(&logits.to_dtype(DType::F32), targets)
            .sure(),
        None => model.train_loss(&logits, targets).sure(),
    };
    drop(logits);
    drop(masks);
    drop(copy);
    ByBlockForward { loss, cuts }
}

/// Mirror of `by_block::take_cut`.
pub(super) fn take_cut(all: &GradStore, below: Option<&Option<Boundary>>) -> Option<Sym> {
    match below {
        Some(Some(b)) => Some(all.get_id(b.var).expect("boundary gradient").clone()),
        _ => None,
    }
}

/// Mirror of `by_block::backward`; `tags`: each boundary's part (the embedding's 0, then the
/// blocks'), under which its seed and backward allocate.
pub(super) fn by_block_backward(model: &Transformer, fwd: ByBlockForward) -> GradStore {
    let ByBlockForward { loss, mut cuts } = fwd;
    let vars = model.own.vars.clone();
    let ledger = loss.ledger().clone();
    let mut grads = GradStore::default();
    let mut all = backward(&loss);
    drop(loss);
    let mut upstream = take_cut(&all, cuts.last());
    keep(&mut grads, &mut all, &vars);
    drop(all);
    while let Some(Some(b)) = cuts.pop() {
        // Boundary i is block i's input: the part below it is block i − 1 (or the embedding).
        let part = cuts.len();
        ledger.set_tag(if part == 0 {
            0
        } else {
            model.blocks[part - 1].tag
        });
        let g = upstream
            .take()
            .expect("a gradient for every tracked boundary");
        let root = b.made.seed(g);
        drop(b);
        let mut all = backward(&root);
        drop(root);
        upstream = take_cut(&all, cuts.last());
        keep(&mut grads, &mut all, &vars);
    }
    ledger.set_tag(0);
    grads
}
