#!/usr/bin/env python3
"""Reference fixtures for tests/reference.rs: tiny models built by transformers, their weights
(renamed to memfit's variable names) and their logits for a fixed input, so that CI checks that
memfit's models compute the same function as the reference implementations without PyTorch.

Run with the bench venv (scripts/bench-torch.sh installs it), from the repository root:
    ~/.cache/memfit/torch-venv/bin/python scripts/make-fixtures.py
Writes tests/fixtures/<family>/{config.json, model.safetensors, io.safetensors}: config.json
is the Hugging Face config memfit reads (`--hf-config`), model.safetensors the weights under
memfit's names (f32), io.safetensors the input tokens (u32 as i64 → stored as `tokens` i64) and
transformers' logits (`logits`, f32, (B, S, V)).
"""
import json, os, sys

import torch
from safetensors.torch import save_file
import transformers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")

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
}


def memfit_name(hf: str) -> str:
    """transformers' parameter name → memfit's variable name."""
    # Routers: Mixtral's block_sparse_moe.gate, Qwen3-MoE's mlp.gate; Mixtral's experts w1
    # (gate), w3 (up), w2 (down).
    n = hf.replace(".block_sparse_moe.gate.", ".mlp.router.").replace(".mlp.gate.", ".mlp.router.")
    n = n.replace(".block_sparse_moe.experts.", ".mlp.experts.")
    n = n.replace(".w1.", ".gate.").replace(".w3.", ".up.").replace(".w2.", ".down.")
    n = n.replace("model.embed_tokens.", "wte.").replace("model.norm.", "ln_f.").replace("lm_head.", "head.")
    n = n.replace("model.layers.", "h.").replace(".input_layernorm.", ".ln1.")
    n = n.replace(".post_attention_layernorm.", ".ln2.").replace(".self_attn.", ".attn.")
    for a, b in [("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("o_proj", "o"),
                 ("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")]:
        n = n.replace(f".{a}.", f".{b}.")
    return n


def main():
    torch.manual_seed(0)
    for name, (model_type, Cfg, Model, extra) in FAMILIES.items():
        cfg = Cfg(**COMMON, **extra)
        cfg._attn_implementation = "eager"
        model = Model(cfg).eval()
        with torch.no_grad():
            for p in model.parameters():  # away from the init's ones and zeros
                p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
            tokens = torch.randint(0, cfg.vocab_size, (2, 11))
            logits = model(tokens).logits.float()
        out = os.path.join(ROOT, name)
        os.makedirs(out, exist_ok=True)
        conf = {k: v for k, v in json.loads(cfg.to_json_string()).items()}
        conf["_memfit"] = f"made by scripts/make-fixtures.py with transformers {transformers.__version__}, torch {torch.__version__}"
        conf["model_type"] = model_type
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(conf, f, indent=1, sort_keys=True)
        weights = {memfit_name(k): v.detach().contiguous() for k, v in model.state_dict().items()}
        save_file(weights, os.path.join(out, "model.safetensors"))
        save_file({"tokens": tokens.to(torch.int64), "logits": logits.contiguous()},
                  os.path.join(out, "io.safetensors"))
        print(name, sorted(weights)[:4], "...", len(weights), "tensors; logits", tuple(logits.shape))


if __name__ == "__main__":
    main()
