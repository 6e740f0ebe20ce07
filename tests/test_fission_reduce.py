"""Reduction, arg-reduction, softmax-family and CumSum fission rules against torch."""
from __future__ import annotations

import pytest
import torch
from opcheck import check_op, run_op

from tilefuse.analysis.classify import classify
from tilefuse.errors import UnsupportedAttribute
from tilefuse.ir.dtypes import DType, TensorType

g = torch.Generator().manual_seed(1)


def randn(*shape, dtype=torch.float32, scale=1.0, shift=0.0):
    return (torch.randn(shape, generator=g) * scale + shift).to(dtype)


def randint(lo, hi, *shape, dtype=torch.int32):
    return torch.randint(lo, hi, shape, generator=g).to(dtype)


def _prod(x, dims, keep):
    for d in sorted(dims, reverse=True):
        x = x.prod(d, keepdim=True)
    return x if keep else x.reshape([n for k, n in enumerate(x.shape) if k not in dims])


REF = {
    "ReduceSum": lambda x, d, k: x.sum(d, keepdim=k),
    "ReduceMean": lambda x, d, k: x.mean(d, keepdim=k),
    "ReduceMax": lambda x, d, k: x.amax(d, keepdim=k),
    "ReduceMin": lambda x, d, k: x.amin(d, keepdim=k),
    "ReduceProd": _prod,
    "ReduceL1": lambda x, d, k: x.abs().sum(d, keepdim=k),
    "ReduceL2": lambda x, d, k: x.square().sum(d, keepdim=k).sqrt(),
    "ReduceSumSquare": lambda x, d, k: x.square().sum(d, keepdim=k),
    "ReduceLogSum": lambda x, d, k: x.sum(d, keepdim=k).log(),
    "ReduceLogSumExp": lambda x, d, k: torch.logsumexp(x, d, keepdim=k),
}
AXES = [None, (1,), (-1, 0), (0, 1, 2), (-2,)]


@pytest.mark.parametrize("op", sorted(REF))
@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce(op, axes, keepdims):
    x = randn(2, 3, 4, scale=0.5, shift=1.5 if op == "ReduceLogSum" else 0.0)
    dims = tuple(range(3)) if axes is None else tuple(a % 3 for a in axes)
    attrs = {"keepdims": keepdims} | ({} if axes is None else {"axes": axes})
    check_op(op, [x], REF[op](x, dims, bool(keepdims)), attrs=attrs, rtol=1e-5, atol=1e-5)


def test_reduce_empty_axes_means_all():
    x = randn(2, 3)
    check_op("ReduceSum", [x], x.sum((0, 1), keepdim=True), attrs={"axes": ()})


@pytest.mark.parametrize("op,ref", [("ReduceSum", lambda x: x), ("ReduceMax", lambda x: x),
                                    ("ReduceSumSquare", torch.square), ("ReduceL2", torch.abs),
                                    ("ReduceL1", torch.abs), ("ReduceLogSum", torch.log),
                                    ("ReduceMean", lambda x: x), ("ReduceLogSumExp", lambda x: x)])
def test_reduce_noop_with_empty_axes(op, ref):
    x = randn(2, 3, shift=2.0)
    check_op(op, [x], ref(x), attrs={"noop_with_empty_axes": 1}, rtol=1e-5, atol=1e-6)


def test_reduce_noop_identity_makes_no_prim():
    x = randn(2, 3)
    assert check_op("ReduceSum", [x], x, attrs={"noop_with_empty_axes": 1}).prims == ()


def test_reduce_rank0():
    x = torch.tensor(2.5)
    check_op("ReduceSum", [x], x)


