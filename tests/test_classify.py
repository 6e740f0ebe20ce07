"""Prim categories derived from structure, on hand-built prims."""
from __future__ import annotations

import pytest

from tilefuse.analysis.classify import CATEGORIES, Category, classify, count_by_category
from tilefuse.fission.registry import Fission
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.expr import INDEX, Const, cast, logical_and, maximum, select, unary

F32 = DType.float32


def _fx(**shapes):
    fx = Fission(set())
    refs = {n: fx.ref(n, TensorType(s, INDEX if n.startswith("idx") else F32)) for n, s in shapes.items()}
    return fx, refs


def _last(build, **shapes):
    fx, r = _fx(**shapes)
    build(fx, r)
    return fx.prims[-1]


def _conv(fx, r):
    x, w = r["x"], r["w"]

    def body(o, k):
        h = o[2] * 2 + k[1] - 1
        return select(logical_and(h.ge(0), h.lt(8)), x[o[0], k[0], h], Const(0.0, F32)) * w[o[1], k[0], k[1]]
    fx.reduce((1, 4, 4), (3, 3), "sum", body)


CASES = [
    # elementwise: every load at the output axes
    ("relu", lambda fx, r: fx.compute((4, 5), lambda i: maximum(r["x"][i], 0.0)), dict(x=(4, 5)), "elementwise"),
    ("add", lambda fx, r: fx.compute((4, 5), lambda i: r["x"][i] + r["y"][i]), dict(x=(4, 5), y=(4, 5)),
     "elementwise"),
    ("fill", lambda fx, r: fx.compute((4,), lambda i: Const(1.0, F32)), {}, "elementwise"),
    # broadcast: a subset of the axes in order, constant 0 for size-1 dims
    ("bias", lambda fx, r: fx.compute((4, 5), lambda i: r["x"][i] + r["b"][i[1]]), dict(x=(4, 5), b=(5,)),
     "broadcast"),
    ("size1", lambda fx, r: fx.compute((4, 5), lambda i: r["x"][i] * r["s"][i[0], 0]), dict(x=(4, 5), s=(4, 1)),
     "broadcast"),
    ("scalar", lambda fx, r: fx.compute((4, 5), lambda i: r["x"][i] * r["s"][()]), dict(x=(4, 5), s=()),
     "broadcast"),
    # layout: any other (quasi-)affine map
    ("transpose", lambda fx, r: fx.compute((5, 4), lambda i: r["x"][i[1], i[0]]), dict(x=(4, 5)), "layout"),
    ("reshape", lambda fx, r: fx.compute((20,), lambda i: r["x"][i[0] // 5, i[0] % 5]), dict(x=(4, 5)), "layout"),
    ("slice", lambda fx, r: fx.compute((2, 5), lambda i: r["x"][i[0] * 2 + 1, i[1]]), dict(x=(4, 5)), "layout"),
    ("pad", lambda fx, r: fx.compute((6,), lambda i: select(logical_and((i[0] - 1).ge(0), (i[0] - 1).lt(4)),
                                                            r["x"][i[0] - 1], Const(0.0, F32))), dict(x=(4,)),
     "layout"),
    ("concat", lambda fx, r: fx.compute((7,), lambda i: select(i[0].lt(4), r["x"][i[0]], r["y"][i[0] - 4])),
     dict(x=(4,), y=(3,)), "layout"),
    # reduce: non-multiplicative body, or a product whose factors read the same variables
    ("sum", lambda fx, r: fx.reduce((4,), (5,), "sum", lambda i, k: r["x"][i[0], k[0]]), dict(x=(4, 5)),
     "reduce"),
    ("max", lambda fx, r: fx.reduce((4,), (5,), "max", lambda i, k: r["x"][i[0], k[0]]), dict(x=(4, 5)),
     "reduce"),
    ("sumsq", lambda fx, r: fx.reduce((4,), (5,), "sum", lambda i, k: r["x"][i[0], k[0]] * r["x"][i[0], k[0]]),
     dict(x=(4, 5)), "reduce"),
    ("rowdot", lambda fx, r: fx.reduce((4,), (5,), "sum", lambda i, k: r["x"][i[0], k[0]] * r["y"][i[0], k[0]]),
     dict(x=(4, 5), y=(4, 5)), "reduce"),
    ("maxprod", lambda fx, r: fx.reduce((4, 3), (5,), "max", lambda i, k: r["x"][i[0], k[0]] * r["w"][k[0], i[1]]),
     dict(x=(4, 5), w=(5, 3)), "reduce"),                       # not a sum: no contraction
    ("pool", lambda fx, r: fx.reduce((3,), (2,), "max", lambda i, k: r["x"][i[0] * 2 + k[0]]), dict(x=(6,)),
     "reduce"),
    # contraction: sum of a product whose operands are reused across each other's axes
    ("matmul", lambda fx, r: fx.reduce((4, 3), (5,), "sum", lambda i, k: r["x"][i[0], k[0]] * r["w"][k[0], i[1]]),
     dict(x=(4, 5), w=(5, 3)), "contraction"),
    ("gemv", lambda fx, r: fx.reduce((4,), (5,), "sum", lambda i, k: r["x"][i[0], k[0]] * r["v"][k[0]]),
     dict(x=(4, 5), v=(5,)), "contraction"),
    ("scaled", lambda fx, r: fx.reduce((4, 3), (5,), "sum",
                                       lambda i, k: r["x"][i[0], k[0]] * r["w"][k[0], i[1]] * 0.5),
     dict(x=(4, 5), w=(5, 3)), "contraction"),
    ("conv", _conv, dict(x=(1, 3, 8), w=(4, 3, 3)), "contraction"),
    # indirect: an index reads data
    ("gather", lambda fx, r: fx.compute((3, 5), lambda i: r["x"][r["idx"][i[0]], i[1]]),
     dict(x=(4, 5), idx=(3,)), "indirect"),
    ("gather_sum", lambda fx, r: fx.reduce((3,), (5,), "sum", lambda i, k: r["x"][r["idx"][i[0]], k[0]]),
     dict(x=(4, 5), idx=(3,)), "indirect"),
    # opaque
    ("topk", lambda fx, r: fx.opaque("topk_indices", [r["x"]], TensorType((4, 2), INDEX), k=2, axis=1,
                                     largest=True, sorted=True), dict(x=(4, 5)), "opaque"),
]


@pytest.mark.parametrize("name, build, shapes, want", CASES, ids=[c[0] for c in CASES])
def test_category(name, build, shapes, want):
    assert classify(_last(build, **shapes)) is Category(want)


def test_every_category_is_covered_and_counted():
    prims = [_last(b, **s) for _, b, s, _ in CASES]
    counts = count_by_category(prims)
    assert set(counts) == set(CATEGORIES) and all(counts[c] > 0 for c in CATEGORIES)
    assert sum(counts.values()) == len(CASES)


def test_category_sees_through_casts_and_names():
    # fp16 operands widened to fp32 before the product are still a contraction
    fx = Fission(set())
    a = fx.ref("a16", TensorType((4, 5), DType.float16))
    b = fx.ref("b16", TensorType((5, 3), DType.float16))
    fx.reduce((4, 3), (5,), "sum", lambda i, k: cast(a[i[0], k[0]], F32) * cast(b[k[0], i[1]], F32))
    assert classify(fx.prims[-1]) is Category.contraction
    fx.compute((4, 5), lambda i: unary("exp", cast(a[i], F32)))
    assert classify(fx.prims[-1]) is Category.elementwise
