#!/usr/bin/env bash
# bench/gpu-check.sh: the CUDA checks in one command on a machine with an NVIDIA GPU (under 8 minutes).
#
#   bench/gpu-check.sh            results in $OUT/gpu-check.txt (OUT default: build-gpu/out)
#
# Builds bench/gpu (a small CMake project: the GPU fingerprint kernel, the CPU fingerprint and their
# tests; it needs nvcc and a C++ compiler only, with xxhash and GoogleTest from the system or from
# the Debian packages bench/gpu-deps.sh fetches into gpu-deps/debs, brought along and unpacked by
# bench/gpu-env.sh) for sm_80 and sm_90, then runs
#   - XXH3 of every chunk length against libxxhash (the kernels' code compiled for the host, whole
#     and split in eight lanes),
#   - GPU fingerprint == CPU fingerprint for sizes 0 .. 16 MiB and dtypes float32, float64, int64,
#     bfloat16, uint8, with both kernels (eight lanes per chunk, the default; one thread per chunk),
#     and a flipped bit changing it,
#   - both kernels' bandwidth against a device-to-device copy of the same bytes (64 MiB, 1 GiB;
#     target at least 0.8x),
#   - the GPU screen's kernels: results bitwise equal to the CPU reference, a flipped bit caught.
# and, where a CUDA-enabled torch is found (the torch of CULPRIT_PYTHON, or of python3, when it sees
# a GPU) along with MPI, HDF5 and Boost development files, GPU training:
# culprit built against that libtorch, `--device cuda` on 2 ranks twice (bitwise the same run to run)
# and on 1 rank (the same bits at another world size), with a NaN injected on GPU tensors caught;
# and `culprit screen --device cuda` clean (passes) and with a bit flipped in its GPU matmul (fails).
# Not run here: the tree reduction over NCCL (docs/cuda.md) needs culprit's full configure with
# -DCULPRIT_NCCL=ON and GTest; build culprit_nccl_tests, run `mpirun -np <GPUs> tests/culprit_nccl_tests`.
# Exit code: the tests' (0 all passed).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-build-gpu/out}"
mkdir -p "$out"
log="$out/gpu-check.txt"
{
  echo "culprit GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "nvidia-smi: not found"
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  "$nvcc" --version | tail -n 2
  . bench/gpu-env.sh  # unpacks gpu-deps/debs (bench/gpu-deps.sh) when they were brought along
  cmake -S bench/gpu -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DDEPS_ROOT="$GPU_DEPS_ROOT" >/dev/null && cmake --build build-gpu -j "$(nproc)" >/dev/null || {
    echo "gpu-check: the build failed (rerun: cmake --build build-gpu)"
    exit 2
  }
  build-gpu/culprit_cuda_tests
  rc=$?
  echo "gpu-check: tests exit $rc"
  bench/gpu-train.sh || rc=$((rc == 0 ? 3 : rc))
  exit $rc
} 2>&1 | tee "$log"
exit "${PIPESTATUS[0]}"