def test_reduce_size1_and_empty_dims():
    x = randn(3, 1, 4)
    check_op("ReduceMax", [x], x.amax(1), attrs={"axes": (1,), "keepdims": 0})
    z = torch.zeros(3, 0)
    check_op("ReduceSum", [z], z.sum(1), attrs={"axes": (1,), "keepdims": 0})
    check_op("ReduceProd", [z], torch.ones(3, 1), attrs={"axes": (1,)})


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                                "ReduceL1", "ReduceSumSquare"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_reduce_int(op, dtype):
    x = randint(-9, 10, 3, 5, dtype=dtype)
    # torch sums ints in int64 and has no integer mean; ONNX keeps the type and truncates the mean.
    ref = REF[op](x.double() if op == "ReduceMean" else x, (1,), False).trunc().to(dtype)
    check_op(op, [x], ref, attrs={"axes": (1,), "keepdims": 0})


def test_reduce_int_float_finish():
    x = randint(0, 50, 3, 5, dtype=torch.int64)
    check_op("ReduceL2", [x], x.double().square().sum(1).sqrt().to(torch.int64), attrs={"axes": (1,), "keepdims": 0})
    check_op("ReduceLogSum", [x + 1], (x + 1).double().sum(1).log().to(torch.int64), attrs={"axes": (-1,),
                                                                                            "keepdims": 0})


def test_reduce_bool_max_min():
    x = randint(0, 2, 4, 3, dtype=torch.bool)
    check_op("ReduceMax", [x], x.any(1), attrs={"axes": (1,), "keepdims": 0})
    check_op("ReduceMin", [x], x.all(1), attrs={"axes": (1,), "keepdims": 0})


@pytest.mark.parametrize("op", sorted(REF))
def test_reduce_fp16(op):
    x = randn(4, 64, scale=0.5, shift=1.5 if op == "ReduceLogSum" else 0.0, dtype=torch.float16)
    ref = REF[op](x.float(), (1,), True).half()
    pg = check_op(op, [x], ref, attrs={"axes": (1,)}, rtol=2e-3, atol=2e-3)
    assert pg.prims[-1].out.dtype is DType.float16


def test_reduce_mean_fp16_does_not_overflow_in_the_sum():
    x = torch.full((2, 8), 60000.0, dtype=torch.float16)
    check_op("ReduceMean", [x], x.float().mean(1).half(), attrs={"axes": (1,), "keepdims": 0})


def test_reduce_log_sum_exp_stable():
    x = torch.tensor([[1000.0, 1000.0, 999.0], [-1000.0, -1001.0, -999.5],
                      [-float("inf"), 0.0, 1.0], [-float("inf")] * 3, [float("inf"), 0.0, 1.0]])
    check_op("ReduceLogSumExp", [x], torch.logsumexp(x, 1), attrs={"axes": (1,), "keepdims": 0})


def test_reduce_bad_axes():
    x = randn(2, 3)
    for axes in [(2,), (0, -2)]:
        with pytest.raises(UnsupportedAttribute, match="axes=.* of ReduceSum \\(node 'n0'\\)"):
            run_op("ReduceSum", [x], [TensorType((1, 1), DType.float32)], attrs={"axes": axes})


# ---------------------------------------------------------------- ArgMax / ArgMin

def _arg(x, axis, largest, last):
    f = torch.argmax if largest else torch.argmin
    if not last:
        return f(x, axis, keepdim=True)
    n = x.shape[axis]
    return n - 1 - f(x.flip(axis), axis, keepdim=True)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("last", [0, 1])
def test_argmax_argmin_with_ties(op, axis, keepdims, last):
    x = randint(0, 3, 3, 4, 5, dtype=torch.float32)      # many ties
    ref = _arg(x, axis, op == "ArgMax", last)
    ref = ref if keepdims else ref.squeeze(axis)
    pg = check_op(op, [x], ref, attrs={"axis": axis, "keepdims": keepdims, "select_last_index": last})
    assert not any(p.is_opaque for p in pg.prims)


def test_argmax_default_axis_int_and_nan():
    x = randint(-5, 5, 4, 3)
    check_op("ArgMax", [x], torch.argmax(x, 0, keepdim=True))
    y = randn(3, 4)
    y[1, 2] = float("nan")
    check_op("ArgMax", [y], torch.argmax(y, 1), attrs={"axis": 1, "keepdims": 0})
    check_op("ArgMin", [y], torch.argmin(y, 1), attrs={"axis": 1, "keepdims": 0})


