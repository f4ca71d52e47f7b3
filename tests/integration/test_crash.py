"""Crash safety: the training job is killed with SIGKILL at random moments while checkpoints are being
written (every step); resume always finds a valid checkpoint and ends bitwise equal to an
uninterrupted run. CULPRIT_CRASH_TRIALS sets the number of trials (default 3; tests/crash-soak.sh: 24).
A torn tail of metrics.jsonl (a crash or a full disk mid-line) is handled by --resume."""
import json
import os
import random
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import CULPRIT, MPIRUN, TempDirTest, run  # noqa: E402

TRIALS = int(os.environ.get("CULPRIT_CRASH_TRIALS", "3"))
STEPS = 40
# ~5 MB of state per checkpoint, one checkpoint per step: most of the run is spent writing.
ARGS = ["--model", "mlp", "--hidden", "768", "--steps", str(STEPS), "--global-batch", "16", "--micro-shards", "4",
        "--checkpoint-every", "1", "--keep-last", "2", "--quiet"]


def final_fingerprint(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        lines = [json.loads(l) for l in f]
    return lines[-1]["step"], lines[-1]["fingerprint"]


class CrashSafety(TempDirTest):
    def test_sigkill_during_checkpoint_writes(self):
        t0 = time.time()
        ref = run(["train"] + ARGS, world=2, run_dir=self.path("ref"))
        self.assertEqual(ref.code, 0, ref.err)
        duration = time.time() - t0
        want = final_fingerprint(self.path("ref"))
        rng = random.Random(int(os.environ.get("CULPRIT_CRASH_SEED", "1")))
        mid_write = 0
        for trial in range(TRIALS):
            with self.subTest(trial=trial):
                run_dir = self.path("t%d" % trial)
                world = 1 + trial % 2
                cmd = [CULPRIT, "train", "--run-dir", run_dir] + ARGS
                if world > 1:
                    cmd = MPIRUN + ["-np", str(world)] + cmd
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
                # Kill somewhere after the first checkpoint began, before the end.
                time.sleep(rng.uniform(0.45, 0.95) * duration)
                # mpirun puts each rank in a process group of its own: kill the whole session at once.
                subprocess.run(["pkill", "-9", "-s", str(proc.pid)])
                proc.wait()
                if proc.returncode == 0:
                    continue  # finished before the kill: nothing to check
                ckdir = os.path.join(run_dir, "checkpoints")
                if any(n.endswith(".tmp") for n in os.listdir(ckdir)):
                    mid_write += 1
                res = run(["train", "--resume"] + ARGS, world=2, run_dir=run_dir)
                self.assertEqual(res.code, 0, "trial %d: resume failed:\n%s" % (trial, res.err))
                self.assertEqual(final_fingerprint(run_dir), want, "trial %d" % trial)
                v = run(["verify", run_dir])
                self.assertEqual(v.code, 0, v.out + v.err)
        print("\n%d of %d kills left an interrupted checkpoint write behind" % (mid_write, TRIALS), file=sys.stderr)


class TornTail(TempDirTest):
    def test_resume_after_a_torn_metrics_line(self):
        # What a crash or a full disk leaves: metrics.jsonl ending mid-line. --resume keeps the whole
        # lines up to its checkpoint and ends bitwise equal to an uninterrupted run, each step once.
        # Negative control: the torn line was really there (the file did not parse before).
        args = ["--model", "mlp", "--steps", "6", "--global-batch", "16", "--micro-shards", "4",
                "--checkpoint-every", "2", "--quiet"]
        ref = run(["train"] + args, world=2, run_dir=self.path("ref"))
        self.assertEqual(ref.code, 0, ref.err)
        short = ["--steps", "4"] + args[4:]
        for i, tail in enumerate(('{"step": ', '{"step": 5, "loss"', 'garbage\n')):
            with self.subTest(tail=tail):
                d = self.path("t%d" % i)
                first = run(["train"] + args[:2] + short, world=2, run_dir=d)
                self.assertEqual(first.code, 0, first.err)
                path = os.path.join(d, "metrics.jsonl")
                with open(path, "a") as f:
                    f.write(tail)
                with open(path) as f:
                    with self.assertRaises(ValueError):
                        [json.loads(l) for l in f]
                res = run(["train", "--resume"] + args, world=2, run_dir=d)
                self.assertEqual(res.code, 0, res.err)
                with open(path) as f:
                    self.assertEqual([json.loads(l)["step"] for l in f], [1, 2, 3, 4, 5, 6])
                self.assertEqual(final_fingerprint(d), final_fingerprint(self.path("ref")))
                self.assertFalse(os.path.exists(path + ".tmp"))


if __name__ == "__main__":
    unittest.main(verbosity=2)

