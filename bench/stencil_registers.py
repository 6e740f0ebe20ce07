"""Registers of depthwise stencils: the sm_90 binary against the cost model, no GPU.

    python bench/stencil_registers.py [--target h100] [--json bench/results/stencil_registers_h100.json]

MobileNetV2 (transformers, depth multiplier 1.0, 224 x 224, batch 1) is planned for ``h100`` (or
``--target a100``) in fp16 and in fp32 (the plans are MODELLED); each distinct depthwise convolution its plan runs on the
gemm family's stencil path (``GemmTile.bb``: positions x channels a program, the 9 taps an
unrolled loop) is generated at every tile of that path's space (``space._stencil_space``: 16 bytes'
worth to 8 outputs a thread) and at 16 outputs a thread (past the space, to show the trend), and
compiled natively for the target's architecture (sm_90, sm_80) on this machine: registers and spills FROM THE COMPILED BINARY
(Triton's bundled cuobjdump) beside the model's registers per thread (``cost/work.py``).  Nothing
is measured on a GPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

WIDER = 16        # outputs a thread past the space's 8, compiled to show the trend


def stencils(dtype, target: str):
    """The distinct stencil schedules of MobileNetV2's plan for ``target`` in ``dtype``."""
    import tilefuse
    from native import build
    fn, args = build("mobilenetv2")
    fn, args = fn.to(dtype), tuple(a.to(dtype) for a in args)
    cm = tilefuse.compile(fn, args, target=target, backend="reference")
    out = {}
    for k in cm.plan.kernels:
        s = k.schedule
        if s.family == "gemm" and s.tile.bb:
            out.setdefault(s.body.shape, s)
    return list(out.values())


def tiles(shape, target):
    """The stencil space's tiles of ``shape`` (``in_space``), then the same at ``WIDER`` outputs a
    thread (fewer warps)."""
    from tilefuse.families.gemm.space import _stencil_space
    space = _stencil_space(shape, target)
    out = [(t, True) for t in space]
    seen = {(t.bm, t.bb, t.warps) for t in space}
    for t in space:
        warps = t.bm * t.bb // (WIDER * target.warp_size)
        if warps >= 1 and (t.bm, t.bb, warps) not in seen:
            seen.add((t.bm, t.bb, warps))
            out.append((dataclasses.replace(t, warps=warps), False))
    return out


def run(target: str = "h100") -> list[dict]:
    import torch
    from tilefuse.codegen.triton.native import compile_native
    from tilefuse.cost.target import PRESETS
    from tilefuse.cost.work import work
    from tilefuse.families import family
    tgt = PRESETS[target]
    rows = []
    for dtype in (torch.float16, torch.float32):
        for s in stencils(dtype, target):
            for t, in_space in tiles(s.body.shape, tgt):
                (kernel,) = family("gemm").kernels(dataclasses.replace(s, tile=t), "stencil")
                b = compile_native(kernel, tgt.arch)
                model = work(kernel, tgt).res.regs_per_thread
                sh = s.body.shape
                row = {"dtype": str(sh.dtype), "channels": sh.batch, "positions": sh.m, "taps": sh.k,
                       "bm": t.bm, "bb": t.bb, "warps": t.warps,
                       "per_thread": t.bm * t.bb // (t.warps * tgt.warp_size), "in_space": in_space,
                       "planned": (t.bm, t.bb, t.warps) == (s.tile.bm, s.tile.bb, s.tile.warps),
                       "binary_registers": b.registers, "spills": b.spills, "model_registers": model,
                       "within_25": 0.75 * b.registers <= model <= 1.25 * b.registers}
                print(row, flush=True)
                rows.append(row)
    return rows


def summary(rows) -> dict:
    """Within ±25%, per dtype and outputs a thread, of the space's tiles and of the wider ones."""
    out: dict = {}
    for r in rows:
        key = f"{r['dtype']} {r['per_thread']} a thread" + ("" if r["in_space"] else " (past the space)")
        n, w = out.get(key, (0, 0))
        out[key] = (n + 1, w + r["within_25"])
    return {k: {"kernels": n, "within_25": w} for k, (n, w) in sorted(out.items())}


def main(argv=None) -> int:
    from fused_registers import write_record
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="h100", choices=("h100", "a100"))
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    rows = run(a.target)
    table = summary(rows)
    for k, v in table.items():
        print(f"{k}: {v['within_25']} of {v['kernels']} within ±25% of the binary")
    if a.json:
        write_record(a.json, f"registers of depthwise stencils planned for {a.target}, the binary for its architecture "
                     "(compiled here, no GPU) vs the cost model", argv, target=a.target, summary=table, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
