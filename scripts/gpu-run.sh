#!/usr/bin/env bash
# The GPU sweep in one call, on the GPU machine (through the device tool, from the repository
# root, with the CUDA build carried):
#   run(command="MEMFIT_GPU_CALL_LIMIT_S=570 scripts/gpu-run.sh", carry=["dist/gpu"], timeout_s=570)
# then, back here: scripts/gpu-collect.sh FILES_AT
#
# It stays inside the call's limits: at most 8 files come back from $OUT (16 MiB each, two
# folders down, plain names), and the command is killed at its time limit. So it writes
# exactly seven files, all at the top of $OUT:
#   machine.txt     what ran where (read-only queries: no GPU setting is touched)
#   smoke.log       the smoke test (one small case, every phase and meter layer, ≈ 30 s), the
#                   same case with the pool's release threshold 0 (CUDA's default) beside
#                   memfit's "keep", the bare-matmul probe (`memfit probe matmul`: what a
#                   product allocates beyond its output, cuBLAS's workspace if the pool gave
#                   it), then the numeric self-checks (`memfit selftest`: the fused kernels in
#                   f32/f16/bf16 with rows wider than a block, the frozen-linear op dense and
#                   quantized, the in-place updates) run by the same binary
#   sweep.log       the main sweep (workloads/gpu-h200.toml, or $1)
#   dataload.log    the data-loading sweep (workloads/gpu-dataload.toml) with the time left
#   torch.log       the PyTorch reference (scripts/torch_reference.py, JSON lines + tables) on
#                   gpu-h200 shapes, and accelerate's `estimate-memory` for the same configs;
#                   "skipped" where the machine has no torch (the dry run on a CPU without it)
#   time.txt        each step's exit status and seconds
#   results.tar.gz  every run folder (results/{smoke,smoke-release0,run,dataload}/: journal,
#                   meta.json, CSV, HDF5, superseded rows); without the CSV/HDF5 copies if it
#                   would pass 16 MiB (gpu-collect.sh rebuilds them from the journals). It is
#                   re-packed (atomically: a temporary, then a rename) after every stage and,
#                   while a sweep runs, whenever its journal grew (a case finished), so a call
#                   killed at its limit still brings back every finished case
# A failed smoke test stops the call at once (a broken build costs a minute). The sweep runs
# under --deadline, leaving MEMFIT_GPU_RESERVE_S (60) for packing; data loading gets what is
# left; every memfit run is also under `timeout`. The script's budget is the call's limit
# (MEMFIT_GPU_CALL_LIMIT_S: pass the call's timeout_s) less 30 s for the files' way back;
# MEMFIT_GPU_BUDGET_S overrides it.
#
# Dry run on the CPU (MEMFIT_GPU_DRY_RUN=1 OUT=DIR scripts/gpu-run.sh): the same script with the
# CPU build and the CPU stand-ins workloads/gpu-h200-cpu.toml and workloads/gpu-dataload-cpu.toml
# (same grids, toy sizes). The CPU build comes packed as the call's (MEMFIT_GPU_DIST: a folder
# scripts/gpu-pack.sh made from it, unpacked by the same scripts/gpu-unpack.sh the GPU side
# uses), else as a plain binary ($MEMFIT_BIN, else target/release/memfit).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:?OUT must name the folder to bring back}"
call_limit="${MEMFIT_GPU_CALL_LIMIT_S:-570}"
budget="${MEMFIT_GPU_BUDGET_S:-$(( call_limit - 30 ))}"
reserve="${MEMFIT_GPU_RESERVE_S:-60}"
dry="${MEMFIT_GPU_DRY_RUN:-0}"
t0=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t0) )); }
mkdir -p "$out"

dist=dist/gpu
if [[ "$dry" == 1 ]]; then
  if [[ -n "${MEMFIT_GPU_DIST:-}" ]]; then
    dist="$MEMFIT_GPU_DIST"
    scripts/gpu-unpack.sh "$dist" || { echo "dry run: unpacking $dist failed" >&2; exit 3; }
    memfit=("$dist/bin/memfit")
  else
    memfit=("${MEMFIT_BIN:-target/release/memfit}")
  fi
  device=cpu
  workload="${1:-workloads/gpu-h200-cpu.toml}"
  dl_workload=workloads/gpu-dataload-cpu.toml
  dl_make=(--count 16 --size 48-64)
  smoke_meter=cpu-allocator
else
  memfit=(scripts/memfit-cuda)
  device=cuda:0
  workload="${1:-workloads/gpu-h200.toml}"
  dl_workload=workloads/gpu-dataload.toml
  dl_make=(--count 128 --size 256-512)
  smoke_meter=cuda-pool
