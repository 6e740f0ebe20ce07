"""Hypothesis strategies for well-typed expressions, shared by the IR, simplifier and analysis tests.

Expressions are built through the smart constructors (the form every pass produces), so printing
and parsing them back must give the identical interned node.

- ``index_exprs()``: int64 index expressions over ``VARS`` with small constants, + - *, floordiv /
  mod / truncating div / fmod by constants (and floordiv/mod by expressions kept >= 1), min/max,
  abs, and ``where`` on comparisons;
- ``bool_exprs()``: comparisons of index expressions joined by and/or/not;
- ``value_exprs()``: float32 expressions over loads of ``INPUTS`` with math ops, casts and selects.

``eval_on_grid`` and ``eval_value`` evaluate them with the reference executor (a one-prim body).
"""
from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.evaluate import eval_prim
from tilefuse.ir.expr import (INDEX, Const, Expr, Load, Var, binary, cast, maximum, minimum, select,
                              substitute, unary)
from tilefuse.ir.prim import Prim

VARS = (Var("i"), Var("j"), Var("k"))
VAR_NAMES = tuple(v.name for v in VARS)

F32, F16 = DType.float32, DType.float16
# Slot -> (dtype, shape) of the tensors value expressions load; loads index them with VARS.
INPUTS = ((F32, (3, 4)), (F32, (4,)), (F16, (3,)), (INDEX, (4,)))
INPUT_DTYPES = tuple(dt for dt, _ in INPUTS)
# Extent of each var in value expressions (loads must stay in bounds).
VALUE_EXTENTS = (3, 4)

small_ints = st.integers(-8, 8)
divisors = st.integers(1, 9)


_CMP_OPS = ("lt", "le", "gt", "ge", "eq", "ne")
# Index operators: name -> builder from (draw, recurse).
_INDEX_OPS = {
    "add": lambda d, g: g() + g(),
    "sub": lambda d, g: g() - g(),
    "mul_const": lambda d, g: g() * d(small_ints),
    "mul": lambda d, g: g() * g(),
    "floordiv": lambda d, g: g() // d(divisors),
    "mod": lambda d, g: g() % d(divisors),
    "div": lambda d, g: binary("div", g(), Const(d(divisors), INDEX)),
    "fmod": lambda d, g: binary("fmod", g(), Const(d(divisors), INDEX)),
    "floordiv_neg": lambda d, g: g() // -d(divisors),
    "mod_neg": lambda d, g: g() % -d(divisors),
    "floordiv_var": lambda d, g: g() // maximum(g(), Const(1, INDEX)),   # divisor >= 1, not constant
    "mod_var": lambda d, g: g() % maximum(g(), Const(1, INDEX)),
    "max": lambda d, g: maximum(g(), g()),
    "min": lambda d, g: minimum(g(), g()),
    "abs": lambda d, g: unary("abs", g()),
    "neg": lambda d, g: -g(),
    "where": lambda d, g: select(binary(d(st.sampled_from(_CMP_OPS)), g(), g()), g(), g()),
    # padding-like conditions on one variable: the simplifier refines ranges inside the branches
    "where_var": lambda d, g: select(binary(d(st.sampled_from(_CMP_OPS)), d(st.sampled_from(VARS)) * d(small_ints),
                                            Const(d(small_ints), INDEX)), g(), g()),
}
# Linear-ish operators are drawn more often: they are what fission produces.
_INDEX_WEIGHTED = ("add", "add", "sub", "mul_const", "mul_const", "floordiv", "floordiv", "mod", "mod",
                   "div", "mul", "max", "min", "abs", "neg", "where", "where_var", "where_var", "fmod", "floordiv_neg", "mod_neg",
                   "floordiv_var", "mod_var")


def _index_leaf(draw) -> Expr:
    if draw(st.integers(0, 2)):
        return draw(st.sampled_from(VARS))
    return Const(draw(small_ints), INDEX)


@st.composite
def index_exprs(draw, depth: int = 5) -> Expr:
    """Trees of up to ``depth`` levels of index operators."""
    def gen(d: int) -> Expr:
        if d == 0 or draw(st.integers(0, 5)) == 0:
            return _index_leaf(draw)
        op = draw(st.sampled_from(_INDEX_WEIGHTED))
        return _INDEX_OPS[op](draw, lambda: gen(d - 1))
    return gen(depth)


@st.composite
def bool_exprs(draw, depth: int = 3) -> Expr:
    """Comparisons of index expressions joined by and/or/xor/not/where."""
    def gen(d: int) -> Expr:
        if d == 0 or draw(st.integers(0, 2)) == 0:
            return binary(draw(st.sampled_from(_CMP_OPS)), draw(index_exprs(2)), draw(index_exprs(2)))
        op = draw(st.sampled_from(("and", "or", "xor", "not", "where")))
        if op == "not":
            return unary("not", gen(d - 1))
        if op == "where":
            return select(gen(d - 1), gen(d - 1), gen(d - 1))
        return binary(op, gen(d - 1), gen(d - 1))
    return gen(depth)


