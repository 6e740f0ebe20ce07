"""Convolutions read channels-last activations: NCHW intermediates become NHWC.

A convolution in the GEMM view reads its activation ``x[n, c, oh·s + kh, ow·s + kw]`` over
K = (c, kh, kw): in NCHW no run of K is contiguous in memory (kw moves by one element for three
steps, then c jumps by H·W), so every activation value is a 2-byte gather that Triton can neither
vectorize nor copy asynchronously (issue #22: 43% of ResNet-50's load instructions were 16-byte).
Channels-last, with K ordered (kh, kw, c), a K chunk is a run of channels: 16-byte loads,
``cp.async``, pipelined, as cuDNN's and TensorRT's NHWC convolutions read.

The stage relabels tensors; it computes nothing anew.  The tensors relabeled are the 4-D
intermediates connected to a convolution (its activation input, its output) through prims that
keep dim 1 as the channel (batch norm, activations, residual adds, padding, pooling, another
convolution): each one's producer lists its axes as (n, h, w, c), every reader's load of it
permutes its index the same way, and each convolution over a relabeled activation sums over
(kh, kw, c) and reads its weight as ``[F, KH, KW, C]`` (a depthwise convolution's as ``[KH, KW, 1, C]``:
a tap's channels contiguous).  The weight is a constant re-laid out
once here (a copy the size of the weight: the layout the kernel reads, as the vendor libraries'
reformatted weights; beyond ``COPY_LIMIT`` too); a weight that is not a constant is relabeled as
an intermediate.  Graph inputs and outputs keep their layout, and so does a tensor an opaque prim
reads or produces.

``channels_padded``, a rewrite the planner weighs (``api.ALTERNATIVES``): a convolution over 3
to 7 channels (a stem over an image's three: a run of that few channels is no 16-byte vector)
reads a copy of its activation made channels-last with its channels padded with zeros to
``MIN_CHANNELS``, and a weight padded alike (TensorRT and cuDNN pad an image's channels for their
NHWC stems).  A tap is then one 16-byte vector: the stem's loads are async copies and its loop is
pipelined, for 8/C of the tensor-core work and a copy kernel (a launch; the planner may fuse the
copy with the activation's producer, or with the stem as a prologue, which gathers again).  The
padded products are zero times zero, so every sum is the same.  One or two channels stay
gathers: padding them would multiply the work by four to eight.

Over 3 or 4 channels with an even stride along the width (both stems), the copy has 4 channels
and a row of the image is one run of ``W·4`` values: the taps of one kernel row, ``KW·4`` values
side by side, are read as one K run ``j`` (padded with zero weights to a multiple of 8), so the
activation is read at ``x[n, ih, ow·s·4 + j]``, a 16-byte vector wherever ``s·4`` is a multiple
of 8.  K is ``KH·⌈KW·4/8⌉·8``: 224 for the 7 × 7 stem (147 as it is, 392 padded to 8 channels),
48 for a 3 × 3 (27, 72), and the copy is 4/3 the image, not 8/3.  A row is padded with zero
pixels where the last window's padded run reaches past it.

Exact: every value is the same; only addresses change (``verify`` checks the stage against eager).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..analysis.index import linear_form
from ..ir.dtypes import TensorType
from ..ir.expr import Binary, Const, Load, Var, binary, free_vars, select, transform, walk
from ..ir.prim import Constant, Prim, PrimGraph, Reduction

NHWC = (0, 2, 3, 1)          # dims of an NCHW tensor in channels-last order
TAPS_OUTER = (2, 3, 1, 0)    # dims of a depthwise weight [C, 1, KH, KW] as [KH, KW, 1, C]
MIN_CHANNELS = 8             # channels a K run needs to be a 16-byte fp16 vector
MIN_PADDED = 3               # fewest channels padded to MIN_CHANNELS (at most 8/3 the work)
ROW_CHANNELS = 4             # channels of a row-window copy: a pixel of 8 bytes


def channels_last(pg: PrimGraph) -> PrimGraph:
    """``pg`` with its convolutions' activations channels-last (module docstring); the same object
    when no convolution reads an intermediate activation of at least ``MIN_CHANNELS`` channels."""
    convs = {p.name: c for p in pg.prims if (c := _conv(p, pg)) is not None
             and pg.types[c[0]].shape[1] >= MIN_CHANNELS}
    region = _region(pg, convs)
    if not region:
        return pg
    pg = _depthwise_taps_outer(pg, region)
    # weights: constants re-laid out; intermediates relabeled; a graph input keeps its layout (and
    # then its convolution its K order: K runs would be gathers of the weight instead)
    weights: dict[str, str] = {}
    relabel = set(region)
    for name, (act, weight, _) in convs.items():
        if act not in region:
            continue
        if (weight in pg.constant_map and weight not in pg.outputs) or \
                (weight in pg.producers and _relabelable(weight, pg)):
            weights[name] = weight
            if weight in pg.producers:
                relabel.add(weight)
    moved = relabel | set(weights.values())
    # a relabeled tensor is another tensor: it gets its own name (what holds the old name's
    # values, ``verify`` among them, never meets the new layout under it)
    renamed = _renamed(sorted(moved), "_nhwc", set(pg.types))
    constants = tuple(Constant(renamed[c.name], c.data.permute(*NHWC).contiguous()) if c.name in moved else c
                      for c in pg.constants)
    prims = []
    for p in pg.prims:
        q = _reads_permuted(p, moved)
        axes, out = q.axes, q.out
        if p.name in relabel:
            axes, out = tuple(axes[d] for d in NHWC), type(out)(tuple(out.shape[d] for d in NHWC), out.dtype)
        q = Prim(renamed.get(q.name, q.name), tuple(renamed.get(n, n) for n in q.inputs), axes, q.body, out,
                 q.reduce, q.origin)
        if p.name in weights:
            q = _channels_inner(q, convs[p.name][2])
        prims.append(q)
    return PrimGraph(pg.inputs, constants, tuple(prims), pg.outputs)


def _renamed(names, suffix: str, taken: set) -> dict[str, str]:
    """A new name for each of ``names`` (``<name><suffix>``, lengthened until unused): a tensor
    laid out anew is another tensor, so what holds the old name's values (``verify`` among them)
    never meets the new layout under it."""
    out = {}
    for n in names:
        new = f"{n}{suffix}"
        while new in taken:
            new += "_"
        taken.add(new)
        out[n] = new
    return out


def _depthwise_taps_outer(pg: PrimGraph, region: set[str]) -> PrimGraph:
    """Each depthwise convolution over a relabeled activation reads its weight, a constant
    ``[C, 1, KH, KW]`` only it reads, as ``[KH, KW, 1, C]`` (a copy, as the other convolutions'
    weights): one tap of ``BLOCK_B`` channels is then a contiguous run, a 16-byte load, where
    the weight's own layout makes each tap a stride-KH·KW gather (the gemm family's stencil path,
    whose batch is the channels)."""
    consts = pg.constant_map
    moved: dict[str, tuple[str, int]] = {}        # prim -> (weight, slot)
    for p in pg.prims:
        if p.is_opaque or p.reduce is None or p.reduce.combiner != "sum" or p.out.rank != 4:
            continue
        if not any(n in region for n in p.inputs):
            continue
        for j, name in enumerate(p.inputs):
            c = consts.get(name)
            lds = [n for n in walk(p.body) if isinstance(n, Load) and n.tensor == j]
            if c is None or c.data.dim() != 4 or c.data.shape[1] != 1 or c.data.shape[0] < MIN_CHANNELS or \
                    name in pg.outputs or len(pg.consumers.get(name, ())) != 1 or not lds:
                continue
            if all(ld.index[0] is p.axes[1] and all(isinstance(v, Var) and v in p.reduce.axes for v in ld.index[1:])
                   for ld in lds):
                moved[p.name] = (name, j)
    if not moved:
        return pg
    renamed = _renamed(sorted(w for w, _ in moved.values()), "_taps", set(pg.types))
    constants = tuple(Constant(renamed[c.name], c.data.permute(*TAPS_OUTER).contiguous()) if c.name in renamed
                      else c for c in pg.constants)
    prims = []
    for p in pg.prims:
        if p.name in moved:
            w, j = moved[p.name]
            body = transform(p.body, lambda n: Load(j, tuple(n.index[d] for d in TAPS_OUTER), n.dtype)
                             if isinstance(n, Load) and n.tensor == j else None)
            p = Prim(p.name, tuple(renamed.get(n, n) if k == j else n for k, n in enumerate(p.inputs)), p.axes,
                     body, p.out, p.reduce, p.origin)
        prims.append(p)
    return PrimGraph(pg.inputs, constants, tuple(prims), pg.outputs)


def channels_padded(pg: PrimGraph) -> PrimGraph:
    """Each convolution over ``MIN_PADDED`` to ``MIN_CHANNELS - 1`` channels whose weight is a
    constant reads its activation from a zero-padded channels-last copy (one copy per activation
    and form) and its weight padded alike (the module docstring): as row windows (``_row_window``)
    where it can, else over ``MIN_CHANNELS`` channels summing over (kh, kw, c); the same object
    when there is none."""
    consts = pg.constant_map
    padded: dict[str, tuple[str, str, Var]] = {}
    rows: dict[str, _Rows] = {}
    for p in pg.prims:
        c = _conv(p, pg)
        if c is None:
            continue
        act, weight, var = c
        w = consts.get(weight)
        if not MIN_PADDED <= pg.types[act].shape[1] < MIN_CHANNELS or w is None or weight in pg.outputs \
                or not w.data.is_floating_point() or w.data.shape[1] != pg.types[act].shape[1]:
            continue
        j, k = p.inputs.index(act), p.inputs.index(weight)
        if all(ld.index[1] is var for ld in walk(p.body) if isinstance(ld, Load) and ld.tensor in (j, k)):
            window = _row_window(p, act, weight, var, pg)
            if window is not None:
                rows[p.name] = window
            else:
                padded[p.name] = c
    if not padded and not rows:
        return pg
    taken = set(pg.types)
    copies = _renamed(sorted({act for act, _, _ in padded.values()}), "_nhwc8", taken)
    weights = _renamed(sorted({w for _, w, _ in padded.values()}), "_nhwc8", taken)
    row_copies = _renamed(sorted({r.act for r in rows.values()}), "_rows4", taken)
    row_weights = _renamed(sorted({r.weight for r in rows.values()}), "_rows4", taken)
    widths = {a: max(r.width for r in rows.values() if r.act == a) for a in row_copies}
    runs = {r.weight: r.run for r in rows.values()}
    constants = []
    for c in pg.constants:
        # the weight itself stays only where a prim other than the padded convolutions reads it
        replaced = c.name in weights or c.name in row_weights
        if not replaced or any(q.name not in padded and q.name not in rows for q in pg.consumers.get(c.name, ())):
            constants.append(c)
        if c.name in weights:       # [F, C, KH, KW] -> [F, KH, KW, MIN_CHANNELS], zeros after C
            data = torch.nn.functional.pad(c.data, (0, 0, 0, 0, 0, MIN_CHANNELS - c.data.shape[1]))
            constants.append(Constant(weights[c.name], data.permute(*NHWC).contiguous()))
        if c.name in row_weights:   # [F, C, KH, KW] -> [F, KH, run]: w[f, c, kh, kw] at kw·4 + c
            data = torch.nn.functional.pad(c.data.permute(*NHWC), (0, ROW_CHANNELS - c.data.shape[1]))
            data = data.reshape(*data.shape[:2], -1)
            data = torch.nn.functional.pad(data, (0, runs[c.name] - data.shape[2]))
            constants.append(Constant(row_weights[c.name], data.contiguous()))
    prims, made = [], set()
    for p in pg.prims:
        if p.name in rows:
            r = rows[p.name]
            if ("rows", r.act) not in made:
                made.add(("rows", r.act))
                prims.append(_row_copy(r.act, row_copies[r.act], pg.types[r.act], widths[r.act], p.origin))
            prims.append(_row_windowed(p, r, row_copies[r.act], row_weights[r.weight]))
            continue
        if p.name not in padded:
            prims.append(p)
            continue
        act, weight, var = padded[p.name]
        if act not in made:
            made.add(act)
            prims.append(_padded_copy(act, copies[act], pg.types[act], p.origin))
        j, k = p.inputs.index(act), p.inputs.index(weight)
        body = transform(p.body, lambda n: Load(n.tensor, tuple(n.index[d] for d in NHWC), n.dtype)
                         if isinstance(n, Load) and n.tensor in (j, k) else None)
        inputs = tuple(copies[act] if s == j else weights[weight] if s == k else n for s, n in enumerate(p.inputs))
        r = p.reduce
        extents = tuple(MIN_CHANNELS if v is var else e for v, e in zip(r.axes, r.extents))
        prims.append(_channels_inner(Prim(p.name, inputs, p.axes, body, p.out,
                                          Reduction(r.axes, extents, r.combiner), p.origin), var))
    return PrimGraph(pg.inputs, tuple(constants), tuple(prims), pg.outputs)


def _padded_copy(src: str, name: str, t: TensorType, origin) -> Prim:
    """``name[n, h, w, c] = src[n, c, h, w]`` for c < C, zero up to ``MIN_CHANNELS``."""
    n, h, w, c = (Var(f"i{d}") for d in range(4))
    body = select(binary("lt", c, t.shape[1]), Load(0, (n, c, h, w), t.dtype), Const(0, t.dtype))
    shape = (t.shape[0], t.shape[2], t.shape[3], MIN_CHANNELS)
    return Prim(name, (src,), (n, h, w, c), body, TensorType(shape, t.dtype), None, origin)


@dataclass(frozen=True)
class _Rows:
    """A convolution read as row windows: its activation and weight; in the activation's index
    ``x[n, c, ih, stride·ow + kw]`` the channel and column variables and the window's start
    (kw = 0) as (ow, stride), ow None where the output is one column wide; the padded run of one
    kernel row's taps; the pixels a row of the copy needs (even: a row of the copy is a whole
    number of 16-byte vectors)."""
    act: str
    weight: str
    channel: Var
    column: Var
    start: tuple[Var | None, int]
    run: int
    width: int


def _row_window(p: Prim, act: str, weight: str, c: Var, pg: PrimGraph) -> _Rows | None:
    """``p`` as row windows (module docstring) where it reads at most ``ROW_CHANNELS`` channels,
    its activation's column is ``stride·ow + kw`` with ``stride·ROW_CHANNELS`` a multiple of 8
    (each window starts on a 16-byte boundary) or ``kw`` alone (one output column), kw stepping
    one pixel (no dilation), and the channel and kw appear nowhere but in the activation's and
    the weight's index."""
    t = pg.types[act]
    if t.shape[1] > ROW_CHANNELS:
        return None
    j, k = p.inputs.index(act), p.inputs.index(weight)
    acts = {ld for ld in walk(p.body) if isinstance(ld, Load) and ld.tensor == j}
    ws = {ld for ld in walk(p.body) if isinstance(ld, Load) and ld.tensor == k}
    if len(acts) != 1 or len(ws) != 1:
        return None
    (a,), (w,) = acts, ws
    kw = w.index[3]
    col = a.index[3]
    if col is kw:                   # one window a row (the output one column wide): it starts at 0
        start, v, stride = Const(0, kw.dtype), None, 2
    elif isinstance(col, Binary) and col.op == "add" and kw in (col.a, col.b):
        start = col.b if col.a is kw else col.a
        v, stride = _scaled(start)
        if v is None or stride * ROW_CHANNELS % 8 or v not in p.axes:
            return None
    else:
        return None
    if any(c in free_vars(e) or kw in free_vars(e) for e in (a.index[0], a.index[2], start, w.index[0], w.index[2])):
        return None
    outside = walk(p.body, lambda n: not (isinstance(n, Load) and n.tensor in (j, k)))
    if any(n is c or n is kw for n in outside):     # c and kw nowhere but in the two loads
        return None
    extent = dict(zip(p.reduce.axes, p.reduce.extents))
    run = -(-extent[kw] * ROW_CHANNELS // 8) * 8
    ow = p.out.shape[p.axes.index(v)] if v is not None else 1
    width = max(t.shape[3], stride * (ow - 1) + run // ROW_CHANNELS)
    return _Rows(act, weight, c, kw, (v, stride), run, width + width % 2)


def _scaled(e) -> tuple[Var | None, int]:
    """(v, s) where ``e`` is ``v·s`` (or v: s = 1) with s a constant; (None, 0) otherwise."""
    if isinstance(e, Var):
        return e, 1
    if isinstance(e, Binary) and e.op == "mul":
        for x, y in ((e.a, e.b), (e.b, e.a)):
            if isinstance(x, Var) and isinstance(y, Const):
                return x, int(y.value)
    return None, 0


def _row_copy(src: str, name: str, t: TensorType, width: int, origin) -> Prim:
    """``name[n, h, q] = src[n, q mod 4, h, q div 4]`` for a real channel and pixel, else zero:
    each row of the image with its pixels' channels side by side, ``width`` pixels long."""
    n, h, q = (Var(f"i{d}") for d in range(3))
    c, x = binary("mod", q, ROW_CHANNELS), binary("floordiv", q, ROW_CHANNELS)
    inside = binary("and", binary("lt", c, t.shape[1]), binary("lt", x, t.shape[3]))
    body = select(inside, Load(0, (n, c, h, x), t.dtype), Const(0, t.dtype))
    shape = (t.shape[0], t.shape[2], width * ROW_CHANNELS)
    return Prim(name, (src,), (n, h, q), body, TensorType(shape, t.dtype), None, origin)


def _row_windowed(p: Prim, r: _Rows, copy: str, weight: str) -> Prim:
    """``p`` summing over (its other reduced axes, kh, j), j the run of one kernel row's taps:
    ``copy[n, ih, ow·s·4 + j] · weight[f, kh, j]``."""
    j, k = p.inputs.index(r.act), p.inputs.index(r.weight)
    taken = {v.name for v in (*p.axes, *p.reduce.axes)}
    name = "rj"
    while name in taken:
        name += "_"
    run = Var(name)
    v, stride = r.start
    column = run if v is None else binary("add", binary("mul", v, stride * ROW_CHANNELS), run)

    def moved(n):
        if isinstance(n, Load) and n.tensor == j:
            return Load(j, (n.index[0], n.index[2], column), n.dtype)
        if isinstance(n, Load) and n.tensor == k:
            return Load(k, (n.index[0], n.index[2], run), n.dtype)
        return None
    red = p.reduce
    keep = [(a, e) for a, e in zip(red.axes, red.extents) if a is not r.channel and a is not r.column]
    reduce = Reduction(tuple(a for a, _ in keep) + (run,), tuple(e for _, e in keep) + (r.run,), red.combiner)
    inputs = tuple(copy if s == j else weight if s == k else n for s, n in enumerate(p.inputs))
    return Prim(p.name, inputs, p.axes, transform(p.body, moved), p.out, reduce, p.origin)


def _conv(p: Prim, pg: PrimGraph) -> tuple[str, str, Var] | None:
    """(activation, weight, channel variable) when ``p`` sums ``x[n, c, ...] · w[f, c, kh, kw]``
    over c and the window, with x a 4-D tensor."""
    if p.is_opaque or p.reduce is None or p.reduce.combiner != "sum" or p.out.rank != 4:
        return None
    reduced = set(p.reduce.axes)
    loads = {}
    for ld in walk(p.body):
        if isinstance(ld, Load) and len(ld.index) == 4:
            loads.setdefault(ld.tensor, ld)
    for a in loads.values():
        c = a.index[1]
        if not (isinstance(c, Var) and c in reduced):
            continue
        for w in loads.values():
            if w is a or w.index[1] is not c or not free_vars(w.index[0]) <= set(p.axes):
                continue
            window = w.index[2:]
            if all(isinstance(k, Var) and k in reduced and k is not c for k in window) and len(set(window)) == 2:
                return p.inputs[a.tensor], p.inputs[w.tensor], c
    return None


def _region(pg: PrimGraph, convs: dict) -> set[str]:
    """The relabeled tensors: from each convolution's activation and output, through prims that
    keep dim 1 the channel, the 4-D intermediates a relabeling can reach (``_relabelable``)."""
    seeds = [t for name, (act, _, _) in convs.items() for t in (act, name)]
    region: set[str] = set()
    work = [t for t in seeds if _relabelable(t, pg)]
    while work:
        t = work.pop()
        if t in region:
            continue
        region.add(t)
        # its producer's channel-keeping inputs, and its readers' outputs
        near = []
        if t not in convs:
            near += [n for n in _channel_inputs(pg.producers[t], pg)]
        for q in pg.consumers.get(t, ()):
            if q.name in convs or t in _channel_inputs(q, pg):
                near.append(q.name)
        work += [n for n in near if n not in region and _relabelable(n, pg)]
    return region


def _channel_inputs(p: Prim, pg: PrimGraph) -> list[str]:
    """The 4-D inputs ``p`` (a 4-D prim, not opaque) reads at its own channel (dim 1 index =
    its axis 1) in every load of them."""
    if p.is_opaque or p.out.rank != 4:
        return []
    out = []
    for j, name in enumerate(p.inputs):
        lds = [n for n in walk(p.body) if isinstance(n, Load) and n.tensor == j]
        if lds and pg.types[name].rank == 4 and all(_at_channel(ld.index[1], p) for ld in lds):
            out.append(name)
    return out


def _at_channel(e, p: Prim) -> bool:
    """Whether the index ``e`` is ``p``'s channel, its axis 1, plus at most reduced variables of
    extent 1: a depthwise convolution reads ``x[n, c + r, ...]`` over its group's one channel ``r``
    (MobileNetV2's first one, after the stem, was left reading NCHW: 2-byte loads)."""
    if e is p.axes[1]:
        return True
    ones = {v for v, n in zip(p.reduce.axes, p.reduce.extents) if n == 1} if p.reduce is not None else set()
    f = linear_form(e)
    return f.const == 0 and f.terms.get(p.axes[1]) == 1 and all(c == 1 and v in ones for v, c in f.terms.items()
                                                                if v is not p.axes[1])


def _relabelable(t: str, pg: PrimGraph) -> bool:
    """An intermediate 4-D tensor made and read by prims whose index maps can be rewritten."""
    p = pg.producers.get(t)
    if p is None or p.is_opaque or p.out.rank != 4 or t in pg.outputs:
        return False
    return not any(q.is_opaque for q in pg.consumers.get(t, ()))


def _reads_permuted(p: Prim, moved: set[str]) -> Prim:
    """``p`` reading each tensor of ``moved`` at its channels-last position."""
    slots = {j for j, n in enumerate(p.inputs) if n in moved}
    if not slots or p.is_opaque:
        return p
    body = transform(p.body, lambda n: Load(n.tensor, tuple(n.index[d] for d in NHWC), n.dtype)
                     if isinstance(n, Load) and n.tensor in slots else None)
    return Prim(p.name, p.inputs, p.axes, body, p.out, p.reduce, p.origin)


def _channels_inner(p: Prim, c: Var) -> Prim:
    """The convolution summing over its window first and the channel last: K runs of channels."""
    r = p.reduce
    order = [j for j, v in enumerate(r.axes) if v is not c] + [r.axes.index(c)]
    return Prim(p.name, p.inputs, p.axes, p.body, p.out,
                Reduction(tuple(r.axes[j] for j in order), tuple(r.extents[j] for j in order), r.combiner),
                p.origin)
