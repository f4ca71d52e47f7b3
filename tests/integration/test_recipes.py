"""The training recipes under fault injection (docs/determinism.md, "Mixed precision" and "Gradient
clipping"), end to end under real mpirun, each case scored against the injected truth with its clean
twin as the negative control: a fault that inflates the gradient norm is still detected with
clipping on (the detectors see the norm before clipping) and bisected to its rank, layer and step; a
fault in a clipped update is settled on two replicas (the float64 arbiter clips too); faults in
bfloat16 activations and their gradients are localised exactly; a bit a bfloat16 value does not keep
is refused in one line."""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import TempDirTest, incidents, run, run_each_rank_code  # noqa: E402
from test_localize import CODES, diagnosis, first_differing_step  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MLP = ["--model", "mlp", "--global-batch", "24", "--micro-shards", "4", "--samples", "96", "--quiet"]
GPT_BF16 = ["--model", "gpt", "--global-batch", "12", "--micro-shards", "4", "--samples", "48", "--optimizer", "adamw",
            "--lr", "0.003", "--precision", "bf16", "--tie-head", "--init", "gpt2", "--clip-grad-norm", "1", "--quiet"]


class Recipes(TempDirTest):
    def train(self, name, world, args, code=0):
        res = run(["train"] + args, world=world, run_dir=self.path(name))
        self.assertEqual(res.code, code, res.err)
        return self.path(name)

    def bisect(self, run_dir, world, verdict):
        res = run(["bisect", "--run-dir", run_dir], world=world, use_mpirun=True)
        self.assertEqual(res.code, CODES[verdict], res.out + res.err)
        return diagnosis(run_dir)

    def metrics(self, run_dir):
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            return {m["step"]: m for m in map(json.loads, f)}

    def test_clipping_does_not_hide_a_norm_inflating_fault(self):
        # A flipped exponent bit in one micro-shard gradient of rank 1: the clip scales the update
        # back to norm 0.5, but the spike detector sees the reduced gradient's norm before clipping.
        spec = "step=12,rank=1,layer=fc2,index=7,phase=grad,kind=bitflip,bit=30"
        args = MLP + ["--steps", "13", "--clip-grad-norm", "0.5", "--on-detect", "warn"]
        d = self.train("clip-spike", 2, args + ["--inject", spec])
        twin = self.train("clip-clean", 2, args)
        inc = incidents(d)
        self.assertEqual((inc[0]["step"], inc[0]["detector"]), (12, "spike"), inc)
        m, clean = self.metrics(d), self.metrics(twin)
        self.assertGreater(m[12]["grad_norm"], 1e6 * clean[12]["grad_norm"])  # the norm before clipping
        self.assertLess(m[12]["clip_factor"], 1e-6)  # the update was clipped hard
        self.assertGreater(clean[12]["clip_factor"], 1e3 * m[12]["clip_factor"])
        self.assertEqual(first_differing_step(d, twin), 12)
        got = self.bisect(d, 2, "hardware-transient")
        self.assertEqual((got["step"], got["phase"], got["layer"], got["rank"]), (12, "grad", "fc2", 1), got)
        # Negative controls: the twin has no incident, and its bisection finds nothing.
        self.assertEqual(incidents(twin), [])
        self.assertEqual(self.bisect(twin, 2, "none")["verdict"], "none")

    def test_a_fault_in_a_clipped_update_is_settled_on_two_replicas(self):
        # A parameter of rank 0 scaled at rest after every clipped update from step 4, two replicas:
        # the replays tie, and the float64 update (clipped the same way) sides with rank 1.
        spec = "step=4,rank=0,index=2,phase=param,kind=scale,factor=3,mode=persistent,layer=fc2"
        args = MLP + ["--steps", "6", "--clip-grad-norm", "0.05", "--on-detect", "warn"]
        d = self.train("clip-update", 2, args + ["--inject", spec])
        self.assertLess(min(m["clip_factor"] for m in self.metrics(d).values()), 1.0)  # the clip bites
        got = self.bisect(d, 2, "hardware-persistent")
        self.assertEqual((got["step"], got["phase"], got["layer"], got["rank"], got["candidates"]),
                         (4, "param", "fc2", 0, []), got)

    def test_faults_in_bf16_activations_and_their_gradients_are_localised(self):
        cases = [("fwd", "step=4,rank=2,layer=blocks.0.mlp.fc,index=5,phase=forward,kind=bitflip,bit=22", "forward"),
                 ("bwd", "step=3,rank=1,layer=blocks.1.attn.proj,index=3,phase=backward,kind=bitflip,bit=27",
                  "backward"),
                 ("noise", "step=4,rank=0,layer=head,index=1,phase=forward,kind=noise", "forward")]
        twin = self.train("bf16-clean", 3, GPT_BF16 + ["--steps", "6"])
        self.assertEqual(incidents(twin), [])
        for name, spec, phase in cases:
            with self.subTest(case=name):
                d = self.train("bf16-" + name, 3, GPT_BF16 + ["--steps", "6", "--spot-check", "1", "--on-detect", "warn", "--inject", spec])
                truth = first_differing_step(d, twin)
                step = int(spec.split(",")[0].split("=")[1])
                rank = int(spec.split(",")[1].split("=")[1])
                layer = spec.split("layer=")[1].split(",")[0]
                self.assertEqual(truth, step)  # the fault changed the bfloat16 value, at its step
                got = self.bisect(d, 3, "hardware-transient")
                self.assertEqual((got["step"], got["phase"], got["layer"], got["rank"]), (step, phase, layer, rank),
                                 got)
        self.assertEqual(self.bisect(twin, 3, "none")["verdict"], "none")  # the negative control

    def refused(self, name, args, *wants):
        """Every rank exits 2 with one error line holding each of `wants`, and no stack trace."""
        workdir = self.path(name + "-rc")
        os.makedirs(workdir)
        codes, _, err = run_each_rank_code(["train", "--run-dir", self.path(name)] + args, 2, workdir)
        self.assertEqual(codes, [2, 2], err)
        lines = [l for l in err.splitlines() if l.startswith("culprit: error:")]
        self.assertEqual(len(lines), 1, err)
        for want in wants:
            self.assertIn(want, lines[0])
        for marker in ("terminate called", "Exception raised from", "Traceback", "Aborted"):
            self.assertNotIn(marker, err)

    def test_a_model_that_cannot_run_under_autocast_or_be_trained_is_refused(self):
        base = ["--steps", "2", "--global-batch", "8", "--micro-shards", "2", "--quiet"]
        for name in ("erfcx", "zeta"):
            subprocess.run(["/usr/bin/python3", os.path.join(HERE, "scripted_models.py"), name, self.path(name + ".pt")],
                           check=True)
        erfcx = ["--model", "torchscript:" + self.path("erfcx.pt")] + base
        self.train("erfcx-fp32", 2, erfcx)  # the negative control: in fp32 it trains
        self.refused("erfcx-bf16", erfcx + ["--precision", "bf16"],
                     "does not run under --precision bf16 (autocast to bfloat16)", "'BFloat16'")
        # An op without a derivative: refused at start-up in one line (was an abort inside step 1).
        self.refused("zeta", ["--model", "torchscript:" + self.path("zeta.pt")] + base,
                     "cannot be trained: its backward pass fails", "the derivative for 'zeta' is not implemented")

    def test_a_bit_bf16_does_not_keep_is_refused(self):
        spec = "step=2,rank=0,layer=head,index=1,phase=forward,kind=bitflip,bit=7"
        self.refused("low-bit", ["--steps", "3"] + GPT_BF16 + ["--inject", spec],
                     "layer head's output (and the gradient into it) is bfloat16 under --precision bf16",
                     "bit must be in [16, 31], got 7")
        # A float32 layer (a layer norm) of the same bf16 run takes any bit.
        self.train("low-bit-ln", 2, ["--steps", "2"] + GPT_BF16 + [
            "--inject", "step=2,rank=0,layer=blocks.0.ln1,index=1,phase=forward,kind=bitflip,bit=7"])


if __name__ == "__main__":
    import unittest
    unittest.main(verbosity=2)
