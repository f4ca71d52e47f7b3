"""The script's optimizer and schedule (docs/python.md, "Optimizers" and "Schedules"): the start check
that maps an SGD or AdamW onto culprit's own update or runs the object as written
(--optimizer script), the adapter culprit's C++ steps (_ScriptOptimizer), several optimizers as one
(Optimizers), and the learning rates per group and step (_Schedule)."""
import math
import warnings
import weakref

import torch

from . import _culprit
from ._errors import SetupError


def _embedding_names(model):
    """The weights of the model's Embedding and EmbeddingBag modules, by name (as culprit's layers)."""
    return {f"{n}.weight" if n else "weight" for n, m in model.named_modules()
            if isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag))}


def _decays(model, which):
    """Per parameter (named_parameters() order): whether culprit's --weight-decay-params WHICH decays
    it — the trainer's rule by name: every parameter, those of 2 or more dimensions (ndim2), or
    those of 2 or more dimensions that are not embedding weights (matrices)."""
    emb = _embedding_names(model)
    return [which == "all" or (p.dim() >= 2 and (which == "ndim2" or n not in emb))
            for n, p in model.named_parameters()]


class Optimizers:
    """Several optimizer objects stepped as one (nanochat's Muon for the matrices and AdamW for the
    rest): Setup(optimizer=lambda params: culprit.Optimizers(Muon(...), AdamW(...))). Their parameter
    groups, in order, are its groups; step() steps each in order."""

    def __init__(self, *optimizers):
        if not optimizers:
            raise SetupError("culprit.Optimizers needs at least one optimizer")
        self.optimizers = list(optimizers)

    @property
    def param_groups(self):
        return [g for o in self.optimizers for g in o.param_groups]

    @property
    def state(self):  # read-only view; _ScriptOptimizer writes through to the owning optimizer
        return {p: st for o in self.optimizers for p, st in o.state.items()}

    def step(self):
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none=True):
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, sd):
        for o, s in zip(self.optimizers, sd["optimizers"]):
            o.load_state_dict(s)


def _leaf_optimizers(opt):
    return opt.optimizers if isinstance(opt, Optimizers) else [opt]


def _state_of(opt, p):
    for o in _leaf_optimizers(opt):
        if p in o.state:
            return o.state[p]
    return {}


def _owner(opt, p):
    for o in _leaf_optimizers(opt):
        if any(q is p for g in o.param_groups for q in g["params"]):
            return o
    raise SetupError("optimizer: a parameter in none of its groups")


def _class_name(opt):
    return "+".join(type(o).__name__ for o in _leaf_optimizers(opt))


# Every optimizer object a factory returned (alive): a second call must build a new one.
_OPTIMIZERS = weakref.WeakSet()


def _made_optimizer(setup, params):
    """setup.optimizer(params), checked: a new object, parameter groups holding every parameter of
    the model once."""
    opt = setup.optimizer(params)
    if any(o in _OPTIMIZERS for o in _leaf_optimizers(opt)):
        raise SetupError("optimizer: the factory returned an optimizer object it had returned before: build it in "
                         "the factory (culprit builds one to step, one for the schedule and one for the start check)")
    try:
        _OPTIMIZERS.update(_leaf_optimizers(opt))
    except TypeError:
        pass  # an object without weak references: not tracked
    if not all(hasattr(o, a) for o in _leaf_optimizers(opt) for a in ("param_groups", "step", "state")):
        raise SetupError(f"optimizer: the factory returned {type(opt).__name__}, not a torch.optim.Optimizer "
                         "(several: culprit.Optimizers(a, b))")
    ids = [id(p) for g in opt.param_groups for p in g["params"]]
    if sorted(ids) != sorted(id(p) for p in params):
        raise SetupError("optimizer: its parameter groups must hold every parameter of the model once "
                         "(build it from the params argument)")
    return opt


_STATE_NAME = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def _state_kind(name, v, cls):
    if not isinstance(name, str) or not name or not set(name) <= _STATE_NAME:
        raise SetupError(f"optimizer: {cls} keeps state named {name!r}: culprit checkpoints state whose names are "
                         "letters, digits and _")
    if isinstance(v, torch.Tensor):
        if v.dtype not in _STATE_DTYPES or type(v) is not torch.Tensor and not isinstance(v, torch.nn.Parameter):
            raise SetupError(f"optimizer: {cls} keeps state '{name}' as a {v.dtype} {type(v).__name__}: culprit "
                             "checkpoints float32/64, bfloat16, float16, int64/32, uint8 and bool tensors")
        return "tensor"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SetupError(f"optimizer: {cls} keeps state '{name}' as {type(v).__name__}: culprit checkpoints "
                         "tensors, ints and floats (keep it as a tensor)")
    return "int" if isinstance(v, int) else "float"


