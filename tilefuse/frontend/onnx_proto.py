"""Reading ONNX protobuf pieces as plain python: tensors, attributes, source locations."""
from __future__ import annotations

import re

import numpy as np
import onnx
from onnx import numpy_helper

from . import onnx_fold


def tensor_value(t: onnx.TensorProto | onnx.SparseTensorProto) -> np.ndarray:
    """An initializer as numpy (sparse ones densified)."""
    if isinstance(t, onnx.SparseTensorProto):
        return _densify(t)
    return numpy_helper.to_array(t)


def _densify(sp: onnx.SparseTensorProto) -> np.ndarray:
    """Indices are flat positions (1-D) or one coordinate row per value (2-D)."""
    values = numpy_helper.to_array(sp.values)
    idx = numpy_helper.to_array(sp.indices)
    dense = np.zeros(int(np.prod(sp.dims)), dtype=values.dtype)
    flat = idx if idx.ndim == 1 else np.ravel_multi_index(tuple(idx.T), tuple(sp.dims))
    dense[flat] = values
    return dense.reshape(tuple(sp.dims))


def attr_value(a: onnx.AttributeProto):
    T = onnx.AttributeProto
    if a.type == T.FLOAT:
        return _f32(a.f)
    if a.type == T.INT:
        return int(a.i)
    if a.type == T.STRING:
        return a.s.decode("utf-8", "replace")
    if a.type == T.FLOATS:
        return tuple(_f32(x) for x in a.floats)
    if a.type == T.INTS:
        return tuple(int(x) for x in a.ints)
    if a.type == T.STRINGS:
        return tuple(s.decode("utf-8", "replace") for s in a.strings)
    if a.type == T.TENSOR:
        return numpy_helper.to_array(a.t)
    if a.type == T.GRAPH:
        return a.g
    if a.type == T.GRAPHS:
        return tuple(a.graphs)
    return onnx.helper.get_attribute_value(a)


def _f32(x: float) -> float:
    """An ONNX float attribute as the shortest decimal that reads back as the same float32
    (1e-5, not 9.999999747378752e-06)."""
    return float(str(np.float32(x)))


def py_value(v):
    """Attribute values as plain python (numpy scalars and arrays become numbers and tuples)."""
    if isinstance(v, np.ndarray):
        return py_value(v.tolist())
    if isinstance(v, (list, tuple)):
        return tuple(py_value(x) for x in v)
    if isinstance(v, np.generic):
        return v.item()
    return v


_LOC_PATTERNS = (re.compile(r'File "([^"]+)", line (\d+)'), re.compile(r"([\w./\\-]+\.py):(\d+)"))


def location(proto: onnx.NodeProto) -> str | None:
    """A user source location from the node's doc_string or metadata (exporters put stack traces
    there): the last frame outside library code, else the last frame."""
    texts = [proto.doc_string] + [p.value for p in getattr(proto, "metadata_props", ())]
    frames = [f"{f}:{line}" for text in texts if text for pat in _LOC_PATTERNS for f, line in pat.findall(text)]
    user = [f for f in frames if not _LIBRARY.search(f)]
    return (user or frames or [None])[-1]


_LIBRARY = re.compile(r"[/\\](site-packages|dist-packages)[/\\]|^<")


def fmt_shape(vi: onnx.ValueInfoProto) -> str:
    if not vi.type.tensor_type.HasField("shape"):
        return "(unknown rank)"
    dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in vi.type.tensor_type.shape.dim]
    return "[" + ", ".join(map(str, dims)) + "]"


def itemsize(elem: int) -> int:
    try:
        return onnx_fold.np_dtype(elem).itemsize
    except (KeyError, TypeError, ValueError):
        return 1


def random_like(rng: np.random.Generator, shape, elem) -> np.ndarray:
    dt = onnx_fold.np_dtype(elem)
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dt, np.integer):
        return rng.integers(0, 3, size=shape).astype(dt)
    return rng.standard_normal(shape).astype(dt)
