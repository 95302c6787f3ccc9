#!/usr/bin/env bash
# memfit's own speed: the embedded default sweep end to end; cases per minute of a sweep of
# tiny cases (each case its own process); `predict` latency for LLaMA-2-70B at B 8 × S 8192 over
# every variant the grid allows; the replay's cost vs layers and vs S (log–log SVG).
#
#   scripts/bench-speed.sh                  # default sweep + 1,000 tiny cases + predict
#   DEFAULT_SWEEP=0 TINY_B=2 scripts/bench-speed.sh   # 200 tiny cases, no default sweep (quick)
source "$(dirname "$0")/bench-common.sh"
WORK="${WORK:-$(mktemp -d)}"; mkdir -p "$WORK"
DEFAULT_SWEEP="${DEFAULT_SWEEP:-1}"
TINY_B="${TINY_B:-10}"      # batches 1..TINY_B × TINY_SEQS sequence lengths
TINY_SEQS="${TINY_SEQS:-100}"
# The predict latency case (the largest preset by default) and the scaling series' preset.
PREDICT_PRESET="${PREDICT_PRESET:-llama-2-70b}"
PREDICT_B="${PREDICT_B:-8}"
PREDICT_S="${PREDICT_S:-8192}"
SCALING="${SCALING:-1}"
build_bins
BIN="$BIN_DIR/memfit-metered"
T="$RAYON_NUM_THREADS"
timed() { # timed NAME CMD… : wall seconds into $WORK/NAME.s
  local name="$1" t0 t1; shift
  timed_locked "$WORK/$name.t" "$@" >"$WORK/$name.log" 2>&1
  read -r t0 t1 <"$WORK/$name.t"
  python3 -c "print($t1 - $t0)" >"$WORK/$name.s"
}
if [[ "$DEFAULT_SWEEP" == 1 ]]; then
  timed default "$BIN" run --threads "$T" --out "$WORK/default"
fi
timed tiny "$BIN" run --preset tiny --batch "$(seq -s, 1 "$TINY_B")" --seq "$(seq -s, 8 $((7 + TINY_SEQS)))" \
  --phases inference --threads "$T" --out "$WORK/tiny"

# predict: every variant of LLaMA-2-70B at B 8 × S 8192 that the workload rules accept.
cat >"$WORK/predict-70b.toml" <<TOML
[defaults]
preset = "$PREDICT_PRESET"
batch = $PREDICT_B
seq = $PREDICT_S
max_seq = $((PREDICT_S + 16))  # S + the 16 decode tokens
phases = ["init", "forward", "backward", "optimizer", "train-step", "inference", "prefill", "decode", "load"]
[[grid]]  # f32: checkpointing, memory-efficient attention, three optimizers
dtype = "f32"
precision = "pure"
checkpoint = [0, 1]
attention = ["standard", "efficient"]
optimizer = ["sgd", "adamw", "adamw-8bit"]
[[grid]]  # mixed precision
dtype = "f16"
precision = "mixed"
optimizer = ["sgd", "adamw", "adamw-8bit"]
[[grid]]  # LoRA and QLoRA
dtype = "f32"
lora_rank = 16
lora_base = ["detach", "op", "q4_0", "q8_0"]
TOML
timed predict70b "$BIN" predict "$WORK/predict-70b.toml" --json

# The replay's cost vs layers (S 1024) and vs S (80 layers): one inference+train-step case each.
: >"$WORK/scaling.txt"
if [[ "$SCALING" == 1 ]]; then
  for L in 5 10 20 40 80; do
    timed "L$L" "$BIN" predict --preset "$PREDICT_PRESET" --layers "$L" --batch 8 --seq 1024 --phases train-step,inference
    echo "layers $L $(cat "$WORK/L$L.s")" >>"$WORK/scaling.txt"
  done
  for S in 256 512 1024 2048 4096 8192; do
    timed "S$S" "$BIN" predict --preset "$PREDICT_PRESET" --batch 8 --seq "$S" --max-seq "$S" --phases train-step,inference
    echo "seq $S $(cat "$WORK/S$S.s")" >>"$WORK/scaling.txt"
  done
fi

