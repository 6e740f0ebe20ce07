"""The fused family: memory-bound prims in one kernel (Welder's tile graph, Inductor-style rows).

A group is *inlined* into per-output expressions over the iteration space of an anchor output
(the largest one): every member prim that is not a reduction is substituted into its consumers
through its index map, so layout prims become index arithmetic on loads and stores.  Each use of a
member reduction becomes a *reduction instance*: the reduction's own body evaluated at the index
where it is used, producing one value per row.  The anchor's axes split into row axes X (those the
instances are indexed by) and inner axes; one program handles XBLOCK consecutive rows.  A schedule
is either *one pass* (every reduction runs over the inner extents and the whole row fits the tile:
the reductions and the outputs share one load of each input, as the Triton softmax tutorial does)
or *looped* (a loop per reduction instance over its reduced extent in chunks of RBLOCK, then a loop
over the inner axes computing and storing the outputs; each loop issues its own loads).

Outputs other than the anchor must be reachable from the anchor's space by an injective index
map (a permutation/projection of its axes), or have the anchor's shape; otherwise the group is
rejected, as are nested reductions (a reduction used inside another's reduced loop; their traffic
can still be modelled: ``tile_traffic``).  Rejection is the common case and is cheap.

Cost: ``cost.work.work`` of the kernel the template prints (``template.py``: the body is
lowered once per form, one pass or looped, and each candidate's XBLOCK and RBLOCK bound to it),
timed by ``cost.model.estimate``: one description of each kernel.  The tile space is XBLOCK ×
RBLOCK × num_warps; ``schedules`` returns the best few, best first.  ``tile_traffic`` keeps
Welder's traffic of a group this family does not build (a reduction nested in another's row).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ...analysis.classify import Category, contraction_operands
from ...analysis.inline import Inliner, Instance, injective_store
from .template import fused_kernel, fused_template, tiled
from ...cost.model import estimate
from ...cost.target import Target
from ...cost.tiles import load_sites, requested_bytes, stored_bytes
from ...cost.work import work
from ...ir.expr import Expr, Var, free_vars, node_count, substitute
from ..base import Built, Family, Group, Schedule

MAX_EXPR_NODES = 4000          # beyond this, inlining has blown up (stencils of stencils): reject
MAX_TILE_ELEMS = 16384         # XBLOCK·RBLOCK values live per program (registers: see _registers)
MAX_PERSISTENT = 16384         # largest reduced/inner extent held whole in one program
XBLOCKS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
RBLOCKS = (64, 256, 1024, 4096, 16384)  # chunk sizes of looped reductions (persistent: next_pow2(extent))
WARPS = (1, 2, 4, 8, 16)
ELEMS_PER_THREAD = (4, 16)     # a thread's share of the tile: at least one 8-byte fp16 vector per
                               # load, at most what registers hold without spilling
RESOLUTION = 0.05              # modelled times closer than this are ties (see _ranked)
TIE_ELEMS_PER_THREAD = 8       # in a tie, the share of the tile per thread Inductor and the tutorials use
TOP_K = 4                      # schedules handed on (to measurement) per group


@dataclass(frozen=True)
class FusedStore:
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
    stores: tuple[FusedStore, ...]
    nested: bool = False                    # a reduction inside another's loop: traffic only, no kernel


@dataclass(frozen=True)
class FusedSchedule(Schedule):
    body: FusedBody
    xblock: int
    rblock: int
    num_warps: int
    num_stages: int = 1       # software-pipelining depth of the kernel's loops (1: none to pipeline)

    @property
    def persistent(self) -> bool:
        return self.rblock >= _loop_max(self.body.instances, self.body.iext)

    @property
    def one_pass(self) -> bool:
        """Reductions and outputs share one tile of loads, in one loop (the emitter obeys this and
        the traffic model charges it): whole rows fit the tile and every reduction runs over the
        inner extents."""
        return self.persistent and _can_one_pass(self.body)

    def tile_key(self) -> tuple:
        return (self.xblock, self.rblock, self.num_warps, self.num_stages)


def _loop_max(instances, iext) -> int:
    return max([math.prod(iext)] + [math.prod(i.rext) for i in instances])


class FusedFamily(Family):
    name = "fused"

    def schedules(self, group: Group, target: Target) -> list[FusedSchedule]:
        cats = group.categories
        # Contractions belong to the library and gemm families, except those without N axes (a
        # depthwise convolution, a matrix-vector product: each output a row reduction, nothing
        # for tensor cores to share) and a lone one with no GEMM form (a 3-operand einsum), so
        # that every single prim stays buildable.
        if Category.opaque in cats:
            return []
        for p, cat in zip(group.prims, cats):
            if cat is Category.contraction:
                ops = contraction_operands(p)
                if (ops is None and len(cats) > 1) or (ops is not None and ops[2]):
                    return []
        built = _build(group)
        if built is None or built.nested:
            return []
        return _ranked(built, target)[:TOP_K]

    def kernels(self, schedule: FusedSchedule, name: str) -> tuple:
        return (fused_kernel(schedule, name),)

    def build(self, schedule: FusedSchedule, name: str) -> Built:
        from ...codegen.triton import compile_kernel
        kernels = self.kernels(schedule, name)
        run, source = compile_kernel(kernels[0])
        b = schedule.body
        return Built(name, self.name, b.inputs, tuple(st.tensor for st in b.stores), run, source, "triton",
                     kernels=kernels)


def _ranked(b: FusedBody, target: Target) -> list[FusedSchedule]:
    """Every feasible (XBLOCK, RBLOCK, warps) schedule, fastest first, each costed from the kernel
    it prints (``cost.work``): the body is lowered once per form (one pass, looped) and each
    candidate tile bound to it.

    Schedules within ``RESOLUTION`` of the fastest are ties the model cannot separate (its
    per-program and latency constants are assumptions until measured); among them the simplest
    comes first: fewest rows per program (the Triton tutorial's one row per program, more programs
    to balance the SMs), then fewest loop iterations (one pass over a row rather than several),
    then about 8 tile elements per thread (so warps grow with the row), then fewest warps, then
    the smallest chunk.  Deterministic.
    """
    templates = {one: fused_template(b, one) for one in ((True, False) if _can_one_pass(b) else (False,))}
    scored = []
    for xb, rb in _tile_options(b):
        one = _can_one_pass(b) and rb >= _loop_max(b.instances, b.iext)
        kernel = tiled(templates[one], b, xb, rb, 1, 1)
        # a loop of several chunks overlaps the next chunk's loads with this one's arithmetic
        stages = 2 if any(a.looped for a in kernel.axes) else 1
        for warps in WARPS:
            elems = -(-(xb * rb) // (warps * target.warp_size))
            lo, hi = ELEMS_PER_THREAD
            if not (lo <= elems <= hi or (elems < lo and warps == 1) or (elems > hi and warps == WARPS[-1])):
                continue   # too few elements per thread (idle lanes) or too many (registers)
            w = work(kernel.bound({}, warps, stages), target)
            t = estimate(w, target).seconds
            if t != float("inf"):
                scored.append((t, FusedSchedule("fused", b.group, w.programs, w, b, xb, rb, warps, stages)))
    if not scored:
        return []
    best = min(t for t, _ in scored)

    def simplest(s: FusedSchedule):
        per_thread = s.xblock * s.rblock / (s.num_warps * target.warp_size)
        return s.xblock, s.work.chunks, abs(math.log2(per_thread / TIE_ELEMS_PER_THREAD)), s.num_warps, s.rblock

    tied = sorted((s for t, s in scored if t <= best * (1 + RESOLUTION)), key=simplest)
    rest = [s for _, s in sorted(((t, s) for t, s in scored if t > best * (1 + RESOLUTION)),
                                 key=lambda ts: (ts[0], ts[1].xblock, ts[1].num_warps, ts[1].rblock))]
    return tied + rest


def tile_traffic(group: Group, tile: tuple[int, ...], target: Target, *, rblock: int | None = None
                 ) -> tuple[int, int]:
    """(bytes requested, programs) when the group's anchor output is computed in tiles of shape
    ``tile`` (Welder's output tile), every load of a tile shared when its rows fit (``rblock``
    None) or issued once per loop when the rows are looped in chunks of ``rblock``.  Works for
    nested reductions too (e.g. Matmul -> Softmax), which no kernel of this family builds."""
    b = _build(group, nested_ok=True)
    if b is None:
        raise ValueError("the group cannot be inlined into one iteration space")
    avars = tuple(Var(f"a{k}") for k in range(len(tile)))
    ext = dict(zip(b.xvars, b.xext)) | dict(zip(b.ivars, b.iext))
    programs = math.prod(-(-ext[v] // t) for v, t in zip(avars, tile))
    rb = rblock or _loop_max(b.instances, b.iext)
    loops = _loops(b, one_pass=rb >= _loop_max(b.instances, b.iext))
    per_input, stores = _traffic(b, loops, dict(zip(avars, tile)), target)
    return int(sum(per_input) * programs + stores), programs


def _build(group: Group, nested_ok: bool = False) -> FusedBody | None:
    outs = [group.members[o] for o in group.outputs]
    if len(outs) > 1 and any(o.out.numel == 0 for o in outs):
        return None   # an empty output gains nothing from fusion and would be a zero-size buffer argument
    order = {p.name: k for k, p in enumerate(group.prims)}
    anchor = max(outs, key=lambda p: (p.out.numel, order[p.name]))
    avars = tuple(Var(f"a{k}") for k in range(anchor.out.rank))
    ext = dict(zip(avars, anchor.out.shape))
    inl = Inliner(group.members, group.inputs)
    values = {anchor.name: inl.value_at(anchor.name, avars)}
    stores_idx = {anchor.name: avars}
    for o in outs:
        if o.name == anchor.name:
            continue
        for idx in inl.refs.get(o.name, []):
            if injective_store(idx, o.out.shape, ext) is not None:
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
    nested = False
    for inst in inl.instances:
        for e in inst.index:
            fv = free_vars(e)
            if fv & rvar_names:
                if not nested_ok:
                    return None  # nested reduction
                nested = True
            xset |= fv - rvar_names
    if nested:
        # traffic only: rows are what the row-wise reductions are indexed by; a reduction used
        # per element (the matmul under a softmax) is computed for the whole tile, as Welder does
        rowwise = [set().union(*(free_vars(e) for e in i.index)) - rvar_names for i in inl.instances]
        rowwise = [r for r in rowwise if r != set(avars)]
        xset = set().union(*rowwise) if rowwise else xset
    if not inl.instances:
        xset = set(avars)
    xvars = tuple(v for v in avars if v in xset)
    ivars = tuple(v for v in avars if v not in xset)
    stores = []
    for o in outs:
        idx = stores_idx[o.name]
        used = injective_store(idx, o.out.shape, ext, partial=not inl.instances)
        if used is None:
            return None
        val = values[o.name]
        deps = set(used) | (free_vars(val) & set(avars))
        mask = tuple(v for v in avars if v not in deps)
        row_only = not (deps & set(ivars))
        limits = tuple((e, n) for e, n in zip(idx, o.out.shape) if isinstance(e, Var) and ext[e] > n)
        stores.append(FusedStore(o.name, idx, val, mask, row_only, limits))
    size = sum(node_count(s.value) for s in stores) + sum(node_count(i.body) for i in inl.instances)
    if size > MAX_EXPR_NODES:
        return None
    return FusedBody(group, anchor.name, group.inputs, xvars, tuple(ext[v] for v in xvars), ivars,
                  tuple(ext[v] for v in ivars), tuple(inl.instances), tuple(stores), nested)


def _can_one_pass(b: FusedBody) -> bool:
    """The emitter's single pass: every reduction runs over the inner extents (softmax, norms)."""
    return bool(b.instances and b.ivars) and all(i.rext == b.iext for i in b.instances)


