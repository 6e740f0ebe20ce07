"""The chain family (MCFuser): two contractions in one kernel, the intermediate kept on chip.

``E = g(f(A·B))·D``: the first contraction's tile (attention's scores ``Q·Kᵀ``, or a GEMM's output)
goes through the members between the two contractions, ``f`` (scale, additive or boolean masks,
causal predicates on the indices, ALiBi-style biases, activations), and, optionally, ``g``, the
softmax over its N axis, into the second contraction, whose reduction runs over that N axis
(attention's keys).  One program owns a row tile (and a column tile of the second contraction's N
when it is split: MCFuser's deep ``nk`` sub-tiling, the scores recomputed per column tile) and
walks N in chunks; K, the first contraction's reduction, is whole (the A tile loaded once: the
redundant-access elimination of MCFuser §2.5) or looped inside.

The softmax that fission produces (max, ``exp(x - max)``, sum, divide, and SDPA's guard of a fully
masked row) is recognized and rewritten to the online softmax (``OnlineSoftmax``): a running max
and sum per row, the accumulator rescaled by ``exp(old max - new max)`` each chunk and divided by
the sum at the end; a fully masked row keeps a running max of -inf, and its guard makes it zero,
as the reference does.  Recognition is structural: the second contraction's operand must be
``exp(score - max) × G`` with ``G`` row-only (``1/sum``, or the guard's select of it), the max must
reduce ``score`` and the sum ``exp(score - max)``.  Any other reduction between the contractions
rejects the group.

Prologues of the three operands (bias adds, head transposes, rotary embeddings, grouped-query
heads' broadcasts) are inlined into their loads, and the second contraction's epilogue is stored
through the inverse of its index map (``families/anchor.py``), as in the gemm family.

Cost: ``cost.work.work`` of the kernel the template prints (``template.py``), timed by
``cost.model.estimate``: one description of each kernel.  The tile space (``space.py``) is ranked
once per chain shape, operand types and softmax on the first body of that key (``ranked_tiles``:
the template lowered once per form, each tile bound to it); the best ``RANKED`` are then costed
on the group's own kernel.

The package: ``body.py`` (what a kernel computes: ``chain_body``), ``space.py`` (the tile space),
``template.py`` (a body and a tile as a tile-level kernel), this module (the family).
"""
from __future__ import annotations

import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

from ...analysis.classify import Category
from ...cost.dot import legacy_mma, ranking_seconds, tensor_cores
from ...cost.target import Target
from ...cost.work import work
from ..base import SCRATCH, Built, Cost, Family, Group, Schedule, Scratch, arriving
from .body import ChainBody, OnlineSoftmax, chain_body, grouped
from .space import ChainShape, ChainTile, chain_tiles
from .template import chain_kernels, splittable, unrolled_combine

TOP_K = 3
RANKED = 8                 # tiles of the cached ranking costed with a group's own prologue/epilogue


@dataclass(frozen=True)
class ChainSchedule(Schedule):
    body: ChainBody
    tile: ChainTile

    def tile_key(self) -> tuple:
        return self.tile.key()


class ChainFamily(Family):
    name = "chain"

    def schedules(self, group: Group, target: Target) -> list[ChainSchedule]:
        if group.categories.count(Category.contraction) != 2 or Category.opaque in group.categories:
            return []
        body = chain_body(group)
        if body is None:
            return []
        scheds = []
        for b in (body, grouped(body)):        # grouped-query heads packed into rows, where they are
            if b is None:
                continue
            ranked = ranked_tiles(b, target)
            # the first RANKED, and when none of them is off the wgmma path, the first that is (the
            # ranking's preference may have put it behind wgmma tiles that the group's own members
            # slow down)
            legacy = [] if any(legacy_mma(t.bm, t.warps, b.in1, target) for t in ranked[:RANKED]) else \
                [t for t in ranked[RANKED:] if legacy_mma(t.bm, t.warps, b.in1, target)][:1]
            scheds += [_schedule(b, t, target) for t in ranked[:RANKED] + tuple(legacy)]
        return _best(scheds, target)[:TOP_K]

    def kernels(self, schedule: ChainSchedule, name: str) -> tuple:
        return chain_kernels(schedule.body, schedule.tile, name)

    def build(self, schedule: ChainSchedule, name: str) -> Built:
        from ...codegen.triton import compile_kernel
        b = schedule.body
        outputs = tuple(st.tensor for st in b.stores)
        kernels = self.kernels(schedule, name)
        if schedule.tile.in_launch:          # read back: the splits' workspaces, its first scratch
            k = kernels[0]
            scratch = tuple(Scratch(k.outputs[j], j in k.counters) for j in sorted(k.workspaces | k.counters))
            n = len(outputs)
            return arriving(self.name, k, b.inputs, tuple(range(n, n + len(k.workspaces))), outputs, name, scratch)
        if len(kernels) == 1:
            run, source = compile_kernel(kernels[0])
            return Built(name, self.name, b.inputs, outputs, run, source, "triton", kernels=kernels)
        (partials, psrc), (combine, csrc) = (compile_kernel(k) for k in kernels)
        n, w = len(outputs), len(kernels[0].outputs)

        def run(ins, outs):                 # outs: the outputs, then the splits' workspaces
            partials(ins, list(outs[n:n + w]))
            combine(list(ins) + list(outs[n:n + w]), outs[:n])

        scratch = tuple(Scratch(t, False) for t in kernels[0].outputs)
        ws = tuple(SCRATCH.format(j) for j in range(w))
        return Built(name, self.name, b.inputs, outputs, run, psrc + "\n\n" + csrc, "triton", scratch,
                     kernels=kernels, wiring=((b.inputs, ws), ((*b.inputs, *ws), outputs)))



