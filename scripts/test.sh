#!/usr/bin/env bash
# Quick start, command 2: install what is missing (scripts/setup.sh test: the build's packages
# and what the tests use), then run the whole test suite on the CPU and
# compile-check the CUDA backend (no GPU needed; MEMFIT_SKIP_CUDA_CHECK=1 skips that part).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
export RAYON_NUM_THREADS="${RAYON_NUM_THREADS:-2}"
# `ranks`: memfit ranks over MPI, whose tests (tests/ranks.rs) launch 1–4 ranks with mpirun.
cargo test --all-targets --features ranks
cargo test --doc --features ranks
if [[ "${MEMFIT_SKIP_CUDA_CHECK:-0}" == 1 ]]; then
  echo "cuda check SKIPPED (MEMFIT_SKIP_CUDA_CHECK=1)" >&2
else
  scripts/cuda-check.sh
fi
