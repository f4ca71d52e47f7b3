#!/usr/bin/env python3
"""--shard-optimizer against the unsharded run: step time, optimizer state and peak memory per rank at
W = 1, 2, 4, side by side in one run.

    .venv/bin/python bench/shard.py [--rounds 3] [--steps 10] [--models mlp-2m,gpt-4x256]

Every round runs each (model, W, variant) once, in an order rotated round by round (this VM drifts
between runs: ratios are paired within a round). Step time: the median of metrics.jsonl's "seconds"
over the steps after the first two (rank 0's step, which includes the parameter gather); optimizer
state: metrics.jsonl's optimizer_bytes (rank 0's; the other ranks' slices are within a 4 KiB chunk of
it); memory: each rank's peak RSS (GNU time), the largest rank. Prints per model and W the medians
over rounds and the paired ratios sharded/unsharded. The bits are the same (tests/integration/
test_shard.py proves it; this bench checks the final fingerprints agree too). Results:
docs/performance.md, "Sharded optimizer state".
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
    # A 2.1M-parameter MLP (AdamW: 17 MB of optimizer state) and a 4 x 256 GPT (3.3M parameters).
    "mlp-2m": ["--model", "mlp", "--hidden", "1024", "--sample-shape", "1024", "--global-batch", "64",
               "--optimizer", "adamw", "--lr", "0.001"],
    "gpt-4x256": ["--model", "gpt", "--layers", "4", "--width", "256", "--heads", "4", "--seq-len", "32",
                  "--vocab", "512", "--global-batch", "16", "--optimizer", "adamw", "--lr", "0.001"],
}
VARIANTS = {"unsharded": [], "sharded": ["--shard-optimizer"]}
WORLDS = (1, 2, 4)


def one(work, model, world, variant, steps):
    tag = "%s-%d-%s" % (model, world, variant)
    run_dir = os.path.join(work, tag)
    shutil.rmtree(run_dir, ignore_errors=True)
    rss = os.path.join(work, "rss-" + tag)
    for p in glob.glob(rss + "-*"):
        os.remove(p)
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(world), "bash", "-c",
           'exec /usr/bin/time -o "$0-$OMPI_COMM_WORLD_RANK" -f %M "$@"', rss,
           CULPRIT, "train", "--run-dir", run_dir, "--steps", str(steps), "--micro-shards", "4", "--quiet",
           "--checkpoint-every", "0", "--samples", "1024"] + MODELS[model] + VARIANTS[variant]
    subprocess.run(cmd, check=True, capture_output=True)
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    peak = max(int(open(p).read().split()[-1]) for p in glob.glob(rss + "-*"))
    secs = statistics.median(r["seconds"] for r in rows[2:])
    return secs, rows[-1]["optimizer_bytes"], peak / 1024.0, rows[-1]["fingerprint"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--models", default=",".join(MODELS))
    a = ap.parse_args()
    models = a.models.split(",")
    work = tempfile.mkdtemp(prefix="culprit-shard-")
    keys = [(m, w, v) for m in models for w in WORLDS for v in VARIANTS]
    res = {k: [] for k in keys}
    try:
        for r in range(a.rounds):
            order = keys[r % len(keys):] + keys[:r % len(keys)]
            for k in order:
                res[k].append(one(work, *k, a.steps))
                print("round %d %-10s W=%d %-9s step %.4f s  optimizer %7.2f MiB  peak RSS %7.1f MiB" %
                      ((r, k[0], k[1], k[2]) + (res[k][-1][0], res[k][-1][1] / 2**20, res[k][-1][2])), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\nmedians over %d rounds (ratio: sharded / unsharded, paired within a round)" % a.rounds)
    print("%-10s %2s  %10s %10s %7s  %12s %12s  %10s %10s %7s  %s" % (
        "model", "W", "step(u)", "step(s)", "ratio", "optim(u)MiB", "optim(s)MiB", "RSS(u)MiB", "RSS(s)MiB", "ratio",
        "same bits"))
    for m in models:
        for w in WORLDS:
            u, s = res[(m, w, "unsharded")], res[(m, w, "sharded")]
            med = lambda xs, i: statistics.median(x[i] for x in xs)
            step_ratio = statistics.median(s[i][0] / u[i][0] for i in range(a.rounds))
            rss_ratio = statistics.median(s[i][2] / u[i][2] for i in range(a.rounds))
            same = all(x[3] == u[0][3] for x in u + s)
            print("%-10s %2d  %10.4f %10.4f %7.3f  %12.2f %12.2f  %10.1f %10.1f %7.3f  %s" % (
                m, w, med(u, 0), med(s, 0), step_ratio, med(u, 1) / 2**20, med(s, 1) / 2**20, med(u, 2), med(s, 2),
                rss_ratio, "yes" if same else "NO"))


if __name__ == "__main__":
    main()
