"""A reduction instance (``analysis/inline.Instance``) as a kernel-IR ``Reduce``: what every
template (fused, gemm, chain) reduces rows with."""
from __future__ import annotations

import math

import torch

from ..ir.dtypes import DType
from ..ir.expr import Cast, Const, Expr, Load, Value, cast, transform
from ..ir.prim import reduce_init
from .kernel import Reduce
from .triton.ops import BOOL_COMBINER, HALF


def reduction(inst, body: Expr, axis: str) -> Reduce:
    """A reduction instance as a ``Reduce`` over ``axis`` (16-bit floats accumulate in fp32, bools
    as int32 any/all)."""
    acc_dt = DType.float32 if inst.dtype in HALF else inst.dtype
    if inst.dtype in HALF:
        body = transform(body, _widen)
    combiner = inst.combiner
    init = reduce_init(combiner, acc_dt)
    if inst.dtype is DType.bool:   # any/all as a max/min over int32, starting from False/True
        acc_dt, combiner, body, init = DType.int32, BOOL_COMBINER[combiner], cast(body, DType.int32), int(init)
    return Reduce(inst.slot, body, axis, combiner, acc_dt, init, inst.dtype,
                  f"{inst.prim} ({inst.combiner}) over {math.prod(inst.rext)} per row")


def _widen(n: Expr) -> Expr | None:
    """fp16/bf16 reduction bodies evaluate in fp32, as the reference does, rounding where the
    body casts to 16 bits (an inlined producer's result, which the reference stores rounded):
    dropping those roundings made a fused ArgMin's min, over unrounded values, match none of
    its indices' rounded values (found by the kernel fuzzer held to eager)."""
    if n.dtype not in HALF:
        return None
    if isinstance(n, (Load, Value, Cast)):
        return cast(n, DType.float32)
    if isinstance(n, Const):
        return Const(torch.tensor(n.value, dtype=n.dtype.to_torch()).item(), DType.float32)
    return None
