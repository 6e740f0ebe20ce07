"""Fission rules: sampling an image at data-dependent coordinates (GridSample, RoiAlign, DeformConv,
MaxRoiPool).

Each output position reads its normalized source coordinates from the grid, maps them to pixel
coordinates, and blends the pixels around them with nearest/linear/cubic weights: one prim whose
loads are indexed by loaded values (indirect), with the padding modes as selects and clamps.
The arithmetic follows ONNX's reference implementation step by step (float32 coordinates, the
border and reflection rules applied first to the coordinate and then to every tap).
"""
from __future__ import annotations

import itertools
import math

from ..errors import UnsupportedAttribute
from ..ir.dtypes import DType
from ..ir.expr import INDEX, Const, Expr, binary, cast, logical_and, maximum, minimum, select, unary
from ..ir.graph import Node
from .common import acc_dtype
from .registry import Fission, TensorRef, rule

F32 = DType.float32
MODES = {"bilinear": "linear", "linear": "linear", "nearest": "nearest", "bicubic": "cubic", "cubic": "cubic"}
PADDING = ("zeros", "border", "reflection")
CUBIC_A = -0.75


def reflect(x: Expr, lo: float, hi: float) -> Expr:
    """Fold x into [lo, hi] by reflecting at the borders (as often as needed)."""
    span = hi - lo

    def fold(dx: Expr) -> tuple[Expr, Expr]:
        """(offset from the border crossed, whether an even number of whole spans lies past it)."""
        n = unary("floor", dx / span)
        return dx - n * span, (n - unary("floor", n * 0.5) * 2.0).eq(0.0)
    r_lo, even_lo = fold(lo - x)
    r_hi, even_hi = fold(x - hi)
    below = select(even_lo, r_lo + lo, hi - r_lo)
    above = select(even_hi, hi - r_hi, r_hi + lo)
    return select(x.lt(lo), below, select(x.gt(hi), above, x))


def _cubic_weights(t: Expr) -> list[Expr]:
    a = CUBIC_A

    def near(d):    # |d| <= 1
        return ((d * (a + 2) - (a + 3)) * d) * d + 1.0

    def far(d):     # 1 < |d| < 2
        return ((d * a - 5 * a) * d + 8 * a) * d - 4 * a
    return [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]


class _Axis:
    """One spatial axis of length n: coordinates, padding, taps."""

    def __init__(self, n: int, align_corners: bool, padding: str):
        self.n, self.ac, self.padding = n, align_corners, padding
        self.lo, self.hi = (0.0, n - 1.0) if align_corners else (-0.5, n - 0.5)

    def coordinate(self, g: Expr, nearest: bool) -> Expr:
        x = (g + 1.0) * 0.5 * (self.n - 1) if self.ac else ((g + 1.0) * self.n - 1.0) * 0.5
        if nearest:
            x = unary("round", x)
        if self.padding == "border":
            return select(logical_and(x.ge(self.lo), x.le(self.hi)), x, minimum(maximum(x, 0.0), self.n - 1.0))
        if self.padding == "reflection":
            return reflect(x, self.lo, self.hi)
        return x

    def pixel(self, i: Expr) -> tuple[Expr, Expr | None]:
        """(an in-bounds index, the condition that the tap is inside; None: always) for tap i."""
        if self.padding == "zeros":
            return minimum(maximum(i, 0), self.n - 1), logical_and(i.ge(0), i.lt(self.n))
        if self.padding == "border":
            return minimum(maximum(i, 0), self.n - 1), None
        return cast(reflect(cast(i, F32), self.lo, self.hi), INDEX), None

    def taps(self, x: Expr, mode: str) -> list[tuple[Expr, Expr | None, Expr | None]]:
        """(index, weight or None, inside or None) per tap."""
        if mode == "nearest":
            return [self._tap(cast(x, INDEX), None)]
        x0 = unary("floor", x)
        t, i0 = x - x0, cast(x0, INDEX)
        if mode == "linear":
            return [self._tap(i0, 1.0 - t), self._tap(i0 + 1, t)]
        return [self._tap(i0 + k, w) for k, w in zip((-1, 0, 1, 2), _cubic_weights(t))]

    def _tap(self, i: Expr, w: Expr | None):
        idx, inside = self.pixel(i)
        return idx, w, inside


