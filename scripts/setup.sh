#!/usr/bin/env bash
# Installs what memfit needs to build and test on Debian/Ubuntu, idempotently:
# libhdf5-dev (the HDF5 C library the `hdf5` crate links), pkg-config (finds it), and
# hdf5-tools (h5dump, used by the tests as a foreign reader), and python3-pip + gcc (the CUDA
# check lays out its toolchain from PyPI wheels), and chromium (tests/report.rs renders report.html
# headless: every image loads, no console error), and valgrind + heaptrack (the heap profilers
# scripts/bench-profilers.sh compares memfit with; tests/bench_scripts.rs runs it once, tiny).
# Does nothing when all are there.
set -euo pipefail
need=()
for pkg in libhdf5-dev pkg-config hdf5-tools python3-pip gcc chromium valgrind heaptrack; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "memfit setup: installing ${need[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
