"""The package's Python half: what a user's script hands culprit (Setup), the adapters the C++ core
calls back (_Source for the data, _model_facts for the layers; the optimizer's and schedule's are in
_optim.py), and the entry points. The contract is docs/python.md."""
import importlib.util
import inspect
import os
import sys
import weakref

import torch

from . import _culprit
from ._errors import SetupError
from ._optim import Optimizers, _embedding_names, _optimizer_args, _schedule, _ScriptOptimizer  # noqa: F401 (the C++ calls)

# culprit's options that the script's Setup decides: given on the command line as well, they would
# contradict it (the run records the script's).
_SCRIPT_OPTIONS = ("--model", "--data", "--script-fingerprint", "--optimizer", "--lr", "--momentum", "--nesterov",
                   "--weight-decay", "--betas", "--eps", "--weight-decay-params", "--script-optimizer",
                   "--optimizer-state")
_DTYPES = {torch.float32: "float32", torch.int64: "int64"}


class IndexedBatches:
    """A data set given as a function from sample indices to a batch: fn(idx) -> (x, y), idx a 1-D
    int64 tensor, x and y with len(idx) rows. n: the number of samples."""

    def __init__(self, n, fn):
        self.n, self.fn = int(n), fn


class Setup:
    """What a script's setup function returns (docs/python.md).

    model:       a torch.nn.Module (float32 parameters; no state changed by its forward pass)
    loss:        loss(output, target) -> 0-dim tensor: output is whatever the forward pass returned
                 (a tensor, tuple, dict, dataclass, ModelOutput); the SUM of the samples' losses, or
                 their mean with reduction="mean" (culprit scales either to the global batch's mean)
    data:        an indexable data set (len(data), data[i] -> (x, y)) or an IndexedBatches; a sample
                 must be a pure function of its index
    optimizer:   optimizer(params) -> any torch.optim.Optimizer over params (the model's parameters()
                 in order), with any parameter groups; a function of your own that makes one is fine
    forward:     forward(model, x, y) -> output: how the model is called (default: model(x)); e.g.
                 lambda m, x, y: m(x, y) for a model that takes its targets (nanoGPT's GPT)
    reduction:   "sum" (default) or "mean": what the loss is over the micro-shard's samples
    scheduler:   scheduler(optimizer) -> a torch.optim.lr_scheduler over that optimizer, stepped once
                 per optimizer step as a training loop steps it
    lr_schedule: lr_schedule(it) -> the learning rate of update `it` (0-based: nanoGPT's get_lr),
                 one float for every group or a list with one per group
    Neither schedule: culprit's --lr-schedule, --warmup-steps and --min-lr scale each group's lr.
    """

    def __init__(self, model, loss, data, optimizer, forward=None, reduction="sum", scheduler=None,
                 lr_schedule=None):
        self.model, self.loss, self.data, self.optimizer = model, loss, data, optimizer
        self.forward, self.reduction = forward, reduction
        self.scheduler, self.lr_schedule = scheduler, lr_schedule


# Every model a setup function returned (alive): a second call must build a new one.
_MODELS = weakref.WeakSet()


def _checked_setup(setup):
    if not isinstance(setup, Setup):
        raise SetupError(f"the setup function must return a culprit.Setup, not {type(setup).__name__}")
    if not isinstance(setup.model, torch.nn.Module):
        raise SetupError(f"Setup.model must be a torch.nn.Module, not {type(setup.model).__name__}")
    if setup.model in _MODELS:
        raise SetupError("the setup function returned a model it had returned before: it must construct a new "
                         "model on every call (replays and rebuilds start from a fresh one)")
    _MODELS.add(setup.model)
    for name in ("loss", "optimizer"):
        if not callable(getattr(setup, name)):
            raise SetupError(f"Setup.{name} must be callable")
    for name in ("forward", "scheduler", "lr_schedule"):
        if getattr(setup, name) is not None and not callable(getattr(setup, name)):
            raise SetupError(f"Setup.{name} must be callable (or None)")
    if setup.reduction not in ("sum", "mean"):
        raise SetupError(f"Setup.reduction must be \"sum\" or \"mean\", not {setup.reduction!r}")
    if setup.scheduler is not None and setup.lr_schedule is not None:
        raise SetupError("Setup: give scheduler= (a torch.optim.lr_scheduler) or lr_schedule= (a function of the "
                         "step), not both")
    if not isinstance(setup.data, IndexedBatches) and not (hasattr(setup.data, "__len__") and
                                                           hasattr(setup.data, "__getitem__")):
        raise SetupError("Setup.data must be indexable (len(data), data[i] -> (x, y)) or a culprit.IndexedBatches")
    return setup


def _as_tensor(v, what, i):
    t = torch.as_tensor(v).cpu()  # the loader copies host memory
    if t.dtype not in _DTYPES:
        raise SetupError(f"data python: sample {i}'s {what} is {t.dtype}: culprit reads float32 values "
                         "or int64 labels and token ids (convert in the data set)")
    return t


