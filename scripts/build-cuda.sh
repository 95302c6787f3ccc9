#!/usr/bin/env bash
# Builds the CUDA memfit here (no GPU needed) and packs what the GPU machine needs into
# dist/gpu/ (git-ignored; pass it in the device tool's `carry`):
#   dist/gpu/memfit.gz     the binary built with `--features cuda` (sm_90: H100/H200)
#   dist/gpu/lib.tar.gz    the HDF5 library chain it links (the GPU image has no libhdf5)
#   dist/gpu/tests.tar.gz  tests/kernels and tests/inplace_optim built with cuda (run on the GPU)
#   dist/gpu/BUILD         commit, date, toolchain of the build
# The CUDA toolchain comes from PyPI wheels (scripts/cuda-toolchain.sh, full mode: ≈ 650 MB
# download once, cached in $MEMFIT_CUDA_TOOLCHAIN, default ~/.cache/memfit/cuda-toolchain).
# A clean build takes ≈ 8 minutes on 2 cores. Run the sweep there with scripts/gpu-run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh cuda
TC="${MEMFIT_CUDA_TOOLCHAIN:-$HOME/.cache/memfit/cuda-toolchain}"
scripts/cuda-toolchain.sh "$TC" full > /dev/null
# shellcheck disable=SC1091
source "$TC/env.sh"
export CUDAFORGE_THREADS="${CUDAFORGE_THREADS:-$(nproc)}"
cargo build --release --features cuda --bin memfit

bin=target/release/memfit
out=dist/gpu
rm -rf "$out" && mkdir -p "$out/lib"
# Debug info stays here (target/); the carried copy is stripped (≈ 11 MB gzipped).
objcopy --strip-debug "$bin" "$out/memfit.stripped"
gzip -c "$out/memfit.stripped" > "$out/memfit.gz" && rm "$out/memfit.stripped"
# Every library the binary needs except glibc's own and the CUDA/driver ones (the GPU machine
# has those: the driver's libcuda, PyTorch's cu13 wheels).
ldd "$bin" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libgcc_s.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|ld-linux*) ;;
    libcuda.so*|libcudart.so*|libcublas*|libcurand.so*|libnvrtc*|libstdc++.so*) ;;
    *) cp -L "$lib" "$out/lib/" ;;
  esac
done
tar -C "$out" -czf "$out/lib.tar.gz" lib && rm -rf "$out/lib"
# The numeric test binaries the GPU call runs on the device (MEMFIT_TEST_DEVICE=cuda:0): the
# fused kernels' CUDA forwards and the in-place optimizer updates against candle's own ops.
mkdir -p "$out/tests"
cargo test --release --features cuda --test kernels --test inplace_optim --no-run \
    --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["target"]["name"], m["executable"])' | while read -r name exe; do
  objcopy --strip-debug "$exe" "$out/tests/$name"
done
tar -C "$out" -czf "$out/tests.tar.gz" tests && rm -rf "$out/tests"
{
  echo "commit $(git rev-parse HEAD)$(git diff --quiet || echo ' (dirty)')"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(ldd --version | head -1)"
  echo "nvcc $(nvcc --version | tail -1)"
  echo "CUDA_COMPUTE_CAP $CUDA_COMPUTE_CAP"
} > "$out/BUILD"
du -sh "$out"/*
