"""Range-aware expression simplification: a table of rewrite rules applied bottom-up to a fixpoint.

``simplify(expr, ranges)`` rewrites each node, children first, with the rules registered for its
kind (``RULES``, in registration order, after the generic ones).  A rule returns an equivalent
expression or None.  The driver accepts a rewrite only if it keeps the dtype (a changed dtype is a
rule bug and raises) and does not grow the tree, and repeats whole passes until nothing changes,
so the result is a fixpoint (``simplify`` is idempotent) no larger than its input.  The branches
of a ``Select`` are rewritten under the ranges its condition implies (``Analyzer.refined``).

Every rule must be sound for all variable values within ``ranges`` (inclusive ``(lo, hi)`` per
Var, see ``analysis/index.py``).  Range-dependent and linear-arithmetic rules apply to int64
index expressions only (index arithmetic does not overflow); narrower integers wrap, floats have
NaN/inf and rounding, so for them only exact, local rules apply.  Constant folding evaluates with
the reference executor's own semantics, so it is exact in every dtype.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping

from ..analysis.index import Analyzer, Interval, Linear, LoadBounds, dtype_range, extent_ranges
from ..ir.dtypes import DType
from ..ir.evaluate import Grid  # constant folding uses the executor's semantics exactly
from ..ir.expr import (INDEX, Binary, Cast, Const, Expr, Load, Select, Unary, Var, binary, cast, loads,
                       select, transform, unary, walk)
from ..ir.prim import Prim, PrimGraph
from ..ir.printer import format_expr

Rule = Callable[[Expr, "Simplifier"], "Expr | None"]

# Rules by node kind ("Binary.floordiv", "Unary.not", "Select", "Cast", ...); "*" applies to all.
RULES: dict[str, list[Rule]] = {}

MAX_PASSES = 16      # whole-expression passes; each pass shrinks or canonicalizes
MAX_STEPS = 32       # rewrites of one node within a pass

_COMPARE_NEGATE = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}
_TRUE, _FALSE = Const(True, DType.bool), Const(False, DType.bool)


def rewrite(*kinds: str):
    """Register a rewrite rule for node kinds; its docstring's first line describes it."""
    def deco(fn: Rule) -> Rule:
        for k in kinds:
            RULES.setdefault(k, []).append(fn)
        return fn
    return deco


def _kind(n: Expr) -> str:
    if isinstance(n, (Binary, Unary)):
        return f"{type(n).__name__}.{n.op}"
    return type(n).__name__


def _cint(e: Expr) -> int | None:
    """Value of an int64 constant, else None."""
    return e.value if isinstance(e, Const) and e.dtype is INDEX else None


def _pos_divisor(n: Binary) -> int | None:
    """k of an int64 ``x op k`` with a constant k > 0."""
    k = _cint(n.b)
    return k if n.dtype is INDEX and k is not None and k > 0 else None


