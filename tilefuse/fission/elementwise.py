"""Fission rules: elementwise operators (arithmetic, comparison, logic, math, activations, casts).

One table maps each operator to an expression builder ``fn(node, *operands) -> Expr`` (an omitted
optional operand is None); one generic rule loads the broadcast operands and emits a single prim.
16-bit float operands are widened to fp32 for the math and the result is rounded once to the
operator's type, as torch's own fp16 kernels do; ops exact in any dtype (compare, select, min/max,
rounding, casts) are marked ``exact`` and skip the widening.
"""
from __future__ import annotations

import functools
import math
import operator
from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import UnsupportedAttribute
from ..ir.dtypes import DType, promote
from ..ir.expr import Const, Expr, binary, cast, maximum, minimum, select, unary
from ..ir.graph import Node
from .common import acc_dtype, bcast, broadcast_shape
from .registry import Fission, TensorRef, rule


@dataclass(frozen=True)
class Ew:
    fn: Callable[..., Expr]
    doc: str
    exact: bool = False     # exact in any dtype: no fp32 widening of 16-bit floats


# ---------------------------------------------------------------- expression builders

def softplus(x: Expr) -> Expr:
    """log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|))."""
    return maximum(x, 0) + unary("log1p", unary("exp", -unary("abs", x)))


def hard_sigmoid(x: Expr, alpha: float, beta: float) -> Expr:
    return maximum(minimum(x * alpha + beta, 1), 0)


def gelu(x: Expr, approximate: str = "none") -> Expr:
    if approximate == "tanh":
        inner = (x + x * x * x * 0.044715) * math.sqrt(2 / math.pi)
        return x * 0.5 * (unary("tanh", inner) + 1)
    return x * 0.5 * (unary("erf", x * (1 / math.sqrt(2))) + 1)


def _gelu(node: Node, x: Expr) -> Expr:
    approx = node.attrs.get("approximate", "none")
    if approx not in ("none", "tanh"):
        raise UnsupportedAttribute(node, "approximate", approx, "expected 'none' or 'tanh'")
    return gelu(x, approx)


def _pow(node: Node, base: Expr, exp: Expr) -> Expr:
    # ONNX Pow allows different base/exponent types; the result has the base's type.  An integer
    # base with a float exponent is computed in float64 (as ONNX's reference does) to keep it exact.
    t = promote(base.dtype, exp.dtype)
    if base.dtype.is_int and t.is_float:
        t = DType.float64
    return cast(binary("pow", cast(base, t), cast(exp, t)), base.dtype)


def _shrink(node: Node, x: Expr) -> Expr:
    lambd, bias = node.attrs.get("lambd", 0.5), node.attrs.get("bias", 0.0)
    # Float attributes on integer inputs: compare and shift in float64, then truncate back.
    v = x if x.dtype.is_float else cast(x, DType.float64)
    out = select(v.lt(-lambd), v + bias, select(v.gt(lambd), v - bias, 0))
    return cast(out, x.dtype)


# (detect_positive, detect_negative) -> test
_ISINF = {
    (1, 1): lambda x: unary("isinf", x),
    (1, 0): lambda x: x.eq(math.inf),
    (0, 1): lambda x: x.eq(-math.inf),
    (0, 0): lambda x: Const(False, DType.bool),
}


def _isinf(node: Node, x: Expr) -> Expr:
    key = (int(bool(node.attrs.get("detect_positive", 1))), int(bool(node.attrs.get("detect_negative", 1))))
    return _ISINF[key](x)


def _clip(node: Node, x: Expr, lo: Expr | None = None, hi: Expr | None = None) -> Expr:
    if lo is not None:
        x = maximum(x, lo)
    if hi is not None:
        x = minimum(x, hi)
    return x


_SHIFT = {"LEFT": "shl", "RIGHT": "shr"}


def _bitshift(node: Node, x: Expr, n: Expr) -> Expr:
    d = node.attrs.get("direction")
    if d not in _SHIFT:
        raise UnsupportedAttribute(node, "direction", d, "expected 'LEFT' or 'RIGHT'")
    return binary(_SHIFT[d], x, n)


