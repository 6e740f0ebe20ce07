"""The kernel-family protocol (DESIGN.md §6), the group of prims a candidate kernel computes, its
cost, and the runnable kernel a family builds from a schedule."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable, Mapping, Protocol, Sequence

from ..analysis.classify import Category, classify
from ..cost.model import Work, estimate
from ..cost.target import Target
from ..ir.dtypes import TensorType
from ..ir.prim import Prim


@dataclass(frozen=True, eq=False)
class Group:
    """The prims of one candidate kernel (topological order), what it reads and what it writes."""
    prims: tuple[Prim, ...]
    inputs: tuple[str, ...]            # tensors read from outside the group
    outputs: tuple[str, ...]           # member prims whose values the kernel writes
    types: Mapping[str, TensorType]    # types of every tensor the group touches

    @cached_property
    def categories(self) -> tuple[Category, ...]:
        return tuple(classify(p) for p in self.prims)

    @cached_property
    def members(self) -> Mapping[str, Prim]:
        return {p.name: p for p in self.prims}

    def ops(self) -> tuple[str, ...]:
        """Source operators, in order, without repeats."""
        return tuple(dict.fromkeys(f"{p.origin.op}:{p.origin.name}" for p in self.prims))


@dataclass(frozen=True)
class Cost:
    """A kernel's modelled (or measured) time and what it was derived from."""
    seconds: float
    bytes: int            # DRAM bytes moved
    flops: int            # arithmetic operations, recomputation included
    blocks: int           # programs / thread blocks launched
    l2_bytes: int = 0     # bytes requested through L2 (re-reads included)
    warps: int = 0        # per program
    waves: int = 0
    occupancy: int = 0    # programs resident per SM
    bound: str = ""       # dram | l2 | compute | launch (link: a collective): the term that dominates
    measured: bool = False

    @staticmethod
    def modelled(work: Work, target: Target, cuda_graph: bool = False) -> "Cost":
        """A kernel's cost, its tail phase included (same launch)."""
        est = estimate(work, target, cuda_graph=cuda_graph)
        seconds, dram, l2, flops = est.seconds, work.dram_bytes, work.l2_bytes, work.flops
        if work.tail is not None:
            seconds += estimate(work.tail, target).body
            dram, l2, flops = dram + work.tail.dram_bytes, l2 + work.tail.l2_bytes, flops + work.tail.flops
        return Cost(seconds, int(dram), int(flops), work.programs, int(l2), work.res.warps, est.waves,
                    est.occupancy, est.bound)

    @staticmethod
    def of(works: Sequence[Work], target: Target, cuda_graph: bool = False) -> "Cost":
        """The cost of kernels launched one after the other (a split-K GEMM's two): times and
        traffic add up; the grid, warps and occupancy are the first's."""
        first, *rest = [Cost.modelled(w, target, cuda_graph) for w in works]
        return replace(first, seconds=first.seconds + sum(c.seconds for c in rest),
                       bytes=first.bytes + sum(c.bytes for c in rest),
                       flops=first.flops + sum(c.flops for c in rest),
                       l2_bytes=first.l2_bytes + sum(c.l2_bytes for c in rest))


@dataclass(frozen=True)
class Schedule:
    """Base of every family's schedule: which family, which group, how many programs, and the
    work the kernel does (what the cost model times)."""
    family: str
    group: Group
    blocks: int
    work: Work
    then: tuple[Work, ...] = field(default=(), kw_only=True)   # the work of kernels launched after this one (split-K's reduction)

    def tile_key(self) -> tuple:
        """The family's own choices (tile sizes, warps, ...), part of ``key``."""
        return ()

    def requested_bytes(self) -> float:
        """What the kernel's loads and stores ask for before any cache credit (the traffic
        audit's modelled side), its tail and later kernels included."""
        return sum(w.requested_bytes + (w.tail.requested_bytes if w.tail else 0.0) for w in (self.work, *self.then))

    def key(self) -> str:
        """Structural identity (shapes, dtypes, index maps, tile choice; never prim names): equal
        for the same kernel in two layers; the tuning cache's key."""
        g = self.group
        pos = {p.name: k for k, p in enumerate(g.prims)}
        ext = {n: k for k, n in enumerate(g.inputs)}
        prims = tuple((p.signature, tuple(("p", pos[n]) if n in pos else ("x", ext[n]) for n in p.inputs))
                      for p in g.prims)
        shape = (self.family, prims, tuple(g.types[n] for n in g.inputs), tuple(pos[o] for o in g.outputs),
                 self.tile_key())
        return hashlib.sha256(repr(shape).encode()).hexdigest()[:24]


# Runs one kernel: (inputs in Built.inputs order, outputs in Built.outputs order then its scratch
# buffers, preallocated and contiguous) -> None; it writes every output.
KernelFn = Callable[[list, list], None]


