#!/usr/bin/env bash
# Each fused op's backward alone, memfit beside PyTorch on this CPU: the bytes it holds beyond
# the gradients it returns, per element of the op's main input (`memfit probe backward`, the
# counting allocator; scripts/torch_op_backward.py, the PyTorch profiler's memory events, the ops
# as transformers runs them). Memory only: one call each, deterministic on a given build.
# PyTorch is installed on demand into $TORCH_VENV (as bench-torch.sh); never in CI.
#
#   scripts/bench-op-backward.sh                  # f32 and f16, the default shapes
#   DTYPES=f32 SHAPE="--rows 4096 --width 2048" scripts/bench-op-backward.sh
source "$(dirname "$0")/bench-common.sh"
TORCH_VENV="${TORCH_VENV:-$HOME/.cache/memfit/torch-venv}"
TORCH_VERSION="${TORCH_VERSION:-2.9.1}"
TRANSFORMERS_VERSION="${TRANSFORMERS_VERSION:-4.57.1}"
DTYPES="${DTYPES:-f32 f16}"
SHAPE="${SHAPE:-}"
if [[ -n "${CI:-}" ]]; then echo "bench-op-backward.sh: not in CI (it installs PyTorch)" >&2; exit 0; fi
if ! "$TORCH_VENV/bin/python" -c "import torch" 2>/dev/null; then
  python3 -m venv "$TORCH_VENV"
  "$TORCH_VENV/bin/pip" install -q "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION"
fi
build_bins
echo "== op backward: bytes held beyond the gradients, per element ($(machine))"
echo "| op | dtype | elements | memfit B/elem | PyTorch B/elem | PyTorch op |"
echo "|---|---|---:|---:|---:|---|"
for dt in $DTYPES; do
  # shellcheck disable=SC2086
  m="$("$BIN_DIR/memfit-metered" probe backward --json --threads "$RAYON_NUM_THREADS" --dtype "$dt" $SHAPE)"
  # shellcheck disable=SC2086
  t="$(locked "$TORCH_VENV/bin/python" "$ROOT/scripts/torch_op_backward.py" --threads "$RAYON_NUM_THREADS" --dtype "$dt" $SHAPE 2>/dev/null)"
  python3 - "$m" "$t" <<'PY'
import json, sys
mem = {d["op"]: d for d in map(json.loads, sys.argv[1].splitlines())}
tor = {d["op"]: d for d in map(json.loads, sys.argv[2].splitlines())}
# memfit's efficient attention beside PyTorch's SDPA (both per element of q).
pairs = {"efficient-attention": "sdpa"}
for op, m in mem.items():
    t = tor.get(pairs.get(op, op))
    f = lambda d: "—" if d is None or d["temporary_bytes_per_element"] is None else f'{d["temporary_bytes_per_element"]:.2f}'
    print(f'| {op} | {m["dtype"]} | {m["elements"]} | {f(m)} | {f(t)} | {t["op"] if t else "—"} |')
PY
done
