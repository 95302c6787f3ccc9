//! The keys of a Hugging Face `config.json` that memfit does not read because they leave the
//! memory of a run unchanged, each with its reason ([`super::hf_config`] refuses every other key
//! it does not read, so that no key is ever silently dropped and a misspelt `--hf-set` field is
//! an error).
//!
//! The lists follow transformers 4.57's `PretrainedConfig` (the keys every `config.json`
//! carries) and the config classes of the families memfit builds. A key that changes memory
//! only for some values is listed [`When::Unset`]: neutral when absent, null, false, 0, empty,
//! refused otherwise (e.g. `output_attentions: true` makes transformers' SDPA attention fall back
//! to eager and keep the probabilities).

use serde_json::Value;

/// When a listed key leaves memory unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// Whatever its value.
    Always,
    /// Only when it is null, false, 0, "" or empty; another value changes memory.
    Unset,
}

/// A key memfit does not read, and why memory does not depend on it.
#[derive(Debug, Clone, Copy)]
pub struct Neutral {
    pub key: &'static str,
    pub when: When,
    pub why: &'static str,
}

const fn any(key: &'static str, why: &'static str) -> Neutral {
    Neutral {
        key,
        when: When::Always,
        why,
    }
}

const fn unset(key: &'static str, why: &'static str) -> Neutral {
    Neutral {
        key,
        when: When::Unset,
        why,
    }
}

const GENERATION: &str = "a generation default; memfit's serving phases take the batch, the \
                          tokens and the cache from flags";
const TOKEN_ID: &str = "a token id: a value, not a size";
const METADATA: &str = "metadata: names and versions, no tensor";
const LABELS: &str = "a classification head's labels, which a causal LM does not build";

/// `PretrainedConfig`'s keys (transformers 4.57), for every family.
pub const COMMON: &[Neutral] = &[
    any("architectures", METADATA),
    any("transformers_version", METADATA),
    any("model_type_version", METADATA),
    any("tokenizer_class", METADATA),
    any("prefix", METADATA),
    any("finetuning_task", METADATA),
    any("task_specific_params", METADATA),
    any("problem_type", METADATA),
    any(
        "auto_map",
        "names remote code; memfit builds what transformers' own class for the model_type builds",
    ),
    any("custom_pipelines", METADATA),
    any("name_or_path", METADATA),
    any(
        "transformers_weights",
        "the name of the weights file to load",
    ),
    any("tf_legacy_loss", "a TensorFlow-only loss flag"),
    any("xla_device", "a TPU flag of transformers 3, no tensor"),
    any(
        "attn_implementation",
        "overwritten by from_pretrained's own argument; memfit's attention is --attention",
    ),
    any("bos_token_id", TOKEN_ID),
    any("eos_token_id", TOKEN_ID),
    any("pad_token_id", TOKEN_ID),
    any("sep_token_id", TOKEN_ID),
    any("unk_token_id", TOKEN_ID),
    any("decoder_start_token_id", TOKEN_ID),
    any("forced_bos_token_id", TOKEN_ID),
    any("forced_eos_token_id", TOKEN_ID),
    any(
        "initializer_range",
        "the spread of the initial weights: values, not sizes",
    ),
    any(
        "initializer_factor",
        "a scale of the initial weights: values, not sizes",
    ),
    any(
        "use_cache",
        "a generation default; memfit's serving phases choose the cache (--kv-cache)",
    ),
    any(
        "return_dict",
        "how outputs are returned (a tuple or an object), not what is kept",
    ),
    any(
        "use_bfloat16",
        "a TensorFlow-era flag PyTorch models do not read (dtype / torch_dtype is read)",
    ),
    any(
        "cache_implementation",
        "generation's cache class; memfit holds each layer's cache as transformers' hybrid cache does (sliding layers at the window)",
    ),
    any("max_length", GENERATION),
    any("min_length", GENERATION),
    any("max_new_tokens", GENERATION),
    any("do_sample", GENERATION),
    any("early_stopping", GENERATION),
    any("num_beams", GENERATION),
    any("num_beam_groups", GENERATION),
    any("diversity_penalty", GENERATION),
    any("temperature", GENERATION),
    any("top_k", GENERATION),
    any("top_p", GENERATION),
    any("typical_p", GENERATION),
    any("repetition_penalty", GENERATION),
    any("length_penalty", GENERATION),
    any("no_repeat_ngram_size", GENERATION),
    any("encoder_no_repeat_ngram_size", GENERATION),
    any("bad_words_ids", GENERATION),
    any("num_return_sequences", GENERATION),
    any("output_scores", GENERATION),
    any("return_dict_in_generate", GENERATION),
    any("remove_invalid_values", GENERATION),
    any("exponential_decay_length_penalty", GENERATION),
    any("suppress_tokens", GENERATION),
    any("begin_suppress_tokens", GENERATION),
    any("label2id", LABELS),
    any("classifier_dropout", LABELS),
    unset(
        "output_router_logits",
        "true adds the routers' auxiliary loss, which memfit does not build",
    ),
    any("id2label", LABELS),
    any("num_labels", LABELS),
    unset(
        "output_attentions",
        "true returns every layer's attention probabilities (SDPA falls back to eager)",
    ),
    unset(
        "output_hidden_states",
        "true returns, and so keeps, every layer's hidden states",
    ),
    unset(
        "torchscript",
        "true clones the tied weights instead of sharing them",
    ),
    unset(
        "gradient_checkpointing",
        "true turns checkpointing on in transformers; ask memfit for it with --checkpoint",
    ),
    unset(
        "chunk_size_feed_forward",
        "a non-zero chunk runs the feed-forward in chunks (smaller activations)",
    ),
    unset(
        "pruned_heads",
        "pruned heads remove parameters from the blocks",
    ),
    unset(
        "is_encoder_decoder",
        "an encoder-decoder model is another architecture",
    ),
    unset(
        "add_cross_attention",
        "cross-attention layers add parameters to every block",
    ),
    unset(
        "cross_attention_hidden_size",
        "cross-attention layers add parameters to every block",
    ),
    unset(
        "tie_encoder_decoder",
        "an encoder-decoder model is another architecture",
    ),
    unset(
        "is_decoder",
        "a decoder flag of encoder models; memfit's decoders are causal anyway",
    ),
];

