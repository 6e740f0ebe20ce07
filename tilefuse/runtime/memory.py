"""Buffer planning: every intermediate tensor of a plan gets a fixed place in one arena.

Two intermediates may share bytes when their lifetimes (``Plan.lifetimes``: first kernel writing
to last kernel touching) are disjoint; a kernel's inputs and outputs are live together, so a
kernel never writes over what it reads.  Placement is greedy by size (largest first, each at
the lowest aligned offset clear of every placed tensor whose lifetime overlaps), which is the
usual heuristic for this offset-assignment problem and near the lower bound on real networks.

Graph outputs are not planned: they are returned to the caller and must outlive the call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from ..ir.prim import PrimGraph
from ..orchestrate.plan import Plan

# Offsets are multiples of this: any dtype's alignment, and the 16-byte alignment Triton's
# vectorized loads assume, with room for the 128-byte lines of a GPU.
ALIGN = 256


@dataclass(frozen=True)
class MemoryPlan:
    offsets: Mapping[str, int]      # intermediate tensor -> byte offset in the arena
    arena_bytes: int                # peak bytes of intermediates with reuse (the arena's size)
    unplanned_bytes: int            # sum of all intermediates' sizes (peak without reuse)

    def views(self, arena: torch.Tensor, types) -> dict[str, torch.Tensor]:
        """Each planned tensor as a typed, shaped view into ``arena`` (a uint8 tensor)."""
        out = {}
        for name, off in self.offsets.items():
            t = types[name]
            raw = arena[off:off + t.nbytes]
            out[name] = raw.view(t.dtype.to_torch()).view(t.shape)
        return out


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def plan_memory(plan: Plan, pg: PrimGraph) -> MemoryPlan:
    """Arena offsets for every tensor a kernel writes that is not a graph output."""
    types = pg.types
    keep = set(plan.sources) | set(plan.outputs)
    live = {n: lt for n, lt in plan.lifetimes.items() if n not in keep}
    # Largest first; ties by first use then name, so the plan is deterministic.
    order = sorted(live, key=lambda n: (-types[n].nbytes, live[n].first, n))
    placed: list[tuple[int, int, int, int]] = []   # (offset, end, first, last)
    offsets: dict[str, int] = {}
    for name in order:
        size, lt = _aligned(types[name].nbytes), live[name]
        clash = sorted((o, e) for o, e, f, l in placed if f <= lt.last and lt.first <= l)
        off = 0
        for o, e in clash:
            if off + size <= o:
                break
            off = max(off, e)
        offsets[name] = off
        placed.append((off, off + size, lt.first, lt.last))
    arena = max((e for _, e, _, _ in placed), default=0)
    total = sum(types[n].nbytes for n in live)
    return MemoryPlan(dict(sorted(offsets.items())), arena, total)
