"""`culprit export` (docs/checkpoint-format.md, "Exporting a checkpoint"): a run's checkpoint as a
state dict a user's own PyTorch model loads. A built-in model's export, in both formats, holds the
checkpoint's tensors bit for bit (read here with h5py; a changed value is seen); a Python run's,
made through `python -m culprit export` and through the plain executable (which hands the run to
the package), holds every name of the script's model's state_dict() (a tied head under both names,
a persistent buffer) and loads with load_state_dict(strict=True); bad input is one line and the
documented exit code, and leaves no file behind."""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import h5py
import torch

sys.path.insert(0, os.path.dirname(__file__))
from culprit_testlib import (CRASH_MARKERS, EXIT_DAMAGED, EXIT_IO, EXIT_OK, EXIT_USAGE, MPIRUN, PY, ROOT,  # noqa: E402
                             SMALL_MLP, TIMEOUT, TempDirTest, error_lines, run)

PKG = os.environ.get("CULPRIT_PYTHON_DIR", os.path.join(ROOT, "build", "python"))

# safetensors' dtype names (huggingface/safetensors) as torch dtypes.
SAFETENSORS_DTYPES = {"F32": torch.float32, "F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                      "U8": torch.uint8, "BOOL": torch.bool}


def read_safetensors(path):
    """A safetensors file by its specification alone (the package is not installed here): the
    tensors in file order and the metadata. The checks are those of safetensors' own reader: the
    header's length, JSON, and data offsets that cover the data exactly, in order, without holes."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    base, end = 8 + n, 0
    out = {}
    for name, h in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"]):
        b, e = h["data_offsets"]
        assert b == end, "%s starts at %d, not at %d" % (name, b, end)
        end = e
        dtype = SAFETENSORS_DTYPES[h["dtype"]]
        raw = bytearray(data[base + b:base + e])
        t = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(h["shape"])
    assert base + end == len(data), "data ends at %d, the file at %d" % (base + end, len(data))
    return out, meta


def checkpoint_tensors(path):
    """The checkpoint's /model tensors, read with h5py: name -> tensor."""
    with h5py.File(path, "r") as f:
        return {name: torch.from_numpy(f["model"][name][()]) for name in f["model"]}


def differing(a, b):
    """The names whose tensors are not bitwise equal (dtype, shape and bytes), or present in one only."""
    out = sorted(set(a) ^ set(b))
    for name in set(a) & set(b):
        x, y = a[name], b[name]
        if x.dtype != y.dtype or x.shape != y.shape or x.contiguous().view(torch.uint8).tolist() != \
                y.contiguous().view(torch.uint8).tolist():
            out.append(name)
    return sorted(out)


def ckpt(run_dir, step):
    return os.path.join(run_dir, "checkpoints", "step-%08d.h5" % step)


class Export(TempDirTest):
    def export(self, run_dir, out, *extra, code=EXIT_OK, program=None, env=None):
        """`culprit export` (or PROGRAM export) of run_dir to out, which must exit `code`: (stdout, stderr)."""
        cmd = (program or [os.environ.get("CULPRIT_BIN", os.path.join(ROOT, "build", "culprit"))]) + \
            ["export", "--run-dir", run_dir, "--out", out] + list(extra)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=env)
        self.assertEqual(proc.returncode, code, proc.stdout + proc.stderr)
        for marker in CRASH_MARKERS:
            self.assertNotIn(marker, proc.stderr)
        if code != EXIT_OK:
            self.assertEqual(len(error_lines(proc.stderr)), 1, proc.stderr)
        return proc.stdout, proc.stderr

    def no_temporaries(self, folder):
        self.assertEqual([n for n in os.listdir(folder) if n.endswith(".tmp")], [])


