"""The torch.compile backend: ``torch.compile(model, backend="tilefuse")``.

Dynamo hands over one FX graph per graph-break-free region.  aot_autograd lowers it to ATen with
the frontend's decomposition table; the forward graph is converted by the same converter table as
``import_torch`` and compiled by the tilefuse pipeline.  A graph tilefuse cannot compile runs
eagerly instead, with a ``TilefuseFallbackWarning`` naming the operator.  Backward graphs (when
gradients are required) run eagerly: tilefuse compiles inference.  Graphs on CPU tensors go back
to PyTorch unless a target or ``interpreter=True`` is given (on a CPU tilefuse's kernels run in
Triton's interpreter: for checking, not speed).

Plans are compiled for static shapes.  When dynamo hands over a graph with symbolic shapes (after a
recompile for a new shape, with ``dynamic=True`` or ``mark_dynamic``), the backend returns a
callable that compiles one plan per concrete input signature seen at call time, up to
``max_specializations`` of them (option, else ``TILEFUSE_MAX_SPECIALIZATIONS``, else 8); further
signatures run eagerly after one warning.  Each new plan is logged on the ``recompile`` channel
with the input dimension that made it new (also in its ``report.specialization``).
"""
from __future__ import annotations

import collections
import contextvars
import copy
import functools
import os
import threading
import time
import warnings
import weakref
from typing import Any, Sequence

import torch
import torch.fx as fx
from torch._functorch.aot_autograd import aot_module_simplified
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..cost.target import Target
from ..errors import InterpreterWarning, OptionError, TargetAbsentError, TilefuseError
from ..log import logger
from ..verify import Verifier, VerifyError, enabled, random_feeds
from .common import Imported
from .torch import decomposition_table, fx_to_graph


class TilefuseFallbackWarning(UserWarning):
    """A graph handed to the torch.compile backend runs eagerly: tilefuse cannot compile it, or has
    compiled ``max_specializations`` plans for its symbolic shapes already."""


DEFAULT_MAX_SPECIALIZATIONS = 8
_recompile_log = logger("recompile")
# the specialization being compiled (plan number, cause), for its report
_specializing: contextvars.ContextVar[dict | None] = contextvars.ContextVar("tilefuse_specializing", default=None)
KEPT = 64       # the graphs compiled last that ``compiled_graphs()`` lists

# weak references, oldest first: the list keeps no compiled model (nor its buffers) alive
_compiled: "collections.deque" = collections.deque(maxlen=KEPT)
_planned: "collections.deque" = collections.deque(maxlen=KEPT)    # plan_only's plans (nothing runs them)


def compiled_graphs() -> list:
    """The CompiledModels this process's ``torch.compile(backend="tilefuse")`` made and that are
    still in use, oldest first (of the last ``KEPT``): their reports say what each graph became."""
    return [c for c in (ref() for ref in _compiled) if c is not None]


# The options torch.compile(..., options={...}) may pass, and what each is
OPTIONS = {"target": "a target name (default: the CUDA device the inputs are on)",
           "backend": "'triton' (generated kernels) or 'reference'",
           "strategy": "'optimal', 'greedy' or 'unfused'",
           "time_limit": "seconds of planning per segment",
           "cuda_graph": "replay each graph's plan as one CUDA graph",
           "measure": "time kernels on the GPU and re-plan with the measurements",
           "dump": "a directory to write each stage's output to",
           "verify": "check every stage against the graph on random inputs",
           "max_specializations": "plans (buckets of sizes) per graph with symbolic shapes",
           "check_buckets": "plan each bucket's smallest sizes too, to report how much slower (modelled) the "
                            "bucket's plan is there (default True)",
           "persistent": "launch runs of consecutive generated kernels as one persistent kernel: 'auto' where "
                         "modelled faster, True every run (experimental)",
           "interpreter": "on a machine without a GPU, run the kernels in Triton's interpreter (checking, "
                          "not speed) instead of handing the graph back to PyTorch",
           "plan_only": "plan each graph for the target and build its kernels, but run the graph through "
                        "PyTorch: the plans are in tilefuse.compiled_graphs() (a GPU target on a machine "
                        "without one: what a static KV cache's decode step becomes on an H100)"}
