"""culprit replay: re-executing a recorded step on other ranks (and another world size) reproduces the
trace bitwise for a clean run, and an injected fault shows as a mismatch at its step, micro-shard,
layer and phase, with the replays telling a transient fault from a persistent one."""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import EXIT_DIFFERS, EXIT_USAGE, TempDirTest, last_culprit_line, run  # noqa: E402

W = 3
ARGS = ["--model", "mlp", "--steps", "8", "--global-batch", "24", "--micro-shards", "4", "--samples", "96", "--quiet",
        "--checkpoint-every", "3", "--trace", "layer", "--on-detect", "warn"]


class Replay(TempDirTest):
    def trained(self, name, inject=None):
        """The run of ARGS on W ranks, `inject` injected: its run directory."""
        extra = ["--inject", inject] if inject else []
        return self.train(name, ARGS + extra, W).run_dir

    def replay(self, run_dir, world, *extra):
        return run(["replay", "--run-dir", run_dir] + list(extra), world=world, use_mpirun=True)

    def test_clean_run_replays_bitwise_on_other_world_sizes(self):
        d = self.trained("clean")
        for world, extra in ((2, []), (1, ["--micro-shard", "2"]), (W, ["--ranks", "0,2"])):
            with self.subTest(world=world, extra=extra):
                res = self.replay(d, world, "--step", "5", *extra)
                self.assertEqual(res.code, 0, res.out + res.err)
                self.assertIn("from %s/checkpoints/step-00000003.h5" % d, res.out)
                self.assertIn("step 4: every micro-shard and the update match", res.out)
                self.assertIn("replay of step 5: everything matches the trace", res.out)
                self.assertNotIn("MISMATCH", res.out)

    def test_transient_fault_is_found_where_it_happened(self):
        d = self.trained("transient", "step=5,rank=1,layer=fc2,index=3,phase=forward,kind=bitflip,bit=4")
        res = self.replay(d, 2, "--step", "5")
        self.assertEqual(res.code, EXIT_DIFFERS, res.out + res.err)
        self.assertIn("step 4: every micro-shard and the update match", res.out)
        for r in (0, 1):
            self.assertRegex(res.out, r"step 5 micro-shard 1 on rank %d \(\S+\): MISMATCH first in the forward output "
                                      r"of layer fc2" % r)
        self.assertIn("=> every replay (ranks 0,1) agrees with the others and not with the record of rank 1", res.out)
        for k in (0, 2, 3):
            self.assertIn("step 5 micro-shard %d on rank 0 (" % k, res.out)
            self.assertNotRegex(res.out, r"micro-shard %d on rank \d \(\S+\): MISMATCH" % k)
        self.assertIn("step 5 update: MISMATCH the reduced gradient differs", res.out)
        self.assertIn("culprit: replay of step 5: 3 mismatch(es) with the trace", res.err)
        self.assertNotIn("culprit: error:", res.err)  # a difference is the answer, not an error
        self.assertEqual(last_culprit_line(res.err), "culprit: exit 5 (differs): what was compared differs, as said "
                                                     "above; this is a finding, not a failure")
        # Before the fault, everything reproduces (the negative control of the same run).
        res = self.replay(d, 2, "--step", "4")
        self.assertEqual(res.code, 0, res.out + res.err)

    def test_json_report_holds_the_same_findings(self):
        d = self.trained("json", "step=5,rank=1,layer=fc2,index=3,phase=forward,kind=bitflip,bit=4")
        res = self.replay(d, 2, "--step", "5", "--json")
        self.assertEqual(res.code, EXIT_DIFFERS, res.out + res.err)
        rep = json.loads(res.out)  # stdout is the record alone
        self.assertEqual((rep["record"], rep["version"], rep["step"], rep["world_size"]), ("replay", 1, 5, 2))
        self.assertTrue(rep["checkpoint"].endswith("checkpoints/step-00000003.h5"), rep["checkpoint"])
        self.assertEqual([(b["step"], b["shards"], b["update"]["where"]) for b in rep["before"]], [(4, [], "")])
        self.assertEqual(rep["mismatches"], 3)
        shards = {s["shard"]: s for s in rep["shards"]}
        self.assertEqual(sorted(shards), [0, 1, 2, 3])
        self.assertEqual(shards[1]["recorded_by"], 1)
        replays = shards[1]["replays"]
        self.assertEqual([r["rank"] for r in replays], [0, 1])
        for r in replays:
            self.assertFalse(r["match"], r)
            self.assertEqual((r["difference"]["where"], r["difference"]["phase"], r["difference"]["layer"]),
                             ("forward", "forward", "fc2"), r)
        for k in (0, 2, 3):  # the negative control inside the same replay
            self.assertTrue(all(r["match"] for r in shards[k]["replays"]), shards[k])
        self.assertEqual(rep["update"]["where"], "reduced-gradient")

    def test_backward_fault_names_the_layer_in_backward_order(self):
        d = self.trained("backward", "step=5,rank=1,layer=fc1,index=3,phase=backward,kind=bitflip,bit=4")
        res = self.replay(d, 2, "--step", "5", "--micro-shard", "1")
        self.assertEqual(res.code, EXIT_DIFFERS, res.out + res.err)
        self.assertRegex(res.out, r"micro-shard 1 on rank 0 \(\S+\): MISMATCH first in the gradient flowing back into "
                                  r"layer fc1")

    def test_grad_and_data_faults_name_their_phase(self):
        for spec, needle in [("layer=fc2,index=3,phase=grad,kind=bitflip,bit=4", "first in the gradient of parameter 'fc2.weight'"),
                             ("index=3,phase=data,kind=bitflip,bit=4", "first in the input samples as loaded")]:
            with self.subTest(spec=spec):
                d = self.trained(spec.split(",")[-3], "step=5,rank=1," + spec)
                res = self.replay(d, 2, "--step", "5", "--micro-shard", "1")
                self.assertEqual(res.code, EXIT_DIFFERS, res.out + res.err)
                self.assertRegex(res.out, r"micro-shard 1 on rank 0 \(\S+\): MISMATCH " + needle.replace("(", r"\("))

    def test_persistent_fault_reproduces_on_its_rank_only(self):
        d = self.trained("persistent", "step=5,rank=1,layer=fc2,index=3,phase=forward,kind=bitflip,bit=4,"
                                       "mode=persistent")
        res = self.replay(d, W, "--step", "5", "--micro-shard", "1")
        self.assertEqual(res.code, EXIT_DIFFERS, res.out + res.err)
        self.assertRegex(res.out, r"micro-shard 1 on rank 1 \(\S+\): match")
        self.assertIn("=> rank(s) 1 reproduce the record of rank 1; rank(s) 0,2 do not", res.out)
        self.assertRegex(res.out, r"replays disagree: micro-shard 1 gradient element \d+: rank 0 \S+ \(0x[0-9a-f]{8}\), "
                                  r"rank 1 \S+ \(0x[0-9a-f]{8}\), bits 0x[0-9a-f]{8} differ")

    def test_bad_input(self):
        d = self.trained("ok")
        res = run(["train"] + ARGS[:-4] + ["--trace", "off"], world=1, run_dir=self.path("notrace"))
        self.assertEqual(res.code, 0, res.err)
        for args, world, needle in [
                (["--run-dir", self.path("missing"), "--step", "2"], 2, "holds no run (no run.json)"),
                (["--run-dir", d, "--step", "99"], 2, "--step 99 is not in the trace of"),
                (["--run-dir", d, "--step", "3", "--ranks", "0,7"], 2, "--ranks: rank 7 does not exist (world size 2)"),
                (["--run-dir", d, "--step", "3", "--micro-shard", "4"], 1, "--micro-shard 4 does not exist"),
                (["--run-dir", d, "--step", "3", "--trace", "deep"], 1, "unknown level 'deep'"),
                (["--run-dir", d], 1, "option '--step' is required"),
                (["--run-dir", self.path("notrace"), "--step", "3"], 1, "no trace in")]:
            with self.subTest(args=args):
                res = run(["replay"] + args, world=world, use_mpirun=True)
                self.assertEqual(res.code, EXIT_USAGE, res.out + res.err)
                self.assertIn("culprit: error: ", res.err)
                self.assertIn(needle, res.err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
