"""culprit ledger (docs/ledger.md): the fleet's suspicion ledger, one SQLite file many jobs write at
once. The real binary: concurrent writers losing nothing, the outputs a job script and a person read
(list, explain, suspects, check; --json), the drain policy, and every file or option that is wrong
refused with one line and its documented exit code. The file is read back with Python's own sqlite3,
as anyone with the sqlite3 shell would."""
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import (CRASH_MARKERS, CULPRIT, EXIT_DAMAGED, EXIT_HARDWARE, EXIT_IO, EXIT_OK,  # noqa: E402
                             EXIT_USAGE, TempDirTest, error_lines, run)

NOTE_10 = ("culprit: exit 10 (hardware suspected): this is a finding, not a crash; the line above says what was "
           "found")


def rows(db):
    with sqlite3.connect(db) as c:
        return c.execute("SELECT host, verdict, run, slurm_job_id, step, action FROM verdicts ORDER BY id").fetchall()


def record_args(db, host, verdict, run_dir, step=-1, job="", action="none", **more):
    args = ["record", db, "--host", host, "--verdict", verdict, "--run", run_dir, "--step", step, "--action", action]
    if job:
        args += ["--job", job]
    for k, v in more.items():
        args += ["--" + k.replace("_", "-"), v]
    return args


class Ledger:
    """culprit ledger ARGS, its exit code checked and nothing a crash leaves on stderr. (Each run of
    the binary costs a second here, loading libtorch: the tests keep them few.)"""

    def ledger(self, *args, code=EXIT_OK, env=None):
        res = run(["ledger"] + [str(a) for a in args], env=env)
        self.assertEqual(res.code, code, "culprit ledger %s exited %d:\n%s\n%s" % (args, res.code, res.out, res.err))
        for marker in CRASH_MARKERS:
            self.assertNotIn(marker, res.err)
        return res

    def refused(self, args, code, *wants):
        """One `culprit: error:` line holding each of wants, exit `code`, nothing a crash leaves."""
        res = self.ledger(*args, code=code)
        lines = error_lines(res.err)
        self.assertEqual(len(lines), 1, res.err)
        for w in wants:
            self.assertIn(w, lines[0])
        return lines[0]


class LedgerTest(Ledger, TempDirTest):
    def setUp(self):
        super().setUp()
        self.db = self.path("ledger.db")


