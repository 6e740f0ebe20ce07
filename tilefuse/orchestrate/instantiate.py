"""A plan made at one size of a program, carried to the same program at another size.

Planning (segments, candidates, the BLP) is what makes a compile take seconds; the program at
another sequence length or key length usually has the same prims under the same names, reading
the same tensors, with only shapes, extents and a few index constants (a concat's offset)
different.  ``instantiate`` keeps the template's decisions — which prims form each kernel, what
each kernel writes, which family builds it, its tiles where the family offers them at the new
size (else the family's best there) — and re-costs each kernel's group at the new size.  Where the program is not the same (a prim missing or reading other
tensors, a family that cannot build the group at this size) it raises ``PlanMismatch``, naming
the prim, and the caller plans the size on its own.

Correctness does not rest on the template: each kernel is built by its family from the new
graph's prims (which checks legality again), and the plan is validated (every tensor written
before it is read).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from ..errors import TilefuseError
from ..ir.prim import PrimGraph
from .candidates import Candidate
from .costing import Coster
from .plan import Plan, PlannedKernel


class PlanMismatch(TilefuseError):
    """The program at this size is not the one the template was planned on."""


@dataclass(frozen=True)
class PlanTemplate:
    """A plan and how its graph was made, to be carried to other sizes of the same program; with
    ``generics``, each kernel's size-generic source (``codegen/triton/generic.py``) over the
    symbols ``generic_over`` (moving together), the other symbols at ``generic_fixed``."""
    plan: Plan
    rewrites: tuple[str, ...]             # the rewrites it was planned on (``api.choose_graph``)
    strategy: str
    sizes: Mapping[str, int] = field(default_factory=dict)   # symbol -> the size it was planned at
    generics: tuple = ()                  # per planned kernel: a Generic or None
    generic_over: tuple[str, ...] = ()
    generic_fixed: Mapping[str, int] = field(default_factory=dict)
    # the runs its plan launched as persistent kernels (their binaries checked on the target when it
    # was planned): carried to other sizes as they are (``persistence.persistent_plan``)
    persistent: tuple = ()

    def generic_size(self, sizes: Mapping[str, int] | None) -> int | None:
        """The size the generic sources take at ``sizes`` (symbol -> size), or None where they do
        not serve it (the symbols they are over differ, or another symbol is elsewhere)."""
        if not self.generics or not sizes:
            return None
        values = {sizes.get(s) for s in self.generic_over}
        if len(values) != 1 or any(sizes.get(s) != n for s, n in self.generic_fixed.items()):
            return None
        return values.pop()


def instantiate(template: PlanTemplate, pg: PrimGraph, coster: Coster) -> Plan:
    """``template``'s kernels on ``pg``, each costed at ``pg``'s sizes (``coster``, made for ``pg``)
    with its family's best schedule there; ``PlanMismatch`` where ``pg`` is another program."""
    old = template.plan
    sources = frozenset(d.name for d in pg.inputs) | frozenset(c.name for c in pg.constants)
    if sources != old.sources or tuple(pg.outputs) != old.outputs:
        raise PlanMismatch(f"the graph's inputs and outputs differ from the template's "
                           f"({sorted(sources ^ old.sources) or 'outputs'})")
    prims = {p.name: p for p in pg.prims}
    kernels = []
    for k in old.kernels:
        cand = _candidate(k.candidate, prims)
        family = k.schedule.family
        options = [cs for cs in coster.options(cand) if cs[1].family == family]
        if not options:
            raise PlanMismatch(f"the {family} family cannot build kernel [{', '.join(cand.names)}] "
                               f"({cand.prims[0].origin.op} '{cand.prims[0].origin.name}') at these sizes")
        # the template's tiles where the family offers them here (one compiled kernel can then
        # serve the bucket), else the family's best
        same = [cs for cs in options if cs[1].tile_key() == k.schedule.tile_key()]
        cost, sched = (same or options)[0]
        kernels.append(PlannedKernel(cand, cost.seconds, k.segment, sched))
    plan = Plan(tuple(kernels), sources, old.outputs,
                dict(old.solver, status="instantiated", seconds=0.0, num_candidates=0, time_limit_cut=[]))
    plan.validate()
    return plan


def _candidate(c: Candidate, prims: Mapping) -> Candidate:
    """The template's candidate over the new graph's prims of the same names."""
    new = []
    for name, p in zip(c.names, c.prims):
        q = prims.get(name)
        if q is None:
            raise PlanMismatch(f"prim {name} ({p.origin.op} '{p.origin.name}') is not in the graph at these sizes")
        if q.inputs != p.inputs or q.out.rank != p.out.rank or q.out.dtype != p.out.dtype \
                or (q.reduce is None) != (p.reduce is None) or q.origin != p.origin:
            raise PlanMismatch(f"prim {name} ({p.origin.op} '{p.origin.name}') differs at these sizes: "
                               f"it reads {list(q.inputs)} as {q.out} (the template: {list(p.inputs)} as {p.out})")
        new.append(q)
    return replace(c, prims=tuple(new))
