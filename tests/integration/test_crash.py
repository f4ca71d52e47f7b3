"""Crash safety: the training job is killed with SIGKILL at random moments while checkpoints are being
written (every step); resume always starts from the newest committed checkpoint and ends bitwise equal
to an uninterrupted run. Half the trials aim their kill at a checkpoint write in progress (its .tmp
file there), so that a kill mid-write is tested every time, not left to the timing. CULPRIT_CRASH_TRIALS
sets the number of trials (default 3; tests/soak.sh runs 24).
A torn tail of metrics.jsonl (a crash or a full disk mid-line) is handled by --resume."""
import json
import os
import random
import signal
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import CULPRIT, MPIRUN, TIMEOUT, TempDirTest, metric_steps, metrics, run  # noqa: E402

TRIALS = int(os.environ.get("CULPRIT_CRASH_TRIALS", "3"))
# An aimed kill misses when the write commits between the look and the kill (or the job ends first):
# the trial starts a new job, this many times at most.
AIM_TRIES = 5
STEPS = 40
# ~5 MB of state per checkpoint, one checkpoint per step: most of the run is spent writing.
ARGS = ["--model", "mlp", "--hidden", "768", "--steps", str(STEPS), "--global-batch", "16", "--micro-shards", "4",
        "--checkpoint-every", "1", "--keep-last", "2"]


def final_fingerprint(run_dir):
    last = metrics(run_dir)[-1]
    return last["step"], last["fingerprint"]


def kill_session(sid):
    """SIGKILL to every process of session sid (mpirun puts each rank in a process group of its own),
    at once: pkill would take milliseconds to start, a checkpoint write here about ten."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.getsid(int(name)) == sid:
                    os.kill(int(name), signal.SIGKILL)
            except OSError:
                pass  # ended meanwhile


def writing(ckdir, first):
    """Whether the checkpoint of step `first` or a later one is being written (its .tmp file is there)."""
    try:
        names = os.listdir(ckdir)
    except OSError:
        return False
    return any(n.endswith(".h5.tmp") and int(n[5:13]) >= first for n in names)


class CrashSafety(TempDirTest):
    def crash_and_resume(self, run_dir, world, want, moment=None, aim=None):
        """Starts the job on `world` ranks and kills it `moment` seconds in, or (aim) as soon as the
        checkpoint of step `aim` or a later one is being written; then checks the resume. Returns
        whether the kill left a checkpoint write interrupted, None when the job ended first."""
        cmd = [CULPRIT, "train", "--run-dir", run_dir, "--quiet"] + ARGS
        if world > 1:
            cmd = MPIRUN + ["-np", str(world)] + cmd
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        ckdir = os.path.join(run_dir, "checkpoints")
        if aim is None:
            time.sleep(moment)
        else:
            deadline = time.time() + TIMEOUT
            while proc.poll() is None and not writing(ckdir, aim) and time.time() < deadline:
                time.sleep(0.0005)
        kill_session(proc.pid)
        proc.wait()
        if proc.returncode == 0:
            return None  # finished before the kill: nothing to check
        names = os.listdir(ckdir)
        interrupted = any(n.endswith(".tmp") for n in names)
        newest = max(int(n[5:13]) for n in names if n.endswith(".h5"))
        # Without --quiet: the resume says where it starts from.
        res = run(["train", "--resume"] + ARGS, world=2, run_dir=run_dir)
        self.assertEqual(res.code, 0, "%s: resume failed:\n%s" % (run_dir, res.err))
        self.assertIn("resumed from %s (step %d)" % (os.path.join(ckdir, "step-%08d.h5" % newest), newest), res.out,
                      "%s: not resumed from the newest committed checkpoint (interrupted: %s)" % (run_dir, interrupted))
        self.assertEqual(metric_steps(run_dir), list(range(1, STEPS + 1)), run_dir)
        self.assertEqual(final_fingerprint(run_dir), want, run_dir)
        v = run(["verify", run_dir])
        self.assertEqual(v.code, 0, v.out + v.err)
        return interrupted

    def test_sigkill_during_checkpoint_writes(self):
        t0 = time.time()
        ref = run(["train", "--quiet"] + ARGS, world=2, run_dir=self.path("ref"))
        self.assertEqual(ref.code, 0, ref.err)
        duration = time.time() - t0
        want = final_fingerprint(self.path("ref"))
        rng = random.Random(int(os.environ.get("CULPRIT_CRASH_SEED", "1")))
        mid_write = 0
        for trial in range(TRIALS):
            with self.subTest(trial=trial):
                world = 1 + trial % 2
                if trial % 4 < 2:
                    # Aimed: killed while a checkpoint after the first one or two is being written.
                    aim = rng.randint(2, STEPS - 2)
                    for attempt in range(AIM_TRIES):
                        run_dir = self.path("t%d-%d" % (trial, attempt))
                        interrupted = self.crash_and_resume(run_dir, world, want, aim=aim)
                        if interrupted:
                            break
                    self.assertTrue(interrupted, "trial %d: none of %d kills aimed at the write of checkpoint %d "
                                    "or later landed mid-write" % (trial, AIM_TRIES, aim))
                else:
                    # Kill somewhere after the first checkpoint began, before the end.
                    interrupted = self.crash_and_resume(self.path("t%d" % trial), world, want,
                                                        moment=rng.uniform(0.45, 0.95) * duration)
                mid_write += bool(interrupted)
        print("\n%d of %d trials' kills left an interrupted checkpoint write behind" % (mid_write, TRIALS),
              file=sys.stderr)
        self.assertGreater(mid_write, 0, "no kill landed while a checkpoint was being written")


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

