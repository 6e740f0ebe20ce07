"""Torch implementations of opaque prims (computations with no tensor-expression form).

Each function takes the prim's input tensors and its attributes and returns one tensor.
"""
from __future__ import annotations

from typing import Callable

import torch

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
