"""Fission rules: attention.

ScaledDotProductAttention becomes contraction (Q·Kᵀ), scale, mask, stable softmax (max, sub+exp,
sum, div), contraction (P·V), so the chain family sees the GEMM → softmax → GEMM pattern.  Scores
and probabilities are kept in fp32 for 16-bit inputs (as torch does); the last contraction rounds
once to the input dtype.
"""
from __future__ import annotations

import math
from typing import Sequence

from ..errors import UnsupportedAttribute
from ..ir.dtypes import DType
from ..ir.expr import Const, Expr, cast, select, unary
from ..ir.graph import Node
from .common import acc_dtype, bcast, broadcast_shape
from .linear import batch_index
from .registry import Fission, TensorRef, rule


def _safe_softmax(fx: Fission, x: TensorRef) -> TensorRef:
    """Stable softmax over the last axis; a row that is entirely -inf (fully masked) gives zeros.

    That is torch's ``scaled_dot_product_attention`` behaviour (its ``_safe_softmax``), unlike
    ``torch.softmax`` which gives NaN there; hence a private helper rather than the plain softmax.
    """
    rows, n = x.shape[:-1], x.shape[-1]
    neg_inf = Const(-math.inf, x.dtype)
    mx = fx.reduce(rows, (n,), "max", lambda i, r: x[i + (r[0],)])
    e = fx.compute(x.shape, lambda i: unary("exp", x[i] - mx[i[:-1]]))
    total = fx.reduce(rows, (n,), "sum", lambda i, r: e[i + (r[0],)])
    return fx.compute(x.shape, lambda i: select(mx[i[:-1]].eq(neg_inf), Const(0, x.dtype), e[i] / total[i[:-1]]))


def _kv_index(shape: Sequence[int], i: Sequence[Expr], batch: Sequence[int], group: int) -> tuple:
    """Batch index of K or V; with grouped-query heads, query head h reads kv head h // group."""
    idx = batch_index(shape, i, batch)
    if group > 1 and shape[-1] != 1:
        idx = idx[:-1] + (i[len(batch) - 1] // group,)
    return idx


def _heads(node: Node, q: TensorRef, kv: TensorRef, gqa: bool) -> int:
    """Query heads per kv head (1 without GQA)."""
    if not gqa or q.rank < 3:
        return 1
    hq, hk = q.shape[-3], kv.shape[-3]
    if hk == 0 or hq % hk:
        raise UnsupportedAttribute(node, "enable_gqa", 1, f"{hq} query heads are not a multiple of {hk} kv heads")
    return hq // hk


@rule("ScaledDotProductAttention")
def sdpa(fx: Fission, node: Node, ins: list) -> TensorRef:
    """softmax(Q·Kᵀ·scale + mask)·V, masks, is_causal, GQA: contraction, scale, mask, softmax, contraction."""
    q, k, v, mask = (list(ins) + [None])[:4]
    if min(q.rank, k.rank, v.rank) < 2 or not (q.rank == k.rank == v.rank):
        raise UnsupportedAttribute(node, "shapes", (q.shape, k.shape, v.shape), "Q, K, V need the same rank >= 2")
    (lq, e), (s, ek), (sv, ev) = q.shape[-2:], k.shape[-2:], v.shape[-2:]
    if e != ek or s != sv:
        raise UnsupportedAttribute(node, "shapes", (q.shape, k.shape, v.shape), "inconsistent Q, K, V sizes")
    gqa = bool(node.attrs.get("enable_gqa", 0))
    gk, gv = _heads(node, q, k, gqa), _heads(node, q, v, gqa)
    kb = k.shape[:-3] + (q.shape[-3],) if gk > 1 else k.shape[:-2]
    vb = v.shape[:-3] + (q.shape[-3],) if gv > 1 else v.shape[:-2]
    batch = broadcast_shape(node, q.shape[:-2], kb, vb)
    nb = len(batch)
    acc = acc_dtype(q.dtype)
    scores_shape = batch + (lq, s)

    def qk(i, r):
        qi = batch_index(q.shape[:-2], i, batch) + (i[nb], r[0])
        ki = _kv_index(k.shape[:-2], i, batch, gk) + (i[nb + 1], r[0])
        return cast(q[qi], acc) * cast(k[ki], acc)

    scores = fx.reduce(scores_shape, (e,), "sum", qk)
    scale = node.attrs.get("scale", 1.0 / math.sqrt(e) if e else 1.0)
    scores = fx.compute(scores_shape, lambda i: scores[i] * Const(scale, acc))
    scores = _mask(fx, node, scores, mask, bool(node.attrs.get("is_causal", 0)))
    probs = _safe_softmax(fx, scores)
    out_dtype = fx.out_type().dtype

    def pv(i, r):
        vi = _kv_index(v.shape[:-2], i, batch, gv) + (r[0], i[nb + 1])
        return cast(probs[i[:nb + 1] + (r[0],)] * cast(v[vi], acc), out_dtype)

    return fx.reduce(batch + (lq, ev), (s,), "sum", pv)


def _mask(fx: Fission, node: Node, scores: TensorRef, mask: TensorRef | None, causal: bool) -> TensorRef:
    """One prim applying the attention mask (bool: keep where True; float: add) and the causal mask."""
    if mask is None and not causal:
        return scores
    shape = scores.shape
    if mask is not None:
        tail = shape[len(shape) - mask.rank:] if mask.rank <= len(shape) else None
        if tail is None or any(m not in (1, t) for m, t in zip(mask.shape, tail)):
            raise UnsupportedAttribute(node, "mask", mask.shape, f"does not broadcast to the scores {shape}")
        if not (mask.dtype is DType.bool or mask.dtype.is_float):
            raise UnsupportedAttribute(node, "mask", mask.dtype.value, "mask must be bool or float")
    neg_inf = Const(-math.inf, scores.dtype)

    def body(i):
        val = scores[i]
        if mask is not None and mask.dtype is DType.bool:
            val = select(bcast(mask, i, shape), val, neg_inf)
        elif mask is not None:
            val = val + cast(bcast(mask, i, shape), scores.dtype)
        if causal:  # top-left aligned, as torch: query l sees keys s <= l
            val = select(i[-1].le(i[-2]), val, neg_inf)
        return val

    return fx.compute(shape, body)
