#!/usr/bin/env bash
# Diagnosis cost (docs/performance.md): culprit bisect's replayed steps and wall time against the
# checkpoint interval K (a NaN injected mid-interval, caught online), and culprit audit's speed-up
# with W ranks.   bench/diagnosis.sh   (needs a build in ./build)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(--model mlp --hidden 256 --global-batch 64 --micro-shards 8 --trace layer --keep-last 100 --quiet)
printf "%4s %6s %8s %10s %10s %10s %9s %12s\n" K fault replayed "wall s" "startup s" "replay s" "step ms" "replay/step"
for K in 4 8 16; do
  fault=$((K + K / 2 + 1))
  d="$out/k$K"
  mpirun --bind-to core -np 2 build/culprit train --run-dir "$d" "${common[@]}" --steps $((3 * K)) \
    --checkpoint-every "$K" --on-detect warn \
    --inject "step=$fault,rank=1,layer=fc2,index=3,phase=forward,kind=nan" >/dev/null 2>&1
  start=$(date +%s.%N)
  mpirun --bind-to core -np 2 build/culprit bisect --run-dir "$d" >/dev/null 2>&1 || true
  end=$(date +%s.%N)
  "$CULPRIT_PY" - "$d" "$K" "$fault" "$start" "$end" <<'PY'
import json, statistics, sys
d, K, fault, start, end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
diag = json.load(open(d + "/diagnosis.json"))
step = statistics.median(json.loads(l)["seconds"] for l in open(d + "/metrics.jsonl"))
replay = diag["seconds"] - diag["startup_seconds"]
print("%4d %6d %8d %10.2f %10.2f %10.3f %9.2f %12.1f   (target <= K+3 = %d; verdict %s at step %d)" % (
    K, fault, diag["steps_replayed"], end - start, diag["startup_seconds"], replay, step * 1e3, replay / step,
    K + 3, diag["verdict"], diag["step"]))
PY
done
# Audit: 8 intervals of 40 steps, audited on 1 and 2 ranks, alternately, 3 times each; the best of
# each (this VM's timing noise, docs/performance.md) for the wall time and the audit's own time
# (verification and replay, without process start-up, as printed by culprit audit).
d="$out/audit"
mpirun --bind-to core -np 2 build/culprit train --run-dir "$d" "${common[@]}" --steps 320 --checkpoint-every 40 >/dev/null
declare -A wall inner
for rep in 1 2 3; do
  for w in 1 2; do
    start=$(date +%s.%N)
    in=$(mpirun --bind-to core -np "$w" build/culprit audit --run-dir "$d" | sed -n 's/^audited in \(.*\) s$/\1/p')
    end=$(date +%s.%N)
    wall[$w]="${wall[$w]:-} $("$CULPRIT_PY" -c "print($end - $start)")"
    inner[$w]="${inner[$w]:-} $in"
  done
done
"$CULPRIT_PY" - "${wall[1]}" "${wall[2]}" "${inner[1]}" "${inner[2]}" <<'PY'
import sys
w1, w2, i1, i2 = (min(float(x) for x in a.split()) for a in sys.argv[1:5])
print("audit of 8 intervals x 40 steps: 1 rank %.2f s (auditing %.2f s), 2 ranks %.2f s (auditing %.2f s)" % (w1, i1, w2, i2))
print("audit speed-up with 2 ranks: %.2fx auditing, %.2fx wall with start-up   (target >= 0.8 x 2 = 1.6)" % (i1 / i2, w1 / w2))
PY
