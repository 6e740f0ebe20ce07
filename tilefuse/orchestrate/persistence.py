"""Which runs of a plan's kernels are launched as one persistent kernel (issue #25).

A run is a maximal sequence of consecutive kernels whose launches are declared
(``runtime/executor.persistent_runs``); each of its generated kernels is a phase
(``runtime/executor.run_phases``: a split-K GEMM's two kernels are two phases, their workspace
named like any tensor).  Before the kernels are built, ``with_phases`` replaces a library call
between generated kernels by a generated kernel where the joined run simulates faster, and
``as_phases`` re-tiles generated kernels for being phases (no launch to pay); after,
``persistent_plan`` replaces a call still between built runs where the joined run then simulates
faster with its prefetches (``_joined``), re-tiles a built run's prefetched phases where the whole
run then simulates faster (``_warm_tiles``) and takes a run where its simulated schedule (``cost/persistent.py``) models
faster than its kernels launched one by one (``"auto"``; True: every run), and ``settle`` makes a
replaced call a call again where no run took it.  For a GPU target a taken run is compiled for its
architecture and, where its binary spills, needs more shared memory than a block has or does not
compile, cut to its longest first part that does not (the rest tried on its own): no GPU is
needed for that check.  Everything here is MODELLED, except that check, which reads the binary.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Sequence

from ..cost.model import Work, estimate
from ..cost.persistent import Phase, phase_of, simulate
from ..cost.target import Target
from ..families.base import Cost
from ..log import logger
from ..runtime.executor import persistent_runs, run_phases
from .plan import Plan

_log = logger("plan")

# Programs a persistent kernel runs on an SM at most, where its binary's registers and shared
# memory let that many be resident (the launcher keeps the grid within what the binary it launches
# holds: ``compile_persistent``).  One: MEASURED on the H200 (bench/README.md, the fourth GPU
# session), BERT-small's run at two an SM took 150.6 us against 122.5 at one: the hardware put a
# phase of fewer tasks than SMs two to an SM (24 tasks on 17 SMs), so the latency a second program
# was to hide came back as two tasks sharing an SM.  Two (the mechanism stays, for a task order
# that spreads a phase over SMs first) is what the model assumed in session 23.
PER_SM = 1


def with_phases(plan: Plan, coster, scheduled: Callable, tgt: Target, cuda_graph: bool) -> Plan:
    """The plan with a kernel that is not generated (a library call) replaced by its group's
    fastest generated schedule where the kernels around it, then one persistent kernel with it,
    model faster than they do with the call between them (each run at its simulated time or its
    kernels' apart, whichever is less: ``"auto"``'s choice).  Where a launch boundary stays is the
    cost model's decision, not a rule.  MODELLED; task counts are the schedules' grids.
    ``scheduled(k)``: (Cost, schedule) of a planned kernel ``k``; ``coster``: the alternatives."""
    from ..families import generated
    launch, atomic = tgt.launch(cuda_graph), 2 * tgt.l2_latency_s
    breaks = {w for _, w in plan.deferred}
    kernels = list(plan.kernels)
    swapped = False

    def run_time(ks: list[int]) -> float:
        apart = sum(kernels[k].cost for k in ks)
        if len(ks) < 2:
            return apart
        # without prefetches (what the built kernels would prefetch is not known yet): the run
        # at its slower figure, so a call is replaced only where that already pays
        phases = [p for k in ks for p in _planned(kernels[k], scheduled, launch, tgt, cuda_graph)]
        return min(apart, launch + simulate(phases, tgt.sm_count, atomic))

    def side(k: int, step: int) -> list[int]:
        out, j = [], k + step
        while 0 <= j < len(kernels) and generated(kernels[j].schedule) and (j if step > 0 else j + 1) not in breaks:
            out.append(j)
            j += step
        return out[::step]

    for k, pk in enumerate(kernels):
        if generated(pk.schedule):
            continue
        alt = next(((c, s) for c, s in coster.options(pk.candidate) if generated(s)), None)
        left = side(k, -1) if k not in breaks else []
        right = side(k, 1) if k + 1 not in breaks else []
        if alt is None or not (left or right):
            continue
        before = run_time(left) + pk.cost + run_time(right)
        kernels[k] = replace(pk, schedule=alt[1], cost=alt[0].seconds)
        if run_time(left + [k] + right) < before:
            swapped = True
            _log.info("persistent: %s as a generated kernel (%s) joins the kernels around it",
                      pk.candidate.names[0], alt[1].family)
        else:
            kernels[k] = pk
    return replace(plan, kernels=tuple(kernels)) if swapped else plan     # (a schedule is not compared)


def as_phases(plan: Plan, coster, scheduled: Callable, tgt: Target, cuda_graph: bool) -> Plan:
    """The plan with each generated kernel next to another re-tiled for being a phase: a phase pays
    a barrier (a posted release and the acquire that sees it), not a launch, so a schedule of
    more kernels or more programs (split-K whose reduction is a second kernel) can be the faster
    phase where it was the slower kernel.  Each kernel's family ranks its schedules on the target
    with a phase boundary's cost for a launch; one replaces the planned schedule where the kernel
    with its neighbours simulates faster with it (each one tried is ``coster.adopt``-ed: costed on
    the target, what ``scheduled`` answers for it).  ``settle`` puts back the planned schedule
    where no run took the kernel.  MODELLED."""
    from ..families import generated
    launch, atomic = tgt.launch(cuda_graph), 2 * tgt.l2_latency_s
    as_phase = _phase_coster(coster, tgt, cuda_graph)
    breaks = {w for _, w in plan.deferred}
    kernels = list(plan.kernels)

    def span(ks: list[int]) -> float:
        return simulate([p for k in ks for p in _planned(kernels[k], scheduled, launch, tgt, cuda_graph)],
                        tgt.sm_count, atomic)

    for k, pk in enumerate(kernels):
        if not generated(pk.schedule):
            continue
        near = ([k - 1] if k and k not in breaks and generated(kernels[k - 1].schedule) else []) + [k] + \
            ([k + 1] if k + 1 < len(kernels) and k + 1 not in breaks and generated(kernels[k + 1].schedule) else [])
        if len(near) < 2:
            continue
        best, fastest = pk, span(near)
        for _, s in as_phase.options(pk.candidate):
            if not generated(s) or s.key() == pk.schedule.key():
                continue
            cost = coster.adopt(s)
            kernels[k] = replace(pk, schedule=s, cost=cost.seconds)
            t = span(near)
            if t < fastest:
                best, fastest = kernels[k], t
        kernels[k] = best
        if best is not pk:
            _log.info("persistent: %s re-tiled as a phase (%s)", pk.candidate.names[0], best.schedule.family)
    return replace(plan, kernels=tuple(kernels))


def _warm_body(schedule, tgt: Target) -> float:
    """A schedule's modelled body (seconds, its kernels') with every DRAM byte it reads in L2."""
    return sum(estimate(replace(w, dram_bytes=w.dram_stored), tgt).body for w in (schedule.work, *schedule.then))


def _phase_coster(coster, tgt: Target, cuda_graph: bool):
    """A ``Coster`` ranking schedules as phases: a phase boundary's cost (a posted release and the
    acquire that sees it) in place of a launch."""
    from .costing import Coster
    boundary = 1.5 * 2 * tgt.l2_latency_s
    return Coster(coster.types, replace(tgt, launch_s=boundary, launch_graph_s=boundary), cuda_graph=cuda_graph)


def settle(plan: Plan, phased: Plan, kernels: Sequence, runs, prims) -> tuple[Plan, list]:
    """(the plan, its built kernels) once the runs are chosen: a kernel ``with_phases`` made
    generated or ``as_phases`` re-tiled that no run launched as one is what it was (the library
    call, the planned tiles: rebuilt in its place, named as the plan names it)."""
    from ..codegen import kernel_names
    from ..families import build
    inside = {k for i, j in runs for k in range(i, j)}
    back = [k for k, (was, now) in enumerate(zip(plan.kernels, phased.kernels))
            if was.schedule is not now.schedule and k not in inside]
    if not back:
        return phased, list(kernels)
    chosen = [plan.kernels[k] if k in back else pk for k, pk in enumerate(phased.kernels)]
    names = kernel_names([pk.schedule for pk in chosen], prims)
    out = [build(chosen[k].schedule, names[k]) if k in back else b for k, b in enumerate(kernels)]
    return replace(phased, kernels=tuple(chosen)), out


def persistent_plan(plan: Plan, kernels: Sequence, scheduled: Callable, tgt: Target, cuda_graph: bool, mode,
                    types, carried: Sequence | None = None, coster=None) -> tuple[Plan, list, list[tuple[int, int]], list[dict]]:
    """(the plan, its built kernels, the runs launched as persistent kernels, a report row per
    candidate run); ``scheduled(k)``: (Cost, schedule) of the plan's kernel ``k``; ``carried``: the
    runs of the plan this one was carried from (a bucket's): the candidates, their binaries not
    compiled again (the same kernels at another size: the same tiles, so the same registers and
    shared memory).  With ``coster`` (a GPU target, not carried), a run's prefetched phases are
    re-tiled where the run then simulates faster (``_warm_tiles``): the plan and kernels returned
    have them."""
    chosen, rows = [], []
    kernels = list(kernels)
    retile = coster is not None and carried is None and bool(tgt.arch)
    as_phase = _phase_coster(coster, tgt, cuda_graph) if retile else None
    if retile and mode == "auto":
        plan, kernels = _joined(plan, kernels, coster, scheduled, tgt, cuda_graph)
    todo = list(persistent_runs(kernels, {w for _, w in plan.deferred}))
    if carried is not None:
        todo = [(i, j) for i, j in carried if any(a <= i and j <= b for a, b in todo)]
    while todo:
        i, j = todo.pop(0)
        run = _simulated(plan, kernels, i, j, scheduled, tgt, cuda_graph)
        if retile:
            plan, kernels, run = _warm_tiles(plan, kernels, i, j, run, coster, as_phase, scheduled, tgt, cuda_graph)
        phases, waits, names, apart, merged = run
        take = mode is True or merged < apart
        per_sm, maxnreg = 1, None
        if tgt.arch and carried is None and (take or PER_SM > 1):
            binary = _binary(kernels, i, j, types, tgt)
            if binary is None and take:
                # compiled for the GPU, the run spills, overflows shared memory or does not
                # compile: its longest first part that does not, then the rest
                m = _longest_fit(kernels, i, j, types, tgt)
                todo[:0] = [r for r in ((i, m), (m if m > i else i + 1, j)) if r[1] - r[0] >= 2]
                continue
            from ..native import binary_occupancy
            if binary is not None and binary_occupancy(binary, tgt) < PER_SM:
                binary, maxnreg = _capped(binary, kernels, i, j, types, tgt)
            per_sm = min(PER_SM, binary_occupancy(binary, tgt)) if binary is not None else 1
            if per_sm > 1:      # its tasks' latencies overlap two a SM: simulated so
                phases, waits, names, apart, merged = run = _simulated(plan, kernels, i, j, scheduled, tgt, cuda_graph,
                                                                       per_sm)
                take = mode is True or merged < apart
        rows.append({"kernels": [b.name for b in kernels[i:j]], "first": i, "programs": per_sm * tgt.sm_count,
                     "per_sm": per_sm, "maxnreg": maxnreg if per_sm > 1 else None,
                     "phases": [_row(n, p) for n, p in zip(names, phases)],
                     "dram_rate": tgt.dram_rate if tgt.arch else 0.0,
                     # what each phase waits for: every task of an earlier phase (a barrier), or
                     # the tasks of it whose tiles its own touch (per task: at most "tasks" of them)
                     "edges": sorted([{"from": d, "to": p, "kind": "phase barrier"}
                                      for p, a in enumerate(waits.after) for d in a]
                                     + [{"from": d, "to": p, "kind": "tile", "tasks": max(map(len, per))}
                                        for p, m in enumerate(waits.tiles) for d, per in m.items()],
                                     key=lambda e: (e["to"], e["from"])),
                     "tasks": sum(p.tasks for p in phases), "atomic_us": round(2 * tgt.l2_latency_s * 1e6, 4),
                     "apart_us": round(apart * 1e6, 3), "persistent_us": round(merged * 1e6, 3),
                     "launched_as_one": take})
        if take:
            chosen.append((i, j))
    return plan, kernels, chosen, rows


def _joined(plan: Plan, kernels: list, coster, scheduled: Callable, tgt: Target, cuda_graph: bool) -> tuple[Plan, list]:
    """(plan, kernels) with each call between runs of built kernels (a library or torch call that
    ``with_phases`` kept: it judged the joined run without the prefetches the built kernels make)
    replaced by its group's fastest generated schedule, built, where the one run it then joins
    simulates faster (``_simulated``, prefetches included) than the runs beside it and the call,
    each run at its simulated time or its kernels' apart, whichever is less (``"auto"``'s choice).
    ``settle`` makes it a call again where no run takes it.  MODELLED."""
    from ..families import build, generated
    breaks = {w for _, w in plan.deferred}
    taken, named = {b.name for b in kernels}, {}

    def name_of(old: str, sched) -> str:
        """The call's name under its new family's prefix (``kernel_names``' form), one per
        schedule key, unique among the plan's (reserved once a replacement is kept)."""
        if sched.key() in named:
            return named[sched.key()]
        base = sched.family + old[old.index("_"):] if "_" in old else f"{sched.family}_{old}"
        name, n = base, 1
        while name in taken:
            n += 1
            name = f"{base}_{n}"
        return name

    def run_s(p: Plan, ks: list, i: int, j: int) -> float:
        if j - i < 2:
            return sum(pk.cost for pk in p.kernels[i:j])
        _, _, _, apart, merged = _simulated(p, ks, i, j, scheduled, tgt, cuda_graph)
        return min(apart, merged)

    for k, pk in enumerate(plan.kernels):
        if generated(pk.schedule) or k in breaks or k + 1 in breaks or \
                not any(0 <= n < len(kernels) and kernels[n].launches is not None for n in (k - 1, k + 1)):
            continue        # (a call with no phase beside it joins nothing)
        alt = next(((c, s) for c, s in coster.options(pk.candidate) if generated(s)), None)
        if alt is None:
            continue
        b = build(alt[1], name_of(kernels[k].name, alt[1]))
        tried = replace(plan, kernels=plan.kernels[:k] + (replace(pk, schedule=alt[1], cost=alt[0].seconds),)
                        + plan.kernels[k + 1:])
        built = kernels[:k] + [b] + kernels[k + 1:]
        run = next(((i, j) for i, j in persistent_runs(built, breaks) if i <= k < j), None)
        if run is None:
            continue
        i, j = run
        if run_s(tried, built, i, j) < run_s(plan, kernels, i, k) + pk.cost + run_s(plan, kernels, k + 1, j):
            _log.info("persistent: %s as a generated kernel (%s) joins the runs beside it",
                      pk.candidate.names[0], alt[1].family)
            plan, kernels = tried, built
            taken.add(b.name)
            named[alt[1].key()] = b.name
    return plan, kernels


def _simulated(plan: Plan, kernels: Sequence, i: int, j: int, scheduled: Callable, tgt: Target, cuda_graph: bool,
               per_sm: int = 1):
    """The run ``kernels[i:j]`` as one persistent kernel of ``per_sm`` programs an SM: (its phases
    as simulated, their ``task_dependencies``, the phases' names, the kernels' modelled time apart,
    the persistent kernel's: one launch and the simulated makespan).  A task runs as long as one
    program of its kernel in a wave of that kernel's own launch (``phase_of``), whatever
    ``per_sm`` (``cost/persistent.py`` says where that is an assumption).  MODELLED."""
    from ..codegen.dependencies import task_dependencies
    from ..codegen.triton.persistent import prefetches, resident
    launch, atomic = tgt.launch(cuda_graph), 2 * tgt.l2_latency_s    # an atomic: a round trip to L2
    costs = [scheduled(k)[0] for k in plan.kernels[i:j]]
    tiles, reads, writes, _ = run_phases(kernels, i, j)
    tasks = iter(math.prod(t.grid) for t in tiles)          # the programs each phase launches
    timed = [pw for k, c in zip(plan.kernels[i:j], costs)
             for pw in _phases(c, scheduled(k)[1], tasks, launch, tgt, cuda_graph)]
    if tgt.arch:        # on a GPU: what L2 holds of the run (written before, prefetched)
        partial = {b.outputs[0] for b in kernels[i:j] if b.inplace}     # caches: rows written
        timed = [_less_dram(p, w, got, tgt) for (p, w), got in zip(timed, resident(tiles, reads, writes, partial))]
        phases = _prefetching(timed, prefetches(tiles, reads, writes), tgt)
    else:
        phases = [p for p, _ in timed]
    waits = task_dependencies(tiles, reads, writes)
    starts = [0]
    for p in phases:
        starts.append(starts[-1] + p.tasks)
    phases = [replace(p, after=a, needs=tuple(tuple(starts[d] + u for d, u in per) for per in waits.needs(k))
                      if waits.tiles[k] else ()) for k, (p, a) in enumerate(zip(phases, waits.after))]
    merged = launch + simulate(phases, per_sm * tgt.sm_count, atomic, tgt.dram_rate if tgt.arch else 0.0)
    return phases, waits, [t.name for t in tiles], sum(c.seconds for c in costs), merged


def _warm_tiles(plan: Plan, kernels: list, i: int, j: int, run, coster, as_phase, scheduled: Callable,
                tgt: Target, cuda_graph: bool):
    """(plan, kernels, ``_simulated`` run) with each generated kernel of the run that earlier
    phases prefetch for re-tiled where the whole run then simulates faster: a phase whose weights
    are in L2 is bound by what its programs draw from L2, not by DRAM, so more programs can be the
    faster phase where they were not the faster kernel (those faster with their weights in L2 are
    tried) (``as_phases`` ranks schedules before the
    kernels are built, without the prefetches).  The alternatives are the kernel's family's
    schedules ranked as phases (``as_phase``: ``_phase_coster``); each one tried is built and
    ``coster.adopt``-ed.  MODELLED."""
    from ..families import build, generated
    first = [0]
    for k in range(i, j):           # each kernel's first phase (a split-K GEMM has two)
        first.append(first[-1] + len(kernels[k].kernels))
    for k in range(i, j):
        pk = plan.kernels[k]
        if not generated(pk.schedule) or not run[0][first[k - i]].fetched_bytes:
            continue
        best, warm = (plan, kernels, run), _warm_body(pk.schedule, tgt)
        for _, s in as_phase.options(pk.candidate):
            # (one no faster with its weights in L2 cannot make the run faster: not simulated)
            if not generated(s) or s.key() == pk.schedule.key() or _warm_body(s, tgt) >= warm:
                continue
            cost = coster.adopt(s)
            b = build(s, kernels[k].name)
            if len(b.kernels) != len(kernels[k].kernels):     # (the phases' numbering stays)
                continue
            tried = replace(plan, kernels=plan.kernels[:k] + (replace(pk, schedule=s, cost=cost.seconds),)
                            + plan.kernels[k + 1:])
            built = kernels[:k] + [b] + kernels[k + 1:]
            got = _simulated(tried, built, i, j, scheduled, tgt, cuda_graph)
            if got[4] < best[2][4]:
                best = (tried, built, got)
        if best[0] is not plan:
            _log.info("persistent: %s re-tiled as a prefetched phase (%d programs)", kernels[k].name,
                      best[0].kernels[k].schedule.work.programs)
        plan, kernels, run = best
    return plan, kernels, run


def _phases(cost: Cost, schedule, tasks, launch_s: float, tgt: Target, cuda_graph: bool) -> list[tuple[Phase, Work]]:
    """A planned kernel's phases, each with its ``Work``: one per kernel it launches (a split-K
    GEMM's partial products, then their reduction), their modelled times in the proportions of
    their own costs."""
    works = (schedule.work, *schedule.then)
    if len(works) == 1:
        return [(replace(phase_of(cost, launch_s, next(tasks)), dram_bytes=schedule.work.dram_bytes), schedule.work)]
    parts = [Cost.modelled(w, tgt, cuda_graph) for w in works]
    bodies = [max(c.seconds - launch_s, 0.0) for c in parts]
    scale = max(cost.seconds - len(works) * launch_s, 0.0) / max(sum(bodies), 1e-30)
    return [(replace(phase_of(replace(c, seconds=launch_s + b * scale), launch_s, next(tasks)),
                     dram_bytes=w.dram_bytes), w) for c, b, w in zip(parts, bodies, works)]


def _planned(pk, scheduled: Callable, launch_s: float, tgt: Target, cuda_graph: bool) -> list[Phase]:
    """A planned kernel's phases before it is built: its schedules' grids as task counts."""
    cost, s = scheduled(pk)
    tasks = iter(max(int(w.programs), 1) for w in (s.work, *s.then))
    return [p for p, _ in _phases(cost, s, tasks, launch_s, tgt, cuda_graph)]


def _less_dram(phase: Phase, work: Work, nbytes: float, tgt: Target) -> tuple[Phase, Work]:
    """A phase (and its work) with ``nbytes`` of its DRAM bytes read from L2 instead: its time
    scaled as its kernel's modelled body is (the body's fill an L2 round trip once it reads nothing
    from DRAM; what it writes stays DRAM bytes, written back from L2).  MODELLED."""
    got = min(float(nbytes), work.dram_bytes - work.dram_stored)     # (what it writes lands in L2)
    if got <= 0:
        return phase, work
    less = replace(work, dram_bytes=work.dram_bytes - got)
    cold, warm = estimate(work, tgt).body, estimate(less, tgt).body
    return replace(phase, task_s=phase.task_s * warm / cold if cold > 0 else phase.task_s,
                   dram_bytes=less.dram_bytes), less


def _prefetching(timed: list[tuple[Phase, Work]], asks: list, tgt: Target) -> list[Phase]:
    """The phases with the prefetches the persistent kernel makes (``asks[p]``: what phase ``p``
    prefetches, ``codegen/triton/persistent.prefetches``): the asking phase pays for the bytes in
    the DRAM queue; a phase asked for has the bytes fetched for it (the first of its DRAM bytes)
    and a warm time, its cold one scaled as its kernel's modelled body is with every DRAM byte read
    from L2 instead, and the DRAM rate one task draws alone (its bytes in flight over a DRAM round
    trip): its tasks not wholly prefetched read the rest at that rate (``cost/persistent.py``).
    MODELLED."""
    out = [p for p, _ in timed]
    fetched: dict[int, int] = {}
    for p, mine in enumerate(asks):
        if mine:
            to: dict[int, float] = {}
            for f in mine:
                to[f.phase] = to.get(f.phase, 0.0) + f.nbytes
            out[p] = replace(out[p], prefetch_bytes=float(sum(f.nbytes for f in mine)),
                             prefetch_for=tuple(sorted(to.items())))
        for f in mine:
            fetched[f.phase] = fetched.get(f.phase, 0) + f.nbytes
    for q, nbytes in fetched.items():
        phase, work = timed[q]
        hot, _ = _less_dram(phase, work, work.dram_bytes, tgt)
        solo = min(tgt.dram_rate, work.inflight_bytes / tgt.dram_latency_s) if tgt.dram_latency_s else 0.0
        out[q] = replace(out[q], warm_s=hot.task_s, fetched_bytes=float(min(nbytes, phase.dram_bytes)),
                         solo_rate=solo)
    return out


def _row(kernel: str, p: Phase) -> dict:
    """A phase as the report records it (enough to redraw its schedule: ``report/gantt.py``)."""
    row = {"kernel": kernel, "tasks": p.tasks, "task_us": round(p.task_s * 1e6, 4), "after": list(p.after or ())}
    if p.needs:     # per task, the earlier tasks it waits for alone as [first, last] runs
        row["needs"] = [_runs(n) for n in p.needs]
    if p.warm_s is not None:
        row["warm_us"] = round(p.warm_s * 1e6, 4)
    if p.prefetch_bytes:
        row["prefetch_bytes"] = int(p.prefetch_bytes)
        row["prefetch_for"] = [[q, int(nbytes)] for q, nbytes in p.prefetch_for]
    if p.dram_bytes:
        row["dram_bytes"] = int(p.dram_bytes)
    if p.fetched_bytes:
        row["fetched_bytes"] = int(p.fetched_bytes)
    if p.solo_rate:
        row["solo_rate"] = p.solo_rate
    return row


def _runs(ids) -> list[list[int]]:
    """Sorted task indices as ``[first, last]`` runs of consecutive ones (a row block's tasks are
    one run: the report stays small; ``report/gantt.timeline`` expands them)."""
    out: list[list[int]] = []
    for u in ids:
        if out and out[-1][1] == u - 1:
            out[-1][1] = u
        else:
            out.append([u, u])
    return out


def _longest_fit(kernels: Sequence, i: int, j: int, types, tgt: Target) -> int:
    """The largest ``m`` in ``[i + 2, j)`` where the run ``kernels[i:m]`` fits (``unfit`` is
    false), found by bisection (a longer prefix needs at least what a shorter one does); ``i``
    where none does."""
    lo, hi = i + 1, j              # kernels[i:lo] fits (one kernel: launched alone), kernels[i:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if unfit(kernels, i, mid, types, tgt):
            hi = mid
        else:
            lo = mid
    return lo if lo >= i + 2 else i


def unfit(kernels: Sequence, first: int, last: int, types, tgt: Target) -> bool:
    """Whether the persistent kernel of ``kernels[first:last]`` compiled for ``tgt``'s GPU spills
    registers, needs more shared memory than a block may have there, or does not compile: a run is
    launched as one only where its binary is clean (no GPU needed)."""
    return _binary(kernels, first, last, types, tgt) is None


def _capped(binary, kernels: Sequence, first: int, last: int, types, tgt: Target):
    """(binary, register cap): the run's persistent kernel compiled with at most the registers a
    thread that ``PER_SM`` programs an SM leave it (``maxnreg``: 128 at 8 warps) where that binary
    does not spill and holds that many an SM (BERT-base's run: 138 registers at 8 warps, one an
    SM); else the binary as it was, and None."""
    from ..native import binary_occupancy
    threads = binary.num_warps * tgt.warp_size
    cap = min(255, tgt.regs_per_sm // (PER_SM * threads) // 8 * 8)
    if cap >= binary.registers or cap < 32:
        return binary, None
    capped = _binary(kernels, first, last, types, tgt, maxnreg=cap)
    if capped is None or binary_occupancy(capped, tgt) < PER_SM:
        return binary, None
    return capped, cap


def _binary(kernels: Sequence, first: int, last: int, types, tgt: Target, maxnreg: int | None = None):
    """The persistent kernel of ``kernels[first:last]`` compiled for ``tgt``'s GPU (cached; at most
    ``maxnreg`` registers a thread where given), or None where it spills, needs more shared memory
    than a block may have or does not compile."""
    from ..codegen.triton.native import NativeCompileError, compile_native_persistent
    tiles, reads, writes, scratch = run_phases(kernels, first, last)
    try:
        binary = compile_native_persistent("persistent", tiles, reads, writes, {**types, **scratch}, tgt.arch,
                                           maxnreg=maxnreg)
    except NativeCompileError as e:
        _log.info("persistent kernel of %s: %s", [b.name for b in kernels[first:last]], e)
        return None
    return None if binary.spills or binary.shared_bytes > tgt.smem_per_block else binary
