"""Helpers for culprit's integration tests: real mpirun runs of the real binary (train, bisect, a
refusal on every rank), culprit's exit codes, and what several tests read or make (diagnoses, traces,
metrics, run directories, data files)."""
import sys
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
PY = sys.executable  # the interpreter culprit was built for (CULPRIT_PYTHON: ctest runs the tests with it)
CULPRIT = os.environ.get("CULPRIT_BIN", os.path.join(os.path.dirname(__file__), "../../build/culprit"))
if os.environ.get("CULPRIT_REQUIRE_BIN") == "1" and not os.path.exists(CULPRIT):
    raise SystemExit("culprit binary %s is missing (scripts/test.sh builds it)" % CULPRIT)
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none"]
TIMEOUT = int(os.environ.get("CULPRIT_TEST_TIMEOUT", "300"))

# Open MPI refuses root without these; CI runs as root.
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")

# ---- exit codes ----

# culprit's exit codes, named as common/include/culprit/exit_codes.h names them (kExitSilentRank:
# EXIT_SILENT_RANK). test_docs.py checks this table against the header, so the two cannot drift.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_MPI = 3
EXIT_DAMAGED = 4
EXIT_DIFFERS = 5
EXIT_IO = 6
EXIT_HARDWARE = 10
EXIT_NUMERICAL = 11
EXIT_INVARIANT = 12
EXIT_SILENT_RANK = 13
EXIT_HARDWARE_TRANSIENT = 20
EXIT_HARDWARE_PERSISTENT = 21
EXIT_SOFTWARE_NONDETERMINISM = 22
EXIT_NUMERICAL_INSTABILITY = 23
EXIT_DATA = 24
EXIT_INCONCLUSIVE = 25
EXIT_HARDWARE_UNCONFIRMED = 26
EXIT_CODES = {name: code for name, code in globals().items() if name.startswith("EXIT_")}

# bisect's verdicts (docs/bisect.md) and the exit code of each: "none" exits 0, a damaged record
# EXIT_DAMAGED, every other verdict the code named after it.
VERDICTS = {"none": EXIT_OK, "hardware-transient": EXIT_HARDWARE_TRANSIENT,
            "hardware-persistent": EXIT_HARDWARE_PERSISTENT, "software-nondeterminism": EXIT_SOFTWARE_NONDETERMINISM,
            "numerical-instability": EXIT_NUMERICAL_INSTABILITY, "data": EXIT_DATA,
            "inconclusive": EXIT_INCONCLUSIVE, "hardware-unconfirmed": EXIT_HARDWARE_UNCONFIRMED,
            "damaged-record": EXIT_DAMAGED}


def exit_codes_h(path=os.path.join(ROOT, "common", "include", "culprit", "exit_codes.h")):
    """The exit codes the C++ header declares, by the names EXIT_CODES gives them."""
    with open(path) as f:
        text = f.read()
    out = {}
    for name, value in re.findall(r"\bkExit(\w+)\s*=\s*(\d+)", text):
        out["EXIT_" + re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).upper()] = int(value)
    return out


# ---- running culprit ----

class Result:
    def __init__(self, proc, run_dir=None):
        self.code = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr
        self.run_dir = run_dir

    def metrics(self, timings=True):
        return metrics(self.run_dir, timings)

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


def run_each_rank_code(args, world, workdir, timeout=TIMEOUT, cwd=None, env=None, program=None):
    """Runs `PROGRAM ARGS` under mpirun (from cwd) and returns (every rank's exit code, stdout,
    stderr); the program is culprit unless given (e.g. [PY, script]); workdir holds the exit codes."""
    script = os.path.join(workdir, "rank_wrapper.sh")
    with open(script, "w") as f:
        f.write('#!/bin/sh\n"$@"\necho $? > "%s/rc.$OMPI_COMM_WORLD_RANK"\n' % workdir)
    os.chmod(script, 0o755)
    for r in range(world):  # a rank that dies before writing its code must not read an older run's
        if os.path.exists(os.path.join(workdir, "rc.%d" % r)):
            os.remove(os.path.join(workdir, "rc.%d" % r))
    proc = subprocess.run(MPIRUN + ["-np", str(world), script] + (program or [CULPRIT]) + list(args),
                          capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)
    codes = []
    for r in range(world):
        with open(os.path.join(workdir, "rc.%d" % r)) as f:
            codes.append(int(f.read()))
    return codes, proc.stdout, proc.stderr


def last_culprit_line(err):
    """The last line culprit itself wrote to stderr (Open MPI's banners that may follow are not)."""
    lines = [l for l in err.splitlines() if l.startswith("culprit:")]
    return lines[-1] if lines else ""


