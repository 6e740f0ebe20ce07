"""Fission of pooling operators against torch.nn.functional (and the ONNX reference where torch differs)."""
import functools
import math

import pytest
import torch
import torch.nn.functional as F

from opcheck import check_op, onnxruntime_node, run_op
from tilefuse.analysis.classify import Category, classify
from tilefuse.errors import UnsupportedAttribute
from tilefuse.ir.dtypes import DType, TensorType

torch.manual_seed(0)
MAXPOOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
AVGPOOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def torch_pad(x, pads, value=0.0):
    n = x.dim() - 2
    flat = []
    for d in reversed(range(n)):
        flat += [pads[d], pads[n + d]]
    return F.pad(x, flat, value=value)


def windows(x, k, s, d):
    """(N, C, out..., taps) view of every window of x (no padding)."""
    for dim in range(len(k)):
        x = x.unfold(2 + dim, (k[dim] - 1) * d[dim] + 1, s[dim])
        x = x[..., ::d[dim]]
    n = len(k)
    return x.flatten(-n) if n > 1 else x


def ref_avg_pool(x, k, s, pads, d, include_pad):
    """Average pool by explicit windows: sum of the padded input over the count of counted taps."""
    ones = torch.ones_like(x)
    total = windows(torch_pad(x, pads), k, s, d).sum(-1)
    mask = torch_pad(ones, pads, value=1.0 if include_pad else 0.0)
    return total / windows(mask, k, s, d).sum(-1)


def same_pads(sizes, k, s, d, mode):
    out = [-(-n // st) for n, st in zip(sizes, s)]
    total = [max(0, (o - 1) * st + (kk - 1) * dd + 1 - n) for o, st, kk, dd, n in zip(out, s, k, d, sizes)]
    begin = [t // 2 if mode == "SAME_UPPER" else t - t // 2 for t in total]
    return tuple(begin) + tuple(t - b for t, b in zip(total, begin))


MAX_CASES = [
    # (x shape, kernel, strides, pads, dilations, ceil_mode)
    ((2, 3, 9), (3,), (2,), (1, 1), (1,), 0),
    ((1, 2, 8, 7), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), 0),
    ((1, 2, 9, 8), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),          # ceil_mode with padding
    ((1, 2, 7, 7), (2, 2), (2, 2), (0, 0, 0, 0), (1, 1), 1),          # ceil_mode overhang
    ((1, 2, 10, 9), (3, 2), (1, 2), (1, 1, 1, 1), (2, 3), 0),         # dilation
    ((1, 2, 6, 5, 7), (2, 3, 2), (2, 1, 2), (1, 1, 0, 1, 1, 0), (1, 1, 2), 1),
]


@pytest.mark.parametrize("xs,k,s,pads,d,ceil", MAX_CASES)
def test_max_pool_with_indices(xs, k, s, pads, d, ceil):
    x = torch.randn(xs)
    n = len(k)
    y, idx = MAXPOOL[n](x, k, s, pads[:n], d, ceil_mode=bool(ceil), return_indices=True)
    plane = math.prod(xs[2:])
    onnx_idx = idx + (torch.arange(xs[0] * xs[1]).reshape(xs[0], xs[1], *[1] * n) * plane)
    attrs = dict(kernel_shape=k, strides=s, pads=pads, dilations=d, ceil_mode=ceil)
    pg = check_op("MaxPool", [x], [y, onnx_idx], attrs=attrs)
    assert [classify(p) for p in pg.prims] == [Category.reduce, Category.reduce]


def test_max_pool_asymmetric_pads_and_ints():
    x = torch.randn(1, 2, 7, 8)
    pads = (0, 2, 1, 0)
    ref = F.max_pool2d(torch_pad(x, pads, value=-math.inf), (3, 3), (2, 2))
    check_op("MaxPool", [x], ref, attrs=dict(kernel_shape=(3, 3), strides=(2, 2), pads=pads))
    xi = torch.randint(-100, 100, (1, 2, 6, 6), dtype=torch.int32)
    ref = F.max_pool2d(torch_pad(xi.double(), (1, 1, 1, 1), value=-math.inf), (3, 3), (2, 2)).to(torch.int32)
    check_op("MaxPool", [xi], ref, attrs=dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1)))


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_max_pool_auto_pad(mode):
    x = torch.randn(1, 2, 7, 6)
    k, s = (3, 2), (2, 2)
    pads = (0,) * 4 if mode == "VALID" else same_pads(x.shape[2:], k, s, (1, 1), mode)
    ref = F.max_pool2d(torch_pad(x, pads, value=-math.inf), k, s)
    check_op("MaxPool", [x], ref, attrs=dict(kernel_shape=k, strides=s, auto_pad=mode))


