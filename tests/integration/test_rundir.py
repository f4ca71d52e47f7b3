"""The run directory is culprit's to guard (docs/architecture.md, "Security model"): one writer at a
time (a lock that a crash releases), no link inside it followed, nothing outside it written or
deleted, a new run only in a directory holding nothing culprit writes (full, failing and read-only
disks: test_disk.py). Real things throughout: concurrent mpirun jobs, real symbolic links."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import (CULPRIT, EXIT_DAMAGED, EXIT_IO, EXIT_USAGE, MPIRUN, SMALL_MLP as ARGS, TempDirTest,  # noqa: E402
                             metric_steps, run, tree_digest)

FOREIGN = "'%s' belongs to another run (run_id "  # a foreign checkpoint or trace, refused by name


def start(args, world, run_dir):
    cmd = MPIRUN + ["-np", str(world), CULPRIT] + list(args) + ["--run-dir", run_dir]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for_steps(run_dir, n, proc, limit=120):
    t0 = time.time()
    while time.time() - t0 < limit and proc.poll() is None:
        try:
            if len(metric_steps(run_dir)) >= n:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError("the job did not reach step %d" % n)


class Lock(TempDirTest):
    def newest_checkpoint(self, d):
        names = [n for n in os.listdir(os.path.join(d, "checkpoints")) if n.endswith(".h5")]
        return max(int(n[5:13]) for n in names)

    def test_a_second_writer_is_refused_while_the_first_runs(self):
        d = self.path("run")
        # Far longer than the test: it is killed once the refused jobs have run.
        first = start(["train", "--steps", "200000", "--checkpoint-every", "100"] + ARGS, 2, d)
        try:
            wait_for_steps(d, 5, first)
            with open(os.path.join(d, ".lock")) as f:
                holder = f.read()
            self.assertIn("culprit train (host ", holder)
            for args in (["train", "--resume"] + ARGS, ["bisect"], ["audit"]):
                with self.subTest(args=args[0]):
                    self.assertIsNone(first.poll(), "the first job ended before the test could race it")
                    r = run(args, world=2, run_dir=d)
                    self.assertEqual(r.code, EXIT_USAGE, r.err)
                    self.assertIn("is in use by culprit train (host ", r.err)
                    self.assertIn("one job writes a run at a time", r.err)
                    self.assertNotIn("Traceback", r.err)
            # Read-only commands never need the lock.
            v = run(["verify", os.path.join(d, "checkpoints", "step-00000000.h5")])
            self.assertEqual(v.code, 0, v.out + v.err)
            self.assertNotIn("in use", v.out + v.err)
            self.assertIsNone(first.poll())
        finally:
            subprocess.run(["pkill", "-9", "-s", str(first.pid)])
            first.communicate(timeout=60)
        # The refused jobs changed nothing: resumed, every step is there once, in order; no trace
        # was moved aside; the run verifies.
        target = self.newest_checkpoint(d) + 10
        r = run(["train", "--resume", "--steps", str(target)] + ARGS, world=2, run_dir=d)
        self.assertEqual(r.code, 0, r.err)
        self.assertEqual(metric_steps(d), list(range(1, target + 1)))
        self.assertEqual(sorted(os.listdir(os.path.join(d, "trace"))), ["rank-00000.h5", "rank-00001.h5"])
        v = run(["verify", d])
        self.assertEqual(v.code, 0, v.out + v.err)

    def test_the_lock_of_a_killed_job_is_free_again(self):
        d = self.path("run")
        first = start(["train", "--steps", "200000", "--checkpoint-every", "20"] + ARGS, 2, d)
        wait_for_steps(d, 45, first)
        subprocess.run(["pkill", "-9", "-s", str(first.pid)])
        first.wait()
        self.assertNotEqual(first.returncode, 0)
        with open(os.path.join(d, ".lock")) as f:
            stale = f.read()
        self.assertIn("culprit train", stale)  # the file stays; the kernel dropped the lock
        target = self.newest_checkpoint(d) + 10
        r = run(["train", "--resume", "--steps", str(target)] + ARGS, world=2, run_dir=d)
        self.assertEqual(r.code, 0, r.err)
        with open(os.path.join(d, ".lock")) as f:
            self.assertNotEqual(f.read(), stale)  # taken by the resumed job
        self.assertEqual(metric_steps(d), list(range(1, target + 1)))

    def test_audit_takes_a_shared_lock(self):
        # The lock held from here (another process's open file): shared, an audit runs and a
        # writer is refused; exclusive, the audit is refused too.
        import fcntl
        self.train("run", ["--steps", "4", "--checkpoint-every", "2"] + ARGS[:-1])
        d = self.path("run")
        with open(os.path.join(d, ".lock"), "r+") as f:
            f.write("a test (shared)\n")
            f.flush()
            fcntl.flock(f, fcntl.LOCK_SH)
            a = run(["audit"], run_dir=d)
            self.assertEqual(a.code, 0, a.err)
            t = run(["train", "--resume", "--steps", "6"] + ARGS, run_dir=d)
            self.assertEqual(t.code, EXIT_USAGE, t.err)
            self.assertIn("is in use by", t.err)
            fcntl.flock(f, fcntl.LOCK_EX)
            a = run(["audit"], run_dir=d)
            self.assertEqual(a.code, EXIT_USAGE, a.err)
            self.assertIn("is in use by", a.err)

    def test_audit_shares_run_side_by_side(self):
        d = self.path("run")
        self.train("run", ["--steps", "6", "--checkpoint-every", "2"] + ARGS[:-1])
        jobs = [start(["audit", "--share", "%d/2" % i], 1, d) for i in range(2)]
        for i, j in enumerate(jobs):
            out, err = j.communicate(timeout=300)
            self.assertEqual(j.returncode, 0, "share %d: %s" % (i, err))
            self.assertNotIn("in use", err)


class Links(TempDirTest):
    def setUp(self):
        super().setUp()
        os.makedirs(self.path("outside"))
        self.victim = self.path("outside", "victim.txt")
        with open(self.victim, "w") as f:
            f.write("precious\n")
        self.victim_before = tree_digest(self.path("outside"))

    def base(self, name="run", steps=4):
        self.train(name, ["--steps", str(steps), "--checkpoint-every", "2"] + ARGS[:-1], world=2)
        return self.path(name)

    def link(self, path):
        if os.path.lexists(path):
            os.remove(path)
        os.symlink(self.victim, path)

    def test_no_link_inside_a_run_directory_is_written_through(self):
        d = self.base()
        # run.json, metrics.jsonl and incidents.jsonl are read too: their links point at copies.
        open(os.path.join(d, "incidents.jsonl"), "w").close()
        for name in ("run.json", "metrics.jsonl", "incidents.jsonl"):
            shutil.copy(os.path.join(d, name), self.path("outside", name))
            os.remove(os.path.join(d, name))
            os.symlink(self.path("outside", name), os.path.join(d, name))
        outside_before = tree_digest(self.path("outside"))
        replaced = ["diagnosis.json", "diagnosis.html", "audit.json.tmp",
                    "checkpoints/step-00000006.h5.tmp"]
        appended = ["checkpoints.jsonl", "incidents.log", "incidents.jsonl"]
        for name in replaced + appended[:2]:
            self.link(os.path.join(d, name))
        resume = ["train", "--resume", "--steps", "6", "--checkpoint-every", "2"] + ARGS
        # The records culprit appends to are refused as links when the job starts, before any write.
        r = run(resume, world=2, run_dir=d)
        self.assertEqual(r.code, EXIT_USAGE, r.err)
        self.assertIn("incidents.jsonl' is a symbolic link: culprit does not follow links inside a run directory",
                      r.err)
        self.assertEqual(tree_digest(self.path("outside")), outside_before)
        for name in appended:
            os.remove(os.path.join(d, name))
        r = run(resume, world=2, run_dir=d)
        self.assertEqual(r.code, 0, r.err)
        self.assertEqual(metric_steps(d), list(range(1, 7)))
        for args in (["bisect"], ["audit"]):
            r = run(args, world=2, run_dir=d)
            self.assertEqual(r.code, 0, args[0] + ": " + r.err)
        for name in appended:  # planted while no job runs: an append refuses them too
            self.link(os.path.join(d, name))
        r = run(["log", d, "--decision", "stop", "--message", "test"])
        self.assertEqual(r.code, EXIT_USAGE, r.err)
        self.assertIn("is a symbolic link: culprit does not follow links inside a run directory", r.err)
        self.assertEqual(tree_digest(self.path("outside")), outside_before)
        for name in ["run.json", "metrics.jsonl", "diagnosis.json", "diagnosis.html",
                     "checkpoints/step-00000006.h5"]:
            p = os.path.join(d, name)
            self.assertTrue(os.path.isfile(p) and not os.path.islink(p), name)  # replaced, not written through
        for name in ["audit.json.tmp", "checkpoints/step-00000006.h5.tmp"]:
            self.assertFalse(os.path.lexists(os.path.join(d, name)), name)
        for name in appended:
            self.assertTrue(os.path.islink(os.path.join(d, name)), name)  # refused, left as it was

    def test_linked_directories_and_traces_are_refused(self):
        for what in ("checkpoints", "trace", "trace/rank-00000.h5"):
            with self.subTest(what=what):
                d = self.base("r-" + what.replace("/", "-"))
                target = self.path("outside", what.replace("/", "-"))
                shutil.move(os.path.join(d, what), target)
                os.symlink(target, os.path.join(d, what))
                before = tree_digest(self.path("outside"))
                # --keep-last 1: retention would delete through a linked checkpoints/.
                r = run(["train", "--resume", "--steps", "8", "--checkpoint-every", "2", "--keep-last", "1"] + ARGS,
                        world=2, run_dir=d)
                self.assertEqual(r.code, EXIT_USAGE, r.err)
                self.assertIn("is a symbolic link", r.err)
                self.assertEqual(len([l for l in r.err.splitlines() if l.startswith("culprit: error")]), 1, r.err)
                self.assertEqual(tree_digest(self.path("outside")), before)

    def test_a_new_run_needs_a_directory_holding_nothing_culprit_writes(self):
        d = self.base()
        # A leftover run without run.json and metrics.jsonl: its traces and checkpoints stay.
        os.remove(os.path.join(d, "run.json"))
        os.remove(os.path.join(d, "metrics.jsonl"))
        before = tree_digest(d)
        r = run(["train", "--steps", "8", "--keep-last", "1"] + ARGS, world=2, run_dir=d)
        self.assertEqual(r.code, EXIT_USAGE, r.err)
        self.assertIn("already holds a run or part of one ('checkpoints')", r.err)
        after = tree_digest(d)
        after.pop(".lock", None)
        before.pop(".lock", None)
        self.assertEqual(after, before)
        # Files culprit never touches do not make a directory used (a job's output, notes).
        fresh = self.path("fresh")
        os.makedirs(fresh)
        for n in ("slurm-1.out", "notes.txt"):
            with open(os.path.join(fresh, n), "w") as f:
                f.write("mine\n")
        self.train("fresh", ["--steps", "2"] + ARGS[:-1])
        for n in ("slurm-1.out", "notes.txt"):
            with open(os.path.join(fresh, n)) as f:
                self.assertEqual(f.read(), "mine\n")


class Identity(TempDirTest):
    """Every checkpoint and trace carries the run's identity (run.json "run_id"); a foreign one is
    refused by name. Two runs of the same configuration: only the identity tells them apart (the
    reported case: a checkpoint of another run renamed in as a later step was "reproduced"). Found
    in the run directory, a foreign or renamed file is damage to the run: exit 4 from every command
    (verify, train --resume, replay, audit, bisect alike); named by --resume-from it is bad input (2)."""

    def two_runs(self):
        self.train("a", ["--steps", "4", "--checkpoint-every", "2"] + ARGS[:-1], world=2)
        self.train("b", ["--steps", "8", "--checkpoint-every", "2", "--keep-last", "10"] + ARGS[:-1], world=2)
        with open(self.path("a", "run.json")) as f, open(self.path("b", "run.json")) as g:
            ids = json.load(f)["run_id"], json.load(g)["run_id"]
        self.assertRegex(ids[0], "^[0-9a-f]{16}$")
        self.assertNotEqual(ids[0], ids[1])
        return self.path("a"), self.path("b")

    def test_a_foreign_checkpoint_is_refused_by_name(self):
        a, b = self.two_runs()
        v = run(["verify", a])
        self.assertEqual(v.code, 0, v.out)  # negative control: the run itself verifies
        foreign = os.path.join(a, "checkpoints", "step-00000008.h5")
        shutil.copy(os.path.join(b, "checkpoints", "step-00000008.h5"), foreign)
        self.assert_refused(["train", "--resume", "--steps", "10", "--run-dir", a] + ARGS, EXIT_DAMAGED,
                            FOREIGN % foreign)
        self.assert_refused(["audit", "--run-dir", a], EXIT_DAMAGED, FOREIGN % foreign)
        # Named by the user, the same file is an input of the wrong run: a bad option.
        self.assert_refused(["train", "--resume-from", foreign, "--steps", "10", "--run-dir", a] + ARGS, EXIT_USAGE,
                            FOREIGN % foreign)
        v = run(["verify", a])
        self.assertEqual(v.code, EXIT_DAMAGED, v.out + v.err)
        self.assertIn(FOREIGN % foreign, v.out + v.err)
        os.remove(foreign)
        # The replay of step 3 starts from step 2's checkpoint: b's, in place of a's own.
        swapped = os.path.join(a, "checkpoints", "step-00000002.h5")
        shutil.copy(os.path.join(b, "checkpoints", "step-00000002.h5"), swapped)
        self.assert_refused(["replay", "--step", "3", "--run-dir", a], EXIT_DAMAGED, FOREIGN % swapped)
        os.remove(swapped)
        shutil.copy(os.path.join(b, "checkpoints", "step-00000008.h5"), foreign)
        # Renamed: step 8's file under step 6's name.
        os.rename(foreign, os.path.join(a, "checkpoints", "step-00000006.h5"))
        v = run(["verify", a])
        self.assertEqual(v.code, EXIT_DAMAGED, v.out)
        self.assertIn("holds step 8, not the step its name says (6)", v.out)

    def test_a_foreign_trace_is_refused_by_name(self):
        a, b = self.two_runs()
        foreign = os.path.join(a, "trace", "rank-00001.h5")
        shutil.copy(os.path.join(b, "trace", "rank-00001.h5"), foreign)
        for args in (["train", "--resume", "--steps", "6"] + ARGS, ["bisect"], ["replay", "--step", "3"],
                     ["audit"]):
            with self.subTest(args=args[0]):
                self.assert_refused(args + ["--run-dir", a], EXIT_DAMAGED, FOREIGN % foreign)
        v = run(["verify", a])
        self.assertEqual(v.code, EXIT_DAMAGED, v.out + v.err)
        self.assertIn(FOREIGN % foreign, v.out + v.err)
        # bisect's verdict says the same: a damaged record, no host blamed.
        with open(os.path.join(a, "diagnosis.json")) as f:
            diag = json.load(f)
        self.assertEqual((diag["verdict"], diag["rank"], diag["host"]), ("damaged-record", -1, ""))
        self.assertIn(FOREIGN % foreign, diag["evidence"][-1])
        with open(os.path.join(b, "trace", "rank-00001.h5"), "rb") as f, open(foreign, "rb") as g:
            self.assertEqual(f.read(), g.read())  # refused, not moved aside or rewritten


class VerifyRun(TempDirTest):
    """`verify RUN` checks the run as a whole, not only each file (each case fails its own way)."""

    def test_an_incomplete_or_inconsistent_run_fails_verify(self):
        def broken(name, how):
            self.train(name, ["--steps", "6", "--checkpoint-every", "2"] + ARGS[:-1], world=2)
            d = self.path(name)
            self.assertEqual(run(["verify", d]).code, 0)
            how(d)
            return run(["verify", d])

        def twice(d):  # what two writers left: steps 3..4 again
            with open(os.path.join(d, "metrics.jsonl")) as f:
                lines = f.readlines()
            with open(os.path.join(d, "metrics.jsonl"), "w") as f:
                f.writelines(lines[:4] + lines[2:])

        def other_loss(d):
            with open(os.path.join(d, "metrics.jsonl")) as f:
                lines = [json.loads(l) for l in f]
            lines[2]["loss"] = lines[2]["loss"] * 1.5
            with open(os.path.join(d, "metrics.jsonl"), "w") as f:
                f.writelines(json.dumps(l) + "\n" for l in lines)

        cases = {
            "no-checkpoints": (lambda d: shutil.rmtree(os.path.join(d, "checkpoints")), "holds no checkpoint"),
            "no-trace": (lambda d: os.remove(os.path.join(d, "trace", "rank-00001.h5")),
                         "the trace of rank 1 is missing"),
            "repeated": (twice, "step 3 follows step 4"),
            "loss": (other_loss, "step 3: loss"),
        }
        for name, (how, needle) in cases.items():
            with self.subTest(case=name):
                v = broken(name, how)
                self.assertEqual(v.code, EXIT_DAMAGED, v.out + v.err)
                self.assertIn(needle, v.out)


class TornTails(TempDirTest):
    def test_resume_cuts_the_torn_tails_of_the_records(self):
        # What a crash or a full disk leaves mid-append: the records' last lines without newline.
        self.train("run", ["--steps", "4", "--checkpoint-every", "2"] + ARGS[:-1], world=2)
        d = self.path("run")
        r = run(["log", d, "--decision", "stop", "--message", "before"])
        self.assertEqual(r.code, 0, r.err)
        for name, torn in (("incidents.jsonl", '{"record": "incident", "ver'), ("incidents.log", "2026-12-02 step"),
                           ("checkpoints.jsonl", '{"step": 4, "by')):
            with open(os.path.join(d, name), "a") as f:
                f.write(torn)
        r = run(["train", "--resume", "--steps", "6", "--checkpoint-every", "2"] + ARGS, world=2, run_dir=d)
        self.assertEqual(r.code, 0, r.err)
        r = run(["log", d, "--decision", "stop", "--message", "after"])
        self.assertEqual(r.code, 0, r.err)
        for name in ("incidents.jsonl", "checkpoints.jsonl"):
            with open(os.path.join(d, name)) as f:
                [json.loads(l) for l in f]  # every line a record again
        r = run(["report", d, "--field", "incident.message", "--which", "last"])
        self.assertEqual(r.code, 0, r.err)
        self.assertIn("after", r.out)


def small_run(test, name="run", world=2, steps=4):
    """A finished run of `steps` steps checkpointed every 2 (its checkpoints and trace intact)."""
    test.train(name, ["--steps", str(steps), "--checkpoint-every", "2"] + ARGS[:-1], world=world)
    return test.path(name)


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


class DamagedMetrics(TempDirTest):
    """Only the last line of metrics.jsonl may be torn (a crash or a full disk mid-append): --resume
    cuts that one (test_crash.TornTail). A damaged line with lines after it is damage: exit 4 naming
    the line, and nothing of the file is deleted."""

    def test_a_damaged_line_in_the_middle_is_refused_not_cut(self):
        d = small_run(self)
        path = os.path.join(d, "metrics.jsonl")
        with open(path) as f:
            lines = f.readlines()
        self.assertEqual(len(lines), 4)
        for i, bad in enumerate(('{"step": 2, "lo\n', "garbage\n", '{"loss": 1.0}\n')):
            with self.subTest(bad=bad):
                with open(path, "w") as f:
                    f.writelines(lines[:1] + [bad] + lines[2:])
                before = read_bytes(path)
                self.assert_refused(["train", "--resume", "--steps", "6", "--run-dir", d] + ARGS, EXIT_DAMAGED,
                                    "metrics.jsonl' line 2 ", "only the last line may be torn")
                self.assertEqual(read_bytes(path), before)  # nothing lost
                v = run(["verify", d])
                self.assertEqual(v.code, EXIT_DAMAGED, v.out + v.err)
                self.assertIn("metrics.jsonl' line 2 is not a metrics line, and lines follow it", v.out)
        # Negative control: the same damage on the last line is a torn tail, cut by --resume.
        with open(path, "w") as f:
            f.writelines(lines + ['{"step": 5, "lo\n'])
        r = run(["train", "--resume", "--steps", "6"] + ARGS, world=2, run_dir=d)
        self.assertEqual(r.code, 0, r.err)
        self.assertEqual(metric_steps(d), [1, 2, 3, 4, 5, 6])


class EditedRunJson(TempDirTest):
    """Every checkpoint holds the configuration the run trained with; run.json is a text file. A
    hand-edited run.json is refused where a checkpoint is opened (resume, bisect, replay, audit):
    exit 4 naming the option, never a verdict about the edited configuration's bits."""

    def test_an_edited_critical_option_is_refused_everywhere(self):
        d = small_run(self)
        path = os.path.join(d, "run.json")
        with open(path) as f:
            j = json.load(f)
        self.assertRegex(j["config"], r"(?m)^lr = 0\.1$")
        original = read_bytes(path)
        # Negative control: untouched, every command runs.
        self.assertEqual(run(["replay", "--step", "3"], world=2, run_dir=d).code, 0)
        j["config"] = re.sub(r"(?m)^lr = 0\.1$", "lr = 0.2", j["config"])
        with open(path, "w") as f:
            json.dump(j, f)
        for args in (["train", "--resume", "--steps", "6"] + ARGS, ["replay", "--step", "3"], ["audit"]):
            with self.subTest(args=args[0]):
                self.assert_refused(args + ["--run-dir", d], EXIT_DAMAGED, "run.json' says --lr 0.2 but checkpoint",
                                    "was written with --lr 0.1", "run.json was edited")
        b = run(["bisect", "--run-dir", d], world=2, use_mpirun=True)
        self.assertEqual(b.code, EXIT_DAMAGED, b.out + b.err)
        self.assertIn("says --lr 0.2 but checkpoint", b.out + b.err)
        self.assertNotIn("software-nondeterminism", b.out)
        # Put back, the run resumes bitwise as before.
        with open(path, "wb") as f:
            f.write(original)
        r = run(["train", "--resume", "--steps", "6"] + ARGS, world=2, run_dir=d)
        self.assertEqual(r.code, 0, r.err)


