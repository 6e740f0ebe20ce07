"""Kernel selection by binary linear programming (Korch §4.2), solved with HiGHS.

One binary u_k per candidate; minimize Σ c_k u_k subject to

- every segment output is written by at least one chosen kernel;
- for every candidate k and every input t of k produced inside the segment:
  u_k ≤ Σ_{j writes t} u_j  (segment inputs are always available);
- every live prim (one a segment output depends on) is a member of some chosen kernel.  This one
  is implied by the others for integer u (induction from the outputs backwards) but closes much of
  the LP gap: without it a 30-prim chain took HiGHS 10 s, with it 0.05 s.

Redundant computation is allowed (a prim may sit in several kernels) and dead prims are never
forced.  With multi-output kernels a feasible u can still deadlock (K1 writes a and needs c while K2
writes c and needs a).  After each solve the chosen kernels are ordered; when some of them wait on
each other, a lazy constraint is added and the program is solved again.  For a stuck set S, with
t_k an input of k ∈ S that only kernels of S write, and W the other candidates that write some t_k:

    Σ_{k∈S} u_k − Σ_{j∈W} u_j ≤ |S| − 1

Every orderable selection satisfies it (the first kernel of S to run found its t_k written by
someone outside S), and the stuck one does not.  S is grown from one kernel by adding the writers
of its blocking inputs, and the smallest such S is used.

A heuristic plan seeds the solver (HiGHS needs a good incumbent early to fix most columns by reduced
cost) and is the fallback when the time limit leaves no usable incumbent: the cheapest plan without
redundancy, a shortest path over execution states (exact for partitions into kernels), else a
forward greedy (repeatedly launch the ready candidate with the lowest cost per newly written live
prim).
Selection never fails unless the candidates cannot compute some needed prim at all, which raises
``NoPlanError`` naming it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import highspy
import numpy as np

from .candidates import Candidate, live_mask, output_variants, remap
from .segment import Segment
from .states import TooManyStates, bits, execution_states, levels_above

DEFAULT_TIME_LIMIT = 10.0
# The solver's work budget: branch-and-bound nodes per solve and lazy-cut rounds per segment.
# Work, not seconds, bounds the search, so a loaded machine finds the plan an idle one does; the
# time limit is only an outer guard (a "time_limit" status says it cut).
MAX_NODES = 20_000
MAX_LAZY_ROUNDS = 64


class NoPlanError(RuntimeError):
    """The candidate kernels cannot compute a prim the segment needs."""


@dataclass(frozen=True)
class Selection:
    chosen: tuple[Candidate, ...]     # executable order
    costs: tuple[float, ...]          # cost of each chosen kernel
    objective: float                  # Σ costs
    status: str                       # optimal | work_limit | time_limit | fallback | empty
    mip_gap: float                    # relative gap reported by HiGHS (inf when unknown)
    seconds: float
    lazy_rounds: int

    def remap(self, seg: Segment) -> "Selection":
        """The same selection in a segment with the same canonical key."""
        return replace(self, chosen=tuple(remap(c, seg) for c in self.chosen))


class _Problem:
    """Candidates with the bitsets selection works on."""

    def __init__(self, seg: Segment, cands: list[tuple[Candidate, float]]):
        self.seg = seg
        self.cands = [c for c, _ in cands]
        self.costs = [float(x) for _, x in cands]
        idx = seg.index
        # In-segment inputs as bitsets; inputs from outside are always available.
        self.need = [seg.mask(t for t in c.inputs if t in idx) for c in self.cands]
        self.writes = [c.out_mask for c in self.cands]


def _prune(p: _Problem) -> list[int]:
    """Candidates whose in-segment inputs can all be written (to a fixpoint)."""
    alive = list(range(len(p.cands)))
    while True:
        writable = 0
        for k in alive:
            writable |= p.writes[k]
        keep = [k for k in alive if not p.need[k] & ~writable]
        if len(keep) == len(alive):
            return alive
        alive = keep


def _check_feasible(p: _Problem, alive: list[int]) -> None:
    """Raise ``NoPlanError`` when some segment output cannot be written at all."""
    writable = 0
    for k in alive:
        writable |= p.writes[k]
    missing = p.seg.out_mask & ~writable
    if not missing:
        return
    out = (missing & -missing).bit_length() - 1
    # Name the root cause: the earliest prim behind that output which some kernel reads (or the
    # output itself) and which no candidate writes.
    ever_written = read = 0
    for k in range(len(p.cands)):
        ever_written |= p.writes[k]
        read |= p.need[k]
    behind = 1 << out
    for v in range(out, -1, -1):
        if behind >> v & 1:
            behind |= p.seg.preds[v]
    roots = behind & (read | (1 << out)) & ~ever_written
    root = (roots & -roots).bit_length() - 1 if roots else out
    prim, o = p.seg.prims[root], p.seg.prims[out]
    why = "" if root == out else f", which needs prim {prim.name} ({prim.origin}) that no candidate writes"
    raise NoPlanError(f"no candidate kernel can produce prim {o.name} ({o.origin}){why}: every kernel "
                      "family rejected the candidates that compute it")


def _partition(p: _Problem, alive: list[int]) -> list[int] | None:
    """The cheapest plan without redundancy: a shortest path over execution states.

    A path ∅ = D0 ⊂ D1 ⊂ ... ⊂ L (L = the live prims, itself a state) runs the kernels D_{i+1} \\ D_i
    in order, each writing its maximal output set, so every path is orderable.  Returns None when
    the candidates allow no such path or the states do not fit the default caps.
    """
    seg = p.seg
    live = live_mask(seg)
    try:
        states = seg.states if seg.states is not None else execution_states(seg.preds)
    except TooManyStates:
        return None
    maximal = {}
    for k in alive:
        m = p.cands[k].members
        if p.writes[k] == output_variants(seg, m)[0]:
            maximal[m] = k
    depth = max((m.bit_count() for m in maximal), default=0)
    inside = [s for s in states if not s & ~live]        # sorted by size, as states are
    inside_set = set(inside)
    up = {s: [t for v in bits(live & ~s) if (t := s | (1 << v)) in inside_set] for s in inside}
    dist: dict[int, float] = {0: 0.0}
    via: dict[int, tuple[int, int]] = {}
    for low in inside:                       # every way into `low` comes from a smaller state
        if low not in dist:
            continue
        for level in levels_above(low, up, depth):
            for high in level:
                k = maximal.get(high & ~low)
                if k is not None and dist[low] + p.costs[k] < dist.get(high, math.inf):
                    dist[high] = dist[low] + p.costs[k]
                    via[high] = (low, k)
    if live not in dist:
        return None
    path, s = [], live
    while s:
        s, k = via[s]
        path.append(k)
    return _drop_unneeded(p, path[::-1])


def _greedy(p: _Problem, alive: list[int]) -> list[int]:
    """Forward greedy cover (orderable by construction), then drop kernels nobody needs."""
    live = live_mask(p.seg)
    written = 0
    chosen: list[int] = []
    while p.seg.out_mask & ~written:
        best, best_key = None, None
        for k in alive:
            if p.need[k] & ~written:
                continue
            gain = (p.writes[k] & live & ~written).bit_count()
            if gain:
                key = (p.costs[k] / gain, -gain, k)
                if best_key is None or key < best_key:
                    best, best_key = k, key
        if best is None:
            raise NoPlanError("the greedy fallback found no ready kernel")
        chosen.append(best)
        written |= p.writes[best]
    return _drop_unneeded(p, chosen)


def _drop_unneeded(p: _Problem, chosen: list[int]) -> list[int]:
    """Keep the kernels that write a segment output or an input of a kept kernel."""
    needed = p.seg.out_mask
    kept = set()
    changed = True
    while changed:
        changed = False
        for k in chosen:
            if k not in kept and p.writes[k] & needed:
                kept.add(k)
                needed |= p.need[k]
                changed = True
    return [k for k in chosen if k in kept]


def _order(p: _Problem, chosen: list[int]) -> tuple[list[int], list[int], int]:
    """(kernels in executable order, kernels stuck waiting on each other, written bitset)."""
    rest = sorted(chosen, key=lambda k: (p.cands[k].members & -p.cands[k].members, k))
    order: list[int] = []
    written = 0
    progress = True
    while rest and progress:
        progress = False
        still = []
        for k in rest:
            if p.need[k] & ~written:
                still.append(k)
            else:
                order.append(k)
                written |= p.writes[k]
                progress = True
        rest = still
    return order, rest, written


def _cut(p: _Problem, alive: list[int], stuck: list[int], written: int) -> tuple[list[int], list[int]]:
    """(S, W) of the lazy constraint for a stuck set (see the module docstring)."""
    block = {k: (p.need[k] & ~written) & -(p.need[k] & ~written) for k in stuck}
    best = None
    for start in stuck:
        s = {start}
        todo = [start]
        while todo:
            k = todo.pop()
            for j in stuck:
                if j not in s and p.writes[j] & block[k]:
                    s.add(j)
                    todo.append(j)
        if best is None or len(s) < len(best):
            best = s
    blocked = 0
    for k in best:
        blocked |= block[k]
    others = [j for j in alive if j not in best and p.writes[j] & blocked]
    return sorted(best), others


class _Solver:
    """The HiGHS model.  Columns: u_k for the alive candidates (binary), then w_v in [0, 1] for each
    in-segment tensor some candidate reads ("v is written"), so each dependency is a two-term row
    u_k ≤ w_v and each tensor's writers are listed once (w_v ≤ Σ writers): the model stays sparse."""

    def __init__(self, p: _Problem, alive: list[int]):
        self.p, self.alive = p, alive
        self.col = {k: i for i, k in enumerate(alive)}
        n = len(alive)
        read = 0
        for k in alive:
            read |= p.need[k]
        self.wcol = {v: n + i for i, v in enumerate(bits(read))}
        h = self.h = highspy.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("mip_rel_gap", 1e-6)
        h.setOptionValue("mip_abs_gap", 1e-9)
        h.setOptionValue("mip_max_nodes", MAX_NODES)
        costs = np.array([p.costs[k] for k in alive], dtype=np.float64)
        # Costs are seconds (~1e-6): rescale so gaps and tolerances mean something.
        scale = float(np.mean(np.abs(costs))) if n else 1.0
        m = n + len(self.wcol)
        empty_i, empty_f = np.array([], dtype=np.int32), np.array([], dtype=np.float64)
        obj = np.concatenate([costs / (scale or 1.0), np.zeros(len(self.wcol))])
        h.addCols(m, obj, np.zeros(m), np.ones(m), 0, empty_i, empty_i, empty_f)
        h.changeColsIntegrality(n, np.arange(n, dtype=np.int32),
                                np.full(n, highspy.HighsVarType.kInteger.value, dtype=np.uint8))
        inf = highspy.kHighsInf
        writers: dict[int, list[int]] = {}
        members: dict[int, list[int]] = {}
        for k in alive:
            for v in bits(p.writes[k]):
                writers.setdefault(v, []).append(self.col[k])
            for v in bits(p.cands[k].members):
                members.setdefault(v, []).append(self.col[k])
        rows: list[tuple[float, float, list[int], list[float]]] = []
        for v in bits(p.seg.out_mask):
            rows.append((1.0, inf, writers[v], [1.0] * len(writers[v])))
        for v, c in self.wcol.items():
            w = writers[v]
            rows.append((-inf, 0.0, [c] + w, [1.0] + [-1.0] * len(w)))
        for k in alive:
            for v in bits(p.need[k]):
                rows.append((-inf, 0.0, [self.col[k], self.wcol[v]], [1.0, -1.0]))
        # Valid and much tighter LP: every live prim is a member of some chosen kernel (implied for
        # integer u by induction from the outputs backwards).
        for v in bits(live_mask(p.seg)):
            rows.append((1.0, inf, members[v], [1.0] * len(members[v])))
        self.add_rows(rows)

    def add_rows(self, rows) -> None:
        if not rows:
            return
        starts, idx, val = [], [], []
        for _, _, i, v in rows:
            starts.append(len(idx))
            idx += i
            val += v
        self.h.addRows(len(rows), np.array([r[0] for r in rows], dtype=np.float64),
                       np.array([r[1] for r in rows], dtype=np.float64), len(idx),
                       np.array(starts, dtype=np.int32), np.array(idx, dtype=np.int32),
                       np.array(val, dtype=np.float64))

    def add_cut(self, s: list[int], w: list[int]) -> None:
        cols = [self.col[k] for k in s] + [self.col[j] for j in w]
        self.add_rows([(-highspy.kHighsInf, float(len(s) - 1), cols, [1.0] * len(s) + [-1.0] * len(w))])

    def hint(self, chosen: list[int]) -> None:
        sol = highspy.HighsSolution()
        x = [0.0] * (len(self.alive) + len(self.wcol))
        written = 0
        for k in chosen:
            x[self.col[k]] = 1.0
            written |= self.p.writes[k]
        for v, c in self.wcol.items():
            x[c] = float(written >> v & 1)
        sol.col_value = x
        self.h.setSolution(sol)

    def solve(self, seconds: float) -> tuple[str, list[int] | None, float]:
        h = self.h
        h.setOptionValue("time_limit", max(seconds, 1e-3))
        h.run()
        status = h.getModelStatus()
        info = h.getInfo()
        has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
        chosen = None
        if has_solution:
            x = h.getSolution().col_value
            chosen = [k for k, i in self.col.items() if x[i] > 0.5]
        if status == highspy.HighsModelStatus.kOptimal:
            return "optimal", chosen, float(info.mip_gap)
        if status == highspy.HighsModelStatus.kInfeasible:
            return "infeasible", None, math.inf
        gap = float(info.mip_gap) if has_solution else math.inf
        if status == highspy.HighsModelStatus.kTimeLimit:
            return "time_limit", chosen, gap
        if status in (highspy.HighsModelStatus.kSolutionLimit, highspy.HighsModelStatus.kIterationLimit):
            return "work_limit", chosen, gap
        return h.modelStatusToString(status).lower().replace(" ", "_"), chosen, gap


