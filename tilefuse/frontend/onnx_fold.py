"""Import-time evaluation of ONNX nodes (constant and shape-computation folding) and type inference
of single nodes, both on one-node models so that every node keeps its own opset's semantics."""
from __future__ import annotations

import warnings

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

# Folding may not create more than this many bytes of new constants in one node (an Expand of a
# constant to a huge tensor stays a node and is computed at run time).
FOLD_LIMIT_BYTES = 16 << 20
FOLD_GROWTH = 4     # ... unless they are at most this many times the size of its constant inputs
# Operators whose results differ from run to run: never folded.
NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                              "Multinomial", "Bernoulli"})
# Constants up to this many elements are given to per-node shape inference as values (shape-like
# parameters); bigger ones only by type, which is all inference needs of weights.
_INFER_VALUE_LIMIT = 4096


def evaluate(proto: onnx.NodeProto, opset: int, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """Run one node with onnx's reference implementation."""
    from onnx.reference import ReferenceEvaluator
    feeds = {name: arr for name, arr in zip(proto.input, inputs) if name}
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            outs = ReferenceEvaluator(proto, opsets={"": opset}).run(None, feeds)
        except Exception:   # noqa: BLE001 - e.g. ops defined by context-dependent functions,
            # which the evaluator expands only inside a model whose input types it knows
            outs = ReferenceEvaluator(_one_node_model(proto, opset, feeds)).run(None, feeds)
    return [np.asarray(o) if o is not None and not isinstance(o, list) else o for o in outs]


def _one_node_model(proto: onnx.NodeProto, opset: int, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    vis = [helper.make_tensor_value_info(k, elem_of(v), v.shape) for k, v in feeds.items()]
    outs = [helper.make_value_info(o, onnx.TypeProto()) for o in proto.output if o]
    model = helper.make_model(helper.make_graph([proto], "one", vis, outs),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(onnx.IR_VERSION, 10)
    return model


def shape_of(proto: onnx.NodeProto, opset: int, shape: tuple[int, ...]) -> np.ndarray:
    """Shape (with opset-15 start/end) of a tensor of the given static shape."""
    attrs = {a.name: a.i for a in proto.attribute}
    r = len(shape)
    start, end = attrs.get("start", 0), attrs.get("end", r)
    start = min(max(start + r if start < 0 else start, 0), r)
    end = min(max(end + r if end < 0 else end, 0), r)
    return np.array(shape[start:end], dtype=np.int64)


def infer_node(proto: onnx.NodeProto, opset: int, in_types: dict[str, tuple[tuple[int, ...], int]],
               consts: dict[str, np.ndarray]) -> dict[str, tuple[tuple, int]]:
    """ONNX type inference for one node given its inputs' static types (and small constant values).

    Returns {output name: (shape with None for unknown dims, elem type)} for the outputs it could type.
    """
    inits, vis = [], []
    for name, (shape, elem) in in_types.items():
        arr = consts.get(name)
        if arr is not None and arr.size <= _INFER_VALUE_LIMIT and arr.dtype != object:
            inits.append(numpy_helper.from_array(arr, name))
        vis.append(helper.make_tensor_value_info(name, elem, shape))
    outs = [helper.make_value_info(o, onnx.TypeProto()) for o in proto.output if o]
    graph = helper.make_graph([proto], "one", vis, outs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = min(onnx.IR_VERSION, 10)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except Exception:       # noqa: BLE001 - onnx raises several unrelated types; caller falls back
        return {}
    return {v.name: t for v in list(inferred.graph.output) + list(inferred.graph.value_info)
            if (t := type_of(v.type)) is not None}


def type_of(tp: onnx.TypeProto) -> tuple[tuple, int] | None:
    """(shape with None for unknown dims, elem type) of a tensor TypeProto; None if not a tensor
    type or the rank is unknown."""
    if tp.WhichOneof("value") != "tensor_type":
        return None
    tt = tp.tensor_type
    if not tt.HasField("shape"):
        return None
    dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
    return dims, tt.elem_type


def to_torch(arr: np.ndarray) -> torch.Tensor:
    """A folded numpy constant as a torch tensor (bfloat16 arrives as ml_dtypes.bfloat16)."""
    arr = np.array(arr, order="C", copy=True)     # (ascontiguousarray would make scalars 1-D)
    if arr.dtype.name == "bfloat16":
        return torch.from_numpy(arr.view(np.uint16)).view(torch.bfloat16)
    return torch.from_numpy(arr)


def elem_of(arr: np.ndarray) -> int:
    """ONNX element type of a numpy array (0 for strings and other non-tensor data)."""
    if arr.dtype == object or arr.dtype.kind in "US":
        return onnx.TensorProto.STRING
    return helper.np_dtype_to_tensor_dtype(arr.dtype)


def elem_name(elem: int) -> str:
    try:
        return onnx.TensorProto.DataType.Name(elem).lower()
    except ValueError:
        return f"element type {elem}"


def np_dtype(elem: int) -> np.dtype:
    return helper.tensor_dtype_to_np_dtype(elem)