def ranges() -> st.SearchStrategy:
    """Inclusive ranges for VARS: small, possibly negative, at most 8 values each."""
    one = st.tuples(st.integers(-6, 8), st.integers(0, 7)).map(lambda p: (p[0], p[0] + p[1]))
    return st.tuples(one, one, one).map(lambda rs: dict(zip(VARS, rs)))


# ---------------------------------------------------------------- float32 value expressions

_F32_CONSTS = st.one_of(st.floats(-4, 4, width=32), st.sampled_from([0.0, -0.0, 1.0, math.inf, -math.inf]))
_UNARY_F = ("neg", "abs", "exp", "log", "sqrt", "tanh", "sigmoid", "floor", "reciprocal", "erf")
_BINARY_F = ("add", "sub", "mul", "div", "max", "min", "pow")


def _value_leaf(draw) -> Expr:
    i, j = VARS[0], VARS[1]
    got = draw(st.sampled_from((
        Load(0, (i, j), F32),
        Load(1, (j,), F32),
        Load(0, (i, Const(0, INDEX)), F32),
        cast(Load(2, (i,), F16), F32),
        cast(Load(3, (j,), INDEX), F32),
        cast(i - j, F32),
        None,
    )))
    return Const(draw(_F32_CONSTS), F32) if got is None else got


@st.composite
def value_exprs(draw, depth: int = 4) -> Expr:
    """float32 expressions over loads of INPUTS, constants and casts."""
    def cond(d: int) -> Expr:
        kind = draw(st.integers(0, 2))
        if kind == 0:
            return binary(draw(st.sampled_from(("lt", "le", "eq", "ne"))), gen(d - 1), gen(d - 1))
        return unary("isnan", gen(d - 1)) if kind == 1 else VARS[0].lt(VARS[1])

    def gen(d: int) -> Expr:
        if d == 0 or draw(st.integers(0, 4)) == 0:
            return _value_leaf(draw)
        kind = draw(st.integers(0, 5))
        if kind == 0:
            return unary(draw(st.sampled_from(_UNARY_F)), gen(d - 1))
        if kind in (1, 2):
            return binary(draw(st.sampled_from(_BINARY_F)), gen(d - 1), gen(d - 1))
        if kind == 3:
            return select(cond(d), gen(d - 1), gen(d - 1))
        return cast(cast(gen(d - 1), draw(st.sampled_from((F16, DType.float64)))), F32)
    return gen(depth)


def any_exprs() -> st.SearchStrategy:
    return st.one_of(index_exprs(), bool_exprs(), value_exprs())


def tree_size(e: Expr, memo: dict | None = None) -> int:
    """Nodes of the expression tree (shared sub-expressions counted at every use)."""
    memo = {} if memo is None else memo
    if e not in memo:
        memo[e] = 1 + sum(tree_size(k, memo) for k in e.children())
    return memo[e]


# ---------------------------------------------------------------- evaluation with the reference executor

def eval_on_grid(e: Expr, rng: dict) -> torch.Tensor:
    """Value of an index/bool expression at every point of the inclusive ranges ``rng`` of VARS
    (a tensor indexed by the offsets from each range's start), computed by the reference executor."""
    axes = tuple(Var(f"_g{k}") for k in range(len(VARS)))
    body = substitute(e, {v: a + rng[v][0] for v, a in zip(VARS, axes)})
    shape = tuple(rng[v][1] - rng[v][0] + 1 for v in VARS)
    return eval_prim(Prim("grid", (), axes, body, TensorType(shape, e.dtype)), [])


def value_inputs(seed: int) -> list:
    """Random tensors for INPUTS, with a NaN and an inf among the floats."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for dt, shape in INPUTS:
        if dt is INDEX:
            out.append(torch.randint(-3, 4, shape, generator=g))
            continue
        t = torch.randn(shape, generator=g) * 2
        t.view(-1)[0] = math.nan if seed % 3 == 0 else t.view(-1)[0]
        t.view(-1)[-1] = math.inf if seed % 5 == 0 else t.view(-1)[-1]
        out.append(t.to(dt.to_torch()))
    return out


def eval_value(e: Expr, inputs: list) -> torch.Tensor:
    """A float value expression over (i, j) in VALUE_EXTENTS, by the reference executor."""
    names = tuple(f"x{k}" for k in range(len(INPUTS)))
    return eval_prim(Prim("v", names, VARS[:2], e, TensorType(VALUE_EXTENTS, e.dtype)), inputs)
