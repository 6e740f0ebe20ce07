"""Persistent kernels in the zoo's plans (issue #25, first stage): launches and modelled time with
and without them.

    python bench/persistent.py [--target h100] [--models bert:base,gpt2:small,llama:small,resnet:small]
                               [--json bench/results/persistent_h100.json]

For each model (``tilefuse.zoo``, random weights, fp16, batch 1) and launch mode (per launch; CUDA
graph) the plan is compiled twice, without persistent kernels and with ``persistent="auto"``
(``codegen/triton/persistent.py``: a run of consecutive generated kernels launched as one where
its simulated schedule models faster, ``cost/persistent.py``).  Recorded: kernels, launches,
the modelled total (``report.est_total_us``), the roofline bound and their ratio, and per run its
kernels and both modelled times.  Everything is MODELLED for the target: no GPU is used, no kernel
runs (the kernels are generated, not compiled).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="h100")
    ap.add_argument("--models", default="bert:base,gpt2:small,llama:small,resnet:small")
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import torch

    import tilefuse
    from tilefuse import zoo
    rows = []
    for spec in args.models.split(","):
        name, size = spec.split(":")
        model, (inputs,) = zoo.build(name, size)
        model = model.half()
        for graph in (False, True):
            row = {"model": f"{name} {size}", "launch": "cuda_graph" if graph else "per_launch"}
            for mode in (False, "auto"):
                c = tilefuse.compile(model, inputs, target=args.target, time_limit=args.time_limit,
                                     cuda_graph=graph, persistent=mode)
                r = c.report
                launches = len(c.kernels) - sum(j - i - 1 for i, j in c.persistent)
                key = "persistent" if mode else "plain"
                row[key] = {"kernels": len(c.kernels), "launches": launches, "est_us": r.est_total_us,
                            "roofline_us": r.roofline_us, "vs_roofline": round(r.est_total_us / r.roofline_us, 3)}
                if mode:
                    row["runs"] = r.persistent
            rows.append(row)
            p, q = row["plain"], row["persistent"]
            print(f"{row['model']:14s} {row['launch']:10s} launches {p['launches']:4d} -> {q['launches']:4d}  "
                  f"{p['est_us']:9.1f} -> {q['est_us']:9.1f} us (modelled; roofline {p['roofline_us']:.1f} us: "
                  f"{p['vs_roofline']}x -> {q['vs_roofline']}x)", flush=True)
    record = {"what": "plans with and without persistent kernels (persistent='auto'); MODELLED times, no GPU",
              "command": "python " + " ".join(sys.argv), "date": datetime.date.today().isoformat(),
              "machine": platform.machine(), "torch": torch.__version__, "tilefuse": tilefuse.__version__,
              "target": args.target, "dtype": "float16", "batch": 1, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
