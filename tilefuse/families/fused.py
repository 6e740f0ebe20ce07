"""The fused family: memory-bound prims in one kernel (Welder's tile graph, Inductor-style rows).

A group is *inlined* into per-output expressions over the iteration space of an anchor output
(the largest one): every member prim that is not a reduction is substituted into its consumers
through its index map, so layout prims become index arithmetic on loads and stores.  Each use of a
member reduction becomes a *reduction instance*: the reduction's own body evaluated at the index
where it is used, producing one value per row.  The anchor's axes split into row axes X (those the
instances are indexed by) and inner axes; one program handles XBLOCK consecutive rows, runs a loop
per reduction instance over its reduced extent in chunks of RBLOCK (one pass if RBLOCK covers it:
a persistent reduction), then a loop over the inner axes computing and storing the outputs.

Outputs other than the anchor must be reachable from the anchor's space by an injective index
map (a permutation/projection of its axes), or have the anchor's shape; otherwise the group is
rejected, as are nested reductions (a reduction used inside another's reduced loop).  Rejection is
the common case and is cheap.

Traffic per program follows Welder: the bounding box each load touches over the program's tile,
with the coalescing penalty of ``cost.model.coalesced_elems``; inputs that fit in half of L2 are
counted once (broadcast weights such as LayerNorm's gamma are served from L2 after the first read).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from ..analysis.classify import Category
from ..analysis.index import bounds
from ..cost.model import coalesced_elems, expr_flops, kernel_seconds
from ..cost.target import Target
from ..ir.dtypes import DType
from ..ir.expr import Const, Expr, Load, Var, free_vars, transform, walk
from ..ir.prim import Prim
from .base import Cost, Group, Schedule

MAX_EXPR_NODES = 4000          # beyond this, inlining has blown up (stencils of stencils): reject
MAX_TILE_ELEMS = 8192          # XBLOCK·RBLOCK values live per program (registers)
MAX_PERSISTENT = 4096          # largest reduced/inner extent held whole in one program
XBLOCKS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
RBLOCKS = (64, 256, 1024)          # chunk sizes of looped reductions (persistent: next_pow2(extent))


@dataclass(frozen=True)
class Instance:
    """One use of a member reduction: its body at a row-dependent index, reduced per row."""
    slot: int                     # referenced in kernel expressions as Load(slot, (), dtype)
    prim: str
    index: tuple[Expr, ...]       # where the reduction's output is read, over anchor row vars
    body: Expr                    # over row vars and ``rvars``; loads use kernel input slots/instances
    rvars: tuple[Var, ...]
    rext: tuple[int, ...]
    combiner: str
    dtype: DType


@dataclass(frozen=True)
class Store:
    tensor: str
    index: tuple[Expr, ...]       # over anchor vars
    value: Expr                   # over anchor vars
    mask_vars: tuple[Var, ...]    # store only where these anchor vars are 0 (duplicates elsewhere)
    row_only: bool                # value and index depend on row vars only


@dataclass(frozen=True)
class FusedSchedule(Schedule):
    anchor: str
    inputs: tuple[str, ...]                 # kernel input slots
    xvars: tuple[Var, ...]
    xext: tuple[int, ...]
    ivars: tuple[Var, ...]
    iext: tuple[int, ...]
    instances: tuple[Instance, ...]
    stores: tuple[Store, ...]
    xblock: int
    rblock: int
    bytes: int
    flops: int

    @property
    def persistent(self) -> bool:
        return self.rblock >= _loop_max(self.instances, self.iext)


def _loop_max(instances, iext) -> int:
    return max([math.prod(iext)] + [math.prod(i.rext) for i in instances])


class _Inliner:
    def __init__(self, group: Group):
        self.group = group
        self.member: Mapping[str, Prim] = group.members
        self.in_slot = {n: k for k, n in enumerate(group.inputs)}
        self.instances: list[Instance] = []
        self.inst_key: dict[tuple, int] = {}
        self.pending: set[tuple] = set()        # instances whose bodies are being inlined
        self.refs: dict[str, list[tuple[Expr, ...]]] = {}   # member -> indices it was used at
        self.memo: dict[tuple, Expr] = {}

    def value_at(self, name: str, idx: tuple[Expr, ...]) -> Expr:
        key = (name, idx)
        got = self.memo.get(key)
        if got is not None:
            return got
        p = self.member[name]
        self.refs.setdefault(name, []).append(idx)
        if p.reduce is not None:
            out = self._instance(p, idx)
        else:
            out = self._resolve(p, dict(zip(p.axes, idx)))
        self.memo[key] = out
        return out

    def _resolve(self, p: Prim, mapping: Mapping[Var, Expr]) -> Expr:
        """p's body with its variables replaced by ``mapping`` and its loads made kernel-level.

        One bottom-up pass does both, so index expressions coming in through ``mapping`` (already
        kernel-level, possibly with data-dependent loads) are never re-read in p's slot numbering.
        """
        def fn(n: Expr):
            if isinstance(n, Var):
                return mapping.get(n)
            if not isinstance(n, Load):
                return None
            src = p.inputs[n.tensor]
            if src in self.member:
                return self.value_at(src, n.index)
            return Load(self.in_slot[src], n.index, n.dtype)
        return transform(p.body, fn)

    def _instance(self, p: Prim, idx: tuple[Expr, ...]) -> Expr:
        key = (p.name, idx)
        if key not in self.inst_key:
            tag = len(self.inst_key) + len(self.pending)
            self.pending.add(key)
            rvars = tuple(Var(f"r{tag}_{k}") for k in range(len(p.reduce.axes)))
            mapping = dict(zip(p.axes, idx))
            mapping.update(zip(p.reduce.axes, rvars))
            body = self._resolve(p, mapping)  # registers the instances it uses first
            self.pending.discard(key)
            slot = len(self.group.inputs) + len(self.instances)
            self.inst_key[key] = slot
            self.instances.append(Instance(slot, p.name, idx, body, rvars, p.reduce.extents, p.reduce.combiner,
                                           p.out.dtype))
        slot = self.inst_key[key]
        return Load(slot, (), p.out.dtype)


def _injective_store(idx: tuple[Expr, ...], shape: tuple[int, ...], ext: Mapping[Var, int]):
    """Vars used if idx maps them injectively onto the whole tensor (else None)."""
    used = []
    for e, n in zip(idx, shape):
        if isinstance(e, Const):
            if e.value != 0 or n != 1:
                return None
        elif isinstance(e, Var) and e in ext and e not in used and ext[e] == n:
            used.append(e)
        else:
            return None
    return tuple(used)


class FusedFamily:
    name = "fused"

    def schedule(self, group: Group, target: Target) -> FusedSchedule | None:
        cats = group.categories
        # A contraction is the library's (or a gemm family's) unless it stands alone: then a fused
        # kernel is the fallback that makes every single prim buildable.
        if Category.opaque in cats or (Category.contraction in cats and len(cats) > 1):
            return None
        built = _build(group)
        if built is None:
            return None
        best = None
        for xb, rb in _tile_options(built):
            sched = _with_tile(built, xb, rb, target)
            t = _seconds(sched, target)
            if best is None or t < best[0]:
                best = (t, sched)
        return None if best is None else best[1]

    def cost(self, sched: FusedSchedule, target: Target) -> Cost:
        return Cost(_seconds(sched, target), sched.bytes, sched.flops, sched.blocks)


def _seconds(s: FusedSchedule, target: Target) -> float:
    return kernel_seconds(s.bytes, s.flops, target.peak(DType.float32, False), s.blocks, target)


@dataclass(frozen=True)
class _Built:
    group: Group
    anchor: str
    inputs: tuple[str, ...]
    xvars: tuple[Var, ...]
    xext: tuple[int, ...]
    ivars: tuple[Var, ...]
    iext: tuple[int, ...]
    instances: tuple[Instance, ...]
    stores: tuple[Store, ...]


def _build(group: Group) -> _Built | None:
    outs = [group.members[o] for o in group.outputs]
    order = {p.name: k for k, p in enumerate(group.prims)}
    anchor = max(outs, key=lambda p: (p.out.numel, order[p.name]))
    avars = tuple(Var(f"a{k}") for k in range(anchor.out.rank))
    ext = dict(zip(avars, anchor.out.shape))
    inl = _Inliner(group)
    values = {anchor.name: inl.value_at(anchor.name, avars)}
    stores_idx = {anchor.name: avars}
    for o in outs:
        if o.name == anchor.name:
            continue
        for idx in inl.refs.get(o.name, []):
            if _injective_store(idx, o.out.shape, ext) is not None:
                stores_idx[o.name] = idx
                values[o.name] = inl.value_at(o.name, idx)
                break
        else:
            if o.out.shape != anchor.out.shape:
                return None
            stores_idx[o.name] = avars
            values[o.name] = inl.value_at(o.name, avars)
    rvar_names = {v for inst in inl.instances for v in inst.rvars}
    xset: set[Var] = set()
    for inst in inl.instances:
        for e in inst.index:
            fv = free_vars(e)
            if fv & rvar_names:
                return None  # nested reduction
            xset |= fv
    if not inl.instances:
        xset = set(avars)
    xvars = tuple(v for v in avars if v in xset)
    ivars = tuple(v for v in avars if v not in xset)
    stores = []
    for o in outs:
        idx = stores_idx[o.name]
        used = _injective_store(idx, o.out.shape, ext)
        if used is None:
            return None
        val = values[o.name]
        deps = set(used) | (free_vars(val) & set(avars))
        mask = tuple(v for v in avars if v not in deps)
        row_only = not (deps & set(ivars))
        stores.append(Store(o.name, idx, val, mask, row_only))
    size = sum(1 for s in stores for _ in walk(s.value)) + sum(1 for i in inl.instances for _ in walk(i.body))
    if size > MAX_EXPR_NODES:
        return None
    return _Built(group, anchor.name, group.inputs, xvars, tuple(ext[v] for v in xvars), ivars,
                  tuple(ext[v] for v in ivars), tuple(inl.instances), tuple(stores))


def _tile_options(b: _Built):
    xn = math.prod(b.xext)
    loop = _loop_max(b.instances, b.iext)
    if loop <= 1:
        rbs = [1]
    else:
        full = 1 << (loop - 1).bit_length()
        rbs = [r for r in RBLOCKS if r < full and r <= 1024] + ([full] if full <= MAX_PERSISTENT else [])
    xcap = 1 << max(xn - 1, 0).bit_length()
    for rb in rbs:
        for xb in XBLOCKS:
            if xb * rb <= MAX_TILE_ELEMS and xb <= xcap and (xb * rb >= 128 or xb == xcap):
                yield xb, rb


def _tile_box(vars_: tuple[Var, ...], ext: tuple[int, ...], block: int) -> dict[Var, int]:
    """Extent each var covers when ``block`` consecutive row-major positions are taken."""
    box, left = {}, block
    for v, n in zip(reversed(vars_), reversed(ext)):
        take = min(n, max(left, 1))
        box[v] = take
        left = -(-left // n) if left > n > 0 else 1
    return box


def _load_elems(ld: Load, ranges: Mapping[Var, tuple[int, int]], shape, itemsize: int,
                target: Target) -> float:
    sub = []
    for e, n in zip(ld.index, shape):
        if any(isinstance(x, Load) for x in walk(e)):
            # data-dependent: at most one distinct row per point of the index's own box
            pts = math.prod(ranges[v][1] - ranges[v][0] + 1 for v in free_vars(e) if v in ranges)
            sub.append(min(n, pts))
            continue
        lo, hi = bounds(e, ranges)
        lo, hi = max(lo, 0), min(hi, n - 1)
        sub.append(max(hi - lo + 1, 0))
    return coalesced_elems(tuple(sub), tuple(shape), itemsize, target)


def _with_tile(b: _Built, xb: int, rb: int, target: Target) -> FusedSchedule:
    g = b.group
    xn = math.prod(b.xext)
    programs = -(-xn // xb)
    xbox = _tile_box(b.xvars, b.xext, xb)
    ranges: dict[Var, tuple[int, int]] = {v: (0, xbox[v] - 1) for v in b.xvars}
    ranges.update((v, (0, n - 1)) for v, n in zip(b.ivars, b.iext))
    for inst in b.instances:
        ranges.update((v, (0, n - 1)) for v, n in zip(inst.rvars, inst.rext))
    persistent = rb >= _loop_max(b.instances, b.iext)
    nin = len(b.inputs)
    # loads per loop; a persistent program loads each distinct (tensor, index) once
    loops = [inst.body for inst in b.instances] + [s.value for s in b.stores]
    seen: set[Load] = set()
    per_input = [0.0] * nin
    for body in loops:
        for ld in (n for n in walk(body) if isinstance(n, Load) and n.tensor < nin):
            if persistent and ld in seen:
                continue
            seen.add(ld)
            t = g.types[b.inputs[ld.tensor]]
            per_input[ld.tensor] += _load_elems(ld, ranges, t.shape, t.dtype.itemsize, target) * t.dtype.itemsize
    total = 0.0
    for k, per in enumerate(per_input):
        t = g.types[b.inputs[k]]
        whole = per * programs
        total += min(whole, t.nbytes) if t.nbytes <= target.l2_bytes // 2 else whole
    for s in b.stores:
        t = g.types[s.tensor]
        total += t.nbytes
    xelems = xn
    flops = 0
    for inst in b.instances:
        flops += (expr_flops(inst.body) + 1) * xelems * math.prod(inst.rext)
    inner = math.prod(b.iext)
    for s in b.stores:
        flops += expr_flops(s.value) * xelems * (1 if s.row_only else inner)
    return FusedSchedule("fused", g, programs, b.anchor, b.inputs, b.xvars, b.xext, b.ivars, b.iext,
                         b.instances, b.stores, xb, rb, int(total), int(flops))
