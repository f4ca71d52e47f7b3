"""culprit audit --run-dir: every checkpoint interval replayed, a silent fault found in its interval,
RUN/audit.json; --share I/N and --merge (the Slurm job array's parts) give the same report, and a
missing share is named. culprit audit --compare: two runs meant to be identical, one trained on data
with one sample changed, are told apart at the first step that used the sample, naming the first
differing tensor; two identical runs (on different world sizes) compare equal."""
import json
import os
import sys
import unittest

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import TempDirTest, incidents, run  # noqa: E402

ARGS = ["--model", "mlp", "--steps", "12", "--global-batch", "16", "--micro-shards", "4", "--checkpoint-every", "4",
        "--keep-last", "10", "--quiet"]


class AuditRun(TempDirTest):
    """Every checkpoint interval replayed, spread over the ranks."""

    ARGS = ["--model", "mlp", "--steps", "12", "--global-batch", "24", "--micro-shards", "4", "--samples", "96",
            "--checkpoint-every", "3", "--keep-last", "10", "--on-detect", "warn", "--quiet"]

    def test_silent_fault_is_found_in_its_interval(self):
        # A small transient bitflip in rank 1's forward pass at step 8: no online detector sees it.
        bad = self.train("bad", self.ARGS + ["--inject", "step=8,rank=1,layer=fc2,index=3,phase=forward,kind=bitflip,"
                                                         "bit=22"], world=3)
        self.assertEqual(incidents(bad.run_dir), [])
        res = run(["audit", "--run-dir", bad.run_dir], world=2, use_mpirun=True)
        self.assertEqual(res.code, 5, res.out + res.err)
        self.assertIn("4 interval(s) on 2 rank(s)", res.out)
        for interval in ("0..3", "3..6", "9..12"):
            self.assertRegex(res.out, r"interval %s \(rank \d\): reproduced bitwise" % interval)
        self.assertRegex(res.out, r"interval 6..9 \(rank 0\): MISMATCH step 8 micro-shard 1 \(recorded by rank 1 on \S+\)")
        self.assertIn("1 interval(s) do not reproduce; first: interval 6..9", res.err)
        whole = json.load(open(os.path.join(bad.run_dir, "audit.json")))
        self.assertEqual(whole["mismatches"], 1)
        self.assertEqual([(i["from"], i["verdict"]) for i in whole["intervals"]],
                         [(0, "reproduced"), (3, "reproduced"), (6, "mismatch"), (9, "reproduced")])
        # The same audit in three shares (as a Slurm job array would run it), then merged.
        os.remove(os.path.join(bad.run_dir, "audit.json"))
        for share in (0, 2):
            res = run(["audit", "--run-dir", bad.run_dir, "--share", "%d/3" % share], world=2, use_mpirun=True)
            # Share 0 holds intervals 0..3 and 9..12, share 2 the faulty 6..9.
            self.assertEqual(res.code, 5 if share == 2 else 0, res.out + res.err)
        res = run(["audit", "--merge", bad.run_dir])
        self.assertEqual(res.code, 2, res.out + res.err)
        self.assertIn("lacks share(s) 1", res.err)
        res = run(["audit", "--run-dir", bad.run_dir, "--share", "1/3"], world=1, use_mpirun=True)
        self.assertEqual(res.code, 0, res.out + res.err)  # share 1: interval 3..6
        res = run(["audit", "--merge", bad.run_dir])
        self.assertEqual(res.code, 5, res.out + res.err)
        merged = json.load(open(os.path.join(bad.run_dir, "audit.json")))
        self.assertEqual(merged["shares"], 3)
        self.assertEqual([(i["from"], i["verdict"]) for i in merged["intervals"]],
                         [(i["from"], i["verdict"]) for i in whole["intervals"]])
        # The clean run reproduces everywhere, on any world size.
        clean = self.train("clean", self.ARGS, world=3)
        for world in (1, 3):
            res = run(["audit", "--run-dir", clean.run_dir], world=world, use_mpirun=True)
            self.assertEqual(res.code, 0, res.out + res.err)
            self.assertEqual(res.out.count("reproduced bitwise"), 4, res.out)

    def test_needs_two_checkpoints(self):
        one = self.train("one", ["--model", "mlp", "--steps", "2", "--checkpoint-every", "0", "--keep-last", "1",
                                 "--quiet", "--global-batch", "8", "--micro-shards", "2"], world=1)
        # Retention keeps the run's start (step 0) and the last; without the start, one is left.
        ck = os.path.join(one.run_dir, "checkpoints")
        self.assertEqual(sorted(os.listdir(ck)), ["step-00000000.h5", "step-00000002.h5"])
        os.remove(os.path.join(ck, "step-00000000.h5"))
        res = run(["audit", "--run-dir", one.run_dir], world=2, use_mpirun=True)
        self.assertEqual(res.code, 2, res.out + res.err)
        self.assertIn("an audit needs two (an interval)", res.err)


