"""An ONNX model with dynamic dimensions, planned for each input size it is called with.

``compile_onnx(path)`` of a model whose inputs have free dims (``batch``, ``sequence``, or unnamed
ones) returns a ``DynamicModel``: each call reads the sizes off its inputs, binds every named dim
once for all inputs (as onnxruntime does) and runs the plan compiled for those sizes, compiling it
the first time (``compile_onnx(..., dims=..., input_shapes=...)``).  The last ``max_plans`` plans
are kept (least recently used dropped); each new plan is logged on the ``recompile`` channel with
what made it new.  Plans are static: a new size costs a plan (seconds), not a fallback.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from ..errors import InputError
from ..log import logger
from .compiled import _ORT_TYPES, IOInfo

DEFAULT_MAX_PLANS = 8
_log = logger("recompile")


class DynamicModel:
    """Plans of one ONNX model, one per set of input sizes; called like a ``CompiledModel``."""

    def __init__(self, model, open_inputs: Mapping[str, tuple | None], compile_for: Callable[..., Any], *,
                 pinned: Mapping[str, Sequence[int]] | None = None, dims: Mapping[str, int] | None = None,
                 max_plans: int = DEFAULT_MAX_PLANS, initializers_as_inputs: bool = False):
        self.model = model
        self.open = dict(open_inputs)          # input -> declared dims (size, dim name or None)
        self._compile_for = compile_for        # (dims, input_shapes) -> CompiledModel
        self.pinned, self.dims = dict(pinned or {}), dict(dims or {})
        self.max_plans = max_plans
        inits = set() if initializers_as_inputs else \
            {t.name for t in model.graph.initializer} | {sp.values.name for sp in model.graph.sparse_initializer}
        self.input_names = [vi.name for vi in model.graph.input if vi.name not in inits
                            and vi.type.WhichOneof("value") == "tensor_type"]
        self.output_names = [vi.name for vi in model.graph.output]
        self._plans: OrderedDict[tuple, Any] = OrderedDict()
        self._lock = threading.Lock()
        self.last = None                       # the plan the last call ran

    # -- what a caller sees
    @property
    def plans(self) -> list:
        """The CompiledModels kept, least recently used first."""
        return list(self._plans.values())

    @property
    def report(self):
        """The report of the plan the last call ran (None before the first call)."""
        return None if self.last is None else self.last.report

    def get_inputs(self) -> list[IOInfo]:
        """The inputs as onnxruntime lists them, free dims by name (None where unnamed)."""
        return [self._io(vi) for vi in self.model.graph.input if vi.name in self.input_names]

    def get_outputs(self) -> list[IOInfo]:
        return [self._io(vi) for vi in self.model.graph.output]

    @staticmethod
    def _io(vi) -> IOInfo:
        from onnx import helper
        tt = vi.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim] \
            if tt.HasField("shape") else None
        npdt = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        name = _ORT_TYPES.get(str(npdt), str(npdt))
        return IOInfo(vi.name, shape, f"tensor({name})", npdt)

    # -- calling
    def __call__(self, *args):
        return self.specialize(self._shapes(args))(*args)

    def emulate(self, *args):
        """The plan for these inputs' sizes run on the CPU whatever the target, as
        ``CompiledModel.emulate`` (an h100 plan checked on a machine without one)."""
        return self.specialize(self._shapes(args)).emulate(*args)

    def _shapes(self, args) -> dict[str, tuple]:
        if len(args) != len(self.input_names):
            raise InputError(f"the model takes {len(self.input_names)} tensor input(s) "
                             f"({', '.join(self.input_names)}), got {len(args)}")
        return {n: tuple(t.shape) for n, t in zip(self.input_names, args) if isinstance(t, torch.Tensor)}

    def run(self, feeds, output_names=None, *, emulate: bool = False):
        """ONNX-Runtime-style, as ``CompiledModel.run`` (``run(None, feeds)`` too)."""
        if isinstance(output_names, Mapping) and (feeds is None or not isinstance(feeds, Mapping)):
            feeds, output_names = output_names, feeds
        if not isinstance(feeds, Mapping):
            raise InputError(f"feeds must be a dict from input name to array ({', '.join(self.input_names)}), "
                             f"got {type(feeds).__name__}")
        shapes = {n: tuple(np.shape(v)) if not isinstance(v, torch.Tensor) else tuple(v.shape)
                  for n, v in feeds.items() if n in self.input_names}
        return self.specialize(shapes).run(feeds, output_names, emulate=emulate)

    def specialize(self, shapes: Mapping[str, Sequence[int]]):
        """The plan for these input shapes ({input: shape}), compiled on first use."""
        dims, input_shapes = self.bind(shapes)
        key = (tuple(sorted(dims.items())), tuple(sorted(input_shapes.items())))
        with self._lock:
            got = self._plans.get(key)
            if got is not None:
                self._plans.move_to_end(key)
                self.last = got
                return got
            cause = self._cause(key)
            got = self._compile_for(dims={**self.dims, **dims}, input_shapes={**self.pinned, **input_shapes})
            got.report.specialization = {"plan": len(self._plans) + 1, "limit": self.max_plans, "cause": cause,
                                         "dims": dict(dims), "input_shapes": {k: list(v) for k, v in input_shapes.items()}}
            _log.info("ONNX model: plan %d (of at most %d kept) for %s", len(self._plans) + 1, self.max_plans, cause)
            self._plans[key] = got
            if len(self._plans) > self.max_plans:
                old, _ = self._plans.popitem(last=False)
                _log.info("ONNX model: the plan for %s dropped (least recently used)", _describe(old))
            self.last = got
            return got

    def bind(self, shapes: Mapping[str, Sequence[int]]) -> tuple[dict[str, int], dict[str, tuple]]:
        """(named dims, whole shapes of inputs with unnamed free dims) for these input shapes;
        ``InputError`` when an input has the wrong rank or a fixed dim, or a named dim two sizes."""
        dims: dict[str, int] = {}
        where: dict[str, str] = {}
        input_shapes: dict[str, tuple] = {}
        for name, declared in self.open.items():
            if name not in shapes:
                raise InputError(f"input '{name}' is missing; the inputs are {self.input_names}")
            shape = tuple(int(d) for d in shapes[name])
            if declared is None:                    # no declared rank: the whole shape
                input_shapes[name] = shape
                continue
            if len(shape) != len(declared):
                raise InputError(f"input '{name}' has shape {list(shape)}; the model declares "
                                 f"{[d if d is not None else '?' for d in declared]}")
            for k, (d, n) in enumerate(zip(declared, shape)):
                if isinstance(d, int) and d != n:
                    raise InputError(f"input '{name}' has size {n} in dim {k}, which the model fixes at {d}")
                if isinstance(d, str):
                    if d in dims and dims[d] != n:
                        raise InputError(f"dim {d!r} is {dims[d]} in input '{where[d]}' but {n} in input '{name}' "
                                         f"(a named dim has one size across the inputs)")
                    dims[d], where[d] = n, name
            if any(d is None for d in declared):
                input_shapes[name] = shape
        return dims, input_shapes

    def _cause(self, key: tuple) -> str:
        if not self._plans:
            return "the first call: " + _describe(key)
        best = min(self._plans, key=lambda old: len(_changes(old, key)))
        return "; ".join(_changes(best, key)) or _describe(key)


def _describe(key: tuple) -> str:
    dims, shapes = key
    parts = [f"{d}={n}" for d, n in dims] + [f"'{i}' {list(s)}" for i, s in shapes]
    return ", ".join(parts) or "static inputs"


def _changes(old: tuple, new: tuple) -> list[str]:
    a, b = dict(old[0]), dict(new[0])
    out = [f"dim {d!r}: {a.get(d)} -> {n}" for d, n in b.items() if a.get(d) != n]
    sa, sb = dict(old[1]), dict(new[1])
    out += [f"input '{i}': {list(sa[i]) if i in sa else None} -> {list(s)}" for i, s in sb.items() if sa.get(i) != s]
    return out