const AUX_LOSS: &str = "the weight of the routers' auxiliary loss, which output_router_logits \
                        (read) asks for";
const PRETRAINING_TP: &str = "slices the projections' matmuls in Meta's pretraining code; \
                              transformers' modules ignore it (same parameters and activations)";

const LLAMA: &[Neutral] = &[any("pretraining_tp", PRETRAINING_TP)];

const MIXTRAL: &[Neutral] = &[
    any("router_aux_loss_coef", AUX_LOSS),
    unset(
        "router_jitter_noise",
        "a non-zero jitter multiplies the router's input by noise in training (a saved tensor)",
    ),
];

const QWEN_MOE: &[Neutral] = &[any("router_aux_loss_coef", AUX_LOSS)];

const QWEN3_MOE: &[Neutral] = &[
    any("router_aux_loss_coef", AUX_LOSS),
    any(
        "qkv_bias",
        "Qwen2-MoE's field; transformers' Qwen3-MoE biases by attention_bias (read)",
    ),
];

const QWEN2: &[Neutral] = &[any(
    "use_mrope",
    "Qwen2-VL's multimodal rotary flag, which transformers' qwen2 does not read",
)];

const DEEPSEEK: &[Neutral] = &[
    any("pretraining_tp", PRETRAINING_TP),
    any(
        "aux_loss_alpha",
        "DeepSeek's auxiliary balance loss, which transformers' model does not compute",
    ),
    any(
        "seq_aux",
        "DeepSeek's auxiliary balance loss, which transformers' model does not compute",
    ),
    any(
        "ep_size",
        "the remote code's expert-parallel degree; memfit sizes one device holding every expert",
    ),
    any(
        "num_nextn_predict_layers",
        "multi-token-prediction layers, which transformers does not build",
    ),
];

const GPT_OSS: &[Neutral] = &[
    any("router_aux_loss_coef", AUX_LOSS),
    any(
        "experts_per_token",
        "the original checkpoint's name; transformers routes by num_experts_per_tok (read)",
    ),
    any(
        "initial_context_length",
        "unused by transformers; YaRN's original length is rope_scaling's (read)",
    ),
];

