"""Fission rules: pooling.

A pool is one reduce prim over the window (``max`` combiner for MaxPool, ``sum`` for the others);
positions outside the input are masked inside the body with a Select (no padded copy: a pool
body is not a product, so nothing is gained by materializing one).  Averages divide by a count
given by integer index arithmetic on the output position (a constant where the count is the same
everywhere along a dim), so borders match ONNX/torch exactly.  Sums of 16-bit inputs are kept in
fp32 until the division.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from ..errors import UnsupportedAttribute
from ..ir.dtypes import DType
from ..ir.expr import INDEX, Const, Expr, binary, cast, logical_and, maximum, minimum, select, unary
from ..ir.graph import Node
from ..ir.prim import reduce_init
from .common import acc_dtype
from .conv import Window, window
from .registry import Fission, TensorRef, rule

INT64_MAX = (1 << 63) - 1


def _pool_window(node: Node, x: TensorRef) -> Window:
    if x.rank < 3:
        raise UnsupportedAttribute(node, "shapes", x.shape, "pools need an (N, C, spatial...) input")
    kernel = node.attrs.get("kernel_shape")
    if kernel is None or len(kernel) != x.rank - 2:
        raise UnsupportedAttribute(node, "kernel_shape", kernel, f"need {x.rank - 2} kernel sizes")
    return window(node, x.shape[2:], tuple(kernel), bool(node.attrs.get("ceil_mode", 0)))


def _taps(win: Window) -> tuple[tuple[int, ...], Callable[[tuple], tuple]]:
    """The window's reduced extents, and the map from reduce vars to taps.

    Only taps that land inside the input for some output position are reduced over: a window
    larger than its input (a ceil_mode pool over a small map) otherwise reads mostly padding.
    """
    first, count = [], []
    for d, k in enumerate(win.kernel):
        s, dil, pb, n, o = (win.strides[d], win.dilations[d], win.pads_begin[d], win.in_sizes[d],
                            win.out_sizes[d])
        lo = max(0, -(-(pb - (o - 1) * s) // dil))
        hi = min(k - 1, (n - 1 + pb) // dil)
        lo, hi = (lo, hi) if lo <= hi else (0, k - 1)
        first.append(lo)
        count.append(hi - lo + 1)
    return tuple(count), lambda r: tuple(rd + Const(f, INDEX) if f else rd for rd, f in zip(r, first))


def _window_reduce(fx: Fission, shape, win: Window, combiner: str, body: Callable) -> TensorRef:
    count, tap = _taps(win)
    return fx.reduce(shape, count, combiner, lambda i, r: body(i, tap(r)))


def _out_shape(x: TensorRef, win: Window) -> tuple[int, ...]:
    return x.shape[:2] + win.out_sizes


def _read(x: TensorRef, win: Window, i: tuple, r: tuple, fill) -> Expr:
    """x at the window position (i, r); ``fill`` outside the input."""
    pos = win.positions(i[2:], r)
    return select(win.inside(pos), x[i[:2] + pos], fill)


def _counts(fns: Sequence[Callable], out_sizes: Sequence[int], o: Sequence[Expr]) -> Expr:
    """int64 product over dims of ``fns[d](o_d, max, min)``, folded to a constant per dim where possible.

    Each fn is written once and evaluated both on Python ints (to see whether the dim's count is
    uniform) and on index expressions.
    """
    total: Expr = Const(1, INDEX)
    for fn, n, od in zip(fns, out_sizes, o):
        values = {fn(v, max, min) for v in range(n)}
        total = total * (Const(values.pop(), INDEX) if len(values) == 1 else fn(od, maximum, minimum))
    return total


def _window_count(win: Window, d: int, include_pad: bool) -> Callable:
    """Number of taps of dim d that fall in [lo, hi): the input, or the input with its pads."""
    s, pb, k, dil, size = win.strides[d], win.pads_begin[d], win.kernel[d], win.dilations[d], win.in_sizes[d]
    lo, hi = (-pb, size + win.pads_end[d]) if include_pad else (0, size)

    def taps(a):  # number of taps t >= 0 with t*dil < a, for a > 0
        return a if dil == 1 else (a + dil - 1) // dil

    def count(o, mx, mn):
        start = o * s - pb
        return mx(0, mn(k, taps(hi - start)) - mx(0, taps(lo - start)))

    return count


def _mean(fx: Fission, total: TensorRef, count: Callable[[tuple], Expr], dtype: DType) -> TensorRef:
    """Elementwise prim ``total / count(output spatial index)``, rounded once to dtype."""
    acc = total.dtype

    def divisor(o):
        c = count(o)
        return Const(c.value, acc) if isinstance(c, Const) else cast(c, acc)

    return fx.compute(total.shape, lambda i: cast(total[i] / divisor(i[2:]), dtype))


@rule("MaxPool")
def max_pool(fx: Fission, node: Node, ins: list):
    """Max over the window (pads, dilations, ceil_mode, auto_pad); optional Indices by an argmin-of-index prim."""
    x = ins[0]
    win = _pool_window(node, x)
    lowest = Const(reduce_init("max", x.dtype), x.dtype)
    y = _window_reduce(fx, _out_shape(x, win), win, "max", lambda i, r: _read(x, win, i, r, lowest))
    if len(node.outputs) < 2 or not node.outputs[1]:
        return y
    return [y, _max_indices(fx, node, x, win, y)]


def _max_indices(fx: Fission, node: Node, x: TensorRef, win: Window, y: TensorRef) -> TensorRef:
    """Flat index of the first window element equal to the max (ONNX: row-major over N, C, spatial)."""
    sizes = x.shape

    def flat(i, pos):
        f = i[0] * sizes[1] + i[1]
        for p, n in zip(pos, sizes[2:]):
            f = f * n + p
        return f

    lowest = Const(reduce_init("max", x.dtype), x.dtype)

    def body(i, r):
        pos = win.positions(i[2:], r)
        hit = logical_and(win.inside(pos), _read(x, win, i, r, lowest).eq(y[i]))
        return select(hit, flat(i, pos), Const(INT64_MAX, INDEX))

    # Row-major flat indices grow with the window position, so the min is the first maximum.
    idx = _window_reduce(fx, y.shape, win, "min", body)
    order = node.attrs.get("storage_order", 0)
    if order not in (0, 1):
        raise UnsupportedAttribute(node, "storage_order", order, "expected 0 or 1")
    return idx if order == 0 else fx.compute(y.shape, lambda i: _column_major(idx[i], sizes[2:]))


def _column_major(f: Expr, spatial: Sequence[int]) -> Expr:
    """Row-major flat index -> the same element with column-major spatial dims (storage_order=1)."""
    total = 1
    for n in spatial:
        total *= n
    rem = f % total
    out, below, after = f - rem, 1, total
    for n in spatial:
        after //= n
        out = out + (rem // after) % n * below
        below *= n
    return out


@rule("AveragePool")
def average_pool(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Mean over the window: sum prim, then divide by the count of taps (count_include_pad, ceil_mode)."""
    x = ins[0]
    win = _pool_window(node, x)
    acc = acc_dtype(x.dtype)
    total = _window_reduce(fx, _out_shape(x, win), win, "sum",
                           lambda i, r: cast(_read(x, win, i, r, Const(0, x.dtype)), acc))
    include = bool(node.attrs.get("count_include_pad", 0))
    fns = [_window_count(win, d, include) for d in range(len(win.kernel))]
    return _mean(fx, total, lambda o: _counts(fns, win.out_sizes, o), x.dtype)


