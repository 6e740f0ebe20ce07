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
           "max_specializations": "plans kept per graph with symbolic shapes",
           "interpreter": "on a machine without a GPU, run the kernels in Triton's interpreter (checking, "
                          "not speed) instead of handing the graph back to PyTorch"}
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
    if target is not None and Target.get(target).device == "cuda" and not Target.get(target).is_present():
        raise TargetAbsentError(f"target {target!r} is not attached to this machine, and torch.compile runs what "
                                f"it compiles; to plan for {target} without one, use tilefuse.compile(model, "
                                f"args, target={target!r}) and check its kernels with .emulate(...)")
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


def _compile_static(gm: fx.GraphModule, args: Sequence[Any], options: dict):
    """The graph compiled for the concrete shapes of ``args`` (the graph itself where it cannot be)."""
    try:
        return aot_module_simplified(gm, list(args),
                                     fw_compiler=functools.partial(_compile_forward, options=options),
                                     bw_compiler=_eager, decompositions=_decompositions())
    except VerifyError:
        raise       # asked to verify: a stage that changed the program is not hidden by a fallback
    except TilefuseError as e:
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
    """A graph with symbolic shapes, run through a plan compiled for each call's concrete input
    signature (tilefuse plans are static).  The backend adds no guards on the symbols, so every size
    dynamo's guards allow reaches this one callable; at most ``limit`` plans are compiled, and calls
    with a new signature after that run the graph eagerly, with one warning."""

    def __init__(self, gm: fx.GraphModule, options: dict, limit: int):
        self.gm, self.options, self.limit = gm, options, limit
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.names = [n.name for n in placeholders]
        self.dynamic = {k: dims for k, n in enumerate(placeholders) if (dims := _symbolic_dims(n))}
        self.scalars = _wrapped_scalars(gm)
        self.plans: dict[tuple, Any] = {}
        self._lock = threading.Lock()  # one compile per signature when threads call at once
        self._warned = False

    def __call__(self, *args):
        key = (_signature(args), tuple(_scalar(args[k]) for k in self.scalars))
        fn = self.plans.get(key)
        if fn is None:
            fn = self._specialize(key, args)
        return fn(*args)

    def _specialize(self, key: tuple, args):
        with self._lock:
            if key in self.plans:
                return self.plans[key]
            if len(self.plans) >= self.limit:
                if not self._warned:
                    self._warned = True
                    warnings.warn(f"tilefuse compiled {self.limit} plans for the input shapes of one "
                                  f"torch.compile graph (max_specializations); calls with other shapes "
                                  f"run eagerly", TilefuseFallbackWarning, stacklevel=3)
                return self.gm.forward
            cause = _cause(key, list(self.plans), self.names, self.dynamic)
            record = {"plan": len(self.plans) + 1, "limit": self.limit, "cause": cause}
            _recompile_log.info("plan %d of at most %d for a graph with symbolic shapes: %s", record["plan"],
                                self.limit, cause)
            token = _specializing.set(record)
            try:
                fn = self.plans[key] = _compile_static(self._with_scalars(args), args, self.options)
            finally:
                _specializing.reset(token)
            return fn

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


@functools.lru_cache(maxsize=1)
def _decompositions() -> dict:
    return dict(decomposition_table().items())


def _eager(gm: fx.GraphModule, example_inputs):
    return _boxed(gm.forward)


def _boxed(fn):
    """aot_autograd calls compiled functions with one list of arguments when they say so."""
    def call(args):
        return fn(*args)
    call._boxed_call = True
    return call


def _compile_forward(gm: fx.GraphModule, example_inputs, *, options: dict):
    from ..api import _check_options, _pipeline  # late: api imports the frontends lazily too
    strategy, backend = options.get("strategy", "optimal"), options.get("backend", "triton")
    _check_options(backend, strategy)
    t0 = time.perf_counter()
    with unset_fake_temporarily():
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        tensor_pos = [k for k, n in enumerate(placeholders) if isinstance(n.meta.get("val"), torch.Tensor)]
        inputs = {placeholders[k]: placeholders[k].name for k in tensor_pos}
        values = {n: n.meta.get("val") for n in placeholders if n not in inputs}
        em, outs = fx_to_graph(gm.graph, inputs=inputs, values=values, owner=gm)
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
                             measure=options.get("measure", False), check=check)
        if backend == "triton":
            compiled.program  # generate the kernels now, while a failure can still fall back to eager
    record = _specializing.get()
    if record is not None:
        compiled.report.specialization = dict(record)
    _compiled.append(weakref.ref(compiled))
    return _boxed(compiled)


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
