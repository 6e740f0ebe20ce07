"""Registers of GEMM kernels with a computed operand: the sm_90 binary against the cost model, no GPU.

    python bench/dot_registers.py [--json bench/results/dot_registers_h100.json]

The plans made with the measured tensor-core latency (``Target.dot_step_s``) read K in 128-wide
chunks, where the register model (``cost/work.py``, fitted at 32 and 64) misses: BERT's GEMM +
LayerNorm, ResNet-50's and MobileNetV2's convolutions with a BatchNorm + ReLU (ReLU6) prologue
(``bench/README.md``, the third GPU session).  Each case here is one such GEMM, forced to one tile
of a grid over BK (32, 64, 128), BN, BM and split-K, built by the gemm family for ``h100``
(fp16, operands through tensor descriptors where the family reads them so), compiled for sm_90
on this machine (registers FROM THE COMPILED BINARY) beside the model's registers per thread.
Nothing is measured on a GPU: this is the data a refit of the register model at BK 128 needs.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cases():
    """(name, function, fp16 inputs): the operand kinds a plan puts before a product."""
    import torch
    h = torch.float16

    def r(*s):
        return torch.randn(*s, dtype=h)

    def pointwise(x, s, b, w):            # a 1 x 1 convolution as a GEMM, BatchNorm + ReLU before it
        return torch.relu(x * s + b) @ w

    def clipped(x, s, b, w):              # MobileNetV2's BatchNorm + ReLU6 before a 1 x 1 convolution
        return torch.clamp(x * s + b, 0, 6) @ w

    def windowed(x, s, b, w):             # BatchNorm + ReLU before a padded 3 x 3 convolution
        return torch.nn.functional.conv2d(torch.relu(x * s + b), w, padding=1)

    return [
        ("bn_relu 1x1, 3136x256 @ 256x64", pointwise, (r(3136, 256), r(256), r(256), r(256, 64))),
        ("bn_clip 1x1, 784x192 @ 192x64", clipped, (r(784, 192), r(192), r(192), r(192, 64))),
        ("bn_relu 3x3, 128ch 28x28", windowed, (r(1, 128, 28, 28), r(1, 128, 1, 1), r(1, 128, 1, 1),
                                               r(128, 128, 3, 3))),
        ("plain 128x768 @ 768x768", lambda x, w: x @ w, (r(128, 768), r(768, 768))),
    ]


TILES = [(bm, bn, bk, split) for bk in (32, 64, 128) for bm, bn in ((64, 32), (64, 64), (128, 32))
         for split in (1, 4)]


def run() -> list[dict]:
    import tilefuse
    from tilefuse.codegen.triton.native import NativeCompileError, compile_native
    from tilefuse.cost.target import Target
    from tilefuse.cost.work import work
    from tilefuse.families.gemm import GemmFamily, _schedule, gemm_body
    from attention import whole_group            # (bench/attention.py: the shared helpers)
    from tilefuse.families.gemm.space import GemmTile
    h100 = Target.get("h100")
    rows = []
    for name, fn, args in cases():
        body = gemm_body(whole_group(tilefuse.compile(fn, args, target="h100", backend="reference").primgraph))
        if body is None:
            raise SystemExit(f"{name}: not one GEMM group")
        for bm, bn, bk, split in TILES:
            tile = GemmTile(bm, bn, bk, 4, 2, split=split, tma=True, in_launch=split > 1)
            try:
                built = GemmFamily().build(_schedule(body, tile, h100), "gemm")
            except Exception as e:           # a tile the family cannot build for this shape
                rows.append({"case": name, "tile": str(tile), "error": f"{type(e).__name__}: {e}"[:200]})
                continue
            kernel = built.kernels[0]
            try:
                b = compile_native(kernel, 90)
            except NativeCompileError as e:
                rows.append({"case": name, "tile": str(tile), "error": str(e)[:200]})
                continue
            model = work(kernel, h100).res.regs_per_thread
            ratio = model / b.registers
            rows.append({"case": name, "tile": str(tile), "bm": bm, "bn": bn, "bk": bk, "split": split,
                         "registers": b.registers, "model_registers": model, "spills": b.spills,
                         "mma": b.mma, "model_over_binary": round(ratio, 3), "within_25": 0.75 <= ratio <= 1.25})
            print(f"{name:34s} {str(tile):58s} binary {b.registers:4d}{' spills' if b.spills else ''}  model "
                  f"{model:4d}  {ratio:5.2f}{'' if 0.75 <= ratio <= 1.25 else '  outside ±25%'}", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    rows = run()
    ok = [r for r in rows if "error" not in r]
    for bk in (32, 64, 128):
        at = [r for r in ok if r["bk"] == bk]
        print(f"BK {bk:3d}: model within ±25% of the binary for {sum(r['within_25'] for r in at)} of {len(at)}")
    if a.json:
        from fused_registers import write_record     # (this folder is on the path when run)
        write_record(a.json, "registers of GEMMs with computed operands at forced tiles, sm_90 binary (compiled "
                     "here, no GPU) vs the cost model", argv, within_25=sum(r["within_25"] for r in ok),
                     kernels=len(ok), rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
