"""ATen converters: FFTs, as canonical DFT nodes (one per transformed dim).

tilefuse has no complex dtype: a complex tensor is held the way ONNX's DFT holds it, as a float
tensor with a trailing (real, imaginary) axis, which ``view_as_real`` then is.  Complex values
may only flow between FFTs and ``view_as_real``/``view_as_complex``; any other reader of one
would see the pairs as data, so it is refused.  Normalization: ``0`` none, ``1`` 1/sqrt(n),
``2`` 1/n, n the product of the transformed sizes; DFT's inverse divides by each length itself.
"""
from __future__ import annotations

import math
from typing import Sequence

from ...ir.dtypes import DType, TensorType
from .common import norm_dim
from .emitter import Emitter
from .registry import converts

# ATen ops that read complex values in the paired form.
COMPLEX_AWARE = frozenset({"aten._fft_c2c.default", "aten._fft_c2r.default", "aten.view_as_real.default",
                           "aten.view_as_complex.default"})


def _complex_result(em: Emitter) -> None:
    """Raise unless every reader of the complex value this node makes understands the pairs."""
    for u in em.fx.users:
        if str(u.target) not in COMPLEX_AWARE:
            raise em.unsupported(f"a complex result read by {u.target} (tilefuse handles complex values only "
                                 f"between FFTs and view_as_real)")


def _dft(em: Emitter, x: str, axis: int, *, inverse: bool, onesided: bool = False, length: int | None = None,
         components: int = 2) -> str:
    shape = list(em.shape(x))
    n = length or shape[axis]
    shape[axis] = n // 2 + 1 if onesided and not inverse else n
    shape[-1] = components
    attrs = {"axis": axis, "inverse": int(inverse), "onesided": int(onesided)}
    if length is not None:
        attrs["dft_length"] = length
    return em.op("DFT", [x], attrs, TensorType(tuple(shape), em.dtype(x)))


def _scale(em: Emitter, x: str, factor: float) -> str:
    if factor == 1.0:
        return x
    return em.op("Mul", [x, em.scalar(factor, em.dtype(x))], out=em.type(x))


def _norm(normalization: int, n: int) -> float:
    return (1.0, 1 / math.sqrt(n), 1 / n)[normalization]


def _dims(dim: Sequence[int], rank: int) -> list[int]:
    return [norm_dim(d, rank) for d in dim]


@converts("aten._fft_r2c.default")
def _fft_r2c(em, a):
    _complex_result(em)
    x = a.self
    shape = em.shape(x)
    dims = _dims(a.dim, len(shape))
    y = em.op("Unsqueeze", [x], {"axes": (len(shape),)}, TensorType(shape + (1,), em.dtype(x)))
    # one-sided halves the last transformed dim, and needs the real input: transform it first
    y = _dft(em, y, dims[-1], inverse=False, onesided=bool(a.onesided))
    for d in dims[:-1]:
        y = _dft(em, y, d, inverse=False)
    return _scale(em, y, _norm(a.normalization, math.prod(shape[d] for d in dims)))


@converts("aten._fft_c2c.default")
def _fft_c2c(em, a):
    _complex_result(em)
    y = a.self
    dims = _dims(a.dim, em.rank(y) - 1)
    for d in dims:
        y = _dft(em, y, d, inverse=not a.forward)
    n = math.prod(em.shape(a.self)[d] for d in dims)
    applied = 1.0 if a.forward else 1 / n
    return _scale(em, y, _norm(a.normalization, n) / applied)


@converts("aten._fft_c2r.default")
def _fft_c2r(em, a):
    y = a.self
    dims = _dims(a.dim, em.rank(y) - 1)
    for d in dims[:-1]:
        y = _dft(em, y, d, inverse=True)
    y = _dft(em, y, dims[-1], inverse=True, onesided=True, length=int(a.last_dim_size), components=1)
    out = em.out_type()
    y = em.reshape(y, out.shape)
    n = math.prod(out.shape[d] for d in dims)
    return _scale(em, y, _norm(a.normalization, n) * n)


def to_pairs(em: Emitter, x: str) -> str:
    """A real tensor as complex (``_to_copy`` to a complex dtype): its values with imaginary parts 0."""
    _complex_result(em)
    if em.fx.args[0].meta["val"].is_complex():
        raise em.unsupported("a cast between complex dtypes")
    real = em.cast(x, DType.from_torch(em.fx.meta["val"].real.dtype))
    r = em.rank(real)
    u = em.op("Unsqueeze", [real], {"axes": (r,)}, TensorType(em.shape(real) + (1,), em.dtype(real)))
    return em.op("Pad", [u, em.scalar(0.0, em.dtype(real))], {"pads": (0,) * (2 * r + 1) + (1,), "mode": "constant"},
                 TensorType(em.shape(real) + (2,), em.dtype(real)))


@converts("aten.view_as_real.default")
def _view_as_real(em, a):
    return a.self


@converts("aten.view_as_complex.default")
def _view_as_complex(em, a):
    _complex_result(em)
    return a.self
