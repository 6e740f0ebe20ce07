"""Costing candidates with the kernel families: the ``cost_fn`` the orchestrator calls.

Families are tried in order; a family that cannot build a group returns None at once (most
candidates die there).  The cheapest schedule wins.  Schedules are kept per candidate so the plan's
kernels carry the schedule they were costed with.
"""
from __future__ import annotations

from typing import Mapping, Sequence

from ..cost.target import Target
from ..families.base import Cost, Group, KernelFamily, Schedule
from ..families.fused import FusedFamily
from ..families.library import LibraryFamily
from ..families.opaque import OpaqueFamily
from ..ir.dtypes import TensorType
from .candidates import Candidate

FAMILIES: tuple[KernelFamily, ...] = (OpaqueFamily(), LibraryFamily(), FusedFamily())


class Coster:
    """Best (cost, schedule) of a prim group on a target, memoized by group structure."""

    def __init__(self, types: Mapping[str, TensorType], target: Target,
                 families: Sequence[KernelFamily] = FAMILIES):
        self.types = types
        self.target = target
        self.families = tuple(families)
        self._memo: dict[tuple, tuple[Cost, Schedule] | None] = {}

    def best(self, cand: Candidate) -> tuple[Cost, Schedule] | None:
        key = (cand.names, cand.outputs)
        if key in self._memo:
            return self._memo[key]
        group = Group(cand.prims, cand.inputs, cand.outputs, self.types)
        best = None
        for fam in self.families:
            sched = fam.schedule(group, self.target)
            if sched is None:
                continue
            cost = fam.cost(sched, self.target)
            if best is None or cost.seconds < best[0].seconds:
                best = (cost, sched)
        self._memo[key] = best
        return best

    def __call__(self, cand: Candidate) -> float | None:
        got = self.best(cand)
        return None if got is None else got[0].seconds
