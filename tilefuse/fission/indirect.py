"""Fission rules: indirect operators (an index that depends on loaded data) and Resize.

Gathers put a Load inside a load's index, which ``analysis/classify.py`` calls indirect.  Negative
indices wrap inside the index (``select(idx < 0, idx + n, idx)``).  Resize computes each output
element's source coordinate with index arithmetic and blends the neighbours it reads; scatters
through index tensors cannot be written as one expression per output element in general and are
opaque prims (scatters into static positions are expressions: ``scatter.py``).
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from ..errors import UnsupportedAttribute
from ..ir.dtypes import DType, TensorType
from ..ir.evaluate import eval_prim
from ..ir.expr import INDEX, Const, Expr, Var, binary, cast, maximum, minimum, select, unary
from ..ir.graph import Node
from ..ir.prim import Prim
from .common import acc_dtype, norm_axis
from .layout import empty
from .registry import Fission, TensorRef, rule


def wrap_index(v: Expr, n: int) -> Expr:
    """A loaded index as int64, negative values counted from the end of a dim of size n."""
    v = cast(v, INDEX)
    return select(v.lt(0), v + n, v)


@rule("Gather")
def _gather(fx, node, ins):
    """``data`` indexed along ``axis`` by the ``indices`` tensor (numpy take)."""
    data, ind = ins[0], ins[1]
    axis = norm_axis(node, int(node.attrs.get("axis", 0)), data.rank)
    q = ind.rank
    shape = data.shape[:axis] + ind.shape + data.shape[axis + 1:]
    if math.prod(shape) == 0:
        return empty(fx, shape, data.dtype)
    n = data.shape[axis]
    return fx.compute(shape, lambda i: data[i[:axis] + (wrap_index(ind[i[axis:axis + q]], n),) + i[axis + q:]])


@rule("GatherElements")
def _gather_elements(fx, node, ins):
    """``out[i] = data[i with i[axis] replaced by indices[i]]`` (torch.gather)."""
    data, ind = ins[0], ins[1]
    axis = norm_axis(node, int(node.attrs.get("axis", 0)), data.rank)
    if ind.rank != data.rank:
        raise UnsupportedAttribute(node, "indices", ind.shape, f"must have rank {data.rank} like data")
    return gather_elements(fx, data, ind, axis)


def gather_elements(fx: Fission, data: TensorRef, ind: TensorRef, axis: int) -> TensorRef:
    if math.prod(ind.shape) == 0:
        return empty(fx, ind.shape, data.dtype)
    n = data.shape[axis]
    return fx.compute(ind.shape, lambda i: data[i[:axis] + (wrap_index(ind[i], n),) + i[axis + 1:]])


@rule("GatherND")
def _gather_nd(fx, node, ins):
    """Slices of ``data`` at the index tuples in the last axis of ``indices`` (``batch_dims``)."""
    data, ind = ins[0], ins[1]
    b = int(node.attrs.get("batch_dims", 0))
    m = ind.shape[-1] if ind.rank else 0
    if ind.rank < 1 or not 0 <= b < min(ind.rank, data.rank) or b + m > data.rank:
        raise UnsupportedAttribute(node, "batch_dims", b,
                                   f"indices {list(ind.shape)} do not fit data {list(data.shape)}")
    q = ind.rank - 1
    shape = ind.shape[:-1] + data.shape[b + m:]
    if math.prod(shape) == 0:
        return empty(fx, shape, data.dtype)

    def body(i):
        head = i[:q]
        picked = tuple(wrap_index(ind[head + (k,)], data.shape[b + k]) for k in range(m))
        return data[i[:b] + picked + i[q:]]
    return fx.compute(shape, body)


@rule("OneHot")
def _one_hot(fx, node, ins):
    """``values[1]`` where the output's ``axis`` index equals the (wrapped) index, else ``values[0]``."""
    ind, values = ins[0], ins[-1]
    out = fx.out_type()
    axis = norm_axis(node, int(node.attrs.get("axis", -1)), out.rank)
    depth = out.shape[axis]
    if math.prod(out.shape) == 0:
        return empty(fx, out.shape, out.dtype)

    def body(i):
        k = wrap_index(ind[i[:axis] + i[axis + 1:]], depth)
        return select(k.eq(i[axis]), values[1], values[0])
    return fx.compute(out.shape, body)


# ---------------------------------------------------------------- scatter (opaque)

_REDUCTIONS = ("none", "add", "mul", "max", "min")


def _reduction(node: Node) -> str:
    r = node.attrs.get("reduction", "none")
    if r not in _REDUCTIONS:
        raise UnsupportedAttribute(node, "reduction", r, f"expected one of {', '.join(_REDUCTIONS)}")
    return r


