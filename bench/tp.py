#!/usr/bin/env python3
"""gpt's tensor-parallel form (--tp-chunks C, --tensor-parallel T): step time against the plain gpt.

    . scripts/env.sh; .venv/bin/python bench/tp.py [--rounds 3] [--steps 8] [--models small,large]
        [--variants plain,chunked,dp2,tp2,tp4] [--json OUT]

Variants, each a `culprit train --model gpt` run (--checkpoint-every 0, --quiet):
  plain    no --tp-chunks, W = 1: the baseline;
  chunked  --tp-chunks C, W = 1 (T = 1: every chunk on the one rank): the chunk count's own cost;
  dp2      no --tp-chunks, W = 2: plain data parallel over D = 2, for comparison;
  dp2c     --tp-chunks C, W = 2, T = 1 (data parallel over D = 2, chunked; not run by default);
  tp2      --tp-chunks C --tensor-parallel 2, W = 2 (D = 1: each micro-shard's chunks over 2 ranks);
  tp4      --tp-chunks C --tensor-parallel 4, W = 4 (D = 1). On a 2-core machine this oversubscribes
           the cores 2:1 (every rank has one intra-op thread), so its ratio mostly measures the
           oversubscription, not tensor parallelism.
Ratios: chunked / plain; dp2 / plain; dp2c, tp2 and tp4 / chunked (all paired within a round, then the
median over rounds).

Every round runs each (model, variant) once, in an order rotated round by round (this VM drifts by up to
1.5x between runs: ratios are paired within a round). Step time: the median of rank 0's metrics.jsonl
"seconds" over the steps after the first two. Every chunked run (chunked, dp2c, tp2, tp4) must end on the
same final fingerprint (metrics.jsonl's last line): every layout gives the same bits; the bench checks it
and prints it (the plain gpt's is printed beside it, for information: it adds its sums in another order).
Launch: mpirun --oversubscribe --bind-to none -np W (run after `. scripts/env.sh`, which sets Open MPI's
run-as-root variables). The binary: $CULPRIT_BIN, else build/culprit. Run directories go in a temporary
directory, deleted at the end. A run that fails is reported with culprit's line and the bench goes on.
Prints the per-round rows, the math libraries and thread counts of the first run's run.json, then the
medians and ratios per model.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CULPRIT = os.environ.get("CULPRIT_BIN", os.path.join(HERE, "..", "build", "culprit"))
# model: (its flags, C)
MODELS = {
    "small": (["--layers", "2", "--width", "64", "--heads", "4", "--global-batch", "16"], 4),
    "large": (["--layers", "4", "--width", "256", "--heads", "8", "--seq-len", "64", "--vocab", "512",
               "--global-batch", "16"], 8),
}
# variant: (world, chunked, T)
VARIANTS = {"plain": (1, False, 1), "chunked": (1, True, 1), "dp2": (2, False, 1), "dp2c": (2, True, 1),
            "tp2": (2, True, 2), "tp4": (4, True, 4)}
DEFAULT_VARIANTS = ("plain", "chunked", "dp2", "tp2", "tp4")
# what each variant's ratio is against
BASE = {"chunked": "plain", "dp2": "plain", "dp2c": "chunked", "tp2": "chunked", "tp4": "chunked"}
LABEL = {"plain": "plain gpt, W=1 (baseline)", "chunked": "chunked T=1, W=1", "dp2": "plain, W=2 (D=2 data parallel)",
         "dp2c": "chunked T=1, W=2 (D=2)", "tp2": "chunked T=2, W=2 (D=1)",
         "tp4": "chunked T=4, W=4 (D=1) OVERSUBSCRIBED"}


def one(work, model, variant, steps, micro_shards):
    """One run: a dict of its measurements, or one with "error" when it failed."""
    world, chunked, T = VARIANTS[variant]
    flags, C = MODELS[model]
    run_dir = os.path.join(work, "%s-%s" % (model, variant))
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(world),
           CULPRIT, "train", "--run-dir", run_dir, "--quiet", "--model", "gpt", "--steps", str(steps),
           "--micro-shards", str(micro_shards), "--checkpoint-every", "0"] + flags
    if chunked:
        cmd += ["--tp-chunks", str(C), "--tensor-parallel", str(T)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        lines = [l.strip() for l in (p.stderr + p.stdout).splitlines() if l.strip().strip("-")]
        said = [l for l in lines if l.startswith("culprit")] or lines  # culprit's line, before mpirun's
        shutil.rmtree(run_dir, ignore_errors=True)
        return {"error": "exit %d: %s" % (p.returncode, said[0] if said else "")}
    rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
    measured = rows[2:] or rows[-1:]
    res = {"seconds": statistics.median(r["seconds"] for r in measured), "fingerprint": rows[-1]["fingerprint"],
           "steps_measured": len(measured)}
    if not os.path.exists(os.path.join(work, "run.json")):  # the math libraries, for the report
        shutil.copy(os.path.join(run_dir, "run.json"), os.path.join(work, "run.json"))
    shutil.rmtree(run_dir, ignore_errors=True)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--micro-shards", type=int, default=4)
    ap.add_argument("--models", default=",".join(MODELS), help="of: " + ", ".join(MODELS))
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS), help="of: " + ", ".join(VARIANTS))
    ap.add_argument("--json", help="write every run's measurements here")
    a = ap.parse_args()
    models = [m for m in a.models.split(",") if m]
    variants = [v for v in a.variants.split(",") if v]
    for m in models:
        if m not in MODELS:
            ap.error("unknown model %s (of: %s)" % (m, ", ".join(MODELS)))
    for v in variants:
        if v not in VARIANTS:
            ap.error("unknown variant %s (of: %s)" % (v, ", ".join(VARIANTS)))
    if a.steps < 3:
        ap.error("--steps must be at least 3 (the first two steps are not measured)")
    work = tempfile.mkdtemp(prefix="culprit-tp-")
    keys = [(m, v) for m in models for v in variants]
    res = {k: [] for k in keys}
    math = None
    try:
        for r in range(a.rounds):
            order = keys[r % len(keys):] + keys[:r % len(keys)]
            for k in order:
                x = one(work, k[0], k[1], a.steps, a.micro_shards)
                res[k].append(x)
                if "error" in x:
                    print("round %d %-6s %-8s FAILED %s" % (r, k[0], k[1], x["error"]), flush=True)
                    continue
                print("round %d %-6s %-8s W=%d  step %.4f s  fingerprint %s" %
                      (r, k[0], k[1], VARIANTS[k[1]][0], x["seconds"], x["fingerprint"]), flush=True)
        if os.path.exists(os.path.join(work, "run.json")):
            info = json.load(open(os.path.join(work, "run.json")))
            math = {"math": info.get("math"), "blas": info.get("blas"),
                    "intra_op_threads": info.get("intra_op_threads")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rounds": a.rounds, "steps": a.steps, "math": math,
                       "runs": [{"model": k[0], "variant": k[1], "world": VARIANTS[k[1]][0], "round": i, **x}
                                for k in keys for i, x in enumerate(res[k])]}, f, indent=1)
    if math:
        print("\nmath libraries: %s; blas: %s; intra-op threads per rank: %s" % (
            json.dumps(math["math"]), json.dumps(math["blas"]), math["intra_op_threads"]))
    print("cores on this machine: %d" % (os.cpu_count() or 0))

    def med(xs):
        v = [x["seconds"] for x in xs if "error" not in x]
        return statistics.median(v) if v else None

    def ratio(xs, us):
        v = [x["seconds"] / u["seconds"] for x, u in zip(xs, us) if "error" not in x and "error" not in u]
        return statistics.median(v) if v else None

    def fmt(v, spec):
        return spec % v if v is not None else "n/a"

    print("\nstep time: medians over %d rounds of rank 0's median step (steps 3..%d); ratios paired within a round,"
          " then the median" % (a.rounds, a.steps))
    bad = False
    for m in models:
        flags, C = MODELS[m]
        print("\nmodel %s (C = %d): %s --micro-shards %d" % (m, C, " ".join(flags), a.micro_shards))
        print("  %-8s %-40s %2s  %9s  %-16s %7s" % ("variant", "", "W", "step s", "ratio against", "ratio"))
        for v in variants:
            xs = res[(m, v)]
            b = BASE.get(v)
            has_b = b in variants
            print("  %-8s %-40s %2d  %9s  %-16s %7s" % (
                v, LABEL[v], VARIANTS[v][0], fmt(med(xs), "%.4f"), b if has_b else "—",
                fmt(ratio(xs, res[(m, b)]), "%.3f") if has_b else "—"))
        chunked = [(v, x["fingerprint"]) for v in variants if VARIANTS[v][1] for x in res[(m, v)] if "error" not in x]
        prints = sorted(set(f for _, f in chunked))
        runs = sum(len(res[(m, v)]) for v in variants if VARIANTS[v][1])
        if chunked:
            same = len(prints) == 1
            bad |= not same
            print("  final fingerprints of the chunked runs (%s): %s — %s%s" % (
                ", ".join(v for v in variants if VARIANTS[v][1]), ", ".join(prints),
                "SAME across every layout and round" if same else "DIFFERENT",
                "" if len(chunked) == runs else " (%d of %d runs failed)" % (runs - len(chunked), runs)))
        for v in variants:
            if not VARIANTS[v][1]:
                fs = sorted(set(x["fingerprint"] for x in res[(m, v)] if "error" not in x))
                print("  final fingerprint of %s (for information: another order of sums): %s" % (v, ", ".join(fs)))
    failed = [(k, x["error"]) for k in keys for x in res[k] if "error" in x]
    for k, e in failed:
        print("failed: %s %s: %s" % (k[0], k[1], e))
    if "tp4" in variants and (os.cpu_count() or 0) < 4:
        print("\nnote: tp4 runs 4 ranks on %d cores: its ratio mostly measures the oversubscription."
              % (os.cpu_count() or 0))
    return 1 if bad or failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
