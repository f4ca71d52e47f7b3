#!/usr/bin/env python3
"""The localisation campaign: seeded random injected faults, each run beside its clean twin, each
diagnosed by `culprit bisect`, scored against the injected truth.

    .venv/bin/python bench/localize.py --trials 300 --seed 1 [--out results.jsonl]

Every trial draws a model (mlp, cnn, gpt, or a residual MLP of this script's own as a TorchScript
file on HDF5 data; with --models py, examples/train_mlp.py's plain PyTorch model trained through the
Python package), a training world size 1-4 and a bisecting one 2-4, a phase, kind, mode, rank,
layer, step, index and bit, and trains with culprit's default options (checkpoints every 10 steps,
the newest 3 and the run's start kept, --on-detect halt, --trace layer) for 16 steps, then the same
run without the fault (the twin). The truth is the injected rank, phase and layer, at the first step
where the two runs' traces differ (read here with h5py, not by culprit). A fault that leaves the run
bitwise equal to its twin has no observable effect: the diagnosis must then be none. Each tenth
trial is a clean run (no fault): none again.

A trial is
  exact      verdict class, step, phase, layer and rank all equal to the truth (the verdict class:
             hardware-transient for transient faults, hardware-persistent for persistent ones, either
             for intermittent ones, hardware-unconfirmed when the faulty rank is outside the bisecting
             world, data for data faults);
  ambiguous  a persistent micro-shard fault bisected on two ranks, or a persistent fault at rest in a
             run with two replicas: each device reproduces its own result and two opinions cannot
             tell which is faulty; correct when the verdict, step,
             phase and layer are right, no rank is blamed and the faulty rank is among the candidates
             (docs/bisect.md, "Limits");
  later      an intermittent or persistent fault that fired silently before the checkpoint the
             search started from
             (the one before the first incident): a later firing named exactly otherwise, the
             earlier steps listed in the diagnosis as not searched (docs/bisect.md, "Limits");
  wrong      anything else (printed in full).
The summary: exact rate per phase x mode, steps replayed per diagnosis against the checkpoint
interval K (with and without an online incident), wall time.

--models sharded draws from the same models trained with --shard-params (ZeRO-3: each rank holds only
its slice of the parameters and of their optimizer state; docs/determinism.md, "Sharded parameters"),
NAME-zero3, on 2-4 ranks (W = 3 with 4 micro-shards: uneven), bisected unsharded on 2-4. A param or
optimizer fault lands on an element of the faulty rank's own slice (the layer drawn among those whose
first parameter the rank holds part of, the index inside that part), as culprit requires there; the
slices are computed here as harness/optim/shard_layout.cpp cuts them, from the parameters' order and
sizes (a one-step probe run per model), and checked against each faulty run's trace.
"""
import argparse
import collections
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
CULPRIT = os.environ.get("CULPRIT_BIN", os.path.join(HERE, "..", "build", "culprit"))
MPIRUN = ["mpirun", "--oversubscribe", "--bind-to", "none"]
STEPS, K = 16, 10

