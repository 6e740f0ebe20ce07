"""Recognizing an N-d convolution in a contraction prim, for the library kernel's conv path.

A match gives strided views of the input (``[N, groups*C, span...]`` at the constant offsets) and
of the weight, and the stride, dilation and groups to call ``torch.nn.functional.conv{N}d`` with
(cuDNN on a GPU).  The forms accepted are described in library.py; fission's grouped form, output
``[N, G, F, spatial...]`` with the group its own axis, is matched with (g, f) as the output channel.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..analysis.index import affine_form, linear_form
from ..ir.dtypes import DType
from ..ir.expr import INDEX, Binary, Const, Expr, Load, Var, free_vars
from ..ir.prim import Prim
from .factors import Strided, strided, unwrap


CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
# Stand-ins for a reduced axis of extent 1 that simplify dropped (the weight view needs the dim).
_UNIT_C = Var("~conv.c")
_UNIT_K = tuple(Var(f"~conv.k{j}") for j in range(3))


@dataclass(frozen=True)
class Conv:
    """``conv(x, w, stride, dilation, groups)`` on strided views of the input and the weight;
    ``which`` is the input factor's position in the body.  ``grouped``: the output is ``[N, G, F,
    spatial...]`` and the weight view ``[G, F, C, K...]``, its first two dims the conv's channels."""
    x: Strided
    w: Strided
    which: int
    stride: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    grouped: bool = False


def _real_affine(e: Expr, ext: dict[Var, int]) -> tuple[dict[Var, int], int] | None:
    """``affine_form`` without extent-1 variables (always 0, so their coefficients do not matter)."""
    a = affine_form(e)
    return None if a is None else ({v: k for v, k in a[0].items() if ext[v] != 1}, a[1])


def _spatial(e: Expr, o: Var, free: set[Var], ext: dict[Var, int]):
    """Input spatial index ``o*s + k*d + const`` (s, d > 0, const >= 0; k a reduced variable not
    used elsewhere, taken from ``free``) as ``(k or None, s, d, const)``; None for any other form."""
    a = _real_affine(e, ext)
    if a is None:
        return None
    terms, const = a
    s = terms.pop(o, 1 if ext[o] == 1 else None)
    ks = [v for v in terms if v in free]
    if s is None or s <= 0 or const < 0 or len(ks) != len(terms) or len(ks) > 1:
        return None
    k = ks[0] if ks else None
    d = 1 if k is None else terms[k]
    if d <= 0:
        return None
    free.discard(k)
    return k, s, d, const


def _group_of(atom: Expr, f: Var, ext: dict[Var, int]) -> int | None:
    """Number of groups if ``atom`` is output channel f's group: ``f`` (depthwise, or f is the
    grouped form's group axis) or ``f // fpg``."""
    if atom == f:
        return ext[f]
    if (isinstance(atom, Binary) and atom.op == "floordiv" and atom.a == f and isinstance(atom.b, Const)
            and atom.b.value > 0 and ext[f] % atom.b.value == 0):
        return ext[f] // atom.b.value
    return None


def _channel(e: Expr, f: Var, free: set[Var], ext: dict[Var, int]):
    """Input channel index ``u*(g*C + c) + const``: c a reduced variable of extent C (from ``free``)
    and g output channel f's group (absent: one group); as ``(c or None, u, groups, const)``, None
    for any other form (overlapping or gapped channel windows, other variables...)."""
    lin = linear_form(e)
    if e.dtype is not INDEX or lin.const < 0:
        return None
    c = g = None
    groups = 1
    for atom, k in lin.terms.items():
        if isinstance(atom, Var) and ext[atom] == 1:
            continue
        n = _group_of(atom, f, ext)
        if n == 1:
            continue  # f // F: always 0
        if n is not None and g is None:
            g, groups = k, n
        elif atom in free and c is None:
            c = (atom, k)
        else:
            return None
    size = ext[c[0]] if c else 1
    u = c[1] if c else (g or 1)
    if u <= 0 or (g is not None and g != size * u):
        return None  # groups would overlap or leave gaps
    free.discard(c[0] if c else None)
    return (c[0] if c else None), u, groups, lin.const


