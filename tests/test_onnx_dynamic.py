"""ONNX models with dynamic dimensions served at run time (issue #24, item 3).

``compile_onnx(path)`` of a model exported with dynamic batch and sequence gives a model that
serves every input size, with one plan per power-of-two bucket of sizes carried to each size in
it; every output is compared with onnxruntime.
"""
from __future__ import annotations

import io
import logging

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import tilefuse
from tilefuse.errors import InputError
from tilefuse.runtime.dynamic import DynamicModel


class Block(torch.nn.Module):
    """A LayerNorm, a projection, a softmax over the sequence and a residual: reductions along the
    hidden dim and along the (dynamic) sequence dim."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.norm, self.proj = torch.nn.LayerNorm(d), torch.nn.Linear(d, d)

    def forward(self, x, bias):
        h = self.proj(self.norm(x))
        w = torch.softmax(h.mean(-1, keepdim=True), dim=1)     # over the sequence
        return x + w * h + bias


@pytest.fixture(scope="module")
def exported() -> bytes:
    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.onnx.export(Block().eval(), (torch.randn(2, 5, 16), torch.randn(1, 5, 1)), buf, dynamo=False,
                      input_names=["x", "bias"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch", 1: "seq"}, "bias": {1: "seq"}, "y": {0: "batch", 1: "seq"}})
    return buf.getvalue()


def _feeds(batch: int, seq: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((batch, seq, 16), dtype=np.float32),
            "bias": rng.standard_normal((1, seq, 1), dtype=np.float32)}


def test_one_compile_serves_three_sizes_each_equal_to_onnxruntime(exported, caplog):
    model = tilefuse.compile_onnx(exported, target="cpu", check_buckets=False)   # (the bound: test_buckets.py)
    assert isinstance(model, DynamicModel) and model.plans == []
    assert [(i.name, i.shape) for i in model.get_inputs()] == [("x", ["batch", "seq", 16]), ("bias", [1, "seq", 1])]
    session = ort.InferenceSession(exported, providers=["CPUExecutionProvider"])
    with caplog.at_level(logging.INFO, logger="tilefuse.recompile"):
        for k, (batch, seq) in enumerate([(2, 5), (3, 7), (1, 12)]):
            feeds = _feeds(batch, seq, k)
            (got,) = model.run(None, feeds)
            (want,) = session.run(None, feeds)
            assert got.shape == (batch, seq, 16)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        (again,) = model.run(None, _feeds(3, 7, 9))          # a size seen before: its plan again
    # buckets: batch 2 x seq 5..8 (planned at seq 7), batch 3..4 x seq 5..8 (planned at 3, 7: serves
    # this call), batch 1 x seq 9..16 (at 15)
    assert len(model.plans) == 3
    assert model.report.specialization["dims"] == {"batch": 3, "seq": 7}      # the last call's plan
    assert not model.report.specialization["carried"]
    assert [p.report.specialization["bucket"]["ranges"] for p in model.plans] == [
        {"batch": [2, 2], "seq": [5, 8]}, {"batch": [1, 1], "seq": [9, 16]}, {"batch": [3, 4], "seq": [5, 8]}]
    lines = [r.getMessage() for r in caplog.records if r.name == "tilefuse.recompile"]
    assert len(lines) == 3, lines
    assert "the first call: batch=2, seq=5" in lines[0] and "serves batch 2..2, seq 5..8" in lines[0], lines[0]
    assert "dim 'batch': 2 -> 3" in lines[1] and "dim 'seq': 5 -> 7" in lines[1], lines[1]
    # a new size in a bucket planned before: carried, no plan
    feeds = _feeds(4, 6, 4)
    np.testing.assert_allclose(model.run(None, feeds)[0], session.run(None, feeds)[0], rtol=1e-5, atol=1e-5)
    assert len(model.plans) == 3 and model.report.specialization["carried"]
    assert model.report.specialization["dims"] == {"batch": 4, "seq": 6}
    # positional torch call, as a CompiledModel takes it
    x, bias = torch.randn(2, 9, 16), torch.randn(1, 9, 1)
    (want,) = session.run(None, {"x": x.numpy(), "bias": bias.numpy()})
    np.testing.assert_allclose(model(x, bias).numpy(), want, rtol=1e-5, atol=1e-5)


def test_the_plans_kept_are_bounded_least_recently_used_first(exported):
    model = tilefuse.compile_onnx(exported, target="cpu", max_plans=2, check_buckets=False)
    for seq in (3, 4, 3, 6, 9):
        model.run(None, _feeds(1, seq, seq))
    # seq 3..4 (planned at 3, carried to 4), 5..8 (at 7), 9..16 (at 15): the first was dropped
    assert [p.report.specialization["dims"]["seq"] for p in model.plans] == [7, 15]
    assert model.planned == 3 and [m.report.specialization["dims"]["seq"] for m in model.served] == [4, 3, 6, 9]


def test_sizes_that_contradict_the_model_are_named(exported):
    model = tilefuse.compile_onnx(exported, target="cpu")
    with pytest.raises(InputError, match=r"dim 'seq' is 5 in input 'x' but 6 in input 'bias'"):
        model.run(None, {"x": np.zeros((1, 5, 16), np.float32), "bias": np.zeros((1, 6, 1), np.float32)})
    with pytest.raises(InputError, match=r"input 'x' has size 8 in dim 2, which the model fixes at 16"):
        model.run(None, {"x": np.zeros((1, 5, 8), np.float32), "bias": np.zeros((1, 5, 1), np.float32)})
    with pytest.raises(InputError, match=r"input 'bias' has shape \[5, 1\]; the model declares \[1, 'seq', 1\]"):
        model.run(None, {"x": np.zeros((1, 5, 16), np.float32), "bias": np.zeros((5, 1), np.float32)})
    assert model.plans == []


def test_unnamed_dims_are_bound_per_input_and_dims_pin_what_they_name():
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "b"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 4]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])]), opset_imports=[helper.make_opsetid("", 17)])
    model = tilefuse.compile_onnx(m, target="cpu")
    x, b = np.random.default_rng(0).standard_normal((2, 3, 4), dtype=np.float32)
    (y,) = model.run(None, {"x": x, "b": b})
    np.testing.assert_allclose(y, np.maximum(x, 0) + b, rtol=1e-6)
    assert model.report.specialization["input_shapes"] == {"x": [3, 4]} and model.report.specialization["dims"] == {"n": 3}
    pinned = tilefuse.compile_onnx(m, target="cpu", dims={"n": 3})            # x is still open
    assert isinstance(pinned, DynamicModel)
    static = tilefuse.compile_onnx(m, target="cpu", dims={"n": 3}, input_shapes={"x": (3, 4)})
    assert isinstance(static, tilefuse.CompiledModel)
    with pytest.raises(InputError, match=r"'x' has unnamed dims: give its shape"):
        tilefuse.compile_onnx(m, target="cpu", dynamic=False)
    onnx.checker.check_model(m)


def test_max_plans_must_be_a_positive_integer(exported):
    from tilefuse.errors import OptionError
    for bad in (0, -1, 2.5, True):
        with pytest.raises(OptionError, match="max_plans must be a positive integer"):
            tilefuse.compile_onnx(exported, target="cpu", max_plans=bad)


def test_a_gpu_targets_plans_are_emulated_per_size(exported):
    model = tilefuse.compile_onnx(exported, target="h100")          # no GPU here: checked by emulation
    session = ort.InferenceSession(exported, providers=["CPUExecutionProvider"])
    for batch, seq in [(1, 3), (2, 6)]:
        feeds = _feeds(batch, seq, seq)
        (want,) = session.run(None, feeds)
        (got,) = model.run(None, feeds, emulate=True)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        x, bias = (torch.from_numpy(feeds[k]) for k in ("x", "bias"))
        np.testing.assert_allclose(model.emulate(x, bias).numpy(), want, rtol=1e-5, atol=1e-5)
    assert len(model.plans) == 2 and model.report.target == "h100"
    with pytest.raises(InputError, match="takes 2 tensor input"):
        model.emulate(torch.zeros(1, 3, 16))