MODELS = {
    "mlp": (["--model", "mlp", "--global-batch", "24", "--micro-shards", "4", "--samples", "96"], ["fc1", "fc2", "fc3"]),
    "cnn": (["--model", "cnn", "--global-batch", "16", "--micro-shards", "4", "--samples", "64"], ["conv1", "conv2", "fc"]),
    "gpt": (["--model", "gpt", "--global-batch", "8", "--micro-shards", "4", "--samples", "32", "--optimizer", "adamw",
             "--lr", "0.003"], ["tok_emb", "blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.mlp.fc", "blocks.1.mlp.proj",
                                "head"]),
    "ts": (None, ["fc_in", "block1", "block2", "head"]),  # filled in by make_torchscript
    # examples/train_mlp.py through the Python package (docs/python.md): a plain PyTorch model with
    # dropout and LayerNorm, trained by `mpirun python3 SCRIPT`, bisected by `culprit bisect`, which
    # re-enters the script. Its layers with parameters (a fault of any phase lands on them).
    "py": (["--global-batch", "32", "--micro-shards", "4"], ["body.0", "body.3", "body.4", "head"]),
}
PY_EXAMPLE = os.path.join(HERE, "..", "examples", "train_mlp.py")
PY_ENV = dict(os.environ, PYTHONPATH=os.environ.get("CULPRIT_PYTHON_DIR", os.path.join(HERE, "..", "build", "python")))
# The training recipes (--models bf16,...): bf16 autocast (faults in bfloat16 activations and their
# gradients) and clipped updates, drawn like the others.
GPT_LAYERS = MODELS["gpt"][1]
RECIPES = {
    "gpt-bf16": (MODELS["gpt"][0] + ["--precision", "bf16", "--tie-head", "--init", "gpt2"], GPT_LAYERS),
    "mlp-bf16": (MODELS["mlp"][0] + ["--precision", "bf16"], MODELS["mlp"][1]),
    "gpt-clip": (MODELS["gpt"][0] + ["--clip-grad-norm", "0.5", "--weight-decay", "0.1"], GPT_LAYERS),
    "cnn-bf16-clip": (MODELS["cnn"][0] + ["--precision", "bf16", "--clip-grad-norm", "1", "--weight-decay", "0.01"],
                      MODELS["cnn"][1]),
    # The optimizers and layouts of issue 34's links campaign: AdamW; clipping with the optimizer
    # state sharded (--shard-optimizer, ZeRO-1).
    "mlp-adamw": (MODELS["mlp"][0] + ["--optimizer", "adamw"], MODELS["mlp"][1]),
    "cnn-clip-shard": (MODELS["cnn"][0] + ["--clip-grad-norm", "1", "--shard-optimizer"], MODELS["cnn"][1]),
}
# --shard-params (ZeRO-3): the models above, each rank holding only its slice of the parameters
# (--models sharded: every NAME-zero3). gpt-bf16-zero3: bf16 autocast and a tied head, whose layer
# borrows tok_emb.weight (gathered for the head's call too; a fault needing the head's own parameter
# is refused and redrawn, as in the recipes campaign).
SHARDED = {"mlp-zero3": "mlp", "cnn-zero3": "cnn", "gpt-zero3": "gpt", "ts-zero3": "ts", "gpt-bf16-zero3": "gpt-bf16",
           "py-zero3": "py"}
SHARDED_SET = ("cnn-zero3", "gpt-zero3", "gpt-bf16-zero3", "mlp-zero3", "py-zero3", "ts-zero3")
LAYOUTS = {}  # sharded model -> (parameter names, sizes, {layer: its first parameter's index}), by probe_layout
CHUNK = 1024  # fp1 chunk: float32 elements, counted from each parameter's first element
# --models tp: gpt's tensor-parallel form (--tp-chunks 4, four heads), T = 2 or 4 ranks sharing each
# micro-shard, D = 1 or 2 data-parallel groups (W = T x D), bisected at T = 1 on 2-4 ranks (a layout
# other than the training one: every chunk on one rank). A forward or backward fault lands on a
# layer's output: a chunk's ("blocks.0.mlp.fc[2]", on the rank that computes that chunk) or a
# replicated layer's (on any rank); a param or optimizer fault on a parameter (every rank holds every
# parameter whole); grad on the rank's copy of the micro-shard's assembled gradient; tp-link on what a
# rank sends in the group's exchanges (every receiver gets it changed); comm on the data-parallel
# tree's messages (D = 2), named by the run's online comm check (a T = 1 replay reduces over other
# ranks: hardware-unconfirmed, as tp-link).
TP = {"gpt-tp2": 2, "gpt-tp4": 4}
TP_CHUNKS = 4
TP_LAYERS = ["tok_emb", "blocks.0.attn.qkv[0]", "blocks.0.attn.qkv[3]", "blocks.0.attn.proj[1]", "blocks.0.attn.proj",
             "blocks.0.mlp.fc[2]", "blocks.1.mlp.proj[3]", "blocks.1.mlp.proj", "head"]
