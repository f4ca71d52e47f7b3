#!/usr/bin/env python3
"""A nanochat-class model and optimizer (this project's own code, in that style), run by culprit
with the documented wrapping only (docs/python.md): functional RMSNorm without weights, rotary
position embeddings, QK-norm, F.scaled_dot_product_attention, a relu^2 MLP, an untied head with
logit soft-capping, the forward returning the mean loss when given targets; Muon (momentum, then
Newton-Schulz orthogonalisation) for the block matrices plus AdamW with per-group learning rates for
the embedding and the head, stepped together as culprit.Optimizers; the learning rate a multiplier
of each group's initial rate per step (lr_schedule returning one rate per group).

    mpirun -np 4 .venv/bin/python nanochat_style.py --run-dir RUN --steps 8 --global-batch 16 --micro-shards 4
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import culprit

VOCAB, SEQ, WIDTH, HEADS, LAYERS = 64, 16, 32, 2, 2
# A schedule that reads the environment (a test changes it to show a replay refusing the new one).
WARMDOWN = float(os.environ.get("RECIPE_WARMDOWN", "0.5"))
STEPS = 8


def norm(x):
    return F.rms_norm(x, (x.size(-1),))


def rotary(x, cos, sin):
    d = x.shape[-1] // 2
    a, b = x[..., :d], x[..., d:]
    return torch.cat([a * cos + b * sin, a * (-sin) + b * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = WIDTH // HEADS
        self.c_q = nn.Linear(WIDTH, WIDTH, bias=False)
        self.c_k = nn.Linear(WIDTH, WIDTH, bias=False)
        self.c_v = nn.Linear(WIDTH, WIDTH, bias=False)
        self.c_proj = nn.Linear(WIDTH, WIDTH, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = (lin(x).view(B, T, HEADS, self.head_dim) for lin in (self.c_q, self.c_k, self.c_v))
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        q, k = norm(q), norm(k)  # QK-norm
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc = nn.Linear(WIDTH, 4 * WIDTH, bias=False)
        self.c_proj = nn.Linear(4 * WIDTH, WIDTH, bias=False)

    def forward(self, x):
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn, self.mlp = Attention(), MLP()

    def forward(self, x, cos, sin):
        x = x + self.attn(norm(x), cos, sin)
        return x + self.mlp(norm(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.lm_head = nn.Linear(WIDTH, VOCAB, bias=False)
        half = WIDTH // HEADS // 2
        freqs = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float32) / half))
        angles = torch.outer(torch.arange(SEQ, dtype=torch.float32), freqs)
        self.register_buffer("cos", angles.cos()[None, :, None, :], persistent=False)
        self.register_buffer("sin", angles.sin()[None, :, None, :], persistent=False)
        with torch.no_grad():
            for block in self.blocks:  # zero-initialised output projections
                block.attn.c_proj.weight.zero_()
                block.mlp.c_proj.weight.zero_()

    def forward(self, idx, targets=None):
        T = idx.size(1)
        cos, sin = self.cos[:, :T], self.sin[:, :T]
        x = norm(self.wte(idx))
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.lm_head(norm(x))
        logits = 15 * torch.tanh(logits / 15)  # soft-capping
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def zeropower(G, steps=5):
    """The orthogonal factor of G by a quintic Newton-Schulz iteration."""
    a, b, c = 3.4445, -4.7750, 2.0315
    X = G / (G.norm() + 1e-7)
    tall = X.size(-2) > X.size(-1)
    if tall:
        X = X.mT
    for _ in range(steps):
        A = X @ X.mT
        X = a * X + (b * A + c * A @ A) @ X
    return X.mT if tall else X


class Muon(torch.optim.Optimizer):
    """Momentum, then the update orthogonalised (2-D parameters only)."""

    def __init__(self, params, lr=0.02, momentum=0.95, nesterov=True, ns_steps=5):
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov, ns_steps=ns_steps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - group["momentum"])
                g = p.grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
                g = zeropower(g, group["ns_steps"])
                p.add_(g, alpha=-group["lr"] * max(1.0, p.size(-2) / p.size(-1)) ** 0.5)


def setup_optimizers(model):
    matrices = [p for b in model.blocks for p in b.parameters()]
    adamw = torch.optim.AdamW([{"params": [model.wte.weight], "lr": 0.05},
                               {"params": [model.lm_head.weight], "lr": 0.004}],
                              betas=(0.8, 0.95), eps=1e-10, weight_decay=0.0)
    return culprit.Optimizers(adamw, Muon(matrices, lr=0.02, momentum=0.95))


def lr_multiplier(it):
    """Constant, then a linear warm-down over the last WARMDOWN of the run."""
    start = STEPS * (1 - WARMDOWN)
    return 1.0 if it < start else max(0.0, (STEPS - it) / (STEPS - start))


INITIAL_LRS = [0.05, 0.004, 0.02]  # the groups of setup_optimizers, in order


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n=256):
        g = torch.Generator().manual_seed(9)
        seq = torch.zeros(n, SEQ + 1, dtype=torch.int64)
        seq[:, :2] = torch.randint(0, VOCAB, (n, 2), generator=g)
        for i in range(2, SEQ + 1):
            seq[:, i] = (7 * seq[:, i - 1] + 3 * seq[:, i - 2] + 1) % VOCAB
        self.x, self.y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def build():
    model = GPT()
    return culprit.Setup(
        model=model, data=Tokens(),
        forward=lambda m, x, y: m(x, y), loss=lambda out, y: out, reduction="mean",
        optimizer=lambda params: setup_optimizers(model),
        lr_schedule=lambda it: [lr * lr_multiplier(it) for lr in INITIAL_LRS])


if __name__ == "__main__":
    sys.exit(culprit.main(build))
