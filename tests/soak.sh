#!/usr/bin/env bash
# Long runs kept out of the default suite: 24 SIGKILL crash trials, 200 corruption offsets, a 10-minute
# fuzz run. Needs the builds of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
export CULPRIT_BIN="$PWD/build/culprit"
CULPRIT_CRASH_TRIALS="${CULPRIT_CRASH_TRIALS:-24}" "$CULPRIT_PY" tests/integration/test_crash.py
CULPRIT_CORRUPTION_OFFSETS="${CULPRIT_CORRUPTION_OFFSETS:-200}" "$CULPRIT_PY" tests/integration/test_corruption.py
FUZZ_SECONDS="${FUZZ_SECONDS:-600}" tests/fuzz/run.sh
