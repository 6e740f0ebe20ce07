"""Fission rules: scatters into static positions (the functional forms of in-place view updates).

``out[i] = select(i in the written region, updates[f(i)], x[i])``: a select between two loads
whose positions are index arithmetic, so ``analysis/classify.py`` sees layout and the prim fuses
like any other layout prim.  Each rule inverts its view: it decides from ``i`` alone whether
``i`` was written and by which element of ``updates``.  Scatters through data-dependent indices
are ``ScatterND``/``ScatterElements`` (``indirect.py``).
"""
from __future__ import annotations

import math
from typing import Sequence

from ..errors import UnsupportedAttribute
from ..ir.expr import Expr, cast, logical_and, select
from ..ir.graph import Node
from .common import norm_axis
from .layout import linearize, slice_window
from .registry import Fission, TensorRef, rule


def _check_updates(node: Node, upd: TensorRef, shape: Sequence[int]) -> None:
    if tuple(upd.shape) != tuple(shape):
        raise UnsupportedAttribute(node, "updates", tuple(upd.shape),
                                   f"the written region has shape {tuple(shape)}")


def _copy(fx: Fission, x: TensorRef) -> TensorRef:
    return fx.compute(x.shape, lambda i: x[i])


def _scatter(fx: Fission, x: TensorRef, upd: TensorRef, where) -> TensorRef:
    """``where(i)`` -> (condition, index into updates); a select between the two loads."""
    if math.prod(upd.shape) == 0:
        return _copy(fx, x)

    def body(i):
        cond, src = where(i)
        return select(cond, cast(upd[src], x.dtype), x[i])
    return fx.compute(x.shape, body)


# ---------------------------------------------------------------- slice

def _axis_inverse(e: Expr, first: int, step: int, length: int, n: int) -> tuple[list[Expr], Expr]:
    """Conditions for position ``e`` of an axis of size n to be one of ``first + k*step``
    (0 <= k < length), and k; conditions that always hold are left out."""
    if step == 1 and first == 0 and length == n:
        return [], e
    last = first + (length - 1) * step
    lo, hi = min(first, last), max(first, last)
    off = e - first if step > 0 else first - e
    conds = ([e.ge(lo)] if lo > 0 else []) + ([e.le(hi)] if hi < n - 1 else [])
    if abs(step) == 1:
        return conds, off
    return conds + [(off % abs(step)).eq(0)], off // abs(step)


@rule("SliceScatter")
def _slice_scatter(fx, node, ins):
    """``X`` with its Slice window (``starts``/``ends``/``axes``/``steps``, as Slice) replaced by ``updates``."""
    x, upd = ins[0], ins[1]
    params = slice_window(node, x.shape)
    _check_updates(node, upd, [p[2] for p in params])

    def where(i):
        conds, src = [], []
        for d, (first, step, length) in enumerate(params):
            c, k = _axis_inverse(i[d], first, step, length, x.shape[d])
            conds += c
            src.append(k)
        return logical_and(*conds), tuple(src)
    return _scatter(fx, x, upd, where)


# ---------------------------------------------------------------- diagonal

def diagonal_length(n1: int, n2: int, offset: int) -> int:
    return max(0, min(n1, n2 - offset) if offset >= 0 else min(n1 + offset, n2))


@rule("DiagonalScatter")
def _diagonal_scatter(fx, node, ins):
    """``X`` with ``torch.diagonal(X, offset, dim1, dim2)`` replaced by ``updates`` (the diagonal last)."""
    x, upd = ins[0], ins[1]
    if x.rank < 2:
        raise UnsupportedAttribute(node, "rank", x.rank, "input must have at least 2 dims")
    d1 = norm_axis(node, int(node.attrs.get("dim1", 0)), x.rank, "dim1")
    d2 = norm_axis(node, int(node.attrs.get("dim2", 1)), x.rank, "dim2")
    if d1 == d2:
        raise UnsupportedAttribute(node, "dim2", d2, "dim1 and dim2 must differ")
    offset = int(node.attrs.get("offset", 0))
    rest = [d for d in range(x.rank) if d not in (d1, d2)]
    _check_updates(node, upd, [x.shape[d] for d in rest] + [diagonal_length(x.shape[d1], x.shape[d2], offset)])

    def where(i):
        k = i[d1] if offset >= 0 else i[d2]
        return (i[d2] - i[d1]).eq(offset), tuple(i[d] for d in rest) + (k,)
    return _scatter(fx, x, upd, where)


# ---------------------------------------------------------------- as_strided

def _greedy_order(node: Node, size: Sequence[int], stride: Sequence[int]) -> list[int]:
    """The view's dims by decreasing stride, when that order decomposes an offset uniquely
    (each stride larger than the span of all smaller ones: a non-overlapping view)."""
    dims = sorted((d for d in range(len(size)) if size[d] > 1), key=lambda d: -stride[d])
    span = 0
    for d in reversed(dims):
        if stride[d] <= span:
            raise UnsupportedAttribute(node, "stride", tuple(stride),
                                       "the view overlaps itself or interleaves its dims")
        span += (size[d] - 1) * stride[d]
    return dims


@rule("AsStridedScatter")
def _as_strided_scatter(fx, node, ins):
    """``X`` (row-major storage) with its ``as_strided(size, stride, storage_offset)`` view
    replaced by ``updates``: an element's offset is split by the strides, largest first."""
    x, upd = ins[0], ins[1]
    size = tuple(int(s) for s in node.attrs.get("size", ()))
    stride = tuple(int(s) for s in node.attrs.get("stride", ()))
    offset = int(node.attrs.get("storage_offset", 0))
    if len(size) != len(stride) or any(s < 0 for s in size + stride) or offset < 0:
        raise UnsupportedAttribute(node, "stride", stride, f"expected {len(size)} non-negative strides")
    _check_updates(node, upd, size)
    if math.prod(size) and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= math.prod(x.shape):
        raise UnsupportedAttribute(node, "size", size, f"the view reaches past the {math.prod(x.shape)} elements of X")
    order = _greedy_order(node, size, stride)

    def where(i):
        rem = linearize(i, x.shape) - offset
        conds = [rem.ge(0)] if offset else []
        src = [0] * len(size)
        for d in order:
            src[d] = rem // stride[d]
            conds.append(src[d].lt(size[d]))
            rem = rem % stride[d]
        return logical_and(*conds, rem.eq(0)), tuple(src)
    return _scatter(fx, x, upd, where)

