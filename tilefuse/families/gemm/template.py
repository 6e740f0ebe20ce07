"""The gemm family's template: a gemm body and tile as tile-level kernels (``codegen/kernel.py``).

Tile axes: ``m`` (BLOCK_M rows, tile dimension 0) and ``n`` (BLOCK_N columns, dimension 1) split
across programs in group-M order (program-id dimension 0), or ``n`` whole inside the program when
the epilogue reduces over rows; ``b``, the batch, one position per program (the next program-id
dimension); ``k`` (BLOCK_K, looped), dimension 0 of the B operand's tile, with its alias ``ka`` as
dimension 1 of A's.  The K loop is one ``Dot`` (Triton pipelines its loads over ``num_stages``),
accumulating in fp32; then the epilogue's row reductions (``Reduce`` over ``n``), then the stores,
each through its own index map (a transposed or reshaped output is a store order).

The small-M path (``tile.dot`` False) keeps every row in the program and reduces the fp32 product
tile over ``k`` (dimension 2) instead of a ``Dot``.  Split-K (``tile.split`` > 1) is two kernels:
the partial products over each split's K range, written to an fp32 workspace, and a reduction
over the splits that runs the epilogue (whole rows per program when the epilogue reduces rows:
a GEMM + LayerNorm fills the SMs with K ranges where its row tiles alone would not).

Two phases (``tile.fixup``: the epilogue reduces rows wider than BLOCK_N): every program stores
the early outputs and the epilogue's pre-reduction value (``body.phases.pre``) of its tile, into a
workspace or the output that already holds it; then it ``Arrive``s at its row block's counter,
and the last of the block's column tiles to arrive walks the block's rows ``FIX_M`` at a time
(axis ``fm``, within ``m``), each row whole (axis ``fn``, ``FIX_N`` wide): it re-reads the stored
values through L2, runs the row reductions and makes the late stores.
"""
from __future__ import annotations

import math
from dataclasses import replace

from ...analysis.index import extent_ranges
from ...codegen.kernel import WS_MIN_BM, WS_WARPS, Arrive, Dot, Kernel, Loop, Reduce, State, Store, TileAxis, pow2
from ...codegen.reduction import reduction
from ...ir.dtypes import DType, TensorType
from ...ir.expr import Const, Expr, Load, Value, Var, binary, cast, select, substitute, transform, walk
from ...transform.simplify import simplify
from ..anchor import unravel
from .body import GemmBody, renumber
from .space import GemmTile

MAX_GRID_1 = 65535      # CUDA's limit on the second grid dimension (the batch)
REDUCE_BLOCK = 1024     # outputs per program of the split-K reduction kernel
MAX_UNROLL = 25         # taps of a stencil whose loop is unrolled (up to 5 x 5: all loads in flight)
PROLOGUE_VALUES = 4096  # a prologue reduction's fp32 tile, [BLOCK_M, PBLOCK], before the K loop


def gemm_kernels(b: GemmBody, t: GemmTile, name: str) -> tuple[Kernel, ...]:
    """The kernels computing gemm body ``b`` with tile ``t``: one, or with split-K the partial
    products (``<name>_partials``, writing an fp32 workspace, the kernels' last output) and the
    reduction that sums them and runs the epilogue (``name``)."""
    if t.ws and (t.fixup or t.bb or t.split > 1):
        raise ValueError(f"{name}: a warp-specialized K loop is one kernel's whole K (tile {t})")
    if t.fixup:
        return (_two_phase_kernel(b, t, name),)
    if t.bb:
        return (_stencil_kernel(b, t, name),)
    if t.split == 1:
        return (gemm_kernel(b, t, name),)
    if t.in_launch:
        return (_split_in_launch(b, t, name),)
    return _split_kernels(b, t, name)


