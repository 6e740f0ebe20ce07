"""The same model gives the same plan and kernels on any machine, loaded or idle.

Planning is bounded by work (``Caps`` for candidates, a node budget and a lazy-round budget for
HiGHS), not by the clock; ``time_limit`` is an outer guard whose cuts the report names.  Here two
compiles of one model run at the same time, in two processes (each with its own hash seed), beside
the suite's other workers on the two cores of a CI machine (with ``--runslow`` a third process
spins too: the default run is loaded enough, and a spinning core slows every other test); their
plans, kernels and reports must be identical.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

COMPILE = textwrap.dedent("""
    import hashlib, json, sys, torch, tilefuse
    from tilefuse.demo import demo_model
    target = sys.argv[1]
    model, args = demo_model(batch=1, seq=5)      # (a BERT-style block: GEMMs, attention, LayerNorm)
    cm = tilefuse.compile(model, args, target=target)
    report = cm.report.to_dict()
    for k in ("compile_seconds",):
        report.pop(k)
    report["solver"].pop("seconds")
    print(json.dumps({
        "plan": [f"{k.candidate} {k.schedule.key()}" for k in cm.plan.kernels],
        "kernels": [hashlib.sha256(k.source.encode()).hexdigest() for k in cm.kernels],
        "report": report,
    }, sort_keys=True))
""")


def _compile_in(target: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", COMPILE, target], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.parametrize("target", ["h100", pytest.param("cpu", marks=pytest.mark.slow)])
def test_two_compiles_in_parallel_on_a_loaded_machine_give_identical_plans(target, tmp_path, request):
    spin = request.config.getoption("--runslow")
    burn = [subprocess.Popen([sys.executable, "-c", "while True: pass"])] if spin else []
    try:
        procs = []
        for seed in ("1", "2"):
            env = dict(os.environ, PYTHONHASHSEED=seed, TILEFUSE_CACHE_DIR=str(tmp_path / seed))
            procs.append(_compile_in(target, env))
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-2000:]
            outs.append(out.strip().splitlines()[-1])
    finally:
        for b in burn:
            b.kill()
    a, b = (json.loads(o) for o in outs)
    assert a["report"]["solver"]["time_limit_cut"] == []
    assert a["plan"] == b["plan"] and a["kernels"] == b["kernels"]
    assert a == b
