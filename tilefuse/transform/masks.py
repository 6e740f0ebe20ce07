"""Constant attention masks become index predicates.

A causal or sliding-window mask built from positions (``torch.tril``, transformers' mask
functions, an exported ``[S, S]`` initializer) reaches the prim graph as a constant, folded or
given: a ``[..., Lq, Lk]`` tensor whose every leading slice is the same band, ``j <= i + c``
(causal, ``c`` the offset of a bottom-right-aligned mask when Lk > Lq) and, for a sliding window,
``j >= i - w``.  Loaded, such a mask costs a tensor read per score and hides the band from the
chain family, which then walks every key block.  Each such constant is replaced by a prim with no
inputs computing the same values from its indices — a boolean mask as the predicate itself, an
additive float mask (0 on the band, -inf off it) as a select — so that the chain kernel's scores
see ``j - i <= c`` (and ``j - i >= -w``) and walk only the band's key blocks
(``families/chain/body.py: _key_bounds``).

Exact: the predicate is regenerated and compared element for element with the constant before
anything is replaced.
"""
from __future__ import annotations

import math

import torch

from ..ir.dtypes import DType, TensorType
from ..ir.expr import INDEX, Const, Expr, Var, binary, logical_and, select, unary
from ..ir.prim import Constant, Origin, Prim, PrimGraph

MIN_SIDE = 2            # a band needs rows and keys
PROBE = 256             # elements of a float constant looked at before the whole of it


def masks_as_predicates(pg: PrimGraph) -> PrimGraph:
    """``pg`` with every constant band mask (module docstring) computed from its indices."""
    made: list[Prim] = []
    kept: list[Constant] = []
    for c in pg.constants:
        band = _band(c.data)
        if band is not None:
            made.append(_predicate_prim(c, *band))
        elif c.data.dtype == torch.bool and (band := _band(~c.data)) is not None:
            made.append(_predicate_prim(c, *band, hide=True))     # the positions to hide: not the band
        else:
            kept.append(c)
    if not made:
        return pg
    return PrimGraph(pg.inputs, tuple(kept), tuple(made) + pg.prims, pg.outputs)


def _band(data: torch.Tensor) -> tuple[int | None, int | None] | None:
    """(c, w) when ``data`` (bool, or float holding only 0 and -inf) is, in every leading slice,
    true (0) exactly where ``j <= i + c`` and ``j >= i - w`` (None: that edge is absent; a mask
    of the positions to hide, ``~tril``, is the lower edge alone), and not all one value."""
    if data.dim() < 2 or min(data.shape[-2:]) < MIN_SIDE or data.numel() == 0:
        return None
    if data.dtype == torch.bool:
        keep = data
    elif data.is_floating_point():
        probe = data.reshape(-1)[:PROBE]       # a weight fails here, before a pass over all of it
        if not bool(((probe == 0) | (probe == -math.inf)).all()):
            return None
        zero = data == 0
        if not bool((zero | (data == -math.inf)).all()):
            return None
        keep = zero
    else:
        return None
    flat = keep.reshape(-1, *keep.shape[-2:])
    first = flat[0]
    if not bool((flat == first).all()) or bool(first.all()) or not bool(first.any()):
        return None
    lq, lk = first.shape
    uppers, lowers = set(), set()
    for q in range(lq):
        kept = first[q].nonzero().flatten()
        if len(kept):
            hi, lo = int(kept.max()), int(kept.min())
            if hi < lk - 1:
                uppers.add(hi - q)
            if lo > 0:
                lowers.add(q - lo)
    if len(uppers) > 1 or len(lowers) > 1:
        return None
    c = next(iter(uppers), None)
    w = next(iter(lowers), None)
    i, j = torch.arange(lq)[:, None], torch.arange(lk)[None, :]
    want = torch.ones(lq, lk, dtype=torch.bool)
    if c is not None:
        want &= j <= i + c
    if w is not None:
        want &= j >= i - w
    return (c, w) if torch.equal(want, first) else None


def _predicate_prim(c: Constant, offset: int | None, window: int | None, hide: bool = False) -> Prim:
    shape = tuple(c.data.shape)
    dtype = DType.from_torch(c.data.dtype)
    axes = tuple(Var(f"i{k}") for k in range(len(shape)))
    i, j = axes[-2], axes[-1]
    diff = binary("sub", j, i)
    conds = ([binary("le", diff, Const(offset, INDEX))] if offset is not None else []) + \
        ([binary("ge", diff, Const(-window, INDEX))] if window is not None else [])
    cond: Expr = conds[0] if len(conds) == 1 else logical_and(*conds)
    if hide:
        cond = unary("not", cond)
    body = cond if dtype is DType.bool else select(cond, Const(0.0, dtype), Const(-math.inf, dtype))
    what = "sliding-window" if offset is not None and window is not None else "causal"
    return Prim(c.name, (), axes, body, TensorType(shape, dtype), origin=Origin(f"{what} mask", c.name))
