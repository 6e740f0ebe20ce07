"""The command line: inspect, compile, demo; user errors exit 2 without a traceback."""
import json
import re

import onnx
import pytest
from onnx import TensorProto, helper

from tilefuse.cli import main


def _model(path, op="Relu", domain=""):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"], name="sig"),
             helper.make_node(op, ["s"], ["y"], name="the_node", domain=domain)]
    opsets = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=opsets, ir_version=10)
    onnx.save(m, path)
    return str(path)


def test_inspect_lists_operators_and_prims(tmp_path, capsys):
    assert main(["inspect", _model(tmp_path / "m.onnx"), "--prims"]) == 0
    out = capsys.readouterr().out
    assert "Sigmoid" in out and "Relu" in out and "elementwise" in out and "# Relu 'the_node'" in out


def test_inspect_names_every_unsupported_node_and_exits_2(tmp_path, capsys):
    path = _model(tmp_path / "m.onnx", op="Foo", domain="com.example")
    assert main(["inspect", path]) == 2
    captured = capsys.readouterr()
    assert "the_node" in captured.out + captured.err
    assert "Traceback" not in captured.out + captured.err


def test_missing_file_is_one_line_error_with_status_2(tmp_path, capsys):
    assert main(["compile", str(tmp_path / "nope.onnx")]) == 2
    err = capsys.readouterr().err
    assert "nope.onnx" in err and "Traceback" not in err


def test_debug_shows_the_traceback(tmp_path):
    from tilefuse.errors import ModelLoadError
    with pytest.raises(ModelLoadError):
        main(["--debug", "compile", str(tmp_path / "nope.onnx")])


def test_truncated_file_is_a_clear_error(tmp_path, capsys):
    path = _model(tmp_path / "m.onnx")
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    assert main(["compile", path]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_compile_for_h100_writes_the_report(tmp_path, capsys):
    path = _model(tmp_path / "m.onnx")
    out_json = tmp_path / "r.json"
    assert main(["compile", path, "--target", "h100", "--json", str(out_json)]) == 0
    r = json.loads(out_json.read_text())
    assert r["target"] == "h100" and r["num_kernels"] == 1           # sigmoid + relu fuse
    assert set(r["strategies"]) == {"unfused", "greedy", "optimal"}
    assert r["strategies"]["unfused"]["num_kernels"] == 2
    out = capsys.readouterr().out
    assert "kernels" in out and "bound" in out and "roofline bound" in out
    k = r["kernels"][0]
    assert k["grid"] >= 1 and k["warps"] >= 1 and k["bound"] in ("dram", "l2", "compute", "launch")
    assert r["launch"] == "per_launch" and r["roofline_us"] > 0


def test_compile_writes_the_html_report(tmp_path, capsys):
    path = _model(tmp_path / "m.onnx")
    page = tmp_path / "plan.html"
    assert main(["compile", path, "--target", "h100", "--html", str(page)]) == 0
    assert f"HTML report written to {page}" in capsys.readouterr().out
    html = page.read_text()
    assert "subgraph cluster_k0" in html and "cluster_k1" not in html      # one kernel, one cluster
    assert "fused_sigmoid_relu" in html and "tilefuse plan" in html


def test_compile_for_a_cuda_graph_costs_graph_launches(tmp_path, capsys):
    path = _model(tmp_path / "m.onnx")
    eager, graph = tmp_path / "e.json", tmp_path / "g.json"
    assert main(["compile", path, "--target", "h100", "--json", str(eager)]) == 0
    assert main(["compile", path, "--target", "h100", "--cuda-graph", "--json", str(graph)]) == 0
    e, g = json.loads(eager.read_text()), json.loads(graph.read_text())
    assert g["launch"] == "cuda_graph" and g["est_total_us"] < e["est_total_us"]


def test_compile_with_persistent_kernels_lists_the_runs(tmp_path, capsys):
    path = _model(tmp_path / "m.onnx")
    out_json = tmp_path / "r.json"
    assert main(["compile", path, "--target", "h100", "--strategy", "unfused", "--persistent", "all",
                 "--json", str(out_json)]) == 0
    (run,) = json.loads(out_json.read_text())["persistent"]
    assert run["kernels"] and len(run["phases"]) == 2 and run["launched_as_one"]
    out = capsys.readouterr().out
    assert "persistent kernels (times modelled)" in out and "1 launch for 2 kernels" in out
    with pytest.raises(SystemExit):                                     # argparse: not a choice
        main(["compile", path, "--persistent", "always"])
    assert "--persistent: invalid choice: 'always'" in capsys.readouterr().err


def test_compile_measure_without_a_gpu_is_one_line_exit_2(tmp_path, capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    path = _model(tmp_path / "m.onnx")
    assert main(["compile", path, "--target", "h100", "--measure"]) == 2
    err = capsys.readouterr()
    text = (err.out + err.err).strip()
    assert "CUDA device" in text and "Traceback" not in text


def test_demo_runs_and_checks_against_eager(capsys):
    """Without a GPU the demo plans for h100, says so in one sentence, and runs that plan's own
    kernels in the interpreter (one target: the table's kernels are the ones checked)."""
    import torch
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "modelled on h100" in out and "operators fused" in out and "LayerNormalization" in out
    assert "MISMATCH" not in out
    if torch.cuda.is_available():
        return
    assert "No GPU here: the kernels are planned for an H100" in out
    assert "target cpu" not in out and "target h100" in out
    (n,) = re.findall(r"planned (\d+) kernels for h100", out)
    assert re.search(rf"ran the {n} kernels on this CPU in Triton's interpreter.*match", out, re.S)
    assert "chain" in out and "gemm" in out          # the h100 plan's families, as run here


def test_run_checks_against_onnxruntime(tmp_path, capsys):
    path = _model(tmp_path / "m.onnx")
    assert main(["run", path, "--check"]) == 0
    assert "match onnxruntime" in capsys.readouterr().out


def test_run_with_given_inputs_and_a_mismatch_exits_1(tmp_path, capsys):
    import numpy as np
    path = _model(tmp_path / "m.onnx")
    feeds = tmp_path / "x.npz"
    np.savez(feeds, x=np.full((2, 3), 0.5, dtype=np.float32))
    assert main(["run", path, "--inputs", str(feeds), "--backend", "reference"]) == 0
    # an absurd tolerance of -1 cannot be met: the comparison itself must be able to fail
    assert main(["run", path, "--inputs", str(feeds), "--check", "--rtol", "0", "--atol", "-1"]) == 1
    assert "mismatch" in capsys.readouterr().out


def test_run_check_without_onnxruntime_is_a_clear_error(tmp_path, monkeypatch, capsys):
    import sys
    path = _model(tmp_path / "m.onnx")
    monkeypatch.setitem(sys.modules, "onnxruntime", None)     # as if not installed
    assert main(["run", path, "--check"]) == 2
    err = capsys.readouterr()
    assert "pip install onnxruntime" in err.out + err.err and "Traceback" not in err.out + err.err


def _matmul_model(path):
    """y = relu(x @ w): one GEMM kernel in every plan."""
    import numpy as np
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16])
    w = helper.make_tensor("w", TensorProto.FLOAT, [32, 16], np.random.default_rng(0).standard_normal(512).tolist())
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"], name="r")]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [w]), opset_imports=[helper.make_opsetid("", 17)],
                          ir_version=10)
    onnx.save(m, path)
    return str(path)


