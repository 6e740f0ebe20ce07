"""The gemm family's body: one contraction with its prologue inlined into the operands and its
epilogue at the accumulator's coordinates (see ``families/gemm/__init__.py``)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...analysis.classify import Category, contraction_operands
from ...analysis.inline import Inliner, Instance
from ...ir.dtypes import DType
from ...ir.expr import Cast, Expr, Value, Var, free_vars, substitute, transform, walk
from ..anchor import AccStore, acc_at, acc_reads, dot_operands, downstream, epilogue_store, split_operands, upstream
from ..base import Group
from .space import GemmShape

DOT_DTYPES = (DType.float16, DType.bfloat16, DType.float32)
MAX_EXPR_NODES = 4000


@dataclass(frozen=True)
class TwoPhase:
    """A row-reducing epilogue split for tiles that do not hold whole rows: every program stores
    ``pre`` (the value the row reductions and the late stores read the accumulator through, e.g.
    ``acc + bias + residual`` before a LayerNorm) and the early stores; the last program of each
    row block re-reads ``pre`` over the block's rows, reduces them and makes the late stores."""
    pre: Expr                     # over the accumulator's variables, reading it as Value(acc)
    source: int                   # the store whose value is ``pre`` at the accumulator's own
                                  # coordinates (re-read from that output), or -1: a workspace
    early: tuple[int, ...]        # stores reading no row reduction (indices into ``stores``)
    late: tuple[int, ...]


@dataclass(frozen=True)
class GemmBody:
    """What a gemm kernel computes, before tile sizes are chosen."""
    group: Group
    anchor: str                              # the contraction
    inputs: tuple[str, ...]                  # kernel input slots; the accumulator is slot len(inputs)
    avars: tuple[Var, ...]                   # the accumulator's variables, one per output dim
    bvars: tuple[Var, ...]                   # batch axes (one program per batch position)
    mvars: tuple[Var, ...]
    nvars: tuple[Var, ...]
    kvars: tuple[Var, ...]
    ext: dict                                # Var -> extent, for every variable above
    a: Expr                                  # operand A over batch, m and k variables
    b: Expr                                  # operand B over batch, k and n variables
    in_dtype: DType                          # the dot's operand type
    out_dtype: DType                         # the contraction's: the accumulator is rounded to it
    instances: tuple[Instance, ...]          # epilogue row reductions over N (their reduced vars are nvars)
    stores: tuple[AccStore, ...]
    phases: TwoPhase | None = None           # how the epilogue splits when rows span tiles
    # prologue row reductions (an RMSNorm's or LayerNorm's statistics of A's rows): each reduced
    # over its own variables for the program's rows before the K loop, read by ``a`` as
    # Value(slot) (slots from ``prologue_slot``), in dependency order
    prologue: tuple[Instance, ...] = ()

    @property
    def acc(self) -> int:
        return len(self.inputs)

    @property
    def acc_shape(self) -> tuple[int, ...]:
        return tuple(self.ext[v] for v in self.avars)

    @property
    def shape(self) -> GemmShape:
        e = self.ext
        prod = lambda vs: math.prod(e[v] for v in vs)  # noqa: E731
        return GemmShape(prod(self.bvars), prod(self.mvars), prod(self.nvars), prod(self.kvars), self.in_dtype,
                         bool(self.instances))


# ---------------------------------------------------------------- the body

def gemm_body(group: Group) -> GemmBody | None:
    """The group as one contraction with its prologue and epilogue, or None (see the module doc)."""
    members = group.members
    conts = [p for p, cat in zip(group.prims, group.categories) if cat is Category.contraction]
    if len(conts) != 1:
        return None
    (c,) = conts
    ops = contraction_operands(c)
    if ops is None or c.out.dtype not in DOT_DTYPES or c.out.numel == 0 or 0 in c.reduce.extents:
        return None     # empty: nothing to tile (an empty K is the library's zeros)
    pro = upstream(c, members)
    if any(n in group.outputs for n in pro):
        return None
    epi = [p for p in group.prims if p.name not in pro and p is not c]
    down = downstream(c, members)
    # a member neither feeding nor reading the contraction is recomputed where the epilogue reads
    # it (``relu(v)`` in ``x @ w + relu(v)``): injective, and not written out
    if any(p.name not in down and (p.reduce is not None or p.name in group.outputs) for p in epi):
        return None
    avars = tuple(Var(f"a{j}") for j in range(c.out.rank))
    kvars = tuple(Var(f"k{j}") for j in range(len(c.reduce.axes)))
    pos = {v: j for j, v in enumerate(c.axes)}
    bvars, mvars, nvars = (tuple(avars[pos[v]] for v in vs) for vs in ops)
    ext = dict(zip(avars, c.out.shape)) | dict(zip(kvars, c.reduce.extents))

    # prologue: the operands, with every member the contraction reads through inlined
    inl = Inliner({n: members[n] for n in pro}, group.inputs)
    body = inl.resolve(c, dict(zip(c.axes, avars)) | dict(zip(c.reduce.axes, kvars)))
    rows = set(bvars) | set(mvars)
    if any(not free_vars(e) <= rows for i in inl.instances for e in i.index):
        return None     # a prologue reduction varying along K or N (a softmax over M): not a row's
    operands = split_operands(body, rows | set(kvars), set(bvars) | set(nvars) | set(kvars), set(mvars), set(nvars))
    if operands is None:
        return None
    if any(isinstance(x, Value) for x in walk(operands[1])):
        return None     # B reading a reduction (a normalized weight)
    dt = c.out.dtype
    a, b, in_dt = dot_operands(*operands, dt)

    # epilogue: every output at the accumulator's coordinates
    acc = len(group.inputs)
    # (an epilogue may read a prologue value too: it is recomputed there from the inputs)
    einl = Inliner({p.name: p for p in group.prims if p is not c}, group.inputs + (c.name,))
    stores: list[AccStore] = []
    for o in group.outputs:
        if o == c.name:
            stores.append(AccStore(o, avars, Value(acc, dt)))
            continue
        st = epilogue_store(members[o], einl, acc, c, avars, ext)
        if st is None:
            return None
        stores.append(st)
    instances = _row_reductions(einl, acc, avars, nvars, ext, dt)
    if instances is None:
        return None
    size = sum(1 for s in stores for _ in walk(s.value)) + sum(1 for i in instances for _ in walk(i.body))
    if size > MAX_EXPR_NODES:
        return None
    a, prologue = _prologue_slots(a, inl.instances, prologue_slot(acc, instances))
    return GemmBody(group, c.name, group.inputs, avars, bvars, mvars, nvars, kvars, ext, a, b, in_dt, dt, instances,
                    tuple(stores), _two_phase(instances, stores, acc, avars, dt) if instances else None, prologue)


