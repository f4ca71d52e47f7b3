"""jobs/ on a real single-node Slurm (scripts/slurm.sh starts munged, slurmctld and slurmd; the tests
submit with sbatch and read outcomes with scontrol):
- train.sbatch with an injected persistent fault ends with the hardware-persistent exit code, logs its
  decision, and submits a follow-up job that excludes the node and resumes from the checkpoint before
  the faulty step; a continuation from there ends bitwise equal to a clean run (negative control: the
  faulty run's own last checkpoint is not);
- a run resumed on fewer ranks (a node lost) whose bisection blames a rank outside its world ends
  hardware-unconfirmed (26) and excludes that host; with the early checkpoints deleted it ends
  inconclusive (25): nobody excluded, no follow-up job;
- a train.sbatch run that fails before any diagnosis still records its decision (stop), and an older
  job's diagnosis.json left in the run directory is not read as this job's (its step not used);
- names in checkpoints/ that are not checkpoints (`step-9+x[$(cmd)].h5`, `step-99999999 (copy).h5`)
  are ignored with a line each: the command in the name never runs, the requeue resumes from the
  right checkpoint;
- a blamed host that is not a plain host name of the job's nodes (recorded as `HOST,culprit-spare`
  by ranks each in a UTS namespace: a list of every node) excludes nobody: stop, no follow-up job;
- a diagnosis that fails on a full filesystem (a tmpfs filled as the diagnosis starts; root only)
  exits 6, not the halt's 10, removes the stale diagnosis.json it found, and the job stops excluding
  nobody;
- postmortem.sbatch writes the expected diagnosis of a silent fault;
- the audit array and its merge job write one report covering every interval;
- screen.sbatch passes a healthy node and excludes it when a flip is injected into its matmul;
- a plain PyTorch model trained through the Python package under `srun --mpi=pmix` is diagnosed by
  postmortem.sbatch (its `culprit bisect` hands the run to the package on every task).
CULPRIT_SKIP_SLURM=1 skips these tests; otherwise daemons that do not start fail them."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import CRASH_MARKERS, CULPRIT, MPIRUN, PY, TempDirTest, run  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
JOBS = os.path.join(ROOT, "jobs")
SLURM_DIR = os.environ.get("CULPRIT_SLURM_DIR", "/tmp/culprit-slurm-test")
SHAPE = ["--steps", "8", "--keep-last", "10", "--trace", "layer", "--global-batch", "24", "--micro-shards", "4",
         "--samples", "96", "--quiet"]
SIZE = SHAPE + ["--checkpoint-every", "2"]
# SHAPE without its step count, with checkpoints every 2 steps (runs trained in two parts).
PARTS = [a for a in SIZE if a not in ("--steps", "8")]
SKIP = os.environ.get("CULPRIT_SKIP_SLURM") == "1"
PKG = os.environ.get("CULPRIT_PYTHON_DIR", "")  # set by CMake when the Python package is built


def slurm_env(extra=None):
    env = dict(os.environ)
    env["SLURM_CONF"] = os.path.join(SLURM_DIR, "slurm.conf")
    env["CULPRIT"] = os.path.abspath(CULPRIT)
    env["CULPRIT_SLURM_DIR"] = SLURM_DIR
    env.update(extra or {})
    return env


def sbatch(args, cwd, extra=None):
    out = subprocess.run(["sbatch", "--parsable"] + args, cwd=cwd, env=slurm_env(extra), capture_output=True,
                         text=True, timeout=60)
    if out.returncode != 0:
        raise AssertionError("sbatch failed: " + out.stderr)
    return out.stdout.strip().split(";")[0]


def job_info(job):
    out = subprocess.run(["scontrol", "show", "job", job], env=slurm_env(), capture_output=True, text=True,
                         timeout=60).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def wait(job, timeout=300):
    """The job's final state and exit code once it has ended."""
    end = time.time() + timeout
    while time.time() < end:
        info = job_info(job)
        if info.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            return info["JobState"], int(info["ExitCode"].split(":")[0])
        time.sleep(0.5)
    raise AssertionError("job %s did not end within %d s: %s" % (job, timeout, job_info(job)))