def select(seg: Segment, cands: list[tuple[Candidate, float]], *,
           time_limit: float = DEFAULT_TIME_LIMIT) -> Selection:
    """The cheapest orderable set of candidate kernels computing the segment's outputs."""
    t0 = time.perf_counter()
    p = _Problem(seg, cands)
    if not seg.out_mask:
        return Selection((), (), 0.0, "empty", 0.0, time.perf_counter() - t0, 0)
    alive = _prune(p)
    _check_feasible(p, alive)
    fallback = _partition(p, alive)
    if fallback is None:
        try:
            fallback = _greedy(p, alive)
        except NoPlanError:
            pass
    solver = _Solver(p, alive)
    if fallback is not None:
        solver.hint(fallback)
    rounds = 0
    status = "time_limit"
    while True:
        left = time_limit - (time.perf_counter() - t0)
        if left <= 0:
            break
        if rounds >= MAX_LAZY_ROUNDS:
            status = "work_limit"
            break
        status, chosen, gap = solver.solve(left)
        if chosen is None:
            break
        chosen = _drop_unneeded(p, chosen)
        order, stuck, written = _order(p, chosen)
        if not stuck and not _worse(p, order, fallback):
            return _selection(p, order, status, gap, t0, rounds)
        if not stuck:                # HiGHS dropped our start and ran out of time
            break
        rounds += 1
        solver.add_cut(*_cut(p, alive, stuck, written))
    if fallback is not None:
        order, _, _ = _order(p, fallback)
        timed_out = status == "time_limit"     # the guard cut the search, not its work budget
        return _selection(p, order, "time_limit+fallback" if timed_out else "fallback", math.inf, t0, rounds)
    raise NoPlanError(f"selection for the segment starting at prim {seg.prims[0].name} "
                      f"({seg.prims[0].origin}) ended with status {status} and no orderable plan, "
                      "and the fallback heuristics found none")


def _worse(p: _Problem, chosen: list[int], other: list[int] | None) -> bool:
    return other is not None and sum(p.costs[k] for k in other) < sum(p.costs[k] for k in chosen) - 1e-12


def _selection(p: _Problem, order: list[int], status: str, gap: float, t0: float, rounds: int) -> Selection:
    costs = tuple(p.costs[k] for k in order)
    return Selection(tuple(p.cands[k] for k in order), costs, sum(costs), status, gap,
                     time.perf_counter() - t0, rounds)
