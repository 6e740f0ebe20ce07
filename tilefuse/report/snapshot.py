"""What a report keeps to draw its plan: prims, kernels with their schedules and sources, the
target's roofs.  Plain data (strings and numbers), so a kept report holds no weights, buffers or
compiled functions of the model it came from."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..analysis.classify import classify
from ..cost.roofline import peak_of
from ..ir.dtypes import DType


@dataclass(frozen=True)
class PrimView:
    name: str
    op: str                   # source operator type
    node: str                 # source node name
    location: str             # user source location ("" when unknown)
    category: str
    type: str                 # "float32[2, 16, 64]"
    inputs: tuple[str, ...]


@dataclass(frozen=True)
class KernelView:
    prims: tuple[str, ...]    # member prims, topological order
    inputs: tuple[str, ...]   # tensors read from outside the kernel
    outputs: tuple[str, ...]  # tensors the kernel writes
    schedule: str             # the family's choices (tiles, warps, stages, ...)
    source: str               # generated Triton, or what the library/torch call does
    language: str             # "triton" | "torch" | "" (not built)


@dataclass(frozen=True)
class Roofs:
    dram_bw: float                          # bytes/s, peak
    ceilings: tuple[tuple[str, float], ...]  # (label, FLOP/s), highest first


@dataclass(frozen=True)
class PlanSnapshot:
    prims: tuple[PrimView, ...]             # every prim of the compiled graph, topological order
    graph_inputs: tuple[tuple[str, str], ...]   # (name, type)
    constants: frozenset[str]
    outputs: tuple[str, ...]
    kernels: tuple[KernelView, ...]         # plan order, as Report.kernels
    roofs: Roofs


# Schedule fields that are not the family's choices: what every schedule has, or derived data.
_NOT_CHOICES = {"family", "group", "blocks", "work", "body", "tail"}


def schedule_text(schedule) -> str:
    """The family's own choices, generically: the schedule's fields beyond the base ones."""
    if schedule is None or not dataclasses.is_dataclass(schedule):
        return ""
    parts = []
    for f in dataclasses.fields(schedule):
        if f.name in _NOT_CHOICES:
            continue
        v = getattr(schedule, f.name)
        if dataclasses.is_dataclass(v):
            v = ", ".join(f"{g.name}={getattr(v, g.name)!r}" for g in dataclasses.fields(v))
            parts.append(f"{f.name}: {v}")
        else:
            parts.append(f"{f.name}={v!r}")
    return "; ".join(parts)


def roofs(target, primgraph) -> Roofs:
    """The target's DRAM roof and the compute ceilings the model's prims run against
    (``cost/roofline.py: peak_of``)."""
    by_value: dict[float, list[str]] = {}
    for p in primgraph.prims:
        if not p.is_opaque:
            peak, label = peak_of(p, target)
            by_value.setdefault(peak, []).append(label)
    by_value.setdefault(target.peak(DType.float32, False), []).append("float32 CUDA cores")
    ceilings = tuple((" / ".join(dict.fromkeys(labels)), v) for v, labels in sorted(by_value.items(), reverse=True))
    return Roofs(target.dram_bw, ceilings)


def snapshot(primgraph, plan, kernels, target) -> PlanSnapshot:
    """The plan as the HTML report draws it; ``kernels`` are the built kernels in plan order
    (``families.base.Built``), or empty when none were built."""
    prims = tuple(PrimView(p.name, p.origin.op, p.origin.name, p.origin.location or "", classify(p).value,
                           str(p.out), tuple(p.inputs)) for p in primgraph.prims)
    built = list(kernels) or [None] * len(plan.kernels)
    views = tuple(KernelView(tuple(p.name for p in k.prims), tuple(k.inputs), tuple(k.outputs),
                             schedule_text(k.schedule), b.source if b else "", b.language if b else "")
                  for k, b in zip(plan.kernels, built))
    return PlanSnapshot(prims, tuple((d.name, str(d.type)) for d in primgraph.inputs),
                        frozenset(c.name for c in primgraph.constants), tuple(primgraph.outputs), views,
                        roofs(target, primgraph))
