#!/usr/bin/env bash
# What a training forward keeps for the backward, per token per layer, in PyTorch + transformers
# (scripts/torch_saved.py: every autograd node's saved tensors, once per storage, parameters
# excluded) and in `memfit predict` (its graph), side by side: a two-layer slice less a
# one-layer one over B·S, at the configs' real widths. PyTorch runs on this CPU in DTYPE (its
# bf16 matmuls run here); memfit answers for the CPU (f16: the CPU's 16-bit type, the same
# bytes) and for cuda:0 in DTYPE, with each kernel set of KERNELS. PyTorch is installed on
# demand into $TORCH_VENV (pinned versions): never in CI. BENCHMARKS.md § 4 quotes its table.
#
# SLICES: CONFIG[+FIELD=JSON…] each (a workloads/configs/CONFIG.json; `+` adds an --hf-set).
#
#   scripts/bench-saved.sh                                   # the five slices, bf16, S 512
#   SLICES="llama-3-8b+vocab_size=32000" DTYPE=f32 scripts/bench-saved.sh
source "$(dirname "$0")/bench-common.sh"
SLICES="${SLICES:-llama-3-8b+vocab_size=32000 qwen3-30b-a3b deepseek-v2-lite gemma-3-1b}"
DTYPE="${DTYPE:-bf16}"
SEQ="${SEQ:-512}"
KERNELS="${KERNELS:-transformers fused}"
WORK="${WORK:-$(mktemp -d)}"; mkdir -p "$WORK"
if [[ -n "${CI:-}" ]]; then echo "bench-saved.sh: not in CI (it installs PyTorch)" >&2; exit 0; fi
need_torch
build_bins
cpu_dtype="$DTYPE"; [[ "$DTYPE" == bf16 ]] && cpu_dtype=f16
graph() {  # graph bytes of `memfit predict ARGS`
  "$BIN_DIR/memfit-metered" predict "$@" --batch 1 --seq "$SEQ" --phases forward --json |
    python3 -c "import json, sys; print(json.loads(sys.stdin.readline())['graph_bytes'])"
}
for slice in $SLICES; do
  IFS=+ read -r config sets <<<"$slice"
  json="$ROOT/workloads/configs/$config.json"
  tset=(); mset=()
  for s in ${sets//+/ }; do tset+=(--set "$s"); mset+=(--hf-set "$s"); done
  locked "$TORCH_VENV/bin/python" "$ROOT/scripts/torch_saved.py" "$json" "${tset[@]}" --layers 1 \
    --seq "$SEQ" --dtype "$DTYPE" --per-layer >"$WORK/$slice.torch.json" 2>"$WORK/$slice.err" ||
    { echo "torch_saved failed on $slice: $WORK/$slice.err" >&2; exit 1; }
  for k in $KERNELS; do
    for dev in "cpu $cpu_dtype" "cuda:0 $DTYPE"; do
      read -r d t <<<"$dev"
      args=(--hf-config "$json" "${mset[@]}" --device "$d" --dtype "$t" --kernels "$k")
      echo "$k $d $(graph "${args[@]}" --layers 1) $(graph "${args[@]}" --layers 2)"
    done
  done >"$WORK/$slice.memfit"
done
python3 - "$WORK" "$SEQ" "$(machine)" $SLICES <<'PY'
import json, sys
work, seq, machine, slices = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
print(f"\n== saved for the backward, bytes per token per layer, B 1 S {seq} (PyTorch on {machine}) ==")
print(f"{'slice':<34} {'PyTorch':>10} {'memfit kernels device':>28} {'memfit':>10} {'×':>7}")
for s in slices:
    t = json.load(open(f"{work}/{s}.torch.json"))
    torch = t["per_token_per_layer_bytes"]
    print(f"{s:<34} {torch:>10,.0f}")
    for line in open(f"{work}/{s}.memfit"):
        k, d, one, two = line.split()
        per = (int(two) - int(one)) / seq
        print(f"{'':<34} {'':>10} {k + ' ' + d:>28} {per:>10,.0f} {per / torch:>7.3f}")
    for op, b in sorted(t["per_token_per_layer"].items(), key=lambda kv: -kv[1]):
        print(f"{'':<4}{op:<50} {b:>10,.0f}")
PY
