"""The GPU suite's scripts (``bench/gpu_suite.sh``) run on a CPU too, through the interpreter, to
check the script: this keeps them in step with the library between the sessions a GPU is lent.
A script that broke (``gpu_kernels.py`` unpacked ``choose_graph``'s old three values for two
sessions) would otherwise spend the device's minutes on its traceback."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_kernels_script_plans_and_times_its_gemms_on_a_cpu(tmp_path):
    out = tmp_path / "gpu_kernels.json"
    proc = subprocess.run([sys.executable, "bench/gpu_kernels.py", "--device", "cpu", "--gemms", "tiny",
                           "--parts", "gemms", "--gemm-tiles", "3", "--gemm-fixed", "16,16,16,4,2;32,16,16,4,3;128,16,16,4,2,ws",
                           "--fixed-from", "0", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rec = json.loads(out.read_text())
    assert rec["device"]["type"] == "cpu" and len(rec["gemms"]) == 2
    for g in rec["gemms"]:
        assert "error" not in g, g["error"]
        for variant in ("gemm", "library"):
            assert "error" not in g[variant], (g["shape"], variant, g[variant]["error"])
            assert g[variant]["modelled_us"] > 0 and g[variant]["measured_us"] > 0
        assert g["chosen"] in ("gemm", "library")
        # the template's next tiles in the model's order, each timed
        alts = g["gemm_alternatives"]
        assert 1 <= len(alts) <= 2 and all(a["measured_us"] > 0 and a["tile"].startswith("BM=") for a in alts)
        assert g["gemm"]["tile"] not in {a["tile"] for a in alts}
        # fixed tiles whatever the model ranks them (the Triton tutorials' for large GEMMs on a GPU)
        fixed = g["gemm_fixed"]
        assert [f["tile"].split()[:3] for f in fixed] == [["BM=16", "BN=16", "BK=16"], ["BM=32", "BN=16", "BK=16"],
                                                          ["BM=128", "BN=16", "BK=16"]]
        assert all("error" not in f and f["measured_us"] > 0 and f["modelled_us"] > 0 for f in fixed), fixed
        # each checked against torch.matmul on the same operands; the last warp-specialized
        assert all(f["ok"] and f["rel_l2"] < 1e-2 for f in fixed), fixed
        assert [f["tile"].endswith("warp-specialized") for f in fixed] == [False, False, True]


def test_gpu_kernels_script_times_a_gemv_on_the_small_m_path_on_a_cpu(tmp_path):
    """``--gemms gemv`` (the suite's step ``gemvs``): a decode step's one-row projection through the
    small-M path, its other stages timed beside it, with the bandwidth each operand moved once
    makes."""
    out = tmp_path / "gpu_gemvs.json"
    proc = subprocess.run([sys.executable, "bench/gpu_kernels.py", "--device", "cpu", "--gemms", "gemv-tiny",
                           "--parts", "gemms", "--gemm-tiles", "3", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (g,) = json.loads(out.read_text())["gemms"]
    assert "error" not in g and g["shape"] == [1, 48, 1200]
    tile = g["gemm"]["tile"]
    assert "small-M" in tile and "stages=1" not in tile, tile           # a K loop, pipelined
    assert g["gemm"]["measured_gbs"] > 0 and g["torch_matmul"]["measured_gbs"] > 0
    assert all("small-M" in a["tile"] or "BM=" in a["tile"] for a in g["gemm_alternatives"])


def _run(tmp_path, script: str, *args: str) -> dict:
    out = tmp_path / "out.json"
    flag = "--json" if script in ("attention.py", "launch_overhead.py") else "--out"
    proc = subprocess.run([sys.executable, f"bench/{script}", *args, flag, str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def _errors(rec, path="") -> list[str]:
    """Every ``error`` (or failed ``check``) anywhere in a script's record, with where it is."""
    found = []
    if isinstance(rec, dict):
        for k, v in rec.items():
            if k == "error":
                found.append(f"{path}: {str(v)[:300]}")
            elif k == "check" and isinstance(v, dict) and v.get("pass") is False:
                found.append(f"{path}.check: {v}")
            else:
                found += _errors(v, f"{path}.{k}")
    elif isinstance(rec, list):
        for i, v in enumerate(rec):
            found += _errors(v, f"{path}[{i}]")
    return found


# The other steps of the suite, on the CPU at their smallest (about 2.5 minutes together): run
# them with --runslow before a session that has a GPU.
@pytest.mark.slow
@pytest.mark.parametrize("script,args", [
    ("gpu_kernels.py", ("--device", "cpu", "--models", "bert", "--size", "tiny", "--parts", "kernels,stems")),
    ("gpu_models.py", ("--device", "cpu", "--size", "tiny", "--models", "bert,resnet")),
    ("gpu_check.py", ("--device", "cpu", "--size", "tiny", "--models", "bert,resnet", "--sample")),
    ("attention.py", ("--device", "cpu", "--shapes", "tiny", "--variants", "eager,sdpa_flash,tilefuse")),
    ("gpu_decode.py", ("--device", "cpu", "--layers", "1", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
                       "--ffn", "128", "--vocab", "64", "--cache", "32", "--prompt", "4", "--runs", "2",
                       "--warmup", "1", "--calls", "3")),
    ("launch_overhead.py", ("--size", "tiny", "--calls", "5")),
], ids=lambda v: v.removesuffix(".py") if isinstance(v, str) else "")
def test_gpu_suite_scripts_run_on_a_cpu(tmp_path, script, args):
    rec = _run(tmp_path, script, *args)
    assert not _errors(rec), _errors(rec)
    if script == "gpu_kernels.py":
        assert rec["kernels"][0]["kernels"] and [r["layout"] for r in rec["stems"]] == ["nchw", "rows4", "nhwc4", "nhwc8"]
        assert {r["kernel"] for r in rec["stems"][1]["copy_apart"]} == {"copy", "stem over the copy"}
    if script == "gpu_models.py":
        assert [m["model"] for m in rec["models"]] == ["bert", "resnet"]
    if script == "attention.py":
        assert rec["ok"] and rec["cases"]
    if script == "gpu_decode.py":
        assert rec["variants"]


def test_chain_tile_probe_runs_each_tile_apart_on_a_cpu(tmp_path):
    """bench/gpu_chain_tiles.py through the interpreter: each tile in its own process, checked
    against fp64 SDPA; a tile the chain template cannot build is a row with its error, not a crash."""
    out = tmp_path / "tiles.json"
    proc = subprocess.run([sys.executable, "bench/gpu_chain_tiles.py", "--device", "cpu", "--shape", "2,32,32,16",
                           "--tiles", "16,32,16,16,4,1;16,16,16,8,4,2;16,32,16,16,4", "--time", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["ok"] for r in rows] == [True, True, False]
    assert rows[0]["rel_l2"] < 1e-2 and rows[1]["nan"] == 0 and "error" in rows[2]
    # --time: each built tile timed too (here the interpreter's wall clock), with its products' rate
    assert all(r["measured_us"] > 0 and r["tflops"] > 0 for r in rows[:2]), rows
    # --causal: the causal chain (the LLM prefills'), right against fp64 SDPA with is_causal
    proc = subprocess.run([sys.executable, "bench/gpu_chain_tiles.py", "--device", "cpu", "--shape", "2,32,32,16",
                           "--tiles", "16,16,16,16,4,2", "--causal", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["causal"] and doc["rows"][0]["causal"] and doc["rows"][0]["ok"] and doc["rows"][0]["rel_l2"] < 1e-2, doc


@pytest.mark.slow
def test_chain_tile_probe_builds_a_warp_specialized_tile_on_a_cpu(tmp_path):
    """``,ws``: 128 queries a program, the key loop split between warp groups (the suite's chain
    step times such tiles); right against fp64 SDPA through the interpreter."""
    out = tmp_path / "tiles.json"
    proc = subprocess.run([sys.executable, "bench/gpu_chain_tiles.py", "--device", "cpu", "--shape", "1,128,64,16",
                           "--tiles", "128,32,16,16,4,2,tma,ws", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["ok"] and row["rel_l2"] < 1e-2 and row["text"].endswith("warp-specialized"), row
