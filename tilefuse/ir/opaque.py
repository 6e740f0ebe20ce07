"""Torch implementations of opaque prims (computations with no tensor-expression form).

Each function takes the prim's input tensors and its attributes and returns one tensor.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from .dtypes import DType

OPAQUE: dict[str, Callable[..., torch.Tensor]] = {}


def opaque_fn(name: str):
    def deco(fn):
        OPAQUE[name] = fn
        return fn
    return deco


@opaque_fn("topk_indices")
def _topk_indices(x: torch.Tensor, *, k: int, axis: int, largest: bool, sorted: bool) -> torch.Tensor:
    # Ties resolve to the lower index (ONNX TopK semantics): a stable sort gives that order.
    order = torch.sort(x, dim=axis, descending=largest, stable=True).indices
    return order.narrow(axis, 0, k).to(torch.int64)


@opaque_fn("det")
def _det(x: torch.Tensor) -> torch.Tensor:
    # (torch's LU has no 16-bit kernels: solve in fp32, round once)
    wide = x if x.dtype in (torch.float32, torch.float64) else x.float()
    return torch.linalg.det(wide).to(x.dtype)


@opaque_fn("bitcast")
def _bitcast(x: torch.Tensor, *, dtype: str) -> torch.Tensor:
    return x.contiguous().view(DType(dtype).to_torch())


# ONNX scatter reductions as torch.scatter_reduce modes ("none" overwrites).
_SCATTER_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


def _wrap(indices: torch.Tensor, n) -> torch.Tensor:
    indices = indices.to(torch.int64)
    return torch.where(indices < 0, indices + n, indices)


@opaque_fn("scatter_elements")
def _scatter_elements(data: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor, *, axis: int,
                      reduction: str) -> torch.Tensor:
    idx = _wrap(indices, data.shape[axis])
    if reduction == "none":
        return data.scatter(axis, idx, updates)
    return data.scatter_reduce(axis, idx, updates, _SCATTER_REDUCE[reduction], include_self=True)


@opaque_fn("scatter_nd")
def _scatter_nd(data: torch.Tensor, indices: torch.Tensor, updates: torch.Tensor, *,
                reduction: str) -> torch.Tensor:
    # Address the first m dims of data by one linear row index, then scatter whole rows.
    m = indices.shape[-1]
    lead = data.shape[:m]
    idx = _wrap(indices.reshape(-1, m), torch.tensor(lead, dtype=torch.int64, device=data.device))
    strides = torch.tensor([math.prod(lead[k + 1:]) for k in range(m)], dtype=torch.int64, device=data.device)
    rows = (idx * strides).sum(-1)
    flat = data.reshape(math.prod(lead), *data.shape[m:]).clone()
    upd = updates.reshape(rows.shape[0], *data.shape[m:])
    if reduction == "none":
        flat[rows] = upd
    else:
        index = rows.reshape(-1, *[1] * (flat.dim() - 1)).expand_as(upd)
        flat = flat.scatter_reduce(0, index, upd, _SCATTER_REDUCE[reduction], include_self=True)
    return flat.reshape(data.shape)


@opaque_fn("index_put")
def _index_put(data: torch.Tensor, values: torch.Tensor, *indices: torch.Tensor, dims: tuple,
               inplace: bool) -> torch.Tensor:
    """``data`` with ``values`` written where the index tensors (one per dim of ``dims``) point, as
    torch's ``index_put`` (``inplace``: the caller writes the result back into ``data``, so a
    kernel may write it there: ``families/opaque.py``)."""
    return torch.ops.aten.index_put.default(data, index_list(data.dim(), dims, indices), values)


def index_list(rank: int, dims: tuple, indices) -> list:
    """torch's optional-index list: each index tensor at its dim, None elsewhere."""
    full: list = [None] * rank
    for d, i in zip(dims, indices):
        full[d] = i
    return full


# --- collectives (torch.distributed's functional collectives) ---
# ``ISSUE[fn]`` starts one and returns its result tensor, valid once ``wait`` has been called on it
# (the runtime issues a collective early and waits just before its result is read:
# ``orchestrate/overlap.py``); the opaque function (the reference's) waits at once.

COLLECTIVES = frozenset({"all_reduce", "all_gather", "reduce_scatter", "all_to_all"})


def _c10d():
    return torch.ops._c10d_functional


def wait(result: torch.Tensor) -> torch.Tensor:
    return _c10d().wait_tensor(result)


ISSUE = {
    "all_reduce": lambda x, *, reduce, group, group_size: _c10d().all_reduce(x.contiguous(), reduce, group),
    "all_gather": lambda x, *, group, group_size: _c10d().all_gather_into_tensor(x.contiguous(), group_size, group),
    "reduce_scatter": lambda x, *, reduce, group, group_size: _c10d().reduce_scatter_tensor(
        x.contiguous(), reduce, group_size, group),
    "all_to_all": lambda x, *, group, group_size, output_split_sizes, input_split_sizes: _c10d().all_to_all_single(
        x.contiguous(), list(output_split_sizes), list(input_split_sizes), group),
}


def _waited(fn: str):
    def run(x: torch.Tensor, **attrs) -> torch.Tensor:
        return wait(ISSUE[fn](x, **attrs))
    return run


for _fn in sorted(COLLECTIVES):
    opaque_fn(_fn)(_waited(_fn))