def gemm_kernel(b: GemmBody, t: GemmTile, name: str) -> Kernel:
    """The kernel computing gemm body ``b`` with tile ``t`` under the function name ``name``."""
    ext, shape = b.ext, b.shape
    if shape.batch > MAX_GRID_1:
        raise ValueError(f"{name}: batch of {shape.batch} exceeds the grid's second dimension")
    if b.instances and t.bn < shape.n:
        raise ValueError(f"{name}: the epilogue reduces rows of {shape.n}, which a BLOCK_N of {t.bn} does not hold")
    note = f"{b.anchor}: {shape.batch} x [{shape.m} x {shape.k}] @ [{shape.k} x {shape.n}]"
    if t.ws and not (t.dot and t.tma and t.warps == WS_WARPS and t.bm >= WS_MIN_BM):
        raise ValueError(f"{name}: a warp-specialized K loop needs tensor cores, tensor descriptors, "
                         f"{WS_WARPS} warps a group and BLOCK_M of {WS_MIN_BM} or more (tile {t})")
    kext = tuple(ext[v] for v in b.kvars)
    if t.dot:
        kavars = tuple(Var(f"ka{j}") for j in range(len(b.kvars)))
        axes = _dot_axes(b, t, b.kvars, kavars, kext)
        body: list = _prologue(b, t, axes, 1)
        body.append(Dot(b.acc, substitute(b.a, dict(zip(b.kvars, kavars))), b.b, "m", "n", "k", "ka",
                        b.in_dtype, b.out_dtype, note))
    else:
        # small M: every row in the program, the products reduced over K in fp32 (a GEMV)
        axes = [TileAxis("m", b.mvars, _ext(b, b.mvars), t.bm, 0, block_name="BLOCK_M"),
                _n_axis(b, t), TileAxis("k", b.kvars, kext, t.bk, 2, block_name="BLOCK_K")]
        product = binary("mul", cast(b.a, DType.float32), cast(b.b, DType.float32))
        body = _prologue(b, t, axes, 2)
        body.append(Reduce(b.acc, product, "k", "sum", DType.float32, 0.0, b.out_dtype, note))
    _batch_axis(b, axes)
    body += [reduction(inst, inst.body, "n") for inst in b.instances]
    body += _stores(b, {})
    types = b.group.types
    comments = _comments(b, f"{name}: gemm kernel (tilefuse), anchor {b.anchor}, {t}",
                         f"C[{shape.batch} x {shape.m} x {shape.n}] = A[{shape.m} x {shape.k}] @ "
                         f"B[{shape.k} x {shape.n}] in {b.in_dtype.value}, fp32 accumulation"
                         + (f", {len(b.instances)} row reduction(s) over N in the epilogue" if b.instances else ""))
    return Kernel(name, tuple(types[n] for n in b.inputs), tuple(types[st.tensor] for st in b.stores),
                  tuple(axes), tuple(body), t.warps, t.stages, comments, swizzle=t.swizzle, tma=t.tma,
                  streamed=streamed(b, t), specialized=t.ws)