TP_PARAM_LAYERS = ["tok_emb", "blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.mlp.fc", "blocks.1.mlp.proj", "head"]
TP_PHASES = ["forward", "backward", "grad", "param", "optimizer", "tp-link", "comm"]
# tp-link: a rank's link in the group's exchanges, of a row-parallel layer's partial products
# (forward) or a column-parallel layer's partial input gradients (backward).
TP_EXCHANGES = ["blocks.0.attn.qkv", "blocks.0.attn.proj", "blocks.0.mlp.fc", "blocks.1.mlp.proj"]
DEFAULT_MODELS = ("cnn", "gpt", "mlp", "ts")
PHASES = ["forward", "backward", "grad", "comm", "param", "optimizer", "data", "tp-link"]
SHARD_PHASES = {"forward", "backward", "grad", "data"}
KINDS = ["bitflip", "nan", "scale", "noise"]
MODES = ["transient", "persistent", "intermittent"]

TS_SOURCE = '''
import sys, torch
class ResMlp(torch.nn.Module):
    """A residual MLP, saved as TorchScript: its forward is opaque to culprit (one traced layer, (output))."""
    def __init__(self):
        super().__init__()
        self.fc_in = torch.nn.Linear(32, 48)
        self.block1 = torch.nn.Linear(48, 48)
        self.block2 = torch.nn.Linear(48, 48)
        self.head = torch.nn.Linear(48, 10)
    def forward(self, x):
        h = torch.relu(self.fc_in(x))
        h = h + torch.relu(self.block1(h))
        h = h + torch.relu(self.block2(h))
        return self.head(h)
torch.manual_seed(3)
torch.jit.script(ResMlp()).save(sys.argv[1])
'''


def make_torchscript(work):
    model, data = os.path.join(work, "resmlp.pt"), os.path.join(work, "resmlp.h5")
    script = os.path.join(work, "resmlp.py")  # TorchScript reads the class's source from a file
    with open(script, "w") as f:
        f.write(TS_SOURCE)
    subprocess.run([sys.executable, script, model], check=True)
    rng = np.random.default_rng(4)
    with h5py.File(data, "w") as f:
        f["x"] = rng.standard_normal((96, 32)).astype(np.float32)
        f["y"] = rng.integers(0, 10, 96)
    MODELS["ts"] = (["--model", "torchscript:" + model, "--data", "hdf5:" + data, "--global-batch", "24",
                     "--micro-shards", "4"], MODELS["ts"][1])


def draw(rng, i, models=DEFAULT_MODELS, phases=PHASES, modes=MODES):
    """One trial's configuration; every tenth is clean."""
    model = rng.choice(sorted(models))
    # Sharded parameters on one rank are the unsharded run: 2-4 ranks (W = 3 uneven over M = 4).
    wt, wb = rng.randint(1 if set(phases) - {"comm"} and model not in SHARDED else 2, 4), rng.randint(2, 4)
    if model in TP:
        return draw_tp(rng, i, model, phases, modes)
    t = {"trial": i, "model": model, "w_train": wt, "w_bisect": wb, "fault": None}
    if i % 10 == 9:
        return t
    phase = rng.choice([p for p in phases if p != "comm" or wt > 1])
    kind = rng.choice(KINDS)
    mode = rng.choice(modes)
    f = {"phase": phase, "kind": kind, "mode": mode, "rank": rng.randrange(wt), "step": rng.randint(2, STEPS - 2),
         "index": rng.randrange(8), "layer": "" if phase == "data" else rng.choice(MODELS[model][1])}
    if model in SHARDED and phase in ("param", "optimizer"):
        # At rest under --shard-params: an element of the faulty rank's own slice (culprit refuses
        # any other), in a layer whose first parameter the rank holds part of.
        f["rank"], f["layer"], f["index"] = draw_in_slice(rng, model, wt, f["rank"])
    spec = "step=%d,rank=%d,index=%d,phase=%s,kind=%s,mode=%s" % (f["step"], f["rank"], f["index"], phase, kind, mode)
    if f["layer"]:
        spec += ",layer=" + f["layer"]
    # A bfloat16 value keeps bits 16..31 of a float32 (culprit refuses lower bits there).
    t["fault"] = with_kind(rng, f, spec, low_bit=16 if "bf16" in model and phase in ("forward", "backward") else 0)
    return t


