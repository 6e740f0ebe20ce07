"""The chain family's body: two contractions with what lies between them (the online softmax
recognized), their operands' prologues and the second's epilogue (see ``families/chain/__init__.py``)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ...analysis.classify import Category, contraction_operands
from ...analysis.index import extent_ranges, linear_form
from ...analysis.inline import Inliner, Instance
from ...ir.dtypes import DType
from ...ir.expr import Binary, Cast, Const, Expr, Load, Value, Select, Unary, Var, binary, cast, free_vars, select, \
    substitute, transform, unary, walk
from ...transform.simplify import simplify
from ..anchor import AccStore, HALF, dot_operands, downstream, epilogue_store, split_operands, upstream
from ..base import Group

DOT_DTYPES = (DType.float16, DType.bfloat16, DType.float32)
MAX_EXPR_NODES = 4000


@dataclass(frozen=True)
class OnlineSoftmax:
    """The softmax between the contractions, as the online rewrite needs it: the second
    contraction's operand is ``exp_term × coeff``; ``exp_term = exp(score - max)``."""
    score: Expr          # over the tile: the first contraction read as Load(S, ())
    exp_term: Expr       # exp(score - Load(max slot)), as written in the operand
    coeff: Expr          # row-only: reads Load(max slot) and Load(sum slot)
    max_slot: int
    sum_slot: int


@dataclass(frozen=True)
class ChainBody:
    """What a chain kernel computes, before tile sizes are chosen."""
    group: Group
    first: str                           # the first contraction (its N axis is the second's K)
    second: str
    inputs: tuple[str, ...]              # kernel input slots
    avars: tuple[Var, ...]               # the second contraction's output variables
    bvars: tuple[Var, ...]               # batch (one program per position)
    mvars: tuple[Var, ...]               # rows of both contractions
    nvars: tuple[Var, ...]               # the first's columns, the second's reduction (keys)
    kvars: tuple[Var, ...]               # the first's reduction (a head dim)
    hvars: tuple[Var, ...]               # the second's columns (the value head dim)
    ext: dict                            # Var -> extent
    a: Expr                              # over b, m, k
    b: Expr                              # over b, k, n
    d: Expr                              # over b, n, h
    p: Expr                              # the second's operand over b, m, n: reads the first's tile as
                                         # Load(S, ()) and the softmax's instances (when ``softmax``)
    softmax: OnlineSoftmax | None
    in1: DType                           # the first dot's operand type
    s_dtype: DType                       # the first contraction's type (its tile is rounded to it)
    in2: DType                           # the second dot's operand type
    c_dtype: DType                       # the second contraction's type
    instances: tuple[Instance, ...]      # the softmax's max and sum (bodies over the tile)
    stores: tuple[AccStore, ...]         # read the second contraction as Load(S, ()) (its own slot)
    causal: int | None = None            # keys beyond row + causal score -inf (an index predicate):
                                         # a row tile's key loop stops at its last row + causal
    window: int | None = None            # keys before row - window score -inf: the key loop starts
                                         # at its first row - window (a sliding window)

    @property
    def slot(self) -> int:
        """The slot the first contraction's tile (and, in the stores, the second's value) is read from."""
        return len(self.inputs)

    def extent(self, vs) -> int:
        return math.prod(self.ext[v] for v in vs)


