"""Baseline plans built by the same machinery as the optimum (DESIGN.md §5.6).

- ``unfused``: one kernel per operator — the operator's contractions and opaque prims alone
  (vendor library, torch), the rest of its prims as one fused kernel when that is a convex,
  buildable group, else one kernel each.
- ``greedy``: producer→consumer fusion as rule-based compilers do it: starting from the unfused
  kernels, each memory-bound kernel is merged into a producer kernel that is memory-bound or holds
  one contraction (an epilogue, as Inductor and TensorRT fuse them) when the merged group is
  convex, buildable, within the size cap, and not modelled slower than the two apart.

Both are partitions of the segment's live prims whose kernels write every value read outside
them (the "maximal" output variant), so each is one of the optimum's candidate sets and the
optimum can never be worse.
"""
from __future__ import annotations

import time

from ..analysis.classify import MEMORY_BOUND, Category, classify
from .blp import Selection
from .candidates import Candidate, CostFn, live_mask, make_candidate, output_variants
from .segment import Segment
from .states import Caps, bits, is_convex


def _candidate(seg: Segment, members: int) -> Candidate:
    return make_candidate(seg, members, output_variants(seg, members)[0])


def _singletons(mask: int) -> list[int]:
    return [1 << v for v in bits(mask)]


def _memory_bound(seg: Segment, mask: int) -> bool:
    return all(classify(seg.prims[v]) in MEMORY_BOUND for v in bits(mask))


def _takes_epilogue(seg: Segment, mask: int) -> bool:
    """A producer a memory-bound consumer may join: memory-bound, or one contraction with its
    epilogue so far (no opaque prim, no second contraction)."""
    cats = [classify(seg.prims[v]) for v in bits(mask)]
    rest = [c for c in cats if c not in MEMORY_BOUND]
    return not rest or rest == [Category.contraction]


def unfused_groups(seg: Segment, cost_fn: CostFn) -> list[int]:
    live = live_mask(seg)
    by_op: dict[str, int] = {}
    for v in bits(live):
        by_op.setdefault(seg.prims[v].origin.name, 0)
        by_op[seg.prims[v].origin.name] |= 1 << v
    groups: list[int] = []
    for mask in by_op.values():
        rest = 0
        for v in bits(mask):
            if classify(seg.prims[v]) in MEMORY_BOUND:
                rest |= 1 << v
            else:
                groups.append(1 << v)
        if not rest:
            continue
        if rest.bit_count() == 1 or (is_convex(rest, seg.preds, seg.succs)
                                    and cost_fn(_candidate(seg, rest)) is not None):
            groups.append(rest)
        else:
            groups.extend(_singletons(rest))
    return groups


def greedy_groups(seg: Segment, cost_fn: CostFn, caps: Caps) -> list[int]:
    groups = unfused_groups(seg, cost_fn)
    cost = {g: cost_fn(_candidate(seg, g)) for g in groups}
    changed = True
    while changed:
        changed = False
        for g in sorted(groups, key=lambda m: (m & -m).bit_length()):
            if g not in cost or not _memory_bound(seg, g):
                continue
            reads = 0
            for v in bits(g):
                reads |= seg.preds[v]
            for p in sorted(groups, key=lambda m: (m & -m).bit_length()):
                if p == g or not (p & reads) or not _takes_epilogue(seg, p):
                    continue
                merged = p | g
                if merged.bit_count() > caps.max_members or not is_convex(merged, seg.preds, seg.succs):
                    continue
                c = cost_fn(_candidate(seg, merged))
                if c is None or c > cost[p] + cost[g]:
                    continue
                groups = [m for m in groups if m not in (p, g)] + [merged]
                del cost[p], cost[g]
                cost[merged] = c
                changed = True
                break
            if changed:
                break
    return groups


def order_groups(seg: Segment, groups: list[int]) -> list[int] | None:
    """Groups in an executable order (each reads only segment inputs or earlier groups' values)."""
    need = {}
    for g in groups:
        r = 0
        for v in bits(g):
            r |= seg.preds[v]
        need[g] = r & ~g
    done, order, left = 0, [], list(groups)
    while left:
        ready = [g for g in left if not need[g] & ~done]
        if not ready:
            return None
        g = min(ready, key=lambda m: (m & -m).bit_length())
        order.append(g)
        left.remove(g)
        done |= g
    return order


def selection_from_groups(seg: Segment, groups: list[int], cost_fn: CostFn, status: str) -> Selection:
    """A Selection of the given partition (split into single prims where it cannot be ordered)."""
    t0 = time.perf_counter()
    order = order_groups(seg, groups)
    if order is None:
        order = _singletons(sum(groups))
    chosen, costs = [], []
    for g in order:
        cand = _candidate(seg, g)
        c = cost_fn(cand)
        if c is None:
            raise RuntimeError(f"no kernel family can build {cand}")
        chosen.append(cand)
        costs.append(c)
    return Selection(tuple(chosen), tuple(costs), sum(costs), status, 0.0, time.perf_counter() - t0, 0)
