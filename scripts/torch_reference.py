#!/usr/bin/env python3
"""The same models as memfit's, in PyTorch eager: per phase step time and memory.

GPT: memfit's decoder (token + position embedding, pre-LayerNorm blocks with separate q/k/v/o
Linears with bias, causal softmax attention written out (scores, mask, softmax), 4H MLP with
tanh-GELU, final LayerNorm, head without bias — tied to the token table for the gpt2-* presets,
as GPT-2's and memfit's are, untied for tiny and small —, cross-entropy, AdamW) — the same
parameter count as memfit's. ViT: memfit's encoder (patches unfolded and projected by a Linear with bias,
a class token, learned positions, the same pre-LayerNorm blocks without the causal mask, final
LayerNorm, a classifier with bias on the class token, cross-entropy over the classes). LLaMA
family (Llama, Qwen3-MoE, Mixtral, …): `transformers.AutoModelForCausalLM.from_config` on a
`config.json` (memfit's workloads/configs/*.json) with `--set FIELD=VALUE` changes (a slice, as
memfit's `hf_set`), optionally with fewer layers. Attention: `--attention eager` (written
out; transformers' eager) or `sdpa` (`F.scaled_dot_product_attention`: PyTorch's
memory-efficient path; transformers' sdpa).

Phases as memfit's: init (build the model), forward (training forward to the loss), backward,
optimizer (AdamW created + first step), train-step (a steady-state step: forward, backward,
step), inference (no-grad forward). Time: the median of --steps runs of each phase after one
warm-up, every phase timed before any memory run: on the CPU the profiler's memory events
(profile_memory=True) stay costly after the profiled run ends (GPT small B4 S128's eager train
step: 1.07 s median timed after them, 0.07 s before), so no time is taken after one. Memory,
per phase, the bytes above the phase's start: on CUDA `torch.cuda.max_memory_allocated` after
`reset_peak_memory_stats`; on the CPU the running sum of the PyTorch profiler's memory events in
one extra profiled run per phase; init's by building a second model under the meter.

Prints one JSON line per phase (`{"phase":…, "wall_s":…, "peak_bytes":…, "retained_bytes":…}`:
retained is what the phase still holds at its end, e.g. the forward's saved tensors) and a table
on stderr.
"""
import argparse, json, math, statistics, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {  # V, H, A, L, S_max, tied head as memfit's presets
    "tiny": (300, 96, 3, 2, 128, False),
    "small": (2048, 256, 4, 4, 256, False),
    "gpt2-small": (50257, 768, 12, 12, 1024, True),
    "gpt2-medium": (50257, 1024, 16, 24, 1024, True),
}
VIT_PRESETS = {  # image, patch, channels, classes, H, A, L as memfit's vit presets
    "vit-tiny": (32, 8, 3, 10, 96, 3, 2),
    "vit-s16": (224, 16, 3, 1000, 384, 6, 12),
    "vit-b16": (224, 16, 3, 1000, 768, 12, 12),
    "vit-l16": (224, 16, 3, 1000, 1024, 16, 24),
}


SDPA = False  # --attention sdpa: F.scaled_dot_product_attention instead of the written-out scores


