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

PY = sys.executable  # the interpreter culprit was built for (CULPRIT_PYTHON: ctest runs the tests with it)
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


# The training recipes (docs/determinism.md): built-in models (trained by the reference from
# culprit's initial state) and TorchScript modules, fp32 and bf16 autocast, clipping, weight decay
# by parameter group. model: (data kind, culprit and reference options).
RECIPE_COMMON = ["--steps", "4", "--global-batch", "16", "--micro-shards", "4", "--seed", "42"]
RECIPES = {
    "mlp-bf16-clip": ("mlp", "vectors", ["--precision", "bf16", "--clip-grad-norm", "0.3", "--weight-decay", "0.01",
                                         "--lr", "0.1"]),
    "cnn-fp32-adamw": ("cnn", "images", ["--optimizer", "adamw", "--lr", "0.01", "--weight-decay", "0.1"]),
    "cnn-bf16-adamw-clip": ("cnn", "images", ["--precision", "bf16", "--optimizer", "adamw", "--lr", "0.01",
                                              "--weight-decay", "0.1", "--clip-grad-norm", "0.5"]),
    "gpt-fp32-tied-clip": ("gpt", "tokens", ["--optimizer", "adamw", "--lr", "0.003", "--weight-decay", "0.1",
                                             "--tie-head", "--clip-grad-norm", "0.5", "--layers", "3", "--width", "48",
                                             "--heads", "4"]),
    "gpt-bf16": ("gpt", "tokens", ["--precision", "bf16", "--optimizer", "adamw", "--lr", "0.003",
                                   "--weight-decay", "0.1"]),
    "gpt-bf16-tied-clip-decay-all": ("gpt", "tokens", ["--precision", "bf16", "--optimizer", "adamw", "--lr", "0.003",
                                                       "--weight-decay", "0.1", "--tie-head", "--clip-grad-norm", "0.2",
                                                       "--weight-decay-params", "all"]),
    "torchscript-bf16-clip": ("mlp_dropout", "vectors", ["--precision", "bf16", "--optimizer", "adamw", "--lr", "0.01",
                                                         "--weight-decay", "0.05", "--clip-grad-norm", "0.4"]),
    "torchscript-embedding-bf16": ("embed", "tokens10", ["--precision", "bf16", "--optimizer", "adamw", "--lr", "0.01",
                                                         "--weight-decay", "0.5"]),
}
# Reference-only options: what culprit reads from its run (the gpt shape comes from its options).
BUILTIN = ("mlp", "cnn", "gpt")


def recipe_data(path, kind):
    rng = np.random.default_rng(5)
    with h5py.File(path, "w") as f:
        if kind == "vectors":
            f["x"], f["y"] = rng.standard_normal((64, 32)).astype(np.float32), rng.integers(0, 10, 64)
        elif kind == "images":
            f["x"], f["y"] = rng.standard_normal((64, 1, 16, 16)).astype(np.float32), rng.integers(0, 10, 64)
        elif kind == "tokens":
            t = rng.integers(0, 40, (64, 12))
            f["x"], f["y"] = t, np.roll(t, -1, axis=1)
        else:  # tokens10: token sequences with a class label each
            f["x"], f["y"] = rng.integers(0, 40, (64, 12)), rng.integers(0, 10, 64)


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

    def recipe_reference(self, model, data, args):
        out = subprocess.run([PY, os.path.join(HERE, "reference_trainer.py"), "--model", model, "--data", data] + args,
                             capture_output=True, text=True, timeout=600)
        self.assertEqual(out.returncode, 0, out.stderr)
        return [json.loads(line) for line in out.stdout.splitlines()]

    @staticmethod
    def comparable(rows):
        """Losses and clip factors are float32: compared as float32 bits."""
        return [(r["step"], np.float32(r["loss"]).tobytes(), r["lr"], r["fingerprint"],
                 np.float32(r["clip_factor"]).tobytes() if "clip_factor" in r else None) for r in rows]

    def test_recipes_bitwise_equal_to_pytorch_eager(self):
        finals = {}
        for case, (model_name, kind, opt_args) in RECIPES.items():
            data = self.path(case + ".h5")
            recipe_data(data, kind)
            if model_name in BUILTIN:
                culprit_model = model_name
            else:
                culprit_model = self.path(model_name + ".pt")
                subprocess.run([PY, os.path.join(HERE, "scripted_models.py"), model_name, culprit_model], check=True)
                culprit_model = "torchscript:" + culprit_model
            args = RECIPE_COMMON + opt_args
            runs = {}
            for world in (1, 2):
                runs[world] = self.train("%s-w%d" % (case, world),
                                         ["--model", culprit_model, "--data", "hdf5:" + data] + args, world=world)
            init = os.path.join(runs[1].run_dir, "checkpoints", "step-00000000.h5")
            ref = self.recipe_reference(model_name if model_name in BUILTIN else culprit_model.split(":", 1)[1], data,
                                        args + ["--init-from", init])
            self.assertEqual(len(ref), 4, case)
            finals[case] = runs[1].final_fingerprint()
            for world, res in runs.items():
                with self.subTest(case=case, world=world):
                    self.assertEqual(self.comparable(res.metrics()), self.comparable(ref))
            if "clip" in case:  # the clip bites: the factor is below 1 in some step
                self.assertLess(min(r["clip_factor"] for r in ref), 1.0, case)
        # Negative controls: the reference with another precision, without the clip, with weight
        # decay on every parameter: each no longer matches.
        for case, change in (("gpt-bf16", ["--precision", "fp32"]),
                             ("cnn-bf16-adamw-clip", ["--clip-grad-norm", "0"]),
                             ("torchscript-embedding-bf16", ["--weight-decay-params", "all"])):
            model_name, _, opt_args = RECIPES[case]
            model = model_name if model_name in BUILTIN else self.path(model_name + ".pt")
            init = self.path(case + "-w1", "checkpoints", "step-00000000.h5")
            other = self.recipe_reference(model, self.path(case + ".h5"), RECIPE_COMMON + opt_args + change +
                                          ["--init-from", init])
            self.assertNotEqual(other[-1]["fingerprint"], finals[case], case)

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
