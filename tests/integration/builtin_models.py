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


# ---- gpt's tensor-parallel form (--tp-chunks C), every chunk on one rank: harness/model/tp_gpt.cpp --

def tree(parts):
    """((p0 + p1) + (p2 + p3)) ...: the fixed tree over the chunks, the left half the smaller."""
    if len(parts) == 1:
        return parts[0]
    half = len(parts) // 2
    return tree(parts[:half]) + tree(parts[half:])


def rows(t, c, chunks, groups):
    per_group = t.shape[0] // groups
    n = per_group // chunks
    if groups == 1:
        return t.narrow(0, c * n, n)
    return torch.cat([t.narrow(0, j * per_group + c * n, n) for j in range(groups)], 0)


def put_rows(t, c, chunks, groups, v):
    per_group = t.shape[0] // groups
    n = per_group // chunks
    for j in range(groups):
        t.narrow(0, j * per_group + c * n, n).copy_(v.narrow(0, j * n, n))


def cols(t, c, chunks):
    n = t.shape[1] // chunks
    return t.narrow(1, c * n, n).contiguous()


class ColumnParallel(torch.autograd.Function):
    """linear(h, W, b) in chunks of W's outputs; the input gradient is the tree over the chunks."""

    @staticmethod
    def forward(ctx, h, w, b, groups, chunks):
        ctx.save_for_backward(h, w)
        ctx.groups, ctx.chunks = groups, chunks
        return tuple(F.linear(h, rows(w, c, chunks, groups), rows(b, c, chunks, groups)) for c in range(chunks))

    @staticmethod
    def backward(ctx, *grads):
        h, w = ctx.saved_tensors
        G, C = ctx.groups, ctx.chunks
        d, oc = h.shape[-1], w.shape[0] // C
        h2 = h.reshape(-1, d)
        dw, db = torch.zeros_like(w), torch.zeros(w.shape[0])
        dh = []
        for c, dy in enumerate(grads):
            dy2 = dy.reshape(-1, oc)
            dh.append(dy.matmul(rows(w, c, C, G)))
            put_rows(dw, c, C, G, dy2.t().mm(h2))
            put_rows(db, c, C, G, dy2.sum(0))
        return tree(dh), dw, db, None, None


class RowPartials(torch.autograd.Function):
    """Chunk c's features times W's columns of chunk c."""

    @staticmethod
    def forward(ctx, w, *ys):
        ctx.save_for_backward(w, *ys)
        C = len(ys)
        return tuple(F.linear(y, cols(w, c, C)) for c, y in enumerate(ys))

    @staticmethod
    def backward(ctx, *grads):
        w, *ys = ctx.saved_tensors
        C, d = len(ys), w.shape[0]
        ic = w.shape[1] // C
        dw = torch.zeros_like(w)
        dys = []
        for c, (dp, y) in enumerate(zip(grads, ys)):
            dys.append(dp.matmul(cols(w, c, C)))
            dw.narrow(1, c * ic, ic).copy_(dp.reshape(-1, d).t().mm(y.reshape(-1, ic)))
        return (dw, *dys)


class ChunkSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, *parts):
        ctx.n = len(parts)
        return tree(list(parts))

    @staticmethod
    def backward(ctx, g):
        return (g,) * ctx.n


def keep_mask(shape):
    return torch.empty(shape).bernoulli_(1 - GPT_DROPOUT).div_(1 - GPT_DROPOUT)


class TpGpt(Gpt):
    """gpt in C chunks (the same parameters): every cross-chunk sum the fixed tree over the chunks,
    dropout masks drawn whole."""

    def __init__(self, vocab, ctx, width, heads, layers, tie_head, chunks):
        super().__init__(vocab, ctx, width, heads, layers, tie_head)
        self.chunks = chunks

    def drop(self, x):
        return x * keep_mask(x.shape) if self.training else x

    def forward(self, idx):
        n, t = idx.shape
        d, heads, C = self.width, self.heads, self.chunks
        hd, hc = d // heads, heads // C
        x = self.drop(self.tok_emb(idx) + self.pos_emb(torch.arange(t, dtype=torch.long)))
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        for blk in self.blocks:
            h = blk.ln1(x)
            att_keep = keep_mask((n, heads, t, t)) if self.training else None
            qkv = ColumnParallel.apply(h, blk.attn.qkv.weight, blk.attn.qkv.bias, 3, C)
            ys = []
            for c in range(C):
                p = qkv[c].view(n, t, 3, hc, hd).permute(2, 0, 3, 1, 4)
                att = torch.matmul(p[0], p[1].transpose(-2, -1)) / math.sqrt(float(hd))
                att = torch.softmax(att.masked_fill(mask, float("-inf")), -1)
                if self.training:
                    att = att * att_keep.narrow(1, c * hc, hc)
                ys.append(torch.matmul(att, p[2]).transpose(1, 2).contiguous().view(n, t, hc * hd))
            x = x + self.drop(ChunkSum.apply(*RowPartials.apply(blk.attn.proj.weight, *ys)) + blk.attn.proj.bias)
            h = blk.ln2(x)
            f = [F.gelu(v) for v in ColumnParallel.apply(h, blk.mlp.fc.weight, blk.mlp.fc.bias, 1, C)]
            x = x + self.drop(ChunkSum.apply(*RowPartials.apply(blk.mlp.proj.weight, *f)) + blk.mlp.proj.bias)
        h = self.ln_f(x)
        return F.linear(h, self.tok_emb.weight) if self.tie_head else self.head(h)


def build(name, x_shape, outputs, a):
    """The model culprit builds for samples of shape x_shape and `outputs` classes (gpt: vocabulary)."""
    if name == "mlp":
        return Mlp(math.prod(x_shape), a.hidden, outputs)
    if name == "cnn":
        return Cnn(x_shape[0], x_shape[1], x_shape[2], outputs)
    if getattr(a, "tp_chunks", 0):
        return TpGpt(outputs, x_shape[0], a.width, a.heads, a.layers, a.tie_head, a.tp_chunks)
    return Gpt(outputs, x_shape[0], a.width, a.heads, a.layers, a.tie_head)


def embedding_names(model):
    """Parameters of Embedding modules (eager or scripted), which --weight-decay-params matrices skips."""
    out = []
    for prefix, m in model.named_modules():
        cls = m.original_name if isinstance(m, torch.jit.ScriptModule) else type(m).__name__
        if cls in ("Embedding", "EmbeddingBag"):
            out += [(prefix + "." if prefix else "") + n for n, _ in m.named_parameters(recurse=False)]
    return out
