"""tilefuse runs its kernels whether or not triton was imported before it (issue #13, item 5).

Without CUDA the kernels run in Triton's interpreter, which ``triton.jit`` selects when it decorates
a function; triton's standard library is decorated when triton is first imported.  Each case runs in
a fresh interpreter that imports triton (directly, or through ``torch.export`` /
``torch.onnx.export(dynamo=True)``, which import it) before tilefuse, without ``TRITON_INTERPRET``.
"""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = pytest.mark.skipif(torch.cuda.is_available(),
                                reason="the interpreter, and so the import order, matters only without CUDA")

MODEL = """
import sys
import torch
import torch.nn as nn
torch.manual_seed(0)
# LayerNorm and softmax: the kernels call triton's standard library (tl.sum, tl.max).
model = nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 8), nn.Softmax(-1)).eval()
x = torch.randn(4, 16)
"""

FIRST = {
    "import triton": "import triton.language",
    "torch.export": "torch.export.export(model, (x,))",
    "torch.onnx.export": """
import io
buf = io.BytesIO()
torch.onnx.export(model, (x,), buf, dynamo=True, input_names=["x"])
""",
}

COMPILE = {
    "import triton": "compiled = tilefuse.compile(model, (x,), time_limit=1.0)\ngot = compiled(x)",
    "torch.export": "compiled = tilefuse.compile(model, (x,), time_limit=1.0)\ngot = compiled(x)",
    "torch.onnx.export": """
compiled = tilefuse.compile_onnx(buf.getvalue(), time_limit=1.0)
got = torch.from_numpy(compiled.run({"x": x.numpy()})[0])
""",
}

CHECK = """
assert compiled.report.num_kernels > 0
torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-5)
print("same as eager")
"""


# what tilefuse must leave as it was (issue #21: no import-time side effects; the interpreter is
# switched on around each kernel's loading and launch, codegen/triton/interpreter.py, and everything
# it changed is restored)
SNAPSHOT = """
import os
import triton.language as tl
from triton.runtime.interpreter import InterpreterBuilder, ReduceOps, interpreter_builder
def snapshot():
    return (os.environ.get("TRITON_INTERPRET"), tl.max, tl.standard._sum_combine, InterpreterBuilder.create_dot,
            InterpreterBuilder.cast_impl, InterpreterBuilder.create_masked_load, ReduceOps.apply_impl,
            interpreter_builder.options)
before = snapshot()
"""

UNCHANGED = """
assert any(k.language == "triton" for k in compiled.kernels)
changed = [k for k, (a, b) in enumerate(zip(before, snapshot())) if a is not b]
assert not changed, changed
print("no trace")
"""


# importing triton directly and exporting to ONNX first under --runslow: torch.export imports
# triton too, the same premise
@pytest.mark.parametrize("first", [pytest.param(f, marks=pytest.mark.slow) if f != "torch.export" else f
                                   for f in FIRST])
def test_triton_imported_before_tilefuse_and_left_as_it_was(first, tmp_path):
    """The kernels run and equal eager, and importing and running tilefuse leaves triton's
    functions and the environment (TRITON_INTERPRET) as they were."""
    script = "\n".join([
        MODEL,
        textwrap.dedent(FIRST[first]),
        'assert "triton.language" in sys.modules, "the premise: triton is imported before tilefuse"',
        SNAPSHOT,
        "import tilefuse",
        'assert os.environ.get("TRITON_INTERPRET") is None, "importing tilefuse set TRITON_INTERPRET"',
        textwrap.dedent(COMPILE[first]),
        CHECK,
        UNCHANGED,
    ])
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TILEFUSE_CACHE_DIR"] = str(tmp_path)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "same as eager" in p.stdout and "no trace" in p.stdout
