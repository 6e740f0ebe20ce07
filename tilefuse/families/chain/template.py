"""The chain family's template: a chain body and tile as a tile-level kernel (``codegen/kernel.py``).

Tile axes: ``m`` (BLOCK_M rows, dimension 0) and ``h`` (BLOCK_H columns of the second product,
dimension 1; split across programs with ``m`` when BLOCK_H < H), ``b`` the batch (one position per
program), ``n`` the keys (BLOCK_N, dimension 1 of the score tile, looped) with its alias ``nv``
(dimension 0 of the value tile), ``e`` the first product's reduction (dimension 0 of the key tile,
whole or looped inside the key loop) with its alias ``ea`` (dimension 1 of the query tile).

Body: one ``Loop`` over the keys carrying the fp32 accumulator (and, with the online softmax, the
running row max and row sum).  Each chunk: the score tile ``Dot`` (Q·Kᵀ over ``e``), then, online,
the chunk's row max, the new running max (``m_safe``: 0 while the row is all -inf, so that no
``-inf - -inf`` appears), ``p = exp(score - m_safe)`` and its row sum, the rescale factor
``alpha = exp(old max - m_safe)``; the second ``Dot`` accumulates ``p·V`` into ``alpha × acc``.
After the loop the second contraction's value is the accumulator times the softmax's row-only
coefficient (``1/sum``, guarded), rounded to its type; the epilogue's stores follow.  The
exponentials are base 2, log2(e) folded into the scores' scale (``_base2``).  A causal key loop
without a window is split as FlashAttention's: a ``Loop`` with ``until`` over the chunks no row
of the tile masks (the mask's comparisons folded to constants: ``body.unmasked``), then the
bounded loop over the diagonal chunks, which ``resume``s it.
"""
from __future__ import annotations

import math
from dataclasses import replace

from ...analysis.index import extent_ranges
from ...codegen.kernel import Dot, Kernel, Loop, State, Store, TileAxis
from ...codegen.reduction import reduction
from ...ir.dtypes import DType
from ...ir.expr import Binary, Const, Select, Unary, Value, Var, binary, cast, select, substitute, transform, unary
from ...transform.simplify import simplify
from .body import unmasked

MAX_GRID_1 = 65535      # CUDA's limit on the second grid dimension (the batch)


LOG2E = 1.4426950408889634


def _base2(e):
    """``exp(a - b)`` in fp32 as ``exp2(a·log2(e) - b·log2(e))``, the factor folded into a's
    constant scale (the softmax scale): what ``tl.exp`` computes anyway (ex2 of a product), one
    fused multiply-add per score instead of a multiply, a subtraction and a multiply."""
    def fn(n):
        if isinstance(n, Unary) and n.op == "exp" and n.x.dtype is DType.float32 and getattr(n.x, "op", None) == "sub":
            return unary("exp2", binary("sub", _log2e(n.x.a), _log2e(n.x.b)))
        return None
    return transform(e, fn)


def _log2e(x):
    """``x·log2(e)``, folded into a constant factor of ``x`` or through a select of -inf."""
    if isinstance(x, Binary) and x.op == "mul" and isinstance(x.b, Const):
        return binary("mul", x.a, Const(x.b.value * LOG2E, x.dtype))
    if isinstance(x, Binary) and x.op == "mul" and isinstance(x.a, Const):
        return binary("mul", Const(x.a.value * LOG2E, x.dtype), x.b)
    if isinstance(x, Select) and isinstance(x.b, Const) and x.b.value == -math.inf:
        return select(x.cond, _log2e(x.a), x.b)
    return binary("mul", x, Const(LOG2E, x.dtype))


