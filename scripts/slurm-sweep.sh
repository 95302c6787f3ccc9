#!/usr/bin/env bash
# A memfit sweep as a Slurm job array: one shard of the workload per array task, then a merge.
#   scripts/slurm-sweep.sh WORKLOAD --array N [sbatch options…]
# Submits (1) an array of N tasks, each `memfit run WORKLOAD --shard auto --resume --out
# OUT/shard-<task>` (the shard from SLURM_ARRAY_TASK_ID/COUNT; --resume, so a requeued or
# preempted task continues its shard instead of starting over; --requeue so Slurm may requeue
# it), with --gres=gpu:1 and the CUDA binary (scripts/memfit-cuda) when the workload runs on
# cuda; (2) a merge job after the array ends whatever its outcome (afterany): `memfit merge
# OUT/shard-* --out OUT/merged`, whose log (OUT/merge.log) names any incomplete shard.
# Prints the array and merge job ids and OUT.
#   MEMFIT_SWEEP_OUT  the sweep's folder (default runs/slurm-<UTC time>)
#   MEMFIT_BIN        the memfit binary (default: target/release/memfit, or scripts/memfit-cuda
#                     for a CUDA workload); MEMFIT_RUN_ARGS  extra `memfit run` flags
#
# A multi-rank case (`memfit ranks`: data, tensor or pipeline parallel over MPI) as one job step of N tasks:
#   scripts/slurm-sweep.sh --ranks N [sbatch options…] -- RANKS_ARGS…
# Submits one job of N tasks whose step is `srun --mpi=pmix memfit ranks RANKS_ARGS --json`
# (every task a rank; Slurm places the tasks on the allocation's nodes), rank 0's JSON in
# OUT/ranks.json, the step's log in OUT/ranks.log. Prints the job id and OUT. The binary must
# be built with `--features ranks` (the default binary is built so when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "--ranks" ]]; then
  n="${2:-}"
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "slurm-sweep: --ranks takes a number of ranks, not '$n'" >&2; exit 2; }
  shift 2
  sb=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do sb+=("$1"); shift; done
  [[ "${1:-}" == "--" ]] || { echo "usage: scripts/slurm-sweep.sh --ranks N [sbatch options...] -- RANKS_ARGS..." >&2; exit 2; }
  shift
  out="$(realpath -m "${MEMFIT_SWEEP_OUT:-runs/slurm-ranks-$(date -u +%Y%m%dT%H%M%SZ)}")"
  mkdir -p "$out"
  bin="${MEMFIT_BIN:-$PWD/target/release/memfit}"
  [[ -x "$bin" ]] || cargo build --release --features ranks --quiet
  args="$(printf "'%s' " "$@")"
  job=$(sbatch --parsable --job-name=memfit-ranks --ntasks="$n" --output="$out/ranks.log" "${sb[@]}" \
    --wrap="srun --mpi=pmix '$bin' ranks $args --json > '$out/ranks.json'")
  echo "ranks job ${job%%;*} ($n tasks), out $out"
  exit 0
fi
workload="${1:?usage: scripts/slurm-sweep.sh WORKLOAD --array N [sbatch options...]}"
shift
[[ "${1:-}" == "--array" && -n "${2:-}" ]] || { echo "usage: scripts/slurm-sweep.sh WORKLOAD --array N [sbatch options...]" >&2; exit 2; }
n="$2"
shift 2
[[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "slurm-sweep: --array takes a number of tasks, not '$n'" >&2; exit 2; }
[[ -f "$workload" ]] || { echo "slurm-sweep: $workload: no such workload file" >&2; exit 2; }
out="$(realpath -m "${MEMFIT_SWEEP_OUT:-runs/slurm-$(date -u +%Y%m%dT%H%M%SZ)}")"
mkdir -p "$out"
gpu=()
if grep -Eq '^[[:space:]]*device[[:space:]]*=[[:space:]]*"cuda' "$workload"; then
  gpu=(--gres=gpu:1)
  bin="${MEMFIT_BIN:-$PWD/scripts/memfit-cuda}"
else
  bin="${MEMFIT_BIN:-$PWD/target/release/memfit}"
  [[ -x "$bin" ]] || cargo build --release --quiet
fi
wl="$(realpath "$workload")"
array=$(sbatch --parsable --job-name=memfit-sweep --array="0-$((n - 1))" --requeue \
  --output="$out/shard-%a.log" --open-mode=append "${gpu[@]}" "$@" \
  --wrap="exec '$bin' run '$wl' --shard auto --resume --quiet ${MEMFIT_RUN_ARGS:-} --out \"$out/shard-\$SLURM_ARRAY_TASK_ID\"")
array="${array%%;*}"
merge=$(sbatch --parsable --job-name=memfit-merge --dependency="afterany:$array" \
  --output="$out/merge.log" "$@" \
  --wrap="for i in \$(seq 0 $((n - 1))); do [ -d '$out'/shard-\$i ] || echo \"shard \$i: no folder (the task never ran)\"; done; exec '$bin' merge '$out'/shard-*/ --out '$out/merged'")
merge="${merge%%;*}"
echo "array job $array ($n tasks), merge job $merge, out $out"