fi
work="$(mktemp -d "${TMPDIR:-/tmp}/memfit-gpu.XXXXXX")"
res="$work/results"
# Kernels the driver JIT-compiles from PTX (memfit's fused.cu among them) are compiled once per
# call, not once per case process.
export CUDA_CACHE_PATH="$work/cuda-cache" CUDA_CACHE_MAXSIZE=4294967296
mkdir -p "$res"
: > "$out/time.txt"
step() { # NAME RC SECONDS
  echo "$1: exit $2, $3 s" >> "$out/time.txt"
}

# results.tar.gz, replaced atomically (a temporary beside it, then a rename): after each stage
# and at the end, so a call killed at its limit still brings back what finished.
snapshot() {
  local tarball="$out/results.tar.gz" tmp="$out/results.tar.gz.part" limit=$((16 * 1024 * 1024))
  tar -C "$work" -czf "$tmp" results
  if (( $(stat -c %s "$tmp") > limit )); then
    # The derived stores go first: the journals are what gpu-collect.sh rebuilds them from.
    tar -C "$work" -czf "$tmp" --exclude='*.h5' --exclude='*.csv' results
    echo "pack: CSV/HDF5 left out to stay under 16 MiB" >> "$out/time.txt"
  fi
  mv -f "$tmp" "$tarball"
}

# Runs a command in the background and re-packs the archive whenever a journal under the
# results grew (a case finished), until the command ends; returns the command's status.
with_snapshots() {
  "$@" &
  local pid=$! last="" now
  while kill -0 "$pid" 2>/dev/null; do
    sleep 3
    now="$(find "$res" -name results.jsonl -printf '%p %s\n' 2>/dev/null | sort)"
    if [[ "$now" != "$last" ]]; then
      snapshot 2>/dev/null || true
      last="$now"
    fi
  done
  wait "$pid"
}

pack() {
  snapshot
  echo "pack: $(stat -c %s "$out/results.tar.gz") bytes, total $(( $(date +%s) - t0 )) s" >> "$out/time.txt"
  rm -rf "$work"
}

{
  echo "# date"; date -u +%Y-%m-%dT%H:%M:%SZ
  echo "# mode"; if [[ "$dry" == 1 ]]; then echo "dry run on the CPU"; else echo "GPU"; fi
  if [[ "$dry" != 1 ]]; then
    echo "# nvidia-smi (query only; each under a timeout: a hung query must not eat the call)"
    timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,clocks.max.sm --format=csv 2>&1
    timeout 20 nvidia-smi --query-compute-apps=pid,used_memory --format=csv 2>&1
    echo "# CUDA runtime as PyTorch sees it"
    timeout 60 python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" 2>&1 | tail -n 1
  fi
  echo "# uname"; uname -a
  echo "# cpu"; grep -m1 "model name" /proc/cpuinfo; nproc
  echo "# build"; cat "$dist/BUILD" 2>&1; grep '^travel:' "$dist/MANIFEST" 2>&1; "${memfit[@]}" --version 2>&1
} > "$out/machine.txt" 2>&1
# The build's PTX is CUDA 13.0 (nvcc 13.0): an older driver cannot load it. Said once, here.
if [[ "$dry" != 1 ]]; then
  drv_cuda="$(timeout 20 nvidia-smi 2>/dev/null | grep -o 'CUDA Version: [0-9.]*' | grep -o '[0-9.]*$' || true)"
  if [[ -n "$drv_cuda" ]] && [[ "$(printf '%s\n13.0\n' "$drv_cuda" | sort -V | head -n 1)" != 13.0 ]]; then
    echo "driver supports CUDA $drv_cuda, older than the build's 13.0: the kernels will not load" | tee -a "$out/time.txt"
  fi
fi

# 1. Smoke test: one small case, every training phase and inference, every meter layer, on
# candle's composed ops (the fused kernels are checked next, without stopping the call).
s=$(date +%s)
timeout 120 "${memfit[@]}" run --preset tiny --batch 2 --seq 16 --kernels composed \
  --phases init,forward,backward,optimizer,train-step,inference \
  --device "$device" --threads 2 --case-timeout 90 --out "$res/smoke" > "$out/smoke.log" 2>&1
rc=$?
if (( rc == 0 )); then
  python3 - "$res/smoke/results.jsonl" "$smoke_meter" "$device" >> "$out/smoke.log" 2>&1 <<'PY'
