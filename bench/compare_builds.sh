#!/usr/bin/env bash
# Two builds of culprit side by side in one run (docs/performance.md, "Build against build"): the
# step time with the default detectors, the step time with every detector off, the default
# detectors' own cost (detector_seconds inside each run) and the checkpoint stall, per model, at W = 2.
# The builds alternate within every round, in rotating order, so the VM's drift (up to 1.5x between
# runs) hits both alike; each ratio is new/old inside a round, and the median over the rounds is shown.
# The runs' fingerprints must also agree: the same bits from both builds (else it stops).
#   bench/compare_builds.sh OLD_CULPRIT NEW_CULPRIT [ROUNDS=5] [STEPS=40]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
old="${1:?usage: bench/compare_builds.sh OLD_CULPRIT NEW_CULPRIT [ROUNDS] [STEPS]}"
new="${2:?usage: bench/compare_builds.sh OLD_CULPRIT NEW_CULPRIT [ROUNDS] [STEPS]}"
rounds="${3:-5}" steps="${4:-40}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bind="--bind-to core"
[ 2 -le "$(nproc)" ] || bind="--oversubscribe --bind-to none"
off="--detect-nonfinite false --comm-check false --spike-window 0 --replica-check-every 0 --check-invariants false --collective-timeout 0"
declare -A size=([mlp]="--hidden 256 --global-batch 128" [cnn]="--global-batch 128" [gpt]="--global-batch 64"
                 [big]="--hidden 2048 --global-batch 32 --samples 256")
for rep in $(seq "$rounds"); do
  for model in mlp cnn gpt big; do
    m=$model
    [ "$model" = big ] && m=mlp
    for cfg in default off; do
      builds=(old new)
      [ $(( rep % 2 )) -eq 0 ] && builds=(new old)
      for b in "${builds[@]}"; do
        bin=$old
        [ "$b" = new ] && bin=$new
        extra=""
        [ "$cfg" = off ] && extra=$off
        # big: a 17 MB state checkpointed every 4 steps (the stall); the others: no checkpoints.
        ck="--checkpoint-every 0"
        [ "$model" = big ] && ck="--checkpoint-every 4 --keep-last 1"
        # shellcheck disable=SC2086
        mpirun $bind -np 2 "$bin" train --run-dir "$out/$model-$cfg-$b-$rep" --model "$m" ${size[$model]} \
          --steps "$steps" --micro-shards 8 $ck --trace off --quiet $extra >/dev/null
      done
    done
  done
done
"$CULPRIT_PY" - "$out" "$rounds" "$old" "$new" <<'PY'
import json, os, statistics, sys
out, rounds, old, new = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def metrics(model, cfg, b, r):
    return [json.loads(l) for l in open("%s/%s-%s-%s-%d/metrics.jsonl" % (out, model, cfg, b, r))]

def step(model, cfg, b, r):
    return statistics.mean(m["seconds"] for m in metrics(model, cfg, b, r)[2:])

def detector_share(model, b, r):
    m = metrics(model, "default", b, r)[2:]
    s = statistics.mean(x["seconds"] for x in m)
    return s / (s - statistics.mean(x["detector_seconds"] for x in m))

def stall(b, r):
    rows = [json.loads(l) for l in open("%s/big-default-%s-%d/checkpoints.jsonl" % (out, b, r))]
    return statistics.median(x["stall_seconds"] for x in rows if x["step"] > 0)

# The same bits from both builds, every run.
for model in ("mlp", "cnn", "gpt", "big"):
    for cfg in ("default", "off"):
        for r in range(1, rounds + 1):
            a = [m["fingerprint"] for m in metrics(model, cfg, "old", r)]
            b = [m["fingerprint"] for m in metrics(model, cfg, "new", r)]
            if a != b:
                sys.exit("%s %s round %d: the builds' fingerprints differ" % (model, cfg, r))

def med(f):
    return statistics.median(f(r) for r in range(1, rounds + 1))

print("old: %s\nnew: %s" % (old, new))
print("W=2, 8 micro-shards, %d rounds; each ratio new/old inside a round, the median over the rounds" % rounds)
print("%-5s %14s %14s %12s %14s %14s %12s %16s %16s" % ("model", "default old ms", "default new ms", "new/old",
      "off old ms", "off new ms", "new/old", "detectors* old", "detectors* new"))
for model in ("mlp", "cnn", "gpt", "big"):
    print("%-5s %14.2f %14.2f %11.3fx %14.2f %14.2f %11.3fx %15.3fx %15.3fx" % (
        model, med(lambda r: step(model, "default", "old", r)) * 1e3, med(lambda r: step(model, "default", "new", r)) * 1e3,
        med(lambda r: step(model, "default", "new", r) / step(model, "default", "old", r)),
        med(lambda r: step(model, "off", "old", r)) * 1e3, med(lambda r: step(model, "off", "new", r)) * 1e3,
        med(lambda r: step(model, "off", "new", r) / step(model, "off", "old", r)),
        med(lambda r: detector_share(model, "old", r)), med(lambda r: detector_share(model, "new", r))))
print("per round, new/old (default, off) per model:")
for r in range(1, rounds + 1):
    print("  round %d: " % r + "  ".join("%s %.3f %.3f" % (m, step(m, "default", "new", r) / step(m, "default", "old", r),
                                                           step(m, "off", "new", r) / step(m, "off", "old", r))
                                         for m in ("mlp", "cnn", "gpt", "big")))
print("checkpoint stall (big: mlp --hidden 2048, 17 MB of state, async): old %.2f ms, new %.2f ms, new/old %.3fx" % (
    med(lambda r: stall("old", r)) * 1e3, med(lambda r: stall("new", r)) * 1e3,
    med(lambda r: stall("new", r) / max(stall("old", r), 1e-9))))
print("* the default detectors' own cost inside each run: step / (step - detector_seconds)")
print("every run of both builds: the same fingerprints, step by step")
PY
