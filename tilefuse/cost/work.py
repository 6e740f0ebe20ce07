"""A kernel's ``Work``, read from the kernel that is printed (issue #21: one description per kernel).

``work(kernel, target)`` walks the kernel's statements the way the printer places them
(``codegen/triton/emit.py``): the program's top level binds every axis that is covered whole, and
each loop over a looped axis opens a scope binding it; a load lives in the outermost open scope
binding the axes its index varies along (loop-invariant loads are hoisted) and is issued once
per scope (loads are interned; a later loop reuses a load still held by an enclosing scope).
From that walk:

- programs: the grid (``Kernel.grid``);
- bytes: each issued load over one program's box — program-split axes over the program's tile
  (``tiles.tile_box``), every other axis over all of it, since the program's loops cover every
  chunk — in Welder's coalesced transactions (``tiles.site_elems``), times the programs, scaled
  by the share of the last program's tile that is in range; every output written whole once;
  ``tiles.split_l2`` divides the loads between DRAM and L2;
- chunks: the loop iterations of a program (one for the top level when it issues loads or runs no
  loop at all), and the bytes in flight, a chunk's share of the program's loads;
- flops: each statement's expression (``model.expr_flops``, plus one per element combined by a
  reduction) at every position it runs for: the program-split axes' extents times the extents
  of the loops around it (and of its own axis, for a reduction), at the fp32 CUDA-core peak;
- registers: a base for indices and pointers plus, per thread, its share of the tile times the
  values live at once (the loads of the widest scope, at most 8, and the value computed).

Statements that this walk does not cost yet (``Dot``, ``Arrive``: the gemm and chain families
still describe their kernels by hand) raise ``TypeError``.
"""
from __future__ import annotations

import contextlib
import functools
import math
from dataclasses import dataclass

from ..codegen.kernel import Kernel, Loop, Reduce, Store
from ..ir.dtypes import DType
from ..ir.expr import Load, Var, free_vars, walk
from .model import Resources, Work, expr_flops, occupancy
from .target import Target
from .tiles import LoadSite, load_site, site_elems, split_l2, stored_bytes, tile_box

REGISTER_BASE = 24       # per thread: program ids, offsets, pointers, loop counters
MAX_LIVE_LOADS = 8       # loads a thread holds at once, at most (the compiler interleaves the rest)


@dataclass(frozen=True)
class Profile:
    """What a kernel does that does not depend on its block sizes, given which axes are looped:
    the loads each scope issues, and each statement's flops per position with the axes whose
    positions it runs for."""
    scopes: tuple[tuple[str | None, tuple[LoadSite, ...]], ...]   # (looped axis or None: top level, loads)
    flops: tuple[tuple[int, tuple[str, ...]], ...]


