"""Normalization fission rules against torch (and onnxruntime where ONNX and torch differ)."""
from __future__ import annotations

import onnxruntime as ort
import pytest
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper
from opcheck import check_op, run_op

from tilefuse.analysis.classify import classify
from tilefuse.errors import UnsupportedAttribute, UnsupportedOperator
from tilefuse.ir.dtypes import DType, TensorType

g = torch.Generator().manual_seed(2)


def randn(*shape, dtype=torch.float32, scale=1.0, shift=0.0):
    return (torch.randn(shape, generator=g) * scale + shift).to(dtype)


def ort_run(op: str, x: torch.Tensor, attrs: dict, opset: int = 21) -> torch.Tensor:
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    vi = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))
    vo = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = helper.make_model(helper.make_graph([node], "g", [vi], [vo]),
                              opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return torch.from_numpy(sess.run(None, {"x": x.numpy()})[0])


# ---------------------------------------------------------------- LayerNormalization

@pytest.mark.parametrize("axis", [-1, 1, -2])
@pytest.mark.parametrize("affine", ["both", "scale", "none"])
def test_layer_norm(axis, affine):
    x = randn(2, 3, 8, scale=3, shift=5)
    shape = x.shape[axis % 3:]
    w, b = randn(*shape), randn(*shape)
    ins = {"both": [x, w, b], "scale": [x, w], "none": [x]}[affine]
    ref = F.layer_norm(x, shape, w if affine != "none" else None, b if affine == "both" else None, 1e-5)
    check_op("LayerNormalization", ins, ref, attrs={"axis": axis}, rtol=1e-5, atol=1e-5)


def test_layer_norm_stats_outputs_and_epsilon():
    x = randn(3, 4, 6, shift=2)
    w, b = randn(6), randn(6)
    axes = (1, 2)
    mean = x.mean(axes, keepdim=True)
    inv = 1 / torch.sqrt(x.var(axes, unbiased=False, keepdim=True) + 1e-2)
    ref = F.layer_norm(x, (4, 6), None, None, 1e-2) * w + b
    check_op("LayerNormalization", [x, w, b], [ref, mean, inv], attrs={"axis": 1, "epsilon": 1e-2},
             rtol=1e-5, atol=1e-5)


def test_layer_norm_broadcast_scale():
    x, w = randn(2, 3, 8), randn(1, 8)
    check_op("LayerNormalization", [x, w], F.layer_norm(x, (8,)) * w, rtol=1e-5, atol=1e-5)


def test_layer_norm_fp16():
    x = randn(4, 64, scale=4, shift=100, dtype=torch.float16)      # large mean: needs the two-pass variance
    w, b = randn(64, dtype=torch.float16), randn(64, dtype=torch.float16)
    xf = x.float()
    ref = F.layer_norm(xf, (64,), w.float(), b.float()).half()
    pg = check_op("LayerNormalization", [x, w, b], ref, rtol=2e-3, atol=2e-3)
    assert {p.out.dtype for p in pg.prims} == {DType.float32, DType.float16}
    # Mean and InvStdDev have the stash type (float32).
    mean, inv = xf.mean(-1, keepdim=True), 1 / torch.sqrt(xf.var(-1, unbiased=False, keepdim=True) + 1e-5)
    check_op("LayerNormalization", [x, w, b], [ref, mean, inv], rtol=2e-3, atol=2e-3)


def test_layer_norm_categories_and_stash_error():
    x, w = randn(2, 8), randn(8)
    pg = check_op("LayerNormalization", [x, w], F.layer_norm(x, (8,), w), rtol=1e-5, atol=1e-5)
    cats = {classify(p).value for p in pg.prims}
    assert cats == {"reduce", "broadcast", "elementwise"}
    with pytest.raises(UnsupportedAttribute, match="stash_type=0 of LayerNormalization"):
        run_op("LayerNormalization", [x, w], [TensorType((2, 8), DType.float32)], attrs={"stash_type": 0})


# ---------------------------------------------------------------- RMSNormalization

@pytest.mark.parametrize("axis", [-1, 1])
def test_rms_norm(axis):
    x = randn(2, 4, 8, scale=2)
    shape = x.shape[axis % 3:]
    w = randn(*shape)
    check_op("RMSNormalization", [x, w], F.rms_norm(x, shape, w, 1e-6), attrs={"axis": axis, "epsilon": 1e-6},
             rtol=1e-5, atol=1e-5)


def test_rms_norm_fp16():
    x, w = randn(3, 96, scale=3, dtype=torch.float16), randn(96, dtype=torch.float16)
    check_op("RMSNormalization", [x, w], F.rms_norm(x.float(), (96,), w.float(), 1e-5).half(), rtol=2e-3, atol=2e-3)


# ---------------------------------------------------------------- BatchNormalization

@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (4, 3), (2, 3, 7)])
def test_batch_norm(shape):
    x = randn(*shape, scale=2, shift=1)
    c = shape[1]
    w, b, m, v = randn(c), randn(c), randn(c), randn(c).abs() + 0.5
    ref = F.batch_norm(x, m, v, w, b, training=False, eps=1e-3)
    check_op("BatchNormalization", [x, w, b, m, v], ref, attrs={"epsilon": 1e-3}, const=(1, 2, 3, 4),
             rtol=1e-5, atol=1e-5)


def test_batch_norm_fp16_input_fp32_params():
    x = randn(2, 4, 3, 3, dtype=torch.float16)
    w, b, m, v = randn(4), randn(4), randn(4), randn(4).abs() + 0.5
    ref = F.batch_norm(x.float(), m, v, w, b, training=False, eps=1e-5).half()
    check_op("BatchNormalization", [x, w, b, m, v], ref, rtol=2e-3, atol=2e-3)


