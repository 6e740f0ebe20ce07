"""Fission of MatMul, Gemm and Einsum against torch."""
import pytest
import torch

from opcheck import check_op, run_op
from tilefuse.analysis.classify import Category, classify
from tilefuse.errors import UnsupportedAttribute
from tilefuse.ir.dtypes import DType, TensorType

torch.manual_seed(0)


def rnd(*shape, dtype=torch.float32):
    return torch.randn(shape).to(dtype)


@pytest.mark.parametrize("sa,sb", [
    ((3, 4), (4, 5)),
    ((4,), (4, 5)),            # 1-D left operand: prepended then removed
    ((3, 4), (4,)),            # 1-D right operand
    ((4,), (4,)),              # dot product
    ((2, 3, 4), (4, 5)),       # batch vs matrix
    ((5,), (2, 3, 5, 4)),      # vector vs batch
    ((2, 1, 3, 4), (5, 4, 6)), # broadcast batches of different ranks
    ((1, 3, 4), (2, 4, 0)),    # empty output dim
    ((3, 0), (0, 2)),          # empty contraction: zeros
])
def test_matmul_shapes(sa, sb):
    a, b = rnd(*sa), rnd(*sb)
    pg = check_op("MatMul", [a, b], torch.matmul(a, b))
    assert len([p for p in pg.prims if p.reduce]) == 1


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 1e-2), (torch.float64, 1e-10)])
def test_matmul_dtypes(dtype, tol):
    a, b = rnd(2, 8, 16, dtype=dtype), rnd(16, 4, dtype=dtype)
    check_op("MatMul", [a, b], torch.matmul(a.double(), b.double()).to(dtype), rtol=tol, atol=tol)


def test_matmul_int():
    a, b = torch.randint(-5, 5, (3, 4)), torch.randint(-5, 5, (4, 2))
    check_op("MatMul", [a, b], a @ b)


def test_matmul_is_one_contraction():
    _, pg = run_op("MatMul", [rnd(2, 3, 4), rnd(4, 5)], [TensorType((2, 3, 5), DType.float32)])
    assert [classify(p) for p in pg.prims] == [Category.contraction]


def test_matmul_bad_shapes():
    with pytest.raises(UnsupportedAttribute, match="MatMul.*n0"):
        run_op("MatMul", [rnd(3, 4), rnd(5, 2)], [TensorType((3, 2), DType.float32)])


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("cshape", [None, (5,), (1, 5), (3, 1), (3, 5), ()])
def test_gemm(ta, tb, cshape):
    a = rnd(4, 3) if ta else rnd(3, 4)
    b = rnd(5, 4) if tb else rnd(4, 5)
    alpha, beta = 0.5, -1.5
    c = None if cshape is None else rnd(*cshape)
    ref = alpha * (a.T if ta else a) @ (b.T if tb else b)
    if c is not None:
        ref = ref + beta * c
    ins = [a, b] + ([c] if c is not None else [])
    check_op("Gemm", ins, ref, attrs=dict(transA=ta, transB=tb, alpha=alpha, beta=beta), const=(1,))


def test_gemm_defaults_and_prims():
    a, b, c = rnd(3, 4), rnd(4, 5), rnd(5)
    pg = check_op("Gemm", [a, b, c], torch.addmm(c, a, b))
    cats = [classify(p) for p in pg.prims]
    assert cats == [Category.contraction, Category.broadcast]
    pg = check_op("Gemm", [a, b], a @ b)
    assert len(pg.prims) == 1


def test_gemm_beta_zero_ignores_c():
    a, b = rnd(3, 4), rnd(4, 5)
    c = torch.full((5,), float("nan"))
    check_op("Gemm", [a, b, c], torch.addmm(c, a, b, beta=0.0), attrs=dict(beta=0.0))


def test_gemm_int_fractional_alpha():
    a, b = torch.ones(2, 2, dtype=torch.int32), torch.ones(2, 2, dtype=torch.int32)
    with pytest.raises(UnsupportedAttribute, match="alpha"):
        run_op("Gemm", [a, b], [TensorType((2, 2), DType.int32)], attrs=dict(alpha=0.5))


@pytest.mark.parametrize("eq,shapes", [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 8), (2, 3, 5, 8)]),
    ("bhqk,bhkd->bhqd", [(2, 3, 4, 5), (2, 3, 5, 8)]),
    ("ij,jk", [(3, 4), (4, 5)]),                 # implicit output
    ("ij->ji", [(3, 4)]),                        # transpose, no reduction
    ("ij->", [(3, 4)]),                          # full sum
    ("ii->i", [(4, 4)]),                         # diagonal
    ("ii", [(4, 4)]),                            # trace
    ("i,j->ij", [(3,), (4,)]),                   # outer product
    ("bn,anm,bm->ba", [(2, 3), (5, 3, 4), (2, 4)]),  # bilinear, three operands
    ("...ij,...jk->...ik", [(2, 3, 4), (1, 4, 5)]),  # ellipsis with broadcasting
    ("i...->...", [(3, 2, 4)]),
    ("b i d, b j d -> b i j", [(2, 3, 4), (2, 5, 4)]),  # spaces
    ("BIJ,BJK->BIK", [(2, 3, 4), (2, 4, 5)]),       # upper-case labels
])
def test_einsum(eq, shapes):
    xs = [rnd(*s) for s in shapes]
    pg = check_op("Einsum", xs, torch.einsum(eq, *xs), attrs=dict(equation=eq), rtol=1e-5, atol=1e-5)
    assert len(pg.prims) == 1


def test_einsum_contraction_category():
    xs = [rnd(2, 3, 4, 8), rnd(2, 3, 5, 8)]
    pg = check_op("Einsum", xs, torch.einsum("bhqd,bhkd->bhqk", *xs), attrs=dict(equation="bhqd,bhkd->bhqk"))
    assert classify(pg.prims[0]) is Category.contraction


@pytest.mark.parametrize("eq,shapes,msg", [
    ("ij,jk->ii", [(3, 4), (4, 5)], "repeated in the output"),
    ("ij,jk->iz", [(3, 4), (4, 5)], "not in any input"),
    ("ij,jk->ik", [(3, 4), (3, 5)], "sizes"),
    ("ijk->i", [(3, 4)], "labels for a rank-2"),
    ("ij,jk", [(3, 4)], "terms"),
])
def test_einsum_errors(eq, shapes, msg):
    xs = [rnd(*s) for s in shapes]
    with pytest.raises(UnsupportedAttribute, match=f"Einsum.*{msg}"):
        run_op("Einsum", xs, [TensorType((3, 5), DType.float32)], attrs=dict(equation=eq))
