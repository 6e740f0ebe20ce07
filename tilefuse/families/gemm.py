"""The gemm family (Hidet): one contraction as anchor, with fused prologues and epilogues.

The contraction ``C[batch, m, n] = Σ_k A[batch, m, k] · B[batch, n, k]`` (a GEMM, batched GEMM with
broadcast batch axes, GEMV, or a convolution read as an implicit GEMM: M = N·OH·OW, N = F,
K = C·KH·KW) is scheduled alone in a small hardware-centric space (``schedule/search.py``: block
tiles BM×BN×BK, warps, stages, group-M swizzle, split-K, a small-M path for GEMVs), then the
rest of the group is fused after scheduling (Hidet §2.5):

- **prologue**: the members the contraction reads through (transposes, reshapes, broadcasts,
  padding, elementwise scales, gathers) are inlined into its operand expressions, so they become
  the operand loads;
- **epilogue**: the members that read the contraction's value are inlined at the accumulator's
  coordinates.  Each output is stored through the inverse of the index map it reads the
  accumulator by (a permutation and reshape of the accumulator's axes: the attention heads'
  transpose is a store order, never a kernel); row reductions over N (softmax, LayerNorm,
  RMSNorm) run on the accumulator tile when the schedule holds whole rows (BN ≥ N), or in two
  phases when it does not (``TwoPhase``): every program stores the value the reductions read,
  and the last program of each row block to finish reduces the block's rows from L2 and stores
  what depends on them, in the same launch.

Rejected (cheaply, the common case): groups without exactly one two-operand contraction, with a
reduction or an opaque prim in the prologue, with a prologue value that is also written out,
with a member that neither feeds nor reads the contraction and is a reduction or written out
(otherwise it is recomputed in the epilogue), or an epilogue that reads the accumulator at more
than one position per output element.  Contractions in integer or float64
types stay with the library.

Cost: ``cost.model.estimate`` over the schedule's work: tensor-core flops of the padded tiles at
the rate the tile sustains (shared-memory bandwidth bounds small tiles: ``tile_rate``), operand
panels requested through L2 once per tile row/column, DRAM re-reads only where the operands do
not stay in L2 (the swizzle window sets how often: ``dram_rereads``), epilogue inputs and outputs
once, occupancy from the accumulator's registers and the stages' shared memory.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..analysis.classify import Category, contraction_operands
from ..analysis.inline import Inliner, Instance
from ..cost.model import Work, estimate, expr_flops
from ..cost.target import Target
from ..ir.dtypes import DType
from ..ir.expr import Cast, Expr, Load, Var, free_vars, substitute, transform, walk
from ..schedule.search import (GemmShape, GemmTile, core_work, dram_rereads, fixup_work, ranked_tiles,
                               split_reduction)
from ..cost.tiles import load_sites, site_elems, tile_box
from .anchor import AccStore, acc_at, acc_reads, dot_operands, downstream, epilogue_store, split_operands, upstream
from .base import Built, Cost, Family, Group, Schedule

DOT_DTYPES = (DType.float16, DType.bfloat16, DType.float32)
TOP_K = 3
MAX_EXPR_NODES = 4000


@dataclass(frozen=True)
class TwoPhase:
    """A row-reducing epilogue split for tiles that do not hold whole rows: every program stores
    ``pre`` (the value the row reductions and the late stores read the accumulator through, e.g.
    ``acc + bias + residual`` before a LayerNorm) and the early stores; the last program of each
    row block re-reads ``pre`` over the block's rows, reduces them and makes the late stores."""
    pre: Expr                     # over the accumulator's variables, reading it as Load(acc, ())
    source: int                   # the store whose value is ``pre`` at the accumulator's own
                                  # coordinates (re-read from that output), or -1: a workspace
    early: tuple[int, ...]        # stores reading no row reduction (indices into ``stores``)
    late: tuple[int, ...]


