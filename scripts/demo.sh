#!/usr/bin/env bash
# README command 1: set up, build, and run the demo: 4 ranks train the default model (mlp) on
# synthetic data, printing loss and parameter fingerprint per step and a summary; then one rank
# trains the same run to show the parameters are bitwise the same at any world size; then a run
# with a silent fault (one wrong value on one rank, reduced into every replica: nothing fires
# online) is diagnosed after the fact by culprit bisect, which names its step, layer, phase and rank;
# last, a plain PyTorch model (examples/train_mlp.py) trained through the Python package on 2 and 1
# ranks, with the same bits (docs/python.md).
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
echo
fault="step=23,rank=2,layer=fc2,index=7,phase=forward,kind=bitflip,bit=22"
echo "== a silent fault: --inject $fault"
echo "   (rank 2 computes one activation of layer fc2 wrongly in step 23; default options: checkpoints every"
echo "   10 steps, the newest 3 and the run's start kept)"
mpirun --oversubscribe --bind-to none -np 4 build/culprit train --run-dir "$run/silent" --steps 60 --quiet \
  --inject "$fault" | tail -n 1
echo
echo "== mpirun -np 4 culprit bisect --run-dir $run/silent"
set +e
mpirun --oversubscribe --bind-to none -np 4 build/culprit bisect --run-dir "$run/silent" 2>/dev/null
rc=$?
set -e
field() { build/culprit report "$run/silent" --field "diagnosis.$1"; }
found="$(field step) $(field layer) $(field phase) $(field rank)"
echo "bisect exit $rc (verdict $(field verdict)): step, layer, phase, rank = $found"
if [ "$found" != "23 fc2 forward 2" ]; then
  echo "MISMATCH: the fault was injected at step 23, layer fc2, phase forward, rank 2" >&2
  exit 1
fi
echo "the diagnosis names the injected fault exactly; its report: $run/silent/diagnosis.html"
if [ -d build/python/culprit ]; then
  echo
  echo "== your own PyTorch model: mpirun -np 2 $CULPRIT_PY examples/train_mlp.py --run-dir $run/py2 --steps 20"
  mpirun --oversubscribe --bind-to none -np 2 "$CULPRIT_PY" examples/train_mlp.py --run-dir "$run/py2" --steps 20 \
    --quiet | tail -n 1
  "$CULPRIT_PY" examples/train_mlp.py --run-dir "$run/py1" --steps 20 --quiet | tail -n 1
  a=$(tail -n 1 "$run/py2/metrics.jsonl" | sed 's/.*"fingerprint": "\([0-9a-f]*\)".*/\1/')
  b=$(tail -n 1 "$run/py1/metrics.jsonl" | sed 's/.*"fingerprint": "\([0-9a-f]*\)".*/\1/')
  if [ "$a" != "$b" ]; then
    echo "MISMATCH: Python model W=2 $a, W=1 $b" >&2
    exit 1
  fi
  echo "the Python model ends with the same parameters on 2 ranks and on 1: fingerprint $a"
else
  echo
  echo "== (the Python package was not built: pybind11-dev or python3-dev missing; docs/python.md)"
fi
echo "run directories: $run/w4 $run/w1 $run/silent (run.json, metrics.jsonl, checkpoints/, trace/)"
