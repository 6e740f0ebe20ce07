"""Which runs of a plan's kernels are launched as one persistent kernel (issue #25).

A run is a maximal sequence of consecutive kernels whose launches are declared
(``runtime/executor.persistent_runs``); each of its generated kernels is a phase
(``runtime/executor.run_phases``: a split-K GEMM's two kernels are two phases, their workspace
named like any tensor).  Under ``"auto"`` a run is taken where its simulated schedule
(``cost/persistent.py``) models faster than its kernels launched one by one; under True every run.
For a GPU target a taken run is compiled for its architecture and split in halves while its binary
spills, needs more shared memory than a block has, or does not compile: no GPU is needed for that
check.  Everything here is MODELLED,
except the spill check, which reads the compiled binary.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Sequence

from ..cost.persistent import Phase, phase_of, simulate
from ..cost.target import Target
from ..families.base import Cost
from ..log import logger
from ..runtime.executor import persistent_runs, run_phases
from .plan import Plan

_log = logger("plan")


def persistent_plan(plan: Plan, kernels: Sequence, scheduled: Callable, tgt: Target, cuda_graph: bool, mode,
                    types) -> tuple[list[tuple[int, int]], list[dict]]:
    """(the runs launched as persistent kernels, a report row per candidate run); ``scheduled(k)``:
    (Cost, schedule) of the plan's kernel ``k``."""
    launch, atomic = tgt.launch(cuda_graph), 2 * tgt.l2_latency_s    # an atomic: a round trip to L2
    chosen, rows = [], []
    todo = list(persistent_runs(kernels, {w for _, w in plan.deferred}))
    while todo:
        i, j = todo.pop(0)
        costs = [scheduled(k)[0] for k in plan.kernels[i:j]]
        tiles = run_phases(kernels, i, j)[0]
        tasks = iter(math.prod(t.grid) for t in tiles)          # the programs each phase launches
        phases = [p for k, c in zip(plan.kernels[i:j], costs)
                  for p in _phases(c, scheduled(k)[1], tasks, launch, tgt, cuda_graph)]
        apart = sum(c.seconds for c in costs)
        merged = launch + simulate(phases, tgt.sm_count, atomic)
        take = mode is True or merged < apart
        if take and tgt.arch and unfit(kernels, i, j, types, tgt):
            # compiled for the GPU, the run spills, overflows shared memory or does not compile:
            # its halves, each on its own
            todo[:0] = [r for r in ((i, (i + j) // 2), ((i + j) // 2, j)) if r[1] - r[0] >= 2]
            continue
        rows.append({"kernels": [b.name for b in kernels[i:j]], "first": i, "programs": tgt.sm_count,
                     "phases": [{"kernel": n, "tasks": p.tasks, "task_us": round(p.task_s * 1e6, 4)}
                                for n, p in zip([t.name for t in tiles], phases)],
                     # how each phase waits for the one before (the only hand-off this stage has)
                     "edges": [{"from": p - 1, "to": p, "kind": "phase barrier"} for p in range(1, len(phases))],
                     "tasks": sum(p.tasks for p in phases), "atomic_us": round(atomic * 1e6, 4),
                     "apart_us": round(apart * 1e6, 3), "persistent_us": round(merged * 1e6, 3),
                     "launched_as_one": take})
        if take:
            chosen.append((i, j))
    return chosen, rows


def _phases(cost: Cost, schedule, tasks, launch_s: float, tgt: Target, cuda_graph: bool) -> list[Phase]:
    """A planned kernel's phases: one per kernel it launches (a split-K GEMM's partial products,
    then their reduction), their modelled times in the proportions of their own costs."""
    works = (schedule.work, *schedule.then)
    if len(works) == 1:
        return [phase_of(cost, launch_s, next(tasks))]
    parts = [Cost.modelled(w, tgt, cuda_graph) for w in works]
    bodies = [max(c.seconds - launch_s, 0.0) for c in parts]
    scale = max(cost.seconds - len(works) * launch_s, 0.0) / max(sum(bodies), 1e-30)
    return [phase_of(replace(c, seconds=launch_s + b * scale), launch_s, next(tasks)) for c, b in zip(parts, bodies)]


def unfit(kernels: Sequence, first: int, last: int, types, tgt: Target) -> bool:
    """Whether the persistent kernel of ``kernels[first:last]`` compiled for ``tgt``'s GPU spills
    registers, needs more shared memory than a block may have there, or does not compile: a run is
    launched as one only where its binary is clean (no GPU needed)."""
    from ..codegen.triton.native import NativeCompileError, compile_native_persistent
    tiles, reads, writes, scratch = run_phases(kernels, first, last)
    try:
        binary = compile_native_persistent("persistent", tiles, reads, writes, {**types, **scratch}, tgt.arch)
    except NativeCompileError as e:
        _log.info("persistent kernel of %s: %s", [b.name for b in kernels[first:last]], e)
        return True
    return binary.spills or binary.shared_bytes > tgt.smem_per_block
