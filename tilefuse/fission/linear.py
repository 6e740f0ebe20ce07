"""Fission rules: linear operators (MatMul, Gemm, Einsum).

Every contraction is ONE prim, ``sum over the contracted axes of a product of loads``, so that
``analysis/classify.py`` sees a contraction and the gemm/chain families can anchor on it.  Scaling
and bias terms (Gemm's alpha, beta, C) are separate elementwise/broadcast prims.
"""
from __future__ import annotations

from typing import Sequence

from ..errors import UnsupportedAttribute
from ..ir.dtypes import DType
from ..ir.expr import Const, Expr, cast
from ..ir.graph import Node
from .common import bcast, broadcast_shape
from .registry import Fission, TensorRef, rule


def batch_index(shape: Sequence[int], idx: Sequence[Expr], out_shape: Sequence[int]) -> tuple:
    """Index of a (right-aligned) batch prefix ``shape`` under numpy broadcasting to ``out_shape``."""
    off = len(out_shape) - len(shape)
    return tuple(0 if (shape[d] == 1 and out_shape[off + d] != 1) else idx[off + d] for d in range(len(shape)))


def product(factors: Sequence[Expr], dtype: DType) -> Expr:
    """The product of loads, cast to ``dtype`` where an operand has another type."""
    out = cast(factors[0], dtype)
    for f in factors[1:]:
        out = out * cast(f, dtype)
    return out


@rule("MatMul")
def matmul(fx: Fission, node: Node, ins: list, dtype: DType | None = None) -> TensorRef:
    """Matrix product with numpy semantics (1-D operands, broadcast batch dims): one contraction prim."""
    a, b = ins
    if a.rank == 0 or b.rank == 0:
        raise UnsupportedAttribute(node, "shapes", (a.shape, b.shape), "MatMul needs operands of rank >= 1")
    k = a.shape[-1]
    kb = b.shape[0] if b.rank == 1 else b.shape[-2]
    if k != kb:
        raise UnsupportedAttribute(node, "shapes", (a.shape, b.shape), "inner dimensions differ")
    a_batch, b_batch = a.shape[:-2], b.shape[:-2]
    batch = broadcast_shape(node, a_batch, b_batch)
    nb = len(batch)
    m_dims = a.shape[-2:-1] if a.rank >= 2 else ()
    n_dims = b.shape[-1:] if b.rank >= 2 else ()
    out_shape = batch + m_dims + n_dims
    dtype = dtype or fx.out_type().dtype      # (the QLinear forms contract in int32)

    def body(i, r):
        ia = batch_index(a_batch, i, batch) + ((i[nb],) if m_dims else ()) + (r[0],)
        ib = batch_index(b_batch, i, batch) + (r[0],) + ((i[-1],) if n_dims else ())
        return product((a[ia], b[ib]), dtype)

    return fx.reduce(out_shape, (k,), "sum", body)


@rule("Gemm")
def gemm(fx: Fission, node: Node, ins: list) -> TensorRef:
    """alpha·op(A)·op(B) + beta·C: one contraction prim, then one prim for alpha and beta·C."""
    a, b, c = (list(ins) + [None])[:3]
    ta, tb = bool(node.attrs.get("transA", 0)), bool(node.attrs.get("transB", 0))
    alpha, beta = node.attrs.get("alpha", 1.0), node.attrs.get("beta", 1.0)
    if a.rank != 2 or b.rank != 2:
        raise UnsupportedAttribute(node, "shapes", (a.shape, b.shape), "Gemm needs 2-D A and B")
    m, k = a.shape[::-1] if ta else a.shape
    kb, n = b.shape[::-1] if tb else b.shape
    if k != kb:
        raise UnsupportedAttribute(node, "shapes", (a.shape, b.shape), "inner dimensions differ")
    dtype = fx.out_type().dtype
    y = fx.reduce((m, n), (k,), "sum", lambda i, r: product(
        (a[(r[0], i[0]) if ta else (i[0], r[0])], b[(i[1], r[0]) if tb else (r[0], i[1])]), dtype))
    use_c = c is not None and beta != 0  # beta = 0 ignores C (as torch.addmm; no NaN from C)
    if alpha == 1 and not use_c:
        return y
    alpha_c, beta_c = _coeff(node, "alpha", alpha, dtype), _coeff(node, "beta", beta, dtype)
    if use_c:
        broadcast_shape(node, (m, n), c.shape)
        return fx.compute((m, n), lambda i: y[i] * alpha_c + cast(bcast(c, i, (m, n)), dtype) * beta_c)
    return fx.compute((m, n), lambda i: y[i] * alpha_c)


