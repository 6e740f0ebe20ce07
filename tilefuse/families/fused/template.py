"""The fused family's template: a fused body and tile as a tile-level kernel (``codegen/kernel.py``).

Tile axes: ``x``, the anchor's row variables, split across programs in blocks of XBLOCK (tile
dimension 0); ``r``, its inner variables, in chunks of RBLOCK (dimension 1), looped unless the
schedule holds whole rows; in a looped schedule each reduction instance has its own axis
``r<slot>`` over its reduced variables, on the same dimension.  A kernel without inner or reduced
variables is one-dimensional.

Body, in the schedule's order: one ``Reduce`` per reduction instance (dependency order); the
outputs that depend on row variables only, stored once per row; then the other outputs in a
``Loop`` over ``r``.  In one pass (``schedule.one_pass``) the reductions run over ``r`` itself, so
every reduction and every output reads the same tile of loads; looped, each reduction loop and the
output loop issue their own loads, and loads a later loop repeats are kept in cache
(``evict_last``).  16-bit float reductions accumulate in fp32 and bool ones as int32 any/all, as
the reference executor does.
"""
from __future__ import annotations

import math
from dataclasses import replace

from ...codegen.kernel import Kernel, Loop, Store, TileAxis, pow2
from ...codegen.reduction import reduction
from ...ir.expr import Load, Var, binary, load_nodes, substitute


def fused_kernel(s, name: str) -> Kernel:
    """The kernel computing fused schedule ``s`` under the function name ``name``: the template
    of its body bound to its tile (what the family costed), named and commented."""
    b = s.body
    k = tiled(fused_template(b, s.one_pass), b, s.xblock, s.rblock, s.num_warps, s.num_stages)
    origins = dict.fromkeys(str(p.origin) for p in b.group.prims)
    comments = (f"{name}: fused kernel (tilefuse), anchor {b.anchor}, XBLOCK={s.xblock} RBLOCK={s.rblock} "
                f"num_warps={s.num_warps} num_stages={s.num_stages}" + (", one pass" if s.one_pass else ""),
                "implements:", *(f"  {o}" for o in origins),
                f"inputs:  {', '.join(f'in{k}={n}' for k, n in enumerate(b.inputs))}",
                f"outputs: {', '.join(f'out{k}={st.tensor}' for k, st in enumerate(b.stores))}")
    return replace(k, name=name, comments=comments)


def tiled(template: Kernel, b, xblock: int, rblock: int, num_warps: int, num_stages: int) -> Kernel:
    """``template`` with a tile bound: XBLOCK rows per program (at most the rows, rounded up to a
    power of two), RBLOCK-wide chunks."""
    return template.bound({"XBLOCK": min(xblock, pow2(math.prod(b.xext))), "RBLOCK": rblock}, num_warps, num_stages)


def fused_template(b, one_pass: bool) -> Kernel:
    """A fused body (``families/fused.FusedBody``) as a kernel whose blocks are bound later
    (``Kernel.bound``): in one pass the reductions run over the row's inner axis ``r`` itself,
    looped each over its own axis."""
    types = b.group.types
    axes = [TileAxis("x", b.xvars, b.xext, 1, 0, grid=0, block_name="XBLOCK")]
    if b.ivars:
        axes.append(TileAxis("r", b.ivars, b.iext, 1, 1, block_name="RBLOCK"))
    body: list = []
    rename: dict[Var, Var] = {}
    for inst in b.instances:
        if one_pass:
            rename.update(zip(inst.rvars, b.ivars))
            axis = "r"
        else:
            axis = f"r{inst.slot}"
            axes.append(TileAxis(axis, inst.rvars, inst.rext, 1, 1, block_name="RBLOCK"))
        body.append(reduction(inst, substitute(inst.body, rename) if rename else inst.body, axis))
    rows, inner = [], []
    for k, st in enumerate(b.stores):
        # duplicates of a value (variables it does not depend on) are stored at 0 only; a row-only
        # output is stored outside the inner loop, once per row
        guards = [binary("eq", v, 0) for v in st.mask_vars if not (st.row_only and v in b.ivars)]
        guards += [binary("lt", v, n) for v, n in st.limits]
        store = Store(k, st.index, st.value, tuple(guards))
        (rows if st.row_only else inner).append(store)
    body += rows
    body += ([Loop("r", tuple(inner))] if b.ivars else inner) if inner else []
    reused = frozenset() if one_pass else _reused(b)
    return Kernel("fused", tuple(types[n] for n in b.inputs), tuple(types[st.tensor] for st in b.stores),
                  tuple(axes), tuple(body), 1, 1, (), reused)


def _reused(b) -> frozenset:
    """Loads of a looped kernel whose data a later loop reads again (keep them in cache).  Each
    reduction loop has its own variables; over the same extent they stand for the row's inner
    variables, so loads are compared with those substituted."""
    loops = []
    for inst in b.instances:
        canon = dict(zip(inst.rvars, b.ivars)) if inst.rext == b.iext else {}
        loops.append([(n, substitute(n, canon) if canon else n) for n in load_nodes(inst.body) if _is_input(n, b)])
    loops.append([(n, n) for st in b.stores for n in load_nodes(st.value) if _is_input(n, b)])
    last = {}
    for k, loads in enumerate(loops):
        for _, c in loads:
            last[c] = k
    return frozenset(n for k, loads in enumerate(loops) for n, c in loads if last[c] > k)


def _is_input(n, b) -> bool:
    return isinstance(n, Load) and n.tensor < len(b.inputs)
