"""--shard-params (ZeRO-3 / FSDP-style; docs/determinism.md, "Sharded parameters") under real mpirun:
each rank holds only its slice of the parameters, of their gradient and of their optimizer state,
gathers a layer's parameters around its forward and backward, and sends each micro-shard's gradient
to the slices' owners during its backward pass. Scored against the unsharded run (the truth the
contract defines): the same bits at W = 1..4 for the built-in models, a TorchScript model and the
recipes (bf16, clipping, small buckets, --keep-gathered); checkpoints written in slices that resume at
any W and layout and export the unsharded tensors; the parameter and gradient buffers' resident
memory measured by the kernel (mincore) falling as 1/W; a fault in a slice that only its owner holds,
at rest or on its way in a gather, bisected to that owner; and the refusals. Each comparison has a control that
could fail (another learning rate gives other bits; the unsharded buffer is all resident)."""
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(__file__))
import culprit_testlib as testlib  # noqa: E402
from culprit_testlib import (EXIT_USAGE, PY, ROOT, TempDirTest, incidents, make_scripted_model, run,  # noqa: E402
                             run_each_rank_code)

MLP = ["--model", "mlp", "--hidden", "96", "--global-batch", "32", "--micro-shards", "4", "--samples", "256"]
CNN = ["--model", "cnn", "--global-batch", "16", "--micro-shards", "4", "--samples", "64"]
ADAMW = ["--optimizer", "adamw", "--lr", "0.003", "--weight-decay", "0.1"]
SGD = ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--nesterov", "--weight-decay", "0.01"]
GPT = ["--model", "gpt", "--global-batch", "8", "--micro-shards", "4", "--samples", "64", "--optimizer", "adamw",
       "--lr", "0.003", "--weight-decay", "0.1", "--clip-grad-norm", "1", "--tie-head", "--layers", "2"]
# Metrics that differ by layout: the optimizer's and the measured memory.
LAYOUT = ("optimizer_bytes", "peak_rss_bytes", "param_resident_bytes", "grad_resident_bytes")


