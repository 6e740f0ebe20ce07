"""Plans: the chosen kernels of every segment in executable order, with buffer lifetimes.

A ``PlannedKernel`` is a selected candidate (member prims, inputs, outputs), its estimated cost and an
opaque ``schedule`` slot that kernel families fill in.  Only a kernel's outputs are materialized;
values a kernel computes without writing them die with it.

``Plan.lifetimes`` maps each tensor some kernel writes to ``Lifetime(first, last)``: the index of
the first kernel writing it and of the last kernel touching it (reading or, for a redundant write,
writing it again; a deferred collective's inputs: the kernel it is waited for before); graph
outputs live to ``len(kernels)``, i.e. past the end.

``execute_reference`` runs a plan kernel by kernel with the reference executor, dropping every
kernel-internal value when the kernel ends, so it equals ``run_reference`` exactly iff the plan is
right.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping, Sequence

import torch

from ..ir.evaluate import eval_prim
from ..ir.prim import Prim, PrimGraph
from .blp import Selection
from .candidates import Candidate
from .segment import Segment


class PlanError(RuntimeError):
    """A plan reads a tensor before any kernel writes it, or never writes a graph output."""


@dataclass(frozen=True)
class PlannedKernel:
    candidate: Candidate
    cost: float
    segment: int                      # index of the segment it was selected in
    schedule: Any = field(default=None, compare=False)   # filled in by kernel families

    @property
    def prims(self) -> tuple[Prim, ...]:
        return self.candidate.prims

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.candidate.inputs

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.candidate.outputs


@dataclass(frozen=True)
class Lifetime:
    first: int        # first kernel writing the tensor
    last: int         # last kernel reading or writing it; len(kernels) for graph outputs


@dataclass(frozen=True)
class Plan:
    kernels: tuple[PlannedKernel, ...]
    sources: frozenset[str]           # always available: graph inputs and constants
    outputs: tuple[str, ...]          # graph outputs, in order
    solver: Mapping[str, Any] = field(default_factory=dict, compare=False)
    # collectives waited for later than they are issued (``overlap.py``): (collective's index,
    # the index of the kernel it is waited for before; len(kernels): at the end)
    deferred: tuple[tuple[int, int], ...] = ()

    @property
    def cost(self) -> float:
        return sum(k.cost for k in self.kernels)

    @cached_property
    def lifetimes(self) -> Mapping[str, Lifetime]:
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        for i, k in enumerate(self.kernels):
            for t in k.inputs:
                last[t] = i
            for t in k.outputs:
                first.setdefault(t, i)
                last[t] = i
        end = len(self.kernels)
        for k, w in self.deferred:          # a collective in flight still reads its inputs
            for t in self.kernels[k].inputs:
                if t in last:
                    last[t] = max(last[t], w)
        for t in self.outputs:
            last[t] = end
        return {t: Lifetime(f, last[t]) for t, f in first.items()}

    def validate(self) -> None:
        """Raise ``PlanError`` unless every input is written before use and every output is written."""
        avail = set(self.sources)
        for i, k in enumerate(self.kernels):
            for t in k.inputs:
                if t not in avail:
                    raise PlanError(f"kernel {i} {k.candidate} reads {t!r} before any kernel writes it")
            avail.update(k.outputs)
        for t in self.outputs:
            if t not in avail:
                raise PlanError(f"graph output {t!r} is never written")


def build_plan(pg: PrimGraph, segments: Sequence[Segment], selections: Sequence[Selection],
               solver: Mapping[str, Any] | None = None) -> Plan:
    """Concatenate the per-segment selections (segments in graph order) into a validated plan."""
    kernels = tuple(PlannedKernel(c, cost, s)
                    for s, sel in enumerate(selections) for c, cost in zip(sel.chosen, sel.costs))
    sources = frozenset(d.name for d in pg.inputs) | frozenset(c.name for c in pg.constants)
    plan = Plan(kernels, sources, tuple(pg.outputs), dict(solver or {}))
    plan.validate()
    return plan


def execute_reference(plan: Plan, pg: PrimGraph, feeds: Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    """Run the plan kernel by kernel with the reference executor; returns the graph outputs."""
    buffers: dict[str, torch.Tensor] = {c.name: c.data for c in pg.constants}
    for d in pg.inputs:
        buffers[d.name] = feeds[d.name]
    lifetimes = plan.lifetimes
    keep = set(plan.sources) | set(plan.outputs)
    for i, k in enumerate(plan.kernels):
        local: dict[str, torch.Tensor] = {}
        for p in k.prims:
            local[p.name] = eval_prim(p, [_read(local, buffers, n, i, k) for n in p.inputs])
        for t in k.outputs:
            buffers[t] = local[t]
        for t in set(k.inputs) | set(k.outputs):  # free buffers after their last use
            lt = lifetimes.get(t)
            if lt is not None and lt.last == i and t not in keep:
                del buffers[t]
    return [buffers[t] for t in plan.outputs]


def _read(local, buffers, name: str, i: int, k: PlannedKernel) -> torch.Tensor:
    if name in local:
        return local[name]
    if name not in buffers:
        raise PlanError(f"kernel {i} {k.candidate} reads {name!r}, which it does not compute and no "
                        "earlier kernel wrote")
    return buffers[name]
