#!/usr/bin/env bash
# GPT-2-small's shape (12 layers x 768, 12 heads, vocabulary 50257, tied head, GPT-2 initialisation,
# 124M parameters) trained, checkpointed, resumed, hit by an injected fault and bisected on this
# machine, 2 ranks, AdamW with weight decay on matrices, warm-up and clipping at 1.0 (a constant
# schedule after warm-up: a cosine one would depend on --steps, which the resume changes):
#
#     bench/gpt2_small.sh [--precision fp32|bf16] [--seq-len 64] [--out DIR]
#
# Prints each phase's wall time, the step time, the time clipping took per step (metrics.jsonl's
# clip_seconds against the step's seconds), the checkpoint size and each rank's peak RSS, and checks
# the verdict against the injected truth (rank 1, step 3, blocks.5.mlp.fc, forward). Results:
# docs/performance.md, "GPT-2 small". Slow by design on reference BLAS (minutes per step).
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
CULPRIT_PY="${CULPRIT_PY:-$here/.venv/bin/python}"
culprit="${CULPRIT_BIN:-$here/build/culprit}"
precision=fp32 seq=64 out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --precision) precision="$2"; shift 2 ;;
    --seq-len) seq="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "usage: $0 [--precision fp32|bf16] [--seq-len N] [--out DIR]" >&2; exit 2 ;;
  esac
done
work="${out:-$(mktemp -d /tmp/culprit-gpt2-XXXXXX)}"
mkdir -p "$work"
run="$work/run-$precision"
rm -rf "$run"
mpirun=(mpirun --oversubscribe --bind-to none -np 2)
model=(--model gpt --layers 12 --width 768 --heads 12 --seq-len "$seq" --vocab 50257 --tie-head --init gpt2
       --samples 64 --global-batch 4 --micro-shards 2 --precision "$precision"
       --optimizer adamw --lr 6e-4 --weight-decay 0.1 --betas 0.9,0.95 --warmup-steps 2
       --clip-grad-norm 1.0 --checkpoint-every 1 --keep-last 3 --collective-timeout 3600)
fault="step=3,rank=1,layer=blocks.5.mlp.fc,index=12345,phase=forward,kind=bitflip,bit=27"

# timed NAME CMD...: CMD on every rank under GNU time (each rank's peak RSS into $work/rss-NAME-RANK),
# its wall seconds into $work/wall-NAME.
timed() {
  local name="$1"; shift
  local t0; t0=$(date +%s.%N)
  "${mpirun[@]}" bash -c 'exec /usr/bin/time -o "$0-$OMPI_COMM_WORLD_RANK" -f %M "$@"' "$work/rss-$name" "$@"
  local rc=$?
  awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }' > "$work/wall-$name"
  return $rc
}

echo "== train 2 steps ($precision, seq-len $seq): $run"
timed train "$culprit" train --run-dir "$run" --steps 2 "${model[@]}"
echo "== resume to step 3 with a fault at step 3 on rank 1, every micro-shard spot-checked"
timed resume "$culprit" train --run-dir "$run" --resume --steps 3 --spot-check 1 --on-detect warn --inject "$fault" --quiet
echo "== bisect on 2 ranks"
set +e
timed bisect "$culprit" bisect --run-dir "$run"
set -e

"$CULPRIT_PY" - "$run" "$work" "$precision" "$seq" <<'EOF'
import glob, json, os, sys
run, work, precision, seq = sys.argv[1:]
info = json.load(open(os.path.join(run, "run.json")))
metrics = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl"))]
d = json.load(open(os.path.join(run, "diagnosis.json")))
ckpts = sorted(glob.glob(os.path.join(run, "checkpoints", "*.h5")))
wall = {n: float(open(os.path.join(work, "wall-" + n)).read()) for n in ("train", "resume", "bisect")}
rss = {n: max(int(open(p).read().split()[-1]) for p in glob.glob(os.path.join(work, "rss-%s-*" % n)))
       for n in ("train", "resume", "bisect")}
print("GPT-2 small (%s, seq-len %s): %d parameters, %s" % (precision, seq, info["parameters"], (info.get("blas") or {}).get("library", "")))
for m in metrics:
    print("  step %d: loss %.6g, grad_norm %.4g, clip_factor %.4g, %.1f s (clip %.3f s = %.2f%% of the step)" % (
        m["step"], m["loss"], m["grad_norm"], m["clip_factor"], m["seconds"], m["clip_seconds"],
        100 * m["clip_seconds"] / m["seconds"]))
print("  checkpoint: %.0f MiB each (%d kept)" % (os.path.getsize(ckpts[-1]) / 2**20, len(ckpts)))
for n in ("train", "resume", "bisect"):
    print("  %-7s wall %7.1f s, peak RSS per rank %.2f GiB" % (n, wall[n], rss[n] / 2**20))
truth = (3, "forward", "blocks.5.mlp.fc", 1)
got = (d.get("step"), d.get("phase"), d.get("layer"), d.get("rank"))
print("  verdict %s at %s, %d steps replayed, %.1f s: %s" % (d["verdict"], got, d.get("steps_replayed", -1),
                                                             d.get("seconds", 0), "exact" if got == truth else "WRONG"))
sys.exit(0 if got == truth and d["verdict"] == "hardware-transient" else 1)
EOF
