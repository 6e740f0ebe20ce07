"""Fission rules: linear quantization and integer contractions.

(De)quantization is elementwise with a scale and zero point per tensor, per channel along ``axis``
or per block of ``block_size`` along it.  Integer contractions (MatMulInteger, ConvInteger and the
QLinear forms) subtract the zero points in int32 and contract exactly in int32; the QLinear forms
then requantize the int32 sum in float64, as ONNX's reference does (an int32 times a float32
scale is a float64 product in numpy), so the rounding agrees at half-way points.
"""
from __future__ import annotations

from typing import Callable

from ..errors import UnsupportedAttribute
from ..ir.dtypes import DType
from ..ir.expr import Expr, cast, maximum, minimum, unary
from ..ir.graph import Node
from .common import norm_axis
from .conv import conv
from .linear import matmul
from .registry import Fission, TensorRef, rule

# Saturation range of each quantized integer type.
QRANGE = {DType.uint8: (0, 255), DType.int8: (-128, 127), DType.int16: (-32768, 32767),
          DType.int32: (-2 ** 31, 2 ** 31 - 1)}


def param_index(node: Node, x_shape: tuple, p: TensorRef, axis: int, block: int) -> Callable[[tuple], tuple]:
    """Index of a scale/zero-point ``p`` seen from an index of x: per tensor, per ``axis`` or per block."""
    if p.rank == 0 or p.shape == (1,) and block == 0:
        return lambda i: (0,) * p.rank
    if block > 0:
        if p.rank != len(x_shape) or p.shape[axis] != -(-x_shape[axis] // block):
            raise UnsupportedAttribute(node, "block_size", block, f"scale of shape {p.shape} for input {x_shape}")
        return lambda i: tuple(v // block if d == axis else v for d, v in enumerate(i))
    if p.rank != 1 or p.shape[0] != x_shape[axis]:
        raise UnsupportedAttribute(node, "axis", axis, f"scale of shape {p.shape} for input {x_shape}")
    return lambda i: (i[axis],)


def _layout(node: Node, x: TensorRef, scale: TensorRef) -> tuple[int, int]:
    """(axis, block_size); the axis matters (and must exist) only for a scale per axis or block."""
    per_tensor = scale.rank == 0 or scale.shape == (1,) and not node.attrs.get("block_size", 0)
    axis = 0 if per_tensor else norm_axis(node, int(node.attrs.get("axis", 1)), x.rank)
    return axis, int(node.attrs.get("block_size", 0))


def saturate(v: Expr, dtype: DType) -> Expr:
    """Round half to even, clamp to ``dtype``'s range, convert."""
    lo, hi = QRANGE[dtype]
    return cast(minimum(maximum(unary("round", v), lo), hi), dtype)


@rule("DequantizeLinear")
def dequantize_linear(fx: Fission, node: Node, ins: list) -> TensorRef:
    """(x - zero_point) · scale in fp32, per tensor, axis or block; the result in the output type."""
    x, scale, zp = (list(ins) + [None])[:3]
    axis, block = _layout(node, x, scale)
    si = param_index(node, x.shape, scale, axis, block)
    zi = param_index(node, x.shape, zp, axis, block) if zp is not None else None
    f32, out = DType.float32, fx.out_type().dtype

    def body(i):
        v = cast(x[i], f32) if zi is None else cast(x[i], f32) - cast(zp[zi(i)], f32)
        return cast(v * cast(scale[si(i)], f32), out)
    return fx.compute(x.shape, body)


@rule("QuantizeLinear")
def quantize_linear(fx: Fission, node: Node, ins: list) -> TensorRef:
    """saturate(round(x / scale) + zero_point), per tensor, axis or block (round half to even)."""
    x, scale, zp = (list(ins) + [None])[:3]
    out = fx.out_type().dtype
    if out not in QRANGE:
        raise UnsupportedAttribute(node, "output_dtype", out.value, "quantizing to a float type is not supported")
    axis, block = _layout(node, x, scale)
    si = param_index(node, x.shape, scale, axis, block)
    zi = param_index(node, x.shape, zp, axis, block) if zp is not None else None
    precision = node.attrs.get("precision")
    math = DType.from_onnx(precision) if precision else x.dtype if x.dtype == scale.dtype else DType.float32

    def body(i):
        q = unary("round", cast(x[i], math) / cast(scale[si(i)], math))
        if zi is not None:
            q = cast(q, DType.float32) + cast(zp[zi(i)], DType.float32)
        return saturate(cast(q, DType.float32), out)
    return fx.compute(x.shape, body)


def _centered(fx: Fission, x: TensorRef, zp: TensorRef | None, axis: int) -> TensorRef:
    """x - zero_point in int32; a 1-D zero point applies along ``axis`` of x."""
    i32 = DType.int32
    if zp is None:
        return fx.compute(x.shape, lambda i: cast(x[i], i32))
    pick = (lambda i: (0,) * zp.rank) if zp.rank == 0 or zp.shape == (1,) else (lambda i: (i[axis],))
    return fx.compute(x.shape, lambda i: cast(x[i], i32) - cast(zp[pick(i)], i32))


@rule("MatMulInteger")
def matmul_integer(fx: Fission, node: Node, ins: list) -> TensorRef:
    """(A - a_zero_point) · (B - b_zero_point) in int32: centering prims, one int32 contraction."""
    a, b, azp, bzp = (list(ins) + [None, None])[:4]
    return matmul(fx, node, [_centered(fx, a, azp, a.rank - 2), _centered(fx, b, bzp, b.rank - 1)])


@rule("ConvInteger")
def conv_integer(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Convolution of (x - x_zero_point) and (w - w_zero_point, per output channel) in int32."""
    x, w, xzp, wzp = (list(ins) + [None, None])[:4]
    return conv(fx, node, [_centered(fx, x, xzp, 1), _centered(fx, w, wzp, 0)])


def requantize(fx: Fission, acc: TensorRef, scales: list[tuple[TensorRef, Callable]], y_scale: TensorRef,
               yzp: TensorRef | None, out: DType) -> TensorRef:
    """saturate(acc · (s1 · s2 / y_scale) + y_zero_point): the multiplier in fp32, the product in fp64."""
    f32, f64 = DType.float32, DType.float64

    def body(i):
        mult = cast(scales[0][0][scales[0][1](i)], f32) * cast(scales[1][0][scales[1][1](i)], f32)
        mult = mult / cast(y_scale[(0,) * y_scale.rank], f32)
        v = cast(acc[i], f64) * cast(mult, f64)
        if yzp is not None:
            v = v + cast(yzp[(0,) * yzp.rank], f64)
        return saturate(v, out)
    return fx.compute(acc.shape, body)


def _per(p: TensorRef, axis_of: Callable[[tuple], Expr]) -> tuple[TensorRef, Callable]:
    """A scale per tensor, or per the output axis ``axis_of`` picks."""
    return p, ((lambda i: (0,) * p.rank) if p.rank == 0 or p.shape == (1,) else (lambda i: (axis_of(i),)))


@rule("QLinearMatMul")
def qlinear_matmul(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Quantized MatMul: an int32 contraction of the centered operands, requantized (scales per row of
    A, per column of B)."""
    a, a_s, azp, b, b_s, bzp, y_s, yzp = ins
    acc = matmul(fx, node, [_centered(fx, a, azp, a.rank - 2), _centered(fx, b, bzp, b.rank - 1)],
                 dtype=DType.int32)
    return requantize(fx, acc, [_per(a_s, lambda i: i[-2]), _per(b_s, lambda i: i[-1])], y_s, yzp,
                      fx.out_type().dtype)


@rule("QLinearConv")
def qlinear_conv(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Quantized Conv: an int32 convolution of the centered operands plus the int32 bias, requantized
    (weight scale per output channel)."""
    x, x_s, xzp, w, w_s, wzp, y_s, yzp = ins[:8]
    bias = ins[8] if len(ins) > 8 else None
    acc = conv(fx, node, [_centered(fx, x, xzp, 1), _centered(fx, w, wzp, 0), bias], dtype=DType.int32)
    return requantize(fx, acc, [_per(x_s, lambda i: i[1]), _per(w_s, lambda i: i[1])], y_s, yzp,
                      fx.out_type().dtype)
