"""Test helper: split one operator into prims, run them with the reference executor, compare."""
from __future__ import annotations

from typing import Mapping, Sequence

import torch

from tilefuse.fission import fission
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.evaluate import run_reference
from tilefuse.ir.graph import Attrs, Graph, Node
from tilefuse.ir.prim import Constant, PrimGraph, TensorDecl


def one_node_graph(op: str, inputs: Sequence[torch.Tensor | None], out_types: Sequence[TensorType],
                   attrs: Mapping | None = None, const: Sequence[int] = ()) -> Graph:
    """A graph with one ``op`` node; inputs listed in ``const`` become constants, None = omitted."""
    decls, consts, names, types = [], [], [], {}
    for k, t in enumerate(inputs):
        if t is None:
            names.append("")
            continue
        name = f"x{k}"
        names.append(name)
        tt = TensorType(tuple(t.shape), DType.from_torch(t.dtype))
        types[name] = tt
        if k in const:
            consts.append(Constant(name, t))
        else:
            decls.append(TensorDecl(name, tt))
    outs = tuple(f"y{k}" for k in range(len(out_types)))
    types.update(zip(outs, out_types))
    node = Node(op, "n0", tuple(names), outs, Attrs(attrs or {}))
    return Graph(tuple(decls), outs, (node,), tuple(consts), types)


def run_op(op: str, inputs: Sequence[torch.Tensor | None], out_types: Sequence[TensorType],
           attrs: Mapping | None = None, const: Sequence[int] = ()) -> tuple[list[torch.Tensor], PrimGraph]:
    g = one_node_graph(op, inputs, out_types, attrs, const)
    pg = fission(g)
    feeds = {d.name: inputs[int(d.name[1:])] for d in g.inputs}
    return run_reference(pg, feeds), pg


def check_op(op: str, inputs: Sequence[torch.Tensor | None], expected: Sequence[torch.Tensor] | torch.Tensor,
             attrs: Mapping | None = None, const: Sequence[int] = (), rtol: float = 1e-5,
             atol: float = 1e-6) -> PrimGraph:
    """Assert the prims of ``op`` reproduce ``expected`` (shapes, dtypes and values)."""
    if isinstance(expected, torch.Tensor):
        expected = [expected]
    types = [TensorType(tuple(e.shape), DType.from_torch(e.dtype)) for e in expected]
    got, pg = run_op(op, inputs, types, attrs, const)
    for k, (g, e) in enumerate(zip(got, expected)):
        assert g.dtype == e.dtype, f"{op} output {k}: dtype {g.dtype} != {e.dtype}"
        assert g.shape == e.shape, f"{op} output {k}: shape {tuple(g.shape)} != {tuple(e.shape)}"
        if e.dtype.is_floating_point:
            torch.testing.assert_close(g, e, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{op} output {k}: {m}")
        else:
            assert torch.equal(g, e), f"{op} output {k}: values differ\n{g}\n{e}"
    return pg


def onnxruntime_node(op, inputs, attrs):
    """Run one ONNX node (opset 21) with onnxruntime: the oracle for ONNX-only attribute semantics."""
    import pytest
    ort = pytest.importorskip("onnxruntime")
    from onnx import helper
    names = [f"x{k}" for k in range(len(inputs))]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, 1, None) for n in names],
                              [helper.make_tensor_value_info("y", 1, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return torch.from_numpy(sess.run(None, {n: t.numpy() for n, t in zip(names, inputs)})[0])


def onnxruntime_op(op, inputs, n_out=1, opset=21, **attrs):
    """One ONNX node run by onnxruntime, inputs of any element type (None: omitted)."""
    import pytest
    ort = pytest.importorskip("onnxruntime")
    import onnx
    from onnx import helper
    names = [f"x{k}" if t is not None else "" for k, t in enumerate(inputs)]
    outs = [f"y{k}" for k in range(n_out)]
    vi = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(t.numpy().dtype), list(t.shape))
          for n, t in zip(names, inputs) if t is not None]
    graph = helper.make_graph([helper.make_node(op, names, outs, **attrs)], "g", vi,
                              [onnx.ValueInfoProto(name=o) for o in outs])
    model = onnx.shape_inference.infer_shapes(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, {n: t.numpy() for n, t in zip(names, inputs) if t is not None})
    return [torch.from_numpy(g) for g in got]
