"""culprit's built-in models (harness/src/models.cpp) written again in eager PyTorch, op for op.

The reference trainer (reference_trainer.py) trains these from the initial state culprit wrote
(RUN/checkpoints/step-00000000.h5), so the comparison covers the training step, not libtorch's
C++ and Python initialisers. Parameter names and order are culprit's state-dict names and order.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

GPT_DROPOUT = 0.1


class Mlp(nn.Module):
    def __init__(self, d_in, hidden, d_out):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(d_in, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, d_out)

    def forward(self, x):
        h = self.fc1(x.flatten(1))
        h = self.fc2(torch.relu(h))
        return self.fc3(torch.relu(h))


class Cnn(nn.Module):
    def __init__(self, c, h, w, d_out):
        super().__init__()
        self.conv1 = nn.Conv2d(c, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * (h // 4) * (w // 4), d_out)

    def forward(self, x):
        h = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        h = torch.max_pool2d(torch.relu(self.conv2(h)), 2)
        return self.fc(h.flatten(1))


class Attn(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)


class MlpBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(d), Attn(d), nn.LayerNorm(d), MlpBlock(d)


class Gpt(nn.Module):
    def __init__(self, vocab, ctx, width, heads, layers, tie_head):
        super().__init__()
        self.width, self.heads, self.tie_head = width, heads, tie_head
        self.tok_emb, self.pos_emb = nn.Embedding(vocab, width), nn.Embedding(ctx, width)
        self.blocks = nn.ModuleList([Block(width) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(width)
        if not tie_head:
            self.head = nn.Linear(width, vocab)

    def forward(self, idx):
        n, t = idx.shape
        d, heads = self.width, self.heads
        hd = d // heads
        train = self.training
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(t, dtype=torch.long))
        x = torch.dropout(x, GPT_DROPOUT, train)
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        for blk in self.blocks:
            h = blk.ln1(x)
            qkv = blk.attn.qkv(h).view(n, t, 3, heads, hd).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(float(hd))
            att = torch.softmax(att.masked_fill(mask, float("-inf")), -1)
            att = torch.dropout(att, GPT_DROPOUT, train)
            y = torch.matmul(att, v).transpose(1, 2).contiguous().view(n, t, d)
            x = x + torch.dropout(blk.attn.proj(y), GPT_DROPOUT, train)
            h = blk.ln2(x)
            h = F.gelu(blk.mlp.fc(h))
            x = x + torch.dropout(blk.mlp.proj(h), GPT_DROPOUT, train)
        h = self.ln_f(x)
        return F.linear(h, self.tok_emb.weight) if self.tie_head else self.head(h)


def build(name, x_shape, outputs, a):
    """The model culprit builds for samples of shape x_shape and `outputs` classes (gpt: vocabulary)."""
    if name == "mlp":
        return Mlp(math.prod(x_shape), a.hidden, outputs)
    if name == "cnn":
        return Cnn(x_shape[0], x_shape[1], x_shape[2], outputs)
    return Gpt(outputs, x_shape[0], a.width, a.heads, a.layers, a.tie_head)


def embedding_names(model):
    """Parameters of Embedding modules (eager or scripted), which --weight-decay-params matrices skips."""
    out = []
    for prefix, m in model.named_modules():
        cls = m.original_name if isinstance(m, torch.jit.ScriptModule) else type(m).__name__
        if cls in ("Embedding", "EmbeddingBag"):
            out += [(prefix + "." if prefix else "") + n for n, _ in m.named_parameters(recurse=False)]
    return out
