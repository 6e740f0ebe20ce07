"""The collective family: one torch.distributed collective (all-reduce, all-gather, reduce-scatter,
all-to-all) as a library kernel, costed by the target's interconnect; never fused.

A ring collective over ``n`` ranks moves ``(n - 1) / n`` of the data across each rank's link per
pass, and an all-reduce makes two passes (reduce-scatter, then all-gather): time = launch + the
link's latency + passes x (n - 1) / n x bytes / link bandwidth, with ``bytes`` the larger of the
collective's input and output (NCCL's "bus bandwidth" accounting).  A built collective can be
issued without waiting (``Built.start``): the runtime waits just before the first kernel that
reads its result, so the kernels planned between overlap it (``orchestrate/overlap.py``); the
modelled plan still adds its time to theirs.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..analysis.classify import Category
from ..cost.model import Resources, Work
from ..cost.target import Target
from ..ir.opaque import COLLECTIVES, ISSUE, wait
from .base import Built, Cost, Group, Schedule
from .opaque import OpaqueFamily


@dataclass(frozen=True)
class CollectiveSchedule(Schedule):
    moved_bytes: int = field(default=0, kw_only=True)    # what crosses the link, per pass

    def tile_key(self) -> tuple:
        return (self.moved_bytes,)


PASSES = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1, "all_to_all": 1}


def collective_fn(group: Group) -> str | None:
    """The collective a one-prim group runs, if it is one."""
    if len(group.prims) != 1 or group.categories[0] is not Category.opaque:
        return None
    fn = group.prims[0].body.fn
    return fn if fn in COLLECTIVES else None


class CollectiveFamily(OpaqueFamily):
    name = "collective"

    def schedules(self, group: Group, target: Target) -> list[Schedule]:
        if collective_fn(group) is None:
            return []
        p = group.prims[0]
        moved = max(group.types[p.inputs[0]].nbytes, p.out.nbytes)
        local = group.types[p.inputs[0]].nbytes + p.out.nbytes      # read and written on this GPU
        work = Work(1, local, local, 0, 1.0, inflight_bytes=0.0, res=Resources(1))
        return [CollectiveSchedule(self.name, group, 1, work, moved_bytes=moved)]

    def build(self, schedule: Schedule, name: str) -> Built:
        built = super().build(schedule, name)
        p = schedule.group.prims[0]
        attrs = dict(p.body.attrs)
        desc = (f"# {name}: collective kernel (tilefuse): torch.distributed {p.body.fn} over process group "
                f"{attrs['group']!r} ({attrs['group_size']} ranks), issued without waiting; waited for before "
                f"the first kernel reading its result\n# implements: {p.origin}\n")
        issue = ISSUE[p.body.fn]

        def start(ins, outs):
            result = issue(ins[0], **attrs)

            def finish():
                outs[0].copy_(wait(result))
            return finish
        return replace(built, source=desc, start=start)

    def cost(self, schedule: Schedule, target: Target, cuda_graph: bool = False) -> Cost:
        p = schedule.group.prims[0]
        n = int(dict(p.body.attrs)["group_size"])
        share = (n - 1) / n if n > 1 else 0.0
        link = schedule.moved_bytes * PASSES[p.body.fn] * share / target.link_bw if target.link_bw else 0.0
        seconds = target.launch(cuda_graph) + (target.link_latency_s if n > 1 else 0.0) + link
        return Cost(seconds, int(schedule.work.dram_bytes), 0, 1, bound="link")
