"""What a user of the command line and the library sees: --version, --input-shape on a
dynamic-batch ONNX export, progress on a terminal and none when piped, the solver as a sentence,
other libraries' warnings silenced, logging channels (TILEFUSE_LOGS / set_logs), and
CompiledModel.emulate (a GPU plan's kernels run here)."""
import logging
import os
import pty
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import tilefuse
from tilefuse.cli import main
from tilefuse.errors import InputError, OptionError, TargetAbsentError
from tilefuse.log import CHANNELS, set_logs


@pytest.fixture(scope="module")
def dynamic_batch_onnx(tmp_path_factory):
    """A Linear-ReLU-Linear exported by torch.onnx with a dynamic batch axis (input ``input``,
    declared ``[batch, 8]``), as exporters write them."""
    path = tmp_path_factory.mktemp("dyn") / "mlp.onnx"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    batch = torch.export.Dim("batch")
    torch.onnx.export(model, (torch.randn(2, 8),), str(path), dynamo=True, dynamic_shapes=({0: batch},))
    dims = onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param and dims[1].dim_value == 8          # really dynamic
    return str(path)


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"tilefuse {tilefuse.__version__} (torch ") and "triton" in out


def test_input_shape_on_a_dynamic_batch_export(dynamic_batch_onnx, tmp_path, capsys):
    path = dynamic_batch_onnx
    assert main(["compile", path, "--target", "h100"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    dim = onnx.load(path).graph.input[0].type.tensor_type.shape.dim[0].dim_param
    assert f"'input' [{dim}, 8]" in err and f"--dim {dim}=1" in err and "Traceback" not in err
    out_json = tmp_path / "r.json"
    assert main(["compile", path, "--target", "h100", "--input-shape", "input=3x8", "--json", str(out_json)]) == 0
    assert '"num_kernels"' in out_json.read_text()
    assert main(["run", path, "--input-shape", "input=5x8", "--check", "--iterations", "0"]) == 0
    out = capsys.readouterr().out
    assert "(5, 4)" in out and "match onnxruntime" in out
    assert main(["inspect", path, "--input-shape", "input=1x8"]) == 0
    # a named dim bound once (onnxruntime's free dimension override); trtexec's NAME:DIMS; an
    # --inputs file's own shapes
    assert main(["run", path, "--dim", f"{dim}=3", "--iterations", "0"]) == 0
    assert "(3, 4)" in capsys.readouterr().out
    assert main(["run", path, "--input-shape", "input:6x8", "--iterations", "0"]) == 0
    assert "(6, 4)" in capsys.readouterr().out
    np.savez(tmp_path / "x.npz", input=np.ones((7, 8), np.float32))
    assert main(["run", path, "--inputs", str(tmp_path / "x.npz"), "--check", "--iterations", "0"]) == 0
    out = capsys.readouterr().out
    assert "(7, 4)" in out and "match onnxruntime" in out
    assert main(["run", path, "--dim", "btch=3"]) == 2          # the flags' words, not the API's
    assert f"--dim binds 'btch', which no input of the model has; its named dims are ['{dim}']" in \
        " ".join(capsys.readouterr().err.split())
    assert main(["run", path, "--input-shape", "input=3x9"]) == 2
    assert "--input-shape gives input 'input' the shape [3, 9], the model declares" in \
        " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("spec", ["input", "input=3xb", "input=-1x8", "=3x8", "input=3x8 x"])
def test_a_bad_input_shape_is_one_line_exit_2(spec, tmp_path, capsys):
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["input"], ["y"])], "g",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    assert main(["compile", str(path), "--input-shape", spec]) == 2
    err = capsys.readouterr().err.strip()
    assert "--input-shape" in err and "\n" not in err


@pytest.mark.parametrize("shape", [(-1, 8), (2.5, 8), "3x8", (True, 8)])
def test_input_shapes_must_be_non_negative_ints(shape):
    m = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])]),
        opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    with pytest.raises(InputError, match=r"input_shapes gives input 'x' the shape .*non-negative integers"):
        tilefuse.compile_onnx(m, input_shapes={"x": shape})