def chain_body(group: Group) -> ChainBody | None:
    """The group as a chain of two contractions (see the module docstring), or None."""
    members = group.members
    conts = [p for p, cat in zip(group.prims, group.categories) if cat is Category.contraction]
    if len(conts) != 2:
        return None
    c1, c2 = conts
    if c1.name not in upstream(c2, members):
        return None
    if any(c.out.dtype not in DOT_DTYPES or c.out.numel == 0 for c in (c1, c2)):
        return None
    ops1, ops2 = contraction_operands(c1), contraction_operands(c2)
    if ops1 is None or ops2 is None or not ops2[1] or not ops2[2]:
        return None
    after = downstream(c2, members)
    between = downstream(c1, members) & upstream(c2, members)
    pro1 = upstream(c1, members)
    # the scores and what the first contraction reads stay on chip: only the second contraction
    # and its epilogue are written; reductions only between the contractions (the softmax)
    if any(o != c2.name and o not in after for o in group.outputs):
        return None
    if any(p.reduce is not None and p.name not in between for p in group.prims if p not in (c1, c2)):
        return None
    nin = len(group.inputs)
    avars = tuple(Var(f"a{j}") for j in range(c2.out.rank))
    nvars = tuple(Var(f"n{j}") for j in range(len(c2.reduce.axes)))
    pos = {v: j for j, v in enumerate(c2.axes)}
    bvars, mvars, hvars = (tuple(avars[pos[v]] for v in vs) for vs in ops2)
    ext = dict(zip(avars, c2.out.shape)) | dict(zip(nvars, c2.reduce.extents))

    # the second contraction's operands, the first read as an input slot (the score tile)
    inl = Inliner({p.name: p for p in group.prims if p not in (c1, c2) and p.name not in after},
                  group.inputs + (c1.name,))
    body2 = inl.resolve(c2, dict(zip(c2.axes, avars)) | dict(zip(c2.reduce.axes, nvars)))
    bs, ms, ns, hs = set(bvars), set(mvars), set(nvars), set(hvars)
    operands = split_operands(body2, bs | ms | ns, bs | ns | hs, ms, hs)
    if operands is None:
        return None
    p, d = operands
    instances = [_keyed(i, nvars, c2.reduce.extents, bs | ms) for i in inl.instances]
    if any(i is None for i in instances) or _reads(d, nin) or any(_reads(d, i.slot) for i in instances):
        return None
    # where the score tile is read: one index, a permutation of the first contraction's axes
    reads = {ld.index for e in [p] + [i.body for i in instances] for ld in walk(e)
             if isinstance(ld, Load) and ld.tensor == nin}
    if len(reads) != 1:
        return None
    (sidx,) = reads
    if not all(isinstance(v, Var) for v in sidx) or len(set(sidx)) != len(sidx):
        return None
    cmap = dict(zip(c1.axes, sidx))
    ones = {v for v, n in ext.items() if n == 1}     # always 0: whichever role they take
    b1, m1, n1 = ({cmap[v] for v in vs} - ones for vs in ops1)
    if m1 != ms - ones or n1 != ns - ones or not b1 <= bs or tuple(cmap[v] for v in ops1[2]
                                                                 if cmap[v] not in ones) != tuple(
                                                                     v for v in nvars if v not in ones):
        return None
    s_dtype = c1.out.dtype
    tile = Value(nin, s_dtype)
    on_tile = lambda e: transform(e, lambda n: tile if isinstance(n, Load) and n.tensor == nin else None)  # noqa: E731
    p = on_tile(p)
    instances = tuple(Instance(i.slot, i.prim, i.index, on_tile(i.body), nvars, i.rext, i.combiner, i.dtype)
                      for i in instances)

    # the first contraction's operands
    kvars = tuple(Var(f"k{j}") for j in range(len(c1.reduce.axes)))
    ext |= dict(zip(kvars, c1.reduce.extents))
    inl1 = Inliner({n: members[n] for n in pro1}, group.inputs)
    body1 = inl1.resolve(c1, cmap | dict(zip(c1.reduce.axes, kvars)))
    if inl1.instances or any(n in group.outputs for n in pro1):
        return None
    ks = set(kvars)
    ab = split_operands(body1, bs | ms | ks, bs | ks | ns, ms, ns)
    if ab is None:
        return None
    a, b, in1 = dot_operands(*ab, s_dtype)

    softmax = None
    if instances:
        softmax = _online_softmax(p, instances, nvars)
        if softmax is None:
            return None
    # the second dot multiplies the probabilities in the values' 16-bit type (FlashAttention's
    # choice: p in [0, 1] rounded once) when the values are 16-bit widened for the product
    in2 = d.x.dtype if isinstance(d, Cast) and d.x.dtype in HALF else d.dtype
    if isinstance(d, Cast) and d.x.dtype in HALF:
        d = d.x
    if in2 not in DOT_DTYPES:
        return None

    # the epilogue: every output at the second contraction's coordinates
    # (it may recompute members that need neither contraction, not read the scores' chain)
    # (no member the epilogue may inline reads the scores' chain: one that is not downstream of
    # the second contraction, say t1 + x feeding the output beside it, would need the scores at
    # the output's coordinates)
    onchip = between | {c1.name}
    epilogue = {q.name: q for q in group.prims if q not in (c1, c2) and q.name not in onchip}
    if any(n in onchip for q in epilogue.values() for n in q.inputs):
        return None
    einl = Inliner(epilogue, group.inputs + (c2.name,))
    stores: list[AccStore] = []
    for o in group.outputs:
        if o == c2.name:
            stores.append(AccStore(o, avars, Value(nin, c2.out.dtype)))
            continue
        st = epilogue_store(members[o], einl, nin, c2, avars, ext)
        if st is None:
            return None
        stores.append(st)
    if einl.instances:
        return None
    size = sum(1 for e in [a, b, d, p] + [st.value for st in stores] for _ in walk(e))
    if size > MAX_EXPR_NODES:
        return None
    causal, window = _key_bounds(softmax.score, mvars, nvars, ext) if softmax else (None, None)
    return ChainBody(group, c1.name, c2.name, group.inputs, avars, bvars, mvars, nvars, kvars, hvars, ext,
                     a, b, d, p, softmax, in1, s_dtype, in2, c2.out.dtype, instances, tuple(stores), causal,
                     window)


