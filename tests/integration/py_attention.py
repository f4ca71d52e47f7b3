"""A model built from torch.nn's own attention (nn.TransformerEncoderLayer: nn.MultiheadAttention,
which reads its out_proj's parameters itself instead of calling that leaf), trained by culprit: for
test_shard_params.py (--shard-params keeps such a leaf's parameters gathered all step)."""
import sys

import torch
import torch.nn.functional as F
from torch import nn

import culprit

WIDTH, SEQ, CLASSES, SAMPLES = 32, 8, 4, 256


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, WIDTH)
        self.enc = nn.TransformerEncoderLayer(WIDTH, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x):
        return self.head(self.enc(self.inp(x)).mean(dim=1))


class Data(torch.utils.data.Dataset):
    def __init__(self):
        g = torch.Generator().manual_seed(3)
        self.x = torch.randn(SAMPLES, SEQ, 4, generator=g)
        self.y = self.x.sum(dim=1)[:, :CLASSES].argmax(dim=1)

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def build():
    return culprit.Setup(model=Net(), loss=lambda out, y: F.cross_entropy(out, y, reduction="sum"), data=Data(),
                         optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01))


if __name__ == "__main__":
    sys.exit(culprit.main(build))
