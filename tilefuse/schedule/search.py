"""The gemm family's hardware-centric schedule space (Hidet §3.3): block tiles BM×BN×BK, warps,
pipeline stages and the group-M swizzle, a few hundred points filtered by the target's registers
and shared memory and ranked by the cost model.

A tile's compute rate (``tile_rate``): the tensor cores' peak (CUDA cores for fp32, which runs in
IEEE precision) times the share a Triton GEMM sustains in full waves (``TRITON_GEMM_EFFICIENCY``),
times what shared memory can feed: every K step reads (BM + BN)·BK operand elements from shared
memory for 2·BM·BN·BK flops, so a tile whose flops per shared-memory byte fall below the SM's
tensor rate over its shared-memory bandwidth is bound by the latter (small and skinny tiles).  On
Hopper, tiles of fewer than 64 rows per warpgroup cannot use wgmma and run at the target's
``legacy_mma_share``.

An epilogue that reduces rows over N (softmax, LayerNorm) either takes tiles holding whole rows
(BN ≥ N) or runs in two phases (``GemmTile.fixup``): every program stores its tile's
pre-reduction values, and the last program of each row block to finish re-reads the block's rows
from L2, reduces them and stores the results (``fixup_work`` times that tail, which runs after the
tiles; no second launch).

The ranking (``ranked_tiles``) times each tile's core GEMM (operands read once per tile panel
through L2, the output written once) and is cached per shape and target; the family then costs
its top few with the group's own prologue and epilogue traffic.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ..cost.model import Resources, Work, estimate, occupancy
from ..cost.target import Target
from ..ir.dtypes import DType

BMS = (16, 32, 64, 128, 256)
BNS = (16, 32, 64, 128, 256)
BKS = (16, 32, 64, 128)
WARPS = (4, 8)
STAGES = (2, 3, 4)
SWIZZLE = 8                      # row tiles per group in group-M order (Triton's matmul tutorial)
MAX_ROW = 2048                   # widest row an epilogue reduction holds in one tile
MAX_FIXUP_ROW = 16384            # widest row the two-phase fixup holds in one pass (64 values a thread)
FIXUP_ELEMS_PER_THREAD = 16      # values of one fixup step per thread: the rows a step takes
# Share of the tensor-core peak a Triton GEMM sustains inside full waves with a large tile: an
# assumption (Triton's matmul tutorial reports fp16 GEMMs near cuBLAS, which the library family
# models at 0.82); to be calibrated against measurements on a GPU.
TRITON_GEMM_EFFICIENCY = 0.75
BASE_REGS = 40                   # indices, pointers, loop state per thread
SMALL_M = 8                      # rows up to which the small-M (GEMV) path is offered
SMALL_M_BKS = (32, 64, 128, 256, 512)
SPLITS = (2, 4, 8, 16)
MIN_K_PER_SPLIT = 256            # as the library's model: shorter K ranges are not worth a partial
REDUCE_BLOCK = 1024              # outputs per program of the split-K reduction kernel
TENSOR_DTYPES = (DType.float16, DType.bfloat16)


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

    def key(self) -> tuple:
        return (self.bm, self.bn, self.bk, self.warps, self.stages, self.swizzle, self.dot, self.split,
                self.fixup)

    def k_range(self, k: int) -> int:
        """K positions each split covers (whole chunks)."""
        return -(-(-(-k // self.split)) // self.bk) * self.bk

    def __str__(self) -> str:
        return (f"BM={self.bm} BN={self.bn} BK={self.bk} warps={self.warps} stages={self.stages}"
                + (f" group-M {self.swizzle}" if self.swizzle > 1 else "") + ("" if self.dot else " small-M")
                + (f" split-K {self.split}" if self.split > 1 else "")
                + (f" two-phase rows ({self.fixup} a step)" if self.fixup else ""))


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def tensor_cores(s: GemmShape, target: Target, t: GemmTile | None = None) -> bool:
    return (t is None or t.dot) and s.dtype in TENSOR_DTYPES and target.has_tensor_cores(s.dtype)


def tile_resources(t: GemmTile, s: GemmShape, target: Target) -> Resources:
    """Registers: the fp32 accumulator's share per thread plus a base (and a row's worth of
    reduction temporaries when the epilogue reduces); shared memory: the pipelined operand tiles."""
    threads = t.warps * target.warp_size
    if not t.dot:      # the product tile is accumulated elementwise in registers, then reduced
        return Resources(t.warps, BASE_REGS + 2 * -(-t.bm * t.bn * t.bk // threads), 0)
    acc = -(-t.bm * t.bn // threads)
    regs = BASE_REGS + acc * (2 if s.row_reduction and not t.fixup else 1)
    if t.fixup:        # the fixup's step of rows (a value and two temporaries per element)
        regs = max(regs, BASE_REGS + 3 * -(-t.fixup * _pow2(s.n) // threads))
    smem = t.stages * (t.bm + t.bn) * t.bk * max(s.dtype.itemsize, 1)
    return Resources(t.warps, regs, smem)


def tile_rate(t: GemmTile, s: GemmShape, target: Target) -> float:
    """FLOP/s one wave of this tile sustains (see the module docstring)."""
    tc = tensor_cores(s, target, t)
    peak = target.peak(s.dtype, tc) * TRITON_GEMM_EFFICIENCY
    if not t.dot:
        return target.peak(DType.float32, False) * TRITON_GEMM_EFFICIENCY
    if not tc:
        return peak
    if target.warpgroup_mma_rows and t.bm < target.warpgroup_mma_rows * max(t.warps // 4, 1):
        peak *= target.legacy_mma_share
    per_sm = peak / target.sm_count
    smem_rate = target.smem_bytes_per_clk * target.clock_hz        # bytes/s per SM
    intensity = 2 * t.bm * t.bn / ((t.bm + t.bn) * s.dtype.itemsize)  # flops per shared-memory byte
    return peak * min(1.0, intensity * smem_rate / per_sm)


def tile_space(s: GemmShape, target: Target) -> list[GemmTile]:
    """Every feasible tile: no block beyond the (power-of-two padded) problem, rows whole or two
    phases when the epilogue reduces over N, accumulator within 255 registers, stages within the
    K loop and shared memory within a block's share."""
    out = []
    m2, n2, k2 = _pow2(max(s.m, 16)), _pow2(max(s.n, 16)), _pow2(max(s.k, 16))
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
                    fixup = fixup_rows(bm, warps, n2, target) if s.row_reduction and bn < n2 else 0
                    if s.row_reduction and bn < n2 and not fixup:
                        continue
                    for stages in STAGES:
                        if stages > max(chunks, 1) + 1 and stages != STAGES[0]:
                            continue
                        mt, nt = -(-s.m // bm), -(-s.n // bn)
                        sw = SWIZZLE if mt > SWIZZLE and nt > 1 else 1
                        t = GemmTile(bm, bn, bk, warps, stages, sw, fixup=fixup)
                        res = tile_resources(t, s, target)
                        if res.regs_per_thread <= 255 and occupancy(res, target) > 0:
                            out.append(t)
                            out += _splits(t, s, target)
    return out + _small_m_space(s, target, whole)


def fixup_rows(bm: int, warps: int, n2: int, target: Target) -> int:
    """Rows per step of a two-phase fixup over rows padded to ``n2``: as many as keep
    ``FIXUP_ELEMS_PER_THREAD`` values a thread, at least one, at most the row block; 0 when one
    row would take more than 64 values a thread."""
    threads = warps * target.warp_size
    if n2 > 64 * threads:
        return 0
    rows = max(threads * FIXUP_ELEMS_PER_THREAD // n2, 1)
    return min(1 << (rows.bit_length() - 1), bm)


def _splits(t: GemmTile, s: GemmShape, target: Target) -> list[GemmTile]:
    """Split-K variants of a tile whose grid leaves SMs idle: each split covers at least
    ``MIN_K_PER_SPLIT`` of K; not with an epilogue that reduces rows (it needs whole sums)."""
    programs = s.batch * -(-s.m // t.bm) * -(-s.n // t.bn)
    if s.row_reduction or programs >= target.sm_count:
        return []
    out = []
    for split in SPLITS:
        if s.k // split < max(MIN_K_PER_SPLIT, t.bk) or programs * split > 4 * target.sm_count:
            continue
        v = GemmTile(t.bm, t.bn, t.bk, t.warps, t.stages, t.swizzle, t.dot, split)
        if -(-s.k // v.k_range(s.k)) == split:       # no empty split
            out.append(v)
    return out


def _small_m_space(s: GemmShape, target: Target, bns) -> list[GemmTile]:
    """Tiles of the small-M path (M ≤ ``SMALL_M``): all rows in one program, a product tile of
    BM × BN × BK values reduced over K, 8 to 64 of them per thread."""
    if s.m > SMALL_M:
        return []
    out = []
    bm = _pow2(s.m)
    k2 = _pow2(max(s.k, 16))
    for bn in bns:
        for bk in (b for b in SMALL_M_BKS if b <= k2):
            for warps in (2, 4, 8):
                per_thread = bm * bn * bk // (warps * target.warp_size)
                if 8 <= per_thread <= 64 or (per_thread < 8 and warps == 2):
                    t = GemmTile(bm, bn, bk, warps, 2 if s.k > bk else 1, 1, dot=False)
                    if occupancy(tile_resources(t, s, target), target) > 0:
                        out.append(t)
    return out


def core_work(s: GemmShape, t: GemmTile, target: Target, *, a_bytes: float, b_bytes: float,
              a_panel: float, b_panel: float, rereads: tuple[float, float], extra_dram: float = 0.0,
              extra_flops: float = 0.0, scratch: float = 0.0) -> Work:
    """The work of a GEMM tile: ``a_panel``/``b_panel`` bytes one program loads over its K loop,
    each operand's distinct bytes ``a_bytes``/``b_bytes`` fetched from DRAM ``rereads`` times, plus
    the epilogue's inputs and outputs (``extra_dram``, requested once) and its arithmetic, and
    ``scratch`` bytes written for a later phase (split-K partials are added here; to DRAM only
    when they do not fit in half of L2)."""
    mt, nt = -(-s.m // t.bm), -(-s.n // t.bn)
    programs = s.batch * mt * nt * t.split
    chunks = -(-t.k_range(s.k) // t.bk)
    kpad = chunks * t.bk * t.split
    tc = tensor_cores(s, target, t)
    # tensor cores compute whole tiles; CUDA cores only the useful products
    flops = 2 * programs * t.bm * t.bn * kpad if tc else 2 * s.batch * s.m * s.n * s.k
    rate = tile_rate(t, s, target)
    # the epilogue's arithmetic runs on CUDA cores after the K loop, charged at their rate
    flops += extra_flops * rate / target.peak(DType.float32, False)
    # a_panel/b_panel cover all of K: a split program loads its share
    l2 = programs * (a_panel + b_panel) / t.split + extra_dram
    dram = a_bytes * rereads[0] + b_bytes * rereads[1] + extra_dram
    if t.split > 1:          # the fp32 partials, written once (the reduction kernel reads them)
        scratch += t.split * s.batch * s.m * s.n * 4
    l2, dram = l2 + scratch, dram + (scratch if scratch > target.l2_bytes // 2 else 0)
    inflight = (t.stages - 1) * (a_panel + b_panel) / t.split / max(chunks, 1)
    return Work(programs, dram, l2, flops, rate, inflight, tile_resources(t, s, target), chunks, l2)


def dram_rereads(s: GemmShape, t: GemmTile, operand_bytes: float, target: Target) -> tuple[float, float]:
    """How many times A and B come from DRAM.  Operands that fit in half of L2 are read once;
    otherwise the programs resident at once cover a window of the tile grid (group-M order:
    ``swizzle`` row tiles by as many columns as the wave holds; row-major: one row), and each A row
    panel is fetched once per column band of windows, each B column panel once per row band."""
    if operand_bytes <= target.l2_bytes // 2:
        return 1.0, 1.0
    mt, nt = -(-s.m // t.bm), -(-s.n // t.bn)
    occ = max(occupancy(tile_resources(t, s, target), target), 1)
    wave = max(min(s.batch * mt * nt, target.sm_count * occ), 1)
    rows = min(mt, t.swizzle)
    cols = max(min(nt, wave // rows), 1)
    return float(-(-nt // cols)), float(-(-mt // rows))


def split_reduction(s: GemmShape, t: GemmTile, target: Target) -> Work | None:
    """The work of the second kernel of a split-K schedule: read the fp32 partials (from L2 when
    they fit), sum them, run the epilogue (its traffic is charged to the first kernel's work)."""
    if t.split == 1:
        return None
    elems = s.batch * s.m * s.n
    partial = t.split * elems * 4
    programs = -(-elems // REDUCE_BLOCK)
    return Work(programs, partial if partial > target.l2_bytes // 2 else 0, partial, elems * t.split,
                target.peak(DType.float32, False), partial / programs, Resources(4, 64), 1, partial)


def fixup_work(s: GemmShape, t: GemmTile, target: Target, *, read: float, written: float,
               inputs: float = 0.0, flops: float = 0.0) -> Work | None:
    """The tail of a two-phase schedule: the last program of each row block re-reads its share of
    the ``read`` bytes the tiles stored (from L2 where they fit), reads ``inputs`` (bytes each
    row block reads: a LayerNorm's weight and bias), reduces the rows and writes its share of
    ``written``; ``fixup`` rows a step, so a step's loads are what a program keeps in flight.
    It runs after the tiles, in the same launch: time it with ``estimate(...).body``."""
    if not t.fixup:
        return None
    groups = s.batch * -(-s.m // t.bm)
    steps = -(-min(t.bm, s.m) // t.fixup)
    l2 = read + inputs * groups + written
    dram = written + inputs + (read if read > target.l2_bytes // 2 else 0)
    inflight = (read / groups + inputs) / steps
    return Work(groups, dram, l2, flops, target.peak(DType.float32, False), inflight,
                tile_resources(t, s, target), steps, l2, store_bytes=written)


@functools.lru_cache(maxsize=2048)
def ranked_tiles(s: GemmShape, target: Target) -> tuple[GemmTile, ...]:
    """Feasible tiles, fastest first by the modelled time of the core GEMM (ties: least padding,
    then larger tiles, fewer warps and stages); cached by value, per shape and target."""
    item = max(s.dtype.itemsize, 1)
    a_bytes, b_bytes = s.batch * s.m * s.k * item, s.batch * s.n * s.k * item
    out_bytes = s.batch * s.m * s.n * item
    scored = []
    for t in tile_space(s, target):
        mt, nt = -(-s.m // t.bm), -(-s.n // t.bn)   # in-bounds rows of a program's panels, on average
        w = core_work(s, t, target, a_bytes=a_bytes, b_bytes=b_bytes, a_panel=s.m / mt * s.k * item,
                      b_panel=s.n / nt * s.k * item, rereads=dram_rereads(s, t, a_bytes + b_bytes, target),
                      extra_dram=0 if t.fixup else out_bytes, scratch=out_bytes if t.fixup else 0)
        sec = estimate(w, target).seconds
        second = split_reduction(s, t, target)
        if second is not None:
            sec += estimate(second, target).seconds
        tail = fixup_work(s, t, target, read=out_bytes, written=out_bytes)
        if tail is not None:
            sec += estimate(tail, target).body
        if math.isfinite(sec):
            padded = (t.bm * mt - s.m) * s.n + (t.bn * nt - s.n) * s.m   # wasted rows and columns
            scored.append(((sec, padded, -t.bm * t.bn, t.warps, t.stages, -t.bk), t))
    scored.sort(key=lambda kv: kv[0])
    return tuple(t for _, t in scored)
