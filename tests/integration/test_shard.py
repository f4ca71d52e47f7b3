"""--shard-optimizer (ZeRO-1; docs/determinism.md, "Sharded optimizer state") under real mpirun: the
same bits as the unsharded run at every world size (parameters, losses, checkpoints byte for byte per
dataset), resume at any other world size sharded or not, optimizer memory per rank about 1/W, the
optimizer tensors written in slices by their owners, and faults in a slice bisected to the rank that
owns it — each scored against the injected truth, with a clean twin as the negative control."""
import os
import sys

import shutil

import h5py

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import EXIT_USAGE, VERDICTS, TempDirTest, diagnosis, incidents, run  # noqa: E402

MLP = ["--model", "mlp", "--hidden", "96", "--global-batch", "32", "--micro-shards", "4", "--samples", "256"]
ADAMW = ["--optimizer", "adamw", "--lr", "0.003", "--weight-decay", "0.1"]
SGD = ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--nesterov", "--weight-decay", "0.01"]
GPT = ["--model", "gpt", "--global-batch", "8", "--micro-shards", "4", "--samples", "64", "--optimizer", "adamw",
       "--lr", "0.003", "--weight-decay", "0.1", "--clip-grad-norm", "1", "--tie-head"]


def optimizer_tensors(path):
    """Every /optimizer dataset of a checkpoint, as numpy arrays."""
    out = {}
    with h5py.File(path, "r") as f:
        f["optimizer"].visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return out


