"""Triton spellings of the IR's types and operators (the expression translator's rule tables).

Semantics follow the reference executor (``ir/evaluate.py``) op for op: integer division truncates or floors as the IR says, ``max``/``min`` propagate
NaN as torch does, 16-bit floats are computed in fp32 where libdevice has no 16-bit entry point
and rounded back (what torch does on CPU).  ``{x}``, ``{a}``, ``{b}`` are operands, ``{t}`` the
result type, ``{f}`` the fmod of the operands.
"""
from __future__ import annotations

from ...ir.dtypes import DType

TL = {DType.float64: "tl.float64", DType.float32: "tl.float32", DType.float16: "tl.float16",
      DType.bfloat16: "tl.bfloat16", DType.int64: "tl.int64", DType.int32: "tl.int32",
      DType.int16: "tl.int16", DType.int8: "tl.int8", DType.uint8: "tl.uint8", DType.bool: "tl.int1"}
HALF = (DType.float16, DType.bfloat16)
LIBDEVICE = "from triton.language.extra import libdevice"

# Unary ops on floats.  ``{x}`` is the operand; 16-bit floats are computed in fp32 and rounded
# back (what torch does on CPU), since libdevice has no 16-bit entry points.
UNARY = {
    "neg": "-{x}", "abs": "tl.abs({x})", "exp": "tl.exp({x})", "exp2": "tl.exp2({x})", "log": "tl.log({x})",
    "sqrt": "tl.sqrt({x})", "rsqrt": "tl.rsqrt({x})", "sin": "tl.sin({x})", "cos": "tl.cos({x})",
    "tan": "libdevice.tan({x})", "asin": "libdevice.asin({x})", "acos": "libdevice.acos({x})",
    "atan": "libdevice.atan({x})", "sinh": "libdevice.sinh({x})", "cosh": "libdevice.cosh({x})",
    "tanh": "libdevice.tanh({x})", "asinh": "libdevice.asinh({x})", "acosh": "libdevice.acosh({x})",
    "atanh": "libdevice.atanh({x})", "erf": "libdevice.erf({x})", "sigmoid": "1.0 / (1.0 + tl.exp(-{x}))",
    "floor": "tl.floor({x})", "ceil": "tl.ceil({x})",
    "round": "libdevice.rint({x})",          # half to even, as torch.round
    "trunc": "libdevice.trunc({x})",
    "sign": "tl.where({x} > 0, 1.0, tl.where({x} < 0, -1.0, 0.0))",     # sign(nan) = 0, as torch
    "reciprocal": "1.0 / {x}", "isnan": "{x} != {x}", "isinf": "({x} == {x}) & ({x} - {x} != {x} - {x})",
    "log1p": "libdevice.log1p({x})", "expm1": "libdevice.expm1({x})",
    "not": "{x} == 0",
}
UNARY_NATIVE_HALF = frozenset({"neg", "abs", "isnan", "isinf", "sign", "not"})
# Unary ops on integers (and bool) where they differ from the float rule.
UNARY_INT = {
    "floor": "{x}", "ceil": "{x}", "round": "{x}", "trunc": "{x}",
    "sign": "tl.where({x} > 0, 1, tl.where({x} < 0, -1, 0))",
    "isnan": "{x} != {x}", "isinf": "{x} != {x}",
}

# Binary ops: (float rule, integer rule).  Integer division floors/truncates as Python/C would.
BINARY = {
    "add": ("{a} + {b}",) * 2, "sub": ("{a} - {b}",) * 2, "mul": ("{a} * {b}",) * 2,
    "div": ("{a} / {b}", "{a} // {b}"),                   # Triton's integer // truncates, like C
    "floordiv": ("tl.floor({a} / {b})",
                 "{a} // {b} - ((({a} % {b}) != 0) & (({a} < 0) != ({b} < 0))).to({t})"),
    "mod": ("tl.where(({f} != 0) & (({f} < 0) != ({b} < 0)), {f} + {b}, {f})",   # {f}: fmod(a, b); exact,
                                                                              # and right for b = ±inf
            "{a} % {b} + tl.where((({a} % {b}) != 0) & (({a} % {b} < 0) != ({b} < 0)), {b}, 0)"),
    "fmod": ("libdevice.fmod({a}, {b})", "{a} % {b}"),     # dividend's sign
    "pow": ("libdevice.pow({a}, {b})",
            # (tl.cast: an operand may be a literal, which has no .to)
            "libdevice.pow(tl.cast({a}, tl.float64), tl.cast({b}, tl.float64)).to({t})"),
    "max": ("tl.maximum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)", "tl.maximum({a}, {b})"),
    "min": ("tl.minimum({a}, {b}, propagate_nan=tl.PropagateNan.ALL)", "tl.minimum({a}, {b})"),
    "lt": ("{a} < {b}",) * 2, "le": ("{a} <= {b}",) * 2, "gt": ("{a} > {b}",) * 2,
    "ge": ("{a} >= {b}",) * 2, "eq": ("{a} == {b}",) * 2, "ne": ("{a} != {b}",) * 2,
    "and": ("{a} & {b}",) * 2, "or": ("{a} | {b}",) * 2, "xor": ("{a} ^ {b}",) * 2,
    "bitand": ("{a} & {b}",) * 2, "bitor": ("{a} | {b}",) * 2, "bitxor": ("{a} ^ {b}",) * 2,
    "shl": ("{a} << {b}",) * 2, "shr": ("{a} >> {b}",) * 2,
}
BINARY_F32 = frozenset({"fmod", "pow", "mod"})          # libdevice: no 16-bit entry points
BOOL_BINARY = {"max": "{a} | {b}", "min": "{a} & {b}"}
INT_DIVISION = frozenset({"div", "floordiv", "mod", "fmod"})
COMPARE = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})

# Reductions: tile reduced along one dimension (keeping it, size 1), and the elementwise combine of
# an accumulator with a tile.  Float max/min go through helpers that propagate NaN (tl.max and
# tl.maximum's default drop it; torch keeps it).
REDUCE_FLOAT = {"sum": "tl.sum({v}, {d}, keep_dims=True)", "prod": "tl.reduce({v}, {d}, _mul, keep_dims=True)",
                "max": "tl.reduce({v}, {d}, _maximum, keep_dims=True)",
                "min": "tl.reduce({v}, {d}, _minimum, keep_dims=True)"}
REDUCE_INT = REDUCE_FLOAT | {"max": "tl.max({v}, {d}, keep_dims=True)", "min": "tl.min({v}, {d}, keep_dims=True)"}
COMBINE_FLOAT = {"sum": "{a} + {b}", "prod": "{a} * {b}", "max": "_maximum({a}, {b})", "min": "_minimum({a}, {b})"}
COMBINE_INT = COMBINE_FLOAT | {"max": "tl.maximum({a}, {b})", "min": "tl.minimum({a}, {b})"}
# bool sum/prod are any/all (the reference reduces as int64 and compares with 0).
BOOL_COMBINER = {"sum": "max", "prod": "min", "max": "max", "min": "min"}

# NaN-propagating combiners for tl.reduce and the accumulators above; a kernel carries those it calls
HELPERS = {
    "_mul": "@triton.jit\ndef _mul(a, b):\n    return a * b\n",
    "_maximum": "@triton.jit\ndef _maximum(a, b):\n    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)\n",
    "_minimum": "@triton.jit\ndef _minimum(a, b):\n    return tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)\n",
}