@rule("GridSample")
def grid_sample(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Sample X at the grid's normalized coordinates (nearest/linear/cubic; zeros/border/reflection
    padding; align_corners): one indirect prim blending the taps of every spatial axis."""
    x, grid = ins
    out = fx.out_type()
    mode = MODES.get(node.attrs.get("mode", "linear"))
    padding = node.attrs.get("padding_mode", "zeros")
    if mode is None:
        raise UnsupportedAttribute(node, "mode", node.attrs.get("mode"), f"expected one of {', '.join(MODES)}")
    if padding not in PADDING:
        raise UnsupportedAttribute(node, "padding_mode", padding, f"expected one of {', '.join(PADDING)}")
    r = x.rank - 2
    if grid.shape[-1] != r or grid.rank != x.rank:
        raise UnsupportedAttribute(node, "grid", grid.shape, f"expected [N, *out, {r}] for input {x.shape}")
    axes = [_Axis(n, bool(node.attrs.get("align_corners", 0)), padding) for n in x.shape[2:]]
    ft = acc_dtype(x.dtype) if x.dtype.is_float else F32

    def body(i):
        n, c, o = i[0], i[1], i[2:]
        taps = []
        for d, ax in enumerate(axes):     # the grid's last axis lists coordinates innermost first
            g = cast(grid[(n, *o, r - 1 - d)], F32)
            taps.append(ax.taps(ax.coordinate(g, mode == "nearest"), mode))
        total = None
        for combo in itertools.product(*taps):
            v = cast(x[(n, c) + tuple(t[0] for t in combo)], ft)
            inside = [t[2] for t in combo if t[2] is not None]
            if inside:
                v = select(logical_and(*inside), v, Const(0, ft))
            for t in combo:
                if t[1] is not None:
                    v = v * cast(t[1], ft)
            total = v if total is None else total + v
        return cast(total, out.dtype)
    return fx.compute(out.shape, body)


def _roi_axis(start: Expr, bin_size: Expr, p: Expr, k: Expr, grid: int, n: int):
    """ONNX RoiAlign's bilinear sample along one axis: (outside, low index, high index, weight of
    high) for sample k of bin p; past the last pixel both taps are the last pixel."""
    v = start + cast(p, F32) * bin_size + (cast(k, F32) + 0.5) * bin_size / float(grid)
    outside = binary("or", v.lt(-1.0), v.gt(float(n)))
    v = maximum(v, 0.0)
    low = unary("floor", v)
    last = low.ge(n - 1.0)
    lo = minimum(cast(low, INDEX), n - 1)
    hi = select(last, Const(n - 1, INDEX), minimum(lo + 1, n - 1))
    return outside, lo, hi, select(last, Const(0.0, F32), v - low)


@rule("RoiAlign")
def roi_align(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Average (or max) of sampling_ratio² bilinear samples per output bin of each box: one reduce
    over the samples, the box's image and coordinates loaded per output (ONNX's reference rules:
    samples outside [-1, size] count as 0, ``max`` takes the largest weighted tap)."""
    x, rois, batch = ins
    out = fx.out_type()
    grid = int(node.attrs.get("sampling_ratio", 0))
    if grid <= 0:
        raise UnsupportedAttribute(node, "sampling_ratio", grid, "the adaptive ratio makes the number of samples "
                                   "depend on the box sizes; give a positive sampling_ratio")
    mode = node.attrs.get("mode", "avg")
    ctm = node.attrs.get("coordinate_transformation_mode", "half_pixel")
    if mode not in ("avg", "max") or ctm not in ("half_pixel", "output_half_pixel"):
        raise UnsupportedAttribute(node, "mode", (mode, ctm), "expected avg/max and half_pixel/output_half_pixel")
    scale, offset = float(node.attrs.get("spatial_scale", 1.0)), 0.5 if ctm == "half_pixel" else 0.0
    (ph_n, pw_n), (h, w) = out.shape[2:], x.shape[2:]

    def body(i, r):
        roi, c, ph, pw = i
        box = [cast(rois[(roi, k)], F32) * scale - offset for k in range(4)]
        size_w, size_h = box[2] - box[0], box[3] - box[1]
        if ctm == "output_half_pixel":
            size_w, size_h = maximum(size_w, 1.0), maximum(size_h, 1.0)
        out_y, yl, yh, ly = _roi_axis(box[1], size_h / float(ph_n), ph, r[0], grid, h)
        out_x, xl, xh, lx = _roi_axis(box[0], size_w / float(pw_n), pw, r[1], grid, w)
        b = cast(batch[(roi,)], INDEX)
        taps = [(yl, xl, (1.0 - ly) * (1.0 - lx)), (yl, xh, (1.0 - ly) * lx),
                (yh, xl, ly * (1.0 - lx)), (yh, xh, ly * lx)]
        vals = [cast(x[(b, c, yy, xx)], F32) * wt for yy, xx, wt in taps]
        v = vals[0] + vals[1] + vals[2] + vals[3] if mode == "avg" else maximum(maximum(vals[0], vals[1]),
                                                                                 maximum(vals[2], vals[3]))
        return select(binary("or", out_y, out_x), Const(0.0, F32), v)
    acc = fx.reduce(out.shape, (grid, grid), "sum" if mode == "avg" else "max", body)
    if mode == "avg":
        return fx.compute(out.shape, lambda i: cast(acc[i] / float(grid * grid), out.dtype))
    return acc if acc.dtype == out.dtype else fx.compute(out.shape, lambda i: cast(acc[i], out.dtype))


