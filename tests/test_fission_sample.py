"""Fission of GridSample (against torch.nn.functional.grid_sample), RoiAlign and MaxRoiPool (onnxruntime)
and DeformConv."""
import pytest
import torch
import torch.nn.functional as F
from onnx import helper
from onnx.reference import ReferenceEvaluator

from opcheck import check_op, onnxruntime_op, run_op
from tilefuse.errors import UnsupportedAttribute
from tilefuse.ir.dtypes import DType, TensorType

torch.manual_seed(0)
TORCH_MODE = {"linear": "bilinear", "nearest": "nearest", "cubic": "bicubic"}


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_2d(mode, padding, align):
    x = torch.randn(2, 3, 5, 7)
    grid = torch.rand(2, 4, 6, 2) * 3.0 - 1.5          # reaches outside [-1, 1]: the padding modes matter
    if mode == "nearest":                                # (keep off the rounding ties, where libraries differ)
        grid = grid + 1e-3
    attrs = {"mode": mode, "padding_mode": padding, "align_corners": align}
    if (mode, padding) == ("cubic", "border"):
        # ONNX clamps an outside coordinate to the border before taking the 4 taps; torch (and
        # onnxruntime) clamp only each tap.  The backend test data follows ONNX's reference.
        want = _onnx_reference(x, grid, attrs)
    else:
        want = F.grid_sample(x, grid, mode=TORCH_MODE[mode], padding_mode=padding, align_corners=bool(align))
    check_op("GridSample", [x, grid], want, attrs=attrs, rtol=1e-4, atol=1e-5)


def _onnx_reference(x, grid, attrs):
    vi = [helper.make_tensor_value_info(n, 1, None) for n in ("x", "g")]
    graph = helper.make_graph([helper.make_node("GridSample", ["x", "g"], ["y"], **attrs)], "g", vi,
                              [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    return torch.from_numpy(ReferenceEvaluator(model).run(None, {"x": x.numpy(), "g": grid.numpy()})[0])


def test_grid_sample_3d_linear():
    x, grid = torch.randn(1, 2, 4, 5, 6), torch.rand(1, 3, 2, 4, 3) * 2.4 - 1.2
    want = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
    check_op("GridSample", [x, grid], want, attrs={"mode": "linear", "padding_mode": "border"}, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("ctm", ["half_pixel", "output_half_pixel"])
def test_roi_align_average_matches_onnxruntime(ctm):
    x = torch.randn(2, 3, 10, 12)
    rois = torch.tensor([[0.0, 0.0, 9.0, 9.0], [2.5, 1.0, 11.5, 6.0], [-3.0, 4.0, 4.0, 13.0]])
    batch = torch.tensor([0, 1, 1])
    attrs = {"output_height": 3, "output_width": 4, "sampling_ratio": 2, "spatial_scale": 0.8,
             "coordinate_transformation_mode": ctm}
    want = onnxruntime_op("RoiAlign", [x, rois, batch], opset=16, **attrs)[0]
    check_op("RoiAlign", [x, rois, batch], want, attrs=attrs, rtol=1e-4, atol=1e-5)


def test_roi_align_adaptive_sampling_is_refused():
    with pytest.raises(UnsupportedAttribute, match="sampling_ratio=0 of RoiAlign"):
        run_op("RoiAlign", [torch.randn(1, 1, 4, 4), torch.tensor([[0.0, 0.0, 3.0, 3.0]]), torch.tensor([0])],
               [TensorType((1, 1, 2, 2), DType.float32)], attrs={"output_height": 2, "output_width": 2})


def test_deform_conv_with_zero_offsets_is_a_convolution():
    x, w, b = torch.randn(1, 4, 6, 7), torch.randn(6, 2, 3, 3), torch.randn(6)
    offset = torch.zeros(1, 2 * 2 * 9, 3, 4)
    attrs = {"group": 2, "offset_group": 2, "strides": (2, 2), "pads": (1, 1, 1, 1)}
    want = F.conv2d(x, w, b, stride=2, padding=1, groups=2)
    check_op("DeformConv", [x, w, offset, b], want, attrs=attrs, rtol=1e-4, atol=1e-5)


def test_deform_conv_matches_onnx_reference():
    x, w = torch.randn(1, 2, 5, 5), torch.randn(3, 2, 2, 2)
    offset, mask = torch.randn(1, 8, 4, 4) * 1.5, torch.rand(1, 4, 4, 4)
    names = ["x", "w", "offset", "", "mask"]
    vi = [helper.make_tensor_value_info(n, 1, None) for n in names if n]
    graph = helper.make_graph([helper.make_node("DeformConv", names, ["y"])], "g", vi,
                              [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    feeds = {"x": x.numpy(), "w": w.numpy(), "offset": offset.numpy(), "mask": mask.numpy()}
    want = torch.from_numpy(ReferenceEvaluator(model).run(None, feeds)[0])
    check_op("DeformConv", [x, w, offset, None, mask], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("scale", [1.0, 0.5, 0.25])
def test_max_roi_pool_matches_onnxruntime(dtype, scale):
    x = torch.randn(2, 3, 9, 11).to(dtype)
    boxes = [[0, 1.0, 2.0, 7.0, 6.0], [1, -4.0, -3.0, 5.0, 4.0],       # partly outside (top-left)
             [1, 6.5, 3.5, 40.0, 30.0], [0, 2.5, -2.5, 2.5, 1.5],       # partly outside, .5 corners (round
             [0, 30.0, 30.0, 44.0, 41.0], [1, 8.0, 5.0, 3.0, 1.0],      # half away), all outside, malformed
             [0, -0.5, 1.5, 0.5, 3.5], [1, 3.0, 2.0, 3.0, 2.0]]    # one pixel: more bins than pixels
    rois = torch.tensor(boxes, dtype=dtype) * torch.tensor([1, *[1 / scale] * 4], dtype=dtype)
    rois = torch.cat([rois, torch.cat([torch.randint(0, 2, (6, 1)), torch.rand(6, 4) * 16 - 3], 1).to(dtype)])
    attrs = {"pooled_shape": [3, 4], "spatial_scale": scale}
    # onnxruntime has no float64 kernel: its float32 result, exact for these float32-representable inputs
    want = onnxruntime_op("MaxRoiPool", [x.float(), rois.float()], **attrs)[0].to(dtype)
    assert (want[4] == 0).all() and (want[7] == x[1, :, 2, 3, None, None]).all()  # the edge cases are exercised
    check_op("MaxRoiPool", [x, rois], want, attrs=attrs, rtol=0, atol=0)


def test_max_roi_pool_keeps_minus_infinity():
    # A bin of -inf pixels is -inf (the max, as ONNX's reference takes it; onnxruntime starts from
    # -FLT_MAX), and is not mistaken for an empty bin (0).
    x = torch.randn(1, 2, 5, 5)
    x[0, 1, 1:3, 2:4] = -float("inf")
    rois = torch.tensor([[0.0, 2.0, 1.0, 3.0, 2.0], [0.0, 6.0, 6.0, 8.0, 8.0]])
    want = torch.stack([x[0, :, 1:3, 2:4], torch.zeros(2, 2, 2)])
    check_op("MaxRoiPool", [x, rois], want, attrs={"pooled_shape": [2, 2]}, rtol=0, atol=0)
