"""A decoder written the torch 2.x way (examples/train_gpt.py: F.scaled_dot_product_attention,
nn.RMSNorm, rotary embeddings, grouped-query attention, SwiGLU; untied head and head tied to the
embedding) under culprit: the same bits at W = 1, 2, 4, the same bits as plain PyTorch eager
training it under culprit's contract (reference_trainer.py --script), and an injected fault named
exactly by `culprit bisect` (a clean run: none). And the attention kernel itself: on the CPU, SDPA
runs libtorch's flash-attention kernel, bitwise the same at 1 and 2 threads and from run to run."""
import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import culprit_testlib as testlib  # noqa: E402
from culprit_testlib import HERE, PY, ROOT, TIMEOUT, TempDirTest, run_each_rank_code  # noqa: E402

SCRIPT = os.path.join(ROOT, "examples", "train_gpt.py")
SIZE = ["--global-batch", "16", "--micro-shards", "4", "--checkpoint-every", "2", "--keep-last", "10", "--quiet"]
STEPS = 6

SDPA_PROBE = r"""
import hashlib, json, torch, torch.nn.functional as F
torch.use_deterministic_algorithms(True)
def h(t): return hashlib.sha1(t.detach().contiguous().numpy().tobytes()).hexdigest()
torch.manual_seed(0)
q = torch.randn(4, 4, 16, 8, requires_grad=True)
k, v = (torch.randn(4, 2, 16, 8, requires_grad=True) for _ in range(2))
with torch.profiler.profile() as prof:
    F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
kernels = sorted({e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product")})
results = []
for threads in (1, 2, 1, 2):
    torch.set_num_threads(threads)
    for t in (q, k, v):
        t.grad = None
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    (y * torch.arange(y.numel()).reshape(y.shape).sin()).sum().backward()
    results.append([h(y), h(q.grad), h(k.grad), h(v.grad)])
print(json.dumps({"kernels": kernels, "results": results}))
"""


def metrics(run_dir):
    return [{k: m[k] for k in ("step", "loss", "fingerprint")} for m in testlib.metrics(run_dir)]


class ModernDecoder(TempDirTest):
    def train(self, name, world, function="build", extra=()):
        run_dir = self.path(name)
        args = (["tied"] if function == "build_tied" else []) + ["--run-dir", run_dir, "--steps", str(STEPS)]
        codes, out, err = run_each_rank_code(args + SIZE + list(extra), world, self.tmp, cwd=self.tmp,
                                             program=[PY, SCRIPT])
        self.assertEqual(codes, [0] * world, out + err)
        return run_dir

    def eager(self, function):
        """reference_trainer.py --script: the script's Setup trained by plain PyTorch eager."""
        proc = subprocess.run([PY, os.path.join(HERE, "reference_trainer.py"), "--script", SCRIPT + ":" + function,
                               "--steps", str(STEPS), "--global-batch", "16", "--micro-shards", "4"],
                              capture_output=True, text=True, timeout=TIMEOUT, cwd=self.tmp)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        rows = [json.loads(line) for line in proc.stdout.splitlines()]
        return [{"step": r["step"], "loss": r["loss"], "fingerprint": r["fingerprint"]} for r in rows]

    def assert_same_as_eager(self, ours, eager):
        self.assertEqual(len(ours), STEPS)
        self.assertEqual([(m["step"], m["fingerprint"]) for m in ours], [(r["step"], r["fingerprint"]) for r in eager])
        for m, r in zip(ours, eager):  # culprit prints the float32 loss with 9 significant digits
            self.assertEqual(float("%.9g" % r["loss"]), m["loss"])

    def test_same_bits_at_every_world_size_and_as_eager(self):
        runs = {w: metrics(self.train("w%d" % w, w)) for w in (1, 2, 4)}
        self.assertEqual(runs[1], runs[2])
        self.assertEqual(runs[1], runs[4])
        self.assert_same_as_eager(runs[1], self.eager("build"))
        tied = {w: metrics(self.train("tied%d" % w, w, "build_tied")) for w in (1, 2)}
        self.assertEqual(tied[1], tied[2])
        self.assert_same_as_eager(tied[1], self.eager("build_tied"))
        # Negative control: the tied and untied decoders differ, and so would a wrong comparison.
        self.assertNotEqual(tied[1][-1]["fingerprint"], runs[1][-1]["fingerprint"])

    def test_fault_in_attention_is_named_exactly_and_a_clean_run_is_none(self):
        spec = "step=3,rank=1,layer=blocks.1.attn.q,index=5,phase=forward,kind=bitflip,bit=22"
        bad = self.train("bad", 2, extra=["--trace", "layer", "--on-detect", "warn", "--inject", spec])
        got = self.bisect(bad, 2, "hardware-transient")
        self.assertEqual((got["verdict"], got["step"], got["phase"], got["layer"], got["rank"]),
                         ("hardware-transient", 3, "forward", "blocks.1.attn.q", 1), got)
        spec = "step=4,rank=0,layer=blocks.0.mlp.down,index=3,phase=backward,kind=bitflip,bit=21"
        bad = self.train("bad_tied", 2, "build_tied", ["--trace", "layer", "--on-detect", "warn", "--inject", spec])
        got = self.bisect(bad, 2, "hardware-transient")
        self.assertEqual((got["verdict"], got["step"], got["phase"], got["layer"], got["rank"]),
                         ("hardware-transient", 4, "backward", "blocks.0.mlp.down", 0), got)
        clean = self.train("clean", 2, extra=["--trace", "layer"])
        self.bisect(clean, 2, "none")

    def test_sdpa_on_the_cpu_is_flash_attention_and_deterministic(self):
        proc = subprocess.run([PY, "-c", SDPA_PROBE], capture_output=True, text=True, timeout=TIMEOUT)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        got = json.loads(proc.stdout.splitlines()[-1])
        self.assertEqual(got["kernels"], ["aten::_scaled_dot_product_flash_attention_for_cpu"], got)
        self.assertEqual(len(got["results"]), 4)
        self.assertEqual(len({tuple(r) for r in got["results"]}), 1, got["results"])  # 1 and 2 threads, twice


if __name__ == "__main__":
    unittest.main()
