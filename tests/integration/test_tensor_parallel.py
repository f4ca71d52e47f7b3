"""gpt's tensor-parallel form (--tp-chunks C, --tensor-parallel T; docs/determinism.md, "Tensor
parallelism") under real mpirun: the same bits and checkpoints at every layout (T, D), equal bit for
bit to an eager PyTorch model that computes the same chunked sums (builtin_models.TpGpt, trained by
reference_trainer.py from culprit's initial state); resumed at another layout; a fault in one
shard of a run with no data-parallel replica (D = 1), a forward output, a backward gradient or a
tensor-parallel exchange's link, bisected at another layout (T = 1) to its step, phase, layer, chunk
and rank; and the refusals. Each comparison has a control that could fail: the plain gpt, and a
reference without the chunks, give other bits; a clean run's bisection finds nothing."""
import json
import os
import subprocess
import sys

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import EXIT_USAGE, PY, TempDirTest, run  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# Four heads, four chunks: T = 1, 2, 4 all divide C.
GPT = ["--model", "gpt", "--heads", "4", "--width", "32", "--layers", "2", "--global-batch", "8", "--micro-shards", "4",
       "--samples", "32", "--optimizer", "adamw", "--lr", "0.003", "--weight-decay", "0.1", "--clip-grad-norm", "0.5"]
CHUNKED = GPT + ["--tp-chunks", "4"]
TIMINGS = ("optimizer_bytes",)


def final_state(path):
    """A checkpoint's model tensors, as bytes."""
    with h5py.File(path, "r") as f:
        return {name: np.array(f["model"][name]).tobytes() for name in f["model"]}


