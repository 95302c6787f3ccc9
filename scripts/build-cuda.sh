#!/usr/bin/env bash
# Builds the CUDA memfit here (no GPU needed) and packs what the GPU machine needs into
# dist/gpu/ (git-ignored; pass it in the device tool's `carry`) with scripts/gpu-pack.sh:
#   dist/gpu/memfit.xz   the binary built with `--features cuda` (sm_90: H100/H200), without
#                        HDF5 (the GPU image has no libhdf5: the run there writes the journal
#                        and CSV; scripts/gpu-collect.sh rebuilds results.h5 here), so it links
#                        nothing the machine lacks; it also runs the numeric self-checks there
#                        (`memfit selftest --device cuda:0`), so no test binaries travel
#   dist/gpu/BUILD       commit, date, toolchain of the build
#   dist/gpu/MANIFEST    sizes and checksums (scripts/gpu-unpack.sh checks them there)
# It prints what the device tool would send (tree + dist/gpu) and fails above 40 MiB
# (MEMFIT_TRAVEL_LIMIT_MIB) — the tool refuses a call above 64.
# The CUDA toolchain comes from PyPI wheels (scripts/cuda-toolchain.sh, full mode: ≈ 650 MB
# download once, cached in $MEMFIT_CUDA_TOOLCHAIN, default ~/.cache/memfit/cuda-toolchain).
# A clean build took 13 m 44 s on 2 cores (12 m 42 s of it cargo), a rebuild after a change in
# memfit 3 m 02 s. Run the sweep there with scripts/gpu-run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh cuda
TC="${MEMFIT_CUDA_TOOLCHAIN:-$HOME/.cache/memfit/cuda-toolchain}"
scripts/cuda-toolchain.sh "$TC" full > /dev/null
# shellcheck disable=SC1091
source "$TC/env.sh"
export CUDAFORGE_THREADS="${CUDAFORGE_THREADS:-$(nproc)}"
cargo build --release --no-default-features --features cuda --bin memfit
# Debug info stays here (target/); the carried copy is stripped.
MEMFIT_BUILD_FEATURES="cuda (no default features: no hdf5)" \
  scripts/gpu-pack.sh target/release/memfit dist/gpu
