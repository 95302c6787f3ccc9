#!/usr/bin/env python3
"""The fused ops' backward passes as a PyTorch user runs them, alone, on the CPU: what each
holds beyond the gradients it returns, beside `memfit probe backward` (the same ops, shapes and
elements; see src/cmd/probe_backward.rs). One JSON object per op on stdout.

Each op's inputs are made and its forward run before the window (with `requires_grad`); the
window is one `torch.autograd.grad(y, inputs, g, retain_graph=True)` (saved tensors stay, as
memfit's probe keeps its args), measured with the PyTorch profiler's raw memory events (every
allocation and free in order; the running sum's maximum above the window's start). What each
op is, as transformers runs it:
  layer-norm     F.layer_norm (one ATen kernel each way)
  rms-norm       transformers' LlamaRMSNorm (f32 upcast, pow, mean, rsqrt, weight)
  gelu           F.gelu(approximate="tanh")
  silu-mul       F.silu(gate) * up (the MLP's act_fn(gate_proj(x)) * up_proj(x))
  rotary         q * cos + rotate_half(q) * sin (apply_rotary_pos_emb; cos, sin (S, D))
  cross-entropy  F.cross_entropy(logits, targets)
  attn-probs     softmax(q·kᵀ·scale + causal mask, dim=-1, dtype=float32).to(q.dtype) (eager)
  sdpa           F.scaled_dot_product_attention(q, k, v, is_causal=True) (beside memfit's
                 efficient-attention)
"""
import argparse
import json

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

OPS = ["layer-norm", "rms-norm", "gelu", "silu-mul", "rotary", "cross-entropy", "attn-probs", "sdpa"]


def measure(fn):
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn()
    ev = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                key=lambda e: e.start_ns())
    cur = peak = 0
    for e in ev:
        cur += e.nbytes()
        peak = max(peak, cur)
    return out, (peak if ev else None)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def build(op, a, dt):
    r = lambda *s: torch.randn(*s, dtype=dt).requires_grad_(True)
    n, w, h, s, d = a.rows, a.width, a.heads, a.seq, a.head_dim
    if op == "layer-norm":
        ins = [r(n, w), r(w), r(w)]
        return ins, F.layer_norm(ins[0], (w,), ins[1], ins[2], 1e-5), n * w
    if op == "rms-norm":
        ins = [r(n, w), r(w)]
        x = ins[0].to(torch.float32)
        var = x.pow(2).mean(-1, keepdim=True)
        y = ins[1] * (x * torch.rsqrt(var + 1e-5)).to(dt)
        return ins, y, n * w
    if op == "gelu":
        ins = [r(n, w)]
        return ins, F.gelu(ins[0], approximate="tanh"), n * w
    if op == "silu-mul":
        ins = [r(n, w), r(n, w)]
        return ins, F.silu(ins[0]) * ins[1], n * w
    if op == "rotary":
        ins = [r(1, h, s, d)]
        cos, sin = torch.randn(s, d, dtype=dt), torch.randn(s, d, dtype=dt)
        return ins, ins[0] * cos + rotate_half(ins[0]) * sin, h * s * d
    if op == "cross-entropy":
        ins = [r(n, w)]
        t = torch.arange(n) * 7919 % w
        return ins, F.cross_entropy(ins[0], t), n * w
    if op == "attn-probs":
        ins = [r(1, h, s, d), r(1, h, s, d)]
        mask = torch.full((s, s), float("-inf"), dtype=dt).triu(1)
        sc = ins[0] @ ins[1].transpose(-1, -2) * d ** -0.5 + mask
        return ins, F.softmax(sc, dim=-1, dtype=torch.float32).to(dt), h * s * s
    if op == "sdpa":
        ins = [r(1, h, s, d), r(1, h, s, d), r(1, h, s, d)]
        return ins, F.scaled_dot_product_attention(*ins, is_causal=True), h * s * d
    raise SystemExit(f"unknown op {op}: one of {', '.join(OPS)}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--op", action="append", default=[])
    p.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
    p.add_argument("--rows", type=int, default=2048)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    for op in a.op or OPS:
        # One warm-up call of the same backward (lazy initialisation outside the window).
        ins, y, _ = build(op, a, dt)
        torch.autograd.grad(y, ins, torch.randn_like(y), retain_graph=True)
        ins, y, elements = build(op, a, dt)
        g = torch.randn_like(y)
        grads, peak = measure(lambda: torch.autograd.grad(y, ins, g, retain_graph=True))
        gb = sum(x.numel() * x.element_size() for x in grads)
        tmp = None if peak is None else peak - gb
        print(json.dumps({
            "op": op, "dtype": a.dtype, "threads": a.threads, "torch": torch.__version__,
            "elements": elements, "peak_bytes": peak, "gradient_bytes": gb,
            "temporary_bytes": tmp,
            "temporary_bytes_per_element": None if tmp is None else tmp / elements,
        }))


if __name__ == "__main__":
    main()