def _key_bounds(score: Expr, mvars, nvars, ext) -> tuple[int | None, int | None]:
    """``(c, w)``: the score is -inf wherever key > row + c, and wherever key < row - w (None
    where no such bound holds): the score is a select of -inf on index comparisons of the one
    varying key and the one varying row variable (is_causal, or a mask built from their
    positions: causal, a sliding window), perhaps under other such selects (a boolean mask)."""
    rows, keys = [v for v in mvars if ext[v] > 1], [v for v in nvars if ext[v] > 1]
    if len(rows) != 1 or len(keys) != 1:
        return None, None
    best = window = None
    e = _strip(score)
    while True:
        if isinstance(e, Select) and _is_neg_inf(e.b):            # where(keep, s, -inf)
            conds, e = _conjuncts(e.cond), _strip(e.a)
        elif isinstance(e, Select) and _is_neg_inf(e.a):          # masked_fill(hide, -inf)
            conds, e = _negated_conjuncts(e.cond), _strip(e.b)
        elif getattr(e, "op", None) == "add" and _additive(e.b) is not None:   # s + where(keep, 0, -inf)
            conds, e = _additive(e.b), _strip(e.a)
        elif getattr(e, "op", None) == "add" and _additive(e.a) is not None:
            conds, e = _additive(e.a), _strip(e.b)
        else:
            break
        for c in conds:
            bound = _key_bound(c, rows[0], keys[0], ext)
            if bound is not None:
                best = bound if best is None else min(best, bound)
            low = _key_bound(c, rows[0], keys[0], ext, lower=True)
            if low is not None:
                window = low if window is None else min(window, low)
    return best, window


def unmasked(e: Expr, mvars, nvars, ext, c: int) -> Expr:
    """``e`` over a chunk of keys wholly at or before the tile's first row + ``c`` (every key <=
    every row + c): each comparison of the key with the row that this decides is a constant,
    which the constructors fold, so a causal mask's select (or its additive -inf) disappears.
    Valid wherever such a comparison appears, since it holds at every position of the chunk."""
    rows, keys = [v for v in mvars if ext[v] > 1], [v for v in nvars if ext[v] > 1]
    if len(rows) != 1 or len(keys) != 1:
        return e

    def decide(n: Expr) -> Expr | None:
        op = getattr(n, "op", None)
        if op not in _NEGATE:
            return None
        for cond, value in ((n, True), (binary(_NEGATE[op], n.a, n.b), False)):
            bound = _key_bound(cond, rows[0], keys[0], ext)
            if bound is not None and bound >= c:
                return Const(value, DType.bool)
        return None
    return transform(e, decide)


def _additive(e: Expr) -> list[Expr] | None:
    """The conditions of an additive mask ``where(keep, 0, -inf)`` (or ``where(hide, -inf, 0)``).
    (Stopping at the band skips keys whose scores eager adds -inf to; only a +inf score, an
    overflowed product, would have made that NaN instead.)"""
    e = _strip(e)
    if isinstance(e, Select):
        a, b = _strip(e.a), _strip(e.b)
        if isinstance(a, Const) and a.value == 0 and _is_neg_inf(b):
            return _conjuncts(e.cond)
        if isinstance(b, Const) and b.value == 0 and _is_neg_inf(a):
            return _negated_conjuncts(e.cond)
    return None


_NEGATE = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt"}



def _negated_conjuncts(c: Expr) -> list[Expr]:
    """Conjuncts implied by ``not c`` (comparisons flipped, ``or`` split); [] where unknown."""
    op = getattr(c, "op", None)
    if op == "or":
        return _negated_conjuncts(c.a) + _negated_conjuncts(c.b)
    if op == "not":
        return _conjuncts(c.x)
    if op in _NEGATE:
        return [binary(_NEGATE[op], c.a, c.b)]
    return []


def _is_neg_inf(e: Expr) -> bool:
    e = _strip(e)
    return isinstance(e, Const) and e.value == -math.inf


