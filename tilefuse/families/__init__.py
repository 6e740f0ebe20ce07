"""Kernel families, found through one registry: every family a plan may use, by name.

The coster asks each registered family for schedules; the runtime builds every planned kernel with
the family that scheduled it (``build``), so nothing outside this package names a family.
"""
from __future__ import annotations

from .base import Built, Cost, Family, Group, KernelFamily, Schedule
from .chain import ChainFamily
from .collective import CollectiveFamily
from .fused import FusedFamily
from .gemm import GemmFamily
from .library import LibraryFamily
from .opaque import OpaqueFamily
from .scatter import ScatterFamily

# In the order the coster consults them (the cheapest rejection first).
FAMILIES: tuple[KernelFamily, ...] = (CollectiveFamily(), ScatterFamily(), OpaqueFamily(), LibraryFamily(), GemmFamily(),
                                      ChainFamily(), FusedFamily())
_BY_NAME = {f.name: f for f in FAMILIES}


def family(name: str) -> KernelFamily:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"no kernel family {name!r}; registered: {sorted(_BY_NAME)}") from None


def generated(schedule: Schedule) -> bool:
    """Whether the schedule's family generates its kernels (Triton source: ``kernels(schedule,
    name)``) rather than calling a library, torch or a collective."""
    return hasattr(family(schedule.family), "kernels")


def build(schedule: Schedule, name: str) -> Built:
    """The runnable kernel of a schedule, built by its family."""
    return family(schedule.family).build(schedule, name)


__all__ = ["FAMILIES", "family", "generated", "build", "Built", "Cost", "Family", "Group", "KernelFamily", "Schedule"]
