"""Fission rules: reductions, arg-reductions, softmax family, cumulative sums and products.

The builders here (``reduce_axes``, ``reduce_over``, ``softmax``, ``log_softmax``, ``argreduce``)
are public so that normalization, attention and pooling rules reuse them.  Statistics that feed
later arithmetic are kept in fp32 for 16-bit inputs (``acc_dtype``); a reduce prim whose output is
itself 16-bit accumulates in fp32 anyway (executor semantics).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from ..errors import UnsupportedAttribute, UnsupportedOperator
from ..ir.dtypes import DType
from ..ir.expr import Const, Expr, binary, cast, select, unary
from ..ir.graph import Node
from .common import acc_dtype, norm_axes, norm_axis
from .registry import Fission, TensorRef, rule


# ---------------------------------------------------------------- index helpers

def reduced_shape(shape: Sequence[int], axes: Sequence[int], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if d in axes else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in axes)


def stat_index(idx: tuple, axes: Sequence[int]) -> tuple:
    """Index of a keepdims statistic seen from a full index: reduced axes read element 0."""
    return tuple(0 if d in axes else v for d, v in enumerate(idx))


def keep_index(out_idx: tuple, axes: Sequence[int], rank: int, keepdims: bool) -> tuple:
    """Index of a keepdims statistic seen from an output index with or without the reduced axes."""
    if keepdims:
        return stat_index(out_idx, axes)
    it = iter(out_idx)
    return tuple(0 if d in axes else next(it) for d in range(rank))


def reduce_axes(fx: Fission, shape: Sequence[int], axes: Sequence[int], keepdims: bool, combiner: str,
                body: Callable[[tuple], Expr]) -> TensorRef:
    """``out = combine over axes of body(idx)``, ``idx`` indexing the full (unreduced) ``shape``.

    ``axes`` are non-negative and non-empty; the output keeps them as size-1 dims when ``keepdims``.
    """
    axes = tuple(sorted(axes))
    kept = [d for d in range(len(shape)) if d not in axes]

    def fn(i: tuple, r: tuple) -> Expr:
        idx: list = [None] * len(shape)
        for k, d in enumerate(axes):
            idx[d] = r[k]
        for k, d in enumerate(kept):
            idx[d] = i[d] if keepdims else i[k]
        return body(tuple(idx))

    return fx.reduce(reduced_shape(shape, axes, keepdims), [shape[d] for d in axes], combiner, fn)


def reduce_over(fx: Fission, x: TensorRef, axes: Sequence[int], keepdims: bool, combiner: str,
                fn: Callable[[Expr], Expr] | None = None) -> TensorRef:
    """``combine over axes of fn(x[idx])`` (fn defaults to the identity; it decides the dtype)."""
    f = fn or _same
    return reduce_axes(fx, x.shape, axes, keepdims, combiner, lambda idx: f(x[idx]))


def _same(v: Expr) -> Expr:
    return v


def _wide(e: Expr) -> Expr:
    return cast(e, acc_dtype(e.dtype))


# ---------------------------------------------------------------- softmax family

def softmax(fx: Fission, x: TensorRef, axis: int) -> TensorRef:
    """Stable softmax along ``axis``: max, exp(x - max), sum, divide (fp32 math for 16-bit x)."""
    ax = (axis % x.rank,)
    m = reduce_over(fx, x, ax, True, "max")
    e = fx.compute(x.shape, lambda i: unary("exp", _wide(x[i]) - _wide(m[stat_index(i, ax)])))
    s = reduce_over(fx, e, ax, True, "sum")
    return fx.compute(x.shape, lambda i: cast(e[i] / s[stat_index(i, ax)], x.dtype))


def log_softmax(fx: Fission, x: TensorRef, axis: int) -> TensorRef:
    """Stable log-softmax along ``axis``: d = x - max, d - log(sum(exp(d)))."""
    ax = (axis % x.rank,)
    m = reduce_over(fx, x, ax, True, "max")
    d = fx.compute(x.shape, lambda i: _wide(x[i]) - _wide(m[stat_index(i, ax)]))
    s = reduce_over(fx, d, ax, True, "sum", lambda v: unary("exp", v))
    return fx.compute(x.shape, lambda i: cast(d[i] - unary("log", s[stat_index(i, ax)]), x.dtype))


def argreduce(fx: Fission, x: TensorRef, axis: int, keepdims: bool, largest: bool, last: bool) -> TensorRef:
    """Index (int64) of the first (or last) max/min along ``axis``, without an opaque prim:
    m = max|min x, then min (max for ``last``) over ``select(x == m, index, sentinel)``."""
    ax = (axis % x.rank,)
    m = reduce_over(fx, x, ax, True, "max" if largest else "min")
    n = x.shape[ax[0]]

    def hit(idx: tuple) -> Expr:
        v = x[idx]
        eq = v.eq(m[stat_index(idx, ax)])
        # A NaN is the extreme (m is NaN then), as in torch.
        return binary("or", eq, unary("isnan", v)) if v.dtype.is_float else eq

    return reduce_axes(fx, x.shape, ax, keepdims, "max" if last else "min",
                       lambda idx: select(hit(idx), idx[ax[0]], -1 if last else n))


# ---------------------------------------------------------------- ONNX Reduce*

def _square(v: Expr) -> Expr:
    return v * v


# op -> (combiner, per-element fn, finish(acc, count), doc); a finish needs a second prim.
_REDUCE: dict[str, tuple[str, Callable | None, Callable | None, str]] = {
    "ReduceSum": ("sum", None, None, "sum"),
    "ReduceMean": ("sum", None, lambda s, n: s / n, "mean (sum, then divide)"),
    "ReduceMax": ("max", None, None, "max"),
    "ReduceMin": ("min", None, None, "min"),
    "ReduceProd": ("prod", None, None, "product"),
    "ReduceL1": ("sum", lambda v: unary("abs", v), None, "sum of abs(x)"),
    "ReduceL2": ("sum", _square, lambda s, n: unary("sqrt", s), "sqrt of the sum of squares"),
    "ReduceSumSquare": ("sum", _square, None, "sum of squares"),
    "ReduceLogSum": ("sum", None, lambda s, n: unary("log", s), "log of the sum"),
}
# A finish that is not exact in integers runs in float64 for integer inputs.
_FLOAT_FINISH = {"ReduceL2", "ReduceLogSum", "ReduceLogSumExp"}


def reduce_attrs(node: Node, rank: int) -> tuple[tuple[int, ...], bool]:
    """(normalized axes, keepdims); empty axes mean a no-op (noop_with_empty_axes=1 or rank 0)."""
    axes = tuple(node.attrs.get("axes", ()) or ())
    keepdims = bool(node.attrs.get("keepdims", 1))
    if not axes:
        return ((), keepdims) if node.attrs.get("noop_with_empty_axes", 0) else (tuple(range(rank)), keepdims)
    return norm_axes(node, axes, rank), keepdims


def _math_dtype(op: str, dtype: DType) -> DType:
    if dtype.is_int and op in _FLOAT_FINISH:
        return DType.float64
    return acc_dtype(dtype)


def _reduce_rule(fx: Fission, node: Node, ins: list) -> TensorRef:
    x = ins[0]
    combiner, fn, finish, _ = _REDUCE[node.op]
    axes, keepdims = reduce_attrs(node, x.rank)
    if not axes:  # no-op: the per-element part only (ONNX applies fn and finish to each element)
        if fn is None and finish is None:
            return x
        md = _math_dtype(node.op, x.dtype)
        fn, finish = fn or _same, finish or (lambda s, n: s)
        return fx.compute(x.shape, lambda i: cast(finish(fn(cast(x[i], md)), Const(1, md)), x.dtype))
    fn = fn or _same
    if finish is None:  # one prim; a 16-bit output accumulates in fp32 by executor semantics
        return reduce_over(fx, x, axes, keepdims, combiner, fn)
    md = _math_dtype(node.op, x.dtype)
    count = math.prod(x.shape[d] for d in axes)
    s = reduce_over(fx, x, axes, keepdims, combiner, lambda v: fn(cast(v, md)))
    return fx.compute(s.shape, lambda i: cast(finish(s[i], Const(count, md)), x.dtype))


def _register_reduce(op: str) -> None:
    def fission_rule(fx: Fission, node: Node, ins: list) -> TensorRef:
        return _reduce_rule(fx, node, ins)
    fission_rule.__doc__ = f"{_REDUCE[op][3].capitalize()} over `axes` (all if absent), fp32 math for 16-bit x."
    fission_rule.__name__ = f"fission_{op}"
    rule(op)(fission_rule)


for _op in _REDUCE:
    _register_reduce(_op)


@rule("ReduceLogSumExp")
def reduce_log_sum_exp(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Stable log(sum(exp(x))): m = max (0 where infinite), log(sum(exp(x - m))) + m."""
    x = ins[0]
    axes, keepdims = reduce_attrs(node, x.rank)
    if not axes:
        return x
    md = _math_dtype("ReduceLogSumExp", x.dtype)
    m = reduce_over(fx, x, axes, True, "max")

    def shift(idx: tuple) -> Expr:
        v = cast(m[idx], md)
        return select(unary("isinf", v), Const(0, md), v)

    s = reduce_axes(fx, x.shape, axes, keepdims, "sum",
                    lambda idx: unary("exp", cast(x[idx], md) - shift(stat_index(idx, axes))))
    return fx.compute(s.shape, lambda i: cast(unary("log", s[i]) + shift(keep_index(i, axes, x.rank, keepdims)),
                                              x.dtype))