def with_kind(rng, f, spec, low_bit=0):
    """The fault f with its kind's and mode's draws (bit, factor, p) added to it and to its spec."""
    if f["kind"] == "bitflip":
        f["bit"] = rng.randint(low_bit, 30)
        spec += ",bit=%d" % f["bit"]
    if f["kind"] == "scale":
        spec += ",factor=%g" % rng.choice([0.5, 2, 3, 1e3])
    if f["mode"] == "intermittent":
        spec += ",p=0.5"
    f["spec"] = spec
    return f


def draw_tp(rng, i, model, phases, modes):
    """A tensor-parallel trial: W = T x D, the fault on a chunk's layer drawn on the chunk's rank."""
    T = TP[model]
    # comm needs a data-parallel tree (D = 2); a slice of comm alone draws no D
    D = rng.choice([1, 2]) if any(p != "comm" for p in phases if p in TP_PHASES) else 2
    t = {"trial": i, "model": model, "w_train": T * D, "w_bisect": rng.randint(2, 4), "fault": None}
    if i % 10 == 9:
        return t
    phase = rng.choice([p for p in phases if p in TP_PHASES and (p != "comm" or D > 1)])
    kind, mode = rng.choice(KINDS), rng.choice(modes)
    f = {"phase": phase, "kind": kind, "mode": mode, "step": rng.randint(2, STEPS - 2), "index": rng.randrange(8)}
    f["layer"] = rng.choice(TP_LAYERS if phase in ("forward", "backward") else
                            TP_EXCHANGES if phase == "tp-link" else TP_PARAM_LAYERS)
    g = rng.randrange(D)
    m = re.search(r"\[(\d+)\]$", f["layer"])
    f["rank"] = g * T + (int(m.group(1)) // (TP_CHUNKS // T) if m else rng.randrange(T))
    spec = "step=%d,rank=%d,index=%d,phase=%s,kind=%s,mode=%s,layer=%s" % (
        f["step"], f["rank"], f["index"], phase, kind, mode, f["layer"])
    t["fault"] = with_kind(rng, f, spec)
    return t


def shard_cuts(sizes, world):
    """The --shard-params / --shard-optimizer slices as harness/optim/shard_layout.cpp cuts them:
    cut c is the fp1 chunk start (a parameter's start, or a multiple of CHUNK into it) nearest to
    c*P/W, the lower one on a tie, never below the cut before; rank c holds [cuts[c], cuts[c+1])."""
    starts, offset = [], 0
    for n in sizes:
        starts += range(offset, offset + n, CHUNK)
        offset += n
    total, cuts, k, first = offset, [0], 0, 0
    for c in range(1, world):
        target = total * c // world
        while k + 1 < len(starts) and starts[k + 1] <= target:
            k += 1
        at = k + 1 if k + 1 < len(starts) and starts[k + 1] - target < target - starts[k] else k
        at = max(at, first)
        cuts.append(starts[at] if at < len(starts) else total)
        first = min(at, len(starts))
    return cuts + [total]


def draw_in_slice(rng, model, world, rank):
    """(rank, layer, index) of a fault at rest inside the rank's slice: the drawn rank when its slice
    holds part of some layer's first parameter (the one a param or optimizer fault lands on), else
    the next rank that does; the layer drawn among those, the index inside the part held."""
    names, sizes, first = LAYOUTS[model]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    cuts = shard_cuts(sizes, world)
    for r in [(rank + j) % world for j in range(world)]:
        lo, hi = cuts[r], cuts[r + 1]
        held = [(layer, max(lo, offsets[i]) - offsets[i], min(hi, offsets[i] + sizes[i]) - offsets[i])
                for layer, i in ((l, first[l]) for l in MODELS[model][1])
                if i is not None and max(lo, offsets[i]) < min(hi, offsets[i] + sizes[i])]
        if held:
            layer, a, b = rng.choice(held)
            return r, layer, rng.randrange(a, b)
    raise RuntimeError("%s at W=%d: no rank holds a layer's first parameter" % (model, world))


def probe_layout(work, model):
    """A sharded model's parameters in the flat buffer's order (the trace's `params`), their sizes
    (the run's first checkpoint) and each layer's first parameter, the one a param or optimizer fault
    lands on (a layer without parameters of its own, the gpt's tied head, has none: culprit refuses
    such a fault there), from a one-step run on one rank."""
    d = os.path.join(work, "probe-" + model)
    rc, out, _ = train(d, {"model": model, "w_train": 1}, None, steps=1)
    if rc != 0:
        raise RuntimeError("probe of %s failed: %s" % (model, out[-2000:]))
    with h5py.File(os.path.join(d, "trace", "rank-00000.h5"), "r") as f:
        names = f.attrs["params"].decode().split("\n")
    with h5py.File(os.path.join(d, "checkpoints", "step-00000000.h5"), "r") as f:
        sizes = [int(f["model"][n].size) for n in names]
    first = {}
    for layer in MODELS[model][1]:
        first[layer] = next((i for i, n in enumerate(names) if n.startswith(layer + ".")), None)
    shutil.rmtree(d, ignore_errors=True)
    LAYOUTS[model] = (names, sizes, first)


def shard_bounds(run_dir):
    """Each rank's slice [lo, hi) as its trace records it (the first step row's `shard`)."""
    bounds = {}
    tdir = os.path.join(run_dir, "trace")
    for name in os.listdir(tdir):
        with h5py.File(os.path.join(tdir, name), "r") as f:
            bounds[int(f.attrs["rank"])] = tuple(int(v) for v in f["steps"]["shard"][0][:2])
    return [bounds[r] for r in sorted(bounds)]


def run(cmd, timeout=600):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=PY_ENV)
    return p.returncode, p.stdout + p.stderr, time.time() - t0