# torch.compile's modes, as tilefuse options
MODES = {"default": {}, "reduce-overhead": {"cuda_graph": True},
         "max-autotune": {"measure": True, "cuda_graph": True}, "max-autotune-no-cudagraphs": {"measure": True}}


def tilefuse_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *, options: dict | None = None,
                     mode: str | None = None, **kw):
    """torch.compile backend.  Options (``OPTIONS``) come from ``torch.compile(..., options={...})``
    or as keywords; ``mode`` maps onto them (``MODES``: "reduce-overhead" replays CUDA graphs,
    "max-autotune" measures kernels on the GPU too).  The target defaults to the CUDA device the
    graph's inputs are on; on CPU tensors the graph runs through PyTorch (tilefuse's kernels would
    run in Triton's interpreter: ``interpreter=True`` asks for that, to check them), with one
    ``InterpreterWarning``."""
    on_cuda = any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs)
    options = _checked_options({**(options or {}), **kw}, mode, on_cuda)
    target = options.get("target")
    if target is not None and Target.get(target).device == "cuda" and not Target.get(target).is_present() \
            and not options.get("plan_only"):
        raise TargetAbsentError(f"target {target!r} is not attached to this machine, and torch.compile runs what "
                                f"it compiles; to plan for {target} without one, pass options={{'plan_only': True}} "
                                f"(the graph then runs through PyTorch), or use tilefuse.compile(model, args, "
                                f"target={target!r}) and check its kernels with .emulate(...)")
    if options.get("plan_only") and options.get("measure"):
        raise OptionError("plan_only runs no kernel of tilefuse's, so it cannot measure them (measure=True)")
    if target is None and not on_cuda and not options.get("interpreter"):
        _pytorch_notice()
        return gm.forward
    if _symbolic(gm, example_inputs):
        return _Specializing(gm, options, _max_specializations(options))
    return _compile_static(gm, example_inputs, options)


def _checked_options(options: dict, mode: str | None, on_cuda: bool) -> dict:
    """``options`` checked, with what ``mode`` means on a GPU (CUDA graphs and measurement need one)."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise OptionError(f"unknown tilefuse option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                          f"the options are: " + "; ".join(f"{k} ({v})" for k, v in OPTIONS.items()))
    if mode is not None:
        if mode not in MODES:
            raise OptionError(f"unknown torch.compile mode {mode!r} for backend 'tilefuse'; choose one of {sorted(MODES)}")
        if on_cuda:
            options = {**MODES[mode], **options}
    return options


_pytorch_told = False


def _pytorch_notice() -> None:
    global _pytorch_told
    if not _pytorch_told:
        _pytorch_told = True
        warnings.warn("tilefuse hands graphs on CPU tensors back to PyTorch: there is no GPU here, and its kernels "
                      "would run in Triton's interpreter, for checking, not speed. options={'interpreter': True} "
                      "runs them anyway; tilefuse.compile(model, args, target='h100') plans for a GPU",
                      InterpreterWarning, stacklevel=3)


def _compile_static(gm: fx.GraphModule, args: Sequence[Any], options: dict, *, template=None,
                    sink: list | None = None, keep: bool = True, fallback: bool = True, sizes: dict | None = None):
    """The graph compiled for the concrete shapes of ``args`` (the graph itself where it cannot be,
    unless not ``fallback``); with ``template``, that plan carried to these shapes; the
    CompiledModel is appended to ``sink``, and listed by ``compiled_graphs()`` if ``keep``."""
    try:
        return aot_module_simplified(gm, list(args),
                                     fw_compiler=functools.partial(_compile_forward, options=options,
                                                                   template=template, sink=sink, keep=keep,
                                                                   sizes=sizes),
                                     bw_compiler=_eager, decompositions=_decompositions(_training(gm, args)))
    except VerifyError:
        raise       # asked to verify: a stage that changed the program is not hidden by a fallback
    except TilefuseError as e:
        from ..orchestrate.instantiate import PlanMismatch
        if not fallback or isinstance(e, PlanMismatch):
            raise
        warnings.warn(f"tilefuse could not compile a graph of {len(gm.graph.nodes)} nodes and runs it "
                      f"eagerly: {e}", TilefuseFallbackWarning, stacklevel=3)
        return gm.forward


def _symbolic(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    """Whether dynamo traced the graph with symbolic inputs: each free size symbol is a SymInt input
    and the placeholders' fake tensors carry the symbols; a Python scalar it chose not to specialize
    (``dynamic=True`` does so for floats: epsilons, scales) is a 0-d tensor input read by ``.item()``."""
    if any(isinstance(x, (torch.SymInt, torch.SymFloat)) for x in example_inputs) or _wrapped_scalars(gm):
        return True
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            v = n.meta.get("example_value", n.meta.get("val"))
            if isinstance(v, torch.Tensor) and not all(isinstance(d, int) for d in (*v.shape, *v.stride())):
                return True
    return False


def _wrapped_scalars(gm: fx.GraphModule) -> list[int]:
    """Positions of the inputs that dynamo passes as 0-d tensors standing for Python scalars."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return [k for k, n in enumerate(placeholders) if getattr(n.meta.get("grapharg"), "pass_arg_as_tensor", False)]


