"""Running a plan with real kernels (backend ``"triton"``).

A ``Program`` is a plan made runnable on one device: its kernels, built at compile time by their
families (``build.build_kernels``), each writing into buffers it is given (never allocating),
and a memory plan placing every intermediate in one arena allocated once.
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import torch

from ..families import Built, build
from ..ir.prim import PrimGraph
from ..ir.samples import allocate, sample_io
from ..orchestrate.plan import Plan
from ..progress import report
from .memory import MemoryPlan, plan_memory, scratch_names


class Program:
    """A plan's kernels, memory plan and constants on ``device``; ``run`` executes it once."""

    def __init__(self, plan: Plan, pg: PrimGraph, device: torch.device, kernels: Sequence[Built],
                 memory: MemoryPlan | None = None):
        if len(kernels) != len(plan.kernels):
            raise ValueError(f"{len(kernels)} built kernels for a plan of {len(plan.kernels)}")
        self.plan, self.device, self.types = plan, device, pg.types
        self.steps = list(kernels)
        self.memory: MemoryPlan = memory or plan_memory(plan, pg, kernels)
        self.constants = {c.name: c.data.to(device) for c in pg.constants}
        arena = torch.empty(self.memory.arena_bytes, dtype=torch.uint8, device=device)
        views = self.memory.views(arena, self.types)
        self.intermediates = {n: v for n, v in views.items() if n in self.types}
        # each kernel's scratch: workspaces in the arena, counters zeroed once here (the kernels
        # leave them at zero, so a CUDA-graph replay needs no memset)
        self.scratch = [[views[n] if n in views else allocate((s,), device)[0]
                         for n, s in zip(scratch_names(k, b), b.scratch)] for k, b in enumerate(kernels)]
        self._fresh = [n for n in dict.fromkeys(plan.outputs) if n not in plan.sources]
        self._deferred = dict(plan.deferred)     # collective -> the kernel it is waited for before

    def run(self, feeds: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        """Graph outputs in order; outputs are new tensors, intermediates live in the arena."""
        buffers = dict(self.constants)
        buffers.update(feeds)
        buffers.update(self.intermediates)
        for n in self._fresh:
            t = self.types[n]
            buffers[n] = torch.empty(t.shape, dtype=t.dtype.to_torch(), device=self.device)
        waits: dict[int, list] = {}            # kernel index -> collectives to wait for before it
        for k, step in enumerate(self.steps):
            for finish in waits.pop(k, ()):
                finish()
            ins, outs = [buffers[n] for n in step.inputs], [buffers[n] for n in step.outputs] + self.scratch[k]
            if k in self._deferred and step.start is not None:
                waits.setdefault(self._deferred[k], []).append(step.start(ins, outs))
            else:
                step.run(ins, outs)
            report("running kernels", k + 1, len(self.steps))
        for finish in waits.pop(len(self.steps), ()):
            finish()
        return [buffers[n] for n in self.plan.outputs]


def kernel_runner(sched, pg: PrimGraph, device: torch.device) -> Callable[[], None]:
    """A zero-argument call running one schedule's kernel alone on ``device`` (for measuring)."""
    from ..codegen import kernel_names
    step = build(sched, kernel_names([sched], pg.prims)[0])
    ins, outs = sample_io(step, pg, device)
    outs = outs + allocate(step.scratch, device)
    return lambda: step.run(ins, outs)
