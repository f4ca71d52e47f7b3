#!/usr/bin/env python3
"""Long clean runs (docs/detection.md "Long clean runs", docs/performance.md "Soak"): for each model,
one clean `culprit train` of STEPS steps on WORLD ranks with the default detectors (spike window 20,
z 8, ratio 3, action warn) and the default trace, sampling every rank's resident memory as it runs.
Prints per model: the spike warnings (the false positives: the run is clean, the truth is that
nothing was injected), the RSS curve (MiB at a few points) and its slope over the second half in
bytes per step, the trace's bytes per step, and the wall time. Not in the default suite.

    bench/soak.py [--steps 20000] [--models mlp,cnn,gpt] [--world 2] [--csv DIR]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CULPRIT = os.environ.get("CULPRIT_BIN", os.path.join(ROOT, "build", "culprit"))
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none"]
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")


def rss_of_ranks(session):
    """Resident KiB of every culprit rank of the job (its session), by pid."""
    out = subprocess.run(["ps", "-s", str(session), "-o", "pid=,rss=,comm="], capture_output=True, text=True).stdout
    return {int(p): int(r) for p, r, c in (l.split() for l in out.splitlines()) if c == "culprit"}


def last_step(run_dir):
    try:
        with open(os.path.join(run_dir, "metrics.jsonl"), "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 400))
            lines = f.read().decode(errors="replace").splitlines()
        return json.loads(lines[-1])["step"] if lines else 0
    except (OSError, ValueError, KeyError, IndexError):
        return 0


def soak(model, steps, world, work, csv_dir):
    run_dir = os.path.join(work, model)
    cmd = MPIRUN + ["-np", str(world), CULPRIT, "train", "--run-dir", run_dir, "--model", model, "--steps",
                    str(steps), "--checkpoint-every", "1000", "--keep-last", "2", "--quiet"]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    curve = []  # (step, MiB of the largest rank)
    while proc.poll() is None:
        rss = rss_of_ranks(proc.pid)
        step = last_step(run_dir)
        if rss and step:
            curve.append((step, max(rss.values()) / 1024))
        time.sleep(2)
    err = proc.stderr.read()
    wall = time.time() - t0
    if proc.returncode != 0:
        sys.exit("%s: culprit train failed (exit %d):\n%s" % (model, proc.returncode, err[-2000:]))
    spikes = [l for l in err.splitlines() if " spike (numerical)" in l]
    warnings = len(spikes)
    trace_bytes = sum(os.path.getsize(os.path.join(run_dir, "trace", n)) for n in os.listdir(os.path.join(run_dir, "trace")))
    half = [c for c in curve if c[0] >= steps // 2]
    slope = (half[-1][1] - half[0][1]) * 1048576 / max(1, half[-1][0] - half[0][0]) if len(half) > 1 else float("nan")
    if csv_dir:
        os.makedirs(csv_dir, exist_ok=True)
        with open(os.path.join(csv_dir, "soak-%s.csv" % model), "w") as f:
            f.write("step,rss_mib\n" + "".join("%d,%.1f\n" % c for c in curve))
    points = [curve[int(i * (len(curve) - 1) / 4)] for i in range(5)] if curve else []
    print("%-4s %6d steps  W=%d  spike warnings %d  RSS MiB %s  slope %+.1f B/step (2nd half)  "
          "trace %.0f B/step/rank  %.0f s" % (model, steps, world, warnings,
                                             " ".join("%d@%d" % (m, s) for s, m in points), slope,
                                             trace_bytes / steps / world, wall))
    for l in spikes[:3]:
        print("     " + l)
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--models", default="mlp,cnn,gpt")
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--csv", default="", help="write each model's RSS curve to DIR/soak-MODEL.csv")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="culprit-soak-") as work:
        for model in a.models.split(","):
            soak(model, a.steps, a.world, work, a.csv)


if __name__ == "__main__":
    main()