def safetensors_tensors(path):
    """A safetensors file's tensors: name -> (dtype, shape, bytes), read from its layout (an 8-byte
    header length, the JSON header, the data)."""
    import json
    import struct
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    return {k: (v["dtype"], tuple(v["shape"]), data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}


def without_layout(lines):
    return [{k: v for k, v in m.items() if k not in LAYOUT} for m in lines]


class ShardParams(TempDirTest):
    def checkpoint(self, name, step):
        return self.path(name, "checkpoints", "step-%08d.h5" % step)

    def assert_same_run(self, name, base, world, what):
        got = without_layout(self.train(name, what[1], world).metrics(timings=False))
        self.assertEqual(got, base, "%s W=%d" % (what[0], world))
        res = run(["diff", self.checkpoint(name, 4), self.checkpoint(what[2], 4)])
        self.assertEqual(res.code, 0, res.out + res.err)

    def test_bitwise_equal_to_unsharded_at_every_world_size(self):
        # Every built-in model, AdamW and SGD, bf16 with clipping and a tied head (a layer that reads
        # another layer's parameter), the reduction overlapped (small buckets) or not; W = 3 cuts
        # unevenly and computes 1 or 2 micro-shards per rank (phantom gathers).
        recipes = (("mlp-adamw", MLP + ADAMW, (1, 3)),
                   ("cnn-sgd", CNN + SGD, (2,)),
                   ("gpt-bf16", GPT + ["--precision", "bf16", "--bucket-mb", "0.01"], (2, 3, 4)))
        for recipe, args, worlds in recipes:
            args = args + ["--steps", "4", "--checkpoint-every", "2"]
            base = without_layout(self.train("%s-plain" % recipe, args, 1).metrics(timings=False))
            for world in worlds:
                self.assert_same_run("%s-%d" % (recipe, world), base, world,
                                     (recipe, args + ["--shard-params"], "%s-plain" % recipe))
            # One gather per layer and step: the same bits.
            self.assert_same_run("%s-keep" % recipe, base, 2,
                                 (recipe + " keep", args + ["--shard-params", "--keep-gathered"], "%s-plain" % recipe))
        # Negative control: another learning rate gives other bits (the comparison can fail).
        other = self.train("other", MLP + ADAMW[:-2] + ["--weight-decay", "0.2", "--steps", "4", "--shard-params"], 2)
        self.assertNotEqual(other.final_fingerprint(), self.train("again", MLP + ADAMW + ["--steps", "4"], 1).final_fingerprint())

    def test_a_torchscript_model_is_one_gathered_unit(self):
        # An opaque forward: its parameters are gathered for the whole step (dropout inside: the
        # generator seeded per micro-shard).
        path = self.path("mlp_dropout.pt")
        make_scripted_model(path, "mlp_dropout")
        args = ["--model", "torchscript:" + path, "--micro-shards", "4", "--steps", "3"] + ADAMW
        want = self.train("ts-plain", args, 1).final_fingerprint()
        for world in (2, 3):
            self.assertEqual(self.train("ts-%d" % world, args + ["--shard-params"], world).final_fingerprint(), want)

    def test_python_models_a_tied_head_and_torch_attention(self):
        # examples/train_gpt.py tied: a torch 2.x decoder (SDPA, RMSNorm, rotary, GQA, SwiGLU) whose
        # head is the token embedding's table (a tied name: gathered for the head's call too).
        script = os.path.join(ROOT, "examples", "train_gpt.py")
        size = ["--global-batch", "16", "--micro-shards", "4", "--steps", "3", "--quiet"]

        def fingerprints(name, world, extra):
            first = ["tied"] if script.endswith("train_gpt.py") else []
            codes, out, err = run_each_rank_code(first + ["--run-dir", self.path(name)] + size + extra, world, self.tmp,
                                                 cwd=self.tmp, program=[PY, script])
            self.assertEqual(codes, [0] * world, out + err)
            return [m["fingerprint"] for m in testlib.metrics(self.path(name))]

        want = fingerprints("py-plain", 1, [])
        for world in (2, 3):
            self.assertEqual(fingerprints("py-%d" % world, world, ["--shard-params"]), want, "W=%d" % world)
        # nn.TransformerEncoderLayer: nn.MultiheadAttention reads its out_proj leaf's parameters itself.
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "py_attention.py")
        want = fingerprints("mha-plain", 1, [])
        self.assertEqual(fingerprints("mha-2", 2, ["--shard-params"]), want)

    def test_slices_resume_at_any_world_and_layout(self):
        args = MLP + ADAMW + ["--steps", "8", "--checkpoint-every", "4"]
        whole = self.train("whole", args, 1)
        self.train("sharded", args + ["--shard-params"], 4)
        self.assertEqual(run(["verify", self.path("sharded")]).code, 0)
        res = run(["diff", self.checkpoint("sharded", 4), self.checkpoint("whole", 4)])
        self.assertEqual(res.code, 0, res.out + res.err)
        # culprit export assembles the slices into the whole state dict: the unsharded run's tensors.
        exported = {}
        for src in ("sharded", "whole"):
            out = self.path("%s.safetensors" % src)
            res = run(["export", "--run-dir", self.path(src), "--step", "4", "--format", "safetensors", "--out", out])
            self.assertEqual(res.code, 0, res.err)
            exported[src] = safetensors_tensors(out)
        self.assertTrue(exported["whole"])
        self.assertEqual(exported["sharded"], exported["whole"])
        # From the sharded checkpoint of step 4: other worlds, sharded or not; and an unsharded one sharded.
        for src, world, flags in (("sharded", 2, ["--shard-params"]), ("sharded", 3, ["--shard-params"]),
                                  ("sharded", 1, ["--shard-params=false"]),
                                  ("sharded", 2, ["--shard-params=false", "--shard-optimizer"]),
                                  ("whole", 3, ["--shard-params"])):
            name = "resume-%s-%d-%s" % (src, world, flags[-1].strip("-").replace("=", "-"))
            shutil.copytree(self.path(src), self.path(name))
            os.remove(self.checkpoint(name, 8))  # the newest valid checkpoint is now step 4's
            res = run(["train", "--quiet", "--resume"] + flags, world=world, run_dir=self.path(name))
            self.assertEqual(res.code, 0, res.err)
            self.assertEqual(res.final_fingerprint(), whole.final_fingerprint(), name)

    def test_the_parameters_resident_memory_falls_as_one_over_w(self):
        # The kernel's count (mincore) of the parameter buffer's resident bytes after each step:
        # the rank's slice (1/W) and at most a page at each end of it; the unsharded run's buffer
        # is all resident (the control: the measurement sees memory that is there).
        args = GPT + ["--width", "128", "--steps", "2", "--memory-metrics"]
        plain = self.train("mem-plain", args, 2).metrics()[-1]
        whole = plain["param_resident_bytes"]
        self.assertGreater(whole, 4 * 400000)
        grad = {}
        for world in (2, 4):
            m = self.train("mem-%d" % world, args + ["--shard-params"], world).metrics()[-1]
            self.assertLessEqual(m["param_resident_bytes"], whole / world + 2 * 4096 + 4096, "W=%d" % world)
            self.assertGreaterEqual(m["param_resident_bytes"], whole / world - 2 * 4096 - 4096, "W=%d" % world)
            self.assertGreater(m["peak_rss_bytes"], 0)
            grad[world] = m["grad_resident_bytes"]
        # The gradient's buffers (the leaf's resident pages, the partial sums, the reduced slice, the
        # values fetched past it, the clipped slice) fall with W too: one slice of partial sums (W
        # divides M = 4: log2(M/W) + 1 at most), the reduced and the clipped slice (3 slices: 0.5
        # from W = 2 to 4), plus a few pages and the fetched parameters (clipping needs each
        # parameter whole on one rank) that do not shrink; all under 7 slices' worth.
        self.assertLess(grad[4], 0.65 * grad[2], grad)
        self.assertLessEqual(grad[2], 7 * whole / 2, grad)
        self.assertGreater(grad[4], whole / 4, grad)  # the control: at least the partial sums are there

    def test_a_fault_in_a_slice_only_its_owner_holds_is_bisected_to_the_owner(self):
        # With two ranks, fc1 lies in rank 0's slice, fc3 in rank 1's. The fault lands on the owner's
        # slice after its update: the gathers give every rank the same wrong value, so no replica
        # disagrees; the trace's slice records and the replay find it, and name the owner.
        args = MLP + ADAMW + ["--steps", "8", "--checkpoint-every", "4", "--shard-params", "--on-detect", "warn"]
        cases = (("step=5,rank=0,layer=fc1,index=7,phase=param,kind=bitflip,bit=30", "hardware-transient",
                  (5, "param", "fc1", 0)),
                 ("step=6,rank=1,layer=fc3,index=3,phase=optimizer,kind=bitflip,bit=30,mode=persistent",
                  "hardware-persistent", (6, "optimizer", "fc3", 1)))
        for i, (spec, verdict, truth) in enumerate(cases):
            d = self.path("fault-%d" % i)
            self.train("fault-%d" % i, args + ["--inject", spec], 2)
            got = self.bisect(d, 2, verdict)
            self.assertEqual((got["step"], got["phase"], got["layer"], got["rank"]), truth, spec)
        # Negative control: the clean sharded run has no incident and bisects to none.
        self.train("clean", args, 2)
        self.assertEqual(incidents(self.path("clean")), [])
        self.assertEqual(self.bisect(self.path("clean"), 2, "none")["verdict"], "none")

    def test_a_slice_changed_at_rest_is_caught_online_and_names_its_owner(self):
        # phase=gather: rank 1's slice of fc3.weight changes in its memory after its update was
        # recorded; every rank's gather check (the owner's included) sees the chunk differ from the
        # owner's record at the next gather, and the vote names the owner. With W = 3 the slice's
        # owner is another rank: the truth is computed from the injected spec, not read back.
        args = MLP + ADAMW + ["--steps", "8", "--checkpoint-every", "4", "--shard-params", "--on-detect", "warn"]
        for world, rank, layer in ((2, 1, "fc3"), (3, 0, "fc1")):
            name = "rest-%d" % world
            spec = "step=5,rank=%d,layer=%s,index=5,phase=gather,kind=bitflip,bit=30" % (rank, layer)
            self.train(name, args + ["--inject", spec], world)
            got = [(x["detector"], x["step"], x["rank"], x["tensor"]) for x in incidents(self.path(name))]
            self.assertEqual(got[0], ("gather-check", 5, rank, layer + ".weight"), got)
            self.assertIn("changed at rest on its owner", incidents(self.path(name))[0]["message"])
            # The bisection: every rank's micro-shards differ (they all gathered the changed slice);
            # the gather check's owner is blamed, unconfirmed (a whole replay holds no slice at rest).
            got = self.bisect(self.path(name), world, "hardware-unconfirmed")
            self.assertEqual((got["step"], got["phase"], got["layer"], got["rank"]), (5, "gather", layer, rank))
        # phase=gather-link: the owner's memory is right, but what its link delivers to every other
        # rank in the step's first gather of fc3.weight differs; the owner's own check is clean, the
        # others' see it: the vote names the owner (its link), and so does the bisection.
        for world, rank in ((2, 1), (3, 2)):
            name = "link-%d" % world
            spec = "step=5,rank=%d,layer=fc3,index=5,phase=gather-link,kind=bitflip,bit=30" % rank
            self.train(name, args + ["--inject", spec], world)
            found = incidents(self.path(name))
            got = [(x["detector"], x["step"], x["rank"], x["tensor"]) for x in found]
            self.assertEqual(got[0], ("gather-check", 5, rank, "fc3.weight"), got)
            self.assertIn("arrived at every other rank", found[0]["message"])
            got = self.bisect(self.path(name), world, "hardware-unconfirmed")
            self.assertEqual((got["step"], got["phase"], got["layer"], got["rank"]), (5, "gather-link", "fc3", rank))
        # Negative control: the same run without the fault has no incident (the check ran: --comm-check
        # is on by default) and its bits differ from the faulty run's (the fault was real).
        clean = self.train("rest-clean", args, 2)
        self.assertEqual(incidents(self.path("rest-clean")), [])
        self.assertNotEqual(clean.final_fingerprint(), testlib.metrics(self.path("rest-2"))[-1]["fingerprint"])

    def test_refusals(self):
        for args, want in (
                (MLP + ["--keep-gathered"], "give --shard-params too"),
                (MLP + ["--shard-params", "--spot-check", "0.5"], "with --shard-params use the audit"),
                (MLP + ["--shard-params", "--inject", "step=2,rank=0,layer=fc3,index=3,phase=param,kind=nan"],
                 "with --shard-params rank 0 holds no element 3 of 'fc3'"),
                (MLP + ["--inject", "step=2,rank=0,layer=fc1,phase=gather,kind=nan"], "give --shard-params"),
                (MLP + ["--inject", "step=2,rank=0,layer=fc1,phase=gather-link,kind=nan"], "give --shard-params"),
                (MLP + ["--shard-params", "--inject", "step=2,rank=0,layer=fc3,index=3,phase=gather-link,kind=nan"],
                 "with --shard-params rank 0 holds no element 3 of 'fc3'")):
            self.assert_refused(["train", "--run-dir", self.path("refused")] + args, EXIT_USAGE, want)


if __name__ == "__main__":
    import unittest
    unittest.main(verbosity=2)
