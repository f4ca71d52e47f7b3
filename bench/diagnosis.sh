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
printf "%4s %6s %8s %14s %12s %16s\n" K fault replayed "bisect s" "step ms" "wall/step"
for K in 4 8 16; do
  fault=$((K + K / 2 + 1))
  d="$out/k$K"
  mpirun --bind-to core -np 2 build/culprit train --run-dir "$d" "${common[@]}" --steps $((3 * K)) \
    --checkpoint-every "$K" --on-detect warn \
    --inject "step=$fault,rank=1,layer=fc2,index=3,phase=forward,kind=nan" >/dev/null 2>&1
  start=$(date +%s.%N)
  mpirun --bind-to core -np 2 build/culprit bisect --run-dir "$d" >/dev/null 2>&1 || true
  end=$(date +%s.%N)
  /usr/bin/python3 - "$d" "$K" "$fault" "$start" "$end" <<'PY'
import json, statistics, sys
d, K, fault, start, end = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
diag = json.load(open(d + "/diagnosis.json"))
step = statistics.median(json.loads(l)["seconds"] for l in open(d + "/metrics.jsonl"))
wall = end - start
print("%4d %6d %8d %14.2f %12.2f %16.1f   (verdict %s at step %d; inside bisect: %.2f s)" % (
    K, fault, diag["steps_replayed"], wall, step * 1e3, wall / step, diag["verdict"], diag["step"], diag["seconds"]))
PY
done
# Audit: 8 intervals of 20 steps, audited on 1 and 2 ranks (wall time, and the audit's own time
# without process start-up as printed by culprit audit).
d="$out/audit"
mpirun --bind-to core -np 2 build/culprit train --run-dir "$d" "${common[@]}" --steps 160 --checkpoint-every 20 >/dev/null
for w in 1 2; do
  start=$(date +%s.%N)
  inner=$(mpirun --bind-to core -np "$w" build/culprit audit --run-dir "$d" | sed -n 's/^audited in \(.*\) s$/\1/p')
  end=$(date +%s.%N)
  /usr/bin/python3 -c "print('audit of 8 intervals on $w rank(s): %.2f s wall, %s s auditing' % ($end - $start, '$inner'))"
done
