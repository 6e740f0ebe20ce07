"""A convolution over the 3-channel image, read as it is or through a zero-padded channels-last
copy (issue #22; ``transform/channels_last.channels_padded``, an alternative ``api.choose_graph``
weighs): the optimum of each graph, and the stem's kernels compiled for sm_90.

    python bench/stem_options.py [--plans resnet50,mobilenetv2] [--batch 1] [--json PATH]

Per plan (``bench/native.py``'s models, fp16, target h100) and launch mode (per launch; CUDA
graph): the optimal plan's MODELLED time of the graph as it is and of its padded rewrite, and
which ``choose_graph`` keeps.  Then each gemm candidate of the stem's segment of at most three
prims that holds the stem convolution (with or without the padding prim, the copy, the
BatchNorm), its best schedule's MODELLED time and registers, and FROM ITS sm_90 BINARY (Triton's
bundled ``cuobjdump`` on this machine, no GPU): registers, spills, global loads by width, async
copies, whether a loop is pipelined.  Nothing is measured on a GPU (``bench/gpu_kernels.py``,
part ``stems``, measures the layouts there).
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def options(name: str, batch: int) -> dict:
    import torch

    import native as nb
    from tilefuse import api
    from tilefuse.codegen.triton.native import compile_native
    from tilefuse.cost.target import H100
    from tilefuse.cost.work import work
    from tilefuse.families import family
    from tilefuse.frontend.torch import import_torch
    from tilefuse.orchestrate.candidates import enumerate_candidates
    from tilefuse.orchestrate.costing import Coster
    from tilefuse.orchestrate.segment import split_segments
    fn, args = nb.build(name)
    args = tuple(a.expand(batch, *a.shape[1:]).contiguous() if isinstance(a, torch.Tensor) else a for a in args)
    pg = api.prims(import_torch(fn, args).graph)
    out = {"batch": batch, "optimum_us": {}, "stem_kernels": []}
    for graph in (False, True):
        # the graph ``choose_graph`` weighs the padding on: the rewrites before it (horizontal) as it chose
        *_, steps = api.choose_graph(pg, H100, cuda_graph=graph)
        (_, before, after), = [s for s in steps if s[0] == "padded_channels"]
        graphs = {"as it is": before, "padded": api._padded(before)}
        if graphs["padded"] is before:
            return {"error": "no convolution over 3 to 7 channels"}
        costs = {label: api.orchestrate(g, H100, cuda_graph=graph)[0]["optimal"].cost for label, g in graphs.items()}
        out["optimum_us"]["cuda graph" if graph else "per launch"] = {
            **{k: round(v * 1e6, 3) for k, v in costs.items()},
            "kept": "padded" if after is not before else "as it is"}
    for label, g in graphs.items():
        conv = next(p.name for p in g.prims if p.reduce is not None and p.out.rank == 4)
        coster = Coster(g.types, H100)
        best = {}
        for seg in split_segments(g):
            if conv not in {p.name for p in seg.prims}:
                continue
            for c, _ in enumerate_candidates(seg, coster):
                if conv in c.names and len(c.names) <= 3:
                    cost, s = coster.best(c)
                    if s.family == "gemm":
                        best[tuple(c.names)] = (cost, s)
        for names, (cost, s) in sorted(best.items()):
            (kernel,) = family("gemm").kernels(s, "conv")
            b = compile_native(kernel, 90)
            out["stem_kernels"].append({
                "graph": label, "prims": list(names), "tile": list(s.tile_key()),
                "modelled_us": round(cost.seconds * 1e6, 3), "model_registers": work(kernel, H100).res.regs_per_thread,
                "registers": b.registers, "spill_bytes": b.spill_bytes, "loads": b.loads,
                "async_copies": b.async_copies, "tma_loads": b.tma_loads, "pipelined": b.pipelined, "mma": b.mma})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plans", default="resnet50,mobilenetv2")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import torch
    import triton

    import tilefuse
    record = {"what": "stems over the NCHW image vs a zero-padded channels-last copy: optimum MODELLED (h100), "
                      "stem kernels FROM THE sm_90 BINARY (no GPU)",
              "command": "python " + " ".join(sys.argv), "date": datetime.date.today().isoformat(),
              "machine": platform.machine(), "versions": {"torch": torch.__version__, "triton": triton.__version__,
                                                          "tilefuse": tilefuse.__version__}, "plans": {}}
    for name in args.plans.split(","):
        rec = record["plans"][name] = options(name, args.batch)
        for mode, row in rec.get("optimum_us", {}).items():
            print(f"{name} b{args.batch} {mode}: as it is {row['as it is']:.1f} us, padded {row['padded']:.1f} us "
                  f"-> {row['kept']}", flush=True)
        for k in rec.get("stem_kernels", ()):
            print(f"  {k['graph']:9s} {'+'.join(k['prims']):40s} {k['modelled_us']:7.2f} us  registers {k['registers']} "
                  f"(model {k['model_registers']})  loads {k['loads']}  async {k['async_copies']}  "
                  f"pipelined {k['pipelined']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
