"""ATen converters: reductions, variance, norms, cumsum/cumprod, topk, sort and softmax."""
from __future__ import annotations

import math

import torch

from ...ir.dtypes import DType, TensorType
from .common import norm_dim, norm_dims, reduce_type
from .emitter import Emitter
from .registry import Converter, converts


def _reduce(em: Emitter, op: str, x: str, dim, keepdim: bool, out: TensorType | None = None,
            dtype: DType | None = None) -> str:
    out = out or em.out_type()
    x = em.cast(x, dtype or out.dtype)
    axes = norm_dims(dim, em.rank(x))
    if em.rank(x) == 0:
        return x
    return em.op(op, [x], {"axes": axes, "keepdims": int(bool(keepdim))}, out)


def _simple_reduce(op: str) -> Converter:
    def convert(em: Emitter, a):
        return _reduce(em, op, a.self, getattr(a, "dim", None), getattr(a, "keepdim", False))
    return convert


converts("aten.sum.dim_IntList", "aten.sum.default")(_simple_reduce("ReduceSum"))
converts("aten.mean.dim", "aten.mean.default")(_simple_reduce("ReduceMean"))
converts("aten.prod.dim_int", "aten.prod.default")(_simple_reduce("ReduceProd"))
converts("aten.amax.default", "aten.max.default")(_simple_reduce("ReduceMax"))
converts("aten.amin.default", "aten.min.default")(_simple_reduce("ReduceMin"))
converts("aten.any.dim", "aten.any.dims", "aten.any.default")(_simple_reduce("ReduceMax"))
converts("aten.all.dim", "aten.all.dims", "aten.all.default")(_simple_reduce("ReduceMin"))


def _arg_reduce(op: str) -> Converter:
    def convert(em: Emitter, a):
        x, dim = a.self, a.dim
        if dim is None:
            x, dim = em.reshape(x, (em.type(x).numel,)), 0
        d = norm_dim(dim, max(em.rank(x), 1))
        return em.op(op, [x], {"axis": d, "keepdims": int(bool(a.keepdim)), "select_last_index": 0})
    return convert


converts("aten.argmax.default")(_arg_reduce("ArgMax"))
converts("aten.argmin.default")(_arg_reduce("ArgMin"))


def _value_index(value_op: str, index_op: str) -> Converter:
    def convert(em: Emitter, a):
        used = em.used_outputs()
        d = norm_dim(a.dim, max(em.rank(a.self), 1))
        values = indices = None
        if 0 in used:
            values = _reduce(em, value_op, a.self, [d], a.keepdim, em.out_type(0))
        if 1 in used:
            indices = em.op(index_op, [a.self], {"axis": d, "keepdims": int(bool(a.keepdim)), "select_last_index": 0},
                            em.out_type(1))
        return (values, indices)
    return convert


converts("aten.max.dim")(_value_index("ReduceMax", "ArgMax"))
converts("aten.min.dim")(_value_index("ReduceMin", "ArgMin"))


def _variance(em: Emitter, x: str, dim, correction, keepdim: bool, out: TensorType) -> tuple[str, str]:
    """(var, mean) with torch's correction: sum((x - mean)^2) / (N - correction); mean keeps dims."""
    shape = em.shape(x)
    axes = norm_dims(dim, len(shape))
    n = math.prod(shape[d] for d in axes)
    c = 1 if correction is None else correction
    kept = reduce_type(shape, axes, True, out.dtype)
    mean = em.op("ReduceMean", [x], {"axes": axes, "keepdims": 1}, kept)
    diff = em.op("Sub", [x, mean], out=em.type(x))
    sq = em.op("Mul", [diff, diff], out=em.type(x))
    ss = em.op("ReduceSum", [sq], {"axes": axes, "keepdims": int(bool(keepdim))}, out)
    var = em.op("Div", [ss, em.scalar(float(max(n - c, 0)), out.dtype)], out=out)
    return var, mean


@converts("aten.var.correction", "aten.var.dim", "aten.var.default")
def _var(em, a):
    return _variance(em, a.self, getattr(a, "dim", None), _correction(a), getattr(a, "keepdim", False),
                     em.out_type())[0]


@converts("aten.std.correction", "aten.std.dim", "aten.std.default")
def _std(em, a):
    out = em.out_type()
    var = _variance(em, a.self, getattr(a, "dim", None), _correction(a), getattr(a, "keepdim", False), out)[0]
    return em.op("Sqrt", [var])


@converts("aten.var_mean.correction", "aten.var_mean.dim")
def _var_mean(em, a):
    var, mean = _variance(em, a.self, a.dim, _correction(a), a.keepdim, em.out_type(0))
    return var, em.reshape(mean, em.out_type(1).shape)


