#!/usr/bin/env python3
"""One rank of the PyTorch DistributedDataParallel peer of `culprit train` (bench/ddp_peer.py runs it).

    mpirun -np W .venv/bin/python bench/ddp_worker.py --model M.pt --data D.h5 --global-batch B \
        --micro-shards M --steps S --lr LR --momentum 0.9 --port PORT --out steps.jsonl

The same work as `mpirun -np W culprit train --model torchscript:M.pt --data hdf5:D.h5 --global-batch B
--micro-shards M --optimizer sgd --lr LR --momentum 0.9 --threads 1`:
- the same TorchScript file (torch.jit.load; its stored weights), in training mode;
- the same HDF5 data (datasets x and y), read whole into memory once before training: a step's
  micro-batches are gathered from that copy (index_select, inside the timed step), where culprit reads
  each step's samples from the file by hyperslab selections on its I/O thread a step ahead;
- the same loss: culprit's (harness/train/trainer.cpp Trainer::loss_of) is the sum of the per-sample
  losses over the global batch divided by B (a sample's loss: the mean over its target elements;
  integer y: cross entropy, floating y: squared error). DDP averages the gradient over the W ranks, so
  each rank's loss is its samples' sum divided by B / W: the reduced gradient is culprit's;
- the same micro-batching: culprit computes M/W micro-shards of B/M samples per rank, each a forward
  and a backward from zeroed gradients; DDP does M/W accumulation micro-batches of B/M samples per rank,
  under no_sync() for all but the last (whose backward all-reduces the accumulated gradient in DDP's
  buckets, overlapped with the backward);
- SGD with momentum (torch.optim.SGD, no Nesterov, no weight decay, constant lr), one intra-op thread
  (torch.set_num_threads(1)), backend gloo over the loopback (MASTER_ADDR 127.0.0.1, --port).
The sample order is culprit's `--shuffle randperm` order (docs/determinism.md, section 1: epoch e is
torch.randperm(N) from a generator seeded with --seed + e; step s takes the next B samples of it), so
without dropout both train the same samples step by step and their losses agree to float rounding
(the micro-shards' sums are reduced in another order); with dropout (the GPT) the masks differ.

Timing per step: a barrier, then time.perf_counter() around the zeroing of the gradients, the
micro-batches' gather, forward and backward passes (with the all-reduce) and the optimizer step —
rank 0's wall time of the step, as culprit's metrics.jsonl "seconds". After the timed region (outside
it) the ranks sum the step's loss for the record. Rank 0 writes one JSON line per step to --out:
{"step", "loss", "seconds"}.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="TorchScript file (torch.jit.save)")
    ap.add_argument("--data", required=True, help="HDF5 file with datasets x and y")
    ap.add_argument("--global-batch", type=int, required=True)
    ap.add_argument("--micro-shards", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--port", type=int, required=True, help="MASTER_PORT on 127.0.0.1")
    ap.add_argument("--out", required=True, help="rank 0's per-step JSON lines")
    a = ap.parse_args()

    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(a.port)
    B, M = a.global_batch, a.micro_shards
    if M % world or B % M:
        raise SystemExit("ddp_worker: M (%d) must be a multiple of W (%d) and divide B (%d)" % (M, world, B))
    per_rank, micro = M // world, B // M

    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)

    import h5py  # after the process group: h5py's import is slow and each rank pays it alike
    with h5py.File(a.data, "r") as f:
        x = torch.from_numpy(f["x"][:])
        y = torch.from_numpy(f["y"][:])
    classification = not y.is_floating_point()
    if x.is_floating_point():
        x = x.float()
    y = y.long() if classification else y.float()
    n = x.size(0)
    y_numel = max(1, y[0].numel())
    denom = float(B // world) * y_numel  # per rank: sum over its B/W samples / (B/W) = culprit's / W

    model = torch.jit.load(a.model)
    model.train()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=a.momentum)

    def loss_of(out, target):
        if classification:
            return F.cross_entropy(out.reshape(-1, out.size(-1)), target.reshape(-1), reduction="sum") / denom
        return F.mse_loss(out, target, reduction="sum") / denom

    def epoch_order(e):  # culprit's randperm order (docs/determinism.md, section 1)
        return torch.randperm(n, generator=torch.Generator().manual_seed(a.seed + e))

    steps_per_epoch = n // B
    if steps_per_epoch < 1:
        raise SystemExit("ddp_worker: fewer samples (%d) than the global batch (%d)" % (n, B))
    epoch, order = 0, epoch_order(0)
    rows = []
    for step in range(1, a.steps + 1):
        e, i = divmod(step - 1, steps_per_epoch)
        if e != epoch:
            epoch, order = e, epoch_order(e)
        batch = order[i * B:(i + 1) * B]
        mine = batch[rank * per_rank * micro:(rank + 1) * per_rank * micro]
        step_loss = torch.zeros(())
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for j in range(per_rank):
            idx = mine[j * micro:(j + 1) * micro]
            xb, yb = x.index_select(0, idx), y.index_select(0, idx)
            if j < per_rank - 1:
                with ddp.no_sync():
                    loss = loss_of(ddp(xb), yb)
                    loss.backward()
            else:
                loss = loss_of(ddp(xb), yb)
                loss.backward()
            step_loss += loss.detach()
        opt.step()
        seconds = time.perf_counter() - t0
        step_loss /= world  # rank r's losses are scaled by W (denominator B / W)
        dist.all_reduce(step_loss)
        if rank == 0:
            rows.append({"step": step, "loss": step_loss.item(), "seconds": seconds})
    if rank == 0:
        with open(a.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
