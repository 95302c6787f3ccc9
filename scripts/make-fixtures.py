#!/usr/bin/env python3
"""Reference fixtures for tests/reference.rs: tiny models built by transformers, their weights
(renamed to memfit's variable names), their logits for a fixed input and their gradients for fixed
targets, so that CI checks that memfit's models compute the same function, and the same
gradients, as the reference implementations without PyTorch.

Run with the bench venv (scripts/bench-torch.sh installs it), from the repository root:
    ~/.cache/memfit/torch-venv/bin/python scripts/make-fixtures.py
Each family draws from its own seed, so `make-fixtures.py mixtral` alone rewrites mixtral's
files to the same bytes as a run over every family (MEMFIT_FIXTURES_OUT=DIR writes elsewhere, to
compare). Writes tests/fixtures/<family>/{config.json, model.safetensors, io.safetensors,
grads.safetensors}: config.json is the Hugging Face config memfit reads (`--hf-config`),
model.safetensors the weights under memfit's names (f32), io.safetensors the input tokens (u32 as
i64 → stored as `tokens` i64) and transformers' logits (`logits`, f32, (B, S, V)),
grads.safetensors the targets (`targets`, i64, (B, S), drawn from a generator of their own so
that the weights, tokens and logits draw as they did before the targets existed) and, under
memfit's names, transformers' gradient of every parameter (computed in float64, stored as f32)
of the mean cross-entropy over
all B·S positions, `F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1))` (memfit's
`Transformer::loss`), with the model in float64 (eager attention). A tied head's gradient is the
embedding's, one tensor (memfit's tied head is the token table); an expert no token reached has
a zero gradient. The gradients are transformers' as they are: its embedding gives the pad
token's row (`padding_idx` = `pad_token_id`) no gradient from the input, which memfit's does
(tests/reference.rs leaves that row out where the input holds the pad token: phi3_partial).

Precision of the gradients: float64 except where transformers computes in float32 whatever the
model's type, so their agreement with an exact gradient is that of float32 rounding at those
points (about 1e-7 relative each, not 1e-16): the eager attention's softmax
(`softmax(..., dtype=torch.float32)`; gpt-oss's, with its sinks, in the model's type), the
RMSNorms (`hidden_states.to(torch.float32)`; Gemma's `x.float()` and `1 + w.float()`), the rotary
tables (`inv_freq.float()`) and DeepSeek-V2's rotation (`xq.float()`, as complex numbers), and
the routers: Mixtral's, Qwen2-MoE's and Qwen3-MoE's softmax (`F.softmax(router_logits,
dtype=torch.float)`), DeepSeek-V2's, DeepSeek-V3's and GLM-4.5's router logits and scores
(`F.linear(hidden.type(torch.float32), weight.type(torch.float32))`); gpt-oss's router is in the
model's type; Qwen3-Next's linear layers (the decay `g`, the delta rule, the gated norm:
`.float()`, `.to(torch.float32)`), whose float64 logits are within 1.8e-5 of the float32 ones. DeepSeek-V3's and GLM-4.5's routing weights are handed to the experts in float64
(see `gradients`: in float32 transformers' float64 model does not run).

The logits (float32) depend to their last bits on the machine's float32 kernels: regenerated on
another CPU, io.safetensors may differ by about 1e-6 relative while the configs, weights, tokens
and targets are byte-identical (so do 15 of the 22 families' logits, made elsewhere, on the
machine that made the gradients: up to 9e-7; they were kept).
"""
import json, os, sys, zlib

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
import transformers

ROOT = os.environ.get("MEMFIT_FIXTURES_OUT") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")

COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
              rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=False,
              torch_dtype="float32")

