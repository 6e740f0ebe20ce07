"""Elementwise fission rules against torch (and ONNX's reference evaluator where ONNX semantics differ)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
from onnx import helper
from onnx.reference import ReferenceEvaluator
from opcheck import check_op, run_op

from tilefuse.analysis.classify import classify
from tilefuse.errors import UnsupportedAttribute
from tilefuse.ir.dtypes import DType, TensorType

g = torch.Generator().manual_seed(0)


def randn(*shape, dtype=torch.float32, scale=1.0):
    return (torch.randn(shape, generator=g) * scale).to(dtype)


def randint(lo, hi, *shape, dtype=torch.int32):
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def onnx_ref(op: str, inputs: list, attrs: dict | None = None) -> list[torch.Tensor]:
    """Outputs of ONNX's own reference evaluator for one node."""
    names = [f"x{k}" for k in range(len(inputs))]
    node = helper.make_node(op, names, ["y"], **(attrs or {}))
    vi = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(t.numpy().dtype), list(t.shape))
          for n, t in zip(names, inputs)]
    out = helper.make_tensor_value_info("y", onnx.TensorProto.UNDEFINED, None)
    model = helper.make_model(helper.make_graph([node], "g", vi, [out]),
                              opset_imports=[helper.make_opsetid("", 21)])
    res = ReferenceEvaluator(model).run(None, {n: t.numpy() for n, t in zip(names, inputs)})
    return [torch.from_numpy(np.asarray(r)) for r in res]


# ---------------------------------------------------------------- unary math

def _uniform(lo, hi):
    return lambda: torch.rand(3, 5, generator=g) * (hi - lo) + lo


UNARY = {
    "Neg": (torch.neg, None), "Abs": (torch.abs, None), "Reciprocal": (torch.reciprocal, _uniform(0.5, 3)),
    "Sqrt": (torch.sqrt, _uniform(0, 4)), "Exp": (torch.exp, None), "Log": (torch.log, _uniform(0.1, 5)),
    "Floor": (torch.floor, None), "Ceil": (torch.ceil, None), "Sign": (torch.sign, None),
    "Sin": (torch.sin, None), "Cos": (torch.cos, None), "Tan": (torch.tan, _uniform(-1.2, 1.2)),
    "Asin": (torch.asin, _uniform(-1, 1)), "Acos": (torch.acos, _uniform(-1, 1)), "Atan": (torch.atan, None),
    "Sinh": (torch.sinh, None), "Cosh": (torch.cosh, None), "Asinh": (torch.asinh, None),
    "Acosh": (torch.acosh, _uniform(1, 4)), "Atanh": (torch.atanh, _uniform(-0.9, 0.9)), "Erf": (torch.erf, None),
    "Sigmoid": (torch.sigmoid, None), "Tanh": (torch.tanh, None), "Rsqrt": (torch.rsqrt, _uniform(0.1, 4)),
    "Relu": (torch.relu, None), "Silu": (F.silu, None), "Mish": (F.mish, None), "Selu": (F.selu, None),
    "Softsign": (F.softsign, None), "HardSwish": (F.hardswish, None), "Softplus": (F.softplus, None),
    "Elu": (F.elu, None), "Celu": (F.celu, None), "Gelu": (F.gelu, None),
    "LeakyRelu": (lambda x: F.leaky_relu(x, 0.01), None),
    "HardSigmoid": (lambda x: torch.clamp(0.2 * x + 0.5, 0, 1), None),
    "ThresholdedRelu": (lambda x: torch.where(x > 1.0, x, 0.0), None),
    "Shrink": (lambda x: F.hardshrink(x, 0.5), None),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_float(op):
    fn, gen = UNARY[op]
    x = gen() if gen else randn(3, 5, scale=3)
    check_op(op, [x], fn(x), rtol=1e-5, atol=1e-5)


# Extreme inputs for ops written in stable form: no overflow to inf/nan.
@pytest.mark.parametrize("op", ["Softplus", "Mish", "Sigmoid", "Silu", "Elu", "Celu", "Selu", "Gelu"])
def test_unary_extreme_values(op):
    x = torch.tensor([-1000.0, -100.0, -30.0, -1e-3, 0.0, 1e-3, 30.0, 100.0, 1000.0])
    check_op(op, [x], UNARY[op][0](x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op,attrs,ref", [
    ("LeakyRelu", {"alpha": 0.2}, lambda x: F.leaky_relu(x, 0.2)),
    ("Elu", {"alpha": 0.5}, lambda x: F.elu(x, 0.5)),
    ("Celu", {"alpha": 2.0}, lambda x: F.celu(x, 2.0)),
    ("Selu", {"alpha": 1.5, "gamma": 2.0}, lambda x: 2.0 * torch.where(x > 0, x, 1.5 * torch.expm1(x))),
    ("Gelu", {"approximate": "tanh"}, lambda x: F.gelu(x, approximate="tanh")),
    ("Gelu", {"approximate": "none"}, F.gelu),
    ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}, F.hardsigmoid),
    ("ThresholdedRelu", {"alpha": 0.5}, lambda x: torch.where(x > 0.5, x, 0.0)),
    ("Shrink", {"lambd": 0.3, "bias": 0.3}, lambda x: F.softshrink(x, 0.3)),
    ("Shrink", {"lambd": 0.3, "bias": 0.1},
     lambda x: torch.where(x < -0.3, x + 0.1, torch.where(x > 0.3, x - 0.1, 0.0))),
])
def test_unary_attributes(op, attrs, ref):
    x = randn(4, 6, scale=2)
    check_op(op, [x], ref(x), attrs=attrs, rtol=1e-5, atol=1e-6)


