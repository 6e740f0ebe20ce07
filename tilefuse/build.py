"""Kernel building, a pipeline stage above the families: every kernel of a plan built at compile
time.

``build_kernels(plan, primgraph)`` names each planned kernel (``codegen/naming.py``) and has the
family that scheduled it build it (``families.build``): generated families lower their schedule
to the tile-level kernel IR (``codegen/kernel.py``; each family's ``template.py``) and
print it as Triton (``codegen/triton/``); library kernels plan their vendor call (``vendor/``).
Errors surface here, at compile time.
"""
from __future__ import annotations

from .codegen.naming import kernel_names
from .families import build
from .log import logger
from .progress import report

_log = logger("kernels")


def build_kernels(plan, primgraph, generics: tuple = (), size: int | None = None) -> tuple:
    """The plan's kernels, built, in plan order (``families.base.Built``); ``generics`` (per
    kernel, from a bucket's template) serve a kernel with its size-generic source where that is its
    own source at ``size`` (``codegen/triton/generic.py``)."""
    from .codegen.triton.generic import serve
    schedules = [k.schedule for k in plan.kernels]
    names = kernel_names(schedules, primgraph.prims)
    built = []
    for i, (s, n) in enumerate(zip(schedules, names)):
        b = build(s, n)
        if i < len(generics):
            b = serve(b, generics[i], size)
        _log.info("kernel %d %s: %s, %s, %d source lines (%s)", i, b.name, b.family, _describe(s),
                  b.source.count("\n") + 1, b.language)
        built.append(b)
        report("generating kernels", i + 1, len(schedules))
    return tuple(built)


def _describe(schedule) -> str:
    """The family's own choices (``Schedule.tile_key``: tile sizes, warps, ...), for the log."""
    return f"{schedule.blocks} programs, choices {schedule.tile_key()}"
