"""The math libraries under libtorch's CPU kernels (docs/determinism.md, "The math libraries"): a run
records them in run.json with MKL's reproducible mode (CNR AUTO) pinned; a replay, bisection or resume
under another MKL branch or ATen CPU capability is refused with one line naming what differs (exit 2
on every rank), and the same commands under the run's own settings go through (the negative
control). The branch does decide bits: the same run under MKL's AVX2 branch ends elsewhere."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import culprit_testlib as testlib  # noqa: E402
from culprit_testlib import EXIT_USAGE, PY, TempDirTest, run  # noqa: E402
import subprocess  # noqa: E402

ARGS = ["--model", "gpt", "--steps", "4", "--checkpoint-every", "2", "--global-batch", "16", "--micro-shards", "4",
        "--quiet"]


def math_of(run_dir):
    with open(os.path.join(run_dir, "run.json")) as f:
        return json.load(f)["math"]


class MathLibraries(TempDirTest):
    def train(self, name, world=2, env=None, args=ARGS):
        res = run(["train"] + args, world=world, run_dir=self.path(name), env=env)
        self.assertEqual(res.code, 0, res.err)
        return self.path(name)

    def test_recorded_pinned_and_a_mismatch_refused(self):
        d = self.train("run")
        m = math_of(d)
        torch_version = subprocess.run([PY, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                                       text=True, check=True).stdout.strip()
        self.assertEqual(m["torch"], torch_version.split("+")[0])
        self.assertIn("Math Kernel Library", m["blas"])
        self.assertRegex(m["mkl_cnr"], r"^AUTO \(\w+\)$")  # pinned by culprit, with the branch run
        self.assertIn(m["cpu_capability"], ("AVX2", "AVX512", "DEFAULT"))
        self.assertRegex(m["onednn"], r"^v\d+\.\d+")
        for env, what in (({"MKL_CBWR": "AVX2,STRICT"}, "MKL's CNR mode (MKL_CBWR) was 'AUTO ("),
                          ({"ATEN_CPU_CAPABILITY": "default"}, "ATen's CPU capability (ATEN_CPU_CAPABILITY) was")):
            if env.get("ATEN_CPU_CAPABILITY") and m["cpu_capability"] == "DEFAULT":
                continue  # already the capability asked for: no mismatch to make
            with self.subTest(env=env):
                for args in (["replay", "--step", "3"], ["bisect"], ["train", "--resume", "--steps", "6"]):
                    line = self.assert_refused(args + ["--run-dir", d], EXIT_USAGE, what, world=2,
                                               env=dict(os.environ, **env))
                    self.assertIn("here would not reproduce its bits", line)
        # Negative control: under the run's own settings the same commands go through.
        res = run(["replay", "--step", "3"], world=2, run_dir=d)
        self.assertEqual(res.code, 0, res.err)
        self.assertEqual(run(["bisect"], world=2, run_dir=d).code, 0)

    def test_a_run_from_before_the_record_is_checked_by_its_libtorch(self):
        # A 1.13 build's run.json has no "math", only versions.libtorch: replaying it under 2.11 would
        # disagree by rounding, not by a fault. Made so from a run of this build (the record dropped).
        d = self.train("old")
        with open(os.path.join(d, "run.json")) as f:
            record = json.load(f)
        del record["math"]
        record["versions"]["libtorch"] = "1.13.0"
        with open(os.path.join(d, "run.json"), "w") as f:
            json.dump(record, f)
        self.assert_refused(["replay", "--step", "3", "--run-dir", d], EXIT_USAGE, "libtorch was '1.13.0', here")

    def test_a_script_that_used_mkl_before_importing_culprit_is_refused(self):
        # MKL's mode can be set only before MKL first computes: a script that multiplied matrices before
        # importing culprit would record MKL without CNR, which no later culprit process reproduces.
        script = self.path("early.py")
        with open(script, "w") as f:
            f.write("import sys, torch\n"
                    "torch.ones(64, 64) @ torch.ones(64, 64)\n"
                    "sys.path.insert(0, %r)\n"
                    "import train_mlp\n"
                    "sys.exit(train_mlp.culprit.main(train_mlp.build))\n" % os.path.join(testlib.ROOT, "examples"))
        self.assert_refused(["--run-dir", self.path("early-run"), "--steps", "2"], EXIT_USAGE,
                            "MKL computed before culprit was imported", program=[PY, script])
        # Negative control: the same script with MKL_CBWR chosen trains.
        res = subprocess.run([PY, script, "--run-dir", self.path("early-env"), "--steps", "2", "--quiet"],
                             capture_output=True, text=True, env=dict(os.environ, MKL_CBWR="AUTO"), timeout=300)
        self.assertEqual(res.returncode, 0, res.stderr)

    def test_the_branch_decides_bits_and_is_kept_when_chosen(self):
        # An MLP with 512-wide layers: its matrix products are large enough for MKL's branches to differ.
        args = ["--model", "mlp", "--hidden", "512", "--global-batch", "64", "--micro-shards", "4", "--steps", "3",
                "--quiet"]
        auto = self.train("auto", args=args)
        env = dict(os.environ, MKL_CBWR="AVX2,STRICT")
        avx2 = {w: self.train("avx2-w%d" % w, w, env, args) for w in (1, 2)}
        self.assertEqual(math_of(avx2[2])["mkl_cnr"], "AVX2,STRICT")  # the environment's choice, recorded
        last = {k: testlib.metrics(d)[-1]["fingerprint"] for k, d in (("auto", auto), ("1", avx2[1]), ("2", avx2[2]))}
        self.assertEqual(last["1"], last["2"])  # W-invariant under that branch too
        if math_of(auto)["mkl_cnr"] != "AUTO (AVX2)":  # on an AVX2-only CPU the two are one branch
            self.assertNotEqual(last["auto"], last["2"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
