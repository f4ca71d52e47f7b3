"""A rank that dies or stops responding mid-step: the other ranks end within --collective-timeout with a
message naming it and its host, the incident is logged, the newest valid checkpoint stays usable, and
--resume completes the run bitwise equal to an uninterrupted one."""
import json
import os
import signal
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import CULPRIT, EXIT_SILENT_RANK, MPIRUN, TempDirTest, incidents, run  # noqa: E402

W = 3
TIMEOUT = 5  # --collective-timeout in these tests; the grace for the roll call is max(1, TIMEOUT/4)
ARGS = ["--model", "mlp", "--global-batch", "24", "--micro-shards", "4", "--samples", "96", "--quiet",
        "--collective-timeout", str(TIMEOUT)]
LONG = 3000  # steps of the runs killed from outside (a few seconds)



def last_step(run_dir):
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            lines = f.readlines()
        return json.loads(lines[-1])["step"] if lines else 0
    except (OSError, ValueError):
        return 0


def rank_pid(run_dir, rank):
    """The pid of the culprit process of `rank` training in run_dir."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmd = f.read().split(b"\0")
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"culprit") and run_dir.encode() in cmd and \
                ("OMPI_COMM_WORLD_RANK=%d" % rank).encode() in env:
            return int(pid)
    return None


class SilentRank(TempDirTest):
    def reference(self, name, steps, extra=()):
        res = run(["train", "--steps", str(steps)] + ARGS + list(extra), world=W, run_dir=self.path(name))
        self.assertEqual(res.code, 0, res.err)
        return res.final_fingerprint()

    def resume_matches(self, run_dir, want, steps):
        # The run really was cut short: the fingerprint it would have ended with is not there yet.
        self.assertLess(last_step(run_dir), steps)
        res = run(["train", "--resume", "--quiet"], world=W, run_dir=run_dir)
        self.assertEqual(res.code, 0, res.err)
        self.assertEqual(res.final_fingerprint(), want)
        v = run(["verify", run_dir])
        self.assertEqual(v.code, 0, v.out + v.err)

    def test_stuck_rank(self):
        # Rank 1 hangs inside the forward pass of step 7 (a stuck device).
        want = self.reference("ref", 12, ["--checkpoint-every", "3"])
        d = self.path("stuck")
        t0 = time.time()
        res = run(["train", "--steps", "12", "--checkpoint-every", "3", "--inject",
                   "step=7,rank=1,layer=fc2,phase=forward,kind=hang"] + ARGS, world=W, run_dir=d, timeout=120)
        elapsed = time.time() - t0
        self.assertEqual(res.code, EXIT_SILENT_RANK, res.err)
        self.assertLess(elapsed, TIMEOUT + 1.25 + 30, "the job took %.1f s to end" % elapsed)
        self.assertRegex(res.err, r"culprit: error: rank 1 \(host \S+\) stopped responding: no answer within the "
                                  r"collective timeout of 5 s .*ranks 0,2 waited in .* of step 7")
        # The line after it says what exit 13 means, before Open MPI's words on MPI_Abort.
        note = "culprit: exit 13 (a rank stopped responding): this is a finding, not a crash"
        self.assertIn(note, res.err)
        self.assertLess(res.err.index("culprit: error: rank 1"), res.err.index(note))
        inc = incidents(d)
        self.assertEqual(len(inc), 1, inc)
        self.assertEqual((inc[0]["step"], inc[0]["detector"], inc[0]["rank"], inc[0]["class"], inc[0]["ranks"]),
                         (7, "collective-timeout", 1, "hardware", [1]), inc)
        # What jobs/train.sbatch reads to exclude the host: through culprit, from the record.
        host = run(["report", d, "--field", "incident.host", "--detector", "collective-timeout"])
        self.assertEqual((host.code, host.out.strip()), (0, inc[0]["host"]), host.err)
        self.assertIn("step-00000006.h5", os.listdir(os.path.join(d, "checkpoints")))
        # The resumed run does not repeat the injected fault and ends where the uninterrupted run did;
        # the trace still records the fault of the run it continued.
        self.resume_matches(d, want, 12)
        res = run(["inspect", "--json", os.path.join(d, "trace", "rank-00002.h5")])
        self.assertEqual(res.code, 0, res.err)
        self.assertEqual(json.loads(res.out)["faults"], ["step=7,rank=1,layer=fc2,phase=forward,kind=hang"])

    def kill_rank_1(self, name, launcher):
        d = self.path(name)
        cmd = launcher + ["-np", str(W), CULPRIT, "train", "--run-dir", d, "--steps", str(LONG),
                          "--checkpoint-every", "100", "--spike-window", "0"] + ARGS
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        deadline = time.time() + 120
        while last_step(d) < 300 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.05)
        pid = rank_pid(d, 1)
        self.assertIsNotNone(pid, "rank 1 not found")
        os.kill(pid, 9)
        killed = time.time()
        try:
            out, err = proc.communicate(timeout=TIMEOUT + 60)
        finally:
            subprocess.run(["pkill", "-9", "-s", str(proc.pid)])
        return d, proc.returncode, err, time.time() - killed

    def test_killed_rank_the_launcher_lets_run(self):
        # Launchers that let the other ranks run on (srun without --kill-on-bad-exit, mpirun
        # --enable-recovery): culprit's watchdog ends the job and names the dead rank.
        want = self.reference("ref", LONG, ["--checkpoint-every", "100", "--spike-window", "0"])
        d, code, err, after = self.kill_rank_1("killed", MPIRUN + ["--enable-recovery"])
        self.assertLess(after, TIMEOUT + 1.25 + 30, "the job took %.1f s to end after the kill" % after)
        self.assertRegex(err, r"culprit: error: rank 1 \(host \S+\) stopped responding")
        inc = incidents(d)
        self.assertEqual([(i["detector"], i["rank"]) for i in inc], [("collective-timeout", 1)], inc)
        self.resume_matches(d, want, LONG)

    def test_killed_rank_under_plain_mpirun(self):
        # Plain mpirun ends the whole job itself when a process dies, and names it.
        want = self.reference("ref", LONG, ["--checkpoint-every", "100", "--spike-window", "0"])
        d, code, err, after = self.kill_rank_1("killed", MPIRUN)
        self.assertNotEqual(code, 0)
        self.assertLess(after, TIMEOUT + 30, "the job took %.1f s to end after the kill" % after)
        self.assertRegex(err, r"process rank 1 .* exited on signal 9")
        self.resume_matches(d, want, LONG)

    def stop_rank_1(self, d, cmd, ready):
        """Runs cmd (under mpirun on W ranks, in run directory d); once ready(stderr lines so far)
        holds and rank 1's process is there, stops it with SIGSTOP. Returns (exit code, stderr,
        seconds from the stop to the end)."""
        proc = subprocess.Popen(MPIRUN + ["-np", str(W), CULPRIT] + cmd, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        lines, stopped = [], None
        reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
        reader.start()
        try:
            deadline = time.time() + 120
            while stopped is None and time.time() < deadline and proc.poll() is None:
                pid = rank_pid(d, 1) if ready(lines, d) else None
                if pid is not None:
                    os.kill(pid, signal.SIGSTOP)
                    stopped = time.time()
                time.sleep(0.05)
            self.assertIsNotNone(stopped, "rank 1 was never stopped:\n" + "".join(lines))
            proc.wait(timeout=TIMEOUT + 90)
            reader.join(timeout=10)
        finally:
            subprocess.run(["pkill", "-9", "-s", str(proc.pid)])
            proc.stdout.close()
            proc.stderr.close()
        return proc.returncode, "".join(lines), time.time() - stopped

    def test_a_rank_stopped_during_the_diagnosis_in_the_job_is_named(self):
        # --on-detect diagnose: the bisection runs on the ranks that trained; rank 1 is stopped as it
        # starts. The diagnosis's collectives are bounded as training's: rank 1 is named (exit 13) and
        # its host goes to the incidents at the halt's step, where jobs/train.sbatch reads it.
        d = self.path("diag")
        # A long interval before the fault: the diagnosis replays for seconds, long enough for the stop.
        spec = "step=600,rank=2,layer=fc1,index=3,phase=forward,kind=noise,mode=persistent"
        code, err, after = self.stop_rank_1(d, ["train", "--run-dir", d, "--steps", "700", "--checkpoint-every", "300",
                                                "--on-detect", "diagnose", "--spot-check", "1", "--inject", spec] + ARGS,
                                            lambda lines, d: any("culprit bisect: first incident" in l for l in lines))
        self.assertEqual(code, EXIT_SILENT_RANK, err)
        self.assertLess(after, TIMEOUT + 1.25 + 30, "the job took %.1f s to end after the stop" % after)
        self.assertRegex(err, r"culprit: error: rank 1 \(host \S+\) stopped responding: no answer within the "
                              r"collective timeout of 5 s")
        silent = [i for i in incidents(d) if i["detector"] == "collective-timeout"]
        self.assertEqual([(i["rank"], i["ranks"], i["class"]) for i in silent], [(1, [1], "hardware")], silent)
        # At the halt's step (a step the job resumes before), not the step the replay was at.
        self.assertEqual(silent[0]["step"], [i for i in incidents(d) if i["detector"] != "collective-timeout"][0]["step"])
        host = run(["report", d, "--field", "incident.host", "--detector", "collective-timeout"])
        self.assertEqual((host.code, host.out.strip()), (0, silent[0]["host"]), host.err)

    def test_a_rank_stopped_during_bisect_or_audit_is_named(self):
        # A run long enough that bisect and audit replay for a while; rank 1 is stopped once rank 0
        # says what it replays (every rank is past the command's start then). Their collectives are bounded by --collective-timeout as training's.
        d = self.path("long")
        res = run(["train", "--steps", "1000", "--checkpoint-every", "100", "--trace", "step"] + ARGS, world=W, run_dir=d)
        self.assertEqual(res.code, 0, res.err)
        # The negative control: neither is stopped; each finds nothing.
        for cmd in (["bisect"], ["audit"]):
            ok = subprocess.run(MPIRUN + ["-np", str(W), CULPRIT] + cmd + ["--run-dir", d, "--collective-timeout",
                                                                          str(TIMEOUT)], capture_output=True, text=True)
            self.assertEqual(ok.returncode, 0, ok.stdout + ok.stderr)
        for cmd in (["bisect"], ["audit"]):
            with self.subTest(command=cmd[0]):
                code, err, after = self.stop_rank_1(d, cmd + ["--run-dir", d, "--collective-timeout", str(TIMEOUT)],
                                                    lambda lines, d: any("replaying" in l for l in lines))
                self.assertEqual(code, EXIT_SILENT_RANK, err)
                self.assertLess(after, TIMEOUT + 1.25 + 30, "%s took %.1f s to end after the stop" % (cmd[0], after))
                self.assertRegex(err, r"culprit: error: rank 1 \(host \S+\) stopped responding")
        # Nothing was recorded about the run itself: a stopped rank of a bisect is not the run's fault.
        self.assertEqual(incidents(d), [])


    def test_a_rank_at_work_of_its_own_past_the_timeout_is_waited_for(self):
        # An audit's shares are unequal (3 intervals on 2 ranks, ~2 s each): rank 1 waits for rank 0
        # longer than a 1 s timeout. Rank 0 answers the roll call "busy" between replayed steps, so
        # the others wait on: exit 0, every interval reproduced, nobody named (was exit 13).
        d = self.path("busy")
        res = run(["train", "--model", "mlp", "--hidden", "2048", "--global-batch", "512", "--samples", "4096",
                   "--steps", "90", "--checkpoint-every", "30", "--quiet"], world=2, run_dir=d)
        self.assertEqual(res.code, 0, res.err)
        t0 = time.time()
        ok = subprocess.run(MPIRUN + ["-np", "2", CULPRIT, "audit", "--run-dir", d, "--collective-timeout", "1"],
                            capture_output=True, text=True, timeout=600)
        self.assertEqual(ok.returncode, 0, ok.stdout + ok.stderr)
        self.assertEqual(ok.stdout.count("reproduced bitwise"), 3, ok.stdout)
        self.assertNotIn("stopped responding", ok.stderr)
        self.assertGreater(time.time() - t0, 3, "the shares took less than the timeout: nothing was tested")


if __name__ == "__main__":
    unittest.main(verbosity=2)