def streamed(b: GemmBody, t: GemmTile) -> frozenset[int]:
    """The B operand's input slots where each of its bytes is read by one program once: one row
    block (M within a tile; each batch its own B) and the pointer path (a tensor descriptor's
    copies take no eviction hint)."""
    if -(-b.shape.m // t.bm) > 1 or (t.tma and t.dot):
        return frozenset()
    slots = frozenset(ld.tensor for ld in walk(b.b) if isinstance(ld, Load) and ld.tensor < len(b.inputs))
    mine = frozenset(ld.tensor for ld in walk(b.a) if isinstance(ld, Load))
    return slots - mine


def _two_phase_kernel(b: GemmBody, t: GemmTile, name: str) -> Kernel:
    """The two-phase kernel (module docstring).  Slots: the inputs, then the stored pre-reduction
    values (read back); results move one slot up.  Outputs: the stores, then the workspace (when
    no output holds the pre-reduction values), then the row blocks' counters."""
    ph, shape, types = b.phases, b.shape, b.group.types
    nin = len(b.inputs)
    moved = {b.acc: b.acc + 1} | {i.slot: i.slot + 1 for i in b.instances}
    kavars = tuple(Var(f"ka{j}") for j in range(len(b.kvars)))
    axes = _dot_axes(b, t, b.kvars, kavars, tuple(b.ext[v] for v in b.kvars))
    _batch_axis(b, axes)
    fm, fn = (tuple(Var(f"f{v.name}") for v in vs) for vs in (b.mvars, b.nvars))
    axes += [TileAxis("fm", fm, _ext(b, b.mvars), t.fixup, 0, block_name="FIX_M", within="m", span=t.bm),
             TileAxis("fn", fn, _ext(b, b.nvars), pow2(shape.n), 1, block_name="FIX_N")]
    note = f"{b.anchor}: {shape.batch} x [{shape.m} x {shape.k}] @ [{shape.k} x {shape.n}]"
    body: list = _prologue(b, t, axes, 1)
    body.append(Dot(b.acc + 1, substitute(b.a, dict(zip(b.kvars, kavars))), b.b, "m", "n", "k", "ka",
                    b.in_dtype, b.out_dtype, note))
    body += [st for j, st in enumerate(_stores(b, moved)) if j in ph.early]
    outputs = [types[st.tensor] for st in b.stores]
    pre_type = TensorType(b.acc_shape, ph.pre.dtype)
    if ph.source < 0:                      # the workspace of pre-reduction values
        body.append(Store(len(outputs), b.avars, renumber(ph.pre, moved)))
        outputs.append(pre_type)
    counters = TensorType((shape.batch * -(-shape.m // t.bm),), DType.int32)
    # the last program of the row block: rows FIX_M at a time, each whole
    reread = Load(nin, b.avars, ph.pre.dtype)
    ranges = extent_ranges({v: b.ext[v] for v in b.bvars} | dict(zip(fm + fn, _ext(b, b.mvars + b.nvars))))
    where = dict(zip(b.mvars + b.nvars, fm + fn))

    def late(e: Expr) -> Expr:
        e = renumber(transform(e, lambda n: reread if n is ph.pre else None), moved)
        return simplify(substitute(e, where), ranges)

    fix: list = [reduction(replace(i, slot=i.slot + 1), late(i.body), "fn") for i in b.instances]
    fix += [Store(j, tuple(late(e) for e in b.stores[j].index), late(b.stores[j].value)) for j in ph.late]
    group = ("b", "m") if b.bvars else ("m",)
    body.append(Arrive(len(outputs), group, axes[1].chunks, (Loop("fm", tuple(fix)),)))
    outputs.append(counters)
    comments = _comments(b, f"{name}: gemm kernel (tilefuse), anchor {b.anchor}, {t}",
                         f"C[{shape.batch} x {shape.m} x {shape.n}] = A[{shape.m} x {shape.k}] @ "
                         f"B[{shape.k} x {shape.n}] in {b.in_dtype.value}, fp32 accumulation; "
                         f"{len(b.instances)} row reduction(s) over N in two phases: every tile stores "
                         f"its pre-reduction values (in{nin}), the last tile of a row block to finish "
                         f"reduces the block's rows",
                         pre=f"in{nin}={'workspace' if ph.source < 0 else 'out%d' % ph.source}")
    workspace = frozenset({len(b.stores)}) if ph.source < 0 else frozenset()
    return Kernel(name, tuple(types[n] for n in b.inputs) + (pre_type,), tuple(outputs), tuple(axes),
                  tuple(body), t.warps, t.stages, comments, swizzle=t.swizzle, written=frozenset({nin}),
                  workspaces=workspace, counters=frozenset({len(outputs) - 1}), tma=t.tma)


def _stencil_kernel(b: GemmBody, t: GemmTile, name: str) -> Kernel:
    """The stencil path: one column per batch position (N = 1), so the batch is tiled instead,
    ``b`` (BLOCK_B positions, tile dimension 1) beside ``m`` (BLOCK_M, dimension 0), both split
    across programs; each K position (a tap) is one iteration of a loop over ``k`` (a scalar
    axis, unrolled up to ``MAX_UNROLL`` taps), whose products accumulate on CUDA cores in fp32;
    then the epilogue."""
    shape, types = b.shape, b.group.types
    if b.prologue:
        raise ValueError(f"{name}: the stencil path has no prologue reductions")
    bn = tuple(b.bvars) + tuple(b.nvars)          # N's variables (extent 1) ride on the batch axis
    axes = (TileAxis("m", b.mvars, _ext(b, b.mvars), t.bm, 0, grid=0, block_name="BLOCK_M"),
            TileAxis("b", bn, _ext(b, bn), t.bb, 1, grid=1, block_name="BLOCK_B"),
            TileAxis("k", b.kvars, _ext(b, b.kvars), 1, -1, block_name="BLOCK_K"))
    if -(-shape.batch // t.bb) > MAX_GRID_1:
        raise ValueError(f"{name}: {shape.batch} batch positions exceed the grid's second dimension")
    f32, slot = DType.float32, b.acc + 1
    product = binary("mul", cast(b.a, f32), cast(b.b, f32))
    taps = Loop("k", (), (State(slot, ("m", "b"), Const(0.0, f32), binary("add", Value(slot, f32), product)),),
                unroll=shape.k <= MAX_UNROLL)
    stores = _stores_of(b, Value(slot, f32))
    head = (f"{name}: gemm kernel (tilefuse), anchor {b.anchor}, {t}: {shape.batch} x [{shape.m} x {shape.k}] "
            f"@ [{shape.k} x 1], the batch tiled, one K position an iteration, fp32 on CUDA cores")
    return Kernel(name, tuple(types[n] for n in b.inputs), tuple(types[st.tensor] for st in b.stores), axes,
                  (taps, *stores), t.warps, 1, _comments(b, head))


def _split_partials(b: GemmBody, t: GemmTile, slot: int):
    """Split-K's partial products: the axes (``s``, the split, on the next program-id dimension),
    the prologue's reductions (over whole rows in every split) and the ``Dot`` over the split's K
    range into result ``slot``, and the fp32 workspace type ``[split, *acc]``."""
    ext, shape = b.ext, b.shape
    kc = t.k_range(shape.k)
    sv, kl, kal = Var("s"), Var("kl"), Var("kal")
    kext = tuple(ext[v] for v in b.kvars)

    def global_k(local: Var):
        return binary("add", binary("mul", sv, kc), local)

    def k_vars(local: Var) -> dict:
        """The contraction's K variables at (split, local position): the global position unravelled."""
        return unravel(global_k(local), b.kvars, kext)

    def operand(e, local: Var):
        """The operand over a split's K range, zero past K's end (when the last range is ragged)."""
        e = substitute(e, k_vars(local))
        if kc * t.split == shape.k:
            return e
        return select(binary("lt", global_k(local), shape.k), e, cast(0, e.dtype))

    axes = _dot_axes(b, t, (kl,), (kal,), (kc,))
    _batch_axis(b, axes)
    axes.append(TileAxis("s", (sv,), (t.split,), 1, -1, grid=_next_grid(axes), block_name="BLOCK_S"))
    ws = TensorType((t.split,) + b.acc_shape, DType.float32)
    note = f"{b.anchor}: {shape.batch} x [{shape.m} x {shape.k}] @ [{shape.k} x {shape.n}], K split {t.split} ways"
    dot = Dot(slot, operand(b.a, kal), operand(b.b, kl), "m", "n", "k", "ka", b.in_dtype, DType.float32, note)
    return axes, (*_prologue(b, t, axes, 1), dot), ws


def _split_in_launch(b: GemmBody, t: GemmTile, name: str) -> Kernel:
    """Split-K in one launch: every program stores its partial product into the fp32 workspace
    and ``Arrive``s at its output tile's counter; the last of the tile's ``split`` programs to
    arrive sums the partials (read back through L2, its own included) and runs the epilogue.
    Slots: the inputs, then the workspace read back; results move one slot up.  Outputs: the
    stores, the workspace, the tiles' counters."""
    types, nin = b.group.types, len(b.inputs)
    axes, steps, ws = _split_partials(b, t, b.acc + 1)
    sr = Var("sr")
    axes.append(TileAxis("r", (sr,), (t.split,), 1, -1, block_name="RBLOCK"))
    total = b.acc + 2
    f32 = DType.float32
    sums = Loop("r", (), (State(total, ("m", "n"), Const(0.0, f32),
                                binary("add", Value(total, f32), Load(nin, (sr,) + b.avars, f32))),), unroll=True)
    stores = _stores_of(b, Value(total, f32))
    outputs = tuple(types[st.tensor] for st in b.stores)
    tiles = [a for a in axes if a.grid is not None and a.name != "s"]      # an output tile's programs
    counters = TensorType((math.prod(max(a.chunks, 1) for a in tiles),), DType.int32)
    group = tuple(a.name for a in tiles)
    body = (*steps, Store(len(outputs), (Var("s"),) + b.avars, Value(b.acc + 1, f32)),
            Arrive(len(outputs) + 1, group, t.split, (sums, *stores)))
    head = (f"{name}: gemm kernel (tilefuse), anchor {b.anchor}, {t}: K split {t.split} ways in one launch, "
            f"the last split of each output tile to finish sums the partials (in{nin}) and runs the epilogue")
    return Kernel(name, tuple(types[n] for n in b.inputs) + (ws,), outputs + (ws, counters), tuple(axes), body,
                  t.warps, t.stages, _comments(b, head, pre=f"in{nin}=workspace"), swizzle=t.swizzle,
                  written=frozenset({nin}), workspaces=frozenset({len(outputs)}),
                  counters=frozenset({len(outputs) + 1}), tma=t.tma)


def _split_kernels(b: GemmBody, t: GemmTile, name: str) -> tuple[Kernel, Kernel]:
    shape, types = b.shape, b.group.types
    sv = Var("s")
    axes, steps, ws = _split_partials(b, t, b.acc)
    first = Kernel(f"{name}_partials", tuple(types[n] for n in b.inputs), (ws,), tuple(axes),
                   (*steps, Store(0, (sv,) + b.avars, Value(b.acc, DType.float32))),
                   t.warps, t.stages, (f"{name}_partials: gemm kernel (tilefuse), split-K partial products, {t}",),
                   swizzle=t.swizzle, workspaces=frozenset({0}), tma=t.tma, streamed=streamed(b, t))
    # the reduction: the splits summed, then the epilogue; one program per REDUCE_BLOCK outputs,
    # or, when the epilogue reduces rows, per ROWS_BLOCK whole rows (the row reductions after the sum)
    nin = len(b.inputs)
    moved = {b.acc: nin + 1} | {i.slot: i.slot + 1 for i in b.instances}
    partial = Load(nin, (sv,) + b.avars, DType.float32)
    sums = f"{b.anchor}: the {t.split} partial sums"
    if b.instances:
        rows = tuple(v for v in b.avars if v not in b.nvars)
        n2, s2 = pow2(shape.n), pow2(t.split)
        xr = min(pow2(max(REDUCE_BLOCK // (n2 * s2), 1)), pow2(math.prod(_ext(b, rows))))
        axes2 = (TileAxis("x", rows, _ext(b, rows), xr, 0, grid=0, block_name="XBLOCK"),
                 TileAxis("n", b.nvars, _ext(b, b.nvars), n2, 1, block_name="BLOCK_N"),
                 TileAxis("r", (sv,), (t.split,), s2, 2, block_name="RBLOCK"))
        body = [Reduce(nin + 1, partial, "r", "sum", DType.float32, 0.0, b.out_dtype, sums)]
        body += [reduction(replace(i, slot=i.slot + 1), renumber(i.body, moved), "n") for i in b.instances]
        warps = 8 if xr * n2 * s2 >= 8 * REDUCE_BLOCK else 4
    else:
        axes2 = (TileAxis("x", b.avars, b.acc_shape, min(REDUCE_BLOCK, pow2(math.prod(b.acc_shape))), 0, grid=0,
                          block_name="XBLOCK"),
                 TileAxis("r", (sv,), (t.split,), pow2(t.split), 1, block_name="RBLOCK"))
        body = [Reduce(nin + 1, partial, "r", "sum", DType.float32, 0.0, b.out_dtype, sums)]
        warps = 4
    body += _stores(b, moved)
    head = f"{name}: gemm kernel (tilefuse), split-K reduction and epilogue of {name}_partials (in{nin})" + \
        (f", {len(b.instances)} row reduction(s) over N on whole rows" if b.instances else "")
    second = Kernel(name, tuple(types[n] for n in b.inputs) + (ws,), tuple(types[st.tensor] for st in b.stores),
                    axes2, tuple(body), warps, 1, _comments(b, head), transient=frozenset({nin}))
    return first, second


def _prologue(b: GemmBody, t: GemmTile, axes: list, dim: int) -> list[Reduce]:
    """The prologue's row reductions (an RMSNorm's sum of squares, a LayerNorm's mean and
    variance), each over an axis of its own on tile dimension ``dim`` (``p<j>``, ``PBLOCK`` wide,
    looped) for the program's rows, before the K loop that reads them through A: the rows are
    read twice, once for their statistics and once as the operand, instead of a kernel that
    writes the normalized rows and a GEMM that reads them back."""
    out = []
    for j, inst in enumerate(b.prologue):
        axes.append(TileAxis(f"p{j}", inst.rvars, inst.rext, prologue_block(b, t.bm), dim, block_name="PBLOCK"))
        out.append(reduction(inst, inst.body, f"p{j}"))
    return out


def prologue_block(b: GemmBody, bm: int) -> int:
    """The prologue reductions' chunk: ``PROLOGUE_VALUES`` over the tile's rows, 16 at least,
    no wider than the widest reduction."""
    widest = max(math.prod(i.rext) for i in b.prologue)
    return min(pow2(widest), max(16, PROLOGUE_VALUES // bm))


def _ext(b, vs) -> tuple[int, ...]:
    return tuple(b.ext[v] for v in vs)


def _n_axis(b, t) -> TileAxis:
    """N split across programs with M (program-id dimension 0), or whole when BLOCK_N holds it."""
    return TileAxis("n", b.nvars, _ext(b, b.nvars), t.bn, 1, grid=None if t.bn >= b.shape.n else 0,
                    block_name="BLOCK_N")


def _dot_axes(b, t, kvars, kavars, kext) -> list[TileAxis]:
    """M, N, and K over ``kvars`` (dimension 0 of B's tile) with its alias over ``kavars``
    (dimension 1 of A's)."""
    return [TileAxis("m", b.mvars, _ext(b, b.mvars), t.bm, 0, grid=0, block_name="BLOCK_M"), _n_axis(b, t),
            TileAxis("k", kvars, kext, t.bk, 0, block_name="BLOCK_K"),
            TileAxis("ka", kavars, kext, t.bk, 1, block_name="BLOCK_K", alias="k")]


def _batch_axis(b, axes: list) -> None:
    """The batch, one position per program on the next program-id dimension."""
    if b.bvars:
        axes.append(TileAxis("b", b.bvars, _ext(b, b.bvars), 1, -1, grid=_next_grid(axes), block_name="BLOCK_B"))


def _stores(b, moved: dict) -> list[Store]:
    """The epilogue's stores, simplified over the accumulator's ranges; ``moved`` renumbers result
    slots (the split-K reduction reads the accumulator from another slot)."""
    ranges = extent_ranges({v: b.ext[v] for v in b.avars})
    return [Store(j, tuple(simplify(e, ranges) for e in st.index), simplify(renumber(st.value, moved), ranges))
            for j, st in enumerate(b.stores)]


def _stores_of(b, acc: Value) -> list[Store]:
    """The epilogue's stores reading the accumulator from an fp32 loop state ``acc`` (a stencil's
    taps, split-K's summed partials), rounded to the contraction's type as a ``Dot``'s is."""
    rounded = cast(acc, b.out_dtype)
    return [replace(st, value=transform(st.value, lambda e: rounded if isinstance(e, Value) and e.slot == b.acc
                                        else None)) for st in _stores(b, {})]


def _comments(b, *head: str, pre: str = "") -> tuple[str, ...]:
    origins = dict.fromkeys(str(p.origin) for p in b.group.prims)
    return (*head, "implements:", *(f"  {o}" for o in origins),
            f"inputs:  {', '.join([f'in{k}={n}' for k, n in enumerate(b.inputs)] + ([pre] if pre else []))}",
            f"outputs: {', '.join(f'out{k}={st.tensor}' for k, st in enumerate(b.stores))}")


def _next_grid(axes) -> int:
    """The first program-id dimension no axis uses yet (they must be 0, 1, 2 in order)."""
    return 1 + max((a.grid for a in axes if a.grid is not None), default=-1)
