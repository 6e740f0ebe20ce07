"""The expression printer: text parses back to the identical node, deterministically and uniquely."""
from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings

from strategies import INPUT_DTYPES, VAR_NAMES, VARS, any_exprs
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.expr import INDEX, Binary, Cast, Const, Load, Select, Unary, Var, binary, cast, select, unary
from tilefuse.ir.printer import format_expr, format_prim, format_primgraph, parse_expr
from tilefuse.ir.prim import Opaque, Origin, Prim, PrimGraph, Reduction, TensorDecl

F32, B = DType.float32, DType.bool
i, j, k = VARS
PROPS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _round_trip(e):
    return parse_expr(format_expr(e), VAR_NAMES, INPUT_DTYPES)


@PROPS
@given(any_exprs())
def test_parse_of_format_is_the_same_node(e):
    assert _round_trip(e) is e, format_expr(e)


@PROPS
@given(any_exprs(), any_exprs())
def test_distinct_expressions_print_differently(a, b):
    assert (format_expr(a) == format_expr(b)) == (a is b)


@pytest.mark.parametrize("e", [
    # nodes the smart constructors leave unfolded, with constant operands (printed with a dtype)
    binary("div", Const(7, INDEX), Const(2, INDEX)),
    binary("floordiv", Const(7, INDEX), Const(0, INDEX)),
    binary("pow", Const(-2, INDEX), Const(3, INDEX)),
    binary("fmod", Const(7, INDEX), i),
    binary("bitand", Const(True, B), Const(False, B)),
    Const(2, INDEX) ** i,
    Cast(Const(3, INDEX), F32),
    Cast(Const(True, B), F32),
    unary("abs", Const(-3, INDEX)),
    Select(i.lt(0), Const(3, INDEX), Const(4, INDEX)),
    Select(i.lt(0), Const(True, B), Const(False, B)),
    Load(0, (), F32),                                   # rank-0 tensor
    # precedence and signs
    i - (j - k), (i - j) - k, i * -j, -(i * j), (-i) ** j, i ** (j ** k), (i ** j) ** k,
    Const(-3, INDEX) % i, i - Const(-3, INDEX), -(Load(0, (i, j), F32) ** Const(2.0, F32)),
    unary("neg", Const(1.5, F32)), Const(-0.0, F32), Const(math.inf, F32), Const(-math.inf, DType.float16),
    Const(math.nan, F32), Const(1e-30, F32) * Load(0, (i, j), F32),
    cast(cast(i, DType.int32), F32), binary("xor", i.lt(j), j.lt(k)), binary("and", i.lt(j), j.lt(k)),
])
def test_round_trip_of_edge_cases(e):
    assert _round_trip(e) is e, format_expr(e)


def test_format_names_loads_and_prints_prims():
    a, r = Load(0, (i, Var("r0")), F32), Var("r0")
    p = Prim("mm", ("x", "w"), (i, j), a * Load(1, (r, j), F32), TensorType((2, 3), F32),
             Reduction((r,), (4,), "sum"), Origin("MatMul", "n1", "model.py:7"))
    text = format_prim(p)
    assert text == "%mm[i, j]: float32[2, 3] = sum[r0<4](%x[i, r0] * %w[r0, j])    # MatMul 'n1' at model.py:7"
    q = Prim("tk", ("mm",), (i, j), Opaque("topk_indices", (("k", 2),)), TensorType((2, 2), INDEX))
    assert format_prim(q).startswith("%tk[i, j]: int64[2, 2] = opaque topk_indices(%mm, k=2)")
    pg = PrimGraph((TensorDecl("x", TensorType((2, 4), F32)), TensorDecl("w", TensorType((4, 3), F32))),
                   (), (p,), ("mm",))
    lines = format_primgraph(pg, classify=lambda p: "contraction").splitlines()
    assert lines[0] == "inputs: %x: float32[2, 4], %w: float32[4, 3]"
    assert lines[1].startswith("contraction  %mm[i, j]") and lines[-1] == "outputs: %mm"


def test_printing_is_deterministic_across_processes():
    # Text must not depend on hashing or memory addresses: a fresh interpreter with another hash
    # seed prints the same expressions (sent pickled) identically.
    exprs = [select(i.lt(j), Load(0, (i * 20 + j // 3,), F32), Const(0.5, F32)) * Load(1, (k,), F32),
             binary("and", (i % 4).eq(j), unary("not", k.ge(2))), cast(i - j * 3, F32) ** Const(2.0, F32)]
    here = [format_expr(e) for e in exprs]
    code = ("import pickle, sys; from tilefuse.ir.printer import format_expr; "
            "print('\\n'.join(format_expr(e) for e in pickle.loads(sys.stdin.buffer.read())))")
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(exprs), capture_output=True,
                         env={**os.environ, "PYTHONHASHSEED": "12345"}, check=True)
    assert out.stdout.decode().splitlines() == here
    assert [format_expr(e) for e in exprs] == here
    assert all(isinstance(e, (Binary, Unary, Select)) for e in exprs)
