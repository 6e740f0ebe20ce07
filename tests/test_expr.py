"""Expression nodes: interning, immutability, hashing, pickling, dtype checks, constructor folding."""
from __future__ import annotations

import math
import pickle

import pytest
from hypothesis import HealthCheck, given, settings

from strategies import VARS, any_exprs
from tilefuse.ir.dtypes import DType
from tilefuse.ir.expr import (INDEX, Binary, Cast, Const, Load, Select, Unary, Var, binary, cast, free_vars,
                              loads, logical_and, maximum, minimum, select, substitute, transform, unary, walk)

F32, F64, I32, B = DType.float32, DType.float64, DType.int32, DType.bool
i, j, k = VARS
x = Load(0, (i,), F32)
PROPS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- identity, immutability, hashing, pickling

def test_structurally_equal_nodes_are_one_object():
    assert Var("i") is i
    assert Const(3, INDEX) is Const(3, INDEX)
    assert Const(1, F32) is Const(1.0, F32)               # float dtype stores a float
    assert Const(1, I32) is not Const(1, INDEX)           # dtype is part of the identity
    assert Const(0.0, F32) is not Const(-0.0, F32)        # distinct float values
    assert Const(math.nan, F32) is Const(math.nan, F32)
    assert Load(0, (i, 2), F32) is Load(0, (i, Const(2, INDEX)), F32)
    assert Load(0, (i,), F32) is not Load(1, (i,), F32)
    assert (i + 1) * j is (i + 1) * j
    assert select(i.lt(j), i, j) is Select(Binary("lt", i, j), i, j)
    assert (i + 1 == i + 1) is True and (i + 1 != i + 2) is True   # == is identity (not .eq())


def test_nodes_are_immutable_and_have_no_truth_value():
    e = i + j
    with pytest.raises(AttributeError):
        e.a = k
    with pytest.raises(AttributeError):
        i.name = "z"
    with pytest.raises(TypeError, match="truth value"):
        bool(i.lt(j))


def test_hash_is_structural_and_usable_in_dicts():
    d = {i + 1: "a", x * 2.0: "b"}
    assert d[i + 1] == "a" and d[Load(0, (i,), F32) * 2.0] == "b"
    assert hash(Const(5, INDEX)) == hash(Const(5, INDEX))
    assert len({i + 1, i + 1, 1 + i}) == 2                # operand order matters structurally


@PROPS
@given(any_exprs())
def test_pickle_round_trip_gives_the_same_node(e):
    assert pickle.loads(pickle.dumps(e)) is e


# ---------------------------------------------------------------- dtype checking

def test_dtype_errors():
    with pytest.raises(TypeError, match="dtypes differ"):
        Binary("add", x, i)
    with pytest.raises(TypeError, match="dtypes differ"):
        x + cast(i, F64)
    with pytest.raises(TypeError, match="condition must be bool"):
        Select(i, x, x)
    with pytest.raises(TypeError, match="branches differ"):
        Select(i.lt(j), x, i)
    with pytest.raises(TypeError, match="int64"):
        Load(0, (cast(i, I32),), F32)
    with pytest.raises(TypeError, match="int64"):
        Load(0, (x,), F32)
    with pytest.raises(TypeError, match="not an index"):
        Load(0, (1.5,), F32)
    with pytest.raises(TypeError, match="bool operands"):
        binary("and", i, j)
    with pytest.raises(TypeError, match="bool operand"):
        unary("not", i)
    with pytest.raises(ValueError, match="unknown"):
        binary("frobnicate", i, j)
    with pytest.raises(ValueError, match="unknown"):
        unary("frobnicate", i)
    with pytest.raises(ValueError, match="non-integral"):
        Const(2.5, INDEX)


def test_result_dtypes():
    assert i.lt(j).dtype is B and unary("isnan", x).dtype is B and unary("not", i.lt(j)).dtype is B
    assert (x * 2).dtype is F32 and Const(2.0, F32).dtype is F32     # Python scalars take the Expr's dtype
    assert cast(i, F32).dtype is F32 and Var("q").dtype is INDEX


# ---------------------------------------------------------------- smart-constructor folding

