//! The by-block backward driver on symbolic tensors, the mirror of `phase::by_block` (each
//! block's graph freed once its gradients are taken); the checkpointed one is
//! `phase::checkpoint`'s own, run on the replay's tensors.

use super::*;

/// One layer of a (possibly compressed) model: its index in the full model and its tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Slot {
    pub(super) layer: usize,
    pub(super) tag: u32,
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
    crate::phase::checkpoint::keep::<Sym>(&mut grads, &mut all, &vars).sure();
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
        crate::phase::checkpoint::keep::<Sym>(&mut grads, &mut all, &vars).sure();
    }
    ledger.set_tag(0);
    grads
}