import json, sys
path, meter, device = sys.argv[1:]
rows = [json.loads(l) for l in open(path) if l.strip()]
# The gate holds only what the sweep's numbers need: every phase ok, a tensor peak from the pool
# (or, on a device without pools, sampled cuMemGetInfo), retained bytes, the device layer. The
# optional layers (NVML's process figures, the pool's reservation) only warn: a container with
# its own PID namespace, a driver reporting 0 bytes or a vGPU without pools must not end the
# call before the sweep.
bad = [f"{r['phase']}: {r['status']} {r.get('error') or ''}" for r in rows if r["status"] != "ok"]
meters = {meter} | ({"cuda-meminfo-sampled"} if device.startswith("cuda") else set())
bad += [f"{r['phase']}: peak_meter {r['peak_meter']}, not {' or '.join(sorted(meters))}"
        for r in rows if r["peak_meter"] not in meters]
need = ["peak_bytes", "retained_bytes", "cpu_user_s", "wall_s"]
warn_on = []
if device.startswith("cuda"):
    need += ["device_used_bytes"]
    warn_on = ["reserved_peak_bytes", "nvml_process_peak_bytes", "nvml_samples_count"]
else:
    need += ["alloc_count", "rss_peak_bytes"]
bad += [f"{r['phase']}: {k} missing" for r in rows for k in need if r.get(k) is None]
for r in rows:
    for k in warn_on:
        if r.get(k) in (None, 0):
            print(f"smoke warning: {r['phase']}: {k} {'missing' if r.get(k) is None else 'is 0'} (optional layer)")
if len(rows) != 6:
    bad.append(f"{len(rows)} rows, not 6")
print("smoke check:", "ok" if not bad else "FAILED")
for b in bad:
    print("  " + b)
sys.exit(1 if bad else 0)
PY
  rc=$?
fi
step smoke "$rc" $(( $(date +%s) - s ))
snapshot
if (( rc == 0 )); then
  # The same case with the pool's release threshold 0 (CUDA's default: freed blocks go back at
  # each synchronisation) beside memfit's "keep" (the trim figures then read what the pool
  # cached); meta.json records each. And a bare matmul's window beyond its output. Neither
  # gates the call. On the CPU the threshold means nothing (the dry run runs it all the same).
  s=$(date +%s)
  (
    echo "# the smoke case with MEMFIT_CUDA_POOL_RELEASE=0"
    MEMFIT_CUDA_POOL_RELEASE=0 timeout 120 "${memfit[@]}" run --preset tiny --batch 2 --seq 16 \
      --kernels composed --phases init,forward,backward,optimizer,train-step,inference \
      --device "$device" --threads 2 --case-timeout 90 --out "$res/smoke-release0" --quiet 2>&1
    r1=$?
    echo "# memfit probe matmul (peak beyond the output: cuBLAS's workspace if it came from the pool)"
    if [[ "$dry" == 1 ]]; then pdt=f32; else pdt=bf16; fi
    r2=0
    for n in 1024 4096; do
      timeout 60 "${memfit[@]}" probe matmul --device "$device" --dtype "$pdt" --n "$n" --threads 2 --json 2>&1 || r2=$?
    done
    echo "# memfit probe backward (each fused op's backward alone: pool peak beyond its gradients, and the replay's)"
    timeout 60 "${memfit[@]}" probe backward --device "$device" --dtype "$pdt" --threads 2 --json 2>&1 || r2=$?
    echo "# the measured timelines of a small case (the pool sampled every 20 µs: results/timeline)"
    timeout 90 "${memfit[@]}" run --preset llama-tiny --batch 2 --seq 32 --decode-tokens 3 \
      --phases train-step,inference,prefill,decode --device "$device" --threads 2 \
      --case-timeout 60 --out "$res/timeline" --timeline "$res/timeline/timeline" --quiet 2>&1 || r2=$?
    exit $(( r1 != 0 ? r1 : r2 ))
  ) >> "$out/smoke.log" 2>&1
  step smoke-extra "$?" $(( $(date +%s) - s ))
  snapshot
fi
if (( rc != 0 )); then
  echo "smoke test failed: the sweep is not run (see smoke.log)" | tee -a "$out/time.txt"
  tail -n 30 "$out/smoke.log"
  pack
  exit 1
fi

# 1b. The numeric self-checks on the device (`memfit selftest`: the fused kernels' forwards and
# gradients against candle's own ops in f32/f16/bf16, wide rows included; the frozen-linear op;
# the in-place optimizer updates), run by the binary that measures. Logged into smoke.log; a
# failure is recorded, the sweep still runs (its rows say which kernels ran).
s=$(date +%s)
{
  echo "# memfit selftest on $device"
  timeout 240 "${memfit[@]}" selftest --device "$device" --threads 2 2>&1
} >> "$out/smoke.log" 2>&1
trc=$?
step tests "$trc" $(( $(date +%s) - s ))
snapshot

