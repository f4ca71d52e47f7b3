#!/usr/bin/env bash
# bench/gpu-deps-check.sh: shows, on this machine, that culprit builds and runs from the packages
# bench/gpu-deps.sh fetches alone, as it must on a GPU machine that lacks them. In a mount namespace
# where this machine's own Open MPI, PMIx, parallel HDF5 and Boost files are hidden (bind mounts over
# them: root and unshare needed), it sources bench/gpu-env.sh as gpu-train.sh does, configures and
# builds culprit (against Debian's CPU libtorch), checks which libraries it loads, and trains on 2
# ranks with the brought mpirun. About 10 minutes on 2 cores (build-gpu-deps/, kept).
# Exit code: 0 when all of that worked.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" != --inside ]; then
  [ -d gpu-deps/debs/core ] || bash bench/gpu-deps.sh
  exec unshare -m --propagation private "$0" --inside
fi

# A machine without those packages: every file they installed here reads as empty, their directories
# as empty directories.
hidden_dirs=(/usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /usr/lib/x86_64-linux-gnu/hdf5/openmpi
             /usr/include/hdf5/openmpi /usr/include/boost /etc/openmpi /usr/share/openmpi)
empty=$(mktemp -d)
for d in "${hidden_dirs[@]}"; do [ -d "$d" ] && mount --bind "$empty" "$d"; done
pattern="^($(IFS='|'; echo "${hidden_dirs[*]}"))/"
for p in libopenmpi3 libopenmpi-dev openmpi-bin openmpi-common libpmix2 libpmix-dev libhdf5-openmpi-103-1 \
         libhdf5-openmpi-dev libboost-program-options1.74.0 libboost-program-options1.74-dev libboost1.74-dev; do
  dpkg -L "$p" 2>/dev/null || true
done | sort -u | grep -vE "$pattern" | while read -r f; do
  { [ -f "$f" ] && [ ! -L "$f" ] && mount --bind /dev/null "$f"; } || true
done
if command -v mpicxx >/dev/null && mpicxx --version >/dev/null 2>&1; then
  echo "gpu-deps-check: this machine's mpicxx still works: hiding failed"; exit 1
fi

. bench/gpu-env.sh
gpu_deps_use_mpi || { echo "gpu-deps-check: gpu-deps/debs unusable"; exit 1; }
echo "gpu-deps-check: linked libraries taken from the packages: $(ls "$GPU_DEPS_ROOT/usr/lib/culprit-extra" | wc -l)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
build=build-gpu-deps
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${GPU_DEPS_CMAKE[@]}" -DCULPRIT_BUILD_TESTS=OFF \
  -DCULPRIT_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" --target culprit
echo "gpu-deps-check: culprit loads"
ldd "$build/culprit" | grep -E "libmpi|libhdf5_openmpi|boost_program|libxxhash"
if ldd "$build/culprit" | grep -E "libmpi|libhdf5_openmpi|boost_program" | grep -qv "$GPU_DEPS_ROOT"; then
  echo "gpu-deps-check: FAIL: a library from outside gpu-deps"; exit 1
fi
run=$(mktemp -d)
mpirun --oversubscribe --bind-to none -np 2 "$build/culprit" train --run-dir "$run/a" --model mlp --steps 5 --quiet
mpirun --oversubscribe --bind-to none -np 1 "$build/culprit" train --run-dir "$run/b" --model mlp --steps 5 --quiet
a=$(tail -n 1 "$run/a/metrics.jsonl") b=$(tail -n 1 "$run/b/metrics.jsonl")
fp() { sed 's/.*"fingerprint": "\([0-9a-f]*\)".*/\1/' <<<"$1"; }
echo "gpu-deps-check: final fingerprints W=2 $(fp "$a"), W=1 $(fp "$b")"
[ "$(fp "$a")" = "$(fp "$b")" ] && echo "gpu-deps-check: PASS" || { echo "gpu-deps-check: FAIL: W=2 and W=1 differ"; exit 1; }
rm -rf "$run"
