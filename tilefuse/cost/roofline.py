"""The roofline bound of a whole model: what no plan can beat on a target.

    bound = max(compulsory bytes / peak DRAM bandwidth, Σ useful flops / peak of their kind)

Compulsory bytes: every graph input and weight read once and every output written once (a model
input updated in place, a static KV cache, by the values written into it); a table read only
through data-dependent indices (an embedding) counts the rows gathered (one per element of the
gathers' outputs), not the whole table.  Useful flops: each prim evaluated once (no
recomputation): a contraction's 2·M·N·K at the tensor-core peak of its dtype where the target has
one, everything else at the fp32 CUDA-core peak.  The peaks are the vendor's, not achievable
fractions, so a plan's modelled time divided by this bound says how far it is from the hardware.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..analysis.classify import Category, classify
from ..ir.dtypes import DType
from ..ir.prim import Prim, PrimGraph
from .model import expr_flops
from .target import Target


@dataclass(frozen=True)
class Roofline:
    compulsory_bytes: int
    flops: int
    memory_s: float
    compute_s: float

    @property
    def seconds(self) -> float:
        return max(self.memory_s, self.compute_s)


def compulsory_bytes(pg: PrimGraph) -> int:
    types = pg.types
    consumers = pg.consumers
    total = sum(_written(pg, o) for o in dict.fromkeys(pg.outputs))
    for name in [d.name for d in pg.inputs] + [c.name for c in pg.constants]:
        users = consumers.get(name, ())
        if not users:
            continue
        if all(classify(p) is Category.indirect for p in users):
            gathered = sum(p.out.numel for p in users) * types[name].dtype.itemsize
            total += min(types[name].nbytes, gathered)
        else:
            total += types[name].nbytes
    return total


def _written(pg: PrimGraph, name: str) -> int:
    """Bytes an output must be written with: all of it, but for a model input updated in place
    (an ``index_put`` marked ``inplace``: a static KV cache), the values it writes."""
    p = pg.producers.get(name)
    if p is not None and p.is_opaque and p.body.fn == "index_put" and dict(p.body.attrs).get("inplace"):
        return pg.types[p.inputs[1]].nbytes
    return pg.types[name].nbytes


def peak_of(p: Prim, target: Target) -> tuple[float, str]:
    """The peak (FLOP/s) a prim's arithmetic is bounded by, and its name: a contraction's
    tensor-core peak for its dtype where the target has one, else the fp32 CUDA-core peak."""
    if classify(p) is Category.contraction and target.has_tensor_cores(p.out.dtype):
        return target.peak(p.out.dtype, True), f"{p.out.dtype.value} tensor cores"
    if classify(p) is Category.contraction:
        return target.peak(p.out.dtype, False), f"{p.out.dtype.value} CUDA cores"
    return target.peak(DType.float32, False), "float32 CUDA cores"


def roofline(pg: PrimGraph, target: Target) -> Roofline:
    flops = 0
    compute = 0.0
    for p in pg.prims:
        if p.is_opaque:
            continue          # no arithmetic the model can count
        reduced = math.prod(p.reduce.extents) if p.reduce is not None else 1
        contraction = classify(p) is Category.contraction
        f = (2 if contraction else expr_flops(p.body)) * p.out.numel * reduced
        flops += f
        compute += f / peak_of(p, target)[0]
    nbytes = compulsory_bytes(pg)
    return Roofline(nbytes, flops, nbytes / target.dram_bw, compute)
