#!/usr/bin/env bash
# Compile-checks the `cuda` feature on a machine without a GPU or CUDA: lays out the check-only
# CUDA toolchain from PyPI wheels (scripts/cuda-toolchain.sh, idempotent, ≈ 100 MB, cached in
# $MEMFIT_CUDA_TOOLCHAIN, default ~/.cache/memfit/cuda-toolchain), then runs
# `cargo check --features cuda` on every target. About 5 minutes on 2 cores the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
TC="${MEMFIT_CUDA_TOOLCHAIN:-$HOME/.cache/memfit/cuda-toolchain}"
scripts/cuda-toolchain.sh "$TC" check > /dev/null
# shellcheck disable=SC1091
source "$TC/env.sh"
export CUDAFORGE_THREADS="${CUDAFORGE_THREADS:-$(nproc)}"
cargo check --release --features cuda --all-targets
# The GPU machine's build exactly (scripts/build-cuda.sh: no HDF5).
cargo check --release --no-default-features --features cuda --bin memfit
