"""Constant folding of prims: every prim that reads only constants is evaluated at compile time.

Inference graphs compute a lot from weights alone: BatchNorm's ``gamma / sqrt(var + eps)`` and
``beta - mean · scale``, transposed or reshaped weights, scaled biases.  Left in the graph, each is
a kernel on every call, and worse, it sits between a convolution and its BatchNorm epilogue as a
prim that does not read the convolution, which no GEMM epilogue can hold.  Folded, the BatchNorm
becomes a per-channel multiply-add by constants in the convolution's epilogue.

A prim is folded when every input is a constant (or folded), it is neither opaque nor a graph
output, and its value is no larger than its largest input (folding must not turn a broadcast into
a materialized tensor).  A pure layout prim larger than ``COPY_LIMIT`` (a weight's transpose or
reshape) is not: it only moves elements, which the vertical transformation composes into the index
maps of what reads it, and a folded copy would double the memory of every weight read that way.
Values come from the reference executor (``ir/evaluate.py``), so folding is exact in every dtype.
One-element constants are inlined as literals into the prims that read them.  Constants no prim
reads any more are dropped.
"""
from __future__ import annotations

from ..analysis.classify import Category, classify
from ..ir.evaluate import eval_prim
from ..ir.expr import Const, Expr, Load, transform, walk
from ..ir.prim import COPY_LIMIT, Constant, Prim, PrimGraph



def fold_constants(pg: PrimGraph) -> PrimGraph:
    values = {c.name: c.data for c in pg.constants}
    outputs = set(pg.outputs)
    folded: list[Constant] = []
    kept = []
    for p in pg.prims:
        ins = p.inputs
        if (ins and not p.is_opaque and p.name not in outputs and all(n in values for n in ins)
                and p.out.numel <= max(values[n].numel() for n in ins)
                and (p.out.numel <= COPY_LIMIT or classify(p) is not Category.layout)):
            values[p.name] = eval_prim(p, [values[n] for n in ins])
            folded.append(Constant(p.name, values[p.name]))
        else:
            kept.append(p)
    scalars = {c.name: c.data for c in pg.constants + tuple(folded) if c.data.numel() == 1}
    inlined = [_inline_scalars(p, scalars) for p in kept]
    if not folded and all(q is p for q, p in zip(inlined, kept)):
        return pg
    used = {n for p in inlined for n in p.inputs} | outputs
    constants = tuple(c for c in pg.constants + tuple(folded) if c.name in used)
    return PrimGraph(pg.inputs, constants, tuple(inlined), pg.outputs)


def _inline_scalars(p: Prim, scalars: dict) -> Prim:
    """``p`` with its loads of one-element constants (a scale, a fill value) as literals, so
    kernels load nothing for them and the chain family sees a masked score's ``-inf``."""
    if p.is_opaque or not any(n in scalars for n in p.inputs):
        return p

    def lit(e: Expr) -> Expr | None:
        if isinstance(e, Load) and p.inputs[e.tensor] in scalars:
            return Const(scalars[p.inputs[e.tensor]].item(), e.dtype)
        return None
    body = transform(p.body, lit)
    used = sorted({n.tensor for n in walk(body) if isinstance(n, Load)})
    new = {old: k for k, old in enumerate(used)}
    body = transform(body, lambda n: Load(new[n.tensor], n.index, n.dtype) if isinstance(n, Load) else None)
    return Prim(p.name, tuple(p.inputs[k] for k in used), p.axes, body, p.out, p.reduce, p.origin)
