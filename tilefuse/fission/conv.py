"""Fission rules: convolutions (Conv, ConvTranspose), and the sliding-window geometry pools share.

Conv is a zero-padding layout prim (only when the window leaves the input), ONE contraction prim
whose loads are affine in the output and kernel axes (``o*stride + k*dilation``), and a bias
broadcast-add.  Keeping the contraction body a plain product of two loads lets the reference
executor evaluate it as an einsum (im2col-like) and the gemm family treat it as an implicit GEMM.
A grouped convolution with several output channels per group computes ``[N, G, m_out, ...]``
(the group its own axis: the GEMM's batch, the group's channels its N) and reshapes it to
``[N, G*m_out, ...]`` in a layout prim; see ``conv_contraction``.

ConvTranspose is one contraction over (input channels of the group, kernel): output position
``o`` receives input ``i`` through kernel tap ``k`` when ``o + pad = i*stride + k*dilation``, so
the input load is guarded by a Select on divisibility and bounds.  That is exact and needs no
zero-stuffed intermediate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..errors import UnsupportedAttribute
from ..ir.dtypes import DType
from ..ir.expr import INDEX, Const, Expr, cast, logical_and, select
from ..ir.graph import Node
from .layout import reshape
from .registry import Fission, TensorRef, rule

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def spatial_attr(node: Node, name: str, n: int, default: int) -> tuple[int, ...]:
    """A per-spatial-dim attribute (strides, dilations, ...) of length ``n``."""
    v = tuple(node.attrs.get(name, (default,) * n))
    if len(v) != n:
        raise UnsupportedAttribute(node, name, v, f"expected {n} values")
    return v


def auto_pad(node: Node) -> str:
    mode = node.attrs.get("auto_pad", "NOTSET")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in AUTO_PADS:
        raise UnsupportedAttribute(node, "auto_pad", mode, f"expected one of {', '.join(AUTO_PADS)}")
    return mode


@dataclass(frozen=True)
class Window:
    """A sliding window over the spatial dims: output ``o`` reads input ``o*s - pb + r*d`` for r < k."""
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads_begin: tuple[int, ...]
    pads_end: tuple[int, ...]
    in_sizes: tuple[int, ...]
    out_sizes: tuple[int, ...]

    def span(self, d: int) -> int:
        """Extent of the window positions read along dim d, counted from ``-pads_begin``."""
        return (self.out_sizes[d] - 1) * self.strides[d] + (self.kernel[d] - 1) * self.dilations[d] + 1

    def needs_guard(self, d: int) -> tuple[bool, bool]:
        """Whether positions along dim d can fall below 0 / at or above the input size."""
        return self.pads_begin[d] > 0, self.span(d) - self.pads_begin[d] > self.in_sizes[d]

    def positions(self, o: Sequence[Expr], r: Sequence[Expr]) -> tuple[Expr, ...]:
        return tuple(o[d] * self.strides[d] + r[d] * self.dilations[d] - self.pads_begin[d]
                     for d in range(len(self.kernel)))

    def inside(self, pos: Sequence[Expr]) -> Expr:
        """Bool expression: ``pos`` lies inside the input (only the bounds that can be crossed)."""
        conds = []
        for d, p in enumerate(pos):
            low, high = self.needs_guard(d)
            if low:
                conds.append(p.ge(0))
            if high:
                conds.append(p.lt(self.in_sizes[d]))
        return logical_and(*conds)

    @property
    def padded(self) -> bool:
        return any(any(self.needs_guard(d)) for d in range(len(self.kernel)))


def window(node: Node, in_sizes: Sequence[int], kernel: Sequence[int], ceil_mode: bool = False) -> Window:
    """Geometry from the ONNX attributes strides, dilations, pads, auto_pad (and ceil_mode for pools)."""
    n = len(in_sizes)
    strides = spatial_attr(node, "strides", n, 1)
    dilations = spatial_attr(node, "dilations", n, 1)
    if min(strides + dilations, default=1) < 1:
        raise UnsupportedAttribute(node, "strides/dilations", (strides, dilations), "must be positive")
    pads = spatial_attr(node, "pads", 2 * n, 0)
    if min(pads, default=0) < 0:
        raise UnsupportedAttribute(node, "pads", pads, "negative pads")
    mode = auto_pad(node)
    eff = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        out = [-(-i // s) for i, s in zip(in_sizes, strides)]
        total = [max(0, (o - 1) * s + e - i) for o, s, e, i in zip(out, strides, eff, in_sizes)]
        begin = [t // 2 if mode == "SAME_UPPER" else t - t // 2 for t in total]
        pads = tuple(begin) + tuple(t - b for t, b in zip(total, begin))
    elif mode == "VALID":
        pads = (0,) * (2 * n)
    pb, pe = pads[:n], pads[n:]
    out = []
    for d in range(n):
        room = in_sizes[d] + pb[d] + pe[d] - eff[d]
        o = (-(-room // strides[d]) if ceil_mode else room // strides[d]) + 1
        if ceil_mode and (o - 1) * strides[d] >= in_sizes[d] + pb[d]:
            o -= 1  # the last window must start inside the input or the leading padding (torch, ORT)
        if (room < 0 and not ceil_mode) or o < 1:  # ceil_mode: a window may overhang (torch, ORT)
            raise UnsupportedAttribute(node, "kernel_shape", tuple(kernel),
                                       f"window larger than the padded input {tuple(in_sizes)}")
        out.append(o)
    return Window(tuple(kernel), strides, dilations, tuple(pb), tuple(pe), tuple(in_sizes), tuple(out))


def kernel_attr(node: Node, kernel: Sequence[int]) -> tuple[int, ...]:
    """The kernel's spatial shape; an explicit kernel_shape attribute must agree with the weights."""
    k = tuple(node.attrs.get("kernel_shape", kernel))
    if k != tuple(kernel):
        raise UnsupportedAttribute(node, "kernel_shape", k, f"weights have spatial shape {tuple(kernel)}")
    return k


