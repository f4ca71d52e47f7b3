"""Checkpoints, resume, the trace, retention and the inspect/verify/diff tools. (A slow copy of the
state in the checkpoint pipeline: harness/tests/test_checkpoint_copy.cpp, through the Env seam.)"""
import glob
import json
import os
import struct
import subprocess
import sys
import unittest

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import EXIT_USAGE, TempDirTest, run  # noqa: E402
import reference_trainer as ref  # noqa: E402

PY = sys.executable  # the interpreter culprit was built for (CULPRIT_PYTHON: ctest runs the tests with it)
HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = {"mlp": [], "cnn": [], "gpt": ["--optimizer", "adamw", "--lr", "0.003"]}
BASE = ["--global-batch", "32", "--micro-shards", "4", "--samples", "160", "--checkpoint-every", "5"]


def ckpt(run_dir, step):
    return os.path.join(run_dir, "checkpoints", "step-%08d.h5" % step)


class Resume(TempDirTest):
    def test_straight_equals_interrupted_and_resumed(self):
        for model, extra in MODELS.items():
            with self.subTest(model=model):
                args = ["--model", model] + BASE + extra
                straight = self.train(model + "-straight", args + ["--steps", "20"], world=2)
                self.train(model + "-split", args + ["--steps", "10"], world=2)
                # The resumed half runs on another world size for mlp.
                world = 3 if model == "mlp" else 2
                res = run(["train", "--quiet", "--resume", "--steps", "20"], world=world,
                          run_dir=self.path(model + "-split"))
                self.assertEqual(res.code, 0, res.err)
                self.assertEqual(res.metrics(timings=False), straight.metrics(timings=False))
                d = run(["diff", ckpt(self.path(model + "-straight"), 20), ckpt(self.path(model + "-split"), 20)])
                self.assertEqual(d.code, 0, d.out + d.err)
                self.assertIn("identical", d.out)
        # Negative control: a checkpoint of another step differs, and diff says where.
        d = run(["diff", ckpt(self.path("mlp-straight"), 15), ckpt(self.path("mlp-straight"), 20)])
        self.assertEqual(d.code, 5)
        self.assertRegex(d.out, r"/model/fc1.weight: \d+ of 2048 elements differ, max \|a-b\| [0-9.e-]+, first at \[")

    def test_checkpoint_writers(self):
        # Every rank holds the whole state; --checkpoint-writers-per-host picks who writes it (slices of
        # every tensor of >= 1 MiB through MPI-IO, small tensors in turn). The files are the same.
        args = ["--model", "mlp", "--hidden", "1024", "--steps", "4", "--checkpoint-every", "2"] + BASE[:6]
        for n, writers in ((1, 1), (2, 2), (0, 3)):
            self.train("w%d" % n, args + ["--checkpoint-writers-per-host", str(n)], world=3)
            log = [json.loads(l) for l in open(os.path.join(self.path("w%d" % n), "checkpoints.jsonl"))]
            self.assertEqual({c["writers"] for c in log}, {writers})
        for n in (2, 0):
            for step in (2, 4):
                d = run(["diff", ckpt(self.path("w1"), step), ckpt(self.path("w%d" % n), step)])
                self.assertEqual(d.code, 0, d.out + d.err)
            v = run(["verify", self.path("w%d" % n)])
            self.assertEqual(v.code, 0, v.out + v.err)
        r = run(["train", "--checkpoint-writers-per-host", "-1"], run_dir=self.path("bad"))
        self.assertEqual(r.code, 2)
        self.assertIn("option '--checkpoint-writers-per-host' must be in [0, 1024], got -1", r.err)

    def test_resume_refusals(self):
        r = run(["train", "--resume"], run_dir=self.path("nothing"))
        self.assertEqual(r.code, 2)
        self.assertIn("holds no run (no run.json)", r.err)
        self.train("a", ["--steps", "6"] + BASE)
        r = run(["train", "--resume", "--seed", "7"], run_dir=self.path("a"))
        self.assertEqual(r.code, 2)
        self.assertIn("option '--seed' is 7 but the run", r.err)
        r = run(["train", "--steps", "3"], run_dir=self.path("a"))
        self.assertEqual(r.code, 2)
        self.assertIn("already holds a run", r.err)
        # A complete run resumes to nothing.
        r = run(["train", "--resume"], run_dir=self.path("a"))
        self.assertEqual(r.code, 0, r.err)
        self.assertIn("the run is complete", r.out)
        # A checkpoint of another run is refused.
        self.train("b", ["--steps", "5", "--seed", "9"] + BASE)
        r = run(["train", "--resume-from", ckpt(self.path("b"), 5), "--steps", "8"], run_dir=self.path("a"))
        self.assertEqual(r.code, 2)
        self.assertIn("belongs to another run", r.err)


