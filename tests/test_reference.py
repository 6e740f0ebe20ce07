"""The reference executor's semantics (see the module docstring of tilefuse/ir/evaluate.py)."""
from __future__ import annotations

import gc
import math
import weakref

import pytest
import torch

from tilefuse.fission.registry import Fission
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.expr import INDEX, Const, Load, Var, binary, cast, logical_and, maximum, select
from tilefuse.ir import evaluate
from tilefuse.ir.evaluate import ReferenceError, eval_prim, run_reference
from tilefuse.ir.prim import Origin, Prim, PrimGraph, Reduction, TensorDecl, reduce_init

F32, F16, BF16, I32, B = DType.float32, DType.float16, DType.bfloat16, DType.int32, DType.bool
i, j = Var("i"), Var("j")


def _binary_prim(op, dtype, n):
    body = binary(op, Load(0, (i,), dtype), Load(1, (i,), dtype))
    return Prim("p", ("a", "b"), (i,), body, TensorType((n,), body.dtype))


# ---------------------------------------------------------------- arithmetic semantics

def test_integer_div_truncates_floordiv_and_mod_floor_fmod_takes_dividend_sign():
    pairs = [(a, b) for a in range(-7, 8) for b in (-3, -2, -1, 1, 2, 3)]
    a = torch.tensor([p[0] for p in pairs])
    b = torch.tensor([p[1] for p in pairs])
    run = lambda op: eval_prim(_binary_prim(op, INDEX, len(pairs)), [a, b]).tolist()  # noqa: E731
    assert run("div") == [int(x / y) for x, y in pairs]                # toward zero
    assert run("floordiv") == [x // y for x, y in pairs]               # toward -inf
    assert run("mod") == [x % y for x, y in pairs]                     # sign of divisor
    assert run("fmod") == [int(math.fmod(x, y)) for x, y in pairs]     # sign of dividend


def test_float_floordiv_mod_fmod():
    a = torch.tensor([-7.5, 7.5, -7.5, 7.5])
    b = torch.tensor([2.0, -2.0, -2.0, 2.0])
    run = lambda op: eval_prim(_binary_prim(op, F32, 4), [a, b]).tolist()  # noqa: E731
    assert run("div") == [x / y for x, y in zip(a.tolist(), b.tolist())]
    assert run("floordiv") == [x // y for x, y in zip(a.tolist(), b.tolist())]
    assert run("mod") == [x % y for x, y in zip(a.tolist(), b.tolist())]
    assert run("fmod") == [math.fmod(x, y) for x, y in zip(a.tolist(), b.tolist())]


def test_float_to_int_cast_truncates():
    x = torch.tensor([-2.7, -0.5, 0.5, 2.7])
    p = Prim("p", ("x",), (i,), cast(Load(0, (i,), F32), I32), TensorType((4,), I32))
    assert eval_prim(p, [x]).tolist() == [-2, 0, 0, 2]


# ---------------------------------------------------------------- 16-bit reductions

def _sum_prim(dtype, n, body=None):
    r = Var("r0")
    body = body if body is not None else Load(0, (r,), dtype)
    return Prim("s", ("x", "y"), (), body, TensorType((), dtype), Reduction((r,), (n,), "sum"))


@pytest.mark.parametrize("dtype", [F16, BF16])
def test_16bit_sum_accumulates_in_fp32(dtype):
    n = 4096
    ones = torch.ones(n, dtype=dtype.to_torch())
    # naive accumulation in the 16-bit type gets stuck (fp16: 2048 + 1 == 2048; bf16 even earlier)
    naive = torch.zeros((), dtype=dtype.to_torch())
    for v in ones:
        naive = naive + v
    assert naive.item() < n
    assert eval_prim(_sum_prim(dtype, n), [ones, ones]).item() == n                     # generic path
    r = Var("r0")
    dot = _sum_prim(dtype, n, Load(0, (r,), dtype) * Load(1, (r,), dtype))              # one group: generic
    assert eval_prim(dot, [ones, ones]).item() == n
    x = torch.ones(2, n, dtype=dtype.to_torch())
    mv = Prim("mv", ("x", "y"), (i,), Load(0, (i, r), dtype) * Load(1, (r,), dtype), TensorType((2,), dtype),
              Reduction((r,), (n,), "sum"))                                                # einsum path
    assert eval_prim(mv, [x, ones]).tolist() == [n, n]


def test_16bit_constants_keep_their_16bit_value_in_fp32_evaluation():
    # fp16 cannot hold 2049: the constant is 2048, so 3 * 2048 = 6144 (3 * 2049 would round to 6148)
    r = Var("r0")
    p = _sum_prim(F16, 3, Load(0, (r,), F16) * Const(2049.0, F16))
    ones = torch.ones(3, dtype=torch.float16)
    assert eval_prim(p, [ones, ones]).item() == 6144
    q = Prim("q", ("x",), (i,), Load(0, (i,), F16) * Const(2049.0, F16), TensorType((3,), F16))
    assert eval_prim(q, [ones]).tolist() == [2048.0] * 3


# ---------------------------------------------------------------- bounds checking

def test_out_of_bounds_load_names_the_origin():
    p = Prim("p", ("x",), (i,), Load(0, (i + 1,), F32), TensorType((4,), F32), origin=Origin("Slice", "sl7"))
    with pytest.raises(ReferenceError, match=r"prim p \(Slice 'sl7'\): index 4 out of bounds for dim 0"):
        eval_prim(p, [torch.zeros(4)])


def test_untaken_select_branch_may_be_out_of_bounds():
    x = torch.arange(4.0)
    shifted = select((i + 1).lt(4), Load(0, (i + 1,), F32), Const(-1.0, F32))
    p = Prim("p", ("x",), (i,), shifted, TensorType((4,), F32))
    assert eval_prim(p, [x]).tolist() == [1.0, 2.0, 3.0, -1.0]
    # nested: the inner branch is guarded by both conditions
    pad = select(i.ge(1), select((i - 1).lt(4), Load(0, (i - 1,), F32), Const(7.0, F32)), Const(9.0, F32))
    q = Prim("q", ("x",), (i,), pad, TensorType((6,), F32))
    assert eval_prim(q, [x]).tolist() == [9.0, 0.0, 1.0, 2.0, 3.0, 7.0]
    # but the taken branch is checked
    bad = select(i.lt(3), Load(0, (i + 2,), F32), Const(0.0, F32))
    with pytest.raises(ReferenceError, match="index 4"):
        eval_prim(Prim("b", ("x",), (i,), bad, TensorType((4,), F32)), [x])


def test_gather_with_data_dependent_index():
    table, idx = torch.randn(10, 3), torch.tensor([3, 0, 9, 3])
    body = Load(0, (Load(1, (i,), INDEX), j), F32)
    p = Prim("g", ("t", "idx"), (i, j), body, TensorType((4, 3), F32), origin=Origin("Gather", "g"))
    torch.testing.assert_close(eval_prim(p, [table, idx]), table[idx])
    with pytest.raises(ReferenceError, match="Gather 'g'.*index 10"):
        eval_prim(p, [table, torch.tensor([0, 10, 1, 2])])


def test_rank0_tensors():
    p = Prim("p", ("s",), (i,), Load(0, (), F32) * cast(i, F32), TensorType((3,), F32))
    assert eval_prim(p, [torch.tensor(2.0)]).tolist() == [0.0, 2.0, 4.0]


# ---------------------------------------------------------------- evaluation strategies

def _matmul(n=6, kk=5, m=7):
    fx = Fission(set())
    a = fx.ref("a", TensorType((n, kk), F32))
    b = fx.ref("b", TensorType((kk, m), F32))
    fx.reduce((n, m), (kk,), "sum", lambda o, r: a[o[0], r[0]] * b[r[0], o[1]])
    return fx.prims[-1], [torch.randn(n, kk), torch.randn(kk, m)]


def _padded_conv1d():
    fx = Fission(set())
    x = fx.ref("x", TensorType((2, 3, 9), F32))
    w = fx.ref("w", TensorType((4, 3, 3), F32))

    def body(o, r):
        h = o[2] * 2 + r[1] - 1
        return select(logical_and(h.ge(0), h.lt(9)), x[o[0], r[0], h], Const(0.0, F32)) * w[o[1], r[0], r[1]]
    fx.reduce((2, 4, 5), (3, 3), "sum", body)
    return fx.prims[-1], [torch.randn(2, 3, 9), torch.randn(4, 3, 3)]


def _expected(name, xs):
    if name == "matmul":
        return xs[0] @ xs[1]
    return torch.nn.functional.conv1d(xs[0], xs[1], stride=2, padding=1)


@pytest.mark.parametrize("name, make", [("matmul", _matmul), ("conv", _padded_conv1d)])
def test_einsum_and_generic_paths_agree(name, make, monkeypatch):
    p, xs = make()
    calls = []
    real = evaluate._einsum
    monkeypatch.setattr(evaluate, "_einsum", lambda *a: calls.append(1) or real(*a))
    fast = eval_prim(p, xs)
    assert calls, "contraction did not take the einsum path"
    monkeypatch.setattr(evaluate, "_einsum", lambda *a: None)
    slow = eval_prim(p, xs)
    torch.testing.assert_close(fast, slow)
    torch.testing.assert_close(fast, _expected(name, xs))


def test_contraction_with_a_variable_no_factor_reads():
    # out[i, j] = sum_r a[i] * b[j] counts each product 4 times; out[i, j] = sum_r a[i, r] * c[r]
    # is constant along j: einsum alone would drop the 4 or fail on j
    r = Var("r0")
    a, b, c = torch.randn(2), torch.randn(3), torch.randn(4)
    p = Prim("p", ("a", "b"), (i, j), Load(0, (i,), F32) * Load(1, (j,), F32), TensorType((2, 3), F32),
             Reduction((r,), (4,), "sum"))
    torch.testing.assert_close(eval_prim(p, [a, b]), 4 * a[:, None] * b[None, :])
    a2 = torch.randn(2, 4)
    q = Prim("q", ("a", "c"), (i, j), Load(0, (i, r), F32) * Load(1, (r,), F32), TensorType((2, 3), F32),
             Reduction((r,), (4,), "sum"))
    torch.testing.assert_close(eval_prim(q, [a2, c]), (a2 @ c)[:, None].expand(2, 3))


def test_chunked_evaluation_matches(monkeypatch):
    x = torch.randn(9, 5, 4)
    r = Var("r0")
    prims = [
        Prim("mx", ("x",), (i, j), Load(0, (i, j, r), F32), TensorType((9, 5), F32), Reduction((r,), (4,), "max")),
        Prim("ss", ("x",), (i, j), Load(0, (i, j, r), F32) * Load(0, (i, j, r), F32), TensorType((9, 5), F32),
             Reduction((r,), (4,), "sum")),
        Prim("ew", ("x",), (i, j), maximum(Load(0, (i, j, Const(1, INDEX)), F32), 0.0), TensorType((9, 5), F32)),
    ]
    whole = [eval_prim(p, [x]) for p in prims]
    monkeypatch.setattr(evaluate, "CHUNK_ELEMS", 7)      # chunks of one leading row (20 elements/row)
    chunked = [eval_prim(p, [x]) for p in prims]
    for a, b in zip(whole, chunked):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(chunked[0], x.amax(-1))
    torch.testing.assert_close(chunked[1], (x * x).sum(-1))
    torch.testing.assert_close(chunked[2], x[:, :, 1].clamp(min=0))


@pytest.mark.parametrize("combiner", ["sum", "prod", "max", "min"])
@pytest.mark.parametrize("dtype", [F32, F16, I32, B])
def test_empty_reduction_gives_the_identity(combiner, dtype):
    r = Var("r0")
    p = Prim("e", ("x",), (i,), Load(0, (i, r), dtype), TensorType((3,), dtype), Reduction((r,), (0,), combiner))
    got = eval_prim(p, [torch.zeros(3, 0, dtype=dtype.to_torch())])
    want = torch.full((3,), reduce_init(combiner, dtype), dtype=dtype.to_torch())
    assert got.dtype == want.dtype and torch.equal(got, want)
    if dtype.is_float:
        assert got.tolist() == [{"sum": 0.0, "prod": 1.0, "max": -math.inf, "min": math.inf}[combiner]] * 3


def test_bool_sum_is_any_and_prod_is_all():
    x = torch.tensor([[True, False, False], [False, False, False], [True, True, True]])
    r = Var("r0")
    run = lambda c: eval_prim(Prim("b", ("x",), (i,), Load(0, (i, r), B), TensorType((3,), B),  # noqa: E731
                                   Reduction((r,), (3,), c)), [x]).tolist()
    assert run("sum") == [True, False, True]
    assert run("prod") == [False, False, True]
    assert run("max") == [True, False, True] and run("min") == [False, False, True]


def test_opaque_prim_runs_its_torch_function_and_checks_its_type():
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 2.0, 7.0]])
    fx = Fission(set())
    ref = fx.ref("x", TensorType((2, 4), F32))
    fx.opaque("topk_indices", [ref], TensorType((2, 2), INDEX), k=2, axis=1, largest=True, sorted=True)
    p = fx.prims[-1]
    assert eval_prim(p, [x]).tolist() == [[1, 2], [3, 0]]     # ties: lower index first
    wrong = Prim(p.name, p.inputs, (i, j, Var("k")), p.body, TensorType((2, 2, 1), INDEX), origin=Origin("TopK", "t"))
    with pytest.raises(ReferenceError, match="TopK 't'"):
        eval_prim(wrong, [x])


