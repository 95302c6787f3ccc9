#!/usr/bin/env bash
# Quick start, command 2: install what is missing, then run the whole test suite on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export RAYON_NUM_THREADS="${RAYON_NUM_THREADS:-2}"
cargo test --all-targets
cargo test --doc