@rule("DeformConv")
def deform_conv(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Deformable convolution: a sampling prim (each input channel bilinearly sampled, zeros outside, at
    every kernel tap moved by its learned offset, times the mask) and one grouped contraction with W."""
    x, w, offset, bias, mask = (list(ins) + [None, None])[:5]
    out = fx.out_type()
    nd = x.rank - 2
    kernel = tuple(w.shape[2:])
    dil = tuple(node.attrs.get("dilations", (1,) * nd))
    strides = tuple(node.attrs.get("strides", (1,) * nd))
    pads = tuple(node.attrs.get("pads", (0,) * (2 * nd)))
    group, og = int(node.attrs.get("group", 1)), int(node.attrs.get("offset_group", 1))
    n, c_in = x.shape[:2]
    taps = math.prod(kernel)
    if c_in != w.shape[1] * group or c_in % og or offset.shape[1] != og * taps * nd:
        raise UnsupportedAttribute(node, "group", (group, og), f"inconsistent with X {x.shape}, W {w.shape}, "
                                   f"offset {offset.shape}")
    axes = [_Axis(size, True, "zeros") for size in x.shape[2:]]
    ft = acc_dtype(x.dtype)
    sizes = out.shape[2:]

    def sample(i):
        b, c, k, o = i[0], i[1], i[2:2 + nd], i[2 + nd:]
        g = c // (c_in // og)
        tap = Const(0, INDEX)
        for d in range(nd):
            tap = tap * kernel[d] + k[d]
        coords = []
        for d in range(nd):
            shift = cast(offset[(b, (g * taps + tap) * nd + d, *o)], F32)
            coords.append(cast(o[d] * strides[d] - pads[d] + k[d] * dil[d], F32) + shift)
        total = None
        for combo in itertools.product(*(ax.taps(v, "linear") for ax, v in zip(axes, coords))):
            v = select(logical_and(*(t[2] for t in combo)), cast(x[(b, c, *(t[0] for t in combo))], ft), Const(0, ft))
            for t in combo:
                v = v * cast(t[1], ft)
            total = v if total is None else total + v
        if mask is not None:
            total = total * cast(mask[(b, g * taps + tap, *o)], ft)
        return cast(total, x.dtype)
    cols = fx.compute((n, c_in) + kernel + sizes, sample)
    m_out = w.shape[0] // group
    cg = w.shape[1]

    def body(i, r):
        oc, c = i[1], (i[1] // m_out) * cg + r[0]
        return cast(cols[(i[0], c, *r[1:], *i[2:])], out.dtype) * cast(w[(oc, r[0], *r[1:])], out.dtype)
    y = fx.reduce(out.shape, (cg,) + kernel, "sum", body)
    if bias is None:
        return y
    return fx.compute(out.shape, lambda i: y[i] + cast(bias[(i[1],)], out.dtype))


def _round_half_away(v: Expr) -> Expr:
    """C's round() (half away from zero), as Caffe and ONNX's reference round box corners."""
    return unary("sign", v) * unary("floor", unary("abs", v) + 0.5)


@rule("MaxRoiPool")
def max_roi_pool(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Max over each bin of each box (Fast R-CNN): a max-reduce over the image, -inf outside the bin.

    The bin's bounds are computed from the loaded box (rounded, floor/ceil, clipped to the image
    as ONNX's reference does); an empty bin (clipped away) gives 0."""
    x, rois = ins
    out = fx.out_type()
    if x.rank != 4 or rois.rank != 2 or rois.shape[1] != 5:
        raise UnsupportedAttribute(node, "rois", rois.shape, f"expected X [N, C, H, W] (got {x.shape}) "
                                   "and rois [num_rois, 5]")
    (ph_n, pw_n), (h, w) = out.shape[2:], x.shape[2:]
    # The reference computes boxes in float64 for float64 data, otherwise in float32.
    ct = DType.float64 if x.dtype is DType.float64 else F32
    scale = float(node.attrs.get("spatial_scale", 1.0))

    def bounds(roi: Expr, p: Expr, k: int, pooled: int, n: int) -> tuple[Expr, Expr]:
        """[start, end) of bin p of the box along the axis whose corners are rois[:, k], rois[:, k + 2]."""
        lo, hi = (_round_half_away(cast(rois[(roi, j)], ct) * Const(scale, ct)) for j in (k, k + 2))
        size = maximum(hi - lo + 1.0, 1.0) / float(pooled)     # a malformed box is one pixel
        pf = cast(p, ct)
        start = minimum(maximum(unary("floor", pf * size) + lo, 0.0), float(n))
        end = minimum(maximum(unary("ceil", (pf + 1.0) * size) + lo, 0.0), float(n))
        return start, end

    def body(i, r):
        roi, c, ph, pw = i
        (hs, he), (ws, we) = bounds(roi, ph, 2, ph_n, h), bounds(roi, pw, 1, pw_n, w)
        yy, xx = cast(r[0], ct), cast(r[1], ct)
        inside = logical_and(yy.ge(hs), yy.lt(he), xx.ge(ws), xx.lt(we))
        b = cast(rois[(roi, 0)], INDEX)
        return select(inside, x[(b, c, r[0], r[1])], Const(-math.inf, x.dtype))
    acc = fx.reduce(out.shape, (h, w), "max", body)

    def finish(i):
        roi, _, ph, pw = i
        (hs, he), (ws, we) = bounds(roi, ph, 2, ph_n, h), bounds(roi, pw, 1, pw_n, w)
        return select(binary("or", he.le(hs), we.le(ws)), Const(0.0, out.dtype), cast(acc[i], out.dtype))
    return fx.compute(out.shape, finish)
