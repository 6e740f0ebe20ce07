"""The operator-level graph both frontends produce: nodes in a canonical op set, static types."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Iterator, Mapping

from .dtypes import TensorType
from .prim import Constant, TensorDecl


class Attrs(Mapping[str, Any]):
    """An immutable, hashable attribute mapping (values: int, float, str, bool, tuples of them)."""
    __slots__ = ("_items", "_d")

    def __init__(self, items: Mapping[str, Any] | None = None, **kw):
        d = dict(items or {}, **kw)
        d = {k: _freeze(v) for k, v in d.items()}
        self._items = tuple(sorted(d.items()))
        self._d = d

    def __getitem__(self, k):
        return self._d[k]

    def __iter__(self) -> Iterator[str]:
        return iter(k for k, _ in self._items)

    def __len__(self):
        return len(self._items)

    def __hash__(self):
        return hash(self._items)

    def __eq__(self, other):
        return isinstance(other, Attrs) and self._items == other._items

    def __repr__(self):
        return "{" + ", ".join(f"{k}={v!r}" for k, v in self._items) + "}"


def _freeze(v):
    if isinstance(v, list):
        return tuple(_freeze(x) for x in v)
    return v


@dataclass(frozen=True)
class Node:
    """One operator.  ``inputs`` may contain "" for an omitted optional input."""
    op: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Attrs = Attrs()
    location: str | None = None

    def __str__(self) -> str:
        s = f"{self.op} '{self.name}'"
        return f"{s} at {self.location}" if self.location else s


@dataclass(frozen=True, eq=False)
class Graph:
    inputs: tuple[TensorDecl, ...]
    outputs: tuple[str, ...]
    nodes: tuple[Node, ...]            # topologically ordered
    constants: tuple[Constant, ...]
    types: Mapping[str, TensorType]    # every value: inputs, constants and node outputs
    name: str = "model"

    def __post_init__(self):
        known = {d.name for d in self.inputs} | {c.name for c in self.constants}
        for n in self.nodes:
            for i in n.inputs:
                if i and i not in known:
                    raise ValueError(f"{n}: input {i!r} is not produced before it")
            for o in n.outputs:
                if o and o not in self.types:
                    raise ValueError(f"{n}: output {o!r} has no type")
                known.add(o)
        for o in self.outputs:
            if o not in known:
                raise ValueError(f"graph output {o!r} is not produced")

    @cached_property
    def constant_map(self) -> Mapping[str, Constant]:
        return {c.name: c for c in self.constants}

    def __str__(self) -> str:
        from .printer import format_graph
        return format_graph(self)
