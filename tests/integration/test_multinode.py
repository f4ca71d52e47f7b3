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

    def train(self, run_dir, sbatch_args, train_args, extra=None, shape=SHAPE):
        return self.sbatch(sbatch_args + [os.path.join(JOBS, "train.sbatch"), run_dir] + shape + train_args, extra)

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
                with open(self.path(name)) as f:
                    text += "==> %s\n%s" % (name, f.read())
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

    # ---- d: no spare node (and two bad nodes, one after the other) ----
    def test_no_spare_node_continues_on_fewer_nodes_with_the_clean_bits(self):
        run_dir = self.path("run")
        # node2 fails at step 5; in the follow-up on node1,3,4 node4 (rank 3 of the first job, rank 2
        # now: rank 2 was node3 before) fails at step 7.
        first = self.train(run_dir, ["-N4", "--ntasks-per-node=1"], fault("node2", 5) + fault("node4", 7))
        self.wait_queue_empty()
        log = self.outputs()
        (d1, j1), (d2, j2), (d3, j3) = self.chain(run_dir)
        self.assertEqual(d1["slurm_job_id"], first)
        self.assertEqual((j1["JobState"], j1["ExitCode"], j1["hosts"]), ("FAILED", "21:0", NODES), log)
        self.assertEqual((d1["decision"], d1["host"], d1["exclude"], d1["step"]), ("requeue", "node2", "node2", 5), d1)
        self.assertIn("shrunk from 4 to 3 node(s)", d1["message"])
        self.assertTrue(d1["resume_from"].endswith("step-00000004.h5"), d1)
        self.assertEqual(d2["slurm_job_id"], d1["next_job"])
        self.assertEqual((j2["JobState"], j2["hosts"], j2["NumTasks"], j2["ExcNodeList"]),
                         ("FAILED", ["node1", "node3", "node4"], "3", "node2"), log)
        # The host where the faulty rank ran at step 7, not where that rank number ran at first.
        with open(os.path.join(run_dir, "diagnosis.json")) as f:
            diag = json.load(f)
        self.assertEqual((diag["verdict"], diag["step"], diag["rank"], diag["host"]),
                         ("hardware-persistent", 7, 2, "node4"), diag)
        self.assertEqual((d2["decision"], d2["host"], d2["exclude"]), ("requeue", "node4", "node2,node4"), d2)
        self.assertIn("shrunk from 3 to 2 node(s)", d2["message"])
        self.assertEqual((j3["JobState"], j3["hosts"], j3["NumTasks"], d3["decision"]),
                         ("COMPLETED", ["node1", "node3"], "2", "done"), log)
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
        self.assertIn("resubmitting (--nodes=4 --ntasks=4 --ntasks-per-node=1, excluding node3) failed", d["message"])
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
            rows = db.execute("SELECT host, verdict, slurm_job_id, action FROM verdicts ORDER BY host, id").fetchall()
        self.assertEqual(rows, [("node2", "hardware-persistent", ja, "excluded"), ("node2", "hardware-persistent", ja, "drained"),
                                ("node4", "hardware-persistent", jb, "excluded"), ("node4", "hardware-persistent", jb, "drained")],
                         rows)
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
    test_no_spare_node_continues_on_fewer_nodes_with_the_clean_bits = None
    test_the_floor_stops_a_chain_that_would_shrink_below_it = None
    test_two_jobs_record_at_once_drain_and_a_new_job_avoids_the_drained = None

    def wait_for_output(self, text, timeout=120):
        end = time.time() + timeout
        while time.time() < end:
            if text in self.outputs():
                return
            time.sleep(0.1)
        raise AssertionError("no %r in the jobs' output: %s" % (text, self.outputs()))

    def culprit_pid_on(self, node):
        """The culprit rank running in node's namespaces."""
        ns = "%s-%s" % (CLUSTER_ENV["CULPRIT_CLUSTER_NAME"], node)
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
            try:
                if open("/proc/%s/comm" % pid).read().strip() == "culprit":
                    return int(pid)
            except OSError:
                pass
        raise AssertionError("no culprit process on " + node)

    def stall(self, host, step=3, seconds=4):
        """A 4 s stall of host's rank in `step` (within the collective timeout: nothing detects it),
        during which the scenario strikes; it changes no value."""
        return ["--collective-timeout", "10", "--inject",
                "step=%d,host=%s,layer=fc1,phase=forward,kind=hang,seconds=%d" % (step, host, seconds)]

    def assert_lost_node_chain(self, run_dir, lost, first):
        log = self.outputs()
        (d1, j1), (d2, j2) = self.chain(run_dir)
        self.assertEqual((d1["slurm_job_id"], d1["exit_code"], d1["decision"]), (first, 13, "requeue"), log)
        # The dead (or stopped) node is named, not one of the healthy ones that waited for it.
        self.assertEqual((d1["host"], d1["exclude"]), (lost, lost), d1)
        with open(os.path.join(run_dir, "incidents.jsonl")) as f:
            incident = [j for j in map(json.loads, f) if j["detector"] == "collective-timeout"][-1]
        self.assertEqual((incident["host"], incident["step"]), (lost, 3), incident)
        # The newest checkpoint before step 3 that verifies (step 2's, unless the node died before
        # every rank had committed it).
        self.assertRegex(d1["resume_from"], r"step-0000000[02]\.h5$", d1)
        self.assertIn("shrunk from 4 to 3 node(s)", d1["message"])
        self.assertEqual((d2["decision"], j2["JobState"], len(j2["hosts"])), ("done", "COMPLETED", 3), log)
        self.assertNotIn(lost, j2["hosts"])
        self.assert_clean_bits(run_dir)

    # ---- a: a persistent fault with a spare node ----
    def test_persistent_fault_excluded_the_spare_takes_its_place(self):
        run_dir = self.path("run")
        first = self.train(run_dir, ["-N3", "--ntasks-per-node=1"], fault("node2", 5))
        self.wait_queue_empty()
        log = self.outputs()
        (d1, j1), (d2, j2) = self.chain(run_dir)
        self.assertEqual((d1["slurm_job_id"], j1["hosts"], d1["exit_code"]), (first, NODES[:3], 21), log)
        self.assertEqual((d1["host"], d1["exclude"]), ("node2", "node2"), d1)
        self.assertNotIn("shrunk", d1["message"])
        self.assertEqual((j2["hosts"], j2["NumTasks"], d2["decision"]), (["node1", "node3", "node4"], "3", "done"), log)
        self.assert_clean_bits(run_dir)

    def test_the_first_jobs_exclude_list_stays_and_sbatch_args_cannot_replace_it(self):
        run_dir = self.path("run")
        self.train(run_dir, ["-N3", "--ntasks-per-node=1", "--exclude=node4"], fault("node2", 5))
        refused = self.train(self.path("refused"), ["-N2"], [], extra={"CULPRIT_SBATCH_ARGS": "-O --exclude=node1"})
        self.wait_queue_empty()
        log = self.outputs()
        (d1, j1), (d2, j2) = self.chain(run_dir)
        self.assertEqual(j1["hosts"], NODES[:3], log)
        self.assertEqual(d1["exclude"], "node4,node2", d1)  # the user's node4 and the bad node2
        self.assertEqual((d2["decision"], j2["hosts"]), ("done", ["node1", "node3"]), log)
        self.assert_clean_bits(run_dir)
        self.assertEqual(self.job(refused)["ExitCode"], "2:0", log)
        self.assertIn("CULPRIT_SBATCH_ARGS holds '--exclude=node1'", log)

    # ---- b: a node dies mid-step ----
    def test_a_node_dies_mid_step_and_is_named(self):
        run_dir = self.path("run")
        first = self.train(run_dir, ["-N4", "--ntasks-per-node=1"], self.stall("node3"))
        self.wait_for_output("hangs for")
        crashed = cluster("crash", "node3")
        self.assertEqual(crashed.returncode, 0, crashed.stderr)
        self.wait_queue_empty(timeout=240)  # the follow-up waits until Slurm has node3 down (~40 s)
        self.assert_lost_node_chain(run_dir, "node3", first)

    # ---- c: a rank stuck ----
    def test_a_stopped_rank_is_named_within_the_collective_timeout(self):
        run_dir = self.path("run")
        first = self.train(run_dir, ["-N4", "--ntasks-per-node=1"], self.stall("node3"))
        self.wait_for_output("hangs for")
        pid = self.culprit_pid_on("node3")
        os.kill(pid, signal.SIGSTOP)
        t0 = time.time()
        self.wait_queue_empty()
        self.assertLess(time.time() - t0, 120)
        self.assert_lost_node_chain(run_dir, "node3", first)

    # ---- e: transient verdicts ----
    def test_a_transient_is_retried_on_the_same_nodes_and_a_repeat_excluded(self):
        run_dir = self.path("run")
        self.train(run_dir, ["-N4", "--ntasks-per-node=1"], fault("node2", 5, mode="transient"))
        self.wait_queue_empty()
        log = self.outputs()
        (d1, j1), (d2, j2), (d3, j3) = self.chain(run_dir)
        # The first: kept (the fault did not recur when recomputed); the follow-up on the same nodes.
        self.assertEqual((d1["exit_code"], d1["decision"], d1["host"], d1["exclude"]),
                         (20, "requeue", "node2", ""), log)
        self.assertIn("a first transient verdict on node2", d1["message"])
        self.assertEqual(j2["hosts"], NODES, log)
        # node2 fails again: a repeat offender, excluded; the chain shrinks and finishes.
        self.assertEqual((d2["exit_code"], d2["decision"], d2["host"], d2["exclude"]),
                         (20, "requeue", "node2", "node2"), log)
        self.assertIn("a repeat", d2["message"])
        self.assertEqual((d3["decision"], j3["hosts"]), ("done", ["node1", "node3", "node4"]), log)
        self.assert_clean_bits(run_dir)

    def test_a_transient_on_a_host_the_ledger_knows_is_excluded_and_drained(self):
        # Another job, another run, last week: a transient verdict on node2 in the fleet's ledger.
        ledger = self.path("ledger.db")
        rec = subprocess.run([CULPRIT, "ledger", "record", ledger, "--host", "node2", "--verdict",
                              "hardware-transient", "--run", "/scratch/runs/other", "--step", "9", "--job", "77",
                              "--action", "retried"], capture_output=True, text=True)
        self.assertEqual(rec.returncode, 0, rec.stderr)
        run_dir = self.path("run")
        self.train(run_dir, ["-N3", "--ntasks-per-node=1"], fault("node2", 5, mode="transient"),
                   extra={"CULPRIT_LEDGER": ledger, "CULPRIT_DRAIN": "1"})
        self.wait_queue_empty()
        log = self.outputs()
        (d1, _), (d2, j2) = self.chain(run_dir)
        self.assertEqual((d1["exit_code"], d1["exclude"]), (20, "node2"), log)
        self.assertIn("a repeat offender in the ledger", d1["message"])
        self.assertIn("drained node2", d1["message"])
        self.assertEqual((d2["decision"], j2["hosts"]), ("done", ["node1", "node3", "node4"]), log)
        self.assertTrue(x(["sinfo", "-h", "-n", "node2", "-o", "%T"]).stdout.startswith("drain"))
        self.assert_clean_bits(run_dir)

    def test_transient_policy_exclude_excludes_at_once(self):
        run_dir = self.path("run")
        self.train(run_dir, ["-N3", "--ntasks-per-node=1"], fault("node2", 5, mode="transient"),
                   extra={"CULPRIT_TRANSIENT": "exclude"})
        self.wait_queue_empty()
        (d1, _), (d2, j2) = self.chain(run_dir)
        self.assertEqual((d1["exit_code"], d1["exclude"]), (20, "node2"), d1)
        self.assertEqual((d2["decision"], j2["hosts"]), ("done", ["node1", "node3", "node4"]))
        self.assert_clean_bits(run_dir)

    # ---- f: two bad nodes, the first the batch host ----
    def test_two_bad_nodes_one_after_the_other_the_first_the_batch_host(self):
        run_dir = self.path("run")
        self.train(run_dir, ["-N4", "--ntasks-per-node=1"], fault("node1", 3) + fault("node3", 6))
        self.wait_queue_empty()
        log = self.outputs()
        (d1, j1), (d2, j2), (d3, j3) = self.chain(run_dir)
        self.assertEqual(j1["BatchHost"], "node1")
        self.assertEqual((d1["host"], d1["exclude"], d1["step"]), ("node1", "node1", 3), log)
        self.assertEqual(j2["hosts"], ["node2", "node3", "node4"], log)
        self.assertEqual((d2["host"], d2["exclude"], d2["step"]), ("node3", "node1,node3", 6), log)
        self.assertIn("shrunk from 3 to 2 node(s)", d2["message"])
        self.assertEqual((d3["decision"], j3["hosts"], j3["NumTasks"]), ("done", ["node2", "node4"], "2"), log)
        self.assert_clean_bits(run_dir)

    # ---- g: the shared filesystem fails ----
    def mount_shared(self, name, size):
        where = os.path.join(self.shared, name)
        os.makedirs(where, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s" % size, "tmpfs", where], check=True)
        self.addCleanup(subprocess.run, ["umount", "-l", where])
        return where

    def assert_stopped_for_io(self, job, reason):
        """Exit 6, decision stop, nobody excluded, no follow-up. The decision itself may not fit on the
        failed filesystem: the job's output says what it decided either way."""
        log = self.outputs()
        self.assertEqual(self.job(job)["ExitCode"], "6:0", log)
        self.assertIn(reason, log)
        self.assertIn("culprit jobs: stop (exit 6): I/O failure", log)
        self.assertIn("never hardware; nobody excluded", log)
        self.assertNotIn("requeue", log)
        self.assertEqual(x(["squeue", "-h"]).stdout.strip(), "")

    def test_a_read_only_shared_filesystem_stops_the_chain_nobody_excluded(self):
        fs = self.mount_shared("ro", "64m")
        run_dir = os.path.join(fs, "run")
        # The first half of the run; then the filesystem goes read-only (a failing file server) and
        # the job that continues the run meets it on every node.
        first = self.train(run_dir, ["-N3", "--ntasks-per-node=1"], [], shape=[a if a != "8" else "4" for a in SHAPE])
        self.wait_queue_empty()
        self.assertEqual(self.job(first)["JobState"], "COMPLETED", self.outputs())
        subprocess.run(["mount", "-o", "remount,ro", fs], check=True)
        job = self.train(run_dir, ["-N3", "--ntasks-per-node=1"], [])
        self.wait_queue_empty()
        self.assert_stopped_for_io(job, "Read-only file system")

    def test_a_full_shared_filesystem_stops_and_the_resubmitted_job_finishes(self):
        fs = self.mount_shared("full", "64m")
        run_dir = os.path.join(fs, "run")
        job = self.train(run_dir, ["-N3", "--ntasks-per-node=1"], self.stall("node2", step=5))
        self.wait_for_output("hangs for")
        filler = os.path.join(fs, "filler")
        subprocess.run(["dd", "if=/dev/zero", "of=" + filler, "bs=1M"], capture_output=True)
        self.wait_queue_empty()
        self.assert_stopped_for_io(job, "No space left on device")
        # Space freed, the same job again resumes from the newest checkpoint and ends clean.
        os.unlink(filler)
        again = self.train(run_dir, ["-N3", "--ntasks-per-node=1"], [])
        self.wait_queue_empty()
        self.assertEqual(self.job(again)["JobState"], "COMPLETED", self.outputs())
        self.assert_clean_bits(run_dir)

    # ---- h: the audit array and the screen across the nodes ----
    def test_the_audit_array_spreads_over_the_nodes_and_merges(self):
        run_dir = self.path("audited")
        res = run(["train"] + SHAPE[:-2] + ["--checkpoint-every", "1", "--on-detect", "warn", "--inject",
                   "step=6,rank=1,layer=fc2,index=1,phase=forward,kind=bitflip,bit=20"], world=2, run_dir=run_dir)
        self.assertEqual(res.code, 0, res.err)
        out = x([os.path.join(JOBS, "submit-audit.sh"), run_dir, "4", "--exclusive", "-o", self.path("job-%j.out")])
        self.assertEqual(out.returncode, 0, out.stderr)
        ids = dict(kv.split("=") for kv in out.stdout.split())
        self.wait_queue_empty()
        merge = self.job(ids["merge"])
        self.assertEqual((merge["JobState"], merge["ExitCode"]), ("FAILED", "5:0"), self.outputs())
        hosts = set()
        for task in range(4):
            hosts.update(self.job("%s_%d" % (ids["array"], task))["hosts"])
        self.assertGreaterEqual(len(hosts), 2, hosts)
        with open(os.path.join(run_dir, "audit.json")) as f:
            report = json.load(f)
        self.assertEqual(report["shares"], 4)
        self.assertEqual([(i["from"], i["to"]) for i in report["intervals"]], [(s, s + 1) for s in range(8)])
        bad = [(i["from"], i["to"]) for i in report["intervals"] if i["verdict"] != "reproduced"]
        self.assertEqual(bad, [(5, 6)], report)  # negative control: the other intervals reproduce

    def test_the_screen_across_the_nodes_names_the_bad_one(self):
        screen = os.path.join(JOBS, "screen.sbatch")
        env = {"CULPRIT_SCREEN_SECONDS": "1"}
        good = self.sbatch(["-N4", "--chdir", self.tmp, screen], env)
        bad = self.sbatch(["-N4", "--chdir", self.tmp, screen, "--inject",
                           "host=node3,layer=matmul,step=2,kind=bitflip,bit=2,index=9"], env)
        self.wait_queue_empty()
        self.assertEqual(self.job(good)["ExitCode"], "0:0", self.outputs())
        self.assertEqual(open(self.path("job-%s.out" % good)).read().splitlines()[-1], "--exclude=")
        self.assertEqual(self.job(bad)["ExitCode"], "10:0", self.outputs())
        self.assertEqual(open(self.path("job-%s.out" % bad)).read().splitlines()[-1], "--exclude=node3")


if __name__ == "__main__":
    unittest.main(verbosity=2)
