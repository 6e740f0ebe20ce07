"""Collectives overlapped with the computation that does not need their result.

A collective (an all-reduce of a row-parallel layer, an all-gather) runs on the interconnect while
the GPU could go on with any kernel that does not read its result.  ``overlap`` orders a plan's
kernels for that, by list scheduling over the kernels' data dependencies: among the kernels whose
inputs are ready, a collective first (issued as early as its input allows), then a kernel that
reads no result of a collective still in flight, and only then one that does (in the planned
order within each class; a collective reading another's result in flight is in the last class).  Each collective is issued without waiting (``Built.start``) and waited
for just before the first kernel that reads its result (``Plan.deferred``: (collective, the kernel
it is waited for before)); its inputs stay live until then, so the memory planner does not give
their bytes to a kernel that runs while the collective may still read them.

The order is a function of the plan alone, so every rank, compiling the same plan, issues the same
collectives in the same order.  Times stay modelled as a sequence (the plan's cost does not
subtract what overlaps); ``hidden`` says what the model would hide: per collective, the smaller of
its time and the time of the kernels between its issue and its wait.
"""
from __future__ import annotations

from dataclasses import replace

from .plan import Plan


def is_collective(kernel) -> bool:
    return kernel.schedule is not None and kernel.schedule.family == "collective"


def overlap(plan: Plan) -> Plan:
    """``plan`` reordered so that collectives overlap the kernels that do not need them, with each
    collective's wait deferred (``Plan.deferred``); the plan itself where it has no collective."""
    kernels = plan.kernels
    if not any(is_collective(k) for k in kernels):
        return plan
    available = set(plan.sources)
    in_flight: dict[str, int] = {}           # tensor -> the collective (new position) writing it
    order: list[int] = []
    left = list(range(len(kernels)))
    while left:
        ready = [i for i in left if all(t in available for t in kernels[i].inputs)]
        if not ready:                         # (a valid plan always has one)
            raise ValueError("the plan's kernels read tensors no earlier kernel writes")
        free = [i for i in ready if not any(t in in_flight for t in kernels[i].inputs)]
        pick = next((i for i in free if is_collective(kernels[i])), free[0] if free else ready[0])
        for t in kernels[pick].inputs:         # it waits for the collectives it reads
            in_flight.pop(t, None)
        if is_collective(kernels[pick]):
            in_flight.update((t, len(order)) for t in kernels[pick].outputs)
        order.append(pick)
        left.remove(pick)
        available.update(kernels[pick].outputs)
    new = tuple(kernels[i] for i in order)
    return replace(plan, kernels=new, deferred=deferred_waits(new, plan.outputs))


def deferred_waits(kernels, outputs) -> tuple[tuple[int, int], ...]:
    """(collective, the kernel it is waited for before: the first reading its result, or
    ``len(kernels)``, the end of the run) for each collective of ``kernels``."""
    out = []
    for k, kern in enumerate(kernels):
        if is_collective(kern):
            wanted = set(kern.outputs)
            w = next((j for j in range(k + 1, len(kernels)) if wanted & set(kernels[j].inputs)), len(kernels))
            out.append((k, w))
    return tuple(out)


def hidden(plan: Plan, seconds) -> list[dict]:
    """Per deferred collective: its position, its wait, the kernels between and the time the model
    would hide (``seconds(kernel)``: a kernel's modelled time)."""
    rows = []
    for k, w in plan.deferred:
        between = list(range(k + 1, w))
        overlapped = sum(seconds(plan.kernels[j]) for j in between)
        rows.append({"collective": k, "waited_before": w, "between": between,
                     "hidden_us": round(min(seconds(plan.kernels[k]), overlapped) * 1e6, 3)})
    return rows