class AuditCompare(TempDirTest):
    def data(self, name, changed=None):
        rng = np.random.default_rng(3)
        x = rng.standard_normal((64, 20)).astype(np.float32)
        y = rng.integers(0, 5, 64).astype(np.int64)
        if changed is not None:
            x[changed, 7] += 1.0
        path = self.path(name + ".h5")
        with h5py.File(path, "w") as f:
            f["x"] = x
            f["y"] = y
        return path

    def fingerprints(self, run_dir):
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return [json.loads(l)["fingerprint"] for l in f]

    def test_one_differing_sample(self):
        a = self.train("a", ARGS + ["--data", "hdf5:" + self.data("a")], world=2)
        b = self.train("b", ARGS + ["--data", "hdf5:" + self.data("b", changed=41)], world=1)
        same = self.train("same", ARGS + ["--data", "hdf5:" + self.data("a")], world=1)
        # The oracle: the first step whose fingerprint differs, and the first parameter whose recorded
        # fingerprint differs there (read with h5py).
        fa, fb = self.fingerprints(a.run_dir), self.fingerprints(b.run_dir)
        step = next(i + 1 for i, (x, y) in enumerate(zip(fa, fb)) if x != y)
        self.assertGreater(step, 1)  # the changed sample is not in the first batch: a real search
        with h5py.File(os.path.join(a.run_dir, "trace", "rank-00000.h5"), "r") as ta, \
                h5py.File(os.path.join(b.run_dir, "trace", "rank-00000.h5"), "r") as tb:
            params = ta.attrs["params"].decode().split("\n") if isinstance(ta.attrs["params"], bytes) \
                else ta.attrs["params"].split("\n")
            ia = list(ta["steps/step"][:]).index(step)
            ib = list(tb["steps/step"][:]).index(step)
            pa, pb = ta["steps/param_fp"][ia], tb["steps/param_fp"][ib]
            tensor = params[next(i for i in range(len(params)) if pa[i] != pb[i])]
        res = run(["audit", "--compare", a.run_dir, b.run_dir])
        self.assertEqual(res.code, 5, res.out + res.err)
        self.assertIn("first differing step: %d\n" % step, res.out)
        self.assertIn("first differing tensor: %s\n" % tensor, res.out)
        self.assertRegex(res.out, r"checkpoints: 4 common, \d compared; equal through step \d+, different from step \d+")
        # Negative control: the same data on another world size compares equal.
        res = run(["audit", "--compare", a.run_dir, same.run_dir])
        self.assertEqual(res.code, 0, res.out + res.err)
        self.assertIn("the runs agree bitwise", res.out)

    def test_bad_input(self):
        for args, needle in [(["--compare", self.path("nope"), self.path("nope2")], "holds neither checkpoints nor a trace"),
                             (["--compare", "x"], "audit takes --run-dir RUN [--share I/N], --merge RUN or --compare"),
                             (["--run-dir", self.path("r"), "--share", "3/3"], "'--share': '3/3' is not I/N"),
                             (["--merge", self.path("nope")], "no audit share has written its part")]:
            res = run(["audit"] + args)
            self.assertEqual(res.code, 2, res.out + res.err)
            self.assertIn("culprit: error: ", res.err)
            self.assertIn(needle, res.err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
