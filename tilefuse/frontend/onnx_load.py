"""Reading an ONNX model (path, bytes or ModelProto) with one clear error per way it can fail."""
from __future__ import annotations

import os
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from ..errors import ModelLoadError

# Default-domain opsets read: old forms the normalizer does not know raise UnsupportedOperator for
# their node.  Opsets above 21 (up to the installed onnx's) are read with opset-21 semantics where
# the later versions only added element types.
MIN_OPSET = 1
DEFAULT_DOMAINS = ("", "ai.onnx")


def load_model(model_or_path) -> tuple[onnx.ModelProto, Path | None]:
    """The ModelProto (external data loaded) and the directory it came from (None if not a file)."""
    if isinstance(model_or_path, onnx.ModelProto):
        model, base = model_or_path, None
    elif isinstance(model_or_path, (bytes, bytearray, memoryview)):
        model, base = _parse(bytes(model_or_path), "the given bytes"), None
    elif isinstance(model_or_path, (str, os.PathLike)):
        path = Path(model_or_path)
        if not path.is_file():
            raise ModelLoadError(f"{path}: no such file; check the path to the .onnx model")
        model, base = _parse(path.read_bytes(), str(path)), path.parent
    else:
        raise ModelLoadError(f"cannot read a model from a {type(model_or_path).__name__}; "
                             "pass a path, bytes or an onnx.ModelProto")
    where = str(model_or_path) if base is not None else "the model"
    _check_structure(model, where)
    _load_external(model, base, where)
    return model, base


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise ModelLoadError(f"{where}: not a valid ONNX protobuf ({e}); the file may be truncated or "
                             "not an ONNX model: export or download it again") from None
    return model


def _check_structure(model: onnx.ModelProto, where: str) -> None:
    if not model.HasField("graph") or not (model.graph.node or model.graph.output):
        raise ModelLoadError(f"{where}: the model has no graph (empty or not an ONNX model); "
                             "export it again")
    if model.ir_version > onnx.IR_VERSION:
        raise ModelLoadError(f"{where}: IR version {model.ir_version} is newer than the installed onnx "
                             f"{onnx.__version__} reads (IR {onnx.IR_VERSION}); upgrade onnx")
    latest = onnx.defs.onnx_opset_version()
    version = default_opset(model)
    if version is None:
        if any(nd.domain in DEFAULT_DOMAINS for nd in model.graph.node):
            raise ModelLoadError(f"{where}: the model uses ONNX operators but imports no default-domain "
                                 f"opset; re-export it with an opset between {MIN_OPSET} and {latest}")
    elif not MIN_OPSET <= version <= latest:
        raise ModelLoadError(f"{where}: opset {version} is not supported (supported: {MIN_OPSET} to {latest}); "
                             "convert it with onnx.version_converter.convert_version(model, 17)")


def default_opset(model: onnx.ModelProto) -> int | None:
    for o in model.opset_import:
        if o.domain in DEFAULT_DOMAINS:
            return o.version
    # IR version 1/2 models have no opset_import and mean opset 1.
    return 1 if model.ir_version < 3 and not model.opset_import else None


def _external_tensors(model: onnx.ModelProto):
    for t in onnx.external_data_helper._get_all_tensors(model):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            yield t


def _load_external(model: onnx.ModelProto, base: Path | None, where: str) -> None:
    for t in _external_tensors(model):
        info = {e.key: e.value for e in t.external_data}
        loc = info.get("location", "?")
        if base is None:
            raise ModelLoadError(f"{where}: tensor '{t.name}' keeps its data in the external file '{loc}'; "
                                 "pass the model's path (with the data file beside it) instead of a "
                                 "ModelProto or bytes, or load it with onnx.load(path) first")
        path = base / loc
        if not path.is_file():
            raise ModelLoadError(f"{where}: external data file '{loc}' of tensor '{t.name}' not found "
                                 f"in {base}; keep the data file beside the model")
        try:
            onnx.external_data_helper.load_external_data_for_tensor(t, str(base))
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{where}: cannot read external data '{loc}' of tensor '{t.name}': {e}") from None
        expect = _nbytes(t)
        if expect is not None and len(t.raw_data) != expect:
            raise ModelLoadError(f"{where}: external data '{loc}' of tensor '{t.name}' holds {len(t.raw_data)} "
                                 f"bytes, the tensor needs {expect}; the data file is truncated or stale")
        t.data_location = onnx.TensorProto.DEFAULT
        del t.external_data[:]


_WHOLE_BYTE_TYPES = {1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20}


def _nbytes(t: onnx.TensorProto) -> int | None:
    if t.data_type not in _WHOLE_BYTE_TYPES:
        return None     # packed 4-bit and string tensors: no simple size to check
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    n = itemsize
    for d in t.dims:
        n *= d
    return n