# ---------------------------------------------------------------- whole graphs

def test_run_reference_frees_intermediates_and_keeps_outputs(monkeypatch):
    t = TensorType((4,), F32)
    ld = Load(0, (i,), F32)
    prims = [Prim("a", ("x",), (i,), ld + 1.0, t), Prim("b", ("a",), (i,), ld * 2.0, t),
             Prim("c", ("b",), (i,), ld - 3.0, t), Prim("d", ("c", "b"), (i,), ld * Load(1, (i,), F32), t)]
    pg = PrimGraph((TensorDecl("x", t),), (), tuple(prims), ("d", "b"))
    made: dict[str, weakref.ref] = {}
    alive_at: dict[str, set] = {}
    real = evaluate.eval_prim

    def spy(p, inputs):
        gc.collect()
        alive_at[p.name] = {n for n, w in made.items() if w() is not None}
        out = real(p, inputs)
        made[p.name] = weakref.ref(out)
        return out
    monkeypatch.setattr(evaluate, "eval_prim", spy)
    x = torch.arange(4.0)
    d, b = run_reference(pg, {"x": x})
    torch.testing.assert_close(b, (x + 1) * 2)
    torch.testing.assert_close(d, ((x + 1) * 2 - 3) * ((x + 1) * 2))
    assert alive_at["c"] == {"b"}          # a was freed after its last use by b
    assert alive_at["d"] == {"b", "c"}     # b stays: it is read by d and is a graph output


def test_untaken_select_branch_may_divide_by_zero_but_a_taken_one_raises():
    from tilefuse.ir.expr import Var, select, binary
    from tilefuse.ir.dtypes import DType, TensorType
    from tilefuse.ir.prim import Prim
    from tilefuse.ir.evaluate import eval_prim
    i = Var("i0")
    safe = select(i.lt(1), 0, binary("floordiv", 6, i))            # i // 0 only where not taken
    got = eval_prim(Prim("p", (), (i,), safe, TensorType((4,), DType.int64)), [])
    assert got.tolist() == [0, 6, 3, 2]
    unsafe = select(i.lt(1), binary("floordiv", 6, i), 0)          # the taken branch divides by 0
    with pytest.raises(RuntimeError):
        eval_prim(Prim("p", (), (i,), unsafe, TensorType((4,), DType.int64)), [])
