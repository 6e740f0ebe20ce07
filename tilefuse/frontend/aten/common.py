"""Small helpers shared by the ATen converters: dims, broadcasting, Python scalars."""
from __future__ import annotations

import torch

from ...ir.dtypes import DType, TensorType


def py(v, dtype: DType):
    """A Python scalar converted to the Python type of dtype."""
    if dtype is DType.bool:
        return bool(v)
    if dtype.is_int:
        return int(v)
    return float(v)


def norm_dim(d: int, rank: int) -> int:
    return d + rank if d < 0 else d


def norm_dims(dim, rank: int) -> tuple[int, ...]:
    """Reduction dims: None or [] = all."""
    if dim is None:
        return tuple(range(rank))
    if isinstance(dim, int):
        dim = [dim]
    if len(dim) == 0:
        return tuple(range(rank))
    return tuple(sorted({norm_dim(d, max(rank, 1)) for d in dim}))


def tup(v, n: int) -> tuple:
    if isinstance(v, (list, tuple)):
        v = tuple(v)
        return v * n if len(v) == 1 else v
    return (v,) * n


def bcast_shape(*shapes) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(*[torch.Size(s) for s in shapes]))


def reduce_type(shape, axes, keepdim, dtype: DType) -> TensorType:
    if keepdim:
        s = tuple(1 if d in axes else n for d, n in enumerate(shape))
    else:
        s = tuple(n for d, n in enumerate(shape) if d not in axes)
    return TensorType(s, dtype)
