"""Fault injection and online detection: each injected fault is caught at its step by the detector
meant for it, the incident names the rank, and --on-detect halt exits with the class's code on every
rank. A clean run raises nothing."""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import (EXIT_HARDWARE, EXIT_INVARIANT, EXIT_NUMERICAL, EXIT_USAGE, TempDirTest,  # noqa: E402
                             incidents, last_culprit_line, run, run_each_rank_code)

PY = sys.executable  # the interpreter culprit was built for (CULPRIT_PYTHON: ctest runs the tests with it)

W = 3
BASE = ["--model", "mlp", "--steps", "6", "--global-batch", "24", "--micro-shards", "4", "--samples", "96",
        "--checkpoint-every", "2", "--trace", "off", "--quiet"]
SMALL = {"bitflip": ",bit=3", "scale": ",factor=2", "noise": "", "nan": ""}

# Every phase x kind: (phase, kind, extra spec, detector, exit code). "spot-check" marks silent
# compute faults: the default detectors let them pass; --spot-check 1 catches them.
CASES = []
for phase in ("forward", "backward", "grad", "data"):
    CASES.append((phase, "nan", "", "nonfinite", EXIT_NUMERICAL))
    for kind in ("bitflip", "scale", "noise"):
        CASES.append((phase, kind, SMALL[kind], "spot-check", EXIT_HARDWARE))
for kind in ("bitflip", "nan", "scale", "noise"):
    CASES.append(("comm", kind, SMALL[kind], "comm", EXIT_HARDWARE))
CASES += [
    ("param", "bitflip", ",bit=3", "replica-divergence", EXIT_HARDWARE),
    ("param", "nan", "", "nonfinite", EXIT_NUMERICAL),
    ("param", "scale", ",factor=2", "replica-divergence", EXIT_HARDWARE),
    ("param", "noise", "", "replica-divergence", EXIT_HARDWARE),
    ("optimizer", "bitflip", ",bit=20", "replica-divergence", EXIT_HARDWARE),
    ("optimizer", "nan", "", "replica-divergence", EXIT_HARDWARE),
    ("optimizer", "scale", ",factor=3", "replica-divergence", EXIT_HARDWARE),
    ("optimizer", "noise", "", "replica-divergence", EXIT_HARDWARE),
    # The learning rate one rank uses: its update breaks the schedule invariant before the replicas part.
    ("lr", "bitflip", ",bit=20", "invariant", EXIT_INVARIANT),
    ("lr", "nan", "", "nonfinite", EXIT_NUMERICAL),
    ("lr", "scale", ",factor=2", "invariant", EXIT_INVARIANT),
    ("lr", "noise", "", "invariant", EXIT_INVARIANT),
    # stale: a value that should have been replaced is not.
    ("grad", "stale", "", "invariant", EXIT_INVARIANT),
    ("param", "stale", "", "invariant", EXIT_INVARIANT),
    ("data", "stale", "", "invariant", EXIT_INVARIANT),
    ("rng", "stale", "", "invariant", EXIT_INVARIANT),
]



