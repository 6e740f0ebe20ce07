"""Fission rules: normalization operators, built from sum-reductions and elementwise prims.

Statistics use the math dtype (fp32 for 16-bit inputs) and the corrected two-pass algorithm: a
first mean m = sum / n, then in one pass over the deviations d = x - m both Σd and Σd²; the mean is
m + Σd / n and the sum of squared deviations Σd² - (Σd)² / n (no cancellation as in E[x²] - E[x]²,
and a constant row has exactly its value as mean and 0 as variance, as torch and onnxruntime give:
sum / n alone is off by an ulp for a third of them, which 1/sqrt(eps) makes 1e-4); where Σd²
overflows (values near the dtype's largest) the variance is inf, and the row its bias, as torch and
onnxruntime give (the correction's own overflow made it inf - inf).  One final
broadcast prim normalizes, scales and shifts, rounding once to the input type.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from ..errors import UnsupportedAttribute, UnsupportedOperator
from ..ir.dtypes import DType
from ..ir.expr import Const, Expr, binary, cast, select, unary
from ..ir.graph import Node
from .common import acc_dtype, bcast, norm_axes, norm_axis
from .reduce import reduce_axes, reduce_over, stat_index
from .registry import Fission, TensorRef, rule

Index = Callable[[tuple], tuple]


def _square(v: Expr) -> Expr:
    return v * v


class Stat:
    """A per-statistic value given by an expression of reduction prims (no prim of its own: a
    normalization keeps as many prims as with a plain mean), indexed like a TensorRef."""

    def __init__(self, shape: tuple[int, ...], dtype: DType, at: Callable[[tuple], Expr]):
        self.shape, self.dtype, self._at = shape, dtype, at

    def __getitem__(self, idx: tuple) -> Expr:
        return self._at(idx)


def moments(fx: Fission, x: TensorRef, axes: Sequence[int], shape: Sequence[int] | None = None,
            index: Index | None = None) -> tuple[Stat, Stat, int]:
    """(mean, sum of squared deviations, count) of ``x`` over ``axes``, keepdims, in the math dtype
    (the corrected two-pass algorithm of the module docstring: three reduction prims).

    ``shape``/``index`` describe a view of ``x`` (GroupNormalization splits channels into groups):
    ``index`` maps a view index to an index of ``x``.
    """
    shape = tuple(shape or x.shape)
    index = index or (lambda idx: idx)
    md = acc_dtype(x.dtype)
    n = math.prod(shape[d] for d in axes)

    def val(idx: tuple) -> Expr:
        return cast(x[index(idx)], md)

    s = reduce_axes(fx, shape, axes, True, "sum", val)

    def dev(idx: tuple) -> Expr:          # the deviation from the first mean, sum / n
        return val(idx) - s[stat_index(idx, axes)] / float(n)

    d = reduce_axes(fx, shape, axes, True, "sum", dev)
    q = reduce_axes(fx, shape, axes, True, "sum", lambda idx: _square(dev(idx)))
    mean = Stat(s.shape, md, lambda i: s[i] / float(n) + d[i] / float(n))
    # (squared deviations past the dtype's range, values near its largest, sum to inf: the
    # variance is inf, as torch and onnxruntime give, not inf - inf; a NaN stays NaN)
    sq = Stat(s.shape, md, lambda i: select(binary("lt", q[i], Const(math.inf, md)),
                                            binary("max", q[i] - d[i] * d[i] / float(n), Const(0.0, md)), q[i]))
    return mean, sq, n


def inv_std(fx: Fission, sq: TensorRef | Stat, n: int, eps: float) -> TensorRef:
    """1 / sqrt(sq / n + eps) per statistic."""
    return fx.compute(sq.shape, lambda i: unary("rsqrt", sq[i] / float(n) + eps))


def _check_stash(node: Node) -> None:
    stash = node.attrs.get("stash_type", 1)
    if stash != 1:
        raise UnsupportedAttribute(node, "stash_type", stash, "only float32 statistics (stash_type=1) are supported")


def _as(fx: Fission, t: TensorRef | Stat, dtype: DType) -> TensorRef:
    if isinstance(t, TensorRef) and t.dtype is dtype:
        return t
    return fx.compute(t.shape, lambda i: cast(t[i], dtype))


def _channel(t: TensorRef | None, i: tuple, md: DType, default: float) -> Expr | float:
    """Per-channel parameter (shape [C]) at the channel of output index i; a missing one is a constant."""
    return default if t is None else cast(t[(i[1],)], md)


def _check_channels(node: Node, x: TensorRef, *params: TensorRef | None) -> None:
    for p in params:
        if p is not None and p.shape != (x.shape[1],):
            raise UnsupportedOperator(node, f"parameter {p.name} has shape {p.shape}, expected ({x.shape[1]},) "
                                      "(one entry per channel)")


@rule("LayerNormalization")
def layer_norm(fx: Fission, node: Node, ins: list) -> list:
    """(x - mean) / sqrt(var + eps) * scale + B over the axes from `axis` on; optional Mean and InvStdDev."""
    x, scale, bias = (list(ins) + [None, None])[:3]
    _check_stash(node)
    ax = norm_axis(node, node.attrs.get("axis", -1), x.rank)
    axes = tuple(range(ax, x.rank))
    md = acc_dtype(x.dtype)
    mean, sq, n = moments(fx, x, axes)
    inv = inv_std(fx, sq, n, node.attrs.get("epsilon", 1e-5))
    if len(node.outputs) > 1 and node.outputs[1]:     # the Mean output: a prim the normalization reads
        mean = _as(fx, mean, md)

    def y(i: tuple) -> Expr:
        si = stat_index(i, axes)
        v = (cast(x[i], md) - mean[si]) * inv[si]
        if scale is not None:
            v = v * cast(bcast(scale, i, x.shape), md)
        if bias is not None:
            v = v + cast(bcast(bias, i, x.shape), md)
        return cast(v, x.dtype)

    outs = [fx.compute(x.shape, y)]
    for k, stat in ((1, mean), (2, inv)):
        wanted = len(node.outputs) > k and node.outputs[k]
        outs.append(_as(fx, stat, fx.out_type(k).dtype) if wanted else None)
    return outs


@rule("RMSNormalization")
def rms_norm(fx: Fission, node: Node, ins: list) -> TensorRef:
    """x / sqrt(mean(x²) + eps) * scale over the axes from `axis` on."""
    x, scale = (list(ins) + [None])[:2]
    ax = norm_axis(node, node.attrs.get("axis", -1), x.rank)
    axes = tuple(range(ax, x.rank))
    md = acc_dtype(x.dtype)
    sq = reduce_over(fx, x, axes, True, "sum", lambda v: _square(cast(v, md)))
    inv = inv_std(fx, sq, math.prod(x.shape[d] for d in axes), node.attrs.get("epsilon", 1e-5))

    def y(i: tuple) -> Expr:
        v = cast(x[i], md) * inv[stat_index(i, axes)]
        return cast(v * cast(bcast(scale, i, x.shape), md) if scale is not None else v, x.dtype)

    return fx.compute(x.shape, y)


@rule("BatchNormalization")
def batch_norm(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Inference: (x - mean[c]) * (scale[c] / sqrt(var[c] + eps)) + B[c]."""
    x, scale, bias, mean, var = ins[:5]
    if node.attrs.get("training_mode", 0):
        raise UnsupportedAttribute(node, "training_mode", node.attrs["training_mode"], "inference only")
    _check_channels(node, x, scale, bias, mean, var)
    md = acc_dtype(x.dtype)
    eps = node.attrs.get("epsilon", 1e-5)
    # Per-channel multiplier first: C elements, folded to a constant when the parameters are.
    a = fx.compute((x.shape[1],), lambda c: unary("rsqrt", cast(var[c], md) + eps) * cast(scale[c], md))
    return fx.compute(x.shape, lambda i: cast((cast(x[i], md) - _channel(mean, i, md, 0.0)) * a[(i[1],)]
                                              + _channel(bias, i, md, 0.0), x.dtype))


