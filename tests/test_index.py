"""Interval and affine analysis of index expressions, and Welder-style tile propagation."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strategies import VARS, bool_exprs, eval_on_grid, index_exprs, ranges
from tilefuse.analysis.index import (EMPTY, UNKNOWN, affine_form, bounds, box_shape, extent_ranges, input_boxes,
                                     load_box)
from tilefuse.fission.registry import Fission
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.expr import INDEX, Const, Load, Var, binary, cast, logical_and, maximum, minimum, select
from tilefuse.ir.prim import Reduction

F32 = DType.float32
i, j, k = VARS
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------- properties

@PROPS
@given(st.one_of(index_exprs(), bool_exprs()), ranges())
def test_bounds_contain_every_value(e, rng):
    vals = eval_on_grid(e, rng).to(torch.int64)
    lo, hi = bounds(e, rng)
    assert lo <= int(vals.min()) and int(vals.max()) <= hi, f"{e}: {lo}..{hi} under {rng}"


@st.composite
def affine_exprs(draw):
    coeffs = draw(st.tuples(*(st.integers(-5, 5) for _ in VARS)))
    e = Const(draw(st.integers(-9, 9)), INDEX)
    for v, c in zip(VARS, coeffs):
        e = e + v * c if draw(st.booleans()) else v * c - e   # mixed shapes, same affine family
    return e


@PROPS
@given(affine_exprs(), ranges())
def test_affine_bounds_are_tight_and_form_is_exact(e, rng):
    vals = eval_on_grid(e, rng)
    assert bounds(e, rng) == (int(vals.min()), int(vals.max()))   # attained at corners
    form = affine_form(e)
    assert form is not None
    coeffs, const = form
    assert all(isinstance(v, Var) and c != 0 for v, c in coeffs.items())
    grid = [torch.arange(rng[v][0], rng[v][1] + 1).reshape([-1 if d == n else 1 for d in range(3)])
            for n, v in enumerate(VARS)]
    want = const + sum((coeffs.get(v, 0) * g for v, g in zip(VARS, grid)), torch.zeros((), dtype=torch.int64))
    assert torch.equal(vals, want.expand(vals.shape))


@PROPS
@given(index_exprs(), ranges())
def test_affine_form_only_for_affine_expressions(e, rng):
    form = affine_form(e)
    if form is not None:   # whenever a form is claimed, it must evaluate like e
        coeffs, const = form
        sub = const + sum((v * c for v, c in coeffs.items()), Const(0, INDEX))
        assert torch.equal(eval_on_grid(sub, rng), eval_on_grid(e, rng))


# ---------------------------------------------------------------- bounds of single constructs

R = {i: (0, 5), j: (0, 19), k: (-4, 3)}


@pytest.mark.parametrize("expr, want", [
    (i * 20 + j, (0, 119)),
    (i - i + 3, (3, 3)),                                      # exact through affine forms
    (j - i * 2, (-10, 19)),
    ((i * 20 + j) // 20, (0, 5)),
    ((i * 20 + j) % 20, (0, 19)),
    ((i * 20 + binary("min", j, Const(9, INDEX))) % 20, (0, 9)),   # one period after dropping 20*i
    (k // 2, (-2, 1)),
    (k % 3, (0, 2)),
    (j // -4, (-5, 0)),
    (j % -4, (-3, 0)),
    (binary("div", k, Const(3, INDEX)), (-1, 1)),            # truncation toward zero
    (binary("fmod", k, Const(3, INDEX)), (-2, 2)),
    (binary("fmod", k, Const(9, INDEX)), (-4, 3)),           # |k| < 9: fmod is k
    (j // maximum(i, Const(1, INDEX)), (0, 19)),
    (maximum(k, i - 2), (-2, 3)),
    (minimum(k, i), (-4, 3)),
    (i * k, (-20, 15)),
    (cast(k, DType.int8), (-4, 3)),
    (select(i.lt(3), i, j), (0, 19)),
    (select(i.lt(3), i, i - 10), (-7, 2)),                   # each branch under its condition
    (select((i - 1).ge(0), i - 1, Const(0, INDEX)), (0, 4)),
    (i.lt(6), (1, 1)),
    (i.lt(j), (0, 1)),
    (logical_and(i.ge(0), (i * 20 + j).lt(120)), (1, 1)),
])
def test_bounds_of_constructs(expr, want):
    assert bounds(expr, R) == want


def test_bounds_unknowns_and_dtype_ranges():
    assert bounds(i + Var("free"), R) == UNKNOWN                       # no range for free
    assert bounds(Load(0, (i,), INDEX), R) == UNKNOWN                  # data-dependent
    assert bounds(Load(0, (i,), DType.uint8), R) == (0, 255)
    assert bounds(Load(0, (i,), INDEX), R, load_bounds=lambda ld: (0, 9)) == (0, 9)
    assert bounds(cast(j * 10, DType.int8), R) == (-128, 127)          # 190 may wrap in int8
    assert bounds(cast(Load(0, (i,), F32), INDEX), R) == UNKNOWN       # float -> int
    assert bounds(cast(i + 1, DType.bool), R) == (1, 1)
    # a zero extent leaves nothing to read: empty bounds, boxes of extent 0
    assert bounds(i + 1, {i: (0, -1)}) == EMPTY and bounds(j, {i: (0, -1), j: (0, 3)}) == EMPTY
    assert box_shape(load_box(Load(0, (j, i), F32), {i: (0, -1), j: (0, 3)}, (4, 5))) == (0, 0)


# ---------------------------------------------------------------- Welder tile propagation (§2.4, §7)

def _fx():
    return Fission(set())


def _ref(fx, name, shape, dtype=F32):
    return fx.ref(name, TensorType(tuple(shape), dtype))


def _tile(axes, starts, sizes):
    return {a: (s, s + n - 1) for a, s, n in zip(axes, starts, sizes)}


@pytest.mark.parametrize("rstep", [None, 16])
@pytest.mark.parametrize("row", [0, 5])
def test_matmul_tile(rstep, row):
    # §7.1: C = A[98304x64] B[64x128]; output tile [4x128] -> A [4xK], B [Kx128] (K = rstep or 64)
    fx = _fx()
    a, b = _ref(fx, "A", (98304, 64)), _ref(fx, "B", (64, 128))
    c = fx.reduce((98304, 128), (64,), "sum", lambda o, r: a[o[0], r[0]] * b[r[0], o[1]])
    p = fx.prims[-1]
    rng = _tile(p.axes, (row * 4, 0), (4, 128))
    if rstep:
        rng[p.reduce.axes[0]] = (16, 16 + rstep - 1)
    boxes = input_boxes(p, rng, [a.shape, b.shape])
    kk = rstep or 64
    assert box_shape(boxes[0]) == (4, kk) and box_shape(boxes[1]) == (kk, 128)
    assert boxes[0][0] == (row * 4, row * 4 + 3)
    assert c.shape == (98304, 128)


def test_softmax_tiles():
    # §2.4: softmax output [4x128] needs input [4x128] (row max and exp-normalize prims)
    fx = _fx()
    x = _ref(fx, "x", (64, 128))
    m = fx.reduce((64,), (128,), "max", lambda o, r: x[o[0], r[0]])
    e = fx.compute((64, 128), lambda o: binary("sub", x[o], m[o[0]]))
    red, ew = fx.prims
    assert box_shape(input_boxes(red, _tile(red.axes, (8,), (4,)))[0]) == (4, 128)
    boxes = input_boxes(ew, _tile(ew.axes, (8, 0), (4, 128)))
    assert [box_shape(boxes[s]) for s in (0, 1)] == [(4, 128), (4,)]
    assert e.shape == (64, 128)


def _conv(fx, x, w, stride, dil, pad):
    n, cin, hh, ww = x.shape
    cout, _, kh, kw = w.shape
    oh = (hh + 2 * pad - dil * (kh - 1) - 1) // stride + 1
    ow = (ww + 2 * pad - dil * (kw - 1) - 1) // stride + 1

    def body(o, r):
        h = o[2] * stride + r[1] * dil - pad
        v = o[3] * stride + r[2] * dil - pad
        inside = logical_and(h.ge(0), h.lt(hh), v.ge(0), v.lt(ww))
        return select(inside, x[o[0], r[0], h, v], Const(0.0, F32)) * w[o[1], r[0], r[1], r[2]]
    return fx.reduce((n, cout, oh, ow), (cin, kh, kw), "sum", body)


@pytest.mark.parametrize("stride, kern, dil, t", [(1, 3, 1, 1), (1, 3, 1, 2), (2, 3, 1, 4), (1, 3, 2, 3),
                                                  (2, 5, 2, 2), (3, 1, 1, 5)])
def test_conv_window_extent(stride, kern, dil, t):
    # Welder: a spatial output tile t needs (t-1)*s + (K-1)*d + 1 input rows (interior tiles)
    fx = _fx()
    x, w = _ref(fx, "x", (1, 3, 64, 64)), _ref(fx, "w", (8, 3, kern, kern))
    _conv(fx, x, w, stride, dil, pad=dil * (kern - 1) // 2)
    p = fx.prims[-1]
    rng = _tile(p.axes, (0, 0, 3, 4), (1, 8, t, t))
    boxes = input_boxes(p, rng, [x.shape, w.shape])
    want = (t - 1) * stride + (kern - 1) * dil + 1
    assert box_shape(boxes[0]) == (1, 3, want, want)
    assert box_shape(boxes[1]) == (8, 3, kern, kern)


def test_conv_edge_tile_is_clipped_to_the_tensor():
    # §7.4: 3x3 stride 1 pad 1: out [2,2] <- in [4,4] inside, [3,3] at the padded corner
    fx = _fx()
    x, w = _ref(fx, "x", (1, 3, 16, 16)), _ref(fx, "w", (4, 3, 3, 3))
    _conv(fx, x, w, 1, 1, 1)
    p = fx.prims[-1]
    shapes = [x.shape, w.shape]
    assert box_shape(input_boxes(p, _tile(p.axes, (0, 0, 5, 5), (1, 4, 2, 2)), shapes)[0]) == (1, 3, 4, 4)
    assert input_boxes(p, _tile(p.axes, (0, 0, 0, 0), (1, 4, 2, 2)), shapes)[0][2:] == [(0, 2), (0, 2)]


@pytest.mark.parametrize("win, stride, t", [(2, 2, 1), (3, 2, 4), (3, 1, 2)])
def test_pool_window_extent(win, stride, t):
    # pool (window w, stride s): t -> (t-1)*s + w; §7.4: MaxPool out [1,1] <- in [2,2]
    fx = _fx()
    x = _ref(fx, "x", (1, 4, 32, 32))
    o = (32 - win) // stride + 1
    fx.reduce((1, 4, o, o), (win, win), "max",
              lambda a, r: x[a[0], a[1], a[2] * stride + r[0], a[3] * stride + r[1]])
    p = fx.prims[-1]
    box = input_boxes(p, _tile(p.axes, (0, 0, 2, 2), (1, 4, t, t)), [x.shape])[0]
    assert box_shape(box)[2:] == ((t - 1) * stride + win,) * 2


def test_layout_tiles_transpose_reshape_slice_concat():
    fx = _fx()
    x = _ref(fx, "x", (6, 20))
    flat = _ref(fx, "f", (120,))
    fx.compute((20, 6), lambda o: x[o[1], o[0]])                                # transpose
    fx.compute((6, 20), lambda o: flat[o[0] * 20 + o[1]])                       # reshape
    fx.compute((3, 20), lambda o: x[o[0] * 2 + 1, o[1]])                        # strided slice
    y = _ref(fx, "y", (4, 20))
    fx.compute((10, 20), lambda o: select(o[0].lt(6), x[o[0], o[1]], y[o[0] - 6, o[1]]))   # concat
    tr, rs, sl, cat = fx.prims
    assert input_boxes(tr, _tile(tr.axes, (4, 1), (8, 2)))[0] == [(1, 2), (4, 11)]
    assert input_boxes(rs, _tile(rs.axes, (2, 0), (2, 20)))[0] == [(40, 79)]
    assert input_boxes(sl, _tile(sl.axes, (1, 0), (2, 20)))[0] == [(3, 5), (0, 19)]
    assert list(input_boxes(cat, _tile(cat.axes, (0, 0), (4, 20)))) == [0]        # y never read
    both = input_boxes(cat, _tile(cat.axes, (4, 0), (4, 20)))
    assert both[0] == [(4, 5), (0, 19)] and both[1] == [(0, 1), (0, 19)]


def test_unflatten_of_flatten_box_is_exact():
    fx = _fx()
    x = _ref(fx, "x", (6, 20))
    fx.compute((6, 20), lambda o: x[(o[0] * 20 + o[1]) // 20, (o[0] * 20 + o[1]) % 20])
    p = fx.prims[-1]
    assert input_boxes(p, _tile(p.axes, (2, 5), (2, 10)))[0] == [(2, 3), (5, 14)]


def test_gather_spans_the_full_dimension():
    # Welder: a data-dependent index gets the full dimension ("undefined % dim")
    fx = _fx()
    table, idx = _ref(fx, "table", (50, 8)), _ref(fx, "idx", (16,), INDEX)
    fx.compute((16, 8), lambda o: table[idx[o[0]], o[1]])
    p = fx.prims[-1]
    shapes = {"table": table.shape, "idx": idx.shape}
    boxes = input_boxes(p, _tile(p.axes, (4, 2), (4, 3)), [shapes[n] for n in p.inputs])
    t, s = p.inputs.index("table"), p.inputs.index("idx")
    assert boxes[t] == [(0, 49), (2, 4)] and boxes[s] == [(4, 7)]
    ld = next(ld for ld in (p.body,) if isinstance(ld, Load))
    assert load_box(ld, _tile(p.axes, (4, 2), (4, 3)))[0] == UNKNOWN
    assert load_box(ld, _tile(p.axes, (4, 2), (4, 3)), table.shape, lambda l: (10, 12)) == [(10, 12), (2, 4)]


def test_input_boxes_default_to_full_extents_and_reject_opaque():
    fx = _fx()
    x = _ref(fx, "x", (5, 7))
    fx.reduce((5,), (7,), "sum", lambda o, r: x[o[0], r[0]] * x[o[0], r[0]])
    p = fx.prims[-1]
    assert input_boxes(p) == {0: [(0, 4), (0, 6)]}
    assert extent_ranges(p.extents) == {p.axes[0]: (0, 4), p.reduce.axes[0]: (0, 6)}
    fx.opaque("topk_indices", [x], TensorType((5, 2), INDEX), k=2, axis=1, largest=True, sorted=True)
    with pytest.raises(ValueError, match="opaque"):
        input_boxes(fx.prims[-1])
    assert isinstance(p.reduce, Reduction) and math.prod(box_shape(input_boxes(p)[0])) == 35
