#!/usr/bin/env bash
# Agreement with independent heap profilers: one CPU case that runs only the train-step phase,
# as the case's own process (`memfit run … --child-case 0`, what a sweep spawns), natively with
# MEMFIT_ALLOC_TRACE=1 (memfit's allocator prints the window's absolute peak and the process's
# peak so far), under valgrind massif (exact peak: --peak-inaccuracy=0) and under heaptrack.
# The process's peak is the train-step window's: its baseline (model, AdamW state, warm-up
# leftovers) plus its peak; the warm-up step before it peaks no higher.
#
#   scripts/bench-profilers.sh                       # small B2 S64 (massif takes minutes)
#   CASE="--preset tiny --batch 1 --seq 16" scripts/bench-profilers.sh   # a quick check
source "$(dirname "$0")/bench-common.sh"
CASE="${CASE:---preset small --batch 2 --seq 64}"
WORK="${WORK:-$(mktemp -d)}"; mkdir -p "$WORK"
"$ROOT/scripts/setup.sh" test  # valgrind and heaptrack among the rest, idempotently
build_bins
BIN="$BIN_DIR/memfit-metered"
# shellcheck disable=SC2206
# Subnormals kept (IEEE): valgrind does not emulate the CPU's flush-to-zero bits, which memfit
# checks after setting them (its default), so every tool runs the same arithmetic unflushed.
ARGS=(run $CASE --phases train-step --threads "$RAYON_NUM_THREADS" --flush-denormals off --child-case 0)
cd "$WORK"
MEMFIT_ALLOC_TRACE=1 timed_locked t.native "$BIN" "${ARGS[@]}" >native.out 2>native.err; read -r t0 t1 <t.native
native_s="$(python3 -c "print($t1 - $t0)")"
MEMFIT_ALLOC_TRACE=1 timed_locked t.massif valgrind --tool=massif --peak-inaccuracy=0.0 --massif-out-file=massif.out \
  "$BIN" "${ARGS[@]}" >massif.stdout 2>massif.err
read -r t0 t1 <t.massif; massif_s="$(python3 -c "print($t1 - $t0)")"
MEMFIT_ALLOC_TRACE=1 timed_locked t.heaptrack heaptrack -o "$WORK/heaptrack" "$BIN" "${ARGS[@]}" >heaptrack.stdout 2>heaptrack.err
read -r t0 t1 <t.heaptrack; heaptrack_s="$(python3 -c "print($t1 - $t0)")"
heaptrack_print "$WORK"/heaptrack*.zst >heaptrack.txt 2>/dev/null

python3 - "$native_s" "$massif_s" "$heaptrack_s" "$(machine)" "$CASE" <<'PY'
import re, sys
native_s, massif_s, heaptrack_s = map(float, sys.argv[1:4])
machine, case = sys.argv[4:6]
def trace(path):
    m = re.findall(r"memfit-alloc-trace (.*)", open(path).read())
    assert m, f"no memfit-alloc-trace line in {path}"
    return {k: int(v) for k, v in (kv.split("=") for kv in m[-1].split())}
mf = trace("native.err")
# massif: the peak snapshot (exact with --peak-inaccuracy=0); useful bytes and heap-admin bytes.
snaps = re.findall(r"mem_heap_B=(\d+)\nmem_heap_extra_B=(\d+)\nmem_stacks_B=\d+\nheap_tree=(\w+)", open("massif.out").read())
peak = [s for s in snaps if s[2] == "peak"]
ms_heap, ms_extra = (int(peak[-1][0]), int(peak[-1][1])) if peak else max((int(a), int(b)) for a, b, _ in snaps)
txt = open("heaptrack.txt").read()
m = re.search(r"peak heap memory consumption: ([0-9.]+)([KMGT]?)", txt)
scale = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
ht = float(m.group(1)) * scale[m.group(2)]
ref = mf["process_peak_bytes"]
print(f"\n== heap profilers vs memfit ({machine}; case: {case} --phases train-step) ==")
print(f"memfit window: baseline {mf['baseline_bytes']:,} B + peak {mf['window_peak_bytes']:,} B = {mf['abs_peak_bytes']:,} B; process peak {ref:,} B")
print(f"{'tool':<28} {'peak heap B':>16} {'vs memfit':>10} {'wall s':>8} {'slowdown':>9}")
print(f"{'memfit (native)':<28} {ref:>16,} {'':>10} {native_s:>8.2f} {1.0:>8.1f}x")
print(f"{'massif mem_heap_B':<28} {ms_heap:>16,} {100*(ms_heap/ref-1):>+9.3f}% {massif_s:>8.2f} {massif_s/native_s:>8.1f}x")
print(f"{'massif + heap-admin':<28} {ms_heap+ms_extra:>16,} {100*((ms_heap+ms_extra)/ref-1):>+9.3f}%")
print(f"{'heaptrack (2 decimals)':<28} {int(ht):>16,} {100*(ht/ref-1):>+9.3f}% {heaptrack_s:>8.2f} {heaptrack_s/native_s:>8.1f}x")
PY
