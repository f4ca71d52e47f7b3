#!/usr/bin/env bash
# README command 2: set up, build (default and AddressSanitizer builds), and run the whole test suite
# with ctest: unit, MPI, integration, jobs/ on a real single-node Slurm (scripts/slurm.sh, started and
# stopped by the test), crash, corruption (also under ASan) and a 30 s fuzz run.
# Long soak runs are separate: tests/soak.sh.
#   CULPRIT_TEST_ARGS="-R determinism" scripts/test.sh   runs a subset.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# The corruption test also runs against an AddressSanitizer build of culprit (./build-asan).
CULPRIT_PRESET=asan scripts/setup.sh
. scripts/env.sh
ctest --preset default ${CULPRIT_TEST_ARGS:-}