@rule("ScatterElements")
def _scatter_elements(fx, node, ins):
    """``data`` with ``updates`` written (or reduced) at ``indices`` along ``axis`` (opaque, torch scatter)."""
    data, ind, upd = ins[:3]
    axis = norm_axis(node, int(node.attrs.get("axis", 0)), data.rank)
    return fx.opaque("scatter_elements", [data, ind, upd], data.type, axis=axis, reduction=_reduction(node))


@rule("ScatterND")
def _scatter_nd(fx, node, ins):
    """``data`` with ``updates`` written (or reduced) at the index tuples of ``indices`` (opaque)."""
    data, ind, upd = ins[:3]
    return fx.opaque("scatter_nd", [data, ind, upd], data.type, reduction=_reduction(node))


@rule("IndexPut")
def _index_put(fx, node, ins):
    """``data`` with ``values`` written at index tensors along ``dims``, in its memory if ``inplace``.

    tilefuse's own operator: the aten frontend's form of an ``index_put`` whose result replaces a
    model input (a KV cache's new rows); opaque (one prim), a generated kernel in the scatter
    family where it writes whole rows."""
    data, values, *indices = ins
    dims = tuple(int(d) for d in node.attrs["dims"])
    if len(dims) != len(indices):
        raise UnsupportedAttribute(node, "dims", dims, f"one per index tensor ({len(indices)})")
    return fx.opaque("index_put", [data, values, *indices], data.type, dims=dims,
                     inplace=bool(node.attrs.get("inplace", 0)))


# ---------------------------------------------------------------- resize

def resized_length(scale: float, n_in: int, n_out: int) -> float:
    """ONNX's length_resized: scale * n_in, which may be fractional (the output has floor of it).

    Scales derived from sizes carry float32 rounding; those lengths are taken as the exact size.
    """
    length = scale * n_in
    return float(n_out) if math.isclose(length, n_out, rel_tol=1e-6) else length


def _coord_fns() -> dict[str, Callable[[Expr, float, int, int], Expr]]:
    """Source coordinate x (float expression) of output position o, per coordinate mode."""
    def half_pixel(o, scale, n_in, n_out):
        return (o + 0.5) / scale - 0.5

    def pytorch_half_pixel(o, scale, n_in, n_out):
        return half_pixel(o, scale, n_in, n_out) if resized_length(scale, n_in, n_out) != 1 else Const(-0.5, o.dtype)

    def align_corners(o, scale, n_in, n_out):
        length = resized_length(scale, n_in, n_out)
        return o * float(n_in - 1) / (length - 1) if length != 1 else Const(0.0, o.dtype)

    def asymmetric(o, scale, n_in, n_out):
        return o / scale

    def half_pixel_symmetric(o, scale, n_in, n_out):
        offset = n_in / 2 * (1 - n_out / resized_length(scale, n_in, n_out))
        return (offset + (o + 0.5) / scale) - 0.5

    return {"half_pixel": half_pixel, "pytorch_half_pixel": pytorch_half_pixel,
            "align_corners": align_corners, "asymmetric": asymmetric,
            "half_pixel_symmetric": half_pixel_symmetric}


COORD = _coord_fns()

# Nearest source position (float, before clamping) from the source coordinate x.
NEAREST: dict[str, Callable[[Expr], Expr]] = {
    "round_prefer_floor": lambda x: unary("ceil", x - 0.5),
    "round_prefer_ceil": lambda x: unary("floor", x + 0.5),
    "floor": lambda x: unary("floor", x),
    "ceil": lambda x: unary("ceil", x),
}

Tap = tuple[Expr, Expr | None]   # (source index, weight; None for nearest)


def _clamp(e: Expr, n: int) -> Expr:
    return minimum(maximum(e, 0), n - 1)


def _nearest_taps(node, x: Expr, n: int, ft: DType) -> list[Tap]:
    mode = node.attrs.get("nearest_mode", "round_prefer_floor")
    if mode not in NEAREST:
        raise UnsupportedAttribute(node, "nearest_mode", mode, f"expected one of {', '.join(NEAREST)}")
    return [(_clamp(cast(NEAREST[mode](x), INDEX), n), None)]


def _linear_taps(node, x: Expr, n: int, ft: DType) -> list[Tap]:
    x0 = unary("floor", x)
    t = x - x0
    i0 = cast(x0, INDEX)
    return [(_clamp(i0, n), 1.0 - t), (_clamp(i0 + 1, n), t)]