def _coeff(node: Node, name: str, value: float, dtype: DType) -> Const:
    try:
        return Const(value, dtype)
    except ValueError:
        raise UnsupportedAttribute(node, name, value, f"not representable in {dtype.value}") from None


# ---------------------------------------------------------------- Einsum

def _split_term(node: Node, term: str, rank: int | None) -> tuple[list[str], int]:
    """Labels of one einsum term and the number of dims its ellipsis stands for (-1: no ellipsis)."""
    head, dots, tail = term.partition("...")
    letters = list(head + tail)
    if "." in head + tail or not all(ch.isalpha() for ch in letters):
        raise UnsupportedAttribute(node, "equation", node.attrs.get("equation"), f"bad term {term!r}")
    if not dots:
        if rank is not None and len(letters) != rank:
            raise UnsupportedAttribute(node, "equation", node.attrs.get("equation"),
                                       f"term {term!r} has {len(letters)} labels for a rank-{rank} operand")
        return letters, -1
    n_ell = 0 if rank is None else rank - len(letters)
    if rank is not None and n_ell < 0:
        raise UnsupportedAttribute(node, "equation", node.attrs.get("equation"), f"term {term!r} too long")
    return letters, n_ell


def parse_einsum(node: Node, equation: str, shapes: Sequence[Sequence[int]]):
    """Resolve an einsum equation to (labels of each operand, output labels, size of each label).

    Ellipsis dims become labels ``"...0"``, ``"...1"`` (right-aligned, broadcast like numpy); a
    label repeated inside one operand reads its diagonal.
    """
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise UnsupportedAttribute(node, "equation", equation, f"{len(terms)} terms for {len(shapes)} inputs")
    parsed = [_split_term(node, t, len(s)) for t, s in zip(terms, shapes)]
    n_ell = max((n for _, n in parsed), default=-1)
    ell = [f"...{k}" for k in range(max(n_ell, 0))]
    labels = []
    for term, (letters, n) in zip(terms, parsed):
        head = term.partition("...")[0]
        labels.append(letters[:len(head)] + ell[len(ell) - n:] + letters[len(head):] if n >= 0 else letters)
    sizes: dict[str, int] = {}
    for labs, shape in zip(labels, shapes):
        for lab, size in zip(labs, shape):
            if sizes.get(lab, 1) != 1 and size not in (1, sizes[lab]):
                raise UnsupportedAttribute(node, "equation", equation, f"label {lab!r} has sizes "
                                           f"{sizes[lab]} and {size}")
            if size != 1 or lab not in sizes:
                sizes[lab] = size
    if arrow:
        out_letters, out_n = _split_term(node, rhs, None)
        if out_n >= 0 and n_ell < 0:
            raise UnsupportedAttribute(node, "equation", equation, "'...' in the output only")
        head = rhs.partition("...")[0]
        out = out_letters[:len(head)] + (ell if out_n >= 0 else []) + out_letters[len(head):]
    else:
        counts: dict[str, int] = {}
        for labs in labels:
            for lab in labs:
                counts[lab] = counts.get(lab, 0) + 1
        out = ell + sorted(lab for lab, n in counts.items() if n == 1 and not lab.startswith("..."))
    if len(set(out)) != len(out):
        raise UnsupportedAttribute(node, "equation", equation, "a label repeated in the output")
    missing = [lab for lab in out if lab not in sizes]
    if missing:
        raise UnsupportedAttribute(node, "equation", equation, f"output labels {missing} not in any input")
    return labels, out, sizes


@rule("Einsum")
def einsum(fx: Fission, node: Node, ins: list) -> TensorRef:
    """Einstein summation: one prim, a sum over the contracted labels of the product of loads."""
    equation = node.attrs.get("equation")
    if not isinstance(equation, str):
        raise UnsupportedAttribute(node, "equation", equation, "missing equation")
    labels, out, sizes = parse_einsum(node, equation, [x.shape for x in ins])
    red = list(dict.fromkeys(lab for labs in labels for lab in labs if lab not in out))
    out_shape = tuple(sizes[lab] for lab in out)
    dtype = fx.out_type().dtype

    def loads(var: dict) -> list[Expr]:
        return [x[tuple(0 if (d == 1 and sizes[lab] != 1) else var[lab] for lab, d in zip(labs, x.shape))]
                for x, labs in zip(ins, labels)]

    if not red:
        return fx.compute(out_shape, lambda i: product(loads(dict(zip(out, i))), dtype))
    return fx.reduce(out_shape, tuple(sizes[lab] for lab in red), "sum",
                     lambda i, r: product(loads({**dict(zip(out, i)), **dict(zip(red, r))}), dtype))

