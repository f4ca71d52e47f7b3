#!/usr/bin/env python3
"""The Python package's overhead: examples/train_mlp.py's model (at a chosen width) trained by `mpirun python3 SCRIPT` (an eager
nn.Module called back from culprit's C++ core, docs/python.md) and by `culprit train` on its
TorchScript export with its data as HDF5, side by side in interleaved rounds.

    .venv/bin/python bench/python_overhead.py [--rounds 5] [--worlds 1,2] [--widths 32,512] [--steps 30]

Both runs must give the same final fingerprint (checked every round: a ratio of two different
computations would measure nothing). Per run the step time is the median of metrics.jsonl's
"seconds" over the steps after the first five; per round and configuration the ratio python /
culprit train; printed: each configuration's median ratio over the rounds and its range."""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CULPRIT = os.environ.get("CULPRIT_BIN", os.path.join(HERE, "..", "build", "culprit"))
PKG = os.environ.get("CULPRIT_PYTHON_DIR", os.path.join(HERE, "..", "build", "python"))
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none"]
ENV = dict(os.environ, PYTHONPATH=PKG, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")

# examples/train_mlp.py's Setup at a chosen width (BENCH_WIDTH), 64 features, 10 classes and 2048
# samples: a script of its own that sets the example's shape and hands on its build() and export().
SCRIPT = """
import os, sys
sys.path.insert(0, %r)
import train_mlp as example
example.FEATURES, example.HIDDEN, example.CLASSES, example.SAMPLES = 64, int(os.environ["BENCH_WIDTH"]), 10, 2048

def build():
    return example.build()

if __name__ == "__main__":
    if sys.argv[1:2] == ["export"]:
        example.export(sys.argv[2])
        sys.exit(0)
    sys.exit(example.culprit.main(build))
""" % os.path.join(HERE, "..", "examples")


def step_seconds(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        m = [json.loads(l) for l in f]
    return statistics.median(x["seconds"] for x in m[5:]), m[-1]["fingerprint"]


def run(cmd, env):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if p.returncode != 0:
        raise SystemExit("failed: %s\n%s%s" % (" ".join(cmd), p.stdout, p.stderr))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--worlds", default="1,2")
    ap.add_argument("--widths", default="32,512")
    ap.add_argument("--steps", type=int, default=30)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="culprit-pybench-")
    script = os.path.join(work, "bench_model.py")
    with open(script, "w") as f:
        f.write(SCRIPT)
    common = ["--steps", str(a.steps), "--global-batch", "256", "--micro-shards", "8", "--checkpoint-every", "0",
              "--quiet"]
    configs = [(w, width) for width in map(int, a.widths.split(",")) for w in map(int, a.worlds.split(","))]
    opt = {}
    for width in {c[1] for c in configs}:
        d = os.path.join(work, "export%d" % width)
        os.makedirs(d)
        subprocess.run([sys.executable, script, "export", d], capture_output=True, text=True, check=True,
                       env=dict(ENV, BENCH_WIDTH=str(width)))
        with open(os.path.join(d, "args")) as f:
            opt[width] = f.read().split()
    ratios = {c: [] for c in configs}
    try:
        for r in range(a.rounds):
            for i, (w, width) in enumerate(configs):
                env = dict(ENV, BENCH_WIDTH=str(width))
                d = os.path.join(work, "export%d" % width)
                py_dir, ts_dir = os.path.join(work, "py"), os.path.join(work, "ts")
                py = MPIRUN + ["-np", str(w), sys.executable, script, "--run-dir", py_dir] + common
                ts = MPIRUN + ["-np", str(w), CULPRIT, "train", "--run-dir", ts_dir, "--model", "torchscript:" + d +
                               "/model.pt", "--data", "hdf5:" + d + "/data.h5"] + opt[width] + common
                order = [py, ts] if (r + i) % 2 == 0 else [ts, py]  # rotated: neither always runs first
                for d_ in (py_dir, ts_dir):
                    shutil.rmtree(d_, ignore_errors=True)
                for cmd in order:
                    run(cmd, env)
                (p_s, p_fp), (t_s, t_fp) = step_seconds(py_dir), step_seconds(ts_dir)
                if p_fp != t_fp:
                    raise SystemExit("W=%d width %d: python and culprit train differ (%s vs %s)" % (w, width, p_fp, t_fp))
                ratios[(w, width)].append(p_s / t_s)
                print("round %d W=%d width %4d: python %.4f s/step, culprit train %.4f s/step, ratio %.3f (bits equal)"
                      % (r, w, width, p_s, t_s, p_s / t_s), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n| W | width | parameters | python / culprit train (median of %d rounds) | range |" % a.rounds)
    print("|---|---|---|---|---|")
    for (w, width), rs in ratios.items():
        params = 64 * width + width + 2 * width + width * width + width + width * 10 + 10
        print("| %d | %d | %d | %.3f | %.3f-%.3f |" % (w, width, params, statistics.median(rs), min(rs), max(rs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
