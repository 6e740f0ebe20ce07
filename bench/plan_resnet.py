"""Plan ResNet-50 (224², fp16, batch 1) for a GPU target on this (CPU) machine; record the
MODELLED plans of every strategy (kernels, kernels by family, modelled time, modelled DRAM traffic).

    python bench/plan_resnet.py [--target h100] [--label after] [--json bench/results/plan_resnet_h100.json]

The model is transformers' ``ResNetForImageClassification`` (1000 classes) with the ResNet-50 layout (bottleneck blocks, depths
3-4-6-3, widths 256-1024-2048, stem 64), random weights (``tilefuse.zoo``), eval mode, fp16.
Plan only: the target is not present, no kernel runs; every number is the cost model's.
Exit status 0 iff optimal <= greedy <= unfused in modelled time.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import subprocess
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="h100")
    ap.add_argument("--label", default="")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    import tilefuse
    import torch
    from tilefuse import zoo

    t0 = time.time()
    model, _ = zoo.build("resnet", "base")
    model = model.half().eval()
    x = torch.randn(1, 3, 224, 224, dtype=torch.float16)
    results = {}
    for strategy in ("optimal", "greedy", "unfused"):
        t = time.time()
        cm = tilefuse.compile(model, (x,), target=args.target, backend="reference", strategy=strategy)
        r = cm.report
        families: dict[str, int] = {}
        for k in r.kernels:
            families[k.family] = families.get(k.family, 0) + 1
        results[strategy] = {"num_kernels": r.num_kernels, "kernels_by_family": families,
                             "modelled_us": r.est_total_us, "traffic_bytes": r.traffic_bytes,
                             "compile_seconds": round(time.time() - t, 2)}
        print(f"{strategy:8s} kernels {r.num_kernels:4d} {families}  modelled {r.est_total_us:8.1f} us  "
              f"traffic {r.traffic_bytes / 1e6:7.2f} MB", flush=True)
    convs = r.ops_by_type.get("Conv", 0)
    print(f"operators {r.num_ops} ({convs} convolutions), compulsory {r.compulsory_bytes / 1e6:.2f} MB, "
          f"roofline {r.roofline_us:.1f} us (MODELLED)")
    ok = results["optimal"]["modelled_us"] <= results["greedy"]["modelled_us"] <= results["unfused"]["modelled_us"]
    if args.json:
        try:
            commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                    cwd=Path(tilefuse.__file__).parent).stdout.strip()
        except OSError:
            commit = ""
        out = {"what": "tilefuse plans of ResNet-50; times and traffic are MODELLED, not measured",
               "label": args.label, "command": "python " + " ".join(sys.argv),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "machine": {"platform": platform.platform(), "cpus": __import__("os").cpu_count()},
               "versions": {"torch": torch.__version__, "python": platform.python_version()},
               "tilefuse_commit": commit, "target": args.target,
               "config": "ResNet-50 (transformers ResNetForImageClassification, bottleneck 3-4-6-3, 1000 classes), random weights, fp16, "
                         "batch 1, 3x224x224; backend reference (plan only)",
               "model": {"num_ops": r.num_ops, "convolutions": convs, "compulsory_bytes": r.compulsory_bytes,
                         "roofline_us": r.roofline_us, "flops": r.total_flops},
               "strategies": results, "ok": ok, "total_seconds": round(time.time() - t0, 1)}
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