class DamagedTraces(TempDirTest):
    """A trace is appended to on --resume: a committed row failing its checksum, or a directory under
    a trace's name, is damage (exit 4 naming it; nothing moved, cut or appended). A file a crash left
    unopenable is moved aside, said, and `verify` then fails the run, whose rank lost those rows."""

    def resume(self, d):
        return ["train", "--resume", "--steps", "6", "--run-dir", d] + ARGS

    def without_lock(self, d):
        return {k: v for k, v in tree_digest(d).items() if k != ".lock"}

    def test_a_row_failing_its_checksum_stops_the_resume(self):
        import h5py
        import numpy as np
        d = small_run(self)
        live = os.path.join(d, "trace", "rank-00001.h5")
        with h5py.File(live, "r+") as f:  # a row in the middle, before the checkpoint resumed from
            fp = f["steps/grad_fp"]
            fp[1] = fp[1] ^ np.uint64(1 << 9)
        before = self.without_lock(d)
        self.assert_refused(self.resume(d), EXIT_DAMAGED, "trace '%s' /steps row 1 (step 2) fails its checksum" % live,
                            "--resume stops")
        self.assertEqual(self.without_lock(d), before)  # nothing cut, appended or moved
        self.assertEqual(metric_steps(d), [1, 2, 3, 4])
        # A row after the checkpoint resumed from (one the resume would cut back) is damage too.
        d2 = small_run(self, "run2")
        os.remove(os.path.join(d2, "checkpoints", "step-00000004.h5"))  # the resume starts at step 2
        live2 = os.path.join(d2, "trace", "rank-00000.h5")
        with h5py.File(live2, "r+") as f:
            fp = f["steps/grad_fp"]
            fp[3] = fp[3] ^ np.uint64(1)
        self.assert_refused(self.resume(d2), EXIT_DAMAGED, "trace '%s' /steps row 3 (step 4) fails its checksum" % live2)
        self.assertEqual(metric_steps(d2), [1, 2, 3, 4])
        # Negative control: an intact run resumes.
        r = run(["train", "--resume", "--steps", "6"] + ARGS, world=2, run_dir=small_run(self, "run3"))
        self.assertEqual(r.code, 0, r.err)

    def test_a_trace_replaced_by_a_directory_is_damage_not_moved_aside(self):
        d = small_run(self)
        live = os.path.join(d, "trace", "rank-00001.h5")
        os.remove(live)
        os.makedirs(os.path.join(live, "inside"))
        before = self.without_lock(d)
        self.assert_refused(self.resume(d), EXIT_DAMAGED, "trace '%s' is a directory, not a trace file" % live)
        self.assertTrue(os.path.isdir(os.path.join(live, "inside")))
        self.assertEqual(sorted(os.listdir(os.path.join(d, "trace"))), ["rank-00000.h5", "rank-00001.h5"])
        self.assertEqual(self.without_lock(d), before)
        v = run(["verify", d])
        self.assertEqual(v.code, EXIT_DAMAGED, v.out + v.err)
        self.assertIn("'%s' is a directory" % live, v.out)
        b = run(["bisect", "--run-dir", d], world=2)  # damage to bisect too: no host blamed
        self.assertEqual(b.code, EXIT_DAMAGED, b.out + b.err)
        self.assertIn("verdict: damaged-record", b.out)
        self.assertIn("'%s' is a directory" % live, b.err)

    def test_a_trace_moved_aside_by_a_resume_fails_verify(self):
        d = small_run(self)
        live = os.path.join(d, "trace", "rank-00001.h5")
        with open(live, "wb") as f:  # what a crash inside an HDF5 flush can leave: not openable
            f.write(b"\0" * 4096)
        r = run(["train", "--resume", "--steps", "6"] + ARGS, world=2, run_dir=d)
        self.assertEqual(r.code, 0, r.err)
        self.assertIn("moved to '%s.damaged-1', a new trace starts" % live, r.err)  # said, on the job's stderr
        v = run(["verify", d])
        self.assertEqual(v.code, EXIT_DAMAGED, v.out + v.err)
        self.assertIn("'%s.damaged-1' is a trace a resume found damaged and moved aside" % live, v.out)
        self.assertIn("the trace of rank 1 ('%s') starts at step 5" % live, v.out)
        self.assertIn("its rows of steps 1..4 are missing", v.out)

    def test_a_deleted_trace_is_missing_rows_to_verify(self):
        d = small_run(self)
        os.remove(os.path.join(d, "trace", "rank-00000.h5"))
        r = run(["train", "--resume", "--steps", "6"] + ARGS, world=2, run_dir=d)
        self.assertEqual(r.code, 0, r.err)
        v = run(["verify", d])
        self.assertEqual(v.code, EXIT_DAMAGED, v.out + v.err)
        self.assertIn("the trace of rank 0", v.out)
        # Negative control: a rank that joined at a resume (a larger world) starts late by right.
        e = small_run(self, "grown")
        r = run(["train", "--resume", "--steps", "6"] + ARGS, world=3, run_dir=e)
        self.assertEqual(r.code, 0, r.err)
        v = run(["verify", e])
        self.assertEqual(v.code, 0, v.out + v.err)


