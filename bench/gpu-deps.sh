#!/usr/bin/env bash
# bench/gpu-deps.sh: fetches what bench/gpu-check.sh needs besides nvcc and a C++ compiler — xxhash
# and GoogleTest's sources — as Debian packages and unpacks them into ./gpu-deps (kept out of git), for
# GPU machines that cannot install packages or reach a mirror. Run it here, then carry gpu-deps along.
# Exit code: apt-get's or dpkg's on failure, 0 otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf gpu-deps && mkdir -p gpu-deps/debs
(cd gpu-deps/debs && apt-get download libxxhash-dev libxxhash0 googletest)
for d in gpu-deps/debs/*.deb; do dpkg -x "$d" gpu-deps; done
du -sh gpu-deps
