"""Inputs and outputs to run one kernel alone, outside its plan (measuring it, auditing its
traffic): the model's weights, random floats, zero integers (in range as indices)."""
from __future__ import annotations

import torch

from .prim import PrimGraph


def sample_io(kernel, pg: PrimGraph, device: torch.device) -> tuple[list, list]:
    """(inputs, outputs) to run ``kernel`` (its ``inputs`` and ``outputs`` tensor names) alone:
    weights are the model's, other inputs random floats or zero integers (in range as indices),
    outputs empty."""
    consts = pg.constant_map
    types = pg.types

    def tensor(name: str) -> torch.Tensor:
        if name in consts:
            return consts[name].data.to(device)
        t = types[name]
        if t.dtype.is_float:
            return torch.randn(t.shape, device=device).to(t.dtype.to_torch())
        return torch.zeros(t.shape, dtype=t.dtype.to_torch(), device=device)

    ins = [tensor(n) for n in kernel.inputs]
    outs = [torch.empty(types[n].shape, dtype=types[n].dtype.to_torch(), device=device) for n in kernel.outputs]
    return ins, outs


def allocate(scratch, device) -> list:
    """New buffers for a built kernel's scratch (``families.base.Scratch``: a type, and whether it
    starts at zero) on ``device``: for a kernel run alone (a check, a measurement, the traffic
    audit), or the counters a program keeps."""
    return [(torch.zeros if s.zeroed else torch.empty)(s.type.shape, dtype=s.type.dtype.to_torch(), device=device)
            for s in scratch]
