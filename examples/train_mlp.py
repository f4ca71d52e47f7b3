#!/usr/bin/env python3
"""A model, loss, data set and optimizer in plain PyTorch, trained by culprit (docs/python.md):

    mpirun -np 4 .venv/bin/python examples/train_mlp.py --run-dir RUN --steps 20
    culprit bisect --run-dir RUN          # re-enters this script to replay its steps

The same bits at any world size W <= --micro-shards, and the same bits as `culprit train` on the
model exported as TorchScript (`python3 examples/train_mlp.py export DIR` writes DIR/model.pt and the
data as DIR/data.h5; tests/integration/test_python.py compares the two)."""
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

import culprit  # noqa: E402

FEATURES, HIDDEN, CLASSES, SAMPLES = 16, 32, 4, 512


class Net(nn.Module):
    """Linear, GELU, dropout, LayerNorm, linear: layers culprit names body.0 ... head."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.GELU(), nn.Dropout(0.1), nn.LayerNorm(HIDDEN),
                                  nn.Linear(HIDDEN, HIDDEN), nn.GELU())
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        return self.head(self.body(x))


class Blobs(torch.utils.data.Dataset):
    """SAMPLES points, each a pure function of its index: drawn once from a generator of its own
    (the global one is culprit's), labelled by which of the first four features is largest."""

    def __init__(self):
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(SAMPLES, FEATURES, generator=g)
        self.y = self.x[:, :CLASSES].argmax(dim=1)

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def summed_loss(output, target):
    return F.cross_entropy(output, target, reduction="sum")


def build():
    """Called by culprit under torch.manual_seed(--seed): on every rank, and again by replays."""
    return culprit.Setup(model=Net(), loss=summed_loss, data=Blobs(),
                         optimizer=lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4))


def export(out_dir, seed=1234):
    """The same model (initialised under the same seed) as TorchScript, the data as HDF5, and the
    optimizer as `culprit train` options (DIR/args): what `culprit train` needs to give the same bits."""
    import h5py
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(seed)
    setup = build()
    torch.jit.script(setup.model).save(os.path.join(out_dir, "model.pt"))
    with h5py.File(os.path.join(out_dir, "data.h5"), "w") as f:
        f["x"] = setup.data.x.numpy()
        f["y"] = setup.data.y.numpy()
    with open(os.path.join(out_dir, "args"), "w") as f:
        f.write(" ".join(culprit._setup._optimizer_args(setup)) + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["export"]:
        export(sys.argv[2])
        sys.exit(0)
    sys.exit(culprit.main(build))
