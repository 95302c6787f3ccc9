#!/usr/bin/env bash
# gpu-pack.sh BIN OUT — packs a memfit binary into OUT (dist/gpu's layout), the one folder the
# GPU call carries, and checks that everything the device tool would send fits:
#   OUT/memfit.xz    BIN, debug info stripped, xz-compressed (decoded there with xz, else
#                    Python's lzma: scripts/gpu-unpack.sh)
#   OUT/lib.tar.xz   the libraries BIN links that are neither glibc's nor CUDA's/the driver's
#                    (the GPU machine has those); absent when there are none — the CUDA build
#                    is made without HDF5, so normally there are none
#   OUT/BUILD        commit, date, toolchain
#   OUT/MANIFEST     each archive's bytes and sha256 (gpu-unpack.sh checks them), and what
#                    unpacks from it
# The device tool sends the tracked files, the untracked files git does not ignore and the
# carried paths, 64 MiB at most, or refuses the call. This prints that total and fails above
# MEMFIT_TRAVEL_LIMIT_MIB (40: room for the results and fixtures the tree will gain).
# scripts/build-cuda.sh calls it with the CUDA build; the dry run's test with the CPU build.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:?usage: scripts/gpu-pack.sh BIN OUT}"
out="${2:?usage: scripts/gpu-pack.sh BIN OUT}"
limit_mib="${MEMFIT_TRAVEL_LIMIT_MIB:-40}"
[[ -x "$bin" ]] || { echo "gpu-pack: $bin is not an executable" >&2; exit 2; }
rm -rf "$out" && mkdir -p "$out"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

objcopy --strip-debug "$bin" "$work/memfit"
# MEMFIT_XZ_LEVEL: -9e (the default) packs smallest; the tests pass -0 (same layout, fast).
level="${MEMFIT_XZ_LEVEL:--9e}"
xz "$level" -T1 -c "$work/memfit" > "$out/memfit.xz"
libs=()
while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libgcc_s.so*|libdl.so*|libpthread.so*|librt.so*|libresolv.so*|ld-linux*) ;;
    libcuda.so*|libcudart.so*|libcublas*|libcurand.so*|libnvrtc*|libnvidia-ml.so*|libstdc++.so*) ;;
    *) libs+=("$lib") ;;
  esac
done < <(ldd "$bin" | awk '$3 ~ /^\// {print $3}')
if (( ${#libs[@]} > 0 )); then
  mkdir -p "$work/lib"
  cp -L "${libs[@]}" "$work/lib/"
  tar -C "$work" -cf - lib | xz "$level" -T1 > "$out/lib.tar.xz"
fi
{
  if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    echo "commit $(git rev-parse HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (dirty)')"
  else
    echo "commit unknown (not a git checkout)"
  fi
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(ldd --version | head -1)"
  if command -v nvcc > /dev/null; then echo "nvcc $(nvcc --version | tail -1)"; fi
  echo "CUDA_COMPUTE_CAP ${CUDA_COMPUTE_CAP:-none}"
  echo "cargo features ${MEMFIT_BUILD_FEATURES:-default}"
  echo "version $("$work/memfit" --version 2>/dev/null || echo '?')"
} > "$out/BUILD"
{
  echo "# file bytes sha256 unpacks-to"
  echo "memfit.xz $(stat -c %s "$out/memfit.xz") $(sha256sum "$out/memfit.xz" | cut -d' ' -f1) bin/memfit"
  if [[ -f "$out/lib.tar.xz" ]]; then
    echo "lib.tar.xz $(stat -c %s "$out/lib.tar.xz") $(sha256sum "$out/lib.tar.xz" | cut -d' ' -f1) lib/ ($(cd "$work/lib" && ls | tr '\n' ' '))"
  fi
} > "$out/MANIFEST"

# What the device tool would send: tracked + untracked-not-ignored files of the tree, and OUT.
# Outside a git checkout (a source archive), every file but the ignored top-level folders.
files() {
  if git rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard
  else
    find . \( -path ./target -o -path ./runs -o -path ./results/scratch -o -path ./dist -o -path ./data -o -path ./.git \) -prune -o -type f -print0
  fi
}
tree=0
while IFS= read -r -d '' f; do
  [[ -f "$f" && ! -L "$f" ]] && tree=$(( tree + $(stat -c %s "$f") ))
done < <(files)
dist=$(du -sb "$out" | cut -f1)
total=$(( tree + dist ))
mib() { awk -v b="$1" 'BEGIN { printf "%.1f", b / 1048576 }'; }
echo "travel: tree $(mib "$tree") MiB + $(basename "$out") $(mib "$dist") MiB = $(mib "$total") MiB of the device tool's 64 (limit here ${limit_mib})" | tee -a "$out/MANIFEST"
ls -l "$out"
if (( total > limit_mib * 1048576 )); then
  echo "gpu-pack: $(mib "$total") MiB would travel, over the ${limit_mib} MiB limit: shrink the tree or the build" >&2
  exit 1
fi
