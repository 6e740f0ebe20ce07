"""Triton's interpreter, as tilefuse runs generated kernels on a machine without CUDA.

``triton.jit`` decorates a function for the interpreter when ``TRITON_INTERPRET`` is 1; the
interpreter then runs it as Python on numpy tiles.  tilefuse changes nothing at import:
``interpreting()`` switches the interpreter on around what needs it (decorating a kernel when it
is loaded, and each launch), and restores on exit everything it changed:

- ``TRITON_INTERPRET`` (its previous value, or its absence);
- the jit functions of ``triton.language`` (``tl.max``, ``tl.softmax``, their tensor-method
  forms), decorated for a GPU when triton was imported without the variable: each is bound to
  one interpreted replacement wherever it is bound, since the interpreter recognises reduction
  combiners (``tl.standard._sum_combine``) by identity;
- four corrections to the interpreter (``_CORRECTIONS``): bf16 products of the values rather than
  of their raw bits, fp32 → bf16 rounded to nearest even, NaN-propagating max/min reduced by
  numpy, bool masks for masked loads and stores; and one saving: no integer overflow checks whose
  assert the interpreter drops anyway.

The interpreter keeps its program index and patched builder in module globals, so interpreted
launches are serialized (one lock, re-entrant: a kernel loaded inside a launch's context).
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
import types
from typing import Callable, Iterator

import torch

KERNEL_MODULE = "tilefuse_kernel_"          # generated kernels' module names start so
_NAN_REDUCTIONS = {"_maximum": "max", "_minimum": "min"}   # the helpers codegen/triton/ops.py defines

# libdevice names the emitter uses -> the torch function with the executor's semantics.
_TORCH_LIBDEVICE = {
    "tan": torch.tan, "asin": torch.asin, "acos": torch.acos, "atan": torch.atan, "sinh": torch.sinh,
    "cosh": torch.cosh, "tanh": torch.tanh, "asinh": torch.asinh, "acosh": torch.acosh,
    "atanh": torch.atanh, "erf": torch.erf, "rint": torch.round, "trunc": torch.trunc,
    "log1p": torch.log1p, "expm1": torch.expm1, "fmod": torch.fmod, "pow": torch.pow,
}


def interpreted() -> bool:
    """Whether tilefuse runs its kernels in the interpreter: on a machine without CUDA."""
    return not torch.cuda.is_available()


class InterpretedLibdevice:
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


_LOCK = threading.RLock()
_depth = 0
_undo: list[tuple[object, str, object]] = []      # (owner, attribute, what it held), in order set
_env: list[str | None] = []


@contextlib.contextmanager
def interpreting() -> Iterator[None]:
    """The interpreter switched on (see the module docstring) and masked-off lanes' numpy
    warnings silenced (the interpreter evaluates them too: log(0), 0/0 on padding; their values
    are never stored); everything restored on exit."""
    import numpy as np
    global _depth
    with _LOCK:
        if _depth == 0:
            # triton imported first here, under the variable, would decorate its own language
            # for the interpreter for good (native compiles would then fail): import it before
            importlib.import_module("triton.language")
            _env.append(os.environ.get("TRITON_INTERPRET"))
            os.environ["TRITON_INTERPRET"] = "1"
            _language.append(_language_state())
            try:
                _interpret_language()
                for correct in _CORRECTIONS:
                    correct()
            except BaseException:
                _restore()
                raise
        _depth += 1
        try:
            with np.errstate(all="ignore"):
                yield
        finally:
            _depth -= 1
            if _depth == 0:
                _restore()


def _restore() -> None:
    while _undo:
        owner, name, old = _undo.pop()
        setattr(owner, name, old)
    for owner, before in _language.pop():
        now = dict(vars(owner))
        for name in now.keys() - before.keys():
            if not isinstance(now[name], types.ModuleType):    # (a submodule imported meanwhile stays)
                delattr(owner, name)
        for name, value in before.items():
            if now.get(name, _language) is not value:
                setattr(owner, name, value)
    old = _env.pop()
    if old is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = old


_language: list = []     # per outermost context: (namespace, its attributes) of _LANGUAGE_OWNERS


def _language_state() -> tuple:
    """The attributes of the triton.language namespaces Triton's interpreter patches when it runs
    a kernel or calls a jit helper from one (``_patch_lang``): a helper's call patches them and never
    restores them (Triton 3.9), which would leave ``tl.tensor``'s operators interpreting and break a
    later native compile (``native.py``).  Restored on exit."""
    import triton.language as tl
    owners = [tl, tl.core, tl.math, tl.tensor, tl.core.tensor_descriptor_base, tl.core.dtype,
              getattr(tl.core, "condition", None)]
    return tuple((o, dict(vars(o))) for o in dict.fromkeys(o for o in owners if o is not None))


def _set(owner, name: str, new) -> None:
    _undo.append((owner, name, getattr(owner, name)))
    setattr(owner, name, new)


_REPLACED: dict[int, tuple[object, object]] = {}    # id(JITFunction) -> (it, its interpreted form)
_BINDINGS: list = [0, ()]     # (modules seen, ((owner, name, JITFunction), ...)): rescanned when new ones load


def _interpret_language() -> None:
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    if _BINDINGS[0] != len(sys.modules):
        owners = [m for n, m in list(sys.modules.items())
                  if m is not None and (n == "triton.language" or n.startswith("triton.language."))]
        _BINDINGS[:] = [len(sys.modules), tuple((owner, name, value) for owner in (*owners, tl.tensor)
                                                for name, value in list(vars(owner).items())
                                                if isinstance(value, JITFunction))]
    for owner, name, value in _BINDINGS[1]:
        if id(value) not in _REPLACED:       # the function is kept alive with its id
            _REPLACED[id(value)] = (value, InterpretedFunction(value.fn))
        _set(owner, name, _REPLACED[id(value)][1])


def _bf16_dot() -> None:
    """The interpreter keeps bfloat16 tiles as their raw uint16 bits and multiplies those in
    ``tl.dot`` (Triton 3.6 and 3.9): widen them to the fp32 values they stand for first (exact;
    a tensor core multiplies bf16 exactly and accumulates in fp32 too)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle
    dot = InterpreterBuilder.create_dot

    def widen(t):
        if t.dtype != tl.bfloat16:
            return t
        if t.data.dtype == np.uint16:       # the raw bits (a masked load may hold floats already)
            return TensorHandle((t.data.astype(np.uint32) << 16).view(np.float32), tl.float32)
        return TensorHandle(t.data.astype(np.float32), tl.float32)

    def create_dot(self, a, b, d, *args, **kwargs):
        return dot(self, widen(a), widen(b), d, *args, **kwargs)

    _set(InterpreterBuilder, "create_dot", create_dot)


