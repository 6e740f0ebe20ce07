"""Fission rules: layout operators (data movement only).

Every prim built here is loads through index maps, Selects and constants: no arithmetic on
values, so ``analysis/classify.py`` sees pure layout (or broadcast / elementwise for the trivial
cases).  Index maps are kept small: a reshape groups dimensions whose products match and only
splits or merges inside a group, and size-1 dimensions never appear in an expression.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from ..errors import UnsupportedAttribute
from ..ir.dtypes import DType
from ..ir.expr import INDEX, Const, Expr, cast, logical_and, maximum, minimum, select
from ..ir.graph import Node
from .common import bcast, norm_axis
from .registry import Fission, TensorRef, rule


def zero(dtype: DType) -> Const:
    return Const(0, dtype)


def empty(fx: Fission, shape: Sequence[int], dtype: DType) -> TensorRef:
    """A prim for a tensor with no elements (nothing to load, nothing to evaluate)."""
    return fx.compute(shape, lambda i: zero(dtype))


# ---------------------------------------------------------------- reshape

def dim_groups(out_shape: Sequence[int], in_shape: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Pair the fewest runs of output and input dims with equal products (size-1 dims dropped)."""
    a = [d for d, n in enumerate(out_shape) if n != 1]
    b = [d for d, n in enumerate(in_shape) if n != 1]
    groups, ga, gb, pa, pb, ia, ib = [], [], [], 1, 1, 0, 0
    while ia < len(a) or ib < len(b):
        if ia < len(a) and (pa <= pb or ib == len(b)):
            pa *= out_shape[a[ia]]
            ga.append(a[ia])
            ia += 1
        else:
            pb *= in_shape[b[ib]]
            gb.append(b[ib])
            ib += 1
        if pa == pb and ga and gb:
            groups.append((ga, gb))
            ga, gb, pa, pb = [], [], 1, 1
    return groups


def linearize(idx: Sequence[Expr], sizes: Sequence[int]) -> Expr:
    """Row-major offset of idx in a box of sizes, as a sum of index * stride (affine form)."""
    out, stride = Const(0, INDEX), 1
    for e, n in reversed(list(zip(idx, sizes))):
        out = e * stride + out
        stride *= n
    return out


def unflatten(lin: Expr, sizes: Sequence[int]) -> list[Expr]:
    """Row-major coordinates of offset lin (0 <= lin < prod(sizes)); the first needs no mod."""
    out, stride = [], math.prod(sizes)
    for k, n in enumerate(sizes):
        stride //= n
        e = lin // stride
        out.append(e if k == 0 else e % n)
    return out


def reshape_index(i: Sequence[Expr], out_shape: Sequence[int], in_shape: Sequence[int]) -> tuple[Expr, ...]:
    """Input index read by out[i] when a row-major tensor of in_shape is re-viewed as out_shape."""
    idx: list[Expr] = [Const(0, INDEX)] * len(in_shape)
    for outs, ins in dim_groups(out_shape, in_shape):
        lin = linearize([i[d] for d in outs], [out_shape[d] for d in outs])
        for d, e in zip(ins, unflatten(lin, [in_shape[d] for d in ins])):
            idx[d] = e
    return tuple(idx)


def reshape(fx: Fission, x: TensorRef, shape: Sequence[int]) -> TensorRef:
    shape = tuple(shape)
    if math.prod(shape) == 0:
        return empty(fx, shape, x.dtype)
    return fx.compute(shape, lambda i: x[reshape_index(i, shape, x.shape)])