def train(run_dir, t, inject, steps=STEPS):
    trainer = [sys.executable, PY_EXAMPLE] if t["model"] in ("py", "py-zero3") else [CULPRIT, "train"]
    args = trainer + ["--run-dir", run_dir, "--steps", str(steps), "--quiet"] + MODELS[t["model"]][0]
    if inject:
        args += ["--inject", inject]
    return run(MPIRUN + ["-np", str(t["w_train"])] + args)


def trace_rows(run_dir):
    """Every trace row's fingerprints, by key, read with h5py: ('step', rank, step) and ('shard', step, k)."""
    rows = {}
    tdir = os.path.join(run_dir, "trace")
    for name in sorted(os.listdir(tdir)):
        with h5py.File(os.path.join(tdir, name), "r") as f:
            rank, ns, nh = int(f.attrs["rank"]), int(f.attrs["steps_committed"]), int(f.attrs["shards_committed"])
            st = f["steps"]
            for i in range(ns):
                rows[("step", rank, int(st["step"][i]))] = (float(st["loss"][i]) if not np.isnan(st["loss"][i]) else "nan",
                                                           int(st["grad_fp"][i]), tuple(st["param_fp"][i]), tuple(st["opt_fp"][i]))
            sh = f["shards"]
            for i in range(nh):
                # by rank too: each rank of a tensor-parallel group records its own row of a micro-shard
                key = ("shard", int(sh["step"][i]), int(sh["shard"][i]), rank)
                rows[key] = tuple(int(sh[c][i]) for c in ("grad_fp", "input_fp")) + tuple(
                    tuple(sh[c][i]) for c in ("fwd_fp", "bwd_fp", "param_grad_fp", "sample_fp"))
    return rows


def first_difference(faulty, twin):
    """The first step where the faulty run's trace differs from its twin's (None: bitwise equal)."""
    steps = sorted({k[2] if k[0] == "step" else k[1] for k in faulty})
    for s in steps:
        for k, v in faulty.items():
            ks = k[2] if k[0] == "step" else k[1]
            if ks == s and twin.get(k) != v:
                return s
    return None


def diagnose(run_dir, wb):
    rc, out, secs = run(MPIRUN + ["-np", str(wb), CULPRIT, "bisect", "--run-dir", run_dir])
    path = os.path.join(run_dir, "diagnosis.json")
    d = json.load(open(path)) if os.path.exists(path) else {"verdict": "error", "exit": rc, "out": out[-2000:]}
    return d, secs


