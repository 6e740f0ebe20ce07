"""The tile-level kernel IR: what one generated kernel does, between a schedule and its source.

A ``Kernel`` computes its outputs from its inputs over *tile axes*.  Each ``TileAxis`` enumerates
a linearized space of IR variables (row-major over ``vars``/``ext``) in blocks of ``block``
positions; it occupies one dimension (``dim``) of the kernel's tiles, and either is split across
programs (``grid``: which program-id dimension) or is covered inside one program (whole when its
block holds it, looped in chunks otherwise).  Several axes may share a dimension when they are
never live together (the reduced axes of two reductions, looped one after the other; a GEMM's N
and the K of its A operand).  An axis of one position per program (``dim`` -1) is a scalar, not a
tile dimension (a GEMM's batch).  An *alias* enumerates the same positions as another axis (its
variables stand for the other's) on a different dimension: a GEMM's K is dimension 0 of its B
tile and dimension 1 of its A tile.  Axes sharing a program-id dimension split it row-major, or
in group-M order when the kernel says ``swizzle`` (Triton's matmul tutorial: a group of row
tiles walks the columns together, so the operands' panels are re-read from L2, not DRAM).  An axis
*within* a program-split axis walks that axis's positions in the program's own tile (``span`` of
them), in its own blocks: the rows of a GEMM's row block, a few at a time.

Statements, run in order by every program:

- ``Reduce``: combine an expression over one tile axis into a value per remaining position (an
  accumulator over the chunks when the axis is looped), named by a slot that later expressions
  read as ``Value(slot)``;
- ``Store``: an expression written to an output at an index (both over the axes' variables),
  where optional guards hold;
- ``Loop``: its body over every chunk of an axis (a single chunk, and no loop, when the axis is
  whole), optionally carrying ``State``: values that start from a constant and are replaced by
  an expression of the iteration's values at its end (an online softmax's running max and sum,
  the rescaled accumulator of attention);
- ``Dot``: a matrix product of two operand tiles accumulated in fp32 over an axis (a K loop
  when it is looped; one product of the current chunk when an enclosing loop walks the axis),
  starting from zeros or from an ``init`` tile, read by later expressions as ``Value(slot)``
  in the contraction's type;
- ``Arrive``: count the program's arrival in its group (the programs that share a position of
  some program-split axes, e.g. the column tiles of one GEMM row block) and run a body in the last
  program of the group to arrive, which may then read what the others stored (through inputs the
  kernel marks ``written``): a row reduction spanning several tiles, finished in one kernel.

Expressions are the IR's own (``ir/expr.py``): loads of input slots through composed index maps,
arithmetic in the IR's dtypes.  Backends (``codegen/triton``) print a kernel; templates
(``families/<family>/template.py``) build one from a family's body and tile; ``cost/work.py``
reads its ``Work`` from it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Mapping, Sequence, Union

from ..ir.dtypes import DType, TensorType
from ..ir.expr import Binary, Expr, Load, Var
from .mapping import TaskMapping, group_m, spatial


@dataclass(frozen=True)
class TileAxis:
    name: str                      # short, unique: "x", "r", "r3", ...
    vars: tuple[Var, ...]          # IR variables it enumerates, row-major
    ext: tuple[int, ...]
    block: int                     # positions per tile (a power of two)
    dim: int                       # tile dimension it occupies
    grid: int | None = None        # program-id dimension that splits it; None: covered in-program
    block_name: str = ""           # the kernel's constexpr holding ``block``
    alias: str = ""                # the axis whose positions this one enumerates (on another dim)
    within: str = ""               # the program-split axis whose program tile this one walks
    span: int = 0                  # with ``within``: positions of that tile (its block)

    @property
    def extent(self) -> int:
        return math.prod(self.ext)

    @property
    def reach(self) -> int:
        """Positions one program walks: its share of a ``within`` axis, else the whole extent."""
        return self.span if self.within else self.extent

    @property
    def chunks(self) -> int:
        return -(-self.reach // self.block) if self.extent else 0

    @property
    def looped(self) -> bool:
        """Covered in more than one chunk by a loop inside the program."""
        return self.grid is None and self.chunks > 1

    @property
    def masked(self) -> bool:
        """Some tile positions fall beyond the extent (the block does not divide it, or it is empty)."""
        if self.within:
            return self.extent % self.span != 0
        return self.extent % self.block != 0 or self.extent == 0


@dataclass(frozen=True)
class Reduce:
    slot: int                      # later expressions read the result as Value(slot)
    value: Expr                    # over the axis's vars (and outer axes'), in ``acc_dtype``
    axis: str
    combiner: str                  # sum | max | min | prod (max/min propagate NaN)
    acc_dtype: DType
    init: object                   # the combiner's identity in acc_dtype
    out_dtype: DType               # the result's type (bool: acc != 0)
    note: str = ""


@dataclass(frozen=True)
class Store:
    output: int                    # output slot
    index: tuple[Expr, ...]        # over the axes' vars, one per output dim
    value: Expr
    guards: tuple[Expr, ...] = ()  # bool expressions: store only where all hold


@dataclass(frozen=True)
class State:
    """A value a ``Loop`` carries: ``init`` (a constant, broadcast over ``axes``) before the first
    iteration; at the end of each, ``next``, which reads this iteration's values and the states'
    current values (``Value(slot)``); after the loop, ``Value(slot)`` is the final value."""
    slot: int
    axes: tuple[str, ...]          # the tile axes it varies along
    init: Expr
    next: Expr


@dataclass(frozen=True)
class Loop:
    axis: str
    body: tuple["Stmt", ...]
    state: tuple[State, ...] = ()
    stop: tuple[str, int] | None = None    # (axis, k): stop after the position k past the last of
                                           # this program's tile of that axis (a causal key loop)
    start: tuple[str, int] | None = None   # (axis, w): start at the chunk holding the position w
                                           # before the first of this program's tile of that axis
                                           # (a sliding window's key loop)
    until: tuple[str, int] | None = None   # (axis, k): end before the first chunk reaching past the
                                           # position k after the first of this program's tile of
                                           # that axis (a causal key loop's chunks no row masks)
    resume: bool = False                   # go on from the chunk where the Loop just before it over
                                           # the same axis ended, carrying its states on (the
                                           # causal key loop's diagonal chunks, after ``until``)
    unroll: bool = False                   # its chunks unrolled (``tl.static_range``), so every
                                           # chunk's loads are issued before their values are used:
                                           # a short loop over a scalar axis (a stencil's taps,
                                           # split-K's partial sums); no stop, start or split


@dataclass(frozen=True)
class Dot:
    slot: int                      # later expressions read the product as Value(slot)
    a: Expr                        # [M, K] operand over axes ``m`` and ``ka`` (alias of ``k``)
    b: Expr                        # [K, N] operand over axes ``k`` and ``n``
    m: str
    n: str
    k: str
    ka: str
    in_dtype: DType                # both operands are cast to it (fp16/bf16: tensor cores; fp32: IEEE)
    out_dtype: DType               # the contraction's type: the fp32 accumulator is rounded to it
    note: str = ""
    init: Expr | None = None       # the fp32 accumulator's first value, over (m, n); None: zeros


@dataclass(frozen=True)
class Arrive:
    """The program arrives at its group, the programs sharing its positions of ``axes``
    (program-split axes), by incrementing the group's counter; the last of the ``count`` programs
    to arrive resets the counter (it is zero before every launch) and runs ``body``, after every
    store the others made before arriving."""
    counter: int                   # output slot of int32 counters, one per group, row-major over ``axes``
    axes: tuple[str, ...]
    count: int
    body: tuple["Stmt", ...]


Stmt = Union[Reduce, Store, Loop, Dot, Arrive]


def check(kernel: "Kernel") -> None:
    """What the kernel's slots and axes must satisfy, checked once where it is printed: every
    ``Load`` reads an input slot with one index per dim; every ``Value`` reads a result a statement
    before it defined (a ``Reduce``'s or ``Dot``'s slot, a ``Loop``'s state, inside the loop and
    after it), numbered past the inputs and defined once; every ``Store`` writes an output slot
    with one index per dim; every statement's axes are the kernel's.  Raises ``ValueError``
    naming the kernel and the slot or axis."""
    from ..ir.expr import Value, walk
    nin, names = len(kernel.inputs), {a.name for a in kernel.axes}
    defined: set[int] = set()

    def fail(msg: str):
        raise ValueError(f"kernel {kernel.name}: {msg}")

    def reads(*exprs) -> None:
        for e in exprs:
            for n in walk(e):
                if isinstance(n, Load) and not (0 <= n.tensor < nin and len(n.index) == kernel.inputs[n.tensor].rank):
                    fail(f"a load of slot {n.tensor} with {len(n.index)} indices is no input's")
                if isinstance(n, Value) and n.slot not in defined:
                    fail(f"value {n.slot} is read before a statement defines it")

    def define(slot: int) -> None:
        if slot < nin or slot in defined:
            fail(f"result slot {slot} is {'an input' if slot < nin else 'defined twice'}")
        defined.add(slot)

    def axes(*used) -> None:
        for a in used:
            if a not in names:
                fail(f"axis {a!r} is not one of its axes {sorted(names)}")

    local: set[int] = set()           # the slots the body of the last Loop defined

    def walk_body(body) -> None:
        nonlocal local
        before = None
        for st in body:
            if isinstance(st, Loop) and st.resume and not (
                    isinstance(before, Loop) and before.axis == st.axis and before.until is not None
                    and [s.slot for s in before.state] == [s.slot for s in st.state]):
                fail(f"a Loop over {st.axis!r} resumes, but no Loop over it with the same states and an "
                     f"'until' comes just before it")
            before = st
            if isinstance(st, Store):
                if not (0 <= st.output < len(kernel.outputs)) or len(st.index) != kernel.outputs[st.output].rank:
                    fail(f"a store to output {st.output} with {len(st.index)} indices")
                reads(st.value, *st.index, *st.guards)
            elif isinstance(st, Reduce):
                axes(st.axis)
                reads(st.value)
                define(st.slot)
            elif isinstance(st, Dot):
                axes(st.m, st.n, st.k, st.ka)
                reads(st.a, st.b, *(() if st.init is None else (st.init,)))
                define(st.slot)
            elif isinstance(st, Loop):
                axes(st.axis, *(b[0] for b in (st.stop, st.start, st.until) if b))
                if st.unroll and (st.stop or st.start or st.until or st.resume):
                    fail(f"an unrolled Loop over {st.axis!r} with a stop, start or split")
                for s in st.state:
                    axes(*s.axes)
                    reads(s.init)
                    if not st.resume:
                        define(s.slot)
                if st.resume:               # its body computes the slots of the loop before it anew
                    defined.difference_update(local)
                known = set(defined)
                walk_body(st.body)
                local = defined - known
                reads(*(s.next for s in st.state))
            elif isinstance(st, Arrive):
                axes(*st.axes)
                walk_body(st.body)
            else:
                fail(f"{type(st).__name__} is not a statement")

    walk_body(kernel.body)


# The first architecture whose tensor descriptors are TMA copies (Triton lowers them to plain loads,
# without async copies, for sm_80: read off the binaries); ``Kernel.tma`` is for it and later.
TMA_ARCH = 90


def descriptor_dims(load: Load, shape: tuple[int, ...], axis_of: Mapping[Var, tuple],
                    tile: tuple[str, str], extents: Mapping[Var, int],
                    shifted: Sequence[str] = ()) -> dict[str, int] | None:
    """The tensor dim of each of the ``tile`` axes when ``load`` reads a whole tile through a tensor
    descriptor (TMA), else None: each tile axis one variable indexing a dim of its own extent, the
    innermost dim among them, the other dims per-program positions (a batch; no gathered index),
    every stride a whole number of 16 bytes.  ``axis_of``: variable -> (axis name, its variables,
    its extent, its tile dim), as the caller names the axes; ``extents``: each variable's.  A
    variable of extent 1 is position 0 (a batch of one merged into a GEMM's rows: the rows are the
    other variable's).  The tile axes named in ``shifted`` may also index their dim at a
    per-program shift (``tile_shift``: a split-K program's chunk of K, ``ss * 384 + k``) over a
    part of it, where the caller knows each block divides its axis's extent (no position of a
    tile past its chunk: the descriptor's zeros stand only for the tensor's end).  The printer
    reads the operand this way (``emit.py: _described``) and the cost model charges it so
    (``cost/work.py``)."""
    from ..ir.expr import free_vars, walk
    item = load.dtype.itemsize
    if any(math.prod(shape[d + 1:]) * item % 16 for d in range(len(shape) - 1)):
        return None
    where: dict[str, int] = {}
    for d, (x, n) in enumerate(zip(load.index, shape)):
        if isinstance(x, Var) and extents.get(x) == 1:
            continue
        v, shift = tile_shift(x, axis_of)
        a = axis_of.get(v) if v is not None else None
        if a is not None and a[0] in tile:
            name, vars_, _, _ = a
            whole = extents[v] == n if shift is None else a[0] in shifted and extents[v] < n
            if [u for u in vars_ if extents[u] != 1] != [v] or not whole or name in where:
                return None
            where[name] = d
        elif not all(v in axis_of and axis_of[v][3] < 0 for v in free_vars(x)) or \
                any(isinstance(m, Load) for m in walk(x)):
            return None
    if set(where) != set(tile) or len(shape) - 1 not in where.values():
        return None
    return where


def tile_shift(x, axis_of: Mapping[Var, tuple]):
    """``(v, shift)`` where the index ``x`` is a variable ``v`` plus a shift of per-program
    positions and constants (``axis_of[u][3] < 0``: a program-split axis of no tile dim; a
    split-K program's ``ss * 384``), the shift an expression or None where there is none;
    ``(None, None)`` otherwise."""
    from ..analysis.index import linear_form
    from ..ir.expr import Const, free_vars, walk
    if isinstance(x, Var):
        return x, None
    if not isinstance(x, Binary) or x.op != "add":
        return None, None
    lin = linear_form(x)
    own = [v for v, c in lin.terms.items() if isinstance(v, Var) and c == 1 and v in axis_of and axis_of[v][3] >= 0]
    if len(own) != 1:
        return None, None
    v = own[0]
    rest = [(u, c) for u, c in lin.terms.items() if u is not v]
    if not rest or any(isinstance(m, Load) for u, _ in rest for m in walk(u)) or \
            not all(w in axis_of and axis_of[w][3] < 0 for u, _ in rest for w in free_vars(u)):
        return None, None
    shift = None
    for u, c in rest:
        term = u if c == 1 else Binary("mul", u, Const(c, u.dtype))
        shift = term if shift is None else Binary("add", shift, term)
    if lin.const:
        shift = Binary("add", shift, Const(lin.const, shift.dtype))
    return v, shift


def piece_descriptors(e, shapes: Sequence[tuple[int, ...]], axis_of: Mapping[Var, tuple], tile: tuple[str, str],
                      extents: Mapping[Var, int]) -> tuple[dict[str, int], tuple, dict] | None:
    """A select among loads of a concatenation read in place (``piece_tests``) read through one
    tensor descriptor per tile: (the tensor dim of each tile axis, the index every piece shares
    once its shift is taken off, each piece load's shift per dim) where every piece is a whole
    tile of its tensor (``descriptor_dims``, the tested axes' variables ranging over the piece's
    extent) of the same rank and strides, read at the same index but for a constant along the
    tested axes (a merged Q/K/V weight: ``w_k[n - 2048, k]``), else None.  The caller checks that
    each tile lies in one piece (every block divides its threshold; ``shapes``: the inputs')."""
    from ..analysis.index import linear_form
    from ..ir.expr import walk
    tests = piece_tests(e, axis_of)
    if not tests:
        return None
    tested = {v for v, info in axis_of.items() if info[0] in {name for name, _, _ in tests}}
    leaves = [n for n in walk(e) if isinstance(n, Load)]
    first: tuple | None = None          # (dims, index, strides) of the first piece
    shifts = {}
    for ld in leaves:
        shape = shapes[ld.tensor]
        idx, shift = [], []
        for x, n in zip(ld.index, shape):
            lin = linear_form(x)
            v, c = next(iter(lin.terms.items())) if len(lin.terms) == 1 else (None, 0)
            if v in tested and c == 1:      # the piece's position along the concatenation
                idx.append(v)
                shift.append(lin.const)
            else:
                idx.append(x)
                shift.append(0)
        ext = {**extents, **{v: n for v, n in zip(idx, shape) if v in tested}}
        got = descriptor_dims(Load(ld.tensor, tuple(idx), ld.dtype), shape, axis_of, tile, ext)
        this = (got, tuple(idx), tuple(math.prod(shape[d + 1:]) for d in range(len(shape))))
        if got is None or (first is not None and this != first):
            return None
        first = first or this
        shifts[ld] = tuple(shift)
    if first is None or len({ld.dtype for ld in leaves}) != 1:
        return None
    return first[0], first[1], shifts


# a test ``v <op> c`` as (threshold t, whether the test holds below t): v < c, v <= c, v >= c, v > c
_TESTS = {"lt": (0, True), "le": (1, True), "ge": (0, False), "gt": (1, False)}


def uniform_test(cond, axis_of: Mapping[Var, tuple]) -> tuple[str, int, bool] | None:
    """(axis, threshold t, below) when ``cond`` tests the one variable of a tile axis against a
    constant (``v < t`` when below, else ``v >= t``), else None.  A tile of the axis starts at a
    multiple of its block, so where the block divides ``t`` the test has one value over the whole
    tile: the printer tests the tile's first position (``emit.py: _pointers``).  ``axis_of`` as
    ``descriptor_dims``'."""
    from ..ir.expr import Binary, Const
    if not (isinstance(cond, Binary) and cond.op in _TESTS and isinstance(cond.a, Var)
            and isinstance(cond.b, Const) and cond.a in axis_of):
        return None
    name, vars_, _, _ = axis_of[cond.a]
    if len(vars_) != 1:
        return None
    shift, below = _TESTS[cond.op]
    return name, int(cond.b.value) + shift, below


def piece_tests(e, axis_of: Mapping[Var, tuple]) -> tuple[tuple[str, int, bool], ...] | None:
    """The tests of a select among loads (a concatenation read in place: a merged Q/K/V weight),
    each ``uniform_test``'s, or None when ``e`` is not one.  Where every block divides its
    threshold, each tile reads one of the loads, which the printer reads through one pointer
    chosen per tile: a plain load (vectorized, copied asynchronously), not one load per piece."""
    from ..ir.expr import Select
    if isinstance(e, Load):
        return ()
    if not isinstance(e, Select):
        return None
    test = uniform_test(e.cond, axis_of)
    a, b = piece_tests(e.a, axis_of), piece_tests(e.b, axis_of)
    if test is None or a is None or b is None:
        return None
    return (test, *a, *b)


def guarded_load(e) -> tuple[Load, Expr] | None:
    """(the load, the test) of a load selected where a test holds, else zero (a padded window:
    ``where(in_bounds, x[i - 1], 0)``; selects of such, their tests joined), or None.  The printer
    reads it as one load masked by the test and its own bounds: a zero-filling asynchronous copy,
    with no select in registers between the copy and the tensor cores."""
    from ..ir.expr import Const, Select, binary
    if not (isinstance(e, Select) and isinstance(e.b, Const) and e.b.value == 0
            and math.copysign(1.0, e.b.value) > 0):     # (a masked load fills +0, not -0)
        return None
    if isinstance(e.a, Load):
        return e.a, e.cond
    inner = guarded_load(e.a)
    return (inner[0], binary("and", e.cond, inner[1])) if inner else None


def shifted(body: tuple, first: int, by: int) -> tuple:
    """``body`` with every result slot from ``first`` on moved up by ``by``, where it is defined
    and where it is read: room for ``by`` more input slots before the results (a kernel that also
    reads back a workspace it writes)."""
    from ..ir.expr import Value, transform

    def e(x):
        return transform(x, lambda n: Value(n.slot + by, n.dtype) if isinstance(n, Value) and n.slot >= first
                         else None)

    def slot(k: int) -> int:
        return k + by if k >= first else k

    def stmt(st):
        if isinstance(st, Reduce):
            return replace(st, slot=slot(st.slot), value=e(st.value))
        if isinstance(st, Store):
            return replace(st, index=tuple(map(e, st.index)), value=e(st.value), guards=tuple(map(e, st.guards)))
        if isinstance(st, Dot):
            return replace(st, slot=slot(st.slot), a=e(st.a), b=e(st.b), init=None if st.init is None else e(st.init))
        if isinstance(st, Loop):
            return replace(st, body=tuple(map(stmt, st.body)),
                           state=tuple(replace(s, slot=slot(s.slot), init=e(s.init), next=e(s.next))
                                       for s in st.state))
        if isinstance(st, Arrive):
            return replace(st, body=tuple(map(stmt, st.body)))
        raise TypeError(f"shifted: {type(st).__name__} is not a statement")

    return tuple(map(stmt, body))


def pow2(n: int) -> int:
    """The least power of two at least ``n`` (and 1): block sizes are powers of two."""
    return 1 << max(n - 1, 0).bit_length()


# A specialized loop (``Kernel.specialized``) as Triton's Hopper pass makes it (sm_90 binaries,
# Triton 3.6 and 3.9): ``WS_WARPS`` warps a group, launched as three groups (8 warps are left
# unspecialized), and rows of at least ``WS_MIN_BM`` (two consumer groups of 64; BM 64 fails in the pass)
WS_WARPS = 4
WS_MIN_BM = 128


@dataclass(frozen=True)
class Kernel:
    name: str
    inputs: tuple[TensorType, ...]          # contiguous tensors, read-only
    outputs: tuple[TensorType, ...]         # contiguous tensors, written
    axes: tuple[TileAxis, ...]
    body: tuple[Stmt, ...]
    num_warps: int
    num_stages: int
    comments: tuple[str, ...] = ()
    reused: frozenset[Load] = field(default=frozenset())   # loads a later loop issues again (keep in cache)
    swizzle: int = 1               # group size of the group-M order of two axes sharing a grid dim
    written: frozenset[int] = field(default=frozenset())   # input slots aliasing an output that other
                                   # programs write (read after an Arrive, through L2: not L1)
    # scratch, declared so that launchers allocate it and the cost model places it (issue #21):
    workspaces: frozenset[int] = field(default=frozenset())  # output slots the launcher allocates per
                                   # call (split-K partials, a two-phase epilogue's pre-reduction values)
    counters: frozenset[int] = field(default=frozenset())    # output slots of int32 counters, zeroed
                                   # once and left at zero by every launch (an ``Arrive``'s)
    transient: frozenset[int] = field(default=frozenset())   # input slots reading a workspace the
                                   # schedule's previous kernel wrote (still in L2 where it fits)
    tma: bool = False              # Dot operands that are whole input tiles are read through tensor
                                   # descriptors (``tl.make_tensor_descriptor``: TMA on sm_90)
    phase: bool = False            # printed as a device function taking its program ids as
                                   # arguments (``pid0``...): a phase of a persistent kernel
    streamed: frozenset[int] = field(default=frozenset())   # input slots each of whose bytes one
                                   # program reads once (a GEMV's weights): loaded evict-first, so
                                   # they do not push out of L2 what others will read (a persistent
                                   # kernel's prefetched weights)
    specialized: bool = False      # the loop of its products (a GEMM's K, a chain's keys) split
                                   # between warp groups (``tl.range(..., warp_specialize=True)``,
                                   # Triton's Hopper pass, sm_90): a producer group issuing the
                                   # descriptor copies and two consumer groups of BLOCK_M / 2 rows
                                   # each, ``num_warps`` warps a group

    def __post_init__(self):
        dims = sorted({a.grid for a in self.axes if a.grid is not None})
        if dims != list(range(len(dims))):
            raise ValueError(f"kernel {self.name}: program-id dimensions {dims} are not 0..{len(dims) - 1}")

    @property
    def compute_warps(self) -> int:
        """The warps that compute: all of them, or the two consumer groups of a specialized loop."""
        return 2 * self.num_warps if self.specialized else self.num_warps

    @property
    def launched_warps(self) -> int:
        """The warps a program runs (a specialized loop's producer group beside its consumers)."""
        return 3 * self.num_warps if self.specialized else self.num_warps

    @property
    def rank(self) -> int:
        return 1 + max(a.dim for a in self.axes)

    @property
    def grid(self) -> tuple[int, ...]:
        sizes: dict[int, int] = {}
        for a in self.axes:
            if a.grid is not None:
                sizes[a.grid] = sizes.get(a.grid, 1) * max(a.chunks, 1)
        return tuple(sizes[g] for g in sorted(sizes)) or (1,)

    def sharing(self, grid: int) -> tuple[TileAxis, ...]:
        """The axes split by program-id dimension ``grid``, slowest first."""
        return tuple(a for a in self.axes if a.grid == grid)

    @property
    def empty(self) -> bool:
        """Nothing to compute: an empty output or an empty program-split axis."""
        return any(t.numel == 0 for t in self.outputs) or any(a.grid is not None and a.extent == 0
                                                             for a in self.axes)

    def bound(self, blocks: Mapping[str, int], num_warps: int, num_stages: int) -> "Kernel":
        """This kernel with block sizes bound by constexpr name (a family lowers a body once and
        binds each candidate tile), and its warps and pipeline depth."""
        axes = tuple(replace(a, block=blocks[a.block_name]) if blocks.get(a.block_name, a.block) != a.block else a
                     for a in self.axes)
        return replace(self, axes=axes, num_warps=num_warps, num_stages=num_stages)

    def task_mapping(self, grid: int) -> TaskMapping:
        """The mapping from program id ``grid`` to the tiles of the axes sharing it (slowest first):
        row-major, or group-M order under ``swizzle`` (Hidet's mappings, ``codegen/mapping.py``);
        what the printer emits and what the cost model's L2 window reads."""
        chunks = [max(a.chunks, 1) for a in self.sharing(grid)]
        if len(chunks) == 2 and self.swizzle > 1:
            return group_m(chunks[0], chunks[1], self.swizzle)
        return spatial(*chunks)

    def axis(self, name: str) -> TileAxis:
        for a in self.axes:
            if a.name == name:
                return a
        raise KeyError(name)

    def index_dtype(self) -> DType:
        """int32 when every offset and position fits (with a block of slack), else int64."""
        biggest = max([t.numel for t in self.inputs + self.outputs]
                      + [a.extent + a.span if a.within else a.chunks * a.block for a in self.axes] + [1])
        return DType.int32 if biggest < 2**31 - 1 else DType.int64
