"""backend="triton": plans run with generated Triton kernels (the interpreter on a CPU machine)."""
import numpy as np
import pytest
import torch

import tilefuse
from tilefuse.demo import demo_model


def test_encoder_block_runs_through_generated_kernels_and_matches_eager():
    model, inputs = demo_model(batch=2, seq=8)
    c = tilefuse.compile(model, inputs, backend="triton")
    assert c.report.backend == "triton"
    assert any(k.family == "fused" for k in c.report.kernels)
    with torch.no_grad():
        want = model(*inputs)
    torch.testing.assert_close(c(*inputs), want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c(*inputs), want, rtol=1e-5, atol=1e-5)   # kernels are built once, reused


@pytest.mark.parametrize("strategy", ["unfused", "greedy"])
def test_baseline_plans_run_through_generated_kernels(strategy):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.GELU(), torch.nn.LayerNorm(24),
                                torch.nn.Softmax(-1)).eval()
    x = torch.randn(5, 12)
    c = tilefuse.compile(model, (x,), backend="triton", strategy=strategy)
    with torch.no_grad():
        torch.testing.assert_close(c(x), model(x), rtol=1e-5, atol=1e-6)


def test_onnx_model_runs_through_generated_kernels(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten()).eval()
    x = torch.randn(1, 3, 6, 6)
    path = tmp_path / "m.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=False, input_names=["x"])
    c = tilefuse.compile_onnx(str(path), backend="triton")
    (y,) = c.run({"x": x.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(y, model(x).numpy(), rtol=1e-5, atol=1e-5)


def test_compiling_twice_gives_identical_kernels_and_plan_and_reuses_the_cache(tmp_path, monkeypatch):
    from tilefuse.codegen.triton import launch
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(launch, "_MODULES", {})          # as in a fresh process
    model, inputs = demo_model(batch=1, seq=5)

    def build():
        c = tilefuse.compile(model, inputs, time_limit=2.0)
        return c, c.program.kernel_sources, [str(k.candidate) for k in c.plan.kernels]

    a, sources_a, plan_a = build()
    files = {p: p.stat().st_mtime_ns for p in (tmp_path / "kernels").glob("*.py")}
    assert sources_a and len(files) == len(set(sources_a))    # identical kernels are written once
    monkeypatch.setattr(launch, "_MODULES", {})          # a second process: nothing imported yet
    b, sources_b, plan_b = build()
    assert sources_a == sources_b and plan_a == plan_b
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "kernels").glob("*.py")} == files   # reused, not rewritten
    for src in sources_a:
        assert src.startswith("# fused_") and "# implements:" in src
    with torch.no_grad():
        torch.testing.assert_close(b(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)