def test_batch_norm_training_unsupported():
    x, p = randn(2, 3), randn(3)
    with pytest.raises(UnsupportedAttribute, match="training_mode=1 of BatchNormalization"):
        run_op("BatchNormalization", [x, p, p, p, p], [TensorType((2, 3), DType.float32)], attrs={"training_mode": 1})


# ---------------------------------------------------------------- Instance and Group normalization

@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 4, 3, 5)])
def test_instance_norm(shape):
    x = randn(*shape, scale=3, shift=2)
    w, b = randn(shape[1]), randn(shape[1])
    check_op("InstanceNormalization", [x, w, b], F.instance_norm(x, weight=w, bias=b, eps=1e-4),
             attrs={"epsilon": 1e-4}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("groups", [1, 2, 6])
@pytest.mark.parametrize("shape", [(2, 6, 4, 3), (3, 6, 5)])
def test_group_norm(groups, shape):
    x = randn(*shape, scale=2, shift=-1)
    w, b = randn(6), randn(6)
    check_op("GroupNormalization", [x, w, b], F.group_norm(x, groups, w, b, 1e-5), attrs={"num_groups": groups},
             rtol=1e-5, atol=1e-5)


def test_group_norm_fp16():
    x = randn(2, 8, 4, 4, scale=3, dtype=torch.float16)
    w, b = randn(8, dtype=torch.float16), randn(8, dtype=torch.float16)
    ref = F.group_norm(x.float(), 4, w.float(), b.float(), 1e-5).half()
    check_op("GroupNormalization", [x, w, b], ref, attrs={"num_groups": 4}, rtol=2e-3, atol=2e-3)


def test_group_norm_errors():
    x, w = randn(2, 6, 4), randn(6)
    out = [TensorType((2, 6, 4), DType.float32)]
    with pytest.raises(UnsupportedAttribute, match="num_groups=4 of GroupNormalization"):
        run_op("GroupNormalization", [x, w, w], out, attrs={"num_groups": 4})
    with pytest.raises(UnsupportedOperator, match="one entry per channel"):
        run_op("GroupNormalization", [x, randn(3), randn(3)], out, attrs={"num_groups": 3})


# ---------------------------------------------------------------- Lp, LRN, MVN

@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("axis", [0, -1])
def test_lp_norm(p, axis):
    x = randn(3, 5)
    check_op("LpNormalization", [x], x / x.norm(p, axis, keepdim=True), attrs={"p": p, "axis": axis},
             rtol=1e-5, atol=1e-6)


def test_lp_norm_unsupported_p():
    with pytest.raises(UnsupportedAttribute, match="p=3 of LpNormalization"):
        run_op("LpNormalization", [randn(2, 2)], [TensorType((2, 2), DType.float32)], attrs={"p": 3})


@pytest.mark.parametrize("size", [1, 3, 5])
def test_lrn_odd_matches_torch(size):
    x = randn(2, 6, 3, 4, scale=3)
    attrs = {"size": size, "alpha": 0.01, "beta": 0.6, "bias": 2.0}
    check_op("LRN", [x], F.local_response_norm(x, size, 0.01, 0.6, 2.0), attrs=attrs, rtol=1e-5, atol=1e-6)


def lrn_spec(x, size, alpha, beta, bias):
    """ONNX's LRN definition, transcribed: window [c - floor((size-1)/2), c + ceil((size-1)/2)]."""
    lo, hi, c = (size - 1) // 2, size // 2, x.shape[1]
    sq = torch.stack([x[:, max(0, k - lo):min(c, k + hi + 1)].square().sum(1) for k in range(c)], 1)
    return x / (bias + alpha / size * sq) ** beta


@pytest.mark.parametrize("size", [2, 3, 4])
def test_lrn_matches_onnx_definition(size):
    # torch pads an even window on the other side (and onnxruntime rejects even sizes).
    x = randn(2, 5, 3, 3, scale=3)
    attrs = {"size": size, "alpha": 0.02, "beta": 0.75, "bias": 1.0}
    check_op("LRN", [x], lrn_spec(x, size, 0.02, 0.75, 1.0), attrs=attrs, rtol=1e-5, atol=1e-6)
    if size % 2:
        torch.testing.assert_close(lrn_spec(x, size, 0.02, 0.75, 1.0), F.local_response_norm(x, size, 0.02, 0.75, 1.0))


def test_lrn_bad_size():
    with pytest.raises(UnsupportedAttribute, match="size=0 of LRN"):
        run_op("LRN", [randn(1, 2, 2, 2)], [TensorType((1, 2, 2, 2), DType.float32)], attrs={"size": 0})


@pytest.mark.parametrize("axes", [None, (1,), (-1, -2)])
def test_mean_variance_norm(axes):
    x = randn(2, 3, 4, 5, scale=2, shift=3)
    dims = (0, 2, 3) if axes is None else tuple(a % 4 for a in axes)
    ref = (x - x.mean(dims, keepdim=True)) / (x.var(dims, unbiased=False, keepdim=True).sqrt() + 1e-9)
    check_op("MeanVarianceNormalization", [x], ref, attrs={} if axes is None else {"axes": axes},
             rtol=1e-5, atol=1e-5)


def test_mean_variance_norm_matches_onnxruntime():
    x = randn(2, 3, 4, 5, scale=2, shift=3)
    check_op("MeanVarianceNormalization", [x], ort_run("MeanVarianceNormalization", x, {}), rtol=1e-4, atol=1e-4)


def test_lp_normalization_of_zero_vector_is_zero():
    x = torch.randn(3, 4)
    x[1] = 0
    want = torch.nn.functional.normalize(x, p=2.0, dim=1)
    check_op("LpNormalization", [x], want, {"axis": 1, "p": 2})
