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
        return c, [k.source for k in c.kernels if k.language == "triton"], [str(k.candidate) for k in c.plan.kernels]

    a, sources_a, plan_a = build()
    files = {p: p.stat().st_mtime_ns for p in (tmp_path / "kernels").glob("*.py")}
    assert sources_a and len(files) == len(set(sources_a))    # identical kernels are written once
    monkeypatch.setattr(launch, "_MODULES", {})          # a second process: nothing imported yet
    b, sources_b, plan_b = build()
    assert sources_a == sources_b and plan_a == plan_b
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "kernels").glob("*.py")} == files   # reused, not rewritten
    for src in sources_a:
        assert src.startswith(("# fused_", "# gemm_", "# chain_")) and "# implements:" in src
    with torch.no_grad():
        torch.testing.assert_close(b(*inputs), model(*inputs), rtol=1e-5, atol=1e-5)


# 16-bit models: the generated kernels against the reference executor on the same plan.  fp16
# reductions accumulate in fp32 in both, so fp16 agrees to rounding; bf16 GEMMs run in bf16 in
# torch's library path, so bf16 is allowed two bf16 ulps (2^-7 relative each).
HALF_TOLERANCE = {torch.float16: dict(rtol=1e-3, atol=1e-3), torch.bfloat16: dict(rtol=2 ** -6, atol=2 ** -5)}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_precision_encoder_block_matches_the_reference(dtype):
    model, inputs = demo_model(batch=2, seq=8)
    model = model.to(dtype)
    c = tilefuse.compile(model, inputs, time_limit=2.0)
    got = c(*inputs)
    want = tilefuse.compile(model, inputs, time_limit=2.0, backend="reference")(*inputs)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want.float(), **HALF_TOLERANCE[dtype])
    with torch.no_grad():   # and both near the fp32 model (16-bit rounding through ten layers of ops)
        ref32 = model.float()(*inputs)
    torch.testing.assert_close(got.float(), ref32, rtol=0.05, atol=0.1)


def test_plans_made_for_a_gpu_compute_the_model_through_the_interpreter():
    # The h100 plan (its own fusion choices and tile sizes) cannot be called here, but its kernels
    # can run in the interpreter: what the GPU will run computes the right function.
    from tilefuse.runtime.executor import Program
    model, inputs = demo_model(batch=2, seq=8)
    c = tilefuse.compile(model, inputs, target="h100", time_limit=2.0)
    assert c.device.type == "cuda"
    program = Program(c.plan, c.primgraph, torch.device("cpu"), c.kernels)
    (got,) = program.run(dict(zip(c.input_names, inputs)))
    with torch.no_grad():
        torch.testing.assert_close(got, model(*inputs), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs kernels only without CUDA")
@pytest.mark.parametrize("reduce", ["amax", "amin"])
def test_interpreter_reduces_nan_propagating_max_min_with_numpy(reduce, monkeypatch):
    """The kernels' NaN-propagating max/min combiners are reduced by numpy in the interpreter, never
    element by element (the interpreter's generic path: a minute for a wide pooling window); NaN
    rows stay NaN, as in torch."""
    from triton.runtime.interpreter import ReduceOps
    fn = lambda a: getattr(torch, reduce)(a * 2, dim=-1)   # noqa: E731
    x = torch.randn(6, 300)
    x[2, 17] = float("nan")
    x[4, 5] = float("inf") if reduce == "amax" else -float("inf")
    c = tilefuse.compile(fn, (x,), backend="triton")
    monkeypatch.setattr(ReduceOps, "generic_reduce", lambda self, _: pytest.fail("element-by-element reduce"))
    got = c(x)
    assert torch.isnan(got[2]) and not torch.isnan(got[torch.arange(6) != 2]).any()
    torch.testing.assert_close(got, fn(x), equal_nan=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs kernels only without CUDA")
def test_interpreted_kernels_skip_overflow_checks_whose_assert_is_dropped(monkeypatch):
    """The interpreter's signed 32-bit overflow check ends in an assert it drops when its options
    have debug off: while tilefuse interprets, the check is not computed (outputs still equal
    eager's), and the interpreter's own options are back as they were afterwards."""
    from triton.language import semantic
    from triton.runtime.interpreter import interpreter_builder

    from tilefuse.codegen.triton.interpreter import interpreting
    before = interpreter_builder.options
    assert before.sanitize_overflow and not before.debug        # the premise (Triton 3.6 and 3.9)
    checked = []
    sanitize = semantic.TritonSemantic.binary_op_sanitize_overflow_impl

    def counted(self, *args):
        checked.append(self.builder.options.sanitize_overflow)
        return sanitize(self, *args)
    monkeypatch.setattr(semantic.TritonSemantic, "binary_op_sanitize_overflow_impl", counted)
    fn = lambda a: torch.softmax(a[:, ::2] * 3, dim=-1)   # noqa: E731   (strided: index arithmetic)
    x = torch.randn(5, 40)
    c = tilefuse.compile(fn, (x,), backend="triton")
    torch.testing.assert_close(c(x), fn(x))
    assert checked and not any(checked)
    assert interpreter_builder.options is before
    with interpreting():
        assert not interpreter_builder.options.sanitize_overflow
    assert interpreter_builder.options is before