class Retention(TempDirTest):
    def test_keep_last_and_keep_every(self):
        self.train("r", ["--steps", "23", "--checkpoint-every", "2", "--keep-last", "2", "--keep-every", "10",
                         "--global-batch", "32", "--micro-shards", "4"])
        steps = sorted(int(os.path.basename(p)[5:13]) for p in glob.glob(self.path("r", "checkpoints", "*.h5")))
        self.assertEqual(steps, [0, 10, 20, 22, 23])  # step 0: the run's start is always kept
        self.assertEqual(glob.glob(self.path("r", "checkpoints", "*.tmp")), [])


class Interop(TempDirTest):
    def test_h5py_state_dict_equals_pytorch_reference(self):
        model = self.path("net.pt")
        subprocess.run([PY, os.path.join(HERE, "scripted_models.py"), "mlp_dropout", model], check=True)
        rng = np.random.default_rng(5)
        data = self.path("d.h5")
        with h5py.File(data, "w") as f:
            f["x"] = rng.standard_normal((96, 32)).astype(np.float32)
            f["y"] = rng.integers(0, 10, 96)
        args = ["--steps", "4", "--global-batch", "32", "--micro-shards", "4", "--optimizer", "adamw", "--lr", "0.01"]
        self.train("i", ["--model", "torchscript:" + model, "--data", "hdf5:" + data] + args, world=2)
        ref_state = self.path("ref.pt")
        out = subprocess.run([PY, os.path.join(HERE, "reference_trainer.py"), "--model", model, "--data", data,
                              "--save-state", ref_state] + args, capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        path = ckpt(self.path("i"), 4)
        # The five lines of docs/checkpoint-format.md, run by Debian's python3.
        code = f'''
import h5py, torch
with h5py.File({path!r}, "r") as f:
    state = {{name: torch.from_numpy(f["model"][name][()]) for name in f["model"]}}
want = torch.load({ref_state!r})
assert state.keys() == want.keys(), (state.keys(), want.keys())
for k in want:
    assert torch.equal(state[k], want[k]) and state[k].dtype == want[k].dtype, k
print("identical", len(state))
'''
        out = subprocess.run([PY, "-c", code], capture_output=True, text=True)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("identical 4", out.stdout)
        # Fingerprints recomputed in Python from the documented definition.
        with h5py.File(path, "r") as f:
            for name in f["model"]:
                ds = f["model"][name]
                self.assertEqual(int(ds.attrs["fingerprint"]), ref.fingerprint_bytes(ds[()].tobytes()))
        ls = subprocess.run(["h5ls", "-r", path], capture_output=True, text=True)
        self.assertEqual(ls.returncode, 0)
        for name in ["/meta", "/model/fc1.weight", "/optimizer/fc1.weight/exp_avg_sq", "/rng/cpu", "/data/cursor"]:
            self.assertIn(name, ls.stdout)


class Tools(TempDirTest):
    def test_inspect_verify_diff(self):
        self.train("t", ["--steps", "6", "--trace", "layer"] + BASE, world=2)
        v = run(["verify", self.path("t")])
        self.assertEqual(v.code, 0, v.out + v.err)
        self.assertEqual(v.out.count("ok "), 3 + 2)  # three checkpoints (0, 5, 6), two trace files
        j = run(["inspect", "--json", ckpt(self.path("t"), 6)])
        self.assertEqual(j.code, 0, j.err)
        doc = json.loads(j.out)
        self.assertTrue(doc["valid"])
        self.assertEqual(doc["step"], 6)
        self.assertEqual(doc["meta"]["world_size"], 2)
        self.assertIn("/model/fc2.weight", [d["name"] for d in doc["datasets"]])
        t = run(["inspect", self.path("t", "trace", "rank-00001.h5")])
        self.assertEqual(t.code, 0, t.err)
        self.assertIn("rank 1 of 2, level layer", t.out)
        self.assertIn("2@1 3@1", t.out)
        bad = run(["diff", ckpt(self.path("t"), 6)])
        self.assertEqual(bad.code, 2)
        missing = run(["verify", self.path("nope")])
        self.assertEqual(missing.code, EXIT_USAGE)  # no such run: bad input (README), not damage
        self.assertIn("does not exist", missing.err)


class Trace(TempDirTest):
    def read(self, run_dir):
        rows = {}
        for p in sorted(glob.glob(os.path.join(run_dir, "trace", "rank-*.h5"))):
            with h5py.File(p, "r") as f:
                n = int(f.attrs["shards_committed"])
                s = f["shards"]
                layers = f.attrs["layers"].decode().split("\n") if isinstance(f.attrs["layers"], bytes) else \
                    str(f.attrs["layers"]).split("\n")
                for i in range(n):
                    rows[(int(s["step"][i]), int(s["shard"][i]))] = (
                        int(s["rank"][i]), int(s["grad_fp"][i]), tuple(s["fwd_fp"][i]), tuple(s["bwd_fp"][i]))
        return rows, layers

    def test_layer_trace_is_world_size_invariant(self):
        args = ["--model", "gpt", "--optimizer", "adamw", "--lr", "0.003", "--steps", "3", "--trace", "layer"] + BASE
        self.train("w1", args, world=1)
        self.train("w4", args, world=4)
        a, layers = self.read(self.path("w1"))
        b, _ = self.read(self.path("w4"))
        self.assertEqual(layers[:3], ["tok_emb", "pos_emb", "blocks.0.ln1"])
        self.assertEqual(sorted(a), sorted(b))
        self.assertEqual(len(a), 3 * 4)
        for key in a:
            self.assertEqual(a[key][1:], b[key][1:], key)  # same fingerprints ...
            self.assertTrue(all(a[key][2]) and all(a[key][3]), "every layer has forward and backward fingerprints")
        self.assertEqual({b[k][0] for k in b}, {0, 1, 2, 3})  # ... computed on different ranks
        self.assertEqual({a[k][0] for k in a}, {0})
        # The reduced gradient's per-parameter fingerprints (format 4, now 5): one per parameter, the same on
        # every rank and at every world size.
        reduced = {}
        for name in ("w1", "w4"):
            for p in sorted(glob.glob(os.path.join(self.path(name), "trace", "rank-*.h5"))):
                with h5py.File(p, "r") as f:
                    self.assertEqual(int(f.attrs["format_version"]), 6)
                    n = int(f.attrs["steps_committed"])
                    # Format 5's slice column: zeros in a run without --shard-optimizer.
                    self.assertFalse(f["steps"]["shard"][:n].any())
                    # Format 6's learning rates: fp1 of the step's one group's rate as a float64
                    # (docs/checkpoint-format.md), computed here from the lr column.
                    for lr, fp in zip(f["steps"]["lr"][:n], f["steps"]["lrs_fp"][:n]):
                        self.assertEqual(int(fp), ref.fingerprint_bytes(struct.pack("<d", float(lr))))
                    rows = [tuple(int(x) for x in f["steps"]["reduced_fp"][i]) for i in range(n)]
                    self.assertEqual(len(rows[0]), len(str(f.attrs["params"]).split("\n")) if not isinstance(
                        f.attrs["params"], bytes) else len(f.attrs["params"].decode().split("\n")))
                    reduced[(name, p[-8:])] = rows
                    self.assertNotEqual(rows[0], tuple(int(x) for x in f["steps"]["param_fp"][0]))
                    self.assertNotEqual(rows[0], tuple(int(x) for x in f["steps"]["opt_fp"][0]))
        self.assertEqual(len(set(map(tuple, reduced.values()))), 1, reduced)
        first = next(iter(reduced.values()))[0]
        self.assertEqual(len(set(first)), len(first), "every parameter's slice has its own fingerprint")

    def test_torn_tail_is_reported(self):
        self.train("torn", ["--steps", "4"] + BASE)
        path = self.path("torn", "trace", "rank-00000.h5")
        with h5py.File(path, "a") as f:
            f.attrs["steps_committed"] = np.int64(3)  # as if the crash came before the counts
        v = run(["verify", self.path("torn")])
        self.assertEqual(v.code, 0, v.out + v.err)
        self.assertIn("torn tail of 1 step row(s) ignored", v.out)
        i = run(["inspect", path])
        self.assertIn("torn tail: 1 step row(s)", i.out)


if __name__ == "__main__":
    unittest.main(verbosity=2)