def _bitwise_not(node: Node, x: Expr) -> Expr:
    if x.dtype is DType.bool:
        return unary("not", x)
    ones = torch.iinfo(x.dtype.to_torch()).max if x.dtype is DType.uint8 else -1
    return binary("bitxor", x, Const(ones, x.dtype))


def cast_target(node: Node) -> DType:
    """The DType named by a Cast's ONNX ``to`` attribute."""
    to = node.attrs.get("to")
    try:
        return DType.from_onnx(to)
    except TypeError:
        supported = ", ".join(f"{d.to_onnx()}={d.value}" for d in DType)
        raise UnsupportedAttribute(node, "to", to, f"ONNX element type not supported (supported: {supported})") \
            from None


def _attr(name: str, default: float) -> Callable[[Node], float]:
    return lambda node: node.attrs.get(name, default)


_alpha = _attr("alpha", 1.0)
_SELU_ALPHA, _SELU_GAMMA = 1.67326319217681884765625, 1.05070102214355468750

_UNARY = {
    "Neg": "neg", "Abs": "abs", "Reciprocal": "reciprocal", "Sqrt": "sqrt", "Exp": "exp", "Log": "log",
    "Sin": "sin", "Cos": "cos", "Tan": "tan", "Asin": "asin", "Acos": "acos", "Atan": "atan",
    "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh", "Erf": "erf",
    "Sigmoid": "sigmoid", "Tanh": "tanh", "Rsqrt": "rsqrt",
    "Floor": "floor", "Ceil": "ceil", "Round": "round", "Sign": "sign", "IsNaN": "isnan", "Not": "not",
}
_UNARY_EXACT = {"Neg", "Abs", "Floor", "Ceil", "Round", "Sign", "IsNaN", "Not"}

_BINARY = {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div",
    "Equal": "eq", "Less": "lt", "Greater": "gt", "LessOrEqual": "le", "GreaterOrEqual": "ge",
    "And": "and", "Or": "or", "Xor": "xor",
    "BitwiseAnd": "bitand", "BitwiseOr": "bitor", "BitwiseXor": "bitxor",
}
_BINARY_EXACT = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor",
                 "BitwiseAnd", "BitwiseOr", "BitwiseXor"}