def _match_conv(p: Prim, xf: Expr, wf: Expr, which: int, grouped: bool) -> Conv | None:
    """``out[n, f, o...] = sum_{c, k...} x[n, chan(f, c), o*s + k*d + const] * w[f, c, k...]``
    with ``x`` = factor ``xf`` (a Load under Casts), ``w`` = ``wf`` (any Load a strided view of
    which is indexed by f, c, k... only: layouts are free); None if the prim is not that.
    ``grouped``: ``out[n, g, f, o...]`` with ``chan(g, c)`` and ``w[g, f, c, k...]`` instead."""
    lead = 3 if grouped else 2
    nsp = p.out.rank - lead
    ext = p.extents
    n, chans, outs = p.axes[0], p.axes[1:lead], p.axes[lead:]
    xl, casts = unwrap(xf)
    if not isinstance(xl, Load) or len(xl.index) != nsp + 2 or any(v in ext for v in _UNIT_K + (_UNIT_C,)):
        return None
    free = {v for v in p.reduce.axes if ext[v] != 1}   # reduced variables not yet given a role
    spatial = [_spatial(xl.index[2 + j], o, free, ext) for j, o in enumerate(outs)]
    batch = _real_affine(xl.index[0], ext)
    if None in spatial or batch is None or not set(batch[0]) <= {n} or batch[1] < 0 or batch[0].get(n, 1) <= 0:
        return None
    chan = _channel(xl.index[1], chans[0], free, ext)
    if chan is None or free:
        return None  # every reduced variable must be the channel or a kernel axis
    c, u, groups, c_const = chan
    ks = [_UNIT_K[j] if k is None else k for j, (k, *_) in enumerate(spatial)]
    order = [*chans, _UNIT_C if c is None else c] + ks
    wext = {**ext, _UNIT_C: 1, **{k: 1 for k in _UNIT_K}}
    if not {v for v in free_vars(wf) if ext[v] != 1} <= set(order):
        return None
    w = strided(wf, order, wext)
    if w is None:
        return None
    spans = [s * (ext[o] - 1) + d * (wext[k] - 1) + 1 for o, k, (_, s, d, _) in zip(outs, ks, spatial)]
    x = _conv_input(xl, casts, (ext[n], batch[0].get(n), batch[1]), (groups * wext[order[lead - 1]], u, c_const),
                    [(z, sp[1], sp[3]) for z, sp in zip(spans, spatial)])
    return Conv(x, w, which, tuple(sp[1] for sp in spatial), tuple(sp[2] for sp in spatial), groups, grouped)


def _conv_input(xl: Load, casts: tuple[DType, ...], batch: tuple, chan: tuple, spatial: list[tuple]) -> Strided:
    """The conv's input as a view ``[N, groups*C, span...]`` of the loaded tensor: batch ``(size,
    coefficient or None, offset)``, channels ``(size, unit stride u, offset)``, spatial dims ``(span,
    stride, offset)`` (coefficient 1: the conv applies stride and dilation; a tail shorter than the
    stride may be kept, see ``Strided.slack``)."""
    (bn, a_n, b0), (cn, u, c0) = batch, chan
    sizes = (bn, cn, *(z for z, _, _ in spatial))
    consts = (b0, c0, *(k for _, _, k in spatial))
    hi = (b0 + (a_n or 0) * (bn - 1), c0 + u * (cn - 1), *(k + z - 1 for z, _, k in spatial))
    cols = (((0, a_n),) if a_n else (), ((1, u),), *(((2 + j, 1),) for j in range(len(spatial))))
    return Strided(xl.tensor, cols, consts, hi, sizes, casts, (0, 0, *(s - 1 for _, s, _ in spatial)))


def ieee_fp32(conv: Callable[[], torch.Tensor]) -> torch.Tensor:
    """Run a CUDA fp32 conv in IEEE fp32: cuDNN's default is TF32 (10-bit mantissa products), far
    outside the reference's 1e-5, and the GEMM path's cuBLAS runs IEEE fp32 too."""
    prec = getattr(torch.backends.cudnn, "conv", None)
    if prec is not None and hasattr(prec, "fp32_precision"):     # torch >= 2.9
        old, prec.fp32_precision = prec.fp32_precision, "ieee"
        try:
            return conv()
        finally:
            prec.fp32_precision = old
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        return conv()


def conv_plan(p: Prim, terms: list[Expr]) -> Conv | None:
    """The convolution a two-factor float contraction computes, trying either factor as the input
    and the output as ``[N, F, spatial...]`` or grouped ``[N, G, F, spatial...]`` (the input's
    rank tells them apart)."""
    if len(terms) != 2:
        return None
    for grouped in (False, True):
        if p.out.rank - 2 - grouped in CONV:
            got = _match_conv(p, terms[0], terms[1], 0, grouped) or _match_conv(p, terms[1], terms[0], 1, grouped)
            if got is not None:
                return got
    return None
