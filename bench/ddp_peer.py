#!/usr/bin/env python3
"""`culprit train` against PyTorch DistributedDataParallel doing the same work: step time side by side
at W = 1, 2, 4 ranks and M = W and 4W micro-shards, in one run (issue 18, item 1).

    .venv/bin/python bench/ddp_peer.py [--rounds 5] [--steps 12] [--warmup 3] [--models resmlp,gpt]
                                       [--worlds 1,2,4] [--out raw.json] [--work DIR]

bench/models_peer.py writes the models as TorchScript files and their data as HDF5 (a residual MLP of
4.47 M parameters, 256 features, 10 classes; a GPT of 4 layers, width 256, 4 heads, seq-len 32, vocab
512: 3.43 M parameters). Three variants train each, each under `mpirun --oversubscribe --bind-to none
-np W`, one intra-op thread per rank:

- culprit: `culprit train --model torchscript:M.pt --data hdf5:D.h5 --global-batch B --micro-shards M
  --optimizer sgd --lr LR --momentum 0.9 --threads 1 --quiet --checkpoint-every 0` with culprit's
  default detectors (NaN/Inf, spikes, communication fingerprints, replica check every step,
  invariants, collective watchdog) and the default trace (`layer`): the comparison issue 18 asks for;
- culprit-bare: the same with every detector, the trace and the periodic checkpoints off
  (`--detect-nonfinite false --comm-check false --spike-window 0 --replica-check-every 0
  --check-invariants false --collective-timeout 0 --trace off`): the loop's own cost (the checkpoint
  after the last step is always written; it follows the last step's timer);
- ddp: bench/ddp_worker.py, PyTorch DDP (gloo) on the same TorchScript file, data, global batch,
  loss (culprit's: sum of per-sample losses / B), SGD momentum, lr, micro-batching (M/W accumulation
  micro-batches per rank, no_sync() on all but the last), threads and sample order (culprit's
  randperm order); without dropout (resmlp) its losses are culprit's step by step, to float rounding
  (the table's "|dloss|" column: the largest difference between culprit's and DDP's step losses in a
  round; the GPT's dropout masks differ, so there it only says both train alike).

Every round runs each (model, W, M, variant) once, in an order rotated round by round (this VM drifts
between runs by up to 1.5x: ratios are paired within a round). Per run: the median of rank 0's step
wall time over the steps after --warmup (culprit: metrics.jsonl "seconds"; ddp: the worker's
perf_counter around the step after a barrier). Prints per (model, W, M) the medians over rounds and the
ratios culprit/ddp and culprit-bare/ddp (median over rounds of the paired ratio, [min, max]), and from
culprit's own metrics the share of its step spent in detector work (detector_seconds) and waiting for
data (data_wait_seconds). Each run must train: every loss finite (culprit halts on NaN/Inf anyway);
the first and last losses are printed. --out keeps every raw number (per-step seconds and losses).
Results: docs/performance.md, "Against PyTorch DDP".
"""
import argparse
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CULPRIT = os.environ.get("CULPRIT_BIN", os.path.join(HERE, "..", "build", "culprit"))
PYTHON = sys.executable  # the interpreter with culprit's torch (.venv/bin/python)
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none"]
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")

# Per model: global batch and learning rate (SGD, momentum 0.9). The GPT's batch is the smallest that
# 4W = 16 micro-shards divide (a micro-shard of one sequence at W = 4, M = 16).
MODELS = {
    "resmlp": {"global_batch": 256, "lr": 0.005},
    "gpt": {"global_batch": 16, "lr": 0.3},
}
BARE = ["--detect-nonfinite", "false", "--comm-check", "false", "--spike-window", "0", "--replica-check-every", "0",
        "--check-invariants", "false", "--collective-timeout", "0", "--trace", "off"]
# culprit's variants: their options after the common ones (culprit-after: the reduction after the last
# backward pass, not overlapped with it: what --bucket-mb buys). ddp is always run.
CULPRIT_VARIANTS = {"culprit": [], "culprit-after": ["--bucket-mb", "0"], "culprit-bare": BARE}
VARIANTS = tuple(CULPRIT_VARIANTS) + ("ddp",)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, what):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write("%s failed (exit %d): %s\n%s%s" % (what, p.returncode, " ".join(cmd), p.stdout[-3000:],
                                                            p.stderr[-3000:]))
        raise SystemExit(1)


