"""Execution states and convex prim sets of a segment (Korch §4.1, Algorithm 1, Theorem 1).

A segment's prims are numbered 0..n-1 in topological order and every prim set is a Python int used
as a bitset (bit i = prim i).  ``preds[i]`` / ``succs[i]`` are the bitsets of the direct
predecessors / successors of prim i inside the segment.

- An *execution state* is a downward-closed set: every predecessor of a member is a member.  The
  empty set and the full set are states.  ``execution_states`` finds them all by a DFS that adds
  one ready prim at a time, carrying the ready set along so each step costs O(out-degree).
- A set is *convex* when no path leaves it and comes back.  Every non-empty convex set is the
  difference D2 \\ D1 of two states D1 ⊂ D2 (Theorem 1), so ``convex_sets`` walks, from each state,
  up the state lattice (adding one ready prim at a time) and collects the differences.

Both enumerations are capped: past the cap they raise ``TooManyStates``, and the caller (the
segment splitter) answers by cutting the segment smaller, so orchestration never fails.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence


class TooManyStates(Exception):
    """An enumeration went past its cap; the segment must be cut smaller."""

    def __init__(self, what: str, cap: int):
        self.what, self.cap = what, cap
        super().__init__(f"more than {cap} {what}")


@dataclass(frozen=True)
class Caps:
    """Bounds that keep orchestration tractable.

    ``max_prims``: prims per segment; ``max_states``: execution states per segment;
    ``max_convex``: distinct convex sets per segment; ``max_members``: prims per candidate kernel
    (Korch's "too many operators to generate within one kernel").
    """
    max_prims: int = 48
    max_states: int = 2048
    max_convex: int = 6000          # enumerating them is cheap; costing them is what takes time (1 to 30 ms
                                    # a kernel of several prims), bounded by ``time_limit`` (candidates.py)
    max_members: int = 24


DEFAULT_CAPS = Caps()


def bits(mask: int):
    """The indices of the set bits of ``mask``, in increasing order."""
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def successors(preds: Sequence[int]) -> list[int]:
    """Successor bitsets from predecessor bitsets."""
    succs = [0] * len(preds)
    for v, p in enumerate(preds):
        for u in bits(p):
            succs[u] |= 1 << v
    return succs


def is_convex(mask: int, preds: Sequence[int], succs: Sequence[int] | None = None) -> bool:
    """True when no path leaves ``mask`` and re-enters it (Korch Definition 1)."""
    succs = successors(preds) if succs is None else succs
    # Everything reachable from the nodes just outside the set; convex iff that misses the set.
    frontier = 0
    for v in bits(mask):
        frontier |= succs[v]
    frontier &= ~mask
    seen = frontier
    while frontier:
        nxt = 0
        for v in bits(frontier):
            nxt |= succs[v]
        if nxt & mask:
            return False
        frontier = nxt & ~seen
        seen |= nxt
    return True


def _ready(preds: Sequence[int], state: int, candidates: int) -> int:
    r = 0
    for v in bits(candidates):
        if preds[v] & ~state == 0:
            r |= 1 << v
    return r


def execution_states(preds: Sequence[int], cap: int = DEFAULT_CAPS.max_states) -> list[int]:
    """All downward-closed prim sets (∅ and the full set included), sorted by (size, value).

    Raises ``TooManyStates`` when there are more than ``cap``.
    """
    n = len(preds)
    succs = successors(preds)
    full = (1 << n) - 1
    start_ready = _ready(preds, 0, full)
    seen = {0}
    stack = [(0, start_ready)]
    while stack:
        state, ready = stack.pop()
        for v in bits(ready):
            nxt = state | (1 << v)
            if nxt in seen:
                continue
            seen.add(nxt)
            if len(seen) > cap:
                raise TooManyStates("execution states", cap)
            # Only successors of v can become ready by adding v.
            stack.append((nxt, (ready & ~(1 << v)) | _ready(preds, nxt, succs[v] & ~nxt)))
    return sorted(seen, key=lambda s: (s.bit_count(), s))


def convex_sets(states: Sequence[int], cap: int = DEFAULT_CAPS.max_convex,
                max_size: int | None = None) -> set[int]:
    """{D2 \\ D1 : D1 ⊂ D2 states}, deduplicated, non-empty; only sets of at most ``max_size`` prims.

    Raises ``TooManyStates`` when there are more than ``cap`` distinct sets.
    """
    state_set = set(states)
    width = max(states, default=0).bit_length()
    full = (1 << width) - 1
    # The state lattice: the states one prim above each state.
    up = {s: [s | (1 << v) for v in bits(full & ~s) if (s | (1 << v)) in state_set] for s in states}
    limit = width if max_size is None else max_size
    out: set[int] = set()
    for low in states:
        for level in levels_above(low, up, limit):
            for t in level:
                out.add(t & ~low)
            if len(out) > cap:
                raise TooManyStates("convex sets", cap)
    return out


def levels_above(low: int, up: Mapping[int, Sequence[int]], depth: int):
    """Breadth-first levels of the states above ``low`` in the lattice ``up`` (state -> the states
    one prim larger), level k holding those with k more prims, for at most ``depth`` levels."""
    level, seen = [low], {low}
    for _ in range(depth):
        nxt = []
        for s in level:
            for t in up[s]:
                if t not in seen:
                    seen.add(t)
                    nxt.append(t)
        if not nxt:
            return
        yield nxt
        level = nxt
