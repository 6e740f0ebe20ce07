"""Registers and shared memory of GEMMs on warp-level MMA: the sm_80 binary against the cost model
for an A100, no GPU.

    python bench/mma_registers.py [--cases plain,relu_prologue,gelu_epilogue]
                                  [--json bench/results/mma_registers_a100.json]

Each case is a 2048 x 2048 x 2048 fp16 GEMM (plain; a ReLU before its A operand, computed in the
K loop; bias + GELU after it) built by the gemm family for ``a100`` at every tile of a grid (BM,
BN 32-256, BK 32-128, 4 and 8 warps, 2-4 stages; at most 128 accumulator values a thread and 160
KiB of buffers), compiled for sm_80 on this machine (``mma.sync``; registers, spills and shared
memory FROM THE COMPILED BINARY) beside the model's (``cost/work.py``: ``FRAGMENT_STEPS``,
``WARP_COMPUTED``, a buffer fewer than the stages).  Nothing is measured on a GPU.
"""
from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

CASES = ("plain", "relu_prologue", "gelu_epilogue")


def case(name: str):
    import torch
    h = torch.float16
    a, b, c = torch.randn(2048, 2048, dtype=h), torch.randn(2048, 2048, dtype=h), torch.randn(2048, dtype=h)
    return {"plain": (lambda a, b: a @ b, (a, b)),
            "relu_prologue": (lambda a, b: torch.relu(a) @ b, (a, b)),
            "gelu_epilogue": (lambda a, b, c: torch.nn.functional.gelu(a @ b + c), (a, b, c))}[name]


def tiles():
    from tilefuse.families.gemm.space import GemmTile
    for bm, bn, bk, warps, stages in itertools.product((32, 64, 128, 256), (32, 64, 128, 256), (32, 64, 128),
                                                       (4, 8), (2, 3, 4)):
        per = bm * bn // (32 * warps)
        buffers = (bm * bk + bk * bn) * 2 * (stages - 1)
        if 4 <= per <= 128 and buffers <= 160 * 1024 and not (bm * bn < 64 * 64 and warps == 8) \
                and (bm, bn, bk, warps) != (256, 256, 128, 8):
            yield GemmTile(bm, bn, bk, warps, stages, 1)


def run(names) -> list[dict]:
    import tilefuse
    from attention import whole_group
    from tilefuse.codegen.triton.native import compile_native
    from tilefuse.cost.target import A100
    from tilefuse.cost.work import work
    from tilefuse.families import family
    from tilefuse.families.gemm.template import gemm_kernels
    rows = []
    for name in names:
        fn, args = case(name)
        pg = tilefuse.compile(fn, args, target="a100", backend="reference").primgraph
        (s, *_) = family("gemm").schedules(whole_group(pg), A100)
        for t in tiles():
            (kernel,) = gemm_kernels(s.body, t, "g")
            b = compile_native(kernel, 80)
            res = work(kernel, A100).res
            row = {"case": name, "bm": t.bm, "bn": t.bn, "bk": t.bk, "warps": t.warps, "stages": t.stages,
                   "mma": b.mma, "binary_registers": b.registers, "spills": b.spills,
                   "model_registers": res.regs_per_thread, "binary_shared": b.shared_bytes,
                   "model_shared": res.smem_bytes,
                   "registers_within_25": 0.75 * b.registers <= res.regs_per_thread <= 1.25 * b.registers,
                   "shared_within_25": 0.75 * b.shared_bytes <= res.smem_bytes <= 1.25 * b.shared_bytes}
            print(row, flush=True)
            rows.append(row)
    return rows


def summary(rows) -> dict:
    """Per case: tiles, those whose binary neither spills nor reaches 255 registers, and of those
    the ones within ±25% in registers; of all, in shared memory."""
    out = {}
    for name in dict.fromkeys(r["case"] for r in rows):
        rs = [r for r in rows if r["case"] == name]
        fit = [r for r in rs if not r["spills"] and r["binary_registers"] < 255]
        out[name] = {"tiles": len(rs), "not_spilling": len(fit),
                     "registers_within_25": sum(r["registers_within_25"] for r in fit),
                     "shared_within_25": sum(r["shared_within_25"] for r in rs)}
    return out


def main(argv=None) -> int:
    from fused_registers import write_record
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    rows = run(a.cases.split(","))
    table = summary(rows)
    for name, v in table.items():
        print(f"{name}: registers within ±25% for {v['registers_within_25']} of the {v['not_spilling']} tiles that "
              f"do not spill ({v['tiles']} tiles); shared memory for {v['shared_within_25']}")
    if a.json:
        write_record(a.json, "registers and shared memory of fp16 GEMMs planned for a100, sm_80 binary (compiled "
                     "here, no GPU) vs the cost model", argv, target="a100", summary=table, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
