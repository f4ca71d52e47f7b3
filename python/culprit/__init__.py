"""culprit: deterministic, world-size-invariant data-parallel training of your own PyTorch model,
with culprit's fingerprints, trace, checkpoints, detectors, replay and bisection (docs/python.md).

    import culprit

    def build():                      # module-level: replays re-enter the script and call it again
        return culprit.Setup(model=Net(), loss=summed_loss, data=MyDataset(),
                             optimizer=lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9))
        # any output type (the loss gets it whole), a mean loss, your optimizer and schedule as written:
        # Setup(..., forward=lambda m, x, y: m(x, y), loss=lambda out, y: out[1], reduction="mean",
        #       optimizer=lambda params: model.configure_optimizers(...), lr_schedule=get_lr)

    if __name__ == "__main__":
        raise SystemExit(culprit.main(build))

    $ mpirun -np 4 .venv/bin/python train.py --run-dir RUN --steps 100 --global-batch 64 --micro-shards 8
    $ culprit bisect --run-dir RUN    # or: mpirun -np 2 .venv/bin/python -m culprit bisect --run-dir RUN
"""
import torch  # first: the extension's tensors need torch's Python bindings loaded

from ._setup import IndexedBatches, Optimizers, Setup, main  # noqa: E402

__all__ = ["IndexedBatches", "Optimizers", "Setup", "main"]
