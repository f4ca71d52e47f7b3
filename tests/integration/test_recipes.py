"""The training recipes under fault injection (docs/determinism.md, "Mixed precision" and "Gradient
clipping"), end to end under real mpirun, each case scored against the injected truth with its clean
twin as the negative control: a fault that inflates the gradient norm is still detected with
clipping on (the detectors see the norm before clipping) and bisected to its rank, layer and step; a
fault in a clipped update is settled on two replicas (the float64 arbiter clips too); faults in
bfloat16 activations and their gradients are localised exactly; a bit a bfloat16 value does not keep
is refused in one line."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import (EXIT_USAGE, TempDirTest, first_differing_step, incidents,  # noqa: E402
                             make_scripted_model, metrics)

MLP = ["--model", "mlp", "--global-batch", "24", "--micro-shards", "4", "--samples", "96", "--quiet"]
GPT_BF16 = ["--model", "gpt", "--global-batch", "12", "--micro-shards", "4", "--samples", "48", "--optimizer", "adamw",
            "--lr", "0.003", "--precision", "bf16", "--tie-head", "--init", "gpt2", "--clip-grad-norm", "1", "--quiet"]


class Recipes(TempDirTest):
    def metrics(self, run_dir):
        return {m["step"]: m for m in metrics(run_dir)}

    def test_clipping_does_not_hide_a_norm_inflating_fault(self):
        # A flipped exponent bit in one micro-shard gradient of rank 1: the clip scales the update
        # back to norm 0.5, but the spike detector sees the reduced gradient's norm before clipping.
        spec = "step=12,rank=1,layer=fc2,index=7,phase=grad,kind=bitflip,bit=30"
        args = MLP + ["--steps", "13", "--clip-grad-norm", "0.5", "--on-detect", "warn"]
        d = self.train("clip-spike", args + ["--inject", spec], 2).run_dir
        twin = self.train("clip-clean", args, 2).run_dir
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
        d = self.train("clip-update", args + ["--inject", spec], 2).run_dir
        self.assertLess(min(m["clip_factor"] for m in self.metrics(d).values()), 1.0)  # the clip bites
        got = self.bisect(d, 2, "hardware-persistent")
        self.assertEqual((got["step"], got["phase"], got["layer"], got["rank"], got["candidates"]),
                         (4, "param", "fc2", 0, []), got)

    def test_faults_in_bf16_activations_and_their_gradients_are_localised(self):
        cases = [("fwd", "step=4,rank=2,layer=blocks.0.mlp.fc,index=5,phase=forward,kind=bitflip,bit=22", "forward"),
                 ("bwd", "step=3,rank=1,layer=blocks.1.attn.proj,index=3,phase=backward,kind=bitflip,bit=27",
                  "backward"),
                 ("noise", "step=4,rank=0,layer=head,index=1,phase=forward,kind=noise", "forward")]
        twin = self.train("bf16-clean", GPT_BF16 + ["--steps", "6"], 3).run_dir
        self.assertEqual(incidents(twin), [])
        for name, spec, phase in cases:
            with self.subTest(case=name):
                d = self.train("bf16-" + name, GPT_BF16 + ["--steps", "6", "--spot-check", "1", "--on-detect", "warn",
                                                     "--inject", spec], 3).run_dir
                truth = first_differing_step(d, twin)
                step = int(spec.split(",")[0].split("=")[1])
                rank = int(spec.split(",")[1].split("=")[1])
                layer = spec.split("layer=")[1].split(",")[0]
                self.assertEqual(truth, step)  # the fault changed the bfloat16 value, at its step
                got = self.bisect(d, 3, "hardware-transient")
                self.assertEqual((got["step"], got["phase"], got["layer"], got["rank"]), (step, phase, layer, rank),
                                 got)
        self.assertEqual(self.bisect(twin, 3, "none")["verdict"], "none")  # the negative control

    def test_a_model_that_cannot_run_under_autocast_or_be_trained_is_refused(self):
        base = ["--steps", "2", "--global-batch", "8", "--micro-shards", "2", "--quiet"]
        for name in ("erfcx", "zeta"):
            make_scripted_model(self.path(name + ".pt"), name)
        erfcx = ["--model", "torchscript:" + self.path("erfcx.pt")] + base
        self.train("erfcx-fp32", erfcx, 2)  # the negative control: in fp32 it trains
        self.assert_refused(["train", "--run-dir", self.path("erfcx-bf16")] + erfcx + ["--precision", "bf16"],
                            EXIT_USAGE, "does not run under --precision bf16 (autocast to bfloat16)", "'BFloat16'")
        # An op without a derivative: refused at start-up in one line (was an abort inside step 1).
        zeta = ["--model", "torchscript:" + self.path("zeta.pt")] + base
        self.assert_refused(["train", "--run-dir", self.path("zeta")] + zeta, EXIT_USAGE,
                            "cannot be trained: its backward pass fails",
                            "the derivative for 'zeta' is not implemented")

    def test_a_bit_bf16_does_not_keep_is_refused(self):
        spec = "step=2,rank=0,layer=head,index=1,phase=forward,kind=bitflip,bit=7"
        self.assert_refused(["train", "--run-dir", self.path("low-bit"), "--steps", "3"] + GPT_BF16 +
                            ["--inject", spec], EXIT_USAGE,
                            "layer head's output (and the gradient into it) is bfloat16 under --precision bf16",
                            "bit must be in [16, 31], got 7")
        # A float32 layer (a layer norm) of the same bf16 run takes any bit.
        self.train("low-bit-ln", ["--steps", "2"] + GPT_BF16 + [
            "--inject", "step=2,rank=0,layer=blocks.0.ln1,index=1,phase=forward,kind=bitflip,bit=7"], 2)


if __name__ == "__main__":
    import unittest
    unittest.main(verbosity=2)
