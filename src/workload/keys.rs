//! The workload keys, written once: each is a key of a grid in a workload file ([`GridSpec`],
//! TOML: a value, or a list that expands) and a flag of `run`, `predict` and `max-batch`
//! ([`GridArgs`], comma lists expanding as TOML lists do), with one description for both, so
//! the file's keys and the flags cannot drift apart. [`GridArgs::grid_flags`] turns the flags
//! into a grid laid over every grid of a file ([`GridSpec::overlay`]).

use clap::Args;
use serde::Deserialize;

use super::OneOrMany;

/// A flag's value as the grid key it stands for (an empty list: not given).
trait FromFlag<F> {
    fn from_flag(flag: &F) -> Self;
}

impl<T: Clone> FromFlag<Vec<T>> for Option<OneOrMany<T>> {
    fn from_flag(v: &Vec<T>) -> Self {
        (!v.is_empty()).then(|| OneOrMany::Many(v.clone()))
    }
}

impl FromFlag<Vec<String>> for Option<Vec<String>> {
    fn from_flag(v: &Vec<String>) -> Self {
        (!v.is_empty()).then(|| v.clone())
    }
}

impl FromFlag<Option<String>> for Option<String> {
    fn from_flag(v: &Option<String>) -> Self {
        v.clone()
    }
}