def _unused_initializer_model(path):
    """Sigmoid of x, with an initializer nothing reads (onnxruntime warns that it removes it)."""
    g = helper.make_graph([helper.make_node("Sigmoid", ["x"], ["y"], name="sig")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                          initializer=[numpy_helper.from_array(np.ones(3, np.float32), "unused")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), path)
    return str(path)


def _cli(*args, tty: bool, env=None) -> str:
    """The CLI in a fresh process, its stdout and stderr together, on a pseudo-terminal or a pipe."""
    cmd = [sys.executable, "-m", "tilefuse.cli", *args]
    env = {**{k: v for k, v in os.environ.items() if k != "TILEFUSE_LOGS"}, "COLUMNS": "120", **(env or {})}
    if not tty:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        return p.stdout + p.stderr
    leader, follower = pty.openpty()
    p = subprocess.Popen(cmd, stdin=follower, stdout=follower, stderr=follower, env={**env, "TERM": "xterm"})
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:          # the other side closed (EIO on Linux)
            break
        if not data:
            break
        chunks.append(data)
    os.close(leader)
    assert p.wait(timeout=300) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")


def test_progress_on_a_terminal_and_none_when_piped(tmp_path):
    path = _unused_initializer_model(tmp_path / "m.onnx")
    on_tty = _cli("run", path, "--check", tty=True)
    assert "importing the model" in on_tty and "generating kernels" in on_tty and "running kernels" in on_tty
    assert "match onnxruntime" in on_tty
    piped = _cli("run", path, "--check", tty=False)
    assert "match onnxruntime" in piped
    for step in ("importing the model", "planning", "generating kernels", "running kernels", "\x1b["):
        assert step not in piped
    assert "Removing initializer" not in piped and "Removing initializer" not in on_tty    # onnxruntime's
    assert "Warning" not in piped


def test_compile_prints_the_solver_as_a_sentence(tmp_path, capsys):
    path = _unused_initializer_model(tmp_path / "m.onnx")
    assert main(["compile", path, "--target", "h100"]) == 0
    got = capsys.readouterr()
    assert not got.out.startswith("\n")
    assert "solver: optimal over 1 segment(s)" in got.out and "{'status'" not in got.out
    assert "[tilefuse." not in got.out + got.err            # no logs unless TILEFUSE_LOGS asks


def test_logs_from_the_environment(tmp_path):
    path = _unused_initializer_model(tmp_path / "m.onnx")
    out = _cli("compile", path, "--target", "h100", tty=False, env={"TILEFUSE_LOGS": "plan,solver,kernels,cost"})
    for line in ("[tilefuse.plan] 1 segments", "[tilefuse.plan] splitting operators into prims:",
                 "[tilefuse.plan] strategy optimal: 1 kernels", "[tilefuse.plan] kernel 0 fused_sigmoid (fused",
                 "[tilefuse.solver] segment 0 (1 prims,", "[tilefuse.kernels] kernel 0 fused_sigmoid: fused,",
                 "[tilefuse.cost] segment 0: "):
        assert line in out, out
    assert "[tilefuse.cost] segment 0 [" not in out          # every candidate only with +cost


def test_set_logs_channels_levels_and_errors(capsys):
    x = torch.randn(4, 8)
    fn = lambda a: torch.softmax(a * 2, dim=-1)   # noqa: E731
    try:
        set_logs("solver,+cost")
        assert logging.getLogger("tilefuse.cost").level == logging.DEBUG
        tilefuse.compile(fn, (x,), target="h100", backend="reference")
        err = capsys.readouterr().err
        assert "[tilefuse.solver] segment 0" in err and "[tilefuse.cost] segment 0 [" in err   # +cost: candidates
        assert "[tilefuse.plan]" not in err
        set_logs()
        tilefuse.compile(fn, (x,), target="h100", backend="reference")
        assert "[tilefuse." not in capsys.readouterr().err
        set_logs("all")
        assert all(logging.getLogger(f"tilefuse.{c}").level == logging.INFO for c in CHANNELS)
    finally:
        set_logs()
    with pytest.raises(OptionError, match="unknown log channel 'plans'.*plan, solver, cost, kernels"):
        set_logs("plans")


def test_a_bad_environment_value_warns_and_imports():
    code = "import tilefuse; print('imported')"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TILEFUSE_LOGS": "everything"})
    assert p.returncode == 0 and "imported" in p.stdout
    assert "TILEFUSE_LOGS" in p.stderr and "unknown log channel 'everything'" in p.stderr


def test_emulate_runs_a_gpu_plan_here():
    """A plan for h100 cannot be called on a CPU machine, but its kernels (gemm with a fused
    epilogue here) run on the CPU through emulate and match eager."""
    if torch.cuda.is_available():
        pytest.skip("emulate needs the interpreter (no CUDA)")
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 48).eval()
    fn = lambda a: torch.relu(lin(a))   # noqa: E731
    x = torch.randn(24, 32)
    cm = tilefuse.compile(fn, (x,), target="h100")
    assert any(k.family == "gemm" for k in cm.report.kernels)
    with pytest.raises(TargetAbsentError, match=r"\.emulate\(\*inputs\)"):
        cm(x)
    with torch.no_grad():
        torch.testing.assert_close(cm.emulate(x), fn(x), rtol=1e-4, atol=1e-4)
    with pytest.raises(InputError, match="shape"):
        cm.emulate(torch.randn(3, 32))