def test_run_checks_the_plan_of_the_target_it_names(tmp_path, capsys):
    """``run --target h100 --check`` runs the h100 plan's own kernels (emulated here: no GPU) against
    onnxruntime and times them, saying that the times are the interpreter's."""
    assert main(["run", _matmul_model(tmp_path / "m.onnx"), "--target", "h100", "--check", "--iterations", "2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "for h100" in out and "emulated on this CPU" in out
    assert re.search(r"latency \(measured, 2 runs, .*\): mean [\d.]+ ms, p50 [\d.]+, p90 [\d.]+, p99 [\d.]+ ms; "
                     r"throughput [\d.]+ runs/s - interpreter", out)
    assert "match onnxruntime" in out


def test_a_bad_target_fails_before_the_model_is_read(tmp_path, capsys):
    for cmd in ("compile", "run"):
        assert main([cmd, str(tmp_path / "missing.onnx"), "--target", "h10"]) == 2
        err = " ".join(capsys.readouterr().err.split())
        assert "--target: unknown target 'h10'; choose one of ['a100', 'cpu', 'h100', 'h200'] or 'auto'" in err
        assert "missing.onnx" not in err


def test_inspect_lists_every_unsupported_operator_not_only_the_first(tmp_path, capsys):
    """Two refused nodes, one after the other, and a supported one between: both named with their
    reasons, the operator table marks them, exit 2."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Foo", ["x"], ["a"], name="first_bad", domain="com.example"),
             helper.make_node("Relu", ["x"], ["r"], name="fine"),
             helper.make_node("Bar", ["r"], ["y"], name="second_bad", domain="com.example"),
             helper.make_node("Sigmoid", ["a"], ["z"], name="after_bad")]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y, z]), ir_version=10,
                          opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)])
    onnx.save(m, tmp_path / "m.onnx")
    assert main(["inspect", str(tmp_path / "m.onnx")]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert "2 operator(s) cannot be compiled" in out
    assert "Foo (node 'first_bad')" in out and "Bar (node 'second_bad')" in out
    assert "domain 'com.example' are not supported" in out
    assert "(1 node(s) that read only what those make were not looked at)" in out
    assert re.search(r"Relu\s*│\s*1\s*│\s*yes", out) and re.search(r"Foo\s*│\s*1\s*│\s*no", out)
    assert re.search(r"Sigmoid\s*│\s*1\s*│\s*1 not looked at", out)


def test_inspect_says_how_many_prims_compile_plans(tmp_path, capsys):
    assert main(["inspect", _matmul_model(tmp_path / "m.onnx")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert re.search(r"fission makes (\d+) prims; compile plans (\d+) of them, after simplifying", out)


def test_the_kernel_table_fits_80_columns_with_a_legend_and_the_launch_floor_is_said(tmp_path, capsys):
    import io

    from rich.console import Console

    import tilefuse
    from tilefuse.cli import kernel_table, roofline_line
    r = tilefuse.compile_onnx(_matmul_model(tmp_path / "m.onnx"), target="h100", backend="reference").report
    buf = io.StringIO()
    Console(file=buf, width=80).print(kernel_table(r))
    lines = buf.getvalue().splitlines()
    assert max(len(ln) for ln in lines) <= 80 and any("Relu" in ln for ln in lines)
    text = " ".join(buf.getvalue().split())
    assert "occ: programs resident per SM" in text and "waves:" in text and "bound: the modelled term" in text
    line = roofline_line(r)
    cpu = tilefuse.compile_onnx(_matmul_model(tmp_path / "m.onnx"), target="cpu", backend="reference").report
    buf = io.StringIO()
    Console(file=buf, width=80).print(kernel_table(cpu))
    assert "target cpu = Triton's interpreter, not a GPU" in " ".join(buf.getvalue().split())
    assert re.match(r"modelled plan [\d.]+ us: 1 launch takes 4\.0 us \(4\.0 each\), the roofline bound is [\d.]+ "
                    r"us; the plan is [\d.]+x their sum", line)