_PROBE_LR = 1e-3  # a group's rate in the start check where the script built it with 0 (a schedule sets it)
_STATE_DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32, torch.uint8, torch.bfloat16, torch.float16,
                 torch.bool)


def _group_entries(opt):
    return [{k: v for k, v in g.items() if k not in ("params", "lr", "initial_lr")} for g in opt.param_groups]


def _probe(opt, model, grads):
    """What opt does in one step per entry of grads (seeded random gradients): the parameters and
    its state after them (to compare), and the state's names and kinds as NAME:KIND,... A group
    built with rate 0 steps at _PROBE_LR (a step that moves nothing would prove nothing). The
    parameters, rates and state are put back afterwards (their storage may be shared beyond this
    Setup: a module-level backbone)."""
    params = list(model.parameters())
    start = [p.detach().clone() for p in params]
    rates = [g["lr"] for g in opt.param_groups]
    entries = _group_entries(opt)
    cls = _class_name(opt)
    try:
        for g in opt.param_groups:
            g["lr"] = g["lr"] or _PROBE_LR
        for step in grads:
            for p, grad in zip(params, step):
                p.grad = grad.clone()
            opt.step()
        after = [p.detach().clone() for p in params]
        kinds, state = {}, []
        for p in params:
            for name, v in _state_of(opt, p).items():
                kind = _state_kind(name, v, cls)
                if kinds.setdefault(name, kind) != kind:
                    raise SetupError(f"optimizer: {cls} keeps state '{name}' as a {kinds[name]} for one parameter and "
                                     f"a {kind} for another: give them one kind (or different names)")
                state.append(v.detach().clone() if kind == "tensor" else torch.tensor(v))
        moved = [k for e, now in zip(entries, _group_entries(opt)) for k in e if now.get(k) != e[k]]
        if moved:
            raise SetupError(f"optimizer: {cls}.step() changes its parameter groups' '{moved[0]}': culprit checkpoints "
                             "the per-parameter state (opt.state[p]) and sets the rates; keep what changes there")
    finally:
        with torch.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)
                p.grad = None
        for g, lr, e in zip(opt.param_groups, rates, entries):
            g.update(e)
            g["lr"] = lr
        for o in _leaf_optimizers(opt):
            o.state.clear()
    return after + state, ",".join(f"{n}:{k}" for n, k in kinds.items())


def _mapped_args(opt, model, uniform):
    """culprit's own options for an SGD or AdamW it implements (what checkpoints, --shard-optimizer
    and the bisection's float64 and exact update checks know), or None where its update is not
    culprit's: another class, a group hyperparameter that differs from the first group's, a weight
    decay over a set of parameters culprit cannot name."""
    groups = opt.param_groups
    g0 = groups[0]
    if isinstance(opt, Optimizers) or not uniform or g0.get("maximize", False):
        return None
    if type(opt) is torch.optim.SGD:
        if any(g["dampening"] != 0 or g["momentum"] != g0["momentum"] or g["nesterov"] != g0["nesterov"]
               for g in groups):
            return None
        args = ["--optimizer", "sgd", "--momentum", repr(float(g0["momentum"]))]
        args += ["--nesterov"] if g0["nesterov"] else []
    elif type(opt) is torch.optim.AdamW:
        if any(g["amsgrad"] or g["betas"] != g0["betas"] or g["eps"] != g0["eps"] for g in groups):
            return None
        b1, b2 = g0["betas"]
        args = ["--optimizer", "adamw", "--betas", f"{float(b1)!r},{float(b2)!r}", "--eps", repr(float(g0["eps"]))]
    else:
        return None
    if any(g["lr"] != g0["lr"] for g in groups):
        return None
    decays = {float(g["weight_decay"]) for g in groups}
    wd = max(decays)
    if len(decays - {0.0}) > 1:
        return None
    which = "all"
    if wd > 0 and 0.0 in decays:
        decayed = [any(p is q for g in groups if g["weight_decay"] > 0 for q in g["params"])
                   for p in model.parameters()]
        which = next((w for w in ("matrices", "ndim2") if _decays(model, w) == decayed), None)
        if which is None:
            return None
    return args + ["--lr", repr(float(g0["lr"])), "--weight-decay", repr(wd), "--weight-decay-params", which]


