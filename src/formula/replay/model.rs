//! The model on symbolic tensors: the model's own ([`crate::model::transformer`], built and
//! run on [`Sym`]), its weights made by the replay's [`Params`] (the model's
//! [`Weights`] source: variables, frozen or quantized projections, the experts a compressed
//! replay holds, routed as it is told) and the replay's variables beside it.

use std::cell::RefCell;
use std::rc::Rc;

use super::*;
use crate::model::config::Config;
use crate::model::shapes::RopeScaling;
use crate::model::tensor_parallel::{CollectiveOps, Megatron, MegatronVocab};
use crate::model::weights::Weights;
use candle_nn::Init;

/// The whole model on symbolic tensors, its variables beside it ([`Kept`]).
pub type Transformer = crate::model::transformer::Transformer<Sym, moe::Told, Kept>;
/// The model's masks and cache of symbolic tensors.
pub type Masks = crate::model::transformer::Masks<Sym>;
pub type KvCache = crate::model::transformer::KvCache<Sym>;

/// What the replay keeps beside its model: the variables (training: what has a gradient; the
/// device is the ledger's).
#[derive(Debug, Clone)]
pub struct Kept {
    pub(super) vars: Vec<Sym>,
}

/// Creates the weights as the replay holds them: variables (training, each recorded) or plain
/// tensors (detached inference), the projections frozen or quantized as the case says
/// (`proj.rs`), the routed experts a compressed replay holds, routed as it is told.
#[derive(Clone, Copy)]
pub(super) struct Params<'a> {
    pub(super) ledger: &'a Rc<Ledger>,
    /// The variables made, in the order the model makes them.
    made: &'a RefCell<Vec<Sym>>,
    vars: bool,
    dtype: DType,
    /// LoRA: everything but the adapters is frozen.
    pub(super) lora: bool,
    /// How LoRA's projections are frozen.
    pub(super) base: LoraBase,
    /// The experts' (routed and shared) `lora` and `base` (with `mxfp4-experts` they alone
    /// are held quantized).
    experts_held: (bool, LoraBase),
    /// Fused kernels (`model::kernels`).
    pub(super) fused: bool,
    /// On the CPU (a quantized weight's dequantize holds scratch there; CUDA's kernel none).
    pub(super) cpu: bool,
    /// The routed experts held (indices among `E`), or all of them.
    held: Option<&'a [usize]>,
    /// Tokens per expert of each sparse layer as a row recorded them; without, the worst
    /// routing or balanced.
    routing: Option<&'a [Vec<usize>]>,
    worst: bool,
}

impl Params<'_> {
    pub(super) fn tensor(&self, dims: &[usize]) -> Sym {
        if self.lora {
            return self.frozen(dims);
        }
        self.adapter(dims)
    }

    /// A weight that never trains.
    pub(super) fn frozen(&self, dims: &[usize]) -> Sym {
        Sym::new(self.ledger, dims, self.dtype)
    }

    /// A LoRA adapter tensor: a variable when training.
    pub(super) fn adapter(&self, dims: &[usize]) -> Sym {
        if !self.vars {
            return self.frozen(dims);
        }
        let v = Sym::var(self.ledger, dims, self.dtype);
        self.made.borrow_mut().push(v.clone());
        v
    }
}

impl Weights for Params<'_> {
    type Tensor = Sym;
    type Routing = moe::Told;

    /// The same weights; the experts' held as `experts_held` says.
    fn pp(&self, name: &str) -> Self {
        match name {
            "experts" | "shared" => Params {
                lora: self.experts_held.0,
                base: self.experts_held.1,
                ..*self
            },
            _ => *self,
        }
    }

    fn weight(&self, dims: &[usize], _name: &str, _init: Init) -> candle_core::Result<Sym> {
        Ok(self.tensor(dims))
    }

    fn linear(&self, inp: usize, out: usize, bias: bool) -> candle_core::Result<Linear> {
        Ok(self.plain(inp, out, bias))
    }

    fn proj(&self, spec: &ProjSpec, cfg: &Config) -> candle_core::Result<Linear> {
        Ok(self.proj_of(spec, cfg.adapter_rank(spec.target)))
    }

    /// The tables' values change no allocation.
    fn rotary(
        &self,
        cfg: &Config,
        head_dim: usize,
        _theta: f64,
        _scaling: Option<&RopeScaling>,
    ) -> candle_core::Result<(Sym, Sym)> {
        let dims = [cfg.max_seq, head_dim / 2];
        Ok((self.frozen(&dims), self.frozen(&dims)))
    }

    fn experts(&self, n: usize) -> Vec<usize> {
        self.held
            .map_or_else(|| (0..n).collect(), <[usize]>::to_vec)
    }

    /// A recorded routing is per sparse layer, in layer order (a replay with one is never
    /// compressed: every layer is built).
    fn routing(&self, cfg: &Config, layer: usize, experts: &[usize]) -> moe::Told {
        let moe = cfg.llama.and_then(|l| l.moe).expect("a mixture of experts");
        let sparse = (0..layer).filter(|&i| moe.sparse(i)).count();
        moe::Told {
            expert_ids: experts.to_vec(),
            routing: self.routing.and_then(|r| r.get(sparse).cloned()),
            worst: self.worst,
            sparse,
        }
    }

    fn segment(&self, tag: u32) {
        self.ledger.set_tag(tag);
    }
}

