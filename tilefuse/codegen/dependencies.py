"""What each phase of a persistent kernel waits for (issue #25): whole earlier phases, or, where
the data allows it, only the earlier tasks whose tiles its own tiles touch.

``task_dependencies``: by tensor name, the earlier phases that write what a phase reads or writes,
or read what it writes; each edge at tile granularity where the data allows it (Souffle's
one-relies-on-one against one-relies-on-many), from each program's bounding boxes
(``codegen/regions.py``), else a barrier, barriers implied by another dropped; the persistent kernel reads them as done flags
(``codegen/triton/persistent.py``), the cost model as each task's waits (``cost/persistent.py``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .kernel import Kernel
from .regions import program_boxes


MAX_PAIRS = 1 << 18          # task pairs an edge's tile analysis may test; more: a phase barrier


@dataclass(frozen=True)
class Waits:
    """What each phase's tasks wait for: ``after[p]``, the phases waited for whole (their done
    counts); ``tiles[p]``, ``{phase d: per task of p, the tasks of d it waits for}`` (their done
    flags): the edges where a task touches what only some of the earlier phase's tasks do."""
    after: tuple[tuple[int, ...], ...]
    tiles: tuple[dict[int, tuple[tuple[int, ...], ...]], ...]

    def needs(self, p: int) -> list[list[tuple[int, int]]] | None:
        """Per task of phase ``p``, the (phase, task) pairs it waits for one by one; None: none."""
        if not self.tiles[p]:
            return None
        count = len(next(iter(self.tiles[p].values())))
        return [[(d, u) for d, per in sorted(self.tiles[p].items()) for u in per[t]] for t in range(count)]


def task_dependencies(kernels: Sequence[Kernel] | None, reads: Sequence[Sequence[str]],
                      writes: Sequence[Sequence[str]]) -> Waits:
    """Tile-level dependencies (Souffle's one-relies-on-one against one-relies-on-many): for each
    earlier phase ``d`` a phase touches (one that writes a tensor it reads or writes, or reads a
    tensor it writes; every such pair: a tile-level edge implies nothing about the phases behind
    it), each of its tasks waits for the tasks of ``d``
    whose boxes of a shared tensor meet its own (``codegen/regions.program_boxes``: what ``d``'s
    task writes and this one reads or writes, or ``d``'s reads and this one's writes); where every
    task needs every task of ``d`` (a GEMM's K over the whole activation, a row reduction over all
    columns), or the boxes are unknown, the edge is a phase barrier.  Barriers implied by another
    barrier are dropped (happens-before is transitive through whole phases), and so is a
    tile-level edge to a phase a barrier already orders.  Without ``kernels`` (None) every edge is
    a barrier: the dependencies by name alone.  The last few answers are kept (a run's analysis
    serves its plan, its source and its binary)."""
    return _waits(None if kernels is None else tuple(kernels), tuple(map(tuple, reads)), tuple(map(tuple, writes)))


@functools.lru_cache(maxsize=8)
def _waits(kernels, reads, writes) -> Waits:
    touched = [set(reads[q]) | set(writes[q]) for q in range(len(reads))]
    count: dict[str, int] = {}
    for t in touched:
        for n in t:
            count[n] = count.get(n, 0) + 1
    cache: dict[int, list | None] = {}

    def boxes(q: int):
        """Phase ``q``'s tasks' boxes of the tensors another phase touches too."""
        if kernels is None:
            return None
        if q not in cache:
            cache[q] = program_boxes(kernels[q], reads[q], writes[q], {n for n in touched[q] if count[n] > 1})
        return cache[q]

    after, tiles, before = [], [], []
    for p in range(len(reads)):
        r, w = set(reads[p]), set(writes[p])
        direct = [q for q in range(p) if set(writes[q]) & (r | w) or set(reads[q]) & w]
        whole, mine = [], {}
        for d in direct:
            shared = (set(writes[d]) & (r | w)) | (set(reads[d]) & w)
            bd, bp = boxes(d), boxes(p)
            if bd is None or bp is None or len(bd) * len(bp) > MAX_PAIRS:
                whole.append(d)
                continue
            hit = _conflicts(bd, bp, shared)
            need = tuple(tuple(int(u) for u in np.flatnonzero(row)) for row in hit)
            if all(len(n) == len(bd) for n in need):
                whole.append(d)
            elif any(need):             # (no task touching a task of ``d``'s: no edge at all)
                mine[d] = need
        closure = set().union(*(before[d] for d in whole)) if whole else set()
        after.append(tuple(sorted(set(whole) - closure)))
        tiles.append({d: n for d, n in mine.items() if d not in closure | set(whole)})
        before.append(set(whole) | closure)
    return Waits(tuple(after), tuple(tiles))


def _conflicts(earlier, later, shared) -> "np.ndarray":
    """``[later task, earlier task]``: whether the two touch a common element of a shared tensor
    that the earlier one writes, or that the earlier one reads and the later one writes (their
    boxes meet; ``earlier``/``later``: each task's boxes read and written)."""
    hit = np.zeros((len(later), len(earlier)), dtype=bool)
    for n in shared:
        ur, uw = (_stack(earlier, side, n) for side in (0, 1))
        tr, tw = (_stack(later, side, n) for side in (0, 1))
        hit |= _meets(tr, uw) | _meets(tw, uw) | _meets(tw, ur)
    return hit


def _stack(boxes, side: int, name: str) -> "np.ndarray":
    """``[task, dim, (lo, hi)]`` of each task's box of ``name`` read (``side`` 0) or written (1);
    an empty box (lo > hi) where the task does not touch it."""
    got = [b[side].get(name) for b in boxes]
    rank = next((len(x) for x in got if x is not None), 0)
    return np.array([x if x is not None else ((1, 0),) * rank for x in got], dtype=np.int64).reshape(len(got), rank, 2)


def _meets(a: "np.ndarray", b: "np.ndarray") -> "np.ndarray":
    """``[i, j]``: whether box ``a[i]`` and box ``b[j]`` share an element (every dimension's
    intervals overlap; an empty one overlaps nothing)."""
    if a.shape[1] != b.shape[1] or not a.size or not b.size:
        return np.zeros((a.shape[0], b.shape[0]), dtype=bool)
    lo_a, hi_a = a[:, None, :, 0], a[:, None, :, 1]
    lo_b, hi_b = b[None, :, :, 0], b[None, :, :, 1]
    return ((lo_a <= hi_b) & (lo_b <= hi_a) & (lo_a <= hi_a) & (lo_b <= hi_b)).all(axis=2)