def test_round_half_to_even():
    x = torch.tensor([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49, 3.7])
    check_op("Round", [x], torch.round(x))


def test_isnan_isinf():
    x = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), -2.0, 0.0])
    check_op("IsNaN", [x], torch.isnan(x))
    for pos, neg, ref in [(1, 1, torch.isinf(x)), (1, 0, torch.isposinf(x)), (0, 1, torch.isneginf(x)),
                          (0, 0, torch.zeros_like(x, dtype=torch.bool))]:
        check_op("IsInf", [x], ref, attrs={"detect_positive": pos, "detect_negative": neg})


@pytest.mark.parametrize("op,ref", [("Neg", torch.neg), ("Abs", torch.abs), ("Sign", torch.sign),
                                    ("Relu", torch.relu), ("Floor", lambda x: x), ("Round", lambda x: x)])
def test_unary_int(op, ref):
    x = randint(-50, 50, 4, 5)
    check_op(op, [x], ref(x))


def test_shrink_int_matches_onnx():
    x = randint(-5, 6, 11, dtype=torch.int32)
    attrs = {"lambd": 1.5, "bias": 1.0}
    check_op("Shrink", [x], onnx_ref("Shrink", [x], attrs)[0], attrs=attrs)


# ---------------------------------------------------------------- binary arithmetic and broadcasting

SHAPES = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 4)), ((2, 1, 4), (3, 1)), ((), (2, 3)),
          ((5, 1, 1), (1,))]
ARITH = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div}


@pytest.mark.parametrize("op", sorted(ARITH))
@pytest.mark.parametrize("sa,sb", SHAPES)
def test_binary_broadcast(op, sa, sb):
    a, b = randn(*sa), randn(*sb) + 3.0
    check_op(op, [a, b], ARITH[op](a, b))


def test_binary_with_constant_operand():
    a, b = randn(2, 3), randn(3)
    check_op("Mul", [a, b], a * b, const=(1,))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.int8])
def test_integer_arithmetic_and_truncating_div(dtype):
    a = randint(-100, 100, 3, 4, dtype=dtype)
    b = randint(1, 9, 4, dtype=dtype) * (randint(0, 2, 4, dtype=dtype) * 2 - 1)
    check_op("Add", [a, b], a + b)
    check_op("Mul", [a, b], a * b)
    check_op("Div", [a, b], torch.div(a, b, rounding_mode="trunc"))


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [torch.int32, torch.float32])
def test_mod(fmod, dtype):
    a = (randn(3, 4, scale=10)).to(dtype)
    b = randint(1, 5, 4, dtype=dtype) * (randint(0, 2, 4, dtype=dtype) * 2 - 1)
    ref = torch.fmod(a, b) if fmod else torch.remainder(a, b)
    check_op("Mod", [a, b], ref, attrs={"fmod": fmod})


def test_mod_matches_onnx_for_ints():
    a, b = randint(-20, 20, 6, dtype=torch.int64), torch.tensor([3, -3, 7, -7, 2, -5])
    for fmod in (0, 1):
        check_op("Mod", [a, b], onnx_ref("Mod", [a, b], {"fmod": fmod})[0], attrs={"fmod": fmod})


def test_pow_same_and_mixed_types():
    base = torch.rand(3, 4, generator=g) * 3 + 0.1
    e = randn(3, 4)
    check_op("Pow", [base, e], torch.pow(base, e))
    ei = randint(-2, 4, 4, dtype=torch.int64)
    check_op("Pow", [base, ei], torch.pow(base, ei.float()))            # float base, int exponent
    bi = randint(-4, 5, 3, 4, dtype=torch.int32)
    eu = randint(0, 4, 3, 4, dtype=torch.int32)
    check_op("Pow", [bi, eu], torch.pow(bi, eu))                         # int ** int
    ef = torch.tensor([0.0, 1.0, 2.0, 3.0])
    bp = randint(0, 6, 3, 4, dtype=torch.int64)
    check_op("Pow", [bp, ef], onnx_ref("Pow", [bp, ef])[0])              # int base, float exponent


