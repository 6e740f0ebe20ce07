"""Code generation, a pipeline stage: every kernel of a plan built at compile time.

``build_kernels(plan, primgraph)`` names each planned kernel (``naming.py``) and has the family
that scheduled it build it (``families.build``): generated families lower their schedule to the
tile-level kernel IR (``kernel.py``, templates such as ``fused.py``) and print it as Triton
(``triton/``); library kernels plan their vendor call.  Errors surface here, at compile time.
"""
from __future__ import annotations

from ..log import logger
from ..progress import report
from .naming import kernel_names

_log = logger("kernels")


def build_kernels(plan, primgraph) -> tuple:
    """The plan's kernels, built, in plan order (``families.base.Built``)."""
    from ..families import build
    schedules = [k.schedule for k in plan.kernels]
    names = kernel_names(schedules, primgraph.prims)
    built = []
    for i, (s, n) in enumerate(zip(schedules, names)):
        b = build(s, n)
        _log.info("kernel %d %s: %s, %s, %d source lines (%s)", i, b.name, b.family, _describe(s),
                  b.source.count("\n") + 1, b.language)
        built.append(b)
        report("generating kernels", i + 1, len(schedules))
    return tuple(built)


def _describe(schedule) -> str:
    """The family's own choices (``Schedule.tile_key``: tile sizes, warps, ...), for the log."""
    return f"{schedule.blocks} programs, choices {schedule.tile_key()}"


__all__ = ["build_kernels", "kernel_names"]
