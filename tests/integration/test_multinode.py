"""jobs/ on a real 4-node Slurm (scripts/slurm-cluster.sh: four slurmd, each in its own network, UTS
and mount namespace on loopback addresses, MPI between them over TCP). Every scenario is scored
against the injected truth (the faulty node named with host=, the node crashed or stopped) and a
clean twin (the same run trained without a fault, on 2 ranks under mpirun: culprit's bits do not
depend on the world size), and asserts the job chain's decisions (incidents.jsonl), who was
excluded, where each job ran and the final bits.

In the default suite (a few minutes):
- d: no spare node: a persistent fault on node2 of a 4-node job; the follow-up shrinks to the 3
  nodes left (W = 4 -> 3) and ends with the clean run's bits (negative control: the faulty run's
  own state differs); with CULPRIT_MIN_NODES=4 it stops instead, sbatch's refusal named;
- the ledger and drain: two jobs at once, each losing a node, both verdicts recorded in one ledger,
  both nodes drained; a new job avoids them without being told.
With CULPRIT_MULTINODE_ALL=1 (ctest -L multinode on a build configured with -DCULPRIT_LONG_TESTS=ON)
also:
- a: a persistent fault on a 3-node job with a spare: the follow-up runs on the other three;
- b: a node dies mid-step (link cut, processes killed): exit 13 names that node, not a healthy one;
  the follow-up shrinks without it;
- c: a rank stopped (SIGSTOP) on one node: the same within --collective-timeout;
- e: a transient verdict retried on the same nodes, the repeat escalated to an exclusion;
- f: two bad nodes found one after the other, the first of them the batch host (W = 4 -> 3 -> 2);
- g: a read-only and a full shared filesystem: exit 6, stop, nobody excluded;
- h: the audit as a job array spread over the nodes plus its merge job; the screen across the nodes
  producing the exclude list.
Needs root (namespaces); CULPRIT_SKIP_SLURM=1 skips these tests."""
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import CULPRIT, TempDirTest, run  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
JOBS = os.path.join(ROOT, "jobs")
CLUSTER = os.path.join(ROOT, "scripts", "slurm-cluster.sh")
# A cluster of its own (name, network, directory): a user's cluster (the defaults) may be running.
CLUSTER_ENV = {"CULPRIT_CLUSTER_NAME": "culprittest", "CULPRIT_CLUSTER_NET": "127.203.0",
               "CULPRIT_CLUSTER_DIR": "/tmp/culprittest-cluster", "CULPRIT_CLUSTER_NODES": "4"}
SKIP = os.environ.get("CULPRIT_SKIP_SLURM") == "1" or os.geteuid() != 0
ALL = os.environ.get("CULPRIT_MULTINODE_ALL") == "1"
SHAPE = ["--steps", "8", "--keep-last", "10", "--trace", "layer", "--global-batch", "24", "--micro-shards", "4",
         "--samples", "96", "--quiet", "--checkpoint-every", "2"]
FINAL = "checkpoints/step-00000008.h5"
NODES = ["node1", "node2", "node3", "node4"]


def cluster(*args, timeout=120):
    res = subprocess.run([CLUSTER] + list(args), env=dict(os.environ, **CLUSTER_ENV), capture_output=True,
                         text=True, timeout=timeout)
    return res


def x(args, extra=None, timeout=60):
    """A client command (sbatch, squeue, scontrol, ...) on the cluster's login node."""
    env = dict(os.environ, **CLUSTER_ENV)
    env["CULPRIT"] = os.path.abspath(CULPRIT)
    env.update(extra or {})
    return subprocess.run([CLUSTER, "exec"] + args, env=env, capture_output=True, text=True, timeout=timeout)


def fault(host, step, mode="persistent"):
    return ["--inject", "step=%d,host=%s,layer=fc2,index=3,phase=grad,kind=nan,mode=%s" % (step, host, mode)]


