#!/usr/bin/env python3
"""bf16 autocast against fp32, and clipping against none: step time and peak memory per model, side
by side in one run.

    .venv/bin/python bench/precision.py [--rounds 3] [--steps 12] [--world 2]

Every round runs each model in each variant (fp32, bf16, fp32 with --clip-grad-norm 1) once, in an
order rotated round by round (this VM drifts between runs: ratios are paired within a round). Step
time: the median of metrics.jsonl's "seconds" over the steps after the first two; memory: each
rank's peak RSS (GNU time), the largest rank. Prints per model the medians over rounds of each
variant and of the paired ratios bf16/fp32 and clip/fp32, and the clipping's own share of the step
(metrics.jsonl's clip_seconds / seconds). Results: docs/performance.md, "Mixed precision and
clipping".
"""
import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CULPRIT = os.environ.get("CULPRIT_BIN", os.path.join(HERE, "..", "build", "culprit"))
MODELS = {
    "mlp": ["--model", "mlp", "--hidden", "256", "--global-batch", "128"],
    "cnn": ["--model", "cnn", "--global-batch", "128"],
    "gpt": ["--model", "gpt", "--global-batch", "64", "--optimizer", "adamw", "--lr", "0.003"],
    "gpt-4x128": ["--model", "gpt", "--layers", "4", "--width", "128", "--heads", "4", "--seq-len", "64",
                  "--vocab", "512", "--global-batch", "16", "--optimizer", "adamw", "--lr", "0.001"],
}
VARIANTS = {"fp32": [], "bf16": ["--precision", "bf16"], "clip": ["--clip-grad-norm", "1"]}


def one(work, model, variant, steps, world):
    run_dir = os.path.join(work, "%s-%s" % (model, variant))
    shutil.rmtree(run_dir, ignore_errors=True)
    rss = os.path.join(work, "rss-%s-%s" % (model, variant))
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(world), "bash", "-c",
           'exec /usr/bin/time -o "$0-$OMPI_COMM_WORLD_RANK" -f %M "$@"', rss,
           CULPRIT, "train", "--run-dir", run_dir, "--steps", str(steps), "--micro-shards", "8", "--quiet",
           "--checkpoint-every", "0"] + MODELS[model] + VARIANTS[variant]
    subprocess.run(cmd, check=True, capture_output=True)
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))][2:]
    peak = max(int(open(p).read().split()[-1]) for p in glob.glob(rss + "-*"))
    clip = statistics.median(r["clip_seconds"] / r["seconds"] for r in rows) if variant == "clip" else None
    return statistics.median(r["seconds"] for r in rows), peak / 1024.0, clip


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--world", type=int, default=2)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="culprit-precision-")
    res = {(m, v): [] for m in MODELS for v in VARIANTS}
    order = [(m, v) for m in MODELS for v in VARIANTS]
    try:
        for r in range(a.rounds):
            k = r % len(order)
            for m, v in order[k:] + order[:k]:
                res[(m, v)].append(one(work, m, v, a.steps, a.world))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("W=%d, 8 micro-shards, %d rounds of %d steps; medians over rounds (ratios paired within a round)" % (
        a.world, a.rounds, a.steps))
    print("%-10s %10s %10s %10s %9s %9s %9s %9s %10s" % ("model", "fp32 ms", "bf16 ms", "clip ms", "bf16/fp32",
                                                       "clip/fp32", "fp32 MiB", "bf16 MiB", "clip share"))
    for m in MODELS:
        f, b, c = res[(m, "fp32")], res[(m, "bf16")], res[(m, "clip")]
        med = lambda xs: statistics.median(xs)  # noqa: E731
        print("%-10s %10.2f %10.2f %10.2f %9.2f %9.3f %9.0f %9.0f %9.2f%%" % (
            m, med([x[0] for x in f]) * 1e3, med([x[0] for x in b]) * 1e3, med([x[0] for x in c]) * 1e3,
            med([y[0] / x[0] for x, y in zip(f, b)]), med([y[0] / x[0] for x, y in zip(f, c)]),
            med([x[1] for x in f]), med([x[1] for x in b]), 100 * med([x[2] for x in c])))


if __name__ == "__main__":
    main()
