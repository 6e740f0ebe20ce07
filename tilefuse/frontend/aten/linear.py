"""ATen converters: contractions (mm, addmm, linear, baddbmm, einsum)."""
from __future__ import annotations

from ...ir.dtypes import TensorType
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