class Simplifier:
    """A simplification context: variable ranges (``an``) plus caches shared by all contexts of
    one ``simplify`` call.  The branches of a ``Select`` are simplified in the context where its
    condition holds (or fails): ``i - 1 >= 0`` is known inside the taken branch of a padding."""

    def __init__(self, an: Analyzer, parent: "Simplifier | None" = None):
        self.an = an
        self._size: dict[Expr, int] = parent._size if parent else {}
        self._order: dict[Expr, tuple] = parent._order if parent else {}
        self._refined: dict[tuple, Simplifier | None] = parent._refined if parent else {}

    def run(self, e: Expr) -> Expr:
        for _ in range(MAX_PASSES):
            new = self._pass(e)
            if new is e:
                break
            e = new
        return e

    def _pass(self, e: Expr) -> Expr:
        """One bottom-up rewrite of every node, each in the context of its path from the root."""
        memo: dict[tuple[int, Expr], Expr] = {}

        def go(n: Expr, ctx: Simplifier) -> Expr:
            key = (id(ctx), n)
            got = memo.get(key)
            if got is not None:
                return got
            if isinstance(n, Select):
                c = go(n.cond, ctx)
                ta, fa = ctx.refine(c, True), ctx.refine(c, False)
                kids = (c, n.a if ta is None else go(n.a, ta), n.b if fa is None else go(n.b, fa))
            else:
                kids = tuple(go(k, ctx) for k in n.children())
            m = n if all(x is y for x, y in zip(kids, n.children())) else n.with_children(kids)
            out = memo[key] = ctx.rewrite_node(m)
            return out

        return go(e, self)

    def refine(self, cond: Expr, truth: bool) -> "Simplifier | None":
        """The context where ``cond`` is ``truth`` (None: nowhere, the branch is never taken)."""
        key = (id(self), cond, truth)
        if key not in self._refined:
            sub = self.an.refined(cond, truth)
            self._refined[key] = None if sub is None else (self if sub is self.an else Simplifier(sub, self))
        return self._refined[key]

    def rewrite_node(self, n: Expr) -> Expr:
        for _ in range(MAX_STEPS):
            for rule in RULES.get("*", []) + RULES.get(_kind(n), []):
                r = rule(n, self)
                if r is None or r is n:
                    continue
                if r.dtype is not n.dtype:
                    raise TypeError(f"simplify rule {rule.__name__} turned {n.dtype.value} {n!r} into "
                                    f"{r.dtype.value} {r!r}")
                if self.size(r) <= self.size(n):
                    n = r
                    break
            else:
                return n
        return n

    # -- helpers for rules
    def size(self, e: Expr) -> int:
        """Tree size (shared sub-expressions counted at every use)."""
        got = self._size.get(e)
        if got is None:
            got = self._size[e] = 1 + sum(self.size(k) for k in e.children())
        return got

    def smallest(self, *cands: Expr | None) -> Expr | None:
        """The smallest candidate (first on ties)."""
        best = None
        for c in cands:
            if c is not None and (best is None or self.size(c) < self.size(best)):
                best = c
        return best

    def bounds(self, e: Expr) -> Interval:
        return self.an.bounds(e)

    def linear(self, e: Expr) -> Linear:
        return self.an.linear(e)

    def order(self, atom: Expr) -> tuple:
        """Canonical order of the atoms of a linear form: variables, then loads, then the rest."""
        got = self._order.get(atom)
        if got is None:
            rank = 0 if isinstance(atom, Var) else 1 if isinstance(atom, Load) else 2
            got = self._order[atom] = (rank, format_expr(atom), atom.dtype.value)
        return got

    def build(self, lin: Linear) -> Expr:
        """Canonical int64 expression of a linear form: positive terms, negative terms, constant."""
        terms = sorted(lin.terms.items(), key=lambda t: self.order(t[0]))
        term = lambda a, c: a if c == 1 else binary("mul", a, Const(c, INDEX))  # noqa: E731
        out: Expr | None = None
        const = lin.const
        for a, c in terms:
            if c > 0:
                out = term(a, c) if out is None else out + term(a, c)
        if out is None and const > 0 and terms:
            out, const = Const(const, INDEX), 0
        for a, c in terms:
            if c < 0:
                out = -term(a, -c) if out is None else out - term(a, -c)
        if out is None:
            return Const(const, INDEX)
        return out + const if const >= 0 else out - (-const)


# ---------------------------------------------------------------- generic rules

@rewrite("*")
def fold_constants(n: Expr, s: Simplifier) -> Expr | None:
    """op(constants) -> constant, evaluated with the reference executor's semantics."""
    kids = n.children()
    if not kids or isinstance(n, (Load, Select)) or not all(isinstance(k, Const) for k in kids):
        return None
    try:
        v = Grid(None, [], {}).eval(n)
    except (RuntimeError, ZeroDivisionError, OverflowError, ValueError):
        return None  # e.g. integer division by zero: left for run time
    if isinstance(n, Cast) and n.dtype.is_int and n.x.dtype.is_float:
        x = n.x.value
        lo, hi = dtype_range(n.dtype) if n.dtype is not INDEX else (-2 ** 63, 2 ** 63 - 1)
        if not (math.isfinite(x) and lo <= math.trunc(x) <= hi):
            return None  # float -> int of NaN, inf or out of range is undefined: no host value
    return Const(v.item(), n.dtype)


