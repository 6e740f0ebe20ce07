"""Plan full-size BERT-base for a GPU target on this (CPU) machine; print the modelled plans.

    python bench/plan_bert.py [--target h100] [--seq 128] [--dtype float16] [--json bench/results/plan_bert_h100.json]

Everything printed is MODELLED by tilefuse's analytic cost model (docs/cost-model.md), not
measured: no GPU is used.  The transformers default BertConfig (12 layers, hidden 768, 12 heads)
with random weights; batch 1.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="h100")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import transformers

    import tilefuse

    t0 = time.perf_counter()
    torch.manual_seed(0)
    config = transformers.BertConfig(attn_implementation="sdpa")
    model = transformers.BertModel(config).eval().to(getattr(torch, args.dtype))
    ids = torch.randint(0, config.vocab_size, (1, args.seq))
    mask = torch.ones(1, args.seq, dtype=torch.int64)
    built = time.perf_counter() - t0
    t1 = time.perf_counter()
    compiled = tilefuse.compile(model, (ids, mask), target=args.target, backend="reference")
    seconds = time.perf_counter() - t1
    r = compiled.report.to_dict()
    s = r["strategies"]
    print(f"BERT-base, seq {args.seq}, {args.dtype}, target {args.target} (MODELLED times, not measured)")
    print(f"operators {r['num_ops']}, prims {r['num_prims']}, kernels (optimal) {r['num_kernels']}")
    for name in ("unfused", "greedy", "optimal"):
        print(f"  {name:8s} {s[name]['num_kernels']:5d} kernels  {s[name]['est_total_us']:10.1f} us (modelled)")
    print(f"solver: {r['solver']}")
    print(f"compile (import + fission + orchestration) {seconds:.1f} s; model construction {built:.1f} s")
    if args.json:
        out = {
            "what": "tilefuse plan of BERT-base; times are modelled by the analytic cost model, not measured",
            "command": " ".join([sys.executable.rsplit('/', 1)[-1]] + sys.argv),
            "machine": {"platform": platform.platform(), "processor": platform.processor(),
                        "cpus": __import__("os").cpu_count()},
            "versions": {"tilefuse": tilefuse.__version__, "torch": torch.__version__,
                         "transformers": transformers.__version__, "python": platform.python_version()},
            "config": {"target": args.target, "seq": args.seq, "dtype": args.dtype, "batch": 1},
            "num_ops": r["num_ops"], "num_prims": r["num_prims"],
            "strategies": s, "solver": r["solver"], "compile_seconds": round(seconds, 2),
        }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    ok = s["optimal"]["est_total_us"] < s["greedy"]["est_total_us"] < s["unfused"]["est_total_us"]
    ok &= r["num_kernels"] < r["num_ops"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