def short_host():
    return subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()


def can_mount():
    return os.geteuid() == 0 and shutil.which("mount") is not None


def plant_stale_diagnosis(run_dir, step, host):
    """An older job's diagnosis.json (a post-mortem or an earlier halt), blaming `host` at `step`."""
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "diagnosis.json"), "w") as f:
        json.dump({"record": "diagnosis", "version": 2, "verdict": "hardware-persistent", "step": step,
                   "layer": "fc1", "phase": "grad", "rank": 0, "host": host, "device": "cpu", "reruns": 8,
                   "reproduced": 8, "evidence": ["planted"], "steps_replayed": 1, "seconds": 1.0,
                   "startup_seconds": 0.5, "slurm_job_id": "an-older-job"}, f)


@unittest.skipIf(SKIP, "CULPRIT_SKIP_SLURM=1: Slurm tests not wanted")
class Slurm(TempDirTest):
    @classmethod
    def setUpClass(cls):
        res = subprocess.run(["bash", os.path.join(ROOT, "scripts/slurm.sh"), "start"], env=slurm_env(),
                             capture_output=True, text=True, timeout=600)
        if res.returncode != 0:
            raise AssertionError("the test Slurm did not start (scripts/slurm.sh start): " + res.stderr.strip())

    @classmethod
    def tearDownClass(cls):
        subprocess.run(["bash", os.path.join(ROOT, "scripts/slurm.sh"), "stop"], env=slurm_env(),
                       capture_output=True, text=True, timeout=120)

    def decisions(self, run_dir):
        with open(os.path.join(run_dir, "incidents.jsonl")) as f:
            return [j for j in map(json.loads, f) if j["detector"] == "jobs"]

    def test_train_excludes_the_bad_node_and_the_continuation_matches_a_clean_run(self):
        run_dir = self.path("run")
        overcommit = {"CULPRIT_SRUN_ARGS": "-O", "CULPRIT_SBATCH_ARGS": "-O"}
        job = sbatch(["-n", "3", "-O", "-o", self.path("train-%j.out"), os.path.join(JOBS, "train.sbatch"), run_dir]
                     + SIZE + ["--inject", "step=5,rank=1,layer=fc2,index=3,phase=grad,kind=nan,mode=persistent"],
                     cwd=self.tmp, extra=overcommit)
        state, code = wait(job)
        log = open(self.path("train-%s.out" % job)).read()
        self.assertEqual((state, code), ("FAILED", 21), log)
        diag = json.load(open(os.path.join(run_dir, "diagnosis.json")))
        self.assertEqual((diag["verdict"], diag["step"], diag["rank"]), ("hardware-persistent", 5, 1), diag)
        host = diag["host"]
        # The decision, with the job id, the restart count, the exclude list and the resume point.
        d = self.decisions(run_dir)[-1]
        self.assertEqual((d["class"], d["decision"], d["slurm_job_id"], d["restart"], d["exit_code"]),
                         ("jobs", "requeue", job, 0, 21), d)
        self.assertEqual(d["exclude"], host)
        self.assertTrue(d["resume_from"].endswith("checkpoints/step-00000004.h5"), d)
        # The follow-up job: on one node it stays pending, excluding the node, with the fault not passed on.
        follow = d["next_job"]
        info = job_info(follow)
        self.assertEqual(info["ExcNodeList"], host, info)
        self.assertIn(info["JobState"], ("PENDING", "CANCELLED"), info)
        command = subprocess.run(["scontrol", "show", "job", follow], env=slurm_env(), capture_output=True,
                                 text=True).stdout
        self.assertIn("train.sbatch " + run_dir, command)
        self.assertNotIn("--inject", command)
        subprocess.run(["scancel", follow], env=slurm_env(), check=True)
        # The continuation (as the follow-up would run on a healthy node), and a clean run.
        job2 = sbatch(["-n", "3", "-O", "-o", self.path("cont-%j.out"), os.path.join(JOBS, "train.sbatch"), run_dir]
                      + SIZE, cwd=self.tmp,
                      extra=dict(overcommit, CULPRIT_RESTART="1", CULPRIT_EXCLUDE=host,
                                 CULPRIT_RESUME_FROM=d["resume_from"]))
        state, code = wait(job2)
        self.assertEqual((state, code), ("COMPLETED", 0), open(self.path("cont-%s.out" % job2)).read())
        self.assertEqual(self.decisions(run_dir)[-1]["decision"], "done")
        clean = self.path("clean")
        res = run(["train"] + SIZE, world=2, run_dir=clean)
        self.assertEqual(res.code, 0, res.err)
        final = "checkpoints/step-00000008.h5"
        same = run(["diff", os.path.join(clean, final), os.path.join(run_dir, final)])
        self.assertEqual(same.code, 0, same.out)
        # Negative control: the faulty job's own state (NaN on rank 1 from step 5) is not a clean one.
        faulty = self.path("faulty")
        res = run(["train"] + SIZE + ["--on-detect", "warn", "--detect-nonfinite", "false", "--inject",
                   "step=5,rank=1,layer=fc2,index=3,phase=grad,kind=scale,factor=2,mode=persistent"],
                  world=3, run_dir=faulty)
        differs = run(["diff", os.path.join(clean, final), os.path.join(faulty, final)])
        self.assertEqual(differs.code, 5, differs.out)

    def resumed_on_two(self, name, drop_early_checkpoints, recorded_host=None):
        """A run trained on 3 ranks with a silent fault on rank 2 at step 5 (one micro-shard's gradient,
        reduced into every replica: nothing fires), resumed by train.sbatch on 2 ranks (a node lost)
        with a spike detector tight enough to fire on healthy steps; optionally with the checkpoints
        before step 6 deleted first (a user freeing space). recorded_host: the first part runs under
        mpirun in a UTS namespace whose host name it is, so the run records its ranks there."""
        run_dir = self.path(name)
        shape = ["--keep-last", "10", "--global-batch", "24", "--micro-shards", "4", "--samples", "96", "--quiet",
                 "--checkpoint-every", "2"]
        first = ["--steps", "6"] + shape + \
            ["--inject", "step=5,rank=2,layer=fc1,index=3,phase=grad,kind=bitflip,bit=22,mode=transient"]
        if recorded_host is None:
            job = sbatch(["-n", "3", "-O", "-o", self.path(name + "-a-%j.out"), os.path.join(JOBS, "train.sbatch"),
                          run_dir] + first, cwd=self.tmp, extra={"CULPRIT_SRUN_ARGS": "-O"})
            self.assertEqual(wait(job), ("COMPLETED", 0), open(self.path(name + "-a-%s.out" % job)).read())
        else:
            # Each rank renames its own namespace's host before it becomes culprit (mpirun itself
            # refuses a node name that is not a plain host name).
            rename = "import os, socket, sys; socket.sethostname(sys.argv[1]); os.execvp(sys.argv[2], sys.argv[2:])"
            res = subprocess.run(MPIRUN + ["-np", "3", "unshare", "--uts", PY, "-c", rename, recorded_host,
                                           os.path.abspath(CULPRIT), "train", "--run-dir", run_dir] + first,
                                 capture_output=True, text=True, timeout=300)
            self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        if drop_early_checkpoints:
            for step in (0, 2, 4):
                os.remove(os.path.join(run_dir, "checkpoints", "step-%08d.h5" % step))
        job = sbatch(["-n", "2", "-O", "-o", self.path(name + "-b-%j.out"), os.path.join(JOBS, "train.sbatch"),
                      run_dir, "--steps", "20"] + shape +
                     ["--spike-window", "4", "--spike-z", "0.0001", "--spike-ratio", "0.0001", "--spike-action", "halt"],
                     cwd=self.tmp, extra={"CULPRIT_SRUN_ARGS": "-O", "CULPRIT_SBATCH_ARGS": "-O"})
        state, code = wait(job)
        out = open(self.path(name + "-b-%s.out" % job)).read()
        return run_dir, job, state, code, out

    def test_train_excludes_a_host_the_record_blames_though_not_rerun(self):
        # The bisection (on the 2 ranks of the resumed job) finds step 5's micro-shard of rank 2
        # differing; rank 2 is outside its world: hardware-unconfirmed (26), the host excluded.
        run_dir, job, state, code, out = self.resumed_on_two("unconfirmed", False)
        self.assertEqual((state, code), ("FAILED", 26), out)
        diag = json.load(open(os.path.join(run_dir, "diagnosis.json")))
        self.assertEqual((diag["verdict"], diag["step"], diag["rank"], diag["reruns"]),
                         ("hardware-unconfirmed", 5, 2, 0), diag)
        d = self.decisions(run_dir)[-1]
        self.assertEqual((d["decision"], d["exit_code"], d["slurm_job_id"], d["exclude"]),
                         ("requeue", 26, job, diag["host"]), d)
        self.assertTrue(d["resume_from"].endswith("checkpoints/step-00000004.h5"), d)
        self.assertEqual(job_info(d["next_job"])["ExcNodeList"], diag["host"])
        subprocess.run(["scancel", d["next_job"]], env=slurm_env(), check=True)

    def test_train_stops_without_excluding_anyone_when_inconclusive(self):
        # The same run with the checkpoints before step 6 deleted: steps 1..6 cannot be replayed, the
        # spike reproduces from step 6's state: inconclusive (25), nobody excluded, no follow-up job.
        run_dir, job, state, code, out = self.resumed_on_two("inconclusive", True)
        self.assertEqual((state, code), ("FAILED", 25), out)
        diag = json.load(open(os.path.join(run_dir, "diagnosis.json")))
        self.assertEqual(diag["verdict"], "inconclusive", diag)
        self.assertEqual([(r["from"], r["to"]) for r in diag["coverage"]["not_examined"]], [(1, 6)], diag)
        d = self.decisions(run_dir)[-1]
        self.assertEqual((d["decision"], d["exit_code"], d["slurm_job_id"]), ("stop", 25, job), d)
        self.assertEqual(d.get("exclude", ""), "", d)
        self.assertEqual(d.get("next_job", ""), "", d)

    def test_train_records_a_stop_without_a_diagnosis(self):
        # Bad input: culprit exits 2 before any diagnosis; the script still records its decision. An
        # older job's diagnosis.json in the directory is not this job's: its step and verdict are not
        # this job's decision's.
        run_dir = self.path("bad")
        plant_stale_diagnosis(run_dir, 3, short_host())
        job = sbatch(["-n", "1", "-o", self.path("bad-%j.out"), os.path.join(JOBS, "train.sbatch"), run_dir, "--steps",
                      "0"], cwd=self.tmp)
        ended = wait(job)
        out = open(self.path("bad-%s.out" % job)).read()
        self.assertEqual(ended, ("FAILED", 2), out)
        d = self.decisions(run_dir)[-1]
        self.assertEqual((d["decision"], d["step"], d["exit_code"], d["slurm_job_id"]), ("stop", -1, 2, job), d)
        self.assertNotIn("hardware-persistent", d["message"])
        self.assertIn("diagnosis.json is not this job's (written by job an-older-job", out)

    def test_train_ignores_names_in_checkpoints_that_are_not_checkpoints(self):
        # A run trained to step 4, then names planted in checkpoints/ that only look like checkpoints;
        # its continuation halts at step 5 (a persistent fault): the requeue resumes from step 4, the
        # command in a planted name never runs, every planted name is named on stderr and kept.
        run_dir = self.path("stray")
        res = run(["train", "--steps", "4"] + PARTS, world=3, run_dir=run_dir)
        self.assertEqual(res.code, 0, res.err)
        planted = ["step-9+x[$(date>pwned)].h5", "step-99999999 (copy).h5", "step-00000003.h5.tmp"]
        for name in planted:
            with open(os.path.join(run_dir, "checkpoints", name), "w") as f:
                f.write("not a checkpoint\n")
        os.symlink("step-00000002.h5", os.path.join(run_dir, "checkpoints", "step-00000003.h5"))  # a link
        overcommit = {"CULPRIT_SRUN_ARGS": "-O", "CULPRIT_SBATCH_ARGS": "-O"}
        job = sbatch(["-n", "3", "-O", "-o", self.path("stray-%j.out"), os.path.join(JOBS, "train.sbatch"), run_dir,
                      "--steps", "8"] + PARTS +
                     ["--inject", "step=5,rank=1,layer=fc2,index=3,phase=grad,kind=nan,mode=persistent"],
                     cwd=self.tmp, extra=overcommit)
        state, code = wait(job)
        out = open(self.path("stray-%s.out" % job)).read()
        self.assertEqual((state, code), ("FAILED", 21), out)
        self.assertFalse(os.path.exists(self.path("pwned")), "a command in a file name ran:\n" + out)
        self.assertFalse(os.path.exists(os.path.join(run_dir, "pwned")), out)
        d = self.decisions(run_dir)[-1]
        self.assertEqual((d["decision"], d["exit_code"], d["step"]), ("requeue", 21, 5), d)
        self.assertTrue(d["resume_from"].endswith("checkpoints/step-00000004.h5"), d)
        subprocess.run(["scancel", d["next_job"]], env=slurm_env(), check=True)
        ignored = {l for l in out.splitlines() if l.startswith("culprit jobs: ignoring ")}
        self.assertEqual(len(ignored), len(planted) + 1, out)  # one line per name (the link too)
        for name in planted:
            self.assertTrue(os.path.exists(os.path.join(run_dir, "checkpoints", name)), name)  # nothing deleted
        self.assertTrue(any("step-00000003.h5 " in l for l in ignored), ignored)

    @unittest.skipUnless(os.geteuid() == 0 and shutil.which("unshare"), "a UTS namespace needs root (CI runs as root)")
    def test_train_excludes_nobody_when_the_blamed_host_is_not_one_of_its_nodes(self):
        # As the hardware-unconfirmed case below, but the run recorded the blamed rank's host as
        # "HOST,culprit-spare": as an --exclude list that is every node of the cluster. It is not a
        # plain host name of this job's nodes: stop, nobody excluded, no follow-up job.
        listed = short_host() + ",culprit-spare"
        run_dir, job, state, code, out = self.resumed_on_two("listhost", False, recorded_host=listed)
        self.assertEqual((state, code), ("FAILED", 26), out)
        diag = json.load(open(os.path.join(run_dir, "diagnosis.json")))
        self.assertEqual((diag["verdict"], diag["rank"], diag["host"], diag["slurm_job_id"]),
                         ("hardware-unconfirmed", 2, listed, job), diag)
        d = self.decisions(run_dir)[-1]
        self.assertEqual((d["decision"], d["exit_code"], d["slurm_job_id"], d["host"]), ("stop", 26, job, ""), d)
        self.assertEqual((d.get("exclude", ""), d.get("next_job", "")), ("", ""), d)
        self.assertIn("'%s', which is not a plain host name of this job's nodes (%s)" % (listed, short_host()),
                      d["message"])

    @unittest.skipUnless(can_mount(), "a tmpfs for the full filesystem needs root (CI runs as root)")
    def test_a_diagnosis_that_fails_on_a_full_disk_exits_6_and_no_stale_one_is_used(self):
        # The run lives on a small tmpfs: trained to step 4, then an older job's diagnosis.json is
        # planted, blaming this host at step 3. train.sbatch resumes; a spot-check mismatch halts step
        # 5 (exit 10) and the diagnosis starts; as soon as it says so (stderr: "culprit: diagnosing")
        # the test fills the filesystem, so what the diagnosis writes does not fit (ENOSPC). The exit
        # is 6, not the halt's 10, in one line; the stale diagnosis is gone; the job stops excluding
        # nobody (before: exit 10, the stale host excluded, a resume from step 2).
        disk = self.path("disk")
        os.makedirs(disk)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", disk], check=True)
        try:
            run_dir = os.path.join(disk, "run")
            res = run(["train", "--steps", "4"] + PARTS, world=3, run_dir=run_dir)
            self.assertEqual(res.code, 0, res.err)
            plant_stale_diagnosis(run_dir, 3, short_host())
            fault = ["--spot-check", "1", "--inject",
                     "step=5,rank=1,layer=fc1,index=2,phase=forward,kind=bitflip,bit=4,mode=persistent"]
            job = sbatch(["-n", "3", "-O", "-o", self.path("full-%j.out"), os.path.join(JOBS, "train.sbatch"),
                          run_dir, "--steps", "8"] + PARTS + fault, cwd=self.tmp,
                         extra={"CULPRIT_SRUN_ARGS": "-O", "CULPRIT_SBATCH_ARGS": "-O"})
            log = self.path("full-%s.out" % job)
            end = time.time() + 300
            while time.time() < end and not (os.path.exists(log) and "culprit: diagnosing" in open(log).read()):
                time.sleep(0.02)
            self.assertIn("culprit: diagnosing", open(log).read())
            filler = os.path.join(disk, "filler")  # outside the run directory: the "other" data
            fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
            try:
                v = os.statvfs(disk)
                try:
                    os.posix_fallocate(fd, 0, v.f_bavail * v.f_frsize)
                except OSError:
                    pass
                while True:
                    try:
                        os.write(fd, b"\0" * 4096)
                    except OSError:
                        break
            finally:
                os.close(fd)
            state, code = wait(job)
            out = open(log).read()
            os.remove(filler)
            self.assertEqual((state, code), ("FAILED", 6), out)
            failed = [l for l in out.splitlines() if l.startswith("culprit: error: diagnosing the halt failed")]
            self.assertEqual(len(failed), 1, out)
            self.assertIn("(exit 6, not the halt's 10)", failed[0])
            self.assertIn("No space left on device", failed[0])
            for marker in CRASH_MARKERS:
                self.assertNotIn(marker, out)
            self.assertIn("culprit jobs: stop (exit 6)", out)
            self.assertNotIn("culprit jobs: requeue", out)
            # No stale diagnosis: none, or this job's own (its record written before its page failed).
            path = os.path.join(run_dir, "diagnosis.json")
            if os.path.exists(path):
                diag = json.load(open(path))
                self.assertEqual((diag["slurm_job_id"], diag["step"]), (job, 5), diag)
            # The decision, when the full disk let it be recorded, excludes nobody.
            for d in self.decisions(run_dir):
                if d["slurm_job_id"] == job:
                    self.assertEqual((d["decision"], d["exit_code"], d.get("exclude", ""), d["host"]),
                                     ("stop", 6, "", ""), d)
        finally:
            subprocess.run(["umount", disk], check=False)

    def test_postmortem_job_writes_the_diagnosis(self):
        run_dir = self.path("silent")
        res = run(["train"] + SIZE + ["--on-detect", "warn", "--inject",
                   "step=5,rank=0,layer=fc1,index=3,phase=grad,kind=bitflip,bit=22,mode=persistent"],
                  world=3, run_dir=run_dir)
        self.assertEqual(res.code, 0, res.err)
        job = sbatch(["-n", "3", "-O", "-o", self.path("pm-%j.out"), os.path.join(JOBS, "postmortem.sbatch"),
                      run_dir], cwd=self.tmp, extra={"CULPRIT_SRUN_ARGS": "-O"})
        state, code = wait(job)
        out = open(self.path("pm-%s.out" % job)).read()
        self.assertEqual((state, code), ("FAILED", 21), out)
        diag = json.load(open(os.path.join(run_dir, "diagnosis.json")))
        self.assertEqual((diag["verdict"], diag["step"], diag["phase"], diag["layer"], diag["rank"]),
                         ("hardware-persistent", 5, "grad", "fc1", 0), diag)
        self.assertTrue(os.path.exists(os.path.join(run_dir, "diagnosis.html")))
        self.assertIn("verdict hardware-persistent", out)
        d = self.decisions(run_dir)[-1]
        self.assertEqual((d["decision"], d["slurm_job_id"], d["exit_code"], d["step"]), ("postmortem", job, 21, 5), d)

    @unittest.skipUnless(PKG, "the Python package was not built (CULPRIT_PYTHON_DIR unset)")
    def test_python_run_under_srun_and_its_postmortem_job(self):
        run_dir = self.path("py")
        spec = "step=3,rank=1,layer=body.4,index=5,phase=forward,kind=bitflip,bit=22"
        env = slurm_env({"PYTHONPATH": PKG, "CULPRIT_PYTHON_DIR": PKG})
        res = subprocess.run(["srun", "-O", "--mpi=pmix", "-n", "2", sys.executable,
                              os.path.join(ROOT, "examples", "train_mlp.py"), "--run-dir", run_dir, "--steps", "6",
                              "--global-batch", "32", "--micro-shards", "4", "--checkpoint-every", "2",
                              "--on-detect", "warn", "--inject", spec, "--quiet"],
                             cwd=self.tmp, env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        job = sbatch(["-n", "2", "-O", "-o", self.path("pm-%j.out"), os.path.join(JOBS, "postmortem.sbatch"),
                      run_dir], cwd=self.tmp, extra={"CULPRIT_SRUN_ARGS": "-O", "CULPRIT_PYTHON_DIR": PKG})
        state, code = wait(job)
        out = open(self.path("pm-%s.out" % job)).read()
        self.assertEqual((state, code), ("FAILED", 20), out)
        diag = json.load(open(os.path.join(run_dir, "diagnosis.json")))
        self.assertEqual((diag["verdict"], diag["step"], diag["phase"], diag["layer"], diag["rank"]),
                         ("hardware-transient", 3, "forward", "body.4", 1), diag)

    def test_audit_array_and_merge_job_cover_every_interval(self):
        run_dir = self.path("audited")
        res = run(["train"] + SHAPE + ["--checkpoint-every", "1", "--on-detect", "warn", "--inject",
                   "step=6,rank=1,layer=fc2,index=1,phase=forward,kind=bitflip,bit=20"], world=2, run_dir=run_dir)
        self.assertEqual(res.code, 0, res.err)
        out = subprocess.run([os.path.join(JOBS, "submit-audit.sh"), run_dir, "3", "-o", self.path("audit-%j.out")],
                             cwd=self.tmp, env=slurm_env(), capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        ids = dict(kv.split("=") for kv in out.stdout.split())
        state, code = wait(ids["merge"])
        self.assertEqual((state, code), ("FAILED", 5), job_info(ids["merge"]))
        report = json.load(open(os.path.join(run_dir, "audit.json")))
        self.assertEqual(report["shares"], 3)
        self.assertEqual([(i["from"], i["to"]) for i in report["intervals"]], [(s, s + 1) for s in range(8)])
        self.assertEqual(sorted({i["share"] for i in report["intervals"]}), [0, 1, 2])
        bad = [(i["from"], i["to"]) for i in report["intervals"] if i["verdict"] != "reproduced"]
        self.assertEqual(bad, [(5, 6)], report)  # negative control: the other intervals reproduce
        self.assertIn("step 6", report["first_bad"])

    def test_screen_job_prints_the_exclude_list(self):
        good = sbatch(["-o", self.path("screen-%j.out"), os.path.join(JOBS, "screen.sbatch")], cwd=self.tmp,
                      extra={"CULPRIT_SCREEN_SECONDS": "1"})
        bad = sbatch(["-o", self.path("screen-%j.out"), os.path.join(JOBS, "screen.sbatch"), "--inject",
                      "rank=0,layer=matmul,step=3,kind=bitflip,bit=2,index=9"], cwd=self.tmp,
                     extra={"CULPRIT_SCREEN_SECONDS": "1"})
        self.assertEqual(wait(good), ("COMPLETED", 0))
        self.assertEqual(open(self.path("screen-%s.out" % good)).read().splitlines()[-1], "--exclude=")
        self.assertEqual(wait(bad), ("FAILED", 10))
        host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
        self.assertEqual(open(self.path("screen-%s.out" % bad)).read().splitlines()[-1], "--exclude=" + host)
        report = json.load(open(os.path.join(self.tmp, "screen-%s.json" % bad)))
        self.assertEqual(report["devices"][0]["verdict"], "fail")
        self.assertEqual(report["devices"][0]["failures"]["matmul"], 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
