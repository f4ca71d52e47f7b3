"""Bitwise determinism: run to run, and across world sizes W = 1, 2, 3, 4 (docs/determinism.md)."""
import os
import sys
import unittest

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import TempDirTest, make_scripted_model  # noqa: E402

MODELS = {
    "mlp": [],
    "cnn": [],
    "gpt": ["--optimizer", "adamw", "--lr", "0.003"],
}
STEPS = ["--steps", "8", "--global-batch", "32", "--micro-shards", "4", "--samples", "96"]


class RunToRun(TempDirTest):
    def test_same_run_twice_is_bitwise_identical(self):
        for model, extra in MODELS.items():
            with self.subTest(model=model):
                a = self.train(model + "-a", ["--model", model] + STEPS + extra, world=2)
                b = self.train(model + "-b", ["--model", model] + STEPS + extra, world=2)
                self.assertEqual(a.metrics(timings=False), b.metrics(timings=False))


class WorldSizeInvariance(TempDirTest):
    def check_invariant(self, name, args):
        ref = None
        for world in (1, 2, 3, 4):
            res = self.train("%s-w%d" % (name, world), args, world=world)
            trace = [(m["step"], m["loss"], m["grad_norm"], m["fingerprint"]) for m in res.metrics()]
            self.assertEqual(len(trace), 8)
            if ref is None:
                ref = trace
            else:
                self.assertEqual(trace, ref, "W=%d differs from W=1 for %s" % (world, name))
        return ref

    def test_builtin_models(self):
        for model, extra in MODELS.items():
            with self.subTest(model=model):
                ref = self.check_invariant(model, ["--model", model] + STEPS + extra)
                # Negative control: another seed changes the parameters.
                other = self.train(model + "-seed", ["--model", model, "--seed", "99"] + STEPS + extra, world=3)
                self.assertNotEqual(other.final_fingerprint(), ref[-1][3])

    def test_torchscript_model_and_hdf5_data(self):
        model = self.path("net.pt")
        make_scripted_model(model)
        rng = np.random.default_rng(3)
        x = rng.standard_normal((96, 32)).astype(np.float32)
        y = rng.integers(0, 10, 96).astype(np.int64)
        with h5py.File(self.path("data.h5"), "w") as f:
            f["x"], f["y"] = x, y
        args = ["--model", "torchscript:" + model, "--data", "hdf5:" + self.path("data.h5")] + STEPS
        ref = self.check_invariant("ts", args)
        # Negative control: one changed sample changes the parameters.
        x[5, 3] += 0.5
        with h5py.File(self.path("data2.h5"), "w") as f:
            f["x"], f["y"] = x, y
        args2 = ["--model", "torchscript:" + model, "--data", "hdf5:" + self.path("data2.h5")] + STEPS
        other = self.train("ts-changed", args2, world=4)
        self.assertNotEqual(other.final_fingerprint(), ref[-1][3])


if __name__ == "__main__":
    unittest.main(verbosity=2)
