"""Costing candidates with the kernel families: the ``cost_fn`` the orchestrator calls.

Every family proposes its top schedules for a group (most reject it at once); each is timed by
the cost model as the plan will run (per-launch, or as a node of a CUDA graph) and the fastest
wins.  A measured time (``cost/measure.py``) overrides the model for the schedule it was measured
on.  Results are memoized per candidate, so the plan's kernels carry the schedule they were costed
with.  The time the planner asks for (``__call__``) is memoized by the candidate's structure too
(``candidates.structure``): a repeated layer's candidates are costed once, the schedules only for
what a plan keeps.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Sequence

from ..cost.target import Target
from ..families import FAMILIES, Cost, Group, KernelFamily, Schedule
from ..ir.dtypes import TensorType
from .candidates import Candidate, structure


class Coster:
    """Best (cost, schedule) of a prim group on a target, memoized by group structure.

    ``measured`` maps a schedule's ``key()`` to measured seconds; those schedules are costed at
    their measured time (plus nothing: a measured time includes what the model calls launch).
    ``grounded`` maps a schedule's key to its modelled cost with the compiled binary's resources
    and tensor-core path (``tilefuse/native.py: ground``); still modelled, not measured.
    """

    def __init__(self, types: Mapping[str, TensorType], target: Target,
                 families: Sequence[KernelFamily] = FAMILIES, *, cuda_graph: bool = False,
                 measured: Mapping[str, float] | None = None, grounded: Mapping[str, Cost] | None = None,
                 seconds: dict | None = None):
        self.types = types
        self.target = target
        self.families = tuple(families)
        self._by_name = {f.name: f for f in self.families}
        self.cuda_graph = cuda_graph
        self.measured = dict(measured or {})
        self.grounded = grounded or {}        # schedule key -> its cost from its compiled binary
        self._options: dict[tuple, list[tuple[Cost, Schedule]]] = {}
        self._adopted: dict[int, tuple[Cost, Schedule]] = {}
        # structure -> the best time; ``seconds`` shares it with another Coster of the same
        # target, launch mode, measured and grounded times (a rewrite of the same graph)
        self._seconds: dict[tuple, float | None] = {} if seconds is None else seconds

    def options(self, cand: Candidate) -> list[tuple[Cost, Schedule]]:
        """Every family's top schedules for the candidate, each costed: the fastest family's
        first, in the family's order (by measured time once any of them is measured)."""
        key = (cand.names, cand.outputs)
        got = self._options.get(key)
        if got is None:
            group = Group(cand.prims, cand.inputs, cand.outputs, self.types)
            ranked = []
            for fam in self.families:
                costed = self._calibrated(fam.schedules(group, self.target))
                if costed:
                    # a family's own order stands (its ties are broken by simplicity), unless a
                    # measured time or a binary says otherwise; families compete by their first
                    costed.sort(key=lambda cs: cs[0].seconds if self._informed(costed) else 0)
                    ranked.append(costed)
            ranked.sort(key=lambda opts: opts[0][0].seconds)
            got = [cs for opts in ranked for cs in opts]
            self._options[key] = got
        return got

    def _informed(self, costed) -> bool:
        return any(c.measured for c, _ in costed) or bool(self.grounded) and any(
            s.key() in self.grounded for _, s in costed)

    def _calibrated(self, scheds: list[Schedule]) -> list[tuple[Cost, Schedule]]:
        """A family's schedules of one group, costed.  Where some were measured, the others'
        modelled times are scaled by how far the model was off for their measured siblings (the
        median ratio), so an alternative tiling of a kernel the device found slow is not taken
        for fast."""
        costed = [(self.cost(s), s) for s in scheds]
        ratios = sorted(c.seconds / self._modelled(s).seconds for c, s in costed if c.measured)
        if not ratios or len(ratios) == len(costed):
            return costed
        r = ratios[len(ratios) // 2]
        return [(cs if cs[0].measured else (replace(cs[0], seconds=cs[0].seconds * r), cs[1])) for cs in costed]

    def _modelled(self, sched: Schedule) -> Cost:
        got = self.grounded.get(sched.key()) if self.grounded else None
        return got if got is not None else self._by_name[sched.family].cost(sched, self.target, self.cuda_graph)

    def cost(self, sched: Schedule) -> Cost:
        cost = self._modelled(sched)
        seconds = self.measured.get(sched.key()) if self.measured else None   # key() hashes the group
        return cost if seconds is None else replace(cost, seconds=seconds, measured=True)

    def adopt(self, sched: Schedule) -> Cost:
        """Cost a schedule that is not among its candidate's options (one re-tiled as a phase of a
        persistent kernel) and remember it, so ``adopted`` answers for a kernel planned with it."""
        cost = self.cost(sched)
        self._adopted[id(sched)] = (cost, sched)      # (the schedule kept alive: its id stays its own)
        return cost

    def adopted(self, sched: Schedule) -> tuple[Cost, Schedule] | None:
        return self._adopted.get(id(sched))

    def best(self, cand: Candidate) -> tuple[Cost, Schedule] | None:
        opts = self.options(cand)
        return opts[0] if opts else None

    def __call__(self, cand: Candidate) -> float | None:
        """The candidate's best time (None: no family builds it), one structure costed once
        (measured and grounded times are keyed by structure too: ``Schedule.key``)."""
        key = structure(cand, self.types)
        if key not in self._seconds:
            got = self.best(cand)
            self._seconds[key] = None if got is None else got[0].seconds
        return self._seconds[key]

