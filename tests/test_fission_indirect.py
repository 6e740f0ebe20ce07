"""Gather-family, OneHot, Resize and Scatter fission rules against torch / onnx.reference / onnxruntime."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from onnx import helper
from onnx.reference import ReferenceEvaluator
from opcheck import check_op, onnxruntime_op, run_op

from tilefuse.analysis.classify import classify
from tilefuse.errors import UnsupportedAttribute
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.printer import format_prim

gen = torch.Generator().manual_seed(1)


def rand(*shape, dtype=torch.float32):
    return torch.randn(shape, generator=gen).to(dtype)


def randint(lo, hi, shape, dtype=torch.int64):
    return torch.randint(lo, hi, shape, generator=gen).to(dtype)


def _node(op, inputs, attrs, n_out):
    names = [f"i{k}" if a is not None else "" for k, a in enumerate(inputs)]
    return helper.make_node(op, names, [f"o{k}" for k in range(n_out)], **(attrs or {})), names


def onnx_ref(op, inputs, attrs=None, n_out=1):
    """One ONNX node run by onnx.reference (inputs: numpy arrays, None = omitted)."""
    node, names = _node(op, inputs, attrs, n_out)
    feeds = {n: a for n, a in zip(names, inputs) if n}
    return [torch.from_numpy(np.ascontiguousarray(r)) for r in ReferenceEvaluator(node).run(None, feeds)]


def ort_run(op, inputs, attrs=None):
    """One ONNX node run by onnxruntime (float32 arithmetic, like the kernels)."""
    import onnxruntime as ort
    node, names = _node(op, inputs, attrs, 1)
    vi = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
          for n, a in zip(names, inputs) if n]
    out = helper.make_tensor_value_info("o0", helper.np_dtype_to_tensor_dtype(inputs[0].dtype), None)
    g = helper.make_graph([node], "g", vi, [out])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return torch.from_numpy(sess.run(None, {n: a for n, a in zip(names, inputs) if n})[0])


def categories(pg):
    return [classify(p).value for p in pg.prims]


# ---------------------------------------------------------------- gathers

@pytest.mark.parametrize("axis,ishape", [(0, (4,)), (1, (2, 3)), (-1, ()), (-2, (5, 1))])
@pytest.mark.parametrize("itype", [torch.int64, torch.int32])
def test_gather(axis, ishape, itype):
    data = rand(6, 5, 7)
    n = data.shape[axis]
    ind = randint(-n, n, ishape, itype)
    want = torch.from_numpy(np.take(data.numpy(), ind.numpy(), axis=axis))
    pg = check_op("Gather", [data, ind], want, attrs={"axis": axis})
    assert categories(pg) == ["indirect"]


def test_gather_constant_indices_and_embedding():
    table = rand(11, 4)
    ids = randint(0, 11, (2, 3))
    pg = check_op("Gather", [table, ids], F.embedding(ids, table), const=(0,))
    assert categories(pg) == ["indirect"]


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis):
    data = rand(3, 4, 5)
    n = data.shape[axis]
    shape = list(data.shape)
    shape[axis] = 6
    ind = randint(-n, n, shape)
    want = torch.gather(data, axis, torch.where(ind < 0, ind + n, ind))
    pg = check_op("GatherElements", [data, ind], want, attrs={"axis": axis})
    assert categories(pg) == ["indirect"]


@pytest.mark.parametrize("dshape,ishape,b", [
    ((4, 5, 3), (2, 2), 0), ((4, 5, 3), (3, 1, 3), 0), ((2, 5, 3), (2, 4, 1), 1), ((2, 3, 5, 7), (2, 3, 2), 2),
])
def test_gather_nd(dshape, ishape, b):
    data = rand(*dshape)
    m = ishape[-1]
    ind = torch.stack([randint(-dshape[b + k], dshape[b + k], ishape[:-1]) for k in range(m)], -1)
    want = onnx_ref("GatherND", [data.numpy(), ind.numpy()], {"batch_dims": b})[0]
    pg = check_op("GatherND", [data, ind], want, attrs={"batch_dims": b})
    assert categories(pg) == ["indirect"]


def test_gather_nd_bad_batch_dims():
    with pytest.raises(UnsupportedAttribute, match="batch_dims"):
        run_op("GatherND", [rand(2, 3), randint(0, 2, (2, 1))], [TensorType((2,), DType.float32)],
               attrs={"batch_dims": 2})


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_one_hot(axis):
    ind = torch.tensor([[0, 3, -1], [5, -5, 2]])      # 5 is out of range: an all-off row
    depth = np.array(5, dtype=np.int64)
    values = torch.tensor([-1.5, 2.0])
    want = onnx_ref("OneHot", [ind.numpy(), depth, values.numpy()], {"axis": axis})[0]
    check_op("OneHot", [ind, values], want, attrs={"axis": axis, "depth": 5})
    # depth left as an input (the output type decides) and float indices (truncated like ONNX)
    find = ind.float() + 0.25 * ind.sign()
    check_op("OneHot", [find, torch.tensor(5), values], want, attrs={"axis": axis})


# ---------------------------------------------------------------- resize

NEAREST_MODES = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
COORD_MODES = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"]


def resize_case(x, scales, **attrs):
    """(ORT result, onnx.reference result) for a Resize by scales.

    ORT computes source coordinates in float32 like the generated kernels, onnx.reference in
    float64; with scales exact in binary and integral scale * length they agree, ties included.
    ORT takes align_corners' length_resized as the integer output size, the ONNX reference (and
    tilefuse) as scale * length: compare with the reference where that is fractional.
    """
    s = np.array(scales, dtype=np.float32)
    return (ort_run("Resize", [x.numpy(), None, s], attrs),
            onnx_ref("Resize", [x.numpy(), None, s], attrs)[0])


@pytest.mark.parametrize("nearest_mode", NEAREST_MODES)
@pytest.mark.parametrize("ctm", COORD_MODES)
def test_resize_nearest(nearest_mode, ctm):
    x = rand(1, 2, 4, 8)
    scales = (1.0, 1.0, 2.5, 0.75)
    attrs = {"mode": "nearest", "nearest_mode": nearest_mode, "coordinate_transformation_mode": ctm}
    want, ref = resize_case(x, scales, **attrs)
    torch.testing.assert_close(want, ref)
    pg = check_op("Resize", [x], want, attrs={"scales": scales, **attrs})
    assert categories(pg) == ["layout"]


@pytest.mark.parametrize("nearest_mode", NEAREST_MODES)
@pytest.mark.parametrize("ctm", ["asymmetric", "half_pixel"])
def test_resize_nearest_integer_factor_is_quasi_affine(nearest_mode, ctm):
    x = rand(1, 3, 4, 12)
    scales = (1.0, 1.0, 3.0, 0.5)
    attrs = {"mode": "nearest", "nearest_mode": nearest_mode, "coordinate_transformation_mode": ctm}
    want, ref = resize_case(x, scales, **attrs)
    torch.testing.assert_close(want, ref)
    if (ctm, nearest_mode) == ("asymmetric", "floor"):
        torch.testing.assert_close(want, F.interpolate(x, size=(12, 6), mode="nearest"))
    pg = check_op("Resize", [x], want, attrs={"scales": scales, **attrs})
    text = format_prim(pg.prims[0])
    print(text)
    assert "f32" not in text and "// 3" in text and "i3 * 2" in text


@pytest.mark.parametrize("ctm", COORD_MODES)
@pytest.mark.parametrize("scales", [(1.0, 1.0, 2.0, 3.0), (1.0, 1.0, 0.6, 1.5), (1.0, 1.0, 1.0, 0.5),
                                    (1.0, 1.0, 0.4, 0.25), (1.0, 1.0, 0.7, 1.3)])
def test_resize_linear(ctm, scales):
    x = rand(2, 3, 5, 4)
    attrs = {"mode": "linear", "coordinate_transformation_mode": ctm}
    want, ref = resize_case(x, scales, **attrs)
    if ctm != "align_corners" or all((s * n).is_integer() for s, n in zip(scales, x.shape)):
        torch.testing.assert_close(want, ref, rtol=1e-5, atol=1e-5)
    check_op("Resize", [x], ref.float(), attrs={"scales": scales, **attrs}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("exclude_outside", [0, 1])
@pytest.mark.parametrize("ctm", ["half_pixel", "align_corners", "asymmetric"])
def test_resize_cubic(exclude_outside, ctm):
    x = rand(1, 2, 6, 5)
    scales = (1.0, 1.0, 1.5, 2.0)
    attrs = {"mode": "cubic", "coordinate_transformation_mode": ctm, "cubic_coeff_a": -0.5,
             "exclude_outside": exclude_outside}
    _, ref = resize_case(x, scales, **attrs)
    check_op("Resize", [x], ref.float(), attrs={"scales": scales, **attrs}, rtol=1e-4, atol=1e-5)


TORCH_MODES = [
    # torch interpolate kwargs, equivalent ONNX attributes
    (dict(mode="nearest"), dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")),
    (dict(mode="nearest-exact"), dict(mode="nearest", coordinate_transformation_mode="half_pixel",
                                      nearest_mode="round_prefer_ceil")),
    (dict(mode="bilinear", align_corners=False), dict(mode="linear", coordinate_transformation_mode="half_pixel")),
    (dict(mode="bilinear", align_corners=True), dict(mode="linear", coordinate_transformation_mode="align_corners")),
    (dict(mode="bicubic", align_corners=False), dict(mode="cubic", coordinate_transformation_mode="half_pixel")),
]


@pytest.mark.parametrize("tmode,attrs", TORCH_MODES)
@pytest.mark.parametrize("size", [(10, 14), (3, 5), (6, 1)])
def test_resize_matches_torch_2d(tmode, attrs, size):
    x = rand(2, 3, 6, 7)
    want = F.interpolate(x, size=size, **tmode)
    scales = (1.0, 1.0, size[0] / 6, size[1] / 7)
    check_op("Resize", [x], want, attrs={"scales": scales, **attrs}, rtol=1e-4, atol=1e-5)


def test_resize_trilinear_and_1d():
    x = rand(1, 2, 3, 4, 5)
    want = F.interpolate(x, size=(6, 4, 9), mode="trilinear", align_corners=False)
    pg = check_op("Resize", [x], want, attrs={"scales": (1.0, 1.0, 2.0, 1.0, 1.8), "mode": "linear"},
                  rtol=1e-4, atol=1e-5)
    assert len(pg.prims) == 1
    y = rand(2, 5)
    want = F.interpolate(y[None], size=12, mode="linear", align_corners=True)[0]
    check_op("Resize", [y], want, attrs={"scales": (1.0, 12 / 5), "mode": "linear",
                                         "coordinate_transformation_mode": "align_corners"}, rtol=1e-5, atol=1e-5)


def test_resize_integer_and_half_inputs():
    x = randint(0, 256, (1, 1, 4, 5), torch.uint8)
    scales = (1.0, 1.0, 1.5, 2.0)
    ref = onnx_ref("Resize", [x.numpy(), None, np.array(scales, dtype=np.float32)], {"mode": "linear"})[0]
    got, _ = run_op("Resize", [x], [TensorType(tuple(ref.shape), DType.uint8)],
                    attrs={"scales": scales, "mode": "linear"})
    assert (got[0].int() - ref.int()).abs().max() <= 1    # float32 vs float64 rounding of .5 cases
    h = rand(1, 1, 4, 4, dtype=torch.float16)
    want = F.interpolate(h.float(), scale_factor=2, mode="bilinear").half()
    check_op("Resize", [h], want, attrs={"scales": (1.0, 1.0, 2.0, 2.0), "mode": "linear"}, rtol=1e-3, atol=1e-3)
    n = randint(-50, 50, (2, 3), torch.int64)
    check_op("Resize", [n], n.repeat_interleave(2, 1), attrs={"scales": (1.0, 2.0), "mode": "nearest",
                                                              "nearest_mode": "floor",
                                                              "coordinate_transformation_mode": "asymmetric"})


@pytest.mark.parametrize("mode", ["linear", "cubic"])
@pytest.mark.parametrize("ctm", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("scales,exclude_outside", [((1.0, 1.0, 0.6, 0.35), 0), ((1.0, 1.0, 0.45, 0.8), 1),
                                                    ((1.0, 0.5, 1.5, 0.3), 0), ((1.0, 1.0, 0.25, 1.0), 1)])
def test_resize_antialias(mode, ctm, scales, exclude_outside):
    # Non-integer downsampling factors (taps straddle the borders), both axes, an upsampled axis
    # (plain interpolation), an unchanged one.
    x = rand(1, 4, 13, 11)
    attrs = {"mode": mode, "antialias": 1, "coordinate_transformation_mode": ctm, "exclude_outside": exclude_outside}
    ref = onnx_ref("Resize", [x.numpy(), None, np.array(scales, dtype=np.float32)], attrs)[0]
    plain = onnx_ref("Resize", [x.numpy(), None, np.array(scales, dtype=np.float32)], {**attrs, "antialias": 0})[0]
    assert not torch.allclose(ref, plain, atol=1e-3)       # the filter is wider than plain interpolation's
    check_op("Resize", [x], ref.float(), attrs={"scales": scales, **attrs}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["linear", "cubic"])
def test_resize_antialias_to_sizes(mode):
    x = rand(2, 3, 17, 9)
    sizes = np.array([2, 3, 5, 4], dtype=np.int64)
    attrs = {"mode": mode, "antialias": 1}
    ref = onnx_ref("Resize", [x.numpy(), None, None, sizes], attrs)[0]
    scales = tuple(float(o / n) for o, n in zip(sizes, x.shape))
    check_op("Resize", [x], ref.float(), attrs={"scales": scales, **attrs}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs,name", [
    ({"antialias": 1, "mode": "nearest"}, "antialias"),
    ({"coordinate_transformation_mode": "tf_crop_and_resize"}, "roi"),
    ({"coordinate_transformation_mode": "crop"}, "coordinate_transformation_mode"),
    ({"mode": "area"}, "mode"),
    ({"nearest_mode": "up"}, "nearest_mode"),
])
def test_resize_unsupported(attrs, name):
    with pytest.raises(UnsupportedAttribute, match=name) as e:
        run_op("Resize", [rand(1, 1, 2, 2)], [TensorType((1, 1, 4, 4), DType.float32)],
               attrs={"scales": (1.0, 1.0, 2.0, 2.0), **attrs})
    assert "Resize (node 'n0')" in str(e.value)


# ---------------------------------------------------------------- scatter (opaque)

@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, -1])
def test_scatter_elements(reduction, axis):
    data = rand(4, 5)
    n = data.shape[axis]
    shape = [3, 5] if axis == 0 else [4, 3]
    if reduction == "none":   # distinct targets: the result of duplicates is unspecified
        lines = [torch.randperm(n, generator=gen)[:3] - n * (k % 2) for k in range(5 if axis == 0 else 4)]
        ind = torch.stack(lines, 1 if axis == 0 else 0)
    else:
        ind = randint(-n, n, shape)
    upd = rand(*shape)
    want = onnx_ref("ScatterElements", [data.numpy(), ind.numpy(), upd.numpy()],
                    {"axis": axis, "reduction": reduction})[0]
    pg = check_op("ScatterElements", [data, ind, upd], want, attrs={"axis": axis, "reduction": reduction})
    assert categories(pg) == ["opaque"]


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("ishape", [(3, 1), (2, 2, 2)])
def test_scatter_nd(reduction, ishape):
    data = rand(5, 4, 3)
    m = ishape[-1]
    if reduction == "none":
        flat = torch.randperm(20, generator=gen)[:int(np.prod(ishape[:-1]))]
        cols = [flat // 4 - 5, flat % 4][:m]
        ind = torch.stack(cols, -1).reshape(ishape)
    else:
        ind = torch.stack([randint(-data.shape[k], data.shape[k], ishape[:-1]) for k in range(m)], -1)
    upd = rand(*ishape[:-1], *data.shape[m:])
    want = onnx_ref("ScatterND", [data.numpy(), ind.numpy(), upd.numpy()], {"reduction": reduction})[0]
    pg = check_op("ScatterND", [data, ind, upd], want, attrs={"reduction": reduction})
    assert categories(pg) == ["opaque"]


def test_scatter_bad_reduction():
    with pytest.raises(UnsupportedAttribute, match="reduction"):
        run_op("ScatterElements", [rand(3), randint(0, 3, (2,)), rand(2)], [TensorType((3,), DType.float32)],
               attrs={"reduction": "mean"})


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_resize_tf_crop_and_resize_extrapolates_outside_the_input(mode):
    x = torch.randn(1, 2, 5, 6)
    roi = torch.tensor([0, 0, -0.2, 0.3, 1, 1, 0.9, 1.4])       # reaches past both borders
    sizes = torch.tensor([1, 2, 4, 5])
    want = onnxruntime_op("Resize", [x, roi, None, sizes], mode=mode,
                          coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=7.0)[0]
    assert (want == 7.0).any() and (want != 7.0).any()
    check_op("Resize", [x], want, attrs={"mode": mode, "coordinate_transformation_mode": "tf_crop_and_resize",
                                         "roi": tuple(roi.tolist()), "scales": (1.0, 1.0, 0.8, 5 / 6),
                                         "extrapolation_value": 7.0, "nearest_mode": "round_prefer_floor"},
             rtol=1e-5, atol=1e-5)
