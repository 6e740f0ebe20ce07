"""The gemm family (Hidet): one contraction as anchor, with fused prologues and epilogues.

The contraction ``C[batch, m, n] = Σ_k A[batch, m, k] · B[batch, n, k]`` (a GEMM, batched GEMM with
broadcast batch axes, GEMV, or a convolution read as an implicit GEMM: M = N·OH·OW, N = F,
K = C·KH·KW) is scheduled alone in a small hardware-centric space (``space.py``: block
tiles BM×BN×BK, warps, stages, group-M swizzle, split-K, a small-M path for GEMVs), then the
rest of the group is fused after scheduling (Hidet §2.5):

- **prologue**: the members the contraction reads through (transposes, reshapes, broadcasts,
  padding, elementwise scales, gathers) are inlined into its operand expressions, so they become
  the operand loads; a reduction over each of A's rows (an RMSNorm's or LayerNorm's statistics)
  runs over the program's rows before the K loop, which reads its result per row (the rows are
  read twice, on chip or from L2, and the normalized rows never written);
- **epilogue**: the members that read the contraction's value are inlined at the accumulator's
  coordinates.  Each output is stored through the inverse of the index map it reads the
  accumulator by (a permutation and reshape of the accumulator's axes: the attention heads'
  transpose is a store order, never a kernel); row reductions over N (softmax, LayerNorm,
  RMSNorm) run on the accumulator tile when the schedule holds whole rows (BN ≥ N), or in two
  phases when it does not (``TwoPhase``): every program stores the value the reductions read,
  and the last program of each row block to finish reduces the block's rows from L2 and stores
  what depends on them, in the same launch.

Rejected (cheaply, the common case): groups without exactly one two-operand contraction, with an
opaque prim, with a prologue reduction that is not per row of A (or that B reads), with a
prologue value that is also written out,
with a member that neither feeds nor reads the contraction and is a reduction or written out
(otherwise it is recomputed in the epilogue), or an epilogue that reads the accumulator at more
than one position per output element.  Contractions in integer or float64
types stay with the library.

Cost: ``cost.work.work`` of each kernel the template prints (``template.py``), timed by
``cost.model.estimate``: one description of each kernel.  The tile space (``space.py``) is ranked
once per contraction shape on the plain GEMM of that shape (``ranked_tiles``: the same template
and ``work``, without the group's prologue and epilogue); the best ``TOP_K`` are then costed on
the group's own kernels.

The package: ``body.py`` (what a kernel computes: ``gemm_body``), ``space.py`` (the tile space),
``template.py`` (a body and a tile as tile-level kernels), this module (the family: ranking,
schedules, cost, build).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from ...analysis.classify import Category
from ...cost.dot import legacy_mma, ranking_seconds
from ...cost.target import Target
from ...cost.work import kernel_seconds, work
from ...ir.dtypes import TensorType
from ...ir.expr import Load, Var
from ...ir.prim import Prim, Reduction
from ..base import SCRATCH, Built, Cost, Family, Group, Schedule, Scratch, arriving
from .body import GemmBody, TwoPhase, gemm_body
from .space import SMALL_M, GemmShape, GemmTile, tile_space
from .template import gemm_kernels, prologue_block

TOP_K = 3
# the shape's first warpgroup-MMA tiles of the fewest rows costed on a group's own kernels when its
# best do not include one: the plain GEMM's ranking puts tall tiles first, while an operand gathered
# per value (a convolution's im2col window over NCHW) or computed costs registers and shared
# memory per row (the ResNet stem: the plain ranking's 53rd tile, BM 64, models 8% faster than the
# BM 32 mma.sync tile its first three gave)
LOWEST_K = 3
LOWEST_MIN_N = 16     # (narrower products: a dot tile pads N to 16; a depthwise one is the stencil path's)


@dataclass(frozen=True)
class GemmSchedule(Schedule):
    body: GemmBody
    tile: GemmTile

    def tile_key(self) -> tuple:
        return self.tile.key()


class GemmFamily(Family):
    name = "gemm"

    def schedules(self, group: Group, target: Target) -> list[GemmSchedule]:
        cats = group.categories
        if cats.count(Category.contraction) != 1 or Category.opaque in cats:
            return []
        body = gemm_body(group)
        if body is None:
            return []
        return _best(body, ranked_tiles(body.shape, target), target)

    def kernels(self, schedule: GemmSchedule, name: str) -> tuple:
        return gemm_kernels(schedule.body, schedule.tile, name)

    def build(self, schedule: GemmSchedule, name: str) -> Built:
        from ...codegen.triton import compile_kernel
        b = schedule.body
        outputs = tuple(st.tensor for st in b.stores)
        kernels = self.kernels(schedule, name)
        scratch = tuple(Scratch(k.outputs[j], j in k.counters) for k in kernels
                        for j in sorted(k.workspaces | k.counters))
        if schedule.tile.fixup or schedule.tile.in_launch:
            # read back: the two-phase kernel's pre-reduction values (an output, or its first
            # scratch buffer), split-K's partials (its first scratch buffer)
            back = b.phases.source if schedule.tile.fixup and b.phases.source >= 0 else len(outputs)
            return arriving(self.name, kernels[0], b.inputs, (back,), outputs, name, scratch)
        if len(kernels) == 1:
            run, source = compile_kernel(kernels[0])
            return Built(name, self.name, b.inputs, outputs, run, source, "triton", kernels=kernels)
        (partials, psrc), (reduce, rsrc) = (compile_kernel(k) for k in kernels)
        n = len(outputs)

        def run(ins, outs):                 # outs: the outputs, then the partials' workspace
            partials(ins, [outs[n]])
            reduce(list(ins) + [outs[n]], outs[:n])

        work = SCRATCH.format(0)
        return Built(name, self.name, b.inputs, outputs, run, psrc + "\n\n" + rsrc, "triton", scratch,
                     kernels=kernels, wiring=((b.inputs, (work,)), ((*b.inputs, work), outputs)))


def _best(body: GemmBody, ranked: tuple[GemmTile, ...], target: Target) -> list[GemmSchedule]:
    """The ``TOP_K`` first tiles of the shape's ranking that the group's own kernels can run
    (its prologue and epilogue add registers), and when none of those is off the wgmma path, the
    first that is (the ranking's preference may have put it behind wgmma tiles that the group's
    own epilogue slows down), and likewise the first tensor-core tile over the whole K
    (``_whole_k``) and the first ``LOWEST_K`` wgmma tiles of 64 rows (``_lowest``), fastest first
    on those kernels (``_ranking``)."""
    out, forms, seen = [], {}, set()

    def take(tiles, count: int) -> None:
        got = 0
        for t in tiles:
            if (t.bb and body.prologue) or t in seen:
                continue        # (the stencil path has no prologue reductions)
            seen.add(t)
            s = _schedule(body, t, target, forms)
            sec = Cost.of((s.work, *s.then), target).seconds
            if math.isfinite(sec):
                out.append((_ranking(sec, t, body.shape, target, 1 + len(s.then)), s))
                got += 1
                if got == count:
                    return

    take(ranked, TOP_K)
    shape = body.shape
    if not any(_legacy(s.tile, shape, target) for _, s in out):
        take(_legacy_ranked(shape, target), 1)
    if target.warpgroup_mma_rows and shape.n >= LOWEST_MIN_N and not any(_lowest(s.tile, shape, target) for _, s in out):
        take(_lowest_ranked(shape, target), LOWEST_K)
    if not any(_whole_k(s.tile) for _, s in out):
        take((t for t in ranked if _whole_k(t)), 1)
    if any(s.work.serial_chunks for _, s in out):
        # a loop Triton does not pipeline (a scalar gather, ``cost/work._Walk.scalar``) waits for
        # each chunk's loads, which the plain ranking (pipelined) does not see: the tiles that
        # load the whole K at once have no chunk to wait for
        take((t for t in ranked if _one_chunk(t, shape)), TOP_K)
        take((t for t in _lowest_ranked(shape, target) if _one_chunk(t, shape)), 1)
    return [s for _, s in sorted(out, key=lambda kv: kv[0])][:TOP_K]


def _one_chunk(t: GemmTile, s: GemmShape) -> bool:
    """A tile whose programs load the whole K in one chunk."""
    return t.split == 1 and t.bk >= s.k


def _whole_k(t: GemmTile) -> bool:
    """A tensor-core tile whose programs each run the whole K loop: on a plain GEMV the split-K
    and small-M tiles can rank ahead of it, while a group's prologue (recomputed per split, or per
    row on the small-M path) and epilogue can make it the group's fastest."""
    return t.dot and t.split == 1