def _optimizer_args(setup, steps=2):
    """The script's optimizer as culprit's options. An SGD or AdamW culprit implements becomes
    culprit's own update, checked to give bitwise what the object's step() gives; any other (another
    class, per-group hyperparameters, culprit.Optimizers) runs as the script wrote it
    (--optimizer script), checked to step deterministically. Steps the Setup's model and puts it
    back: call it on a Setup of its own."""
    model = setup.model
    params = list(model.parameters())
    if not params:
        raise SetupError("the model has no parameters to train")
    wide = [n for n, p in model.named_parameters() if p.dtype != torch.float32]
    if wide:
        raise SetupError(f"parameter '{wide[0]}' is not float32; culprit trains float32 parameters (build the model "
                         "in float32, e.g. model.float(); --precision bf16 computes the forward pass in bfloat16)")
    opt = _made_optimizer(setup, params)
    schedule = _schedule(setup, True)
    if schedule:  # the run's rates computed once now: a schedule that breaks does so before training
        schedule.lrs(max(2, min(steps, 100000)))
    # One rate for every group at every step: culprit's own update can take the schedule.
    uniform = all(len(set(v)) == 1 for v in schedule.table) if schedule else True
    g = torch.Generator().manual_seed(0)
    grads = [[torch.randn(p.shape, generator=g) for p in params] for _ in range(2)]
    theirs, state = _probe(opt, model, grads)
    args = _mapped_args(opt, model, uniform)
    if args is not None:
        start = [p.detach().clone() for p in params]
        which = args[args.index("--weight-decay-params") + 1]
        probed = list(args)
        probed[probed.index("--lr") + 1] = repr(float(opt.param_groups[0]["lr"] or _PROBE_LR))
        ours = _culprit.reference_update(probed, start, _decays(model, which), grads)
        if all(torch.equal(a, b) for a, b in zip(theirs, ours)):
            return args
    again, _ = _probe(opt, model, grads)
    names = [n for n, _p in model.named_parameters()]
    for k, (a, b) in enumerate(zip(theirs, again)):
        if a.shape != b.shape or not torch.equal(a, b):
            what = f"parameter '{names[k]}'" if k < len(names) else "optimizer state"
            raise SetupError(f"optimizer: two runs of {_class_name(opt)}.step() from the same state and gradients "
                             f"gave a different {what}: culprit needs a deterministic step (no random numbers or "
                             "clock of its own)")
    return ["--optimizer", "script", "--script-optimizer", _class_name(opt), "--optimizer-state", state,
            "--lr", repr(float(opt.param_groups[0]["lr"]))]


class _ScriptOptimizer:
    """The script's optimizer object as culprit's C++ steps it (--optimizer script): built over the
    model's parameters (views of culprit's flat buffer), its groups' learning rates set per step,
    its per-parameter state as named tensors (ints and floats as 0-dim int64 and float64 tensors,
    put back as numbers) for culprit's checkpoints."""

    def __init__(self, setup, state, recorded_class):
        self.params = list(setup.model.parameters())
        self.opt = _made_optimizer(setup, self.params)
        if _class_name(self.opt) != recorded_class:
            raise SetupError(f"optimizer: the setup function now builds {_class_name(self.opt)}, the run was trained "
                             f"with {recorded_class}: restore the script's optimizer (and the modules it imports)")
        self.kinds = dict(item.split(":", 1) for item in state.split(",") if item)
        self._groups = self.opt.param_groups
        index = {id(p): i for i, p in enumerate(self.params)}
        self._group_of = [0] * len(self.params)
        for gi, group in enumerate(self._groups):
            for p in group["params"]:
                self._group_of[index[id(p)]] = gi

    def groups(self):
        return len(self._groups)

    def group_of(self):
        return self._group_of

    def base_lrs(self):
        return [float(g["lr"]) for g in self._groups]

    def set_lrs(self, lrs):
        for g, lr in zip(self._groups, lrs):
            g["lr"] = lr

    def step(self):
        with torch.no_grad():
            self.opt.step()
        # Checked here, on the step's thread (state() also runs on the checkpoint writer's).
        for p in self.params:
            new = [n for n in _state_of(self.opt, p) if n not in self.kinds]
            if new:
                raise SetupError(f"optimizer: {_class_name(self.opt)} keeps state '{new[0]}' that its first two "
                                 "steps did not (culprit's checkpoints hold the state the start check found): create "
                                 "every state entry on a parameter's first step")

    def state(self, i):
        out = []
        st = _state_of(self.opt, self.params[i])
        for name, kind in self.kinds.items():  # --optimizer-state's order, after a restore as before
            if name not in st:
                continue
            v = st[name]
            if kind == "tensor":
                out.append((name, v))
            else:
                out.append((name, torch.tensor(v, dtype=torch.int64 if kind == "int" else torch.float64)))
        return out

    def clear(self):
        for o in _leaf_optimizers(self.opt):
            o.state.clear()

    def load(self, i, state):
        p = self.params[i]
        kinds = self.kinds
        _owner(self.opt, p).state[p] = {
            name: t if kinds[name] == "tensor" else (int(t.item()) if kinds[name] == "int" else float(t.item()))
            for name, t in state}