def test_max_pool_column_major_indices_match_onnx_reference():
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    x = torch.randn(2, 3, 7, 5)
    attrs = dict(kernel_shape=(3, 2), strides=(2, 1), pads=(1, 0, 1, 1), storage_order=1)
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, None)],
                              [helper.make_tensor_value_info("y", 1, None),
                               helper.make_tensor_value_info("i", 7, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    y, i = ReferenceEvaluator(model).run(None, {"x": x.numpy()})
    check_op("MaxPool", [x], [torch.from_numpy(y), torch.from_numpy(i)], attrs=attrs)


AVG_CASES = [
    # (x shape, kernel, strides, pads, ceil_mode, count_include_pad)
    ((2, 3, 9), (3,), (2,), (1, 1), 0, 0),
    ((2, 3, 9), (3,), (2,), (1, 1), 1, 1),
    ((1, 2, 8, 7), (3, 3), (2, 2), (1, 1, 1, 1), 0, 1),
    ((1, 2, 8, 7), (3, 3), (2, 2), (1, 1, 1, 1), 1, 0),
    ((1, 2, 7, 7), (2, 2), (2, 2), (0, 0, 0, 0), 1, 1),              # ceil overhang is never counted
    ((1, 2, 9, 6), (3, 2), (3, 1), (1, 0, 1, 0), 1, 1),
    ((1, 2, 5, 6, 7), (3, 2, 3), (2, 2, 2), (1, 1, 1, 1, 1, 1), 1, 0),
]


@pytest.mark.parametrize("xs,k,s,pads,ceil,include", AVG_CASES)
def test_average_pool(xs, k, s, pads, ceil, include):
    x = torch.randn(xs)
    n = len(k)
    ref = AVGPOOL[n](x, k, s, pads[:n], ceil_mode=bool(ceil), count_include_pad=bool(include))
    attrs = dict(kernel_shape=k, strides=s, pads=pads, ceil_mode=ceil, count_include_pad=include)
    pg = check_op("AveragePool", [x], ref, attrs=attrs)
    assert [classify(p) for p in pg.prims] == [Category.reduce, Category.elementwise]


@pytest.mark.parametrize("op,pool", [("AveragePool", functools.partial(F.avg_pool2d, count_include_pad=False)),
                                     ("MaxPool", F.max_pool2d)])
def test_window_larger_than_input_reduces_only_taps_that_can_land(op, pool):
    # EfficientNet's top pool: kernel 9 with ceil_mode over a 2x3 map reads 2x3 taps, not 9x9
    x = torch.randn(1, 3, 2, 3)
    attrs = dict(kernel_shape=(9, 9), strides=(9, 9), pads=(0, 0, 0, 0), ceil_mode=1)
    pg = check_op(op, [x], pool(x, 9, 9, ceil_mode=True), attrs=attrs)
    assert pg.prims[0].reduce.extents == (2, 3)
    # with leading padding the first taps land in the padding for every output and are skipped too
    attrs = dict(kernel_shape=(5, 5), strides=(1, 1), pads=(2, 2, 2, 2), dilations=(1, 1))
    x = torch.randn(1, 2, 2, 2)
    pg = check_op(op, [x], pool(x, 5, 1, 2), attrs=attrs)
    assert pg.prims[0].reduce.extents == (3, 3)    # taps 1..3: o + r - 2 in [0, 2) for o in {0, 1}


@pytest.mark.parametrize("pads,d,include", [
    ((0, 1, 2, 0), (1, 1), 0),      # asymmetric pads
    ((0, 1, 2, 0), (1, 1), 1),
    ((2, 1, 2, 3), (2, 3), 0),      # dilation (ONNX opset 19+; torch has none)
    ((2, 1, 2, 3), (2, 3), 1),
])
def test_average_pool_asymmetric_dilated(pads, d, include):
    x = torch.randn(1, 2, 9, 8)
    k, s = (3, 2), (2, 1)
    ref = ref_avg_pool(x, k, s, pads, d, include)
    attrs = dict(kernel_shape=k, strides=s, pads=pads, dilations=d, count_include_pad=include)
    check_op("AveragePool", [x], ref, attrs=attrs)


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
def test_average_pool_auto_pad(mode):
    x = torch.randn(1, 2, 7, 6)
    k, s = (3, 4), (2, 3)
    ref = ref_avg_pool(x, k, s, same_pads(x.shape[2:], k, s, (1, 1), mode), (1, 1), False)
    check_op("AveragePool", [x], ref, attrs=dict(kernel_shape=k, strides=s, auto_pad=mode))


def test_average_pool_fp16():
    x = torch.randn(1, 3, 8, 8).half()
    ref = F.avg_pool2d(x.float(), 3, 2, 1, count_include_pad=False).half()
    check_op("AveragePool", [x], ref, attrs=dict(kernel_shape=(3, 3), strides=(2, 2), pads=(1,) * 4),
             rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_lp_pool(p):
    x = torch.randn(1, 2, 7, 8).abs() + 0.1
    pads = (1, 0, 1, 1)
    ref = F.lp_pool2d(torch_pad(x, pads), p, (3, 2), (2, 2))
    check_op("LpPool", [x], ref, attrs=dict(kernel_shape=(3, 2), strides=(2, 2), pads=pads, p=p), rtol=1e-4)


def test_lp_pool_takes_absolute_values():
    x = torch.randn(1, 2, 6)
    ref = F.lp_pool1d(x.abs(), 3, 2, 2)
    check_op("LpPool", [x], ref, attrs=dict(kernel_shape=(2,), strides=(2,), p=3), rtol=1e-4)


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 3, 4, 5), (1, 2, 3, 4, 2)])
def test_global_pools(shape):
    x = torch.randn(shape)
    dims = tuple(range(2, len(shape)))
    pg = check_op("GlobalAveragePool", [x], x.mean(dims, keepdim=True))
    assert [classify(p) for p in pg.prims] == [Category.reduce, Category.elementwise]
    check_op("GlobalMaxPool", [x], x.amax(dims, keepdim=True))
    check_op("GlobalLpPool", [x], x.norm(2, dims, keepdim=True), rtol=1e-4)


