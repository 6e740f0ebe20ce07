"""Kernel orchestration (Korch, extended to multi-output kernels).

    PrimGraph ─► split_segments ─► per distinct segment: enumerate_candidates (convex sets × output
    variants, costed by a callback) ─► select (BLP, HiGHS) ─► build_plan ─► Plan

Kernel families and the cost model plug in through ``cost_fn(candidate) -> float | None``.
Structurally identical segments (repeated layers) are solved once and the selection is mapped onto
the others by position.
"""
from __future__ import annotations

import time

from ..ir.prim import PrimGraph
from .blp import DEFAULT_TIME_LIMIT, NoPlanError, Selection, select
from .candidates import Candidate, CostFn, enumerate_candidates, make_candidate, remap
from .plan import Kernel, Lifetime, Plan, PlanError, build_plan, execute_reference
from .segment import Segment, make_segment, split_segments
from .states import DEFAULT_CAPS, Caps, TooManyStates, convex_sets, execution_states, is_convex

# Worst first: the status a plan reports is the worst of its segments'.
_STATUS_RANK = ("fallback", "time_limit", "optimal", "empty")


def orchestrate(pg: PrimGraph, cost_fn: CostFn, *, caps: Caps = DEFAULT_CAPS,
                time_limit: float = DEFAULT_TIME_LIMIT) -> Plan:
    """Split, enumerate, select and stitch: the cheapest plan the candidates allow.

    ``time_limit`` is per distinct segment.  ``Plan.solver`` records status, segment and candidate
    counts, lazy rounds, the worst MIP gap and the seconds spent.
    """
    t0 = time.perf_counter()
    segments = split_segments(pg, caps)
    solved: dict[tuple, Selection] = {}
    selections: list[Selection] = []
    num_candidates = 0
    for seg in segments:
        key = seg.canonical_key()
        sel = solved.get(key)
        if sel is not None:
            selections.append(sel.remap(seg))
            continue
        cands = enumerate_candidates(seg, cost_fn, caps)
        num_candidates += len(cands)
        sel = solved[key] = select(seg, cands, time_limit=time_limit)
        selections.append(sel)
    statuses = [s.status for s in solved.values()]
    solver = {
        "status": min(statuses, key=_rank, default="empty"),
        "num_segments": len(segments),
        "num_distinct_segments": len(solved),
        "num_candidates": num_candidates,
        "lazy_rounds": sum(s.lazy_rounds for s in solved.values()),
        "mip_gap": max((s.mip_gap for s in solved.values()), default=0.0),
        "seconds": round(time.perf_counter() - t0, 4),
    }
    return build_plan(pg, segments, selections, solver)


def _rank(status: str) -> int:
    return _STATUS_RANK.index(status) if status in _STATUS_RANK else -1


__all__ = [
    "orchestrate", "Caps", "DEFAULT_CAPS", "TooManyStates", "execution_states", "convex_sets", "is_convex",
    "Segment", "make_segment", "split_segments", "Candidate", "CostFn", "enumerate_candidates",
    "make_candidate", "remap", "Selection", "select", "NoPlanError", "DEFAULT_TIME_LIMIT", "Kernel",
    "Lifetime", "Plan", "PlanError", "build_plan", "execute_reference",
]