def _max_specializations(options: dict) -> int:
    value, source = options.get("max_specializations"), "option max_specializations"
    if value is None:
        value, source = os.environ.get("TILEFUSE_MAX_SPECIALIZATIONS"), "TILEFUSE_MAX_SPECIALIZATIONS"
    if value is None:
        return DEFAULT_MAX_SPECIALIZATIONS
    try:
        n = int(value) if isinstance(value, (int, str)) and not isinstance(value, bool) else 0
    except ValueError:
        n = 0
    if n < 1:
        raise OptionError(f"{source} must be a positive integer (plans kept per graph with symbolic "
                          f"shapes), got {value!r}")
    return n


class _Specializing:
    """A graph with symbolic shapes, run through plans for buckets of its sizes (tilefuse plans
    are static).  Each call's size symbols (read off the inputs whose dims dynamo left symbolic)
    fall in power-of-two buckets (``orchestrate/buckets.py``); a bucket is planned once, at its
    largest sizes but one (inputs of those sizes made up for the trace), its bound checked at its
    smallest, and each size in it is served by that plan carried to the size
    (``orchestrate/instantiate.py``: no planning; kernels generated for the size).  The backend
    adds no guards on the symbols, so every size dynamo's guards allow reaches this one callable;
    at most ``limit`` buckets are planned, and calls needing another one run the graph eagerly,
    with one warning."""

    INSTANCES = 16       # the sizes whose compiled plans are kept (least recently used dropped)

    def __init__(self, gm: fx.GraphModule, options: dict, limit: int):
        self.gm, self.options, self.limit = gm, options, limit
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.names = [n.name for n in placeholders]
        self.dynamic = {k: dims for k, n in enumerate(placeholders) if (dims := _symbolic_dims(n))}
        self.exprs = [_size_exprs(n) for n in placeholders]
        self.scalars = _wrapped_scalars(gm)
        self.buckets: dict[tuple, tuple] = {}   # bucket key -> (Bucket, its plan's CompiledModel, its callable)
        self.first: dict[str, int] = {}         # the size symbols at the first call
        # the symbols bucketed: under torch.compile's default, dynamo makes a dim symbolic once it
        # has changed (or ``mark_dynamic`` says it will), so every symbol varies; ``dynamic=True``
        # makes every dim a symbol, and one is bucketed once it has taken a second size (until then
        # it may be a dim that never changes, planned at its own size)
        self.varying: set[str] = set() if not torch._dynamo.config.assume_static_by_default else {
            str(e) for exprs in self.exprs if exprs for e in exprs if getattr(e, "is_Symbol", False)}
        self.plans: dict[tuple, Any] = {}       # signatures planned on their own -> callable
        self.unbucketed = False                 # the graph cannot be traced at made-up sizes
        self.instances: collections.OrderedDict[tuple, Any] = collections.OrderedDict()
        self._lock = threading.Lock()  # one compile per signature when threads call at once
        self._warned = False

    def __call__(self, *args):
        key = (_signature(args), tuple(_scalar(args[k]) for k in self.scalars))
        fn = self.instances.get(key)
        if fn is None:
            fn = self._specialize(key, args)
        return fn(*args)

    @property
    def planned(self) -> int:
        """Plans made: one per bucket (a bucket of one size may share its plan with a wider one)."""
        return len({id(b[1]) for b in self.buckets.values()}) + len(self.plans)

    def _specialize(self, key: tuple, args):
        with self._lock:
            fn = self.instances.get(key)
            if fn is not None:
                return fn
            sizes = self._sizes(args)
            # no size symbol to bucket (only scalars), or sizes that cannot be bucketed: a plan per signature
            fn = self._in_bucket(key, args, sizes) if sizes and not self.unbucketed else self._alone(key, args)
            self.instances[key] = fn
            if len(self.instances) > self.INSTANCES:
                self.instances.popitem(last=False)
            return fn

    def _over_limit(self) -> bool:
        if self.planned < self.limit:
            return False
        if not self._warned:
            self._warned = True
            warnings.warn(f"tilefuse compiled {self.limit} plans for the input shapes of one "
                          f"torch.compile graph (max_specializations); calls with other shapes "
                          f"run eagerly", TilefuseFallbackWarning, stacklevel=4)
        return True

    def _record(self, key: tuple, **more) -> dict:
        cause = _cause(key, self._seen, self.names, self.dynamic)
        return {"plan": self.planned + 1, "limit": self.limit, "cause": cause, **more}

    @property
    def _seen(self) -> list[tuple]:
        return list(self.instances) + [k for k in self.plans if k not in self.instances]

    def _alone(self, key: tuple, args):
        """The plan of this signature on its own (counted against the limit)."""
        fn = self.plans.get(key)
        if fn is None:
            if self._over_limit():
                return self.gm.forward
            record = self._record(key)
            _recompile_log.info("plan %d of at most %d for a graph with symbolic shapes: %s", record["plan"],
                                self.limit, record["cause"])
            fn = self.plans[key] = self._compile(args, record)[0]
        return fn

    def _in_bucket(self, key: tuple, args, sizes: dict[str, int]):
        from ..orchestrate.buckets import bucket, clipped, describe_ranges, plan_bucket, planned_size
        from ..orchestrate.instantiate import PlanMismatch
        self.first = self.first or dict(sizes)
        self.varying |= {s for s, n in sizes.items() if self.first.get(s) != n}
        static = (self._layout(args), key[1])
        got = next((e for (st, _), e in self.buckets.items() if st == static and e[0].holds(sizes)), None)
        if got is None:
            ranges = {s: bucket(n) if s in self.varying else (n, n) for s, n in sizes.items()}
            ranges = clipped(ranges, sizes, [e[0].ranges for (st, _), e in self.buckets.items()
                                             if st == static and e[0].narrowed])
            at = {s: planned_size(*r) for s, r in ranges.items()}
            # the plan at the planned sizes, when they were planned already (as a bucket of one)
            alone = self.buckets.get((static, tuple((s, (n, n)) for s, n in at.items())))
            if alone is None and self._over_limit():
                return self.gm.forward
            record = self._record(key, sizes=dict(sizes)) if alone is None else alone[1].report.specialization
            made: list = []                  # the models planning the bucket made
            top_fn: list = []

            def compile_at(where, template):
                if alone is not None and where == at and template is None:
                    made.append(alone[1])
                    return alone[1]
                # kept (listed by compiled_graphs): the bucket's plan, not what planning it made
                # to check the bound and to make the kernels size-generic
                fn, model = self._compile(self._args_at(args, sizes, where),
                                          {**record, "sizes": dict(where), "carried": template is not None},
                                          template=template, keep=where == at and template is None,
                                          fallback=False)
                if model is None:
                    raise _Unplanned()
                if where == at and template is None:
                    top_fn.append(fn)
                made.append(model)
                return model
            try:
                bucket_, top = plan_bucket(ranges, compile_at, check=self.options.get("check_buckets", True))
            except _Unplanned:       # the graph at other sizes cannot be traced: a plan per signature
                self.unbucketed = True
                return self._alone(key, args)
            for model in made:
                if model is not (alone and alone[1]):
                    model.report.specialization["bucket"] = bucket_.record()
            got = self.buckets[static, tuple(bucket_.ranges.items())] = (bucket_, top,
                                                                          top_fn[0] if top_fn else alone[2])
            _recompile_log.info("plan %d of at most %d for a graph with symbolic shapes: %s; serves %s, planned at "
                                "%s%s", record["plan"], self.limit, record["cause"], describe_ranges(bucket_.ranges),
                                bucket_.template.sizes, bucket_.describe())
            if not bucket_.holds(sizes):        # narrowed past these sizes: they need a bucket of their own
                return self._in_bucket(key, args, sizes)
        bucket_, top, fn = got
        if sizes == bucket_.template.sizes:
            return fn
        record = {**top.report.specialization, "sizes": dict(sizes), "carried": True,
                  "cause": f"sizes {sizes} in the bucket of plan {top.report.specialization['plan']}"}
        try:
            fn, model = self._compile(args, record, template=bucket_.template, sizes=sizes)
            if model is not None:
                model.report.specialization["generic_kernels"] = sum(b.size_arg is not None for b in model.kernels)
        except PlanMismatch as e:
            _recompile_log.info("the plan for %s does not carry to %s (%s): planned on its own",
                                describe_ranges(bucket_.ranges), sizes, e)
            return self._alone(key, args)
        _recompile_log.debug("plan for %s carried to %s", describe_ranges(bucket_.ranges), sizes)
        return fn

    def _compile(self, args, record: dict, *, template=None, keep: bool = True, fallback: bool = True,
                 sizes: dict | None = None):
        """(the callable, its CompiledModel) for ``args``; ``_Unplanned`` where tilefuse could not
        (having warned and run the graph eagerly there, with ``fallback``)."""
        sink: list = []
        token = _specializing.set(record)
        try:
            fn = _compile_static(self._with_scalars(args), args, self.options, template=template, sink=sink,
                                 keep=keep, fallback=fallback, sizes=sizes)
        except Exception as e:      # made-up sizes the graph cannot take (not fallback)
            from ..orchestrate.instantiate import PlanMismatch
            if fallback or isinstance(e, (VerifyError, PlanMismatch)):
                raise
            raise _Unplanned(str(e)) from e
        finally:
            _specializing.reset(token)
        if not sink:             # tilefuse could not compile it: eager, warned
            return fn, None
        return fn, sink[0]

    def _sizes(self, args) -> dict[str, int]:
        """Each size symbol's value in these inputs (symbol name -> size), from the dims and SymInt
        inputs that are a symbol alone."""
        out: dict[str, int] = {}
        for k, exprs in enumerate(self.exprs):
            if exprs is None:
                continue
            values = tuple(args[k].shape) if isinstance(args[k], torch.Tensor) else (args[k],)
            for e, v in zip(exprs, values):
                if getattr(e, "is_Symbol", False):
                    out.setdefault(str(e), int(v))
        return dict(sorted(out.items()))

    def _args_at(self, args, sizes: dict[str, int], at: dict[str, int]) -> list:
        """``args`` where the symbols have the sizes ``at``: made-up inputs (zeros, the same layout)."""
        if at == sizes:
            return list(args)
        out = list(args)
        for k, exprs in enumerate(self.exprs):
            if exprs is None:
                continue
            values = [int(e.xreplace({_sym(s): n for s, n in at.items()})) if not isinstance(e, int) else e
                      for e in exprs]
            out[k] = _like(args[k], values) if isinstance(args[k], torch.Tensor) else values[0]
        return out

    def _layout(self, args) -> tuple:
        """What a bucket's plan depends on besides the symbols: each tensor's dtype, device, gradient
        flag, stride order and fixed dims; each other input's value unless it is a symbol."""
        key = []
        for k, a in enumerate(args):
            exprs = self.exprs[k]
            if isinstance(a, torch.Tensor):
                fixed = tuple(n if exprs is None or isinstance(exprs[d], int) else None for d, n in enumerate(a.shape))
                key.append((fixed, _stride_order(a), a.dtype, a.device, a.requires_grad))
            elif exprs is None:
                key.append((type(a), a))
        return tuple(key)

    def _with_scalars(self, args) -> fx.GraphModule:
        """The graph with each wrapped scalar's ``.item()`` replaced by its value in ``args``: traced
        without a shape environment, ``.item()`` of an input has no value."""
        if not self.scalars:
            return self.gm
        graph = copy.deepcopy(self.gm.graph)
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        for k in self.scalars:
            for use in list(placeholders[k].users):
                if use.op == "call_method" and use.target == "item":
                    for reader in list(use.users):
                        reader.replace_input_with(use, _scalar(args[k]))
                    graph.erase_node(use)
        return fx.GraphModule(self.gm, graph)


