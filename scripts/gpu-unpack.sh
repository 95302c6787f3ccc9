#!/usr/bin/env bash
# gpu-unpack.sh DIST — unpacks what scripts/gpu-pack.sh packed, in place: DIST/bin/memfit and,
# if packed, DIST/lib/. Each archive is checked against DIST/MANIFEST (bytes and sha256) first,
# so a truncated or stale copy is named instead of crashing later. xz decodes with the `xz`
# command where there is one, else with Python's lzma module (the GPU machine has Python).
# Idempotent: a finished unpack is left as it is. Used by scripts/memfit-cuda (on the GPU
# machine) and by the CPU dry run of scripts/gpu-run.sh, so both exercise the same layout.
set -euo pipefail
dist="${1:?usage: scripts/gpu-unpack.sh DIST}"
[[ -f "$dist/MANIFEST" ]] || { echo "gpu-unpack: no $dist/MANIFEST (scripts/build-cuda.sh makes dist/gpu)" >&2; exit 3; }
[[ -f "$dist/UNPACKED" && -x "$dist/bin/memfit" ]] && exit 0

unxz_to() { # ARCHIVE: decoded bytes on stdout
  if command -v xz > /dev/null; then
    xz -dc "$1"
  else
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), sys.stdout.buffer)' "$1"
  fi
}

while read -r name bytes sum _; do
  [[ "$name" == "#"* || "$name" == "travel:" ]] && continue
  f="$dist/$name"
  [[ -f "$f" ]] || { echo "gpu-unpack: $f is missing (MANIFEST lists it)" >&2; exit 3; }
  got_bytes=$(stat -c %s "$f")
  got_sum=$(sha256sum "$f" | cut -d' ' -f1)
  if [[ "$got_bytes" != "$bytes" || "$got_sum" != "$sum" ]]; then
    echo "gpu-unpack: $f is $got_bytes bytes, sha256 $got_sum; MANIFEST says $bytes, $sum" >&2
    exit 3
  fi
  case "$name" in
    memfit.xz)
      mkdir -p "$dist/bin"
      unxz_to "$f" > "$dist/bin/memfit.part"
      chmod +x "$dist/bin/memfit.part"
      mv "$dist/bin/memfit.part" "$dist/bin/memfit" ;;
    lib.tar.xz)
      rm -rf "$dist/lib"
      unxz_to "$f" | tar -C "$dist" -xf - ;;
    *) echo "gpu-unpack: unknown archive $name in MANIFEST" >&2; exit 3 ;;
  esac
done < "$dist/MANIFEST"
[[ -x "$dist/bin/memfit" ]] || { echo "gpu-unpack: MANIFEST names no memfit.xz" >&2; exit 3; }
# Written last: its presence means every archive was unpacked.
date -u +%Y-%m-%dT%H:%M:%SZ > "$dist/UNPACKED"
