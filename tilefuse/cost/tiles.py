"""Welder's tile traffic: what a program's tile of a kernel reads and writes.

A program computes a tile of its kernel's program-split axes (``tile_box``) and loops over the
others (``cost/work.py`` for the fused family; the gemm and chain families' own descriptions).  Each load of the
inlined expressions is a ``LoadSite``: its index map, analysed once.  Propagating the program's
tile through the index map gives the box the load touches (Welder's tile propagation, with the
map composed through every layout prim by the inliner); its bytes follow Welder's coalescing rule
(``cost.model.coalesced_elems``).  ``requested_bytes`` sums the boxes of the loads a group
issues loop by loop (Welder's nested-reduction example, ``families.fused.tile_traffic``);
``stored_bytes`` the outputs; ``split_l2`` divides the requested bytes into DRAM and L2 traffic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from ..analysis.index import affine_form, bounds
from ..ir.dtypes import TensorType
from ..ir.expr import Load, Var, free_vars, walk
from .model import coalesced_elems
from .target import Target


def tile_box(vars_: Sequence[Var], ext: Sequence[int], block: int) -> dict[Var, int]:
    """Extent each var covers when ``block`` consecutive row-major positions are taken."""
    box, left = {}, block
    for v, n in zip(reversed(vars_), reversed(ext)):
        take = min(n, max(left, 1))
        box[v] = take
        left = -(-left // n) if left > n > 0 else 1
    return box


@dataclass(frozen=True)
class LoadSite:
    """One distinct load of a loop: tensor slot and, per dim, how its index depends on variables."""
    load: Load
    dims: tuple        # per dim: ("affine", ({var: coeff}, const)) | ("data", vars) | ("other", expr)


def load_sites(bodies: Iterable, num_inputs: int) -> list[LoadSite]:
    """The distinct loads of kernel inputs in ``bodies`` (one loop's expressions): loads are
    interned, so a load written twice is issued once, as the emitter's common subexpressions."""
    seen: dict[Load, None] = {}
    for body in bodies:
        for n in walk(body):
            if isinstance(n, Load) and n.tensor < num_inputs:
                seen.setdefault(n)
    return [load_site(ld) for ld in seen]


def load_site(ld: Load) -> LoadSite:
    """A load's index map, analysed once: per dim affine in variables, data-dependent, or other."""
    dims = []
    for e in ld.index:
        if any(isinstance(x, Load) for x in walk(e)):
            dims.append(("data", tuple(free_vars(e))))
            continue
        form = affine_form(e)
        dims.append(("affine", form) if form is not None else ("other", e))
    return LoadSite(ld, tuple(dims))


def site_elems(site: LoadSite, ranges: Mapping[Var, tuple[int, int]], t: TensorType, target: Target,
               full: Mapping[Var, tuple[int, int]] | None = None) -> float:
    """Elements moved to serve ``site`` over a box of variable ranges (coalescing included).

    ``full``: the variables' whole ranges over the kernel.  Where an affine index over them leaves
    the tensor (a padded window: the load is guarded and reads nothing there), a program's box is
    charged the in-bounds share of the whole image: programs slide over the whole range, so on
    average that fraction of each box is read."""
    sub = []
    start = 0             # the box's first element (its alignment decides how runs straddle sectors)
    last = len(t.shape) - 1
    for d, ((kind, what), n) in enumerate(zip(site.dims, t.shape)):
        if kind == "affine":
            # the span of an affine map over a box, 1 + sum |c|·(extent - 1), clipped to the dim;
            # along an outer dim only the positions it takes count (a strided window skips rows:
            # each row is a run of its own), along the last the span (gaps inside a sector move)
            coeffs, const = what
            ext = 1 + sum(abs(c) * (ranges[v][1] - ranges[v][0]) for v, c in coeffs.items())
            if d < last:
                ext = min(ext, _distinct(coeffs, ranges))
            lo = const + sum(min(c * ranges[v][0], c * ranges[v][1]) for v, c in coeffs.items())
            start += min(max(lo, 0), n - 1) * math.prod(t.shape[d + 1:])
            if full is not None:
                ext = min(ext, n) * inside_share(coeffs, const, full, n)
        elif kind == "data":
            # data-dependent: at most one distinct row per point of the index's own box
            ext = math.prod(ranges[v][1] - ranges[v][0] + 1 for v in what if v in ranges)
        else:
            lo, hi = bounds(what, ranges)
            ext = max(min(hi, n - 1) - max(lo, 0) + 1, 0)
        sub.append(max(min(ext, n), 0))
    return coalesced_elems(tuple(sub), tuple(t.shape), t.dtype.itemsize, target, start)


def _distinct(coeffs: Mapping[Var, int], ranges: Mapping[Var, tuple[int, int]], limit: int = 4096) -> int:
    """How many values ``sum c·v`` takes over the box (enumerated while small, else unbounded)."""
    values = {0}
    for v, c in coeffs.items():
        lo, hi = ranges[v]
        if len(values) * (hi - lo + 1) > limit:
            return limit * limit
        values = {x + c * i for x in values for i in range(lo, hi + 1)}
    return len(values)


def inside_share(coeffs: Mapping[Var, int], const: int, full: Mapping[Var, tuple[int, int]], n: int) -> float:
    """Share of the span of an affine index over the full ranges that lies in [0, n)."""
    lo = const + sum(min(c * full[v][0], c * full[v][1]) for v, c in coeffs.items() if v in full)
    hi = const + sum(max(c * full[v][0], c * full[v][1]) for v, c in coeffs.items() if v in full)
    return 1.0 if hi < lo else max(min(hi, n - 1) - max(lo, 0) + 1, 0) / (hi - lo + 1)


def requested_bytes(loops: Sequence[Sequence[LoadSite]], ranges: Mapping[Var, tuple[int, int]],
                    inputs: Sequence[TensorType], target: Target,
                    full: Mapping[Var, tuple[int, int]] | None = None) -> list[float]:
    """Bytes one program requests of each input: every loop issues its distinct loads over the
    whole of its ranges (a load repeated by two loops is requested twice)."""
    per_input = [0.0] * len(inputs)
    for sites in loops:
        for site in sites:
            t = inputs[site.load.tensor]
            per_input[site.load.tensor] += site_elems(site, ranges, t, target, full) * t.dtype.itemsize
    return per_input


def stored_bytes(outputs: Sequence[TensorType], target: Target) -> float:
    """Outputs written whole, in the transactions that carry them (a tiny one still costs one)."""
    return sum(coalesced_elems(t.shape, t.shape, t.dtype.itemsize, target) * t.dtype.itemsize for t in outputs)


def split_l2(per_program: Sequence[float], programs: int, concurrent: int, inputs: Sequence[TensorType],
             target: Target) -> tuple[float, float]:
    """(DRAM bytes, L2 bytes) of the loads of ``programs`` programs, ``concurrent`` resident at once.

    The first touch of each byte comes from DRAM (compulsory); a re-read hits L2 when what it
    re-reads is still resident: the whole tensor fits in half of L2 (weights broadcast to every
    program), or the bytes the resident programs hold of it do (a row re-read by the next pass of
    the same program).  Otherwise it goes to DRAM again.  Requested bytes pass through L2, except
    re-reads of a small broadcast tensor (a norm's weight vector), which each SM's L1 serves after
    its first read: such a tensor crosses L2 at most once per SM.
    """
    dram = l2 = 0.0
    half = target.l2_bytes // 2
    for per, t in zip(per_program, inputs):
        total = per * programs
        compulsory = min(total, t.nbytes)
        resident = t.nbytes <= half or per * concurrent <= half
        dram += compulsory if resident else total
        l1_resident = target.l1_bytes and t.nbytes <= target.l1_bytes // 4
        l2 += min(total, t.nbytes * target.sm_count) if l1_resident else total
    return dram, l2
