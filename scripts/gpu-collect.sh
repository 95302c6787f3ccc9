#!/usr/bin/env bash
# Back here after scripts/gpu-run.sh: copies what the device tool brought back (its files_at
# folder) into results/h200/<run id>/, derives CSV and HDF5 from the journal with
# `memfit convert`, and prints the folder to commit (add a README.md there saying what ran).
set -euo pipefail
cd "$(dirname "$0")/.."
src="${1:?usage: scripts/gpu-collect.sh FILES_AT (the folder the device tool returned)}"
[[ -f "$src/run/results.jsonl" ]] || { echo "no run/results.jsonl under $src" >&2; exit 2; }
id="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_id"])' "$src/run/meta.json")"
dst="results/h200/$id"
mkdir -p "$dst"
cp "$src/run/results.jsonl" "$src/run/meta.json" "$dst/"
for f in machine.txt sweep.log dataload.log time.txt; do [[ -f "$src/$f" ]] && cp "$src/$f" "$dst/"; done
cargo build --release --quiet
target/release/memfit convert "$dst"
if [[ -f "$src/dataload/results.jsonl" ]]; then
  mkdir -p "$dst/dataload"
  cp "$src/dataload/results.jsonl" "$src/dataload/meta.json" "$dst/dataload/"
  target/release/memfit convert "$dst/dataload"
fi
echo "$dst"
