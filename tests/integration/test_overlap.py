"""The reduction overlapped with the backward pass (--bucket-mb; docs/determinism.md, "Overlapping the
reduction with the backward pass") gives the bits of the reduction after the backward pass, at every
W and M, for every model kind, and faults land and are detected as without it.

The models here are small: --bucket-mb 0.001 (1 KiB) cuts them into many buckets, so the hooks, the
bucket order and the two communicators are exercised; --bucket-mb 0 is the reduction after the
backward pass (tree_allreduce), the reference."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import TempDirTest, incidents, make_scripted_model, run  # noqa: E402

MANY = ["--bucket-mb", "0.001"]
AFTER = ["--bucket-mb", "0"]
STEPS = ["--steps", "5", "--global-batch", "32", "--samples", "96"]
MODELS = {
    "mlp": ["--model", "mlp"],
    "cnn": ["--model", "cnn"],
    # A tied head: one parameter whose gradient comes from two places; AdamW and clipping.
    "gpt-tied": ["--model", "gpt", "--tie-head", "--optimizer", "adamw", "--lr", "0.003", "--clip-grad-norm", "0.5"],
    # bf16 forward passes; the update of each rank's slice, then the gather.
    "mlp-bf16-sharded": ["--model", "mlp", "--precision", "bf16", "--shard-optimizer", "--optimizer", "adamw"],
}


def signature(res):
    return [(m["step"], m["loss"], m["grad_norm"], m["fingerprint"]) for m in res.metrics()]


class SameBits(TempDirTest):
    def test_every_model_world_and_micro_shards(self):
        for model, args in MODELS.items():
            for m in (4, 8):
                with self.subTest(model=model, M=m):
                    base = args + STEPS + ["--micro-shards", str(m)]
                    ref = signature(self.train("%s-%d-ref" % (model, m), base + AFTER, world=1))
                    for world in (1, 2, 3, 4):
                        got = signature(self.train("%s-%d-w%d" % (model, m, world), base + MANY, world=world))
                        self.assertEqual(got, ref, "%s M=%d W=%d overlapped differs" % (model, m, world))

    def test_torchscript_models(self):
        # Dropout (the generator seeded per micro-shard), and a regression (MSE) head.
        for name in ("mlp_dropout", "regressor"):
            with self.subTest(model=name):
                path = self.path(name + ".pt")
                make_scripted_model(path, name)
                base = ["--model", "torchscript:" + path, "--micro-shards", "4"] + STEPS
                if name == "regressor":
                    base += ["--classes", "4"]
                ref = signature(self.train(name + "-ref", base + AFTER, world=2))
                got = signature(self.train(name + "-many", base + MANY, world=2))
                self.assertEqual(got, ref)

    def test_negative_control_a_different_tree_changes_the_bits(self):
        # The test could not fail if the bits did not depend on the reduction: M changes the tree.
        a = signature(self.train("m4", MODELS["mlp"] + STEPS + ["--micro-shards", "4"] + MANY, world=2))
        b = signature(self.train("m8", MODELS["mlp"] + STEPS + ["--micro-shards", "8"] + MANY, world=2))
        self.assertNotEqual(a[-1][3], b[-1][3])


class Faults(TempDirTest):
    """A fault in the leaf (the last micro-shard's: reduced while its backward runs), a stale
    gradient (accumulated into, so the hook must read the sum) and a faulty link land on the same
    values with and without buckets, and the detectors report the same incidents."""
    BASE = ["--model", "mlp", "--steps", "4", "--global-batch", "24", "--micro-shards", "4", "--samples", "96",
            "--on-detect", "warn", "--spot-check", "0"]
    SPECS = [
        "step=2,rank=1,layer=fc1,index=3,phase=grad,kind=bitflip,bit=28",
        "step=2,rank=1,layer=fc2,index=3,phase=grad,kind=stale",
        "step=2,rank=1,layer=fc1,index=5,phase=comm,kind=scale,factor=2",
        "step=3,rank=0,layer=fc2,index=1,phase=grad,kind=nan",
    ]

    def fields(self, run_dir):
        return [(i["step"], i["detector"], i["rank"], i.get("sender"), i.get("receiver")) for i in incidents(run_dir)]

    def test_faults_land_alike(self):
        clean = signature(self.train("clean", self.BASE + MANY, world=3))
        for n, spec in enumerate(self.SPECS):
            with self.subTest(spec=spec):
                runs = {}
                for label, bucket in (("after", AFTER), ("many", MANY)):
                    name = "f%d-%s" % (n, label)
                    res = run(["train", "--quiet", "--inject", spec] + self.BASE + bucket, world=3,
                              run_dir=self.path(name))
                    self.assertEqual(res.code, 0, res.err)
                    runs[label] = (res.metrics(timings=False), self.fields(self.path(name)))
                self.assertEqual(runs["many"], runs["after"])
                # Negative control: the fault changed the training (or was reported).
                faulty = [(m["step"], m["loss"], m["grad_norm"], m["fingerprint"]) for m in runs["many"][0]]
                self.assertTrue(faulty != clean or runs["many"][1], spec)
        # The link fault is named as the comm check names it without buckets: sender rank 1.
        comm = self.fields(self.path("f2-many"))
        self.assertTrue(comm and comm[0][1] == "comm" and comm[0][3] == 1, comm)


if __name__ == "__main__":
    unittest.main(verbosity=2)