def _power_sum(fx: Fission, node: Node, shape, extents, read: Callable, dtype: DType) -> TensorRef:
    """(sum |v|^p)^(1/p) as a sum prim and a root prim."""
    p = node.attrs.get("p", 2)
    if p <= 0:
        raise UnsupportedAttribute(node, "p", p, "must be positive")
    acc = acc_dtype(dtype)

    def power(v: Expr) -> Expr:
        v = cast(v, acc)
        if p == 2:
            return v * v
        return unary("abs", v) if p == 1 else binary("pow", unary("abs", v), Const(p, acc))

    total = fx.reduce(shape, extents, "sum", lambda i, r: power(read(i, r)))
    if p == 1:
        return fx.compute(shape, lambda i: cast(total[i], dtype))
    root = (lambda v: unary("sqrt", v)) if p == 2 else (lambda v: binary("pow", v, Const(1.0 / p, acc)))
    return fx.compute(shape, lambda i: cast(root(total[i]), dtype))


@rule("LpPool")
def lp_pool(fx: Fission, node: Node, ins: list) -> TensorRef:
    """p-norm over the window (zero padding): sum of |x|^p prim, then the p-th root."""
    x = ins[0]
    win = _pool_window(node, x)
    zero = Const(0, x.dtype)
    count, tap = _taps(win)
    return _power_sum(fx, node, _out_shape(x, win), count, lambda i, r: _read(x, win, i, tap(r), zero), x.dtype)


