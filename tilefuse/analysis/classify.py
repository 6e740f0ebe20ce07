"""Prim categories, derived from structure alone (never declared by fission rules).

- opaque:      the body is an opaque call;
- indirect:    some load index depends on loaded data (gather, embedding);
- contraction: sum-reduce of a product whose factors read different subsets of the axes
               (matmul, bmm, conv, linear: each operand is reused across the other's axes);
- reduce:      any other reduction (sum, max, mean, variance, pooling);
- elementwise: every load reads at exactly the output axes;
- broadcast:   loads read at a subset of the output axes (in order, constants for size-1 dims);
- layout:      loads through any other (quasi-)affine map (transpose, reshape, slice, pad, concat).
"""
from __future__ import annotations

from enum import Enum
from functools import lru_cache

from ..ir.expr import Binary, Cast, Const, Expr, Load, Var, walk
from ..ir.prim import Prim, Reduction


class Category(str, Enum):
    elementwise = "elementwise"
    broadcast = "broadcast"
    layout = "layout"
    reduce = "reduce"
    contraction = "contraction"
    indirect = "indirect"
    opaque = "opaque"


CATEGORIES = tuple(c.value for c in Category)
MEMORY_BOUND = frozenset({Category.elementwise, Category.broadcast, Category.layout, Category.reduce,
                          Category.indirect})


def _strip_casts(e: Expr) -> Expr:
    while isinstance(e, Cast):
        e = e.x
    return e


def _factors(e: Expr) -> list[Expr]:
    e = _strip_casts(e)
    if isinstance(e, Binary) and e.op == "mul":
        return _factors(e.a) + _factors(e.b)
    return [e]


def _vars(e: Expr) -> frozenset:
    return frozenset(n for n in walk(e) if isinstance(n, Var))


def _is_contraction(axes: tuple[Var, ...], body: Expr, reduce: Reduction | None) -> bool:
    if reduce is None or reduce.combiner != "sum":
        return False
    facs = [f for f in _factors(body) if any(isinstance(n, Load) for n in walk(f))]
    if len(facs) < 2:
        return False
    rvars = set(reduce.axes)
    var_sets = [_vars(f) for f in facs]
    if not all(vs & rvars for vs in var_sets):
        return False
    out_axes = set(axes)
    # Reuse: some operand misses an output axis another operand has.
    return len({vs & out_axes for vs in var_sets}) > 1


def contraction_operands(p: Prim) -> tuple[tuple, tuple, tuple] | None:
    """(batch, M, N) output axes of a two-operand contraction, or None.

    Factors without loads (scales) are ignored; M axes are read only by the first operand, N axes
    only by the second, batch axes by both.  An output axis of extent 1 read by neither (a
    composed reshape reads it as the constant 0) is a batch axis; any other read by neither
    makes it no GEMM.
    """
    if p.is_opaque:
        return None
    return _contraction_operands(p.axes, p.body, p.reduce, p.out.shape)


@lru_cache(maxsize=1 << 14)     # asked for the same prims many times while planning, as _classify
def _contraction_operands(axes: tuple[Var, ...], body: Expr, reduce: Reduction | None,
                          shape: tuple[int, ...]) -> tuple[tuple, tuple, tuple] | None:
    if not _is_contraction(axes, body, reduce):
        return None
    facs = [f for f in _factors(body) if any(isinstance(n, Load) for n in walk(f))]
    if len(facs) != 2:
        return None
    a, b = (_vars(f) & set(axes) for f in facs)
    unread = set(axes) - a - b
    if any(n != 1 for v, n in zip(axes, shape) if v in unread):
        return None
    a, b = a | unread, b | unread
    order = lambda vs: tuple(v for v in axes if v in vs)  # noqa: E731 - keep axis order
    return order(a & b), order(a - b), order(b - a)


def _index_kind(axes: tuple[Var, ...], ld: Load) -> str:
    if any(isinstance(n, Load) for i in ld.index for n in walk(i)):
        return "indirect"
    if ld.index == axes:
        return "elementwise"
    pos = {v: k for k, v in enumerate(axes)}
    last = -1
    for i in ld.index:
        if isinstance(i, Const):
            if i.value != 0:
                return "layout"
            continue
        if not isinstance(i, Var) or i not in pos or pos[i] <= last:
            return "layout"
        last = pos[i]
    return "broadcast"


_ORDER = ("elementwise", "broadcast", "layout", "indirect")


def classify(p: Prim) -> Category:
    """The prim's category (see the module docstring)."""
    if p.is_opaque:
        return Category.opaque
    return _classify(p.axes, p.body, p.reduce)


# The planner asks for the same prims' categories many times (about 500k times planning BERT);
# the key is the structure the category depends on (interned expressions hash cheaply).
@lru_cache(maxsize=1 << 14)
def _classify(axes: tuple[Var, ...], body: Expr, reduce: Reduction | None) -> Category:
    kinds = {_index_kind(axes, n) for n in walk(body) if isinstance(n, Load)}
    if "indirect" in kinds:
        return Category.indirect
    if reduce is not None:
        return Category.contraction if _is_contraction(axes, body, reduce) else Category.reduce
    worst = max((_ORDER.index(k) for k in kinds), default=0)
    return Category(_ORDER[worst])


def count_by_category(prims) -> dict[str, int]:
    counts = {c: 0 for c in CATEGORIES}
    for p in prims:
        counts[classify(p).value] += 1
    return counts
