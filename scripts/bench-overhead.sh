#!/usr/bin/env bash
# Meter overhead: the same train step with the meters on (the usual build) and off (the
# `unmetered` build: the system allocator, no bookkeeping, no trim/high-water-mark reset),
# alternating runs (metered, unmetered, metered, …), median and spread of the window's wall_s
# (from the rows) and of the whole process's wall time. Then the per-case cost of a process per
# case (the sweep's isolation) from a sweep of tiny cases.
#
#   scripts/bench-overhead.sh               # small B4 S128 (9 pairs) and gpt2-small B1 S128 (3 pairs)
#   PAIRS=3 BIG_PAIRS=0 scripts/bench-overhead.sh   # quicker
#   MEMFIT_BENCH_LOCK=/tmp/x.lock …          # each timed run under flock
#   NOTRIM=1 …   # a third arm: the metered build with `--trim off` (no malloc_trim, no high-water
#                # reset, no trim meter), to tell the allocator's bookkeeping from the trim's page
#                # faults, and to show what `--trim off` saves
source "$(dirname "$0")/bench-common.sh"
PAIRS="${PAIRS:-9}"
# PAIRS or BIG_PAIRS 0: that config is skipped.
BIG_PAIRS="${BIG_PAIRS:-3}"
ISO_CASES="${ISO_CASES:-200}"
ISO_SEQS="${ISO_SEQS:-100}"  # sequence lengths 8.. of the isolation sweep; batches fill ISO_CASES
SMALL_CASE="${SMALL_CASE:---preset small --batch 4 --seq 128}"
WORK="${WORK:-$(mktemp -d)}"; mkdir -p "$WORK"
build_bins both
NOTRIM="${NOTRIM:-0}"

# run BIN TAG CONFIG_ARGS… : one process, one train-step window; appends "tag window_s process_s"
run_one() {
  local bin="$1" tag="$2"; shift 2
  local out="$WORK/$tag-$RANDOM$RANDOM" t0 t1 trim=()
  # The window starts with the heap as the warm-up left it; its RSS peak is then missing.
  [[ "$tag" == */metered-notrim ]] && trim=(--trim off)
  timed_locked "$WORK/t" "$BIN_DIR/$bin" run "$@" "${trim[@]}" --phases train-step --threads "$RAYON_NUM_THREADS" --out "$out" >/dev/null 2>&1
  read -r t0 t1 <"$WORK/t"
  python3 - "$out/results.jsonl" "$tag" "$t0" "$t1" >>"$WORK/times.txt" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 1 and rows[0]["status"] == "ok", rows
print(sys.argv[2], rows[0]["wall_s"], float(sys.argv[4]) - float(sys.argv[3]), rows[0]["cpu_sys_s"], rows[0]["peak_meter"])
PY
  rm -rf "$out"
}

pairs() {
  local name="$1" n="$2"; shift 2
  for ((i = 0; i < n; i++)); do
    run_one memfit-metered "$name/metered" "$@"
    run_one memfit-unmetered "$name/unmetered" "$@"
    if [[ "$NOTRIM" == 1 ]]; then run_one memfit-metered "$name/metered-notrim" "$@"; fi
  done
}

# KEEP_TIMES=1 adds to the pairs already in $WORK/times.txt (e.g. PAIRS=0 BIG_PAIRS=0 to redo only
# the summary and the isolation sweep).
[[ "${KEEP_TIMES:-0}" == 1 ]] || : >"$WORK/times.txt"
if ((PAIRS > 0)); then
  # shellcheck disable=SC2086
  pairs "$(echo $SMALL_CASE | sed 's/--preset //; s/--batch /B/; s/--seq /S/; s/ /-/g')" "$PAIRS" $SMALL_CASE
fi
if ((BIG_PAIRS > 0)); then
  pairs "gpt2-small-B1-S128" "$BIG_PAIRS" --preset gpt2-small --batch 1 --seq 128
fi

