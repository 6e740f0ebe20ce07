"""Triton code generation: ``emit_*`` returns kernel source text, ``compile_*`` a callable kernel."""
from .emit import emit_fused, kernel_name
from .launch import compile_fused

__all__ = ["emit_fused", "kernel_name", "compile_fused"]