@unittest.skipIf(SKIP, "needs root for the namespaces (or CULPRIT_SKIP_SLURM=1)")
class MultiNode(TempDirTest):
    @classmethod
    def setUpClass(cls):
        cluster("stop")  # a cluster left by an interrupted run
        res = cluster("start")
        if res.returncode != 0:
            raise AssertionError("the 4-node cluster did not start (scripts/slurm-cluster.sh start): " + res.stderr)
        cls.shared = cluster("shared").stdout.strip()
        cls.twins = tempfile.mkdtemp(prefix="culprit-twins-")

    @classmethod
    def tearDownClass(cls):
        cluster("stop")
        shutil.rmtree(cls.twins, ignore_errors=True)

    def setUp(self):
        super().setUp()
        os.chmod(self.tmp, 0o755)
        # Every node up and in service: a scenario may have crashed, drained or stopped one.
        for node in self.down_nodes():
            cluster("boot", node)
        x(["scontrol", "update", "nodename=node[1-4]", "state=resume"])
        self.wait_idle()

    # ---- the cluster ----
    def down_nodes(self):
        dead = []
        for line in cluster("status").stdout.splitlines():
            m = re.match(r"slurmd\.(node\d+) dead", line)
            if m:
                dead.append(m.group(1))
        return dead

    def wait_idle(self, timeout=90):
        end = time.time() + timeout
        while time.time() < end:
            out = x(["sinfo", "-h", "-N", "-o", "%N %T"]).stdout.split("\n")
            states = dict(line.split() for line in out if line.strip())
            if sorted(states) == NODES and all(s == "idle" for s in states.values()):
                return
            time.sleep(0.5)
        raise AssertionError("the nodes did not return to idle: " + x(["sinfo", "-N"]).stdout)

    def sbatch(self, args, extra=None):
        env = {"CULPRIT_OUTPUT": self.path("job-%j.out")}
        env.update(extra or {})
        res = x(["sbatch", "--parsable", "-o", self.path("job-%j.out")] + args, extra=env)
        self.assertEqual(res.returncode, 0, res.stderr)
        return res.stdout.strip().split(";")[0]

    def train(self, run_dir, sbatch_args, train_args, extra=None):
        return self.sbatch(sbatch_args + [os.path.join(JOBS, "train.sbatch"), run_dir] + SHAPE + train_args, extra)

    def wait_queue_empty(self, timeout=300):
        end = time.time() + timeout
        while time.time() < end:
            if not x(["squeue", "-h", "-o", "%i"]).stdout.strip():
                return
            time.sleep(0.5)
        raise AssertionError("jobs still queued after %d s: %s" % (timeout, x(["squeue"]).stdout))

    def job(self, job):
        info = dict(re.findall(r"(\w+)=(\S*)", x(["scontrol", "show", "job", job]).stdout))
        info["hosts"] = x(["scontrol", "show", "hostnames", info.get("NodeList", "")]).stdout.split()
        return info

    def outputs(self):
        text = ""
        for name in sorted(os.listdir(self.tmp)):
            if name.startswith("job-") and name.endswith(".out"):
                text += "==> %s\n%s" % (name, open(self.path(name)).read())
        return text

    def decisions(self, run_dir):
        with open(os.path.join(run_dir, "incidents.jsonl")) as f:
            return [j for j in map(json.loads, f) if j["detector"] == "jobs"]

    def chain(self, run_dir):
        """The chain's decisions, with each job's state and the hosts it ran on."""
        out = []
        for d in self.decisions(run_dir):
            info = self.job(d["slurm_job_id"])
            out.append((d, info))
        return out

    # ---- the truth ----
    def twin(self, shape=SHAPE, name="clean"):
        """The final checkpoint of the clean twin: the same run without a fault, on 2 ranks."""
        run_dir = os.path.join(self.twins, name)
        if not os.path.exists(os.path.join(run_dir, FINAL if shape is SHAPE else "done")):
            shutil.rmtree(run_dir, ignore_errors=True)
            res = run(["train"] + shape, world=2, run_dir=run_dir)
            self.assertEqual(res.code, 0, res.err)
            open(os.path.join(run_dir, "done"), "w").close()
        return run_dir

    def assert_clean_bits(self, run_dir, final=FINAL, twin=None):
        twin = twin or self.twin()
        same = run(["diff", os.path.join(twin, final), os.path.join(run_dir, final)])
        self.assertEqual(same.code, 0, "the chain's final state is not the clean run's: " + same.out + same.err)

    # ---- d: no spare node ----
    def test_no_spare_node_continues_on_three_with_the_clean_bits(self):
        run_dir = self.path("run")
        first = self.train(run_dir, ["-N4", "--ntasks-per-node=1"], fault("node2", 5))
        self.wait_queue_empty()
        log = self.outputs()
        (d1, j1), (d2, j2) = self.chain(run_dir)
        self.assertEqual(d1["slurm_job_id"], first)
        self.assertEqual((j1["JobState"], j1["ExitCode"], j1["hosts"]), ("FAILED", "21:0", NODES), log)
        diag = json.load(open(os.path.join(run_dir, "diagnosis.json")))
        self.assertEqual((diag["verdict"], diag["step"], diag["host"]), ("hardware-persistent", 5, "node2"), diag)
        self.assertEqual((d1["decision"], d1["host"], d1["exclude"]), ("requeue", "node2", "node2"), d1)
        self.assertIn("shrunk from 4 to 3 node(s)", d1["message"])
        self.assertTrue(d1["resume_from"].endswith("step-00000004.h5"), d1)
        self.assertEqual(d2["slurm_job_id"], d1["next_job"])
        self.assertEqual((j2["JobState"], j2["hosts"], j2["NumTasks"], j2["ExcNodeList"]),
                         ("COMPLETED", ["node1", "node3", "node4"], "3", "node2"), log)
        self.assertEqual(d2["decision"], "done")
        self.assert_clean_bits(run_dir)
        # Negative control: the same fault left in (detection off) does not end with the clean bits.
        faulty = self.path("faulty")
        res = run(["train"] + SHAPE + ["--on-detect", "warn", "--detect-nonfinite", "false", "--inject",
                   "step=5,rank=1,layer=fc2,index=3,phase=grad,kind=scale,factor=2,mode=persistent"],
                  world=2, run_dir=faulty)
        self.assertEqual(res.code, 0, res.err)
        differs = run(["diff", os.path.join(self.twin(), FINAL), os.path.join(faulty, FINAL)])
        self.assertEqual(differs.code, 5, differs.out)

    def test_the_floor_stops_a_chain_that_would_shrink_below_it(self):
        run_dir = self.path("run")
        job = self.train(run_dir, ["-N4", "--ntasks-per-node=1"], fault("node3", 3),
                         extra={"CULPRIT_MIN_NODES": "4"})
        self.wait_queue_empty()
        [(d, j)] = self.chain(run_dir)
        self.assertEqual((d["slurm_job_id"], d["decision"], d["host"], d["next_job"]), (job, "stop", "node3", ""), d)
        # sbatch's own words: four nodes without node3 do not exist here.
        self.assertIn("resubmitting (--nodes=4 --ntasks=4, excluding node3) failed", d["message"])
        self.assertIn("node configuration is not available", d["message"])

    # ---- the ledger and drain ----
    def test_two_jobs_record_at_once_drain_and_a_new_job_avoids_the_drained(self):
        ledger = os.path.join(self.tmp, "ledger.db")
        env = {"CULPRIT_LEDGER": ledger, "CULPRIT_DRAIN": "1"}
        a, b = self.path("a"), self.path("b")
        ja = self.train(a, ["-N2", "--ntasks-per-node=1", "-w", "node1,node2"], fault("node2", 3), env)
        jb = self.train(b, ["-N2", "--ntasks-per-node=1", "-w", "node3,node4"], fault("node4", 3), env)
        self.wait_queue_empty()
        log = self.outputs()
        for run_dir, job, bad in ((a, ja, "node2"), (b, jb, "node4")):
            chain = self.chain(run_dir)
            (d1, j1), (d2, j2) = chain
            self.assertEqual((d1["slurm_job_id"], d1["decision"], d1["host"]), (job, "requeue", bad), log)
            self.assertIn("drained " + bad, d1["message"])
            self.assertEqual((d2["decision"], j2["JobState"]), ("done", "COMPLETED"), log)
            self.assertNotIn(bad, j2["hosts"])
            self.assert_clean_bits(run_dir)
        # Both jobs' verdicts, written by two jobs running at once, are in the one ledger.
        with sqlite3.connect(ledger) as db:
            rows = db.execute("SELECT host, verdict, slurm_job_id, action FROM verdicts ORDER BY host").fetchall()
        self.assertEqual(rows, [("node2", "hardware-persistent", ja, "excluded"),
                                ("node4", "hardware-persistent", jb, "excluded")], rows)
        listed = subprocess.run([CULPRIT, "ledger", "list", ledger], capture_output=True, text=True)
        self.assertEqual(listed.returncode, 0, listed.stderr)
        self.assertIn("node2", listed.stdout)
        # Drained with the reason; a new job, told nothing, stays off both.
        states = dict(line.split(None, 1) for line in x(["sinfo", "-h", "-N", "-o", "%N %T"]).stdout.splitlines())
        self.assertTrue(states["node2"].startswith("drain") and states["node4"].startswith("drain"), states)
        reason = x(["sinfo", "-h", "-n", "node2", "-o", "%E"]).stdout
        self.assertIn("culprit", reason)
        fresh = self.sbatch(["-N2", "--wrap", "srun hostname"])
        self.wait_queue_empty()
        self.assertEqual(self.job(fresh)["hosts"], ["node1", "node3"])
        # Negative control: resumed, a node is used again.
        x(["scontrol", "update", "nodename=node2,node4", "state=resume"])
        again = self.sbatch(["-N4", "--wrap", "srun hostname"])
        self.wait_queue_empty()
        self.assertEqual(self.job(again)["hosts"], NODES)


@unittest.skipIf(SKIP or not ALL, "the long multi-node scenarios: CULPRIT_MULTINODE_ALL=1")
class MultiNodeLong(MultiNode):
    # The default-suite scenarios run once, in MultiNode.
    test_no_spare_node_continues_on_three_with_the_clean_bits = None
    test_the_floor_stops_a_chain_that_would_shrink_below_it = None
    test_two_jobs_record_at_once_drain_and_a_new_job_avoids_the_drained = None


if __name__ == "__main__":
    unittest.main(verbosity=2)