def test_argmax_fp16():
    x = randn(3, 17, dtype=torch.float16)
    check_op("ArgMax", [x], torch.argmax(x.float(), 1, keepdim=True), attrs={"axis": 1})


# ---------------------------------------------------------------- softmax family

@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("op,ref", [("Softmax", torch.softmax), ("LogSoftmax", torch.log_softmax)])
def test_softmax(axis, op, ref):
    x = randn(2, 3, 5, scale=3)
    check_op(op, [x], ref(x, axis), attrs={"axis": axis}, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op,ref", [("Softmax", torch.softmax), ("LogSoftmax", torch.log_softmax)])
def test_softmax_stable_and_default_axis(op, ref):
    x = randn(3, 6, scale=1000)                     # exp overflows without the max shift
    check_op(op, [x], ref(x, -1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op,ref", [("Softmax", torch.softmax), ("LogSoftmax", torch.log_softmax)])
def test_softmax_fp16(op, ref):
    x = randn(4, 33, scale=4, dtype=torch.float16)
    pg = check_op(op, [x], ref(x.float(), -1).half(), rtol=2e-3, atol=2e-3)
    assert any(p.out.dtype is DType.float32 for p in pg.prims)      # fp32 intermediates


def test_softmax_categories():
    x = randn(2, 3, 8)
    pg = check_op("Softmax", [x], torch.softmax(x, -1))
    cats = [classify(p).value for p in pg.prims]
    assert cats == ["reduce", "broadcast", "reduce", "broadcast"]


def test_hardmax():
    x = randint(0, 3, 4, 5, dtype=torch.float32)
    for axis in (0, -1):
        ref = torch.nn.functional.one_hot(torch.argmax(x, axis), x.shape[axis]).float()
        ref = ref if axis == -1 else ref.movedim(-1, axis)
        check_op("Hardmax", [x], ref, attrs={"axis": axis})


# ---------------------------------------------------------------- CumSum

def _cumsum(x, axis, exclusive, reverse):
    y = x.flip(axis) if reverse else x
    c = torch.cumsum(y, axis)
    if exclusive:
        c = c - y
    return c.flip(axis) if reverse else c


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, -1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_cumsum(exclusive, reverse, axis, dtype):
    x = randn(3, 6, scale=4).to(dtype)
    ref = _cumsum(x, axis, exclusive, reverse).to(dtype)     # torch sums int32 in int64
    check_op("CumSum", [x, torch.tensor(axis)], ref, attrs={"axis": axis, "exclusive": exclusive, "reverse": reverse},
             const=(1,), rtol=1e-5, atol=1e-5)


def test_cumsum_fp16():
    x = randn(2, 40, dtype=torch.float16)
    check_op("CumSum", [x], torch.cumsum(x.float(), 1).half(), attrs={"axis": 1}, rtol=2e-3, atol=2e-3)


def test_cumsum_needs_axis_attribute():
    x = randn(2, 3)
    with pytest.raises(UnsupportedAttribute, match="axis=None of CumSum"):
        run_op("CumSum", [x, torch.tensor(1)], [TensorType((2, 3), DType.float32)], const=(1,))


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_cumprod(exclusive, reverse, dtype):
    x = (randn(3, 5) + 1.5).to(dtype) if dtype.is_floating_point else torch.randint(-3, 4, (3, 5), generator=g)
    y = x.flip(1) if reverse else x
    c = torch.cumprod(y, 1)
    if exclusive:   # the product of the elements before: shift right, 1 first
        c = torch.cat([torch.ones_like(c[:, :1]), c[:, :-1]], 1)
    check_op("CumProd", [x], (c.flip(1) if reverse else c).to(dtype),
             attrs={"axis": 1, "exclusive": exclusive, "reverse": reverse}, rtol=1e-5, atol=1e-5)
