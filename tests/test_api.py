"""The public API contract (DESIGN.md §9): compile, report, targets, strategies, errors."""
import numpy as np
import pytest
import torch

import tilefuse
from tilefuse.errors import InputError, TargetAbsentError

REPORT_KEYS = {"target", "backend", "strategy", "num_ops", "num_prims", "prims_by_category", "num_kernels",
               "kernels", "est_total_us", "strategies", "solver", "compile_seconds"}
KERNEL_KEYS = {"name", "family", "prims", "ops", "est_us", "bytes", "flops", "measured_us"}


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 32)
        self.ln = torch.nn.LayerNorm(32)

    def forward(self, x):
        return torch.softmax(self.ln(torch.nn.functional.gelu(self.fc(x))), -1)


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    return Block().eval(), torch.randn(4, 16)


def test_report_has_the_contract_keys(block):
    model, x = block
    c = tilefuse.compile(model, (x,), target="cpu")
    r = c.report.to_dict()
    assert REPORT_KEYS <= set(r)
    assert r["kernels"] and all(KERNEL_KEYS <= set(k) for k in r["kernels"])
    assert set(r["strategies"]) == {"unfused", "greedy", "optimal"}
    assert {"status", "num_segments", "num_candidates", "seconds"} <= set(r["solver"])
    assert r["num_kernels"] == len(c.plan.kernels) < r["num_ops"] + 1
    assert r["strategies"]["optimal"]["est_total_us"] <= r["strategies"]["unfused"]["est_total_us"]
    assert tilefuse.Report is type(c.report)
    with torch.no_grad():
        torch.testing.assert_close(c(x), model(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strategy", ["unfused", "greedy", "optimal"])
def test_each_strategy_runs_exactly(block, strategy):
    model, x = block
    c = tilefuse.compile(model, (x,), target="cpu", strategy=strategy)
    assert c.report.strategy == strategy
    assert c.report.num_kernels == c.report.strategies[strategy]["num_kernels"]
    with torch.no_grad():
        torch.testing.assert_close(c(x), model(x), rtol=1e-5, atol=1e-6)


def test_planning_for_an_absent_gpu_gives_a_plan_but_calling_raises(block):
    model, x = block
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    c = tilefuse.compile(model, (x,), target="h100")
    assert c.report.target == "h100" and c.plan.kernels
    with pytest.raises(TargetAbsentError, match="h100.*not present"):
        c(x)


def test_unknown_backend_strategy_and_target_are_clear_errors(block):
    model, x = block
    with pytest.raises(ValueError, match="backend"):
        tilefuse.compile(model, (x,), backend="nope")
    with pytest.raises(ValueError, match="strategy"):
        tilefuse.compile(model, (x,), strategy="nope")
    with pytest.raises(ValueError, match="target"):
        tilefuse.compile(model, (x,), target="v100")


def test_wrong_input_shape_and_dtype_at_call_time(block):
    model, x = block
    c = tilefuse.compile(model, (x,), target="cpu")
    with pytest.raises(InputError, match="shape"):
        c(torch.randn(5, 16))
    with pytest.raises(InputError, match="dtype"):
        c(x.double())
    with pytest.raises(InputError):
        c.run({"wrong": x.numpy()})
    with pytest.raises(InputError, match=r"input 'x' \(#0\) is on meta.*runs on cpu.*\.to\('cpu'\)"):
        c(x.to("meta"))


def test_a_cpu_scalar_input_goes_to_the_models_device_and_a_cpu_tensor_does_not():
    """PyTorch lets a 0-dim CPU tensor stand beside device tensors (transformers' static cache,
    compiled with its prefill, reads its CPU length counter): the call copies it over; a CPU tensor
    of any other rank is the caller's mistake.  (The meta device stands in for CUDA here.)"""
    def f(x, n):
        return x * n
    x, n = torch.randn(4, 8), torch.tensor(3.0)
    c = tilefuse.compile(f, (x, n), target="cpu")
    feeds = c._check([x.to("meta"), n], torch.device("meta"))
    assert [t.device.type for t in feeds.values()] == ["meta", "meta"] and feeds[list(feeds)[1]].shape == ()
    one = tilefuse.compile(f, (x, n.reshape(1)), target="cpu")
    with pytest.raises(InputError, match=r"\(#1\) is on cpu.*runs on meta"):
        one._check([x.to("meta"), n.reshape(1)], torch.device("meta"))


def test_cuda_graph_replay_needs_a_cuda_target(block):
    model, x = block
    with pytest.raises(ValueError, match="cuda_graph=True needs backend='triton' and a CUDA target"):
        tilefuse.compile(model, (x,), target="cpu", cuda_graph=True)


def test_onnx_run_takes_numpy_feeds(block, tmp_path):
    model, x = block
    path = tmp_path / "b.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False, input_names=["x"], output_names=["y"])
    c = tilefuse.compile_onnx(str(path), target="cpu")
    (y,) = c.run({"x": x.numpy()})
    assert isinstance(y, np.ndarray)
    with torch.no_grad():
        np.testing.assert_allclose(y, model(x).numpy(), rtol=1e-5, atol=1e-6)


def test_compiling_twice_gives_the_same_plan(block):
    model, x = block
    a = tilefuse.compile(model, (x,), target="h100").report.to_dict()
    b = tilefuse.compile(model, (x,), target="h100").report.to_dict()
    for r in (a, b):
        r.pop("compile_seconds")
        r["solver"].pop("seconds")
    assert a == b


def _onnx_mlp(path):
    import onnx
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 4], np.linspace(-1, 1, 32).tolist())
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g", [x], [y], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return str(path)


def test_onnxruntime_conventions(tmp_path):
    """``get_inputs()``/``get_outputs()`` as onnxruntime's NodeArgs; ``run(None, feeds)`` and
    ``run(["y"], feeds)`` in onnxruntime's argument order; ``run(feeds, emulate=True)`` runs a GPU
    plan's kernels here, where a plain ``run`` of it is TargetAbsentError."""
    path = _onnx_mlp(tmp_path / "m.onnx")
    cm = tilefuse.compile_onnx(path, target="h100")
    (i,), (o,) = cm.get_inputs(), cm.get_outputs()
    assert (i.name, i.shape, i.type, i.dtype) == ("x", [2, 8], "tensor(float)", np.float32)
    assert (o.name, o.shape, o.type) == ("y", [2, 4], "tensor(float)")
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    want = x @ np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4)
    for got in (cm.run(None, {"x": x}, emulate=True), cm.run(["y"], {"x": x}, emulate=True),
                cm.run({"x": x}, emulate=True)):
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5)
    with pytest.raises(TargetAbsentError, match=r"emulate=True"):
        cm.run(None, {"x": x})


def test_target_auto_without_a_gpu_says_once_that_kernels_run_in_the_interpreter(monkeypatch):
    import tilefuse.api as api
    monkeypatch.setattr(api, "_interpreter_told", False)
    m, x = torch.nn.Linear(4, 4), torch.randn(2, 4)
    with pytest.warns(tilefuse.InterpreterWarning, match=r"no CUDA GPU.*not for speed.*target='h100'.*emulate"):
        tilefuse.compile(m, (x,))
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # once; and never for a named target
        tilefuse.compile(m, (x,))
        monkeypatch.setattr(api, "_interpreter_told", False)
        tilefuse.compile(m, (x,), target="cpu")