FAMILIES = {
    # Llama with grouped-query attention (2 K/V heads of 4).
    "llama": ("llama", transformers.LlamaConfig, transformers.LlamaForCausalLM, {}),
    # Qwen3: q/k RMSNorms per head, head_dim 16 (not hidden / heads = 8).
    "qwen3": ("qwen3", transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 16}),
    # Mistral: a sliding window of 4 tokens over an 11-token input.
    "mistral": ("mistral", transformers.MistralConfig, transformers.MistralForCausalLM,
                {"sliding_window": 4}),
    # Mixtral: 4 experts, 2 per token (renormalised).
    "mixtral": ("mixtral", transformers.MixtralConfig, transformers.MixtralForCausalLM,
                {"num_local_experts": 4, "num_experts_per_tok": 2}),
    # Qwen3-MoE: 6 experts of width 24, 3 per token, renormalised; q/k norms.
    "qwen3_moe": ("qwen3_moe", transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                  {"num_experts": 6, "num_experts_per_tok": 3, "moe_intermediate_size": 24,
                   "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": []}),
    # Qwen3-MoE with layer 1 listed dense (mlp_only_layers: its MLP is intermediate_size wide).
    "qwen3_moe_dense": ("qwen3_moe", transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                        {"num_experts": 6, "num_experts_per_tok": 3, "moe_intermediate_size": 24,
                         "norm_topk_prob": True, "decoder_sparse_step": 1,
                         "mlp_only_layers": [1]}),
    # Qwen3 with per-layer attention types: a window of 4 from layer 1 on (max_window_layers
    # 1: layer 0 full, layer 1 sliding; transformers' layer_types).
    "qwen3_layer_types": ("qwen3", transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
                          {"head_dim": 16, "use_sliding_window": True, "sliding_window": 4,
                           "max_window_layers": 1}),
    # Qwen2-MoE: 4 experts of width 24, 2 per token (not renormalised), a shared expert of
    # width 40 with its sigmoid gate; every second layer sparse (layer 0 dense, width 48);
    # q, k, v biases.
    "qwen2_moe": ("qwen2_moe", transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM,
                  {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
                   "shared_expert_intermediate_size": 40, "norm_topk_prob": False,
                   "decoder_sparse_step": 2, "mlp_only_layers": []}),
    # DeepSeek-V2: MLA without q compression (kv_lora_rank 16, nope 8, rope 4, v 6), 6 routed
    # experts of width 20 (2 per token, greedy softmax), 2 shared, layer 0 dense, and a
    # routed scale of 1.5; 3 layers.
    "deepseek_v2": ("deepseek_v2", transformers.DeepseekV2Config, transformers.DeepseekV2ForCausalLM,
                    {"num_hidden_layers": 3, "num_key_value_heads": 4, "q_lora_rank": None,
                     "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
                     "v_head_dim": 6, "n_routed_experts": 6, "num_experts_per_tok": 2,
                     "n_shared_experts": 2, "moe_intermediate_size": 20,
                     "first_k_dense_replace": 1, "topk_method": "greedy",
                     "norm_topk_prob": False, "routed_scaling_factor": 1.5, "n_group": 1,
                     "topk_group": 1}),
    # DeepSeek-V3: MLA with q compression (q_lora_rank 24), 8 routed experts in 4 groups,
    # 2 groups then 2 experts per token (sigmoid scores, renormalised, scaled 2.5), 1 shared;
    # layer 0 dense.
    "deepseek_v3": ("deepseek_v3", transformers.DeepseekV3Config, transformers.DeepseekV3ForCausalLM,
                    {"num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 16,
                     "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6,
                     "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 4,
                     "topk_group": 2, "n_shared_experts": 1, "moe_intermediate_size": 20,
                     "first_k_dense_replace": 1, "norm_topk_prob": True,
                     "routed_scaling_factor": 2.5, "rope_interleave": True}),
    # Phi-3: fused qkv_proj and gate_up_proj (split into memfit's q, k, v and gate, up below),
    # GQA 4:2, a sliding window of 5 over the 11-token input.
    "phi3": ("phi3", transformers.Phi3Config, transformers.Phi3ForCausalLM,
             {"sliding_window": 5, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
    # Rope scaling (transformers' modeling_rope_utils), each over the 11-token input:
    # Llama 3.1's llama3 (original context 8: frequency 0 in the smoothed band, 1-3 divided).
    "llama_rope_llama3": ("llama", transformers.LlamaConfig, transformers.LlamaForCausalLM,
                          {"rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 8}}),
    # Qwen3 under YaRN (factor 4 over an original 8: cos and sin times 0.1·ln 4 + 1).
    "qwen3_yarn": ("qwen3", transformers.Qwen3Config, transformers.Qwen3ForCausalLM,
                   {"head_dim": 16, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                     "original_max_position_embeddings": 8}}),
    # DeepSeek-V3's own YaRN (factor 40, mscale = mscale_all_dim = 1: the attention scale
    # times mscale²), as its config.json ships it.
    "deepseek_v3_yarn": ("deepseek_v3", transformers.DeepseekV3Config,
                         transformers.DeepseekV3ForCausalLM,
                         {"num_key_value_heads": 4, "q_lora_rank": 24, "kv_lora_rank": 16,
                          "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6,
                          "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 4,
                          "topk_group": 2, "n_shared_experts": 1, "moe_intermediate_size": 20,
                          "first_k_dense_replace": 1, "norm_topk_prob": True,
                          "routed_scaling_factor": 2.5, "rope_interleave": True,
                          "rope_scaling": {"type": "yarn", "factor": 40.0, "beta_fast": 32,
                                           "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
                                           "original_max_position_embeddings": 4}}),
    # Phi-3 128k's LongRoPE (short factors up to the original 16 positions; attention factor
    # from max / original = 2).
    "phi3_longrope": ("phi3", transformers.Phi3Config, transformers.Phi3ForCausalLM,
                      {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
                       "original_max_position_embeddings": 16,
                       "rope_scaling": {"type": "longrope", "short_factor": [1.0, 1.5, 2.5, 4.0],
                                        "long_factor": [2.0, 3.0, 5.0, 8.0]}}),
    # Phi-4-mini's shape of Phi-3: the rotary over the first 0.75 of each head (6 of 8), the
    # head tied.
    "phi3_partial": ("phi3", transformers.Phi3Config, transformers.Phi3ForCausalLM,
                     {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
                      "partial_rotary_factor": 0.75, "tie_word_embeddings": True}),
    # Gemma 3: (1 + w) norms, four a block, GeGLU (tanh GELU), the embedding times sqrt(H),
    # q/k norms, head_dim 16 with the attention scale 24^-1/2, layer 0 sliding (window 4, its
    # own rotary base 10^4), layer 1 full (base 10^6 under linear scaling 8), tied head.
    "gemma3": ("gemma3_text", transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM,
               {"head_dim": 16, "query_pre_attn_scalar": 24, "sliding_window": 4,
                "layer_types": ["sliding_attention", "full_attention"], "rope_theta": 1e6,
                "rope_local_base_freq": 10000.0,
                "rope_scaling": {"rope_type": "linear", "factor": 8.0},
                "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh",
                "hidden_act": None}),
    # Gemma 2: Gemma 3's block without q/k norms and local rotary base, layer 0 sliding
    # (window 4) and layer 1 full, soft-capping tight enough to bite on these weights (the
    # scores at 1.5, the logits at 2), tied head.
    "gemma2": ("gemma2", transformers.Gemma2Config, transformers.Gemma2ForCausalLM,
               {"head_dim": 16, "query_pre_attn_scalar": 24, "sliding_window": 4,
                "attn_logit_softcapping": 1.5, "final_logit_softcapping": 2.0,
                "tie_word_embeddings": True, "hidden_activation": "gelu_pytorch_tanh",
                "hidden_act": None, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
    # gpt-oss: attention sinks, q/k/v/o biases, layer 0 sliding (window 4) and layer 1 full,
    # YaRN (factor 4 over an original 8, not truncated), 4 biased experts of width 48 with the
    # clamped SwiGLU (their gate/up scaled by 4 below, so that gates pass 7 and ups pass ±7),
    # 2 per token from a biased router.
    "gpt_oss": ("gpt_oss", transformers.GptOssConfig, transformers.GptOssForCausalLM,
                {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 4,
                 "head_dim": 16, "layer_types": ["sliding_attention", "full_attention"],
                 "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0,
                                  "beta_slow": 1.0, "truncate": False,
                                  "original_max_position_embeddings": 8}}),
    # SmolLM3: every second layer NoPE (no_rope_layer_interval 2: layer 1 does not rotate its
    # queries and keys), rotary base 2e6, tied head.
    "smollm3": ("smollm3", transformers.SmolLM3Config, transformers.SmolLM3ForCausalLM,
                {"no_rope_layer_interval": 2, "rope_theta": 2e6, "tie_word_embeddings": True,
                 "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
    # OLMo 2: norms after the attention and the MLP only (none before), RMSNorms of the whole
    # q and k projections (32 and 16 wide), q/k/v/o biases.
    "olmo2": ("olmo2", transformers.Olmo2Config, transformers.Olmo2ForCausalLM,
              {"attention_bias": True, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
    # GLM-4.5: the rotary over half of each head (partial_rotary_factor 0.5 of head_dim 16),
    # q/k/v biases (none on o), per-head q/k norms, DeepSeek-V3's router (sigmoid, groups: 8
    # experts in 4 groups, 2 kept, 2 per token, scaled 2.5) with a shared expert, layer 0 dense.
    "glm4_moe": ("glm4_moe", transformers.Glm4MoeConfig, transformers.Glm4MoeForCausalLM,
                 {"head_dim": 16, "partial_rotary_factor": 0.5, "attention_bias": True,
                  "use_qk_norm": True, "n_routed_experts": 8, "num_experts_per_tok": 2,
                  "n_group": 4, "topk_group": 2, "n_shared_experts": 1,
                  "moe_intermediate_size": 20, "first_k_dense_replace": 1,
                  "routed_scaling_factor": 2.5, "norm_topk_prob": True,
                  "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
    # Llama 4's text model: 3 layers; layers 0 and 2 rotate (llama3 scaling, factor 8 over an
    # original 8) and attend within chunks of 4 tokens (the 11-token input spans three) with
    # the weightless q/k L2 norm; layer 1 is NoPE, attends to everything and tempers its
    # queries (floor_scale 2, attn_scale 0.5: factors 1 to 1.9 over the input); layers 0 and 1
    # a mixture of 4 experts of width 20, 1 per token (the sigmoid weight on its input), and a
    # shared expert of 20; layer 2 dense, 48 wide.
    "llama4": ("llama4_text", transformers.Llama4TextConfig, transformers.Llama4ForCausalLM,
               {"num_hidden_layers": 3, "head_dim": 16, "intermediate_size": 20,
                "intermediate_size_mlp": 48, "num_local_experts": 4, "num_experts_per_tok": 1,
                "moe_layers": [0, 1], "no_rope_layers": [1, 0, 1], "attention_chunk_size": 4,
                "use_qk_norm": True, "attn_temperature_tuning": True, "floor_scale": 2,
                "attn_scale": 0.5,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
                "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
    # Qwen3-Next: 4 layers, 0 and 2 Gated DeltaNet (2 key heads of 8, 4 value heads of 8: q and
    # k repeated, a convolution of 4; the 11-token input one chunk of 64, padded), 1 and 3 full
    # attention (the output gate, q/k norms, a quarter of each 16-wide head rotated); layers
    # 0 to 2 a mixture of 4 experts of 20, 2 per token, renormalised, with a shared expert of
    # 24 and its gate; layer 3 dense (mlp_only_layers), 48 wide.
    "qwen3_next": ("qwen3_next", transformers.Qwen3NextConfig, transformers.Qwen3NextForCausalLM,
                   {"num_hidden_layers": 4, "head_dim": 16, "partial_rotary_factor": 0.25,
                    "layer_types": ["linear_attention", "full_attention", "linear_attention",
                                    "full_attention"],
                    "linear_conv_kernel_dim": 4, "linear_key_head_dim": 8,
                    "linear_value_head_dim": 8, "linear_num_key_heads": 2,
                    "linear_num_value_heads": 4, "num_experts": 4, "num_experts_per_tok": 2,
                    "moe_intermediate_size": 20, "shared_expert_intermediate_size": 24,
                    "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [3],
                    "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}),
}


def split_experts(weights):
    """gpt-oss's stacked experts under memfit's names, one projection each: `gate_up_proj`
    (E, H, 2I) holds gate in its even columns and up in its odd ones (interleaved), `down_proj`
    (E, I, H); memfit's weights are (out, in)."""
    out = {}
    for k, v in weights.items():
        p = k[: k.rfind(".") + 1]
        if k.endswith(".mlp.experts.gate_up_proj"):
            for e in range(v.shape[0]):
                out[f"{p}{e}.gate.weight"] = v[e][:, 0::2].t().contiguous()
                out[f"{p}{e}.up.weight"] = v[e][:, 1::2].t().contiguous()
        elif k.endswith(".mlp.experts.gate_up_proj_bias"):
            for e in range(v.shape[0]):
                out[f"{p}{e}.gate.bias"] = v[e][0::2].contiguous()
                out[f"{p}{e}.up.bias"] = v[e][1::2].contiguous()
        elif k.endswith(".mlp.experts.down_proj"):
            for e in range(v.shape[0]):
                out[f"{p}{e}.down.weight"] = v[e].t().contiguous()
        elif k.endswith(".mlp.experts.down_proj_bias"):
            for e in range(v.shape[0]):
                out[f"{p}{e}.down.bias"] = v[e].contiguous()
        else:
            out[k] = v
    return out


def llama4_tensors(weights, cfg):
    """Llama 4's tensors under memfit's layout: the stacked experts split (`gate_up_proj` (E, H,
    2I) holds gate in its first I columns and up in the last, `chunk(2, dim=-1)`; `down_proj`
    (E, I, H); memfit's weights are (out, in)), and the q and k rows de-interleaved per head:
    transformers rotates pairs (2j, 2j + 1) as complex numbers, memfit the halves (j, D/2 + j),
    the same function of rows so permuted (the scores are dot products over each head: the
    same permutation of q and k leaves them unchanged)."""
    d = cfg.head_dim
    perm = list(range(0, d, 2)) + list(range(1, d, 2))
    out = {}
    for k, v in weights.items():
        p = k[: k.rfind(".") + 1]
        if k.endswith(".mlp.experts.gate_up_proj"):
            i = v.shape[2] // 2
            for e in range(v.shape[0]):
                out[f"{p}{e}.gate.weight"] = v[e][:, :i].t().contiguous()
                out[f"{p}{e}.up.weight"] = v[e][:, i:].t().contiguous()
        elif k.endswith(".mlp.experts.down_proj"):
            for e in range(v.shape[0]):
                out[f"{p}{e}.down.weight"] = v[e].t().contiguous()
        elif k.endswith((".attn.q.weight", ".attn.k.weight")):
            heads = v.shape[0] // d
            rows = [h * d + j for h in range(heads) for j in perm]
            out[k] = v[rows].contiguous()
        else:
            out[k] = v
    return out


def qwen3_next_tensors(weights):
    """Qwen3-Next's linear layers under memfit's layout: the convolution's weight `(C, 1, K)`
    kept `(K, C)`."""
    return {k: (v[:, 0, :].t().contiguous() if k.endswith(".attn.conv") else v)
            for k, v in weights.items()}


def split_fused(weights, cfg):
    """Phi-3's fused projections under memfit's names: `qkv_proj` rows are q (heads·head_dim),
    k then v (kv_heads·head_dim each); `gate_up_proj` rows are gate then up (`chunk(2)`)."""
    d = cfg.hidden_size // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * d, cfg.num_key_value_heads * d
    out = {}
    for k, v in weights.items():
        if k.endswith(".qkv_proj.weight"):
            p = k[: -len("qkv_proj.weight")]
            out[p + "q.weight"], out[p + "k.weight"], out[p + "v.weight"] = (
                t.contiguous() for t in v.split([q, kv, kv], dim=0))
        elif k.endswith(".gate_up_proj.weight"):
            p = k[: -len("gate_up_proj.weight")]
            out[p + "gate.weight"], out[p + "up.weight"] = (t.contiguous() for t in v.chunk(2, dim=0))
        else:
            out[k] = v
    return out


def memfit_name(hf: str, gemma: bool = False) -> str:
    """transformers' parameter name → memfit's variable name."""
    # Routers: Mixtral's block_sparse_moe.gate, Qwen3-MoE's mlp.gate; Mixtral's experts w1
    # (gate), w3 (up), w2 (down).
    # Gemma 3's four norms a block: after the attention, before and after the MLP.
    n = hf.replace(".post_attention_layernorm.", ".ln1_post.") if gemma else hf
    n = n.replace(".pre_feedforward_layernorm.", ".ln2.").replace(".post_feedforward_layernorm.", ".ln2_post.")
    n = n.replace(".block_sparse_moe.gate.", ".mlp.router.").replace(".mlp.gate.", ".mlp.router.")
    n = n.replace(".block_sparse_moe.experts.", ".mlp.experts.")
    # Llama 4's feed-forward part (dense, or router, experts and shared expert).
    n = n.replace(".feed_forward.", ".mlp.")
    # Shared experts: Qwen2-MoE's shared_expert and its gate, DeepSeek's shared_experts.
    n = n.replace(".mlp.shared_expert_gate.", ".mlp.shared_gate.")
    n = n.replace(".mlp.shared_experts.", ".mlp.shared.").replace(".mlp.shared_expert.", ".mlp.shared.")
    # MLA (DeepSeek).
    for a, b in [("q_a_proj", "q_a"), ("q_b_proj", "q_b"), ("q_a_layernorm", "q_a_norm"),
                 ("kv_a_proj_with_mqa", "kv_a"), ("kv_a_layernorm", "kv_a_norm"),
                 ("kv_b_proj", "kv_b")]:
        n = n.replace(f".{a}.", f".{b}.")
    n = n.replace(".w1.", ".gate.").replace(".w3.", ".up.").replace(".w2.", ".down.")
    n = n.replace("model.embed_tokens.", "wte.").replace("model.norm.", "ln_f.").replace("lm_head.", "head.")
    n = n.replace("model.layers.", "h.").replace(".input_layernorm.", ".ln1.")
    n = n.replace(".post_attention_layernorm.", ".ln2.").replace(".self_attn.", ".attn.")
    # Qwen3-Next's Gated DeltaNet.
    n = n.replace(".linear_attn.", ".attn.")
    for a, b in [("in_proj_qkvz.", "qkvz."), ("in_proj_ba.", "ba."), ("conv1d.weight", "conv"),
                 ("A_log", "a_log"), ("out_proj.", "out.")]:
        n = n.replace(f".attn.{a}", f".attn.{b}")
    for a, b in [("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("o_proj", "o"),
                 ("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")]:
        n = n.replace(f".{a}.", f".{b}.")
    return n


def seed(name):
    """Each family's own seed (CRC-32 of its name): a family regenerated alone gets the same
    bytes as in a run over all of them."""
    return zlib.crc32(name.encode())


def memfit_tensors(tensors, cfg, gemma):
    """`tensors` (transformers' names: the weights or their gradients) under memfit's names:
    renamed, Phi-3's fused projections and gpt-oss's stacked experts split (Llama 4's: see
    `llama4_tensors`). DeepSeek-V3's
    e_score_correction_bias is a buffer (zero), kept on memfit's host; a tied head is the
    embedding itself (Gemma 3): not a tensor of its own."""
    renamed = {memfit_name(k, gemma): v.detach().contiguous()
               for k, v in tensors.items()
               if not k.endswith("e_score_correction_bias")
               and not (cfg.tie_word_embeddings and k == "lm_head.weight")}
    if cfg.model_type == "llama4_text":
        return llama4_tensors(renamed, cfg)
    if cfg.model_type == "qwen3_next":
        return qwen3_next_tensors(split_experts(renamed))
    return split_experts(split_fused(renamed, cfg))


def gradients(model, tokens, targets):
    """transformers' gradient of every parameter (a zero one where none reached it: an expert
    no token chose) of the mean cross-entropy of `targets` over all positions, in float64, and
    the float64 logits. Converts `model` to float64."""
    model.double()
    # DeepSeek-V3's and GLM-4.5's experts add their outputs into a buffer of the routing weights'
    # type, float32 whatever the model's, which `index_add_` refuses a float64 output: the
    # weights handed on in the model's type (the sum in float64).
    for m in model.modules():
        if type(m).__name__ in ("DeepseekV3TopkRouter", "Glm4MoeTopkRouter"):
            m.register_forward_hook(lambda _, args, out: (out[0], out[1].to(args[0].dtype)))
    logits = model(tokens).logits
    assert logits.dtype == torch.float64, logits.dtype
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)).backward()
    grads = {k: p.grad if p.grad is not None else torch.zeros_like(p)
             for k, p in model.named_parameters()}
    return grads, logits.detach()


def main():
    only = set(sys.argv[1:])
    for name, (model_type, Cfg, Model, extra) in FAMILIES.items():
        if only and name not in only:
            continue
        torch.manual_seed(seed(name))
        # A None among a family's own values removes COMMON's (Gemma's hidden_act); elsewhere
        # it is the value (DeepSeek-V2's q_lora_rank: no query compression).
        args = {k: v for k, v in {**COMMON, **extra}.items() if v is not None or k not in COMMON}
        cfg = Cfg(**args)
        cfg._attn_implementation = "eager"
        model = Model(cfg).eval()
        with torch.no_grad():
            for n, p in model.named_parameters():  # away from the init's ones and zeros
                p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
                if n.endswith("gate_up_proj"):  # gpt-oss: past its clamps
                    p.mul_(4.0)
                # Qwen3-Next: A = exp(A_log) about 0.14, decays of about 0.8 a token, so the
                # state carries across the input (at A about 2.7 each token forgets nearly all,
                # and float32's gradients drift 1.5e-4 from float64's; here 1.8e-5).
                if n.endswith(".A_log"):
                    p.sub_(3.0)
            tokens = torch.randint(0, cfg.vocab_size, (2, 11))
            logits = model(tokens).logits.float()
        # The targets from a generator of their own: the draws above are as before they existed.
        targets = torch.randint(0, cfg.vocab_size, (2, 11),
                                generator=torch.Generator().manual_seed(seed(name + " targets")))
        out = os.path.join(ROOT, name)
        os.makedirs(out, exist_ok=True)
        conf = {k: v for k, v in json.loads(cfg.to_json_string()).items()}
        conf["_memfit"] = f"made by scripts/make-fixtures.py with transformers {transformers.__version__}, torch {torch.__version__}"
        conf["model_type"] = model_type
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(conf, f, indent=1, sort_keys=True)
        # Gemma 3's and OLMo 2's norm after the attention is memfit's ln1_post.
        gemma = model_type in ("gemma2", "gemma3_text", "olmo2")
        weights = memfit_tensors(model.state_dict(), cfg, gemma)
        save_file(weights, os.path.join(out, "model.safetensors"))
        save_file({"tokens": tokens.to(torch.int64), "logits": logits.contiguous()},
                  os.path.join(out, "io.safetensors"))
        grads, logits64 = gradients(model, tokens, targets)
        grads = memfit_tensors(grads, cfg, gemma)
        assert {k: v.shape for k, v in grads.items()} == {k: v.shape for k, v in weights.items()}, \
            f"{name}: the gradients are not the weights' tensors"
        # The float64 model routes as the float32 one did (a token sent to another expert would
        # move its logits by far more).
        agree = ((logits64 - logits).abs().max() / logits.abs().max()).item()
        # Qwen3-Next's delta rule and gated norm compute in float32 whatever the model's type
        # (`.to(torch.float32)`), so its float64 model agrees to float32's rounding there.
        bound = 1e-4 if model_type == "qwen3_next" else 1e-5
        assert agree < bound, f"{name}: float64 logits {agree:.1e} from float32 ones"
        # Stored in float32 (computed in float64): 6e-8 relative, far inside the test's 1e-4, at
        # half the bytes (the tree travels to the GPU machine whole).
        save_file({"targets": targets.to(torch.int64), **{k: v.float() for k, v in grads.items()}},
                  os.path.join(out, "grads.safetensors"))
        print(name, sorted(weights)[:4], "...", len(weights), "tensors; logits", tuple(logits.shape),
              f"; float64 logits within {agree:.1e}")


if __name__ == "__main__":
    main()