def _cubic_taps(node, x: Expr, n: int, ft: DType) -> list[Tap]:
    a = float(node.attrs.get("cubic_coeff_a", -0.75))
    x0 = unary("floor", x)
    t = x - x0
    i0 = cast(x0, INDEX)

    def near(d):   # |d| <= 1
        return ((d * (a + 2) - (a + 3)) * d) * d + 1.0

    def far(d):    # 1 < |d| < 2
        return ((d * a - 5 * a) * d + 8 * a) * d - 4 * a
    weights = [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
    idx = [i0 + k for k in (-1, 0, 1, 2)]
    if int(node.attrs.get("exclude_outside", 0)):
        inside = [cast(binary("and", j.ge(0), j.lt(n)), ft) for j in idx]
        weights = [w * m for w, m in zip(weights, inside)]
        total = weights[0] + weights[1] + weights[2] + weights[3]
        weights = [w / total for w in weights]
    return [(_clamp(j, n), w) for j, w in zip(idx, weights)]


TAPS: dict[str, Callable[[Node, Expr, int, DType], list[Tap]]] = {
    "nearest": _nearest_taps, "linear": _linear_taps, "cubic": _cubic_taps,
}


def _antialias_taps(node, x: Expr, n: int, scale: float, mode: str) -> list[Tap]:
    """Downsampling with antialias: the linear/cubic filter stretched by 1/scale, so each output
    averages every input pixel under it, weights normalized to sum 1.  As in ONNX's reference, the
    taps cover support/scale either side of x, counted from ceil(x) - 1 (x in (base, base + 1]);
    taps past the border read the edge pixel."""
    a = float(node.attrs.get("cubic_coeff_a", -0.75))
    support = 1.0 if mode == "linear" else 2.0
    start = math.floor(-support / scale) + 1
    base = unary("ceil", x) - 1.0
    ratio = x - base

    def kernel(d: Expr) -> Expr:
        d = unary("abs", d)
        if mode == "linear":
            return maximum(1.0 - d, 0.0)
        near = (d * (a + 2) - (a + 3)) * d * d + 1.0
        far = ((d * a - 5 * a) * d + 8 * a) * d - 4 * a
        return select(d.le(1.0), near, select(d.lt(2.0), far, Const(0.0, d.dtype)))
    offsets = range(start, 2 - start)
    idx = [cast(base, INDEX) + k for k in offsets]
    weights = [kernel((k - ratio) * scale) for k in offsets]
    if int(node.attrs.get("exclude_outside", 0)):
        weights = [w * cast(binary("and", j.ge(0), j.lt(n)), w.dtype) for w, j in zip(weights, idx)]
    total = weights[0]
    for w in weights[1:]:
        total = total + w
    return [(_clamp(j, n), w / total) for j, w in zip(idx, weights)]


def _resize_check(node: Node, x: TensorRef, out: TensorType) -> tuple[list[float], str, str]:
    mode = node.attrs.get("mode", "nearest")
    ctm = node.attrs.get("coordinate_transformation_mode", "half_pixel")
    if mode not in TAPS:
        raise UnsupportedAttribute(node, "mode", mode, "expected nearest, linear or cubic")
    if ctm not in COORD and ctm != CROP:
        raise UnsupportedAttribute(node, "coordinate_transformation_mode", ctm,
                                   f"supported: {', '.join(COORD)}, {CROP}")
    if int(node.attrs.get("antialias", 0)) and mode == "nearest":
        raise UnsupportedAttribute(node, "antialias", 1, "antialias applies to the linear and cubic modes")
    scales = [float(s) for s in node.attrs.get("scales", ())]
    if not scales:
        scales = [o / n if n else 1.0 for o, n in zip(out.shape, x.shape)]
    if len(scales) != x.rank or any(s <= 0 for s in scales):
        raise UnsupportedAttribute(node, "scales", tuple(scales), f"expected {x.rank} positive factors")
    return scales, mode, ctm


@rule("Resize")
def _resize(fx, node, ins):
    """Nearest/linear/cubic resampling by ``scales`` (linear/cubic optionally antialiased).

    Source coordinates by index arithmetic; each output blends its taps along every resized axis."""
    x, out = ins[0], fx.out_type()
    scales, mode, ctm = _resize_check(node, x, out)
    if math.prod(out.shape) == 0 or math.prod(x.shape) == 0:
        return empty(fx, out.shape, out.dtype)
    ft = acc_dtype(x.dtype) if x.dtype.is_float else DType.float32
    # Axes resized by exactly 1 with an unchanged length read straight through; size-1 input
    # axes read element 0; the others blend their taps.
    roi = node.attrs.get("roi") if ctm == CROP else None
    if ctm == CROP and (roi is None or len(roi) != 2 * x.rank):
        raise UnsupportedAttribute(node, "roi", roi, f"{CROP} needs a start and an end per axis")
    antialias = bool(int(node.attrs.get("antialias", 0)))
    scales32 = [float(torch.tensor(s, dtype=torch.float32)) for s in scales]
    moved = [d for d in range(x.rank)
             if x.shape[d] > 1 and not (scales[d] == 1.0 and x.shape[d] == out.shape[d] and roi is None)]

    def coordinate(i, d) -> Expr:
        # Coordinates in float32 whatever the data type, as ONNX carries scales and ORT computes.
        if roi is not None:
            return crop_coordinate(cast(i[d], DType.float32), roi[d], roi[x.rank + d], x.shape[d], out.shape[d])
        return COORD[ctm](cast(i[d], DType.float32), scales32[d], x.shape[d], out.shape[d])

    def axis_taps(i, d) -> list[Tap]:
        if antialias and scales32[d] < 1.0:      # upsampling with antialias is plain interpolation
            taps = _antialias_taps(node, coordinate(i, d), x.shape[d], scales32[d], mode)
        else:
            taps = TAPS[mode](node, coordinate(i, d), x.shape[d], DType.float32)
        if mode == "nearest":
            return [(integer_map(taps[0][0], i[d], out.shape[d], x.shape[d]), None)]
        return [(src, cast(w, ft)) for src, w in taps]

    def body(i):
        base = [i[d] if x.shape[d] > 1 else Const(0, INDEX) for d in range(x.rank)]
        taps = {d: axis_taps(i, d) for d in moved}
        if mode == "nearest":   # one tap per axis: a pure load
            v = x[tuple(taps[d][0][0] if d in taps else base[d] for d in range(x.rank))]
        else:
            v = _to_out(_blend(x, base, moved, taps, ft), out.dtype)
        outside = None      # (tf_crop_and_resize) a source coordinate past the input on some axis
        for d in moved if roi is not None else ():
            c = coordinate(i, d)
            past = binary("or", c.lt(0.0), c.gt(x.shape[d] - 1.0))
            outside = past if outside is None else binary("or", outside, past)
        if outside is None:
            return v
        value = cast(Const(float(node.attrs.get("extrapolation_value", 0.0)), DType.float32), out.dtype)
        return select(outside, value, v)
    return fx.compute(out.shape, body)


CROP = "tf_crop_and_resize"


def crop_coordinate(o: Expr, start: float, end: float, n_in: int, n_out: int) -> Expr:
    """tf_crop_and_resize: the output spans [start, end] of the input (in fractions of its extent)."""
    if n_out == 1:
        return Const((end - start) * (n_in - 1) / 2 + start * (n_in - 1), o.dtype)
    return o * ((end - start) * (n_in - 1) / (n_out - 1)) + start * (n_in - 1)


def integer_map(e: Expr, v: Var, n: int, size: int) -> Expr:
    """``e`` (an index map of ``v`` in [0, n) into [0, size)) in integer form when it has one.

    Nearest resizing by an integer factor computes its float coordinates to ``(a*v + s) // k``
    clamped to the input; finding that form (by evaluating ``e`` with the reference semantics)
    keeps the load quasi-affine for index analysis, with identical results.
    """
    vals = eval_prim(Prim("map", (), (v,), e, TensorType((n,), INDEX)), []).tolist()
    changes = [o for o in range(1, n) if vals[o] != vals[o - 1]]
    if not changes:
        return Const(vals[0], INDEX)
    candidates = [(vals[1] - vals[0], 1, vals[0])]       # (a, k, s): downsampling, k = 1
    if len(changes) > 1:                                 # upsampling: runs of k equal values
        k = changes[1] - changes[0]
        candidates.append((1, k, k * vals[changes[0]] - changes[0]))
    for a, k, s in candidates:
        f = [(a * o + s) // k for o in range(n)]
        if vals == [min(max(y, 0), size - 1) for y in f]:
            out = (v * a + s if s >= 0 else v * a - (-s)) // k
            out = maximum(out, 0) if min(f) < 0 else out
            return minimum(out, size - 1) if max(f) > size - 1 else out
    return e


def _blend(x: TensorRef, idx: list, axes: Sequence[int], taps: dict[int, list[Tap]], ft: DType) -> Expr:
    """Weighted sum over the taps of each resized axis, nested axis by axis (separable)."""
    if not axes:
        return cast(x[tuple(idx)], ft)
    d, rest = axes[0], axes[1:]
    terms = [_blend(x, idx[:d] + [src] + idx[d + 1:], rest, taps, ft) * w for src, w in taps[d]]
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


def _to_out(v: Expr, dtype: DType) -> Expr:
    """Back to the output dtype; integers round half-even and saturate like ONNX's reference."""
    if dtype.is_float or dtype is DType.bool:
        return cast(v, dtype)
    info = torch.iinfo(dtype.to_torch())
    return cast(minimum(maximum(unary("round", v), float(info.min)), float(info.max)), dtype)
