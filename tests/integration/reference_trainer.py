"""An independent implementation of culprit's training contract (docs/determinism.md) in PyTorch.

Run with the interpreter culprit was built for (its torch: the same libtorch as culprit). It trains
a TorchScript module, or one of culprit's built-in models written in eager PyTorch (builtin_models.py)
from the initial state culprit wrote (--init-from), on HDF5 data, or a Python script's Setup (--script
SCRIPT:FUNCTION: its model, data, loss and optimizer, built under torch.manual_seed(--seed) as
culprit builds it), exactly as `culprit train` promises to — bf16 under torch.autocast, clipping with
torch.nn.utils.clip_grad_norm_, weight decay by parameter group — recomputes the fingerprints of
docs/fingerprint.md with xxhash, and prints one JSON line per step.
"""
import argparse
import json
import math
import struct

import h5py
import numpy as np
import torch
import torch.nn.functional as F
import xxhash

import builtin_models
from feistel import key, splitmix64  # noqa: F401 (the contract's counter-based randomness, written once)

MASK = (1 << 64) - 1
STREAM_DROPOUT = 3
CHUNK = 4096
DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.int64: 2, torch.int32: 3}


def fingerprint_bytes(data):
    if not data:
        return xxhash.xxh3_64_intdigest(b"")
    hashes = b"".join(struct.pack("<Q", xxhash.xxh3_64_intdigest(data[i:i + CHUNK]))
                      for i in range(0, len(data), CHUNK))
    return xxhash.xxh3_64_intdigest(hashes)


def set_fingerprint(named):
    h = xxhash.xxh3_64()
    for name, t in named:
        t = t.detach().contiguous()
        nb = name.encode()
        h.update(struct.pack("<I", len(nb)) + nb + struct.pack("<BB", DTYPE_CODES[t.dtype], t.dim()))
        h.update(b"".join(struct.pack("<q", d) for d in t.shape))
        h.update(struct.pack("<Q", fingerprint_bytes(t.numpy().tobytes())))
    return h.intdigest()


def tree_sum(leaves):
    """((g0+g1)+(g2+g3))+...: the fixed complete binary tree."""
    if len(leaves) == 1:
        return leaves[0]
    half = len(leaves) // 2
    return tree_sum(leaves[:half]) + tree_sum(leaves[half:])


def learning_rate(a, step):
    if a.warmup_steps > 0 and step <= a.warmup_steps:
        return a.lr * float(step) / float(a.warmup_steps)
    if a.lr_schedule == "cosine":
        span = float(max(1, a.steps - a.warmup_steps))
        progress = float(step - a.warmup_steps) / span
        return a.min_lr + (a.lr - a.min_lr) * (0.5 * (1.0 + math.cos(math.pi * progress)))
    return a.lr


def load_model(a, x_all, y_all):
    if a.model not in ("mlp", "cnn", "gpt"):
        return torch.jit.load(a.model)
    if a.model == "gpt":
        outputs = a.vocab or int(max(x_all.max(), y_all.max())) + 1
    else:
        outputs = int(y_all.max()) + 1 if y_all.dtype == torch.int64 else y_all[0].numel()
    model = builtin_models.build(a.model, list(x_all.shape[1:]), outputs, a)
    with h5py.File(a.init_from, "r") as f:
        state = {name: torch.from_numpy(np.array(f["model"][name])) for name in f["model"]}
    with torch.no_grad():
        for name, t in model.named_parameters():
            t.copy_(state.pop(name).reshape(t.shape))
    if state:
        raise SystemExit("the checkpoint holds tensors the model does not: %s" % sorted(state))
    return model


def load_script(a):
    """The Setup a script's build function returns under torch.manual_seed(--seed): (setup, x_all,
    y_all)."""
    import importlib.util
    path, func = a.script.rsplit(":", 1)
    spec = importlib.util.spec_from_file_location("culprit_reference_script", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(a.seed)
    setup = getattr(module, func)()
    items = [setup.data[i] for i in range(len(setup.data))]
    x_all = torch.stack([torch.as_tensor(x) for x, _ in items])
    y_all = torch.stack([torch.as_tensor(y) for _, y in items])
    return setup, x_all, y_all


def make_optimizer(a, model, named):
    """Weight decay on every parameter, or (matrices; auto for adamw) on weights of 2 or more
    dimensions that are not embeddings: the others form a second group with weight decay 0."""
    matrices_only = a.weight_decay_params == "matrices" or (a.weight_decay_params == "auto" and a.optimizer == "adamw")
    skip = set(builtin_models.embedding_names(model))
    decayed = [t for name, t in named if not matrices_only or (t.dim() >= 2 and name not in skip)]
    plain = [t for name, t in named if matrices_only and not (t.dim() >= 2 and name not in skip)]
    groups = [{"params": decayed}] if decayed else []
    if plain:
        groups.append({"params": plain, "weight_decay": 0.0})
    if a.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=a.lr, momentum=a.momentum, nesterov=a.nesterov,
                               weight_decay=a.weight_decay, foreach=False)
    b1, b2 = (float(v) for v in a.betas.split(","))
    return torch.optim.AdamW(groups, lr=a.lr, betas=(b1, b2), eps=a.eps, weight_decay=a.weight_decay, foreach=False)


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--model", help="mlp | cnn | gpt | a TorchScript file (or --script)")
    p.add_argument("--init-from", help="built-in models: culprit's step-0 checkpoint (HDF5) holding the initial state")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=0)
    p.add_argument("--tie-head", action="store_true")
    p.add_argument("--tp-chunks", type=int, default=0, help="gpt's tensor-parallel form: C chunks, all computed here")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--clip-grad-norm", type=float, default=0.0)
    p.add_argument("--weight-decay-params", default="auto", choices=["auto", "matrices", "all"])
    p.add_argument("--data", help="HDF5 data (x, y); a --script brings its own")
    p.add_argument("--script", help="SCRIPT:FUNCTION: a Python script's Setup (docs/python.md), trained in eager")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--micro-shards", type=int, default=8)
    p.add_argument("--optimizer", default="sgd")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--nesterov", action="store_true")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--betas", default="0.9,0.999")
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--lr-schedule", default="constant")
    p.add_argument("--min-lr", type=float, default=0.0)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--save-state", help="torch.save the final state dict here")
    return p.parse_args()


