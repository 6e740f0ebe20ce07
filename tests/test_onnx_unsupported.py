"""The ONNX operators tilefuse refuses: every standard operator is supported or listed with a reason."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tilefuse.errors import UnsupportedOperator
from tilefuse.fission import RULES, load_rules
from tilefuse.frontend import onnx as onnx_frontend
from tilefuse.frontend.onnx import import_onnx
from tilefuse.frontend.onnx_control import CONTROL_OPS, SEQUENCE_OPS
from tilefuse.frontend.onnx_normalize import RULES as NORMALIZE
from tilefuse.frontend.onnx_unsupported import UNSUPPORTED


def _latest_schemas() -> dict:
    latest = {}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain in ("", "ai.onnx") and (s.name not in latest or s.since_version > latest[s.name].since_version):
            latest[s.name] = s
    return latest


def test_every_standard_operator_is_supported_or_listed():
    load_rules()
    handled = set(RULES) | set(NORMALIZE) | onnx_frontend._ALWAYS_FOLD | SEQUENCE_OPS | CONTROL_OPS
    missing = sorted(op for op, s in _latest_schemas().items()
                     if op not in handled and op not in UNSUPPORTED and not s.deprecated
                     and not (s.has_function or s.has_context_dependent_function))
    assert not missing, f"operators neither supported nor listed in frontend/onnx_unsupported.py: {missing}"
    refusing = {"NonZero", "Unique", "NonMaxSuppression"}     # fission rules that refuse (other frontends)
    stale = sorted(op for op in UNSUPPORTED if op in handled - refusing)
    assert not stale, f"listed as unsupported but handled: {stale}"


def test_listed_operator_is_refused_with_its_reason():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.INT64, None)
    m = helper.make_model(helper.make_graph([helper.make_node("NonZero", ["x"], ["y"], name="nz")], "g", [x], [y]),
                          opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(UnsupportedOperator, match="NonZero \\(node 'nz'\\): the output shape depends"):
        import_onnx(m)


def test_listed_operator_with_constant_inputs_is_folded():
    value = onnx.numpy_helper.from_array(np.array([0.0, 2.0, 3.0], np.float32))
    c = helper.make_node("Constant", [], ["c"], value=value)
    m = helper.make_model(helper.make_graph([c, helper.make_node("NonZero", ["c"], ["y"])], "g", [],
                                            [helper.make_tensor_value_info("y", TensorProto.INT64, None)]),
                          opset_imports=[helper.make_opsetid("", 21)])
    g = import_onnx(m).graph
    assert g.nodes == () and g.constant_map["y"].data.tolist() == [[1, 2]]
