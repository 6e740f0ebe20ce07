"""ATen converters: elementwise operators (unary, binary, comparisons, where, clamp)."""
from __future__ import annotations

import math

import torch

from ...ir.dtypes import DType, TensorType
from .common import py
from .emitter import Emitter, op_name
from .registry import Converter, converts


def _unary(op: str, attrs: dict | None = None, cast_input: bool = True) -> Converter:
    def convert(em: Emitter, a):
        out = em.out_type()
        x = em.cast(a.self, out.dtype) if cast_input else a.self
        return em.op(op, [x], attrs)
    return convert


for _name, _op in {
    "abs": "Abs", "neg": "Neg", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "rsqrt": "Rsqrt",
    "reciprocal": "Reciprocal", "sin": "Sin", "cos": "Cos", "tan": "Tan", "tanh": "Tanh", "erf": "Erf",
    "sigmoid": "Sigmoid", "relu": "Relu", "floor": "Floor", "ceil": "Ceil", "sign": "Sign",
    "sgn": "Sign", "asin": "Asin", "acos": "Acos", "atan": "Atan", "sinh": "Sinh", "cosh": "Cosh",
    "asinh": "Asinh", "acosh": "Acosh", "atanh": "Atanh", "silu": "Silu", "mish": "Mish",
    "hardswish": "HardSwish",
}.items():
    converts(f"aten.{_name}.default")(_unary(_op))

converts("aten.hardsigmoid.default")(_unary("HardSigmoid", {"alpha": 1.0 / 6, "beta": 0.5}))
converts("aten.isnan.default")(_unary("IsNaN", cast_input=False))
converts("aten.isinf.default")(_unary("IsInf", cast_input=False))


@converts("aten.round.default")
def _round(em, a):
    return em.op("Round", [a.self])


@converts("aten.round.decimals")
def _round_decimals(em, a):
    if a.decimals == 0:
        return em.op("Round", [a.self])
    t = em.type(a.self)
    scale = em.scalar(10.0 ** a.decimals, t.dtype)
    scaled = em.op("Round", [em.op("Mul", [a.self, scale], out=t)], out=t)
    return em.op("Div", [scaled, scale])


@converts("aten.gelu.default")
def _gelu(em, a):
    return em.op("Gelu", [a.self], {"approximate": a.approximate})


@converts("aten.leaky_relu.default")
def _leaky_relu(em, a):
    return em.op("LeakyRelu", [a.self], {"alpha": float(a.negative_slope)})


@converts("aten.elu.default")
def _elu(em, a):
    if a.scale != 1 or a.input_scale != 1:
        raise em.bad_attr("scale", (a.scale, a.input_scale), "only scale=input_scale=1 (plain ELU) is supported")
    return em.op("Elu", [a.self], {"alpha": float(a.alpha)})


@converts("aten.softplus.default")
def _softplus(em, a):
    # torch switches to the identity above `threshold`; there log1p(exp(x)) equals x to fp32 precision.
    t = em.type(a.self)
    if a.beta == 1:
        return em.op("Softplus", [a.self])
    beta = em.scalar(float(a.beta), t.dtype)
    sp = em.op("Softplus", [em.op("Mul", [a.self, beta], out=t)], out=t)
    return em.op("Div", [sp, beta])


@converts("aten.log1p.default")
def _log1p(em, a):
    out = em.out_type()
    x = em.cast(a.self, out.dtype)
    return em.op("Log", [em.op("Add", [x, em.scalar(1.0, out.dtype)], out=out)])


@converts("aten.expm1.default")
def _expm1(em, a):
    out = em.out_type()
    x = em.cast(a.self, out.dtype)
    return em.op("Sub", [em.op("Exp", [x], out=out), em.scalar(1.0, out.dtype)])


@converts("aten.log2.default")
def _log2(em, a):
    out = em.out_type()
    x = em.cast(a.self, out.dtype)
    return em.op("Div", [em.op("Log", [x], out=out), em.scalar(math.log(2.0), out.dtype)])


@converts("aten.logical_not.default")
def _logical_not(em, a):
    return em.op("Not", [em.cast(a.self, DType.bool)])


