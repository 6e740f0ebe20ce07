"""Plans for every strategy over one segmentation: unfused, greedy and optimal (the BLP).

All three use the same segments and the same cost function, so their modelled totals compare:
per segment the optimum is never worse than greedy, which is never worse than unfused (greedy
merges only when the model says the merge does not slow things down; if the solver stops at its
time limit with an incumbent worse than greedy, the greedy selection is used and the status says
so).  Identical segments are solved once.
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Mapping

from ..ir.prim import PrimGraph
from .baselines import greedy_groups, selection_from_groups, unfused_groups
from .blp import DEFAULT_TIME_LIMIT, Selection, select
from .candidates import enumerate_candidates
from .costing import Coster
from .plan import Plan, build_plan
from .segment import split_segments
from .states import DEFAULT_CAPS, Caps

STRATEGIES = ("unfused", "greedy", "optimal")
_STATUS_RANK = ("fallback", "fallback+greedy", "time_limit+greedy", "time_limit", "optimal", "empty")


def plan_strategies(pg: PrimGraph, coster: Coster, *, caps: Caps = DEFAULT_CAPS,
                    time_limit: float = DEFAULT_TIME_LIMIT, progress=None,
                    solved: dict | None = None) -> Mapping[str, Plan]:
    """``progress(done, total)`` is called after each segment (for a progress bar); ``solved``
    (canonical segment key -> selections) is shared by callers planning variants of one graph
    with one cost model: segments they have in common are solved once."""
    t0 = time.perf_counter()
    segments = split_segments(pg, caps)
    solved = {} if solved is None else solved
    chosen: dict[str, list[Selection]] = {s: [] for s in STRATEGIES}
    num_candidates = 0
    mine: dict[tuple, dict[str, Selection]] = {}        # this graph's distinct segments
    for k, seg in enumerate(segments):
        key = seg.canonical_key()
        if key in solved:
            for s in STRATEGIES:
                chosen[s].append(solved[key][s].remap(seg))
        else:
            unfused = selection_from_groups(seg, unfused_groups(seg, coster), coster, "unfused")
            greedy = selection_from_groups(seg, greedy_groups(seg, coster, caps), coster, "greedy")
            cands = enumerate_candidates(seg, coster, caps, seconds=time_limit)
            num_candidates += len(cands)
            optimal = select(seg, cands, time_limit=time_limit)
            if optimal.objective > greedy.objective:
                optimal = replace(greedy, status=f"{optimal.status}+greedy")
            solved[key] = {"unfused": unfused, "greedy": greedy, "optimal": optimal}
            for s in STRATEGIES:
                chosen[s].append(solved[key][s])
        mine[key] = solved[key]
        if progress is not None:
            progress(k + 1, len(segments))
    statuses = [sel["optimal"].status for sel in mine.values()]
    solver = {
        "status": min(statuses, key=_rank, default="empty"),
        "num_segments": len(segments),
        "num_distinct_segments": len(mine),
        "num_candidates": num_candidates,
        "lazy_rounds": sum(sel["optimal"].lazy_rounds for sel in mine.values()),
        "mip_gap": max((sel["optimal"].mip_gap for sel in mine.values()), default=0.0),
        "seconds": round(time.perf_counter() - t0, 4),
    }
    plans = {}
    for s in STRATEGIES:
        plan = build_plan(pg, segments, chosen[s], solver)
        kernels = tuple(replace(kn, schedule=coster.best(kn.candidate)[1]) for kn in plan.kernels)
        plans[s] = replace(plan, kernels=kernels)
    return plans


def _rank(status: str) -> int:
    return _STATUS_RANK.index(status) if status in _STATUS_RANK else -1
