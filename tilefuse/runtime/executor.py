"""Running a plan with real kernels (backend ``"triton"``).

A ``Program`` is a plan made runnable on one device: its kernels, built at compile time by their
families (``build.build_kernels``), each writing into buffers it is given (never allocating),
and a memory plan placing every intermediate in one arena allocated once.
"""
from __future__ import annotations

import collections
from typing import Callable, Mapping, Sequence

import torch

from ..families import Built, build
from ..families.base import SCRATCH
from ..ir.prim import PrimGraph
from ..ir.samples import allocate, sample_io
from ..orchestrate.plan import Plan
from ..progress import report
from .memory import MemoryPlan, plan_memory, scratch_names


class Program:
    """A plan's kernels, memory plan and constants on ``device``; ``run`` executes it once."""

    def __init__(self, plan: Plan, pg: PrimGraph, device: torch.device, kernels: Sequence[Built],
                 memory: MemoryPlan | None = None, persistent: Sequence[tuple[int, int]] = (),
                 programs: int = 1, donate: bool = False, trace: bool = False,
                 per_sm: Mapping[int, int] | None = None, fits: Callable | None = None,
                 maxnreg: Mapping[int, int] | None = None):
        if len(kernels) != len(plan.kernels):
            raise ValueError(f"{len(kernels)} built kernels for a plan of {len(plan.kernels)}")
        self.plan, self.device, self.types = plan, device, pg.types
        self.steps = list(kernels)
        self.memory: MemoryPlan = memory or plan_memory(plan, pg, kernels, persistent)
        self.constants = {c.name: c.data.to(device) for c in pg.constants}
        arena = torch.empty(self.memory.arena_bytes, dtype=torch.uint8, device=device)
        views = self.memory.views(arena, self.types)
        self.intermediates = {n: v for n, v in views.items() if n in self.types}
        # each kernel's scratch: workspaces in the arena, counters zeroed once here (the kernels
        # leave them at zero, so a CUDA-graph replay needs no memset)
        self.scratch = [[views[n] if n in views else allocate((s,), device)[0]
                         for n, s in zip(scratch_names(k, b), b.scratch)] for k, b in enumerate(kernels)]
        # ``donate``: an in-place kernel (``Built.inplace``) writes its output into its input's memory
        # where that input is a model input no other kernel reads and the output a model output: the
        # caller overwrites the input with it anyway (a torch.compile'd graph's updated KV cache)
        readers = collections.Counter(n for b in kernels for n in dict.fromkeys(b.inputs))
        feeds = {d.name for d in pg.inputs}
        self._aliases = {b.outputs[0]: b.inputs[0] for b in kernels
                         if donate and b.inplace and b.inputs[0] in feeds and readers[b.inputs[0]] == 1
                         and b.outputs[0] in plan.outputs}
        self._fresh = [n for n in dict.fromkeys(plan.outputs) if n not in plan.sources and n not in self._aliases]
        self._deferred = dict(plan.deferred)     # collective -> the kernel it is waited for before
        # runs of kernels launched as one persistent kernel (``codegen/triton/persistent.py``):
        # first kernel -> (the launcher, the kernel after the run)
        # ``programs``: the persistent kernels' grid (at most what the GPU holds at once), times
        # ``per_sm[k]`` for a run holding kernel k where the plan runs several programs an SM
        # (their binary's occupancy: ``compile_persistent`` checks the one it launches, ``fits``),
        # at most ``maxnreg[k]`` registers a thread where the plan capped them for that.
        # An in-place kernel not given its input's memory copies it first: not a phase then.
        apart = {k for k, b in enumerate(kernels) if b.inplace and b.outputs[0] not in self._aliases}
        persistent = [r for i, j in persistent for r in _without(i, j, apart)]
        # ``trace``: each persistent launch leaves its tasks' clock readings (``runtime/trace.py``)
        per_sm, maxnreg = per_sm or {}, maxnreg or {}
        self._persistent = {i: (_persistent_launch(kernels, i, j, programs, trace, per_sm.get(i, 1), fits,
                                                   maxnreg.get(i)), j)
                            for i, j in persistent}
        # the persistent kernels' scratch buffers by the names their phases use
        self._scratch = {n: t for i, j in persistent for k in range(i, j)
                         for n, t in zip(scratch_names(k, kernels[k]), self.scratch[k])}

    def run(self, feeds: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
        """Graph outputs in order; outputs are new tensors, intermediates live in the arena."""
        buffers = dict(self.constants)
        buffers.update(feeds)
        buffers.update(self.intermediates)
        buffers.update(self._scratch)
        for n in self._fresh:
            t = self.types[n]
            buffers[n] = torch.empty(t.shape, dtype=t.dtype.to_torch(), device=self.device)
        for n, into in self._aliases.items():
            if not buffers[into].is_contiguous():     # kernels write contiguous outputs: write a copy
                buffers[into] = buffers[into].contiguous()
            buffers[n] = buffers[into]
        waits: dict[int, list] = {}            # kernel index -> collectives to wait for before it
        skip = 0
        for k, step in enumerate(self.steps):
            for finish in waits.pop(k, ()):
                finish()
            if k < skip:
                continue
            if k in self._persistent:
                launch, skip = self._persistent[k]
                try:
                    launch(buffers)
                except BaseException:      # counters a failed launch left behind: zero again
                    for j in range(k, skip):
                        for t, s in zip(self.scratch[j], self.steps[j].scratch):
                            if s.zeroed:
                                t.zero_()
                    raise
                report("running kernels", skip, len(self.steps))
                continue
            ins, outs = [buffers[n] for n in step.inputs], [buffers[n] for n in step.outputs] + self.scratch[k]
            if k in self._deferred and step.start is not None:
                waits.setdefault(self._deferred[k], []).append(step.start(ins, outs))
            else:
                step.run(ins, outs)
            report("running kernels", k + 1, len(self.steps))
        for finish in waits.pop(len(self.steps), ()):
            finish()
        return [buffers[n] for n in self.plan.outputs]


def persistent_runs(kernels: Sequence[Built], breaks=frozenset(), least: int = 2) -> list[tuple[int, int]]:
    """The maximal runs (first, past the last) of at least ``least`` consecutive kernels that can
    be phases of one persistent kernel: generated kernels whose launches are declared
    (``Built.launches``: plain ones, and split-K and two-phase GEMMs with their scratch), none
    empty; a run starts anew at each index in ``breaks`` (where a collective is waited for)."""
    runs, start = [], None
    for k, b in enumerate(list(kernels) + [None]):
        ok = b is not None and b.launches is not None and not any(t.empty for t in b.kernels)
        if start is not None and (not ok or k in breaks):
            if k - start >= least:
                runs.append((start, k))
            start = None
        if ok and start is None:
            start = k
    return runs


def _without(i: int, j: int, apart: set) -> list[tuple[int, int]]:
    """The run (i, j) cut at the kernels in ``apart``: its parts of two kernels or more."""
    cuts = [i - 1] + sorted(k for k in apart if i <= k < j) + [j]
    return [(a + 1, b) for a, b in zip(cuts, cuts[1:]) if b - (a + 1) >= 2]


def run_phases(kernels: Sequence[Built], first: int, last: int) -> tuple[list, list, list, dict]:
    """The phases of the persistent kernel running ``kernels[first:last]``: (tile-level kernels,
    each one's input names, each one's output names, the types of the scratch buffers they name),
    a built kernel's scratch named as the memory plan names it (``scratch_names``)."""
    tiles, reads, writes, types = [], [], [], {}
    for k in range(first, last):
        b = kernels[k]
        names = scratch_names(k, b)
        types.update((n, s.type) for n, s in zip(names, b.scratch))
        slot = {SCRATCH.format(j): n for j, n in enumerate(names)}
        for kernel, (ins, outs) in zip(b.kernels, b.launches):
            tiles.append(kernel)
            reads.append([slot.get(n, n) for n in ins])
            writes.append([slot.get(n, n) for n in outs])
    return tiles, reads, writes, types


def _persistent_launch(steps: Sequence[Built], first: int, last: int, programs: int, trace: bool = False,
                       per_sm: int = 1, fits: Callable | None = None, maxnreg: int | None = None):
    from ..codegen.triton.persistent import compile_persistent
    tiles, reads, writes, _ = run_phases(steps, first, last)
    launch, _, _ = compile_persistent("persistent_" + steps[first].name, tiles, reads, writes, programs * per_sm,
                                      trace, per_sm, fits, maxnreg)
    return launch


def kernel_runner(sched, pg: PrimGraph, device: torch.device) -> Callable[[], None]:
    """A zero-argument call running one schedule's kernel alone on ``device`` (for measuring)."""
    from ..codegen import kernel_names
    step = build(sched, kernel_names([sched], pg.prims)[0])
    ins, outs = sample_io(step, pg, device)
    outs = outs + allocate(step.scratch, device)
    return lambda: step.run(ins, outs)