def expected_verdicts(t, f):
    if f["phase"] == "data":
        return {"data"}
    if f["phase"] == "tp-link" or (f["phase"] == "comm" and t["model"] in TP):
        return {"hardware-unconfirmed"}  # a replay computes every chunk on one rank: the link is never rerun
    if f["rank"] >= t["w_bisect"]:
        return {"hardware-unconfirmed"}
    return {"transient": {"hardware-transient"}, "persistent": {"hardware-persistent"},
            "intermittent": {"hardware-transient", "hardware-persistent"}}[f["mode"]]


def score(t, d, truth_step):
    f = t["fault"]
    if f is None or truth_step is None:
        return "exact" if d["verdict"] == "none" else "wrong"
    layer = "" if f["phase"] == "data" else f["layer"]
    where = (d.get("step"), d.get("phase"), d.get("layer"))
    if d["verdict"] in expected_verdicts(t, f) and where == (truth_step, f["phase"], layer) and d.get("rank") == f["rank"]:
        return "exact"
    # Two devices, each reproducing its own result: a persistent micro-shard fault bisected on two
    # ranks, or a persistent fault at rest when the run itself had only two replicas.
    ambiguous = (t["w_bisect"] == 2 and f["mode"] == "persistent" and f["rank"] < 2 and
                 (f["phase"] in SHARD_PHASES or t["w_train"] <= 2))
    if (ambiguous and d.get("rank") == -1 and f["rank"] in d.get("candidates", []) and where == (truth_step, f["phase"], layer)
            and d["verdict"] in ({"data"} if f["phase"] == "data" else {"hardware-persistent"})):
        return "ambiguous"
    # A fault that fires again and again, silently before the checkpoint the search started from: a
    # later firing named exactly otherwise, and the earlier steps listed as not searched.
    unsearched = any(r["from"] <= truth_step <= r["to"] for r in (d.get("coverage") or {}).get("not_examined", []))
    if (f["mode"] in ("intermittent", "persistent") and unsearched and d.get("step", -1) > truth_step and d.get("rank") == f["rank"]
            and (d.get("phase"), d.get("layer")) == (f["phase"], layer) and d["verdict"] in expected_verdicts(t, f)):
        return "later"
    return "wrong"


def parse_line(line):
    """A trial as the campaign prints it ('14 mlp  W2->2 step=2,rank=1,...'), for --again."""
    m = re.match(r"\s*(\d+)\s+([\w-]+)\s+W(\d)->(\d)\s+(\S+)", line)
    if not m:
        return None
    t = {"trial": int(m.group(1)), "model": m.group(2), "w_train": int(m.group(3)), "w_bisect": int(m.group(4)),
         "fault": None}
    if m.group(5) != "(clean)":
        kv = dict(item.split("=", 1) for item in m.group(5).split(","))
        t["fault"] = {"phase": kv["phase"], "kind": kv["kind"], "mode": kv["mode"], "rank": int(kv["rank"]),
                      "step": int(kv["step"]), "index": int(kv["index"]), "layer": kv.get("layer", ""),
                      "spec": m.group(5)}
    return t


