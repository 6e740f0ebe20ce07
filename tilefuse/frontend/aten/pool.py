"""ATen converters: max, average and adaptive average pooling."""
from __future__ import annotations

from ...ir.dtypes import TensorType
from .common import tup
from .emitter import Emitter, op_name
from .registry import converts


def _pool_nd(em: Emitter, x: str) -> int:
    """Spatial rank from the op name (max_pool2d -> 2); the input is (N, C, ...) or unbatched (C, ...)."""
    nd = int(next(c for c in op_name(em.fx.target).split(".")[1] if c.isdigit()))
    if em.rank(x) not in (nd + 1, nd + 2):
        raise em.unsupported(f"pooling needs an (N, C, ...) or (C, ...) input, got rank {em.rank(x)}")
    return nd


def _batched(em: Emitter, x: str, emit) -> str:
    """``emit(x, out_type)`` on x with a batch of one in front when x is unbatched (C, ...), the
    result reshaped back: the canonical pooling ops take (N, C, ...) only."""
    nd = _pool_nd(em, x)
    out = em.out_type(0)
    if em.rank(x) == nd + 2:
        return emit(x, out)
    y = emit(em.reshape(x, (1, *em.shape(x))), TensorType((1, *out.shape), out.dtype))
    return em.reshape(y, out.shape)


def _pool_attrs(em: Emitter, x: str, kernel, stride, padding, ceil_mode, dilation=None) -> dict:
    nd = _pool_nd(em, x)
    k = tup(kernel, nd)
    attrs = {"kernel_shape": k, "strides": tup(stride, nd) if stride else k,
             "pads": tup(padding, nd) * 2, "ceil_mode": int(bool(ceil_mode))}
    if dilation is not None:
        attrs["dilations"] = tup(dilation, nd)
    return attrs


def _whole_input_window(x_shape, out_shape, attrs: dict) -> bool:
    """One unpadded window covering the whole input (e.g. EfficientNet's AvgPool2d(1280, ceil_mode=True)
    on a small map): torch clips the window to the input, so the pool is a global one."""
    return (not any(attrs["pads"]) and all(k >= n for k, n in zip(attrs["kernel_shape"], x_shape[2:]))
            and all(s == 1 for s in out_shape[2:]))


def _pool(em: Emitter, op: str, x: str, attrs: dict) -> str:
    def emit(x, out):
        if _whole_input_window(em.shape(x), out.shape, attrs):
            return em.op("Global" + op, [x], out=out)
        return em.op(op, [x], attrs, out)
    return _batched(em, x, emit)


@converts("aten.max_pool2d_with_indices.default", "aten.max_pool3d_with_indices.default",
          "aten.max_pool1d_with_indices.default")
def _max_pool_indices(em, a):
    if 1 in em.used_outputs():
        raise em.unsupported("the indices output of max pooling is not supported")
    attrs = _pool_attrs(em, a.self, a.kernel_size, a.stride, a.padding, a.ceil_mode, a.dilation)
    return (_pool(em, "MaxPool", a.self, attrs), None)


@converts("aten.max_pool1d.default", "aten.max_pool2d.default", "aten.max_pool3d.default")
def _max_pool(em, a):
    return _pool(em, "MaxPool", a.self, _pool_attrs(em, a.self, a.kernel_size, a.stride, a.padding, a.ceil_mode,
                                                     a.dilation))


@converts("aten.avg_pool1d.default", "aten.avg_pool2d.default", "aten.avg_pool3d.default")
def _avg_pool(em, a):
    if getattr(a, "divisor_override", None) is not None:
        raise em.bad_attr("divisor_override", a.divisor_override, "average pooling with a custom divisor")
    attrs = _pool_attrs(em, a.self, a.kernel_size, a.stride, a.padding, a.ceil_mode)
    attrs["count_include_pad"] = int(bool(a.count_include_pad))
    return _pool(em, "AveragePool", a.self, attrs)


@converts("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default",
          "aten._adaptive_avg_pool3d.default", "aten.adaptive_avg_pool3d.default",
          "aten.adaptive_avg_pool1d.default")
def _adaptive_avg_pool(em, a):
    if em.out_type().shape == em.shape(a.self):
        return a.self

    def emit(x, out):
        if all(s == 1 for s in out.shape[2:]):
            return em.op("GlobalAveragePool", [x], out=out)
        return em.op("AdaptiveAveragePool", [x], out=out)
    return _batched(em, a.self, emit)