def _symbolic_dims(node: fx.Node) -> tuple[int, ...]:
    """The dimensions dynamo left symbolic in a placeholder's example tensor (() for a SymInt)."""
    v = node.meta.get("example_value", node.meta.get("val"))
    if isinstance(v, torch.Tensor):
        return tuple(d for d, n in enumerate(v.shape) if not isinstance(n, int))
    return ()


class _Unplanned(Exception):
    """tilefuse could not compile the graph at some sizes (it runs eagerly there)."""


def _size_exprs(node: fx.Node) -> tuple | None:
    """A placeholder's sizes as dynamo traced them (ints, or sympy expressions of the size
    symbols); None for an input with none symbolic."""
    v = node.meta.get("example_value", node.meta.get("val"))
    sizes = tuple(v.shape) if isinstance(v, torch.Tensor) else (v,) if isinstance(v, torch.SymInt) else ()
    if not any(isinstance(n, torch.SymInt) for n in sizes):
        return None
    return tuple(n.node.expr if isinstance(n, torch.SymInt) else int(n) for n in sizes)


def _sym(name: str):
    import sympy
    return sympy.Symbol(name, integer=True, positive=True)


def _stride_order(t: torch.Tensor) -> tuple:
    """The dims from outermost to innermost by stride (size-1 dims last), and whether it is
    contiguous."""
    order = sorted(range(t.dim()), key=lambda d: (t.shape[d] == 1, -t.stride(d), d))
    return tuple(order), t.is_contiguous()


