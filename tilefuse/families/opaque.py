"""The opaque family: one opaque prim (TopK indices, scatter, ...) run through torch; never fused."""
from __future__ import annotations

from ..analysis.classify import Category
from ..cost.model import kernel_seconds
from ..cost.target import Target
from .base import Cost, Group, Schedule


class OpaqueFamily:
    name = "opaque"

    def schedule(self, group: Group, target: Target) -> Schedule | None:
        if len(group.prims) != 1 or group.categories[0] is not Category.opaque:
            return None
        return Schedule("opaque", group, target.sm_count)

    def cost(self, sched: Schedule, target: Target) -> Cost:
        p = sched.group.prims[0]
        nbytes = sum(sched.group.types[t].nbytes for t in dict.fromkeys(p.inputs)) + p.out.nbytes
        # A sort-like pass reads its input a few times; 3x is a modelling assumption.
        return Cost(kernel_seconds(3 * nbytes, 0, 1.0, sched.blocks, target), nbytes, 0, sched.blocks)