const GPT2: &[Neutral] = &[
    any(
        "summary_type",
        "GPT2DoubleHeadsModel's summary head, not built for a causal LM",
    ),
    any(
        "summary_use_proj",
        "GPT2DoubleHeadsModel's summary head, not built for a causal LM",
    ),
    any(
        "summary_activation",
        "GPT2DoubleHeadsModel's summary head, not built for a causal LM",
    ),
    any(
        "summary_proj_to_labels",
        "GPT2DoubleHeadsModel's summary head, not built for a causal LM",
    ),
    any(
        "summary_first_dropout",
        "GPT2DoubleHeadsModel's summary head, not built for a causal LM",
    ),
    any(
        "scale_attn_weights",
        "whether the scores are divided by √d: one scale, the same tensors",
    ),
    any(
        "scale_attn_by_inverse_layer_idx",
        "one more scale of the scores: the same tensors",
    ),
    unset(
        "reorder_and_upcast_attn",
        "true computes the scores in f32 (larger in a 16-bit run)",
    ),
    any(
        "summary_last_dropout",
        "GPT2DoubleHeadsModel's summary head, not built for a causal LM",
    ),
    any(
        "n_ctx",
        "GPT-2's older name of n_positions; transformers reads n_positions",
    ),
];

const VIT: &[Neutral] = &[
    any(
        "tie_word_embeddings",
        "a ViT classifier has no LM head to tie",
    ),
    any(
        "hidden_act",
        "memfit computes the GELU with the tanh approximation: the same saved tensors",
    ),
    any(
        "encoder_stride",
        "the masked-image-modelling decoder's stride, not built",
    ),
    any(
        "pooler_output_size",
        "ViTModel's pooler, which ViTForImageClassification does not build",
    ),
    any(
        "pooler_act",
        "ViTModel's pooler, which ViTForImageClassification does not build",
    ),
];

/// The keys of `model_type`'s config class that memfit does not read (beside [`COMMON`]).
pub fn family(model_type: &str) -> &'static [Neutral] {
    match model_type {
        "llama" | "mistral" => LLAMA,
        "qwen2" => QWEN2,
        "mixtral" => MIXTRAL,
        "qwen2_moe" => QWEN_MOE,
        "qwen3_moe" => QWEN3_MOE,
        "deepseek_v2" | "deepseek_v3" => DEEPSEEK,
        "gpt_oss" => GPT_OSS,
        "gpt2" => GPT2,
        "vit" => VIT,
        _ => &[],
    }
}

/// Whether `v` is "unset": null, false, 0, "" or an empty list or object.
pub fn is_unset(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// The listed entry for `key` under `model_type`, if any.
pub fn neutral(model_type: &str, key: &str) -> Option<&'static Neutral> {
    family(model_type)
        .iter()
        .chain(COMMON)
        .find(|n| n.key == key)
}

/// The known key nearest to `key` by edit distance, when it is close enough to be a misspelling
/// (at most a third of the key's letters differ).
pub fn nearest<'a>(key: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let limit = (key.chars().count() / 3).max(1);
    known
        .into_iter()
        .map(|k| (edit_distance(key, k), k))
        .filter(|(d, _)| *d <= limit)
        .min()
        .map(|(_, k)| k)
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(here + 1);
            prev = here;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misspellings_find_their_key() {
        let known = ["num_hidden_layers", "hidden_size", "num_attention_heads"];
        assert_eq!(
            nearest("num_hiden_layers", known),
            Some("num_hidden_layers")
        );
        assert_eq!(nearest("hiden_size", known), Some("hidden_size"));
        assert_eq!(nearest("vocab", known), None);
    }

    #[test]
    fn unset_values() {
        for v in ["null", "false", "0", "0.0", "\"\"", "[]", "{}"] {
            assert!(is_unset(&serde_json::from_str(v).unwrap()), "{v}");
        }
        for v in ["true", "1", "0.1", "\"x\"", "[1]", "{\"a\": 1}"] {
            assert!(!is_unset(&serde_json::from_str(v).unwrap()), "{v}");
        }
    }

    #[test]
    fn no_key_is_listed_twice_for_a_family() {
        for t in [
            "llama",
            "mixtral",
            "qwen3_moe",
            "deepseek_v3",
            "gpt_oss",
            "gpt2",
            "vit",
        ] {
            let mut keys: Vec<&str> = family(t).iter().chain(COMMON).map(|n| n.key).collect();
            let n = keys.len();
            keys.sort();
            keys.dedup();
            assert_eq!(keys.len(), n, "{t}");
        }
    }
}