@dataclass(frozen=True)
class GemmBody:
    """What a gemm kernel computes, before tile sizes are chosen."""
    group: Group
    anchor: str                              # the contraction
    inputs: tuple[str, ...]                  # kernel input slots; the accumulator is slot len(inputs)
    avars: tuple[Var, ...]                   # the accumulator's variables, one per output dim
    bvars: tuple[Var, ...]                   # batch axes (one program per batch position)
    mvars: tuple[Var, ...]
    nvars: tuple[Var, ...]
    kvars: tuple[Var, ...]
    ext: dict                                # Var -> extent, for every variable above
    a: Expr                                  # operand A over batch, m and k variables
    b: Expr                                  # operand B over batch, k and n variables
    in_dtype: DType                          # the dot's operand type
    out_dtype: DType                         # the contraction's: the accumulator is rounded to it
    instances: tuple[Instance, ...]          # epilogue row reductions over N (their reduced vars are nvars)
    stores: tuple[AccStore, ...]
    phases: TwoPhase | None = None           # how the epilogue splits when rows span tiles

    @property
    def acc(self) -> int:
        return len(self.inputs)

    @property
    def acc_shape(self) -> tuple[int, ...]:
        return tuple(self.ext[v] for v in self.avars)

    @property
    def shape(self) -> GemmShape:
        e = self.ext
        prod = lambda vs: math.prod(e[v] for v in vs)  # noqa: E731
        return GemmShape(prod(self.bvars), prod(self.mvars), prod(self.nvars), prod(self.kvars), self.in_dtype,
                         bool(self.instances))


@dataclass(frozen=True)
class GemmSchedule(Schedule):
    body: GemmBody
    tile: GemmTile
    tail: Work | None = None      # a two-phase schedule's fixup (``work`` is the tiles' phase)

    def requested_bytes(self) -> float:
        """Plus the fixup's, or the split-K reduction's reads of the partials."""
        s = self.body.shape
        partials = self.tile.split * s.batch * s.m * s.n * 4 if self.tile.split > 1 else 0
        return self.work.requested_bytes + (self.tail.requested_bytes if self.tail else partials)

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
        return [_schedule(body, t, target) for t in ranked_tiles(body.shape, target)[:TOP_K]]

    def cost(self, schedule: GemmSchedule, target: Target, cuda_graph: bool = False) -> Cost:
        """The kernel's modelled cost; with split-K, plus the reduction kernel's; in two phases,
        plus the tail (in the same launch)."""
        cost = Cost.modelled(schedule.work, target, cuda_graph)
        second = split_reduction(schedule.body.shape, schedule.tile, target)
        if second is not None:
            extra = estimate(second, target, cuda_graph=cuda_graph).seconds
        elif schedule.tail is not None:
            second = schedule.tail
            extra = estimate(second, target, cuda_graph=cuda_graph).body
        else:
            return cost
        return replace(cost, seconds=cost.seconds + extra, bytes=cost.bytes + int(second.dram_bytes),
                       l2_bytes=cost.l2_bytes + int(second.l2_bytes))

    def build(self, schedule: GemmSchedule, name: str) -> Built:
        from ..codegen.gemm import gemm_kernels
        from ..codegen.triton import compile_kernel
        b = schedule.body
        outputs = tuple(st.tensor for st in b.stores)
        kernels = gemm_kernels(schedule, name)
        if schedule.tile.fixup:
            return self._two_phase(kernels[0], b, outputs, name)
        if len(kernels) == 1:
            run, source = compile_kernel(kernels[0])
            return Built(name, self.name, b.inputs, outputs, run, source, "triton")
        (partials, psrc), (reduce, rsrc) = (compile_kernel(k) for k in kernels)
        ws = kernels[0].outputs[0]

        def run(ins, outs):
            import torch
            scratch = torch.empty(ws.shape, dtype=torch.float32, device=outs[0].device)
            partials(ins, [scratch])
            reduce(list(ins) + [scratch], outs)

        return Built(name, self.name, b.inputs, outputs, run, psrc + "\n\n" + rsrc, "triton")

    def _two_phase(self, kernel, b: GemmBody, outputs, name: str) -> Built:
        """The two-phase kernel's launcher: its pre-reduction values go to a workspace allocated
        per call (or are read back from the output holding them); its row-block counters are
        zeroed once per device and calling thread (calls from two threads never share them) and
        left at zero by every launch (reset after a failed one)."""
        import threading

        import torch

        from ..codegen.triton import compile_kernel
        launch, source = compile_kernel(kernel)
        source_out = b.phases.source
        ws = kernel.inputs[-1]
        ngroups = kernel.outputs[-1].shape[0]
        counters: dict = {}

        def run(ins, outs):
            dev = outs[0].device
            key = (dev, threading.get_ident())
            if key not in counters:
                counters[key] = torch.zeros(ngroups, dtype=torch.int32, device=dev)
            if source_out < 0:
                pre = torch.empty(ws.shape, dtype=ws.dtype.to_torch(), device=dev)
                extra = [pre]
            else:
                pre, extra = outs[source_out], []
            try:
                launch(list(ins) + [pre], list(outs) + extra + [counters[key]])
            except BaseException:
                counters[key].zero_()
                raise

        return Built(name, self.name, b.inputs, outputs, run, source, "triton")