def _like(t: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """Zeros of ``shape`` laid out in ``t``'s stride order (for tracing only: values do not matter)."""
    order, _ = _stride_order(t)
    z = torch.zeros([shape[d] for d in order], dtype=t.dtype, device=t.device)
    inverse = sorted(range(len(order)), key=lambda d: order[d])
    return z.permute(inverse).requires_grad_(t.requires_grad)


def _cause(key: tuple, seen: list[tuple], names: list[str], dynamic: dict[int, tuple]) -> str:
    """What makes signature ``key`` new: on the first call, the sizes of the inputs with symbolic
    dimensions; later, each input that differs from the nearest signature seen (the one with the
    fewest differences), by name and dimension ("input 1 'l_x_' dim 1: 8 -> 9")."""
    if not seen:
        sized = [f"input {k} {names[k]!r} {list(key[0][k][0])} (symbolic dims {', '.join(map(str, dims))})"
                 for k, dims in sorted(dynamic.items()) if k < len(key[0])]
        return "the first call" + (": " + ", ".join(sized) if sized else "")
    best = min(seen, key=lambda old: len(_differences(old, key, names)))
    return "; ".join(_differences(best, key, names)) or "the same signature"


def _differences(old: tuple, new: tuple, names: list[str]) -> list[str]:
    out = []
    for k, (a, b) in enumerate(zip(old[0], new[0])):
        name = f"input {k} {names[k] if k < len(names) else k!r}"
        if a == b:
            continue
        if isinstance(a[0], tuple) and isinstance(b[0], tuple):      # tensors: shape, strides, dtype, device
            if len(a[0]) != len(b[0]):
                out.append(f"{name} rank: {len(a[0])} -> {len(b[0])}")
            elif a[0] != b[0]:
                out += [f"{name} dim {d}: {x} -> {y}" for d, (x, y) in enumerate(zip(a[0], b[0])) if x != y]
            else:
                out += [f"{name} {what}: {x} -> {y}" for what, x, y in
                        zip(("strides", "dtype", "device", "requires_grad"), a[1:], b[1:]) if x != y]
        else:
            out.append(f"{name}: {a[-1]!r} -> {b[-1]!r}")
    out += [f"scalar input {k}: {x!r} -> {y!r}" for k, (x, y) in enumerate(zip(old[1], new[1])) if x != y]
    return out


def _scalar(x):
    return x.item() if isinstance(x, torch.Tensor) else x


def _signature(args: Sequence[Any]) -> tuple:
    """What a plan compiled for ``args`` depends on: each tensor's shape, dtype, device, gradient flag
    and the strides of its non-unit dims (a size-1 dim's stride never matters); each other input's
    type and value (dynamo passes symbolic sizes as ints)."""
    key = []
    for a in args:
        if isinstance(a, torch.Tensor):
            strides = tuple(s if d != 1 else None for d, s in zip(a.shape, a.stride()))
            key.append((tuple(a.shape), strides, a.dtype, a.device, a.requires_grad))
        else:
            key.append((type(a), a))
    return tuple(key)


@functools.lru_cache(maxsize=2)
def _decompositions(training: bool = False) -> dict:
    """The frontend's table; ``training``: with the CPU's fused attention decomposed as torch
    does (a graph traced for a backward pass keeps its logsumexp, which tilefuse does not make)."""
    table = dict(decomposition_table().items())
    if training:
        cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
        table[cpu] = torch.export.default_decompositions()[cpu]
    return table


def _training(gm: fx.GraphModule, args: Sequence[Any]) -> bool:
    """Whether aot_autograd traces ``gm`` for a backward pass too (its own test)."""
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in (*gm.parameters(), *args))