def verdict_line(verdict, run_dir):
    """The line a verdict's exit ends with (README.md, "Exit codes")."""
    return "culprit: verdict %s (exit %d): this is a diagnosis, not a failure; see %s/diagnosis.json" % (
        verdict, VERDICTS[verdict], run_dir)


def error_lines(err):
    """stderr's `culprit: error:` lines."""
    return [l for l in err.splitlines() if l.startswith("culprit: error:")]


# What a crash leaves on stderr (an exception escaping, a signal, an abort): a refusal never says it.
CRASH_MARKERS = ("terminate called", "Exception raised from", "Segmentation", "Signal:", "stack trace", "Traceback",
                 "Aborted")


# ---- what a run leaves ----

def incidents(run_dir):
    """The run's incident records (RUN/incidents.jsonl), none when the file does not exist."""
    path = os.path.join(run_dir, "incidents.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f]


def diagnosis(run_dir):
    """RUN/diagnosis.json, the bisection's finding."""
    with open(os.path.join(run_dir, "diagnosis.json")) as f:
        return json.load(f)


def metrics(run_dir, timings=True):
    """RUN/metrics.jsonl's lines; timings=False leaves out what differs run to run (the timers)."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    if not timings:
        lines = [{k: v for k, v in m.items() if k not in TIMINGS} for m in lines]
    return lines


def metric_steps(run_dir):
    """The steps of metrics.jsonl's lines, in order."""
    return [m["step"] for m in metrics(run_dir)]


def metric_steps_until_torn(run_dir):
    """The steps of metrics.jsonl's whole lines (a full disk can cut the last one)."""
    out = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            try:
                out.append(json.loads(line)["step"])
            except ValueError:
                break
    return out


def first_differing_step(run_dir, twin_dir):
    """The first step whose rank-0 trace row (loss, gradient, parameters) differs between two runs."""
    rows = []
    for d in (run_dir, twin_dir):
        with h5py.File(os.path.join(d, "trace", "rank-00000.h5"), "r") as f:
            st, n = f["steps"], int(f.attrs["steps_committed"])
            rows.append({int(st["step"][i]): (st["loss"][i].tobytes(), int(st["grad_fp"][i]), st["param_fp"][i].tobytes())
                         for i in range(n)})
    return min(s for s in rows[0] if rows[0][s] != rows[1].get(s))


def tree_digest(root):
    """Every file under root (following nothing) with its content hash."""
    out = {}
    for base, _, names in os.walk(root):
        for n in names:
            p = os.path.join(base, n)
            if os.path.islink(p):
                out[os.path.relpath(p, root)] = "link:" + os.readlink(p)
                continue
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def listing(*dirs):
    """Every file under dirs with its size and modification time."""
    out = {}
    for d in dirs:
        for base, _, files in os.walk(d):
            for n in files:
                p = os.path.join(base, n)
                st = os.stat(p)
                out[p] = (st.st_size, st.st_mtime_ns)
    return out


# ---- models and data ----

# A small MLP run: the run-directory tests' (test_rundir.py, test_disk.py).
SMALL_MLP = ["--model", "mlp", "--global-batch", "16", "--micro-shards", "4", "--quiet"]
DEFAULT_SEED = 1234  # culprit train's default --seed


def make_scripted_model(path, name="mlp_dropout"):
    """Saves scripted_models.py's TorchScript module `name` at path."""
    subprocess.run([PY, os.path.join(HERE, "scripted_models.py"), name, path], check=True)


def randperm(seed, epoch, n):
    """The epoch's sample order (docs/determinism.md, "1. Data order", randperm)."""
    import torch  # here, not at the top: torch is slow to import and most tests never need it
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(n, generator=g).tolist()


def tokens_of(path, dtype):
    return np.fromfile(path, dtype="<u2" if dtype == "uint16" else "<u4").astype(np.int64)


def write_tokens(path, tokens, dtype="uint16", meta=None):
    np.asarray(tokens, dtype="<u2" if dtype == "uint16" else "<u4").tofile(path)
    if meta is not None:
        with open(path + ".json", "w") as f:
            json.dump(meta, f)


def keep_mtime(path, change):
    """Applies change(path) and puts the file's modification time back (a change a record cannot see)."""
    st = os.stat(path)
    change(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def flip_byte(path, offset, mask=0x01):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([b ^ mask]))


# scripts/tokenize.py's corpus (the repository's README.md and docs/*.md): its window and vocabulary.
CORPUS_T, CORPUS_V = 64, 512


def make_corpus():
    """Makes scripts/tokenize.py's corpus in a directory of its own (a test module's setUpModule);
    returns its path. remove_corpus removes it."""
    path = os.path.join(tempfile.mkdtemp(prefix="culprit-test-corpus-"), "corpus.bin")
    subprocess.run([PY, os.path.join(ROOT, "scripts", "tokenize.py"), path], check=True, capture_output=True,
                   timeout=120)
    return path


def remove_corpus(path):
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


# ---- the tests' base classes ----

class TempDirTest(unittest.TestCase):
    # How long a refusal may take before the test calls it a hang.
    REFUSAL_TIMEOUT = TIMEOUT

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="culprit-test-")

    def tearDown(self):
        if os.environ.get("CULPRIT_KEEP_TEST_DIRS") != "1":
            shutil.rmtree(self.tmp, ignore_errors=True)

    def path(self, *parts):
        return os.path.join(self.tmp, *parts)

    def train(self, name, args, world=1, code=EXIT_OK, env=None):
        """Runs `culprit train --quiet ARGS` on `world` ranks in the run directory `name`, which must
        exit `code`; returns the Result (its run_dir: the run directory)."""
        res = run(["train", "--quiet"] + list(args), world=world, run_dir=self.path(name), env=env)
        self.assertEqual(res.code, code, "culprit train exited %d, not %d (W=%d %s):\n%s\n%s" % (
            res.code, code, world, args, res.out, res.err))
        return res

    def bisect(self, run_dir, world, verdict, env=None):
        """Runs `culprit bisect` on run_dir under mpirun on `world` ranks, which must find `verdict`
        (its exit code and its report say it); returns diagnosis.json."""
        res = run(["bisect", "--run-dir", run_dir], world=world, use_mpirun=True, env=env)
        self.assertEqual(res.code, VERDICTS[verdict], res.out + res.err)
        self.assertIn("verdict: " + verdict, res.out)
        # culprit's own last line says what the exit code means (a diagnosis, not a crash) before
        # Open MPI's "non-zero exit code" banner; "none" exits 0 and needs none.
        if verdict == "none":
            self.assertNotIn("culprit: verdict", res.err)
        elif verdict != "damaged-record":
            self.assertEqual(last_culprit_line(res.err), verdict_line(verdict, run_dir), res.err)
        return diagnosis(run_dir)

    def assert_refused(self, args, code, *wants, world=2, watch=(), env=None, program=None):
        """Runs `culprit ARGS` (or `PROGRAM ARGS`) under mpirun on `world` ranks from a directory of its
        own: every rank exits `code`; stderr holds one `culprit: error:` line (a script: the same line
        from each rank at most), holding each of `wants`, and nothing a crash leaves; nothing changes
        in the working directory or the `watch`ed ones. Returns the line."""
        cwd = tempfile.mkdtemp(prefix="cwd-", dir=self.tmp)
        workdir = tempfile.mkdtemp(prefix="rc-", dir=self.tmp)
        before = listing(cwd, *watch)
        codes, _, err = run_each_rank_code(args, world, workdir, timeout=self.REFUSAL_TIMEOUT, cwd=cwd, env=env,
                                           program=program)
        self.assertEqual(codes, [code] * world, "exit codes for %s:\n%s" % (args, err))
        lines = error_lines(err)
        if program:
            # A Python script says it on each rank that refused (the package has no rank-0 printer):
            # the same line, once per rank at most.
            self.assertTrue(1 <= len(lines) <= world and len(set(lines)) == 1,
                            "want one error line (once per rank at most) for %s, got:\n%s" % (args, err))
        else:
            self.assertEqual(len(lines), 1, "want one error line for %s, got:\n%s" % (args, err))
        for want in wants:
            self.assertIn(want, lines[0])
        for marker in CRASH_MARKERS:
            self.assertNotIn(marker, err)
        self.assertEqual(listing(cwd, *watch), before, "written outside the run directory by %s" % args)
        return lines[0]


class DataTest(TempDirTest):
    """The data tests' (test_data.py, test_data_record.py): every run's read stall is checked."""

    def check_timers(self, res):
        """metrics.jsonl's read stall: both fields on every line, never negative."""
        for m in res.metrics():
            self.assertGreaterEqual(m["data_wait_seconds"], 0.0, m)
            self.assertGreaterEqual(m["data_read_seconds"], 0.0, m)

    def train(self, name, args, world=1, code=EXIT_OK, env=None):
        res = super().train(name, args, world, code, env)
        self.check_timers(res)
        return res