class Detection(TempDirTest):
    def halted(self, name, spec, code, detector, extra=(), world=W):
        """Runs with `spec` injected at step 3 on rank 1; checks codes, incident and checkpoints."""
        workdir = self.path(name + "-rc")
        os.makedirs(workdir)
        codes, out, err = run_each_rank_code(["train", "--run-dir", self.path(name), "--inject", spec] + BASE +
                                             list(extra), world, workdir)
        self.assertEqual(codes, [code] * world, err)
        inc = incidents(self.path(name))
        self.assertTrue(inc, err)
        self.assertEqual((inc[0]["step"], inc[0]["detector"]), (3, detector), inc[0])
        self.assertIn("halted at step 3 by the %s detector" % detector, err)
        # The last line says the code is a finding (Open MPI's banner after it reads as a crash).
        self.assertRegex(last_culprit_line(err), r"^culprit: exit %d \(.+\): this is a finding, not a crash; the line "
                                                 r"above says what was found; see %s/incidents.jsonl$"
                         % (code, re.escape(self.path(name))))
        # The checkpoint of step 2, from before the fault, is there; none of step 3 or later.
        ck = sorted(os.listdir(self.path(name, "checkpoints")))
        self.assertIn("step-00000002.h5", ck)
        self.assertFalse([c for c in ck if c >= "step-00000003"], ck)
        return inc[0]

    def test_injected_faults_are_caught_at_their_step_on_their_rank(self):
        for phase, kind, extra, detector, code in CASES:
            with self.subTest(phase=phase, kind=kind):
                name = "%s-%s" % (phase, kind)
                layer = "" if phase in ("data", "lr", "rng") else ",layer=fc2"
                spec = "step=3,rank=1%s,index=5,phase=%s,kind=%s%s" % (layer, phase, kind, extra)
                if detector == "spot-check":
                    # Silent: the default detectors see nothing ...
                    res = run(["train", "--inject", spec] + BASE, world=W, run_dir=self.path(name + "-default"))
                    self.assertEqual(res.code, 0, res.err)
                    self.assertEqual(incidents(self.path(name + "-default")), [])
                    # ... and every micro-shard recomputed by another rank catches it.
                    inc = self.halted(name, spec, code, detector, ["--spot-check", "1"])
                else:
                    inc = self.halted(name, spec, code, detector)
                self.assertEqual(inc["rank"], 1, inc)
                self.assertIn(1, inc["ranks"], inc)
                self.check_structure(phase, detector, inc)

    def check_structure(self, phase, detector, inc):
        """The record's structured fields say what the message says (readers use the fields)."""
        if detector == "comm":
            self.assertEqual((inc["what"], inc["sender"]), ("message", 1), inc)
            self.assertNotEqual(inc["receiver"], -1, inc)
        elif detector == "replica-divergence":
            what = "optimizer-state" if phase == "optimizer" else "parameter"
            self.assertEqual((inc["what"], inc["tensor"]), (what, "fc2.weight"), inc)
        elif detector == "spot-check" or (detector == "nonfinite" and phase in ("forward", "backward", "grad", "data")):
            # W = 3, M = 4: rank 1 computes micro-shard 1 only.
            self.assertEqual((inc["what"], inc["micro_shard"]), ("gradient", 1), inc)

    def test_spot_check_with_two_and_one_ranks(self):
        spec = "step=3,rank=%d,layer=fc1,index=2,phase=forward,kind=bitflip,bit=4"
        # Two ranks, transient: the owner's own recomputation agrees with the checker, so the owner is faulty.
        inc = self.halted("w2", spec % 1, EXIT_HARDWARE, "spot-check", ["--spot-check", "1"], world=2)
        self.assertEqual(inc["rank"], 1, inc)
        self.assertIn("rank 1 itself recomputed it like rank 0", inc["message"])
        # Two ranks, persistent: one of the two is wrong every time; two cannot tell which.
        inc = self.halted("w2p", spec % 1 + ",mode=persistent", EXIT_HARDWARE, "spot-check", ["--spot-check", "1"],
                          world=2)
        self.assertEqual(inc["rank"], -1, inc)
        self.assertIn("a third rank or a replay decides", inc["message"])
        # One rank recomputes its own micro-shards: a transient fault shows.
        inc = self.halted("w1", spec % 0, EXIT_HARDWARE, "spot-check", ["--spot-check", "1"], world=1)
        self.assertEqual(inc["rank"], 0, inc)
        # A persistent fault on the checker: the third rank sides with the owner.
        inc = self.halted("w3c", spec % 2 + ",mode=persistent", EXIT_HARDWARE, "spot-check", ["--spot-check", "1"])
        self.assertEqual(inc["rank"], 2, inc)

    def test_invariants_of_every_rank(self):
        # A bug on every rank (rank=all) leaves the replicas equal: only the invariants see it.
        for name, spec, needle in [
                ("frozen", "step=3,rank=all,layer=fc2,phase=param,kind=stale", "parameter 'fc2.weight' did not change"),
                ("lr-stale", "step=3,rank=all,phase=lr,kind=stale", "the learning rate of step 3 is 0.075 but the schedule"),
                ("lr-scale", "step=3,rank=all,phase=lr,kind=scale,factor=2", "but the schedule gives 0.05")]:
            with self.subTest(name=name):
                inc = self.halted(name, spec, EXIT_INVARIANT, "invariant", ["--lr-schedule", "cosine"])
                self.assertEqual(inc["ranks"], [0, 1, 2], inc)
                self.assertIn("every rank (first rank 0): ", inc["message"])
                self.assertIn(needle, inc["message"])
        # Negative control: the same run without the fault is clean, and --check-invariants false
        # lets the frozen parameter pass.
        res = run(["train", "--lr-schedule", "cosine"] + BASE, world=W, run_dir=self.path("clean"))
        self.assertEqual(res.code, 0, res.err)
        self.assertEqual(incidents(self.path("clean")), [])
        res = run(["train", "--lr-schedule", "cosine", "--check-invariants", "false", "--inject",
                   "step=3,rank=all,layer=fc2,phase=param,kind=stale"] + BASE, world=W, run_dir=self.path("off"))
        self.assertEqual(res.code, 0, res.err)

    def test_dropout_seed_bitflip_is_caught_by_spot_check(self):
        # gpt has dropout: a flipped seed bit changes the masks, silently, on one rank.
        args = ["--model", "gpt", "--steps", "4", "--global-batch", "12", "--micro-shards", "4", "--samples", "48",
                "--trace", "off", "--quiet", "--inject", "step=2,rank=1,phase=rng,kind=bitflip,bit=7"]
        res = run(["train"] + args, world=W, run_dir=self.path("gpt-default"))
        self.assertEqual(res.code, 0, res.err)
        self.assertEqual(incidents(self.path("gpt-default")), [])
        res = run(["train", "--spot-check", "1"] + args, world=W, run_dir=self.path("gpt-spot"))
        self.assertEqual(res.code, EXIT_HARDWARE, res.err)
        inc = incidents(self.path("gpt-spot"))
        self.assertEqual((inc[0]["step"], inc[0]["detector"], inc[0]["rank"]), (2, "spot-check", 1), inc)

    def test_intermittent_faults_follow_the_seed(self):
        # A flaky link: what rank 2 sends is corrupted now and then (each step is a fresh draw).
        spec = "step=2,rank=2,layer=fc1,phase=comm,kind=scale,factor=2,mode=intermittent,p=0.4"

        def steps(name, seed):
            args = BASE[:3] + ["16"] + BASE[4:]
            res = run(["train", "--on-detect", "warn", "--seed", str(seed), "--inject", spec] + args, world=W,
                      run_dir=self.path(name))
            self.assertEqual(res.code, 0, res.err)
            inc = incidents(self.path(name))
            self.assertTrue(all(i["detector"] == "comm" and i["rank"] == 2 for i in inc), inc)
            return [i["step"] for i in inc]

        a, b, c = steps("i1", 5), steps("i2", 5), steps("i3", 6)
        self.assertEqual(a, b)  # the same seed draws the same steps
        self.assertTrue(a and a[0] >= 2, a)
        # Now and then, not always: some steps from the fault's start on are clean.
        self.assertLess(len(a), 15, a)
        self.assertNotEqual(a, c)  # another seed, other steps

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
        self.assertEqual(codes, [EXIT_NUMERICAL] * W, err)
        self.assertIn("halted at step 12 by the spike detector", err)
        # Negative control: without the fault, no spike.
        res = run(["train"] + args[:-2], world=W, run_dir=self.path("spike-clean"))
        self.assertEqual(res.code, 0, res.err)
        self.assertEqual(incidents(self.path("spike-clean")), [])