class _Source:
    """The data set as culprit's C++ data source reads it: size, one sample's shapes and dtypes, and
    read(indices) -> (x, y) stacked into contiguous tensors."""

    def __init__(self, data):
        self.data = data
        self.n = data.n if isinstance(data, IndexedBatches) else len(data)
        if self.n < 1:
            raise SetupError("data python: the data set is empty")
        x, y = self._fetch([0])
        self.x_shape, self.y_shape = list(x.shape[1:]), list(y.shape[1:])
        self.x_dtype, self.y_dtype = _DTYPES[x.dtype], _DTYPES[y.dtype]
        self.x_bytes = x[0].numel() * x.element_size()
        self.y_bytes = y[0].numel() * y.element_size()

    def _fetch(self, idx):
        if isinstance(self.data, IndexedBatches):
            xy = self.data.fn(torch.tensor(idx, dtype=torch.int64))
            x, y = _as_tensor(xy[0], "x", idx[0]), _as_tensor(xy[1], "y", idx[0])
            if x.shape[:1] != (len(idx),) or y.shape[:1] != (len(idx),):
                raise SetupError(f"data python: the batch function gave x {tuple(x.shape)} and y {tuple(y.shape)} "
                                 f"for {len(idx)} indices (a row per index)")
            return x.contiguous(), y.contiguous()
        xs, ys = [], []
        for i in idx:
            x, y = self.data[i]
            xs.append(_as_tensor(x, "x", i))
            ys.append(_as_tensor(y, "y", i))
        return torch.stack(xs).contiguous(), torch.stack(ys).contiguous()

    def read(self, idx):
        with torch.no_grad():
            x, y = self._fetch(idx)
        want = ([self.x_dtype, self.y_dtype], [self.x_shape, self.y_shape])
        got = ([_DTYPES.get(x.dtype), _DTYPES.get(y.dtype)], [list(x.shape[1:]), list(y.shape[1:])])
        if got != want:
            raise SetupError(f"data python: samples {idx[:4]} have x {got[0][0]} {got[1][0]} and y {got[0][1]} "
                             f"{got[1][1]}; sample 0 has x {want[0][0]} {want[1][0]} and y {want[0][1]} {want[1][1]}")
        return x, y


def _call(setup, x, y):
    """The model's output for x (and targets y), as the Setup calls it."""
    return setup.model(x) if setup.forward is None else setup.forward(setup.model, x, y)


def _model_facts(setup, x, y):
    """The model's layers (leaf modules whose output is one tensor, in the order a forward pass of x
    calls them; leaves not called follow in definition order) and embedding weights (weight decay
    skips them). A leaf returning a tuple (an LSTM, attention with weights) is no layer: culprit
    could neither fingerprint nor corrupt its output."""
    model = setup.model
    leaves = [n for n, m in model.named_modules() if n and not any(True for _ in m.children())]
    order, other = [], set()

    def seen(n, o):
        if n in order or n in other:
            return
        if isinstance(o, torch.Tensor):
            order.append(n)
        else:
            other.add(n)

    hooks = [m.register_forward_hook(lambda mod, i, o, n=n: seen(n, o))
             for n, m in model.named_modules() if n in leaves]
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            _call(setup, x, y)
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    layers = order + [n for n in leaves if n not in order and n not in other]
    return layers, sorted(_embedding_names(model)), _tied(model)


def _tied(model):
    """(other name, parameter name) of every parameter the model holds under more than one name (a
    head tied to the embedding: named_parameters() gives it once, the state dict twice)."""
    first, tied = {}, []
    for n, p in model.named_parameters(remove_duplicate=False):
        if id(p) in first:
            tied.append((n, first[id(p)]))
        else:
            first[id(p)] = n
    return tied


def _script_of(build):
    """SCRIPT:FUNCTION of a module-level setup function (replays import SCRIPT and call FUNCTION)."""
    script = inspect.getsourcefile(build)
    module = sys.modules.get(build.__module__)
    if not script or module is None or getattr(module, build.__name__, None) is not build:
        raise SetupError("the setup function must be a module-level function of a script file "
                         "(replays re-enter the script and call it)")
    return f"{os.path.abspath(script)}:{build.__name__}"


def _given(args, option):
    return any(a == option or a.startswith(option + "=") for a in args)


def _option_int(args, option, default):
    """The integer value of an option on the command line (culprit's parser checks it later)."""
    for i, a in enumerate(args):
        v = args[i + 1] if a == option and i + 1 < len(args) else a[len(option) + 1:] if a.startswith(option + "=") else None
        if v is not None:
            try:
                return int(v)
            except ValueError:
                return default
    return default


