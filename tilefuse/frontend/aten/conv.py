"""ATen converters: convolution and transposed convolution."""
from __future__ import annotations

from .common import tup
from .registry import converts


@converts("aten.convolution.default", "aten._convolution.default")
def _convolution(em, a):
    nd = em.rank(a.weight) - 2
    attrs = {"strides": tup(a.stride, nd), "pads": tup(a.padding, nd) * 2, "dilations": tup(a.dilation, nd),
             "group": int(a.groups), "kernel_shape": tuple(em.shape(a.weight)[2:])}
    if a.transposed:
        attrs["output_padding"] = tup(a.output_padding, nd)
        return em.op("ConvTranspose", [a.input, a.weight, a.bias], attrs)
    return em.op("Conv", [a.input, a.weight, a.bias], attrs)