python3 - "$WORK" "$(machine)" "$DEFAULT_SWEEP" "$PREDICT_PRESET B $PREDICT_B S $PREDICT_S" <<'PY'
import json, math, os, re, sys
work, machine, default, predict_case = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
rd = lambda n: float(open(os.path.join(work, n + ".s")).read())
rows = lambda d: [json.loads(l) for l in open(os.path.join(work, d, "results.jsonl"))]
print(f"\n== memfit's own speed ({machine}) ==")
if default:
    r = rows("default"); cases = len({x["case"] for x in r})
    print(f"embedded default sweep: {cases} cases, {len(r)} rows, {sum(x['status']=='ok' for x in r)} ok, {rd('default'):.1f} s end to end")
r = rows("tiny"); cases = len({x["case"] for x in r}); t = rd("tiny")
m = re.search(r"a process per case: ([0-9.]+) ms to start on average \(([0-9.]+) ms of CPU\)", open(os.path.join(work, "tiny.log")).read())
print(f"tiny sweep: {cases} cases in {t:.1f} s = {60*cases/t:.0f} cases/min ({1000*t/cases:.1f} ms per case; "
      f"windows {1000*sum(x['wall_s'] or 0 for x in r)/cases:.2f} ms per case"
      + (f"; spawn to hello {m.group(1)} ms, {m.group(2)} ms CPU" if m else "") + ")")
n = sum(1 for _ in open(os.path.join(work, "predict70b.log")))
print(f"predict {predict_case}, {n} variant cases × 9 phases: {rd('predict70b'):.2f} s ({rd('predict70b')/n:.3f} s per case)")
pts = {"layers": [], "seq": []}
for line in open(os.path.join(work, "scaling.txt")):
    k, x, s = line.split(); pts[k].append((int(x), float(s)))
def slope(p):
    if len(p) < 2: return float("nan")
    xs = [math.log(a) for a, _ in p]; ys = [math.log(b) for _, b in p]
    mx, my = sum(xs)/len(xs), sum(ys)/len(ys)
    return sum((a-mx)*(b-my) for a, b in zip(xs, ys)) / sum((a-mx)**2 for a in xs)
for k, p in pts.items():
    if p:
        print(f"predict time vs {k}: " + ", ".join(f"{x}: {s*1000:.0f} ms" for x, s in p) + f"; log–log slope {slope(p):.2f}")
# A small log–log SVG of both series.
if any(pts.values()):
    W, H, M = 640, 320, 50
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2*W}" height="{H}" font-family="sans-serif" font-size="12">']
    for i, (k, p) in enumerate(pts.items()):
        if not p: continue
        ox = i * W
        xs = [math.log10(a) for a, _ in p]; ys = [math.log10(b) for _, b in p]
        x0, x1 = min(xs), max(xs); y0, y1 = min(ys) - 0.1, max(ys) + 0.1
        X = lambda v: ox + M + (v - x0) / (x1 - x0 or 1) * (W - 2*M)
        Y = lambda v: H - M - (v - y0) / (y1 - y0 or 1) * (H - 2*M)
        svg.append(f'<rect x="{ox+M}" y="{M}" width="{W-2*M}" height="{H-2*M}" fill="none" stroke="#888"/>')
        svg.append(f'<polyline fill="none" stroke="#1f77b4" stroke-width="2" points="{" ".join(f"{X(a):.1f},{Y(b):.1f}" for a, b in zip(xs, ys))}"/>')
        for (a, s), xa, yb in zip(p, xs, ys):
            svg.append(f'<circle cx="{X(xa):.1f}" cy="{Y(yb):.1f}" r="3" fill="#1f77b4"/><text x="{X(xa):.1f}" y="{H-M+15}" text-anchor="middle">{a}</text><text x="{X(xa)+4:.1f}" y="{Y(yb)-6:.1f}">{s*1000:.0f} ms</text>')
        svg.append(f'<text x="{ox+W/2}" y="{H-10}" text-anchor="middle">{k} (log)</text><text x="{ox+W/2}" y="30" text-anchor="middle">predict time vs {k}, log–log slope {slope(p):.2f}</text>')
    svg.append("</svg>")
    out = os.environ.get("SVG_OUT", os.path.join(work, "predict-scaling.svg"))
    open(out, "w").write("\n".join(svg)); print(f"plot: {out}")
PY
