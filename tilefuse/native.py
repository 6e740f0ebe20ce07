"""A plan's generated kernels compiled for the target's GPU architecture, beside the model.

Every tile-level kernel a plan launches (``Built.kernels``) is compiled ahead of time for the
target's compute capability (``codegen/triton/native.py``: no GPU needed) and read off the binary:
registers, spills, shared memory, tensor-core path, load widths, async copies.  Each row carries
what the cost model assumed for the same kernel (its ``Work.res``: warps, registers per thread,
shared memory, and the programs resident per SM they give), so the two can be compared kernel by
kernel: ``CompiledModel.native()``, the report, ``tilefuse compile --native``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .codegen.kernel import Dot
from .codegen.triton.native import Binary, NativeCompileError, compile_native
from .cost.dot import wgmma
from .cost.measure import settle
from .cost.model import Resources, Work, occupancy
from .cost.target import Target
from .errors import OptionError
from .families import Cost, family
from .log import logger
from .progress import report

_log = logger("plan")


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


def binary_resources(b: Binary) -> Resources:
    """What one program of the binary holds: its warps, registers and shared memory (Triton's
    dynamic allocation and cuobjdump's static figure)."""
    return Resources(b.num_warps, max(b.registers, 1), b.shared_bytes + b.static_shared)


def binary_occupancy(b: Binary, target: Target) -> int:
    """Programs resident per SM for the binary's resources."""
    return occupancy(binary_resources(b), target)


# Shared memory the system keeps per block on sm_80 and later (cuobjdump's SHARED of every
# binary): what a launched kernel's own figure (Triton's dynamic allocation) leaves out
SYSTEM_SHARED = 1024


def launched_occupancy(registers: int, shared: int, warps: int, target: Target) -> int:
    """Programs resident per SM of a kernel as the launch compiled it (its registers a thread,
    Triton's dynamic shared bytes, its warps): a persistent kernel's grid on the GPU
    (``codegen/triton/persistent.compile_persistent``)."""
    return occupancy(Resources(warps, max(registers, 1), shared + SYSTEM_SHARED), target)


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


# ---------------------------------------------------------------- planning on the binary

TOP_K = 3          # schedules of each kernel of the plan compiled per round (the measurement loop's)
ROUNDS = 32        # a cap on re-plans (ResNet-50 at h100 settles after 10; 8 left it unsettled, with a spill)


def grounded_cost(schedule, target: Target, cuda_graph: bool = False) -> Cost:
    """The schedule's cost with what the model estimated of its kernels replaced by the binary's:
    registers, shared memory and so occupancy, and the tensor-core path (wgmma or mma.sync, at
    ``legacy_mma_share`` of the rate).  A kernel that spills, or that Triton cannot compile for
    the architecture, costs ``inf``: planning takes another."""
    fam = family(schedule.family)
    works = (schedule.work, *schedule.then)
    kernels = fam.kernels(schedule, "k")
    out = []
    for kernel, w in zip(kernels, works):
        try:
            b = compile_native(kernel, target.arch)
        except NativeCompileError as e:
            _log.warning("%s; the schedule %s is not planned", e, schedule.tile_key())
            return replace(Cost.of(works, target, cuda_graph), seconds=math.inf)
        if b.spills:
            return replace(Cost.of(works, target, cuda_graph), seconds=math.inf)
        out.append(_grounded_work(w, kernel, b, target))
    return Cost.of(tuple(out), target, cuda_graph)


def _grounded_work(w: Work, kernel, b: Binary, target: Target) -> Work:
    res = binary_resources(b)
    peak = w.peak
    dot = next((st for st in _statements(kernel.body) if isinstance(st, Dot)), None)
    if dot is not None and b.mma != "none" and target.warpgroup_mma_rows:
        assumed = wgmma(kernel.axis(dot.m).block, kernel.num_warps, target)
        if assumed and b.mma == "mma.sync":
            peak *= target.legacy_mma_share
        elif not assumed and b.mma == "wgmma":
            peak /= target.legacy_mma_share
    tail = _grounded_work(w.tail, kernel, b, target) if w.tail is not None else None
    return replace(w, res=res, peak=peak, tail=tail)


def _statements(body):
    for st in body:
        yield st
        yield from _statements(getattr(st, "body", ()))


@dataclass(frozen=True)
class Grounding:
    plans: dict
    coster: object
    compiled: int              # schedules compiled and costed from their binaries
    rounds: int
    stable: bool               # the last plan's kernels were all costed from their binaries


def ground(plan_fn, target: Target, *, strategy: str = "optimal", cuda_graph: bool = False,
           top_k: int = TOP_K, rounds: int = ROUNDS) -> Grounding:
    """Plan, cost the plan's kernels and each one's ``top_k`` alternatives from their binaries
    (``grounded_cost``), re-plan with those costs, until a round compiles nothing new: the loop
    the measurement loop runs (``cost/measure.py: settle``), with the binary in place of the GPU.
    ``plan_fn(grounded)`` plans with ``grounded`` (schedule key -> Cost) overriding the model."""
    if not target.arch:
        raise OptionError(f"target {target.name!r} has no GPU architecture to compile kernels for; "
                          f"plan for a GPU (target='h100', 'h200' or 'a100') to plan on the binary")
    compiled = []

    def value_of(sched) -> Cost:
        compiled.append(sched.key())
        cost = grounded_cost(sched, target, cuda_graph)
        report(f"compiling kernels for sm_{target.arch}", len(compiled))
        return cost

    plans, coster, grounded, done, stable = settle(
        plan_fn, value_of, strategy=strategy, top_k=top_k, rounds=rounds,
        wanted=lambda sched: hasattr(family(sched.family), "kernels"))
    return Grounding(plans, coster, len(grounded), done, stable)