# ---------------------------------------------------------------- tiles and cost

def chain_shape(b: ChainBody) -> ChainShape:
    return ChainShape(*(b.extent(vs) for vs in (b.bvars, b.mvars, b.nvars, b.kvars, b.hvars)),
                      max(b.in1.itemsize, b.in2.itemsize))


_RANKED: OrderedDict[tuple, tuple[ChainTile, ...]] = OrderedDict()
RANKED_CACHE = 1024       # chain bodies whose ranking is kept (least recently used dropped)
_RANKED_LOCK = threading.Lock()


def ranked_tiles(b: ChainBody, target: Target) -> tuple[ChainTile, ...]:
    """Every tile of the space, fastest first as the cost model times it on this body; cached by
    value per chain shape, operand types, softmax and target (a group's other members change its
    prologue's and epilogue's traffic, not the ranking of the tiles)."""
    key = (chain_shape(b), b.in1, b.in2, b.softmax is not None, splittable(b), target)
    with _RANKED_LOCK:
        got = _RANKED.get(key)
        if got is not None:
            _RANKED.move_to_end(key)
            return got
    forms: dict = {}
    tiles = chain_tiles(chain_shape(b), target, tensor_cores(b.in1, target) and tensor_cores(b.in2, target),
                        splittable(b), plain=b.softmax is None)
    got = tuple(s.tile for s in _best([_schedule(b, t, target, _bound(b, t, forms)) for t in tiles], target))
    with _RANKED_LOCK:
        _RANKED[key] = got
        if len(_RANKED) > RANKED_CACHE:
            _RANKED.popitem(last=False)
    return got


def _best(scheds: list["ChainSchedule"], target: Target) -> list["ChainSchedule"]:
    """Feasible schedules, fastest first (a tile off the target's wgmma path ranked
    ``LEGACY_MMA_MARGIN`` slower: ``cost/dot.py``); ties go to K whole, fewer column tiles, larger
    tiles, fewer warps and stages."""
    scored = []
    for s in scheds:
        sec = Cost.of((s.work, *s.then), target).seconds
        t = s.tile
        if math.isfinite(sec):
            sec = ranking_seconds(sec, t.bm, t.warps, s.body.in1, target, 1 + len(s.then))
            kc, ht = -(-s.body.extent(s.body.kvars) // t.bk), -(-s.body.extent(s.body.hvars) // t.bh)
            scored.append(((sec, t.split, kc, ht, -t.bm * t.bn, t.warps, t.stages), s))
    scored.sort(key=lambda kv: kv[0])
    return [s for _, s in scored]


def _schedule(b: ChainBody, t: ChainTile, target: Target, kernels=None) -> ChainSchedule:
    """The schedule of one tile: the work of the kernels the template prints for it (with the
    keys split, the partials' then the combine's)."""
    first, *then = (work(k, target) for k in (kernels or chain_kernels(b, t, "chain")))
    return ChainSchedule("chain", b.group, first.programs, first, b, t, then=tuple(then))


def _bound(b: ChainBody, t: ChainTile, forms: dict) -> tuple:
    """The body's kernels for tile ``t``: lowered once per form (H split across programs or
    whole, descriptors, the key split) and bound to the tile's blocks, warps and stages (the
    combine's own)."""
    form = (t.bh < b.extent(b.hvars), t.tma, t.split, t.in_launch and unrolled_combine(t), t.in_launch)
    if form not in forms:
        forms[form] = chain_kernels(b, t, "chain")
    first, *rest = forms[form]
    return (first.bound({"BLOCK_M": t.bm, "BLOCK_N": t.bn, "BLOCK_K": t.bk, "BLOCK_H": t.bh}, t.warps, t.stages),
            *rest)


__all__ = ["ChainFamily", "ChainSchedule", "ChainBody", "ChainShape", "ChainTile", "OnlineSoftmax",
           "chain_body", "ranked_tiles"]
