//! Where a model's weights come from, so that each layer's construction is written once
//! (`build`, beside its forward): candle-nn's `VarBuilder` (variables made and initialised in a
//! `VarMap`, or read from a checkpoint) or the replay's parameters (symbolic weights on its
//! ledger, frozen or quantized as the case holds them). A layer asks for its weights by the
//! names candle-nn gives them (`vb.pp`), in the order the model creates them; what differs
//! between the two is only how a weight, a projection and the rotary tables are made, which
//! experts are built, and how the experts are routed. candle's source (`VarBuilder`) is
//! implemented beside the model's assembly (`super::transformer`), the replay's in
//! `formula::replay`.

use candle_core::Result;
use candle_nn::Init;

use super::config::{Config, ProjSpec};
use super::proj::Proj;
use super::shapes::RopeScaling;
use super::tensor_ops::TensorOps;

/// A source of weights for one interpreter's tensors.
pub trait Weights: Sized {
    type Tensor: TensorOps;
    /// How a mixture of experts built from here routes its tokens.
    type Routing;
    /// The weights under `name` (candle-nn's `pp`).
    fn pp(&self, name: &str) -> Self;
    /// A weight `dims` named `name`, made with `init` (a variable while training).
    fn weight(&self, dims: &[usize], name: &str, init: Init) -> Result<Self::Tensor>;
    /// candle-nn's `Linear` `inp → out` here (weight `(out, in)`, a bias when `bias`), without
    /// an adapter and not fused: the patch projection, the head, the routers, the shared gate.
    fn linear(&self, inp: usize, out: usize, bias: bool) -> Result<Proj<Self::Tensor>>;
    /// A block's projection `spec`, with its LoRA adapter when `cfg` adapts it.
    fn proj(&self, spec: &ProjSpec, cfg: &Config) -> Result<Proj<Self::Tensor>>;
    /// The rotary tables cos and sin `(S_max, D/2)` for heads of `head_dim` (buffers, never
    /// variables, in the weights' type).
    fn rotary(
        &self,
        cfg: &Config,
        head_dim: usize,
        theta: f64,
        scaling: Option<&RopeScaling>,
    ) -> Result<(Self::Tensor, Self::Tensor)>;
    /// The routed experts a mixture of `n` holds (their indices): all of them, or a compressed
    /// replay's few.
    fn experts(&self, n: usize) -> Vec<usize> {
        (0..n).collect()
    }
    /// The routing of block `layer`'s mixture, holding the experts `experts`.
    fn routing(&self, cfg: &Config, layer: usize, experts: &[usize]) -> Self::Routing;
    /// The weights made next are block `tag`'s (0: outside the blocks); the replay's ledger
    /// segments (`formula::replay::compress`).
    fn segment(&self, _tag: u32) {}
}

/// A pipeline stage's weights (`memfit ranks --pp`): `W`'s, except the parts another stage
/// holds, made with no elements (Megatron's layout, `formula::parallel`'s `stage_shares`): the
/// token table only on the first stage and, when the head is tied to it, on the last (its own
/// copy); GPT's position table only on the first; the final norm and an untied head only on
/// the last. The blocks a stage builds are the ones its caller lists
/// ([`super::transformer::Transformer::build`]).
#[derive(Clone)]
pub struct StageWeights<W> {
    inner: W,
    first: bool,
    last: bool,
    tied: bool,
    /// Directly under the model's root (where the table, the final norm and the head are).
    root: bool,
    /// Under a part this stage does not hold.
    dropped: bool,
}

impl<W: Weights> StageWeights<W> {
    pub fn new(inner: W, first: bool, last: bool, tied: bool) -> Self {
        StageWeights {
            inner,
            first,
            last,
            tied,
            root: true,
            dropped: false,
        }
    }

    /// `dims` with no elements where this stage does not hold the weight.
    fn dims(&self, dims: &[usize], dropped: bool) -> Vec<usize> {
        let mut d = dims.to_vec();
        if dropped && let Some(x) = d.first_mut() {
            *x = 0;
        }
        d
    }
}

impl<W: Weights> Weights for StageWeights<W> {
    type Tensor = W::Tensor;
    type Routing = W::Routing;

    fn pp(&self, name: &str) -> Self {
        let dropped = self.dropped
            || (self.root
                && match name {
                    "wte" => !(self.first || (self.last && self.tied)),
                    "ln_f" | "head" => !self.last,
                    _ => false,
                });
        StageWeights {
            inner: self.inner.pp(name),
            first: self.first,
            last: self.last,
            tied: self.tied,
            root: false,
            dropped,
        }
    }

    fn weight(&self, dims: &[usize], name: &str, init: Init) -> Result<Self::Tensor> {
        let dropped = self.dropped || (self.root && name == "wpe" && !self.first);
        self.inner.weight(&self.dims(dims, dropped), name, init)
    }

    fn linear(&self, inp: usize, out: usize, bias: bool) -> Result<Proj<Self::Tensor>> {
        self.inner
            .linear(inp, if self.dropped { 0 } else { out }, bias)
    }

    fn proj(&self, spec: &ProjSpec, cfg: &Config) -> Result<Proj<Self::Tensor>> {
        self.inner.proj(spec, cfg)
    }

    fn rotary(
        &self,
        cfg: &Config,
        head_dim: usize,
        theta: f64,
        scaling: Option<&RopeScaling>,
    ) -> Result<(Self::Tensor, Self::Tensor)> {
        self.inner.rotary(cfg, head_dim, theta, scaling)
    }

    fn experts(&self, n: usize) -> Vec<usize> {
        self.inner.experts(n)
    }

    fn routing(&self, cfg: &Config, layer: usize, experts: &[usize]) -> Self::Routing {
        self.inner.routing(cfg, layer, experts)
    }

    fn segment(&self, tag: u32) {
        self.inner.segment(tag)
    }
}
