"""Prim (one tensor expression with one output) and PrimGraph (a DAG of prims)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping

import torch

from .dtypes import DType, TensorType
from .expr import Expr, Var, free_vars, loads

COMBINERS = ("sum", "max", "min", "prod")


def reduce_init(combiner: str, dtype: DType):
    """Identity element of a combiner for a dtype."""
    if combiner == "sum":
        return False if dtype is DType.bool else 0
    if combiner == "prod":
        return True if dtype is DType.bool else 1
    if dtype is DType.bool:
        return combiner == "min"
    if dtype.is_float:
        return -math.inf if combiner == "max" else math.inf
    info = torch.iinfo(dtype.to_torch())
    return info.min if combiner == "max" else info.max


@dataclass(frozen=True, slots=True)
class Origin:
    """The source operator a prim came from."""
    op: str
    name: str
    location: str | None = None

    def __str__(self) -> str:
        s = f"{self.op} '{self.name}'"
        return f"{s} at {self.location}" if self.location else s


@dataclass(frozen=True, slots=True)
class Reduction:
    axes: tuple[Var, ...]
    extents: tuple[int, ...]
    combiner: str

    def __post_init__(self):
        if self.combiner not in COMBINERS:
            raise ValueError(f"unknown combiner {self.combiner!r}")
        if len(self.axes) != len(self.extents) or not self.axes:
            raise ValueError("a reduction needs one extent per axis and at least one axis")


@dataclass(frozen=True, slots=True)
class Opaque:
    """A computation not expressible as a tensor expression, run by a registered torch function."""
    fn: str
    attrs: tuple[tuple[str, Any], ...] = ()

    def __str__(self) -> str:
        a = ", ".join(f"{k}={v!r}" for k, v in self.attrs)
        return f"{self.fn}({a})"


@dataclass(frozen=True)
class Prim:
    """``out[axes] = combine_{reduce.axes} body`` (or an opaque call), one output tensor ``name``."""
    name: str
    inputs: tuple[str, ...]
    axes: tuple[Var, ...]
    body: Expr | Opaque
    out: TensorType
    reduce: Reduction | None = None
    origin: Origin = Origin("?", "?")

    def __post_init__(self):
        if len(self.axes) != self.out.rank:
            raise ValueError(f"prim {self.name}: {len(self.axes)} axes for a rank-{self.out.rank} output")
        if len(set(self.axes)) != len(self.axes):
            raise ValueError(f"prim {self.name}: repeated axis variable")
        if isinstance(self.body, Opaque):
            if self.reduce is not None:
                raise ValueError(f"prim {self.name}: opaque prims cannot reduce")
            return
        if self.body.dtype is not self.out.dtype:
            raise TypeError(f"prim {self.name}: body is {self.body.dtype.value}, output {self.out.dtype.value}")
        bound = set(self.axes) | set(self.reduce.axes if self.reduce else ())
        unbound = free_vars(self.body) - bound
        if unbound:
            raise ValueError(f"prim {self.name}: unbound variables {sorted(v.name for v in unbound)}")
        for ld in loads(self.body):
            if not 0 <= ld.tensor < len(self.inputs):
                raise ValueError(f"prim {self.name}: load of slot {ld.tensor} with {len(self.inputs)} inputs")

    @property
    def is_opaque(self) -> bool:
        return isinstance(self.body, Opaque)

    @cached_property
    def extents(self) -> dict[Var, int]:
        ext = dict(zip(self.axes, self.out.shape))
        if self.reduce:
            ext.update(zip(self.reduce.axes, self.reduce.extents))
        return ext

    @cached_property
    def signature(self) -> tuple:
        """Name-free structural identity (equal for repeated layers)."""
        return (self.axes, self.body, self.out, self.reduce, len(self.inputs))


# Compile time copies a constant (a transposed, reshaped or concatenated weight) only up to this
# many elements; a larger one is read in place through an index map, so compiling never doubles
# the memory of a model's weights (frontend/aten/emitter.py, transform/fold.py, horizontal.py).
COPY_LIMIT = 1 << 16


@dataclass(frozen=True, eq=False)
class Constant:
    """A named constant tensor (weights, folded values).  Compared by identity."""
    name: str
    data: torch.Tensor

    @cached_property
    def type(self) -> TensorType:
        return TensorType(tuple(self.data.shape), DType.from_torch(self.data.dtype))


@dataclass(frozen=True, slots=True)
class TensorDecl:
    name: str
    type: TensorType


@dataclass(frozen=True, eq=False)
class PrimGraph:
    inputs: tuple[TensorDecl, ...]
    constants: tuple[Constant, ...]
    prims: tuple[Prim, ...]            # topologically ordered
    outputs: tuple[str, ...]

    def __post_init__(self):
        self.validate()

    @cached_property
    def types(self) -> Mapping[str, TensorType]:
        t: dict[str, TensorType] = {d.name: d.type for d in self.inputs}
        t.update((c.name, c.type) for c in self.constants)
        t.update((p.name, p.out) for p in self.prims)
        return t

    @cached_property
    def producers(self) -> Mapping[str, Prim]:
        return {p.name: p for p in self.prims}

    @cached_property
    def consumers(self) -> Mapping[str, tuple[Prim, ...]]:
        c: dict[str, list[Prim]] = {}
        for p in self.prims:
            for name in dict.fromkeys(p.inputs):
                c.setdefault(name, []).append(p)
        return {k: tuple(v) for k, v in c.items()}

    @cached_property
    def constant_map(self) -> Mapping[str, Constant]:
        return {c.name: c for c in self.constants}

    def validate(self) -> None:
        known: dict[str, TensorType] = {}
        for d in self.inputs:
            known[d.name] = d.type
        for c in self.constants:
            if c.name in known:
                raise ValueError(f"duplicate tensor name {c.name!r}")
            known[c.name] = c.type
        for p in self.prims:
            for n in p.inputs:
                if n not in known:
                    raise ValueError(f"prim {p.name} ({p.origin}) reads {n!r} before it is produced")
            if not p.is_opaque:
                for ld in loads(p.body):
                    t = known[p.inputs[ld.tensor]]
                    if len(ld.index) != t.rank or ld.dtype is not t.dtype:
                        raise ValueError(f"prim {p.name} ({p.origin}): load of {p.inputs[ld.tensor]} as "
                                         f"{ld.dtype.value} with {len(ld.index)} indices, tensor is {t}")
            if p.name in known:
                raise ValueError(f"duplicate tensor name {p.name!r}")
            known[p.name] = p.out
        for o in self.outputs:
            if o not in known:
                raise ValueError(f"graph output {o!r} is never produced")

    def __str__(self) -> str:
        from .printer import format_primgraph
        return format_primgraph(self)