def work(kernel: Kernel, target: Target) -> Work:
    """The kernel's work on ``target`` (see the module docstring)."""
    t = _tile(kernel.body, kernel.axes, kernel.inputs, kernel.outputs, target)
    warps = kernel.num_warps
    res = Resources(warps, REGISTER_BASE + -(-t.tile_elems // (warps * target.warp_size)) * t.live)
    concurrent = min(t.programs, occupancy(res, target) * target.sm_count)
    dram, l2 = split_l2(t.per_input, t.programs, concurrent, kernel.inputs, target)
    requested = sum(t.per_input)
    return Work(t.programs, dram + t.stored, l2 + t.stored, t.flops, target.peak(DType.float32, False),
                inflight_bytes=requested / t.chunks, res=res, chunks=t.chunks,
                requested_bytes=requested * t.programs + t.stored)


@dataclass(frozen=True)
class _Tile:
    """What a kernel's work is for one binding of its blocks, whatever its warps."""
    programs: int
    per_input: tuple[float, ...]   # bytes one program's loads request of each input
    stored: float
    chunks: int
    flops: float
    tile_elems: int                # per tile dimension its widest block, multiplied
    live: int                      # values a thread holds per tile element


@functools.lru_cache(maxsize=4096)
def _tile(body: tuple, axes: tuple, inputs: tuple, outputs: tuple, target: Target) -> _Tile:
    """Cached by value: the warp counts a family tries for one tile share it."""
    looped = frozenset(a.name for a in axes if a.looped)
    shape = tuple((a.name, a.vars, a.ext, a.dim, a.grid, a.alias) for a in axes)
    prof = profile(body, shape, looped, len(inputs))
    split = [a for a in axes if a.grid is not None]
    empty = any(t.numel == 0 for t in outputs) or any(a.extent == 0 for a in split)
    programs = 0 if empty else math.prod(max(a.chunks, 1) for a in split)
    # one program's box: program-split axes over its tile, every other axis whole
    ranges = {v: (0, n - 1) for a in axes for v, n in zip(a.vars, a.ext)}
    full = dict(ranges)
    for a in split:
        ranges.update((v, (0, n - 1)) for v, n in tile_box(a.vars, a.ext, a.block).items())
    per_input = [0.0] * len(inputs)
    for _, sites in prof.scopes:
        for site in sites:
            t = inputs[site.load.tensor]
            per_input[site.load.tensor] += site_elems(site, ranges, t, target, full) * t.dtype.itemsize
    # the last program's positions beyond an extent are masked off and move nothing
    tail = math.prod(a.extent / (max(a.chunks, 1) * min(a.block, a.extent)) for a in split if a.extent)
    stored = stored_bytes(outputs, target)
    by_name = {a.name: a for a in axes}
    chunks = sum(max(by_name[ax].chunks, 1) if ax else 1 for ax, _ in prof.scopes) or 1
    positions = math.prod(a.extent for a in split)
    flops = sum(f * positions * math.prod(by_name[x].extent for x in over) for f, over in prof.flops)
    dims: dict[int, int] = {}
    for a in axes:
        if a.dim >= 0:
            dims[a.dim] = max(dims.get(a.dim, 1), a.block)
    widest = max((len(sites) for _, sites in prof.scopes), default=0)
    return _Tile(programs, tuple(p * tail for p in per_input), stored, chunks, flops, math.prod(dims.values()),
                 min(widest, MAX_LIVE_LOADS) + 1)


@functools.lru_cache(maxsize=4096)
def profile(body: tuple, shape: tuple, looped: frozenset, num_inputs: int) -> Profile:
    """The kernel's ``Profile`` from its statements, its axes (name, vars, ext, dim, grid, alias)
    and the axes that are looped.  Cached by value: a family lowers a body once and binds block
    sizes per candidate, which changes neither."""
    return _Walk(shape, looped, num_inputs).run(body)


class _Walk:
    def __init__(self, shape: tuple, looped: frozenset, num_inputs: int):
        self.axis_of = {v: name for name, vars_, *_ in shape for v in vars_}
        aliases: dict[str, set[str]] = {}
        for name, _, _, _, _, alias in shape:
            aliases.setdefault(alias or name, set()).add(name)
        self.binds = {k: frozenset(v) for k, v in aliases.items()}
        whole = frozenset().union(*(self.binds[name] for name, *_rest, alias in shape
                                    if not alias and name not in looped))
        self.looped, self.nin = looped, num_inputs
        self.stack: list[tuple[frozenset, dict]] = [(whole, {})]     # open scopes: bound axes, loads
        self.scopes: list[tuple[str | None, dict]] = [(None, self.stack[0][1])]
        self.flops: list[tuple[int, tuple[str, ...]]] = []
        self.around: list[str] = []                                   # enclosing Loop axes

    def run(self, body) -> Profile:
        self.statements(body)
        scopes = tuple((ax, tuple(load_site(ld) for ld in loads)) for ax, loads in self.scopes
                       if loads or ax is not None)
        if not scopes:
            scopes = ((None, ()),)
        return Profile(scopes, tuple(self.flops))

    def statements(self, body) -> None:
        for st in body:
            if isinstance(st, Store):
                for e in (st.value, *st.index, *st.guards):
                    self.loads(e)
                self.flops.append((expr_flops(st.value), tuple(self.around)))
            elif isinstance(st, Reduce):
                with self.scope(st.axis):
                    self.loads(st.value)
                self.flops.append((expr_flops(st.value) + 1, (*self.around, st.axis)))
            elif isinstance(st, Loop) and not st.state and st.stop is None:
                with self.scope(st.axis):
                    self.around.append(st.axis)
                    self.statements(st.body)
                    self.around.pop()
            else:
                raise TypeError(f"work: {type(st).__name__} statements are not costed from the kernel yet")

    @contextlib.contextmanager
    def scope(self, axis: str):
        """A loop over ``axis`` when it is looped and not bound yet (by an enclosing loop)."""
        bound = self.stack[-1][0]
        if axis not in self.looped or axis in bound:
            yield                          # covered whole (or this chunk of an enclosing loop)
            return
        loads: dict = {}
        self.stack.append((bound | self.binds[axis], loads))
        self.scopes.append((axis, loads))
        try:
            yield
        finally:
            self.stack.pop()

    def loads(self, e) -> None:
        """Place every memory load of ``e`` in its scope, once."""
        for n in walk(e):
            if not isinstance(n, Load) or n.tensor >= self.nin:
                continue
            if any(n in loads for _, loads in self.stack):
                continue
            axes = frozenset(self.axis_of[v] for v in _index_vars(n) if v in self.axis_of)
            home = next(loads for bound, loads in self.stack if axes <= bound)
            home[n] = None


def _index_vars(ld: Load) -> set[Var]:
    out: set[Var] = set()
    for e in ld.index:
        out |= free_vars(e)
    return out