def _conjuncts(c: Expr) -> list[Expr]:
    if getattr(c, "op", None) == "and":
        return _conjuncts(c.a) + _conjuncts(c.b)
    return [c]


def _key_bound(c: Expr, m: Var, n: Var, ext, lower: bool = False) -> int | None:
    """``k`` when condition ``c`` implies key n <= row m + k (n - m + const compared with 0);
    with ``lower``, ``w`` when it implies key n >= row m - w."""
    op = getattr(c, "op", None)
    if op not in ("le", "lt", "ge", "gt"):
        return None
    lhs, rhs = (c.a, c.b) if op in ("le", "lt") else (c.b, c.a)      # lhs <(=) rhs
    form = linear_form(binary("sub", lhs, rhs))
    terms = {v: k for v, k in form.terms.items() if not (isinstance(v, Var) and ext.get(v) == 1)}
    strict = 1 if op in ("lt", "gt") else 0
    if not lower and terms == {n: 1, m: -1}:
        # n - m + const <= 0 (or < 0): n <= m - const (- 1)
        return -form.const - strict
    if lower and terms == {n: -1, m: 1}:
        # m - n + const <= 0 (or < 0): n >= m + const (+ 1), so w = -const - 1 for strict
        return -form.const - strict
    return None


def _reads(e: Expr, slot: int) -> bool:
    """``e`` reads input slot ``slot`` or the result in that slot."""
    return any((isinstance(n, Load) and n.tensor == slot) or (isinstance(n, Value) and n.slot == slot) for n in walk(e))


def _keyed(inst: Instance, nvars, extents, rows: set) -> Instance | None:
    """An instance reducing over the keys for one row (its index over batch and row variables),
    with its reduced variables renamed to the keys'.  It must reduce over exactly the keys'
    extents: a softmax over more columns than the second contraction reads (attention sinks: a
    logit per head concatenated to the scores, sliced off after) is not the online softmax."""
    if len(inst.rvars) != len(nvars) or tuple(inst.rext) != tuple(extents) \
            or any(free_vars(e) - rows for e in inst.index):
        return None
    body = substitute(inst.body, dict(zip(inst.rvars, nvars)))
    return Instance(inst.slot, inst.prim, inst.index, body, nvars, inst.rext, inst.combiner, inst.dtype)


def _strip(e: Expr) -> Expr:
    while isinstance(e, Cast):
        e = e.x
    return e


def _online_softmax(p: Expr, instances, nvars) -> OnlineSoftmax | None:
    """The softmax of the module docstring, or None."""
    if len(instances) != 2:
        return None
    mx, sm = instances
    if mx.combiner != "max" or sm.combiner != "sum":
        return None
    top = Value(mx.slot, mx.dtype)
    exps = {e for e in walk(p) if isinstance(e, Unary) and e.op == "exp" and _minus(e.x, top)}
    if len(exps) != 1:
        return None
    (term,) = exps
    score = term.x.a
    if _strip(mx.body) is not _strip(score) or _strip(sm.body) is not _strip(term):
        return None
    mark = Value(-1, term.dtype)
    p = _nan_guards(p, term, top, set(nvars))
    coeff = _coefficient(transform(p, lambda n: mark if n is term else None), mark)
    if coeff is None or free_vars(coeff) & set(nvars) or _reads(coeff, -1):
        return None
    if any(isinstance(n, Load) and n.index for n in walk(coeff)):
        return None      # row-only means the reductions' values and constants only
    return OnlineSoftmax(score, term, coeff, mx.slot, sm.slot)


def _nan_guards(p: Expr, term: Expr, top: Expr, nvars: set) -> Expr:
    """``p`` with each ``where(isnan(q), 0, q)`` around the softmax (the ONNX exporters write it
    so that a row whose keys are all masked yields zeros, not NaN) as the row-only select it is:
    ``q = exp(score - max) · c`` with ``c`` row-only is NaN exactly where the row's max is not
    finite (a NaN score makes the max NaN; +inf makes ``inf - inf``; all -inf makes
    ``-inf - -inf``), and otherwise every ``exp`` lies in [0, 1] and the sum, which holds a 1, is
    finite.  So the guard tests the max, and ``p`` stays ``exp_term × coefficient``."""
    mark = Value(-1, term.dtype)

    def guard(e: Expr) -> Expr | None:
        if not isinstance(e, Select) or not _zero(e.a):
            return None
        cond = _strip(e.cond)
        if not (isinstance(cond, Unary) and cond.op == "isnan" and _strip(cond.x) is _strip(e.b)):
            return None
        c = _coefficient(transform(e.b, lambda n: mark if n is term else None), mark)
        if c is None or free_vars(c) & nvars or _reads(c, -1) or any(isinstance(n, Load) and n.index for n in walk(c)):
            return None
        return select(binary("or", unary("isnan", top), unary("isinf", top)), e.a, e.b)
    return transform(p, guard)


