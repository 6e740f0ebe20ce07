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
exponentials are base 2, log2(e) folded into the scores' scale (``_base2``) where the scores are
the product times constants (a mask of finite fill, fp32's or bf16's most negative value, would
overflow to -inf times log2(e): the difference is taken first there).  A causal key loop
without a window is split as FlashAttention's: a ``Loop`` with ``until`` over the chunks no row
of the tile masks (the mask's comparisons folded to constants: ``body.unmasked``), then the
bounded loop over the diagonal chunks, which ``resume``s it.  With the keys split across programs
(``t.split``; ``split_kernels``) the loop runs over one split's keys and a second kernel combines
the splits: flash-decoding under a softmax, a plain sum of the second product's partial sums in a
GEMM chain.
"""
from __future__ import annotations

import math
from dataclasses import replace

from ...analysis.index import extent_ranges
from ...codegen.kernel import (WS_MIN_BM, WS_WARPS, Arrive, Dot, Kernel, Loop, Reduce, State, Store, TileAxis, pow2,
                               shifted)
from ...codegen.reduction import reduction
from ...ir.dtypes import DType, TensorType
from ...ir.expr import Binary, Const, Load, Select, Unary, Value, Var, binary, cast, select, substitute, transform, \
    unary
from ...transform.simplify import simplify
from ..anchor import unravel
from .body import unmasked

MAX_GRID_1 = 65535      # CUDA's limit on the second grid dimension (the batch)
COMBINE_BLOCK = 2048    # elements (rows x H x splits) per program of flash-decoding's combine
UNROLLED_VALUES = 64    # fp32 values a thread holds of the splits' shares in an unrolled in-launch combine


LOG2E = 1.4426950408889634


def _base2(e, fold: bool = True):
    """``exp(a - b)`` in fp32 as ``exp2(a·log2(e) - b·log2(e))``, the factor folded into a's
    constant scale (the softmax scale): what ``tl.exp`` computes anyway (ex2 of a product), one
    fused multiply-add per score instead of a multiply, a subtraction and a multiply.  Without
    ``fold`` (scores that may lie beyond fp32's largest value over log2(e): a mask written as the
    type's most negative finite value, ``masked_fill(~mask, finfo.min)`` or added to the scores),
    ``exp2((a - b)·log2(e))``: the difference first, so a row masked whole is 0 - 0, uniform as
    eager's softmax gives it, not -inf - -inf (NaN)."""
    def fn(n):
        if isinstance(n, Unary) and n.op == "exp" and n.x.dtype is DType.float32 and getattr(n.x, "op", None) == "sub":
            if not fold:
                return unary("exp2", binary("mul", n.x, Const(LOG2E, n.x.dtype)))
            return unary("exp2", binary("sub", _log2e(n.x.a), _log2e(n.x.b)))
        return None
    return transform(e, fn)


def _scaled_scores(x, slot: int) -> bool:
    """Whether ``x`` is the first product's scores (``Value(slot)``) times constants, masked to
    -inf: its ``x·log2(e)`` is finite wherever the scores are (``_base2``'s fold is exact)."""
    if isinstance(x, Value):
        return x.slot == slot
    if isinstance(x, Binary) and x.op == "mul" and isinstance(x.b, Const):
        return _scaled_scores(x.a, slot)
    if isinstance(x, Binary) and x.op == "mul" and isinstance(x.a, Const):
        return _scaled_scores(x.b, slot)
    if isinstance(x, Select) and isinstance(x.b, Const) and x.b.value == -math.inf:
        return _scaled_scores(x.a, slot)
    return False


def _log2e(x):
    """``x·log2(e)``, folded into a constant factor of ``x`` or through a select of -inf."""
    if isinstance(x, Binary) and x.op == "mul" and isinstance(x.b, Const):
        return binary("mul", x.a, Const(x.b.value * LOG2E, x.dtype))
    if isinstance(x, Binary) and x.op == "mul" and isinstance(x.a, Const):
        return binary("mul", Const(x.a.value * LOG2E, x.dtype), x.b)
    if isinstance(x, Select) and isinstance(x.b, Const) and x.b.value == -math.inf:
        return select(x.cond, _log2e(x.a), x.b)
    return binary("mul", x, Const(LOG2E, x.dtype))


def chain_kernels(b, t, name: str) -> tuple[Kernel, ...]:
    """The kernels computing chain body ``b`` with tile ``t``: one, or with the keys split
    (``t.split`` > 1: flash-decoding) the partials and their combine (``split_kernels``)."""
    if t.split == 1:
        return (chain_kernel(b, t, name),)
    return (split_in_launch(b, t, name),) if t.in_launch else split_kernels(b, t, name)


def chain_kernel(b, t, name: str, split: bool = False) -> Kernel:
    """The kernel computing chain body ``b`` with tile ``t`` under the function name ``name``;
    ``split``: the partials of ``t.split`` key ranges instead (``split_kernels``)."""
    types, ext = b.group.types, b.ext
    batch = b.extent(b.bvars)
    if batch > MAX_GRID_1:
        raise ValueError(f"{name}: batch of {batch} exceeds the grid's second dimension")
    if t.ws and not (t.tma and t.warps == WS_WARPS and t.bm >= WS_MIN_BM and t.split == 1 and not split
                     and t.bk >= b.extent(b.kvars) and t.bh >= b.extent(b.hvars) and b.window is None):
        # (a sliding window's loop starts per row tile: not tried under Triton's pass)
        raise ValueError(f"{name}: a warp-specialized key loop needs tensor descriptors, {WS_WARPS} warps a "
                         f"group, BLOCK_M of {WS_MIN_BM} or more, K and H whole and no window or key "
                         f"split (tile {t})")
    extent = lambda vs: tuple(ext[v] for v in vs)  # noqa: E731
    kav = tuple(Var(f"ka{j}") for j in range(len(b.kvars)))
    nvv = tuple(Var(f"nv{j}") for j in range(len(b.nvars)))
    h_split = t.bh < b.extent(b.hvars)
    keys, to_n, to_nv = b.nvars, {}, dict(zip(b.nvars, nvv))
    kext = extent(b.nvars)
    if split:       # the keys of one split: local positions ``nl`` (alias ``nvl``) from s·chunk on
        keys, nvv = (Var("nl"),), (Var("nvl"),)
        kext = (b.extent(b.nvars) // t.split,)
        to_n, to_nv = _split_keys(b, keys[0], kext[0]), _split_keys(b, nvv[0], kext[0])
    axes = [TileAxis("m", b.mvars, extent(b.mvars), t.bm, 0, grid=0, block_name="BLOCK_M"),
            TileAxis("h", b.hvars, extent(b.hvars), t.bh, 1, grid=0 if h_split else None, block_name="BLOCK_H"),
            TileAxis("n", keys, kext, t.bn, 1, block_name="BLOCK_N"),
            TileAxis("nv", nvv, kext, t.bn, 0, block_name="BLOCK_N", alias="n"),
            TileAxis("e", b.kvars, extent(b.kvars), t.bk, 0, block_name="BLOCK_K"),
            TileAxis("ea", kav, extent(b.kvars), t.bk, 1, block_name="BLOCK_K", alias="e")]
    if b.bvars:
        axes.append(TileAxis("b", b.bvars, extent(b.bvars), 1, -1, grid=1, block_name="BLOCK_B"))
    if split:
        axes.append(TileAxis("s", (Var("s"),), (t.split,), 1, -1, grid=2 if b.bvars else 1, block_name="BLOCK_S"))
    S = b.slot
    base = S + 1 + len(b.instances)
    MXC, SMC, D2, MI, LI, ACC = range(base, base + 6)
    f32 = DType.float32
    acc = Value(ACC, f32)
    shape = (batch, b.extent(b.mvars), b.extent(b.nvars), b.extent(b.kvars), b.extent(b.hvars))
    note = "{}: {} x [{} x {}] @ [{} x {}]".format(b.first, shape[0], shape[1], shape[3], shape[3], shape[2])
    if split:
        note += f", keys split {t.split} ways"
    first = Dot(S, substitute(b.a, dict(zip(b.kvars, kav))), substitute(b.b, to_n), "m", "n", "e", "ea", b.in1,
                b.s_dtype, note)
    d = substitute(b.d, to_nv)
    note2 = "{}: {} x [{} x {}] @ [{} x {}]".format(b.second, shape[0], shape[1], shape[2], shape[2], shape[4])
    sm = b.softmax
    open_body = ()                  # the loop's body over the chunks no row masks (a causal split)
    if sm is None:
        body = (first, Dot(D2, substitute(b.p, to_n), d, "m", "h", "nv", "n", b.in2, f32, note2, init=acc))
        state = (State(ACC, ("m", "h"), Const(0.0, f32), Value(D2, f32)),)
        value = acc
        if split:       # this split's share of the second product's sum over the keys
            sv, rows = Var("s"), b.bvars + b.mvars
            return Kernel(f"{name}_partials", tuple(types[n] for n in b.inputs), split_workspaces(b, t),
                          tuple(axes), (Loop("n", body, state), Store(0, (sv,) + rows + b.hvars, acc)),
                          t.warps, t.stages, (f"{name}_partials: chain kernel (tilefuse), {b.first} -> {b.second}, "
                                              f"{t}: each split's accumulator",),
                          tma=t.tma, workspaces=frozenset({0}))
    else:
        mx, total = (next(i for i in b.instances if i.slot == x) for x in (sm.max_slot, sm.sum_slot))
        running, rsum = Value(MI, mx.dtype), Value(LI, total.dtype)
        m_new = binary("max", running, Value(MXC, mx.dtype))
        neg_inf = Const(-math.inf, mx.dtype)
        m_safe = select(binary("eq", m_new, neg_inf), Const(0.0, mx.dtype), m_new)
        top = Value(sm.max_slot, mx.dtype)
        score = substitute(sm.score, to_n)
        fold = _scaled_scores(score, S)
        p = _base2(transform(substitute(sm.exp_term, to_n), lambda n: m_safe if n is top else None), fold)
        alpha = _base2(unary("exp", binary("sub", running, m_safe)), fold)
        body = (first,
                reduction(replace(mx, slot=MXC), score, "n"),
                reduction(replace(total, slot=SMC), p, "n"),
                Dot(D2, p, d, "m", "h", "nv", "n", b.in2, f32, note2,
                    init=binary("mul", acc, cast(alpha, f32))))
        state = (State(MI, ("m",), neg_inf, m_new),
                 State(LI, ("m",), Const(0.0, total.dtype),
                       binary("add", binary("mul", rsum, cast(alpha, total.dtype)), Value(SMC, total.dtype))),
                 State(ACC, ("m", "h"), Const(0.0, f32), Value(D2, f32)))
        if split:       # this split's running max and sum, and its accumulator, unnormalized
            sv, rows = Var("s"), b.bvars + b.mvars
            return Kernel(f"{name}_partials", tuple(types[n] for n in b.inputs), split_workspaces(b, t),
                          tuple(axes), (Loop("n", body, state),
                                        Store(0, (sv,) + rows + b.hvars, acc),
                                        Store(1, (sv,) + rows, cast(running, f32)),
                                        Store(2, (sv,) + rows, cast(rsum, f32))),
                          t.warps, t.stages, (f"{name}_partials: chain kernel (tilefuse), {b.first} -> {b.second}, "
                                              f"{t}: each split's running max, sum and accumulator",),
                          tma=t.tma, workspaces=frozenset({0, 1, 2}))
        if b.causal is not None and b.window is None and not t.ws:
            # FlashAttention's split: the key chunks no row of the tile masks run without the
            # mask's compares and selects; the diagonal chunks after them with it (not under a
            # specialized loop: Triton's pass fails on a kernel of two loops of products, sm_90,
            # Triton 3.6 and 3.9; one bounded loop masks every chunk instead)
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
    stores = _epilogue(b, cast(value, b.c_dtype))
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
                  loops + stores, t.warps, t.stages, comments, tma=t.tma, specialized=t.ws)


def _split_keys(b, local: Var, chunk: int) -> dict:
    """The key variables at (split ``s``, local position ``local``): the global position
    ``s·chunk + local`` unravelled (keys divide evenly: ``space.split_counts``)."""
    return unravel(binary("add", binary("mul", Var("s"), chunk), local), b.nvars, [b.ext[v] for v in b.nvars])


def splittable(b) -> bool:
    """Whether the keys may be split across programs (``split_kernels``): a key loop with no index
    bounds (a causal or sliding-window loop is bounded per row tile instead), under an online
    softmax (flash-decoding) or none (a GEMM chain: the second product's sum over the keys)."""
    return b.causal is None and b.window is None


def split_workspaces(b, t) -> tuple[TensorType, ...]:
    """The key split's fp32 workspaces: per split, the accumulator ``[split, *rows, *H]`` (under
    a softmax unnormalized, with the running max and the running sum ``[split, *rows]``)."""
    rows = tuple(b.ext[v] for v in b.bvars + b.mvars)
    f32 = DType.float32
    acc = TensorType((t.split, *rows, *(b.ext[v] for v in b.hvars)), f32)
    return (acc,) if b.softmax is None else (acc, TensorType((t.split, *rows), f32), TensorType((t.split, *rows), f32))


def split_in_launch(b, t, name: str) -> Kernel:
    """The key split in one launch: every program runs its split's key loop, stores its share
    (``split_kernels``' partials) into the workspaces and ``Arrive``s at its tile's counter; the
    last of the tile's ``split`` programs to arrive reads the shares back through L2 (its own
    included) and combines them in a loop over the splits (unrolled, every share's loads in
    flight, while that fits: ``unrolled_combine``), and runs the epilogue.  Under a softmax the loop is the online softmax's over the splits: running max
    ``M``, the sum and the accumulator rescaled by ``exp(M_old - M_new)`` as each split's share
    comes in weighted by ``exp(m_s - M_new)`` (0 for a split whose keys were all masked; ``M_new``
    read as 0 while every split so far was).  Slots: the inputs, then the workspaces read back;
    results move up past them.  Outputs: the stores, the workspaces, the tiles' counters."""
    if not splittable(b) or b.extent(b.nvars) % t.split:
        raise ValueError(f"{name}: the keys split only evenly, and only where the key loop has no bounds")
    partials = chain_kernel(b, t, name, split=True)
    types, nin, sm = b.group.types, len(b.inputs), b.softmax
    ws = split_workspaces(b, t)
    nws, nout = len(ws), len(b.stores)
    f32 = DType.float32
    sr = Var("sr")
    rows = b.bvars + b.mvars
    first_free = b.slot + 1 + len(b.instances) + 6 + nws     # past chain_kernel's slots, moved (a clash:
                                                             # ``codegen/kernel.check`` names the slot)
    shares = tuple(replace(st, output=nout + st.output) if isinstance(st, Store) else st
                   for st in shifted(partials.body, nin, nws))
    axes = partials.axes + (TileAxis("r", (sr,), (t.split,), 1, -1, block_name="RBLOCK"),)
    acc_r = Load(nin, (sr,) + rows + b.hvars, f32)
    AS = first_free
    if sm is None:
        state = (State(AS, ("m", "h"), Const(0.0, f32), binary("add", Value(AS, f32), acc_r)),)
        value = cast(Value(AS, f32), b.c_dtype)
    else:
        MS, LS = first_free + 1, first_free + 2
        m_r, l_r = Load(nin + 1, (sr,) + rows, f32), Load(nin + 2, (sr,) + rows, f32)
        top, total = Value(MS, f32), Value(LS, f32)
        m_new = binary("max", top, m_r)
        neg_inf = Const(-math.inf, f32)
        safe = select(binary("eq", m_new, neg_inf), Const(0.0, f32), m_new)
        old = unary("exp", binary("sub", top, safe))        # rescales what came before
        w = unary("exp", binary("sub", m_r, safe))          # weighs this split's share
        state = (State(MS, ("m",), neg_inf, m_new),
                 State(LS, ("m",), Const(0.0, f32), binary("add", binary("mul", total, old), binary("mul", w, l_r))),
                 State(AS, ("m", "h"), Const(0.0, f32),
                       binary("add", binary("mul", Value(AS, f32), old), binary("mul", w, acc_r))))
        mx, tot = (next(i for i in b.instances if i.slot == x) for x in (sm.max_slot, sm.sum_slot))
        last = {sm.max_slot: cast(top, mx.dtype), sm.sum_slot: cast(total, tot.dtype)}
        coeff = transform(sm.coeff, lambda n: last.get(n.slot) if isinstance(n, Value) else None)
        value = cast(binary("mul", cast(coeff, f32), Value(AS, f32)), b.c_dtype)
    combine = (Loop("r", (), state, unroll=unrolled_combine(t)), *_epilogue(b, value))
    tiles = tuple(a.name for a in axes if a.grid is not None and a.name != "s")     # a tile's programs
    counters = TensorType((math.prod(max(a.chunks, 1) for a in axes if a.name in tiles),), DType.int32)
    outputs = tuple(types[st.tensor] for st in b.stores)
    comments = (f"{name}: chain kernel (tilefuse), {b.first} -> {b.second}, {t}: keys split {t.split} ways in one "
                f"launch, the last split of each tile to finish combines the shares (in{nin}..) and runs the epilogue",
                f"inputs:  {', '.join([f'in{k}={n}' for k, n in enumerate(b.inputs)] + [f'in{nin}..=workspaces'])}",
                f"outputs: {', '.join(f'out{k}={st.tensor}' for k, st in enumerate(b.stores))}")
    return Kernel(name, tuple(types[n] for n in b.inputs) + ws, outputs + ws + (counters,), axes,
                  shares + (Arrive(nout + nws, tiles, t.split, combine),), t.warps, t.stages, comments, tma=t.tma,
                  written=frozenset(range(nin, nin + nws)), workspaces=frozenset(range(nout, nout + nws)),
                  counters=frozenset({nout + nws}))


def unrolled_combine(t) -> bool:
    """Whether the in-launch combine's loop over the splits is unrolled (every split's share
    loaded at once: one round trip) or walked (one share in registers at a time): unrolled while
    the shares come to ``UNROLLED_VALUES`` fp32 values a thread at most."""
    return t.split * t.bm * t.bh <= UNROLLED_VALUES * 32 * t.warps


def _epilogue(b, value) -> tuple[Store, ...]:
    """The epilogue's stores with the second contraction's value ``value``."""
    out = Value(b.slot, b.c_dtype)
    ranges = extent_ranges({v: b.ext[v] for v in b.avars})
    return tuple(Store(j, tuple(simplify(e, ranges) for e in st.index),
                       simplify(transform(st.value, lambda n: value if n is out else None), ranges))
                 for j, st in enumerate(b.stores))


def split_kernels(b, t, name: str) -> tuple[Kernel, Kernel]:
    """The keys split ``t.split`` ways across programs, for a grid that would leave SMs idle
    (decode's one query row per head; a GEMM chain of few row tiles, whose other way to more
    programs, H split, recomputes the first product per H tile): the partials kernel runs the key
    loop over its split's keys and stores its accumulator ``acc_s``; the combine kernel, one
    program per ``XBLOCK`` rows with every split in the tile, sums them and runs the epilogue.
    Under a softmax (flash-decoding) a split also stores its running max ``m_s`` and sum ``l_s``,
    and the combine rescales each split to the rows' overall max ``M`` (``w_s = exp(m_s - M)``, 0
    for a split whose keys were all masked) and runs the epilogue on ``coeff(M, Σ w_s·l_s) ×
    Σ w_s·acc_s`` (the softmax's row coefficient: ``1/sum``, guarded where every key is masked),
    as the one-kernel form does."""
    sm, types, nin = b.softmax, b.group.types, len(b.inputs)
    if not splittable(b) or b.extent(b.nvars) % t.split:
        raise ValueError(f"{name}: the keys split only evenly, and only where the key loop has no bounds")
    partials = chain_kernel(b, t, name, split=True)
    f32 = DType.float32
    sv = Var("s")
    rows = b.bvars + b.mvars
    nrows, hext = b.extent(rows), b.extent(b.hvars)
    h2, s2 = pow2(hext), pow2(t.split)
    xr = min(pow2(max(COMBINE_BLOCK // (h2 * s2), 1)), pow2(nrows))
    axes = (TileAxis("x", rows, tuple(b.ext[v] for v in rows), xr, 0, grid=0, block_name="XBLOCK"),
            TileAxis("h", b.hvars, tuple(b.ext[v] for v in b.hvars), h2, 1, block_name="BLOCK_H"),
            TileAxis("r", (sv,), (t.split,), s2, 2, block_name="RBLOCK"))
    ws = split_workspaces(b, t)
    MX, LS, AS = range(nin + len(ws), nin + len(ws) + 3)
    if sm is None:
        body = (Reduce(AS, Load(nin, (sv,) + rows + b.hvars, f32), "r", "sum", f32, 0.0, f32,
                       "the splits' accumulators summed"),)
        value = cast(Value(AS, f32), b.c_dtype)
    else:
        m_s = Load(nin + 1, (sv,) + rows, f32)
        top = Value(MX, f32)
        w = unary("exp", binary("sub", m_s, select(binary("eq", top, Const(-math.inf, f32)), Const(0.0, f32), top)))
        mx, total = (next(i for i in b.instances if i.slot == x) for x in (sm.max_slot, sm.sum_slot))
        body = (Reduce(MX, m_s, "r", "max", f32, -math.inf, f32, "the splits' overall max"),
                Reduce(LS, binary("mul", w, Load(nin + 2, (sv,) + rows, f32)), "r", "sum", f32, 0.0, f32,
                       "the splits' sums rescaled"),
                Reduce(AS, binary("mul", w, Load(nin, (sv,) + rows + b.hvars, f32)), "r", "sum", f32, 0.0, f32,
                       "the splits' accumulators rescaled"))
        last = {sm.max_slot: cast(top, mx.dtype), sm.sum_slot: cast(Value(LS, f32), total.dtype)}
        coeff = transform(sm.coeff, lambda n: last.get(n.slot) if isinstance(n, Value) else None)
        value = cast(binary("mul", cast(coeff, f32), Value(AS, f32)), b.c_dtype)
    stores = _epilogue(b, value)
    what = f"in{nin}: {t.split} splits' accumulators" if sm is None else \
        f"in{nin}..in{nin + 2}: {t.split} splits' accumulators, maxima, sums"
    comments = (f"{name}: chain kernel (tilefuse), the key split's combine of {name}_partials ({what}) "
                f"and the epilogue",
                f"inputs:  {', '.join(f'in{k}={n}' for k, n in enumerate(b.inputs))}",
                f"outputs: {', '.join(f'out{k}={st.tensor}' for k, st in enumerate(b.stores))}")
    combine = Kernel(name, tuple(types[n] for n in b.inputs) + ws, tuple(types[st.tensor] for st in b.stores), axes,
                     body + stores, 4, 1, comments, transient=frozenset(range(nin, nin + len(ws))))
    return partials, combine