# ---------------------------------------------------------------- the body

def gemm_body(group: Group) -> GemmBody | None:
    """The group as one contraction with its prologue and epilogue, or None (see the module doc)."""
    members = group.members
    conts = [p for p, cat in zip(group.prims, group.categories) if cat is Category.contraction]
    if len(conts) != 1:
        return None
    (c,) = conts
    ops = contraction_operands(c)
    if ops is None or c.out.dtype not in DOT_DTYPES or c.out.numel == 0 or 0 in c.reduce.extents:
        return None     # empty: nothing to tile (an empty K is the library's zeros)
    pro = upstream(c, members)
    if any(members[n].reduce is not None for n in pro) or any(n in group.outputs for n in pro):
        return None
    epi = [p for p in group.prims if p.name not in pro and p is not c]
    down = downstream(c, members)
    # a member neither feeding nor reading the contraction is recomputed where the epilogue reads
    # it (``relu(v)`` in ``x @ w + relu(v)``): injective, and not written out
    if any(p.name not in down and (p.reduce is not None or p.name in group.outputs) for p in epi):
        return None
    avars = tuple(Var(f"a{j}") for j in range(c.out.rank))
    kvars = tuple(Var(f"k{j}") for j in range(len(c.reduce.axes)))
    pos = {v: j for j, v in enumerate(c.axes)}
    bvars, mvars, nvars = (tuple(avars[pos[v]] for v in vs) for vs in ops)
    ext = dict(zip(avars, c.out.shape)) | dict(zip(kvars, c.reduce.extents))

    # prologue: the operands, with every member the contraction reads through inlined
    inl = Inliner({n: members[n] for n in pro}, group.inputs)
    body = inl.resolve(c, dict(zip(c.axes, avars)) | dict(zip(c.reduce.axes, kvars)))
    if inl.instances:
        return None
    operands = split_operands(body, set(bvars) | set(mvars) | set(kvars), set(bvars) | set(nvars) | set(kvars),
                         set(mvars), set(nvars))
    if operands is None:
        return None
    dt = c.out.dtype
    a, b, in_dt = dot_operands(*operands, dt)

    # epilogue: every output at the accumulator's coordinates
    acc = len(group.inputs)
    # (an epilogue may read a prologue value too: it is recomputed there from the inputs)
    einl = Inliner({p.name: p for p in group.prims if p is not c}, group.inputs + (c.name,))
    stores: list[AccStore] = []
    for o in group.outputs:
        if o == c.name:
            stores.append(AccStore(o, avars, Load(acc, (), dt)))
            continue
        st = epilogue_store(members[o], einl, acc, c, avars, ext)
        if st is None:
            return None
        stores.append(st)
    instances = _row_reductions(einl, acc, avars, nvars, ext, dt)
    if instances is None:
        return None
    size = sum(1 for s in stores for _ in walk(s.value)) + sum(1 for i in instances for _ in walk(i.body))
    if size > MAX_EXPR_NODES:
        return None
    return GemmBody(group, c.name, group.inputs, avars, bvars, mvars, nvars, kvars, ext, a, b, in_dt, dt, instances,
                    tuple(stores), _two_phase(instances, stores, acc, avars, dt) if instances else None)


