#!/usr/bin/env bash
# Instructions executed inside the training step (Trainer::step) by two builds, counted by valgrind's
# callgrind: repeatable to the instruction for the same binary and inputs whatever else the machine
# does, so a change of the loop's cost shows even where wall-clock times drift (docs/performance.md,
# "Build against build"). One rank, 6 steps, per model with the default detectors and with all off.
#   bench/instructions.sh OLD_CULPRIT NEW_CULPRIT   (needs valgrind; a few minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
old="${1:?usage: bench/instructions.sh OLD_CULPRIT NEW_CULPRIT}"
new="${2:?usage: bench/instructions.sh OLD_CULPRIT NEW_CULPRIT}"
command -v valgrind >/dev/null || { echo "instructions.sh: valgrind is not installed" >&2; exit 2; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
off="--detect-nonfinite false --comm-check false --spike-window 0 --replica-check-every 0 --check-invariants false --collective-timeout 0"
count() {  # binary, name, culprit train options...
  local bin=$1 name=$2
  shift 2
  valgrind --tool=callgrind --callgrind-out-file="$out/$name.cg" --toggle-collect='culprit::harness::Trainer::step(*' \
    "$bin" train --run-dir "$out/$name" --micro-shards 8 --steps 6 --checkpoint-every 0 --trace off --quiet "$@" \
    2>&1 >/dev/null | sed -n 's/.*Collected : //p'
}
printf "%-12s %16s %16s %10s\n" case "old instructions" "new instructions" "new/old"
for c in "mlp:--model mlp --hidden 256 --global-batch 128" "gpt:--model gpt --global-batch 64"; do
  name=${c%%:*} args=${c#*:}
  for cfg in default off; do
    extra=""
    [ "$cfg" = off ] && extra=$off
    # shellcheck disable=SC2086
    a=$(count "$old" "$name-$cfg-old" $args $extra)
    # shellcheck disable=SC2086
    b=$(count "$new" "$name-$cfg-new" $args $extra)
    printf "%-12s %16s %16s %9.5fx\n" "$name $cfg" "$a" "$b" "$("$CULPRIT_PY" -c "print($b / $a)")"
  done
done
