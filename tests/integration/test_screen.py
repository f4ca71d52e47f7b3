"""culprit screen under real mpirun: healthy devices pass; a flip injected into one rank's matmul fails
exactly that device (exit 10, the host in the exclude list, the JSON report); two devices that
disagree are unresolved; bad options are one clear line and exit 2 on every rank."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import EXIT_USAGE, TempDirTest, run  # noqa: E402


class Screen(TempDirTest):
    def test_healthy_devices_pass(self):
        report = self.path("ok.json")
        res = run(["screen", "--seconds", "0.5", "--size", "64", "--report", report], world=3)
        self.assertEqual(res.code, 0, res.out + res.err)
        j = json.load(open(report))
        self.assertEqual([d["verdict"] for d in j["devices"]], ["pass"] * 3)
        self.assertEqual(j["exclude"], "")
        self.assertGreater(j["repetitions"], 1)

    def test_a_flipped_matmul_fails_its_device_only(self):
        report = self.path("bad.json")
        res = run(["screen", "--seconds", "0.5", "--size", "64", "--report", report, "--inject",
                   "rank=1,layer=matmul,step=2,index=5,kind=bitflip,bit=4,mode=persistent"], world=3)
        self.assertEqual(res.code, 10, res.out + res.err)
        j = json.load(open(report))
        self.assertEqual([d["verdict"] for d in j["devices"]], ["pass", "fail", "pass"])
        bad = j["devices"][1]
        self.assertEqual(bad["failures"]["reduce"], 0)
        self.assertEqual(bad["failures"]["matmul"], j["repetitions"] - 1)
        self.assertEqual(bad["first_failure"], 2)
        self.assertEqual(j["exclude"], bad["host"])
        self.assertIn("exclude: " + bad["host"], res.out)
        # An intermittent fault fails now and then.
        res = run(["screen", "--seconds", "0.5", "--size", "64", "--report", report, "--inject",
                   "rank=0,layer=pointwise,step=1,index=7,kind=bitflip,bit=1,mode=intermittent,p=0.3"], world=3)
        self.assertEqual(res.code, 10, res.out + res.err)
        j = json.load(open(report))
        self.assertTrue(0 < j["devices"][0]["failures"]["pointwise"] < j["repetitions"], j)

    def test_two_devices_that_disagree_are_unresolved(self):
        report = self.path("two.json")
        res = run(["screen", "--seconds", "0.2", "--size", "64", "--report", report, "--inject",
                   "rank=1,layer=reduce,step=1,kind=bitflip,bit=3,mode=persistent"], world=2)
        self.assertEqual(res.code, 10, res.out + res.err)
        self.assertIn("screen with 3 or more", res.out)
        j = json.load(open(report))
        self.assertEqual([d["verdict"] for d in j["devices"]], ["unresolved", "unresolved"])

    def test_bad_options(self):
        for args, needle in [(["--inject", "rank=0,layer=conv"], "unknown layer 'conv'"),
                             (["--size", "0"], "'--size'"),
                             (["--device", "gpu"], "unknown device 'gpu' (valid: cpu, cuda)"),
                             # Here: no GPU (or a build without nvcc); either way one line naming it.
                             (["--device", "cuda"], "--device"),
                             (["--bogus"], "unrecognised option '--bogus'")]:
            with self.subTest(args=args):
                self.assert_refused(["screen"] + args, EXIT_USAGE, needle)


if __name__ == "__main__":
    unittest.main(verbosity=2)