class LongPaths(TempDirTest):
    """Open MPI 4.1's sharedfp/lockedfile built its lock file's name in a fixed buffer: a run
    directory over ~212 characters aborted the first checkpoint written through MPI-IO. culprit
    leaves that component out (it uses no shared file pointers); a path of any length a file system
    takes trains, checkpoints, resumes and verifies."""

    def test_a_run_directory_with_a_long_path(self):
        d = self.tmp
        while len(d) < 600:
            d = os.path.join(d, "a-run-directory-nested-deep-" + "x" * 40)
        os.makedirs(d)
        d = os.path.join(d, "run")
        self.assertGreater(len(os.path.join(d, "checkpoints", "step-00000002.h5.tmp")), 600)
        r = run(["train", "--steps", "4", "--checkpoint-every", "2"] + ARGS, world=2, run_dir=d)
        self.assertEqual(r.code, 0, r.err)
        self.assertNotIn("buffer overflow", r.err)
        self.assertEqual(sorted(os.listdir(os.path.join(d, "checkpoints"))),
                         ["step-00000000.h5", "step-00000002.h5", "step-00000004.h5"])  # nothing beside them
        r = run(["train", "--resume", "--steps", "6", "--checkpoint-every", "2"] + ARGS, world=2, run_dir=d)
        self.assertEqual(r.code, 0, r.err)
        v = run(["verify", d])
        self.assertEqual(v.code, 0, v.out + v.err)
        self.assertIn("step-00000006.h5", v.out)


