"""The rate a matrix-product tile sustains: what ``cost/work.py`` charges a kernel's ``Dot``.

A ``Dot`` of a BM × BN accumulator tile runs on tensor cores when its operand type has them on
the target (fp16, bf16), else on CUDA cores (an fp32 dot in IEEE precision).  On tensor cores the
tile sustains the dtype's peak times ``TRITON_GEMM_EFFICIENCY``; with fewer rows than a Hopper
warpgroup MMA needs (``Target.warpgroup_mma_rows``, in warpgroups of 4 warps) it falls back to warp-level
``mma.sync`` at ``Target.legacy_mma_share`` of that; and a small tile is bound by shared memory:
each product of a K step reads (BM + BN)·BK operand values for 2·BM·BN·BK flops, so a tile's
flops per shared-memory byte is 2·BM·BN / ((BM + BN)·itemsize), times the SM's shared-memory
bandwidth.  All modelled.
"""
from __future__ import annotations

from ..ir.dtypes import DType
from .target import Target

# Share of the tensor-core peak a Triton GEMM sustains inside full waves with a large tile: an
# assumption (Triton's matmul tutorial reports fp16 GEMMs near cuBLAS, which the library family
# models at 0.82); to be calibrated against measurements on a GPU.
TRITON_GEMM_EFFICIENCY = 0.75
TENSOR_DTYPES = (DType.float16, DType.bfloat16)
# A family ranks a tile that misses warpgroup MMA on a target that has it as if its kernel's body
# (its time less the launch, which no tile changes) were this share slower: a prior toward the
# hardware's fast path, not a measured figure.  Where the paths model within it of each other
# (launch- or memory-bound kernels, whose bodies the model times with no calibration yet) the
# wgmma tile is the safer choice: mma.sync halves the rate should the kernel turn out
# compute-bound, and a wgmma tile loses at most this share if it does not.  A ranking preference,
# never a time (the schedule keeps its modelled seconds); measurement on a GPU replaces it.
LEGACY_MMA_MARGIN = 0.25


def tensor_cores(dtype: DType, target: Target) -> bool:
    """A dot of ``dtype`` operands runs on tensor cores on ``target``."""
    return dtype in TENSOR_DTYPES and target.has_tensor_cores(dtype)


def wgmma(bm: int, warps: int, target: Target) -> bool:
    """A dot of a BM-row tile runs as Hopper warpgroup MMA: whole warpgroups of 4 warps, and rows
    in whole multiples of ``warpgroup_mma_rows`` (Triton's rule, read off sm_90 binaries: BM 64 at
    4 or 8 warps compiles to HGMMA; BM 16 or 32, or 2 warps, to HMMA; bench/README.md)."""
    rows = target.warpgroup_mma_rows
    return bool(rows) and bm % rows == 0 and warps % 4 == 0


def legacy_mma(bm: int, warps: int, dtype: DType, target: Target) -> bool:
    """A tensor-core tile that misses the target's warpgroup MMA (runs on mma.sync)."""
    return bool(target.warpgroup_mma_rows) and tensor_cores(dtype, target) and not wgmma(bm, warps, target)


def ranking_seconds(seconds: float, bm: int, warps: int, dtype: DType, target: Target, launches: int = 1) -> float:
    """``seconds`` (of ``launches`` kernels) as families rank a tensor-core dot tile: the body
    ``LEGACY_MMA_MARGIN`` longer when the tile misses the target's warpgroup MMA."""
    if legacy_mma(bm, warps, dtype, target):
        fixed = launches * target.launch(False)
        return fixed + (seconds - fixed) * (1 + LEGACY_MMA_MARGIN)
    return seconds


def dot_rate(bm: int, bn: int, warps: int, dtype: DType, target: Target) -> float:
    """FLOP/s one wave of BM × BN dot tiles of ``dtype`` operands sustains (module docstring)."""
    tc = tensor_cores(dtype, target)
    peak = target.peak(dtype, tc) * TRITON_GEMM_EFFICIENCY
    if not tc:
        return peak
    if target.warpgroup_mma_rows and not wgmma(bm, warps, target):
        peak *= target.legacy_mma_share
    per_sm = peak / target.sm_count
    smem_rate = target.smem_bytes_per_clk * target.clock_hz        # bytes/s per SM
    intensity = 2 * bm * bn / ((bm + bn) * dtype.itemsize)          # flops per shared-memory byte
    return peak * min(1.0, intensity * smem_rate / per_sm)