@pytest.mark.parametrize("shape,out", [
    ((1, 2, 10), (4,)),
    ((2, 3, 7, 9), (3, 4)),
    ((1, 2, 6, 6), (3, 3)),       # uniform bins: a constant divisor
    ((1, 2, 3, 5), (5, 7)),       # more bins than inputs: overlapping bins
    ((1, 2, 5, 6, 7), (2, 3, 4)),
    ((1, 2, 5, 6), (1, 1)),
])
def test_adaptive_average_pool(shape, out):
    x = torch.randn(shape)
    ref = {1: F.adaptive_avg_pool1d, 2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}[len(out)](x, out)
    check_op("AdaptiveAveragePool", [x], ref)


def test_adaptive_uniform_bins_need_no_mask():
    x = torch.randn(1, 2, 6, 6)
    pg = check_op("AdaptiveAveragePool", [x], F.adaptive_avg_pool2d(x, 3))
    assert "Select" not in repr(pg.prims[0].body) and "where" not in str(pg)


@pytest.mark.parametrize("op,attrs,msg", [
    ("MaxPool", dict(), "kernel_shape"),
    ("MaxPool", dict(kernel_shape=(2, 2), storage_order=2), "storage_order"),
    ("AveragePool", dict(kernel_shape=(2, 2), pads=(1, 1)), "pads"),
    ("AveragePool", dict(kernel_shape=(9, 9)), "window larger"),
    ("LpPool", dict(kernel_shape=(2, 2), p=0), "p=0"),
])
def test_pool_errors(op, attrs, msg):
    x = torch.randn(1, 1, 4, 4)
    outs = [TensorType((1, 1, 3, 3), DType.float32)]
    if op == "MaxPool":
        outs.append(TensorType((1, 1, 3, 3), DType.int64))
    with pytest.raises(UnsupportedAttribute, match=f"{op} \\(node 'n0'\\)") as err:
        run_op(op, [x], outs, attrs)
    assert msg in str(err.value)



