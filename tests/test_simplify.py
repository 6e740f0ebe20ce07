"""The range-aware simplifier: soundness, idempotence and size (hypothesis), and its rules."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strategies import (VARS, bool_exprs, eval_on_grid, eval_value, index_exprs, ranges, tree_size,
                        value_exprs, value_inputs)
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.evaluate import eval_prim, run_reference
from tilefuse.ir.expr import (INDEX, Cast, Const, Load, Select, Var, binary, cast, maximum, minimum,
                              select, unary)
from tilefuse.ir.prim import Origin, Prim, PrimGraph, Reduction, TensorDecl
from tilefuse.transform import simplify as simp
from tilefuse.transform.simplify import simplify, simplify_graph, simplify_prim

F32 = DType.float32
i, j, k = VARS
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(e, rng):
    s = simplify(e, rng)
    assert s.dtype is e.dtype
    assert tree_size(s) <= tree_size(e), f"{e} grew into {s}"
    assert torch.equal(eval_on_grid(s, rng), eval_on_grid(e, rng)), f"{e} -> {s} under {rng}"
    assert simplify(s, rng) is s, f"not idempotent: {e} -> {s} -> {simplify(s, rng)}"
    return s


# ---------------------------------------------------------------- properties

@PROPS
@given(index_exprs(), ranges())
def test_index_simplification_is_sound_idempotent_and_shrinks(e, rng):
    _check(e, rng)


@PROPS
@given(bool_exprs(), ranges())
def test_bool_simplification_is_sound_idempotent_and_shrinks(e, rng):
    _check(e, rng)


@PROPS
@given(value_exprs(), st.integers(0, 30))
def test_value_simplification_is_exact(e, seed):
    rng = {i: (0, 2), j: (0, 3)}
    s = simplify(e, rng)
    assert s.dtype is e.dtype and tree_size(s) <= tree_size(e)
    xs = value_inputs(seed)
    torch.testing.assert_close(eval_value(s, xs), eval_value(e, xs), rtol=0, atol=0, equal_nan=True)
    assert simplify(s, rng) is s


@PROPS
@given(index_exprs())
def test_simplification_without_ranges_is_sound(e):
    # No ranges: only range-free identities may fire; checked on one grid.
    s = simplify(e)
    rng = {i: (-3, 4), j: (0, 5), k: (-6, -1)}
    assert torch.equal(eval_on_grid(s, rng), eval_on_grid(e, rng))
    assert simplify(s) is s


# ---------------------------------------------------------------- reshape chains (fission of Reshape)

R = {i: (0, 5), j: (0, 19), k: (0, 9)}


@pytest.mark.parametrize("expr, want", [
    ((i * 20 + j) // 20, i),
    ((i * 20 + j) % 20, j),
    ((i * 20 + j) // 4 // 5, i),                          # (x // a) // b -> x // (a*b)
    ((i * 20 + j) // 4 % 5, j // 4),                      # ((x // a) % b) from reshape chains
    ((i * 20 + j) // 20 * 20 + (i * 20 + j) % 20, i * 20 + j),   # flatten after unflatten
    (i * 20 + j - (i * 20 + j) // 20 * 20, j),
    ((i * 60 + k * 6 + 5) // 6, i * 10 + k),              # [6,10,6] -> flat -> [60,6]
    ((i * 60 + k * 6 + 5) % 6, Const(5, INDEX)),
    (k // 10, Const(0, INDEX)),                           # x // c -> 0 for 0 <= x < c
    (k % 10, k),                                          # x % c -> x for 0 <= x < c
    ((k + 10) % 10, k),
    (j % 10 // 5, j // 5 % 2),                            # mod outermost
    (j % 10 % 5, j % 5),
    (i * 3 + j * 2 + i * 4 - j, i * 7 + j),               # collect terms
    (j + i - i, j),
    (i * 5 % 4, i % 4),
    ((j // 4 % 4) * 4 + j % 4, j % 16),                  # digits of j recombine
    (((j // 4 % 4) * 4 + j % 4) // 4, j // 4 % 4),
    ((j // 16) * 16 + (j // 4 % 4) * 4 + j % 4, j),
])
def test_reshape_and_affine_rules(expr, want):
    assert simplify(expr, R) is want


def test_transpose_reshape_chain_composes_to_a_simple_map():
    # view(2,8,16) . transpose . view(2,4,4,8) . permute(0,3,1,2) . view(2,128) composed by
    # substitution (as vertical fusion does): the flat index splits back into plain digits.
    c = Var("c")
    t9 = lambda a, b, d: (a, b, d // 4, d % 4)                 # noqa: E731 - [2,8,16] <- [2,8,4,4]
    t10 = lambda a, b, d: t9(a, d, b)                           # noqa: E731 - transpose(1, 2)
    t11 = lambda a, b, d, e: t10(a, b * 4 + d, e)               # noqa: E731 - [2,4,4,8] <- [2,16,8]
    t12 = lambda a, b, d, e: t11(a, d, e, b)                    # noqa: E731 - permute(0,3,1,2)
    idx = t12(i, c // 16, c // 4 % 4, c % 4)                   # [2,128] <- [2,8,4,4]
    got = tuple(simplify(e, {i: (0, 1), c: (0, 127)}) for e in idx)
    assert got == (i, c // 16, c // 4 % 4, c % 4)


def test_reshape_of_reshape_prim_collapses_to_identity():
    # [6,20] -> [120] -> [6,20]: the composed index map is the identity, so the layout prim
    # becomes elementwise.
    x = Load(0, ((i * 20 + j) // 20, (i * 20 + j) % 20), F32)
    p = Prim("p", ("x",), (i, j), x, TensorType((6, 20), F32))
    assert simplify_prim(p).body is Load(0, (i, j), F32)


# ---------------------------------------------------------------- other rules

def test_select_with_decided_condition_and_padding():
    pad = select(binary("and", (i - 1).ge(0), (i - 1).lt(6)), Load(0, (i - 1,), F32), Const(0.0, F32))
    assert simplify(pad, {i: (1, 6)}) is Load(0, (i - 1,), F32)
    assert simplify(pad, {i: (7, 9)}) is Const(0.0, F32)
    kept = simplify(pad, {i: (0, 7)})
    assert isinstance(kept, Select)
    # i - 1 >= 0 becomes i >= 1: constants move right of the comparison
    assert simplify((i - 1).ge(0), {}) is i.ge(1)


def test_select_branches_are_simplified_under_their_condition():
    e = select(i.lt(5), minimum(i, Const(7, INDEX)), maximum(i, Const(2, INDEX)))
    assert simplify(e, {i: (0, 9)}) is i
    assert simplify(select(i.lt(3), (i % 3), j), {i: (0, 9)}) is select(i.lt(3), i, j)


def test_nested_selects_are_refined_along_their_paths():
    # concat of 48 pieces, each level re-testing its own condition in the else branch (dead code):
    # every inner test is decided by the ranges of its path, in one linear-time traversal
    n = 48

    def chain(level, redundant):
        if level == n - 1:
            return Load(level, (i - level * 4,), F32)
        cond = i.lt((level + 1) * 4)
        rest = chain(level + 1, redundant)
        if redundant:
            rest = select(cond, Const(-1.0, F32), rest)
        return select(cond, Load(level, (i - level * 4,), F32), rest)
    assert simplify(chain(0, True), {i: (0, 4 * n - 1)}) is chain(0, False)


@pytest.mark.parametrize("expr, want", [
    (minimum(i, i + 1), i),
    (maximum(i, Const(0, INDEX)), i),
    (maximum(maximum(j, Const(1, INDEX)), Const(3, INDEX)), maximum(j, Const(3, INDEX))),
    (unary("abs", i - 10), 10 - i),
    (binary("div", j, Const(4, INDEX)), j // 4),
    (binary("fmod", j, Const(4, INDEX)), j % 4),
    (binary("div", Const(7, INDEX), Const(2, INDEX)), Const(3, INDEX)),   # folded with trunc
    (binary("div", Const(-7, INDEX), Const(2, INDEX)), Const(-3, INDEX)),
])
def test_minmax_abs_div_rules(expr, want):
    assert simplify(expr, {i: (0, 9), j: (0, 19)}) is want


def test_boolean_rules():
    a, b = i.lt(j), j.lt(3)
    rng = {i: (0, 9), j: (0, 9)}
    assert simplify(binary("and", a, a), rng) is a
    assert simplify(binary("and", a, unary("not", a)), rng) is Const(False, DType.bool)
    assert simplify(binary("or", a, unary("not", a)), rng) is Const(True, DType.bool)
    assert simplify(binary("and", a, binary("or", a, b)), rng) is a
    assert simplify(unary("not", unary("not", a)), rng) is a
    assert simplify(unary("not", a), rng) is i.ge(j)
    assert simplify(binary("xor", a, Const(True, DType.bool)), rng) is i.ge(j)
    assert simplify(select(a, Const(True, DType.bool), b), rng) is binary("or", a, b)
    assert simplify(binary("and", a, i.lt(20)), rng) is a            # i < 20 always holds


def test_guarded_loads_stay_guarded():
    # where(i < 3, m[i], True) must not become (i >= 3) or m[i]: m[i] is out of bounds for i >= 3
    m = Load(0, (i,), DType.bool)
    p = Prim("p", ("m",), (i,), select(i.lt(3), m, Const(True, DType.bool)), TensorType((5,), DType.bool))
    q = simplify_prim(p)
    assert q.body is p.body
    assert eval_prim(q, [torch.tensor([True, False, True])]).tolist() == [True, False, True, True, True]
    assert simplify(select(i.lt(3), j.lt(2), Const(True, DType.bool))) is binary("or", i.ge(3), j.lt(2))


def test_guarded_divisions_stay_guarded():
    # where(k >= 1, 1 // max(k, 1) == 1, False): the branch becomes 1 // k under k >= 1, so the
    # select must not turn into (k >= 1) and (1 // k == 1), which divides by zero at k = 0
    e = select(k.ge(1), binary("floordiv", 1, maximum(k, 1)).eq(1), Const(False, DType.bool))
    _check(e, {i: (0, 0), j: (0, 0), k: (0, 2)})


def test_float_rules_stay_exact():
    x = Load(0, (i,), F32)
    assert simplify(x * 0.0) is x * 0.0                 # NaN * 0 is NaN: no folding
    assert simplify(x - x) is x - x
    assert simplify(unary("not", x.lt(1.0))) is unary("not", x.lt(1.0))   # NaN: not (x < 1) != x >= 1
    assert simplify(maximum(x, x)) is x
    assert simplify(unary("abs", -x)) is unary("abs", x)
    # float32 constants fold with float32 rounding, as the executor computes them
    third = simplify(Const(1.0, F32) / Const(3.0, F32))
    assert isinstance(third, Const) and third.value == torch.tensor(1 / 3, dtype=torch.float32).item()
    # exact casts collapse, rounding ones stay
    h = Load(1, (i,), DType.float16)
    assert simplify(cast(cast(h, F32), DType.float64)) is cast(h, DType.float64)
    assert simplify(cast(cast(h, F32), DType.float16)) is h
    assert simplify(cast(cast(x, DType.float16), F32)) is cast(cast(x, DType.float16), F32)
    # int64 -> int32 -> int64 round trip is exact when the range fits int32
    assert simplify(cast(cast(i, DType.int32), INDEX), {i: (0, 9)}) is i
    assert isinstance(simplify(cast(cast(i, DType.int32), INDEX)), Cast)


def test_undefined_constant_operations_are_left_to_run_time():
    for e in (binary("floordiv", Const(7, INDEX), Const(0, INDEX)), Cast(Const(math.nan, F32), INDEX),
              Cast(Const(1e30, F32), DType.int32)):
        assert simplify(e) is e
    assert simplify(Cast(Const(300, INDEX), DType.int8)) is Const(44, DType.int8)   # wraps, as torch does
    assert simplify(Cast(Const(-2.5, F32), DType.int32)) is Const(-2, DType.int32)  # truncates


def test_rule_changing_dtype_is_reported(monkeypatch):
    bad = lambda n, s: cast(n, F32) if isinstance(n, Var) else None  # noqa: E731
    bad.__name__ = "bad_rule"
    monkeypatch.setitem(simp.RULES, "Var", [bad])
    with pytest.raises(TypeError, match="bad_rule"):
        simplify(i + 1)


def test_rules_form_a_documented_table():
    rules = {r for rs in simp.RULES.values() for r in rs}
    assert len(rules) >= 20
    assert all(r.__doc__ and r.__doc__.strip() for r in rules)


# ---------------------------------------------------------------- prims and graphs

def _graph(prims, inputs):
    return PrimGraph(tuple(TensorDecl(n, t) for n, t in inputs), (), tuple(prims), (prims[-1].name,))


def test_simplify_prim_drops_inputs_it_no_longer_reads():
    x, y = Load(0, (i,), F32), Load(1, (i,), F32)
    body = select((i + 10).ge(10), x, y)          # i + 10 >= 10 always: y is never read
    p = Prim("p", ("a", "b"), (i,), body, TensorType((4,), F32), origin=Origin("Where", "w"))
    q = simplify_prim(p)
    assert q.inputs == ("a",) and q.body is x and q.origin == p.origin
    assert simplify_prim(q) is q


def test_simplify_graph_keeps_results_and_identity_when_unchanged():
    t = TensorType((6, 20), F32)
    flat = Prim("flat", ("x",), (k,), Load(0, (k // 20, k % 20), F32), TensorType((120,), F32))
    back = Prim("back", ("flat",), (i, j), Load(0, (i * 20 + j,), F32) * 2.0, t)
    red = Prim("red", ("back",), (i,), Load(0, (i, Var("r0")), F32), TensorType((6,), F32),
               Reduction((Var("r0"),), (20,), "sum"))
    pg = _graph([flat, back, red], [("x", t)])
    spg = simplify_graph(pg)
    x = torch.randn(6, 20)
    torch.testing.assert_close(run_reference(spg, {"x": x})[0], run_reference(pg, {"x": x})[0])
    assert simplify_graph(spg) is spg
    done = _graph([Prim("e", ("x",), (i, j), Load(0, (i, j), F32), t)], [("x", t)])
    assert simplify_graph(done) is done


def test_empty_prim_is_left_alone():
    p = Prim("p", ("x",), (i,), Load(0, ((i * 20 + 3) // 20,), F32), TensorType((0,), F32))
    assert simplify_prim(p) is p
