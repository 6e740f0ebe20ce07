"""Running a plan with real kernels (backend ``"triton"``).

Fused kernels are generated Triton (run by Triton's interpreter on a machine without CUDA);
library and opaque kernels run through torch (cuBLAS/cuDNN on a GPU), their single prim evaluated
by the torch ops the reference executor maps it to.  Buffers are freed after their last use.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from ..ir.prim import PrimGraph
from ..orchestrate.plan import Plan
from .reference import eval_prim

KernelFn = Callable[[list[torch.Tensor]], Mapping[str, torch.Tensor]]


@dataclass(frozen=True)
class Step:
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    run: KernelFn


def _torch_kernel(kernel) -> KernelFn:
    (prim,) = kernel.prims
    return lambda ins: {prim.name: eval_prim(prim, ins)}


def build_steps(plan: Plan) -> list[Step]:
    from ..codegen.triton import compile_fused
    steps = []
    for k in plan.kernels:
        if k.schedule.family == "fused":
            fn = compile_fused(k.schedule)
            steps.append(Step(tuple(k.schedule.inputs), k.outputs, fn))
        else:
            steps.append(Step(tuple(k.prims[0].inputs), k.outputs, _torch_kernel(k)))
    return steps


def execute(steps: list[Step], plan: Plan, pg: PrimGraph, feeds: Mapping[str, torch.Tensor],
            device: torch.device) -> list[torch.Tensor]:
    buffers: dict[str, torch.Tensor] = {c.name: c.data.to(device) for c in pg.constants}
    buffers.update(feeds)
    keep = set(plan.sources) | set(plan.outputs)
    lifetimes = plan.lifetimes
    for i, step in enumerate(steps):
        out = step.run([buffers[n] for n in step.inputs])
        for n in step.outputs:
            buffers[n] = out[n]
        for n in set(step.inputs) | set(step.outputs):
            lt = lifetimes.get(n)
            if lt is not None and lt.last == i and n not in keep:
                del buffers[n]
    return [buffers[n] for n in plan.outputs]