class Recording(LedgerTest):
    def test_the_job_defaults_to_slurms(self):
        env = dict(os.environ, SLURM_JOB_ID="777")
        self.ledger("record", self.db, "--host", "node40", "--verdict", "silent-rank", "--run", "runs/x", env=env)
        host, verdict, run_dir, job, step, action = rows(self.db)[-1]
        self.assertEqual((host, verdict, job, step, action), ("node40", "silent-rank", "777", -1, "none"))
        self.assertTrue(os.path.isabs(run_dir) and run_dir.endswith("/runs/x"), run_dir)

    def test_eight_jobs_recording_at_once_lose_nothing(self):
        # Eight writers start together on a ledger that does not exist yet: they race to create the
        # schema as well. (The library's test does 8 x 50 in forked processes: ledger_unit.)
        procs, per = 8, 2
        script = ('for i in $(seq 1 %d); do "%s" ledger record "%s" --host "node$1" --verdict hardware-transient '
                  '--run /scratch/runs/a --step "$i" --job "$1" --busy-timeout 60 || exit 1; done' % (per, CULPRIT, self.db))
        writers = [subprocess.Popen(["sh", "-c", script, "sh", str(p)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True) for p in range(procs)]
        for w in writers:
            out, err = w.communicate(timeout=120)
            self.assertEqual(w.returncode, 0, err)
            self.assertEqual(err, "")
        got = rows(self.db)
        self.assertEqual(len(got), procs * per)
        self.assertEqual(sorted((h, s) for h, _, _, _, s, _ in got),
                         sorted(("node%d" % p, i) for p in range(procs) for i in range(1, per + 1)))
        # The rollback journal, never WAL (docs/ledger.md: NFS and Lustre), and no journal left behind.
        with sqlite3.connect(self.db) as c:
            self.assertEqual(c.execute("PRAGMA journal_mode").fetchone()[0], "delete")
            self.assertEqual(c.execute("PRAGMA user_version").fetchone()[0], 1)
            self.assertEqual(c.execute("PRAGMA application_id").fetchone()[0], 0x43554C50)
        self.assertFalse(os.path.exists(self.db + "-wal"))
        self.assertFalse(os.path.exists(self.db + "-journal"))


class Outputs(Ledger, unittest.TestCase):
    """One ledger for the class (it is only read): node17 has two transient verdicts in two runs (a
    pattern); node03 one persistent (proof); node09 one transient (maybe a cosmic ray), recorded again
    by a post-mortem of the same fault (action none: the same finding)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="culprit-test-")
        cls.db = os.path.join(cls.tmp, "ledger.db")
        for args in (("node17", "hardware-transient", "/scratch/runs/a", 42, "1001", "retried",
                      {"device": "cuda:1", "evidence": "step 42, layer fc1, forward"}),
                     ("node03", "hardware-persistent", "/scratch/runs/c", 100, "1003", "excluded", {"device": "cuda:0"}),
                     ("node09", "hardware-transient", "/scratch/runs/c", 5, "1004", "retried", {}),
                     ("node09", "hardware-transient", "/scratch/runs/c", 5, "1005", "none", {}),
                     ("node17", "hardware-transient", "/scratch/runs/b", 7, "1002", "excluded",
                      {"device": "cuda:1", "evidence": "step 7, layer attn"})):
            res = run(["ledger"] + [str(a) for a in record_args(cls.db, *args[:6], **args[6])])
            assert res.code == 0, res.err

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_list_most_suspicious_first(self):
        out = self.ledger("list", self.db).out.splitlines()
        self.assertEqual(out[0].split(), ["HOST", "DRAIN", "FINDINGS", "RUNS", "JOBS", "DEVICES", "FIRST", "LAST",
                                          "LAST-ACTION"])
        self.assertEqual([(l.split()[0], l.split()[1]) for l in out[1:]],
                         [("node17", "yes"), ("node03", "yes"), ("node09", "no")])
        self.assertIn("hardware-transient=2", out[1])
        self.assertTrue(out[1].endswith("excluded"), out[1])
        self.assertIn("hardware-transient=1", out[3])  # the same fault twice is one finding
        only = self.ledger("list", self.db, "--host", "node03").out.splitlines()
        self.assertEqual([l.split()[0] for l in only], ["HOST", "node03"])

    def test_list_json(self):
        doc = json.loads(self.ledger("list", self.db, "--json").out)
        self.assertEqual((doc["record"], doc["version"]), ("ledger-list", 1))
        self.assertEqual(doc["policy"], {"persistent": 1, "transient": 2, "silent": 2, "unconfirmed": 1})
        hosts = {h["host"]: h for h in doc["hosts"]}
        self.assertEqual([h["host"] for h in doc["hosts"]], ["node17", "node03", "node09"])
        n17 = hosts["node17"]
        self.assertEqual((n17["drain"], n17["findings"], n17["runs"], n17["jobs"], n17["devices"], n17["last_action"]),
                         (True, {"hardware-transient": 2}, 2, 2, ["cuda:1"], "excluded"))
        self.assertEqual(n17["why"], "2 hardware-transient (--transient 2)")
        self.assertEqual((hosts["node09"]["rows"], hosts["node09"]["findings"]), (2, {"hardware-transient": 1}))

    def test_explain_says_why_oldest_first(self):
        out = self.ledger("explain", self.db, "node17").out.splitlines()
        self.assertEqual(out[0], "node17: 2 verdict(s) in 2 run(s), 2 job(s); over the drain policy: "
                                 "2 hardware-transient (--transient 2)")
        self.assertEqual(out[1].split(), ["TIME", "RUN", "JOB", "STEP", "VERDICT", "DEVICE", "RANK", "EXIT", "ACTION",
                                          "EVIDENCE"])
        self.assertEqual(out[2].split()[1:6], ["/scratch/runs/a", "1001", "42", "hardware-transient", "cuda:1"])
        self.assertTrue(out[2].endswith("step 42, layer fc1, forward"), out[2])
        self.assertEqual(out[3].split()[1:3], ["/scratch/runs/b", "1002"])
        doc = json.loads(self.ledger("explain", self.db, "node17", "--json").out)
        self.assertEqual((doc["record"], doc["host"], doc["drain"]), ("ledger-explain", "node17", True))
        self.assertEqual([r["step"] for r in doc["rows"]], [42, 7])
        self.assertEqual(self.ledger("explain", self.db, "node99").out, "node99: no verdicts in %s\n" % self.db)

    def test_suspects_under_the_policy(self):
        self.assertEqual(self.ledger("suspects", self.db).out, "node17\nnode03\n")
        wider = self.ledger("suspects", self.db, "--transient", 1).out.splitlines()
        self.assertEqual((wider[0], sorted(wider[1:])), ("node17", ["node03", "node09"]))  # node17: 2 over 1
        self.assertEqual(self.ledger("suspects", self.db, "--persistent", 0, "--transient", 3).out, "")

    def test_check_is_the_exit_code(self):
        res = self.ledger("check", self.db, "node17", code=EXIT_HARDWARE)
        self.assertIn("over the drain policy: 2 hardware-transient", res.out)
        self.assertEqual(res.err.strip().splitlines()[-1], NOTE_10)
        res = self.ledger("check", self.db, "node09")
        self.assertIn("not over the drain policy", res.out)
        self.assertEqual(res.err, "")
        self.ledger("check", self.db, "node09", "--transient", 1, code=EXIT_HARDWARE)
        self.ledger("check", self.db, "node-never-seen")



class Refusals(LedgerTest):
    def test_bad_input_exits_2(self):
        self.refused(["suspects", self.db], EXIT_USAGE, "ledger '%s' does not exist" % self.db)
        self.refused(["check", self.db, "node1"], EXIT_USAGE, "does not exist")
        self.assertFalse(os.path.exists(self.db))  # readers never create it
        self.refused([], EXIT_USAGE, "ledger needs an action")
        self.refused(["frobnicate", self.db], EXIT_USAGE, "unknown ledger action 'frobnicate'")
        base = ["record", self.db, "--run", "/r"]
        self.refused(base + ["--host", "", "--verdict", "hardware"], EXIT_USAGE, "'--host' is empty")
        self.refused(base + ["--host", "a,b", "--verdict", "hardware"], EXIT_USAGE, "not a host name")
        self.refused(base + ["--host", "n1", "--verdict", "Hardware Transient"], EXIT_USAGE, "not a verdict")
        self.refused(base + ["--host", "n1", "--verdict", "hardware", "--action", "rebooted"], EXIT_USAGE,
                     "unknown action 'rebooted'")
        self.refused(["record", self.path("no", "l.db"), "--host", "n1", "--verdict", "hardware", "--run", "/r"],
                     EXIT_USAGE, "does not exist: create it first")
        self.refused(["explain", self.db], EXIT_USAGE, "the ledger file and a host")
        self.refused(["list", self.db, "--verdict", "hardware"], EXIT_USAGE, "'--verdict'")  # record's, not list's
        self.assertFalse(os.path.exists(self.db))

    def test_not_a_ledger_exits_4(self):
        with open(self.db, "wb") as f:
            f.write(os.urandom(8192))
        for args in (["list", self.db], ["record", self.db, "--host", "n1", "--verdict", "hardware", "--run", "/r"]):
            self.refused(args, EXIT_DAMAGED, self.db, "not a culprit ledger or is damaged")
        other = self.path("other.db")
        with sqlite3.connect(other) as c:
            c.execute("CREATE TABLE verdicts (x)")
        self.refused(["suspects", other], EXIT_DAMAGED, "another program")
        newer = self.path("newer.db")
        self.ledger("record", newer, "--host", "n1", "--verdict", "hardware", "--run", "/r")
        with sqlite3.connect(newer) as c:
            c.execute("PRAGMA user_version = 2")
        self.refused(["check", newer, "n1"], EXIT_DAMAGED, "schema version 2", "use a newer culprit")

    def test_an_unwritable_directory_exits_6(self):
        ro = self.path("ro")
        os.makedirs(ro)
        mounted = os.geteuid() == 0
        if mounted:  # root writes through permissions: a read-only filesystem instead
            res = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", ro], capture_output=True)
            if res.returncode != 0:
                self.skipTest("cannot mount a read-only tmpfs: %s" % res.stderr)
        else:
            os.chmod(ro, 0o555)
        try:
            db = os.path.join(ro, "ledger.db")
            line = self.refused(["record", db, "--host", "n1", "--verdict", "hardware", "--run", "/r"], EXIT_IO, db)
            self.assertTrue("Read-only file system" in line or "Permission denied" in line, line)
        finally:
            if mounted:
                subprocess.run(["umount", ro], check=False)
            else:
                os.chmod(ro, 0o755)

    def test_a_lock_held_past_the_busy_timeout_exits_6(self):
        self.ledger("record", self.db, "--host", "n1", "--verdict", "hardware", "--run", "/r")
        holder = sqlite3.connect(self.db, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            self.refused(["record", self.db, "--host", "n2", "--verdict", "hardware", "--run", "/r", "--busy-timeout",
                          "1"], EXIT_IO, "still locked by another job after 1 s")
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        self.assertEqual([r[0] for r in rows(self.db)], ["n1"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