def _normalize_groups(fx: Fission, node: Node, x: TensorRef, scale, bias, groups: int, eps: float) -> TensorRef:
    """Normalize x (N, C, ...) over each group of C/groups channels and all spatial positions,
    then apply per-channel scale and bias."""
    c = x.shape[1]
    cg = c // groups
    view = (x.shape[0], groups, cg) + x.shape[2:]
    axes = tuple(range(2, len(view)))
    md = acc_dtype(x.dtype)
    mean, sq, n = moments(fx, x, axes, view, lambda v: (v[0], v[1] * cg + v[2]) + v[3:])
    inv = inv_std(fx, sq, n, eps)

    def y(i: tuple) -> Expr:
        si = (i[0], i[1] // cg) + (0,) * (len(view) - 2)
        v = (cast(x[i], md) - mean[si]) * inv[si]
        return cast(v * _channel(scale, i, md, 1.0) + _channel(bias, i, md, 0.0), x.dtype)

    return fx.compute(x.shape, y)


@rule("InstanceNormalization")
def instance_norm(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Per (n, c) normalization over spatial axes, then per-channel scale and B."""
    x, scale, bias = ins[:3]
    _check_channels(node, x, scale, bias)
    return _normalize_groups(fx, node, x, scale, bias, x.shape[1], node.attrs.get("epsilon", 1e-5))


@rule("GroupNormalization")
def group_norm(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Normalization over groups of channels and spatial axes; per-channel scale and bias (opset 21)."""
    x, scale, bias = ins[:3]
    _check_stash(node)
    groups = node.attrs.get("num_groups")
    if not isinstance(groups, int) or groups < 1 or x.shape[1] % groups:
        raise UnsupportedAttribute(node, "num_groups", groups, f"must divide the {x.shape[1]} channels")
    _check_channels(node, x, scale, bias)
    return _normalize_groups(fx, node, x, scale, bias, groups, node.attrs.get("epsilon", 1e-5))


# p -> (per-element fn, norm from the reduced sum)
_LP = {1: (lambda v: unary("abs", v), lambda s: s), 2: (_square, lambda s: unary("sqrt", s))}


@rule("LpNormalization")
def lp_norm(fx: Fission, node: Node, ins: list) -> TensorRef:
    """x divided by its p-norm along `axis` (p = 1 or 2)."""
    x = ins[0]
    p = node.attrs.get("p", 2)
    if p not in _LP:
        raise UnsupportedAttribute(node, "p", p, "only p=1 and p=2 are defined")
    fn, finish = _LP[p]
    ax = (norm_axis(node, node.attrs.get("axis", -1), x.rank),)
    md = acc_dtype(x.dtype)
    s = reduce_over(fx, x, ax, True, "sum", lambda v: fn(cast(v, md)))

    def body(i):
        norm = finish(s[stat_index(i, ax)])
        # A zero vector stays zero (the ONNX conformance data), not 0/0.
        return cast(select(norm.eq(Const(0, md)), Const(0, md), cast(x[i], md) / norm), x.dtype)

    return fx.compute(x.shape, body)


@rule("LRN")
def lrn(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Cross-channel local response normalization: x / (bias + alpha/size * window sum of x²)^beta."""
    x = ins[0]
    size = node.attrs.get("size")
    if not isinstance(size, int) or size < 1:
        raise UnsupportedAttribute(node, "size", size, "must be a positive integer")
    alpha, beta, k = node.attrs.get("alpha", 1e-4), node.attrs.get("beta", 0.75), node.attrs.get("bias", 1.0)
    md = acc_dtype(x.dtype)
    front, c = (size - 1) // 2, x.shape[1]

    def window(i: tuple, r: tuple) -> Expr:
        ch = i[1] - front + r[0]
        inside = binary("and", ch.ge(0), ch.lt(c))
        return select(inside, _square(cast(x[(i[0], ch) + i[2:]], md)), 0.0)

    sq = fx.reduce(x.shape, (size,), "sum", window)
    return fx.compute(x.shape, lambda i: cast(cast(x[i], md) / (sq[i] * (alpha / size) + k) ** beta, x.dtype))


@rule("MeanVarianceNormalization")
def mean_variance_norm(fx: Fission, node: Node, ins: list) -> TensorRef:
    """(x - mean) / (sqrt(var) + 1e-9) over `axes` (ONNX's function body)."""
    x = ins[0]
    axes = norm_axes(node, node.attrs.get("axes", (0, 2, 3)), x.rank)
    md = acc_dtype(x.dtype)
    mean, sq, n = moments(fx, x, axes)
    inv = fx.compute(sq.shape, lambda i: 1.0 / (unary("sqrt", sq[i] / float(n)) + 1e-9))
    return fx.compute(x.shape, lambda i: cast((cast(x[i], md) - mean[stat_index(i, axes)]) * inv[stat_index(i, axes)],
                                              x.dtype))