def main():
    a = parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch._C._set_graph_executor_optimize(False)

    setup = None
    if a.script:
        setup, x_all, y_all = load_script(a)
        model = setup.model
    else:
        with h5py.File(a.data, "r") as f:
            x_all = torch.from_numpy(f["x"][...])
            y_all = torch.from_numpy(f["y"][...])
        if y_all.dtype != torch.int64 and not y_all.is_floating_point():
            y_all = y_all.to(torch.int64)
        model = load_model(a, x_all, y_all)
    classification = y_all.dtype == torch.int64
    model.train()
    named = list(model.named_parameters())
    params = [t for _, t in named]
    n, B, M = x_all.shape[0], a.global_batch, a.micro_shards
    per_sample = max(1, y_all[0].numel())
    opt = setup.optimizer(params) if a.script else make_optimizer(a, model, named)
    base_lrs = [g["lr"] for g in opt.param_groups]
    if a.script:
        a.lr = opt.param_groups[0]["lr"]  # the schedule's base: the script's optimizer's (culprit's --lr)
    # A script's own schedule, as its training loop would run it: a scheduler stepped after each
    # optimizer step, or lr_schedule(it) written into every group before it.
    scheduler = setup.scheduler(opt) if setup is not None and setup.scheduler is not None else None
    lr_schedule = setup.lr_schedule if setup is not None else None
    steps_per_epoch = n // B
    for s in range(1, a.steps + 1):
        epoch, start = (s - 1) // steps_per_epoch, ((s - 1) % steps_per_epoch) * B
        g = torch.Generator()
        g.manual_seed(a.seed + epoch)
        order = torch.randperm(n, generator=g)
        if lr_schedule is not None:
            v = lr_schedule(s - 1)
            for group, lr in zip(opt.param_groups, v if isinstance(v, (list, tuple)) else [v] * len(base_lrs)):
                group["lr"] = lr
        elif scheduler is None:
            lr = learning_rate(a, s)
            unit = argparse.Namespace(**dict(vars(a), lr=1.0, min_lr=a.min_lr / a.lr if a.lr > 0 else 0.0))
            for group, base in zip(opt.param_groups, base_lrs):
                group["lr"] = lr if base == a.lr else base * learning_rate(unit, s)
        lr = opt.param_groups[0]["lr"]
        leaves = []
        for k in range(M):
            idx = order[start + k * (B // M): start + (k + 1) * (B // M)]
            x, y = x_all.index_select(0, idx), y_all.index_select(0, idx)
            torch.manual_seed(key(a.seed, STREAM_DROPOUT, s, k))
            for t in params:
                t.grad = None
            # The forward pass, model and loss, under autocast (bf16); the backward outside it.
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
                if setup is not None:
                    out = model(x) if setup.forward is None else setup.forward(model, x, y)
                    own = setup.loss(out, y)
                    # a mean over the micro-shard: / M, as a gradient-accumulation loop divides it
                    loss = own / (B / x.shape[0]) if setup.reduction == "mean" else own / (B * per_sample)
                elif classification:
                    out = model(x)
                    c = out.shape[-1]
                    loss = F.cross_entropy(out.reshape(-1, c), y.reshape(-1), reduction="sum") / (B * per_sample)
                else:
                    out = model(x)
                    loss = F.mse_loss(out, y, reduction="sum") / (B * per_sample)
            loss.backward()
            flat = [t.grad.reshape(-1) if t.grad is not None else torch.zeros(t.numel()) for t in params]
            leaves.append(torch.cat(flat + [loss.detach().float().reshape(1)]))
        total = tree_sum(leaves)
        off = 0
        for t in params:
            t.grad = total[off:off + t.numel()].view_as(t).clone()
            off += t.numel()
        row = {"step": s, "loss": float(total[-1]), "lr": lr}
        if a.clip_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, a.clip_grad_norm)
            row["clip_factor"] = float(torch.clamp(a.clip_grad_norm / (norm + 1e-6), max=1.0))
        opt.step()
        if scheduler is not None:
            scheduler.step()
        row["fingerprint"] = "%016x" % set_fingerprint(named)
        print(json.dumps(row))
    if a.save_state:
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, a.save_state)


if __name__ == "__main__":
    main()