class RecordFiles(TempDirTest):
    """A record is opened only if it is a regular file of a size its kind can have: a fifo never
    hangs a reader, a huge file never exhausts its memory (exit 4 naming the file, at once)."""
    REFUSAL_TIMEOUT = 60

    def fifo(self, path):
        if os.path.lexists(path):
            os.remove(path)
        os.mkfifo(path)

    def test_a_fifo_in_place_of_a_record_is_refused_at_once(self):
        d = small_run(self)
        r = run(["log", d, "--decision", "stop", "--message", "m"])
        self.assertEqual(r.code, 0, r.err)
        cases = [("incidents.jsonl", ["report", d], "incidents.jsonl' is a fifo, not a regular file"),
                 ("diagnosis.json", ["report", d, "--field", "diagnosis.verdict"], "diagnosis.json' is a fifo"),
                 ("run.json", ["replay", "--step", "3", "--run-dir", d], "run.json' is a fifo"),
                 ("run.json", ["bisect", "--run-dir", d], "run.json' is a fifo")]
        for name, args, want in cases:
            with self.subTest(name=name, command=args[0]):
                saved = self.path("saved-" + name)
                src = os.path.join(d, name)
                if os.path.exists(src) and not os.path.exists(saved):
                    shutil.copy(src, saved)
                self.fifo(src)
                self.assert_refused(args, EXIT_DAMAGED, want, world=1 if args[0] == "report" else 2)
                os.remove(src)
                if os.path.exists(saved):
                    shutil.copy(saved, src)
        # A checkpoint and a trace: verify names each and goes on, bisect refuses.
        ckpt = os.path.join(d, "checkpoints", "step-00000002.h5")
        self.fifo(ckpt)
        v = run(["verify", d], timeout=60)
        self.assertEqual(v.code, EXIT_DAMAGED, v.out + v.err)
        self.assertIn("step-00000002.h5' is a fifo, not a regular file", v.out)
        os.remove(ckpt)
        trace = os.path.join(d, "trace", "rank-00001.h5")
        shutil.copy(trace, self.path("trace"))
        self.fifo(trace)
        v = run(["verify", d], timeout=60)
        self.assertEqual(v.code, EXIT_DAMAGED, v.out + v.err)
        self.assertIn("rank-00001.h5' is a fifo", v.out)
        b = run(["bisect", "--run-dir", d], world=2, use_mpirun=True, timeout=60)
        self.assertEqual(b.code, EXIT_DAMAGED, b.out + b.err)
        self.assertIn("is a fifo", b.out + b.err)

    def test_a_huge_record_is_refused_without_reading_it(self):
        d = small_run(self, world=1)
        path = os.path.join(d, "incidents.jsonl")
        with open(path, "w") as f:
            f.truncate(4 << 30)  # sparse: 4 GiB of nothing
        self.assert_refused(["report", d], EXIT_DAMAGED, "incidents.jsonl' is 4294967296 bytes, more than",
                            world=1)
        with open(path, "w") as f:
            f.write('{"record": "incident", "version": 1, "message": "' + "x" * (2 << 20) + '"}\n')
        self.assert_refused(["report", d], EXIT_DAMAGED, "incidents.jsonl' line 1 is longer than", world=1)
        with open(os.path.join(d, "diagnosis.json"), "w") as f:
            f.truncate(1 << 40)
        os.remove(path)
        self.assert_refused(["report", d, "--field", "diagnosis.verdict"], EXIT_DAMAGED,
                            "diagnosis.json' is 1099511627776 bytes", world=1)


