"""Fission of Conv and ConvTranspose against torch.nn.functional."""
import pytest
import torch
import torch.nn.functional as F

from opcheck import check_op, onnxruntime_node, run_op
from tilefuse.analysis.classify import Category, classify
from tilefuse.errors import UnsupportedAttribute
from tilefuse.ir.dtypes import DType, TensorType

torch.manual_seed(0)
TOL = dict(rtol=1e-4, atol=1e-4)
CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
CONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def torch_conv(x, w, b, strides, pads, dilations, group):
    """F.conv with ONNX-style (possibly asymmetric) pads [begins..., ends...]."""
    n = x.dim() - 2
    flat = []
    for d in reversed(range(n)):
        flat += [pads[d], pads[n + d]]
    return CONV[n](F.pad(x, flat), w, b, stride=strides, dilation=dilations, groups=group)


CASES = [
    # (x shape, w shape, strides, pads, dilations, group, bias)
    ((2, 3, 9), (4, 3, 3), (1,), (1, 1), (1,), 1, True),
    ((1, 4, 11), (4, 2, 4), (2,), (2, 0), (2,), 2, False),
    ((2, 3, 8, 7), (5, 3, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, True),
    ((1, 3, 9, 8), (4, 3, 2, 3), (2, 3), (0, 1, 2, 0), (1, 1), 1, True),     # non-square, asymmetric pads
    ((1, 2, 10, 10), (3, 2, 3, 3), (2, 2), (0, 0, 0, 0), (2, 2), 1, False),  # dilation, no padding
    ((1, 6, 7, 7), (6, 1, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 6, True),     # depthwise
    ((1, 4, 7, 6), (8, 1, 3, 3), (2, 1), (1, 1, 1, 1), (1, 1), 4, True),     # channel multiplier 2
    ((2, 4, 6, 6), (6, 2, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 2, False),    # grouped 1x1
    ((1, 2, 5, 6, 4), (3, 2, 2, 3, 2), (1, 2, 1), (1, 0, 1, 0, 1, 1), (1, 1, 2), 1, True),
]


@pytest.mark.parametrize("xs,ws,strides,pads,dil,group,bias", CASES)
def test_conv(xs, ws, strides, pads, dil, group, bias):
    x, w = torch.randn(xs), torch.randn(ws)
    b = torch.randn(ws[0]) if bias else None
    ref = torch_conv(x, w, b, strides, pads, dil, group)
    attrs = dict(strides=strides, pads=pads, dilations=dil, group=group)
    ins = [x, w] + ([b] if bias else [])
    check_op("Conv", ins, ref, attrs=attrs, const=(1, 2), **TOL)


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("stride", [1, 2])
def test_conv_auto_pad(mode, stride):
    x, w = torch.randn(1, 2, 8, 7), torch.randn(3, 2, 4, 3)
    n = 2
    if mode == "VALID":
        pads = (0,) * 4
    else:
        out = [-(-s // stride) for s in x.shape[2:]]
        total = [max(0, (o - 1) * stride + k - s) for o, k, s in zip(out, w.shape[2:], x.shape[2:])]
        begin = [t // 2 if mode == "SAME_UPPER" else t - t // 2 for t in total]
        pads = tuple(begin) + tuple(t - b for t, b in zip(total, begin))
    ref = torch_conv(x, w, None, (stride,) * n, pads, (1,) * n, 1)
    check_op("Conv", [x, w], ref, attrs=dict(auto_pad=mode, strides=(stride,) * n), const=(1,), **TOL)


def test_conv_pad_larger_than_needed():
    # the trailing pad is never reached by a window: no padded elements are materialized for it
    x, w = torch.randn(1, 2, 7, 7), torch.randn(3, 2, 3, 3)
    ref = torch_conv(x, w, None, (3, 3), (1, 1, 2, 2), (1, 1), 1)
    pg = check_op("Conv", [x, w], ref, attrs=dict(strides=(3, 3), pads=(1, 1, 2, 2)), const=(1,), **TOL)
    span = (ref.shape[2] - 1) * 3 + 3
    assert span < 7 + 1 + 2 and pg.prims[0].out.shape == (1, 2, span, span)


def test_conv_fp16():
    x, w, b = torch.randn(1, 4, 6, 6).half(), torch.randn(5, 4, 3, 3).half(), torch.randn(5).half()
    ref = torch_conv(x.float(), w.float(), b.float(), (1, 1), (1, 1, 1, 1), (1, 1), 1).half()
    check_op("Conv", [x, w, b], ref, attrs=dict(pads=(1, 1, 1, 1)), const=(1, 2), rtol=1e-2, atol=1e-2)


def test_conv_prim_categories():
    x, w, b = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4)
    ref = torch_conv(x, w, b, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    pg = check_op("Conv", [x, w, b], ref, attrs=dict(pads=(1, 1, 1, 1)), const=(1, 2), **TOL)
    assert [classify(p) for p in pg.prims] == [Category.layout, Category.contraction, Category.broadcast]
    pg = check_op("Conv", [x, w], F.conv2d(x, w, groups=1), const=(1,), **TOL)
    assert [classify(p) for p in pg.prims] == [Category.contraction]


def test_conv_resnet_size_takes_the_einsum_path(monkeypatch):
    # The contraction body stays a product of two affine loads, so the reference executor evaluates
    # it as one einsum over im2col-like factors instead of the full 7-D iteration space.
    calls = []
    einsum = torch.einsum
    monkeypatch.setattr(torch, "einsum", lambda *a: calls.append(a[0]) or einsum(*a))
    x, w = torch.randn(1, 64, 56, 56), torch.randn(64, 64, 3, 3)
    got, _ = run_op("Conv", [x, w], [TensorType((1, 64, 56, 56), DType.float32)], dict(pads=(1, 1, 1, 1)),
                    const=(1,))
    torch.testing.assert_close(got[0], F.conv2d(x, w, padding=1), rtol=1e-4, atol=1e-3)
    assert len(calls) == 1


@pytest.mark.parametrize("attrs,msg", [
    (dict(group=2), "group"),
    (dict(kernel_shape=(2, 2)), "kernel_shape"),
    (dict(auto_pad="SAME"), "auto_pad"),
    (dict(strides=(1,)), "strides"),
])
def test_conv_errors(attrs, msg):
    x, w = torch.randn(1, 3, 5, 5), torch.randn(4, 3, 3, 3)
    with pytest.raises(UnsupportedAttribute, match=f"{msg}.*Conv.*n0"):
        run_op("Conv", [x, w], [TensorType((1, 4, 3, 3), DType.float32)], attrs)


def test_conv_kernel_larger_than_input():
    x, w = torch.randn(1, 1, 2, 2), torch.randn(1, 1, 3, 3)
    with pytest.raises(UnsupportedAttribute, match="window larger"):
        run_op("Conv", [x, w], [TensorType((1, 1, 0, 0), DType.float32)])


def torch_conv_transpose(x, w, b, strides, pads, out_pad, dil, group):
    """F.conv_transpose with ONNX-style asymmetric pads: run unpadded, zero-extend by output_padding, crop."""
    n = x.dim() - 2
    y = CONVT[n](x, w, None, stride=strides, dilation=dil, groups=group)
    extra = []
    for d in reversed(range(n)):
        extra += [0, out_pad[d]]
    y = F.pad(y, extra)
    for d in range(n):
        y = y.narrow(2 + d, pads[d], y.shape[2 + d] - pads[d] - pads[n + d])
    return y if b is None else y + b.reshape([-1] + [1] * n)


T_CASES = [
    # (x shape, w shape, strides, pads, output_padding, dilations, group, bias)
    ((2, 3, 5), (3, 4, 3), (1,), (0, 0), (0,), (1,), 1, True),
    ((1, 4, 6), (4, 2, 4), (3,), (1, 2), (1,), (1,), 2, False),
    ((1, 2, 4, 5), (2, 3, 3, 3), (2, 2), (1, 1, 1, 1), (1, 0), (1, 1), 1, True),
    ((2, 2, 3, 4), (2, 3, 2, 3), (1, 2), (0, 1, 1, 0), (0, 1), (2, 1), 1, False),
    ((1, 4, 4, 4), (4, 1, 3, 3), (2, 2), (1, 1, 1, 1), (0, 0), (1, 1), 4, True),   # depthwise
    ((1, 2, 3, 3, 2), (2, 2, 2, 2, 2), (2, 1, 2), (0, 0, 0, 0, 0, 0), (0, 0, 1), (1, 1, 1), 1, True),
]


@pytest.mark.parametrize("xs,ws,strides,pads,out_pad,dil,group,bias", T_CASES)
def test_conv_transpose(xs, ws, strides, pads, out_pad, dil, group, bias):
    x, w = torch.randn(xs), torch.randn(ws)
    b = torch.randn(ws[1] * group) if bias else None
    n = len(xs) - 2
    if pads[:n] == pads[n:]:
        ref = CONVT[n](x, w, b, stride=strides, padding=pads[:n], output_padding=out_pad, dilation=dil, groups=group)
    else:
        ref = torch_conv_transpose(x, w, b, strides, pads, out_pad, dil, group)
    attrs = dict(strides=strides, pads=pads, output_padding=out_pad, dilations=dil, group=group)
    pg = check_op("ConvTranspose", [x, w] + ([b] if bias else []), ref, attrs=attrs, const=(1, 2), **TOL)
    assert classify(pg.prims[0]) is Category.contraction


def test_conv_transpose_output_shape_and_same():
    x, w = torch.randn(1, 2, 4, 3), torch.randn(2, 3, 3, 3)
    full = F.conv_transpose2d(x, w, stride=2)                          # (1, 3, 9, 7)
    # output_shape (8, 6): total padding 1 per dim; NOTSET/SAME_LOWER put it first, SAME_UPPER last
    check_op("ConvTranspose", [x, w], full[:, :, 1:, 1:], attrs=dict(strides=(2, 2), output_shape=(8, 6)),
             const=(1,), **TOL)
    check_op("ConvTranspose", [x, w], full[:, :, :8, :6],
             attrs=dict(strides=(2, 2), output_shape=(8, 6), auto_pad="SAME_UPPER"), const=(1,), **TOL)
    # SAME without output_shape: output = input * stride
    check_op("ConvTranspose", [x, w], full[:, :, :8, :6], attrs=dict(strides=(2, 2), auto_pad="SAME_UPPER"),
             const=(1,), **TOL)



@pytest.mark.parametrize("mode", ["NOTSET", "SAME_UPPER", "SAME_LOWER"])
@pytest.mark.parametrize("out_shape", [None, (8, 6), (7, 5)])
def test_conv_transpose_output_shape_matches_onnxruntime(mode, out_shape):
    # output_shape / SAME auto_pad: the total padding is split as the opset-21 text says
    x, w = torch.randn(1, 2, 4, 3), torch.randn(2, 3, 3, 3)
    attrs = dict(strides=(2, 2), auto_pad=mode, dilations=(1, 1))
    if out_shape is not None:
        attrs["output_shape"] = out_shape
    check_op("ConvTranspose", [x, w], onnxruntime_node("ConvTranspose", [x, w], attrs), attrs=attrs, const=(1,),
             **TOL)


def test_conv_transpose_errors():
    x, w = torch.randn(1, 3, 4, 4), torch.randn(3, 2, 3, 3)
    with pytest.raises(UnsupportedAttribute, match="group.*ConvTranspose"):
        run_op("ConvTranspose", [x, w], [TensorType((1, 4, 6, 6), DType.float32)], dict(group=2))


def test_a_conv_whose_every_tap_is_padding_stores_from_its_generated_kernel():
    """A grouped, dilated convolution whose one output window lies wholly in the padding (the ONNX
    fuzzer's seed 89): its A operand simplifies to zero and its output position to the program's
    batch alone, so the gemm kernel stores a [1, 1, 1] tile at a position on no tile axis (Triton
    refused the scalar pointer).  Planned for an H100, run through the interpreter, it equals
    onnxruntime: the bias."""
    from onnx import helper
    import tilefuse
    attrs = dict(dilations=[2, 1], group=2, kernel_shape=[2, 2], pads=[0, 2, 1, 0], strides=[1, 2])
    x, w, b = torch.randn(1, 18, 2, 1), torch.randn(2, 9, 2, 2), torch.randn(2)
    ref = onnxruntime_node("Conv", [x, w, b], attrs)
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, list(x.shape))],
                              [helper.make_tensor_value_info("y", 1, None)],
                              [helper.make_tensor("w", 1, list(w.shape), w.flatten().tolist()),
                               helper.make_tensor("b", 1, list(b.shape), b.tolist())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    cm = tilefuse.compile_onnx(model.SerializeToString(), backend="triton", target="h100", verify=True, time_limit=1.0)
    assert [k.schedule.family for k in cm.plan.kernels] == ["gemm"]
    torch.testing.assert_close(cm.emulate(x), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ref.flatten(), b)