# 2. The sweep, under a deadline that leaves the reserve (and some time for data loading and
# the PyTorch reference).
s=$(date +%s)
dl_share=$(( $(left) / 5 ))
torch_share=$(( $(left) / 6 ))
deadline=$(( $(left) - reserve - dl_share - torch_share ))
if (( deadline > 10 )); then
  with_snapshots timeout $(( deadline + 30 )) "${memfit[@]}" run "$workload" --deadline "$deadline" \
    --out "$res/run" > "$out/sweep.log" 2>&1
  rc=$?
else
  echo "no time left for the sweep" > "$out/sweep.log"; rc=124
fi
step sweep "$rc" $(( $(date +%s) - s ))
snapshot
# memfit run's 3: every row written, some case did not measure (the workload's case that cannot
# fit comes back `oom`, as meant); time.txt keeps the 3, the call's status is the sweep's success.
sweep_rc=$rc
(( rc == 3 )) && sweep_rc=0

# 3. Data loading onto the device (D5, D6's pinned copies) with what is left.
s=$(date +%s)
dl_deadline=$(( $(left) - reserve ))
if (( dl_deadline > 20 )); then
  with_snapshots timeout $(( dl_deadline + 20 )) bash -c '
    "${@:4}" dataset make --out "$1/dataset" '"${dl_make[*]}"' &&
    "${@:4}" run "$2" --dataset "$1/dataset" --deadline "$3" --out "$1/results/dataload"' \
    _ "$work" "$dl_workload" "$(( dl_deadline - 10 ))" "${memfit[@]}" > "$out/dataload.log" 2>&1
  rc=$?
else
  echo "skipped: ${dl_deadline} s left before the reserve" > "$out/dataload.log"; rc=0
fi
step dataload "$rc" $(( $(date +%s) - s ))
snapshot
rm -rf "$work/dataset"

# 4. The same models in PyTorch eager (and accelerate's estimate) with what is left before the
# reserve; every output line goes into torch.log.
s=$(date +%s)
torch_deadline=$(( $(left) - reserve / 2 ))
trc=0
{
  if ! timeout 60 python3 -c "import torch" 2>/dev/null; then
    echo "skipped: no torch on this machine"
  elif (( torch_deadline < 20 )); then
    echo "skipped: ${torch_deadline} s left"
  else
    if [[ "$dry" == 1 ]]; then
      tdev=cpu; tcfgs=("--preset tiny --batch 2 --seq 16 --dtype f32")
    else
      tdev=cuda:0
      tcfgs=("--preset small --batch 4 --seq 128 --dtype f32"
             "--preset gpt2-small --batch 1 --seq 128 --dtype f32"
             "--preset gpt2-small --batch 8 --seq 1024 --dtype bf16"
             "--preset vit-b16 --batch 32 --dtype bf16"
             "--hf-config workloads/configs/llama-3.2-1b.json --batch 4 --seq 1024 --dtype bf16")
    fi
    end=$(( $(date +%s) + torch_deadline ))
    for c in "${tcfgs[@]}"; do
      rest=$(( end - $(date +%s) )); (( rest > 10 )) || { echo "skipped (time): $c"; continue; }
      echo "# torch_reference.py $c --device $tdev"
      # shellcheck disable=SC2086
      timeout "$rest" python3 scripts/torch_reference.py $c --device "$tdev" --threads 2 --steps 5 2>&1 \
        | grep -v "gpuGetDeviceCount\|CPUAllocator.cpp"
      r=${PIPESTATUS[0]}; (( r == 0 )) || trc=$r
    done
    # accelerate's estimate on the local configs (scripts/accelerate_estimate.py: the CLI asks the
    # Hub first, and this machine has no network), every LLaMA-family config memfit ships.
    if [[ "$dry" != 1 ]] && python3 -c "import accelerate" 2>/dev/null; then
      rest=$(( end - $(date +%s) ))
      if (( rest > 5 )); then
        echo "# accelerate_estimate.py workloads/configs/*.json (accelerate's estimate-memory, offline)"
        HF_HUB_OFFLINE=1 timeout "$rest" python3 scripts/accelerate_estimate.py workloads/configs/*.json 2>&1 \
          | grep -v "deprecated"
      else
        echo "skipped (time): accelerate_estimate.py"
      fi
    fi
  fi
} > "$out/torch.log" 2>&1
step torch "$trc" $(( $(date +%s) - s ))

pack
tail -n 25 "$out/sweep.log"
cat "$out/time.txt"
exit "$sweep_rc"
