#!/usr/bin/env python3
"""--shard-optimizer and --shard-params against the unsharded run, step time and memory per rank.

Step time, optimizer state, parameters and gradient resident and peak memory per rank at W = 1, 2, 4,
side by side in one run.

    .venv/bin/python bench/shard.py [--rounds 3] [--steps 10] [--models mlp-2m,gpt-4x256]
        [--variants unsharded,sharded,params,params-keep] [--worlds 1,2,4] [--json OUT]

Variants: `unsharded`; `sharded` (--shard-optimizer, ZeRO-1); `params` (--shard-params, ZeRO-3: a
layer's parameters gathered around its forward and its backward, released after; each micro-shard's
gradient reduce-scattered to the slices' owners during its backward pass); `params-keep`
(--shard-params --keep-gathered: gathered once per step, kept until the rank's micro-shards are done).
Every run has --memory-metrics. Every ratio is against `unsharded` (n/a when it is not among --variants,
e.g. a model that fits a rank only sharded).

Every round runs each (model, W, variant) once, in an order rotated round by round (this VM drifts
between runs: ratios are paired within a round). Step time: the median of metrics.jsonl's "seconds"
over the steps after the first two (rank 0's step, which includes the parameter gathers); optimizer
state: metrics.jsonl's optimizer_bytes (rank 0's; the other ranks' slices are within a 4 KiB chunk of
it); memory: each rank's peak RSS over the whole process (GNU time), the largest rank; and, from
--memory-metrics, rank 0's peak RSS during a step (peak_rss_bytes, the largest over the measured steps)
and the resident bytes of its flat parameter buffer after the step (param_resident_bytes, mincore; the
largest over the measured steps); with --shard-params also those of its gradient's buffers after the
step (grad_resident_bytes: the leaf's pages, the partial sums, the reduced slice, the clipped slice;
the largest over the measured steps; "—" for the variants without it). Prints the per-round rows, the
math libraries and thread counts of the first run's run.json, the sharded-optimizer table as before
(medians over rounds, ratios sharded/unsharded), then one table of every variant against unsharded.
The bits are the same (tests/integration/test_shard.py and test_shard_params.py prove it; this bench
checks the final fingerprints agree with the unsharded run's too). A run that fails (a model that does
not fit) is reported as failed, with culprit's line, and the bench goes on. Results:
docs/performance.md, "Sharded optimizer state" and "Sharded parameters".
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
    # GPT-2 small's shape (docs/models.md, bench/gpt2_small.sh: 12 x 768, 12 heads, vocabulary 50257, tied
    # head, GPT-2 initialisation; 123.7M parameters at --seq-len 32), one sequence per micro-shard.
    "gpt-124m": ["--model", "gpt", "--layers", "12", "--width", "768", "--heads", "12", "--seq-len", "32",
                 "--vocab", "50257", "--tie-head", "--init", "gpt2", "--global-batch", "4",
                 "--optimizer", "adamw", "--lr", "0.0006"],
    # A smaller GPT with GPT-2's vocabulary (6 x 512: 44.7M parameters), for where gpt-124m does not fit.
    "gpt-6x512": ["--model", "gpt", "--layers", "6", "--width", "512", "--heads", "8", "--seq-len", "32",
                  "--vocab", "50257", "--tie-head", "--init", "gpt2", "--global-batch", "4",
                  "--optimizer", "adamw", "--lr", "0.0006"],
}
DEFAULT_MODELS = ("mlp-2m", "gpt-4x256")
VARIANTS = {"unsharded": [], "sharded": ["--shard-optimizer"], "params": ["--shard-params"],
            "params-keep": ["--shard-params", "--keep-gathered"]}
WORLDS = (1, 2, 4)


def one(work, model, world, variant, steps):
    """One run: a dict of its measurements, or one with "error" when it failed."""
    tag = "%s-%d-%s" % (model, world, variant)
    run_dir = os.path.join(work, tag)
    shutil.rmtree(run_dir, ignore_errors=True)
    rss = os.path.join(work, "rss-" + tag)
    for p in glob.glob(rss + "-*"):
        os.remove(p)
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(world), "bash", "-c",
           'exec /usr/bin/time -o "$0-$OMPI_COMM_WORLD_RANK" -f %M "$@"', rss,
           CULPRIT, "train", "--run-dir", run_dir, "--steps", str(steps), "--micro-shards", "4", "--quiet",
           "--checkpoint-every", "0", "--samples", "1024", "--memory-metrics"] + MODELS[model] + VARIANTS[variant]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        lines = [l.strip() for l in (p.stderr + p.stdout).splitlines() if l.strip().strip("-")]
        said = [l for l in lines if l.startswith("culprit")] or lines  # culprit's line, before mpirun's
        shutil.rmtree(run_dir, ignore_errors=True)
        return {"error": "exit %d: %s" % (p.returncode, said[0] if said else "")}
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    measured = rows[2:] or rows[-1:]
    peak = max(int(open(q).read().split()[-1]) for q in glob.glob(rss + "-*"))
    res = {"seconds": statistics.median(r["seconds"] for r in measured),
           "optimizer_bytes": rows[-1]["optimizer_bytes"],
           "peak_rss_kib": peak,  # GNU time: the largest rank's, the whole process
           "step_peak_rss_bytes": max(r["peak_rss_bytes"] for r in measured),  # rank 0's, during a step
           "param_resident_bytes": max(r["param_resident_bytes"] for r in measured),
           # rank 0's gradient buffers after the step: --shard-params only (None without it)
           "grad_resident_bytes": max((r["grad_resident_bytes"] for r in measured if "grad_resident_bytes" in r),
                                      default=None),
           "fingerprint": rows[-1]["fingerprint"]}
    if not os.path.exists(os.path.join(work, "run.json")):  # the math libraries, for the report
        shutil.copy(os.path.join(run_dir, "run.json"), os.path.join(work, "run.json"))
    shutil.rmtree(run_dir, ignore_errors=True)  # gpt-124m's checkpoint is 1.4 GB
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help="of: " + ", ".join(MODELS))
    ap.add_argument("--variants", default=",".join(VARIANTS), help="of: " + ", ".join(VARIANTS) +
                    " (the ratios need unsharded)")
    ap.add_argument("--worlds", default=",".join(map(str, WORLDS)))
    ap.add_argument("--json", help="write every run's measurements here")
    a = ap.parse_args()
    models = a.models.split(",")
    variants = [v for v in a.variants.split(",") if v]
    worlds = [int(w) for w in a.worlds.split(",")]
    for m in models:
        if m not in MODELS:
            ap.error("unknown model %s (of: %s)" % (m, ", ".join(MODELS)))
    for v in variants:
        if v not in VARIANTS:
            ap.error("unknown variant %s (of: %s)" % (v, ", ".join(VARIANTS)))
    work = tempfile.mkdtemp(prefix="culprit-shard-")
    keys = [(m, w, v) for m in models for w in worlds for v in variants]
    res = {k: [] for k in keys}
    math = None
    try:
        for r in range(a.rounds):
            order = keys[r % len(keys):] + keys[:r % len(keys)]
            for k in order:
                x = one(work, *k, a.steps)
                res[k].append(x)
                if "error" in x:
                    print("round %d %-10s W=%d %-11s FAILED %s" % (r, k[0], k[1], k[2], x["error"]), flush=True)
                    continue
                grad = x["grad_resident_bytes"]
                print("round %d %-10s W=%d %-11s step %.4f s  optimizer %7.2f MiB  peak RSS %7.1f MiB"
                      "  step peak RSS %7.1f MiB  params resident %7.2f MiB  grad resident %s" %
                      (r, k[0], k[1], k[2], x["seconds"], x["optimizer_bytes"] / 2**20, x["peak_rss_kib"] / 1024.0,
                       x["step_peak_rss_bytes"] / 2**20, x["param_resident_bytes"] / 2**20,
                       "%7.2f MiB" % (grad / 2**20) if grad is not None else "—"), flush=True)
        if os.path.exists(os.path.join(work, "run.json")):
            info = json.load(open(os.path.join(work, "run.json")))
            math = {"math": info.get("math"), "blas": info.get("blas"),
                    "intra_op_threads": info.get("intra_op_threads")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rounds": a.rounds, "steps": a.steps, "math": math,
                       "runs": [{"model": k[0], "world": k[1], "variant": k[2], "round": i, **x}
                                for k in keys for i, x in enumerate(res[k])]}, f, indent=1)
    if math:
        print("\nmath libraries: %s; blas: %s; intra-op threads per rank: %s" % (
            json.dumps(math["math"]), json.dumps(math["blas"]), math["intra_op_threads"]))

    def med(xs, f):
        v = [x[f] for x in xs if "error" not in x and x.get(f) is not None]
        return statistics.median(v) if v else None

    def ratio(xs, us, f):
        v = [x[f] / u[f] for x, u in zip(xs, us) if "error" not in x and "error" not in u]
        return statistics.median(v) if v else None

    def same_bits(xs, us):  # every final fingerprint equal to the unsharded runs' ("*": some runs failed)
        ref = [u["fingerprint"] for u in us if "error" not in u]
        got = [x["fingerprint"] for x in xs if "error" not in x]
        if not ref or not got:
            return "n/a"
        return ("yes" if len(set(ref + got)) == 1 else "NO") + ("" if len(ref + got) == len(xs + us) else "*")

    def fmt(v, spec, scale=1.0):
        return spec % (v / scale) if v is not None else "n/a"

    if "unsharded" in variants and "sharded" in variants:  # the table this bench has always printed
        print("\nmedians over %d rounds (ratio: sharded / unsharded, paired within a round)" % a.rounds)
        print("%-10s %2s  %10s %10s %7s  %12s %12s  %10s %10s %7s  %s" % (
            "model", "W", "step(u)", "step(s)", "ratio", "optim(u)MiB", "optim(s)MiB", "RSS(u)MiB", "RSS(s)MiB",
            "ratio", "same bits"))
        for m in models:
            for w in worlds:
                u, s = res[(m, w, "unsharded")], res[(m, w, "sharded")]
                print("%-10s %2d  %10s %10s %7s  %12s %12s  %10s %10s %7s  %s" % (
                    m, w, fmt(med(u, "seconds"), "%.4f"), fmt(med(s, "seconds"), "%.4f"),
                    fmt(ratio(s, u, "seconds"), "%.3f"), fmt(med(u, "optimizer_bytes"), "%.2f", 2**20),
                    fmt(med(s, "optimizer_bytes"), "%.2f", 2**20), fmt(med(u, "peak_rss_kib"), "%.1f", 1024),
                    fmt(med(s, "peak_rss_kib"), "%.1f", 1024), fmt(ratio(s, u, "peak_rss_kib"), "%.3f"),
                    same_bits(s, u)))

    print("\nevery variant against unsharded: medians over %d rounds, ratios variant / unsharded paired within a"
          " round;\nstep RSS: rank 0's peak during a step (--memory-metrics), params: its parameter buffer's"
          " resident bytes;\ngrad: its gradient buffers' resident bytes (--shard-params only, — otherwise);"
          "\nproc RSS: the largest rank's peak over the whole process (GNU time)" % a.rounds)
    print("%-10s %2s %-11s  %9s %6s  %10s %6s  %10s %6s  %10s %6s  %10s  %10s %6s  %s" % (
        "model", "W", "variant", "step s", "ratio", "optim MiB", "ratio", "stepRSSMiB", "ratio", "params MiB",
        "ratio", "grad MiB", "procRSSMiB", "ratio", "same bits"))
    for m in models:
        for w in worlds:
            u = res.get((m, w, "unsharded"), [])
            for v in variants:
                xs = res[(m, w, v)]
                cols = []
                for f, spec, scale in (("seconds", "%.4f", 1), ("optimizer_bytes", "%.2f", 2**20),
                                       ("step_peak_rss_bytes", "%.1f", 2**20),
                                       ("param_resident_bytes", "%.2f", 2**20), ("peak_rss_kib", "%.1f", 1024)):
                    cols += [fmt(med(xs, f), spec, scale), fmt(ratio(xs, u, f), "%.3f")]
                g = med(xs, "grad_resident_bytes")
                ok = any("error" not in x for x in xs)  # "—": ran, without grad_resident_bytes
                cols.insert(8, "%.2f" % (g / 2**20) if g is not None else "—" if ok else "n/a")
                print("%-10s %2d %-11s  %9s %6s  %10s %6s  %10s %6s  %10s %6s  %10s  %10s %6s  %s" % (
                    (m, w, v) + tuple(cols) + (same_bits(xs, u),)))
    failed = [(k, x["error"]) for k in keys for x in res[k] if "error" in x]
    for k, e in failed:
        print("failed: %s W=%d %s: %s" % (k[0], k[1], k[2], e))


if __name__ == "__main__":
    main()