def trial(work, t):
    d_fault, d_twin = os.path.join(work, "t%d" % t["trial"]), os.path.join(work, "t%d-twin" % t["trial"])
    f = t["fault"]
    rc, out, train_s = train(d_fault, t, f["spec"] if f else None)
    t["train_exit"] = rc
    if rc == 2:  # a draw culprit refuses (a layer without parameters for phase param, ...): redrawn
        shutil.rmtree(d_fault, ignore_errors=True)
        t["refused"] = next((l for l in out.splitlines() if "culprit: error" in l), out.strip()[-200:])
        if "with --shard-params" in t["refused"]:  # drawn in the slice: this script's layout is wrong
            raise RuntimeError("trial %d: a fault drawn in the rank's slice was refused: %s" % (t["trial"], t["refused"]))
        return t
    if t["model"] in SHARDED and t["model"] in LAYOUTS:
        cuts = shard_cuts(LAYOUTS[t["model"]][1], t["w_train"])
        if shard_bounds(d_fault) != list(zip(cuts, cuts[1:])):
            raise RuntimeError("trial %d: the trace's slices %s are not the ones computed here %s" % (
                t["trial"], shard_bounds(d_fault), cuts))
    truth = None
    if f:
        rc2, out2, _ = train(d_twin, t, None)
        if rc2 != 0:
            raise RuntimeError("clean twin failed: " + out2[-2000:])
        truth = first_difference(trace_rows(d_fault), trace_rows(d_twin))
    t["truth_step"] = truth
    t["incident"] = os.path.exists(os.path.join(d_fault, "incidents.jsonl")) and os.path.getsize(
        os.path.join(d_fault, "incidents.jsonl")) > 0
    d, secs = diagnose(d_fault, t["w_bisect"])
    t["diagnosis"] = {k: d.get(k) for k in ("verdict", "step", "phase", "layer", "rank", "candidates", "sample",
                                            "steps_replayed", "replay_faults", "coverage", "seconds")}
    t["bisect_wall_s"] = secs
    t["score"] = score(t, d, truth)
    if t["score"] == "wrong":
        t["evidence"] = d.get("evidence", d.get("out"))
    shutil.rmtree(d_fault, ignore_errors=True)
    shutil.rmtree(d_twin, ignore_errors=True)
    return t


def brief(d):
    """One line of a diagnosis: verdict@step/phase/layer/rank, candidates, replay faults, steps not examined."""
    cov = d.get("coverage") or {}
    gaps = ", ".join("%d..%d" % (r["from"], r["to"]) for r in cov.get("not_examined", []))
    return "%s@%s/%s/%s/r%s candidates %s, %d replay fault(s), %s steps replayed, not examined: %s" % (
        d.get("verdict"), d.get("step"), d.get("phase"), d.get("layer"), d.get("rank"), d.get("candidates"),
        len(d.get("replay_faults") or []), d.get("steps_replayed"), gaps or "-")


