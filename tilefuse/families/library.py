"""The library family: one contraction through the vendor library (cuBLAS/cuDNN via torch).

Always available for a contraction, so a plan is never worse than eager on a big GEMM or conv.
The contraction is read as a (batched) GEMM: output axes only in operand A form M, only in B form N,
in both form the batch, reduction axes form K (a conv is an implicit GEMM: M = N·OH·OW,
N = F, K = C·KH·KW).  The library is modelled as a tuned tiled GEMM choosing among CTA tiles and
split-K factors: tensor cores for fp16/bf16 (padded to whole tiles), CUDA cores otherwise (fp32
runs in IEEE precision, not TF32: the runtime switches TF32 off), each tile held in shared memory
with ``STAGES`` buffers, operands re-read through L2 once per tile row/column.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..analysis.classify import Category, contraction_operands
from ..cost.model import Resources, Work, estimate
from ..cost.target import Target
from ..ir.dtypes import DType
from .base import Built, Family, Group, Schedule

# CTA tiles (M × N) and split-K factors the library chooses among (cuBLAS's kernels for Hopper and
# Ampere use 64-256 wide tiles and split K when M·N gives too few tiles).
TILES = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
SPLITS = (1, 2, 4, 8)
MIN_K_PER_SPLIT = 256
STAGES = 3
# Fraction of the tensor-core (or CUDA-core) peak a tuned library GEMM sustains inside full waves:
# calibrated so that an 8192³ bf16 GEMM models at ~790 TFLOP/s on an H200 (tests/test_calibration.py).
LIBRARY_EFFICIENCY = 0.82
TENSOR_CORE_DTYPES = (DType.float16, DType.bfloat16)
TOP_K = 3


@dataclass(frozen=True)
class LibrarySchedule(Schedule):
    batch: int
    m: int
    n: int
    k: int
    tile: tuple[int, int]
    split_k: int
    tensor_cores: bool

    def tile_key(self) -> tuple:
        return (self.tile, self.split_k, self.tensor_cores)


class LibraryFamily(Family):
    name = "library"

    def build(self, schedule: LibrarySchedule, name: str) -> Built:
        from ..vendor.torch_call import library_kernel
        (prim,) = schedule.group.prims
        kernel = library_kernel(prim)
        desc = (f"# {name}: library kernel (tilefuse), {kernel!r}\n# implements: {prim.origin}\n"
                f"# {schedule.batch} x [{schedule.m} x {schedule.k}] @ [{schedule.k} x {schedule.n}], "
                f"modelled tile {schedule.tile[0]}x{schedule.tile[1]}, split-K {schedule.split_k}\n")
        return Built(name, self.name, tuple(prim.inputs), (prim.name,),
                     lambda ins, outs: kernel(ins, outs[0]), desc, "torch")

    def schedules(self, group: Group, target: Target) -> list[LibrarySchedule]:
        if len(group.prims) != 1 or group.categories[0] is not Category.contraction:
            return []
        p = group.prims[0]
        ops = contraction_operands(p)
        if ops is None:
            return []
        batch_axes, m_axes, n_axes = ops
        ext = p.extents
        batch = math.prod(ext[v] for v in batch_axes)
        m = math.prod(ext[v] for v in m_axes)
        n = math.prod(ext[v] for v in n_axes)
        k = math.prod(p.reduce.extents)
        # tensor cores take 16-bit operands (accumulating in fp32, whatever the output type)
        dtype = group.types[p.inputs[0]].dtype
        tc = dtype in TENSOR_CORE_DTYPES and target.has_tensor_cores(dtype)
        scored = []
        for tile in TILES:
            for split in SPLITS:
                if split > 1 and k // split < MIN_K_PER_SPLIT:
                    continue
                s = _schedule(group, target, batch, m, n, k, tile, split, tc)
                t = estimate(s.work, target).seconds
                if t != math.inf:
                    scored.append(((t, split, tile), s))
        scored.sort(key=lambda kv: kv[0])
        return [s for _, s in scored[:TOP_K]]


def _schedule(group: Group, target: Target, batch: int, m: int, n: int, k: int, tile: tuple[int, int],
              split: int, tc: bool) -> LibrarySchedule:
    p = group.prims[0]
    dtype = group.types[p.inputs[0]].dtype
    tm, tn = tile
    item = max(dtype.itemsize, 1)
    a_bytes, b_bytes = (group.types[t].nbytes for t in (p.inputs[0], p.inputs[-1]))
    mt, nt = math.ceil(m / tm), math.ceil(n / tn)
    programs = batch * mt * nt * split
    kc = math.ceil(k / split)
    flops = 2 * batch * m * n * k
    # tensor cores work on whole tiles: the padded tile is what they compute
    work_flops = programs * tm * tn * kc * 2 if tc else flops
    # split K: fp32 partials written and read back, from L2 when they fit there
    partial = 2 * 4 * batch * m * n * split if split > 1 else 0
    partial_dram = partial if partial > target.l2_bytes // 2 else 0
    out_bytes = p.out.nbytes
    bk = 128 // item if item else 32                               # a 128-byte K slice per stage
    warps = 8 if tm * tn >= 128 * 128 else 4
    acc_regs = tm * tn // (warps * target.warp_size)               # fp32 accumulators per thread
    res = Resources(warps, min(acc_regs + 48, 255) if acc_regs + 48 <= 255 else 256,
                    STAGES * (tm + tn) * bk * item)
    dram = a_bytes + b_bytes + out_bytes + partial_dram
    l2 = a_bytes * nt + b_bytes * mt + out_bytes + partial
    peak = target.peak(dtype, tc) * LIBRARY_EFFICIENCY
    # the vendor's programs step through K as ours do (the same latency floor)
    steps = math.ceil(kc / bk)
    work = Work(programs, dram, l2, work_flops, peak, inflight_bytes=STAGES * (tm + tn) * bk * item, res=res,
                dot_steps=steps)
    return LibrarySchedule("library", group, programs, work, batch, m, n, k, tile, split, tc)
