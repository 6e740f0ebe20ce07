"""Control flow at import time: Scan and Loop unrolled (one inlined body per iteration, outputs
stacked), If with a run-time condition as both branches and a Where."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import tilefuse
from tilefuse.errors import UnsupportedOperator
from tilefuse.frontend.onnx import import_onnx

F = TensorProto.FLOAT


def _scan_model(in_dir: int, out_dir: int, out_axis: int) -> onnx.ModelProto:
    """state += x_t * w (w from the outer scope); emits state and x_t - state per step."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["x_t", "w"], ["xw"]), helper.make_node("Add", ["s", "xw"], ["s_out"]),
         helper.make_node("Sub", ["x_t", "s_out"], ["d"])],
        "body", [helper.make_tensor_value_info("s", F, [3]), helper.make_tensor_value_info("x_t", F, [3])],
        [helper.make_tensor_value_info("s_out", F, [3]), helper.make_tensor_value_info("s_copy", F, [3]),
         helper.make_tensor_value_info("d", F, [3])])
    body.node.append(helper.make_node("Identity", ["s_out"], ["s_copy"]))
    scan = helper.make_node("Scan", ["s0", "x"], ["s_final", "ys", "ds"], body=body, num_scan_inputs=1,
                            scan_input_axes=[1], scan_input_directions=[in_dir],
                            scan_output_directions=[out_dir, 0], scan_output_axes=[out_axis, 0])
    g = helper.make_graph([scan], "g", [helper.make_tensor_value_info("s0", F, [3]),
                                        helper.make_tensor_value_info("x", F, [3, 5])],
                          [helper.make_tensor_value_info(o, F, None) for o in ("s_final", "ys", "ds")],
                          initializer=[onnx.numpy_helper.from_array(np.array([1.0, -2.0, 0.5], np.float32), "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)], ir_version=8)


def test_scan_unrolls_and_matches_onnxruntime():
    for in_dir, out_dir, out_axis in [(0, 0, 0), (1, 1, 1)]:
        m = _scan_model(in_dir, out_dir, out_axis)
        feeds = {"s0": np.random.randn(3).astype(np.float32), "x": np.random.randn(3, 5).astype(np.float32)}
        want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        graph = import_onnx(m).graph
        assert "Scan" not in {n.op for n in graph.nodes} and sum(n.op == "Add" for n in graph.nodes) == 5
        got = tilefuse.compile_onnx(m, backend="reference").run(feeds)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def _loop_model(trip_input: bool) -> onnx.ModelProto:
    """acc = acc * 2 + i for M = 4 iterations (stop early when i == 2 via the condition); emits acc."""
    I64 = TensorProto.INT64
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=F), helper.make_node("Mul", ["acc", "two"], ["a2"]),
         helper.make_node("Add", ["a2", "fi"], ["acc_out"]), helper.make_node("Less", ["i", "two_i"], ["c_out"]),
         helper.make_node("Identity", ["acc_out"], ["emit"])],
        "body", [helper.make_tensor_value_info("i", I64, []), helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("acc", F, [2])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), helper.make_tensor_value_info("acc_out", F, [2]),
         helper.make_tensor_value_info("emit", F, [2])],
        initializer=[onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two"),
                     onnx.numpy_helper.from_array(np.array(2, np.int64), "two_i")])
    loop = helper.make_node("Loop", ["M", "cond", "acc0"], ["acc_final", "accs"], body=body)
    inits = [onnx.numpy_helper.from_array(np.array(True), "cond")]
    inputs = [helper.make_tensor_value_info("acc0", F, [2])]
    if trip_input:
        inputs.append(helper.make_tensor_value_info("M", I64, []))
    else:
        inits.append(onnx.numpy_helper.from_array(np.array(4, np.int64), "M"))
    outputs = [helper.make_tensor_value_info(o, F, None) for o in ("acc_final", "accs")]
    g = helper.make_graph([loop], "g", inputs, outputs, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)], ir_version=8)


def test_loop_with_constant_trip_count_unrolls_and_stops_on_its_condition():
    m = _loop_model(trip_input=False)
    feeds = {"acc0": np.array([1.0, -1.0], np.float32)}
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert want[1].shape == (3, 2)          # the condition stops it after i == 2
    got = tilefuse.compile_onnx(m, backend="reference").run(feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w)


def test_loop_with_run_time_trip_count_is_refused():
    with pytest.raises(UnsupportedOperator, match="Loop .*dynamic trip count"):
        import_onnx(_loop_model(trip_input=True), input_shapes={"M": ()})


def test_if_with_run_time_condition_selects_between_both_branches():
    def branch(op, name):
        return helper.make_graph([helper.make_node(op, ["x", "x"], [name])], name, [],
                                 [helper.make_tensor_value_info(name, F, [4])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch("Add", "t"), else_branch=branch("Mul", "e"))
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                        helper.make_tensor_value_info("x", F, [4])],
                          [helper.make_tensor_value_info("y", F, [4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)], ir_version=8)
    assert [n.op for n in import_onnx(m).graph.nodes] == ["Add", "Mul", "Where"]
    compiled = tilefuse.compile_onnx(m, backend="reference")
    x = np.array([1.0, -2.0, 3.0, 0.5], np.float32)
    for c in (True, False):
        np.testing.assert_allclose(compiled.run({"c": np.array(c), "x": x})[0], x + x if c else x * x)
