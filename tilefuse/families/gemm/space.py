"""The gemm family's hardware-centric tile space (Hidet §3.3): block tiles BM×BN×BK, warps,
pipeline stages and the group-M swizzle, split-K for grids that leave SMs idle (its partials
summed by a second kernel, or in the same launch by the last split of each tile), a stencil path
for one column per batch position (depthwise convolutions), two-phase row
reductions for rows wider than a tile, and a small-M path for GEMVs: a few hundred points per
shape.  The family ranks them (``families/gemm``) by the modelled time of the kernel each prints
(``cost/work.py``); a tile a target cannot hold (registers, shared memory) is infeasible there.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from ...codegen.kernel import TMA_ARCH, pow2
from ...cost.dot import tensor_cores
from ...cost.target import Target
from ...cost.work import DOT_REGISTER_BASE
from ...ir.dtypes import DType

BMS = (16, 32, 64, 128, 256)
BNS = (16, 32, 64, 128, 256)
BKS = (16, 32, 64, 128)
WARPS = (4, 8)
STAGES = (2, 3, 4)
SWIZZLE = 8                      # row tiles per group in group-M order (Triton's matmul tutorial)
MAX_ROW = 2048                   # widest row an epilogue reduction holds in one tile
MAX_FIXUP_ROW = 16384            # widest row the two-phase fixup holds in one pass (64 values a thread)
FIXUP_ELEMS_PER_THREAD = (16, 64)   # values of one fixup step per thread: the rows a step takes
                                 # (more rows a step: fewer round trips where fewer row blocks than
                                 # SMs fix many rows, e.g. BM 64 over 128 rows; fewer: fewer
                                 # registers)
SMALL_M = 8                      # rows up to which the small-M (GEMV) path is offered
SMALL_M_BKS = (32, 64, 128, 256, 512)
SMALL_M_STAGES = 4              # deepest small-M K pipeline (3 chunks of 17 KiB ahead at BN 16, BK 512)
STENCIL_BBS = (8, 16, 32, 64)    # channels a stencil program covers (8 fp16: one 16-byte run)
STENCIL_BMS = (16, 32, 64, 128)   # positions a stencil program covers
STENCIL_MIN_BATCH = 8            # batch positions (channels) from which the stencil is offered
STENCIL_MAX_PER_THREAD = 8       # outputs a thread: the unrolled taps hold about 9 times that (a
                                 # stride-2 stencil with a BatchNorm prologue spilled at 16)
SPLITS = (2, 4, 8, 16)
MIN_K_PER_SPLIT = 256            # as the library's model: shorter K ranges are not worth a partial


@dataclass(frozen=True)
class GemmShape:
    batch: int
    m: int
    n: int
    k: int
    dtype: DType                 # the dot's operand type
    row_reduction: bool = False  # the epilogue reduces over N: tiles must hold whole rows


@dataclass(frozen=True)
class GemmTile:
    bm: int
    bn: int
    bk: int
    warps: int
    stages: int
    swizzle: int = 1             # group-M order over this many row tiles (1: row-major)
    dot: bool = True             # tl.dot on tensor cores; False: the small-M path (GEMV, decode),
                                 # products reduced over K on CUDA cores, no row padded to 16
    split: int = 1               # split-K: programs per output tile, each over a K range, their
                                 # fp32 partials summed by a second kernel that runs the epilogue
    fixup: int = 0               # two-phase row reductions (rows wider than BN): the last program
                                 # of a row block finishes the block's rows, ``fixup`` rows a step
    tma: bool = False            # operands that are whole input tiles read through tensor
                                 # descriptors (TMA: targets of sm_90 and later)
    bb: int = 0                  # the stencil path (N = 1 per batch position: a depthwise
                                 # convolution): BB batch positions (channels) a program, beside BM
                                 # positions, one K position (tap) a loop iteration on CUDA cores
    in_launch: bool = False      # split-K's partials summed and the epilogue run by the last of an
                                 # output tile's splits to finish, in the same launch (else a
                                 # second kernel: the only way when the epilogue reduces rows)
    ws: bool = False             # the K loop warp-specialized (``Kernel.specialized``): a producer
                                 # warp group issuing the descriptor copies beside two consumer
                                 # groups of BM / 2 rows, ``warps`` warps a group (``codegen.kernel.WS_WARPS``,
                                 # BM from ``WS_MIN_BM``, sm_90, both operands whole descriptor tiles).
                                 # Not in ``tile_space``: no measurement yet says what it buys, so
                                 # ``bench/gpu_kernels.py`` times it beside the planned tiles

    def key(self) -> tuple:
        return (self.bm, self.bn, self.bk, self.warps, self.stages, self.swizzle, self.dot, self.split,
                self.fixup, self.tma, self.in_launch, self.bb) + ((True,) if self.ws else ())

    def k_range(self, k: int) -> int:
        """K positions each split covers (whole chunks)."""
        return -(-(-(-k // self.split)) // self.bk) * self.bk

    def __str__(self) -> str:
        if self.bb:
            return f"stencil BM={self.bm} BB={self.bb} warps={self.warps}"
        return (f"BM={self.bm} BN={self.bn} BK={self.bk} warps={self.warps} stages={self.stages}"
                + (f" group-M {self.swizzle}" if self.swizzle > 1 else "") + ("" if self.dot else " small-M")
                + (f" split-K {self.split}" if self.split > 1 else "") + (" in one launch" if self.in_launch else "")
                + (f" two-phase rows ({self.fixup} a step)" if self.fixup else "")
                + (" TMA" if self.tma else "") + (" warp-specialized" if self.ws else ""))


def tile_space(s: GemmShape, target: Target) -> list[GemmTile]:
    """Every tile: no block beyond the (power-of-two padded) problem, rows whole or two phases
    when the epilogue reduces over N, the accumulator within a thread's registers, stages within
    the K loop."""
    out = []
    m2, n2, k2 = pow2(max(s.m, 16)), pow2(max(s.n, 16)), pow2(max(s.k, 16))
    # tensor descriptors feed tensor cores; a dot off them (fp32 IEEE: FMA) would pull each
    # descriptor tile from shared memory into registers (sm_90 binaries: 255 registers and spills
    # at 16x16x128, 40 with plain loads)
    tma = target.arch >= TMA_ARCH and tensor_cores(s.dtype, target)
    if s.row_reduction:
        whole = (n2,) if n2 <= MAX_ROW else ()
        bns = whole + (tuple(b for b in BNS if b < n2) if n2 <= MAX_FIXUP_ROW else ())
    else:
        whole = bns = tuple(b for b in BNS if b <= n2)
    for bm in (b for b in BMS if b <= m2):
        for bn in bns:
            for bk in (b for b in BKS if b <= k2):
                chunks = -(-s.k // bk)
                for warps in WARPS:
                    if s.row_reduction and bn < n2:
                        # the larger step where few row blocks fix their rows in parallel
                        pers = FIXUP_ELEMS_PER_THREAD if s.batch * -(-s.m // bm) < target.sm_count \
                            else FIXUP_ELEMS_PER_THREAD[:1]
                        fixups = sorted({f for per in pers if (f := fixup_rows(bm, warps, n2, target, per))})
                        if not fixups:
                            continue
                    else:
                        fixups = [0]
                    for stages, fixup in itertools.product(STAGES, fixups):
                        if stages > max(chunks, 1) + 1 and stages != STAGES[0]:
                            continue
                        mt, nt = -(-s.m // bm), -(-s.n // bn)
                        sw = SWIZZLE if mt > SWIZZLE and nt > 1 else 1
                        t = GemmTile(bm, bn, bk, warps, stages, sw, fixup=fixup, tma=tma)
                        # the fp32 accumulator must fit the registers (the rest: the ranking)
                        if -(-bm * bn // (warps * target.warp_size)) <= 255 - DOT_REGISTER_BASE:
                            out.append(t)
                            if fixup == fixups[0]:
                                out += _splits(t, s, target)
    return out + _small_m_space(s, target, whole) + _stencil_space(s, target)


def fixup_rows(bm: int, warps: int, n2: int, target: Target, per_thread: int = FIXUP_ELEMS_PER_THREAD[0]) -> int:
    """Rows per step of a two-phase fixup over rows padded to ``n2``: as many as keep
    ``per_thread`` values a thread, at least one, at most the row block; 0 when one row would
    take more than 64 values a thread."""
    threads = warps * target.warp_size
    if n2 > 64 * threads:
        return 0
    rows = max(threads * per_thread // n2, 1)
    return min(1 << (rows.bit_length() - 1), bm)


def _splits(t: GemmTile, s: GemmShape, target: Target) -> list[GemmTile]:
    """Split-K variants of a tile whose grid leaves SMs idle: each split covers at least
    ``MIN_K_PER_SPLIT`` of K; with an epilogue that reduces rows, when the reduction kernel holds
    whole rows (``MAX_ROW``), which it reduces after summing the splits."""
    programs = s.batch * -(-s.m // t.bm) * -(-s.n // t.bn)
    if (s.row_reduction and pow2(s.n) > MAX_ROW) or programs >= target.sm_count:
        return []
    out = []
    for split in SPLITS:
        if s.k // split < max(MIN_K_PER_SPLIT, t.bk) or programs * split > 4 * target.sm_count:
            continue
        v = GemmTile(t.bm, t.bn, t.bk, t.warps, t.stages, t.swizzle, t.dot, split, tma=t.tma)
        if -(-s.k // v.k_range(s.k)) == split:       # no empty split
            out.append(v)
            if not s.row_reduction:
                out.append(replace(v, in_launch=True))
    return out


def _stencil_space(s: GemmShape, target: Target) -> list[GemmTile]:
    """Tiles of the stencil path, for a product of one column per batch position (N = 1: a
    depthwise convolution, whose batch is its channels and K its taps): BM positions × BB
    channels a program, 16 bytes' worth to ``STENCIL_MAX_PER_THREAD`` outputs a thread (the taps'
    loads, unrolled, hold about 9 times that: about 80 registers), the taps a loop (no tensor-core tile
    padded to 16 columns, no row of 16 padded taps); channels-last activations make BB channels
    one contiguous run of each tap's load."""
    if s.n != 1 or s.batch < STENCIL_MIN_BATCH or s.row_reduction:
        return []
    out = []
    least = 16 // s.dtype.itemsize          # a thread's run of channels: one 16-byte load
    for bb in (b for b in STENCIL_BBS if b <= pow2(s.batch)):
        for bm in (b for b in STENCIL_BMS if b <= pow2(max(s.m, 16))):
            for warps in (2, 4, 8):
                if least <= bm * bb // (warps * target.warp_size) <= STENCIL_MAX_PER_THREAD:
                    out.append(GemmTile(bm, 1, 1, warps, 1, 1, dot=False, bb=bb))
    return out


def _small_m_space(s: GemmShape, target: Target, bns) -> list[GemmTile]:
    """Tiles of the small-M path (M ≤ ``SMALL_M``): all rows in one program, a product tile of
    BM × BN × BK values reduced over K, 8 to 64 of them per thread; a K loop pipelined 2 to
    ``SMALL_M_STAGES`` deep (its chunks copied asynchronously that many less one ahead), at most
    one stage a chunk."""
    if s.m > SMALL_M:
        return []
    out = []
    bm = pow2(s.m)
    k2 = pow2(max(s.k, 16))
    for bn in bns:
        for bk in (b for b in SMALL_M_BKS if b <= k2):
            for warps in (2, 4, 8):
                per_thread = bm * bn * bk // (warps * target.warp_size)
                if 8 <= per_thread <= 64 or (per_thread < 8 and warps == 2):
                    chunks = -(-s.k // bk)
                    for stages in range(min(chunks, 2), min(chunks, SMALL_M_STAGES) + 1):
                        out.append(GemmTile(bm, bn, bk, warps, stages, 1, dot=False))
    return out
