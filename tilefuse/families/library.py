"""The library family: one contraction through the vendor library (cuBLAS/cuDNN via torch).

Always available for a contraction, so a plan is never worse than eager on a big GEMM or conv.
The contraction is read as a (batched) GEMM: output axes only in operand A form M, only in B form N,
in both form the batch, reduction axes form K (a conv is an implicit GEMM: M = N·OH·OW,
N = F, K = C·KH·KW).  Time is the better of a tensor-core kernel with tile and wave quantization
and a CUDA-core kernel without.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..analysis.classify import Category, contraction_operands
from ..cost.model import kernel_seconds
from ..cost.target import Target
from ..ir.dtypes import DType
from .base import Cost, Group, Schedule

# cuBLAS-like CTA tiles (M × N) the library chooses among.
TILES = ((256, 128), (128, 128), (128, 64), (64, 64))
# Fraction of peak a tuned library GEMM reaches on large problems (modelling assumption).
LIBRARY_EFFICIENCY = 0.8
TENSOR_CORE_DTYPES = (DType.float16, DType.bfloat16)


@dataclass(frozen=True)
class LibrarySchedule(Schedule):
    batch: int
    m: int
    n: int
    k: int
    tile: tuple[int, int]
    tensor_cores: bool


class LibraryFamily:
    name = "library"

    def schedule(self, group: Group, target: Target) -> LibrarySchedule | None:
        if len(group.prims) != 1 or group.categories[0] is not Category.contraction:
            return None
        p = group.prims[0]
        ops = contraction_operands(p)
        if ops is None:
            return None
        batch_axes, m_axes, n_axes = ops
        ext = p.extents
        batch = math.prod(ext[v] for v in batch_axes)
        m = math.prod(ext[v] for v in m_axes)
        n = math.prod(ext[v] for v in n_axes)
        k = math.prod(p.reduce.extents)
        tc = p.out.dtype in TENSOR_CORE_DTYPES and bool(target.peak_tensor)
        best = None
        for tm, tn in TILES:
            tiles = batch * math.ceil(m / tm) * math.ceil(n / tn)
            waves = math.ceil(tiles / target.sm_count)
            padded = waves * target.sm_count * tm * tn * k * 2
            key = (padded, -tm * tn)
            if best is None or key < best[0]:
                best = (key, (tm, tn), tiles)
        _, tile, tiles = best
        return LibrarySchedule("library", group, tiles, batch, m, n, k, tile, tc)

    def cost(self, sched: LibrarySchedule, target: Target) -> Cost:
        g = sched.group
        p = g.prims[0]
        flops = 2 * sched.batch * sched.m * sched.n * sched.k
        unique = sum(g.types[t].nbytes for t in dict.fromkeys(p.inputs)) + p.out.nbytes
        dtype = p.out.dtype
        tm, tn = sched.tile
        # Tensor cores: padded tiles, whole waves.  CUDA cores: no padding, but the slower peak.
        waves = math.ceil(sched.blocks / target.sm_count)
        tc_flops = waves * target.sm_count * tm * tn * sched.k * 2
        options = [kernel_seconds(unique, flops, target.peak(dtype, False) * LIBRARY_EFFICIENCY,
                                  target.sm_count * 4, target)]
        if sched.tensor_cores:
            options.append(kernel_seconds(unique, tc_flops, target.peak(dtype, True) * LIBRARY_EFFICIENCY,
                                          max(sched.blocks, 1), target))
        return Cost(min(options), unique, flops, sched.blocks)
