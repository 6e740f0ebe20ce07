"""The traffic audit: bytes the generated kernels of the zoo models' h100 plans really move,
counted under Triton's interpreter on this CPU machine, against the bytes the cost model charged.

    python bench/traffic.py [--size small] [--models bert,gpt2,llama,vit,resnet] [--target h100]
                            [--json bench/results/traffic_h100_small.json]

Per model: ``tilefuse.compile(model, inputs, target=...)`` plans for the target (plan only: the
target is not present) and builds every kernel; ``tilefuse.cost.audit.audit_traffic`` runs each
generated (fused) kernel alone in the interpreter on the values its inputs take for the example
inputs, counting the 32-byte sectors each load and store touches under its mask (COUNTED, not
estimated), and compares with ``Work.requested_bytes`` of its schedule (MODELLED: the loads the
schedule issues over the boxes it covers, rounded to transactions, plus the stores, before any
L1/L2 credit).  Library (GEMM/conv) kernels are not counted.  Exit status 0 iff every kernel is
within ``--tolerance`` (default 10%).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="small", choices=["tiny", "small", "base"])
    ap.add_argument("--models", default="bert,gpt2,llama,vit,resnet")
    ap.add_argument("--target", default="h100")
    ap.add_argument("--tolerance", type=float, default=0.10)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    import tilefuse          # first: it sets up Triton's interpreter on a machine without a GPU
    import torch
    import triton
    from tilefuse import zoo
    from tilefuse.cost.audit import audit_traffic

    results, worst = [], 0.0
    for name in args.models.split(","):
        t0 = time.perf_counter()
        model, sets = zoo.build(name, args.size)
        c = tilefuse.compile(model, sets[0], target=args.target, backend="reference")
        rows = audit_traffic(c, *sets[0])
        seconds = time.perf_counter() - t0
        counted = sum(r.counted_bytes for r in rows)
        modelled = sum(r.modelled_bytes for r in rows)
        off = [r for r in rows if abs(r.ratio - 1) > args.tolerance]
        worst = max([worst] + [abs(r.ratio - 1) for r in rows])
        print(f"== {name} ({args.size}), {args.target} plan: {len(c.kernels)} kernels, {len(rows)} generated; "
              f"counted {counted / 1e6:.3f} MB vs modelled {modelled / 1e6:.3f} MB "
              f"({counted / modelled:.3f}); {len(off)} outside ±{args.tolerance:.0%}; {seconds:.1f} s")
        print(f"   {'#':>4} {'kernel':52s} {'counted B':>12} {'modelled B':>12} {'ratio':>6}")
        for r in rows:
            flag = "  <- outside tolerance" if r in off else ""
            print(f"   {r.index:4d} {r.name:52s} {r.counted_bytes:12d} {r.modelled_bytes:12d} {r.ratio:6.3f}{flag}")
        results.append({"model": name, "size": args.size, "kernels": len(c.kernels), "generated": len(rows),
                        "counted_bytes": counted, "modelled_bytes": modelled, "outside_tolerance": len(off),
                        "per_kernel": [{"index": r.index, "name": r.name, "counted_bytes": r.counted_bytes,
                                        "element_bytes": r.element_bytes, "modelled_bytes": r.modelled_bytes,
                                        "loads": r.loads, "stores": r.stores} for r in rows]})
    print(f"worst |counted/modelled - 1| = {worst:.3f}")
    if args.json:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        record = {"what": "bytes moved by generated kernels: counted under the Triton interpreter vs modelled",
                  "command": "python " + " ".join(sys.argv), "date": datetime.date.today().isoformat(),
                  "commit": commit, "machine": platform.platform(), "python": platform.python_version(),
                  "torch": torch.__version__, "triton": triton.__version__, "target": args.target,
                  "tolerance": args.tolerance, "worst_deviation": round(worst, 4), "models": results}
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
