"""Plans for every strategy over one segmentation: unfused, greedy and optimal (the BLP).

All three use the same segments and the same cost function, so their modelled totals compare:
per segment the optimum is never worse than greedy, which is never worse than unfused (greedy
merges only when the model says the merge does not slow things down; if the solver stops at its
time limit with an incumbent worse than greedy, the greedy selection is used and the status says
so).  Identical segments are solved once.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import replace
from typing import Mapping

from ..ir.prim import PrimGraph
from ..log import logger
from ..progress import report
from .baselines import greedy_groups, selection_from_groups, unfused_groups
from .blp import DEFAULT_TIME_LIMIT, Selection, select
from .candidates import enumerate_candidates
from .costing import Coster
from .plan import Plan, build_plan
from .segment import split_segments
from .states import DEFAULT_CAPS, Caps

STRATEGIES = ("unfused", "greedy", "optimal")
_STATUS_RANK = ("time_limit+fallback", "time_limit+fallback+greedy", "time_limit+greedy", "time_limit",
                "fallback", "fallback+greedy", "work_limit+greedy", "work_limit", "optimal", "empty")
_plan, _solver, _cost = logger("plan"), logger("solver"), logger("cost")


def plan_strategies(pg: PrimGraph, coster: Coster, *, caps: Caps = DEFAULT_CAPS,
                    time_limit: float = DEFAULT_TIME_LIMIT, progress=None,
                    solved: dict | None = None) -> Mapping[str, Plan]:
    """``progress(done, total)`` is called after each segment (for a progress bar); ``solved``
    (canonical segment key -> selections) is shared by callers planning variants of one graph
    with one cost model: segments they have in common are solved once."""
    t0 = time.perf_counter()
    segments = split_segments(pg, caps)
    _plan.info("%d segments of %s prims, %d distinct", len(segments), [len(s) for s in segments],
               len({s.canonical_key() for s in segments}))
    solved = {} if solved is None else solved
    chosen: dict[str, list[Selection]] = {s: [] for s in STRATEGIES}
    num_candidates = 0
    time_cuts: list[str] = []      # where the time limit cut the search (candidates: counted; solver: its clock)
    mine: dict[tuple, dict[str, Selection]] = {}        # this graph's distinct segments
    for k, seg in enumerate(segments):
        key = seg.canonical_key()
        if key in solved:
            for s in STRATEGIES:
                chosen[s].append(solved[key][s].remap(seg))
        else:
            unfused = selection_from_groups(seg, unfused_groups(seg, coster), coster, "unfused")
            greedy = selection_from_groups(seg, greedy_groups(seg, coster, caps), coster, "greedy")
            cut: list[str] = []
            cands = enumerate_candidates(seg, coster, caps, seconds=time_limit, cut=cut)
            num_candidates += len(cands)
            optimal = select(seg, cands, time_limit=time_limit)
            if "time_limit" in optimal.status:
                cut.append("solver")
            if cut:
                time_cuts.append(f"segment {k}: {' and '.join(cut)}")
                _solver.info("segment %d: the time limit (%.3g s) cut the %s (raise time_limit)%s", k, time_limit,
                             " and ".join(cut), "; the plan may differ from run to run" if "solver" in cut else "")
            if optimal.objective > greedy.objective:
                optimal = replace(greedy, status=f"{optimal.status}+greedy")
            _log_segment(k, seg, cands, coster, optimal, greedy, unfused)
            solved[key] = {"unfused": unfused, "greedy": greedy, "optimal": optimal}
            for s in STRATEGIES:
                chosen[s].append(solved[key][s])
        mine[key] = solved[key]
        if progress is not None:
            progress(k + 1, len(segments))
        report("planning segments", k + 1, len(segments))
    statuses = [sel["optimal"].status for sel in mine.values()]
    solver = {
        "status": min(statuses, key=_rank, default="empty"),
        "num_segments": len(segments),
        "num_distinct_segments": len(mine),
        "num_candidates": num_candidates,
        "lazy_rounds": sum(sel["optimal"].lazy_rounds for sel in mine.values()),
        "mip_gap": max((sel["optimal"].mip_gap for sel in mine.values()), default=0.0),
        "seconds": round(time.perf_counter() - t0, 4),
        "time_limit_cut": time_cuts,
    }
    plans = {}
    for s in STRATEGIES:
        plan = build_plan(pg, segments, chosen[s], solver)
        kernels = tuple(replace(kn, schedule=coster.best(kn.candidate)[1]) for kn in plan.kernels)
        plans[s] = replace(plan, kernels=kernels)
    return plans


def _log_segment(k: int, seg, cands, coster: Coster, optimal, greedy, unfused) -> None:
    """The solver's verdict on one segment (``solver``) and what its candidates cost (``cost``)."""
    _solver.info("segment %d (%d prims, %d candidates): %s, gap %.3g, %d kernels, %.2f us (greedy %.2f, "
                 "unfused %.2f), %d lazy rounds, %.2f s", k, len(seg), len(cands), optimal.status,
                 optimal.mip_gap, len(optimal.chosen), optimal.objective * 1e6, greedy.objective * 1e6,
                 unfused.objective * 1e6, optimal.lazy_rounds, optimal.seconds)
    if not _cost.isEnabledFor(logging.INFO):
        return
    wins = Counter(coster.best(c)[1].family for c, _ in cands)
    _cost.info("segment %d: %d candidates buildable, won by %s", k, len(cands),
               ", ".join(f"{f} {n}" for f, n in wins.most_common()))
    for c, _ in cands if _cost.isEnabledFor(logging.DEBUG) else ():
        _cost.debug("segment %d %s: %s", k, c, ", ".join(
            f"{s.family} {cost.seconds * 1e6:.2f} us" for cost, s in _first_per_family(coster.options(c))))


def _first_per_family(options):
    seen = set()
    for cost, s in options:
        if s.family not in seen:
            seen.add(s.family)
            yield cost, s


def _rank(status: str) -> int:
    return _STATUS_RANK.index(status) if status in _STATUS_RANK else -1
