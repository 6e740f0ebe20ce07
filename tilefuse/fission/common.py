"""Helpers shared by fission rules: axes, broadcasting, n-ary elementwise prims."""
from __future__ import annotations

from typing import Callable, Sequence

from ..errors import UnsupportedAttribute
from ..ir.dtypes import DType
from ..ir.expr import Const, Expr, cast
from ..ir.graph import Node
from .registry import Fission, TensorRef


def norm_axis(node: Node, axis: int, rank: int, attr: str = "axis") -> int:
    """Resolve a possibly negative axis; raise naming the node when out of range."""
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < max(rank, 1):
        raise UnsupportedAttribute(node, attr, axis, f"out of range for rank {rank}")
    return a


def norm_axes(node: Node, axes: Sequence[int], rank: int, attr: str = "axes") -> tuple[int, ...]:
    out = tuple(sorted({norm_axis(node, a, rank, attr) for a in axes}))
    if len(out) != len(tuple(axes)):
        raise UnsupportedAttribute(node, attr, tuple(axes), "repeated axis")
    return out


def broadcast_shape(node: Node, *shapes: Sequence[int]) -> tuple[int, ...]:
    """Numpy broadcasting of several shapes."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(rank):
        dims = {s[len(s) - rank + d] for s in shapes if len(s) - rank + d >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise UnsupportedAttribute(node, "shapes", tuple(tuple(s) for s in shapes), "not broadcastable")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def bcast(x: TensorRef, i: tuple, out_shape: Sequence[int]) -> Expr:
    """Load x at output index i under numpy broadcasting (size-1 dims read element 0)."""
    off = len(out_shape) - x.rank
    return x[tuple(0 if (x.shape[d] == 1 and out_shape[off + d] != 1) else i[off + d] for d in range(x.rank))]


def elementwise(fx: Fission, node: Node, xs: Sequence[TensorRef], fn: Callable[..., Expr]) -> TensorRef:
    """One prim computing fn over broadcast loads of xs."""
    shape = broadcast_shape(node, *(x.shape for x in xs))
    return fx.compute(shape, lambda i: fn(*(bcast(x, i, shape) for x in xs)))


def scalar(value, dtype: DType) -> Const:
    return Const(value, dtype)


def acc_dtype(dtype: DType) -> DType:
    """Accumulation type for arithmetic on dtype (fp32 for 16-bit floats)."""
    return DType.float32 if dtype in (DType.float16, DType.bfloat16) else dtype


def to(e: Expr, dtype: DType) -> Expr:
    return cast(e, dtype)
