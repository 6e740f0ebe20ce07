"""The chain family's tile space: MCFuser's for the Triton template (the ``nk`` sub-tiling: a
program owns a row tile and a tile of the second product's columns, walks the keys, and holds or
loops the first product's reduction), in powers of two, times warps and pipeline stages (at least
two where a loop streams tiles through tensor descriptors on sm_90: every dot loop pipelined).

Sizes: M and N (rows, keys), walked in many tiles whose padding is bounded by one tile and which
the cost model charges (padded flops, masked lanes), take every power of two from 16 up to the
padded extent (at most 256); K and H, held whole or in a few chunks, the whole dimension padded
to a power of two (up to 256) or a smaller power of two that pads it by less than 5% (MCFuser's
Rule 3), not a second product more than ``NARROW_H`` times narrower than the key block (it spills).
Shared memory (Rule 4, MCFuser Eq. 1): the five tiles a program touches (A bm×bk,
B bk×bn, C bm×bn, D bn×bh, E bm×bh) within the target's per-block limit, with 20% slack for the
estimate's error.  On sm_90, a tile class Triton 3.6 compiles to wrong values (measured on an
H200: ``miscompiled``) is left out.  The ranking (``families/chain``) times each with
``cost/work.py``.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from ...codegen.kernel import TMA_ARCH, pow2
from ...cost.dot import wgmma
from ...cost.target import Target

SIZES = (16, 32, 64, 128, 256)
MAX_PADDING = 0.05
SMEM_SLACK = 1.2
WARPS = (4, 8)
STAGES = (1, 2, 3)
# a second product NARROW_H or more times narrower than the key block spills: sm_90 binaries (Triton
# 3.9) of BM=16 decode attention at BH=16 hold 85, 145 and 255+ registers (spilling) for BN=64,
# 128, 256, whatever the warps; at BH=32, 61-104 (the register model does not see it)
NARROW_H = 8
MIN_SPLIT_KEYS = 64     # keys per split at least (fewer: the combine's traffic outweighs the split)
SPLIT_WAVES = 4         # splits stop once the grid holds this many waves of the SMs


@dataclass(frozen=True)
class ChainShape:
    batch: int
    m: int
    n: int
    k: int
    h: int
    itemsize: int               # element bytes of the operands


@dataclass(frozen=True)
class ChainTile:
    bm: int
    bn: int
    bk: int                              # >= K: K whole (one chunk)
    bh: int                              # >= H: H whole in the program
    warps: int
    stages: int
    tma: bool = False                    # whole input tiles through tensor descriptors (sm_90 on)
    split: int = 1                       # key ranges across programs (flash-decoding), then a combine
    in_launch: bool = False              # the combine run by the last split of each tile to finish
    ws: bool = False                     # the key loop warp-specialized (``Kernel.specialized``): a
                                         # producer warp group copying the key and value tiles beside
                                         # two consumer groups of BM / 2 rows (the gemm family's
                                         # ``GemmTile.ws``); not in ``chain_tiles`` until measured

    def key(self) -> tuple:
        return (self.bm, self.bn, self.bk, self.bh, self.warps, self.stages, self.tma, self.split,
                self.in_launch) + ((True,) if self.ws else ())

    def __str__(self) -> str:
        return (f"BM={self.bm} BN={self.bn} BK={self.bk} BH={self.bh} warps={self.warps} stages={self.stages}"
                + (" TMA" if self.tma else "") + (f" split={self.split}" if self.split > 1 else "")
                + (" in one launch" if self.in_launch else "") + (" warp-specialized" if self.ws else ""))


def chain_tiles(s: ChainShape, target: Target, tensor_cores: bool = True, splittable: bool = False,
                plain: bool = False) -> list[ChainTile]:
    """Every tile of the space (module docstring), sizes × warps × stages; through tensor
    descriptors on sm_90 where the dots run on tensor cores (``tensor_cores``; off them a
    descriptor tile is pulled from shared memory into registers) and the tile loops over keys or
    K; with ``splittable`` (a key loop without bounds: ``template.splittable``), the tiles whose
    grid leaves SMs idle also with the keys split (``split_counts``), the splits combined by a
    second kernel or in the same launch; in a ``plain`` chain (no softmax) only those that keep H
    whole: a split there is the way to more programs that does not recompute the first product
    per H tile, and splitting H as well would (the space stays near its unsplit size)."""
    out = []
    tma = target.arch >= TMA_ARCH and tensor_cores
    for bm, bn, bk, bh in itertools.product(streamed_sizes(s.m), streamed_sizes(s.n), held_sizes(s.k), held_sizes(s.h)):
        smem = s.itemsize * (bm * bk + bk * bn + bm * bn + bn * bh + bm * bh)
        if smem <= SMEM_SLACK * target.smem_per_block and bh * NARROW_H >= bn:
            programs = s.batch * -(-s.m // bm) * -(-s.h // bh)
            split = splittable and not (plain and bh < s.h)
            splits = (1,) + (split_counts(s.n, bn, programs, target.sm_count) if split else ())
            # descriptors only where a loop streams tiles through them: the one tile a program of a
            # loopless chain loads gains nothing from a TMA copy, and on the H200 (Triton 3.6) the
            # loopless 64-row TMA kernels of MCFuser's S4/S5 returned NaN (bench/README.md)
            looped = tma and (bn < s.n or bk < s.k)
            # a loop on sm_90 is software-pipelined (issue #22): at one stage each chunk's copies
            # wait for the products before them (LLaMA's causal attention chose it, 116 plain
            # 16-byte loads and no async copy in its binary)
            out += [ChainTile(bm, bn, bk, bh, w, st, looped, k, one) for k in splits for one in _launches(k)
                    for w in WARPS for st in (STAGES[1:] if looped else STAGES)
                    if not (tensor_cores and miscompiled(s, bm, bn, bk, bh, w, st, target))]
    return out


def miscompiled(s: ChainShape, bm: int, bn: int, bk: int, bh: int, warps: int, stages: int, target: Target) -> bool:
    """A tile whose kernel Triton (3.6, the GPU machine's) compiles to wrong values on sm_90, as
    MEASURED on an H200 (2026-11-28, ``bench/gpu_chain_tiles.py``, ``bench/README.md``): on the
    wgmma path, K held whole, H split across programs and one stage (or no loop to pipeline: a
    loopless kernel's code is the same at any stage count).  MCFuser's S4 (12 x 256 x 256, d 64)
    at BM 64, BK 64, BH 32, 4 warps, 1 stage gave a relative error of 1.1 through pointers (NaN
    through descriptors, an illegal address once); BH 64, 8 warps, BK 32, BM 16 or 2 stages over
    a key loop, each alone, were right.  Why is not pinned (the PTX's fences, barriers and waits
    are in place): the whole class is left out, 8 warps too."""
    return bool(target.warpgroup_mma_rows) and wgmma(bm, warps, target) and bh < s.h and bk >= s.k \
        and (stages == 1 or bn >= s.n)


def _launches(split: int) -> tuple[bool, ...]:
    """A key split's combine as a second kernel, or in the same launch (the last split of each
    tile to finish runs it: ``template.split_in_launch``)."""
    return (False,) if split == 1 else (False, True)


def split_counts(n: int, bn: int, programs: int, sms: int) -> tuple[int, ...]:
    """Flash-decoding's splits of ``n`` keys for a grid of ``programs``: powers of two that divide
    the keys into ranges of at least ``bn`` (and ``MIN_SPLIT_KEYS``), while the grid is under
    ``SPLIT_WAVES`` waves of the ``sms``; none where the grid already fills them."""
    if programs >= sms:
        return ()
    out, k = [], 2
    while n % k == 0 and n // k >= max(bn, MIN_SPLIT_KEYS) and programs * k <= SPLIT_WAVES * sms:
        out.append(k)
        k *= 2
    return tuple(out)


def held_sizes(d: int) -> tuple[int, ...]:
    """Sizes of a dimension held whole or in a few chunks (K, H; module docstring)."""
    whole = pow2(max(d, SIZES[0]))
    keeps = (lambda t: d % t == 0) if d == pow2(d) else (lambda t: (-(-d // t) * t - d) / d < MAX_PADDING)
    return tuple(t for t in SIZES if t < whole and keeps(t)) + ((whole,) if whole <= SIZES[-1] else ())


def streamed_sizes(d: int) -> tuple[int, ...]:
    """Sizes of a dimension walked in many tiles (M, N; module docstring)."""
    whole = pow2(max(d, SIZES[0]))
    return tuple(t for t in SIZES if t <= whole)