# Isolation: a sweep of ISO_CASES tiny inference cases (batches × ISO_SEQS sequence lengths 8..);
# memfit prints the mean spawn-to-hello time per case process. Its total wall / cases beside
# the case windows' own wall.
iso_out="$WORK/iso"; rm -rf "$iso_out"
timed_locked "$WORK/t" "$BIN_DIR/memfit-metered" run --preset tiny --batch "$(seq -s, 1 $(( (ISO_CASES + ISO_SEQS - 1) / ISO_SEQS )))" --seq "$(seq -s, 8 $((7 + ISO_SEQS)))" \
  --phases inference --threads "$RAYON_NUM_THREADS" --out "$iso_out" >"$WORK/iso.log" 2>&1
read -r t0 t1 <"$WORK/t"

python3 - "$WORK/times.txt" "$iso_out/results.jsonl" "$WORK/iso.log" "$t0" "$t1" "$(machine)" <<'PY'
import json, re, statistics as st, sys
times, iso_rows, iso_log, t0, t1, machine = sys.argv[1:]
runs = {}
for line in open(times):
    tag, w, p, sy, meter = line.split()
    runs.setdefault(tag, []).append((float(w), float(p), float(sy), meter))
def med(x): return st.median(x)
def spread(x): return (min(x), max(x))
print(f"\n== meter overhead ({machine}) ==")
print(f"{'config':<22} {'build':<10} {'n':>3} {'window wall_s median [min–max]':>34} {'process s median [min–max]':>30} {'window sys s':>12}")
for name in sorted({t.split('/')[0] for t in runs}):
    for b in ("metered", "unmetered", "metered-notrim"):
        r = runs.get(f"{name}/{b}", [])
        if not r: continue
        w = [x[0] for x in r]; p = [x[1] for x in r]; sy = [x[2] for x in r]
        print(f"{name:<22} {b:<10} {len(r):>3} {med(w):>10.4f} [{min(w):.4f}–{max(w):.4f}] {med(p):>12.3f} [{min(p):.3f}–{max(p):.3f}] {med(sy):>12.3f}")
    m, u = runs[f"{name}/metered"], runs[f"{name}/unmetered"]
    # Paired: run i of each build were neighbours in time.
    dw = [a[0] / b[0] - 1 for a, b in zip(m, u)]
    dp = [a[1] / b[1] - 1 for a, b in zip(m, u)]
    print(f"{name:<22} overhead  window {100*med(dw):+.2f} % (pairs {100*min(dw):+.2f}…{100*max(dw):+.2f}), "
          f"process {100*med(dp):+.2f} % (pairs {100*min(dp):+.2f}…{100*max(dp):+.2f})")
    n = runs.get(f"{name}/metered-notrim")
    if n:
        # The same neighbours in time: metered-notrim against the unmetered run just before it.
        dn = [a[0] / b[0] - 1 for a, b in zip(n, u)]
        print(f"{name:<22} without the trim  window {100*med(dn):+.2f} % (pairs {100*min(dn):+.2f}…{100*max(dn):+.2f}), "
              f"window sys {med([x[2] for x in n]):.3f} s: the rest of the window overhead is the trim's page faults")
        # --trim on against --trim off, the metered run just before it.
        dt = [a[0] / b[0] - 1 for a, b in zip(m, n)]
        print(f"{name:<22} --trim on vs off  window {100*med(dt):+.2f} % (pairs {100*min(dt):+.2f}…{100*max(dt):+.2f})")
rows = [json.loads(l) for l in open(iso_rows)]
ok = [r for r in rows if r["status"] == "ok"]
log = open(iso_log).read()
m = re.search(r"a process per case: ([0-9.]+) ms to start on average \(([0-9.]+) ms of CPU\)", log)
total = float(t1) - float(t0)
win = sum(r["wall_s"] for r in ok)
print(f"\n== isolation: a process per case ({len(rows)} tiny inference cases, {len(ok)} ok) ==")
print(f"sweep wall {total:.2f} s = {1000*total/len(rows):.1f} ms per case; windows {1000*win/len(rows):.2f} ms per case")
if m:
    print(f"spawn to hello (memfit's own figure): {m.group(1)} ms per case, {m.group(2)} ms of CPU")
PY
