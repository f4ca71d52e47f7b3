#!/usr/bin/env python3
"""The models and data of the DDP peer benchmark (bench/ddp_peer.py): TorchScript files that both
`culprit train --model torchscript:PATH` and PyTorch DDP (bench/ddp_worker.py, torch.jit.load) train,
and HDF5 files (datasets x and y, docs/data.md `hdf5:PATH`) that both read.

    .venv/bin/python bench/models_peer.py OUT_DIR [--models resmlp,gpt] [--mlp-samples 8192] [--gpt-samples 2048]

writes OUT_DIR/NAME.pt and OUT_DIR/NAME.h5 for each model and prints one JSON line per model
(parameters, shapes). Everything comes from fixed seeds; nothing is downloaded.

- resmlp: a compute-bound residual MLP. 256 float32 input features, Linear(256, 1024) + ReLU, 4
  residual blocks h = h + relu(Linear(1024, 1024)(h)), a Linear(1024, 10) head: 4,471,818 parameters.
  Data: x ~ N(0, 1) [N, 256], y int64 class labels [N] from a fixed random linear teacher (argmax of
  x @ W, 10 classes, the first 10 features weighted up), so the loss can fall.
- gpt: a decoder-only transformer as culprit's built-in gpt (docs/models.md; pre-LN blocks, GELU MLP of
  4 x width, causal attention, dropout 0.1, an untied Linear head), written again here as a TorchScript
  module: 4 layers, width 256, 4 heads, seq-len 32, vocab 512: 3,430,400 parameters. Its forward maps
  int64 token ids [B, T] to logits [B, T, V]; culprit's loss on those is cross entropy summed over
  B x T, divided by B x T (harness/train/trainer.cpp Trainer::loss_of). (Seq-len 32, not 64: at 64 the
  smallest batch 16 micro-shards divide took 4.4 s a step at W = 1 here.) Data: x int64 [N, 32], y its
  next tokens [N, 32], from sequences t_j = (a + b*j) mod V with a, b drawn per sample (learnable).
"""
import argparse
import json
import math
import os
from typing import List

import torch
import torch.nn.functional as F
from torch import nn

SEED = 20261203


class ResMlp(nn.Module):
    def __init__(self, d_in: int, width: int, blocks: int, classes: int):
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.blocks = nn.ModuleList([nn.Linear(width, width) for _ in range(blocks)])
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.inp(x.flatten(1)))
        for blk in self.blocks:
            h = h + torch.relu(blk(h))
        return self.head(h)


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc_proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n, t, d = x.size(0), x.size(1), x.size(2)
        hd = d // self.heads
        qkv = self.qkv(self.ln1(x)).view(n, t, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(float(hd))
        att = torch.softmax(att.masked_fill(mask, float("-inf")), -1)
        att = F.dropout(att, self.dropout, self.training)
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(n, t, d)
        x = x + F.dropout(self.proj(y), self.dropout, self.training)
        h = F.gelu(self.fc(self.ln2(x)))
        return x + F.dropout(self.fc_proj(h), self.dropout, self.training)


class Gpt(nn.Module):
    def __init__(self, vocab: int, ctx: int, width: int, heads: int, layers: int, dropout: float = 0.1):
        super().__init__()
        self.dropout = dropout
        self.tok_emb, self.pos_emb = nn.Embedding(vocab, width), nn.Embedding(ctx, width)
        self.blocks = nn.ModuleList([Block(width, heads, dropout) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.size(1)
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(t, dtype=torch.long, device=idx.device))
        x = F.dropout(x, self.dropout, self.training)
        mask = torch.ones(t, t, dtype=torch.bool, device=idx.device).triu(1)
        for blk in self.blocks:
            x = blk(x, mask)
        return self.head(self.ln_f(x))


# name -> (what to build, how to make its data)
MLP = dict(d_in=256, width=1024, blocks=4, classes=10)
GPT = dict(vocab=512, ctx=32, width=256, heads=4, layers=4)


def mlp_data(n, g):
    x = torch.randn(n, MLP["d_in"], generator=g)
    teacher = torch.randn(MLP["d_in"], MLP["classes"], generator=g) / math.sqrt(MLP["d_in"])
    teacher[:MLP["classes"]] += 2 * torch.eye(MLP["classes"])  # a few features dominate: quick to learn
    return x.numpy().astype("float32"), (x @ teacher).argmax(1).numpy().astype("int64")


def gpt_data(n, g):
    v, t = GPT["vocab"], GPT["ctx"]
    a = torch.randint(0, v, (n, 1), generator=g)
    b = torch.randint(1, 8, (n, 1), generator=g)
    seq = (a + b * torch.arange(t + 1)) % v  # [n, T + 1]
    return seq[:, :t].numpy().astype("int64"), seq[:, 1:].numpy().astype("int64")


def write(out_dir, name, samples):
    import h5py
    torch.manual_seed(SEED)
    g = torch.Generator().manual_seed(SEED + 1)
    if name == "resmlp":
        model, (x, y) = ResMlp(**MLP), mlp_data(samples, g)
    elif name == "gpt":
        model, (x, y) = Gpt(**GPT), gpt_data(samples, g)
    else:
        raise SystemExit("unknown model %r (resmlp, gpt)" % name)
    pt, h5 = os.path.join(out_dir, name + ".pt"), os.path.join(out_dir, name + ".h5")
    torch.jit.script(model).save(pt)
    with h5py.File(h5, "w") as f:
        f["x"] = x
        f["y"] = y
    params = sum(p.numel() for p in model.parameters())
    return {"model": name, "pt": pt, "h5": h5, "parameters": params, "samples": samples,
            "x_shape": list(x.shape), "y_shape": list(y.shape)}


def main(argv: List[str] = None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--models", default="resmlp,gpt")
    ap.add_argument("--mlp-samples", type=int, default=8192)
    ap.add_argument("--gpt-samples", type=int, default=2048)
    a = ap.parse_args(argv)
    os.makedirs(a.out_dir, exist_ok=True)
    torch.set_num_threads(1)
    out = []
    for name in a.models.split(","):
        info = write(a.out_dir, name, a.mlp_samples if name == "resmlp" else a.gpt_samples)
        print(json.dumps(info), flush=True)
        out.append(info)
    return out


if __name__ == "__main__":
    main()