def one(work, info, model, world, micro, variant, steps, warmup):
    tag = "%s-w%d-m%d-%s" % (model, world, micro, variant)
    cfg = MODELS[model]
    common = ["--global-batch", str(cfg["global_batch"]), "--micro-shards", str(micro), "--steps", str(steps)]
    load = os.getloadavg()[0]  # other work on the machine: recorded with the run
    t0 = time.perf_counter()
    if variant == "ddp":
        out = os.path.join(work, tag + ".jsonl")
        cmd = MPIRUN + ["-np", str(world), "-x", "GLOO_SOCKET_IFNAME=lo", "-x", "OMP_NUM_THREADS=1", PYTHON,
                        os.path.join(HERE, "ddp_worker.py"), "--model", info["pt"], "--data", info["h5"],
                        "--lr", str(cfg["lr"]), "--momentum", "0.9", "--threads", "1", "--port", str(free_port()),
                        "--out", out] + common
        run(cmd, tag)
        rows = [json.loads(l) for l in open(out)]
        os.remove(out)
    else:
        run_dir = os.path.join(work, tag)
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = MPIRUN + ["-np", str(world), CULPRIT, "train", "--run-dir", run_dir,
                        "--model", "torchscript:" + info["pt"], "--data", "hdf5:" + info["h5"],
                        "--optimizer", "sgd", "--lr", str(cfg["lr"]), "--momentum", "0.9", "--threads", "1",
                        "--quiet", "--checkpoint-every", "0"] + common + CULPRIT_VARIANTS[variant]
        run(cmd, tag)
        rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
        shutil.rmtree(run_dir, ignore_errors=True)
    wall = time.perf_counter() - t0
    if len(rows) != steps:
        raise SystemExit("%s: %d steps recorded, %d expected" % (tag, len(rows), steps))
    losses = [r["loss"] for r in rows]
    if not all(math.isfinite(l) for l in losses):
        raise SystemExit("%s: a loss is not finite: %s" % (tag, losses))
    timed = rows[warmup:]
    res = {"seconds": [r["seconds"] for r in rows], "loss": losses, "wall": wall, "loadavg_before": load,
           "median": statistics.median(r["seconds"] for r in timed)}
    if variant != "ddp":
        for k in ("detector_seconds", "data_wait_seconds", "data_read_seconds"):
            res[k] = [r.get(k, 0.0) for r in rows]
        res["detector_share"] = statistics.median(r.get("detector_seconds", 0.0) / r["seconds"] for r in timed)
        res["data_wait_share"] = statistics.median(r.get("data_wait_seconds", 0.0) / r["seconds"] for r in timed)
    return res


