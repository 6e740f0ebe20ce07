"""The ONNX frontend: loading errors, folding, normalization across opsets, options, exporters."""
from __future__ import annotations

import io

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import tilefuse
from tilefuse.errors import InputError, ModelLoadError, UnsupportedAttribute, UnsupportedOperator
from tilefuse.frontend.onnx import import_onnx
from tilefuse.frontend.onnx_fold import FOLD_LIMIT_BYTES
from tilefuse.ir.dtypes import DType, TensorType

F = TensorProto.FLOAT
I64 = TensorProto.INT64


def make(nodes, inputs, outputs, inits=(), opset=17, ir=None, **kw) -> onnx.ModelProto:
    """A model from nodes; inputs/outputs are (name, elem, shape) triples; inits numpy arrays by name."""
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                          [helper.make_tensor_value_info(*o) for o in outputs],
                          initializer=[numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], **kw)
    m.ir_version = ir or min(onnx.IR_VERSION, 8)
    return m


def relu_model() -> onnx.ModelProto:
    return make([helper.make_node("Relu", ["x"], ["y"], name="r")], [("x", F, [2, 3])], [("y", F, [2, 3])])


def canon(model, **kw):
    """(op, attrs) of each canonical node."""
    return [(n.op, dict(n.attrs)) for n in import_onnx(model, **kw).graph.nodes]


# ---------------------------------------------------------------------- loading errors
def test_loads_path_bytes_and_proto(tmp_path):
    m = relu_model()
    p = tmp_path / "m.onnx"
    onnx.save(m, p)
    for src in (m, m.SerializeToString(), str(p), p):
        g = import_onnx(src).graph
        assert [n.op for n in g.nodes] == ["Relu"] and g.types["y"] == TensorType((2, 3), DType.float32)


def test_missing_file(tmp_path):
    with pytest.raises(ModelLoadError, match="no such file"):
        import_onnx(tmp_path / "nope.onnx")


def test_truncated_file(tmp_path):
    m = make([helper.make_node("Add", ["x", "w"], ["y"])], [("x", F, [64])], [("y", F, [64])],
             inits={"w": np.ones(64, np.float32)})
    p = tmp_path / "cut.onnx"
    p.write_bytes(m.SerializeToString()[:-150])
    with pytest.raises(ModelLoadError, match="cut.onnx") as e:
        import_onnx(p)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("data", [b"", b"not an onnx model at all \xff\xfe", b"\x08"])
def test_garbage_bytes(data):
    with pytest.raises(ModelLoadError):
        import_onnx(data)


def test_wrong_object_type():
    with pytest.raises(ModelLoadError, match="cannot read a model from a int"):
        import_onnx(42)


def test_model_without_graph():
    with pytest.raises(ModelLoadError, match="no graph"):
        import_onnx(onnx.ModelProto(ir_version=8))


def test_unsupported_opset():
    m = relu_model()
    m.opset_import[0].version = onnx.defs.onnx_opset_version() + 5
    with pytest.raises(ModelLoadError, match="opset"):
        import_onnx(m)


def test_newer_ir_version():
    m = relu_model()
    m.ir_version = onnx.IR_VERSION + 1
    with pytest.raises(ModelLoadError, match="IR version"):
        import_onnx(m)


def test_other_domain_names_the_node():
    nodes = [helper.make_node("Relu", ["x"], ["t"]),
             helper.make_node("Normalizer", ["t"], ["y"], domain="ai.onnx.ml", norm="L2")]
    m = make(nodes, [("x", F, [2, 3])], [("y", F, [2, 3])])
    m.opset_import.append(helper.make_opsetid("ai.onnx.ml", 1))
    with pytest.raises(UnsupportedOperator, match=r"Normalizer \(node 'Normalizer_1'\).*ai\.onnx\.ml"):
        import_onnx(m)


def _external_model(tmp_path):
    m = make([helper.make_node("Add", ["x", "w"], ["y"])], [("x", F, [300])], [("y", F, [300])],
             inits={"w": np.arange(300, dtype=np.float32)})
    p = tmp_path / "ext.onnx"
    onnx.save(m, p, save_as_external_data=True, location="ext.bin", size_threshold=0)
    return p


def test_external_data(tmp_path):
    p = _external_model(tmp_path)
    g = import_onnx(p).graph
    assert torch.equal(g.constant_map["w"].data, torch.arange(300, dtype=torch.float32))
    (tmp_path / "ext.bin").unlink()
    with pytest.raises(ModelLoadError, match="external data file 'ext.bin'.*not found"):
        import_onnx(p)


