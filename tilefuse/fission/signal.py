"""Fission rules: discrete Fourier transforms (DFT, STFT) as contractions with constant matrices.

A transform of length L is linear over the complex numbers, ``y[o] = sum_r M[o, r] · x[r]``; with
complex values stored as (real, imaginary) pairs in the last axis it is one real contraction over
(r, input component) with the constant ``W[o, r, c_in, c_out]`` built from M at compile time, so
it plans like any GEMM.  The FFT's n·log n would need a different prim structure; the matrix form
costs n² but fuses and runs on tensor cores, which for the short axes of audio front-ends is the
better trade.
"""
from __future__ import annotations

import numpy as np
import torch

from ..errors import UnsupportedAttribute
from ..ir.graph import Node
from .common import norm_axis
from .registry import Fission, TensorRef, rule


def dft_matrix(n_out: int, n_in: int, length: int, inverse: bool, onesided: bool) -> np.ndarray:
    """The complex M[o, r] of a DFT of ``length`` points reading ``n_in`` inputs (zero-padded or
    truncated to ``length``); the inverse is normalized by 1/length, and a one-sided inverse (irfft)
    reads a Hermitian half spectrum, each bin but 0 and length/2 counting twice."""
    o, r = np.meshgrid(np.arange(n_out), np.arange(n_in), indexing="ij")
    sign = 1.0 if inverse else -1.0
    m = np.exp(sign * 2j * np.pi * ((o * r) % length) / length)
    if inverse:
        m /= length
    if inverse and onesided:
        twice = (r > 0) & (2 * r != length)
        m = np.where(twice, 2 * m, m)
    return m


def real_weights(m: np.ndarray, c_in: int, c_out: int) -> np.ndarray:
    """W[o, r, c_in, c_out] with y = M·x on (real, imaginary) pairs (c_out = 1 keeps the real part)."""
    w = np.empty(m.shape + (2, 2))
    w[..., 0, 0], w[..., 1, 0] = m.real, -m.imag
    w[..., 0, 1], w[..., 1, 1] = m.imag, m.real
    return w[..., :c_in, :c_out]


def _contract(fx: Fission, load, out_shape: tuple, axis: int, w: np.ndarray, dtype) -> TensorRef:
    """``out[..., o (at axis), ..., c] = sum_{r, c_in} load(i, r, c_in) · W[o, r, c_in, c]``."""
    wt = fx.constant(torch.from_numpy(w).to(dtype.to_torch()), "dft")
    return fx.reduce(out_shape, w.shape[1:3], "sum",
                     lambda i, r: load(i, r[0], r[1]) * wt[(i[axis], r[0], r[1], i[-1])])


@rule("DFT")
def dft(fx: Fission, node: Node, ins: list) -> TensorRef:
    """DFT along ``axis`` (inverse, one-sided, dft_length): one contraction with a constant matrix."""
    x = ins[0]
    out = fx.out_type()
    if x.rank < 2 or x.shape[-1] not in (1, 2) or not x.dtype.is_float:
        raise UnsupportedAttribute(node, "input", x.shape, "DFT needs a float input ending in 1 (real) or 2 (complex)")
    axis = norm_axis(node, int(node.attrs.get("axis", -2)), x.rank)
    if axis == x.rank - 1:
        raise UnsupportedAttribute(node, "axis", node.attrs.get("axis"), "the last axis holds the components")
    inverse, onesided = bool(node.attrs.get("inverse", 0)), bool(node.attrs.get("onesided", 0))
    n = x.shape[axis]
    length = int(node.attrs.get("dft_length", 2 * (n - 1) if inverse and onesided else n))
    n_in = min(n, length // 2 + 1 if inverse and onesided else length)
    m = dft_matrix(out.shape[axis], n_in, length, inverse, onesided)
    w = real_weights(m, x.shape[-1], out.shape[-1])
    return _contract(fx, lambda i, r, c: x[i[:axis] + (r,) + i[axis + 1:-1] + (c,)], out.shape, axis, w, x.dtype)


@rule("STFT")
def stft(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Short-time DFT of windowed frames: a windowing prim (if a window is given), one contraction."""
    x, window = ins[0], (list(ins) + [None])[1]
    out = fx.out_type()
    if x.rank != 3 or x.shape[-1] not in (1, 2) or not x.dtype.is_float:
        raise UnsupportedAttribute(node, "signal", x.shape, "STFT needs a float [batch, length, 1 or 2] signal")
    step = int(node.attrs["frame_step"])
    length = int(node.attrs.get("frame_length", window.shape[0] if window is not None else x.shape[1]))
    batch, frames = x.shape[0], out.shape[1]
    src = x
    if window is not None:
        src = fx.compute((batch, frames, length, x.shape[-1]),
                         lambda i: x[(i[0], i[1] * step + i[2], i[3])] * window[(i[2],)])
        load = lambda i, r, c: src[(i[0], i[1], r, c)]   # noqa: E731
    else:
        load = lambda i, r, c: x[(i[0], i[1] * step + r, c)]   # noqa: E731
    m = dft_matrix(out.shape[2], length, length, False, False)
    return _contract(fx, load, out.shape, 2, real_weights(m, x.shape[-1], out.shape[-1]), x.dtype)