class BuiltIn(Export):
    @classmethod
    def setUpClass(cls):
        cls.tmp_class = tempfile.mkdtemp(prefix="culprit-export-")
        cls.run_dir = os.path.join(cls.tmp_class, "run")
        res = run(["train", "--steps", "4", "--checkpoint-every", "2", "--hidden", "8", "--samples", "64",
                   "--trace", "off"] + SMALL_MLP, run_dir=cls.run_dir)
        assert res.code == 0, res.out + res.err

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp_class, ignore_errors=True)

    def test_both_formats_hold_the_checkpoint_bit_for_bit(self):
        saved = checkpoint_tensors(ckpt(self.run_dir, 4))
        self.assertEqual(sorted(saved), ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight", "fc3.bias", "fc3.weight"])
        pt, st = self.path("m.pt"), self.path("m.safetensors")
        out, _ = self.export(self.run_dir, pt, "--format", "torch")  # the newest checkpoint: step 4
        self.assertIn("exported step 4 of run", out)
        self.export(self.run_dir, st, "--format", "safetensors", "--step", "4")
        loaded = torch.load(pt)  # torch 2.x: weights_only=True by default
        self.assertEqual(differing(loaded, torch.load(pt, weights_only=True)), [])
        self.assertIs(type(loaded), dict)
        self.assertEqual(list(loaded), sorted(saved))  # the checkpoint's order: by name
        self.assertEqual(differing(loaded, saved), [])
        tensors, meta = read_safetensors(st)
        self.assertEqual(differing(tensors, saved), [])
        self.assertEqual(meta["format"], "pt")
        self.assertEqual(meta["culprit_step"], "4")
        with open(os.path.join(self.run_dir, "run.json")) as f:
            self.assertEqual(meta["culprit_run_id"], json.load(f)["run_id"])
        for t in loaded.values():
            self.assertEqual(t.dtype, torch.float32)
        # Negative control: one changed bit of one value is seen, by name.
        changed = {k: v.clone() for k, v in saved.items()}
        changed["fc2.weight"].view(torch.int32)[0, 0] ^= 1
        self.assertEqual(differing(loaded, changed), ["fc2.weight"])
        self.assertEqual(differing(tensors, changed), ["fc2.weight"])
        # Another step is another checkpoint's tensors (step 0: the initial parameters).
        self.export(self.run_dir, self.path("s0.pt"), "--format", "torch", "--step", "0")
        first = torch.load(self.path("s0.pt"))
        self.assertEqual(differing(first, checkpoint_tensors(ckpt(self.run_dir, 0))), [])
        self.assertEqual(differing(first, loaded), sorted(saved))
        self.no_temporaries(self.tmp)

    def test_refusals_are_one_line_and_their_exit_code(self):
        out = self.path("m.pt")
        _, err = self.export(self.run_dir, out, "--format", "torch", "--step", "3", code=EXIT_USAGE)
        self.assertIn("has no checkpoint of step 3; it has checkpoints of steps 0, 2, 4", err)
        _, err = self.export(self.run_dir, out, "--format", "pickle", code=EXIT_USAGE)
        self.assertIn("option '--format': unknown format 'pickle' (valid: torch, safetensors)", err)
        _, err = self.export(self.path("nothing"), out, "--format", "torch", code=EXIT_USAGE)
        self.assertIn("holds no run", err)
        self.assertFalse(os.path.exists(out))
        # An existing file is kept unless --force.
        with open(out, "w") as f:
            f.write("mine")
        _, err = self.export(self.run_dir, out, "--format", "torch", code=EXIT_USAGE)
        self.assertIn("'%s' exists: give --force to replace it" % out, err)
        with open(out) as f:
            self.assertEqual(f.read(), "mine")
        self.export(self.run_dir, out, "--format", "torch", "--force")
        self.assertEqual(differing(torch.load(out), checkpoint_tensors(ckpt(self.run_dir, 4))), [])
        # A directory that does not exist cannot be written (6); the run's own files are never replaced.
        _, err = self.export(self.run_dir, self.path("no", "m.pt"), "--format", "torch", code=EXIT_IO)
        self.assertIn("No such file or directory", err)
        _, err = self.export(self.run_dir, os.path.join(self.run_dir, "run.json"), "--format", "torch", "--force",
                             code=EXIT_USAGE)
        self.assertIn("is the run's own 'run.json'", err)
        self.no_temporaries(self.tmp)
        self.no_temporaries(self.run_dir)

    def test_a_damaged_checkpoint_is_refused_or_skipped(self):
        run_dir = self.path("copy")
        shutil.copytree(self.run_dir, run_dir)
        with h5py.File(ckpt(run_dir, 4), "r+") as f:
            f["model"]["fc1.bias"][0] += 1.0
        _, err = self.export(run_dir, self.path("m.pt"), "--format", "torch", "--step", "4", code=EXIT_DAMAGED)
        self.assertIn("fc1.bias", err)
        # The newest valid one is step 2: the damaged step 4 is named and skipped, as --resume skips it.
        out, err = self.export(run_dir, self.path("m.pt"), "--format", "safetensors")
        self.assertIn("skipping damaged checkpoint", err)
        self.assertIn("exported step 2", out)
        self.assertEqual(differing(read_safetensors(self.path("m.pt"))[0], checkpoint_tensors(ckpt(run_dir, 2))), [])


# A model with a head tied to its embedding (nanoGPT's lm_head.weight = wte.weight: named_parameters()
# lists the tensor once, state_dict() under both names), a persistent buffer and a non-persistent one.
MODEL = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 8)
        self.norm = nn.LayerNorm(8)
        self.head = nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.full((8,), 0.5))
        self.register_buffer("scratch", torch.zeros(2), persistent=False)

    def forward(self, x):
        return self.head(self.norm(self.emb(x)) * self.scale).sum(1)
