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

from ..analysis.classify import Category, contraction_operands
from ..analysis.index import affine_form, bounds
from ..cost.model import coalesced_elems, expr_flops, kernel_seconds
from ..cost.target import Target
from ..ir.dtypes import DType
from ..ir.expr import Const, Expr, Load, Var, free_vars, walk
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
    limits: tuple[tuple[Var, int], ...] = ()   # store only where var < n: an output smaller than
                                               # the anchor, computed at the anchor's coordinates


@dataclass(frozen=True)
class FusedBody:
    """What a fused kernel computes, before tile sizes are chosen."""
    group: Group
    anchor: str
    inputs: tuple[str, ...]                 # kernel input slots
    xvars: tuple[Var, ...]                  # row axes (of the anchor): one program per XBLOCK rows
    xext: tuple[int, ...]
    ivars: tuple[Var, ...]                  # inner axes, looped in chunks of RBLOCK
    iext: tuple[int, ...]
    instances: tuple[Instance, ...]         # reductions, in dependency order
    stores: tuple[Store, ...]


@dataclass(frozen=True)
class FusedSchedule(Schedule):
    body: FusedBody
    xblock: int
    rblock: int
    bytes: int
    flops: int

    def __getattr__(self, name):  # the body's fields read as the schedule's own
        if name == "body":
            raise AttributeError(name)
        return getattr(self.body, name)

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

        One recursive pass over p's own nodes does both; results are never visited again, so index
        expressions coming in through ``mapping`` (already kernel-level) or produced by folding
        are never re-read in p's slot numbering.
        """
        memo: dict[int, Expr] = {}

        def go(n: Expr) -> Expr:
            got = memo.get(id(n))
            if got is not None:
                return got
            if isinstance(n, Var):
                out = mapping.get(n, n)
            elif isinstance(n, Load):
                idx = tuple(go(i) for i in n.index)
                src = p.inputs[n.tensor]
                out = self.value_at(src, idx) if src in self.member else Load(self.in_slot[src], idx, n.dtype)
            else:
                kids = n.children()
                out = n.with_children(tuple(go(k) for k in kids)) if kids else n
            memo[id(n)] = out
            return out

        return go(p.body)

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


def _injective_store(idx: tuple[Expr, ...], shape: tuple[int, ...], ext: Mapping[Var, int], partial=False):
    """Vars used if idx maps them injectively onto the whole tensor (else None); ``partial``: a var
    may range beyond its dim (the store is then limited to the dim)."""
    used = []
    for e, n in zip(idx, shape):
        if isinstance(e, Const):
            if e.value != 0 or n != 1:
                return None
        elif isinstance(e, Var) and e in ext and e not in used and (ext[e] == n or partial and ext[e] > n):
            used.append(e)
        else:
            return None
    return tuple(used)


class FusedFamily:
    name = "fused"

    def schedule(self, group: Group, target: Target) -> FusedSchedule | None:
        cats = group.categories
        # Contractions belong to the library (and later the gemm/chain families); a fused kernel
        # takes one only when it stands alone and no library form exists (e.g. a 3-operand
        # einsum), so that every single prim stays buildable.
        if Category.opaque in cats:
            return None
        if Category.contraction in cats and (len(cats) > 1 or contraction_operands(group.prims[0]) is not None):
            return None
        built = _build(group)
        if built is None:
            return None
        best = None
        sites, flops = _sites(built), _flops(built)
        for xb, rb in _tile_options(built):
            sched = _with_tile(built, sites, flops, xb, rb, target)
            t = _seconds(sched, target)
            if best is None or t < best[0]:
                best = (t, sched)
        return None if best is None else best[1]

    def cost(self, sched: FusedSchedule, target: Target) -> Cost:
        return Cost(_seconds(sched, target), sched.bytes, sched.flops, sched.blocks)


def _seconds(s: FusedSchedule, target: Target) -> float:
    t = kernel_seconds(s.bytes, s.flops, target.peak(DType.float32, False), s.blocks, target)
    if target.program_s:  # an interpreting target runs programs and their loop chunks one by one
        chunks = sum(-(-n // s.rblock) for n in [math.prod(s.iext)] + [math.prod(i.rext) for i in s.instances])
        t += target.program_s * s.blocks * chunks
    return t


def _build(group: Group) -> FusedBody | None:
    outs = [group.members[o] for o in group.outputs]
    if len(outs) > 1 and any(o.out.numel == 0 for o in outs):
        return None   # an empty output gains nothing from fusion and would be a zero-size buffer argument
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
            # Same shape, or (without reductions, whose rows would then run out of range) smaller
            # in every dim: computed at the anchor's coordinates, stored where they fit (a split).
            smaller = o.out.rank == anchor.out.rank and all(n <= m for n, m in zip(o.out.shape, anchor.out.shape))
            if o.out.shape != anchor.out.shape and not (smaller and not inl.instances):
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
        used = _injective_store(idx, o.out.shape, ext, partial=not inl.instances)
        if used is None:
            return None
        val = values[o.name]
        deps = set(used) | (free_vars(val) & set(avars))
        mask = tuple(v for v in avars if v not in deps)
        row_only = not (deps & set(ivars))
        limits = tuple((e, n) for e, n in zip(idx, o.out.shape) if isinstance(e, Var) and ext[e] > n)
        stores.append(Store(o.name, idx, val, mask, row_only, limits))
    size = sum(1 for s in stores for _ in walk(s.value)) + sum(1 for i in inl.instances for _ in walk(i.body))
    if size > MAX_EXPR_NODES:
        return None
    return FusedBody(group, anchor.name, group.inputs, xvars, tuple(ext[v] for v in xvars), ivars,
                  tuple(ext[v] for v in ivars), tuple(inl.instances), tuple(stores))


def _tile_options(b: FusedBody):
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


@dataclass(frozen=True)
class _Site:
    """A load the kernel issues, analysed once per group (tile sizes vary, the maps do not)."""
    loop: int                       # which loop issues it (instances first, then stores)
    load: Load
    dims: tuple                     # per dim: ("affine", {var: coeff}) | ("data", vars) | ("other", expr)


def _sites(b: FusedBody) -> list[_Site]:
    nin = len(b.inputs)
    loops = [inst.body for inst in b.instances] + [s.value for s in b.stores]
    out = []
    for k, body in enumerate(loops):
        for ld in (n for n in walk(body) if isinstance(n, Load) and n.tensor < nin):
            dims = []
            for e in ld.index:
                if any(isinstance(x, Load) for x in walk(e)):
                    dims.append(("data", tuple(free_vars(e))))
                    continue
                form = affine_form(e)
                dims.append(("affine", form[0]) if form is not None else ("other", e))
            out.append(_Site(k, ld, tuple(dims)))
    return out


def _site_elems(site: _Site, ranges: Mapping[Var, tuple[int, int]], shape, itemsize: int,
                target: Target) -> float:
    sub = []
    for (kind, what), n in zip(site.dims, shape):
        if kind == "affine":
            # exact extent of an affine map over a box: 1 + sum |c|·(extent - 1), clipped to the dim
            ext = 1 + sum(abs(c) * (ranges[v][1] - ranges[v][0]) for v, c in what.items())
        elif kind == "data":
            # data-dependent: at most one distinct row per point of the index's own box
            ext = math.prod(ranges[v][1] - ranges[v][0] + 1 for v in what if v in ranges)
        else:
            lo, hi = bounds(what, ranges)
            ext = max(min(hi, n - 1) - max(lo, 0) + 1, 0)
        sub.append(max(min(ext, n), 0))
    return coalesced_elems(tuple(sub), tuple(shape), itemsize, target)


def _with_tile(b: FusedBody, sites: list[_Site], flops: int, xb: int, rb: int, target: Target) -> FusedSchedule:
    g = b.group
    xn = math.prod(b.xext)
    programs = -(-xn // xb)
    xbox = _tile_box(b.xvars, b.xext, xb)
    ranges: dict[Var, tuple[int, int]] = {v: (0, xbox[v] - 1) for v in b.xvars}
    ranges.update((v, (0, n - 1)) for v, n in zip(b.ivars, b.iext))
    for inst in b.instances:
        ranges.update((v, (0, n - 1)) for v, n in zip(inst.rvars, inst.rext))
    persistent = rb >= _loop_max(b.instances, b.iext)
    # a persistent program loads each distinct (tensor, index) once; a looped one once per loop
    seen: set[Load] = set()
    per_input = [0.0] * len(b.inputs)
    for site in sites:
        if persistent and site.load in seen:
            continue
        seen.add(site.load)
        t = g.types[b.inputs[site.load.tensor]]
        per_input[site.load.tensor] += _site_elems(site, ranges, t.shape, t.dtype.itemsize, target) * t.dtype.itemsize
    total = 0.0
    for k, per in enumerate(per_input):
        t = g.types[b.inputs[k]]
        whole = per * programs
        total += min(whole, t.nbytes) if t.nbytes <= target.l2_bytes // 2 else whole
    total += sum(g.types[s.tensor].nbytes for s in b.stores)
    return FusedSchedule("fused", g, programs, b, xb, rb, int(total), flops)


def _flops(b: FusedBody) -> int:
    xn = math.prod(b.xext)
    flops = sum((expr_flops(inst.body) + 1) * xn * math.prod(inst.rext) for inst in b.instances)
    inner = math.prod(b.iext)
    flops += sum(expr_flops(s.value) * xn * (1 if s.row_only else inner) for s in b.stores)
    return int(flops)