def prologue_slot(acc: int, instances) -> int:
    """The first result slot of the prologue's reductions: past every slot a template gives the
    accumulator, the epilogue's reductions and split-K's sums (at most ``acc + 2 + len(instances)``)."""
    return acc + 3 + len(instances)


def _prologue_slots(a: Expr, instances, first: int) -> tuple[Expr, tuple[Instance, ...]]:
    """A's expression and the prologue's reductions with the reductions renumbered from slot
    ``first`` (the inliner numbers them after the inputs, where the accumulator is)."""
    moved = {i.slot: first + j for j, i in enumerate(instances)}
    return renumber(a, moved), tuple(Instance(moved[i.slot], i.prim, i.index, renumber(i.body, moved), i.rvars,
                                              i.rext, i.combiner, i.dtype) for i in instances)


def renumber(e: Expr, moved: dict) -> Expr:
    """``e`` reading results (``Value``) from the slots ``moved`` gives them."""
    if not moved:
        return e
    return transform(e, lambda n: Value(moved[n.slot], n.dtype) if isinstance(n, Value) and n.slot in moved else None)


def _row_reductions(einl: Inliner, acc: int, avars, nvars, ext, c_dtype: DType) -> tuple[Instance, ...] | None:
    """The epilogue's reductions, each over the accumulator's N axes for a fixed row, with its
    reduced variables renamed to the N variables (so they run on the accumulator tile); None when
    one is not such a row reduction."""
    out = []
    nset = set(nvars)
    for inst in einl.instances:
        if len(inst.rvars) != len(nvars) or any(free_vars(e) & nset for e in inst.index):
            return None
        reads = acc_reads(inst.body, acc)
        rename: dict[Var, Var] = {}
        for idx in reads:
            for e, a in zip(idx, avars):
                if a in nset:
                    if not isinstance(e, Var) or e not in inst.rvars or rename.get(e, a) is not a:
                        return None
                    rename[e] = a
                elif e is not a:
                    return None
        if len(rename) != len(nvars) or tuple(rename.get(r) for r in inst.rvars) != nvars:
            return None
        body = acc_at(substitute(inst.body, rename), acc, tuple(avars), c_dtype, {})
        out.append(Instance(inst.slot, inst.prim, inst.index, body, nvars, tuple(ext[v] for v in nvars),
                            inst.combiner, inst.dtype))
    return tuple(out)


def _two_phase(instances, stores, acc: int, avars, dt: DType) -> TwoPhase:
    """Where a row-reducing epilogue splits (``TwoPhase``): ``pre`` is the largest expression of
    the accumulator that every read of it by the reductions and the late stores goes through
    (the accumulator itself at worst)."""
    slots = {i.slot for i in instances}
    tile = Value(acc, dt)
    memo: dict[int, bool] = {}

    def reduced(e: Expr) -> bool:         # reads a row reduction
        got = memo.get(id(e))
        if got is None:
            got = memo[id(e)] = (isinstance(e, Value) and e.slot in slots) or any(reduced(c) for c in e.children())
        return got

    late = tuple(j for j, st in enumerate(stores) if reduced(st.value))
    early = tuple(j for j in range(len(stores)) if j not in late)
    values = [i.body for i in instances] + [stores[j].value for j in late]
    tops: list[Expr] = []                # maximal subexpressions reading the accumulator, no reduction

    def collect(e: Expr) -> None:
        if not reduced(e):
            if any(x is tile for x in walk(e)):
                tops.append(e)
            return
        for c in e.children():
            collect(c)

    for v in values:
        collect(v)
    common = None
    for t in tops:
        subs = {x for x in walk(t) if any(y is tile for y in walk(x))}
        common = subs if common is None else common & subs
    pre = tile
    for e in sorted(common or (), key=lambda x: -sum(1 for _ in walk(x))):
        mark = Value(-1, e.dtype)
        if all(not any(x is tile for x in walk(transform(v, lambda n: mark if n is e else None)))
               for v in values):
            pre = e
            break
    while isinstance(pre, Cast) and pre.x.dtype in (DType.float16, DType.bfloat16) and pre.dtype is DType.float32:
        pre = pre.x                       # store the 16-bit value: widening it again is exact
    source = next((j for j in early if stores[j].index == tuple(avars) and stores[j].value is pre), -1)
    return TwoPhase(pre, source, early, late)
