#!/usr/bin/env bash
# The GPU sweep in one call, on the GPU machine (through the device tool, from the repository
# root, with dist/gpu in `carry`):
#   run(command="scripts/gpu-run.sh", carry=["dist/gpu"], timeout_s=560)
# Unpacks the CUDA build (scripts/build-cuda.sh made it here), records the machine (read-only
# queries: no GPU setting is touched), runs workloads/gpu-h200.toml (or $1), and leaves under
# $OUT: run/ (results.jsonl, meta.json, and CSV/HDF5 when they could be written), dataload/
# (workloads/gpu-dataload.toml, when time is left), machine.txt, sweep.log, dataload.log, time.txt. Back here: scripts/gpu-collect.sh FILES_AT.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:?OUT must name the folder to bring back}"
workload="${1:-workloads/gpu-h200.toml}"
mkdir -p "$out"
{
  echo "# date"; date -u +%Y-%m-%dT%H:%M:%SZ
  echo "# nvidia-smi (query only)"; nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,clocks.max.sm --format=csv 2>&1
  echo "# uname"; uname -a
  echo "# build"; cat dist/gpu/BUILD 2>&1
} > "$out/machine.txt"
start=$(date +%s%N)
scripts/memfit-cuda run "$workload" --out "$out/run" > "$out/sweep.log" 2>&1
rc=$?
end=$(date +%s%N)
echo "exit $rc, $(( (end - start) / 1000000 )) ms" > "$out/time.txt"
# Data loading onto the device (D5, D6's pinned copies) when at least 2 minutes are left.
elapsed=$(( (end - start) / 1000000000 ))
if (( elapsed < 400 )); then
  timeout $(( 520 - elapsed )) bash -c '
    scripts/memfit-cuda dataset make --out data/gpu-dataload --count 128 --size 256-512 &&
    scripts/memfit-cuda run workloads/gpu-dataload.toml --out "$1/dataload"' _ "$out" \
    > "$out/dataload.log" 2>&1
  echo "dataload: exit $?" >> "$out/time.txt"
else
  echo "dataload: skipped (the sweep took ${elapsed} s)" >> "$out/time.txt"
fi
tail -n 40 "$out/sweep.log"
cat "$out/time.txt"
exit $rc
