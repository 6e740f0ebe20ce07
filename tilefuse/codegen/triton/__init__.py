"""Triton code generation: a tile-level kernel (codegen/kernel.py) printed as source
(``triton_source``) and loaded as a launcher (``compile_kernel``)."""
from .emit import triton_source
from .launch import compile_kernel

__all__ = ["triton_source", "compile_kernel"]