impl Transformer {
    /// The model of `shape` on `ledger`, its weights variables when `vars` (else the case's
    /// serving weights), with the layers `slots` (real layer indices, in order, each with its
    /// tag): all of them ([`all_layers`]), or a compressed model ([`compress`]); a mixture of
    /// experts with the routed experts `experts` (indices among `E`), or all of them.
    pub(super) fn with_layers(
        ledger: &Rc<Ledger>,
        shape: &Shape,
        vars: bool,
        slots: &[Slot],
        experts: Option<&[usize]>,
    ) -> Self {
        // A serving copy (`vars` false) takes the case's serving weights: an f16 copy, or the
        // projections quantized behind the frozen-linear op.
        let serve = if vars {
            ServingWeights::Model
        } else {
            shape.serve
        };
        let dtype = if shape.elem == ElemType::F32 && serve != ServingWeights::F16 {
            DType::F32
        } else {
            DType::Half
        };
        // Under mixed precision the variables stay f32 (the working copy is made by `cast`).
        let dtype = if shape.mixed && vars {
            DType::F32
        } else {
            dtype
        };
        let (lora, base) = match serve.quantized() {
            Some(_) if serve.experts_only() => (false, shape.lora_base),
            Some(q) => (true, q),
            None => (shape.lora_rank > 0, shape.lora_base),
        };
        let made = RefCell::new(Vec::new());
        let p = Params {
            ledger,
            made: &made,
            vars,
            dtype,
            lora,
            base,
            experts_held: (
                lora || serve.experts_only(),
                serve.quantized().unwrap_or(base),
            ),
            fused: shape.kernels.fused(),
            cpu: shape.cpu,
            held: experts,
            routing: shape.routing.as_deref().map(Vec::as_slice),
            worst: shape.worst_routing,
        };
        let layers: Vec<(usize, u32)> = slots.iter().map(|s| (s.layer, s.tag)).collect();
        let own = Kept { vars: Vec::new() };
        let mut model = Transformer::build(&shape.config(), &p, &layers, own).sure();
        model.own.vars = made.into_inner();
        // Any length: a prediction is not refused at the position table's end.
        model.form.max_seq = None;
        ledger.cuda.set(!shape.cpu);
        // A tensor-parallel rank's shard: Megatron's collectives around its sublayers (under
        // sequence parallelism, over the vocabulary's ranks).
        let megatron = Megatron {
            f_all_reduce: true,
            g_all_reduce: true,
            release: shape.kernels.fused(),
            sequence: shape.sequence_parallel.then_some(shape.vocab_parallel),
        };
        if shape.tp_collectives {
            model = model.with_collectives(Rc::new(megatron));
        }
        // Its run of the vocabulary: Megatron's vocab-parallel embedding, head and loss.
        if shape.vocab_parallel > 1 {
            model = model.with_vocab_parallel(Rc::new(MegatronVocab {
                start: 0,
                tp: shape.vocab_parallel,
                megatron,
            }));
        }
        model
    }
}

/// Tensor parallelism's collectives on symbolic tensors: `f` a fresh copy whose backward
/// all-reduces into a fresh gradient, `g` a fresh output whose backward is the identity, as
/// the candle ops on ranks (`crate::ranks::tensor`); outside a graph `f` is the identity and
/// never reaches [`CollectiveOps::tp_enter`].
impl CollectiveOps for Sym {
    fn tp_enter(&self, _reduce: bool) -> candle_core::Result<Sym> {
        Ok(self.tp_enter_op())
    }

    fn tp_reduce(&self, _reduce: bool) -> candle_core::Result<Sym> {
        Ok(self.tp_reduce_op())
    }

    fn sp_gather(&self, tp: usize) -> candle_core::Result<Sym> {
        Ok(self.sp_gather_op(tp))
    }

    fn sp_scatter(&self, tp: usize) -> candle_core::Result<Sym> {
        Ok(self.sp_scatter_op(tp))
    }

    /// `ranks::tensor`'s: the gathered blocks on the host beside the fresh output, then freed
    /// (vLLM's all-gather: its `(N, …)` buffer and the moved copy).
    fn tp_gather_last(&self, tp: usize) -> candle_core::Result<Sym> {
        let ledger = self.ledger();
        let mut dims = self.dims().to_vec();
        let len: usize = dims.iter().product();
        // On a GPU the buffer is a device tensor (vLLM's `torch.empty`); on the ranks a host
        // vector.
        let blocks = match ledger.cuda.get() {
            true => (Some(Sym::new(ledger, &[tp * len], self.dtype())), None),
            false => (
                None,
                Some(ledger.host(self.dtype().size() as usize * tp * len)),
            ),
        };
        *dims.last_mut().expect("a last dimension") *= tp;
        let out = Sym::new(ledger, &dims, self.dtype());
        drop(blocks);
        Ok(out)
    }

    /// `ranks::tensor`'s: the rows' maxima and the group's, then the sums (in the first
    /// vector) and their reduction into the output's vector: three `N` f32 vectors on the host
    /// at once, the last kept as the `(N, 1)` tensor.
    fn tp_logsumexp(&self) -> candle_core::Result<Sym> {
        let n = self.dims()[0];
        let ledger = self.ledger();
        let (local, max) = (ledger.host(4 * n), ledger.host(4 * n));
        let lse = Sym::new(ledger, &[n, 1], DType::F32);
        drop((local, max));
        Ok(lse)
    }
}
