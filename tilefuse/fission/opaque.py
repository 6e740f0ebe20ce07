"""Fission rules: operators with no tensor-expression form.

Det (an LU factorization) and BitCast (a reinterpretation of bits) are one torch call each.
TopK keeps only the selection opaque: its indices come from the ``topk_indices`` torch prim and
its values are an ordinary gather of the input at those indices, which can fuse with consumers.
Operators whose output shape depends on the data cannot have a static PrimGraph and are refused.
"""
from __future__ import annotations

from ..errors import UnsupportedAttribute, UnsupportedOperator
from ..ir.dtypes import DType, TensorType
from .common import norm_axis
from .indirect import gather_elements
from .registry import rule


@rule("TopK")
def _topk(fx, node, ins):
    """The ``k`` largest (``largest=1``) or smallest along ``axis``: opaque indices, gathered values."""
    x = ins[0]
    axis = norm_axis(node, int(node.attrs.get("axis", -1)), x.rank)
    k = int(node.attrs.get("k", fx.out_type().shape[axis]))
    if not 0 <= k <= x.shape[axis]:
        raise UnsupportedAttribute(node, "k", k, f"must be between 0 and {x.shape[axis]}")
    shape = x.shape[:axis] + (k,) + x.shape[axis + 1:]
    indices = fx.opaque("topk_indices", [x], TensorType(shape, DType.int64), k=k, axis=axis,
                        largest=bool(node.attrs.get("largest", 1)), sorted=bool(node.attrs.get("sorted", 1)))
    return [gather_elements(fx, x, indices, axis), indices]


@rule("Det")
def _det(fx, node, ins):
    """Determinant of the trailing square matrices: one opaque prim (torch.linalg.det)."""
    x = ins[0]
    if x.rank < 2 or x.shape[-1] != x.shape[-2] or not x.dtype.is_float:
        raise UnsupportedAttribute(node, "shape", x.shape, "Det needs square float matrices in the last two axes")
    return fx.opaque("det", [x], fx.out_type())


@rule("BitCast")
def _bitcast(fx, node, ins):
    """The input's bits reinterpreted as the type ``to`` (of the same width): one opaque prim."""
    x, out = ins[0], fx.out_type()
    if out.dtype.itemsize != x.dtype.itemsize:
        raise UnsupportedAttribute(node, "to", out.dtype.value, f"not the width of {x.dtype.value}")
    return fx.opaque("bitcast", [x], out, dtype=out.dtype.value)


@rule("NonMaxSuppression", "NonZero", "Unique", "Compress")
def _data_dependent(fx, node, ins):
    """Not supported: the output shape depends on the input values."""
    raise UnsupportedOperator(node, "data-dependent output shape is not supported")
