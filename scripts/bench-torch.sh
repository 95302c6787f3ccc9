#!/usr/bin/env bash
# The same models in memfit (candle; composed and fused kernels) and in PyTorch (eager and
# scaled_dot_product_attention) on this CPU, side by side per phase:
# step time (memfit: the window's wall_s, median over RUNS processes; PyTorch: the median of
# STEPS steps after a warm-up) and memory above the phase's start (memfit: the counting
# allocator; PyTorch: its profiler's memory events). PyTorch is installed on demand into
# $TORCH_VENV (pinned versions; ≈ 7 GB, minutes): never in CI.
#
# CONFIGS: PRESET:BATCH:SEQ[:LAYERS] each. A vit-… preset takes SEQ "-" (its sequence is its
# patches + 1); a LLaMA preset (a workloads/configs/PRESET.json) is built by transformers from
# that config.json, LAYERS blocks of it when given (memfit: --preset PRESET --layers LAYERS).
#
# TRIM: memfit's --trim, off by default here. PyTorch's steps run on a warm heap; memfit's
# default meter hands the freed heap back to the kernel (malloc_trim) before each window for
# its RSS layer, so its window would also pay the page faults of refilling it (BENCHMARKS § 1:
# +12 % of a small window). TRIM=on times the windows as `memfit run` meters them by default.
#
# DTYPE: f32 (the default), bf16 or f16. PyTorch runs in DTYPE; memfit measures bf16's bytes
# with its f16 run (candle's CPU matmul has no bf16; f16 and bf16 are the same bytes in every
# tensor, so the memory columns compare; the times compare f16 kernels with bf16 ones).
#
#   scripts/bench-torch.sh                         # the GPT, ViT and LLaMA configs below, f32
#   CONFIGS="small:4:128" RUNS=1 scripts/bench-torch.sh
#   CONFIGS="small:4:128" DTYPE=bf16 KERNELS=transformers scripts/bench-torch.sh
source "$(dirname "$0")/bench-common.sh"
CONFIGS="${CONFIGS:-small:4:128 gpt2-small:1:128 vit-tiny:8:- vit-b16:2:- smollm2-135m:1:128 tinyllama-1.1b:1:128:2}"
RUNS="${RUNS:-3}"
DTYPE="${DTYPE:-f32}"
case "$DTYPE" in
  f32 | f16) MEMFIT_DTYPE="$DTYPE" ;;
  bf16) MEMFIT_DTYPE=f16 ;;
  *) echo "bench-torch.sh: DTYPE is f32, bf16 or f16, not $DTYPE" >&2; exit 2 ;;
esac
STEPS="${STEPS:-5}"
WORK="${WORK:-$(mktemp -d)}"; mkdir -p "$WORK"
if [[ -n "${CI:-}" ]]; then echo "bench-torch.sh: not in CI (it installs PyTorch)" >&2; exit 0; fi
need_torch
build_bins
PHASES=init,forward,backward,optimizer,train-step,inference
# memfit with each kernel set, PyTorch with each attention (sdpa: its memory-efficient path).
KERNELS="${KERNELS:-composed fused}"
TRIM="${TRIM:-off}"
TORCH_ATTENTION="${TORCH_ATTENTION:-eager sdpa}"
for c in $CONFIGS; do
  IFS=: read -r preset b s layers <<<"$c"
  mf=(--preset "$preset" --batch "$b")
  tr=(--batch "$b")
  [[ "$s" != - ]] && mf+=(--seq "$s") && tr+=(--seq "$s")
  [[ -n "$layers" ]] && mf+=(--layers "$layers") && tr+=(--layers "$layers")
  if [[ -f "$ROOT/workloads/configs/$preset.json" ]]; then
    tr+=(--hf-config "$ROOT/workloads/configs/$preset.json")
  else
    tr+=(--preset "$preset")
  fi
  for k in $KERNELS; do
    for ((i = 0; i < RUNS; i++)); do
      locked "$BIN_DIR/memfit-metered" run "${mf[@]}" --phases "$PHASES" --kernels "$k" \
        --dtype "$MEMFIT_DTYPE" --optimizer adamw --threads "$RAYON_NUM_THREADS" --trim "$TRIM" \
        --out "$WORK/memfit-$c-$k-$i" >"$WORK/memfit-$c-$k-$i.log" 2>&1 ||
        { echo "memfit failed on $c ($k): $WORK/memfit-$c-$k-$i.log" >&2; exit 1; }
    done
  done
  for att in $TORCH_ATTENTION; do
    locked "$TORCH_VENV/bin/python" "$ROOT/scripts/torch_reference.py" "${tr[@]}" --attention "$att" \
      --dtype "$DTYPE" --threads "$RAYON_NUM_THREADS" --steps "$STEPS" >"$WORK/torch-$c-$att.jsonl" 2>"$WORK/torch-$c-$att.err" ||
      { echo "torch_reference failed on $c ($att): $WORK/torch-$c-$att.err" >&2; exit 1; }
  done
