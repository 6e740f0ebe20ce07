"""Fission of ScaledDotProductAttention against torch.nn.functional.scaled_dot_product_attention."""
import pytest
import torch
import torch.nn.functional as F

from opcheck import check_op, run_op
from tilefuse.analysis.classify import Category, classify
from tilefuse.errors import UnsupportedAttribute
from tilefuse.ir.dtypes import DType, TensorType

torch.manual_seed(0)
TOL = dict(rtol=1e-4, atol=1e-5)


def qkv(b, hq, hk, lq, s, e, ev, dtype=torch.float32):
    return (torch.randn(b, hq, lq, e, dtype=dtype), torch.randn(b, hk, s, e, dtype=dtype),
            torch.randn(b, hk, s, ev, dtype=dtype))


def test_plain():
    q, k, v = qkv(2, 3, 3, 5, 7, 8, 6)
    pg = check_op("ScaledDotProductAttention", [q, k, v], F.scaled_dot_product_attention(q, k, v), **TOL)
    cats = [classify(p) for p in pg.prims]
    assert cats[0] is Category.contraction and cats[-1] is Category.contraction
    assert cats.count(Category.reduce) == 2      # softmax max and sum


@pytest.mark.parametrize("lq,s", [(5, 5), (3, 7), (7, 3)])
def test_causal(lq, s):
    q, k, v = qkv(1, 2, 2, lq, s, 4, 4)
    check_op("ScaledDotProductAttention", [q, k, v], F.scaled_dot_product_attention(q, k, v, is_causal=True),
             attrs=dict(is_causal=1), **TOL)


@pytest.mark.parametrize("mshape", [(5, 7), (2, 1, 5, 7), (2, 1, 1, 7), (1, 7)])
def test_bool_and_float_masks(mshape):
    q, k, v = qkv(2, 3, 3, 5, 7, 8, 8)
    keep = torch.rand(mshape) > 0.3
    keep[..., 0] = True                      # no fully masked rows here
    check_op("ScaledDotProductAttention", [q, k, v, keep],
             F.scaled_dot_product_attention(q, k, v, attn_mask=keep), **TOL)
    add = torch.randn(mshape)
    check_op("ScaledDotProductAttention", [q, k, v, add],
             F.scaled_dot_product_attention(q, k, v, attn_mask=add), **TOL)


def test_fully_masked_row_matches_torch():
    q, k, v = qkv(1, 2, 2, 4, 5, 4, 4)
    keep = torch.ones(4, 5, dtype=torch.bool)
    keep[2] = False
    additive = torch.zeros(4, 5).masked_fill(~keep, float("-inf"))
    for m in (keep, additive):
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=m)
        check_op("ScaledDotProductAttention", [q, k, v, m], ref, **TOL)


def test_scale_and_gqa():
    q, k, v = qkv(2, 6, 2, 5, 4, 8, 3)
    ref = F.scaled_dot_product_attention(q, k, v, scale=0.3, enable_gqa=True, is_causal=True)
    check_op("ScaledDotProductAttention", [q, k, v], ref, attrs=dict(scale=0.3, enable_gqa=1, is_causal=1), **TOL)


def test_gqa_with_mask_and_batch_broadcast():
    q, k, v = qkv(2, 4, 1, 3, 5, 4, 4)
    mask = torch.randn(2, 4, 3, 5)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    check_op("ScaledDotProductAttention", [q, k, v, mask], ref, attrs=dict(enable_gqa=1), **TOL)
    q3, k3, v3 = torch.randn(4, 3, 8), torch.randn(1, 5, 8), torch.randn(1, 5, 2)   # 3-D, broadcast batch
    check_op("ScaledDotProductAttention", [q3, k3, v3], F.scaled_dot_product_attention(q3, k3, v3), **TOL)


def test_mask_with_causal_applies_both():
    q, k, v = qkv(1, 2, 2, 4, 4, 4, 4)
    keep = torch.rand(4, 4) > 0.5
    keep[:, 0] = True
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=keep & torch.ones(4, 4, dtype=torch.bool).tril())
    check_op("ScaledDotProductAttention", [q, k, v, keep], ref, attrs=dict(is_causal=1), **TOL)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype):
    q, k, v = qkv(1, 2, 2, 6, 6, 16, 16, dtype)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True).to(dtype)
    check_op("ScaledDotProductAttention", [q, k, v], ref, attrs=dict(is_causal=1), rtol=2e-2, atol=2e-2)


def test_errors():
    q, k, v = qkv(1, 3, 2, 4, 4, 4, 4)
    out = [TensorType((1, 3, 4, 4), DType.float32)]
    with pytest.raises(UnsupportedAttribute, match="enable_gqa.*ScaledDotProductAttention.*n0"):
        run_op("ScaledDotProductAttention", [q, k, v], out, dict(enable_gqa=1))
    q, k, v = qkv(1, 2, 2, 4, 4, 4, 4)
    with pytest.raises(UnsupportedAttribute, match="mask.*ScaledDotProductAttention"):
        run_op("ScaledDotProductAttention", [q, k, v, torch.zeros(3, 4)], [TensorType((1, 2, 4, 4), DType.float32)])
