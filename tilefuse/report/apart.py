"""Why two kernels are apart: for each kernel that reads what another kernel of the plan wrote,
what kept the two from being one kernel (issue #23, "why not fused").

The answers, in the order they are checked:

- ``segment``: the planner cuts the prim graph into segments (a bounded number of prims each, so
  that enumerating candidate kernels stays tractable: ``orchestrate/segment.py``) and the cut
  falls between the two; no candidate spans a cut;
- ``between``: another kernel reads the producer's output and feeds the consumer, so the two
  alone are not a kernel (a fused kernel must be convex: nothing outside it on a path between its
  members);
- ``family``: no kernel family builds the two as one kernel (the prims' categories are named:
  two contractions that are not a GEMM chain, an opaque call, ...);
- ``cost``: a family builds them as one, and its modelled time is no better than the two apart;
- ``plan``: the fused pair models faster than the pair apart, but the plan's other kernels (one of
  the two fused with a third) save more in all: the solver's optimum over the whole segment.

Times are modelled, for the plan's target and launch mode: the pair apart is the plan's own two
costs (measured, where the plan was measured), the fused pair is costed afresh by asking the
families for its schedules as the planner would (modelled even in a measured plan).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

from ..analysis.classify import classify
from ..orchestrate.candidates import Candidate
from ..orchestrate.costing import Coster


@dataclass(frozen=True)
class Apart:
    producer: int            # kernel index in the plan
    consumer: int
    tensor: str              # a tensor the consumer reads from the producer
    reason: str              # segment | between | family | cost | plan
    detail: str
    fused_us: float | None = None      # the best one-kernel schedule of the pair (modelled)
    apart_us: float | None = None      # the two kernels as planned

    def as_dict(self) -> dict:
        return asdict(self)


def why_apart(compiled) -> list[Apart]:
    """One ``Apart`` per pair of the plan's kernels where the second reads what the first wrote."""
    plan, pg, target = compiled.plan, compiled.primgraph, compiled.target
    kernels = plan.kernels
    coster = Coster(pg.types, target, cuda_graph=compiled.cuda_graph)
    writer = {o: i for i, k in enumerate(kernels) for o in k.outputs}
    consumers: dict[str, set[str]] = {}
    for p in pg.prims:
        for n in p.inputs:
            consumers.setdefault(n, set()).add(p.name)
    out = []
    for j, k2 in enumerate(kernels):
        seen = set()
        for t in k2.inputs:
            i = writer.get(t)
            if i is None or i == j or i in seen:
                continue
            seen.add(i)
            out.append(_pair(i, j, t, kernels, pg, coster, consumers, writer))
    return out


def _pair(i: int, j: int, tensor: str, kernels, pg, coster: Coster, consumers, writer) -> Apart:
    k1, k2 = kernels[i], kernels[j]
    apart = (k1.cost + k2.cost) * 1e6
    if k1.segment != k2.segment:
        return Apart(i, j, tensor, "segment", f"the planner's segment boundary falls between them (segments "
                                              f"{k1.segment} and {k2.segment})", None, apart)
    names = set(k1.candidate.names) | set(k2.candidate.names)
    via = _between(names, consumers, pg)
    if via:
        owner = {n: k for k, kern in enumerate(kernels) for n in kern.candidate.names}
        third = sorted({owner[n] for n in via if n in owner} - {i, j})
        many = len(third) > 1
        return Apart(i, j, tensor, "between", ("kernels " if many else "kernel ") + ", ".join(f"#{k}" for k in third)
                     + (" read" if many else " reads") + f" #{i}'s output and feed{'' if many else 's'} #{j}: a kernel "
                     f"of the two would have to hold {'them' if many else 'it'} too", None, apart)
    cand = _candidate([p for p in pg.prims if p.name in names], pg)
    best = coster.best(cand)
    if best is None:
        cats = Counter(classify(p).value for p in cand.prims)
        return Apart(i, j, tensor, "family", "no kernel family builds them as one kernel (" +
                     ", ".join(f"{n} {c}" for c, n in sorted(cats.items())) + " prims)", None, apart)
    cost, sched = best
    fused = cost.seconds * 1e6
    if fused >= apart:
        return Apart(i, j, tensor, "cost", f"as one {sched.family} kernel it models {fused:.2f} us, apart "
                                           f"{apart:.2f} us", fused, apart)
    return Apart(i, j, tensor, "plan", f"as one {sched.family} kernel it models {fused:.2f} us against "
                                       f"{apart:.2f} us apart, but the plan's other kernels save more in all "
                                       f"(the optimum over their segment)", fused, apart)


def _between(names: set[str], consumers, pg) -> set[str]:
    """Prims outside ``names`` on a path from one of them to another (the set is not convex)."""
    down: set[str] = set()
    work = [c for n in names for c in consumers.get(n, ()) if c not in names]
    while work:
        n = work.pop()
        if n not in down:
            down.add(n)
            work += [c for c in consumers.get(n, ()) if c not in names]
    return {n for n in down if _reaches(n, names, consumers)}


def _reaches(start: str, names: set[str], consumers) -> bool:
    seen, work = set(), [start]
    while work:
        n = work.pop()
        for c in consumers.get(n, ()):
            if c in names:
                return True
            if c not in seen:
                seen.add(c)
                work.append(c)
    return False


def _candidate(prims: list, pg) -> Candidate:
    """The prims as one candidate kernel, writing what is read outside it or is a graph output."""
    inside = {p.name for p in prims}
    readers = {n for p in pg.prims if p.name not in inside for n in p.inputs}
    outputs = tuple(p.name for p in prims if p.name in readers or p.name in pg.outputs)
    inputs = tuple(dict.fromkeys(n for p in prims for n in p.inputs if n not in inside))
    return Candidate(0, 0, tuple(p.name for p in prims), inputs, outputs, tuple(prims))
