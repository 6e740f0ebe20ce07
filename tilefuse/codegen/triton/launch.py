"""Compile a tile-level kernel's Triton source: write it under the cache by content hash, import
it, launch.

Kernels are imported from real files so tracebacks and profilers show the generated lines;
identical sources share one module.  Without CUDA the kernels run in the Triton interpreter
(``interpreter.py``): they are decorated for it, and run, inside ``interpreting()``, which changes
nothing outside it.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Callable

import torch

from ...paths import cache_root
from ..kernel import Kernel
from .emit import triton_source
from .interpreter import KERNEL_MODULE, InterpretedLibdevice, interpreted, interpreting

_MODULES: dict[str, object] = {}


def cache_dir() -> Path:
    return cache_root()


def load_kernel(source: str, name: str):
    """The ``@triton.jit`` function ``name`` defined by ``source`` (imported once per source)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    mod = _MODULES.get(digest)
    if mod is None:
        path = _cached(source, digest)
        modname = f"{KERNEL_MODULE}{digest}"
        spec = importlib.util.spec_from_file_location(modname, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[modname] = mod  # Triton looks functions' globals up through their module
        if interpreted():
            with interpreting():           # triton.jit decorates for the interpreter
                spec.loader.exec_module(mod)
            mod.libdevice = InterpretedLibdevice()
        else:
            spec.loader.exec_module(mod)
        _MODULES[digest] = mod
    return getattr(mod, name)


def _cached(source: str, digest: str) -> Path:
    """The kernel's file under the cache, written (atomically: concurrent writers never expose a
    partial file) unless an identical one is there; a corrupt or unreadable entry is rewritten.
    A cache directory that cannot be used (a file, unwritable) is replaced by a temporary one,
    with a warning, rather than failing the compile."""
    data = source.encode()
    for root in (cache_dir(), None):
        if root is None:
            root = _fallback_cache()
        path = root / "kernels" / f"{digest}.py"
        try:
            if path.is_file() and path.read_bytes() == data:
                return path
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
            return path
        except OSError as e:
            if root != cache_dir():
                raise
            warnings.warn(f"tilefuse: the kernel cache {root} cannot be used ({e.strerror or e}); kernels go to "
                          f"a temporary directory this run (set TILEFUSE_CACHE_DIR to a writable folder)",
                          stacklevel=3)
    raise AssertionError("unreachable")


_FALLBACK: list[Path] = []


def _fallback_cache() -> Path:
    if not _FALLBACK:
        import tempfile
        _FALLBACK.append(Path(tempfile.mkdtemp(prefix="tilefuse-cache-")))
    return _FALLBACK[0]


def _torch_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    return torch.empty(size, dtype=torch.int8, device="cuda")


def _descriptor_scratch() -> None:
    """Triton builds a kernel's tensor descriptors in global memory it asks an allocator for (a
    context variable: per thread): set one, torch's caching allocator, unless the caller's
    context has one already."""
    import triton
    try:
        from triton.runtime import _allocation
        if not isinstance(_allocation._allocator.get(), _allocation.NullAllocator):
            return
    except (ImportError, AttributeError):       # another Triton's internals: set ours
        pass
    triton.set_allocator(_torch_scratch)


def compile_kernel(kernel: Kernel) -> tuple[Callable[[list[torch.Tensor], list[torch.Tensor]], None], str]:
    """(launcher, source) of a kernel: the launcher takes its inputs (``kernel.inputs`` order) and
    preallocated contiguous outputs and writes the outputs."""
    source = triton_source(kernel)
    return _launcher(kernel, load_kernel(source, kernel.name), source, {}), source


def compile_generic(kernel: Kernel, generic, size: int) -> Callable[[list[torch.Tensor], list[torch.Tensor]], None]:
    """The launcher of ``kernel`` (generated for ``size``) running its bucket's size-generic source
    (``generic.py``; the caller has checked that it ``matches``) with the size as an argument."""
    from .generic import PARAM
    return _launcher(kernel, load_kernel(generic.source, kernel.name), generic.source, {PARAM: size})


def _launcher(kernel: Kernel, fn, source: str, extra: dict):
    grid = kernel.grid
    blocks = {a.block_name: a.block for a in kernel.axes}
    warps, stages = kernel.num_warps, kernel.num_stages
    empty, tma = kernel.empty, kernel.tma and "make_tensor_descriptor" in source

    def launch(inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        if empty:
            return
        ins = [t.contiguous() for t in inputs]
        if tma:         # a tensor descriptor's base must be 16-byte aligned (a view may not be)
            ins = [t if t.data_ptr() % 16 == 0 else t.clone() for t in ins]
            if not interpreted():
                _descriptor_scratch()
        with interpreting() if interpreted() else contextlib.nullcontext():
            fn[grid](*ins, *outputs, **extra, **blocks, num_warps=warps, num_stages=stages)

    return launch
