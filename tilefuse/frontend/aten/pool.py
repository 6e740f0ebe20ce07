"""ATen converters: max, average and adaptive average pooling."""
from __future__ import annotations

from .common import tup
from .emitter import Emitter, op_name
from .registry import converts


def _pool_nd(em: Emitter, x: str) -> int:
    """Spatial rank from the op name (max_pool2d -> 2); unbatched inputs are not supported."""
    nd = int(next(c for c in op_name(em.fx.target).split(".")[1] if c.isdigit()))
    if em.rank(x) != nd + 2:
        raise em.unsupported(f"pooling needs a batched (N, C, ...) input, got rank {em.rank(x)}")
    return nd


def _pool_attrs(em: Emitter, x: str, kernel, stride, padding, ceil_mode, dilation=None) -> dict:
    nd = _pool_nd(em, x)
    k = tup(kernel, nd)
    attrs = {"kernel_shape": k, "strides": tup(stride, nd) if stride else k,
             "pads": tup(padding, nd) * 2, "ceil_mode": int(bool(ceil_mode))}
    if dilation is not None:
        attrs["dilations"] = tup(dilation, nd)
    return attrs


def _whole_input_window(em: Emitter, x: str, attrs: dict) -> bool:
    """One unpadded window covering the whole input (e.g. EfficientNet's AvgPool2d(1280, ceil_mode=True)
    on a small map): torch clips the window to the input, so the pool is a global one."""
    spatial = em.shape(x)[2:]
    return (not any(attrs["pads"]) and all(k >= n for k, n in zip(attrs["kernel_shape"], spatial))
            and all(s == 1 for s in em.out_type(0).shape[2:]))


def _pool(em: Emitter, op: str, x: str, attrs: dict) -> str:
    if _whole_input_window(em, x, attrs):
        return em.op("Global" + op, [x], out=em.out_type(0))
    return em.op(op, [x], attrs, em.out_type(0))


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
    out = em.out_type()
    if all(s == 1 for s in out.shape[2:]):
        return em.op("GlobalAveragePool", [a.self])
    if out.shape == em.shape(a.self):
        return a.self
    return em.op("AdaptiveAveragePool", [a.self])
