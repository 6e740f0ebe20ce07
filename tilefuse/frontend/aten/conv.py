"""ATen converters: convolution and transposed convolution."""
from __future__ import annotations

from types import SimpleNamespace

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


@converts("aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default")
def _conv_as_written(em, a):
    """A convolution with its padding in numbers: the ``convolution`` it decomposes to."""
    return _convolution(em, SimpleNamespace(**vars(a), transposed=False, output_padding=0))