done

KERNELS="$KERNELS" TORCH_ATTENTION="$TORCH_ATTENTION" DTYPE="$DTYPE" MEMFIT_DTYPE="$MEMFIT_DTYPE" TRIM="$TRIM" \
  python3 - "$WORK" "$(machine)" $CONFIGS <<'PY'
import glob, json, os, statistics as st, sys
work, machine, configs = sys.argv[1], sys.argv[2], sys.argv[3:]
kernels, atts = os.environ["KERNELS"].split(), os.environ["TORCH_ATTENTION"].split()
dtype, mdtype = os.environ["DTYPE"], os.environ["MEMFIT_DTYPE"]
cols = [f"memfit {k}" for k in kernels] + [f"torch {a}" for a in atts]
types = dtype if dtype == mdtype else f"PyTorch {dtype}, memfit {mdtype} (the same bytes)"
print(f"\n== memfit (candle) vs PyTorch, {types}, CPU ({machine}), memfit --trim {os.environ['TRIM']}: seconds / MiB per phase ==")
print(f"{'config':<22} {'phase':<11} " + " ".join(f"{c:>22}" for c in cols)
      + "".join(f" {k[:5]}/{a[:5]} t× m×" for k in kernels for a in atts))
for c in configs:
    fig = {}  # column -> phase -> (seconds, bytes)
    for k in kernels:
        runs = {}
        for f in glob.glob(os.path.join(work, f"memfit-{c}-{k}-*", "results.jsonl")):
            for l in open(f):
                r = json.loads(l)
                if r["status"] == "ok":
                    runs.setdefault(r["phase"], []).append((r["wall_s"], r["peak_bytes"]))
        fig[f"memfit {k}"] = {p: (st.median(x[0] for x in v), st.median(x[1] for x in v)) for p, v in runs.items()}
    tv = ""
    for a in atts:
        fig[f"torch {a}"] = {}
        for l in open(os.path.join(work, f"torch-{c}-{a}.jsonl")):
            t = json.loads(l); tv = t["torch"]
            fig[f"torch {a}"][t["phase"]] = (t["wall_s"], t["peak_bytes"])
    for ph in ["init", "forward", "backward", "optimizer", "train-step", "inference"]:
        cells = []
        for col in cols:
            s_b = fig[col].get(ph)
            cells.append(f"{s_b[0]:9.4f} s {s_b[1] / 2**20:9.2f}" if s_b and s_b[1] is not None
                         else f"{'-':>22}")
        ratios = ""
        for k in kernels:
            for a in atts:
                m, t = fig[f"memfit {k}"].get(ph), fig[f"torch {a}"].get(ph)
                if m and t and t[0] and t[1]:
                    ratios += f" {m[0] / t[0]:12.2f} {m[1] / t[1]:5.2f}"
                else:
                    ratios += f" {'-':>12} {'-':>5}"
        print(f"{c:<22} {ph:<11} " + " ".join(cells) + ratios)
    n = len(glob.glob(os.path.join(work, f"memfit-{c}-{kernels[0]}-*", "results.jsonl")))
    print(f"{'':<22} (torch {tv}; memfit: median of {n} runs)")
PY