'''

SCRIPT = MODEL + '''
import torch.nn.functional as F
import culprit


def batch(idx):
    return (idx[:, None] * 3 + torch.arange(4)) % 16, idx % 16


def build():
    return culprit.Setup(model=Net(), loss=lambda out, y: F.cross_entropy(out, y, reduction="sum"),
                         data=culprit.IndexedBatches(64, batch),
                         optimizer=lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9))


if __name__ == "__main__":
    raise SystemExit(culprit.main(build))
'''


@unittest.skipUnless(os.path.isdir(os.path.join(PKG, "culprit")), "the Python package is not built")
class Python(Export):
    def test_every_state_dict_name_and_strict_load(self):
        script = self.path("tied.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        env = dict(os.environ, PYTHONPATH=PKG, CULPRIT_PYTHON_DIR=PKG)
        run_dir = self.path("run")
        proc = subprocess.run(MPIRUN + ["-np", "1", PY, script, "--run-dir", run_dir, "--steps", "2",
                                        "--global-batch", "8", "--micro-shards", "2", "--checkpoint-every", "2",
                                        "--trace", "off", "--quiet"],
                              capture_output=True, text=True, timeout=TIMEOUT, env=env, cwd=self.tmp)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        saved = checkpoint_tensors(ckpt(run_dir, 2))
        self.assertEqual(sorted(saved), ["emb.weight", "norm.bias", "norm.weight", "scale", "scratch"])
        # Through the package, and through the executable, which hands a Python run to it.
        pt, st = self.path("m.pt"), self.path("m.safetensors")
        self.export(run_dir, pt, "--format", "torch", program=[PY, "-m", "culprit"], env=env)
        self.export(run_dir, st, "--format", "safetensors", env=env)
        ns = {}
        exec(MODEL, ns)
        want = ["scale", "emb.weight", "norm.weight", "norm.bias", "head.weight"]  # the root's buffer first
        self.assertEqual(list(ns["Net"]().state_dict()), want)
        for state in (torch.load(pt), read_safetensors(st)[0]):
            self.assertEqual(list(state), want)  # the model's own state-dict order
            model = ns["Net"]()
            model.load_state_dict(state, strict=True)
            loaded = dict(model.named_parameters())
            loaded.update(model.named_buffers())
            self.assertEqual(differing({k: v.detach() for k, v in loaded.items() if k in saved}, saved), [])
            self.assertEqual(differing({"w": state["head.weight"]}, {"w": saved["emb.weight"]}), [])
            # Negative control: the trained values, not a fresh model's.
            self.assertIn("emb.weight", differing({"emb.weight": ns["Net"]().emb.weight.detach()}, saved))
        self.no_temporaries(self.tmp)


if __name__ == "__main__":
    unittest.main(verbosity=2)