class Shard(TempDirTest):
    def checkpoint(self, name, step):
        return self.path(name, "checkpoints", "step-%08d.h5" % step)

    def assert_same_checkpoints(self, a, b, step):
        res = run(["diff", self.checkpoint(a, step), self.checkpoint(b, step)])
        self.assertEqual(res.code, 0, res.out + res.err)

    def test_bitwise_equal_to_unsharded_at_every_world_size(self):
        for recipe, args in (("adamw", MLP + ADAMW), ("sgd", MLP + SGD), ("gpt", GPT)):
            base = self.train("%s-plain-1" % recipe, args + ["--steps", "6", "--checkpoint-every", "3"], 1)
            want = base.metrics(timings=False)
            for line in want:
                line.pop("optimizer_bytes")  # memory: 1/W of it when sharded
            for world in (1, 2, 4):
                name = "%s-shard-%d" % (recipe, world)
                got = self.train(name, args + ["--steps", "6", "--checkpoint-every", "3", "--shard-optimizer"], world)
                m = got.metrics(timings=False)
                for line in m:
                    line.pop("optimizer_bytes")
                self.assertEqual(m, want, "%s W=%d" % (recipe, world))
                self.assert_same_checkpoints(name, "%s-plain-1" % recipe, 6)
        # Negative control: another learning rate gives other bits (the comparison can fail).
        other = self.train("adamw-other", MLP + ADAMW[:-2] + ["--weight-decay", "0.2", "--steps", "6",
                                                              "--shard-optimizer"], 2)
        self.assertNotEqual(other.final_fingerprint(), self.train("x", MLP + ADAMW + ["--steps", "6"], 1).final_fingerprint())

    def test_uneven_cuts_empty_slices_and_threads_keep_the_bits(self):
        # W = 3 cuts unevenly; a 426-parameter MLP on 4 ranks leaves rank 0 without a slice; with two
        # intra-op threads a slice of fc2.weight (65536 elements, cut by the slices) is split again
        # among the threads. Each is the unsharded run's bits.
        cases = ((MLP + ADAMW, 3, []), (["--model", "mlp", "--hidden", "8", "--global-batch", "16", "--micro-shards", "4",
                                         "--samples", "64"] + SGD, 4, []),
                 (["--model", "mlp", "--hidden", "256", "--global-batch", "16", "--micro-shards", "2", "--samples", "64"]
                  + ADAMW, 2, ["--threads", "2"]))
        for i, (args, world, extra) in enumerate(cases):
            want = self.train("plain-%d" % i, args + extra + ["--steps", "4"], 1).final_fingerprint()
            got = self.train("shard-%d" % i, args + extra + ["--steps", "4", "--shard-optimizer"], world)
            self.assertEqual(got.final_fingerprint(), want, "case %d (W=%d %s)" % (i, world, extra))
            self.assertEqual(incidents(self.path("shard-%d" % i)), [])

    def test_without_a_trace_the_replica_check_compares_the_parameters(self):
        # --trace off: the replica check asks the state for its fingerprints itself. A copy's
        # parameter fault is still caught there, and --on-detect diagnose names the rank in the job.
        args = MLP + ADAMW + ["--steps", "8", "--checkpoint-every", "4", "--shard-optimizer"]
        clean = self.train("untraced", args + ["--trace", "off"], 2)
        self.assertEqual(incidents(self.path("untraced")), [])
        self.assertEqual(clean.final_fingerprint(), self.train("traced", args, 2).final_fingerprint())
        spec = "step=5,rank=0,layer=fc3,index=7,phase=param,kind=bitflip,bit=30"
        self.train("untraced-fault", args + ["--trace", "off", "--on-detect", "warn", "--inject", spec], 2)
        self.assertIn("replica-divergence", {x["detector"] for x in incidents(self.path("untraced-fault"))})
        res = run(["train", "--quiet", "--on-detect", "diagnose", "--inject", spec] + args, world=2,
                  run_dir=self.path("diagnosed"))
        self.assertEqual(res.code, VERDICTS["hardware-transient"], res.out + res.err)
        got = diagnosis(self.path("diagnosed"))
        self.assertEqual((got["step"], got["phase"], got["layer"], got["rank"]), (5, "param", "fc3", 0), got)

    def test_the_owners_write_the_slices_and_any_world_resumes(self):
        args = MLP + ADAMW + ["--steps", "8", "--checkpoint-every", "4"]
        whole = self.train("whole", args, 1)
        self.train("sharded", args + ["--shard-optimizer"], 4)
        # The optimizer tensors of the sharded checkpoint are the unsharded run's, element for
        # element (each written in up to four slices), and the file verifies.
        a, b = optimizer_tensors(self.checkpoint("sharded", 4)), optimizer_tensors(self.checkpoint("whole", 4))
        self.assertEqual(sorted(a), sorted(b))
        for k in a:
            self.assertEqual(a[k].tobytes(), b[k].tobytes(), k)
        self.assertEqual(run(["verify", self.path("sharded")]).code, 0)
        # Resume from step 4 at other world sizes, sharded or not, and from an unsharded run sharded.
        for src, world, flag in (("sharded", 2, "--shard-optimizer"), ("sharded", 3, "--shard-optimizer"),
                                 ("sharded", 1, "--shard-optimizer=false"), ("whole", 4, "--shard-optimizer")):
            name = "resume-%s-%d%s" % (src, world, flag[-5:])
            shutil.copytree(self.path(src), self.path(name))
            os.remove(self.checkpoint(name, 8))  # the newest valid checkpoint is now step 4's
            res = run(["train", "--quiet", "--resume", flag], world=world, run_dir=self.path(name))
            self.assertEqual(res.code, 0, res.err)
            self.assertEqual(res.final_fingerprint(), whole.final_fingerprint(), name)
            self.assertEqual(len(res.metrics()), 8, name)

    def test_optimizer_memory_per_rank_is_about_one_over_w(self):
        args = GPT + ["--width", "64", "--layers", "2", "--steps", "2"]
        plain = self.train("mem-plain-4", args, 4).metrics()[-1]["optimizer_bytes"]
        one = self.train("mem-1", args + ["--shard-optimizer"], 1).metrics()[-1]["optimizer_bytes"]
        self.assertEqual(one, plain)  # sharding over one rank holds everything, as unsharded does
        chunk = 2 * 4096 + 8 * 64  # AdamW: two 4 KiB chunks of state, plus the step counters
        for world in (2, 4):
            mine = self.train("mem-%d" % world, args + ["--shard-optimizer"], world).metrics()[-1]["optimizer_bytes"]
            self.assertLessEqual(mine, plain / world + chunk, "W=%d: %d of %d" % (world, mine, plain))
            self.assertGreaterEqual(mine, plain / world - chunk)

    def test_a_faulty_slice_is_named_by_its_owner(self):
        args = MLP + ADAMW + ["--steps", "8", "--checkpoint-every", "4", "--shard-optimizer", "--on-detect", "warn"]
        # fc3 lies in rank 1's slice, fc1 in rank 0's (with two ranks).
        # (spec, verdict, (step, phase, layer, rank), whether the replicas diverge)
        cases = (("step=5,rank=1,layer=fc3,index=3,phase=optimizer,kind=bitflip,bit=30", "hardware-transient",
                  (5, "optimizer", "fc3", 1), False),
                 ("step=5,rank=1,layer=fc3,index=3,phase=optimizer,kind=bitflip,bit=30,mode=persistent",
                  "hardware-persistent", (5, "optimizer", "fc3", 1), False),
                 # A parameter of rank 0's master copy: the gather spreads it, every replica agrees.
                 ("step=5,rank=0,layer=fc1,index=7,phase=param,kind=bitflip,bit=30", "hardware-transient",
                  (5, "param", "fc1", 0), False),
                 # A parameter of rank 0's copy of rank 1's slice: rank 0's replica alone differs.
                 ("step=5,rank=0,layer=fc3,index=7,phase=param,kind=bitflip,bit=30", "hardware-transient",
                  (5, "param", "fc3", 0), True))
        for i, (spec, verdict, truth, diverge) in enumerate(cases):
            d = self.path("fault-%d" % i)
            self.train("fault-%d" % i, args + ["--inject", spec], 2)
            kinds = {x["detector"] for x in incidents(d)}
            self.assertEqual("replica-divergence" in kinds, diverge, (spec, kinds))
            got = self.bisect(d, 2, verdict)
            self.assertEqual((got["step"], got["phase"], got["layer"], got["rank"]), truth, spec)
        # Negative control: the clean sharded run has no incident and bisects to none.
        self.train("clean", args, 2)
        self.assertEqual(incidents(self.path("clean")), [])
        self.assertEqual(self.bisect(self.path("clean"), 2, "none")["verdict"], "none")

    def test_a_fault_on_state_a_rank_does_not_hold_is_refused(self):
        self.assert_refused(["train", "--run-dir", self.path("refused"), "--shard-optimizer"] + MLP +
                            ["--inject", "step=2,rank=0,layer=fc3,index=3,phase=optimizer,kind=nan"], EXIT_USAGE,
                            "with --shard-optimizer rank 0 holds no optimizer state of element 3 of 'fc3'")


if __name__ == "__main__":
    import unittest
    unittest.main(verbosity=2)
