"""How much a bucket's plan costs at the sizes it serves, against each size's own optimal plan.

    python bench/buckets.py [--model bert] [--size base] [--target h100] [--first 17] [--last 512]
                            [--per-bucket 5] [--json bench/results/buckets_bert_h100.json]

For every power-of-two bucket of sequence lengths between ``--first`` and ``--last``
(``tilefuse/orchestrate/buckets.py``) the model is planned at the bucket's planned size (its largest
but one); at ``--per-bucket`` sizes spread over the bucket (its ends included) it is planned again
on its own, and the bucket's plan is carried there (``orchestrate/instantiate.py``); both are
costed.  Recorded per size: the own plan's and the carried plan's modelled time and kernel count,
and how much slower the carried one is; the seconds (measured on this machine) of importing the
model at that size (torch.export) and of carrying the plan there (fission, graph stages, carry,
kernel building; no planning), against the own plan's compile; per bucket the worst.  Every time is MODELLED by
tilefuse's cost model for the target (fp16, batch 1, per launch): no GPU is used and no kernel
runs (backend "reference": plans only).  The model is ``tilefuse.zoo`` (random weights, seed 0).

Exit status 0 iff every size tested is within ``buckets.TOLERANCE`` (10%) of its own plan.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time


def spread(first: int, last: int, n: int) -> list[int]:
    """``n`` sizes from ``first`` to ``last``, ends included."""
    if last - first + 1 <= n:
        return list(range(first, last + 1))
    return sorted({round(first + (last - first) * k / (n - 1)) for k in range(n)})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bert")
    ap.add_argument("--size", default="base")
    ap.add_argument("--target", default="h100")
    ap.add_argument("--first", type=int, default=17)
    ap.add_argument("--last", type=int, default=512)
    ap.add_argument("--per-bucket", type=int, default=5)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import torch

    import tilefuse
    from tilefuse import zoo
    from tilefuse.api import _pipeline
    from tilefuse.frontend.torch import import_torch
    from tilefuse.orchestrate.buckets import TOLERANCE, bucket, planned_size

    def inputs_at(seq):
        model, inputs = zoo.build(args.model, args.size, seq=seq)
        return model.half(), inputs[0]

    def own(seq):
        model, inputs = inputs_at(seq)
        return tilefuse.compile(model, inputs, target=args.target, backend="reference", time_limit=args.time_limit)

    def carried(seq, template):
        """(the plan carried to ``seq``, seconds importing the model (torch.export), seconds carrying
        it: fission, the graph stages, the carry, kernel building)."""
        model, inputs = inputs_at(seq)
        t0 = time.perf_counter()
        imported = import_torch(model, inputs)
        t1 = time.perf_counter()
        got = _pipeline(imported, target=args.target, backend="reference", strategy="optimal",
                        t0=t1, dump=None, time_limit=args.time_limit, template=template)
        return got, t1 - t0, time.perf_counter() - t1

    buckets = sorted({bucket(n) for n in range(args.first, args.last + 1)})
    rows, summary = [], []
    for first, last in buckets:
        lo, hi = max(first, args.first), min(last, args.last)
        at = planned_size(first, last)
        t0 = time.perf_counter()
        top = own(at)
        plan_s = time.perf_counter() - t0
        worst = 0.0
        for seq in spread(lo, hi, args.per_bucket):
            mine = own(seq) if seq != at else top
            theirs, import_s, carry_s = carried(seq, top.template)
            slower = theirs.report.est_total_us / mine.report.est_total_us - 1.0
            worst = max(worst, slower)
            rows.append({"bucket": [first, last], "seq": seq, "own_us": mine.report.est_total_us,
                         "own_kernels": mine.report.num_kernels, "carried_us": theirs.report.est_total_us,
                         "carried_kernels": theirs.report.num_kernels, "slower": round(slower, 5),
                         "import_seconds": round(import_s, 3), "carry_seconds": round(carry_s, 3),
                         "own_compile_seconds": mine.report.compile_seconds})
            print(f"bucket {first}..{last} (planned at {at}): seq {seq}: own {mine.report.est_total_us:.1f} us "
                  f"({mine.report.num_kernels} kernels), carried {theirs.report.est_total_us:.1f} us "
                  f"({theirs.report.num_kernels}): {100 * slower:+.2f}%", flush=True)
        summary.append({"bucket": [first, last], "planned_at": at, "plan_seconds": round(plan_s, 2),
                        "worst_slower": round(worst, 5)})
    ok = all(r["slower"] <= TOLERANCE for r in rows)
    record = {
        "what": "bucket plans carried to sizes vs each size's own optimal plan; MODELLED times (no GPU)",
        "command": "python " + " ".join(sys.argv),
        "date": datetime.date.today().isoformat(), "machine": platform.machine(), "python": platform.python_version(),
        "torch": torch.__version__, "tilefuse": tilefuse.__version__,
        "model": f"zoo {args.model} {args.size}, fp16, batch 1", "target": args.target, "launch": "per_launch",
        "tolerance": TOLERANCE, "within_tolerance": ok, "buckets": summary, "sizes": rows,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
