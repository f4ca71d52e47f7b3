#!/usr/bin/env bash
# README command 1: set up, build, and run the demo: 4 ranks train the default model (mlp) on
# synthetic data, printing loss and parameter fingerprint per step and a summary; then one rank
# trains the same run to show the parameters are bitwise the same at any world size.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
. scripts/env.sh
run="runs/demo-$(date +%Y%m%d-%H%M%S)"
echo
echo "== mpirun -np 4 culprit train --run-dir $run/w4 --steps 60"
mpirun --oversubscribe --bind-to none -np 4 build/culprit train --run-dir "$run/w4" --steps 60
echo
echo "== the same run on 1 rank"
build/culprit train --run-dir "$run/w1" --steps 60 --quiet | tail -n 1
a=$(tail -n 1 "$run/w4/metrics.jsonl" | sed 's/.*"fingerprint": "\([0-9a-f]*\)".*/\1/')
b=$(tail -n 1 "$run/w1/metrics.jsonl" | sed 's/.*"fingerprint": "\([0-9a-f]*\)".*/\1/')
if [ "$a" = "$b" ]; then
  echo "world size 4 and world size 1 end with the same parameters: fingerprint $a"
else
  echo "MISMATCH: W=4 $a, W=1 $b" >&2
  exit 1
fi
echo
echo "== culprit verify $run/w4   (every checkpoint and trace fingerprint rechecked)"
build/culprit verify "$run/w4"
echo "run directories: $run/w4 $run/w1 (run.json, metrics.jsonl, checkpoints/, trace/)"