class Block(nn.Module):
    def __init__(s, h, a, smax, causal=True):
        super().__init__()
        s.a, s.causal = a, causal
        s.ln1, s.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        s.q, s.k, s.v, s.o = (nn.Linear(h, h) for _ in range(4))
        s.fc1, s.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)
        if causal:
            s.register_buffer("mask", torch.triu(torch.full((smax, smax), float("-inf")), 1), persistent=False)

    def forward(s, x):
        b, t, h = x.shape
        y = s.ln1(x)
        split = lambda z: z.view(b, t, s.a, h // s.a).transpose(1, 2)
        q, k, v = split(s.q(y)), split(s.k(y)), split(s.v(y))
        if SDPA:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=s.causal).transpose(1, 2).reshape(b, t, h)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(h // s.a))
            if s.causal:
                att = att + s.mask[:t, :t]
            y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, h)
        x = x + s.o(y)
        return x + s.fc2(F.gelu(s.fc1(s.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(s, v, h, a, l, smax, tied=False):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(v, h), nn.Embedding(smax, h)
        s.h = nn.ModuleList(Block(h, a, smax) for _ in range(l))
        s.ln_f = nn.LayerNorm(h)
        s.head = nn.Linear(h, v, bias=False)
        if tied:
            s.head.weight = s.wte.weight

    def forward(s, idx):
        x = s.wte(idx) + s.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in s.h:
            x = blk(x)
        return s.head(s.ln_f(x))


class ViT(nn.Module):
    def __init__(s, image, patch, channels, classes, h, a, l):
        super().__init__()
        s.p, n = patch, (image // patch) ** 2
        s.patch = nn.Linear(channels * patch * patch, h)
        s.cls = nn.Parameter(torch.zeros(1, 1, h))
        s.wpe = nn.Parameter(torch.zeros(1, n + 1, h))
        s.h = nn.ModuleList(Block(h, a, n + 1, causal=False) for _ in range(l))
        s.ln_f = nn.LayerNorm(h)
        s.head = nn.Linear(h, classes)

    def forward(s, img):
        b, c, i, _ = img.shape
        g = i // s.p  # (B, C, I, I) -> (B, N, C·p²), channel-major patches as memfit's patchify
        x = img.reshape(b, c, g, s.p, g, s.p).permute(0, 2, 4, 1, 3, 5).reshape(b, g * g, c * s.p * s.p)
        x = torch.cat([s.cls.expand(b, -1, -1), s.patch(x)], 1) + s.wpe
        for blk in s.h:
            x = blk(x)
        return s.head(s.ln_f(x[:, :1]))  # (B, 1, classes), as memfit's


def build(args, dev, dtype):
    if args.hf_config:
        import transformers

        d = json.load(open(args.hf_config))
        d.pop("_memfit", None)
        for s in args.set:  # FIELD=VALUE, the value as JSON else a string (as memfit's hf_set)
            k, v = s.split("=", 1)
            try:
                d[k] = json.loads(v)
            except json.JSONDecodeError:
                d[k] = v
        if args.layers:
            d["num_hidden_layers"] = args.layers
        cfg = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
        cfg._attn_implementation = "sdpa" if SDPA else "eager"
        m = transformers.AutoModelForCausalLM.from_config(cfg).to(device=dev, dtype=dtype)
        return m, cfg.vocab_size, lambda idx: m(input_ids=idx).logits
    if args.preset in VIT_PRESETS:
        image, patch, c, k, h, a, l = VIT_PRESETS[args.preset]
        m = ViT(image, patch, c, k, h, a, args.layers or l).to(device=dev, dtype=dtype)
        return m, k, m
    v, h, a, l, smax, tied = PRESETS[args.preset]
    m = GPT(v, h, a, args.layers or l, smax, tied).to(device=dev, dtype=dtype)
    return m, v, m


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="small", choices=sorted(PRESETS) + sorted(VIT_PRESETS))
    p.add_argument("--hf-config", help="a LLaMA-family config.json (transformers.LlamaConfig)")
    p.add_argument("--layers", type=int, default=0, help="override the layer count")
    p.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="change a --hf-config field before the model is built (repeatable)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--dtype", default="f32", choices=["f32", "f16", "bf16"])
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--attention", default="eager", choices=["eager", "sdpa"],
                   help="attention written out (scores, mask, softmax) or scaled_dot_product_attention")
    global SDPA
    a = p.parse_args()
    SDPA = a.attention == "sdpa"
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    dtype = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[a.dtype]
    cuda = dev.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(dev)) if cuda else (lambda: None)

    # Memory above the phase's start: CUDA's peak counter, or the CPU profiler's memory events.
    def measure(fn):
        """(fn's result, peak bytes above the start, bytes still held at the end)."""
        if cuda:
            sync(); torch.cuda.reset_peak_memory_stats(dev); base = torch.cuda.memory_allocated(dev)
            out = fn(); sync()
            return out, torch.cuda.max_memory_allocated(dev) - base, torch.cuda.memory_allocated(dev) - base
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            out = fn()
        # The raw (kineto) memory events: every allocation (+bytes) and free (-bytes) in order.
        ev = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
        cur = peak = 0
        for e in ev:
            cur += e.nbytes()
            peak = max(peak, cur)
        return out, (peak if ev else None), (cur if ev else None)

    def timed(fn, setup=lambda: None, n=a.steps):
        ts = []
        for _ in range(n):
            st = setup(); sync(); t0 = time.perf_counter(); fn(st); sync(); ts.append(time.perf_counter() - t0)
        return statistics.median(ts), min(ts), max(ts)

    t0 = time.perf_counter()
    model, vocab, fwd = build(a, dev, dtype)
    init_s = time.perf_counter() - t0
    params = sum(x.numel() for x in model.parameters())
    seq = a.seq
    if a.preset in VIT_PRESETS and not a.hf_config:
        image, patch, c = VIT_PRESETS[a.preset][:3]
        seq = (image // patch) ** 2 + 1  # patches + the class token
        idx = torch.rand(a.batch, c, image, image, device=dev, dtype=dtype) * 2 - 1
        tgt = torch.randint(0, vocab, (a.batch, 1), device=dev)
    else:
        idx = torch.randint(0, vocab, (a.batch, a.seq), device=dev)
        tgt = torch.randint(0, vocab, (a.batch, a.seq), device=dev)
    loss_of = lambda: F.cross_entropy(fwd(idx).float().reshape(-1, vocab), tgt.reshape(-1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(_=None):
        opt.zero_grad(set_to_none=True)
        loss_of().backward()
        opt.step()

    def fresh_loss():
        opt.zero_grad(set_to_none=True)
        return loss_of()

    def grads():
        opt.zero_grad(set_to_none=True); loss_of().backward()

    # optimizer: memfit's window creates AdamW and takes its first step.
    def first_step(_):
        o = torch.optim.AdamW(model.parameters(), lr=1e-4); o.step()

    step(); step()  # warm-up (and the optimizer's state exists from here on)
    # 1. Every time first, before any profiled run.
    times = {"init": (init_s, init_s, init_s)}
    times["forward"] = timed(lambda _: loss_of())
    times["backward"] = timed(lambda l: l.backward(), fresh_loss)
    times["optimizer"] = timed(first_step, grads)
    opt.zero_grad(set_to_none=True)
    times["train-step"] = timed(step)
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        times["inference"] = timed(lambda _: fwd(idx))
    # 2. Memory, in the same states.
    mem = {"forward": measure(loss_of)[1:]}
    l = fresh_loss()
    mem["backward"] = measure(lambda: l.backward())[1:]
    del l
    grads()
    mem["optimizer"] = measure(lambda: first_step(None))[1:]
    # From a state without gradients, as memfit's train-step window starts (candle's gradient
    # store goes with the step); with the last step's .grad still allocated the window would
    # free them inside and read less (GPT-2 small eager: 707 MiB against 916).
    opt.zero_grad(set_to_none=True)
    mem["train-step"] = measure(step)[1:]
    opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        mem["inference"] = measure(lambda: fwd(idx))[1:]
    # init: a second model built under the meter (the same bytes as the first), then dropped.
    (twin, _, _), init_peak, init_kept = measure(lambda: build(a, dev, dtype))
    del twin
    mem["init"] = (init_peak, init_kept)
    res = {ph: (times[ph], mem[ph]) for ph in times}
    cpu_model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown")
    meta = {"torch": torch.__version__, "time_method": "timed before any profiled run", "cpu_model": cpu_model, "attention": a.attention, "device": str(dev), "dtype": a.dtype, "threads": torch.get_num_threads(),
            "params": params, "batch": a.batch, "seq": seq, "model": a.hf_config or a.preset, "layers": a.layers or None}
    print(f"{'phase':<11} {'wall_s median':>13} {'[min–max]':>18} {'peak MiB':>10}   ({meta})", file=sys.stderr)
    for ph, ((med, lo, hi), (pk, kept)) in res.items():
        print(json.dumps({"phase": ph, "wall_s": med, "wall_min_s": lo, "wall_max_s": hi, "peak_bytes": pk,
                          "retained_bytes": kept, **meta}))
        pks = f"{pk / 2**20:10.2f}" if pk is not None else f"{'-':>10}"
        print(f"{ph:<11} {med:13.4f} [{lo:.4f}–{hi:.4f}] {pks}", file=sys.stderr)


if __name__ == "__main__":
    main()
