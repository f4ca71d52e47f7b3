#!/usr/bin/env python3
"""Scripts that break docs/python.md's contract, one per CULPRIT_VARIANT, for test_python.py's
refusals: each must end with one clear line and exit 2 on every rank."""
import os
import random
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.environ["CULPRIT_PYTHON_DIR"])
import culprit  # noqa: E402

VARIANT = os.environ.get("CULPRIT_VARIANT", "ok")


class Data:
    def __init__(self, noisy=False):
        g = torch.Generator().manual_seed(3)
        self.x, self.noisy = torch.randn(64, 8, generator=g), noisy
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        # noisy: a random augmentation drawn from the global generator (not a function of i)
        if VARIANT == "seeding_data":  # a function of i, but it reseeds the generator dropout uses
            torch.manual_seed(i)
            return self.x[i] + 0 * torch.rand(8), self.y[i]
        return (self.x[i] + torch.rand(8) if self.noisy else self.x[i]), self.y[i]


GLOBAL = nn.Sequential(nn.Linear(8, 2))


class LongNames(nn.Module):  # nanoGPT-style nesting: leaf names like transformer.h.0.attn.attn_dropout
    def __init__(self):
        super().__init__()
        attn = nn.ModuleDict({"c_attn": nn.Linear(8, 16), "attn_dropout": nn.Dropout(0.1)})
        self.transformer = nn.ModuleDict({"h": nn.ModuleList([nn.ModuleDict({"attn": attn})])})
        self.lm_head = nn.Linear(16, 2)

    def forward(self, x):
        a = self.transformer.h[0].attn
        return self.lm_head(torch.relu(a.attn_dropout(a.c_attn(x))))


def model():
    if VARIANT == "global_model":  # the same module on every call
        return GLOBAL
    if VARIANT == "rank_model":  # initialised from the rank: the ranks start from different models
        torch.manual_seed(int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    if VARIANT == "batchnorm":
        return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 2))
    if VARIANT == "inplace_param":
        return InPlace()
    if VARIANT == "long_names":
        return LongNames()
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    if VARIANT == "hidden_rng":  # initialised from Python's own random module, which culprit does not seed
        with torch.no_grad():
            net[0].weight.mul_(random.random())
    return net


def summed(o, y):
    return F.cross_entropy(o, y, reduction="sum")


def per_sample(o, y):  # a loss per sample, not their sum
    return F.cross_entropy(o, y, reduction="none")


def mean(o, y):  # PyTorch's default reduction: a 0-dim tensor, but a mean
    return F.cross_entropy(o, y)


def raising(o, y):
    raise RuntimeError("the user's loss is broken")


CALLS = [0]


def raising_later_on_rank1(o, y):  # an exception in the middle of training, on one rank only
    CALLS[0] += 1
    if os.environ.get("OMPI_COMM_WORLD_RANK") == "1" and CALLS[0] > 6:
        raise RuntimeError("rank 1's loss broke mid-run")
    return summed(o, y)


def hanging_on_rank1(o, y):  # the script itself hangs on one rank (a deadlock, a wait on nothing)
    CALLS[0] += 1
    if os.environ.get("OMPI_COMM_WORLD_RANK") == "1" and CALLS[0] > 6:
        time.sleep(3600)
    return summed(o, y)


class InPlace(nn.Module):  # changes its own weights in the forward pass, outside the optimizer
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        with torch.no_grad():
            self.fc.weight.mul_(0.999)
        return self.fc(x)


def odd_sgd(params):  # an SGD whose step() does something of its own after the update
    opt = torch.optim.SGD(params, lr=0.1)
    plain = opt.step

    def step(closure=None):
        plain()
        with torch.no_grad():
            for p in params:
                p.mul_(0.999)
    opt.step = step
    return opt


def matrices_decayed(params):  # AdamW with weight decay on the weight matrices only (GPT recipes)
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=0.003, betas=(0.9, 0.95))


class RandomStep(torch.optim.SGD):  # a step that draws from the global generator: not reproducible
    @torch.no_grad()
    def step(self, closure=None):
        super().step()
        for g in self.param_groups:
            for p in g["params"]:
                p.add_(torch.rand(p.shape), alpha=1e-3)


class ListState(torch.optim.SGD):  # state culprit cannot checkpoint
    @torch.no_grad()
    def step(self, closure=None):
        super().step()
        for g in self.param_groups:
            for p in g["params"]:
                self.state[p].setdefault("history", []).append(1)


class Counted(torch.optim.Optimizer):  # a user's own optimizer whose state holds Python numbers
    def __init__(self, params, lr=0.1):
        super().__init__(params, dict(lr=lr))

    @torch.no_grad()
    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                st = self.state[p]
                st["count"] = st.get("count", 0) + 1            # an int
                st["scale"] = 0.9 * st.get("scale", 1.0) + 0.1  # a float
                p.add_(p.grad, alpha=-g["lr"] * st["scale"] / st["count"] ** 0.5)


OPTIMIZERS = {
    "number_state": lambda p: Counted(p, lr=0.2),
    # two groups with their own rates and momenta, a torch scheduler over them (test_recipe.py)
    "step_lr": lambda p: torch.optim.SGD([{"params": p[:2], "lr": 0.2, "momentum": 0.5},
                                          {"params": p[2:], "lr": 0.05}], lr=0.1, momentum=0.9),
    "random_step": lambda p: RandomStep(p, lr=0.1),
    "list_state": lambda p: ListState(p, lr=0.1),
    # run as the script wrote them (--optimizer script)
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "odd_step": odd_sgd,
    # accepted: culprit's update is checked bitwise against these at start
    "adamw_groups": matrices_decayed,
    "sgd_nesterov_foreach": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.8, nesterov=True, weight_decay=1e-3,
                                                      foreach=True),
}


def build():
    if VARIANT == "chdir":  # a build() that changes directory: relative paths must keep their meaning
        os.chdir(os.environ["CULPRIT_ELSEWHERE"])
    opt = OPTIMIZERS.get(VARIANT, lambda p: torch.optim.SGD(p, lr=0.1))
    loss = {"vector_loss": per_sample, "mean_loss": mean, "raises": raising,
            "raises_later": raising_later_on_rank1, "hangs": hanging_on_rank1}.get(VARIANT, summed)
    data = Data(noisy=VARIANT == "noisy_data")
    if VARIANT == "batches":  # the same samples as a function from indices to a batch
        data = culprit.IndexedBatches(len(data.x), lambda idx, d=data: (d.x[idx], d.y[idx]))
    schedules = {"plateau": dict(scheduler=lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o)),
                 "two_schedules": dict(scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 2),
                                       lr_schedule=lambda it: 0.1),
                 "one_cycle": dict(scheduler=lambda o: torch.optim.lr_scheduler.OneCycleLR(o, 0.1, total_steps=10)),
                 "sum_declared_mean": dict(reduction="mean"),
                 "step_lr": dict(scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5))}
    if VARIANT == "one_cycle":
        opt = OPTIMIZERS["adam"]
    return culprit.Setup(model=model(), loss=loss, data=data, optimizer=opt, **schedules.get(VARIANT, {}))


if __name__ == "__main__":
    sys.exit(culprit.main(build))
