#!/usr/bin/env bash
# Installs, idempotently on Debian/Ubuntu, what memfit needs:
#   scripts/setup.sh         building and running: libhdf5-dev (the HDF5 C library the `hdf5`
#                            crate links) and pkg-config (finds it). scripts/run.sh uses this.
#   scripts/setup.sh cuda    and python3-pip + gcc: the CUDA build and check lay out their
#                            toolchain from PyPI wheels (scripts/build-cuda.sh, cuda-check.sh).
#   scripts/setup.sh test    all of that and what the tests use besides: hdf5-tools (h5dump, a
#                            foreign reader of the HDF5 files), chromium (tests/report.rs renders
#                            report.html headless), valgrind + heaptrack (the heap profilers
#                            scripts/bench-profilers.sh compares memfit with; tests/bench_scripts.rs
#                            runs it once, tiny), Open MPI + libclang (the `ranks` feature:
#                            the mpi crate's bindings; tests/ranks.rs runs mpirun).
#                            scripts/test.sh uses this.
# Does nothing when all are there.
set -euo pipefail
pkgs=(libhdf5-dev pkg-config)
case "${1:-}" in
  "") ;;
  cuda) pkgs+=(python3-pip gcc) ;;
  test) pkgs+=(python3-pip gcc hdf5-tools chromium valgrind heaptrack libopenmpi-dev openmpi-bin libclang-dev) ;;
  *) echo "setup.sh: unknown set '$1' (none, cuda or test)" >&2; exit 2 ;;
esac
need=()
for pkg in "${pkgs[@]}"; do
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