def _eager(gm: fx.GraphModule, example_inputs):
    return _boxed(gm.forward)


def _boxed(fn):
    """aot_autograd calls compiled functions with one list of arguments when they say so."""
    def call(args):
        return fn(*args)
    call._boxed_call = True
    return call


def _compile_forward(gm: fx.GraphModule, example_inputs, *, options: dict, template=None,
                     sink: list | None = None, keep: bool = True, sizes: dict | None = None):
    from ..api import _check_options, _pipeline  # late: api imports the frontends lazily too
    strategy, backend = options.get("strategy", "optimal"), options.get("backend", "triton")
    _check_options(backend, strategy, options.get("time_limit", 10.0), options.get("persistent", False))
    t0 = time.perf_counter()
    with unset_fake_temporarily():
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        tensor_pos = [k for k, n in enumerate(placeholders) if isinstance(n.meta.get("val"), torch.Tensor)]
        inputs = {placeholders[k]: placeholders[k].name for k in tensor_pos}
        values = {n: n.meta.get("val") for n in placeholders if n not in inputs}
        em, outs = fx_to_graph(gm.graph, inputs=inputs, values=values, owner=gm,
                               updated=_written_back(placeholders))
        graph = em.graph([o for o in outs if isinstance(o, str)], "torch_compile_graph")

        def flatten_inputs(args, kwargs):
            return [args[k] for k in tensor_pos]

        def unflatten_outputs(results):
            it = iter(results)
            return [next(it) if isinstance(o, str) else o for o in outs]

        check = None
        if enabled(options.get("verify")):      # on random inputs, the graph dynamo traced the oracle
            feeds = random_feeds(graph.inputs)   # (the example inputs are fake tensors here)
            args = list(example_inputs)
            for k in tensor_pos:
                args[k] = feeds[placeholders[k].name]
            check = Verifier(feeds, lambda: [o for o, spec in zip(gm(*args), outs) if isinstance(spec, str)])
        compiled = _pipeline(Imported(graph, flatten_inputs, unflatten_outputs),
                             target=options.get("target") or _device_target(example_inputs), backend=backend,
                             strategy=strategy, t0=t0, dump=options.get("dump"),
                             time_limit=options.get("time_limit", 10.0), cuda_graph=options.get("cuda_graph", False),
                             measure=options.get("measure", False), check=check, template=template,
                             sizes=sizes, persistent=options.get("persistent", False))
        compiled.static_inputs = frozenset(placeholders[k].name for k in _static_indices() if k in tensor_pos)
        if backend == "triton" and not options.get("plan_only"):
            compiled.program  # generate the kernels now, while a failure can still fall back to eager
    record = _specializing.get()
    if record is not None:
        compiled.report.specialization = dict(record)
    if sink is not None:
        sink.append(compiled)
    if keep:
        _compiled.append(weakref.ref(compiled))
    if options.get("plan_only"):
        _planned.append(compiled)     # kept alive: nothing else holds a plan that never runs
        return _boxed(gm.forward)
    return _boxed(compiled)


