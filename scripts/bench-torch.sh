#!/usr/bin/env bash
# The same GPT in memfit (candle) and in PyTorch eager on this CPU, side by side per phase:
# step time (memfit: the window's wall_s, median over RUNS processes; PyTorch: the median of
# STEPS steps after a warm-up) and memory above the phase's start (memfit: the counting
# allocator; PyTorch: its profiler's memory events). PyTorch is installed on demand into
# $TORCH_VENV (pinned versions; ≈ 7 GB, minutes): never in CI.
#
# CONFIGS: PRESET:BATCH:SEQ[:LAYERS] each. A vit-… preset takes SEQ "-" (its sequence is its
# patches + 1); a LLaMA preset (a workloads/configs/PRESET.json) is built by transformers from
# that config.json, LAYERS blocks of it when given (memfit: --preset PRESET --layers LAYERS).
#
#   scripts/bench-torch.sh                         # the GPT, ViT and LLaMA configs below, f32
#   CONFIGS="small:4:128" RUNS=1 scripts/bench-torch.sh
source "$(dirname "$0")/bench-common.sh"
TORCH_VENV="${TORCH_VENV:-$HOME/.cache/memfit/torch-venv}"
TORCH_VERSION="${TORCH_VERSION:-2.9.1}"
TRANSFORMERS_VERSION="${TRANSFORMERS_VERSION:-4.57.1}"
CONFIGS="${CONFIGS:-small:4:128 gpt2-small:1:128 vit-tiny:8:- vit-b16:2:- smollm2-135m:1:128 tinyllama-1.1b:1:128:2}"
RUNS="${RUNS:-3}"
STEPS="${STEPS:-5}"
WORK="${WORK:-$(mktemp -d)}"; mkdir -p "$WORK"
if [[ -n "${CI:-}" ]]; then echo "bench-torch.sh: not in CI (it installs PyTorch)" >&2; exit 0; fi
if ! "$TORCH_VENV/bin/python" -c "import torch, transformers" 2>/dev/null; then
  python3 -m venv "$TORCH_VENV"
  "$TORCH_VENV/bin/pip" install -q "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION"
fi
build_bins
PHASES=init,forward,backward,optimizer,train-step,inference
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
  for ((i = 0; i < RUNS; i++)); do
    locked "$BIN_DIR/memfit-metered" run "${mf[@]}" --phases "$PHASES" \
      --optimizer adamw --threads "$RAYON_NUM_THREADS" --out "$WORK/memfit-$c-$i" >"$WORK/memfit-$c-$i.log" 2>&1 ||
      { echo "memfit failed on $c: $WORK/memfit-$c-$i.log" >&2; exit 1; }
  done
  locked "$TORCH_VENV/bin/python" "$ROOT/scripts/torch_reference.py" "${tr[@]}" \
    --threads "$RAYON_NUM_THREADS" --steps "$STEPS" >"$WORK/torch-$c.jsonl" 2>"$WORK/torch-$c.err" ||
    { echo "torch_reference failed on $c: $WORK/torch-$c.err" >&2; exit 1; }
done

python3 - "$WORK" "$(machine)" $CONFIGS <<'PY'
import glob, json, os, statistics as st, sys
work, machine, configs = sys.argv[1], sys.argv[2], sys.argv[3:]
print(f"\n== candle (memfit) vs PyTorch eager, f32, CPU ({machine}) ==")
print(f"{'config':<18} {'phase':<11} {'memfit s':>9} {'torch s':>9} {'time ×':>7} {'memfit MiB':>11} {'torch MiB':>10} {'mem ×':>7}")
for c in configs:
    mf = {}
    for f in glob.glob(os.path.join(work, f"memfit-{c}-*", "results.jsonl")):
        for l in open(f):
            r = json.loads(l)
            if r["status"] == "ok":
                mf.setdefault(r["phase"], []).append((r["wall_s"], r["peak_bytes"]))
    tv = ""
    for l in open(os.path.join(work, f"torch-{c}.jsonl")):
        t = json.loads(l); tv = t["torch"]
        m = mf.get(t["phase"])
        if not m: continue
        mw, mp = st.median(x[0] for x in m), st.median(x[1] for x in m)
        tp = t["peak_bytes"]
        ratio_m = f"{mp / tp:7.2f}" if tp else f"{'-':>7}"
        tps = f"{tp / 2**20:10.2f}" if tp is not None else f"{'-':>10}"
        print(f"{c:<18} {t['phase']:<11} {mw:9.4f} {t['wall_s']:9.4f} {mw / t['wall_s']:7.2f} {mp / 2**20:11.2f} {tps} {ratio_m}")
    print(f"{'':<18} (torch {tv}; memfit: median of {len(mf.get('forward', []))} runs)")
PY
