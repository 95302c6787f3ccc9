#!/usr/bin/env bash
# memfit beside PyTorch, stored for the report: runs workloads/torch-compare.toml (the six
# configs of BENCHMARKS.md § 4, candle's composed ops and memfit's fused kernels) into OUT, then
# scripts/torch_reference.py on the same configs with eager attention and with
# scaled_dot_product_attention, into OUT/torch.jsonl (one JSON line per config, attention and
# phase: wall_s, peak_bytes, retained_bytes, the torch version, params). `memfit report` reads
# torch.jsonl beside the rows and compares per phase (src/report/torch.rs).
#
#   scripts/torch-compare.sh [OUT]     # default results/cpu/torch-compare; ≈ 15 min on 2 cores
#
# PyTorch is installed on demand into $TORCH_VENV (pinned versions; ≈ 7 GB, minutes): never in
# CI. MEMFIT_BIN: the memfit to run (default: target/release/memfit, built here).
source "$(dirname "$0")/bench-common.sh"
OUT="${1:-$ROOT/results/cpu/torch-compare}"
WORKLOAD="${WORKLOAD:-$ROOT/workloads/torch-compare.toml}"
STEPS="${STEPS:-5}"
if [[ -n "${CI:-}" ]]; then echo "torch-compare.sh: not in CI (it installs PyTorch)" >&2; exit 0; fi
need_torch
memfit="${MEMFIT_BIN:-}"
if [[ -z "$memfit" ]]; then
  (cd "$ROOT" && cargo build --release --quiet)
  memfit="$ROOT/target/release/memfit"
fi
locked "$memfit" run "$WORKLOAD" --out "$OUT" --quiet

# The grids' configs as torch_reference.py arguments: a LLaMA preset is built by transformers
# from its workloads/configs/PRESET.json; `layers` keeps that many blocks.
mapfile -t configs < <(python3 - "$WORKLOAD" "$ROOT/workloads/configs" <<'PY'
import os, sys, tomllib
w = tomllib.load(open(sys.argv[1], "rb"))
for g in w["grid"]:
    args = ["--batch", str(g["batch"])]
    if "seq" in g:
        args += ["--seq", str(g["seq"])]
    if "layers" in g:
        args += ["--layers", str(g["layers"])]
    if "hf_config" in g:
        # A slice: the config file with the grid's hf_set changes (paths from the repository).
        args += ["--hf-config", os.path.join(os.path.dirname(sys.argv[2]), "..", g["hf_config"])]
        for s in g.get("hf_set", []):
            args += ["--set", s]
    else:
        cfg = os.path.join(sys.argv[2], g["preset"] + ".json")
        args += ["--hf-config", cfg] if os.path.isfile(cfg) else ["--preset", g["preset"]]
    print(" ".join(args))
PY
)
tmp="$OUT/.torch.jsonl.tmp"
: > "$tmp"
for c in "${configs[@]}"; do
  for att in eager sdpa; do
    # shellcheck disable=SC2086
    locked "$TORCH_VENV/bin/python" "$ROOT/scripts/torch_reference.py" $c --attention "$att" \
      --threads "$RAYON_NUM_THREADS" --steps "$STEPS" >> "$tmp" 2>> "$OUT/torch.err"
  done
done
mv "$tmp" "$OUT/torch.jsonl"
rm -f "$OUT/torch.err"
echo "torch-compare: $(wc -l < "$OUT/torch.jsonl") PyTorch rows and memfit's rows in $OUT"
