"""Code generation: the tile-level kernel IR (``kernel.py``), the templates that build kernels
from a family's schedule (``fused.py``, ``gemm.py``, ``chain.py``), the Triton printer and
launcher (``triton/``) and kernel names (``naming.py``).  Building a plan's kernels is a stage
above the families (``tilefuse/build.py``); nothing here imports the families."""
from __future__ import annotations

from .naming import kernel_names

__all__ = ["kernel_names"]
