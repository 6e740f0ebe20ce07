"""ATen converters: convolution and transposed convolution."""
from __future__ import annotations

from types import SimpleNamespace

from ...ir.dtypes import TensorType
from .common import tup
from .registry import converts


@converts("aten.convolution.default", "aten._convolution.default")
def _convolution(em, a, out=None):
    nd = em.rank(a.weight) - 2
    attrs = {"strides": tup(a.stride, nd), "pads": tup(a.padding, nd) * 2, "dilations": tup(a.dilation, nd),
             "group": int(a.groups), "kernel_shape": tuple(em.shape(a.weight)[2:])}
    if a.transposed:
        attrs["output_padding"] = tup(a.output_padding, nd)
        return em.op("ConvTranspose", [a.input, a.weight, a.bias], attrs, out)
    return em.op("Conv", [a.input, a.weight, a.bias], attrs, out)


@converts("aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default")
def _conv_as_written(em, a):
    """A convolution with its padding in numbers: the ``convolution`` it decomposes to.  An
    unbatched input (``(C, L)`` for conv1d) gets a batch of 1 around it, as the decomposition does."""
    a = SimpleNamespace(**vars(a), transposed=False, output_padding=0)
    if em.rank(a.input) == em.rank(a.weight):
        return _convolution(em, a)
    out = em.out_type()
    a.input = em.op("Unsqueeze", [a.input], {"axes": (0,)}, TensorType((1,) + tuple(em.shape(a.input)),
                                                                      em.dtype(a.input)))
    y = _convolution(em, a, TensorType((1,) + tuple(out.shape), out.dtype))
    return em.op("Squeeze", [y], {"axes": (0,)}, out)
