"""Warp-specialized GEMM and attention tiles beside their unspecialized twins: the sm_90 binary
against the cost model, no GPU.

    python bench/warp_specialized.py [--json bench/results/warp_specialized_h100.json]

``GemmTile.ws`` / ``ChainTile.ws`` (``Kernel.specialized``) print the loop of products as
``tl.range(..., warp_specialize=True)``; Triton's Hopper pass splits a program into a producer
warp group issuing the TMA copies and two consumer groups.  Each tile is built by its family for
``h100`` (fp16) and compiled for sm_90 on this machine: warps launched, registers, spills, shared
memory, wgmma and TMA instructions FROM THE COMPILED BINARY, beside the model's warps, registers,
shared memory and modelled time (h100, one launch).  Nothing is measured on a GPU: whether a specialized
tile is faster is ``bench/gpu_kernels.py``'s and ``bench/gpu_chain_tiles.py``'s to time.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

# (BM, BN, BK, warps, stages, specialized) of the 2048³ GEMM, (BM, BN, warps, stages,
# specialized) of attention 16 x 4096 x 4096, d 128 (K and H whole), full and causal
GEMM_TILES = [(128, 256, 64, 8, 3, False), (128, 256, 64, 4, 3, False), (128, 256, 64, 4, 3, True),
              (128, 256, 64, 4, 4, True), (128, 128, 64, 4, 4, False), (128, 128, 64, 4, 4, True)]
CHAIN_TILES = [(128, 128, 8, 3, False), (128, 64, 8, 3, False), (128, 64, 4, 3, True), (128, 128, 4, 2, True)]


def _row(kernel, label: str, target) -> dict:
    from tilefuse.codegen.triton.native import NativeCompileError, compile_native
    from tilefuse.cost.work import kernel_seconds, work
    w = work(kernel, target)
    res, seconds = w.res, kernel_seconds(w, target)
    row = {"kernel": label, "model_warps": res.warps, "model_registers": res.regs_per_thread,
           "model_shared_bytes": res.smem_bytes,           # (no program fits: None, not JSON's Infinity)
           "modelled_us": round(seconds * 1e6, 2) if math.isfinite(seconds) else None}
    try:
        b = compile_native(kernel, 90)
    except NativeCompileError as e:
        return row | {"error": str(e)[-300:]}
    return row | {"warps": b.num_warps, "registers": b.registers, "spill_bytes": b.spill_bytes,
                  "shared_bytes": b.shared_bytes, "wgmma": b.mma_instructions if b.mma == "wgmma" else 0,
                  "tma_loads": b.tma_loads}


def run() -> list[dict]:
    import torch
    import torch.nn.functional as F

    import tilefuse
    from attention import whole_group            # (bench/attention.py: the shared helpers)
    from tilefuse.cost.target import Target
    from tilefuse.families.chain import ChainFamily, chain_body
    from tilefuse.families.chain import _schedule as chain_schedule
    from tilefuse.families.chain.space import ChainTile
    from tilefuse.families.gemm import GemmFamily, gemm_body
    from tilefuse.families.gemm import _schedule as gemm_schedule
    from tilefuse.families.gemm.space import SWIZZLE, GemmTile
    h100 = Target.get("h100")
    rows = []
    a, w = (torch.randn(2048, 2048, dtype=torch.float16) for _ in range(2))
    body = gemm_body(whole_group(tilefuse.compile(lambda x, y: x @ y, (a, w), target="h100",
                                                  backend="reference").primgraph))
    for bm, bn, bk, warps, stages, ws in GEMM_TILES:
        tile = GemmTile(bm, bn, bk, warps, stages, SWIZZLE, tma=True, ws=ws)
        (k,) = GemmFamily().build(gemm_schedule(body, tile, h100), "gemm").kernels
        rows.append(_row(k, f"GEMM 2048^3 {tile}", h100))
    for causal in (False, True):
        q, kk, v = (torch.randn(1, 16, 4096, 128, dtype=torch.float16) for _ in range(3))
        cm = tilefuse.compile(lambda x, y, z: F.scaled_dot_product_attention(x, y, z, is_causal=causal), (q, kk, v),
                              target="h100", backend="reference")
        cbody = chain_body(whole_group(cm.primgraph))
        for bm, bn, warps, stages, ws in CHAIN_TILES:
            tile = ChainTile(bm, bn, 128, 128, warps, stages, True, ws=ws)
            (k,) = ChainFamily().build(chain_schedule(cbody, tile, h100), "chain").kernels
            rows.append(_row(k, f"attention 16x4096x4096 d128{' causal' if causal else ''} {tile}", h100))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    rows = run()
    print("| kernel | warps | registers | spill B | shared KiB | HGMMA | UTMALDG | model warps / registers / KiB | modelled µs |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        if "error" in r:
            print(f"| {r['kernel']} | {r['error']} |")
            continue
        print(f"| {r['kernel']} | {r['warps']} | {r['registers']} | {r['spill_bytes']} | {r['shared_bytes'] // 1024} | "
              f"{r['wgmma']} | {r['tma_loads']} | {r['model_warps']} / {r['model_registers']} / "
              f"{r['model_shared_bytes'] // 1024} | {r['modelled_us'] if r['modelled_us'] is not None else 'no fit'} |")
    if a.json:
        from fused_registers import write_record     # (this folder is on the path when run)
        write_record(a.json, "warp-specialized GEMM and attention tiles beside their unspecialized twins, sm_90 "
                     "binary (compiled here, no GPU) vs the cost model", argv, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
