#!/usr/bin/env bash
# Median step time per model for W = 1, 2, 4 (the first two steps are warm-up and not counted).
#   bench/step_time.sh [STEPS]   (default 30); needs a build in ./build.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
steps="${1:-30}"
out=$(mktemp -d)
printf "%-6s %4s %14s %16s\n" model W "step ms" "samples/s"
for model in mlp cnn gpt; do
  for w in 1 2 4; do
    dir="$out/$model-$w"
    mpirun --oversubscribe --bind-to none -np "$w" build/culprit train --run-dir "$dir" --model "$model" \
      --steps "$steps" --global-batch 64 --micro-shards 8 --quiet >/dev/null
    "$CULPRIT_PY" - "$dir/metrics.jsonl" "$model" "$w" <<'PY'
import json, statistics, sys
secs = [json.loads(l)["seconds"] for l in open(sys.argv[1])][2:]
med = statistics.median(secs)
print("%-6s %4s %14.2f %16.0f" % (sys.argv[2], sys.argv[3], med * 1e3, 64 / med))
PY
  done
done
rm -rf "$out"