ELEMENTWISE: dict[str, Ew] = {
    **{op: Ew(lambda node, x, p=p: unary(p, x), f"{p}(x)", op in _UNARY_EXACT) for op, p in _UNARY.items()},
    **{op: Ew(lambda node, a, b, p=p: binary(p, a, b), f"{p}(a, b) with broadcasting", op in _BINARY_EXACT)
       for op, p in _BINARY.items()},
    "Pow": Ew(_pow, "a ** b computed in the wider of the two types, result in the base's type"),
    "Mod": Ew(lambda node, a, b: binary("fmod" if node.attrs.get("fmod", 0) else "mod", a, b),
              "remainder: sign of the divisor (fmod=0) or of the dividend (fmod=1)"),
    "IsInf": Ew(_isinf, "x == +inf and/or x == -inf (detect_positive/detect_negative)", True),
    "BitShift": Ew(_bitshift, "x << n or x >> n (direction)", True),
    "BitwiseNot": Ew(_bitwise_not, "x xor all-ones (logical not for bool)", True),
    "Where": Ew(lambda node, c, a, b: select(c, a, b), "select(cond, a, b) with three-way broadcasting", True),
    "Cast": Ew(lambda node, x: cast(x, cast_target(node)),
               "cast to the ONNX type `to` (float to int truncates, nonzero to bool is True)", True),
    "Clip": Ew(_clip, "min(max(x, min), max) with optional bounds", True),
    "Max": Ew(lambda node, *xs: functools.reduce(maximum, xs), "max of n broadcast inputs", True),
    "Min": Ew(lambda node, *xs: functools.reduce(minimum, xs), "min of n broadcast inputs", True),
    "Sum": Ew(lambda node, *xs: functools.reduce(operator.add, xs), "sum of n broadcast inputs"),
    "Mean": Ew(lambda node, *xs: functools.reduce(operator.add, xs) / float(len(xs)), "mean of n broadcast inputs"),
    "Relu": Ew(lambda node, x: maximum(x, 0), "max(x, 0)", True),
    "LeakyRelu": Ew(lambda node, x: select(x.lt(0), x * node.attrs.get("alpha", 0.01), x), "x < 0 ? alpha*x : x"),
    "PRelu": Ew(lambda node, x, s: select(x.lt(0), x * s, x), "x < 0 ? slope*x : x (slope broadcast)"),
    "Elu": Ew(lambda node, x: select(x.lt(0), unary("expm1", x) * _alpha(node), x), "x < 0 ? alpha*(exp(x)-1) : x"),
    "Selu": Ew(lambda node, x: select(x.gt(0), x, unary("expm1", x) * node.attrs.get("alpha", _SELU_ALPHA))
               * node.attrs.get("gamma", _SELU_GAMMA), "gamma * (x > 0 ? x : alpha*(exp(x)-1))"),
    "Celu": Ew(lambda node, x: maximum(x, 0) + minimum(unary("expm1", x / _alpha(node)) * _alpha(node), 0),
               "max(x, 0) + min(alpha*(exp(x/alpha)-1), 0)"),
    "Gelu": Ew(_gelu, "x*Phi(x) via erf, or the tanh approximation"),
    "Silu": Ew(lambda node, x: x * unary("sigmoid", x), "x * sigmoid(x)"),
    "Mish": Ew(lambda node, x: x * unary("tanh", softplus(x)), "x * tanh(softplus(x)), softplus in stable form"),
    "Softplus": Ew(lambda node, x: softplus(x), "log(1+exp(x)) as max(x,0) + log1p(exp(-abs(x))) (stable)"),
    "Softsign": Ew(lambda node, x: x / (unary("abs", x) + 1), "x / (1 + abs(x))"),
    "HardSigmoid": Ew(lambda node, x: hard_sigmoid(x, node.attrs.get("alpha", 0.2), node.attrs.get("beta", 0.5)),
                      "max(0, min(1, alpha*x + beta))"),
    "HardSwish": Ew(lambda node, x: x * hard_sigmoid(x, 1 / 6, 0.5), "x * max(0, min(1, x/6 + 1/2))"),
    "ThresholdedRelu": Ew(lambda node, x: select(x.gt(_alpha(node)), x, 0), "x > alpha ? x : 0"),
    "Shrink": Ew(_shrink, "x < -lambd ? x+bias : x > lambd ? x-bias : 0"),
}


# ---------------------------------------------------------------- the generic rule

def _apply(fx: Fission, node: Node, ins: list, spec: Ew) -> TensorRef:
    present = [x for x in ins if x is not None]
    shape = broadcast_shape(node, *(x.shape for x in present))
    first = ins[0].dtype
    narrow = not spec.exact and acc_dtype(first) is not first

    def operand(x: TensorRef | None, i: tuple) -> Expr | None:
        if x is None:
            return None
        v = bcast(x, i, shape)
        return v if spec.exact else cast(v, acc_dtype(v.dtype))

    def body(i: tuple) -> Expr:
        out = spec.fn(node, *(operand(x, i) for x in ins))
        return cast(out, first) if narrow and out.dtype is DType.float32 else out

    return fx.compute(shape, body)


def _register(op: str, spec: Ew) -> None:
    def fission_rule(fx: Fission, node: Node, ins: list) -> TensorRef:
        return _apply(fx, node, ins, spec)
    fission_rule.__doc__ = f"Elementwise {spec.doc}."
    fission_rule.__name__ = f"fission_{op}"
    rule(op)(fission_rule)


for _op, _spec in ELEMENTWISE.items():
    _register(_op, _spec)


@rule("CastLike")
def cast_like(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Cast to the element type of the second input (which is not read)."""
    x, like = ins
    return fx.compute(x.shape, lambda i: cast(x[i], like.dtype))


@rule("Identity")
def identity(fx: Fission, node: Node, ins: list) -> TensorRef:
    """The input itself: no prim."""
    return ins[0]


@rule("Dropout")
def dropout(fx: Fission, node: Node, ins: list) -> list:
    """Inference: the input itself; the optional mask output is all True."""
    x = ins[0]
    mask = fx.compute(x.shape, lambda i: Const(True, DType.bool)) if len(node.outputs) > 1 and node.outputs[1] else None
    return [x, mask]
