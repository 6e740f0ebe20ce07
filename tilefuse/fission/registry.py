"""Fission: operator Graph -> PrimGraph.

Each operator family module registers rules with ``@rule("OpType", ...)``.  A rule receives the
``Fission`` builder, the ``Node`` and one ``TensorRef`` per node input (None for an omitted
optional input) and returns the output refs (one per node output; None for an unrequested
optional output).  Rules describe prims TVM-style::

    y = fx.compute(x.shape, lambda i: maximum(x[i], 0.0))
    s = fx.reduce(out_shape, (n,), "sum", lambda i, r: x[i + r])
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..errors import FissionError, UnsupportedOperator
from ..ir.dtypes import DType, TensorType
from ..ir.expr import Expr, Load, Var, as_index
from ..ir.graph import Graph, Node
from ..ir.prim import Constant, Opaque, Origin, Prim, PrimGraph, Reduction, TensorDecl

Rule = Callable[["Fission", Node, list], object]


@dataclass(frozen=True)
class RuleInfo:
    op: str
    fn: Rule
    family: str        # the fission module, e.g. "elementwise"
    doc: str


RULES: dict[str, RuleInfo] = {}


def rule(*ops: str):
    """Register a fission rule for one or more canonical operator types."""
    def deco(fn: Rule) -> Rule:
        family = fn.__module__.rsplit(".", 1)[-1]
        doc = (fn.__doc__ or "").strip().split("\n")[0]
        for op in ops:
            if op in RULES:
                raise RuntimeError(f"two fission rules for {op}")
            RULES[op] = RuleInfo(op, fn, family, doc)
        return fn
    return deco


class TensorRef:
    """A tensor available during fission; indexing it inside ``compute`` makes a Load."""
    __slots__ = ("name", "type", "_fx")

    def __init__(self, name: str, type: TensorType, fx: "Fission"):
        self.name, self.type, self._fx = name, type, fx

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def rank(self) -> int:
        return self.type.rank

    def __getitem__(self, idx) -> Expr:
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) != self.rank:
            raise IndexError(f"{self.name}: {len(idx)} indices for rank {self.rank}")
        return Load(self._fx._slot(self), tuple(as_index(i) for i in idx), self.dtype)

    def __repr__(self):
        return f"TensorRef({self.name}: {self.type})"


class Fission:
    """Builder of one PrimGraph.  ``node`` is the operator being split (for origins and errors)."""

    def __init__(self, taken: set[str], types=None):
        self.types = types or {}        # value name -> TensorType of the operator graph
        self.prims: list[Prim] = []
        self.constants: list[Constant] = []
        self.node: Node | None = None
        self.origin = Origin("?", "?")
        self._taken = set(taken)
        self._count = 0
        self._slots: dict[str, int] | None = None

    # -- naming
    def _fresh(self, stem: str = "t") -> str:
        while True:
            self._count += 1
            name = f"{stem}{self._count}"
            if name not in self._taken:
                self._taken.add(name)
                return name

    def _slot(self, ref: TensorRef) -> int:
        if self._slots is None:
            raise RuntimeError("tensors can only be indexed inside fx.compute/fx.reduce")
        return self._slots.setdefault(ref.name, len(self._slots))

    def _emit(self, shape, body_fn, raxes_extents=None, combiner=None) -> TensorRef:
        if self._slots is not None:
            raise RuntimeError("fx.compute cannot be nested")
        shape = tuple(int(s) for s in shape)
        axes = tuple(Var(f"i{k}") for k in range(len(shape)))
        self._slots = {}
        try:
            if raxes_extents is None:
                body = body_fn(axes)
                red = None
            else:
                rext = tuple(int(e) for e in raxes_extents)
                raxes = tuple(Var(f"r{k}") for k in range(len(rext)))
                body = body_fn(axes, raxes)
                red = Reduction(raxes, rext, combiner)
            inputs = tuple(self._slots)
        finally:
            self._slots = None
        if not isinstance(body, Expr):
            raise TypeError(f"{self.node}: a prim body must be an expression, got {body!r}")
        prim = Prim(self._fresh(), inputs, axes, body, TensorType(shape, body.dtype), red, self.origin)
        self.prims.append(prim)
        return TensorRef(prim.name, prim.out, self)

    # -- the prim constructors rules use
    def compute(self, shape: Sequence[int], fn: Callable[[tuple], Expr]) -> TensorRef:
        """A prim without reduction: ``out[i] = fn(i)``."""
        return self._emit(shape, fn)

    def reduce(self, shape: Sequence[int], extents: Sequence[int], combiner: str,
               fn: Callable[[tuple, tuple], Expr]) -> TensorRef:
        """``out[i] = combine over r in extents of fn(i, r)``; combiner in sum/max/min/prod."""
        return self._emit(shape, fn, tuple(extents), combiner)

    def opaque(self, fn: str, inputs: Sequence[TensorRef], out: TensorType, **attrs) -> TensorRef:
        """A prim run by the torch function registered as ``fn`` in ``ir/opaque.py``."""
        from ..ir.opaque import OPAQUE
        if fn not in OPAQUE:
            raise KeyError(f"no opaque function {fn!r}")
        axes = tuple(Var(f"i{k}") for k in range(out.rank))
        body = Opaque(fn, tuple(sorted((k, _freeze(v)) for k, v in attrs.items())))
        prim = Prim(self._fresh(), tuple(r.name for r in inputs), axes, body, out, None, self.origin)
        self.prims.append(prim)
        return TensorRef(prim.name, prim.out, self)

    def constant(self, data: torch.Tensor, stem: str = "c") -> TensorRef:
        c = Constant(self._fresh(stem), data.detach().clone().contiguous())
        self.constants.append(c)
        return TensorRef(c.name, c.type, self)

    def out_type(self, k: int = 0) -> TensorType:
        """Declared type of output ``k`` of the node being split (static shapes decide e.g. Reshape)."""
        return self.types[self.node.outputs[k]]

    def ref(self, name: str, type: TensorType) -> TensorRef:
        return TensorRef(name, type, self)


def _freeze(v):
    return tuple(_freeze(x) for x in v) if isinstance(v, list) else v


def fission(graph: Graph, *, collect_errors: bool = False):
    """Split every operator into prims.

    Returns the PrimGraph, or with ``collect_errors`` a pair (PrimGraph or None, list of errors)
    so that every unsupported node can be reported at once.
    """
    from . import load_rules
    load_rules()
    taken = {d.name for d in graph.inputs} | {c.name for c in graph.constants} | set(graph.types)
    fx = Fission(taken, graph.types)
    env: dict[str, TensorRef] = {d.name: fx.ref(d.name, d.type) for d in graph.inputs}
    env.update((c.name, fx.ref(c.name, c.type)) for c in graph.constants)
    errors: list[Exception] = []
    for node in graph.nodes:
        fx.node = node
        fx.origin = Origin(node.op, node.name, node.location)
        info = RULES.get(node.op)
        ins = [env[n] if n else None for n in node.inputs]
        try:
            if info is None:
                raise UnsupportedOperator(node, "no fission rule for this operator type")
            outs = info.fn(fx, node, ins)
            if isinstance(outs, TensorRef) or outs is None:
                outs = [outs]
            outs = list(outs)
            if len(outs) < len(node.outputs):
                outs += [None] * (len(node.outputs) - len(outs))
            for name, ref in zip(node.outputs, outs):
                if not name:
                    continue
                if ref is None:
                    raise FissionError(node, f"output {name!r} was not produced")
                want = graph.types[name]
                if ref.type != want:
                    raise FissionError(node, f"output {name!r} is {ref.type}, the graph says {want}")
                env[name] = ref
        except Exception as e:
            if not collect_errors:
                raise
            errors.append(e)
            for name in node.outputs:
                if name and name not in env:  # stand-in so later nodes can still be checked
                    env[name] = fx.ref(name, graph.types[name])
    if errors:
        return None, errors
    inputs = tuple(TensorDecl(d.name, d.type) for d in graph.inputs)
    pg = PrimGraph(inputs, tuple(graph.constants) + tuple(fx.constants), tuple(fx.prims),
                   tuple(env[o].name for o in graph.outputs))
    return (pg, []) if collect_errors else pg
