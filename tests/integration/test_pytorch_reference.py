"""culprit against an independent PyTorch implementation of its contract: bitwise equal."""
import json
import os
import subprocess
import sys
import unittest

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import TempDirTest  # noqa: E402

PY = "/usr/bin/python3"
HERE = os.path.dirname(os.path.abspath(__file__))

# 96 samples, batch 32: 3 steps per epoch, so 7 steps cross two epoch boundaries.
COMMON = ["--steps", "7", "--global-batch", "32", "--micro-shards", "4", "--seed", "42"]
CASES = {
    "sgd-momentum": ("mlp_dropout", ["--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9",
                                      "--weight-decay", "0.0001", "--lr-schedule", "cosine", "--warmup-steps", "2"]),
    "sgd-nesterov": ("mlp_dropout", ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.8", "--nesterov"]),
    "adamw": ("mlp_dropout", ["--optimizer", "adamw", "--lr", "0.01", "--weight-decay", "0.01",
                              "--betas", "0.85,0.99", "--eps", "1e-7"]),
    "adamw-regression": ("regressor", ["--optimizer", "adamw", "--lr", "0.005"]),
}


class PyTorchReference(TempDirTest):
    def make_inputs(self, model_name):
        model = self.path(model_name + ".pt")
        subprocess.run([PY, os.path.join(HERE, "scripted_models.py"), model_name, model], check=True)
        rng = np.random.default_rng(11)
        data = self.path(model_name + ".h5")
        with h5py.File(data, "w") as f:
            f["x"] = rng.standard_normal((96, 32)).astype(np.float32)
            if model_name == "regressor":
                f["y"] = rng.standard_normal((96, 4)).astype(np.float32)
            else:
                f["y"] = rng.integers(0, 10, 96).astype(np.int64)
        return model, data

    def reference(self, model, data, args):
        cli = [a for a in args if a != "--nesterov"]
        flags = ["--nesterov"] if "--nesterov" in args else []
        out = subprocess.run([PY, os.path.join(HERE, "reference_trainer.py"), "--model", model, "--data", data]
                             + cli + flags, capture_output=True, text=True, timeout=600)
        self.assertEqual(out.returncode, 0, out.stderr)
        return [json.loads(line) for line in out.stdout.splitlines()]

    def test_bitwise_equal_to_pytorch(self):
        for case, (model_name, opt_args) in CASES.items():
            model, data = self.make_inputs(model_name)
            args = COMMON + opt_args
            ref = self.reference(model, data, args)
            self.assertEqual(len(ref), 7)
            for world in (1, 4):
                with self.subTest(case=case, world=world):
                    res = self.train("%s-w%d" % (case, world),
                                     ["--model", "torchscript:" + model, "--data", "hdf5:" + data] + args, world=world)
                    # Losses are float32: compared as float32 bits.
                    got = [(m["step"], np.float32(m["loss"]).tobytes(), m["lr"], m["fingerprint"])
                           for m in res.metrics()]
                    want = [(r["step"], np.float32(r["loss"]).tobytes(), r["lr"], r["fingerprint"]) for r in ref]
                    self.assertEqual(got, want)
        # Negative control: a different seed on the reference side no longer matches.
        model, data = self.make_inputs("mlp_dropout")
        other = self.reference(model, data, COMMON[:-1] + ["43"] + CASES["adamw"][1])
        self.assertNotEqual(other[-1]["fingerprint"], ref[-1]["fingerprint"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
