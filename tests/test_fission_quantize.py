"""Fission of linear (de)quantization and integer contractions, against onnxruntime and torch."""
import pytest
import torch
import torch.nn.functional as F

from tilefuse.errors import UnsupportedAttribute
from tilefuse.ir.dtypes import DType, TensorType

from opcheck import check_op, onnxruntime_op as _ort, run_op

torch.manual_seed(0)


def test_dequantize_per_axis():
    x = torch.randint(0, 256, (2, 3, 4), dtype=torch.uint8)
    s, z = torch.rand(3) + 0.1, torch.randint(0, 256, (3,), dtype=torch.uint8)
    check_op("DequantizeLinear", [x, s, z], _ort("DequantizeLinear", [x, s, z], axis=1), attrs={"axis": 1})


def test_dequantize_blocked_int8_without_zero_point():
    x = torch.randint(-128, 128, (3, 8), dtype=torch.int8)
    s = torch.rand(3, 2) + 0.1
    want = x.float() * s.repeat_interleave(4, dim=1)
    check_op("DequantizeLinear", [x, s], want, attrs={"axis": 1, "block_size": 4})


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8])
def test_quantize_rounds_half_to_even_and_saturates(dtype):
    x = torch.tensor([[-300.0, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 300.0]] * 2)
    s, z = torch.tensor(1.0), torch.tensor(3 if dtype is torch.uint8 else -3, dtype=dtype)
    want = _ort("QuantizeLinear", [x, s, z])[0]
    assert want.dtype == dtype
    check_op("QuantizeLinear", [x, s, z], want)


def test_quantize_per_axis_matches_onnxruntime():
    x = torch.randn(2, 3, 5) * 20
    s, z = torch.rand(3) + 0.05, torch.randint(0, 256, (3,), dtype=torch.uint8)
    check_op("QuantizeLinear", [x, s, z], _ort("QuantizeLinear", [x, s, z], axis=1), attrs={"axis": 1})


def test_matmul_integer_is_exact():
    a = torch.randint(0, 256, (2, 4, 16), dtype=torch.uint8)
    b = torch.randint(-128, 128, (16, 5), dtype=torch.int8)
    za, zb = torch.tensor(128, dtype=torch.uint8), torch.tensor(3, dtype=torch.int8)
    want = (a.int() - 128) @ (b.int() - 3)
    pg = check_op("MatMulInteger", [a, b, za, zb], want)
    assert pg.prims[-1].out.dtype.value == "int32"


def test_conv_integer_per_channel_zero_point():
    x = torch.randint(0, 256, (1, 2, 6, 6), dtype=torch.uint8)
    w = torch.randint(0, 256, (3, 2, 3, 3), dtype=torch.uint8)
    zx, zw = torch.tensor(10, dtype=torch.uint8), torch.tensor([1, 2, 3], dtype=torch.uint8)
    want = F.conv2d((x.double() - 10), (w.double() - zw.double().view(3, 1, 1, 1)), padding=1).int()
    check_op("ConvInteger", [x, w, zx, zw], want, attrs={"pads": (1, 1, 1, 1)})


def test_qlinear_matmul_matches_onnxruntime():
    a = torch.randint(0, 256, (3, 8), dtype=torch.uint8)
    b = torch.randint(0, 256, (8, 4), dtype=torch.uint8)
    ins = [a, torch.tensor(0.02), torch.tensor(120, dtype=torch.uint8), b, torch.tensor(0.03),
           torch.tensor(130, dtype=torch.uint8), torch.tensor(0.05), torch.tensor(128, dtype=torch.uint8)]
    want = _ort("QLinearMatMul", ins)[0]
    got = check_op("QLinearMatMul", ins, want)
    assert any(p.reduce is not None and p.out.dtype.value == "int32" for p in got.prims)


def test_qlinear_conv_with_bias_matches_onnxruntime():
    x = torch.randint(0, 256, (1, 2, 5, 5), dtype=torch.uint8)
    w = torch.randint(0, 256, (4, 2, 3, 3), dtype=torch.uint8)
    bias = torch.randint(-500, 500, (4,), dtype=torch.int32)
    ins = [x, torch.tensor(0.01), torch.tensor(100, dtype=torch.uint8), w, torch.rand(4) * 0.01 + 0.005,
           torch.tensor(128, dtype=torch.uint8), torch.tensor(0.05), torch.tensor(120, dtype=torch.uint8), bias]
    want = _ort("QLinearConv", ins, pads=[1, 1, 1, 1])[0]
    check_op("QLinearConv", ins, want, attrs={"pads": (1, 1, 1, 1)})


def test_quantize_to_float8_is_refused():
    with pytest.raises(UnsupportedAttribute, match="QuantizeLinear"):
        run_op("QuantizeLinear", [torch.randn(4), torch.tensor(1.0)], [TensorType((4,), DType.float16)])
