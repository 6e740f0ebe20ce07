"""Candidate kernels: a convex prim set of a segment plus the prims the kernel writes.

For each convex set two output variants are offered:

- *maximal*: every member read outside the set (by the segment or later), every segment output,
  and every member with no reader inside the set;
- *sinks-only*: just the members with no reader inside the set, when that differs.  This lets the
  selection compute a prim inside two kernels without ever writing it (Korch Fig. 4c).

A candidate is positional (``members`` and ``out_mask`` are bitsets over the segment's prims), so
``remap`` carries it to a structurally identical segment.  ``enumerate_candidates`` asks a cost
callback for each one: ``cost_fn(candidate) -> float | None``, None (or inf) meaning that no kernel
family can build it; kernel families and the cost model plug in there.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from ..ir.prim import Prim
from .segment import Segment
from .states import DEFAULT_CAPS, Caps, bits

# kernels of several prims costed per second of ``time_limit``: about what this costs on one core
# for the zoo's models (1-3 ms a kernel, the tile searches included), so a limit gives the same
# candidates on an idle machine and a loaded one; groups whose inlined expressions are large cost
# more (bailing_hybrid's unrolled slice updates: 10-30 ms), and their limit is then exceeded
COSTED_PER_SECOND = 1000

CostFn = Callable[["Candidate"], "float | None"]


@dataclass(frozen=True)
class Candidate:
    members: int                      # bitset over the segment's prims
    out_mask: int                     # bitset of the members the kernel writes
    names: tuple[str, ...]            # member prim names, topological order
    inputs: tuple[str, ...]           # tensors read from outside the set, in order of first use
    outputs: tuple[str, ...]          # prim names the kernel writes, topological order
    prims: tuple[Prim, ...] = field(compare=False, repr=False)

    def __str__(self) -> str:
        return f"[{', '.join(self.names)}] -> ({', '.join(self.outputs)})"


def make_candidate(seg: Segment, members: int, out_mask: int) -> Candidate:
    prims = tuple(seg.prims[k] for k in bits(members))
    names = tuple(p.name for p in prims)
    inside = set(names)
    inputs = tuple(dict.fromkeys(n for p in prims for n in p.inputs if n not in inside))
    return Candidate(members, out_mask, names, inputs, seg.names(out_mask), prims)


def structure(cand: Candidate, types) -> tuple:
    """A name-free key of what the candidate computes: its prims' signatures wired by position
    (inputs first, then members), the inputs' types, which members it writes.  Equal keys (a
    layer's kernel and the next layer's, in segments that are not identical) cost alike: the
    families see a group only through these (``tests/test_costing.py`` checks it)."""
    idx: dict[str, int] = {}
    for n in (*cand.inputs, *cand.names):
        idx.setdefault(n, len(idx))
    return (tuple((p.signature, tuple(idx[n] for n in p.inputs)) for p in cand.prims),
            tuple(types[n] for n in cand.inputs), tuple(idx[n] for n in cand.outputs))


def remap(cand: Candidate, seg: Segment) -> Candidate:
    """The same candidate (by position) in a segment with the same canonical key."""
    return make_candidate(seg, cand.members, cand.out_mask)


def output_variants(seg: Segment, members: int) -> list[int]:
    """Output bitsets offered for a convex set: maximal, then sinks-only if different."""
    maximal = sinks = 0
    for v in bits(members):
        bit = 1 << v
        succ = seg.succs[v]
        if not succ & members:
            sinks |= bit
        if succ & ~members or seg.out_mask & bit:
            maximal |= bit
    maximal |= sinks
    return [maximal] if sinks == maximal else [maximal, sinks]


def spans(seg: Segment, convex) -> list[int]:
    """The convex sets made of two contractions, the second reading what the first made through
    no other contraction, and every prim on a path between them (a path's inner prims feed the
    second and depend on the first: the set is convex): attention's scores, softmax and second
    product, a GEMM chain's activation; each also with the elementwise, broadcast and layout prims
    its members read, transitively (its operands' prologues: a rotary embedding, a transpose into
    heads), which a chain kernel may compute as it loads.  Smallest first, those ``convex``
    holds."""
    from ..analysis.classify import Category, classify
    n = len(seg.prims)
    gemm = light = 0
    for k, p in enumerate(seg.prims):
        c = classify(p)
        if c is Category.contraction:
            gemm |= 1 << k
        elif c in (Category.elementwise, Category.broadcast, Category.layout):
            light |= 1 << k
    after = [0] * n                              # the prims that depend on each, transitively
    for v in range(n - 1, -1, -1):
        for w in bits(seg.succs[v]):
            after[v] |= 1 << w | after[w]
    before = [0] * n                             # each prim's transitive inputs
    for v in range(n):
        for u in bits(seg.preds[v]):
            before[v] |= 1 << u | before[u]
    out = set()
    for a in bits(gemm):
        for b in bits(gemm & after[a]):
            inner = after[a] & before[b]
            members = inner | 1 << a | 1 << b
            if inner & gemm:
                continue
            grown, reads, new = members, 0, members
            while new:                           # the light prims read, transitively
                for v in bits(new):
                    reads |= seg.preds[v]
                new = reads & light & ~grown
                grown |= new
            out.update(m for m in (members, grown) if m in convex)
    return sorted(out, key=lambda m: (m.bit_count(), m))


def live_mask(seg: Segment) -> int:
    """Prims some segment output depends on (themselves included); the others are dead code."""
    live = seg.out_mask
    for v in range(len(seg.prims) - 1, -1, -1):
        if live >> v & 1:
            live |= seg.preds[v]
    return live


def enumerate_candidates(seg: Segment, cost_fn: CostFn, caps: Caps = DEFAULT_CAPS,
                         seconds: float | None = None, cut: list | None = None) -> list[tuple[Candidate, float]]:
    """Every buildable candidate of the segment with its cost, in a deterministic order.

    Candidates that write no live prim are skipped: no selection needs them.  The work is bounded
    by ``caps`` (``max_convex`` sets per segment) and by ``seconds``, counted as work, not read off
    a clock: at most ``seconds × COSTED_PER_SECOND`` kernels of several prims are costed, so the
    same segment gives the same candidates on a loaded machine or an idle one.  Single prims come
    first (a plan always exists), then the sets spanning two contractions (``spans``: attention's
    and GEMM chains' groups, larger than most sets a short budget reaches), then the rest smallest
    first; when the budget runs out the enumeration stops, keeping what it has, and
    ``"candidates"`` is appended to ``cut``.
    """
    _, convex = seg.enumerate(caps)
    live = live_mask(seg)
    out = []
    budget = math.inf if seconds is None else seconds * COSTED_PER_SECOND
    first = spans(seg, convex)
    ahead = set(first)
    singles = sorted(m for m in convex if m.bit_count() == 1)
    rest = sorted((m for m in convex if m.bit_count() > 1 and m not in ahead), key=lambda m: (m.bit_count(), m))
    for members in singles + first + rest:
        if members.bit_count() > 1 and budget <= 0:
            if cut is not None:
                cut.append("candidates")
            break
        for out_mask in output_variants(seg, members):
            if not out_mask & live:
                continue
            if members.bit_count() > 1:
                budget -= 1
            cand = make_candidate(seg, members, out_mask)
            cost = cost_fn(cand)
            if cost is None or math.isinf(cost) or math.isnan(cost):
                continue
            out.append((cand, float(cost)))
    return out
