#!/usr/bin/env bash
# README command 2: set up, build, and run the whole test suite with ctest.
#   CULPRIT_TEST_ARGS="-R determinism" scripts/test.sh   runs a subset.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. scripts/env.sh
ctest --preset default ${CULPRIT_TEST_ARGS:-}
