#!/usr/bin/env python3
"""What PyTorch + transformers' autograd graph saves after a training forward, op by op.

Builds `transformers.AutoModelForCausalLM.from_config` on a config.json (memfit's
workloads/configs/*.json) with `--set FIELD=VALUE` changes and `--layers L` (a slice), in
`--dtype` (f32, bf16, f16: the weights and activations in that type, as `model.to(dtype)`),
SDPA attention (`--attn eager`: transformers' eager attention), runs `model(input_ids=x, labels=x)` at batch `--batch`, sequence `--seq`, and
walks the graph from the loss's `grad_fn` through `next_functions`: every node's `_saved_*`
tensors, counted once per storage (`untyped_storage().data_ptr()`), parameters' storages
excluded. The logits the output holds are counted apart (`logits`), as the model returns them.

With `--autocast` the model stays f32 and the forward runs under `torch.autocast` in
`--dtype` (mixed precision as PyTorch users run it).

CONFIG may instead name a GPT preset of `scripts/torch_reference.py` (tiny, small, gpt2-small,
gpt2-medium): its nanoGPT-style GPT — what memfit's GPT answers for (one-op tanh GELU, separate
q/k/v/o), not transformers' GPT-2 (whose composed `gelu_new` saves four tensors) — with its
written-out attention (`--attn eager`: scores, scale, additive mask, softmax, `P·v`) or
`F.scaled_dot_product_attention` (`--attn sdpa`), and its loss (`F.cross_entropy` of the f32
logits). The reference's mask buffer is excluded as the parameters are (a constant).

With `--per-layer`, the slice is built twice (L and L + 1 layers, same seed) and the difference
per token is printed too: what one more layer keeps per token, by op.

Prints one JSON object: {"total_bytes", "logits_bytes", "by_op": {"Node._saved_x": bytes},
"per_token_per_layer": {...}} (the last with --per-layer).
"""
import argparse, json, sys

import torch
import transformers

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


class Reference:
    """torch_reference.py's GPT as `build` returns a model: `vocab_size` and the loss call."""

    def __init__(self, preset, layers, dtype, attn):
        sys.path.insert(0, __file__.rsplit("/", 1)[0])
        import torch_reference as tr

        tr.SDPA = attn == "sdpa"
        v, h, a, _, smax, tied = tr.PRESETS[preset]
        self.vocab_size = v
        torch.manual_seed(0)
        self.model = tr.GPT(v, h, a, layers, smax, tied).to(dtype).train()

    def __call__(self, input_ids, labels):
        """The reference's `loss_of`: the f32 logits' cross-entropy; the logits not held."""
        logits = self.model(input_ids)
        v = self.vocab_size
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, v), labels.reshape(-1))
        return argparse.Namespace(loss=loss, logits=torch.empty(0))

    def parameters(self):
        return list(self.model.parameters()) + list(self.model.buffers())


REFERENCE_PRESETS = ("tiny", "small", "gpt2-small", "gpt2-medium")


def build(config_path, sets, layers, dtype, attn="sdpa"):
    if config_path in REFERENCE_PRESETS:
        m = Reference(config_path, layers, dtype, attn)
        return m, m
    cfg = transformers.AutoConfig.from_pretrained(config_path)
    for s in sets:
        k, v = s.split("=", 1)
        setattr(cfg, k, json.loads(v))
    cfg.num_hidden_layers = layers
    for key in ("layer_types",):
        lt = getattr(cfg, key, None)
        if isinstance(lt, list):
            setattr(cfg, key, lt[:layers])
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    m = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype, attn_implementation=attn)
    return m.to(dtype).train(), cfg


def saved(model, batch, seq, vocab, autocast=None):
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    x = torch.randint(0, vocab, (batch, seq))
    if autocast is None:
        out = model(input_ids=x, labels=x)
    else:
        with torch.autocast("cpu", dtype=autocast):
            out = model(input_ids=x, labels=x)
    seen, by_op, total = set(), {}, 0
    stack, visited = [out.loss.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in visited:
            continue
        visited.add(node)
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            try:
                val = getattr(node, attr)
            except Exception:
                continue
            vals = val if isinstance(val, (tuple, list)) else [val]
            for t in vals:
                if not isinstance(t, torch.Tensor):
                    continue
                st = t.untyped_storage()
                ptr = st.data_ptr()
                if ptr in params or ptr in seen or st.nbytes() == 0:
                    continue
                seen.add(ptr)
                key = f"{node.name()}.{attr}"
                by_op[key] = by_op.get(key, 0) + st.nbytes()
                total += st.nbytes()
        stack.extend(f for f, _ in node.next_functions)
    logits = out.logits.untyped_storage().nbytes()
    return total, logits, by_op


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=JSON")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--dtype", choices=DTYPES, default="bf16")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--per-layer", action="store_true")
    ap.add_argument("--autocast", action="store_true")
    ap.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    a = ap.parse_args()
    torch.set_grad_enabled(True)
    dt = DTYPES[a.dtype]
    ac = dt if a.autocast else None
    if a.autocast:
        dt = torch.float32
    m, cfg = build(a.config, a.set, a.layers, dt, a.attn)
    total, logits, by_op = saved(m, a.batch, a.seq, cfg.vocab_size, ac)
    res = {"config": a.config, "sets": a.set, "layers": a.layers, "dtype": a.dtype,
           "autocast": a.autocast, "attn": a.attn,
           "batch": a.batch, "seq": a.seq, "total_bytes": total, "logits_bytes": logits,
           "by_op": dict(sorted(by_op.items(), key=lambda kv: -kv[1]))}
    del m
    if a.per_layer:
        m2, _ = build(a.config, a.set, a.layers + 1, dt, a.attn)
        t2, _, ops2 = saved(m2, a.batch, a.seq, cfg.vocab_size, ac)
        tokens = a.batch * a.seq
        res["per_token_per_layer_bytes"] = (t2 - total) / tokens
        res["per_token_per_layer"] = {k: (ops2.get(k, 0) - by_op.get(k, 0)) / tokens
                                      for k in sorted(set(ops2) | set(by_op))
                                      if ops2.get(k, 0) != by_op.get(k, 0)}
    json.dump(res, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