def _correction(a) -> float:
    if getattr(a, "correction", None) is not None:
        return a.correction
    return 1 if getattr(a, "unbiased", True) else 0


@converts("aten.linalg_vector_norm.default")
def _vector_norm(em, a):
    out = em.out_type()
    ops = {2: "ReduceL2", 1: "ReduceL1"}
    if a.ord in ops:
        return _reduce(em, ops[a.ord], a.self, a.dim, a.keepdim, out)
    if a.ord == math.inf:
        x = em.op("Abs", [em.cast(a.self, out.dtype)], out=TensorType(em.shape(a.self), out.dtype))
        return _reduce(em, "ReduceMax", x, a.dim, a.keepdim, out)
    raise em.bad_attr("ord", a.ord, "only the 1-, 2- and inf-norms are supported")


def _cumulative(op: str) -> Converter:
    def convert(em: Emitter, a):
        out = em.out_type()
        x = em.cast(a.self, out.dtype)
        return em.op(op, [x], {"axis": norm_dim(a.dim, max(out.rank, 1))})
    return convert


converts("aten.cumsum.default")(_cumulative("CumSum"))
converts("aten.cumprod.default")(_cumulative("CumProd"))


@converts("aten.topk.default")
def _topk(em, a):
    d = norm_dim(a.dim, max(em.rank(a.self), 1))
    return em.op("TopK", [a.self], {"k": int(a.k), "axis": d, "largest": int(a.largest), "sorted": int(a.sorted)},
                 outs=[em.out_type(0), em.out_type(1)])


@converts("aten.sort.default", "aten.sort.stable")
def _sort(em, a):
    """A TopK of every element, which orders ties by index: torch's stable sort (an unstable
    one may order ties differently; the values agree)."""
    d = norm_dim(a.dim, max(em.rank(a.self), 1))
    n = em.shape(a.self)[d] if em.rank(a.self) else 1
    return em.op("TopK", [a.self], {"k": n, "axis": d, "largest": int(a.descending), "sorted": 1},
                 outs=[em.out_type(0), em.out_type(1)])


def _softmax(op: str) -> Converter:
    def convert(em: Emitter, a):
        out = em.out_type()
        x = em.cast(a.self, out.dtype)
        return em.op(op, [x], {"axis": norm_dim(a.dim, max(out.rank, 1)) if out.rank else 0})
    return convert


converts("aten._softmax.default", "aten.softmax.int")(_softmax("Softmax"))
converts("aten._log_softmax.default", "aten.log_softmax.int")(_softmax("LogSoftmax"))


@converts("aten.histc.default")
def _histc(em, a):
    """Counts per bin of [min, max] split into ``bins`` equal bins (the last one closed), values
    outside or NaN not counted: each element's bin index compared with every bin and summed (a
    mixture-of-experts router counts its tokens per expert so).  torch derives the range from the
    data when min == max; that range is a run-time value, so it is refused."""
    lo, hi, bins = float(a.min), float(a.max), int(a.bins)
    if not lo < hi:
        raise em.bad_attr("min", a.min, "histc over the data's own range (min == max) is not supported; "
                          "give the range")
    out = em.out_type()
    dt = out.dtype
    n = math.prod(em.shape(a.self))
    x = em.reshape(a.self, (n, 1))
    flat, mask = TensorType((n, 1), dt), TensorType((n, 1), DType.bool)
    pos = em.op("Mul", [em.op("Sub", [x, em.scalar(lo, dt)], out=flat), em.scalar(float(bins), dt)], out=flat)
    pos = em.op("Floor", [em.op("Div", [pos, em.scalar(hi - lo, dt)], out=flat)], out=flat)
    pos = em.op("Min", [pos, em.scalar(float(bins - 1), dt)], out=flat)     # max itself is in the last bin
    inside = em.op("And", [em.op("GreaterOrEqual", [x, em.scalar(lo, dt)], out=mask),
                           em.op("LessOrEqual", [x, em.scalar(hi, dt)], out=mask)], out=mask)
    hit = em.op("Equal", [pos, em.const(torch.arange(bins, dtype=dt.to_torch()))], out=TensorType((n, bins), DType.bool))
    hit = em.op("And", [hit, inside], out=TensorType((n, bins), DType.bool))
    counts = em.op("Cast", [hit], {"to": dt.to_onnx()}, TensorType((n, bins), dt))
    return em.op("ReduceSum", [counts], {"axes": (0,), "keepdims": 0}, out)
