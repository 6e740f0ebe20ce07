"""The traffic audit: the bytes a plan's generated kernels really move, against the model.

Each generated kernel of a compiled model runs alone under Triton's interpreter (on this machine,
whatever the plan's target) with ``count_traffic`` open, on the values its inputs take when the
model runs on example inputs (computed by the reference executor, so gathers read the rows real
token ids select), or on sample inputs (the weights, random activations, zero indices).  The counted bytes (the distinct 32-byte sectors each executed load and store touches under its
mask, times 32: what the memory system moves) are compared with the bytes the cost model charged
the kernel's schedule before any cache credit (``Work.requested_bytes``: every load the schedule
issues, loop by loop, over the box it covers, rounded to coalesced segments, plus every store).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..ir.evaluate import eval_prim
from ..ir.samples import allocate, sample_io
from .traffic_counter import count_traffic


@dataclass(frozen=True)
class KernelTraffic:
    index: int               # position in the plan
    name: str
    counted_bytes: int       # what the kernel's loads and stores moved under the interpreter, in the
                             # 32-byte sectors each operation touches (a broadcast element is one)
    element_bytes: int       # the same in elements rather than sectors
    modelled_bytes: int      # what the cost model charged its schedule, before cache credit
    loads: int               # load operations executed (all programs)
    stores: int

    @property
    def ratio(self) -> float:
        return self.counted_bytes / self.modelled_bytes if self.modelled_bytes else float("inf")


def audit_traffic(compiled, *example_args) -> list[KernelTraffic]:
    """Counted vs modelled bytes of every generated (Triton) kernel of ``compiled``, plan order;
    ``example_args``: the model's inputs (as for calling it), else sample inputs."""
    pg = compiled.primgraph
    values = None
    if example_args:
        feeds = dict(zip(compiled.input_names, compiled.imported.flatten_inputs(example_args, {})))
        values = {c.name: c.data for c in pg.constants} | {n: t.cpu() for n, t in feeds.items()}
        for p in pg.prims:
            values[p.name] = eval_prim(p, [values[n] for n in p.inputs])
    out = []
    cpu = torch.device("cpu")
    for i, (k, built) in enumerate(zip(compiled.plan.kernels, compiled.kernels)):
        if built.language != "triton":
            continue
        ins, outs = sample_io(built, pg, cpu)
        if values is not None:
            ins = [values[n] for n in built.inputs]
        with count_traffic() as t:
            built.run(ins, outs + allocate(built.scratch, cpu))
        out.append(KernelTraffic(i, built.name, t.sector_bytes, t.distinct_bytes, int(k.schedule.requested_bytes()),
                                 t.loads, t.stores))
    return out
