"""The opaque family: one opaque prim (TopK indices, scatter, ...) run through torch; never fused."""
from __future__ import annotations

from ..analysis.classify import Category
from ..cost.model import Resources, Work
from ..cost.target import Target
from ..ir.opaque import COLLECTIVES
from .base import Built, Family, Group, Schedule

SORT_PASSES = 3      # a sort-like torch kernel reads its data a few times (modelling assumption)


class OpaqueFamily(Family):
    name = "opaque"

    def build(self, schedule: Schedule, name: str) -> Built:
        from ..ir.evaluate import eval_prim
        (prim,) = schedule.group.prims

        def run(ins, outs):
            outs[0].copy_(eval_prim(prim, ins))
        desc = f"# {name}: opaque kernel (tilefuse), torch: {prim.body}\n# implements: {prim.origin}\n"
        return Built(name, self.name, tuple(prim.inputs), (prim.name,), run, desc, "torch")

    def schedules(self, group: Group, target: Target) -> list[Schedule]:
        if len(group.prims) != 1 or group.categories[0] is not Category.opaque \
                or group.prims[0].body.fn in COLLECTIVES:        # the collective family's
            return []
        p = group.prims[0]
        nbytes = sum(group.types[t].nbytes for t in dict.fromkeys(p.inputs)) + p.out.nbytes
        programs = target.sm_count * 4
        work = Work(programs, SORT_PASSES * nbytes, SORT_PASSES * nbytes, 0, 1.0,
                    inflight_bytes=16 * 1024, res=Resources(4))
        return [Schedule("opaque", group, programs, work)]