@rewrite("*")
def fold_by_bounds(n: Expr, s: Simplifier) -> Expr | None:
    """An int64 or bool expression whose range is one value -> that constant (axis Vars stay:
    a size-1 axis is still the axis, for classification and tile propagation)."""
    if isinstance(n, (Const, Var)) or not (n.dtype is INDEX or n.dtype is DType.bool):
        return None
    lo, hi = s.bounds(n)
    return Const(lo, n.dtype) if lo == hi else None


# ---------------------------------------------------------------- linear arithmetic (int64)

def _split_floordiv(atom: Expr, c: int, s: Simplifier) -> Linear | None:
    """c*(x // k) with k | c  ==  (c/k)*x - (c/k)*(x % k)   (x == k*(x // k) + x % k)."""
    if not (isinstance(atom, Binary) and atom.op == "floordiv"):
        return None
    k = _cint(atom.b)
    if not k or c % k:
        return None
    q = c // k
    return s.linear(atom.a).scale(q) - Linear({binary("mod", atom.a, atom.b): q})


def _split_digit(atom: Expr, c: int, s: Simplifier) -> Linear | None:
    """c*((x // a) % b) with a | c  ==  (c/a)*(x % (a*b)) - (c/a)*(x % a)   (a digit of x)."""
    if not (isinstance(atom, Binary) and atom.op == "mod" and isinstance(atom.a, Binary)
            and atom.a.op == "floordiv"):
        return None
    a, b = _pos_divisor(atom.a), _pos_divisor(atom)
    if not (a and b) or c % a:
        return None
    x, q = atom.a.a, c // a
    return Linear({binary("mod", x, Const(a * b, INDEX)): q, binary("mod", x, atom.a.b): -q})


_IDENTITIES = (_split_floordiv, _split_digit)


def _recombine(lin: Linear, s: Simplifier) -> Linear:
    """Rewrite terms by the identities above when that shrinks the expression: they cancel
    against other terms, e.g. (x // k)*k + x % k -> x and (x // 4 % 4)*4 + x % 4 -> x % 16."""
    changed = True
    while changed:
        changed = False
        size = s.size(s.build(lin))
        for atom, c in lin.terms.items():
            for identity in _IDENTITIES:
                repl = identity(atom, c, s)
                if repl is None:
                    continue
                cand = lin - Linear({atom: c}) + repl
                if s.size(s.build(cand)) < size:
                    lin, changed = cand, True
                    break
            if changed:
                break
    return lin