class FalsePositives(TempDirTest):
    """No detection at all over clean runs: every model, W = 1..4, 5 seeds, 30 steps, every default
    detector and the invariants on, a quarter of the micro-shards spot-checked."""

    def test_clean_runs_raise_nothing(self):
        seeds = [int(x) for x in os.environ.get("CULPRIT_FP_SEEDS", "11,23,37,41,59").split(",")]
        for model, extra in (("mlp", []), ("cnn", []), ("gpt", ["--optimizer", "adamw", "--lr", "0.003"])):
            for world in (1, 2, 3, 4):
                for seed in seeds:
                    with self.subTest(model=model, world=world, seed=seed):
                        d = self.path("clean-%s-%d-%d" % (model, world, seed))
                        args = ["--model", model, "--steps", "30", "--global-batch", "32", "--micro-shards", "4",
                                "--samples", "256", "--trace", "off", "--checkpoint-every", "0", "--quiet",
                                "--seed", str(seed), "--spot-check", "0.25"] + extra
                        res = run(["train"] + args, world=world, run_dir=d)
                        self.assertEqual(res.code, 0, res.err)
                        self.assertEqual(incidents(d), [])

    def test_bad_specs(self):
        for spec, needle in [("step=1,rank=0,layer=fc9,phase=grad,kind=nan", "unknown layer 'fc9' (valid: fc1, fc2, fc3)"),
                             ("step=1,rank=0,layer=fc1,phase=gpu,kind=nan", "unknown phase 'gpu' (valid: forward, backward, grad, comm"),
                             ("step=1,rank=0,layer=fc1,phase=grad,kind=zap", "unknown kind 'zap'"),
                             ("step=1,rank=0,layer=fc1,phase=grad,color=red", "unknown key 'color'"),
                             ("step=1,rank=7,layer=fc1,phase=grad,kind=nan", "rank 7 does not exist")]:
            res = run(["train", "--inject", spec] + BASE, world=2, run_dir=self.path("bad"))
            self.assertEqual(res.code, EXIT_USAGE, res.err)
            self.assertIn(needle, res.err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
