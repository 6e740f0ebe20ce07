"""What a frontend hands to the pipeline: the operator graph and how to call it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from ..ir.graph import Graph


def _identity_flatten(args: tuple, kwargs: dict) -> list:
    if kwargs:
        raise TypeError("this model takes positional inputs only")
    return list(args)


def _list_outputs(outs: list) -> Any:
    return outs[0] if len(outs) == 1 else tuple(outs)


@dataclass(frozen=True)
class Imported:
    graph: Graph
    # Call arguments -> one tensor per graph input (in graph.inputs order).
    flatten_inputs: Callable[[tuple, dict], Sequence[torch.Tensor]] = _identity_flatten
    # Graph outputs (in order) -> the structure the model returns.
    unflatten_outputs: Callable[[list], Any] = _list_outputs