class LiveRun(TempDirTest):
    """A run another job is writing is "in use" (exit 2) to every command that reads it whole, never
    damaged; verify's own failures keep their exit codes (no such run 2, unreadable 6)."""

    def test_verify_and_replay_of_a_live_run_say_in_use(self):
        d = self.path("run")
        first = start(["train", "--steps", "200000", "--checkpoint-every", "10"] + ARGS, 2, d)
        try:
            wait_for_steps(d, 25, first)
            self.assertEqual(os.stat(os.path.join(d, ".lock")).st_mode & 0o777, 0o600)
            v = run(["verify", d])
            self.assertEqual(v.code, EXIT_USAGE, v.out + v.err)
            self.assertIn("is in use by culprit train (host ", v.err)
            self.assertNotIn("FAIL", v.out)
            self.assert_refused(["replay", "--step", "3", "--run-dir", d], EXIT_USAGE, "is in use by culprit train")
            self.assertIsNone(first.poll())
        finally:
            subprocess.run(["pkill", "-9", "-s", str(first.pid)])
            first.communicate(timeout=60)
        v = run(["verify", d])  # the job ended: the run is whole up to its newest checkpoint
        self.assertNotIn("in use", v.out + v.err)

    def test_the_refusal_names_the_live_holder_not_a_dead_one(self):
        import fcntl
        d = small_run(self, world=1)
        dead = subprocess.Popen(["true"])
        dead.wait()
        lock = os.path.join(d, ".lock")
        with open(lock, "r+") as f:
            f.truncate(0)
            f.write("culprit train (host %s, pid %d, since 2026-01-01T00:00:00Z)\n" % (os.uname().nodename, dead.pid))
            f.flush()
            fcntl.flock(f, fcntl.LOCK_EX)
            line = self.assert_refused(["train", "--resume", "--steps", "6", "--run-dir", d] + ARGS, EXIT_USAGE,
                                       "is in use by another process on this host: pid %d " % os.getpid(),
                                       "which has ended")
            self.assertIn("pid %d" % dead.pid, line)  # said to have ended, not blamed

    def test_verify_exit_codes_for_a_missing_or_unreadable_run(self):
        self.assert_refused(["verify", self.path("nope")], EXIT_USAGE, "does not exist", world=1)
        if os.getuid() != 0:
            self.skipTest("needs root to run verify as another user")
        d = small_run(self, world=1)
        os.chmod(self.tmp, 0o755)
        os.chmod(d, 0o700)
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", CULPRIT, "verify", d],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, EXIT_IO, r.stdout + r.stderr)
        self.assertIn("cannot read the run directory", r.stderr)
        self.assertIn("Permission denied", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
