"""Factors of a contraction as tensors over their own variables, for library kernels.

A factor is ``strided`` when it is a Load (under Casts) through an affine index with non-negative
coefficients: a ``torch.as_strided`` view of the input, no copy.  Any other factor is ``gathered``:
evaluated by the reference executor's grid evaluator (``ir/evaluate.py``) over its own variables.
See library.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..analysis.index import affine_form
from ..ir.dtypes import DType
from ..ir.evaluate import Grid, retype, var_env
from ..ir.expr import Binary, Cast, Expr, Load, Var, transform
from ..ir.prim import Prim

HALF = (DType.float16, DType.bfloat16)


def mul_leaves(e: Expr) -> list[Expr]:
    if isinstance(e, Binary) and e.op == "mul":
        return mul_leaves(e.a) + mul_leaves(e.b)
    return [e]


def cast_to(x: torch.Tensor, dtype: DType) -> torch.Tensor:
    """The reference's Cast semantics (float -> int truncates)."""
    t = dtype.to_torch()
    if x.dtype == t:
        return x
    if dtype.is_int and x.dtype.is_floating_point:
        return torch.trunc(x).to(t)
    return x.to(t)


@dataclass(frozen=True)
class Strided:
    """A Load through an affine index with non-negative coefficients, read as an ``as_strided`` view."""
    slot: int
    cols: tuple[tuple[tuple[int, int], ...], ...]  # per view dim: ((input dim, coefficient), ...)
    consts: tuple[int, ...]                         # per input dim: the index at the origin
    hi: tuple[int, ...]                             # per input dim: the largest index read
    sizes: tuple[int, ...]
    casts: tuple[DType, ...]                        # applied innermost first
    slack: tuple[int, ...] = ()                     # per view dim: how much longer it may be (conv input)
    kind = "strided"

    def tensor(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor | None:
        x = inputs[self.slot]
        if x.dim() != len(self.hi) or any(n <= h for n, h in zip(x.shape, self.hi)):
            return None  # would read out of bounds: let the reference report it
        st = x.stride()
        strides = [sum(st[d] * k for d, k in col) for col in self.cols]
        offset = x.storage_offset() + sum(s * c for s, c in zip(st, self.consts))
        v = x.as_strided(self._sizes(x), strides, offset)
        for dt in self.casts:
            v = cast_to(v, dt)
        return v

    def _sizes(self, x: torch.Tensor) -> tuple[int, ...]:
        """The view's sizes; a dim with slack (a conv input's spatial dim, coefficient 1: the conv
        ignores a tail shorter than its stride) runs to the input's end when that is within the
        slack, so an unsliced input stays one contiguous view that the conv need not copy."""
        if not self.slack:
            return self.sizes
        sizes = list(self.sizes)
        for v, (z, k, col) in enumerate(zip(self.sizes, self.slack, self.cols)):
            if k and len(col) == 1 and col[0][1] == 1:
                d = col[0][0]
                rest = x.shape[d] - self.consts[d]
                sizes[v] = rest if z <= rest <= z + k else z
        return tuple(sizes)


def unwrap(f: Expr) -> tuple[Expr, tuple[DType, ...]]:
    """(the expression under a chain of Casts, the casts innermost first)."""
    casts = []
    while isinstance(f, Cast):
        casts.append(f.dtype)
        f = f.x
    return f, tuple(reversed(casts))


def strided(f: Expr, order: Sequence[Var], ext: dict[Var, int]) -> Strided | None:
    f, casts = unwrap(f)
    if not isinstance(f, Load):
        return None
    forms = [affine_form(i) for i in f.index]  # None for div/mod, Select, Load, products of Vars
    if any(a is None or any(k < 0 for k in a[0].values()) or a[1] < 0 for a in forms):
        return None  # negative strides cannot be viewed
    cols = tuple(tuple((d, a[0][v]) for d, a in enumerate(forms) if v in a[0]) for v in order)
    # Exact bounds of an affine index with non-negative coefficients over 0..ext-1.
    hi = tuple(c + sum(k * (ext[v] - 1) for v, k in co.items()) for co, c in forms)
    return Strided(f.tensor, cols, tuple(c for _, c in forms), hi, tuple(ext[v] for v in order), casts)


@dataclass(frozen=True)
class Gathered:
    """Any other factor: evaluated by the reference executor over its own variables."""
    prim: Prim
    expr: Expr
    order: tuple[Var, ...]
    sizes: tuple[int, ...]
    kind = "gathered"

    def tensor(self, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
        device = inputs[0].device if inputs else torch.device("cpu")
        g = Grid(self.prim, list(inputs), var_env(list(self.order), self.prim.extents, device))
        return g.eval(self.expr).expand(self.sizes)


def factor(prim: Prim, f: Expr, order: Sequence[Var]):
    ext = prim.extents
    got = strided(f, order, ext)
    if got is not None:
        return got
    if prim.out.dtype in HALF:  # the reference evaluates 16-bit reduce bodies in fp32
        f = transform(f, lambda n: retype(n) if n.dtype in HALF else None)
    return Gathered(prim, f, tuple(order), tuple(ext[v] for v in order))


def constant(e: Expr):
    return Grid(None, [], {}).eval(e).item()
