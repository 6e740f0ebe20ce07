"""``torch.compile(model, backend="tilefuse")`` with its defaults on a machine without a GPU, against
eager PyTorch: MEASURED on this CPU (wall clock per call, median of ``--runs`` after warm-up).

    python bench/torch_compile_cpu.py [--runs 30] [--json bench/results/torch_compile_cpu.json]

Issue #23 asks that the backend never make a CPU-only program more than 1.5x slower by default:
there it hands each graph back to PyTorch (one ``InterpreterWarning``), since tilefuse's kernels
would run in Triton's interpreter.  For contrast the same models run once more with
``options={"interpreter": True}`` (tilefuse's kernels in the interpreter: checking, not speed).
Models, random weights, batch 1, fp32: a 3-layer MLP (256 wide, batch 32), a 2-layer BERT
(hidden 128, seq 64), a ResNet-style convolution block (32 channels, 32 x 32).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import warnings


def models():
    import torch
    import transformers
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256),
                              torch.nn.GELU(), torch.nn.Linear(256, 10)).eval()
    bert = transformers.BertModel(transformers.BertConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=2,
                                                          num_attention_heads=2, intermediate_size=512,
                                                          attn_implementation="sdpa")).eval()
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
                               torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10)).eval()
    return {"mlp": (mlp, (torch.randn(32, 256),)),
            "bert-2layer": (bert, (torch.randint(0, 1000, (1, 64)),)),
            "conv-block": (conv, (torch.randn(1, 3, 32, 32),))}


def timed(fn, args, runs: int, warmup: int = 3) -> float:
    """Median wall-clock seconds per call."""
    import torch

    from tilefuse.cost.measure import wall_timer
    with torch.no_grad():
        return wall_timer(warmup, runs)(lambda: fn(*args)).median_s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--interpreter-runs", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import torch
    import triton

    import tilefuse
    rows = {}
    for name, (model, inputs) in models().items():
        eager = timed(model, inputs, args.runs)
        torch._dynamo.reset()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", tilefuse.InterpreterWarning)
            default = torch.compile(model, backend="tilefuse")
            t_default = timed(default, inputs, args.runs)
            torch._dynamo.reset()
            interp = torch.compile(model, backend="tilefuse", options={"interpreter": True})
            t_interp = timed(interp, inputs, args.interpreter_runs, warmup=1)
        torch._dynamo.reset()
        rows[name] = {"eager_ms": round(eager * 1e3, 4), "tilefuse_default_ms": round(t_default * 1e3, 4),
                      "default_over_eager": round(t_default / eager, 3),
                      "tilefuse_interpreter_ms": round(t_interp * 1e3, 2),
                      "interpreter_over_eager": round(t_interp / eager, 1)}
        print(f"{name:12s} eager {eager * 1e3:8.3f} ms   torch.compile(tilefuse) default {t_default * 1e3:8.3f} ms "
              f"({t_default / eager:.2f}x)   interpreter {t_interp * 1e3:9.1f} ms ({t_interp / eager:.0f}x)", flush=True)
    doc = {"what": "torch.compile(backend='tilefuse') defaults vs eager on a CPU machine without a GPU; MEASURED "
                   "wall clock per call (median), this machine",
           "command": "python " + " ".join(["bench/torch_compile_cpu.py"] + (argv if argv is not None else sys.argv[1:])),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
           "versions": {"tilefuse": tilefuse.__version__, "torch": torch.__version__, "triton": triton.__version__,
                        "python": platform.python_version()},
           "machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()},
           "runs": args.runs, "interpreter_runs": args.interpreter_runs, "models": rows,
           "worst_default_over_eager": max(r["default_over_eager"] for r in rows.values())}
    if args.json:
        with open(args.json, "w") as f:
            f.write(json.dumps(doc, indent=1) + "\n")
        print(f"written {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
