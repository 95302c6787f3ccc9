#!/usr/bin/env bash
# Regenerates the committed CPU results (results/cpu/) from the workloads, as each workload's
# header says, then the report (docs/report/). Each run goes to a fresh folder first and
# replaces the committed one only when it finished, so a failure leaves the old results.
# About 51 minutes on 2 cores (measured 2026-12-05 at 3d40a0d; seed-moe 25 of them); keep the machine otherwise idle (the
# rows' times are measured).
#
#   scripts/results-cpu.sh                  # every workload below
#   scripts/results-cpu.sh seed-vit default # just those
#
# seed-dataload and seed-persistent read an 80 MB dataset (data/seed-dataload, made first when
# missing: see seed-dataload's header); torch-compare, the PyTorch reference run, needs PyTorch
# (scripts/torch-compare.sh) and is not rerun here.
set -euo pipefail
cd "$(dirname "$0")/.."
memfit="${MEMFIT_BIN:-}"
if [[ -z "$memfit" ]]; then
  cargo build --release --quiet
  memfit=target/release/memfit
fi
all=(default seed-attention seed-checkpoint seed-decode seed-decode-threads seed-f3-slice
     seed-f5-time seed-llama seed-llama-real seed-load seed-lora seed-optimizers seed-precision
     seed-quantized seed-vit seed-moe seed-dataload seed-persistent)
names=("$@")
(( ${#names[@]} )) || names=("${all[@]}")
new="results/.cpu-new"
# `memfit run`, where exit 3 (every row written, some case out of memory or failed: the rows say
# which, as some seed workloads mean them to) is a finished set; any other failure stops here.
measure() { "$memfit" run "$@" || { local rc=$?; (( rc == 3 )) || exit "$rc"; }; }
for name in "${names[@]}"; do
  if [[ "$name" == seed-dataload || "$name" == seed-persistent ]] && [[ ! -f data/seed-dataload/manifest.json ]]; then
    "$memfit" dataset make --out data/seed-dataload --count 256 --size 256-512
  fi
done
for name in "${names[@]}"; do
  rm -rf "${new:?}/$name"
  mkdir -p "$new/$name"
  case "$name" in
    seed-decode-threads)
      for t in 1 2; do measure "workloads/$name.toml" --threads "$t" --out "$new/$name/t$t" --quiet; done ;;
    seed-f5-time|seed-persistent|seed-dataload)
      for i in 1 2 3; do measure "workloads/$name.toml" --out "$new/$name/r$i" --quiet; done ;;
    *)
      measure "workloads/$name.toml" --out "$new/$name" --quiet ;;
  esac
  # A README beside the rows (how the set was made) stays.
  [[ -f "results/cpu/$name/README.md" ]] && cp "results/cpu/$name/README.md" "$new/$name/"
  rm -rf "results/cpu/$name"
  mv "$new/$name" "results/cpu/$name"
  echo "results-cpu: $name done ($(date -u +%H:%M:%S))"
done
rmdir "$new" 2>/dev/null || true
if [[ $# -eq 0 ]]; then
  # The measured timelines the report draws (one small case's train step and serving phases;
  # its rows are the trace's own and not kept: the seed workloads measure these phases).
  rm -rf results/cpu/timeline "$new-timeline"
  "$memfit" run --preset llama-tiny --batch 2 --seq 32 --decode-tokens 3 --threads 1 \
    --phases train-step,inference,prefill,decode --out "$new-timeline" \
    --timeline results/cpu/timeline --quiet
  rm -rf "$new-timeline"
fi
"$memfit" report results/cpu --out docs/report --measure-cpu-peak