def test_pow_fp16_base_fp32_exponent():
    base = (torch.rand(3, 4, generator=g) * 2 + 0.5).half()
    e = randn(4)
    check_op("Pow", [base, e], torch.pow(base.float(), e).half(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("op,ref", [("Equal", torch.eq), ("Less", torch.lt), ("Greater", torch.gt),
                                    ("LessOrEqual", torch.le), ("GreaterOrEqual", torch.ge)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_comparisons(op, ref, dtype):
    a, b = randint(-2, 3, 3, 4, dtype=dtype), randint(-2, 3, 4, dtype=dtype)
    check_op(op, [a, b], ref(a, b))


def test_equal_bool():
    a, b = randint(0, 2, 3, 4, dtype=torch.bool), randint(0, 2, 3, 1, dtype=torch.bool)
    check_op("Equal", [a, b], a == b)


@pytest.mark.parametrize("op,ref", [("And", torch.logical_and), ("Or", torch.logical_or), ("Xor", torch.logical_xor)])
def test_logical(op, ref):
    a, b = randint(0, 2, 2, 3, 4, dtype=torch.bool), randint(0, 2, 3, 1, dtype=torch.bool)
    check_op(op, [a, b], ref(a, b))
    check_op("Not", [a], ~a)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32])
def test_bitwise(dtype):
    hi = 256 if dtype is torch.uint8 else 1 << 20
    a, b = randint(0, hi, 3, 4, dtype=dtype), randint(0, hi, 4, dtype=dtype)
    check_op("BitwiseAnd", [a, b], a & b)
    check_op("BitwiseOr", [a, b], a | b)
    check_op("BitwiseXor", [a, b], a ^ b)
    check_op("BitwiseNot", [a], ~a)
    n = randint(0, 8, 4, dtype=dtype)
    check_op("BitShift", [a, n], a << n, attrs={"direction": "LEFT"})
    check_op("BitShift", [a, n], a >> n, attrs={"direction": "RIGHT"})


def test_bitshift_matches_onnx():
    a, n = randint(0, 256, 8, dtype=torch.uint8), randint(0, 8, 8, dtype=torch.uint8)
    for d in ("LEFT", "RIGHT"):
        check_op("BitShift", [a, n], onnx_ref("BitShift", [a, n], {"direction": d})[0], attrs={"direction": d})


# ---------------------------------------------------------------- select, clip, variadic

def test_where_three_way_broadcast():
    c, a, b = randint(0, 2, 3, 1, dtype=torch.bool), randn(1, 4), randn(2, 1, 1)
    check_op("Where", [c, a, b], torch.where(c, a, b))
    ci, ai = randint(0, 2, 4, dtype=torch.bool), randint(-9, 9, 3, 4, dtype=torch.int64)
    check_op("Where", [ci, ai, torch.tensor(7)], torch.where(ci, ai, torch.tensor(7)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_clip(dtype):
    x = randn(4, 5, scale=5).to(dtype)
    lo, hi = torch.tensor(-2, dtype=dtype), torch.tensor(3, dtype=dtype)
    check_op("Clip", [x, lo, hi], torch.clamp(x, lo, hi))
    check_op("Clip", [x, lo], torch.clamp(x, min=lo))
    check_op("Clip", [x, None, hi], torch.clamp(x, max=hi))
    check_op("Clip", [x], x.clone())
    check_op("Clip", [x, hi, lo], torch.full_like(x, -2))        # min > max: everything is max


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
def test_variadic(op):
    xs = [randn(2, 3, 4), randn(4), randn(3, 1)]
    stack = torch.stack(torch.broadcast_tensors(*xs))
    ref = {"Max": stack.amax(0), "Min": stack.amin(0), "Sum": stack.sum(0), "Mean": stack.mean(0)}[op]
    check_op(op, xs, ref)
    check_op(op, xs[:1], xs[0].clone())


def test_variadic_int_max():
    xs = [randint(-9, 9, 3, 4), randint(-9, 9, 4)]
    check_op("Max", xs, torch.maximum(*xs))


@pytest.mark.parametrize("xshape,sshape", [((2, 3, 4, 4), (3, 1, 1)), ((2, 3, 4), (4,)), ((2, 3), (1,))])
def test_prelu_slope_broadcast(xshape, sshape):
    x, s = randn(*xshape), randn(*sshape)
    check_op("PRelu", [x, s], torch.where(x < 0, x * s, x))


# ---------------------------------------------------------------- casts

@pytest.mark.parametrize("src,dst", [
    (torch.float32, torch.int32), (torch.float32, torch.bool), (torch.bool, torch.float32),
    (torch.int64, torch.float16), (torch.float32, torch.bfloat16), (torch.float16, torch.float32),
    (torch.int32, torch.bool), (torch.float16, torch.int64), (torch.int64, torch.int8), (torch.bool, torch.int64),
])
def test_cast(src, dst):
    x = randn(3, 5, scale=20)
    x[0, :3] = torch.tensor([0.0, -0.7, 2.9])
    x = (x > 0) if src is torch.bool else x.to(src)
    ref = x.trunc().to(dst) if x.is_floating_point() and not dst.is_floating_point and dst is not torch.bool \
        else x.to(dst)
    check_op("Cast", [x], ref, attrs={"to": DType.from_torch(dst).to_onnx()})


def test_cast_like():
    x, like = randn(3, 4, scale=9), randint(0, 2, 2, dtype=torch.int64)
    pg = check_op("CastLike", [x, like], x.trunc().to(torch.int64))
    assert pg.prims[0].inputs == ("x0",)          # the type source is not read


@pytest.mark.parametrize("to", [8, 17])           # string, float8e4m3fn
def test_cast_unsupported_type(to):
    x = randn(2, 2)
    with pytest.raises(UnsupportedAttribute, match=r"to=%d of Cast \(node 'n0'\)" % to):
        run_op("Cast", [x], [TensorType((2, 2), DType.float32)], attrs={"to": to})


# ---------------------------------------------------------------- identity, dropout

def test_identity_makes_no_prim():
    x = randn(2, 3)
    pg = check_op("Identity", [x], x)
    assert pg.prims == () and pg.outputs == ("x0",)


def test_dropout_inference():
    x = randn(2, 3)
    pg = check_op("Dropout", [x], x)
    assert pg.prims == ()
    pg = check_op("Dropout", [x], [x, torch.ones(2, 3, dtype=torch.bool)])
    assert len(pg.prims) == 1


# ---------------------------------------------------------------- fp16 and bf16

@pytest.mark.parametrize("op,fn", [("Gelu", F.gelu), ("Softplus", F.softplus), ("Sigmoid", torch.sigmoid),
                                   ("HardSwish", F.hardswish), ("Mish", F.mish), ("Silu", F.silu),
                                   ("Exp", torch.exp), ("Tanh", torch.tanh)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_unary_16bit(op, fn, dtype):
    x = randn(4, 8, scale=3, dtype=dtype)
    tol = 1e-3 if dtype is torch.float16 else 1e-2
    pg = check_op(op, [x], fn(x.float()).to(dtype), rtol=tol, atol=tol)
    assert pg.prims[0].out.dtype is DType.from_torch(dtype)


def test_binary_fp16_mean_and_add():
    a, b, c = (randn(3, 4, dtype=torch.float16, scale=100) for _ in range(3))
    check_op("Add", [a, b], a + b)                   # fp32 math then one rounding == fp16 add
    check_op("Mean", [a, b, c], ((a.float() + b.float() + c.float()) / 3).half(), rtol=1e-3, atol=1e-3)


def test_fp16_exact_ops_are_not_widened():
    x = randn(3, 4, dtype=torch.float16)
    pg = check_op("Relu", [x], torch.relu(x))
    assert "f32" not in str(pg)
    pg = check_op("Sigmoid", [x], torch.sigmoid(x.float()).half(), rtol=1e-3, atol=1e-3)
    assert "f32" in str(pg)


# ---------------------------------------------------------------- errors and categories

@pytest.mark.parametrize("op,attrs,attr", [("Gelu", {"approximate": "fast"}, "approximate"),
                                           ("BitShift", {"direction": "UP"}, "direction")])
def test_unsupported_attributes(op, attrs, attr):
    x = randint(0, 9, 2, 2, dtype=torch.uint8) if op == "BitShift" else randn(2, 2)
    ins = [x, x] if op == "BitShift" else [x]
    with pytest.raises(UnsupportedAttribute, match=f"{attr}=.* of {op} \\(node 'n0'\\)"):
        run_op(op, ins, [TensorType((2, 2), DType.from_torch(x.dtype))], attrs=attrs)


def test_not_broadcastable():
    with pytest.raises(UnsupportedAttribute, match="not broadcastable"):
        run_op("Add", [randn(2, 3), randn(4)], [TensorType((2, 3), DType.float32)])


def test_categories():
    x, y, bias = randn(2, 5, 8), randn(2, 5, 8), randn(8)
    assert classify(check_op("Add", [x, y], x + y).prims[0]).value == "elementwise"
    assert classify(check_op("Add", [x, bias], x + bias).prims[0]).value == "broadcast"
    assert classify(check_op("Gelu", [x], F.gelu(x)).prims[0]).value == "elementwise"