def _zero(x: Expr) -> bool:
    return isinstance(_strip(x), Const) and _strip(x).value == 0


def _minus(e: Expr, top: Expr) -> bool:
    return getattr(e, "op", None) == "sub" and _strip(e.b) is top


def _coefficient(e: Expr, t: Expr) -> Expr | None:
    """``c`` with ``e = c · t`` (``t`` occurring linearly: through products and quotients by
    expressions free of it, negation, casts, and selects on conditions free of it whose other
    branch is zero), else None."""
    def has(x: Expr) -> bool:
        return any(n is t for n in walk(x))

    if e is t:
        return Const(1.0, t.dtype)
    if isinstance(e, Cast):
        return _coefficient(e.x, t)
    if isinstance(e, Unary) and e.op == "neg":
        c = _coefficient(e.x, t)
        return None if c is None else binary("sub", Const(0.0, c.dtype), c)
    if isinstance(e, Select):
        if has(e.cond):
            return None
        ca = _coefficient(e.a, t) if has(e.a) else (Const(0.0, t.dtype) if _zero(e.a) else None)
        cb = _coefficient(e.b, t) if has(e.b) else (Const(0.0, t.dtype) if _zero(e.b) else None)
        return None if ca is None or cb is None else select(e.cond, ca, cast(cb, ca.dtype))
    if getattr(e, "op", None) in ("mul", "div"):
        if e.op == "mul" and has(e.b) and not has(e.a):
            c = _coefficient(e.b, t)
            return None if c is None else binary("mul", cast(e.a, c.dtype), c)
        if has(e.a) and not has(e.b):
            c = _coefficient(e.a, t)
            return None if c is None else binary(e.op, c, cast(e.b, c.dtype))
    return None


def grouped(b: ChainBody) -> ChainBody | None:
    """Grouped-query attention packed into rows (GQA packing, as decode kernels do): a batch
    variable ``v`` (a query head) that the keys and values read only as ``v // G`` (``G`` query
    heads share a key/value head) is split into ``v = h·G + g``: ``h`` stays a batch variable, the
    group ``g`` joins the rows, so one program reads its key/value head once for the ``G`` heads
    (rather than ``G`` programs reading it each) and a decode step's single query row becomes ``G``
    rows of a tensor-core tile.  None where no batch variable qualifies, or the key loop is
    bounded per row (causal, windowed: the bound needs one row variable)."""
    if b.causal is not None or b.window is not None:
        return None
    for v in b.bvars:
        divisors = {n.b.value for e in (b.b, b.d) for n in walk(e)
                    if isinstance(n, Binary) and n.op == "floordiv" and n.a is v and isinstance(n.b, Const)}
        if len(divisors) != 1:
            continue
        (size,) = divisors
        if not isinstance(size, int) or size < 2 or b.ext[v] % size:
            continue
        h, g = Var(f"{v.name}h"), Var(f"{v.name}g")
        ext = {u: n for u, n in b.ext.items() if u is not v} | {h: b.ext[v] // size, g: size}
        ranges = extent_ranges(ext)
        sub = {v: binary("add", binary("mul", h, Const(size, v.dtype)), g)}

        def on(e: Expr) -> Expr:
            return simplify(substitute(e, sub), ranges)
        kb, kd = on(b.b), on(b.d)
        if g in free_vars(kb) or g in free_vars(kd):
            continue
        sm = b.softmax
        if sm is not None:
            sm = OnlineSoftmax(on(sm.score), on(sm.exp_term), on(sm.coeff), sm.max_slot, sm.sum_slot)
        split = lambda vs: tuple(x for u in vs for x in ((h, g) if u is v else (u,)))  # noqa: E731
        return replace(b, avars=split(b.avars), bvars=tuple(h if u is v else u for u in b.bvars),
                       mvars=(g,) + b.mvars, ext=ext, a=on(b.a), b=kb, d=kd, p=on(b.p), softmax=sm,
                       instances=tuple(replace(i, index=tuple(on(x) for x in i.index), body=on(i.body))
                                       for i in b.instances),
                       stores=tuple(AccStore(st.tensor, tuple(on(x) for x in st.index), on(st.value))
                                    for st in b.stores))
    return None