def summary(results):
    out = []
    cells = collections.defaultdict(lambda: collections.Counter())
    for t in results:
        f = t["fault"]
        key = ("clean", "-") if f is None else (f["phase"], f["mode"]) if t["truth_step"] is not None else ("no effect", "-")
        cells[key][t["score"]] += 1
    out.append("%-12s %-13s %6s %6s %9s %6s %6s %8s" % ("phase", "mode", "trials", "exact", "ambiguous", "later", "wrong",
                                                       "correct"))
    total = collections.Counter()
    for key in sorted(cells):
        c = cells[key]
        n = sum(c.values())
        total.update(c)
        out.append("%-12s %-13s %6d %6d %9d %6d %6d %7.1f%%" % (key[0], key[1], n, c["exact"], c["ambiguous"], c["later"],
                                                                c["wrong"], 100.0 * (c["exact"] + c["ambiguous"]) / n))
    n = sum(total.values())
    out.append("%-26s %6d %6d %9d %6d %6d %7.1f%%" % ("all", n, total["exact"], total["ambiguous"], total["later"],
                                                      total["wrong"], 100.0 * (total["exact"] + total["ambiguous"]) / max(1, n)))
    for inc in (True, False):
        rep = [t["diagnosis"]["steps_replayed"] for t in results
               if t["incident"] == inc and t["diagnosis"].get("steps_replayed") is not None and t["truth_step"] is not None]
        if rep:
            out.append("steps replayed per diagnosis, %s online incident: median %g, max %d (K = %d, K + 3 = %d)" % (
                "with an" if inc else "without", statistics.median(rep), max(rep), K, K + 3))
    walls = [t["bisect_wall_s"] for t in results]
    out.append("bisect wall time per diagnosis (mpirun and start-up included): median %.2f s, max %.2f s" % (
        statistics.median(walls), max(walls)))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trials", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="")
    ap.add_argument("--min-correct", type=float, default=0, help="exit 1 below this fraction exact or ambiguous")
    ap.add_argument("--min-exact", type=float, default=0, help="exit 1 below this fraction exact (1: every trial)")
    ap.add_argument("--rescore", default="", help="score the trials of an earlier --out file again and summarise")
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS),
                    help="models to draw from: %s, py (recipes: %s; sharded parameters: %s, or sharded for all of "
                    "them; tensor-parallel: %s, or tp for both)" % (", ".join(DEFAULT_MODELS), ", ".join(RECIPES),
                                                                   ", ".join(SHARDED), ", ".join(TP)))
    ap.add_argument("--phases", default=",".join(PHASES), help="phases to draw from (a targeted slice: comm)")
    ap.add_argument("--modes", default=",".join(MODES), help="modes to draw from (a targeted slice: persistent)")
    ap.add_argument("--again", default="", help="run the trials listed in FILE, one per line as this script prints "
                    "them (e.g. the non-exact ones of docs/bisect.md), instead of drawing")
    a = ap.parse_args()
    if a.rescore:
        results = [json.loads(l) for l in open(a.rescore)]
        for t in results:
            t["score"] = score(t, t["diagnosis"], t["truth_step"])
            if t["score"] != "exact":
                print("%4d %-4s W%d->%d %s truth %s: %s %s" % (t["trial"], t["model"], t["w_train"], t["w_bisect"],
                                                              (t["fault"] or {}).get("spec"), t["truth_step"], t["score"],
                                                              brief(t["diagnosis"])))
        print(summary(results))
        return 0
    MODELS.update(RECIPES)
    models = [m for name in a.models.split(",")
              for m in (SHARDED_SET if name == "sharded" else sorted(TP) if name == "tp" else [name])]
    unknown = [m for m in models if m not in MODELS and m not in SHARDED and m not in TP]
    if unknown:
        ap.error("unknown model(s) %s" % ", ".join(unknown))
    phases, modes = a.phases.split(","), a.modes.split(",")
    if not set(phases) <= set(PHASES) or not set(modes) <= set(MODES) or not phases or not modes:
        ap.error("--phases takes %s; --modes takes %s" % (",".join(PHASES), ",".join(MODES)))
    rng = random.Random(a.seed)
    work = tempfile.mkdtemp(prefix="culprit-localize-")
    make_torchscript(work)
    for name, base in SHARDED.items():
        MODELS[name] = (MODELS[base][0] + ["--shard-params"], MODELS[base][1])
    for name, T in TP.items():
        MODELS[name] = (MODELS["gpt"][0] + ["--heads", "4", "--tp-chunks", str(TP_CHUNKS), "--tensor-parallel", str(T)],
                        TP_LAYERS)
    results = []
    out = open(a.out, "w") if a.out else None
    t0 = time.time()
    try:
        again = [t for t in map(parse_line, open(a.again)) if t] if a.again else None
        if again == []:
            ap.error("--again %s lists no trials" % a.again)
        for m in sorted({t["model"] for t in again} if again is not None else set(models)):
            if m in SHARDED:
                probe_layout(work, m)
        for i in range(len(again) if again is not None else a.trials):
            t = trial(work, again[i] if again is not None else draw(rng, i, models, phases, modes))
            while "refused" in t:
                print("     redrawn: %s" % t["refused"], flush=True)
                t = trial(work, draw(rng, i, models, phases, modes))
            results.append(t)
            if out:
                out.write(json.dumps(t) + "\n")
                out.flush()
            f = t["fault"]
            print("%4d %-4s W%d->%d %-70s truth %-4s -> %-22s %s" % (
                t["trial"], t["model"], t["w_train"], t["w_bisect"], f["spec"] if f else "(clean)", t["truth_step"],
                "%s@%s/%s/%s/r%s" % (t["diagnosis"]["verdict"], t["diagnosis"]["step"], t["diagnosis"]["phase"],
                                     t["diagnosis"]["layer"], t["diagnosis"]["rank"]), t["score"]), flush=True)
            if t["score"] == "wrong":
                print("     evidence: %s" % t.get("evidence"), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\n" + summary(results))
    print("%d trials in %.0f s (seed %d)" % (len(results), time.time() - t0, a.seed))
    correct = sum(t["score"] != "wrong" for t in results) / max(1, len(results))
    exact = sum(t["score"] == "exact" for t in results) / max(1, len(results))
    return 0 if correct >= a.min_correct and exact >= a.min_exact else 1


if __name__ == "__main__":
    sys.exit(main())