def _written_back(placeholders: list) -> frozenset:
    """The placeholders of the graph being compiled whose data it updates (AOT autograd's input
    mutations, e.g. a static KV cache's ``index_copy_``): AOT makes the graph return their new
    values and copies each back into its input, a copy it skips when the value is the input itself
    (``aten/scatter.py``: ``IndexPut``)."""
    from torch._guards import TracingContext
    ctx = TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    if meta is None or len(meta.input_info) != len(placeholders):
        return frozenset()
    return frozenset(p for p, info in zip(placeholders, meta.input_info)
                     if info.mutates_data and not info.mutates_metadata and not info.mutates_storage_metadata)


def _static_indices() -> list[int]:
    """The graph's inputs that AOT autograd knows to keep their addresses from call to call (the
    parameters and buffers dynamo lifts into inputs, tensors marked ``mark_static_address``)."""
    from torch._guards import TracingContext
    ctx = TracingContext.try_get()
    return list(getattr(getattr(ctx, "fw_metadata", None), "static_input_indices", None) or ())


def _device_target(example_inputs) -> str:
    """``auto`` (the CUDA device) for a graph on CUDA tensors, else the interpreter target ``cpu``."""
    on_cuda = any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs)
    return "auto" if on_cuda else "cpu"


def _register() -> None:
    # Installed packages expose the backend through the torch_dynamo_backends entry point; register
    # it by hand only when that is missing (registering both would be a duplicate).
    import torch._dynamo
    if "tilefuse" not in torch._dynamo.list_backends(exclude_tags=()):
        torch._dynamo.register_backend(tilefuse_backend, name="tilefuse")


_register()