def _global_shape(node: Node, x: TensorRef) -> tuple[int, ...]:
    if x.rank < 3:
        raise UnsupportedAttribute(node, "shapes", x.shape, "pools need an (N, C, spatial...) input")
    return x.shape[:2] + (1,) * (x.rank - 2)


@rule("GlobalMaxPool")
def global_max_pool(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Max over all spatial dims (kept as size 1): one reduce prim."""
    x = ins[0]
    return fx.reduce(_global_shape(node, x), x.shape[2:], "max", lambda i, r: x[i[:2] + r])


@rule("GlobalAveragePool")
def global_average_pool(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Mean over all spatial dims (kept as size 1): sum prim, then divide."""
    x = ins[0]
    acc = acc_dtype(x.dtype)
    total = fx.reduce(_global_shape(node, x), x.shape[2:], "sum", lambda i, r: cast(x[i[:2] + r], acc))
    n = 1
    for s in x.shape[2:]:
        n *= s
    return _mean(fx, total, lambda o: Const(n, INDEX), x.dtype)


@rule("GlobalLpPool")
def global_lp_pool(fx: Fission, node: Node, ins: list) -> TensorRef:
    """p-norm over all spatial dims: sum of |x|^p prim, then the p-th root."""
    x = ins[0]
    return _power_sum(fx, node, _global_shape(node, x), x.shape[2:], lambda i, r: x[i[:2] + r], x.dtype)


@rule("AdaptiveAveragePool")
def adaptive_average_pool(fx: Fission, node: Node, ins: list) -> TensorRef:
    """PyTorch adaptive average pooling (output size from the output type): masked sum prim, divide."""
    x = ins[0]
    out_type = fx.out_type()
    if x.rank < 3 or out_type.shape[:2] != x.shape[:2]:
        raise UnsupportedAttribute(node, "shapes", (x.shape, out_type.shape), "needs (N, C, spatial...) in and out")
    ins_, outs = x.shape[2:], out_type.shape[2:]
    # bin o of dim d covers [floor(o*in/out), ceil((o+1)*in/out))
    starts = [(lambda o, mx, mn, a=a, b=b: o * a // b) for a, b in zip(ins_, outs)]
    lengths = [(lambda o, mx, mn, a=a, b=b: ((o + 1) * a + b - 1) // b - o * a // b) for a, b in zip(ins_, outs)]
    widths = tuple(max((ln(o, max, min) for o in range(b)), default=0) for ln, b in zip(lengths, outs))
    ragged = [len({ln(o, max, min) for o in range(b)}) > 1 for ln, b in zip(lengths, outs)]
    acc = acc_dtype(x.dtype)

    def body(i, r):
        o = i[2:]
        pos = tuple(st(od, maximum, minimum) + rd for st, od, rd in zip(starts, o, r))
        inside = logical_and(*(rd.lt(ln(od, maximum, minimum))
                               for ln, od, rd, rag in zip(lengths, o, r, ragged) if rag))
        return cast(select(inside, x[i[:2] + pos], Const(0, x.dtype)), acc)

    total = fx.reduce(out_type.shape, widths, "sum", body)
    return _mean(fx, total, lambda o: _counts(lengths, outs, o), x.dtype)


@rule("Col2Im")
def col2im(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Sum of sliding blocks into an image (im2col's inverse): a sum-reduce over the block's taps,
    each output pixel reading the column of the block position that covers it (masked where none)."""
    x, out = ins[0], fx.out_type()
    image, block = tuple(node.attrs["image_shape"]), tuple(node.attrs["block_shape"])
    nd = len(image)
    dil = tuple(node.attrs.get("dilations", (1,) * nd))
    strides = tuple(node.attrs.get("strides", (1,) * nd))
    pads = tuple(node.attrs.get("pads", (0,) * (2 * nd)))
    blocks = [(image[d] + pads[d] + pads[nd + d] - dil[d] * (block[d] - 1) - 1) // strides[d] + 1 for d in range(nd)]
    taps = math.prod(block)
    if x.rank != 3 or x.shape[1] % taps or x.shape[2] != math.prod(blocks) or min(blocks) < 1:
        raise UnsupportedAttribute(node, "block_shape", block, f"input {x.shape} for image {image}")

    def body(i, r):
        n, c, pos = i[0], i[1], i[2:]
        inside, col, row = [], Const(0, INDEX), c * taps
        for d in range(nd):
            q = pos[d] + pads[d] - r[d] * dil[d]        # the block start's offset, times its stride
            j = q // strides[d]
            inside += [q.ge(0), j.lt(blocks[d])] + ([(q % strides[d]).eq(0)] if strides[d] > 1 else [])
            col = col * blocks[d] + minimum(maximum(j, 0), blocks[d] - 1)
            row = row + r[d] * math.prod(block[d + 1:])
        return select(logical_and(*inside), cast(x[(n, row, col)], acc_dtype(x.dtype)), Const(0, acc_dtype(x.dtype)))
    y = fx.reduce(out.shape, block, "sum", body)
    return y if y.dtype == out.dtype else fx.compute(out.shape, lambda i: cast(y[i], out.dtype))


@rule("MaxUnpool")
def max_unpool(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Each pooled value back at its index, zeros elsewhere (a scatter, written as a gather): for each
    output position a max-reduce over the inputs whose pooling window covers it finds the last one
    whose index names it (ONNX's write order), then one load of that input."""
    x, ind = ins[0], ins[1]
    out = fx.out_type()
    nd = x.rank - 2
    kernel = tuple(node.attrs["kernel_shape"])
    strides = tuple(node.attrs.get("strides", (1,) * nd))
    pads = tuple(node.attrs.get("pads", (0,) * (2 * nd)))
    inferred = [(x.shape[2 + d] - 1) * strides[d] - pads[d] - pads[nd + d] + kernel[d] for d in range(nd)]
    reach = [-(-kernel[d] // strides[d]) for d in range(nd)]       # inputs whose window covers one position
    plane = math.prod(inferred)

    def winner(i, r):
        n, c, pos = i[0], i[1], i[2:]
        src, ok = [], [p.lt(inferred[d]) for d, p in enumerate(pos)]
        for d, p in enumerate(pos):
            j = (p + pads[d]) // strides[d] - r[d]
            ok += [j.ge(0), j.lt(x.shape[2 + d]), (p + pads[d] - j * strides[d]).lt(kernel[d])]
            src.append(minimum(maximum(j, 0), x.shape[2 + d] - 1))
        flat = Const(0, INDEX)
        for d, p in enumerate(pos):
            flat = flat * inferred[d] + p
        hit = logical_and(*ok, cast(ind[(n, c, *src)], INDEX).eq((n * x.shape[1] + c) * plane + flat))
        linear = Const(0, INDEX)
        for d, j in enumerate(src):
            linear = linear * x.shape[2 + d] + j
        return select(hit, linear, Const(-1, INDEX))
    last = fx.reduce(out.shape, reach, "max", winner)

    def body(i):
        k, src = last[i], []
        for d in reversed(range(nd)):
            src.insert(0, maximum(k, 0) // math.prod(x.shape[3 + d:]) % x.shape[2 + d])
        return select(k.ge(0), x[(i[0], i[1], *src)], Const(0, x.dtype))
    return fx.compute(out.shape, body)