def _error(msg):
    print(f"culprit: error: {msg}", file=sys.stderr, flush=True)
    return 2  # kExitUsage: bad command line, configuration or input


def _call_build(build):
    """build(), with the working directory it found put back: a build() that changes directory must
    not move what the run's relative paths name (the run directory, data, checkpoints)."""
    cwd = os.getcwd()
    try:
        return build()
    finally:
        if os.getcwd() != cwd:
            os.chdir(cwd)


def main(build, argv=None):
    """Runs culprit on the script's Setup: `train` (the default) or any other command
    (python3 train.py bisect --run-dir RUN). Returns the exit code (README.md)."""
    args = list(sys.argv[1:] if argv is None else argv)
    cmd = args.pop(0) if args and args[0] in _culprit.command_names() else "train"
    try:
        if cmd == "train" and not (_given(args, "--help") or _given(args, "--resume") or
                                   _given(args, "--resume-from")):
            given = [o for o in _SCRIPT_OPTIONS if _given(args, o)]
            if given:
                raise SetupError(f"option '{given[0]}' comes from the script's Setup (docs/python.md)")
            torch.manual_seed(0)
            script = _script_of(build)
            args += ["--model", "python:" + script, "--data", "python",
                     "--script-fingerprint", _culprit.script_fingerprint(script.rsplit(":", 1)[0])]
            setup = _checked_setup(_call_build(build))
            scheduled = [o for o in ("--lr-schedule", "--warmup-steps", "--min-lr") if _given(args, o)]
            if scheduled and (setup.scheduler is not None or setup.lr_schedule is not None):
                raise SetupError(f"option '{scheduled[0]}' is culprit's schedule, but the Setup brings its own "
                                 "(scheduler= or lr_schedule=): give one of them")
            args += _optimizer_args(setup, _option_int(args, "--steps", 20))  # culprit train's default --steps
    except SetupError as e:
        return _error(str(e))
    except Exception as e:  # the user's setup function or optimizer factory: one line, not a traceback
        return _error(f"the setup function raised {type(e).__name__}: {e}")
    return _culprit.main([cmd] + args, build)


def _import_script(path):
    name = "culprit_script_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or not os.path.isfile(path):
        raise SetupError(f"the run's script '{path}' does not exist")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, os.path.dirname(path))
    spec.loader.exec_module(module)
    return module


def run_module(args):
    """python3 -m culprit COMMAND ...: any culprit command, as the executable runs it; on a run made
    from Python (--run-dir RUN), with the run's script re-entered."""
    run_dir = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--run-dir"),
                   next((a[len("--run-dir="):] for a in args if a.startswith("--run-dir=")), None))
    if not run_dir or not os.path.isfile(os.path.join(run_dir, "run.json")):
        return _culprit.main(args, None)  # no run made yet (or none named): nothing to re-enter
    try:
        model = _culprit.run_model(run_dir)
        if not model.startswith("python:"):
            return _culprit.main(args, None)
        script, func = model[len("python:"):].rsplit(":", 1)
        build = getattr(_import_script(script), func, None)
        if build is None:
            raise SetupError(f"the run's script '{script}' has no function '{func}'")
    except (SetupError, ValueError) as e:
        return _error(str(e))
    except Exception as e:  # importing the script ran its module-level code
        return _error(f"importing the run's script raised {type(e).__name__}: {e}")
    return main(build, args)


def _state_dict(setup, saved):
    """`culprit export` of a Python run: the checkpoint's tensors `saved` ((name, tensor) pairs: the
    model's named_parameters(), a tied tensor once, then its named_buffers()) copied by name into the
    fresh Setup's model, and that model's state_dict() as (name, tensor) pairs — every name
    load_state_dict(strict=True) expects: a tied tensor under each of its names, persistent buffers
    only. Host tensors, detached and contiguous, each in its own dtype."""
    model = setup.model
    own = dict(model.named_parameters())
    own.update(model.named_buffers())
    given = dict(saved)
    missing = [n for n in own if n not in given]
    extra = [n for n in given if n not in own]
    if missing:
        raise SetupError(f"the setup function's model has '{missing[0]}' and the run's checkpoint does not")
    if extra:
        raise SetupError(f"the run's checkpoint has '{extra[0]}' and the setup function's model does not")
    with torch.no_grad():
        for name, t in given.items():
            dst = own[name]
            if dst.shape != t.shape or dst.dtype != t.dtype:
                raise SetupError(f"the checkpoint's '{name}' is {t.dtype} {list(t.shape)}, the model's is "
                                 f"{dst.dtype} {list(dst.shape)}")
            dst.copy_(t)
    out = []
    for name, t in model.state_dict().items():
        if not isinstance(t, torch.Tensor):
            raise SetupError(f"state_dict() entry '{name}' is a {type(t).__name__}, not a tensor: culprit exports "
                             "tensors only")
        out.append((name, t.detach().cpu().contiguous()))
    return out
