#!/usr/bin/env bash
# Quick start, command 1: install what is missing, build in release mode, run the embedded
# default workload on the CPU. Extra arguments go to `memfit run` (e.g. --out DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cargo build --release --quiet
exec ./target/release/memfit run "$@"