def pad_input(fx: Fission, x: TensorRef, win: Window) -> TensorRef:
    """Layout prim: x with zeros around its spatial dims, covering exactly the positions ``win`` reads."""
    shape = x.shape[:2] + tuple(win.span(d) for d in range(len(win.kernel)))
    zero = Const(0, x.dtype)

    def body(i):
        pos = tuple(q - pb for q, pb in zip(i[2:], win.pads_begin))
        return select(win.inside(pos), x[i[:2] + pos], zero)

    return fx.compute(shape, body)


def group_split(node: Node, channels: int, group: int, what: str) -> int:
    if group < 1 or channels % group:
        raise UnsupportedAttribute(node, "group", group, f"does not divide the {channels} {what}")
    return channels // group


def add_bias(fx: Fission, y: TensorRef, b: TensorRef | None) -> TensorRef:
    """Broadcast prim adding a per-channel bias (dim 1)."""
    if b is None:
        return y
    return fx.compute(y.shape, lambda i: y[i] + cast(b[(i[1],)], y.dtype))


def conv_contraction(fx: Fission, batch: int, group: int, m_out: int, sizes: Sequence[int],
                     reduced: Sequence[int], tap: Callable[..., Expr]) -> TensorRef:
    """A convolution's ``[batch, group*m_out, sizes...]`` output: the sum over ``reduced`` (input
    channel of the group, kernel...) of ``tap(n, g, f, o, r)``, the product for output channel f of
    group g at spatial position o.

    With one flat channel axis m, a grouped convolution's input load reads m (through its group
    ``m // m_out``), so in the GEMM view (``contraction_operands``) every output channel is a batch
    of N = 1.  With several output channels per group it is therefore computed as ``[batch, group,
    m_out, sizes...]``, the group an axis both operands read (the batch) and f one only the weight
    reads (N), and reshaped.  That includes a depthwise convolution with a channel multiplier (one
    input channel per group): K is only the kernel window, but N = m_out instead of 1, so each
    input window is read once for its m_out outputs.  One group needs no split, and one output
    channel per group (depthwise, or several input channels) would give N = 1 anyway: those keep
    the flat axis (a depthwise convolution stays a row reduction per output, which the fused
    family takes too).
    """
    if group > 1 and m_out > 1:
        y = fx.reduce((batch, group, m_out) + tuple(sizes), tuple(reduced), "sum",
                      lambda i, r: tap(i[0], i[1], i[2], i[3:], r))
        return reshape(fx, y, (batch, group * m_out) + tuple(sizes))
    zero = Const(0, INDEX)
    split = (lambda m: (zero, m)) if group == 1 else (lambda m: (m, zero))   # (group, channel in it)
    return fx.reduce((batch, group * m_out) + tuple(sizes), tuple(reduced), "sum",
                     lambda i, r: tap(i[0], *split(i[1]), i[2:], r))


def _operands(node: Node, ins: list) -> tuple:
    """(x, w, bias or None, spatial rank, kernel, group, input channels per group), checked."""
    x, w, b = (list(ins) + [None])[:3]
    nsp = x.rank - 2
    if nsp < 1 or w.rank != x.rank:
        raise UnsupportedAttribute(node, "shapes", (x.shape, w.shape),
                                   f"{node.op} needs (N, C, spatial...) input and weights")
    group = node.attrs.get("group", 1)
    return x, w, b, nsp, kernel_attr(node, w.shape[2:]), group, group_split(node, x.shape[1], group, "input channels")