def test_external_data_truncated(tmp_path):
    p = _external_model(tmp_path)
    data = (tmp_path / "ext.bin").read_bytes()
    (tmp_path / "ext.bin").write_bytes(data[:100])
    with pytest.raises(ModelLoadError, match="truncated"):
        import_onnx(p)


def test_external_data_needs_a_path(tmp_path):
    p = _external_model(tmp_path)
    proto = onnx.load(p, load_external_data=False)
    with pytest.raises(ModelLoadError, match="external file 'ext.bin'.*pass the model's path"):
        import_onnx(proto)


def test_undefined_input_is_malformed():
    m = make([helper.make_node("Add", ["x", "ghost"], ["y"], name="add")], [("x", F, [2])], [("y", F, [2])])
    with pytest.raises(ModelLoadError, match="'ghost' is not produced"):
        import_onnx(m)


def test_string_input_names_the_node():
    m = make([helper.make_node("StringNormalizer", ["s"], ["y"], name="norm")],
             [("s", TensorProto.STRING, [3])], [("y", TensorProto.STRING, [3])], opset=10)
    with pytest.raises(UnsupportedOperator, match=r"node 'norm'.*string tensors are not supported"):
        import_onnx(m)


def test_unused_unsupported_input():
    m = make([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [2]), ("u", TensorProto.UINT32, [2])],
             [("y", F, [2])])
    with pytest.raises(ModelLoadError, match="input 'u' has element type uint32"):
        import_onnx(m)


def test_cast_to_unsupported_type():
    m = make([helper.make_node("Cast", ["x"], ["y"], name="c", to=TensorProto.UINT32)], [("x", F, [2])],
             [("y", TensorProto.UINT32, [2])])
    with pytest.raises(UnsupportedAttribute, match=r"to='uint32' of Cast \(node 'c'\)"):
        import_onnx(m)