@converts("aten.bitwise_not.default")
def _bitwise_not(em, a):
    return em.op("Not" if em.dtype(a.self) is DType.bool else "BitwiseNot", [a.self])


def _binary(op: str) -> Converter:
    """Arithmetic: both operands are cast to the result dtype (torch type promotion)."""
    def convert(em: Emitter, a):
        dt = em.out_type().dtype
        return em.op(op, [em.operand(a.self, dt), em.operand(a.other, dt)])
    return convert


for _name, _op in {"maximum": "Max", "minimum": "Min"}.items():
    converts(f"aten.{_name}.default")(_binary(_op))


@converts("aten.mul.Tensor", "aten.mul.Scalar")
def _mul(em, a):
    dt = em.out_type().dtype
    return em.op("And" if dt is DType.bool else "Mul", [em.operand(a.self, dt), em.operand(a.other, dt)])


@converts("aten.fmod.Tensor", "aten.fmod.Scalar")
def _fmod(em, a):
    """C-style remainder: the result takes the dividend's sign."""
    dt = em.out_type().dtype
    return em.op("Mod", [em.operand(a.self, dt), em.operand(a.other, dt)], {"fmod": 1})


def _with_alpha(em: Emitter, v, alpha, dt: DType) -> str:
    v = em.operand(v, dt)
    if alpha == 1:
        return v
    return em.op("Mul", [v, em.scalar(py(alpha, dt), dt)], out=TensorType(em.shape(v), dt))


@converts("aten.add.Tensor", "aten.add.Scalar")
def _add(em, a):
    dt = em.out_type().dtype
    if dt is DType.bool:
        return em.op("Or", [em.operand(a.self, dt), em.operand(a.other, dt)])
    return em.op("Add", [em.operand(a.self, dt), _with_alpha(em, a.other, a.alpha, dt)])


@converts("aten.sub.Tensor", "aten.sub.Scalar")
def _sub(em, a):
    dt = em.out_type().dtype
    return em.op("Sub", [em.operand(a.self, dt), _with_alpha(em, a.other, a.alpha, dt)])


@converts("aten.rsub.Tensor", "aten.rsub.Scalar")
def _rsub(em, a):
    dt = em.out_type().dtype
    return em.op("Sub", [em.operand(a.other, dt), _with_alpha(em, a.self, a.alpha, dt)])


def _trunc(em: Emitter, q: str) -> str:
    """Round toward zero (ONNX has no Trunc): floor for q >= 0, ceil below."""
    t = em.type(q)
    neg = em.op("Less", [q, em.scalar(0.0, t.dtype)], out=TensorType(t.shape, DType.bool))
    return em.op("Where", [neg, em.op("Ceil", [q], out=t), em.op("Floor", [q], out=t)])


def _floor_div(em: Emitter, x: str, y: str) -> str:
    out = em.out_type()
    if out.dtype.is_float:
        return em.op("Floor", [em.op("Div", [x, y], out=out)])
    # Integers: x - mod(x, y) is an exact multiple of y, so the truncating Div is exact.
    m = em.op("Mod", [x, y], {"fmod": 0}, out=out)
    return em.op("Div", [em.op("Sub", [x, m], out=out), y])


@converts("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode",
          "aten.floor_divide.default", "aten.floor_divide.Scalar")
def _div(em, a):
    out = em.out_type()
    mode = getattr(a, "rounding_mode", None)
    if "floor_divide" in op_name(em.fx.target):
        mode = "floor"
    x, y = em.operand(a.self, out.dtype), em.operand(a.other, out.dtype)
    if mode == "floor":
        return _floor_div(em, x, y)
    if mode == "trunc" and out.dtype.is_float:
        return _trunc(em, em.op("Div", [x, y], out=out))
    return em.op("Div", [x, y])  # integer Div truncates (canonical semantics)


@converts("aten.remainder.Tensor", "aten.remainder.Scalar")
def _remainder(em, a):
    out = em.out_type()
    x, y = em.operand(a.self, out.dtype), em.operand(a.other, out.dtype)
    if not out.dtype.is_float:
        return em.op("Mod", [x, y], {"fmod": 0})
    # Python-style remainder for floats: x - floor(x / y) * y.
    q = em.op("Floor", [em.op("Div", [x, y], out=out)], out=out)
    return em.op("Sub", [x, em.op("Mul", [q, y], out=out)])


