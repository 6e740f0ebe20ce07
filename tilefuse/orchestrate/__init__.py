"""Kernel orchestration (Korch, extended to multi-output kernels).

    PrimGraph ─► split_segments ─► per distinct segment: enumerate_candidates (convex sets × output
    variants, costed by the Coster) ─► select (BLP, HiGHS) ─► build_plan ─► Plan

``strategies.plan_strategies`` is the driver: it plans the unfused, greedy and optimal strategies
over one segmentation.  Kernel families and the cost model plug in through the ``Coster``
(``costing.py``).  Structurally identical segments (repeated layers) are solved once and the
selection is mapped onto the others by position.
"""
from .blp import NoPlanError, select
from .candidates import enumerate_candidates
from .plan import Plan, PlanError, PlannedKernel, build_plan, execute_reference
from .segment import make_segment, split_segments
from .states import Caps, convex_sets, execution_states, is_convex

__all__ = [
    "Caps", "NoPlanError", "Plan", "PlannedKernel", "PlanError", "build_plan", "convex_sets", "enumerate_candidates",
    "execute_reference", "execution_states", "is_convex", "make_segment", "select", "split_segments",
]
