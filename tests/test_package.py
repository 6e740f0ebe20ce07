"""Build here, deploy there (issue #23, item 4): a compiled model saved as a package
(``CompiledModel.save``, ``tilefuse compile --save``) loads without planning (``tilefuse.load``),
its kernels regenerated from the saved plan and equal to the saved sources; a package from another
tilefuse version, for another GPU, or not a package at all is refused with the reason."""
import json
import zipfile

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import tilefuse
from tilefuse import api
from tilefuse.cli import main
from tilefuse.errors import PackageError


def _onnx(path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])
    w = helper.make_tensor("w", TensorProto.FLOAT, [32, 16], np.random.default_rng(0).standard_normal(512).tolist())
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Gelu", ["h"], ["y"], domain="")]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 20)],
                          ir_version=10)
    onnx.save(m, path)
    return str(path)


def _no_planning(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("loading a package planned again")
    monkeypatch.setattr(api, "choose_graph", refuse)
    monkeypatch.setattr(api, "orchestrate", refuse)


def test_an_h100_package_built_here_loads_without_planning_and_runs_emulated(tmp_path, monkeypatch):
    cm = tilefuse.compile_onnx(_onnx(tmp_path / "m.onnx"), target="h100")
    path = cm.save(tmp_path / "m.tfz")
    with zipfile.ZipFile(path) as z:
        manifest = json.loads(z.read("manifest.json"))
        assert {"manifest.json", "model.pkl", "model.onnx"} <= set(z.namelist())
    assert manifest["target"] == "h100" and manifest["arch"] == 90 and manifest["tilefuse"] == tilefuse.__version__
    _no_planning(monkeypatch)
    loaded = tilefuse.load(path)
    assert [b.source for b in loaded.kernels] == [b.source for b in cm.kernels]
    assert loaded.target.name == "h100" and loaded.report.to_dict() == cm.report.to_dict()
    x = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
    np.testing.assert_array_equal(loaded.run(None, {"x": x}, emulate=True)[0], cm.run(None, {"x": x}, emulate=True)[0])


def test_a_pytorch_model_with_keyword_inputs_round_trips(tmp_path):
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x, *, bias):
            return torch.relu(self.lin(x) + bias)
    torch.manual_seed(0)
    model, x, b = Scaled().eval(), torch.randn(2, 8), torch.randn(8)
    cm = tilefuse.compile(model, (x,), target="cpu", example_kwargs={"bias": b})
    loaded = tilefuse.load(cm.save(tmp_path / "s.tfz"))
    x2, b2 = torch.randn(2, 8), torch.randn(8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x2, bias=b2), model(x2, bias=b2))


def test_packages_that_cannot_be_used_here_are_refused_with_the_reason(tmp_path, monkeypatch):
    path = tilefuse.compile_onnx(_onnx(tmp_path / "m.onnx"), target="h100", backend="reference").save(tmp_path / "m.tfz")
    old = tmp_path / "old.tfz"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(old, "w") as dst:
        for name in src.namelist():
            data = src.read(name)
            if name == "manifest.json":
                data = json.dumps(json.loads(data) | {"tilefuse": "0.0.1"}).encode()
            dst.writestr(name, data)
    with pytest.raises(PackageError, match=r"built by tilefuse 0\.0\.1 .*this is tilefuse .*compile the model again"):
        tilefuse.load(old)
    (tmp_path / "junk.tfz").write_bytes(b"not a zip")
    with pytest.raises(PackageError, match="not a tilefuse package"):
        tilefuse.load(tmp_path / "junk.tfz")
    with pytest.raises(PackageError, match="no such file"):
        tilefuse.load(tmp_path / "missing.tfz")
    # a machine with another GPU (an A100 here, as torch would report it)
    from tilefuse.cost.target import Target
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: type("P", (), {"name": "NVIDIA A100-SXM4-80GB"})())
    monkeypatch.setattr(Target, "is_present", lambda self: False)
    with pytest.raises(PackageError, match=r"planned for h100 \(sm_90\); this machine has NVIDIA A100-SXM4-80GB"):
        tilefuse.load(path)


def test_cli_compile_save_then_run_the_package_checked_against_onnxruntime(tmp_path, capsys):
    """The acceptance: compile for h100 on a CPU machine with --save, then run the package with
    --check, its kernels emulated here."""
    model, pkg = _onnx(tmp_path / "m.onnx"), tmp_path / "p.tfz"
    assert main(["compile", model, "--target", "h100", "--save", str(pkg)]) == 0
    assert f"saved the compiled model to {pkg}" in " ".join(capsys.readouterr().out.split())
    assert main(["run", str(pkg), "--check", "--iterations", "1"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "for h100" in out and "emulated on this CPU" in out and "match onnxruntime" in out
    assert main(["run", str(pkg), "--target", "a100"]) == 2
    assert "holds a plan for h100; --target a100 does not apply" in " ".join(capsys.readouterr().err.split())