def _bf16_rounding() -> None:
    """The interpreter converts fp32 to bfloat16 by dropping the low mantissa bits (Triton 3.9); a
    GPU rounds to nearest even, as torch and the reference executor do: round through torch."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle
    cast = InterpreterBuilder.cast_impl

    def cast_impl(self, src, dst_type):
        if dst_type.scalar == tl.bfloat16 and src.dtype.scalar == tl.float32:
            f32 = torch.from_numpy(np.array(src.data, dtype=np.float32))
            return TensorHandle(f32.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16), tl.bfloat16)
        return cast(self, src, dst_type)

    _set(InterpreterBuilder, "cast_impl", cast_impl)


def _bool_masks() -> None:
    """A block mask and-ed with a scalar condition (the bounds of a gathered batch index, which a
    gemm kernel loads once per program) holds int32 data in the interpreter (Triton 3.9), and its
    masked load and store refuse that ("mask has unsupported dtype"): hand them bools."""
    import numpy as np
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle
    load, store = InterpreterBuilder.create_masked_load, InterpreterBuilder.create_masked_store

    def boolean(mask):
        # (Triton 3.6's tensor descriptors hand over a bare numpy bool array, not a TensorHandle)
        if mask is None or not isinstance(mask, TensorHandle) or mask.data.dtype == np.bool_:
            return mask
        return TensorHandle(mask.data != 0, mask.dtype)

    def create_masked_load(self, ptrs, mask, other, *args, **kwargs):
        return load(self, ptrs, boolean(mask), other, *args, **kwargs)

    def create_masked_store(self, ptrs, value, mask, *args, **kwargs):
        return store(self, ptrs, value, boolean(mask), *args, **kwargs)

    _set(InterpreterBuilder, "create_masked_load", create_masked_load)
    _set(InterpreterBuilder, "create_masked_store", create_masked_store)


def _nan_max_min() -> None:
    """The interpreter reduces with a combine function it does not know one element at a time in
    Python (a max-pool over a 200-wide window took a minute); the kernels' NaN-propagating
    ``_maximum``/``_minimum`` combiners are numpy's ``max``/``min``, which propagate NaN too."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import ReduceOps
    apply = ReduceOps.apply_impl

    def apply_impl(self, input):
        fn = getattr(self.combine_fn, "fn", None)
        op = _NAN_REDUCTIONS.get(getattr(fn, "__name__", None))
        if (op is not None and len(input) == 1 and input[0].dtype != tl.bfloat16     # bf16: raw bits
                and getattr(fn, "__module__", "").startswith(KERNEL_MODULE)):
            return self.min_max(input[0], val_reduce_op=getattr(np, op))
        return apply(self, input)

    _set(ReduceOps, "apply_impl", apply_impl)


def _no_dropped_overflow_checks() -> None:
    """The interpreter (Triton 3.6 and 3.9) evaluates every signed 32-bit add, sub and mul a
    second time in int64 against the type's bounds for an overflow assert, then drops the assert
    because its options have ``debug`` off (``device_assert`` returns at once): a third of an
    interpreted kernel's time spent on a check that can never fire.  Where the assert would be
    dropped, the check is not computed."""
    import dataclasses

    from triton.runtime import interpreter
    builder = interpreter.interpreter_builder
    if builder.options.sanitize_overflow and not builder.options.debug:
        _set(builder, "options", dataclasses.replace(builder.options, sanitize_overflow=False))


_CORRECTIONS: tuple[Callable[[], None], ...] = (_bf16_dot, _bf16_rounding, _nan_max_min, _bool_masks,
                                                _no_dropped_overflow_checks)