@rewrite("Binary.add", "Binary.sub", "Binary.mul", "Unary.neg")
def normalize_linear(n: Expr, s: Simplifier) -> Expr | None:
    """Collect terms (a*x + b*x -> (a+b)*x, x - x -> 0), recombine (x//k)*k + x%k -> x, and order
    terms canonically; a common factor stays factored out when that is smaller."""
    if n.dtype is not INDEX:
        return None
    lin = _recombine(s.linear(n), s)
    flat = s.build(lin)
    coeffs = list(lin.terms.values()) + ([lin.const] if lin.const else [])
    g = math.gcd(*coeffs) if coeffs else 0
    factored = None
    if g > 1 and len(coeffs) > 1:
        factored = binary("mul", s.build(Linear({a: c // g for a, c in lin.terms.items()}, lin.const // g)),
                          Const(g, INDEX))
    return s.smallest(flat, factored)


# ---------------------------------------------------------------- floordiv, div, mod (int64)

@rewrite("Binary.floordiv")
def floordiv_nested(n: Binary, s: Simplifier) -> Expr | None:
    """(x // a) // b -> x // (a*b) for positive constants a, b."""
    b = _pos_divisor(n)
    if b and isinstance(n.a, Binary) and n.a.op == "floordiv" and _pos_divisor(n.a):
        return binary("floordiv", n.a.a, Const(_pos_divisor(n.a) * b, INDEX))
    return None


@rewrite("Binary.floordiv")
def floordiv_split(n: Binary, s: Simplifier) -> Expr | None:
    """(a*k + b) // k -> a + b // k, and b // k -> its value when the range of b fixes it."""
    k = _pos_divisor(n)
    if not k:
        return None
    lin = s.linear(n.a)
    q_terms = {a: c // k for a, c in lin.terms.items() if c % k == 0}
    r_terms = {a: c for a, c in lin.terms.items() if c % k}
    cands = []
    for qc in dict.fromkeys((lin.const // k, 0)):  # move the constant's multiple of k out, or not
        if not q_terms and qc == 0:
            continue  # nothing leaves the division
        q, r = Linear(q_terms, qc), Linear(r_terms, lin.const - qc * k)
        lo, hi = s.an.linear_bounds(r)
        if not math.isinf(lo) and not math.isinf(hi) and lo // k == hi // k:
            cands.append(s.build(q + Linear({}, lo // k)))
        else:
            cands.append(s.build(q) + binary("floordiv", s.build(r), n.b))
    return s.smallest(*cands)


@rewrite("Binary.floordiv")
def floordiv_of_mod(n: Binary, s: Simplifier) -> Expr | None:
    """(x % m) // a -> (x // a) % (m / a) when a divides m (mod outermost is the canonical order)."""
    a = _pos_divisor(n)
    if a and isinstance(n.a, Binary) and n.a.op == "mod":
        m = _pos_divisor(n.a)
        if m and m % a == 0:
            return binary("mod", binary("floordiv", n.a.a, n.b), Const(m // a, INDEX))
    return None


@rewrite("Binary.div")
def div_nonnegative(n: Binary, s: Simplifier) -> Expr | None:
    """Truncating x / k -> x // k when x >= 0 and k > 0 (they agree there)."""
    if n.dtype is INDEX and s.bounds(n.a)[0] >= 0 and s.bounds(n.b)[0] > 0:
        return binary("floordiv", n.a, n.b)
    return None


@rewrite("Binary.fmod")
def fmod_nonnegative(n: Binary, s: Simplifier) -> Expr | None:
    """fmod(x, k) -> x % k when x >= 0 and k > 0 (they agree there)."""
    if n.dtype is INDEX and s.bounds(n.a)[0] >= 0 and s.bounds(n.b)[0] > 0:
        return binary("mod", n.a, n.b)
    return None


def _small_residue(c: int, k: int) -> int:
    """The representative of c mod k nearest to 0 (positive on ties)."""
    r = c % k
    return r if r <= k - r else r - k


@rewrite("Binary.mod")
def mod_split(n: Binary, s: Simplifier) -> Expr | None:
    """(a*k + b) % k -> b % k (coefficients reduced mod k), and b % k -> b - q*k when b stays
    within one period [q*k, q*k + k)."""
    k = _pos_divisor(n)
    if not k:
        return None
    lin = s.linear(n.a)
    r = Linear({a: _small_residue(c, k) for a, c in lin.terms.items()}, lin.const % k)
    lo, hi = s.an.linear_bounds(r)
    if not math.isinf(lo) and not math.isinf(hi) and lo // k == hi // k:
        return s.build(r - Linear({}, lo // k * k))
    return binary("mod", s.build(r), n.b)


@rewrite("Binary.mod")
def mod_of_mod(n: Binary, s: Simplifier) -> Expr | None:
    """(x % m) % k -> x % k when k divides m."""
    k = _pos_divisor(n)
    if k and isinstance(n.a, Binary) and n.a.op == "mod":
        m = _pos_divisor(n.a)
        if m and m % k == 0:
            return binary("mod", n.a.a, n.b)
    return None


@rewrite("Binary.mod")
def mod_of_floordiv(n: Binary, s: Simplifier) -> Expr | None:
    """(x // a) % b -> (x' // a) % b with x' = x reduced modulo a*b (reshape chains)."""
    b = _pos_divisor(n)
    if not (b and isinstance(n.a, Binary) and n.a.op == "floordiv" and _pos_divisor(n.a)):
        return None
    a = _pos_divisor(n.a)
    ab = a * b
    lin = s.linear(n.a.a)
    r = Linear({t: c for t, c in lin.terms.items() if c % ab}, lin.const % ab)
    return binary("mod", binary("floordiv", s.build(r), n.a.b), n.b)


# ---------------------------------------------------------------- min / max

def _sign_of_difference(a: Expr, b: Expr, s: Simplifier) -> Interval | None:
    if a.dtype is INDEX:
        return s.an.linear_bounds(s.linear(a) - s.linear(b))
    if a.dtype is DType.bool:
        (alo, ahi), (blo, bhi) = s.bounds(a), s.bounds(b)
        return (alo - bhi, ahi - blo)
    return None  # floats: NaN makes every order undecidable


@rewrite("Binary.max", "Binary.min")
def minmax_same(n: Binary, s: Simplifier) -> Expr | None:
    """max(x, x) -> x, min(x, x) -> x."""
    return n.a if n.a is n.b else None


@rewrite("Binary.max", "Binary.min")
def minmax_decided(n: Binary, s: Simplifier) -> Expr | None:
    """max(a, b) -> a when a >= b over the ranges (and the like for min)."""
    d = _sign_of_difference(n.a, n.b, s)
    if d is None:
        return None
    a_wins = d[0] >= 0 if n.op == "max" else d[1] <= 0
    b_wins = d[1] <= 0 if n.op == "max" else d[0] >= 0
    return n.a if a_wins else (n.b if b_wins else None)


@rewrite("Binary.max", "Binary.min")
def minmax_constants(n: Binary, s: Simplifier) -> Expr | None:
    """max(max(x, c1), c2) -> max(x, max(c1, c2)) for int64 constants (same for min)."""
    c2 = _cint(n.b)
    if c2 is None or not (isinstance(n.a, Binary) and n.a.op == n.op) or _cint(n.a.b) is None:
        return None
    return binary(n.op, n.a.a, binary(n.op, n.a.b, n.b))


# ---------------------------------------------------------------- booleans and comparisons

def _negation(e: Expr) -> Expr | None:
    """The simplified form of ``not e`` where it is immediate: x for not x, a >= b for a < b."""
    if isinstance(e, Unary) and e.op == "not":
        return e.x
    if isinstance(e, Binary) and e.op in _COMPARE_NEGATE and not e.a.dtype.is_float:
        return binary(_COMPARE_NEGATE[e.op], e.a, e.b)
    return None


def _is_not_of(a: Expr, b: Expr) -> bool:
    return _negation(a) is b or _negation(b) is a


@rewrite("Binary.and", "Binary.or")
def logic_idempotent(n: Binary, s: Simplifier) -> Expr | None:
    """x and x -> x, x or x -> x; x and not x -> False, x or not x -> True."""
    if n.a is n.b:
        return n.a
    if _is_not_of(n.a, n.b):
        return _FALSE if n.op == "and" else _TRUE
    return None


@rewrite("Binary.and", "Binary.or")
def logic_absorb(n: Binary, s: Simplifier) -> Expr | None:
    """a and (a or b) -> a, a or (a and b) -> a (either operand order)."""
    other = "or" if n.op == "and" else "and"
    for x, y in ((n.a, n.b), (n.b, n.a)):
        if isinstance(y, Binary) and y.op == other and (y.a is x or y.b is x):
            return x
    return None


@rewrite("Binary.xor")
def xor_rules(n: Binary, s: Simplifier) -> Expr | None:
    """x xor x -> False, x xor True -> not x, x xor False -> x."""
    if n.a is n.b:
        return _FALSE
    for x, c in ((n.a, n.b), (n.b, n.a)):
        if isinstance(c, Const):
            return unary("not", x) if c.value else x
    return None


@rewrite(*(f"Binary.{op}" for op in _COMPARE_NEGATE))
def compare_linear(n: Binary, s: Simplifier) -> Expr | None:
    """a op b over int64 -> P op N + c with positive terms P left, negative terms N and the
    constant right (i - 1 >= 0 -> i >= 1)."""
    if n.a.dtype is not INDEX:
        return None
    d = s.linear(n.a) - s.linear(n.b)
    left = Linear({a: c for a, c in d.terms.items() if c > 0})
    right = Linear({a: -c for a, c in d.terms.items() if c < 0}, -d.const)
    return binary(n.op, s.build(left), s.build(right))


@rewrite("Unary.not")
def not_rules(n: Unary, s: Simplifier) -> Expr | None:
    """not not x -> x; not (a < b) -> a >= b for integers (floats: NaN breaks it)."""
    return _negation(n.x)


# ---------------------------------------------------------------- select

@rewrite("Select")
def select_decided(n: Select, s: Simplifier) -> Expr | None:
    """where(c, a, b) -> a or b when the ranges decide c."""
    v = s.an.decide(n.cond)
    return None if v is None else (n.a if v else n.b)


@rewrite("Select")
def select_not(n: Select, s: Simplifier) -> Expr | None:
    """where(not c, a, b) -> where(c, b, a)."""
    if isinstance(n.cond, Unary) and n.cond.op == "not":
        return select(n.cond.x, n.b, n.a)
    return None


def _may_fail(e: Expr) -> bool:
    """Whether e loads or divides integers by anything but a non-zero constant: where a Select does
    not take it, a branch may index out of bounds or divide by zero (it was simplified under the
    ranges its condition implies)."""
    return any(isinstance(n, Load) or (isinstance(n, Binary) and n.op in ("div", "floordiv", "mod", "fmod")
                                       and not n.b.dtype.is_float and not (isinstance(n.b, Const) and n.b.value))
               for n in walk(e))


@rewrite("Select")
def select_bool(n: Select, s: Simplifier) -> Expr | None:
    """where(c, True, x) -> c or x, where(c, x, False) -> c and x (and the negated forms), unless
    x may fail where it is not taken (``_may_fail``): an operand of `or` may not."""
    if n.dtype is not DType.bool:
        return None
    c, a, b = n.cond, n.a, n.b
    if isinstance(a, Const) and not _may_fail(b):
        return binary("or", c, b) if a.value else binary("and", unary("not", c), b)
    if isinstance(b, Const) and not _may_fail(a):
        return binary("or", unary("not", c), a) if b.value else binary("and", c, a)
    return None


@rewrite("Select")
def select_nested(n: Select, s: Simplifier) -> Expr | None:
    """where(c, where(c, a, b), d) -> where(c, a, d); where(c, a, where(c, b, d)) -> where(c, a, d)."""
    a, b = n.a, n.b
    if isinstance(a, Select) and a.cond is n.cond:
        a = a.a
    if isinstance(b, Select) and b.cond is n.cond:
        b = b.b
    return select(n.cond, a, b) if (a is not n.a or b is not n.b) else None


# ---------------------------------------------------------------- casts and unary

# dtype -> dtypes holding each of its values exactly (bool holds 0/1: every dtype).
_F = (DType.float16, DType.bfloat16, DType.float32, DType.float64)
_EXACT_IN: dict[DType, frozenset] = {
    DType.bool: frozenset(DType) - {DType.bool},
    DType.uint8: frozenset({DType.int16, DType.int32, DType.int64, *_F}),
    DType.int8: frozenset({DType.int16, DType.int32, DType.int64, *_F}),
    DType.int16: frozenset({DType.int32, DType.int64, DType.float32, DType.float64}),
    DType.int32: frozenset({DType.int64, DType.float64}),
    DType.int64: frozenset(),
    DType.float16: frozenset({DType.float32, DType.float64}),
    DType.bfloat16: frozenset({DType.float32, DType.float64}),
    DType.float32: frozenset({DType.float64}),
    DType.float64: frozenset(),
}


def _exact_cast(x: Expr, to: DType, s: Simplifier) -> bool:
    """Whether casting x to ``to`` keeps its value (by dtype, or by range for integers)."""
    if to in _EXACT_IN[x.dtype]:
        return True
    if x.dtype.is_int and to.is_int:
        lo, hi = s.bounds(x)
        rlo, rhi = dtype_range(to)
        return rlo <= lo and hi <= rhi
    return False


@rewrite("Cast")
def cast_chain(n: Cast, s: Simplifier) -> Expr | None:
    """cast(cast(x, t1), t2) -> cast(x, t2) when x -> t1 is exact (the value is the same)."""
    inner = n.x
    if isinstance(inner, Cast) and _exact_cast(inner.x, inner.dtype, s):
        return cast(inner.x, n.dtype)
    return None


@rewrite("Unary.floor", "Unary.ceil", "Unary.round", "Unary.trunc")
def round_integer(n: Unary, s: Simplifier) -> Expr | None:
    """floor/ceil/round/trunc of an integer -> the integer."""
    return n.x if n.x.dtype.is_int else None


@rewrite("Unary.abs")
def abs_rules(n: Unary, s: Simplifier) -> Expr | None:
    """abs(abs x) -> abs x, abs(-x) -> abs x; abs(x) -> x or -x when the sign of x is known."""
    x = n.x
    if isinstance(x, Unary) and x.op in ("abs", "neg"):
        return unary("abs", x.x)
    if n.dtype is INDEX:
        lo, hi = s.bounds(x)
        return x if lo >= 0 else (unary("neg", x) if hi <= 0 else None)
    return None


# ---------------------------------------------------------------- public entry points

def simplify(expr: Expr, ranges: Mapping[Var, Interval] | None = None,
             load_bounds: LoadBounds | None = None) -> Expr:
    """An equivalent expression, no larger, for variable values within ``ranges`` (inclusive)."""
    return Simplifier(Analyzer(ranges, load_bounds)).run(expr)


def _compact_inputs(prim: Prim, body: Expr) -> tuple[tuple[str, ...], Expr]:
    """Drop inputs the body no longer reads and renumber the load slots."""
    used = sorted({ld.tensor for ld in loads(body)})
    if len(used) == len(prim.inputs):
        return prim.inputs, body
    slot = {old: new for new, old in enumerate(used)}
    body = transform(body, lambda e: Load(slot[e.tensor], e.index, e.dtype) if isinstance(e, Load) else None)
    return tuple(prim.inputs[k] for k in used), body


def simplify_prim(prim: Prim) -> Prim:
    """The prim with its body simplified over its axis and reduce extents (unused inputs dropped)."""
    if prim.is_opaque or any(n == 0 for n in prim.extents.values()):
        return prim  # an empty prim computes nothing: leave it as it is
    body = simplify(prim.body, extent_ranges(prim.extents))
    if body is prim.body:
        return prim
    inputs, body = _compact_inputs(prim, body)
    return dataclasses.replace(prim, inputs=inputs, body=body)


def simplify_graph(pg: PrimGraph) -> PrimGraph:
    """Every prim simplified; the same graph object when nothing changed."""
    prims = tuple(simplify_prim(p) for p in pg.prims)
    if all(a is b for a, b in zip(prims, pg.prims)):
        return pg
    return PrimGraph(pg.inputs, pg.constants, prims, pg.outputs)