@rule("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def _reshape(fx, node, ins):
    """Row-major re-view to the declared output shape (floordiv/mod only inside merged dim groups)."""
    return reshape(fx, ins[0], fx.out_type().shape)


@rule("Expand")
def _expand(fx, node, ins):
    """Numpy broadcast to the declared output shape (size-1 dims read element 0)."""
    x, shape = ins[0], fx.out_type().shape
    if math.prod(shape) == 0:
        return empty(fx, shape, x.dtype)
    return fx.compute(shape, lambda i: bcast(x, i, shape))


# ---------------------------------------------------------------- permutations and blocks

@rule("Transpose")
def _transpose(fx, node, ins):
    """Permute axes by ``perm`` (default: reversed)."""
    x = ins[0]
    given = tuple(node.attrs.get("perm", reversed(range(x.rank))))
    perm = tuple(norm_axis(node, int(p), x.rank, "perm") for p in given)
    if sorted(perm) != list(range(x.rank)):
        raise UnsupportedAttribute(node, "perm", given, f"not a permutation of {x.rank} axes")
    inv = {p: k for k, p in enumerate(perm)}
    shape = tuple(x.shape[p] for p in perm)
    if math.prod(shape) == 0:
        return empty(fx, shape, x.dtype)
    return fx.compute(shape, lambda i: x[tuple(i[inv[d]] for d in range(x.rank))])


def _blocksize(node: Node, x: TensorRef) -> int:
    b = int(node.attrs.get("blocksize", 0))
    if b < 1:
        raise UnsupportedAttribute(node, "blocksize", b, "must be a positive integer")
    if x.rank != 4:
        raise UnsupportedAttribute(node, "rank", x.rank, "input must be 4-D (N, C, H, W)")
    return b


# channel index read by DepthToSpace output (c, h % b, w % b): ONNX's two channel orders.
_D2S_CHANNEL: dict[str, Callable[[Expr, Expr, Expr, int, int], Expr]] = {
    "DCR": lambda c, bh, bw, b, cout: (bh * b + bw) * cout + c,
    "CRD": lambda c, bh, bw, b, cout: c * (b * b) + bh * b + bw,
}


@rule("DepthToSpace")
def _depth_to_space(fx, node, ins):
    """Move channel blocks into b x b spatial blocks (``mode`` DCR or CRD)."""
    x = ins[0]
    b = _blocksize(node, x)
    mode = node.attrs.get("mode", "DCR")
    if mode not in _D2S_CHANNEL:
        raise UnsupportedAttribute(node, "mode", mode, "expected DCR or CRD")
    n, c, h, w = x.shape
    cout = c // (b * b)
    chan = _D2S_CHANNEL[mode]
    shape = (n, cout, h * b, w * b)
    if math.prod(shape) == 0:
        return empty(fx, shape, x.dtype)
    return fx.compute(shape, lambda i: x[i[0], chan(i[1], i[2] % b, i[3] % b, b, cout), i[2] // b, i[3] // b])


# (channel, row in block, column in block) of SpaceToDepth output channel co: inverse of the above.
_S2D_SOURCE: dict[str, Callable[[Expr, int, int], tuple[Expr, Expr, Expr]]] = {
    "DCR": lambda co, b, c: (co % c, co // (b * c), co // c % b),
    "CRD": lambda co, b, c: (co // (b * b), co // b % b, co % b),
}


@rule("SpaceToDepth")
def _space_to_depth(fx, node, ins):
    """Move b x b spatial blocks into channels (``mode`` DCR: block position major, or CRD)."""
    x = ins[0]
    b = _blocksize(node, x)
    mode = node.attrs.get("mode", "DCR")
    if mode not in _S2D_SOURCE:
        raise UnsupportedAttribute(node, "mode", mode, "expected DCR or CRD")
    n, c, h, w = x.shape
    shape = (n, c * b * b, h // b, w // b)
    if math.prod(shape) == 0:
        return empty(fx, shape, x.dtype)

    def body(i):
        ch, bh, bw = _S2D_SOURCE[mode](i[1], b, c)
        return x[i[0], ch, i[2] * b + bh, i[3] * b + bw]
    return fx.compute(shape, body)


# ---------------------------------------------------------------- concat and split

@rule("Concat")
def _concat(fx, node, ins):
    """Join along ``axis``: nested Selects on the axis index pick the input."""
    xs = [x for x in ins if x is not None]
    axis = norm_axis(node, int(node.attrs.get("axis", 0)), xs[0].rank)
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    parts, off = [], 0
    for x in xs:
        if x.shape[axis]:
            parts.append((x, off))
            off += x.shape[axis]
    if math.prod(shape) == 0:
        return empty(fx, shape, xs[0].dtype)

    def body(i):
        def at(x, o):
            return x[i[:axis] + (i[axis] - o,) + i[axis + 1:]]
        x, o = parts[-1]
        out = at(x, o)
        for (x, o), (_, nxt) in reversed(list(zip(parts, parts[1:]))):
            out = select(i[axis].lt(nxt), at(x, o), out)
        return out
    return fx.compute(shape, body)


def split_sizes(node: Node, n: int, parts: int) -> tuple[int, ...]:
    """``split`` if given, else ONNX's num_outputs rule: ceil(n / parts) each, the last smaller."""
    if "split" in node.attrs:
        sizes = tuple(int(s) for s in node.attrs["split"])
    else:
        size = -(-n // parts)
        sizes = tuple(max(0, min(size, n - k * size)) for k in range(parts))
    if sum(sizes) != n or any(s < 0 for s in sizes):
        raise UnsupportedAttribute(node, "split", sizes, f"sizes must be non-negative and add up to {n}")
    return sizes


@rule("Split")
def _split(fx, node, ins):
    """Cut along ``axis`` into pieces of sizes ``split`` (equal pieces when absent)."""
    x = ins[0]
    axis = norm_axis(node, int(node.attrs.get("axis", 0)), x.rank)
    sizes = split_sizes(node, x.shape[axis], len(node.outputs))
    outs, off = [], 0
    for k, size in enumerate(sizes):
        shape = x.shape[:axis] + (size,) + x.shape[axis + 1:]
        if not node.outputs[k]:
            outs.append(None)
        elif math.prod(shape) == 0:
            outs.append(empty(fx, shape, x.dtype))
        else:
            outs.append(fx.compute(shape, lambda i, o=off: x[i[:axis] + (i[axis] + o,) + i[axis + 1:]]))
        off += size
    return outs


# ---------------------------------------------------------------- slice

def slice_params(dim: int, start: int, end: int, step: int) -> tuple[int, int, int]:
    """(first index, step, length) of an ONNX slice of a dim, clamped per the ONNX rules."""
    if start < 0:
        start += dim
    if end < 0:
        end += dim
    if step > 0:
        start, end = min(max(start, 0), dim), min(max(end, 0), dim)
    else:
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
    length = max(0, -(-(end - start) // step))
    return start, step, length


def slice_window(node, shape: Sequence[int]) -> list[tuple[int, int, int]]:
    """(first, step, length) per axis of a tensor of ``shape`` for the node's Slice attributes
    (``starts``/``ends``/``axes``/``steps``; negative, clamped, reversed; axes not named whole)."""
    starts = tuple(node.attrs.get("starts", ()))
    ends = tuple(node.attrs.get("ends", ()))
    axes = tuple(node.attrs.get("axes", range(len(starts))))
    steps = tuple(node.attrs.get("steps", (1,) * len(starts)))
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise UnsupportedAttribute(node, "starts", starts, "starts, ends, axes and steps differ in length")
    if 0 in steps:
        raise UnsupportedAttribute(node, "steps", steps, "a step cannot be 0")
    window = [(0, 1, n) for n in shape]
    seen = set()
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = norm_axis(node, int(a), len(shape), "axes")
        if a in seen:
            raise UnsupportedAttribute(node, "axes", axes, "repeated axis")
        seen.add(a)
        window[a] = slice_params(shape[a], int(s), int(e), int(st))
    return window


@rule("Slice")
def _slice(fx, node, ins):
    """Strided window per axis (``starts``/``ends``/``axes``/``steps``; negative, clamped, reversed)."""
    x = ins[0]
    window = slice_window(node, x.shape)
    shape = [length for _, _, length in window]
    if math.prod(shape) == 0:
        return empty(fx, shape, x.dtype)
    return fx.compute(shape, lambda i: x[tuple(i[d] * step + first for d, (first, step, _) in enumerate(window))])


# ---------------------------------------------------------------- pad

def _reflect(pos: Expr, n: int, before: int, after: int) -> Expr:
    if n == 1:
        return Const(0, INDEX)
    if before < n and after < n:   # one reflection per side: piecewise affine
        e = select(pos.ge(n), 2 * (n - 1) - pos, pos) if after else pos
        return select(pos.lt(0), -pos, e) if before else e
    period = 2 * (n - 1)
    m = pos % period
    return select(m.lt(n), m, period - m)


def _edge(pos: Expr, n: int, before: int, after: int) -> Expr:
    e = maximum(pos, 0) if before else pos
    return minimum(e, n - 1) if after else e


def _wrap(pos: Expr, n: int, before: int, after: int) -> Expr:
    if before <= n and after <= n:
        e = select(pos.ge(n), pos - n, pos) if after else pos
        return select(pos.lt(0), pos + n, e) if before else e
    return pos % n


# Position in [0, n) read for position pos of an axis padded by (before, after) > 0, per mode
# (numpy.pad semantics, repeating for pads wider than the input).
_PAD_MAP: dict[str, Callable[[Expr, int, int, int], Expr]] = {"reflect": _reflect, "edge": _edge, "wrap": _wrap}


@rule("Pad")
def _pad(fx, node, ins):
    """Pad (constant/reflect/edge/wrap) with ``pads`` begins-then-ends; negative pads crop first."""
    x = ins[0]
    cv = ins[1] if len(ins) > 1 else None
    mode = node.attrs.get("mode", "constant")
    pads = tuple(int(p) for p in node.attrs.get("pads", (0,) * 2 * x.rank))
    if len(pads) != 2 * x.rank:
        raise UnsupportedAttribute(node, "pads", pads, f"expected {2 * x.rank} values (begins, then ends)")
    if mode != "constant" and mode not in _PAD_MAP:
        raise UnsupportedAttribute(node, "mode", mode, "expected constant, reflect, edge or wrap")
    begin, end = pads[:x.rank], pads[x.rank:]
    # Crop (negative pads) first: axis d then spans [lo, lo + n) of the input.
    lo = [max(-b, 0) for b in begin]
    n = [x.shape[d] - lo[d] - max(-end[d], 0) for d in range(x.rank)]
    if any(m < 0 for m in n):
        raise UnsupportedAttribute(node, "pads", pads, "crops more than the input has")
    shape = tuple(n[d] + max(begin[d], 0) + max(end[d], 0) for d in range(x.rank))
    if math.prod(shape) == 0:
        return empty(fx, shape, x.dtype)
    padded = [d for d in range(x.rank) if begin[d] > 0 or end[d] > 0]
    if mode != "constant" and any(n[d] == 0 for d in padded):
        raise UnsupportedAttribute(node, "mode", mode, "cannot pad an empty axis except with a constant")

    def body(i):
        pos = [i[d] - max(begin[d], 0) for d in range(x.rank)]
        if mode == "constant":
            inside = logical_and(*[pos[d].ge(0) for d in padded if begin[d] > 0],
                                 *[pos[d].lt(n[d]) for d in padded if end[d] > 0])
            return select(inside, x[tuple(p + o for p, o in zip(pos, lo))], _pad_value(x, cv))
        src = [(_PAD_MAP[mode](pos[d], n[d], max(begin[d], 0), max(end[d], 0)) if d in padded else pos[d]) + lo[d]
               for d in range(x.rank)]
        return x[tuple(src)]
    return fx.compute(shape, body)


def _pad_value(x: TensorRef, cv: TensorRef | None) -> Expr:
    """The constant padding value: 0, or the one element of the constant_value input."""
    if cv is None:
        return zero(x.dtype)
    return cast(cv[(0,) * cv.rank], x.dtype)


# ---------------------------------------------------------------- tile, trilu

@rule("Tile")
def _tile(fx, node, ins):
    """Repeat ``repeats[d]`` times along each axis (index mod input size)."""
    x = ins[0]
    reps = tuple(int(r) for r in node.attrs.get("repeats", ()))
    if len(reps) != x.rank or any(r < 0 for r in reps):
        raise UnsupportedAttribute(node, "repeats", reps, f"expected {x.rank} non-negative counts")
    shape = tuple(n * r for n, r in zip(x.shape, reps))
    if math.prod(shape) == 0:
        return empty(fx, shape, x.dtype)
    return fx.compute(shape, lambda i: x[tuple(i[d] if reps[d] == 1 else (i[d] % x.shape[d]) if x.shape[d] > 1
                                                else 0 for d in range(x.rank))])


@rule("Trilu")
def _trilu(fx, node, ins):
    """Keep the upper (``upper=1``) or lower triangle of the last two axes, offset by ``k``."""
    x = ins[0]
    if x.rank < 2:
        raise UnsupportedAttribute(node, "rank", x.rank, "input must have at least 2 dims")
    upper = bool(node.attrs.get("upper", 1))
    kin = ins[1] if len(ins) > 1 and "k" not in node.attrs else None
    if math.prod(x.shape) == 0:
        return empty(fx, x.shape, x.dtype)

    def body(i):
        k = cast(kin[(0,) * kin.rank], INDEX) if kin is not None else Const(int(node.attrs.get("k", 0)), INDEX)
        diag = i[-1] - i[-2]
        keep = diag.ge(k) if upper else diag.le(k)
        return select(keep, x[i], zero(x.dtype))
    return fx.compute(x.shape, body)


# ---------------------------------------------------------------- reverse sequence

@rule("ReverseSequence")
def reverse_sequence(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Reverse the first ``sequence_lens[b]`` steps along ``time_axis`` of each batch entry: one load
    whose time index reads the length (a data-dependent index, like a gather)."""
    x, lens = ins
    t_ax = norm_axis(node, int(node.attrs.get("time_axis", 0)), x.rank, "time_axis")
    b_ax = norm_axis(node, int(node.attrs.get("batch_axis", 1)), x.rank, "batch_axis")
    if t_ax == b_ax or lens.shape != (x.shape[b_ax],):
        raise UnsupportedAttribute(node, "batch_axis", b_ax, f"sequence_lens {lens.shape} for input {x.shape}")

    def body(i):
        n = cast(lens[(i[b_ax],)], INDEX)
        t = select(i[t_ax].lt(n), n - 1 - i[t_ax], i[t_ax])
        return x[i[:t_ax] + (t,) + i[t_ax + 1:]]
    return fx.compute(x.shape, body)


@rule("TensorScatter")
def tensor_scatter(fx: Fission, node: Node, ins: list) -> TensorRef:
    """A cache update written as a gather: position s along ``axis`` of batch b reads the update at
    s - write_indices[b] where that falls inside it (modulo the cache length, ``circular``), else
    the past cache."""
    cache, update, where = (list(ins) + [None])[:3]
    axis = norm_axis(node, int(node.attrs.get("axis", -2)), cache.rank)
    mode = node.attrs.get("mode", "linear")
    if mode not in ("linear", "circular") or axis == 0:
        raise UnsupportedAttribute(node, "mode", (mode, axis), "expected linear or circular along a non-batch axis")
    n_max, n_new = cache.shape[axis], update.shape[axis]

    def body(i):
        start = cast(where[(i[0],)], INDEX) if where is not None else Const(0, INDEX)
        k = i[axis] - start
        if mode == "circular":
            k = (k + n_max) % n_max
        inside = logical_and(k.ge(0), k.lt(n_new))
        j = minimum(maximum(k, 0), n_new - 1)
        return select(inside, update[i[:axis] + (j,) + i[axis + 1:]], cache[i])
    return fx.compute(cache.shape, body)