@dataclass(frozen=True)
class Scratch:
    """A buffer a built kernel needs besides its outputs, declared by its kernels
    (``Kernel.workspaces``, ``Kernel.counters``) so that whoever runs it places it: the memory
    planner puts workspaces in the arena, live for that kernel only, and counters in a buffer
    zeroed once per program (every launch leaves them at zero, so CUDA-graph replays need no
    memset)."""
    type: TensorType
    zeroed: bool = False       # zero before the first launch, and left at zero by every launch


@dataclass(frozen=True)
class Built:
    """A kernel ready to run, built from a schedule at compile time."""
    name: str                  # the report's, the Triton function's and the profiler's name
    family: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    run: KernelFn
    source: str                # generated Triton source, or what the library/torch call does
    language: str              # "triton" | "torch"
    scratch: tuple[Scratch, ...] = ()   # passed to ``run`` after the outputs
    kernels: tuple = ()        # the tile-level kernels it launches, in order (generated families:
                               # what ``source`` prints and native compilation compiles)
    size_arg: int | None = None    # runs its bucket's size-generic source with this size
                                   # (``codegen/triton/generic.py``); None: its own source
    # a collective: ``start(inputs, outputs)`` issues it without waiting and returns a call that
    # waits and writes the outputs (``orchestrate/overlap.py``); None: ``run`` waits
    start: Callable | None = None
    # what ``run`` passes each of ``kernels`` (its inputs, then its outputs, in parameter order),
    # by name: the built kernel's inputs' and outputs', and ``SCRATCH.format(j)`` for its scratch
    # buffer j; () for a plain kernel (its inputs, then its outputs)
    wiring: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = ()
    # its output may be its first input's own memory (it then writes only what changes: an
    # in-place index_put into a KV cache); the runtime decides (``executor.Program``, ``donate``)
    inplace: bool = False

    @property
    def plain(self) -> bool:
        """One generated kernel launched as it is: no second kernel, no scratch (what a size-generic
        source can replace)."""
        return self.language == "triton" and len(self.kernels) == 1 and not self.scratch and not self.wiring

    @property
    def launches(self) -> tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] | None:
        """Each generated kernel's tensors by name, in launch order (``wiring``): what a persistent
        kernel needs to run them as its phases; None where ``run`` does more than launch them
        (a library call, a collective, a launcher whose wiring is not declared)."""
        if self.language != "triton" or not self.kernels or self.start is not None:
            return None
        if self.wiring:
            return self.wiring
        return ((self.inputs, self.outputs),) if self.plain else None


SCRATCH = "#scratch{}"     # a built kernel's scratch buffer in its ``wiring`` (no tensor name has a #)


def holding(data, out):
    """``out`` holding ``data``'s values, for an in-place kernel (``Built.inplace``) to write into:
    nothing to do where the runtime gave it ``data``'s own memory, else a copy."""
    if out.data_ptr() != data.data_ptr():
        out.copy_(data)
    return out




class KernelFamily(Protocol):
    name: str

    def schedules(self, group: Group, target: Target) -> list[Schedule]:
        """Top-k schedules for the group, best first; [] (quickly) if this family cannot build it."""

    def cost(self, schedule: Schedule, target: Target, cuda_graph: bool = False) -> Cost:
        """The schedule's modelled cost as the plan runs it (per launch or in a CUDA graph)."""

    def build(self, schedule: Schedule, name: str) -> Built:
        """The runnable kernel (generated source or a library call); raises on what it cannot build."""

    # generated families also have ``kernels(schedule, name) -> tuple[Kernel, ...]``: the
    # tile-level kernels ``build`` prints and launches, in launch order (their ``work`` is the
    # schedule's ``work`` and ``then``)


class Family:
    """What families share: the modelled cost of a schedule's work."""
    name = ""

    def cost(self, schedule: Schedule, target: Target, cuda_graph: bool = False) -> Cost:
        if schedule.then:
            return Cost.of((schedule.work, *schedule.then), target, cuda_graph)
        return Cost.modelled(schedule.work, target, cuda_graph)


def arriving(family: str, kernel, inputs: tuple[str, ...], back: tuple[int, ...], outputs: tuple[str, ...],
             name: str, scratch: tuple[Scratch, ...]) -> Built:
    """The launcher of a kernel whose programs ``Arrive`` (a two-phase epilogue, split-K or a
    chain's key split in one launch): the kernel reads back, as inputs after ``inputs``, the
    buffers ``back`` (indices into the outputs, then the scratch: a workspace it writes); its
    scratch (``Built.scratch``) holds those workspaces and the groups' counters, zero before the
    first launch and left at zero by every launch (a failed launch zeroes them again)."""
    from ..codegen.triton import compile_kernel
    launch, source = compile_kernel(kernel)

    def run(ins, outs):                 # outs: the outputs, then the workspaces, the counters
        try:
            launch(list(ins) + [outs[j] for j in back], list(outs))
        except BaseException:
            outs[-1].zero_()
            raise

    names = outputs + tuple(SCRATCH.format(j) for j in range(len(scratch)))
    return Built(name, family, inputs, outputs, run, source, "triton", scratch, kernels=(kernel,),
                 wiring=(((*inputs, *(names[j] for j in back)), names),))
