"""Compile a tile-level kernel's Triton source: write it under the cache by content hash, import
it, launch.

Kernels are imported from real files so tracebacks and profilers show the generated lines;
identical sources share one module.  Without CUDA the kernels run in the Triton interpreter,
which ``triton.jit`` selects at decoration time from ``TRITON_INTERPRET`` (set before a kernel is
loaded; triton's standard library is re-decorated if triton was imported without it).
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

_MODULES: dict[str, object] = {}

# libdevice names the emitter uses -> the torch function with the executor's semantics.
_TORCH_LIBDEVICE = {
    "tan": torch.tan, "asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh,
    "cosh": torch.cosh, "tanh": torch.tanh, "asinh": torch.asinh, "acosh": torch.acosh,
    "atanh": torch.atanh, "erf": torch.erf, "rint": torch.round, "trunc": torch.trunc,
    "log1p": torch.log1p, "expm1": torch.expm1, "fmod": torch.fmod, "pow": torch.pow,
}


class _InterpretedLibdevice:
    """Stands in for ``libdevice`` under the Triton interpreter, which cannot run it.

    The interpreter calls kernel globals as plain Python on tiles holding numpy arrays, so each
    function evaluates with torch on those arrays and wraps the result as a tile again.
    """

    def __getattr__(self, name):
        fn = _TORCH_LIBDEVICE[name]

        def call(*args):
            import triton.language as tl
            from triton.runtime.interpreter import TensorHandle
            data = [torch.from_numpy(a.handle.data) for a in args]
            out = fn(*data).to(data[0].dtype).numpy()
            ty = tl.block_type(args[0].dtype, list(out.shape)) if out.ndim else args[0].dtype
            return tl.tensor(TensorHandle(out, args[0].handle.dtype), ty)

        return call


def cache_dir() -> Path:
    return cache_root()


def load_kernel(source: str, name: str):
    """The ``@triton.jit`` function ``name`` defined by ``source`` (imported once per source)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    mod = _MODULES.get(digest)
    if mod is None:
        if not torch.cuda.is_available():
            _require_interpreter()
        path = _cached(source, digest)
        modname = f"{_KERNEL_MODULE}{digest}"
        spec = importlib.util.spec_from_file_location(modname, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[modname] = mod  # Triton looks functions' globals up through their module
        spec.loader.exec_module(mod)
        if os.environ.get("TRITON_INTERPRET") == "1":
            mod.libdevice = _InterpretedLibdevice()
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


def _require_interpreter() -> None:
    """Make sure triton runs kernels in its interpreter (no CUDA device here).

    ``triton.jit`` picks the interpreter from ``TRITON_INTERPRET`` when it decorates a function.
    Kernels are decorated when they are loaded, after this sets it; triton's own jit functions were
    decorated when triton was first imported, which may have been before tilefuse set it."""
    os.environ["TRITON_INTERPRET"] = "1"
    _interpret_language()
    _bf16_dot_in_interpreter()
    _bf16_rounding_in_interpreter()
    _nan_max_min_in_interpreter()
    _bool_masks_in_interpreter()


def _interpret_language() -> None:
    """Re-decorate for the interpreter the jit functions of ``triton.language`` (``tl.max``,
    ``tl.softmax``, their tensor-method forms) that were decorated for a GPU, because triton was
    imported without ``TRITON_INTERPRET=1`` (``torch.export`` imports it, for one): the state that
    importing tilefuse first gives.  Each function gets one replacement wherever it is bound, since
    the interpreter recognises reduction combiners (``tl.standard._sum_combine``) by identity."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    replaced: dict[int, InterpretedFunction] = {}
    owners = [m for n, m in list(sys.modules.items())
              if m is not None and (n == "triton.language" or n.startswith("triton.language."))]
    for owner in (*owners, tl.tensor):
        for name, value in list(vars(owner).items()):
            if isinstance(value, JITFunction):
                if id(value) not in replaced:
                    replaced[id(value)] = InterpretedFunction(value.fn)
                setattr(owner, name, replaced[id(value)])


def _bf16_dot_in_interpreter() -> None:
    """The interpreter keeps bfloat16 tiles as their raw uint16 bits and multiplies those in
    ``tl.dot`` (Triton 3.6 and 3.9): widen them to the fp32 values they stand for first (exact;
    a tensor core multiplies bf16 exactly and accumulates in fp32 too)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle
    dot = InterpreterBuilder.create_dot
    if getattr(dot, "_tilefuse_bf16", False):
        return

    def widen(t):
        if t.dtype != tl.bfloat16:
            return t
        if t.data.dtype == np.uint16:       # the raw bits (a masked load may hold floats already)
            return TensorHandle((t.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
        return TensorHandle(t.data.astype(np.float32), tl.float32)

    def create_dot(self, a, b, d, *args, **kwargs):
        return dot(self, widen(a), widen(b), d, *args, **kwargs)

    create_dot._tilefuse_bf16 = True
    InterpreterBuilder.create_dot = create_dot


def _bf16_rounding_in_interpreter() -> None:
    """The interpreter converts fp32 to bfloat16 by dropping the low mantissa bits (Triton 3.9); a
    GPU rounds to nearest even, as torch and the reference executor do: round through torch."""
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle
    cast = InterpreterBuilder.cast_impl
    if getattr(cast, "_tilefuse_bf16", False):
        return

    def cast_impl(self, src, dst_type):
        if dst_type.scalar == tl.bfloat16 and src.dtype.scalar == tl.float32:
            f32 = torch.from_numpy(np.array(src.data, dtype=np.float32))
            return TensorHandle(f32.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16), tl.bfloat16)
        return cast(self, src, dst_type)

    cast_impl._tilefuse_bf16 = True
    InterpreterBuilder.cast_impl = cast_impl


def _bool_masks_in_interpreter() -> None:
    """A block mask and-ed with a scalar condition (the bounds of a gathered batch index, which a
    gemm kernel loads once per program) holds int32 data in the interpreter (Triton 3.9), and its
    masked load and store refuse that ("mask has unsupported dtype"): hand them bools."""
    import numpy as np
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle
    load, store = InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store
    if getattr(load, "_tilefuse_bool", False):
        return

    def boolean(mask):
        if mask is None or mask.data.dtype == np.bool_:
            return mask
        return TensorHandle(mask.data != 0, mask.dtype)

    def create_masked_load(self, ptrs, mask, other, *args, **kwargs):
        return load(self, ptrs, boolean(mask), other, *args, **kwargs)

    def create_masked_store(self, ptrs, value, mask, *args, **kwargs):
        return store(self, ptrs, value, boolean(mask), *args, **kwargs)

    create_masked_load._tilefuse_bool = True
    InterpreterBuilder.create_masked_load = create_masked_load
    InterpreterBuilder.create_masked_store = create_masked_store


_KERNEL_MODULE = "tilefuse_kernel_"
_NAN_REDUCTIONS = {"_maximum": "max", "_minimum": "min"}   # the helpers codegen/triton/ops.py defines


def _nan_max_min_in_interpreter() -> None:
    """The interpreter reduces with a combine function it does not know one element at a time in
    Python (a max-pool over a 200-wide window took a minute); the kernels' NaN-propagating
    ``_maximum``/``_minimum`` combiners are numpy's ``max``/``min``, which propagate NaN too."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import ReduceOps
    apply = ReduceOps.apply_impl
    if getattr(apply, "_tilefuse_nan", False):
        return

    def apply_impl(self, input):
        fn = getattr(self.combine_fn, "fn", None)
        op = _NAN_REDUCTIONS.get(getattr(fn, "__name__", None))
        if (op is not None and len(input) == 1 and input[0].dtype != tl.bfloat16     # bf16: raw bits
                and getattr(fn, "__module__", "").startswith(_KERNEL_MODULE)):
            return self.min_max(input[0], val_reduce_op=getattr(np, op))
        return apply(self, input)

    apply_impl._tilefuse_nan = True
    ReduceOps.apply_impl = apply_impl


# The interpreter keeps its program index and patched builder in module globals: two threads
# interpreting kernels at once would read each other's; kernels on a GPU need no lock.
_INTERPRETING = threading.RLock()


def _interpreter_lock():
    if os.environ.get("TRITON_INTERPRET") == "1":
        return _INTERPRETING
    return contextlib.nullcontext()


def _quiet_masked_lanes():
    """The interpreter evaluates masked-off lanes too (log(0), 0/0 on padding), and numpy warns
    about them; their values are never stored.  On a GPU there is nothing to silence."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        import numpy as np
        return np.errstate(all="ignore")
    return contextlib.nullcontext()


def compile_kernel(kernel: Kernel) -> tuple[Callable[[list[torch.Tensor], list[torch.Tensor]], None], str]:
    """(launcher, source) of a kernel: the launcher takes its inputs (``kernel.inputs`` order) and
    preallocated contiguous outputs and writes the outputs."""
    source = triton_source(kernel)
    fn = load_kernel(source, kernel.name)
    grid = kernel.grid
    blocks = {a.block_name: a.block for a in kernel.axes}
    warps, stages = kernel.num_warps, kernel.num_stages
    empty = kernel.empty

    def launch(inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        if empty:
            return
        with _interpreter_lock(), _quiet_masked_lanes():
            fn[grid](*(t.contiguous() for t in inputs), *outputs, **blocks, num_warps=warps, num_stages=stages)

    return launch, source
