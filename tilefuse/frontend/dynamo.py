"""The torch.compile backend: ``torch.compile(model, backend="tilefuse")``.

Dynamo hands over one FX graph per graph-break-free region.  aot_autograd lowers it to ATen with
the frontend's decomposition table; the forward graph is converted by the same converter table as
``import_torch`` and compiled by the tilefuse pipeline.  A graph tilefuse cannot compile runs
eagerly instead, with a ``TilefuseFallbackWarning`` naming the operator.  Backward graphs (when
gradients are required) run eagerly: tilefuse compiles inference.
"""
from __future__ import annotations

import functools
import time
import warnings
from typing import Any, Sequence

import torch
import torch.fx as fx
from torch._functorch.aot_autograd import aot_module_simplified
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..errors import TilefuseError
from .common import Imported
from .torch import decomposition_table, fx_to_graph


class TilefuseFallbackWarning(UserWarning):
    """A graph handed to the torch.compile backend runs eagerly because tilefuse cannot compile it."""


def tilefuse_backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *, options: dict | None = None,
                     mode: str | None = None, **kw):
    """torch.compile backend.  Pipeline options (``strategy``, ``target``, ``backend``, ``time_limit``,
    ``cuda_graph``, ``dump``) come from ``torch.compile(..., options={...})`` or as keywords; ``mode``
    is ignored.  The target defaults to the device the graph's inputs are on."""
    options = {**(options or {}), **kw}
    try:
        return aot_module_simplified(gm, list(example_inputs),
                                     fw_compiler=functools.partial(_compile_forward, options=options),
                                     bw_compiler=_eager, decompositions=_decompositions())
    except TilefuseError as e:
        warnings.warn(f"tilefuse could not compile a graph of {len(gm.graph.nodes)} nodes and runs it "
                      f"eagerly: {e}", TilefuseFallbackWarning, stacklevel=2)
        return gm.forward


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

        compiled = _pipeline(Imported(graph, flatten_inputs, unflatten_outputs),
                             target=options.get("target") or _device_target(example_inputs), backend=backend,
                             strategy=strategy, t0=t0, dump=options.get("dump"),
                             time_limit=options.get("time_limit", 10.0), cuda_graph=options.get("cuda_graph", False))
        if backend == "triton":
            compiled.program  # generate the kernels now, while a failure can still fall back to eager
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