/// Builds [`GridArgs`] field by field (each kind its clap attributes), then the two structs'
/// conversions. Kinds: `one` (a single string), `ints` / `strs` (a value or a list; a comma list
/// as a flag), `list` (a list of strings; a comma list as a flag), `repeat` (a list; the flag
/// repeated, its values may hold commas).
macro_rules! grid_args {
    (@acc [$($out:tt)*]) => {
        /// Every workload key as a flag (comma lists expand like TOML lists).
        #[derive(Debug, Args, Default)]
        pub struct GridArgs { $($out)* }
    };
    (@acc [$($out:tt)*] [$($doc:tt)*] $name:ident one [$($h:expr)?] $($rest:tt)*) => {
        grid_args!(@acc [$($out)* $($doc)* #[arg(long $(, help = $h)?)] pub $name: Option<String>,] $($rest)*);
    };
    (@acc [$($out:tt)*] [$($doc:tt)*] $name:ident ints [$($h:expr)?] $($rest:tt)*) => {
        grid_args!(@acc [$($out)* $($doc)* #[arg(long, value_delimiter = ',', allow_negative_numbers = true $(, help = $h)?)] pub $name: Vec<i64>,] $($rest)*);
    };
    (@acc [$($out:tt)*] [$($doc:tt)*] $name:ident strs [$($h:expr)?] $($rest:tt)*) => {
        grid_args!(@acc [$($out)* $($doc)* #[arg(long, value_delimiter = ',' $(, help = $h)?)] pub $name: Vec<String>,] $($rest)*);
    };
    (@acc [$($out:tt)*] [$($doc:tt)*] $name:ident list [$($h:expr)?] $($rest:tt)*) => {
        grid_args!(@acc [$($out)* $($doc)* #[arg(long, value_delimiter = ',' $(, help = $h)?)] pub $name: Vec<String>,] $($rest)*);
    };
    (@acc [$($out:tt)*] [$($doc:tt)*] $name:ident repeat [$($h:expr)?] $($rest:tt)*) => {
        grid_args!(@acc [$($out)* $($doc)* #[arg(long, value_name = "FIELD=VALUE" $(, help = $h)?)] pub $name: Vec<String>,] $($rest)*);
    };
}

/// The type of a kind's grid key.
macro_rules! spec_type {
    (one) => { Option<String> };
    (ints) => { Option<OneOrMany<i64>> };
    (strs) => { Option<OneOrMany<String>> };
    (list) => { Option<Vec<String>> };
    (repeat) => { Option<Vec<String>> };
}

macro_rules! grid_keys {
    ($( $(#[doc = $doc:expr])* $name:ident : $kind:ident $(, help = $h:expr)? ; )*) => {
        /// One grid: every key optional; lists expand.
        #[derive(Debug, Clone, Default, PartialEq, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct GridSpec {
            $( $(#[doc = $doc])* pub $name: spec_type!($kind), )*
        }

        grid_args!(@acc [] $( [$(#[doc = $doc])*] $name $kind [$($h)?] )*);

        impl GridSpec {
            /// Keys set in `over` replace those in `self`.
            pub fn overlay(&self, over: &GridSpec) -> GridSpec {
                GridSpec { $( $name: over.$name.clone().or_else(|| self.$name.clone()), )* }
            }
        }

        impl GridArgs {
            /// The workload keys given as flags, to lay over every grid.
            pub fn grid_flags(&self) -> GridSpec {
                GridSpec { $( $name: FromFlag::from_flag(&self.$name), )* }
            }

            /// True when any workload key was given as a flag.
            pub fn has_grid_flags(&self) -> bool {
                self.grid_flags() != GridSpec::default()
            }
        }
    };
}

grid_keys! {
    /// Model family: gpt (decoder), vit (image encoder) or llama (RMSNorm, rotary, GQA,
    /// SwiGLU); a vit-… or LLaMA preset implies its family.
    model: one;
    preset: one, help = preset_help();
    /// Batch sizes (sequences, or images for a ViT).
    batch: ints;
    /// Sequence lengths (tokens).
    seq: ints;
    /// Position-table lengths (default: the preset's, or the sequence for custom shapes).
    max_seq: ints;
    /// Hidden sizes.
    hidden: ints;
    /// Attention heads (must divide hidden).
    heads: ints;
    /// Decoder blocks.
    layers: ints;
    /// Vocabulary sizes.
    vocab: ints;
    optimizer: strs, help = optimizer_help();
    phases: list, help = phases_help();
    /// Element types: f32, f16 (CPU and CUDA), bf16 (CUDA; `predict` answers for it on any
    /// device). Default: the hf_config checkpoint's `torch_dtype` / `dtype` (a bf16 checkpoint
    /// measured on the CPU runs f32, and its rows say so), else f32.
    dtype: strs;
    /// Device: cpu or cuda:N (the CUDA build; `predict` answers for cuda:N on any build).
    device: one;
    /// Blocks per gradient-checkpoint segment (0 = off).
    checkpoint: ints;
    /// The backward: by-block (the default: each block's graph is freed once its gradients
    /// are taken, as PyTorch frees saved tensors) or whole (candle's loss.backward(), the
    /// whole graph kept until it returns).
    backward: strs;
    attention: strs, help = attention_help();
    kernels: strs, help = kernels_help();
    /// on (the default): the CPU threads flush subnormal floats to zero (FTZ/DAZ; changes
    /// results below 2⁻¹²⁶, not memory; can make a backward several times faster); off.
    flush_denormals: strs;
    /// on (the default): trim the heap and reset the RSS high-water mark before each window,
    /// trim again after it (rss_peak_bytes, trim_* figures); off: skip both, saving the trim's
    /// page faults on small windows (those figures are then missing).
    trim: strs;
    /// Precision: pure (everything in dtype) or mixed (f32 master weights, gradients and
    /// optimizer state; f16/bf16 working copies and activations).
    precision: strs;
    /// LoRA ranks (0 = off): base weights frozen, adapters train.
    lora_rank: ints;
    /// Projections with LoRA adapters: q, k, v, o, fc1, fc2 (GPT) or gate, up, down (LLaMA),
    /// or all (default q,v).
    lora_targets: list;
    /// How LoRA freezes the base projections: detach, op (the default), q4_0, q8_0, q4_k, q6_k
    /// (QLoRA), fp8, mxfp4 (held as those checkpoints ship).
    lora_base: strs;
    /// Elements per quantization block of adamw-8bit (default 2048).
    optimizer_block: ints;
    /// Tokens the decode phase generates (default 16).
    decode_tokens: ints;
    /// Decode with a key/value cache (on, the default) or recompute the prefix per token
    /// (off).
    kv_cache: strs;
    weights: strs, help = weights_help();
    /// How the load phase reads the safetensors file: read (the default) or mmap.
    load: strs;
    /// ViT: sides of the square input image in pixels.
    image: ints;
    /// ViT: sides of a square patch in pixels (divide the image).
    patch: ints;
    /// ViT: colour channels of the image.
    channels: ints;
    /// ViT: classes of the classifier.
    classes: ints;
    /// A Hugging Face config.json (a local path, relative to the working directory): the model
    /// family and sizes, its element type the default dtype; size keys override its fields
    /// (e.g. layers 2 for a two-block slice).
    hf_config: one;
    /// Changes to the hf_config file's fields before it is read: FIELD=VALUE, the value as
    /// JSON (else a string), e.g. num_hidden_layers=2, n_routed_experts=8; a field memfit
    /// neither reads nor knows to change no memory is refused. As a flag, repeated.
    hf_set: repeat;
    /// LLaMA: K/V heads (divide heads).
    kv_heads: ints;
    /// LLaMA: width of one head (even; default the preset's, or hidden/heads when the sizes
    /// change).
    head_dim: ints;
    /// LLaMA: width of the SwiGLU MLP.
    intermediate: ints;
    /// GPT, LLaMA: tie the LM head to the token embedding: on, off (the presets say which).
    tied: strs;
    /// LLaMA: attention biases off, qkv (Qwen2) or on (q, k, v, o).
    attention_bias: strs;
    /// dataload: the dataset folder (`memfit dataset make`).
    dataset: one;
    /// dataload: worker counts (0 = the main thread).
    workers: ints;
    /// dataload: thread (the default) or process workers.
    worker_kind: strs;
    /// dataload: batches requested ahead per worker (default 2).
    prefetch: ints;
    /// dataload: where the dataset is read from: ram (the default), mmap or stream.
    storage: strs;
    /// dataload: persistent workers on (the default: alive through all epochs) or off.
    persistent: strs;
    /// dataload: passes over the dataset in the window (default 2).
    epochs: ints;
    /// dataload: side of the square crop in pixels (default 224).
    crop: ints;
}

/// `--preset`'s help: every preset, from the lists the families keep.
pub fn preset_help() -> String {
    format!(
        "Named model the size keys start from: GPT {}; ViT {}; LLaMA family (shipped \
         config.json files) {}",
        crate::model::config::PRESETS.join(", "),
        crate::model::vit::PRESETS.join(", "),
        crate::model::llama::presets().join(", ")
    )
}

/// `--phases`' help, from the phase list.
pub fn phases_help() -> String {
    format!(
        "Phases ({}): `run` measures them, `predict` predicts them",
        crate::step::Phase::names()
    )
}

/// `--optimizer`'s help, from the optimizer list.
pub fn optimizer_help() -> String {
    format!("Optimizers: {}", crate::step::OptimizerKind::names())
}

/// `--weights`' help, from the serving weights' names.
pub fn weights_help() -> String {
    format!(
        "Weights the inference phases serve with: {} (mxfp4-experts: the experts alone in \
         MXFP4, as gpt-oss ships)",
        crate::device::ServingWeights::NAMES
    )
}

/// `--attention`'s help, its default read from the expander that applies it.
pub fn attention_help() -> String {
    format!(
        "Attention: standard (scores materialised), efficient (no S×S tensor kept: the \
         online-softmax op on the CPU, the tiled composition on CUDA) or tiled (the composition \
         of ordinary ops, every device and type); default {} on every device",
        super::DEFAULT_ATTENTION
    )
}

/// `--kernels`' help, its default read from the expander that applies it.
pub fn kernels_help() -> String {
    format!(
        "Norms, attention softmax, activations and loss: transformers (one op each, keeping \
         what PyTorch + transformers' autograd keeps: RMSNorm's f32 copy and normalised \
         value, SwiGLU's SiLU output, the loss's f32 log-probabilities; nothing of a rotary \
         or 16-bit norm input), fused (memfit's lean kernels: each keeps its inputs and \
         output only, as Liger's fused kernels) or composed (candle's stock ops, kept for \
         comparison); default {} on every device",
        super::DEFAULT_KERNELS
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        grid: GridArgs,
    }

    /// A flag becomes its grid key: comma lists, a repeated `--hf-set`, single values; nothing
    /// given is the empty grid.
    #[test]
    fn flags_are_the_grid_keys() {
        let cli = Cli::parse_from([
            "x",
            "--batch",
            "1,2",
            "--phases",
            "init,forward",
            "--hf-set",
            "a=[1,2]",
            "--hf-set",
            "b=3",
            "--preset",
            "tiny",
            "--dtype",
            "f32",
        ]);
        let g = cli.grid.grid_flags();
        assert_eq!(g.batch, Some(OneOrMany::Many(vec![1, 2])));
        assert_eq!(g.phases, Some(vec!["init".into(), "forward".into()]));
        assert_eq!(g.hf_set, Some(vec!["a=[1,2]".into(), "b=3".into()]));
        assert_eq!(g.preset.as_deref(), Some("tiny"));
        assert_eq!(g.dtype, Some(OneOrMany::Many(vec!["f32".into()])));
        assert!(cli.grid.has_grid_flags());
        assert!(!Cli::parse_from(["x"]).grid.has_grid_flags());
        // The flags lie over a file's grid key by key.
        let file = GridSpec {
            seq: Some(OneOrMany::One(8)),
            batch: Some(OneOrMany::One(4)),
            ..GridSpec::default()
        };
        let both = file.overlay(&g);
        assert_eq!(both.seq, Some(OneOrMany::One(8)));
        assert_eq!(both.batch, Some(OneOrMany::Many(vec![1, 2])));
    }
}