def _legacy(t: GemmTile, s: GemmShape, target: Target) -> bool:
    return t.dot and legacy_mma(t.bm, t.warps, s.dtype, target)


def _lowest(t: GemmTile, s: GemmShape, target: Target) -> bool:
    """A warpgroup-MMA tile of the fewest rows it takes (64 on sm_90) over the whole K."""
    return _whole_k(t) and t.bm == target.warpgroup_mma_rows and not _legacy(t, s, target)


@functools.lru_cache(maxsize=2048)
def _lowest_ranked(s: GemmShape, target: Target) -> tuple[GemmTile, ...]:
    """The shape's ranked tiles of ``_lowest`` (cached)."""
    return tuple(t for t in ranked_tiles(s, target) if _lowest(t, s, target))


@functools.lru_cache(maxsize=2048)
def _legacy_ranked(s: GemmShape, target: Target) -> tuple[GemmTile, ...]:
    """The shape's ranked tiles that miss the target's wgmma path, in order (cached)."""
    return tuple(t for t in ranked_tiles(s, target) if _legacy(t, s, target))


def _ranking(sec: float, t: GemmTile, s: GemmShape, target: Target, launches: int) -> float:
    """The seconds a tile ranks by: a tensor-core tile off the target's wgmma path ranks with its
    body ``LEGACY_MMA_MARGIN`` longer (``cost/dot.py``)."""
    return ranking_seconds(sec, t.bm, t.warps, s.dtype, target, launches) if t.dot else sec