def test_control_flow_names_the_node():
    body = helper.make_graph([helper.make_node("Identity", ["c"], ["c_out"])], "body",
                             [helper.make_tensor_value_info("i", I64, []),
                              helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                             [helper.make_tensor_value_info("c_out", TensorProto.BOOL, [])])
    loop = helper.make_node("Loop", ["n", "cond"], [], name="loop", body=body)
    m = make([loop, helper.make_node("Relu", ["x"], ["y"])],
             [("x", F, [2]), ("n", I64, []), ("cond", TensorProto.BOOL, [])], [("y", F, [2])])
    assert [n.op for n in import_onnx(m).graph.nodes] == ["Relu"]    # unused: pruned
    m.graph.node[1].input[0] = "x"
    m.graph.node.insert(1, helper.make_node("Identity", ["x"], ["x2"]))
    loop2 = helper.make_node("Loop", ["n", "cond"], ["c_final"], name="loop2", body=body)
    m.graph.node.insert(0, loop2)
    m.graph.output.append(helper.make_tensor_value_info("c_final", TensorProto.BOOL, []))
    with pytest.raises(UnsupportedOperator, match=r"Loop \(node 'loop2'\).*dynamic trip count"):    # (not unrolled)
        import_onnx(m)


# ---------------------------------------------------------------------- input shapes
def _dynamic_model():
    return make([helper.make_node("Relu", ["x"], ["y"])], [("x", F, ["batch", 3])], [("y", F, ["batch", 3])])


def test_dynamic_input_needs_a_shape():
    with pytest.raises(InputError, match=r"1 input with dynamic dims: 'x' \[batch, 3\]; bind the named dims once "
                                         r"for every input: dims=\{'batch': 1\} \(command line: --dim batch=1\)"):
        import_onnx(_dynamic_model())


def test_named_dims_are_bound_once_for_every_input_and_all_unbound_ones_listed():
    """onnxruntime binds a named free dimension once for the whole model; so does ``dims``.  All
    inputs left open are listed in one error, with an example of the right rank for each."""
    two = make([helper.make_node("Add", ["a", "b"], ["y"])],
               [("a", F, ["batch", "seq"]), ("b", F, ["batch", "seq"])], [("y", F, ["batch", "seq"])])
    g = import_onnx(two, dims={"batch": 2, "seq": 5}).graph
    assert [d.type.shape for d in g.inputs] == [(2, 5), (2, 5)]
    with pytest.raises(InputError) as e:
        import_onnx(two, dims={"batch": 2})
    assert str(e.value) == ("2 inputs with dynamic dims: 'a' [batch, seq], 'b' [batch, seq]; bind the named dims "
                            "once for every input: dims={'seq': 1} (command line: --dim seq=1)")
    anon = make([helper.make_node("Relu", ["x"], ["y"])], [("x", F, [None, 3])], [("y", F, [None, 3])])
    with pytest.raises(InputError, match=r"'x' has unnamed dims: give its shape with input_shapes=\{'x': \(1, 3\)\} "
                                         r"\(command line: --input-shape x=1x3\)"):
        import_onnx(anon)
    with pytest.raises(InputError, match=r"dims binds 'btach', which no input of the model has; its named dims are "
                                         r"\['batch', 'seq'\]"):
        import_onnx(two, dims={"btach": 2, "seq": 5})
    # input_shapes pins one input's whole shape; it must agree with the dims bound
    with pytest.raises(InputError, match=r"gives input 'a' the shape \[3, 5\].*with dims"):
        import_onnx(two, dims={"batch": 2, "seq": 5}, input_shapes={"a": (3, 5)})


def test_input_shapes_option():
    g = import_onnx(_dynamic_model(), input_shapes={"x": (5, 3)}).graph
    assert g.inputs[0].type.shape == (5, 3) and g.types["y"].shape == (5, 3)
    with pytest.raises(InputError, match="declares"):
        import_onnx(_dynamic_model(), input_shapes={"x": (5, 4)})
    with pytest.raises(InputError, match="not inputs of the model"):
        import_onnx(_dynamic_model(), input_shapes={"z": (5, 3)})


def test_input_shapes_through_compile_onnx():
    cm = tilefuse.compile_onnx(_dynamic_model(), input_shapes={"x": (4, 3)})
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    np.testing.assert_array_equal(cm.run({"x": x})[0], np.maximum(x, 0))


# ---------------------------------------------------------------------- constants and folding
def test_initializer_inputs_are_constants():
    m = make([helper.make_node("Add", ["x", "w"], ["y"])], [("x", F, [2]), ("w", F, [2])], [("y", F, [2])],
             inits={"w": np.array([1.0, 2.0], np.float32)}, ir=3)
    g = import_onnx(m).graph
    assert [d.name for d in g.inputs] == ["x"] and "w" in g.constant_map
    g2 = import_onnx(m, initializers_as_inputs=True).graph
    assert [d.name for d in g2.inputs] == ["x", "w"] and not g2.constants


def test_shape_computation_folds_to_one_reshape():
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape (the usual exported flatten) folds away."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Constant", [], ["zero"], value=numpy_helper.from_array(np.array(0, np.int64))),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Constant", [], ["ax"], value=numpy_helper.from_array(np.array([0], np.int64))),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
             helper.make_node("Constant", [], ["m1"], value=numpy_helper.from_array(np.array([-1], np.int64))),
             helper.make_node("Concat", ["n1", "m1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["x", "shape"], ["y"], name="flatten")]
    m = make(nodes, [("x", F, [2, 3, 4])], [("y", F, None)], opset=13)
    g = import_onnx(m).graph
    assert [(n.op, n.name, n.inputs) for n in g.nodes] == [("Reshape", "flatten", ("x",))]
    assert g.types["y"] == TensorType((2, 12), DType.float32) and not g.constants
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(tilefuse.compile_onnx(m)(x), x.reshape(2, 12))


def test_constant_only_subgraph_folds():
    two = numpy_helper.from_array(np.array([2.0], np.float32))
    nodes = [helper.make_node("ConstantOfShape", ["shp"], ["z"], value=two),
             helper.make_node("Range", ["a", "b", "d"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=F),
             helper.make_node("Mul", ["z", "rf"], ["c"]),
             helper.make_node("Add", ["x", "c"], ["y"])]
    m = make(nodes, [("x", F, [3])], [("y", F, [3])],
             inits={"shp": np.array([3], np.int64), "a": np.array(0, np.int64), "b": np.array(3, np.int64),
                    "d": np.array(1, np.int64)})
    g = import_onnx(m).graph
    assert [n.op for n in g.nodes] == ["Add"]
    (c,) = [k for k in g.nodes[0].inputs if k != "x"]
    assert torch.equal(g.constant_map[c].data, torch.tensor([0.0, 2.0, 4.0]))


def test_huge_fold_stays_a_node():
    n = int((FOLD_LIMIT_BYTES // 4) ** 0.5) + 8
    nodes = [helper.make_node("Expand", ["one", "shape"], ["big"], name="expand"),
             helper.make_node("Mul", ["x", "big"], ["y"])]
    m = make(nodes, [("x", F, [n, n])], [("y", F, [n, n])],
             inits={"one": np.ones((1, 1), np.float32), "shape": np.array([n, n], np.int64)})
    g = import_onnx(m).graph
    assert [nd.op for nd in g.nodes] == ["Expand", "Mul"]
    assert sum(c.type.nbytes for c in g.constants) < 1024
    small = make(nodes, [("x", F, [4, 4])], [("y", F, [4, 4])],
                 inits={"one": np.ones((1, 1), np.float32), "shape": np.array([4, 4], np.int64)})
    assert [nd.op for nd in import_onnx(small).graph.nodes] == ["Mul"]


def test_big_fold_that_does_not_grow_much():
    """A Cast (or DequantizeLinear) of big weights replaces them: folded whatever the size."""
    n = FOLD_LIMIT_BYTES // 8 + 16
    nodes = [helper.make_node("Cast", ["w"], ["w64"], to=TensorProto.DOUBLE),
             helper.make_node("Add", ["x", "w64"], ["y"])]
    m = make(nodes, [("x", TensorProto.DOUBLE, [n])], [("y", TensorProto.DOUBLE, [n])],
             inits={"w": np.ones(n, np.float32)})
    g = import_onnx(m).graph
    assert [nd.op for nd in g.nodes] == ["Add"] and g.constant_map["w64"].data.dtype == torch.float64


def test_dynamic_parameter_is_unsupported():
    m = make([helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")], [("x", F, [6]), ("s", I64, [2])],
             [("y", F, [2, 3])])
    with pytest.raises(UnsupportedOperator, match=r"node 'rs'.*dynamic shape is not supported"):
        import_onnx(m)


def test_eyelike_and_size_fold_from_types():
    nodes = [helper.make_node("EyeLike", ["x"], ["e"], k=1), helper.make_node("Size", ["x"], ["n"]),
             helper.make_node("Cast", ["n"], ["nf"], to=F), helper.make_node("Mul", ["e", "nf"], ["t"]),
             helper.make_node("Add", ["x", "t"], ["y"])]
    m = make(nodes, [("x", F, [3, 4])], [("y", F, [3, 4])])
    g = import_onnx(m).graph
    assert [n.op for n in g.nodes] == ["Add"]
    (c,) = [k for k in g.nodes[0].inputs if k != "x"]
    assert torch.equal(g.constant_map[c].data, torch.from_numpy(np.eye(3, 4, 1, dtype=np.float32)) * 12)


# ---------------------------------------------------------------------- normalization across opsets
def _one(op, inputs, out_shape, attrs=None, inits=None, opset=17, x_shape=(2, 3, 4), elem=F, outs=("y",)):
    node = helper.make_node(op, ["x", *inputs], list(outs), name="n", **(attrs or {}))
    return make([node], [("x", elem, list(x_shape))], [(o, elem, list(s)) for o, s in zip(outs, out_shape)],
                inits=inits or {}, opset=opset)


def _same(*models):
    got = [canon(m) for m in models]
    for g in got[1:]:
        assert g == got[0]
    return got[0]


def test_reduce_axes_attribute_vs_input():
    assert _same(_one("ReduceSum", [], [(2, 1, 4)], {"axes": [1]}, opset=11),
                 _one("ReduceSum", ["a"], [(2, 1, 4)], inits={"a": np.array([1])}, opset=13),
                 ) == [("ReduceSum", {"axes": (1,)})]
    assert _same(_one("ReduceMax", [], [(2, 4)], {"axes": [-2], "keepdims": 0}, opset=13),
                 _one("ReduceMax", ["a"], [(2, 4)], {"keepdims": 0}, inits={"a": np.array([-2])}, opset=18),
                 ) == [("ReduceMax", {"axes": (-2,), "keepdims": 0})]
    noop = _one("ReduceSum", ["a"], [(2, 3, 4)], {"noop_with_empty_axes": 1},
                inits={"a": np.zeros(0, np.int64)}, opset=13)
    assert canon(noop) == [("Identity", {})]


def test_softmax_before_13_flattens():
    last = _same(_one("Softmax", [], [(2, 3, 4)], {"axis": 2}, opset=11),
                 _one("Softmax", [], [(2, 3, 4)], {"axis": -1}, opset=13))
    assert last == [("Softmax", {"axis": -1})]
    m = _one("LogSoftmax", [], [(2, 3, 4)], opset=11)       # default axis 1: over the last 12 values
    assert [op for op, _ in canon(m)] == ["Reshape", "LogSoftmax", "Reshape"]
    x = torch.randn(2, 3, 4)
    want = torch.log_softmax(x.reshape(2, 12), -1).reshape(2, 3, 4)
    torch.testing.assert_close(tilefuse.compile_onnx(m)(x), want)


def test_split_forms():
    outs = ("a", "b")
    want = [("Split", {"axis": 2, "split": (1, 3)})]
    assert _same(_one("Split", [], [(2, 3, 1), (2, 3, 3)], {"axis": 2, "split": [1, 3]}, opset=11, outs=outs),
                 _one("Split", ["s"], [(2, 3, 1), (2, 3, 3)], {"axis": 2}, inits={"s": np.array([1, 3])},
                      opset=13, outs=outs)) == want
    even = [("Split", {"axis": 2, "split": (2, 2)})]
    assert _same(_one("Split", [], [(2, 3, 2), (2, 3, 2)], {"axis": 2}, opset=11, outs=outs),
                 _one("Split", [], [(2, 3, 2), (2, 3, 2)], {"axis": 2, "num_outputs": 2}, opset=18, outs=outs)
                 ) == even


def test_squeeze_unsqueeze_forms():
    assert _same(_one("Squeeze", [], [(3, 4)], {"axes": [0]}, x_shape=(1, 3, 4), opset=11),
                 _one("Squeeze", ["a"], [(3, 4)], inits={"a": np.array([0])}, x_shape=(1, 3, 4), opset=13),
                 _one("Squeeze", [], [(3, 4)], x_shape=(1, 3, 4), opset=13)) == [("Squeeze", {"axes": (0,)})]
    assert _same(_one("Unsqueeze", [], [(2, 1, 3, 4)], {"axes": [1]}, opset=11),
                 _one("Unsqueeze", ["a"], [(2, 1, 3, 4)], inits={"a": np.array([1])}, opset=13)
                 ) == [("Unsqueeze", {"axes": (1,)})]


def test_slice_forms():
    want = [("Slice", {"starts": (1,), "ends": (3,), "axes": (2,), "steps": (1,)})]
    assert _same(_one("Slice", [], [(2, 3, 2)], {"starts": [1], "ends": [3], "axes": [2]}, opset=9),
                 _one("Slice", ["s", "e", "a"], [(2, 3, 2)], opset=10,
                      inits={"s": np.array([1]), "e": np.array([3]), "a": np.array([2])}),
                 _one("Slice", ["s", "e", "a", "st"], [(2, 3, 2)], opset=13,
                      inits={"s": np.array([1]), "e": np.array([3]), "a": np.array([2]), "st": np.array([1])})
                 ) == want


def test_pad_forms():
    pads = [0, 0, 1, 0, 0, 2]
    want = ("Pad", {"mode": "constant", "pads": tuple(pads)})
    old = _one("Pad", [], [(2, 3, 7)], {"pads": pads, "mode": "constant", "value": 1.5}, opset=10)
    new = _one("Pad", ["p", "v"], [(2, 3, 7)], {"mode": "constant"}, opset=11,
               inits={"p": np.array(pads), "v": np.array(1.5, np.float32)})
    axes = _one("Pad", ["p", "v", "a"], [(2, 3, 7)], {"mode": "constant"}, opset=18,
                inits={"p": np.array([1, 2]), "v": np.array(1.5, np.float32), "a": np.array([-1])})
    for m in (old, new, axes):
        (node,) = import_onnx(m).graph.nodes
        assert (node.op, dict(node.attrs)) == want and len(node.inputs) == 2
    x = torch.randn(2, 3, 4)
    for m in (old, new, axes):
        torch.testing.assert_close(tilefuse.compile_onnx(m)(x),
                                   torch.nn.functional.pad(x, (1, 2), value=1.5))


def test_clip_attributes_become_inputs():
    old = _one("Clip", [], [(2, 3, 4)], {"min": -0.5, "max": 0.5}, opset=6)
    new = _one("Clip", ["lo", "hi"], [(2, 3, 4)], opset=11,
               inits={"lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)})
    x = torch.randn(2, 3, 4)
    for m in (old, new):
        (node,) = import_onnx(m).graph.nodes
        assert node.op == "Clip" and len(node.inputs) == 3
        torch.testing.assert_close(tilefuse.compile_onnx(m)(x), x.clamp(-0.5, 0.5))
    only_max = _one("Clip", [], [(2, 3, 4)], {"max": 0.5}, opset=6)
    g = import_onnx(only_max).graph
    # an omitted min is float32's lowest (Clip-6's default; from opset 11 numeric_limits::lowest())
    assert g.constant_map[g.nodes[0].inputs[1]].data.item() == torch.finfo(torch.float32).min


def test_resize_forms():
    sc = np.array([1, 1, 2, 2], np.float32)
    base = dict(x_shape=(1, 1, 2, 3))
    up9 = _one("Upsample", ["s"], [(1, 1, 4, 6)], {"mode": "nearest"}, inits={"s": sc}, opset=9, **base)
    r10 = _one("Resize", ["s"], [(1, 1, 4, 6)], {"mode": "nearest"}, inits={"s": sc}, opset=10, **base)
    legacy = _same(up9, r10)
    assert legacy[0][1]["coordinate_transformation_mode"] == "asymmetric"
    assert legacy[0][1]["nearest_mode"] == "floor" and legacy[0][1]["scales"] == (1.0, 1.0, 2.0, 2.0)
    roi = np.zeros(0, np.float32)
    r11 = _one("Resize", ["r", "s"], [(1, 1, 4, 6)], {"mode": "linear"}, inits={"r": roi, "s": sc}, opset=11, **base)
    r13 = _one("Resize", ["", "", "z"], [(1, 1, 4, 6)], {"mode": "linear"},
               inits={"z": np.array([1, 1, 4, 6])}, opset=13, **base)
    r18 = _one("Resize", ["", "", "z"], [(1, 1, 4, 6)], {"mode": "linear", "axes": [2, 3]},
               inits={"z": np.array([4, 6])}, opset=18, **base)
    new = _same(r11, r13, r18)
    assert new[0][1]["coordinate_transformation_mode"] == "half_pixel"
    assert new[0][1]["scales"] == (1.0, 1.0, 2.0, 2.0) and new[0][1]["mode"] == "linear"
    aspect = _one("Resize", ["", "", "z"], [(1, 1, 4, 6)], {"keep_aspect_ratio_policy": "not_larger", "axes": [2, 3]},
                  inits={"z": np.array([5, 6])}, opset=18, **base)
    assert canon(aspect)[0][1]["scales"] == (1.0, 1.0, 2.0, 2.0)


def test_topk_tile_and_dropout():
    k1 = _one("TopK", [], [(2, 3, 2), (2, 3, 2)], {"k": 2}, opset=1, outs=("v", "i"))
    k10 = _one("TopK", ["k"], [(2, 3, 2), (2, 3, 2)], inits={"k": np.array([2])}, opset=10, outs=("v", "i"))
    k1.graph.output[1].type.tensor_type.elem_type = I64
    k10.graph.output[1].type.tensor_type.elem_type = I64
    assert _same(k1, k10) == [("TopK", {"k": 2})]
    tile = _one("Tile", ["r"], [(2, 6, 4)], inits={"r": np.array([1, 2, 1])})
    assert canon(tile) == [("Tile", {"repeats": (1, 2, 1)})]
    drop = _one("Dropout", ["ratio"], [(2, 3, 4), (2, 3, 4)], inits={"ratio": np.array(0.3, np.float32)},
                opset=13, outs=("y", "mask"))
    drop.graph.output[1].type.tensor_type.elem_type = TensorProto.BOOL
    g = import_onnx(drop).graph
    assert [(n.op, n.inputs) for n in g.nodes] == [("Dropout", ("x",))]
    assert g.constant_map["mask"].data.all()
    train = _one("Dropout", ["ratio", "t"], [(2, 3, 4)], opset=13,
                 inits={"ratio": np.array(0.3, np.float32), "t": np.array(True)})
    with pytest.raises(UnsupportedAttribute, match="training_mode"):   # random: only ratio 0 is supported
        import_onnx(train)


def test_legacy_broadcast_and_prelu():
    add = make([helper.make_node("Add", ["x", "b"], ["y"], broadcast=1, axis=1)],
               [("x", F, [2, 3, 4]), ("b", F, [3])], [("y", F, [2, 3, 4])], opset=6)
    x, b = torch.randn(2, 3, 4), torch.randn(3)
    torch.testing.assert_close(tilefuse.compile_onnx(add)(x, b), x + b[:, None])
    prelu = make([helper.make_node("PRelu", ["x", "s"], ["y"])], [("x", F, [2, 3, 4])], [("y", F, [2, 3, 4])],
                 inits={"s": np.array([0.1, 0.2, 0.3], np.float32)}, opset=6)
    s = torch.tensor([0.1, 0.2, 0.3])
    torch.testing.assert_close(tilefuse.compile_onnx(prelu)(x), torch.where(x > 0, x, x * s[:, None]))


def test_batchnorm_forms():
    p = {k: np.random.default_rng(k).random(3).astype(np.float32) + 0.5 for k in range(4)}
    inits = {"s": p[0], "b": p[1], "m": p[2], "v": p[3]}
    v6 = _one("BatchNormalization", ["s", "b", "m", "v"], [(2, 3, 4)], {"epsilon": 1e-3, "is_test": 1,
                                                                       "momentum": 0.9}, inits=inits, opset=6)
    v15 = _one("BatchNormalization", ["s", "b", "m", "v"], [(2, 3, 4)], {"epsilon": 1e-3}, inits=inits, opset=15)
    assert _same(v6, v15) == [("BatchNormalization", {"epsilon": 1e-3})]
    train = _one("BatchNormalization", ["s", "b", "m", "v"], [(2, 3, 4)], {"training_mode": 1}, inits=inits,
                 opset=15)
    x = torch.randn(2, 3, 4)       # training mode normalizes by the batch's own statistics
    want = torch.nn.functional.batch_norm(x, None, None, torch.from_numpy(p[0]), torch.from_numpy(p[1]), training=True)
    torch.testing.assert_close(tilefuse.compile_onnx(train, backend="reference")(x), want, rtol=1e-5, atol=1e-5)


def test_auto_pad_becomes_pads():
    w = np.ones((1, 1, 3, 3), np.float32)
    m = make([helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2])],
             [("x", F, [1, 1, 6, 6])], [("y", F, [1, 1, 3, 3])], inits={"w": w})
    (node,) = import_onnx(m).graph.nodes
    assert node.attrs["pads"] == (0, 0, 1, 1) and "auto_pad" not in node.attrs


def test_cast_forms():
    cl = make([helper.make_node("CastLike", ["x", "like"], ["y"])], [("x", F, [2]), ("like", I64, [1])],
              [("y", I64, [2])], opset=15)
    g = import_onnx(cl).graph
    assert [(n.op, n.inputs, dict(n.attrs)) for n in g.nodes] == [("Cast", ("x",), {"to": I64})]


# ---------------------------------------------------------------------- names, locations, identity
def test_unnamed_nodes_get_deterministic_names():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["b"], name="neg"),
             helper.make_node("Exp", ["b"], ["y"])]
    m = make(nodes, [("x", F, [2])], [("y", F, [2])])
    assert [n.name for n in import_onnx(m).graph.nodes] == ["Relu_0", "neg", "Exp_2"]


def test_locations_from_doc_string_and_metadata():
    n1 = helper.make_node("Relu", ["x"], ["a"], doc_string='File "/home/me/model.py", line 12, in forward')
    n2 = helper.make_node("Neg", ["a"], ["y"])
    n2.metadata_props.add(key="pkg.torch.onnx.stack_trace",
                          value='File "/home/me/net.py", line 7, in forward\n'
                                'File "/usr/lib/python3/site-packages/torch/nn/functional.py", line 9, in neg')
    m = make([n1, n2], [("x", F, [2])], [("y", F, [2])], ir=10)
    assert [n.location for n in import_onnx(m).graph.nodes] == ["/home/me/model.py:12", "/home/me/net.py:7"]
    assert import_onnx(relu_model()).graph.nodes[0].location is None


def test_identity_models():
    """Outputs that are inputs or constants need no operator."""
    m = make([helper.make_node("Identity", ["x"], ["y"])], [("x", F, [2])],
             [("y", F, [2]), ("c", F, [2]), ("x", F, [2])], inits={"c": np.array([1.0, 2.0], np.float32)})
    cm = tilefuse.compile_onnx(m)
    x = np.array([3.0, -4.0], np.float32)
    y, c, x2 = cm.run({"x": x})
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(c, [1.0, 2.0])
    np.testing.assert_array_equal(x2, x)


def test_sequences_and_if_are_resolved():
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", F, [2, 3])])
    other = helper.make_graph([helper.make_node("Exp", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, [2, 3])])
    nodes = [helper.make_node("If", ["cond"], ["z"], then_branch=then, else_branch=other),
             helper.make_node("SequenceConstruct", ["x", "z"], ["seq"]),
             helper.make_node("SequenceInsert", ["seq", "x"], ["seq2"]),
             helper.make_node("ConcatFromSequence", ["seq2"], ["y"], axis=0, new_axis=1)]
    m = make(nodes, [("x", F, [2, 3])], [("y", F, [3, 2, 3])], inits={"cond": np.array(True)})
    x = torch.randn(2, 3)
    torch.testing.assert_close(tilefuse.compile_onnx(m)(x), torch.stack([x, -x, x]))


def test_local_function_is_expanded():
    f = helper.make_function("custom", "AddScaled", ["a", "b"], ["c"],
                             [helper.make_node("Constant", [], ["k"], value_float=2.0),
                              helper.make_node("Mul", ["b", "k"], ["t"]),
                              helper.make_node("Add", ["a", "t"], ["c"])],
                             [helper.make_opsetid("", 17)])
    m = make([helper.make_node("AddScaled", ["x", "x"], ["y"], domain="custom", name="call", doc_string="net.py:3")],
             [("x", F, [3])], [("y", F, [3])], functions=[f])
    m.opset_import.append(helper.make_opsetid("custom", 1))
    g = import_onnx(m).graph
    assert [n.op for n in g.nodes] == ["Mul", "Add"] and g.nodes[0].name.startswith("call/")
    assert {n.location for n in g.nodes} == {"net.py:3"}
    x = torch.randn(3)
    torch.testing.assert_close(tilefuse.compile_onnx(m)(x), x * 3)


# ---------------------------------------------------------------------- an exported model
class _MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.norm, self.fc2 = torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 5)

    def forward(self, x):
        return torch.softmax(self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x)))), dim=-1)


