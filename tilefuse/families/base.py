"""The kernel-family protocol (DESIGN.md §6) and the group of prims a candidate kernel computes."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Mapping, Protocol

from ..analysis.classify import Category, classify
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
    seconds: float
    bytes: int            # DRAM bytes moved
    flops: int            # arithmetic operations, recomputation included
    blocks: int           # programs / thread blocks launched

    def __add__(self, other: "Cost") -> "Cost":
        return Cost(self.seconds + other.seconds, self.bytes + other.bytes, self.flops + other.flops,
                    self.blocks + other.blocks)


@dataclass(frozen=True)
class Schedule:
    """Base of every family's schedule: which family, which group, how many programs."""
    family: str
    group: Group
    blocks: int


class KernelFamily(Protocol):
    name: str

    def schedule(self, group: Group, target: Target) -> Schedule | None:
        """A schedule for the group, or None (quickly) if this family cannot build it."""

    def cost(self, sched: Schedule, target: Target) -> Cost:
        """Modelled time, bytes and flops of the scheduled kernel on the target."""
