"""The opaque family: one opaque prim (TopK indices, scatter, ...) run through torch; never fused."""
from __future__ import annotations

from ..analysis.classify import Category
from ..cost.model import Resources, Work
from ..cost.target import Target
from ..ir.opaque import COLLECTIVES
from .base import Built, Family, Group, Schedule, holding

SORT_PASSES = 3      # a sort-like torch kernel reads its data a few times (modelling assumption)


class OpaqueFamily(Family):
    name = "opaque"

    def build(self, schedule: Schedule, name: str) -> Built:
        from ..ir.evaluate import eval_prim
        (prim,) = schedule.group.prims
        desc = f"# {name}: opaque kernel (tilefuse), torch: {prim.body}\n# implements: {prim.origin}\n"
        if _in_place(prim):
            return Built(name, self.name, tuple(prim.inputs), (prim.name,), _index_put_run(prim), desc, "torch",
                         inplace=True)

        def run(ins, outs):
            outs[0].copy_(eval_prim(prim, ins))
        return Built(name, self.name, tuple(prim.inputs), (prim.name,), run, desc, "torch")

    def schedules(self, group: Group, target: Target) -> list[Schedule]:
        if len(group.prims) != 1 or group.categories[0] is not Category.opaque \
                or group.prims[0].body.fn in COLLECTIVES:        # the collective family's
            return []
        p = group.prims[0]
        programs = target.sm_count * 4
        if _in_place(p):    # written into its input's memory: the values read, their rows written
            nbytes = 2 * sum(group.types[t].nbytes for t in dict.fromkeys(p.inputs[1:]))
        else:
            nbytes = SORT_PASSES * (sum(group.types[t].nbytes for t in dict.fromkeys(p.inputs)) + p.out.nbytes)
        work = Work(programs, nbytes, nbytes, 0, 1.0, inflight_bytes=16 * 1024, res=Resources(4))
        return [Schedule("opaque", group, programs, work)]


def _in_place(prim) -> bool:
    return prim.body.fn == "index_put" and dict(prim.body.attrs).get("inplace", False)


def _index_put_run(prim):
    """The launcher of an in-place ``index_put``: where the runtime gave it its input's memory as
    its output (``Built.inplace``; ``runtime/executor.py``) it writes only the indexed rows, else it
    copies the input first.  MODELLED as the in-place write."""
    import torch

    from ..ir.opaque import index_list
    dims = tuple(dict(prim.body.attrs)["dims"])

    def run(ins, outs):
        data, values, *indices = ins
        out = holding(data, outs[0])
        torch.ops.aten.index_put_.default(out, index_list(out.dim(), dims, indices), values.to(out.dtype))
    return run