class TensorParallel(TempDirTest):
    def checkpoint(self, name, step):
        return self.path(name, "checkpoints", "step-%08d.h5" % step)

    def test_same_bits_at_every_layout(self):
        # (T, D): one rank; two ranks sharing each micro-shard; 2 x 2; four ranks sharing each; three
        # data-parallel ranks of one (D = 3 over 4 micro-shards: uneven).
        base = self.train("t1d1", CHUNKED + ["--steps", "4"])
        want = base.metrics(timings=False)
        state = final_state(self.checkpoint("t1d1", 4))
        for t, d in ((2, 1), (2, 2), (4, 1), (1, 3)):
            name = "t%dd%d" % (t, d)
            res = self.train(name, CHUNKED + ["--steps", "4", "--tensor-parallel", str(t)], world=t * d)
            with self.subTest(T=t, D=d):
                self.assertEqual(res.metrics(timings=False), want)
                self.assertEqual(final_state(self.checkpoint(name, 4)), state)
        # Control: the plain gpt (its sums in one piece) gives other bits from the same start.
        plain = self.train("plain", GPT + ["--steps", "4"])
        self.assertNotEqual(plain.final_fingerprint(), base.final_fingerprint())
        self.assertEqual(final_state(self.checkpoint("plain", 0)), final_state(self.checkpoint("t1d1", 0)))

    def test_equal_to_pytorch_eager(self):
        data = self.path("tokens.h5")
        rng = np.random.default_rng(5)
        with h5py.File(data, "w") as f:
            t = rng.integers(0, 40, (64, 12))
            f["x"], f["y"] = t, np.roll(t, -1, axis=1)
        args = ["--steps", "4", "--global-batch", "16", "--micro-shards", "4", "--seed", "42", "--optimizer", "adamw",
                "--lr", "0.003", "--weight-decay", "0.1", "--layers", "2", "--width", "48", "--heads", "4",
                "--clip-grad-norm", "0.5"]
        chunks = ["--tp-chunks", "4"]
        res = self.train("tp", ["--model", "gpt", "--data", "hdf5:" + data, "--tensor-parallel", "2"] + args + chunks,
                         world=2)

        def reference(extra):
            out = subprocess.run([PY, os.path.join(HERE, "reference_trainer.py"), "--model", "gpt", "--data", data,
                                  "--init-from", self.checkpoint("tp", 0)] + extra, capture_output=True, text=True,
                                 timeout=600)
            self.assertEqual(out.returncode, 0, out.stderr)
            return [json.loads(line) for line in out.stdout.splitlines()]

        ref = reference(args + chunks)
        got = [(m["step"], np.float32(m["loss"]).tobytes(), m["fingerprint"]) for m in res.metrics()]
        self.assertEqual(got, [(r["step"], np.float32(r["loss"]).tobytes(), r["fingerprint"]) for r in ref])
        # Control: the reference without the chunks (the plain gpt from the same start) differs.
        plain = reference(args)
        self.assertNotEqual(plain[-1]["fingerprint"], ref[-1]["fingerprint"])

    def test_resume_at_another_layout(self):
        whole = self.train("whole", CHUNKED + ["--steps", "6", "--tensor-parallel", "2"], world=2)
        self.train("cut", CHUNKED + ["--steps", "3", "--tensor-parallel", "2"], world=2)
        # Resumed on four ranks sharing each micro-shard, then on three data-parallel ranks.
        self.train("cut", ["--resume", "--steps", "5", "--tensor-parallel", "4"], world=4)
        res = self.train("cut", ["--resume", "--steps", "6", "--tensor-parallel", "1"], world=3)
        self.assertEqual(res.final_fingerprint(), whole.final_fingerprint())
        self.assertEqual(final_state(self.checkpoint("cut", 6)), final_state(self.checkpoint("whole", 6)))
        # A plain run cannot be resumed tensor-parallel: its chunks would change its bits.
        self.train("plain", GPT + ["--steps", "2"])
        line = self.assert_refused(["train", "--run-dir", self.path("plain"), "--resume", "--steps", "3",
                                    "--tensor-parallel", "2"], EXIT_USAGE, "--tp-chunks 0 (the plain gpt)")
        self.assertIn("fix its bits", line)

    def test_refusals(self):
        cases = [
            (["--tp-chunks", "4", "--tensor-parallel", "3"], 3, "does not divide --tp-chunks 4"),
            (["--tp-chunks", "3"], 1, "does not divide --heads 4"),
            (["--tp-chunks", "4", "--tensor-parallel", "2"], 3, "not a multiple of --tensor-parallel 2"),
            (["--tp-chunks", "4", "--tensor-parallel", "2", "--shard-params"], 2, "'--shard-params' does not combine"),
            (["--tp-chunks", "4", "--precision", "bf16"], 1, "'--precision bf16' does not combine"),
            (["--tp-chunks", "4", "--inject", "step=2,rank=0,layer=blocks.0.mlp.proj,phase=tp-link,kind=nan"], 1,
             "give --tensor-parallel 2 or more"),
            (["--tp-chunks", "4", "--tensor-parallel", "2", "--inject",
              "step=2,rank=0,layer=blocks.0.ln1,phase=tp-link,kind=nan"], 2, "exchanges nothing"),
        ]
        for extra, world, want in cases:
            with self.subTest(extra=extra):
                self.assert_refused(["train", "--run-dir", self.path("refused"), "--steps", "2"] + GPT + extra,
                                    EXIT_USAGE, want, world=world)
        self.assert_refused(["train", "--run-dir", self.path("refused"), "--model", "mlp", "--tensor-parallel", "2"],
                            EXIT_USAGE, "applies to --model gpt", world=2)

    def test_fault_in_one_shard_bisected_at_another_layout(self):
        # D = 1: no data-parallel replica of any shard. Trained at T = 2, bisected at T = 1 on three
        # ranks (each replays whole micro-shards, every chunk on one rank). The truth: the injected
        # step, phase, layer (its chunk) and rank.
        train = CHUNKED + ["--steps", "10", "--checkpoint-every", "4", "--tensor-parallel", "2"]
        cases = [
            ("forward", "step=6,rank=1,layer=blocks.0.mlp.fc[3],index=40,phase=forward,kind=scale,mode=transient",
             "hardware-transient", "blocks.0.mlp.fc[3]", 1),
            ("backward", "step=5,rank=0,layer=blocks.1.attn.proj[1],index=3,phase=backward,kind=bitflip,bit=27,"
             "mode=persistent", "hardware-persistent", "blocks.1.attn.proj[1]", 0),
            ("tp-link", "step=7,rank=1,layer=blocks.0.mlp.proj,index=5,phase=tp-link,kind=scale,mode=transient",
             "hardware-unconfirmed", "blocks.0.mlp.proj", 1),
        ]
        for name, spec, verdict, layer, rank in cases:
            with self.subTest(fault=name):
                res = run(["train", "--quiet", "--inject", spec] + train, world=2, run_dir=self.path(name))
                self.assertIn(res.code, (0, 10), res.err)  # tp-link: the replicas diverge, the vote halts
                d = self.bisect(self.path(name), 3, verdict)
                step = int(spec.split(",")[0].split("=")[1])
                self.assertEqual((d["step"], d["phase"], d["layer"], d["rank"], d["shard"]),
                                 (step, name, layer, rank, rank % 2), d)
                self.assertTrue(any("rank %d is tensor-parallel shard %d of 2" % (rank, rank) in e for e in d["evidence"]),
                                d["evidence"])
        # Control: the clean run has nothing to find.
        self.train("clean", train, world=2)
        clean = self.bisect(self.path("clean"), 3, "none")
        self.assertEqual((clean["verdict"], clean["shard"]), ("none", -1))


if __name__ == "__main__":
    import unittest
    unittest.main()
