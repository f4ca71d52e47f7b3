"""The user's recipe as written (docs/python.md, "Your training script -> culprit"): scripts in the
style of nanoGPT's train.py (its model's (logits, loss) output, configure_optimizers' groups, get_lr's
cosine with a floor, clipping, a tied head) and of nanochat (QK-norm, rotary, SDPA, an untied head,
Muon + AdamW with per-group rates as culprit.Optimizers, a per-group schedule) train under culprit
with the documented wrapping only: the same bits at W = 1, 2, 4, the same bits as plain PyTorch
eager (reference_trainer.py --script), a resume at another world size, an update fault of an
optimizer culprit does not know named exactly by the bisection (a clean run: none), an exported
checkpoint that the script's model loads with strict=True, and a changed schedule refused on replay."""
import importlib.util
import json
import math
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import culprit_testlib as testlib  # noqa: E402
from culprit_testlib import HERE, PY, ROOT, TIMEOUT, TempDirTest, run_each_rank_code  # noqa: E402

PKG = os.environ.get("CULPRIT_PYTHON_DIR", os.path.join(ROOT, "build", "python"))

RECIPES = os.path.join(HERE, "recipes")
NANOGPT = os.path.join(RECIPES, "nanogpt_style.py")
NANOCHAT = os.path.join(RECIPES, "nanochat_style.py")
VARIANTS = os.path.join(HERE, "py_variants.py")
SIZE = ["--global-batch", "16", "--micro-shards", "4", "--checkpoint-every", "2", "--keep-last", "10", "--quiet"]
STEPS = 8


def metrics(run_dir):
    return [{k: m[k] for k in ("step", "loss", "fingerprint")} for m in testlib.metrics(run_dir)]


def config(run_dir):
    with open(os.path.join(run_dir, "run.json")) as f:
        return json.load(f)["config"].splitlines()


def py_env(**extra):
    env = dict(os.environ, PYTHONPATH=PKG, CULPRIT_PYTHON_DIR=PKG)
    env.update(extra)
    return env