@rule("ArgMax", "ArgMin")
def arg_max_min(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Index of the max/min along `axis`; refused over an empty axis with rows to index (as by torch).

    A max/min reduce, then a min-reduce of matching indices."""
    x = ins[0]
    axis = norm_axis(node, node.attrs.get("axis", 0), x.rank)
    if x.shape[axis] == 0 and math.prod(x.shape[:axis] + x.shape[axis + 1:]):
        raise UnsupportedOperator(node, f"{node.op} over axis {axis} of a {list(x.shape)} tensor: the axis is empty, "
                                        f"there is no index to give (torch and onnxruntime refuse it too)")
    return argreduce(fx, x, axis, bool(node.attrs.get("keepdims", 1)), node.op == "ArgMax",
                     bool(node.attrs.get("select_last_index", 0)))


@rule("Softmax")
def softmax_rule(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Stable softmax: max, exp(x - max), sum, divide."""
    return softmax(fx, ins[0], norm_axis(node, node.attrs.get("axis", -1), ins[0].rank))


@rule("LogSoftmax")
def log_softmax_rule(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Stable log-softmax: max, x - max, sum of exp, subtract log."""
    return log_softmax(fx, ins[0], norm_axis(node, node.attrs.get("axis", -1), ins[0].rank))


@rule("Hardmax")
def hardmax(fx: Fission, node: Node, ins: list) -> TensorRef:
    """One-hot of the first maximum along `axis`."""
    x = ins[0]
    ax = norm_axis(node, node.attrs.get("axis", -1), x.rank)
    j = argreduce(fx, x, ax, True, True, False)
    return fx.compute(x.shape, lambda i: select(i[ax].eq(j[stat_index(i, (ax,))]), Const(1, x.dtype),
                                                Const(0, x.dtype)))


# (exclusive, reverse) -> which source positions r contribute to position i
_CUMSUM_MASK = {
    (0, 0): lambda r, i: r.le(i),
    (1, 0): lambda r, i: r.lt(i),
    (0, 1): lambda r, i: r.ge(i),
    (1, 1): lambda r, i: r.gt(i),
}


# cumulative op -> (combiner, identity)
_CUMULATIVE = {"CumSum": ("sum", 0), "CumProd": ("prod", 1)}


@rule("CumSum", "CumProd")
def cumulative(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Cumulative sum/product as a masked sum/prod-reduce along `axis` (quadratic: fine for small extents)."""
    x = ins[0]
    if "axis" not in node.attrs:
        raise UnsupportedAttribute(node, "axis", None, "the axis input must be a constant, given as attribute "
                                   "'axis' by the frontend")
    ax = norm_axis(node, node.attrs["axis"], x.rank)
    mask = _CUMSUM_MASK[(int(bool(node.attrs.get("exclusive", 0))), int(bool(node.attrs.get("reverse", 0))))]
    combiner, identity = _CUMULATIVE[node.op]
    n = x.shape[ax]

    def body(i: tuple, r: tuple) -> Expr:
        src = i[:ax] + (r[0],) + i[ax + 1:]
        return select(mask(r[0], i[ax]), x[src], Const(identity, x.dtype))

    return fx.reduce(x.shape, (n,), combiner, body)
