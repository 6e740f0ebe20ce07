"""Fission rules: operators with no tensor-expression form.

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


@rule("NonMaxSuppression", "NonZero", "Unique", "Compress")
def _data_dependent(fx, node, ins):
    """Not supported: the output shape depends on the input values."""
    raise UnsupportedOperator(node, "data-dependent output shape is not supported")