def _loops(b: FusedBody, *, one_pass: bool) -> list:
    """The distinct loads each loop of the kernel issues, in emission order.

    Looped: one loop per reduction instance, then the store loop.  One pass: a single loop in
    which every instance's reduced variables are the row's inner variables (as the emitter
    substitutes them), so loads of the same element by different reductions are one load.
    Nested instances (traffic only) keep one canonical variable per reduced axis of their prim.
    """
    nin = len(b.inputs)
    bodies = [inst.body for inst in b.instances] + [s.value for s in b.stores]
    if not one_pass:   # a loop per reduction, then one loop computing every output
        return [load_sites([i.body], nin) for i in b.instances] + [load_sites([s.value for s in b.stores], nin)]
    mapping: dict[Var, Var] = {}
    for inst in b.instances:
        if inst.rext == b.iext:
            mapping.update(zip(inst.rvars, b.ivars))
        else:
            mapping.update((v, _kvar(inst, j)) for j, v in enumerate(inst.rvars))
    return [load_sites([substitute(body, mapping) for body in bodies], nin)]


def _kvar(inst: Instance, j: int) -> Var:
    """The one variable standing for reduced axis j of every instance of a prim (one pass)."""
    return Var(f"k_{inst.prim}_{j}")


def _tile_options(b: FusedBody):
    xn = math.prod(b.xext)
    loop = _loop_max(b.instances, b.iext)
    if loop <= 1:
        rbs = [1]
    else:
        full = 1 << (loop - 1).bit_length()
        rbs = [r for r in RBLOCKS if r < full] + ([full] if full <= MAX_PERSISTENT else [])
    xcap = 1 << max(xn - 1, 0).bit_length()
    for rb in rbs:
        for xb in XBLOCKS:
            if xb * rb <= MAX_TILE_ELEMS and xb <= xcap and (xb * rb >= 128 or xb == xcap):
                yield xb, rb


def _ranges(b: FusedBody, box: dict[Var, int]) -> dict[Var, tuple[int, int]]:
    """Variable ranges over one program: ``box`` for the tiled anchor vars, every other anchor,
    inner and reduced var over its whole extent (the program's loops cover it)."""
    ranges = {v: (0, box.get(v, n) - 1) for v, n in zip(b.xvars + b.ivars, b.xext + b.iext)}
    for inst in b.instances:
        ranges.update((v, (0, n - 1)) for v, n in zip(inst.rvars, inst.rext))
        ranges.update((_kvar(inst, j), (0, n - 1)) for j, n in enumerate(inst.rext))
    return ranges


def _traffic(b: FusedBody, loops, box: dict[Var, int], target: Target) -> tuple[list[float], int]:
    """(bytes one program covering ``box`` requests per input, bytes stored by the kernel)."""
    g = b.group
    per_input = requested_bytes(loops, _ranges(b, box), [g.types[n] for n in b.inputs], target, _ranges(b, {}))
    return per_input, stored_bytes([g.types[s.tensor] for s in b.stores], target)