def _row_reductions(einl: Inliner, acc: int, avars, nvars, ext, c_dtype: DType) -> tuple[Instance, ...] | None:
    """The epilogue's reductions, each over the accumulator's N axes for a fixed row, with its
    reduced variables renamed to the N variables (so they run on the accumulator tile); None when
    one is not such a row reduction."""
    out = []
    nset = set(nvars)
    for inst in einl.instances:
        if len(inst.rvars) != len(nvars) or any(free_vars(e) & nset for e in inst.index):
            return None
        reads = acc_reads(inst.body, acc)
        rename: dict[Var, Var] = {}
        for idx in reads:
            for e, a in zip(idx, avars):
                if a in nset:
                    if not isinstance(e, Var) or e not in inst.rvars or rename.get(e, a) is not a:
                        return None
                    rename[e] = a
                elif e is not a:
                    return None
        if len(rename) != len(nvars) or tuple(rename.get(r) for r in inst.rvars) != nvars:
            return None
        body = acc_at(substitute(inst.body, rename), acc, tuple(avars), c_dtype, {})
        out.append(Instance(inst.slot, inst.prim, inst.index, body, nvars, tuple(ext[v] for v in nvars),
                            inst.combiner, inst.dtype))
    return tuple(out)


def _two_phase(instances, stores, acc: int, avars, dt: DType) -> TwoPhase:
    """Where a row-reducing epilogue splits (``TwoPhase``): ``pre`` is the largest expression of
    the accumulator that every read of it by the reductions and the late stores goes through
    (the accumulator itself at worst)."""
    slots = {i.slot for i in instances}
    tile = Load(acc, (), dt)
    memo: dict[int, bool] = {}

    def reduced(e: Expr) -> bool:         # reads a row reduction
        got = memo.get(id(e))
        if got is None:
            got = memo[id(e)] = (isinstance(e, Load) and e.tensor in slots) or any(reduced(c) for c in e.children())
        return got

    late = tuple(j for j, st in enumerate(stores) if reduced(st.value))
    early = tuple(j for j in range(len(stores)) if j not in late)
    values = [i.body for i in instances] + [stores[j].value for j in late]
    tops: list[Expr] = []                # maximal subexpressions reading the accumulator, no reduction

    def collect(e: Expr) -> None:
        if not reduced(e):
            if any(x is tile for x in walk(e)):
                tops.append(e)
            return
        for c in e.children():
            collect(c)

    for v in values:
        collect(v)
    common = None
    for t in tops:
        subs = {x for x in walk(t) if any(y is tile for y in walk(x))}
        common = subs if common is None else common & subs
    pre = tile
    for e in sorted(common or (), key=lambda x: -sum(1 for _ in walk(x))):
        mark = Load(-1, (), e.dtype)
        if all(not any(x is tile for x in walk(transform(v, lambda n: mark if n is e else None)))
               for v in values):
            pre = e
            break
    while isinstance(pre, Cast) and pre.x.dtype in (DType.float16, DType.bfloat16) and pre.dtype is DType.float32:
        pre = pre.x                       # store the 16-bit value: widening it again is exact
    source = next((j for j in early if stores[j].index == tuple(avars) and stores[j].value is pre), -1)
    return TwoPhase(pre, source, early, late)


# ---------------------------------------------------------------- cost

