"""The GPU suite's scripts (``bench/gpu_suite.sh``) run on a CPU too, through the interpreter, to
check the script: this keeps them in step with the library between the sessions a GPU is lent.
A script that broke (``gpu_kernels.py`` unpacked ``choose_graph``'s old three values for two
sessions) would otherwise spend the device's minutes on its traceback."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_kernels_script_plans_and_times_its_gemms_on_a_cpu(tmp_path):
    out = tmp_path / "gpu_kernels.json"
    proc = subprocess.run([sys.executable, "bench/gpu_kernels.py", "--device", "cpu", "--gemms", "tiny",
                           "--parts", "gemms", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
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