def _schedule(setup, per_group):
    """The Setup's learning-rate schedule (None: culprit's --lr-schedule)."""
    if setup.scheduler is None and setup.lr_schedule is None:
        return None
    return _Schedule(setup, per_group)


class _Schedule:
    """Each parameter group's learning rate per step, from the script's scheduler or lr_schedule,
    computed ahead on an optimizer of its own (the one culprit steps is not touched): lrs(s) for
    step s >= 1 is what a training loop's optimizer would hold at its s-th step(). per_group: every
    group's rate (the script's optimizer); else one rate, the same for every group (culprit's own
    update schedules one)."""

    def __init__(self, setup, per_group):
        self.per_group = per_group
        self.fn = setup.lr_schedule
        self.opt = _made_optimizer(setup, list(setup.model.parameters()))
        self.groups = self.opt.param_groups
        self.sched = None
        if setup.scheduler is not None:
            if isinstance(self.opt, Optimizers):
                raise SetupError("scheduler: a torch.optim.lr_scheduler steps one torch.optim.Optimizer, and the "
                                 "factory gives culprit.Optimizers: give lr_schedule= a list of rates, one per group")
            self.sched = setup.scheduler(self.opt)
            if isinstance(self.sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
                raise SetupError("scheduler: ReduceLROnPlateau decides from the loss as training goes: culprit needs a "
                                 "schedule of the step alone (lr_schedule=, or another scheduler)")
            if not callable(getattr(self.sched, "step", None)):
                raise SetupError(f"scheduler: the factory returned {type(self.sched).__name__}, not a "
                                 "torch.optim.lr_scheduler over the optimizer it was given")
        self.fixed = [self._rest(g) for g in self.groups]
        self.table = []

    @staticmethod
    def _rest(group):
        return {k: v for k, v in group.items() if k not in ("params", "lr", "initial_lr")}

    def lrs(self, step):
        while len(self.table) < step:
            self.table.append(self._next(len(self.table)))
        return self.table[max(step, 1) - 1]

    def _next(self, it):
        n = len(self.groups)
        if self.fn is not None:
            v = self.fn(it)
            lrs = [float(x) for x in v] if isinstance(v, (list, tuple)) else [float(v)] * n
            if len(lrs) != n:
                raise SetupError(f"lr_schedule({it}) gave {len(lrs)} learning rates for {n} parameter groups")
        else:
            if it > 0:
                with warnings.catch_warnings():  # "scheduler.step() before optimizer.step()": no optimizer steps here
                    warnings.simplefilter("ignore")
                    self.sched.step()
            lrs = [float(g["lr"]) for g in self.groups]
            for g, fixed in zip(self.groups, self.fixed):
                moved = [k for k in fixed if self._rest(g).get(k) != fixed[k]]
                if moved:
                    raise SetupError(f"scheduler: {type(self.sched).__name__} changes '{moved[0]}' as well: culprit "
                                     "schedules the learning rate alone (cycle_momentum=False, or lr_schedule=)")
        if not all(math.isfinite(v) and v >= 0 for v in lrs):
            raise SetupError(f"the schedule gives update {it} the learning rates {lrs}: each must be finite and >= 0")
        if self.per_group:
            return lrs
        if len(set(lrs)) > 1:
            raise SetupError(f"the schedule gives the parameter groups different learning rates at step {it + 1} "
                             f"({lrs}), but the run updates with culprit's own optimizer, which schedules one (the "
                             "start check computes the schedule for --steps: train with the full --steps from the "
                             "start)")
        return lrs[:1]
