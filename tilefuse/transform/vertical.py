"""The vertical transformation (Souffle §6.2): pure layout prims are composed into their
consumers' index maps, so no reshape, transpose, permute, slice, expand, concat, pad or gather
survives as a copy between kernels.  Boolean masks of index comparisons and boolean loads
(``_mask``: a causal band and a padding mask) are composed the same way: recomputing one costs
no more than loading it.

A prim is a pure layout when its value is a load, or a select among loads and constants on index
conditions (concat, pad): no arithmetic, no type change.  Each consumer's load of it becomes its
body at the consumer's index (consumer-first composition: the producer's map applied to the
consumer's index, the order the notes correct in Souffle's Eq. 2), its loads renumbered into the
consumer's inputs.  Composition stops where it would change what a consumer is: opaque prims
read tensors, and a contraction must stay a sum of a product of plain loads (a select of loads
would not be; a gather would make its operand a gathered copy), so those keep reading the
layout prim, which then stays.  A layout prim nothing reads
any more, and that is no graph output, is dropped.  The composed index expressions are
simplified afterwards (``transform/simplify.py``).
"""
from __future__ import annotations

from ..analysis.classify import Category, classify
from ..ir.dtypes import DType
from ..ir.expr import INDEX, Binary, Const, Expr, Load, Select, Unary, substitute, transform, walk
from ..ir.prim import Prim, PrimGraph

MAX_NODES = 2000        # a consumer's body may not grow beyond this by composition


def vertical(pg: PrimGraph) -> PrimGraph:
    """``pg`` with its pure layout prims composed into their consumers (the same object when
    nothing changes)."""
    layouts: dict[str, Prim] = {}           # name -> the layout prim, itself composed
    prims: list[Prim] = []
    changed = False
    for p in pg.prims:
        q = _compose(p, layouts)
        changed |= q is not p
        if _pure(q) or _mask(q):
            layouts[q.name] = q
        prims.append(q)
    read = {n for p in prims for n in p.inputs} | set(pg.outputs)
    kept = tuple(p for p in prims if p.name not in layouts or p.name in read)
    if not changed and len(kept) == len(prims):
        return pg
    return PrimGraph(pg.inputs, pg.constants, kept, pg.outputs)


def _pure(p: Prim) -> bool:
    """A load, or a select among loads and constants, of the output's type."""
    if p.is_opaque or p.reduce is not None:
        return False
    stack = [p.body]
    while stack:
        e = stack.pop()
        if isinstance(e, Select):
            stack += [e.a, e.b]          # the condition is index arithmetic
        elif not (isinstance(e, Load) or isinstance(e, Const)) or e.dtype is not p.out.dtype:
            return False
    return isinstance(p.body, (Load, Select))


_LOGIC = ("and", "or")
_COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")


def _mask(p: Prim) -> bool:
    """A boolean mask as cheap to recompute as to load: index comparisons (a causal or window
    band, ``transform/masks.py``) combined by and/or/not with boolean loads (a padding mask): its
    readers compute it, so no ``[S, S]`` mask is materialized and a chain sees the band."""
    if p.is_opaque or p.reduce is not None or p.out.dtype is not DType.bool:
        return False
    stack = [p.body]
    while stack:
        e = stack.pop()
        if isinstance(e, Load):
            if e.dtype is not DType.bool or any(isinstance(n, Load) for i in e.index for n in walk(i)):
                return False
        elif isinstance(e, Binary) and e.op in _LOGIC:
            stack += [e.a, e.b]
        elif isinstance(e, Unary) and e.op == "not":
            stack.append(e.x)
        elif isinstance(e, Binary) and e.op in _COMPARE:
            if e.a.dtype is not INDEX or any(isinstance(n, Load) for n in (*walk(e.a), *walk(e.b))):
                return False
        elif not (isinstance(e, Const) and e.dtype is DType.bool):
            return False
    return True


def _compose(c: Prim, layouts: dict[str, Prim]) -> Prim:
    """``c`` reading through the layouts it loads instead of from them, where allowed."""
    if c.is_opaque or not any(n in layouts for n in c.inputs):
        return c
    contraction = classify(c) is Category.contraction
    inputs = list(c.inputs)
    slots = {n: k for k, n in enumerate(inputs)}

    def slot(name: str) -> int:
        if name not in slots:
            slots[name] = len(inputs)
            inputs.append(name)
        return slots[name]

    def inline(e: Expr) -> Expr | None:
        if not isinstance(e, Load):
            return None
        lay = layouts.get(c.inputs[e.tensor]) if e.tensor < len(c.inputs) else None
        if lay is None or (contraction and not _plain(lay.body)):
            return None
        own = transform(lay.body, lambda n: Load(slot(lay.inputs[n.tensor]), n.index, n.dtype)
                        if isinstance(n, Load) else None)
        return substitute(own, dict(zip(lay.axes, e.index)))

    body = transform(c.body, inline)
    if body is c.body or sum(1 for _ in walk(body)) > MAX_NODES:
        return c
    q = _compact(Prim(c.name, tuple(inputs), c.axes, body, c.out, c.reduce, c.origin))
    if contraction and classify(q) is not Category.contraction:
        return c
    return q


def _plain(e: Expr) -> bool:
    """A load through an index that loads nothing (no gather): what a contraction's operand may
    read through and stay a GEMM operand (strided for the library, an affine panel for gemm)."""
    return isinstance(e, Load) and not any(isinstance(n, Load) for i in e.index for n in walk(i))


def _compact(p: Prim) -> Prim:
    """``p`` without the inputs it no longer loads (slots renumbered)."""
    used = sorted({n.tensor for n in walk(p.body) if isinstance(n, Load)})
    if len(used) == len(p.inputs):
        return p
    new = {old: k for k, old in enumerate(used)}
    body = transform(p.body, lambda n: Load(new[n.tensor], n.index, n.dtype) if isinstance(n, Load) else None)
    return Prim(p.name, tuple(p.inputs[k] for k in used), p.axes, body, p.out, p.reduce, p.origin)

