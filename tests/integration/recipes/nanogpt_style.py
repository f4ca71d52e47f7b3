#!/usr/bin/env python3
"""A training script written the way nanoGPT's train.py and model.py are (this project's own code, in
their style), run by culprit with the documented wrapping only (docs/python.md, "Your training
script -> culprit"):

- GPT.forward(idx, targets) returns (logits, loss), the loss a token mean: Setup(forward=...,
  loss=lambda out, y: out[1], reduction="mean");
- GPT.configure_optimizers: AdamW, weight decay on every tensor of 2+ dimensions (embeddings
  included), none on the rest: handed over unchanged;
- get_lr(it): linear warm-up, cosine decay to min_lr = learning_rate / 10: Setup(lr_schedule=get_lr);
- grad_clip = 1.0: culprit's --clip-grad-norm 1.0 (torch.nn.utils.clip_grad_norm_ on the reduced
  gradient);
- the token embedding tied to the head (wte.weight = lm_head.weight).

    mpirun -np 4 .venv/bin/python nanogpt_style.py --run-dir RUN --steps 8 --global-batch 16 \\
        --micro-shards 4 --clip-grad-norm 1.0
"""
import math
import sys
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

import culprit


@dataclass
class GPTConfig:
    block_size: int = 16
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True


class LayerNorm(nn.Module):
    """LayerNorm with an optional bias (PyTorch's has no bias=False before 2.1)."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.n_head, self.n_embd, self.dropout = config.n_head, config.n_embd, config.dropout

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0, is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1, self.attn = LayerNorm(config.n_embd, config.bias), CausalSelfAttention(config)
        self.ln_2, self.mlp = LayerNorm(config.n_embd, config.bias), MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        else:  # inference: the last position only
            logits = self.lm_head(x[:, [-1], :])
            loss = None
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        param_dict = {pn: p for pn, p in self.named_parameters() if p.requires_grad}
        decay_params = [p for n, p in param_dict.items() if p.dim() >= 2]
        nodecay_params = [p for n, p in param_dict.items() if p.dim() < 2]
        optim_groups = [{"params": decay_params, "weight_decay": weight_decay},
                        {"params": nodecay_params, "weight_decay": 0.0}]
        use_fused = device_type == "cuda"
        return torch.optim.AdamW(optim_groups, lr=learning_rate, betas=betas, **({"fused": True} if use_fused else {}))


# train.py's settings, scaled down
learning_rate, min_lr = 6e-3, 6e-4
warmup_iters, lr_decay_iters = 2, 8
weight_decay, beta1, beta2 = 1e-1, 0.9, 0.95


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


class Tokens(torch.utils.data.Dataset):
    """256 sequences of block_size + 1 tokens, each a pure function of its index (a learnable
    recurrence from two seeded tokens): inputs and next-token targets, as get_batch cuts them."""

    def __init__(self, n=256, block_size=16, vocab=64):
        g = torch.Generator().manual_seed(5)
        seq = torch.zeros(n, block_size + 1, dtype=torch.int64)
        seq[:, :2] = torch.randint(0, vocab, (n, 2), generator=g)
        for i in range(2, block_size + 1):
            seq[:, i] = (5 * seq[:, i - 1] + seq[:, i - 2] + 3) % vocab
        self.x, self.y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def build():
    model = GPT(GPTConfig())
    return culprit.Setup(
        model=model, data=Tokens(),
        forward=lambda m, x, y: m(x, y),        # (logits, loss)
        loss=lambda out, y: out[1], reduction="mean",
        optimizer=lambda params: model.configure_optimizers(weight_decay, learning_rate, (beta1, beta2), "cpu"),
        lr_schedule=get_lr)


if __name__ == "__main__":
    sys.exit(culprit.main(build))
