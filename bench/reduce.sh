#!/usr/bin/env bash
# Tree reduction vs MPI_Allreduce, 4 ranks, 1-64 MiB, twice: with glibc's default allocator
# settings, and with glibc told to keep freed memory (so Open MPI's per-call temporary buffers
# stop costing fresh page faults). Needs a build in ./build.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
np="${NP:-4}"
echo "### glibc defaults"
mpirun --oversubscribe --bind-to none -np "$np" build/bench/tree_reduce_bench --reps 15
echo
echo "### MALLOC_MMAP_THRESHOLD_=1GiB MALLOC_TRIM_THRESHOLD_=4GiB (freed memory kept)"
mpirun --oversubscribe --bind-to none -x MALLOC_MMAP_THRESHOLD_=1073741824 -x MALLOC_TRIM_THRESHOLD_=4294967296 \
  -np "$np" build/bench/tree_reduce_bench --reps 15
