"""The horizontal transformation (Souffle §6.1): contractions that read one activation the same
way become one contraction (attention's Q, K and V projections; LLaMA's gate and up
projections; several heads of a block).

Siblings are contraction prims with the same body (interned: the same expression in their own
slots), the same activation input, the same output type but for the extent of their one N axis,
and a weight of one type whose N dim is the only one that differs.  The merged prim takes the
first sibling's place in the topological order.  Small constant weights (up to ``COPY_LIMIT``
elements) are concatenated at compile time (a new constant; weights no other prim reads are
dropped).  Larger ones, and other weights (graph inputs, computed tensors: an ONNX model whose
initializers are inputs), are concatenated by a layout prim, a select over the N ranges, which the
gemm family reads in its operand loads: one launch over several problems, each tile's loads from
one weight (the others masked off), no copy (a copy of every Q/K/V and gate/up weight was 1.2 GB
more for TinyLlama, held by the compiled model).  Each
sibling becomes a slice of the merged prim (``out[..., n] = merged[..., n + offset]``), which the
vertical transformation composes into the slice's readers.

One launch instead of several, the activation read once, and a wider grid; what it costs is that
the siblings' own epilogues (bias adds, head transposes) move into their consumers' operand
loads.  Whether that pays is the planner's call: ``api.py`` plans the graph with and without the
rewrite and keeps the cheaper optimum (``choose_graph``).
"""
from __future__ import annotations

import torch

from ..analysis.classify import Category, classify, contraction_operands
from ..ir.dtypes import TensorType
from ..ir.expr import Cast, Load, Var, binary, select
from ..ir.prim import COPY_LIMIT, Constant, Origin, Prim, PrimGraph


def horizontal(pg: PrimGraph) -> PrimGraph:
    """``pg`` with every set of sibling contractions merged (the same object when there is none)."""
    consts = pg.constant_map
    made = {p.name: k for k, p in enumerate(pg.prims)}
    sets: dict[tuple, list[tuple[Prim, int, int]]] = {}
    for p in pg.prims:
        got = _sibling(p, pg.types)
        if got is not None:
            key, wslot, ndim = got
            siblings = sets.setdefault(key, [])
            # the merged prim sits at the first sibling: every weight must exist by then
            if not siblings or made.get(p.inputs[wslot], -1) < made[siblings[0][0].name]:
                siblings.append((p, wslot, ndim))
    sets = {k: v for k, v in sets.items() if len(v) > 1}
    if not sets:
        return pg
    taken = set(pg.types)
    merged_at: dict[str, list[Prim]] = {}       # first sibling -> prims to put in its place
    replaced: dict[str, Prim] = {}
    new_consts: list[Constant] = []
    for members in sets.values():
        first, wslot, ndim = members[0]
        axis = _n_axis(first)
        wdim = _weight_dim(first, wslot, axis)
        names = [p.inputs[wslot] for p, _, _ in members]
        wname = _fresh("+".join(names), taken)
        if all(n in consts and consts[n].data.numel() <= COPY_LIMIT for n in names):
            new_consts.append(Constant(wname, torch.cat([consts[n].data for n in names], dim=wdim)))
            before = []
        else:
            before = [_concat(wname, names, [pg.types[n] for n in names], wdim, first.origin)]
        shape = list(first.out.shape)
        shape[ndim] = sum(p.out.shape[ndim] for p, _, _ in members)
        name = _fresh(f"{first.name}.h", taken)
        inputs = tuple(wname if j == wslot else n for j, n in enumerate(first.inputs))
        origin = Origin(first.origin.op, "+".join(p.origin.name for p, _, _ in members), first.origin.location)
        merged = Prim(name, inputs, first.axes, first.body, TensorType(tuple(shape), first.out.dtype),
                      first.reduce, origin)
        merged_at[first.name] = before + [merged]
        offset = 0
        for p, _, _ in members:
            index = tuple(binary("add", v, offset) if k == ndim and offset else v for k, v in enumerate(p.axes))
            replaced[p.name] = Prim(p.name, (name,), p.axes, Load(0, index, p.out.dtype), p.out, None, p.origin)
            offset += p.out.shape[ndim]
    prims = []
    for p in pg.prims:
        prims += merged_at.get(p.name, [])
        prims.append(replaced.get(p.name, p))
    used = {n for p in prims for n in p.inputs} | set(pg.outputs)     # an output may be a constant
    constants = tuple(c for c in pg.constants if c.name in used) + tuple(new_consts)
    return PrimGraph(pg.inputs, constants, tuple(prims), pg.outputs)


def _concat(name: str, parts, types, dim: int, origin: Origin) -> Prim:
    """The layout prim concatenating tensors ``parts`` along ``dim`` (a select over the ranges)."""
    shape = list(types[0].shape)
    shape[dim] = sum(t.shape[dim] for t in types)
    axes = tuple(Var(f"i{k}") for k in range(len(shape)))
    body, end = None, sum(t.shape[dim] for t in types)
    for j in range(len(parts) - 1, -1, -1):
        end -= types[j].shape[dim]
        index = tuple(binary("sub", v, end) if k == dim and end else v for k, v in enumerate(axes))
        load = Load(j, index, types[j].dtype)
        body = load if body is None else select(binary("lt", axes[dim], end + types[j].shape[dim]), load, body)
    return Prim(name, tuple(parts), axes, body, TensorType(tuple(shape), types[0].dtype), None,
                Origin("Concat", name, origin.location))


def _sibling(p: Prim, types) -> tuple[tuple, int, int] | None:
    """(sibling key, weight slot, output dim of N) of a contraction eligible for merging, or None:
    two loads (perhaps widened), one of the weight, reading one N axis and reduced axes."""
    if p.is_opaque or classify(p) is not Category.contraction:
        return None
    ops = contraction_operands(p)
    if ops is None or len(ops[2]) != 1:
        return None
    factors = _loads(p.body)
    if factors is None:
        return None
    (n,) = ops[2]
    wloads = [ld for ld in factors if n in ld.index]
    if len(wloads) != 1 or factors[0].tensor == factors[1].tensor:
        return None
    (wload,) = wloads
    wslot = wload.tensor
    if not all(isinstance(e, Var) for e in wload.index):
        return None                   # a plain permutation of N and reduced axes
    w = types[p.inputs[wslot]]
    wdim = list(wload.index).index(n)
    ndim = p.axes.index(n)
    others = tuple(name for j, name in enumerate(p.inputs) if j != wslot)
    key = (others, p.body, p.axes, p.reduce, p.out.dtype, _without(p.out.shape, ndim), wslot,
           w.dtype, _without(w.shape, wdim))
    return key, wslot, ndim


def _loads(body):
    """The loads of a product of two (widened) loads, else None."""
    while isinstance(body, Cast):
        body = body.x
    if getattr(body, "op", None) != "mul":
        return None
    out = []
    for f in (body.a, body.b):
        while isinstance(f, Cast):
            f = f.x
        if not isinstance(f, Load):
            return None
        out.append(f)
    return out


def _n_axis(p: Prim):
    return contraction_operands(p)[2][0]


def _weight_dim(p: Prim, wslot: int, n) -> int:
    wload = next(ld for ld in _loads(p.body) if ld.tensor == wslot)
    return list(wload.index).index(n)


def _without(shape, dim: int) -> tuple:
    return tuple(s for j, s in enumerate(shape) if j != dim)


def _fresh(base: str, taken: set) -> str:
    name, k = base, 1
    while name in taken:
        name, k = f"{base}.{k}", k + 1
    taken.add(name)
    return name
