"""``tilefuse.minify``: a bug planted in the Triton code generator (GELU's ``erf`` computed on
1.01 x) is found in a 2-layer BERT, shrunk to a few prims and written as a test case that fails
while the bug is there and passes without it."""
from __future__ import annotations

import runpy

import pytest
import torch

import tilefuse
from tilefuse import zoo
from tilefuse.codegen.triton import ops
from tilefuse.minifier import MinifyError, ddmin


@pytest.fixture
def planted_erf_bug(monkeypatch, tmp_path):
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setitem(ops.UNARY, "erf", "libdevice.erf({x} * 1.01)")


def test_a_planted_bug_in_bert_shrinks_to_a_few_prims(planted_erf_bug, tmp_path, monkeypatch):
    model, sets = zoo.build("bert", "tiny")
    out = tmp_path / "test_minified.py"
    steps = []
    found = tilefuse.minify(model, sets[0], out=out, time_limit=2.0, progress=steps.append)
    assert found.original_prims > 90 and found.num_prims <= 10, found.graph
    assert any(p.origin.op == "Gelu" for p in found.graph.prims)
    assert found.failure.kind == "VerifyError" and found.failure.stage == "kernels"
    assert steps[0].startswith("failure:") and "->" in steps[-1]
    # the test case fails while the bug is there ...
    test = runpy.run_path(str(out))["test_minified"]
    with pytest.raises(AssertionError, match="kernels"):
        test()
    # ... and passes once it is fixed
    monkeypatch.setitem(ops.UNARY, "erf", "libdevice.erf({x})")
    test()


def test_a_model_that_compiles_right_has_nothing_to_minify(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU()).eval()
    with pytest.raises(MinifyError, match="nothing to minify"):
        tilefuse.minify(model, (torch.randn(2, 4),), out=None, time_limit=1.0)


def test_a_wrong_frontend_is_reported_as_such(monkeypatch):
    import tilefuse.fission as fission_pkg
    import tilefuse.minifier as minify_mod
    real = fission_pkg.fission

    def wrong(graph):
        from tilefuse.ir.prim import Prim, PrimGraph
        pg = real(graph)
        p = pg.prims[-1]
        bad = Prim(p.name, p.inputs, p.axes, p.body * 2.0, p.out, p.reduce, p.origin)
        return PrimGraph(pg.inputs, pg.constants, pg.prims[:-1] + (bad,), pg.outputs)
    monkeypatch.setattr(fission_pkg, "fission", wrong)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh()).eval()
    with pytest.raises(MinifyError, match="frontend or in fission"):
        minify_mod.minify(model, (torch.randn(2, 4),), out=None, time_limit=1.0)


def test_ddmin_finds_a_one_minimal_failing_subset():
    calls = []

    def fails(items):
        calls.append(len(items))
        return {3, 11, 17} <= set(items)
    assert ddmin(list(range(20)), fails) == [3, 11, 17]
    assert ddmin([5], lambda items: True) == [5]


def test_the_cli_minifies_an_onnx_model(planted_erf_bug, tmp_path, capsys):
    from tilefuse.cli import main

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)

        def forward(self, x):
            return torch.softmax(self.fc2(torch.nn.functional.gelu(self.fc1(x))), -1)
    path = tmp_path / "net.onnx"
    torch.onnx.export(Net().eval(), (torch.randn(3, 8),), str(path), dynamo=True, verbose=False)
    out = tmp_path / "case.py"
    assert main(["minify", str(path), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "failure: VerifyError in stage 'kernels'" in printed and str(out) in printed
    with pytest.raises(AssertionError):
        runpy.run_path(str(out))["test_minified"]()
