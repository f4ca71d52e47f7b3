#!/usr/bin/env bash
# The cost of the default --trace layer against --trace step and off, side by side: for each model,
# ROUNDS interleaved rounds of (off, step, layer) 2-rank runs; per run the median step time from
# metrics.jsonl (steps 6..), per round the ratios to the same round's off run; the medians of those.
#   bench/trace_level.sh [ROUNDS=3] [STEPS=60]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
rounds=${1:-3}
steps=${2:-60}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for model in mlp cnn gpt; do
  for r in $(seq 1 "$rounds"); do
    for t in off step layer; do
      mpirun --oversubscribe --bind-to none -np 2 build/culprit train --run-dir "$work/$model-$r-$t" --model "$model" \
        --steps "$steps" --trace "$t" --checkpoint-every 0 --quiet >/dev/null
    done
  done
done
"$CULPRIT_PY" - "$work" "$rounds" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def med(path):
    rows = [json.loads(l) for l in open(path)]
    return statistics.median(r["seconds"] for r in rows[5:])
print("%-5s %10s %10s %10s %12s %12s" % ("model", "off ms", "step ms", "layer ms", "step/off", "layer/off"))
for model in ("mlp", "cnn", "gpt"):
    t = {k: [med("%s/%s-%d-%s/metrics.jsonl" % (work, model, r, k)) for r in range(1, rounds + 1)] for k in ("off", "step", "layer")}
    ratio = lambda k: statistics.median(t[k][i] / t["off"][i] for i in range(rounds))
    print("%-5s %10.3f %10.3f %10.3f %11.3fx %11.3fx" % (model, *(1000 * statistics.median(t[k]) for k in ("off", "step", "layer")),
                                                         ratio("step"), ratio("layer")))
PY
