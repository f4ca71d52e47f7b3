#!/usr/bin/env bash
# Detector overhead (docs/performance.md): the mean step time with every default detector (NaN/Inf,
# spikes, replica check, communication fingerprints, invariants, collective watchdog), and with
# --spot-check 0.05 on top, against the same loop with all of them off, per model, in one run.
# The three configurations alternate, in rotating order, so drift on the machine hits them alike.
#   bench/detectors.sh [STEPS] [REPEATS] [W]   (defaults 60, 6, 2); needs a build in ./build.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
steps="${1:-60}" repeats="${2:-6}" world="${3:-2}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
off=(--detect-nonfinite false --comm-check false --spike-window 0 --replica-check-every 0
     --check-invariants false --collective-timeout 0)
# One rank per core when they fit: unbound ranks on this 2-core VM land either apart or together
# from run to run, and step times jump between two levels 1.7x apart.
bind="--bind-to core"
[ "$world" -le "$(nproc)" ] || bind="--oversubscribe --bind-to none"
# Step sizes of a few to a few tens of milliseconds: a per-step fixed cost of the detectors (one
# small allgather, per-micro-shard fingerprints) shows as what it is.
declare -A size=([mlp]="--hidden 256 --global-batch 128" [cnn]="--global-batch 128" [gpt]="--global-batch 64")
declare -A extra=([off]="${off[*]}" [default]="" [spot]="--spot-check 0.05")
for model in mlp cnn gpt; do
  for rep in $(seq "$repeats"); do
    # Rotate the order each repeat (ABC BCA CAB): whatever the first run of a round pays, all pay.
    cfgs=(off default spot)
    for i in 0 1 2; do
      cfg=${cfgs[$(( (i + rep) % 3 ))]}
      # shellcheck disable=SC2086
      mpirun $bind -np "$world" build/culprit train --run-dir "$out/$model-$cfg-$rep" \
        --model "$model" ${size[$model]} --steps "$steps" --micro-shards 8 --checkpoint-every 0 --trace off \
        --quiet ${extra[$cfg]} >/dev/null
    done
  done
done
"$CULPRIT_PY" - "$out" "$repeats" "$world" <<'PY'
import json, statistics, sys
out, repeats, world = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def run_mean(model, cfg, rep):
    secs = [json.loads(l)["seconds"] for l in open("%s/%s-%s-%d/metrics.jsonl" % (out, model, cfg, rep))][2:]
    return statistics.mean(secs)

def paired(model, cfg):
    # Each round's runs follow one another: the ratio inside a round, the median over the rounds.
    return statistics.median(run_mean(model, cfg, r) / run_mean(model, "off", r) for r in range(1, repeats + 1))

def mean_step(model, cfg):
    # Each run's mean step time (after two warm-up steps); the fastest run of the repeats. On this
    # VM whole runs land in a fast or a slow mode (up to 1.5x apart) whatever their configuration:
    # the minimum compares like with like, the median is shown for the spread.
    runs = [run_mean(model, cfg, rep) for rep in range(1, repeats + 1)]
    return min(runs), statistics.median(runs)

print("W=%s, 8 micro-shards (mlp --hidden 256 and cnn: global batch 128; gpt: 64); mean step time in ms" % world)
print("fastest run of %d (median run in parentheses)" % repeats)
def within(model):
    # The spot check's own cost, inside each --spot-check run (immune to drift between runs): the
    # run's mean step time against the mean of its steps without a spot check (metrics.jsonl marks
    # the others "spot_checked"); the median over the runs.
    f = []
    for rep in range(1, repeats + 1):
        m = [json.loads(l) for l in open("%s/%s-spot-%d/metrics.jsonl" % (out, model, rep))][2:]
        plain = [x["seconds"] for x in m if not x.get("spot_checked")]
        f.append(statistics.mean(x["seconds"] for x in m) / statistics.mean(plain))
    return statistics.median(f)

def timed(model):
    # The default detectors' own cost, inside each run with them (immune to drift between runs): the
    # run's mean step time against the same less the mean time its steps spent in detector work
    # (metrics.jsonl "detector_seconds", rank 0's timers); the median over the runs.
    f = []
    for rep in range(1, repeats + 1):
        m = [json.loads(l) for l in open("%s/%s-default-%d/metrics.jsonl" % (out, model, rep))][2:]
        step = statistics.mean(x["seconds"] for x in m)
        f.append(step / (step - statistics.mean(x["detector_seconds"] for x in m)))
    return statistics.median(f)

print("%-6s %16s %16s %16s %12s %12s %14s %14s %14s" % ("model", "off", "default", "spot 0.05", "default/off",
                                                      "spot/off", "default/off*", "spot/default*", "spot/off**"))
for model in ("mlp", "cnn", "gpt"):
    t = {c: mean_step(model, c) for c in ("off", "default", "spot")}
    cell = lambda c: "%6.2f (%6.2f)" % (t[c][0] * 1e3, t[c][1] * 1e3)
    d, w = timed(model), within(model)
    print("%-6s %16s %16s %16s %11.3fx %11.3fx %13.3fx %13.3fx %13.3fx" % (
        model, cell("off"), cell("default"), cell("spot"), paired(model, "default"), paired(model, "spot"), d, w, w * d))
print("targets: default/off <= 1.03x, spot/off <= 1.08x")
print("default/off, spot/off: run against run, the median over the rounds of the ratio inside each round")
print("*  measured inside the runs: default/off* from the detectors' timers in each default run;")
print("   spot/default* all steps of each --spot-check run against its steps without a spot check")
print("** default/off* x spot/default*: both costs measured inside their runs")
PY