def chain_kernel(b, t, name: str) -> Kernel:
    """The kernel computing chain body ``b`` with tile ``t`` under the function name ``name``."""
    types, ext = b.group.types, b.ext
    batch = b.extent(b.bvars)
    if batch > MAX_GRID_1:
        raise ValueError(f"{name}: batch of {batch} exceeds the grid's second dimension")
    extent = lambda vs: tuple(ext[v] for v in vs)  # noqa: E731
    kav = tuple(Var(f"ka{j}") for j in range(len(b.kvars)))
    nvv = tuple(Var(f"nv{j}") for j in range(len(b.nvars)))
    h_split = t.bh < b.extent(b.hvars)
    axes = [TileAxis("m", b.mvars, extent(b.mvars), t.bm, 0, grid=0, block_name="BLOCK_M"),
            TileAxis("h", b.hvars, extent(b.hvars), t.bh, 1, grid=0 if h_split else None, block_name="BLOCK_H"),
            TileAxis("n", b.nvars, extent(b.nvars), t.bn, 1, block_name="BLOCK_N"),
            TileAxis("nv", nvv, extent(b.nvars), t.bn, 0, block_name="BLOCK_N", alias="n"),
            TileAxis("e", b.kvars, extent(b.kvars), t.bk, 0, block_name="BLOCK_K"),
            TileAxis("ea", kav, extent(b.kvars), t.bk, 1, block_name="BLOCK_K", alias="e")]
    if b.bvars:
        axes.append(TileAxis("b", b.bvars, extent(b.bvars), 1, -1, grid=1, block_name="BLOCK_B"))
    S = b.slot
    base = S + 1 + len(b.instances)
    MXC, SMC, D2, MI, LI, ACC = range(base, base + 6)
    f32 = DType.float32
    acc = Value(ACC, f32)
    shape = (batch, b.extent(b.mvars), b.extent(b.nvars), b.extent(b.kvars), b.extent(b.hvars))
    note = "{}: {} x [{} x {}] @ [{} x {}]".format(b.first, shape[0], shape[1], shape[3], shape[3], shape[2])
    first = Dot(S, substitute(b.a, dict(zip(b.kvars, kav))), b.b, "m", "n", "e", "ea", b.in1, b.s_dtype, note)
    d = substitute(b.d, dict(zip(b.nvars, nvv)))
    note2 = "{}: {} x [{} x {}] @ [{} x {}]".format(b.second, shape[0], shape[1], shape[2], shape[2], shape[4])
    sm = b.softmax
    open_body = ()                  # the loop's body over the chunks no row masks (a causal split)
    if sm is None:
        body = (first, Dot(D2, b.p, d, "m", "h", "nv", "n", b.in2, f32, note2, init=acc))
        state = (State(ACC, ("m", "h"), Const(0.0, f32), Value(D2, f32)),)
        value = acc
    else:
        mx, total = (next(i for i in b.instances if i.slot == x) for x in (sm.max_slot, sm.sum_slot))
        running, rsum = Value(MI, mx.dtype), Value(LI, total.dtype)
        m_new = binary("max", running, Value(MXC, mx.dtype))
        neg_inf = Const(-math.inf, mx.dtype)
        m_safe = select(binary("eq", m_new, neg_inf), Const(0.0, mx.dtype), m_new)
        top = Value(sm.max_slot, mx.dtype)
        p = _base2(transform(sm.exp_term, lambda n: m_safe if n is top else None))
        alpha = _base2(unary("exp", binary("sub", running, m_safe)))
        body = (first,
                reduction(replace(mx, slot=MXC), sm.score, "n"),
                reduction(replace(total, slot=SMC), p, "n"),
                Dot(D2, p, d, "m", "h", "nv", "n", b.in2, f32, note2,
                    init=binary("mul", acc, cast(alpha, f32))))
        state = (State(MI, ("m",), neg_inf, m_new),
                 State(LI, ("m",), Const(0.0, total.dtype),
                       binary("add", binary("mul", rsum, cast(alpha, total.dtype)), Value(SMC, total.dtype))),
                 State(ACC, ("m", "h"), Const(0.0, f32), Value(D2, f32)))
        if b.causal is not None and b.window is None:
            # FlashAttention's split: the key chunks no row of the tile masks run without the
            # mask's compares and selects; the diagonal chunks after them with it
            free = lambda e: unmasked(e, b.mvars, b.nvars, b.ext, b.causal)  # noqa: E731
            if free(sm.score) is not sm.score:
                open_body = (first,
                             reduction(replace(mx, slot=MXC), free(sm.score), "n"),
                             reduction(replace(total, slot=SMC), free(p), "n"),
                             Dot(D2, free(p), d, "m", "h", "nv", "n", b.in2, f32, note2,
                                 init=binary("mul", acc, cast(alpha, f32))))
        last = {sm.max_slot: running, sm.sum_slot: rsum}
        coeff = transform(sm.coeff, lambda n: last.get(n.slot) if isinstance(n, Value) else None)
        value = binary("mul", cast(coeff, f32), acc)
    value = cast(value, b.c_dtype)
    out = Value(S, b.c_dtype)
    ranges = extent_ranges({v: ext[v] for v in b.avars})
    stores = tuple(Store(j, tuple(simplify(e, ranges) for e in st.index),
                         simplify(transform(st.value, lambda n: value if n is out else None), ranges))
                   for j, st in enumerate(b.stores))
    origins = dict.fromkeys(str(p.origin) for p in b.group.prims)
    comments = (f"{name}: chain kernel (tilefuse), {b.first} -> {b.second}, {t}",
                f"E = {'softmax' if sm else 'f'}(A[{shape[1]} x {shape[3]}] @ B[{shape[3]} x {shape[2]}]) @ "
                f"D[{shape[2]} x {shape[4]}], batch {shape[0]}; the scores stay on chip"
                + (" (online softmax)" if sm else ""),
                "implements:", *(f"  {o}" for o in origins),
                f"inputs:  {', '.join(f'in{k}={n}' for k, n in enumerate(b.inputs))}",
                f"outputs: {', '.join(f'out{k}={st.tensor}' for k, st in enumerate(b.stores))}")
    causal, window = None if b.causal is None else ("m", b.causal), None if b.window is None else ("m", b.window)
    if open_body:
        loops = (Loop("n", open_body, state, until=causal), Loop("n", body, state, causal, window, resume=True))
    else:
        loops = (Loop("n", body, state, causal, window),)
    return Kernel(name, tuple(types[n] for n in b.inputs), tuple(types[st.tensor] for st in b.stores), tuple(axes),
                  loops + stores, t.warps, t.stages, comments, tma=t.tma)
