"""TopK (opaque indices + gathered values) and the data-dependent operators that are refused."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from onnx import helper
from onnx.reference import ReferenceEvaluator
from opcheck import check_op, one_node_graph, run_op

from tilefuse.analysis.classify import classify
from tilefuse.errors import UnsupportedOperator
from tilefuse.fission import fission
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.evaluate import run_reference

gen = torch.Generator().manual_seed(2)


def onnx_topk(x, k, **attrs):
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], **attrs)
    v, i = ReferenceEvaluator(node).run(None, {"x": x.numpy(), "k": np.array([k], dtype=np.int64)})
    return torch.from_numpy(v), torch.from_numpy(i)


@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("largest", [1, 0])
@pytest.mark.parametrize("k", [1, 3, "all"])
def test_topk_with_ties(axis, largest, k):
    x = torch.randint(-3, 4, (5, 7, 3), generator=gen).float()     # many ties: lower index first
    k = x.shape[axis] if k == "all" else k
    want = onnx_topk(x, k, axis=axis, largest=largest)
    pg = check_op("TopK", [x], want, attrs={"k": k, "axis": axis, "largest": largest, "sorted": 1})
    assert [classify(p).value for p in pg.prims] == ["opaque", "indirect"]


def test_topk_matches_torch_and_k_from_type():
    x = torch.randn(4, 11, generator=gen)
    vals, idx = torch.topk(x, 5, dim=1)
    check_op("TopK", [x], [vals, idx], attrs={"axis": -1})          # k from the declared output type
    xi = torch.randint(0, 1000, (6, 9), generator=gen, dtype=torch.int32)
    vals, idx = torch.topk(xi.long(), 2, dim=0, largest=False, sorted=True)
    check_op("TopK", [xi], [vals.int(), idx], attrs={"k": 2, "axis": 0, "largest": 0})


def test_topk_values_only():
    x = torch.randn(3, 8, generator=gen)
    g = one_node_graph("TopK", [x], [TensorType((3, 2), DType.float32), TensorType((3, 2), DType.int64)],
                       {"k": 2, "axis": 1})
    node = replace(g.nodes[0], outputs=("y0", ""))     # the Indices output is not requested
    g = replace(g, nodes=(node,), outputs=("y0",))
    out = run_reference(fission(g), {"x0": x})[0]
    torch.testing.assert_close(out, torch.topk(x, 2, dim=1).values)


@pytest.mark.parametrize("op,inputs,out", [
    ("NonZero", [torch.tensor([[1, 0], [0, 3]])], TensorType((2, 2), DType.int64)),
    ("Unique", [torch.tensor([3, 1, 3])], TensorType((2,), DType.int64)),
    ("NonMaxSuppression", [torch.rand(1, 4, 4), torch.rand(1, 1, 4)], TensorType((2, 3), DType.int64)),
    ("Compress", [torch.rand(3, 2), torch.tensor([True, False, True])], TensorType((2, 2), DType.float32)),
])
def test_data_dependent_shapes_are_refused(op, inputs, out):
    with pytest.raises(UnsupportedOperator, match="data-dependent output shape is not supported") as e:
        run_op(op, inputs, [out])
    assert f"{op} (node 'n0')" in str(e.value)
    pg, errors = fission(one_node_graph(op, inputs, [out]), collect_errors=True)
    assert pg is None and len(errors) == 1 and isinstance(errors[0], UnsupportedOperator)


def test_det_is_one_opaque_prim():
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    pg = check_op("Det", [x], torch.from_numpy(np.linalg.det(x.numpy())), rtol=1e-9, atol=1e-9)
    assert [p.body.fn for p in pg.prims] == ["det"]


def test_det_fp16_solves_in_fp32():
    x = torch.randn(3, 3).half()
    check_op("Det", [x], torch.tensor(np.linalg.det(x.float().numpy())).half(), rtol=1e-3, atol=1e-3)


def test_bitcast_reinterprets_bits():
    x = torch.randn(2, 5)
    want = torch.from_numpy(x.numpy().view(np.int32))
    check_op("BitCast", [x], want, attrs={"to": 6})


def test_bitcast_to_another_width_is_refused():
    with pytest.raises(Exception, match="BitCast"):
        run_op("BitCast", [torch.randn(4)], [TensorType((4,), DType.float16)], attrs={"to": 10})