def _schedule(body: GemmBody, tile: GemmTile, target: Target, forms: dict | None = None) -> GemmSchedule:
    """The schedule of one tile: the work of the kernels the template prints for it."""
    kernels = gemm_kernels(body, tile, "gemm") if forms is None else _bound(body, tile, forms)
    first, *then = (work(k, target) for k in kernels)
    return GemmSchedule("gemm", body.group, first.programs, first, body, tile, then=tuple(then))


@functools.lru_cache(maxsize=2048)
def ranked_tiles(s: GemmShape, target: Target) -> tuple[GemmTile, ...]:
    """Feasible tiles, fastest first by the modelled time of the plain GEMM of this shape
    (``plain_body``) as the template prints it for each tile (``_ranking``; ties: least padding,
    for a GEMV more programs up to the SMs (``_spread``), then larger tiles, fewer warps, stages
    and registers); cached by value, per shape and target."""
    body, forms = plain_body(s), {}
    scored = []
    for t in tile_space(s, target):
        sec, works = plain_seconds(body, t, target, forms)
        if math.isfinite(sec):
            mt, nt = -(-s.m // t.bm), -(-s.n // t.bn)
            padded = (t.bm * mt - s.m) * s.n + (t.bn * nt - s.n) * s.m   # wasted rows and columns
            regs = max(w.res.regs_per_thread for w in works)    # further from spilling
            key = (sec, padded, _spread(t, s, mt * nt * s.batch, target), -t.bm * t.bn, t.warps, t.stages, regs,
                   -t.bk)
            scored.append((key, t))
    scored.sort(key=lambda kv: kv[0])
    return tuple(t for _, t in scored)


def plain_seconds(body: GemmBody, t: GemmTile, target: Target, forms: dict) -> tuple[float, list]:
    """(the seconds tile ``t`` ranks by on the plain GEMM ``body``, its kernels' works)."""
    works = [work(k, target) for k in _bound(body, t, forms)]
    return _ranking(sum(kernel_seconds(w, target) for w in works), t, body.shape, target, len(works)), works


def _spread(t: GemmTile, s: GemmShape, programs: int, target: Target) -> int:
    """A tie-break: a GEMV (M up to ``SMALL_M``) whose tiles tie streams its weights at the DRAM
    rate either way, the small-M path or tensor cores (each weight read once, the row beside it
    next to nothing); over more SMs it leans less on each SM's rate, which the model does not
    bound (the H200's trace of the decode step: the gate/up projection's 44 programs, one an SM,
    ran 1.9x their modelled time).  With more rows each column tile re-reads them (BERT's M = 128:
    more programs made its persistent kernel's phases slower in the simulation): larger tiles
    first (the next key)."""
    if s.m > SMALL_M:
        return 0
    return -min(programs, target.sm_count)


def _bound(body: GemmBody, t: GemmTile, forms: dict) -> tuple:
    """The body's kernels for tile ``t``: lowered once per form (in ``forms``: what fixes the
    kernels' structure — the dot or small-M path, N split or whole, split-K's ranges, a two-phase
    kernel's row blocks, which set its counters and arrivals) and bound to the tile's blocks,
    warps, stages and swizzle (``Kernel.bound``): the kernels ``gemm_kernels`` prints for it."""
    s = body.shape
    key = (t.dot, t.bn >= s.n, (t.bm, t.bn) if t.fixup else (), t.split, t.k_range(s.k) if t.split > 1 else 0,
           t.bk if t.split > 1 else 0, t.tma, t.in_launch, bool(t.bb))
    if key not in forms:
        forms[key] = gemm_kernels(body, t, "gemm")
    first, *rest = forms[key]
    blocks = {"BLOCK_M": t.bm, "BLOCK_N": t.bn, "BLOCK_K": t.bk, "FIX_M": t.fixup, "BLOCK_B": t.bb or 1}
    if body.prologue:
        blocks["PBLOCK"] = prologue_block(body, t.bm)
    return (replace(first.bound(blocks, t.warps, t.stages), swizzle=t.swizzle), *rest)


@functools.lru_cache(maxsize=2048)
def plain_body(s: GemmShape) -> GemmBody:
    """The body of a plain GEMM of shape ``s``: ``C[b, m, n] = Σ_k A[b, m, k]·B[b, n, k]`` (no
    batch axis for a batch of one), in ``s.dtype``; with ``s.row_reduction``, ``C`` less its row
    sums (a reduction over N in the epilogue, as a LayerNorm's)."""
    dt = s.dtype
    batch = (s.batch,) if s.batch > 1 else ()
    axes = tuple(Var(f"i{j}") for j in range(len(batch) + 2))
    bi, (i, j), r = axes[:-2], axes[-2:], Var("r")
    c_type = TensorType(batch + (s.m, s.n), dt)
    types = {"A": TensorType(batch + (s.m, s.k), dt), "B": TensorType(batch + (s.n, s.k), dt), "C": c_type}
    prims = [Prim("C", ("A", "B"), axes, Load(0, bi + (i, r), dt) * Load(1, bi + (j, r), dt), c_type,
                  Reduction((r,), (s.k,), "sum"))]
    if s.row_reduction:
        types["R"] = TensorType(batch + (s.m,), dt)
        types["D"] = c_type
        prims.append(Prim("R", ("C",), bi + (i,), Load(0, bi + (i, j), dt), types["R"],
                          Reduction((j,), (s.n,), "sum")))
        prims.append(Prim("D", ("C", "R"), axes, Load(0, axes, dt) - Load(1, bi + (i,), dt), c_type))
    out = "D" if s.row_reduction else "C"
    body = gemm_body(Group(tuple(prims), ("A", "B"), (out,), types))
    if body is None or body.shape != s:
        raise ValueError(f"no plain GEMM body for {s}")
    return body


__all__ = ["GemmFamily", "GemmSchedule", "GemmBody", "GemmShape", "GemmTile", "TwoPhase", "gemm_body",
           "ranked_tiles"]