def spread(xs):
    return "%.3f [%.3f, %.3f]" % (statistics.median(xs), min(xs), max(xs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=3, help="steps left out of each run's median")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--worlds", default="1,2,4")
    ap.add_argument("--variants", default="culprit,culprit-bare",
                    help="culprit's variants to run beside ddp: %s" % ", ".join(CULPRIT_VARIANTS))
    ap.add_argument("--out", help="JSON file for every raw number")
    ap.add_argument("--work", help="directory for the models, data and runs (default: a temporary one, deleted)")
    a = ap.parse_args()
    models = a.models.split(",")
    worlds = [int(w) for w in a.worlds.split(",")]
    for m in models:
        if m not in MODELS:
            raise SystemExit("unknown model %r (%s)" % (m, ", ".join(MODELS)))
    if a.steps <= a.warmup:
        raise SystemExit("--steps must exceed --warmup")
    cores = len(os.sched_getaffinity(0))
    work = a.work or tempfile.mkdtemp(prefix="culprit-ddp-peer-")
    os.makedirs(work, exist_ok=True)
    p = subprocess.run([PYTHON, os.path.join(HERE, "models_peer.py"), work, "--models", ",".join(models)],
                       capture_output=True, text=True, check=True)
    infos = {i["model"]: i for i in map(json.loads, p.stdout.splitlines())}
    for m in models:
        i = infos[m]
        print("%-7s %9d parameters, x %s, y %s, global batch %d, lr %g" % (
            m, i["parameters"], i["x_shape"], i["y_shape"], MODELS[m]["global_batch"], MODELS[m]["lr"]))
    over = [w for w in worlds if w > cores]
    if over:
        print("note: %d cores here: W = %s oversubscribes them (expected; those ranks share cores)" %
              (cores, ", ".join(map(str, over))))
    variants = [v for v in a.variants.split(",") if v] + ["ddp"]
    for v in variants[:-1]:
        if v not in CULPRIT_VARIANTS:
            raise SystemExit("unknown variant '%s' (valid: %s)" % (v, ", ".join(CULPRIT_VARIANTS)))
    keys = [(m, w, mm, v) for m in models for w in worlds for mm in (w, 4 * w) for v in variants]
    res = {k: [] for k in keys}
    try:
        for r in range(a.rounds):
            order = keys[r % len(keys):] + keys[:r % len(keys)]
            for k in order:
                x = one(work, infos[k[0]], *k, a.steps, a.warmup)
                res[k].append(x)
                extra = ""
                if k[3] != "ddp":
                    extra = "  detectors %4.1f%%  data wait %4.1f%%" % (100 * x["detector_share"],
                                                                       100 * x["data_wait_share"])
                print("round %d %-7s W=%d M=%-2d %-12s step %.4f s  loss %.4f -> %.4f%s  (load %.1f)" % (
                    r + 1, k[0], k[1], k[2], k[3], x["median"], x["loss"][0], x["loss"][-1], extra,
                    x["loadavg_before"]), flush=True)
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)

    print("\nmedians over %d round(s) of each run's median step (steps %d-%d of %d); ratios paired within a "
          "round: median [min, max]" % (a.rounds, a.warmup + 1, a.steps, a.steps))
    ours = variants[:-1]
    print("%-7s %2s %3s  %s%10s  %s %9s %9s  %8s" % (
        "model", "W", "M", "".join("%16s" % (v + " s") for v in ours), "ddp s",
        "".join("%-30s" % (v + "/ddp") for v in ours), "detectors", "data wait", "|dloss|"))
    summary = []
    for m in models:
        for w in worlds:
            for mm in (w, 4 * w):
                d = res[(m, w, mm, "ddp")]
                med = lambda xs: statistics.median(x["median"] for x in xs)
                ratios = {v: [res[(m, w, mm, v)][i]["median"] / d[i]["median"] for i in range(a.rounds)] for v in ours}
                c = res[(m, w, mm, ours[0])]
                det = statistics.median(x["detector_share"] for x in c)
                wait = statistics.median(x["data_wait_share"] for x in c)
                dloss = max(abs(p - q) for i in range(a.rounds) for p, q in zip(c[i]["loss"], d[i]["loss"]))
                print("%-7s %2d %3d  %s%10.4f  %s %8.1f%% %8.1f%%  %8.1e%s" % (
                    m, w, mm, "".join("%16.4f" % med(res[(m, w, mm, v)]) for v in ours), med(d),
                    "".join("%-30s" % spread(ratios[v]) for v in ours), 100 * det, 100 * wait, dloss,
                    "  (oversubscribed)" if w > cores else ""))
                row = {"model": m, "world": w, "micro_shards": mm, "ddp": med(d), "detector_share": det,
                       "data_wait_share": wait, "max_loss_difference": dloss}
                for v in ours:
                    row[v] = med(res[(m, w, mm, v)])
                    row[v + "_over_ddp"] = ratios[v]
                summary.append(row)
    print("detectors, data wait: culprit (default) runs' median share of the step in detector_seconds and "
          "data_wait_seconds (rank 0's metrics.jsonl); |dloss|: the largest |culprit loss - ddp loss| of a step")
    if over:
        print("W = %s: more ranks than the %d cores here (oversubscribed)" % (", ".join(map(str, over)), cores))
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"rounds": a.rounds, "steps": a.steps, "warmup": a.warmup, "cores": cores,
                       "models": {m: dict(MODELS[m], **{k: infos[m][k] for k in ("parameters", "x_shape", "y_shape")})
                                  for m in models},
                       "summary": summary,
                       "runs": [{"model": k[0], "world": k[1], "micro_shards": k[2], "variant": k[3], "round": i + 1,
                                 **x} for k in keys for i, x in enumerate(res[k])]}, f, indent=1)


if __name__ == "__main__":
    main()
