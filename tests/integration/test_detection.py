"""Fault injection and online detection: each injected fault is caught at its step by the detector
meant for it, the incident names the rank, and --on-detect halt exits with the class's code on every
rank. A clean run raises nothing."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import TempDirTest, run, run_each_rank_code  # noqa: E402

W = 3
BASE = ["--model", "mlp", "--steps", "6", "--global-batch", "24", "--micro-shards", "4", "--samples", "96",
        "--checkpoint-every", "2", "--trace", "off", "--quiet"]
HARDWARE, NUMERICAL = 10, 11

# (phase, kind, extra spec, detector, exit code)
CASES = [
    ("forward", "nan", "", "nonfinite", NUMERICAL),
    ("backward", "nan", "", "nonfinite", NUMERICAL),
    ("grad", "nan", "", "nonfinite", NUMERICAL),
    ("data", "nan", "", "nonfinite", NUMERICAL),
    ("comm", "bitflip", ",bit=3", "comm", HARDWARE),
    ("comm", "nan", "", "comm", HARDWARE),
    ("param", "bitflip", ",bit=3", "replica-divergence", HARDWARE),
    ("param", "nan", "", "nonfinite", NUMERICAL),
    ("param", "scale", ",factor=2", "replica-divergence", HARDWARE),
    ("param", "noise", "", "replica-divergence", HARDWARE),
    ("optimizer", "bitflip", ",bit=20", "replica-divergence", HARDWARE),
    ("optimizer", "scale", ",factor=3", "replica-divergence", HARDWARE),
]


def incidents(run_dir):
    path = os.path.join(run_dir, "incidents.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(l) for l in f]


class Detection(TempDirTest):
    def test_injected_faults_are_caught_at_their_step_on_their_rank(self):
        for phase, kind, extra, detector, code in CASES:
            with self.subTest(phase=phase, kind=kind):
                name = "%s-%s" % (phase, kind)
                spec = "step=3,rank=1,layer=fc2,index=5,phase=%s,kind=%s%s" % (phase, kind, extra)
                workdir = self.path(name + "-rc")
                os.makedirs(workdir)
                codes, out, err = run_each_rank_code(["train", "--run-dir", self.path(name), "--inject", spec] + BASE,
                                                     W, workdir)
                self.assertEqual(codes, [code] * W, err)
                inc = incidents(self.path(name))
                self.assertTrue(inc, err)
                self.assertEqual((inc[0]["step"], inc[0]["detector"], inc[0]["rank"]), (3, detector, 1), inc[0])
                self.assertIn("halted at step 3 by the %s detector" % detector, err)
                # The checkpoint of step 2, from before the fault, is there; none of step 3 or later.
                ck = sorted(os.listdir(self.path(name, "checkpoints")))
                self.assertIn("step-00000002.h5", ck)
                self.assertFalse([c for c in ck if c >= "step-00000003"], ck)

    def test_warn_goes_on_and_logs(self):
        spec = "step=2,rank=2,layer=fc1,phase=param,kind=scale,factor=2,mode=persistent"
        res = run(["train", "--on-detect", "warn", "--inject", spec] + BASE, world=W, run_dir=self.path("warn"))
        self.assertEqual(res.code, 0, res.err)
        inc = incidents(self.path("warn"))
        self.assertEqual([i["step"] for i in inc], [2, 3, 4, 5, 6])
        self.assertTrue(all(i["rank"] == 2 and i["detector"] == "replica-divergence" for i in inc))
        with open(self.path("warn", "incidents.log")) as f:
            line = f.readline()
        self.assertRegex(line, r"^time=\S+ step=2 detector=replica-divergence class=hardware rank=2 host=\S+ "
                               r"device=cpu slurm_job_id=\S+ message=\".*fc1.weight.*\"$")

    def test_spikes(self):
        # A flipped exponent bit in one micro-shard gradient: a gradient-norm spike at step 12.
        spec = "step=12,rank=1,layer=fc2,index=7,phase=grad,kind=bitflip,bit=30"
        args = ["--model", "mlp", "--steps", "13", "--global-batch", "24", "--micro-shards", "4", "--samples", "96",
                "--trace", "off", "--quiet", "--inject", spec]
        res = run(["train", "--on-detect", "warn"] + args, world=W, run_dir=self.path("spike-warn"))
        self.assertEqual(res.code, 0, res.err)
        inc = incidents(self.path("spike-warn"))
        self.assertEqual((inc[0]["step"], inc[0]["detector"], inc[0]["class"]), (12, "spike", "numerical"), inc)
        self.assertIn("gradient norm spike", inc[0]["message"])
        workdir = self.path("spike-rc")
        os.makedirs(workdir)
        codes, out, err = run_each_rank_code(["train", "--run-dir", self.path("spike-halt"), "--spike-action", "halt"]
                                             + args, W, workdir)
        self.assertEqual(codes, [NUMERICAL] * W, err)
        self.assertIn("halted at step 12 by the spike detector", err)
        # Negative control: without the fault, no spike.
        res = run(["train"] + args[:-2], world=W, run_dir=self.path("spike-clean"))
        self.assertEqual(res.code, 0, res.err)
        self.assertEqual(incidents(self.path("spike-clean")), [])


class FalsePositives(TempDirTest):
    """No detection at all over clean runs: every model, W = 1..4, 5 seeds, 30 steps."""

    def test_clean_runs_raise_nothing(self):
        seeds = [int(x) for x in os.environ.get("CULPRIT_FP_SEEDS", "11,23,37,41,59").split(",")]
        for model, extra in (("mlp", []), ("cnn", []), ("gpt", ["--optimizer", "adamw", "--lr", "0.003"])):
            for world in (1, 2, 3, 4):
                for seed in seeds:
                    with self.subTest(model=model, world=world, seed=seed):
                        d = self.path("clean-%s-%d-%d" % (model, world, seed))
                        args = ["--model", model, "--steps", "30", "--global-batch", "32", "--micro-shards", "4",
                                "--samples", "256", "--trace", "off", "--checkpoint-every", "0", "--quiet",
                                "--seed", str(seed)] + extra
                        res = run(["train"] + args, world=world, run_dir=d)
                        self.assertEqual(res.code, 0, res.err)
                        self.assertEqual(incidents(d), [])

    def test_bad_specs(self):
        for spec, needle in [("step=1,rank=0,layer=fc9,phase=grad,kind=nan", "unknown layer 'fc9' (valid: fc1, fc2, fc3)"),
                             ("step=1,rank=0,layer=fc1,phase=gpu,kind=nan", "unknown phase 'gpu' (valid: backward, comm"),
                             ("step=1,rank=0,layer=fc1,phase=grad,kind=zap", "unknown kind 'zap'"),
                             ("step=1,rank=0,layer=fc1,phase=grad,color=red", "unknown key 'color'"),
                             ("step=1,rank=7,layer=fc1,phase=grad,kind=nan", "rank 7 does not exist")]:
            res = run(["train", "--inject", spec] + BASE, world=2, run_dir=self.path("bad"))
            self.assertEqual(res.code, 2, res.err)
            self.assertIn(needle, res.err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