@converts("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def _pow(em, a):
    dt = em.out_type().dtype
    e = a.exponent
    if isinstance(a.self, str) and not isinstance(e, str):
        x = em.cast(a.self, dt)
        if e == 2:
            return em.op("Mul", [x, x])
        if e == 1:
            return x
        if e == 0.5 and dt.is_float:
            return em.op("Sqrt", [x])
    return em.op("Pow", [em.operand(a.self, dt), em.operand(e, dt)])


def _compare(op: str, negate: bool = False) -> Converter:
    def convert(em: Emitter, a):
        dt = DType.from_torch(torch.result_type(em.proto(a.self), em.proto(a.other)))
        ins = [em.operand(a.self, dt), em.operand(a.other, dt)]
        if not negate:
            return em.op(op, ins)
        return em.op("Not", [em.op(op, ins, out=em.out_type())])
    return convert


for _name, (_op, _neg) in {"eq": ("Equal", False), "ne": ("Equal", True), "lt": ("Less", False),
                           "le": ("LessOrEqual", False), "gt": ("Greater", False),
                           "ge": ("GreaterOrEqual", False)}.items():
    for _ov in ("Tensor", "Scalar"):
        converts(f"aten.{_name}.{_ov}")(_compare(_op, _neg))


def _logical(op: str) -> Converter:
    def convert(em: Emitter, a):
        return em.op(op, [em.operand(a.self, DType.bool), em.operand(a.other, DType.bool)])
    return convert


for _name, _op in {"and": "And", "or": "Or", "xor": "Xor"}.items():
    converts(f"aten.logical_{_name}.default")(_logical(_op))


def _bitwise(op: str) -> Converter:
    def convert(em: Emitter, a):
        dt = em.out_type().dtype
        name = {"BitwiseAnd": "And", "BitwiseOr": "Or", "BitwiseXor": "Xor"}[op] if dt is DType.bool else op
        return em.op(name, [em.operand(a.self, dt), em.operand(a.other, dt)])
    return convert


for _name, _op in {"and": "BitwiseAnd", "or": "BitwiseOr", "xor": "BitwiseXor"}.items():
    for _ov in ("Tensor", "Scalar"):
        converts(f"aten.bitwise_{_name}.{_ov}")(_bitwise(_op))


@converts("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(em, a):
    dt = em.out_type().dtype
    return em.op("Where", [em.cast(a.condition, DType.bool), em.operand(a.self, dt), em.operand(a.other, dt)])


@converts("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(em, a):
    dt = em.out_type().dtype
    return em.op("Where", [em.cast(a.mask, DType.bool), em.operand(a.value, dt), em.operand(a.self, dt)])


def _clip(em: Emitter, x, lo, hi) -> str:
    out = em.out_type()
    x = em.cast(x, out.dtype)
    tensor_bounds = isinstance(lo, str) or isinstance(hi, str)
    if not tensor_bounds:
        return em.op("Clip", [x, None if lo is None else em.scalar(py(lo, out.dtype), out.dtype),
                              None if hi is None else em.scalar(py(hi, out.dtype), out.dtype)])
    # Tensor bounds broadcast elementwise: Max then Min.
    if lo is not None:
        x = em.op("Max", [x, em.operand(lo, out.dtype)], out=out)
    if hi is not None:
        x = em.op("Min", [x, em.operand(hi, out.dtype)], out=out)
    return x


@converts("aten.clamp.default", "aten.clamp.Tensor")
def _clamp(em, a):
    return _clip(em, a.self, a.min, a.max)


@converts("aten.clamp_min.default", "aten.clamp_min.Tensor")
def _clamp_min(em, a):
    return _clip(em, a.self, a.min, None)


@converts("aten.clamp_max.default", "aten.clamp_max.Tensor")
def _clamp_max(em, a):
    return _clip(em, a.self, None, a.max)


@converts("aten.hardtanh.default")
def _hardtanh(em, a):
    return _clip(em, a.self, a.min_val, a.max_val)
