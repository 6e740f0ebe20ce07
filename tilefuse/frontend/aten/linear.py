"""ATen converters: contractions (mm, addmm, linear, baddbmm, einsum)."""
from __future__ import annotations

import torch

from ...ir.dtypes import DType, TensorType
from .emitter import Emitter
from .registry import Converter, converts


def _matmul(second: str) -> Converter:
    def convert(em: Emitter, a):
        return em.op("MatMul", [a.self, getattr(a, second)])
    return convert


converts("aten.mm.default", "aten.bmm.default")(_matmul("mat2"))
converts("aten.matmul.default")(_matmul("other"))
converts("aten.dot.default")(_matmul("tensor"))


@converts("aten.addmm.default")
def _addmm(em, a):
    return em.op("Gemm", [a.mat1, a.mat2, a.self], {"alpha": float(a.alpha), "beta": float(a.beta)})


@converts("aten.linear.default")
def _linear(em, a):
    x, w, b = a.input, a.weight, a.bias
    if em.rank(x) == 2:
        return em.op("Gemm", [x, w, b], {"transB": 1})
    out = em.out_type()
    wt = em.transpose(w, [1, 0]) if em.rank(w) == 2 else w
    if b is None:
        return em.op("MatMul", [x, wt])
    return em.op("Add", [em.op("MatMul", [x, wt], out=out), b])


def _scaled_sum(em: Emitter, base: str, beta, prod: str, alpha) -> str:
    """beta * base + alpha * prod (torch's addmm family; beta=0 ignores base entirely)."""
    out = em.out_type()
    if alpha != 1:
        prod = em.op("Mul", [prod, em.scalar(float(alpha), out.dtype)], out=em.type(prod))
    if beta == 0:
        return prod if em.shape(prod) == out.shape else em.op("Expand", [prod])
    if beta != 1:
        base = em.op("Mul", [base, em.scalar(float(beta), out.dtype)], out=em.type(base))
    return em.op("Add", [base, prod])


def _bmm_type(em: Emitter, b1: str, b2: str) -> TensorType:
    return TensorType(em.shape(b1)[:-1] + em.shape(b2)[-1:], em.dtype(b1))


@converts("aten.baddbmm.default")
def _baddbmm(em, a):
    prod = em.op("MatMul", [a.batch1, a.batch2], out=_bmm_type(em, a.batch1, a.batch2))
    return _scaled_sum(em, a.self, a.beta, prod, a.alpha)


@converts("aten.addbmm.default")
def _addbmm(em, a):
    t = _bmm_type(em, a.batch1, a.batch2)
    prod = em.op("MatMul", [a.batch1, a.batch2], out=t)
    prod = em.op("ReduceSum", [prod], {"axes": (0,), "keepdims": 0}, TensorType(t.shape[1:], t.dtype))
    return _scaled_sum(em, a.self, a.beta, prod, a.alpha)


@converts("aten.einsum.default")
def _einsum(em, a):
    dt = em.out_type().dtype
    return em.op("Einsum", [em.cast(x, dt) for x in a.tensors], {"equation": a.equation.replace(" ", "")})


def _grouped(em: Emitter, x: str, w: str, offs: str) -> str:
    """out[s] = x[s] @ w[e] for the rows s of group e, offs[e-1] <= s < offs[e] (offs: the groups'
    cumulative ends, a mixture-of-experts' tokens sorted by expert); rows past the last end are 0.
    A row's group is the number of ends at or before it, its weights gathered per row: one GEMM
    over a gathered batch, whatever the (run-time) group sizes."""
    if em.rank(x) != 2 or em.rank(w) != 3 or em.rank(offs) != 1:
        raise em.unsupported(f"a grouped matmul of {list(em.shape(x))} by {list(em.shape(w))}; "
                             "only 2-d rows by 3-d per-group weights with offsets")
    (s, k), (e, _, n) = em.shape(x), em.shape(w)
    out = em.out_type()
    i64, b = DType.int64, DType.bool
    ends = em.reshape(em.cast(offs, i64), (1, e))
    rows = em.const(torch.arange(s, dtype=torch.int64).reshape(s, 1))
    passed = em.op("LessOrEqual", [ends, rows], out=TensorType((s, e), b))
    group = em.op("ReduceSum", [em.cast(passed, i64)], {"axes": (1,), "keepdims": 0}, TensorType((s,), i64))
    inside = em.op("Less", [group, em.scalar(e, i64)], out=TensorType((s,), b))
    group = em.op("Min", [group, em.scalar(e - 1, i64)], out=TensorType((s,), i64))
    wg = em.op("Gather", [w, group], {"axis": 0}, TensorType((s, k, n), em.dtype(w)))
    prod = em.op("MatMul", [em.reshape(em.cast(x, out.dtype), (s, 1, k)), em.cast(wg, out.dtype)],
                 out=TensorType((s, 1, n), out.dtype))
    prod = em.reshape(prod, (s, n))
    zero = em.scalar(0.0 if out.dtype.is_float else 0, out.dtype)
    return em.op("Where", [em.reshape(inside, (s, 1)), prod, zero], out=out)


@converts("transformers.grouped_mm_fallback.default")
def _grouped_mm_fallback(em, a):
    return _grouped(em, a.input, a.weight, a.offs)


@converts("aten._grouped_mm.default")
def _grouped_mm(em, a):
    if a.offs is None or a.bias is not None:
        raise em.unsupported("a grouped matmul without offsets or with a bias")
    return _grouped(em, a.self, a.mat2, a.offs)