@rule("Conv")
def conv(fx: Fission, node: Node, ins: list, dtype: DType | None = None) -> TensorRef:
    """N-D convolution (strides, dilations, pads/auto_pad, groups): pad prim, contraction, bias add."""
    x, w, b, nsp, kernel, group, c_in = _operands(node, ins)
    m_out = group_split(node, w.shape[0], group, "output channels")
    if w.shape[1] != c_in:
        raise UnsupportedAttribute(node, "group", group, f"weights have {w.shape[1]} input channels per group, "
                                   f"input has {c_in}")
    win = window(node, x.shape[2:], kernel)
    src = pad_input(fx, x, win) if win.padded else x
    dtype = dtype or fx.out_type().dtype      # (QLinearConv contracts in int32)

    def tap(n, g, f, o, r):
        c, k = r[0], r[1:]
        pos = tuple(o[d] * win.strides[d] + k[d] * win.dilations[d] for d in range(nsp))
        return cast(src[(n, g * c_in + c) + pos], dtype) * cast(w[(g * m_out + f, c) + tuple(k)], dtype)

    y = conv_contraction(fx, x.shape[0], group, m_out, win.out_sizes, (c_in,) + kernel, tap)
    return add_bias(fx, y, b)


def transpose_geometry(node: Node, in_sizes, kernel, strides, dilations) -> tuple[tuple, tuple]:
    """(output spatial sizes, leading pads) of ConvTranspose, following the ONNX opset-21 text.

    Explicit ``pads`` win; otherwise ``output_shape`` (or, for SAME auto_pad, input·stride) fixes
    the size and the total padding is split as the spec says (SAME_UPPER: the smaller half first).
    """
    n = len(in_sizes)
    out_pad = spatial_attr(node, "output_padding", n, 0)
    full = [s * (i - 1) + op + (k - 1) * d + 1 for s, i, op, k, d in zip(strides, in_sizes, out_pad, kernel, dilations)]
    mode = auto_pad(node)
    target = node.attrs.get("output_shape")
    if target is not None:
        target = tuple(target)[-n:]
    elif mode in ("SAME_UPPER", "SAME_LOWER") and "pads" not in node.attrs:
        target = tuple(i * s for i, s in zip(in_sizes, strides))
    if "pads" in node.attrs or target is None:
        pads = (0,) * (2 * n) if mode == "VALID" else spatial_attr(node, "pads", 2 * n, 0)
        out = target or tuple(f - pb - pe for f, pb, pe in zip(full, pads[:n], pads[n:]))
        return tuple(out), tuple(pads[:n])
    total = [f - t for f, t in zip(full, target)]
    begin = tuple(t // 2 if mode == "SAME_UPPER" else t - t // 2 for t in total)
    return tuple(target), begin


@rule("ConvTranspose")
def conv_transpose(fx: Fission, node: Node, ins: list) -> TensorRef:
    """N-D transposed convolution: one contraction with the stride folded into a guarded input load."""
    x, w, b, nsp, kernel, group, c_in = _operands(node, ins)
    if w.shape[0] != x.shape[1]:
        raise UnsupportedAttribute(node, "shapes", (x.shape, w.shape), "weights' dim 0 must equal input channels")
    m_out = w.shape[1]
    strides = spatial_attr(node, "strides", nsp, 1)
    dilations = spatial_attr(node, "dilations", nsp, 1)
    out_sizes, pb = transpose_geometry(node, x.shape[2:], kernel, strides, dilations)
    if min(out_sizes) < 1:
        raise UnsupportedAttribute(node, "pads", node.attrs.get("pads"), f"empty output {out_sizes}")
    dtype = fx.out_type().dtype
    zero = Const(0, x.dtype)

    def tap(n, g, f, o, r):
        c, k = r[0], r[1:]
        ch = g * c_in + c
        conds, pos = [], []
        for d in range(nsp):
            t = o[d] + pb[d] - k[d] * dilations[d]   # = input position * stride
            s = strides[d]
            conds += [t.ge(0), (t % s).eq(0), (t // s).lt(x.shape[2 + d])]
            pos.append(t // s)
        xv = select(logical_and(*conds), x[(n, ch) + tuple(pos)], zero)
        return cast(xv, dtype) * cast(w[(ch, f) + tuple(k)], dtype)

    y = conv_contraction(fx, x.shape[0], group, m_out, out_sizes, (c_in,) + kernel, tap)
    return add_bias(fx, y, b)
