"""A plan's generated kernels compiled for the target's GPU architecture, beside the model.

Every tile-level kernel a plan launches (``Built.kernels``) is compiled ahead of time for the
target's compute capability (``codegen/triton/native.py``: no GPU needed) and read off the binary:
registers, spills, shared memory, tensor-core path, load widths, async copies.  Each row carries
what the cost model assumed for the same kernel (its ``Work.res``: warps, registers per thread,
shared memory, and the programs resident per SM they give), so the two can be compared kernel by
kernel: ``CompiledModel.native()``, the report, ``tilefuse compile --native``.
"""
from __future__ import annotations

from dataclasses import dataclass

from .codegen.triton.native import Binary, compile_native
from .cost.model import Resources, occupancy
from .cost.target import Target
from .errors import OptionError
from .progress import report

# Registers are allocated per warp in units of 256 (8 per thread), the figure occupancy rests on.
_REG_UNIT = 8


@dataclass(frozen=True)
class NativeKernel:
    """One tile-level kernel of a plan kernel: its binary and the model's view of it."""
    plan_kernel: str             # the plan kernel's name (``Built.name``)
    family: str
    binary: Binary
    occupancy: int               # programs resident per SM from the binary's registers and shared memory
    model: Resources             # what the cost model assumed (warps, registers/thread, shared memory)
    model_occupancy: int

    def as_dict(self) -> dict:
        b = self.binary
        return {"kernel": b.kernel, "arch": b.arch, "registers": b.registers, "spill_bytes": b.spill_bytes,
                "spill_instructions": b.spill_instructions, "shared_bytes": b.shared_bytes, "mma": b.mma,
                "wide_load_share": round(b.wide_share(16), 4), "loads": b.loads,
                "async_copies": b.async_copies, "tma_loads": b.tma_loads, "pipelined": b.pipelined,
                "occupancy": self.occupancy, "model_registers": self.model.regs_per_thread,
                "model_shared_bytes": self.model.smem_bytes, "model_occupancy": self.model_occupancy}


def binary_occupancy(b: Binary, target: Target) -> int:
    """Programs resident per SM for the binary's registers (in allocation units), shared memory
    (Triton's dynamic allocation and cuobjdump's static figure) and warps."""
    regs = -(-max(b.registers, 1) // _REG_UNIT) * _REG_UNIT
    return occupancy(Resources(b.num_warps, regs, b.shared_bytes + b.static_shared), target)


def native_kernels(plan, built, target: Target) -> list[NativeKernel]:
    """Every generated kernel of ``plan`` (built as ``built``, in plan order) compiled for
    ``target.arch``; library and torch kernels have none and are skipped."""
    if not target.arch:
        raise OptionError(f"target {target.name!r} has no GPU architecture to compile kernels for; "
                          f"plan for a GPU (target='h100', 'h200' or 'a100') to compile natively")
    jobs = [(k, b, kernel, work) for k, b in zip(plan.kernels, built)
            for kernel, work in zip(b.kernels, (k.schedule.work, *k.schedule.then))]
    rows = []
    for i, (k, b, kernel, work) in enumerate(jobs):
        binary = compile_native(kernel, target.arch)
        rows.append(NativeKernel(b.name, b.family, binary, binary_occupancy(binary, target), work.res,
                                 occupancy(work.res, target)))
        report(f"compiling kernels for sm_{target.arch}", i + 1, len(jobs))
    return rows
