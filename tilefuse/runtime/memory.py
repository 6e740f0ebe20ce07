"""Buffer planning: every intermediate tensor of a plan gets a fixed place in one arena.

Two intermediates may share bytes when their lifetimes (``Plan.lifetimes``: first kernel writing
to last kernel touching) are disjoint; a kernel's inputs and outputs are live together, so a
kernel never writes over what it reads.  Placement is greedy by size (largest first, each at
the lowest aligned offset clear of every placed tensor whose lifetime overlaps), which is the
usual heuristic for this offset-assignment problem and near the lower bound on real networks.

Graph outputs are not planned: they are returned to the caller and must outlive the call.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import torch

from ..ir.dtypes import TensorType
from ..ir.prim import PrimGraph
from ..orchestrate.plan import Plan

# Offsets are multiples of this: any dtype's alignment, and the 16-byte alignment Triton's
# vectorized loads assume, with room for the 128-byte lines of a GPU.
ALIGN = 256


@dataclass(frozen=True)
class MemoryPlan:
    offsets: Mapping[str, int]      # intermediate tensor (or kernel workspace) -> byte offset in the arena
    arena_bytes: int                # peak bytes of intermediates with reuse (the arena's size)
    unplanned_bytes: int            # sum of all intermediates' sizes (peak without reuse)
    scratch: Mapping[str, TensorType] = field(default_factory=dict)   # the workspaces placed, by name

    def views(self, arena: torch.Tensor, types) -> dict[str, torch.Tensor]:
        """Each planned tensor as a typed, shaped view into ``arena`` (a uint8 tensor)."""
        out = {}
        for name, off in self.offsets.items():
            t = self.scratch[name] if name in self.scratch else types[name]
            raw = arena[off:off + t.nbytes]
            out[name] = raw.view(t.dtype.to_torch()).view(t.shape)
        return out


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def assign_offsets(tensors: Mapping[str, tuple[int, int, int]]) -> tuple[dict[str, int], int]:
    """name -> (bytes, first, last) to (aligned byte offsets, arena size): tensors whose lifetimes
    [first, last] intersect get disjoint byte ranges."""
    # Largest first; ties by first use then name, so the layout is deterministic.
    order = sorted(tensors, key=lambda n: (-tensors[n][0], tensors[n][1], n))
    placed: list[tuple[int, int, int, int]] = []   # (offset, end, first, last)
    offsets: dict[str, int] = {}
    for name in order:
        nbytes, first, last = tensors[name]
        size = _aligned(nbytes)
        clash = sorted((o, e) for o, e, f, l in placed if f <= last and first <= l)
        off = 0
        for o, e in clash:        # the lowest gap below or between clashing blocks that fits
            if off + size <= o:
                break
            off = max(off, e)
        offsets[name] = off
        placed.append((off, off + size, first, last))
    return dict(sorted(offsets.items())), max((e for _, e, _, _ in placed), default=0)


def plan_memory(plan: Plan, pg: PrimGraph, kernels: Sequence = (),
                runs: Sequence[tuple[int, int]] = ()) -> MemoryPlan:
    """Arena offsets for every tensor a kernel writes that is not a graph output, and for the
    workspaces the built ``kernels`` declare (``Built.scratch``), each live during its kernel
    only.  Zeroed scratch (counters) is not placed here: it must stay zero between launches.
    A tensor alive during one of the persistent ``runs`` (first, past the last kernel) is kept
    alive through the whole run: its phases may run side by side, so no two of the tensors they
    touch may share bytes (``codegen/dependencies`` orders them by name)."""
    types = pg.types
    keep = set(plan.sources) | set(plan.outputs)
    live = {n: (types[n].nbytes, lt.first, lt.last) for n, lt in plan.lifetimes.items() if n not in keep}
    scratch = {n: s.type for k, b in enumerate(kernels) for n, s in zip(scratch_names(k, b), b.scratch)
               if not s.zeroed}
    live |= {n: (t.nbytes, int(n.split(":")[1]), int(n.split(":")[1])) for n, t in scratch.items()}
    for i, j in runs:
        live = {n: (b, min(f, i), max(last, j - 1)) if f <= j - 1 and i <= last else (b, f, last)
                for n, (b, f, last) in live.items()}
    offsets, arena = assign_offsets(live)
    return MemoryPlan(offsets, arena, sum(b for b, _, _ in live.values()), scratch)


def scratch_names(k: int, built) -> list[str]:
    """Names of kernel ``k``'s scratch buffers in the memory plan (no tensor name has a colon)."""
    return [f"scratch:{k}:{j}" for j in range(len(built.scratch))]
