"""An ONNX model with dynamic dimensions, served at every size with one plan per bucket of sizes.

``compile_onnx(path)`` of a model whose inputs have free dims (``batch``, ``sequence``, or unnamed
ones) returns a ``DynamicModel``: each call reads the sizes off its inputs and binds every named
dim once for all inputs (as onnxruntime does).  Each free dim (a named one, or an unnamed dim of
one input: ``"x[0]"``) is a size symbol; its size falls in a power-of-two bucket
(``orchestrate/buckets.py``).  A bucket is planned once, at its largest sizes but one, with its
bound checked at its smallest, and every size in it is served by that plan carried to the size
(``orchestrate/instantiate.py``: no planning, kernels generated for the size; a size the plan
does not carry to is planned on its own).  The plans of the last ``max_plans`` buckets are kept,
and the compiled models of the last ``SERVED`` sizes (least recently used dropped); each new
plan is logged on the ``recompile`` channel with what made it new and the sizes it serves.
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
SERVED = 16          # sizes whose compiled models are kept
_log = logger("recompile")


class DynamicModel:
    """Plans of one ONNX model, one per set of input sizes; called like a ``CompiledModel``."""

    def __init__(self, model, open_inputs: Mapping[str, tuple | None], compile_for: Callable[..., Any], *,
                 pinned: Mapping[str, Sequence[int]] | None = None, dims: Mapping[str, int] | None = None,
                 max_plans: int = DEFAULT_MAX_PLANS, initializers_as_inputs: bool = False,
                 check_buckets: bool = True):
        self.model = model
        self.open = dict(open_inputs)          # input -> declared dims (size, dim name or None)
        self._compile_for = compile_for        # (dims, input_shapes, template=None, sizes=None) -> CompiledModel
        self.check_buckets = check_buckets
        self.pinned, self.dims = dict(pinned or {}), dict(dims or {})
        self.max_plans = max_plans
        inits = set() if initializers_as_inputs else \
            {t.name for t in model.graph.initializer} | {sp.values.name for sp in model.graph.sparse_initializer}
        self.input_names = [vi.name for vi in model.graph.input if vi.name not in inits
                            and vi.type.WhichOneof("value") == "tensor_type"]
        self.output_names = [vi.name for vi in model.graph.output]
        self._buckets: OrderedDict[tuple, tuple] = OrderedDict()   # ranges -> (Bucket, its plan's model)
        self._served: OrderedDict[tuple, tuple] = OrderedDict()   # sizes -> (CompiledModel, bucket key)
        self.planned = 0                       # buckets planned so far (dropped ones included)
        self._lock = threading.Lock()
        self.last = None                       # the compiled model the last call ran

    # -- what a caller sees
    @property
    def plans(self) -> list:
        """The plans kept, one per bucket of sizes (each a CompiledModel at the sizes it was
        planned at: ``report.specialization["bucket"]`` says which sizes it serves), least
        recently used first."""
        return [top for _, top in self._buckets.values()]

    @property
    def served(self) -> list:
        """The compiled models of the sizes served last (each a bucket's plan carried to its
        sizes, or the plan itself), least recently used first."""
        return [model for model, _ in self._served.values()]

    @property
    def report(self):
        """The report of the compiled model the last call ran (None before the first call)."""
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
        """The compiled model for these input shapes ({input: shape}): its bucket's plan (planned
        on first use) carried to them."""
        dims, input_shapes = self.bind(shapes)
        key = (tuple(sorted(dims.items())), tuple(sorted(input_shapes.items())))
        with self._lock:
            got = self._served.get(key)
            if got is None:
                got = self._served[key] = self._serve(key, dims, input_shapes)
                if len(self._served) > SERVED:
                    self._served.popitem(last=False)
            model, bkey = got
            self._served.move_to_end(key)
            if bkey in self._buckets:
                self._buckets.move_to_end(bkey)      # a bucket used is a bucket kept
            self.last = model
            return model

    def _serve(self, key: tuple, dims: dict[str, int], input_shapes: dict[str, tuple]):
        from ..orchestrate.buckets import bucket, clipped, describe_ranges, plan_bucket
        from ..orchestrate.instantiate import PlanMismatch
        sizes = {**dims, **{f"{i}[{k}]": n for i, shape in input_shapes.items()
                            for k, n in enumerate(shape) if self._free(i, k)}}
        sizes = dict(sorted(sizes.items()))
        made: dict[tuple, Any] = {}

        def compile_at(where, template):
            d, shapes = self._at(where, dims, input_shapes)
            model = made[tuple(sorted(where.items())), template is not None] = self._compile_for(
                dims={**self.dims, **d}, input_shapes={**self.pinned, **shapes}, template=template,
                sizes=dict(where))
            return model
        bkey = next((k for k, (b, _) in self._buckets.items() if b.holds(sizes)), None)
        if bkey is None:
            ranges = clipped({s: bucket(n) for s, n in sizes.items()}, sizes,
                             [b.ranges for b, _ in self._buckets.values() if b.narrowed])
            self.planned += 1
            cause = self._cause(key)
            b, top = plan_bucket(ranges, compile_at, check=self.check_buckets)
            bkey = tuple(b.ranges.items())
            self._buckets[bkey] = (b, top)
            if len(self._buckets) > self.max_plans:
                old, _ = self._buckets.popitem(last=False)
                _log.info("ONNX model: the plan for %s dropped (least recently used)", describe_ranges(dict(old)))
            for (where, carried), model in made.items():
                model.report.specialization = self._record(dict(where), dims, input_shapes, cause, b, carried,
                                                           self.planned)
            _log.info("ONNX model: plan %d (of at most %d buckets kept) for %s; serves %s, planned at %s%s",
                      self.planned, self.max_plans, cause, describe_ranges(b.ranges), b.template.sizes, b.describe())
            if not b.holds(sizes):           # narrowed past these sizes: they need a bucket of their own
                return self._serve(key, dims, input_shapes)
        b, top = self._buckets[bkey]
        if sizes == b.template.sizes:
            return top, bkey
        e = None
        try:
            got = compile_at(sizes, b.template)
        except PlanMismatch as mismatch:
            e = mismatch
            self.planned += 1
            _log.info("ONNX model: the plan for %s does not carry to %s (%s): planned on its own (plan %d)",
                      describe_ranges(b.ranges), _describe(key), e, self.planned)
            got = compile_at(sizes, None)
        plan = top.report.specialization["plan"]
        got.report.specialization = self._record(sizes, dims, input_shapes, f"sizes {_describe(key)} in the "
                                                 f"bucket of plan {plan}", b, e is None, plan)
        got.report.specialization["generic_kernels"] = sum(k.size_arg is not None for k in got.kernels)
        return got, bkey

    def _record(self, where, dims, input_shapes, cause: str, b, carried: bool, plan: int) -> dict:
        """A served model's ``report.specialization``: its sizes and its bucket."""
        d, shapes = self._at(where, dims, input_shapes)
        return {"plan": plan, "limit": self.max_plans, "cause": cause, "carried": carried,
                "dims": d, "input_shapes": {k: list(v) for k, v in shapes.items()}, "bucket": b.record()}

    def _free(self, name: str, k: int) -> bool:
        """Whether dim ``k`` of input ``name`` is an unnamed free dim (a size symbol of its own)."""
        declared = self.open.get(name)
        return declared is None or declared[k] is None

    def _at(self, where: Mapping[str, int], dims: dict[str, int], input_shapes: dict[str, tuple]):
        """(dims, input shapes) with the size symbols at ``where``."""
        d = {n: where.get(n, v) for n, v in dims.items()}
        shapes = {i: tuple(where.get(f"{i}[{k}]", n) for k, n in enumerate(shape)) for i, shape in input_shapes.items()}
        return d, shapes

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
        if not self._served:
            return "the first call: " + _describe(key)
        best = min(self._served, key=lambda old: len(_changes(old, key)))
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
