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