def _schedule(body: GemmBody, tile: GemmTile, target: Target) -> GemmSchedule:
    """The schedule of one tile: the work the kernel does, as the cost model times it."""
    g = body.group
    s = body.shape
    a_in, b_in = _input_bytes(body.a, g), _input_bytes(body.b, g)
    elems = s.batch * s.m * s.n
    ph = body.phases if tile.fixup else None
    stores = [body.stores[j] for j in ph.early] if ph else list(body.stores)
    values = [st.value for st in stores] + ([ph.pre] if ph else [])
    flops = sum(expr_flops(v) for v in values) * elems
    if not ph:
        values += [i.body for i in body.instances]
        flops += sum(expr_flops(i.body) + 1 for i in body.instances) * elems
    # the prologue's arithmetic runs on every operand element each program loads
    flops += expr_flops(body.a) * s.batch * s.m * s.k * -(-s.n // tile.bn)
    flops += expr_flops(body.b) * s.batch * s.n * s.k * -(-s.m // tile.bm)
    pre = elems * ph.pre.dtype.itemsize if ph else 0
    work = core_work(s, tile, target, a_bytes=a_in, b_bytes=b_in,
                     a_panel=_panel_bytes(body.a, body, body.mvars, tile.bm, s.m / -(-s.m // tile.bm), tile.bk,
                                          target),
                     b_panel=_panel_bytes(body.b, body, body.nvars, tile.bn, s.n / -(-s.n // tile.bn), tile.bk,
                                          target),
                     rereads=dram_rereads(s, tile, a_in + b_in, target),
                     extra_dram=_read_bytes(values, body, target) + _written(stores, g), extra_flops=flops,
                     scratch=pre if ph and ph.source < 0 else 0)
    tail = None
    if ph:
        late = [body.stores[j] for j in ph.late]
        stored = Load(len(body.inputs), tuple(body.avars), ph.pre.dtype)    # re-read, not recomputed
        values = [transform(v, lambda n: stored if n is ph.pre else None)
                  for v in [st.value for st in late] + [i.body for i in body.instances]]
        groups = s.batch * -(-s.m // tile.bm)
        tail = fixup_work(s, tile, target, read=pre, written=_written(late, g),
                          inputs=_read_bytes(values, body, target, per_row_block=groups),
                          flops=(sum(expr_flops(v) for v in values) + len(body.instances)) * elems)
    return GemmSchedule("gemm", g, work.programs, work, body, tile, tail)


def _panel_bytes(operand: Expr, body: GemmBody, own: tuple, block: int, rows: float, bk: int,
                 target: Target) -> float:
    """Bytes one program's loads of an operand move over its K loop: each load site's box
    (Welder's propagation through the site's index map, coalesced into sectors, a padded window
    at its in-bounds share) over one K chunk (``bk`` positions of K, row-major over its variables)
    and the program's ``block`` of its own M or N positions, times the K chunks; a box of rows is
    scaled to ``rows``, the in-bounds rows of a program on average (masked rows move nothing).
    A convolution's window is the union of its taps (a 3×3 tile reads each input row once, not
    three times) and a strided one's box spans the gaps between the elements it reads."""
    types = body.group.types
    ext = body.ext
    kext = [ext[v] for v in body.kvars]
    k = math.prod(kext)
    full = {v: (0, n - 1) for v, n in ext.items()}
    ranges = dict(full) | {v: (0, 0) for v in body.bvars}
    for vs, n in ((own, block), (body.kvars, min(bk, k))):
        ranges |= {v: (0, e - 1) for v, e in tile_box(vs, [ext[v] for v in vs], n).items()}
    own_rows = min(block, math.prod(ext[v] for v in own))
    # the K positions one chunk's box covers (whole rows of K's inner variables: at least BK);
    # the loop covers K of them, so the boxes are charged K / covered times (a ragged last chunk)
    covered = math.prod(ranges[v][1] + 1 for v in body.kvars)
    kset, oset = set(body.kvars), set(own)
    total = 0.0
    for site in load_sites([operand], body.acc):
        used = set().union(*(free_vars(i) for i in site.load.index)) if site.load.index else set()
        t = types[body.inputs[site.load.tensor]]
        moved = site_elems(site, ranges, t, target, full) * t.dtype.itemsize
        moved *= (k / covered if used & kset else 1) * (rows / own_rows if used & oset else 1)
        total += moved
    return total


def _input_bytes(operand: Expr, g: Group) -> int:
    slots = {ld.tensor for ld in walk(operand) if isinstance(ld, Load)}
    return sum(g.types[g.inputs[t]].nbytes for t in slots if t < len(g.inputs))


def _read_bytes(values, body: GemmBody, target: Target, per_row_block: int = 0) -> float:
    """Bytes the loads of the epilogue ``values`` move over the accumulator's whole range (each
    load site's box, coalesced: a bias its N elements, a gathered embedding the rows gathered);
    with ``per_row_block`` (row blocks), what one row block moves: a load indexed by M rows its
    share, any other all of its box."""
    g = body.group
    full = {v: (0, n - 1) for v, n in body.ext.items()}
    mset = set(body.mvars)
    total = 0.0
    for site in load_sites(values, len(g.inputs)):
        t = g.types[g.inputs[site.load.tensor]]
        moved = site_elems(site, full, t, target, full) * t.dtype.itemsize
        if per_row_block and any(free_vars(i) & mset for i in site.load.index):
            moved /= per_row_block
        total += moved
    return total


def _written(stores, g: Group) -> int:
    return sum(g.types[st.tensor].nbytes for st in stores)


__all__ = ["GemmFamily", "GemmSchedule", "GemmBody", "gemm_body"]
