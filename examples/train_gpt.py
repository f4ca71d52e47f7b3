#!/usr/bin/env python3
"""A decoder written the torch 2.x way, trained by culprit (docs/python.md, docs/models.md):
F.scaled_dot_product_attention (causal), nn.RMSNorm, rotary position embeddings, grouped-query
attention (fewer key/value heads than query heads) and a SwiGLU MLP, with an untied head, or the
head tied to the token embedding (`tied` as the first argument):

    mpirun -np 4 .venv/bin/python examples/train_gpt.py --run-dir RUN --steps 20
    mpirun -np 4 .venv/bin/python examples/train_gpt.py tied --run-dir RUN2 --steps 20
    culprit bisect --run-dir RUN          # re-enters this script (build or build_tied) to replay

The same bits at any world size W <= --micro-shards, and the same bits as this model trained by
plain PyTorch eager under culprit's contract (tests/integration/reference_trainer.py --script)."""
import sys

import torch
import torch.nn.functional as F
from torch import nn

import culprit

VOCAB, SEQ, WIDTH, HEADS, KV_HEADS, LAYERS, SAMPLES = 64, 16, 32, 4, 2, 2, 256


def rotate(x, positions):
    """Rotary position embedding of x (batch, heads, seq, head_dim): each pair of channels turned
    by an angle proportional to the position."""
    half = x.shape[-1] // 2
    freqs = 1.0 / (10000.0 ** (torch.arange(0, half, dtype=x.dtype) / half))
    angles = positions.to(x.dtype)[:, None] * freqs[None, :]
    cos, sin = angles.cos(), angles.sin()
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.head_dim = WIDTH // HEADS
        self.q = nn.Linear(WIDTH, HEADS * self.head_dim, bias=False)
        self.kv = nn.Linear(WIDTH, 2 * KV_HEADS * self.head_dim, bias=False)
        self.out = nn.Linear(HEADS * self.head_dim, WIDTH, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, HEADS, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, t, 2, KV_HEADS, self.head_dim).permute(2, 0, 3, 1, 4)
        positions = torch.arange(t)
        q, k = rotate(q, positions), rotate(k, positions)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.out(y.transpose(1, 2).reshape(b, t, HEADS * self.head_dim))


class SwiGLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(WIDTH, 2 * WIDTH, bias=False)
        self.up = nn.Linear(WIDTH, 2 * WIDTH, bias=False)
        self.down = nn.Linear(2 * WIDTH, WIDTH, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.attn = nn.RMSNorm(WIDTH), Attention()
        self.norm2, self.mlp = nn.RMSNorm(WIDTH), SwiGLU()

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    def __init__(self, tied):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class Sequences(torch.utils.data.Dataset):
    """SAMPLES token sequences, each a pure function of its index: two random tokens, then
    t[i] = (3 t[i-1] + t[i-2] + 1) mod VOCAB (learnable); inputs and next-token targets."""

    def __init__(self):
        g = torch.Generator().manual_seed(11)
        seq = torch.zeros(SAMPLES, SEQ + 1, dtype=torch.int64)
        seq[:, :2] = torch.randint(0, VOCAB, (SAMPLES, 2), generator=g)
        for i in range(2, SEQ + 1):
            seq[:, i] = (3 * seq[:, i - 1] + seq[:, i - 2] + 1) % VOCAB
        self.x, self.y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def summed_loss(output, target):
    return F.cross_entropy(output.reshape(-1, VOCAB), target.reshape(-1), reduction="sum")


def setup(tied):
    return culprit.Setup(model=Decoder(tied), loss=summed_loss, data=Sequences(),
                         optimizer=lambda params: torch.optim.AdamW(params, lr=3e-3, betas=(0.9, 0.95),
                                                                    weight_decay=0.01))


def build():
    """The untied decoder; called by culprit under torch.manual_seed(--seed), again by replays."""
    return setup(tied=False)


def build_tied():
    """The decoder whose head is its token embedding."""
    return setup(tied=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["tied"]:
        del sys.argv[1]
        sys.exit(culprit.main(build_tied))
    sys.exit(culprit.main(build))
