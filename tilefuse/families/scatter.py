"""The scatter family: an in-place ``index_put`` of whole rows as a generated kernel.

A model input updated in place under torch.compile (a static KV cache's ``index_copy_``) reaches
the plan as the opaque ``index_put`` prim with ``inplace`` (``frontend/aten/scatter.py``). Where
one dim is indexed by a 1-D index tensor and the values have the input's shape with that dim
replaced by the index's length (one new row per index: the KV-cache update), this family prints a
kernel over the values — each program stores a tile of them at the rows the index names — so it
is generated code like any other kernel: a phase of a persistent kernel (a decode step's cache
updates no longer break the run), compiled for the target's GPU. The kernel writes only the rows:
it is correct where the runtime gives it the input's own memory as its output (``Built.inplace``,
``Program(donate=True)``); elsewhere its launcher copies the input first. An index out of range
(after torch's wrapping of negative ones) writes nothing, never outside the tensor (torch raises).

The values may be computed in the kernel: elementwise and layout prims producing them (a decode
step's key, sliced from a fused projection and transposed to the cache's layout) are members of the
group, inlined into the values' load as index arithmetic (``analysis/inline.py``), so the new rows
are not written to memory first by a kernel of their own.

Cost: ``cost.work.work`` of the kernel it prints (a store at data-dependent positions counts the
values it writes, not the whole output): the values and the index read, the rows written.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..analysis.classify import Category
from ..analysis.inline import Inliner
from ..codegen.kernel import Kernel, Store, TileAxis, pow2
from ..cost.target import Target
from ..cost.work import work
from ..ir.expr import INDEX, Load, Var, binary, cast, select
from .base import Built, Family, Group, Schedule, holding

MAX_BLOCK = 1024
WARPS = 4
_PRODUCERS = (Category.elementwise, Category.broadcast, Category.layout)    # of values, inlined


@dataclass(frozen=True, eq=False)
class ScatterSchedule(Schedule):
    dim: int = 0                 # the indexed dim
    block: int = 1               # values per program

    def tile_key(self) -> tuple:
        return (self.block,)


class ScatterFamily(Family):
    name = "scatter"

    def schedules(self, group: Group, target: Target) -> list[Schedule]:
        dim = _row_write(group)
        if dim is None:
            return []
        values = group.types[group.prims[-1].inputs[1]]
        block = min(MAX_BLOCK, pow2(max(values.numel, 1)))
        w = work(_kernel(group, dim, block, "scatter"), target)
        return [ScatterSchedule("scatter", group, w.programs, w, dim=dim, block=block)]

    def kernels(self, schedule: ScatterSchedule, name: str) -> tuple:
        return (_kernel(schedule.group, schedule.dim, schedule.block, name),)

    def build(self, schedule: ScatterSchedule, name: str) -> Built:
        from ..codegen.triton import compile_kernel
        p = schedule.group.prims[-1]
        kernels = self.kernels(schedule, name)
        launch, source = compile_kernel(kernels[0])
        read = _read(schedule.group)

        def run(ins, outs):         # ins: the input written in place, then what the kernel reads
            holding(ins[0], outs[0])
            launch(list(ins[1:]), outs)
        return Built(name, self.name, (p.inputs[0], *read), (p.name,), run, source, "triton", kernels=kernels,
                     wiring=((read, (p.name,)),), inplace=True)


def _read(group: Group) -> tuple[str, ...]:
    """What the kernel reads: the group's inputs but the one written in place."""
    return tuple(n for n in group.inputs if n != group.prims[-1].inputs[0])


def _kernel(group: Group, d: int, block: int, name: str) -> Kernel:
    """The kernel: one axis over the values (``block`` a program), each stored at its row of the
    output (the index, wrapped as torch wraps negative ones; out of range: not stored)."""
    p = group.prims[-1]
    read = _read(group)
    values, index = (group.types[n] for n in p.inputs[1:])
    out = p.out
    vs = tuple(Var(f"a{k}") for k in range(values.rank))
    raw = Load(read.index(p.inputs[2]), (vs[d],), index.dtype)
    at = cast(select(binary("lt", raw, 0), binary("add", raw, out.shape[d]), raw), INDEX)
    inside = binary("and", binary("ge", at, 0), binary("lt", at, out.shape[d]))
    if p.inputs[1] in group.members:            # computed here from what its producers read
        value = Inliner(group.members, read).value_at(p.inputs[1], vs)
    else:
        value = Load(read.index(p.inputs[1]), vs, values.dtype)
    store = Store(0, tuple(at if k == d else v for k, v in enumerate(vs)), value, guards=(inside,))
    axis = TileAxis("x", vs, values.shape, block, 0, grid=0, block_name="XBLOCK")
    comments = (f"{name}: scatter kernel (tilefuse): rows of {p.inputs[1]} written into {p.inputs[0]} at "
                f"{p.inputs[2]} along dim {d}, in its own memory", f"implements: {p.origin}",
                "inputs:  " + " ".join(f"in{k}={n}" for k, n in enumerate(read)),
                f"outputs: out0={p.name} (the memory of {p.inputs[0]})")
    return Kernel(name, tuple(group.types[n] for n in read), (out,), (axis,), (store,), WARPS, 1, comments)


def _row_write(group: Group) -> int | None:
    """The indexed dim of an in-place ``index_put`` this family prints (module docstring), else None:
    the group's last prim, the one it writes, the others elementwise or layout prims computing its
    values (not reading the tensor written)."""
    p = group.prims[-1]
    if group.categories[-1] is not Category.opaque or not p.is_opaque or group.outputs != (p.name,):
        return None
    attrs = dict(p.body.attrs)
    if p.body.fn != "index_put" or not attrs.get("inplace") or len(attrs.get("dims", ())) != 1 or len(p.inputs) != 3:
        return None
    producers = group.prims[:-1]
    if any(c not in _PRODUCERS for c in group.categories[:-1]) or \
            any(p.inputs[0] in q.inputs for q in producers) or p.inputs[0] in group.members or \
            p.inputs[2] in group.members or (producers and p.inputs[1] not in group.members):
        return None
    (d,) = attrs["dims"]
    x, values, index = (group.types[n] for n in p.inputs)
    if index.rank != 1 or not index.dtype.is_int or values.dtype != x.dtype or values.rank != x.rank:
        return None
    want = x.shape[:d] + (index.shape[0],) + x.shape[d + 1:]
    return d if values.shape == want and math.prod(want) > 0 else None