@pytest.mark.parametrize("got, want", [
    (i + 0, i), (0 + i, i), (i - 0, i), (i * 1, i), (1 * i, i), (i // 1, i), (i % 1, Const(0, INDEX)),
    (i * 0, Const(0, INDEX)), (0 * i, Const(0, INDEX)), (i - i, Const(0, INDEX)),
    (x + 0.0, x), (x * 1.0, x), (x / 1.0, x), (x - 0.0, x),
    (Const(3, INDEX) + 4, Const(7, INDEX)),
    (Const(7, INDEX) // 2, Const(3, INDEX)), (Const(-7, INDEX) // 2, Const(-4, INDEX)),   # floor
    (Const(-7, INDEX) % 3, Const(2, INDEX)),                                               # sign of divisor
    (Const(3, INDEX).lt(4), Const(True, B)),
    (maximum(Const(2, I32), Const(5, I32)), Const(5, I32)),
    (binary("and", i.lt(j), Const(True, B)), i.lt(j)),
    (binary("or", Const(False, B), i.lt(j)), i.lt(j)),
    (Const(1.5, F64) + Const(2.25, F64), Const(3.75, F64)),          # float64 folds exactly
    (-(-x), x), (-Const(3, INDEX), Const(-3, INDEX)), (unary("not", Const(True, B)), Const(False, B)),
    (select(Const(True, B), i, j), i), (select(i.lt(j), k, k), k),
    (cast(x, F32), x), (cast(Const(3.0, F32), INDEX), Const(3, INDEX)), (cast(Const(7, INDEX), B), Const(True, B)),
])
def test_constructor_folds(got, want):
    assert got is want


@pytest.mark.parametrize("e, kind", [
    (x * 0.0, Binary),                                   # NaN * 0 and inf * 0 are NaN
    (0.0 * x, Binary),
    (x - x, Binary),                                     # NaN - NaN is NaN
    (Const(1.0, F32) + Const(2.0, F32), Binary),         # float32 does not round like Python floats
    (binary("floordiv", x, Const(1.0, F32)), Binary),    # x // 1.0 is floor(x)
    (cast(Const(2.5, F32), INDEX), Cast),                # non-integral: truncation left to the executor
    (cast(Const(300, INDEX), DType.int8), Cast),         # out of range: wraps at run time
    (cast(Const(math.inf, F32), INDEX), Cast),
    (unary("exp", Const(1.0, F32)), Unary),
])
def test_constructor_does_not_fold_inexact(e, kind):
    assert type(e) is kind


def test_float64_max_min_folding_propagates_nan():
    nan, one = Const(math.nan, F64), Const(1.0, F64)
    for a, b in ((nan, one), (one, nan)):
        assert math.isnan(maximum(a, b).value) and math.isnan(minimum(a, b).value)


# ---------------------------------------------------------------- traversal

def test_free_vars_walk_loads():
    g = Load(1, (Load(2, (k,), INDEX), j), F32)
    e = select(i.lt(3), x, g * 2.0)
    assert free_vars(e) == {i, j, k}
    assert [ld.tensor for ld in loads(e)] == [0, 1, 2]
    nodes = list(walk((i + 1) * (i + 1)))
    assert len(nodes) == len(set(map(id, nodes))) == 4    # shared i + 1 visited once: *, +, i, 1


def test_substitute_and_transform_rebuild_through_constructors():
    e = Load(0, (i * 4 + j,), F32) * 2.0
    assert substitute(e, {i: Const(0, INDEX)}) is Load(0, (j,), F32) * 2.0      # 0*4 + j folds to j
    assert substitute(e, {}) is e
    assert substitute(e, {Var("unused"): i}) is e                               # unchanged: same object
    bumped = transform(e, lambda n: n + 1 if isinstance(n, Var) else None)
    assert bumped is Load(0, ((i + 1) * 4 + (j + 1),), F32) * 2.0
    retyped = transform(e, lambda n: Load(n.tensor, n.index, F64) if isinstance(n, Load) else
                        (Const(n.value, F64) if isinstance(n, Const) and n.dtype is F32 else None))
    assert retyped.dtype is F64


def test_logical_and_of_many():
    assert logical_and() is Const(True, B)
    assert logical_and(i.lt(1), j.lt(2)) is binary("and", i.lt(1), j.lt(2))
