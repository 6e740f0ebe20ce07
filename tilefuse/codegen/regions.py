"""What each program of a kernel touches: per program (numbered as a launch numbers them,
program-id dimension 0 fastest), the bounding box of each tensor it reads or writes.

Welder's tile propagation over the kernel's own index expressions: a program-split axis covers
its tile of positions (through the task mapping the printer emits: row-major or group-M), an axis
walked inside the program its whole extent (or, ``within`` another, that one's tile), and each
load's and store's index is bounded over those ranges (``analysis/index``).  A box holds at least
every element the program touches: a data-dependent index spans its dimension, a loop's bounds
(causal, windowed) are ignored.  So two programs whose boxes of a tensor do not meet touch no
common element of it: what a persistent kernel's tile-level dependencies rest on
(``codegen/dependencies.task_dependencies``).  A kernel whose writes depend on which program
runs them (an ``Arrive``'s tail: the last of a group to arrive) has no boxes (None).
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import fields, is_dataclass
from typing import Collection, Sequence

from ..analysis.index import Analyzer
from ..ir.expr import Expr, Load, Var, walk
from .kernel import Arrive, Kernel, Store, TileAxis

Box = tuple[tuple[int, int], ...]
MAX_PROGRAMS = 4096          # more programs than this: no boxes (the analysis would cost seconds)


def program_boxes(k: Kernel, ins: Sequence[str], outs: Sequence[str],
                  wanted: Collection[str]) -> list[tuple[dict[str, Box], dict[str, Box]]] | None:
    """Per program, ``({tensor: box read}, {tensor: box written})`` for the tensors in ``wanted``
    (``ins``/``outs``: the kernel's input and output slots' names); None where a program's writes
    are not its own (an ``Arrive``), or the grid is over ``MAX_PROGRAMS``.  The last answers are
    kept, up to ``MEMO_PROGRAMS`` programs' boxes in all (a persistent run is analysed again with
    one of its kernels re-tiled: the others' boxes are the same); the answer is shared, not to be
    changed."""
    global _memo_programs
    key = (id(k), tuple(ins), tuple(outs), frozenset(wanted))
    with _MEMO_LOCK:
        got = _MEMO.get(key)
        if got is not None and got[0] is k:          # (the kernel kept alive: its id is its own)
            _MEMO.move_to_end(key)
            return got[1]
    out = _program_boxes(k, ins, outs, wanted)
    with _MEMO_LOCK:
        if key not in _MEMO:
            _MEMO[key] = (k, out)
            _memo_programs += len(out or ())
        while _memo_programs > MEMO_PROGRAMS and len(_MEMO) > 1:
            _, (_, old) = _MEMO.popitem(last=False)
            _memo_programs -= len(old or ())
    return out


MEMO_PROGRAMS = 1 << 16      # programs' boxes kept (a BERT-base run: ~8,000)
_MEMO: OrderedDict = OrderedDict()
_MEMO_LOCK = threading.Lock()
_memo_programs = 0


def _program_boxes(k: Kernel, ins: Sequence[str], outs: Sequence[str], wanted: Collection[str]):
    programs = math.prod(k.grid)
    if programs > MAX_PROGRAMS or k.empty or any(0 in a.ext for a in k.axes):
        return None         # (an empty loop axis: no position to bound; a whole-phase wait)
    loads: list[Load] = []
    stores: list[Store] = []
    if not _collect(k.body, loads, stores):
        return None
    loads = [ld for ld in loads if ins[ld.tensor] in wanted]
    stores = [st for st in stores if outs[st.output] in wanted]
    maps = [k.task_mapping(g) for g in range(len(k.grid))]
    out, memo = [], {}
    for pid in range(programs):
        an = Analyzer(_ranges(k, pid, maps), _lin_memo=memo)
        read: dict[str, list] = {}
        written: dict[str, list] = {}
        for ld in loads:
            _merge(read, ins[ld.tensor], _box(an, ld.index, k.inputs[ld.tensor].shape))
        for st in stores:
            _merge(written, outs[st.output], _box(an, st.index, k.outputs[st.output].shape))
        out.append(({n: tuple(b) for n, b in read.items()}, {n: tuple(b) for n, b in written.items()}))
    return out


def _collect(body, loads: list, stores: list) -> bool:
    """Every load and store of ``body`` (through loops, states, dots); False at an ``Arrive``."""
    ok = True

    def visit(x) -> None:
        nonlocal ok
        if isinstance(x, Arrive):
            ok = False
        elif isinstance(x, Expr):
            loads.extend(n for n in walk(x) if isinstance(n, Load))
        elif isinstance(x, tuple):
            for y in x:
                visit(y)
        elif is_dataclass(x):
            if isinstance(x, Store):
                stores.append(x)
            for f in fields(x):
                visit(getattr(x, f.name))
    visit(body)
    return ok


def _ranges(k: Kernel, pid: int, maps) -> dict[Var, tuple[int, int]]:
    """The variables' ranges in program ``pid``: each program-split axis over its tiles (through
    its dimension's task mapping; the span of them where a program takes several), a ``within``
    axis over its parent's, the rest whole."""
    tiles: dict[str, tuple[int, int]] = {}
    for g, m in enumerate(maps):
        p = pid % k.grid[g]
        pid //= k.grid[g]
        axes = k.sharing(g)
        for t in m(p):
            for a, i in zip(axes, t):
                lo, hi = tiles.get(a.name, (i, i))
                tiles[a.name] = (min(lo, i), max(hi, i))
    out: dict[Var, tuple[int, int]] = {}
    for a in k.axes:
        if a.name in tiles:
            first, last = tiles[a.name]
            lo, hi = first * a.block, (last + 1) * a.block - 1
        elif a.within:
            first, last = tiles[a.within]
            lo, hi = first * a.span, (last + 1) * a.span - 1
        else:
            lo, hi = 0, a.extent - 1
        out.update(_unravel(a, lo, min(hi, a.extent - 1)))
    return out


def _unravel(a: TileAxis, lo: int, hi: int) -> dict[Var, tuple[int, int]]:
    """Each of the axis's variables' range over its linear positions ``lo..hi`` (row-major): a
    variable whole once the positions cross its outer one's value."""
    out, inner = {}, 1
    for v, n in zip(reversed(a.vars), reversed(a.ext)):
        a0, a1 = lo // inner, hi // inner
        out[v] = (a0 % n, a1 % n) if a0 // n == a1 // n else (0, n - 1)
        inner *= n
    return out


def _box(an: Analyzer, index, shape) -> list[tuple[int, int]]:
    box = []
    for e, n in zip(index, shape):
        lo, hi = an.bounds(e)
        box.append((max(int(lo) if math.isfinite(lo) else 0, 0), min(int(hi) if math.isfinite(hi) else n - 1, n - 1)))
    return box


def _merge(boxes: dict, name: str, box: list) -> None:
    got = boxes.get(name)
    boxes[name] = box if got is None else [(min(a, c), max(b, d)) for (a, b), (c, d) in zip(got, box)]
