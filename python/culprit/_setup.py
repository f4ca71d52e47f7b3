"""The package's Python half: what a user's script hands culprit (Setup), the adapters the C++ core
calls back (_Source for the data, _model_facts for the layers), the mapping of the script's
optimizer onto culprit's options, and the entry points. The contract is docs/python.md."""
import importlib.util
import inspect
import os
import sys
import weakref

import torch

from . import _culprit

# culprit's options that the script's Setup decides: given on the command line as well, they would
# contradict it (the run records the script's).
_SCRIPT_OPTIONS = ("--model", "--data", "--script-fingerprint", "--optimizer", "--lr", "--momentum", "--nesterov",
                   "--weight-decay",
                   "--betas", "--eps", "--weight-decay-params")
_DTYPES = {torch.float32: "float32", torch.int64: "int64"}


class SetupError(ValueError):
    """The script's Setup breaks the contract (docs/python.md): one line, exit 2 on every rank."""


class IndexedBatches:
    """A data set given as a function from sample indices to a batch: fn(idx) -> (x, y), idx a 1-D
    int64 tensor, x and y with len(idx) rows. n: the number of samples."""

    def __init__(self, n, fn):
        self.n, self.fn = int(n), fn


class Setup:
    """What a script's setup function returns.

    model:     a torch.nn.Module (float32 parameters; no state changed by its forward pass)
    loss:      loss(output, target) -> 0-dim tensor, the SUM of the samples' losses (culprit divides
               by the global batch's target elements, so micro-shards add up to the batch's mean)
    data:      an indexable data set (len(data), data[i] -> (x, y)) or an IndexedBatches; a sample
               must be a pure function of its index
    optimizer: optimizer(params) -> torch.optim.SGD or torch.optim.AdamW over params (a list of the
               model's parameters, or groups of them)
    """

    def __init__(self, model, loss, data, optimizer):
        self.model, self.loss, self.data, self.optimizer = model, loss, data, optimizer


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


def _model_facts(setup, x):
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
            model(x)
    finally:
        model.train(was_training)
        for h in hooks:
            h.remove()
    layers = order + [n for n in leaves if n not in order and n not in other]
    return layers, sorted(_embedding_names(model))


def _embedding_names(model):
    """The weights of the model's Embedding and EmbeddingBag modules, by name (as culprit's layers)."""
    return {f"{n}.weight" if n else "weight" for n, m in model.named_modules()
            if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag))}


def _decays(model, which):
    """Per parameter (named_parameters() order): whether culprit's --weight-decay-params WHICH decays
    it — the trainer's rule by name: every parameter, or those of 2 or more dimensions that are not
    embedding weights."""
    emb = _embedding_names(model)
    return [which == "all" or (p.dim() >= 2 and n not in emb) for n, p in model.named_parameters()]


def _optimizer_args(setup):
    """The script's optimizer as culprit's options: culprit's update is its libtorch implementation of
    the same algorithm (what checkpoints, --shard-optimizer and the float64 update check know),
    checked here to give bitwise what the optimizer's own step() gives. Steps the Setup's model:
    call it on a Setup of its own."""
    model = setup.model
    params = list(model.parameters())
    if not params:
        raise SetupError("the model has no parameters to train")
    wide = [n for n, p in model.named_parameters() if p.dtype != torch.float32]
    if wide:
        raise SetupError(f"parameter '{wide[0]}' is not float32; culprit trains float32 parameters")
    opt = setup.optimizer(params)
    groups = opt.param_groups
    ids = [id(p) for g in groups for p in g["params"]]
    if sorted(ids) != sorted(id(p) for p in params):
        raise SetupError("optimizer: its parameter groups must hold every parameter of the model once")
    g0 = groups[0]
    if any(g["lr"] != g0["lr"] for g in groups):
        raise SetupError("optimizer: every parameter group must have the same lr (culprit schedules one)")
    if g0.get("maximize", False):
        raise SetupError("optimizer: maximize=True is not supported")
    if type(opt) is torch.optim.SGD:
        if any(g["dampening"] != 0 or g["momentum"] != g0["momentum"] or g["nesterov"] != g0["nesterov"]
               for g in groups):
            raise SetupError("optimizer: SGD needs dampening=0 and one momentum and nesterov for every group")
        args = ["--optimizer", "sgd", "--momentum", repr(float(g0["momentum"]))]
        args += ["--nesterov"] if g0["nesterov"] else []
    elif type(opt) is torch.optim.AdamW:
        if any(g["amsgrad"] or g["betas"] != g0["betas"] or g["eps"] != g0["eps"] for g in groups):
            raise SetupError("optimizer: AdamW needs amsgrad=False and one betas and eps for every group")
        b1, b2 = g0["betas"]
        args = ["--optimizer", "adamw", "--betas", f"{float(b1)!r},{float(b2)!r}", "--eps", repr(float(g0["eps"]))]
    else:
        raise SetupError("optimizer: culprit updates with torch.optim.SGD or torch.optim.AdamW, "
                         f"not {type(opt).__name__}")
    decays = {float(g["weight_decay"]) for g in groups}
    wd = max(decays)
    which = "all"
    if len(decays - {0.0}) > 1:
        raise SetupError("optimizer: the parameter groups may have one nonzero weight_decay (and 0)")
    if wd > 0 and 0.0 in decays:
        decayed = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
        matrices = {id(p) for p, d in zip(params, _decays(model, "matrices")) if d}
        if decayed != matrices:
            raise SetupError("optimizer: weight decay must apply to every parameter, or to the weight matrices "
                             "(2 or more dimensions, not embeddings) alone")
        which = "matrices"
    args += ["--lr", repr(float(g0["lr"])), "--weight-decay", repr(wd), "--weight-decay-params", which]
    _check_update(opt, model, args, _decays(model, which))
    return args


def _check_update(opt, model, args, decays):
    """culprit's update, configured by args, must equal the optimizer's own step(): two steps of
    seeded random gradients on the model's parameters, compared bitwise (an option culprit does not
    map, or an implementation that differs, is refused rather than trained differently)."""
    names, params = zip(*model.named_parameters())
    g = torch.Generator().manual_seed(0)
    start = [p.detach().clone() for p in params]
    grads = [[torch.randn(p.shape, generator=g) for p in params] for _ in range(2)]
    try:
        for step in grads:
            for p, grad in zip(params, step):
                p.grad = grad.clone()
            opt.step()
        theirs = [p.detach().clone() for p in params]
    finally:  # put the parameters back: their storage may be shared beyond this Setup (a module-level backbone)
        with torch.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)
                p.grad = None
        opt.state.clear()
    ours = _culprit.reference_update(args, start, decays, grads)
    for name, a, b in zip(names, theirs, ours):
        if not torch.equal(a, b):
            raise SetupError(f"optimizer: {type(opt).__name__}.step() and culprit's update ({' '.join(args)}) "
                             f"differ at parameter '{name}' in two steps: an option culprit does not map "
                             "(docs/python.md)")


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
            args += _optimizer_args(_checked_setup(_call_build(build)))
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