def _check_exported(dynamo: bool, opset: int | None = None):
    import onnxruntime as ort
    torch.manual_seed(0)
    model, x = _MLP().eval(), torch.randn(4, 8)
    f = io.BytesIO()
    kw = {} if opset is None else {"opset_version": opset}
    torch.onnx.export(model, (x,), f, dynamo=dynamo, **kw)
    data = f.getvalue()
    name = onnx.load_from_string(data).graph.input[0].name
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    want = sess.run(None, {name: x.numpy()})[0]
    cm = tilefuse.compile_onnx(data)
    ops = {n.op for n in cm.graph.nodes}
    assert "Softmax" in ops and ("LayerNormalization" in ops or (opset or 18) < 17)
    np.testing.assert_allclose(cm.run({name: x.numpy()})[0], want, rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.parametrize("opset", [14, 17])    # LayerNormalization decomposed / as one operator
def test_torchscript_export_matches_onnxruntime(opset):
    _check_exported(dynamo=False, opset=opset)


@pytest.mark.slow      # ~13 s, mostly the exporter itself
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
def test_dynamo_export_matches_onnxruntime():
    pytest.importorskip("onnxscript")
    _check_exported(dynamo=True)


# ---------------------------------------------------------------------- the canonical graph, run by onnxruntime
# Checks the frontend alone (whatever fission does): the canonical graph, put back into ONNX
# opset 21 (onnx_conformance.canonical_to_onnx), must reproduce the backend test data.  All model
# cases (many at opset 6: legacy forms), and the node cases of the operators normalization rewrites;
# each held to its entry in tests/onnx_expectations.json.
from onnx_conformance import cases as _conformance_cases, check as _conformance_check  # noqa: E402


@pytest.mark.parametrize("case", _conformance_cases("test_canonical_graph_matches_onnxruntime"))
def test_canonical_graph_matches_onnxruntime(case):
    _conformance_check("test_canonical_graph_matches_onnxruntime", case)


def test_sparse_initializer_is_densified():
    values = numpy_helper.from_array(np.array([5.0, 7.0], np.float32), "w")
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([1, 4], np.int64)), [2, 3])
    m = make([helper.make_node("Add", ["x", "w"], ["y"])], [("x", F, [2, 3])], [("y", F, [2, 3])])
    m.graph.sparse_initializer.append(sparse)
    g = import_onnx(m).graph
    assert torch.equal(g.constant_map["w"].data, torch.tensor([[0.0, 5.0, 0.0], [0.0, 7.0, 0.0]]))


@pytest.mark.parametrize("constant", [True, False])
def test_groupnorm_18_per_group_scale(constant):
    """Opset 18's per-group scale/bias becomes opset 21's per-channel one."""
    x, s, b = torch.randn(2, 4, 3), torch.tensor([1.5, -2.0]), torch.tensor([0.1, 0.2])
    inits = {"s": s.numpy(), "b": b.numpy()} if constant else {}
    extra = [] if constant else [("s", F, [2]), ("b", F, [2])]
    m = make([helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2, epsilon=1e-5)],
             [("x", F, [2, 4, 3])] + extra, [("y", F, [2, 4, 3])], inits=inits, opset=18)
    g = import_onnx(m).graph
    norm = [n for n in g.nodes if n.op == "GroupNormalization"][0]
    assert all(g.types[i].shape == (4,) for i in norm.inputs[1:])
    want = torch.nn.functional.group_norm(x, 2, s.repeat_interleave(2), b.repeat_interleave(2), eps=1e-5)
    cm = tilefuse.compile_onnx(m)
    got = cm(x) if constant else cm(x, s, b)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
