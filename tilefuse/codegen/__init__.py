"""Code generation, a pipeline stage: every kernel of a plan built at compile time.

``build_kernels(plan, primgraph)`` names each planned kernel (``naming.py``) and has the family
that scheduled it build it (``families.build``): generated families lower their schedule to the
tile-level kernel IR (``kernel.py``, templates such as ``fused.py``) and print it as Triton
(``triton/``); library kernels plan their vendor call.  Errors surface here, at compile time.
"""
from __future__ import annotations

from .naming import kernel_names


def build_kernels(plan, primgraph) -> tuple:
    """The plan's kernels, built, in plan order (``families.base.Built``)."""
    from ..families import build
    schedules = [k.schedule for k in plan.kernels]
    names = kernel_names(schedules, primgraph.prims)
    return tuple(build(s, n) for s, n in zip(schedules, names))


__all__ = ["build_kernels", "kernel_names"]
