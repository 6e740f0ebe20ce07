"""Affine forms and interval (bounds) analysis of index expressions; Welder-style load boxes.

An *interval* is an inclusive pair ``(lo, hi)``; a side that cannot be bounded is ``-inf``/``inf``
(floats), so ``UNKNOWN = (-inf, inf)``.  Booleans are the integers 0 and 1.  Variable ranges are
given as a mapping ``Var -> (lo, hi)`` (inclusive); a variable without one is unknown; if one is
empty (``lo > hi``, a zero extent) there is no point at all and every bound is ``EMPTY``.

Soundness: for every assignment of the variables within their ranges, the value of an expression
lies within its ``bounds``.  Index (int64) arithmetic is assumed not to overflow; narrower integer
types wrap, so their bounds fall back to the type's full range whenever they might.  Bounds are
exact for affine expressions over distinct variables and conservative elsewhere (floordiv/mod,
min/max, casts, ``Select`` as the union of its branches, each under the ranges its condition allows).

Data-dependent loads (a gather's index) are bounded by an optional ``load_bounds(load)`` callback,
else by their dtype; :func:`load_box` clips each dimension to the tensor shape when given, so a
data-dependent index covers the full dimension (Welder's "undefined % dim").  :func:`input_boxes`
is Welder's tile propagation through one prim: given the ranges of an output tile (and of a
reduce-axis chunk), the box of each input it reads.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import torch

from ..ir.dtypes import DType
from ..ir.expr import INDEX, Binary, Cast, Const, Expr, Load, Select, Unary, Value, Var
from ..ir.prim import Prim

INF = math.inf
UNKNOWN = (-INF, INF)
EMPTY = (INF, -INF)   # no value at all: some variable's range is empty
BOOL = (0, 1)

Interval = tuple  # (lo, hi), ints or +-inf
LoadBounds = Callable[[Load], "Interval | None"]


def dtype_range(dtype: DType) -> Interval:
    """Values a dtype can hold (int64 is treated as unbounded: index math does not overflow)."""
    if dtype is DType.bool:
        return BOOL
    if dtype.is_int and dtype is not INDEX:
        info = torch.iinfo(dtype.to_torch())
        return (info.min, info.max)
    return UNKNOWN


# ---------------------------------------------------------------- linear forms

class Linear:
    """``sum(coeff * atom) + const`` over integer atoms (Vars or non-affine sub-expressions)."""
    __slots__ = ("terms", "const")

    def __init__(self, terms: Mapping[Expr, int] | None = None, const: int = 0):
        self.terms = {a: c for a, c in (terms or {}).items() if c != 0}
        self.const = const

    def __add__(self, o: "Linear") -> "Linear":
        t = dict(self.terms)
        for a, c in o.terms.items():
            t[a] = t.get(a, 0) + c
        return Linear(t, self.const + o.const)

    def scale(self, k: int) -> "Linear":
        return Linear({a: c * k for a, c in self.terms.items()}, self.const * k)

    def __sub__(self, o: "Linear") -> "Linear":
        return self + o.scale(-1)

    @property
    def is_const(self) -> bool:
        return not self.terms


def _lin_add(a, b): return a + b
def _lin_sub(a, b): return a - b


def _lin_mul(a: Linear, b: Linear) -> Linear | None:
    if a.is_const:
        return b.scale(a.const)
    if b.is_const:
        return a.scale(b.const)
    return None  # a product of two non-constant terms is an atom


_LINEAR_BINARY = {"add": _lin_add, "sub": _lin_sub, "mul": _lin_mul}


def linear_form(e: Expr, memo: dict | None = None) -> Linear:
    """Linear form of an integer expression; anything not built from +, -, *const, neg is an atom."""
    memo = {} if memo is None else memo
    got = memo.get(e)
    if got is not None:
        return got
    out = None
    if isinstance(e, Const) and e.dtype.is_int:
        out = Linear({}, e.value)
    elif isinstance(e, Binary) and e.op in _LINEAR_BINARY and e.dtype.is_int:
        out = _LINEAR_BINARY[e.op](linear_form(e.a, memo), linear_form(e.b, memo))
    elif isinstance(e, Unary) and e.op == "neg" and e.dtype.is_int:
        out = linear_form(e.x, memo).scale(-1)
    if out is None:
        out = Linear({e: 1}, 0)
    memo[e] = out
    return out


def affine_form(e: Expr) -> tuple[dict[Var, int], int] | None:
    """``({var: coeff}, const)`` when ``e`` is an affine int64 expression of Vars, else None."""
    if e.dtype is not INDEX:
        return None
    lin = linear_form(e)
    if not all(isinstance(a, Var) for a in lin.terms):
        return None
    return dict(lin.terms), lin.const


# ---------------------------------------------------------------- interval arithmetic

def _mul(a, b):
    return 0 if a == 0 or b == 0 else a * b  # inf * 0 is 0 here: one factor is exactly zero


def _imul(a: Interval, b: Interval) -> Interval:
    ps = [_mul(x, y) for x in a for y in b]
    return (min(ps), max(ps))


def _iscale(a: Interval, k: int) -> Interval:
    return _imul(a, (k, k))


def _iadd(a: Interval, b: Interval) -> Interval:
    return (a[0] + b[0], a[1] + b[1])


def _union(a: Interval, b: Interval) -> Interval:
    return (min(a[0], b[0]), max(a[1], b[1]))


def _quot(a, b, rounding: str):
    """a / b rounded toward -inf ("floor") or 0 ("trunc"), with limits for infinite a or b."""
    if math.isinf(a) and math.isinf(b):
        return None
    if math.isinf(a):
        return a if b > 0 else -a
    if math.isinf(b):  # |a / b| is infinitesimal: its sign decides the floor
        return -1 if rounding == "floor" and a != 0 and (a < 0) != (b < 0) else 0
    if rounding == "floor":
        return a // b
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _idiv(a: Interval, b: Interval, rounding: str) -> Interval:
    if b[0] <= 0 <= b[1]:
        return UNKNOWN
    # Both roundings of a / b are monotone in a and b on each side of 0: corners bound them.
    qs = [_quot(x, y, rounding) for x in a for y in b]
    if any(q is None for q in qs):
        return UNKNOWN
    return (min(qs), max(qs))


def _split_by(lin: Linear, k: int) -> tuple[Linear, Linear]:
    """``lin = k * q + r`` with q the terms whose coefficient k divides (and const // k)."""
    q = {a: c // k for a, c in lin.terms.items() if c % k == 0}
    r = {a: c for a, c in lin.terms.items() if c % k != 0}
    return Linear(q, lin.const // k), Linear(r, lin.const % k)


# ---------------------------------------------------------------- the analyzer

class Analyzer:
    """Bounds of expressions under fixed variable ranges (memoized; one per range context)."""

    def __init__(self, ranges: Mapping[Var, Interval] | None = None, load_bounds: LoadBounds | None = None,
                 _lin_memo: dict | None = None):
        self.ranges = dict(ranges or {})
        # An empty range (a zero extent) leaves no point to evaluate at: every expression is EMPTY.
        self.empty = any(lo > hi for lo, hi in self.ranges.values())
        self.load_bounds = load_bounds
        self.lin_memo: dict = {} if _lin_memo is None else _lin_memo  # range-independent, shared
        self.memo: dict[Expr, Interval] = {}
        self._refined: dict[tuple[Expr, bool], Analyzer | None] = {}

    # -- public queries
    def linear(self, e: Expr) -> Linear:
        return linear_form(e, self.lin_memo)

    def bounds(self, e: Expr) -> Interval:
        if self.empty:
            return EMPTY
        got = self.memo.get(e)
        if got is None:
            got = self.memo[e] = self._bounds(e)
        return got

    def linear_bounds(self, lin: Linear) -> Interval:
        out = (lin.const, lin.const)
        for a, c in lin.terms.items():
            out = _iadd(out, _iscale(self.bounds(a), c))
        return out

    def decide(self, cond: Expr) -> bool | None:
        """The value of a bool expression if the ranges fix it, else None."""
        lo, hi = self.bounds(cond)
        return bool(lo) if lo == hi else None

    def refined(self, cond: Expr, truth: bool) -> "Analyzer | None":
        """An analyzer for the sub-ranges where ``cond`` is ``truth``; None if there are none."""
        key = (cond, truth)
        if key not in self._refined:
            self._refined[key] = self._refine(cond, truth)
        return self._refined[key]

    def _refine(self, cond: Expr, truth: bool) -> "Analyzer | None":
        if self.decide(cond) is (not truth):
            return None
        ranges = dict(self.ranges)
        for v, lo, hi in self._constraints(cond, truth):
            old = ranges.get(v, UNKNOWN)
            new = (max(old[0], lo), min(old[1], hi))
            if new[0] > new[1]:
                return None
            ranges[v] = new
        if ranges == self.ranges:
            return self
        return Analyzer(ranges, self.load_bounds, self.lin_memo)

    # -- implementation
    def _bounds(self, e: Expr) -> Interval:
        if e.dtype.is_float:
            return UNKNOWN
        lin = self.linear(e) if e.dtype.is_int else None
        if lin is not None and not (len(lin.terms) == 1 and lin.terms.get(e) == 1):
            out = self.linear_bounds(lin)
        else:
            out = _NODE_BOUNDS[type(e)](self, e)
        return _clip_to(out, dtype_range(e.dtype))

    def _cmp_diff(self, a: Expr, b: Expr) -> Interval:
        """Bounds of a - b, exact for int64 affine differences (x + 1 - x is 1)."""
        if a.dtype is INDEX:
            return self.linear_bounds(self.linear(a) - self.linear(b))
        if a.dtype.is_float:
            return UNKNOWN
        (alo, ahi), (blo, bhi) = self.bounds(a), self.bounds(b)
        return (alo - bhi, ahi - blo)

    def _constraints(self, cond: Expr, truth: bool) -> list[tuple[Var, float, float]]:
        """Variable bounds implied by ``cond == truth`` (only the simple, exactly solvable forms)."""
        if isinstance(cond, Unary) and cond.op == "not":
            return self._constraints(cond.x, not truth)
        if isinstance(cond, Binary):
            if (cond.op, truth) in (("and", True), ("or", False)):
                return self._constraints(cond.a, truth) + self._constraints(cond.b, truth)
            if cond.op in _CMP_TRUE and cond.a.dtype is INDEX:
                op = cond.op if truth else _CMP_NEGATE[cond.op]
                d = self.linear(cond.a) - self.linear(cond.b)
                if len(d.terms) == 1:
                    (v, c), = d.terms.items()
                    if isinstance(v, Var):
                        return _solve(v, c, d.const, op)
        return []


def _clip_to(iv: Interval, rng: Interval) -> Interval:
    if iv[0] < rng[0] or iv[1] > rng[1]:
        return rng  # might wrap around: anything in the type's range
    return iv


def _solve(v: Var, c: int, k: int, op: str) -> list[tuple[Var, float, float]]:
    """Bounds on v from ``c*v + k  op  0``."""
    lo_hi = {"lt": (None, -k - 1), "le": (None, -k), "gt": (-k + 1, None), "ge": (-k, None),
             "eq": (-k, -k)}.get(op)
    if lo_hi is None:
        return []
    lo, hi = -INF, INF
    m_lo, m_hi = lo_hi  # m_lo <= c*v <= m_hi
    if c < 0:
        c, m_lo, m_hi = -c, (None if m_hi is None else -m_hi), (None if m_lo is None else -m_lo)
    if m_lo is not None:
        lo = -((-m_lo) // c)  # ceil
    if m_hi is not None:
        hi = m_hi // c
    return [(v, lo, hi)]


# -- comparisons: (true when d = a - b satisfies, false when it satisfies)
_CMP_TRUE = {
    "lt": (lambda lo, hi: hi < 0, lambda lo, hi: lo >= 0),
    "le": (lambda lo, hi: hi <= 0, lambda lo, hi: lo > 0),
    "gt": (lambda lo, hi: lo > 0, lambda lo, hi: hi <= 0),
    "ge": (lambda lo, hi: lo >= 0, lambda lo, hi: hi < 0),
    "eq": (lambda lo, hi: lo == hi == 0, lambda lo, hi: lo > 0 or hi < 0),
    "ne": (lambda lo, hi: lo > 0 or hi < 0, lambda lo, hi: lo == hi == 0),
}
_CMP_NEGATE = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}


def _b_compare(an: Analyzer, e: Binary) -> Interval:
    is_true, is_false = _CMP_TRUE[e.op]
    lo, hi = an._cmp_diff(e.a, e.b)
    if is_true(lo, hi):
        return (1, 1)
    if is_false(lo, hi):
        return (0, 0)
    return BOOL


def _b_mod(an: Analyzer, e: Binary) -> Interval:
    b = an.bounds(e.b)
    if isinstance(e.b, Const) and e.b.value > 0 and e.dtype is INDEX:
        k = e.b.value
        _, r = _split_by(an.linear(e.a), k)  # (k*q + r) % k == r % k
        lo, hi = an.linear_bounds(r)
        if not math.isinf(lo) and not math.isinf(hi) and lo // k == hi // k:  # within one period
            return (lo - lo // k * k, hi - lo // k * k)
        return (0, k - 1)
    if b[0] > 0:
        a = an.bounds(e.a)
        if a[0] >= 0 and a[1] < b[0]:
            return a
        return (0, b[1] - 1 if a[0] < 0 else min(b[1] - 1, a[1]))
    if b[1] < 0:
        return (b[0] + 1, 0)
    return UNKNOWN


def _b_fmod(an: Analyzer, e: Binary) -> Interval:
    (alo, ahi), (blo, bhi) = an.bounds(e.a), an.bounds(e.b)
    if blo <= 0 <= bhi:
        return UNKNOWN
    small, big = min(abs(blo), abs(bhi)), max(abs(blo), abs(bhi))
    if -small < alo and ahi < small:
        return (alo, ahi)  # |a| < |b|: fmod is a itself
    m = big - 1  # |fmod(a, b)| < |b|, with the sign of a and |result| <= |a|
    return (0 if alo >= 0 else max(alo, -m), 0 if ahi <= 0 else min(ahi, m))


def _b_minmax(an: Analyzer, e: Binary) -> Interval:
    a, b = an.bounds(e.a), an.bounds(e.b)
    f = max if e.op == "max" else min
    return (f(a[0], b[0]), f(a[1], b[1]))


def _b_logic(an: Analyzer, e: Binary) -> Interval:
    (alo, ahi), (blo, bhi) = an.bounds(e.a), an.bounds(e.b)
    if e.op == "and":
        return (min(alo, blo), min(ahi, bhi))
    if e.op == "or":
        return (max(alo, blo), max(ahi, bhi))
    if alo == ahi and blo == bhi:  # xor
        return (int(alo != blo),) * 2
    return BOOL


def _b_bitand(an: Analyzer, e: Binary) -> Interval:
    (alo, ahi), (blo, bhi) = an.bounds(e.a), an.bounds(e.b)
    if alo >= 0 and blo >= 0:
        return (0, min(ahi, bhi))
    return dtype_range(e.dtype)


def _b_shr(an: Analyzer, e: Binary) -> Interval:
    (alo, ahi), (blo, bhi) = an.bounds(e.a), an.bounds(e.b)
    if alo >= 0 and blo >= 0 and bhi < 63:
        return (_quot(alo, 2 ** bhi, "floor"), _quot(ahi, 2 ** blo, "floor"))
    return dtype_range(e.dtype)


def _ints_only(f):
    """Integer arithmetic bounds; the same op on bools (e.g. mul as logical and) is just 0..1."""
    return lambda an, e: f(an, e) if e.dtype is not DType.bool else BOOL


# Binary op -> bounds (add/sub/mul by constants are handled through linear forms).
_BINARY_BOUNDS: dict[str, Callable[[Analyzer, Binary], Interval]] = {
    **{op: _b_compare for op in _CMP_TRUE},
    "mul": _ints_only(lambda an, e: _imul(an.bounds(e.a), an.bounds(e.b))),
    "floordiv": _ints_only(lambda an, e: _idiv(an.bounds(e.a), an.bounds(e.b), "floor")),
    "div": _ints_only(lambda an, e: _idiv(an.bounds(e.a), an.bounds(e.b), "trunc")),
    "mod": _ints_only(_b_mod),
    "fmod": _ints_only(_b_fmod),
    "max": _b_minmax, "min": _b_minmax,
    "and": _b_logic, "or": _b_logic, "xor": _b_logic,
    "bitand": _ints_only(_b_bitand),
    "shr": _ints_only(_b_shr),
}


def _u_abs(an: Analyzer, e: Unary) -> Interval:
    lo, hi = an.bounds(e.x)
    if lo >= 0:
        return (lo, hi)
    if hi <= 0:
        return (-hi, -lo)
    return (0, max(-lo, hi))


def _u_sign(an: Analyzer, e: Unary) -> Interval:
    lo, hi = an.bounds(e.x)
    s = lambda v: (v > 0) - (v < 0)  # noqa: E731
    return (s(lo), s(hi))


_UNARY_BOUNDS: dict[str, Callable[[Analyzer, Unary], Interval]] = {
    "abs": _u_abs,
    "sign": _u_sign,
    "not": lambda an, e: (1 - an.bounds(e.x)[1], 1 - an.bounds(e.x)[0]),
    # integer floor/ceil/round/trunc are the identity (the executor's semantics)
    **{op: (lambda an, e: an.bounds(e.x)) for op in ("floor", "ceil", "round", "trunc")},
}


def _n_var(an: Analyzer, e: Var) -> Interval:
    return an.ranges.get(e, UNKNOWN)


def _n_const(an: Analyzer, e: Const) -> Interval:
    v = int(e.value)
    return (v, v)


def _n_load(an: Analyzer, e: Load) -> Interval:
    got = an.load_bounds(e) if an.load_bounds is not None else None
    return got if got is not None else dtype_range(e.dtype)


def _n_value(an: Analyzer, e: Value) -> Interval:
    return dtype_range(e.dtype)  # a result slot: any value of its type


def _n_unary(an: Analyzer, e: Unary) -> Interval:
    f = _UNARY_BOUNDS.get(e.op)
    return f(an, e) if f is not None else dtype_range(e.dtype)


def _n_binary(an: Analyzer, e: Binary) -> Interval:
    f = _BINARY_BOUNDS.get(e.op)
    return f(an, e) if f is not None else dtype_range(e.dtype)


def _n_select(an: Analyzer, e: Select) -> Interval:
    out = None
    for truth, branch in ((True, e.a), (False, e.b)):
        sub = an.refined(e.cond, truth)
        if sub is not None:
            iv = sub.bounds(branch)
            out = iv if out is None else _union(out, iv)
    return out if out is not None else an.bounds(e.a)  # no feasible branch: empty ranges


def _n_cast(an: Analyzer, e: Cast) -> Interval:
    if e.x.dtype.is_float:
        return dtype_range(e.dtype)
    lo, hi = an.bounds(e.x)
    if e.dtype is DType.bool:
        return (0, 0) if lo == hi == 0 else ((1, 1) if lo > 0 or hi < 0 else BOOL)
    return (lo, hi)  # clipped to the target's range by the caller


_NODE_BOUNDS = {Var: _n_var, Const: _n_const, Load: _n_load, Value: _n_value, Unary: _n_unary, Binary: _n_binary,
                Select: _n_select, Cast: _n_cast}


# ---------------------------------------------------------------- public functions

def bounds(expr: Expr, ranges: Mapping[Var, Interval] | None = None,
           load_bounds: LoadBounds | None = None) -> Interval:
    """Inclusive bounds of an integer or bool expression for variables within ``ranges``."""
    return Analyzer(ranges, load_bounds).bounds(expr)


def extent_ranges(extents: Mapping[Var, int]) -> dict[Var, Interval]:
    """``{v: (0, n - 1)}`` for axis extents (a prim's ``extents``)."""
    return {v: (0, n - 1) for v, n in extents.items()}


def _clip_box(box: list[Interval], shape: Sequence[int] | None) -> list[Interval]:
    if shape is None:
        return box
    return [(max(lo, 0), min(hi, n - 1)) for (lo, hi), n in zip(box, shape)]


def load_box(load: Load, ranges: Mapping[Var, Interval] | None = None, shape: Sequence[int] | None = None,
             load_bounds: LoadBounds | None = None) -> list[Interval]:
    """Bounding box ``[(lo, hi)]`` per dimension of the elements ``load`` reads for variables in
    ``ranges``; clipped to ``shape`` when given (a data-dependent index then spans its dimension)."""
    an = Analyzer(ranges, load_bounds)
    return _clip_box([an.bounds(i) for i in load.index], shape)


def input_boxes(prim: Prim, ranges: Mapping[Var, Interval] | None = None,
                shapes: Sequence[Sequence[int]] | None = None) -> dict[int, list[Interval]]:
    """Per input slot, the bounding box of everything the prim reads when its variables stay in
    ``ranges`` (default: each axis's full extent).  This is Welder's tile propagation: give the
    output-axis ranges of a tile (and a reduce-axis chunk) and get each operand's tile.

    A load under a ``Select`` branch counts only where the branch is taken; ``shapes[slot]``
    clips boxes to the tensor.
    """
    if prim.is_opaque:
        raise ValueError(f"prim {prim.name} ({prim.origin}) is opaque: its reads are unknown")
    full = extent_ranges(prim.extents)
    full.update(ranges or {})
    boxes: dict[int, list[Interval]] = {}
    seen: set[tuple[int, Expr]] = set()
    root = Analyzer(full)
    analyzers = [root]  # keeps refined analyzers alive: their ids key ``seen``

    def visit(e: Expr, an: Analyzer) -> None:
        if (id(an), e) in seen:
            return
        seen.add((id(an), e))
        if isinstance(e, Select):
            visit(e.cond, an)
            for truth, branch in ((True, e.a), (False, e.b)):
                sub = an.refined(e.cond, truth)
                if sub is not None:
                    analyzers.append(sub)
                    visit(branch, sub)
            return
        if isinstance(e, Load):
            box = _clip_box([an.bounds(i) for i in e.index], shapes[e.tensor] if shapes else None)
            old = boxes.get(e.tensor)
            boxes[e.tensor] = box if old is None else [_union(a, b) for a, b in zip(old, box)]
        for k in e.children():
            visit(k, an)

    visit(prim.body, root)
    return boxes


def box_shape(box: Sequence[Interval]) -> tuple:
    """Extent of each dimension of a box (0 for an empty one)."""
    return tuple(max(hi - lo + 1, 0) for lo, hi in box)