def load(path):
    spec = importlib.util.spec_from_file_location("recipe_" + os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Recipes(TempDirTest):
    def train(self, script, name, world, extra=(), steps=STEPS, env=None):
        run_dir = self.path(name)
        codes, out, err = run_each_rank_code(["--run-dir", run_dir, "--steps", str(steps)] + SIZE + list(extra), world,
                                             self.tmp, cwd=self.tmp, program=[PY, script], env=env or py_env())
        self.assertEqual(codes, [0] * world, out + err)
        return run_dir

    def eager(self, script, extra=()):
        proc = subprocess.run([PY, os.path.join(HERE, "reference_trainer.py"), "--script", script + ":build",
                               "--steps", str(STEPS), "--global-batch", "16", "--micro-shards", "4"] + list(extra),
                              capture_output=True, text=True, timeout=TIMEOUT, cwd=self.tmp, env=py_env())
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return [json.loads(line) for line in proc.stdout.splitlines()]

    def assert_same_as_eager(self, ours, eager):
        self.assertEqual([(m["step"], m["fingerprint"]) for m in ours], [(r["step"], r["fingerprint"]) for r in eager])
        for m, r in zip(ours, eager):  # culprit prints the float32 loss with 9 significant digits
            self.assertEqual(float("%.9g" % r["loss"]), m["loss"])

    def test_nanogpt_train_py_as_written(self):
        clip = ["--clip-grad-norm", "1.0"]
        runs = {w: self.train(NANOGPT, "gpt%d" % w, w, clip) for w in (1, 2, 4)}
        got = {w: metrics(r) for w, r in runs.items()}
        self.assertEqual(len(got[1]), STEPS)
        self.assertEqual(got[1], got[2])
        self.assertEqual(got[1], got[4])
        self.assert_same_as_eager(got[1], self.eager(NANOGPT, clip))
        # configure_optimizers' groups are culprit's own AdamW (nanoGPT's decay set: ndim2), and the
        # rates are get_lr's, its floor included (truth: the formula, not culprit's output).
        cfg = config(runs[2])
        for line in ("optimizer = adamw", "weight-decay-params = ndim2", "betas = 0.9,0.95", "weight-decay = 0.1"):
            self.assertIn(line, cfg)
        lr, floor, warm, decay = 6e-3, 6e-4, 2, 8
        want = [lr * (it + 1) / (warm + 1) if it < warm else floor + 0.5 * (1 + math.cos(math.pi * (it - warm) / (decay - warm))) * (lr - floor)
                for it in range(STEPS)]
        self.assertEqual([m["lr"] for m in testlib.metrics(runs[1])], [float("%.17g" % v) for v in want])
        self.assertTrue(all("clip_factor" in m for m in testlib.metrics(runs[1])))
        # The checkpoint, exported, loads into the script's own model: tied names included.
        out = self.path("gpt.pt")
        codes, o, e = run_each_rank_code(["export", "--run-dir", runs[1], "--format", "torch", "--out", out], 1,
                                         self.tmp, cwd=self.tmp, program=[PY, "-m", "culprit"], env=py_env())
        self.assertEqual(codes, [0], o + e)
        probe = ("import sys, torch; sys.path.insert(0, %r); import nanogpt_style as n; m = n.GPT(n.GPTConfig()); "
                 "sd = torch.load(%r); m.load_state_dict(sd, strict=True); "
                 "print(sorted(sd) == sorted(m.state_dict()), torch.equal(sd['lm_head.weight'], sd['transformer.wte.weight']))"
                 % (RECIPES, out))
        proc = subprocess.run([PY, "-c", probe], capture_output=True, text=True, timeout=TIMEOUT, env=py_env())
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout.split(), ["True", "True"])
        # A fault injected at the layer that holds the tied weight by its other name (lm_head) lands
        # on that weight, and the bisection names it by its own name's layer.
        spec = "step=3,rank=1,layer=lm_head,index=9,phase=param,kind=bitflip,bit=21"
        bad = self.train(NANOGPT, "tied_fault", 2, clip + ["--trace", "layer", "--on-detect", "warn", "--inject", spec],
                         steps=4)
        d = self.bisect(bad, 2, "hardware-transient", env=py_env())
        self.assertEqual((d["step"], d["phase"], d["layer"], d["rank"]), (3, "param", "transformer.wte", 1), d)

    def test_nanochat_muon_adamw_bitwise_resumable_and_bisected(self):
        runs = {w: self.train(NANOCHAT, "chat%d" % w, w, ["--trace", "layer"]) for w in (1, 2, 4)}
        got = {w: metrics(r) for w, r in runs.items()}
        self.assertEqual(got[1], got[2])
        self.assertEqual(got[1], got[4])
        self.assert_same_as_eager(got[1], self.eager(NANOCHAT))
        cfg = config(runs[1])
        self.assertIn("optimizer = script", cfg)
        self.assertIn("script-optimizer = AdamW+Muon", cfg)
        # Every group's rate, recorded per step: the schedule's (truth: the script's own function).
        chat = load(NANOCHAT)
        self.assertEqual([m["lrs"] for m in testlib.metrics(runs[1])],
                         [[float("%.17g" % (lr * chat.lr_multiplier(it))) for lr in chat.INITIAL_LRS]
                          for it in range(STEPS)])
        # Resumed at another world size from step 4: the same bits as the run never stopped.
        part = self.train(NANOCHAT, "part", 2, ["--trace", "layer"], steps=4)
        codes, out, err = run_each_rank_code(["--run-dir", part, "--resume", "--steps", str(STEPS), "--quiet"], 4,
                                             self.tmp, cwd=self.tmp, program=[PY, NANOCHAT], env=py_env())
        self.assertEqual(codes, [0] * 4, out + err)
        self.assertEqual(metrics(part), got[1])
        # Faults around the update of the optimizer culprit does not know (Muon's matrices): in a
        # parameter it wrote, in its momentum, in the reduction it was handed; each named exactly.
        for name, spec, step, phase, layer, rank in (
                ("param", "step=5,rank=1,layer=blocks.0.mlp.c_fc,index=7,phase=param,kind=bitflip,bit=20",
                 5, "param", "blocks.0.mlp.c_fc", 1),
                ("state", "step=3,rank=0,layer=blocks.1.mlp.c_fc,index=11,phase=optimizer,kind=bitflip,bit=24",
                 3, "optimizer", "blocks.1.mlp.c_fc", 0),
                ("comm", "step=4,rank=1,layer=blocks.0.attn.c_v,index=3,phase=comm,kind=bitflip,bit=30",
                 4, "comm", "blocks.0.attn.c_v", 1)):
            bad = self.train(NANOCHAT, "bad_" + name, 2, ["--trace", "layer", "--on-detect", "warn", "--inject", spec],
                             steps=6)
            d = self.bisect(bad, 2, "hardware-transient", env=py_env())
            self.assertEqual((d["verdict"], d["step"], d["phase"], d["layer"], d["rank"]),
                             ("hardware-transient", step, phase, layer, rank), d)
        # And a fault in one of its layers' forward pass.
        spec = "step=3,rank=0,layer=blocks.1.attn.c_q,index=5,phase=forward,kind=bitflip,bit=22"
        bad = self.train(NANOCHAT, "bad_fwd", 2, ["--trace", "layer", "--on-detect", "warn", "--inject", spec])
        d = self.bisect(bad, 2, "hardware-transient", env=py_env())
        self.assertEqual((d["verdict"], d["step"], d["phase"], d["layer"], d["rank"]),
                         ("hardware-transient", 3, "forward", "blocks.1.attn.c_q", 0), d)
        # Negative control: the clean run has nothing to name.
        self.bisect(runs[2], 2, "none", env=py_env())
        # A schedule that now gives other rates (it reads the environment) is refused, not replayed.
        codes, out, err = run_each_rank_code(["bisect", "--run-dir", runs[2]], 2, self.tmp, cwd=self.tmp,
                                             program=[PY, "-m", "culprit"],
                                             env=py_env(RECIPE_WARMDOWN="0.25"))
        self.assertEqual(codes, [2, 2], out + err)
        self.assertIn("the learning-rate schedule now gives step 6 other rates than the run used (group 0: 0.05, recorded 0.0375", err)

    def test_an_optimizer_of_numbers_resumes_and_refusals(self):
        env = py_env(CULPRIT_VARIANT="number_state")
        whole = self.train(VARIANTS, "numbers", 2, env=env)
        self.assertIn("optimizer-state = count:int,scale:float", config(whole))
        # Its int and float state through a checkpoint: resumed at W = 1 from step 4, the same bits.
        part = self.train(VARIANTS, "numbers_part", 2, env=env, steps=4)
        codes, out, err = run_each_rank_code(["--run-dir", part, "--resume", "--steps", str(STEPS), "--quiet"], 1,
                                             self.tmp, cwd=self.tmp, program=[PY, VARIANTS], env=env)
        self.assertEqual(codes, [0], out + err)
        self.assertEqual(metrics(part), metrics(whole))
        # The checkpoint holds them as the optimizer computed them (truth: its recurrence), typed.
        import h5py
        with h5py.File(os.path.join(part, "checkpoints", "step-00000004.h5"), "r") as f:
            for name in ("0.weight", "2.bias"):
                count, scale = f["optimizer"][name]["count"], f["optimizer"][name]["scale"]
                self.assertEqual((count.dtype.name, int(count[()])), ("int64", 4))
                want = 1.0
                for _ in range(4):
                    want = 0.9 * want + 0.1
                self.assertEqual((scale.dtype.name, float(scale[()])), ("float64", want))
        # Refusals, one line each: --shard-optimizer with the script's own optimizer; a mean loss
        # declared a sum, also when a micro-shard holds one sample.
        for variant, extra, said in (
                ("number_state", ["--shard-optimizer"], "option '--shard-optimizer' needs culprit's own update"),
                ("mean_loss", ["--global-batch", "4", "--micro-shards", "4"],
                 "the loss must be the sum over the samples as the Setup declares")):
            codes, out, err = run_each_rank_code(["--run-dir", self.path("no-" + variant), "--steps", "2"] + extra, 2,
                                                 self.tmp, cwd=self.tmp, program=[PY, VARIANTS],
                                                 env=py_env(CULPRIT_VARIANT=variant))
            self.assertEqual(codes, [2, 2], out + err)
            self.assertIn(said, err)
            self.assertEqual(len([l for l in err.splitlines() if l.startswith("culprit: error:")]), 1, err)  # rank 0 says it

    def test_a_torch_scheduler_drives_each_group(self):
        env = py_env(CULPRIT_VARIANT="step_lr")
        runs = {w: self.train(VARIANTS, "steplr%d" % w, w, env=env) for w in (1, 2)}
        self.assertEqual(metrics(runs[1]), metrics(runs[2]))
        self.assertIn("optimizer = script", config(runs[1]))
        # StepLR(step_size=2, gamma=0.5) over the groups' own rates (truth: its closed form).
        self.assertEqual([m["lrs"] for m in testlib.metrics(runs[1])],
                         [[0.2 * 0.5 ** (it // 2), 0.05 * 0.5 ** (it // 2)] for it in range(STEPS)])
        proc = subprocess.run([PY, os.path.join(HERE, "reference_trainer.py"), "--script", VARIANTS + ":build",
                               "--steps", str(STEPS), "--global-batch", "16", "--micro-shards", "4"],
                              capture_output=True, text=True, timeout=TIMEOUT, cwd=self.tmp, env=env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assert_same_as_eager(metrics(runs[1]), [json.loads(line) for line in proc.stdout.splitlines()])


if __name__ == "__main__":
    unittest.main()
