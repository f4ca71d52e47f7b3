"""Helpers for culprit's integration tests: real mpirun runs of the real binary."""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

CULPRIT = os.environ.get("CULPRIT_BIN", os.path.join(os.path.dirname(__file__), "../../build/culprit"))
if os.environ.get("CULPRIT_REQUIRE_BIN") == "1" and not os.path.exists(CULPRIT):
    raise SystemExit("culprit binary %s is missing (scripts/test.sh builds it)" % CULPRIT)
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none"]
TIMEOUT = int(os.environ.get("CULPRIT_TEST_TIMEOUT", "300"))

# Open MPI refuses root without these; CI runs as root.
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")


class Result:
    def __init__(self, proc, run_dir=None):
        self.code = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr
        self.run_dir = run_dir

    def metrics(self, timings=True):
        """metrics.jsonl's lines; timings=False leaves out what differs run to run (the timers)."""
        with open(os.path.join(self.run_dir, "metrics.jsonl")) as f:
            lines = [json.loads(line) for line in f]
        if not timings:
            lines = [{k: v for k, v in m.items() if k not in TIMINGS} for m in lines]
        return lines

    def final_fingerprint(self):
        return self.metrics()[-1]["fingerprint"]


# metrics.jsonl's timers, the only fields that may differ between two runs of the same steps.
TIMINGS = ("seconds", "detector_seconds", "clip_seconds", "data_wait_seconds", "data_read_seconds")


def run(args, world=1, run_dir=None, timeout=TIMEOUT, use_mpirun=None, env=None):
    """Runs `culprit ARGS` on `world` ranks (mpirun unless world == 1 and use_mpirun is falsy)."""
    cmd = [CULPRIT] + list(args)
    if run_dir is not None:
        cmd += ["--run-dir", run_dir]
    if world > 1 or use_mpirun:
        cmd = MPIRUN + ["-np", str(world)] + cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return Result(proc, run_dir)


def incidents(run_dir):
    """The run's incident records (RUN/incidents.jsonl), none when the file does not exist."""
    path = os.path.join(run_dir, "incidents.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f]


def run_each_rank_code(args, world, workdir, timeout=TIMEOUT, cwd=None):
    """Runs under mpirun (from cwd) and returns (every rank's exit code, stdout, stderr); workdir
    holds the exit codes."""
    script = os.path.join(workdir, "rank_wrapper.sh")
    with open(script, "w") as f:
        f.write('#!/bin/sh\n"$@"\necho $? > "%s/rc.$OMPI_COMM_WORLD_RANK"\n' % workdir)
    os.chmod(script, 0o755)
    proc = subprocess.run(MPIRUN + ["-np", str(world), script, CULPRIT] + list(args),
                          capture_output=True, text=True, timeout=timeout, cwd=cwd)
    codes = []
    for r in range(world):
        with open(os.path.join(workdir, "rc.%d" % r)) as f:
            codes.append(int(f.read()))
    return codes, proc.stdout, proc.stderr


class TempDirTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="culprit-test-")

    def tearDown(self):
        if os.environ.get("CULPRIT_KEEP_TEST_DIRS") != "1":
            shutil.rmtree(self.tmp, ignore_errors=True)

    def path(self, *parts):
        return os.path.join(self.tmp, *parts)

    def train(self, name, extra, world=1):
        res = run(["train", "--quiet"] + list(extra), world=world, run_dir=self.path(name))
        self.assertEqual(res.code, 0, "culprit train failed (W=%d %s):\n%s\n%s" % (world, extra, res.out, res.err))
        return res
