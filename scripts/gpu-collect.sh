#!/usr/bin/env bash
# Back here after scripts/gpu-run.sh: unpacks what the device tool brought back (its files_at
# folder: results.tar.gz and the logs) into results/h200/<run id>/ (the main sweep's journal,
# meta.json and logs at the top; the smoke test, its twin at the pool's release threshold 0
# and data loading as smoke/, smoke-release0/ and dataload/),
# rebuilds CSV and HDF5 from each journal with `memfit convert`, and prints the folder to
# commit (add a README.md there saying what ran).
#   MEMFIT_BIN      the memfit binary to convert with (default: target/release/memfit, built)
#   MEMFIT_RESULTS  where run folders go (default: results/h200)
set -euo pipefail
cd "$(dirname "$0")/.."
src="${1:?usage: scripts/gpu-collect.sh FILES_AT (the folder the device tool returned)}"
[[ -f "$src/results.tar.gz" ]] || { echo "gpu-collect: no results.tar.gz under $src (see $src/time.txt)" >&2; exit 2; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
tar -C "$tmp" -xzf "$src/results.tar.gz"
main="$tmp/results/run"
if [[ ! -f "$main/results.jsonl" ]]; then
  echo "gpu-collect: the archive holds no main sweep (results/run/results.jsonl); smoke test only?" >&2
  main="$tmp/results/smoke"
fi
[[ -f "$main/meta.json" ]] || { echo "gpu-collect: no meta.json in $main" >&2; exit 2; }
id="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["run_id"])' "$main/meta.json")"
dst="${MEMFIT_RESULTS:-results/h200}/$id"
mkdir -p "$dst"
memfit="${MEMFIT_BIN:-}"
if [[ -z "$memfit" ]]; then
  cargo build --release --quiet
  memfit=target/release/memfit
fi
copy_run() { # FROM TO: the journal and what belongs with it, then CSV/HDF5 rebuilt
  mkdir -p "$2"
  for f in results.jsonl meta.json superseded.jsonl; do [[ -f "$1/$f" ]] && cp "$1/$f" "$2/"; done
  "$memfit" convert "$2"
}
copy_run "$main" "$dst"
for part in smoke smoke-release0 dataload; do
  if [[ -f "$tmp/results/$part/results.jsonl" && "$tmp/results/$part" != "$main" ]]; then
    copy_run "$tmp/results/$part" "$dst/$part"
  fi
done
for f in machine.txt smoke.log sweep.log dataload.log torch.log time.txt; do [[ -f "$src/$f" ]] && cp "$src/$f" "$dst/"; done
echo "$dst"