@pytest.mark.parametrize("op", ["AveragePool", "MaxPool", "LpPool"])
@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=(3, 2), strides=(2, 2), pads=(1, 0, 2, 1), dilations=(2, 2), ceil_mode=1),
    dict(kernel_shape=(3, 3), strides=(2, 3), pads=(1, 1, 1, 1), dilations=(1, 2), ceil_mode=1, count_include_pad=1),
    # (onnxruntime ignores dilations when it computes SAME padding; the spec and tilefuse do not)
    dict(kernel_shape=(2, 3), strides=(3, 2), auto_pad="SAME_LOWER"),
    dict(kernel_shape=(3, 4), strides=(2, 3), auto_pad="SAME_UPPER", ceil_mode=1, count_include_pad=1),
])
def test_pools_match_onnxruntime(op, attrs):
    x = torch.randn(1, 2, 10, 11)
    if op != "AveragePool":
        attrs = {k: v for k, v in attrs.items() if k != "count_include_pad"}
    check_op(op, [x], onnxruntime_node(op, [x], attrs), attrs=attrs, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("size,kernel,include", [((1, 1), 320, True), ((5, 7), 6, True), ((5, 7), 6, False)])
def test_average_pool_ceil_mode_window_overhangs_input(size, kernel, include):
    # HF EfficientNet: AvgPool2d(320, ceil_mode=True) on a 1x1 map: the window overhangs the input.
    x = torch.randn(1, 3, *size)
    want = torch.nn.functional.avg_pool2d(x, kernel, stride=kernel, ceil_mode=True, count_include_pad=include)
    check_op("AveragePool", [x], want, {"kernel_shape": (kernel, kernel), "strides": (kernel, kernel),
                                        "ceil_mode": 1, "count_include_pad": int(include)})


# ---------------------------------------------------------------- Col2Im

@pytest.mark.parametrize("image,block,strides,pads,dil", [
    ((5, 6), (2, 3), (1, 1), (0, 0, 0, 0), (1, 1)),
    ((7, 8), (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    ((9, 6), (2, 2), (1, 2), (0, 1, 0, 1), (2, 1)),
])
def test_col2im_matches_torch_fold(image, block, strides, pads, dil):
    blocks = [(image[d] + pads[d] + pads[2 + d] - dil[d] * (block[d] - 1) - 1) // strides[d] + 1 for d in range(2)]
    x = torch.randn(2, 3 * math.prod(block), math.prod(blocks))
    want = F.fold(x, (image[0] + pads[0] + pads[2], image[1] + pads[1] + pads[3]), block, dilation=dil,
                  stride=strides)[..., pads[0]:pads[0] + image[0], pads[1]:pads[1] + image[1]]
    check_op("Col2Im", [x], want, attrs={"image_shape": image, "block_shape": block, "strides": strides,
                                         "pads": pads, "dilations": dil}, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- MaxUnpool

@pytest.mark.parametrize("kernel,stride,pad,size", [(2, 2, 0, (8, 6)), (3, 2, 1, (7, 9))])   # (3, 2): overlaps
def test_max_unpool_inverts_max_pool(kernel, stride, pad, size):
    x = torch.randn(2, 3, *size)        # (sizes the unpooling restores: ONNX's indices count in that shape)
    pooled, idx = F.max_pool2d(x, kernel, stride, pad, return_indices=True)
    plane = x.shape[2] * x.shape[3]
    flat = idx + (torch.arange(6).view(2, 3, 1, 1) * plane)           # ONNX indices count over N and C too
    want = F.max_unpool2d(pooled, idx, kernel, stride, pad, output_size=x.shape[2:])
    check_op("MaxUnpool", [pooled, flat], want,
             attrs={"kernel_shape": (kernel,) * 2, "strides": (stride,) * 2, "pads": (pad,) * 4})
