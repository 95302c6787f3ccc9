# Sourced by scripts/bench-*.sh: building the two binaries, locking, the machine's description.
# shellcheck shell=bash
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BIN_DIR="$ROOT/target/bench"
export RAYON_NUM_THREADS="${RAYON_NUM_THREADS:-2}"

# MEMFIT_BENCH_LOCK=FILE: every timed run holds `flock FILE` (a shared machine: no build runs
# beside a timing). Unset: no lock.
locked() {
  if [[ -n "${MEMFIT_BENCH_LOCK:-}" ]]; then flock "$MEMFIT_BENCH_LOCK" "$@"; else "$@"; fi
}

# The metered release binary (the usual one) and the `unmetered` one, kept side by side in
# target/bench (building one feature set after the other rebuilds only memfit itself).
# MEMFIT_BENCH_REBUILD=1 rebuilds them. MEMFIT_BENCH_BIN=PATH (the smoke test in
# tests/bench_scripts.rs) builds nothing and uses that one binary in both roles: the script's
# plumbing is exercised, its figures mean nothing (the summaries say so).
build_bins() {
  if [[ -n "${MEMFIT_BENCH_BIN:-}" ]]; then
    BIN_DIR="$(mktemp -d)"
    ln -s "$MEMFIT_BENCH_BIN" "$BIN_DIR/memfit-metered"
    ln -s "$MEMFIT_BENCH_BIN" "$BIN_DIR/memfit-unmetered"
    echo "bench: smoke run with $MEMFIT_BENCH_BIN in both roles: the figures below mean nothing" >&2
    return
  fi
  mkdir -p "$BIN_DIR"
  if [[ "${MEMFIT_BENCH_REBUILD:-0}" == 1 || ! -x "$BIN_DIR/memfit-metered" ]]; then
    (cd "$ROOT" && locked cargo build --release --quiet)
    cp "$ROOT/target/release/memfit" "$BIN_DIR/memfit-metered"
  fi
  if [[ "${1:-}" == both && ( "${MEMFIT_BENCH_REBUILD:-0}" == 1 || ! -x "$BIN_DIR/memfit-unmetered" ) ]]; then
    (cd "$ROOT" && locked cargo build --release --quiet --features unmetered)
    cp "$ROOT/target/release/memfit" "$BIN_DIR/memfit-unmetered"
    # Leave target/release/memfit as the metered build.
    (cd "$ROOT" && locked cargo build --release --quiet)
  fi
}

# One line about the machine, for the summaries.
machine() {
  local cpu mem
  cpu="$(lscpu | sed -n 's/^Model name: *//p' | head -1)"
  mem="$(free -g | awk '/^Mem:/{print $2 " GiB"}')"
  echo "$(nproc) CPUs ($cpu), $mem RAM, RAYON_NUM_THREADS=$RAYON_NUM_THREADS"
}

# Seconds since the epoch, nanosecond resolution.
now() { date +%s.%N; }

# timed_locked FILE CMD… : runs CMD under the lock (if any) and writes "START END" (seconds since
# the epoch) to FILE, taken inside the lock, so waiting for it is never timed. Returns CMD's status.
timed_locked() {
  local file="$1"; shift
  locked bash -c 's=$(date +%s.%N); "${@:2}"; rc=$?; e=$(date +%s.%N); echo "$s $e" >"$1"; exit $rc' _ "$file" "$@"
}

# PyTorch + transformers at their pinned versions in $TORCH_VENV (installed when missing: about
# 7 GB, minutes): for the scripts that run PyTorch beside memfit (bench-torch.sh,
# bench-saved.sh, torch-compare.sh), never in CI.
TORCH_VENV="${TORCH_VENV:-$HOME/.cache/memfit/torch-venv}"
TORCH_VERSION="${TORCH_VERSION:-2.9.1}"
TRANSFORMERS_VERSION="${TRANSFORMERS_VERSION:-4.57.1}"
need_torch() {
  if ! "$TORCH_VENV/bin/python" -c "import torch, transformers" 2>/dev/null; then
    python3 -m venv "$TORCH_VENV"
    "$TORCH_VENV/bin/pip" install -q "torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION"
  fi
}
