"""Running a plan with real kernels (backend ``"triton"``).

A ``Program`` is a plan made runnable on one device: a ``Step`` per kernel, each writing into
buffers it is given (never allocating), and a memory plan placing every intermediate in one arena
allocated once.  Fused kernels are generated Triton (run by Triton's interpreter on a machine
without CUDA); library kernels run through torch (cuBLAS/cuDNN on a GPU) with layouts folded into
strides (runtime/library.py); opaque kernels run their torch function.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import torch

from ..ir.prim import PrimGraph
from ..orchestrate.plan import Plan
from .memory import MemoryPlan, plan_memory
from .reference import eval_prim

# Runs one kernel: (inputs in Step.inputs order, outputs in Step.outputs order) -> None.
KernelFn = Callable[[list[torch.Tensor], list[torch.Tensor]], None]


@dataclass(frozen=True)
class Step:
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    run: KernelFn
    source: str | None = None     # generated source (fused kernels)


def _torch_kernel(prim) -> KernelFn:
    def run(ins, outs):
        outs[0].copy_(eval_prim(prim, ins))
    return run


def build_step(sched) -> Step:
    """The runnable kernel of a schedule."""
    from ..codegen.triton import compile_fused
    if sched.family == "fused":
        launch = compile_fused(sched)
        return Step(tuple(sched.inputs), tuple(st.tensor for st in sched.stores), launch, launch.source)
    (prim,) = sched.group.prims
    if sched.family == "library":
        from .library import library_kernel
        return Step(tuple(prim.inputs), (prim.name,), _one_output(library_kernel(prim)))
    return Step(tuple(prim.inputs), (prim.name,), _torch_kernel(prim))


def _one_output(fn) -> KernelFn:
    return lambda ins, outs: fn(ins, outs[0])


class Program:
    """A plan's kernels, memory plan and constants on ``device``; ``run`` executes it once."""

    def __init__(self, plan: Plan, pg: PrimGraph, device: torch.device, memory: MemoryPlan | None = None):
        self.plan, self.device, self.types = plan, device, pg.types
        self.steps = [build_step(k.schedule) for k in plan.kernels]
        self.memory: MemoryPlan = memory or plan_memory(plan, pg)
        self.constants = {c.name: c.data.to(device) for c in pg.constants}
        arena = torch.empty(self.memory.arena_bytes, dtype=torch.uint8, device=device)
        self.intermediates = self.memory.views(arena, self.types)
        self._fresh = [n for n in dict.fromkeys(plan.outputs) if n not in plan.sources]

    @property
    def kernel_sources(self) -> list[str]:
        """The generated Triton source of each fused kernel, in plan order."""
        return [s.source for s in self.steps if s.source is not None]

    def run(self, feeds: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        """Graph outputs in order; outputs are new tensors, intermediates live in the arena."""
        buffers = dict(self.constants)
        buffers.update(feeds)
        buffers.update(self.intermediates)
        for n in self._fresh:
            t = self.types[n]
            buffers[n] = torch.empty(t.shape, dtype=t.dtype.to_torch(), device=self.device)
        for step in self.steps:
            step.run([buffers[n] for n in step.inputs], [buffers[n] for n in step.outputs])
        return [buffers[n] for n in self.plan.outputs]


def kernel_runner(sched, pg: PrimGraph, device: torch.device) -> Callable[[], None]:
    """A zero-argument call running one schedule's kernel alone on ``device`` (for measuring):
    weights are the model's, other inputs random floats or zero integers (in range as indices)."""
    step = build_step(sched)
    consts = pg.constant_map
    types = sched.group.types

    def tensor(name: str) -> torch.Tensor:
        if name in consts:
            return consts[name].data.to(device)
        t = types[name]
        if t.dtype.is_float:
            return torch.randn(t.shape, device=device).to(t.dtype.to_torch())
        return torch.zeros(t.shape, dtype=t.dtype.to_torch(), device=device)

    ins = [tensor(n) for n in step.inputs]
    outs = [torch.empty(types[n].shape, dtype=types[n].dtype.to_torch(), device=device) for n in step.outputs]
    return lambda: step.run(ins, outs)
