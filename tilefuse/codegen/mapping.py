"""Hidet task mappings (§5.1; shared/papers/hidet-notes.md §2.1, §3.1): which worker runs which
tasks, and in what order, as small composable objects.

A mapping has ``workers`` workers and a task ``shape``; ``m(w)`` is worker w's ordered list of task
tuples.  ``repeat(*d)``: one worker runs the whole grid, row-major; ``spatial(*d)``: one task per
worker, the worker id unravelled row-major; ``f1 * f2`` (composition f1 ∘ f2): ``n1·n2`` workers,
shape ``d1 ⊙ d2``, worker w runs ``t1 ⊙ d2 + t2`` for t1 in f1(w // n2) (outer) and t2 in
f2(w % n2) (inner); associative, not commutative.  ``group_m(rows, cols, g)`` is the custom
mapping of Triton's matmul tutorial: programs walk ``g`` row tiles down before moving one column
right, so the programs resident together share operand panels in L2.

Triton exposes only the program level (hidet-notes "Expressing task mappings for Triton"): a
kernel's program-id dimension shared by several tile axes is a mapping from the program id to
tile coordinates.  ``expand(w)`` gives the tasks as index expressions of a symbolic worker (IR
``Expr``s: div/mod for ``spatial``, constants for ``repeat``), which the Triton printer emits as
the program's tile coordinates (``codegen/triton/emit.py``); ``__call__`` is the same mapping on
integers, for tests and for reasoning about schedules.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable

from ..ir.expr import INDEX, Const, Expr, binary


@dataclass(frozen=True)
class TaskMapping:
    workers: int
    shape: tuple[int, ...]
    run: Callable[[int], list]                 # worker -> ordered task tuples (integers)
    expand: Callable[[Expr], list]             # symbolic worker -> ordered task tuples (Exprs)
    name: str = ""
    cover: Callable[[int], tuple] | None = None   # closed form of ``window`` (None: enumerate)

    def window(self, workers: int) -> tuple[int, ...]:
        """Per task dimension, how many distinct coordinates the tasks of the first ``workers``
        workers take: the tiles the programs resident at once work on (the cost model's L2
        window)."""
        workers = max(min(workers, self.workers), 1)
        if self.cover is not None:
            return self.cover(workers)
        seen = [set() for _ in self.shape]
        for w in range(workers):
            for t in self.run(w):
                for s, x in zip(seen, t):
                    s.add(x)
        return tuple(max(len(s), 1) for s in seen)

    def __call__(self, w: int) -> list[tuple[int, ...]]:
        if not 0 <= w < self.workers:
            raise ValueError(f"worker {w} outside {self.name} ({self.workers} workers)")
        return self.run(w)

    def __mul__(self, inner: "TaskMapping") -> "TaskMapping":
        """Composition ``self ∘ inner``: each instance of ``inner`` is one macro-task of ``self``."""
        outer = self
        if len(outer.shape) != len(inner.shape):
            raise ValueError(f"cannot compose {outer.name} (rank {len(outer.shape)}) with {inner.name} "
                             f"(rank {len(inner.shape)})")
        d2, n2 = inner.shape, inner.workers

        def combine(t1, t2, mul, add):
            return tuple(add(mul(a, d), b) for a, b, d in zip(t1, t2, d2))

        def run(w: int):
            return [combine(t1, t2, lambda a, d: a * d, lambda x, y: x + y)
                    for t1 in outer.run(w // n2) for t2 in inner.run(w % n2)]

        def expand(w: Expr):
            hi = binary("floordiv", w, Const(n2, INDEX)) if n2 > 1 else w
            lo = Const(0, INDEX) if n2 == 1 else binary("mod", w, Const(n2, INDEX)) if outer.workers > 1 else w
            return [combine(t1, t2, lambda a, d: _mul(a, d), lambda x, y: _add(x, y))
                    for t1 in outer.expand(hi) for t2 in inner.expand(lo)]

        return TaskMapping(outer.workers * n2, tuple(a * b for a, b in zip(outer.shape, d2)), run, expand,
                           f"{outer.name}*{inner.name}")


def repeat(*d: int) -> TaskMapping:
    """One worker runs the whole grid of tasks, row-major."""
    tasks = list(itertools.product(*map(range, d)))
    return TaskMapping(1, tuple(d), lambda w: list(tasks),
                       lambda w: [tuple(Const(i, INDEX) for i in t) for t in tasks], f"repeat{tuple(d)}")


def spatial(*d: int) -> TaskMapping:
    """One task per worker: the worker id unravelled row-major over the grid."""
    strides = [math.prod(d[i + 1:]) for i in range(len(d))]

    def run(w: int):
        return [tuple((w // s) % n for s, n in zip(strides, d))]

    def expand(w: Expr):
        out = []
        for i, (s, n) in enumerate(zip(strides, d)):
            e = w if s == 1 else binary("floordiv", w, Const(s, INDEX))
            if i > 0 and n > 1:            # the slowest dimension needs no wrap
                e = binary("mod", e, Const(n, INDEX))
            out.append(e if n > 1 else Const(0, INDEX))
        return [tuple(out)]

    def cover(w: int) -> tuple[int, ...]:
        out = []
        for n in reversed(d):               # the fastest dimension first
            out.append(max(min(n, w), 1))
            w = -(-w // n)
        return tuple(reversed(out))

    return TaskMapping(math.prod(d), tuple(d), run, expand, f"spatial{tuple(d)}", cover)


def group_m(rows: int, cols: int, g: int) -> TaskMapping:
    """Programs over a rows × cols grid of tiles in group-M order: a group of ``g`` row tiles
    (fewer in the last group) is walked column by column, each column top to bottom."""
    width = g * cols

    def run(w: int):
        group, r = divmod(w, width)
        first = group * g
        size = min(rows - first, g)
        return [(first + r % size, r // size)]

    def expand(w: Expr):
        group = binary("floordiv", w, Const(width, INDEX))
        r = binary("mod", w, Const(width, INDEX))
        first = binary("mul", group, Const(g, INDEX))
        size = Const(g, INDEX) if rows % g == 0 else binary("min", binary("sub", Const(rows, INDEX), first),
                                                          Const(g, INDEX))
        return [(binary("add", first, binary("mod", r, size)), binary("floordiv", r, size))]

    def cover(w: int) -> tuple[int, int]:
        # one group's rows, as many columns as the workers fill (a window spanning several groups
        # is charged as one group's: the re-read count errs high)
        tall = min(rows, g)
        return tall, max(min(cols, w // tall), 1)

    return TaskMapping(rows * cols, (rows, cols), run, expand, f"group_m({rows}, {cols}, {g})", cover)


def _mul(a: Expr, d: int) -> Expr:
    if isinstance(a, Const):
        return Const(a.value * d, INDEX)
    return a if d == 1 else binary("mul", a, Const(d, INDEX))


def _add(x: Expr, y: Expr) -> Expr:
    if isinstance(y, Const) and y.value == 0:
        return x
    if isinstance(x, Const) and x.value == 0:
        return y
    return binary("add", x, y)
