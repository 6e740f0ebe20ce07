"""Library kernels (vendor/torch_call.py) against the reference executor, prim by prim.

Contraction prims come from fissioning real operators (their inputs from running the reference on
the operator's graph, so a conv gets its padded input) or are built by hand for the edge paths
(conv-like prims that are, and are not, convolutions: the conv path must never give a wrong answer).
Tolerances: fp32 1e-5; fp16 rtol/atol 1e-2 and bf16 2e-2 (the GEMM runs in 16-bit with torch's
accumulation, the reference accumulates in fp32); integers exact.
"""
import math

import pytest
import torch
from opcheck import one_node_graph

from tilefuse.ir.evaluate import ReferenceError, eval_prim, run_reference
import tilefuse.vendor.factors as factor_module
from tilefuse.analysis.classify import Category, classify
from tilefuse.fission import fission
from tilefuse.fission.registry import Fission
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.expr import Const, cast
from tilefuse.ir.prim import PrimGraph
from tilefuse.vendor.torch_call import library_kernel
from tilefuse.transform.simplify import simplify_graph

torch.manual_seed(0)
F32, F16, BF16, I64, I32 = DType.float32, DType.float16, DType.bfloat16, DType.int64, DType.int32
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-2, 1e-2), torch.bfloat16: (2e-2, 2e-2)}
S = ("strided", "strided")
H = torch.float16


def contractions(op, inputs, out_shape, attrs=None, dtype=F32):
    """[(prim, its input tensors)] for every contraction prim of one fissioned, simplified operator."""
    g = one_node_graph(op, inputs, [TensorType(tuple(out_shape), dtype)], attrs)
    pg = simplify_graph(fission(g))
    full = PrimGraph(pg.inputs, pg.constants, pg.prims, tuple(p.name for p in pg.prims))
    feeds = {d.name: inputs[int(d.name[1:])] for d in g.inputs}
    env = {c.name: c.data for c in pg.constants} | feeds
    env.update(zip(full.outputs, run_reference(full, feeds)))
    found = [(p, [env[n] for n in p.inputs]) for p in pg.prims if classify(p) is Category.contraction]
    assert found, f"{op}: no contraction prim"
    return found


def run_and_check(prim, xs):
    """Run the library kernel into a poisoned buffer and compare with eval_prim; returns the kernel."""
    k = library_kernel(prim)
    out = torch.full(prim.out.shape, 7, dtype=prim.out.dtype.to_torch())
    ptr = out.data_ptr()
    assert k(xs, out) is None
    assert out.data_ptr() == ptr
    ref = eval_prim(prim, xs)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    if out.dtype.is_floating_point:
        rtol, atol = TOL.get(out.dtype, TOL[torch.float32])
        torch.testing.assert_close(out, ref, rtol=rtol, atol=atol, msg=lambda m: f"{k}: {m}")
    else:
        assert torch.equal(out, ref), k
    return k


def r(*shape, dtype=torch.float32):
    if dtype.is_floating_point:
        return torch.randn(*shape).to(dtype)
    return torch.randint(-20, 20, shape, dtype=dtype)


# ---------------------------------------------------------------- operators from fission

OPS = {
    "matmul_2d": ("MatMul", [r(5, 7), r(7, 6)], (5, 6), None, F32, [("gemm", S, True)]),
    "matmul_broadcast_batch": ("MatMul", [r(2, 1, 3, 4), r(5, 4, 6)], (2, 5, 3, 6), None, F32,
                               [("gemm", S, False)]),
    "matmul_batched": ("MatMul", [r(3, 4, 5), r(3, 5, 2)], (3, 4, 2), None, F32, [("gemm", S, True)]),
    "matmul_vector": ("MatMul", [r(2, 3, 4), r(4, 5)], (2, 3, 5), None, F32, [("gemm", S, True)]),
    "gemm_tA": ("Gemm", [r(4, 3), r(4, 5)], (3, 5), {"transA": 1}, F32, [("gemm", S, True)]),
    "gemm_tB": ("Gemm", [r(3, 4), r(5, 4)], (3, 5), {"transB": 1}, F32, [("gemm", S, True)]),
    "gemm_tAtB": ("Gemm", [r(4, 3), r(5, 4)], (3, 5), {"transA": 1, "transB": 1, "alpha": 0.5}, F32,
                  [("gemm", S, True)]),
    "attention_scores": ("Einsum", [r(2, 3, 4, 8), r(2, 3, 5, 8)], (2, 3, 4, 5),
                         {"equation": "bhqd,bhkd->bhqk"}, F32, [("gemm", S, True)]),
    "sdpa": ("ScaledDotProductAttention", [r(2, 3, 4, 8), r(2, 3, 5, 8), r(2, 3, 5, 6)], (2, 3, 4, 6), None,
             F32, [("gemm", S, True), ("gemm", S, True)]),
    "sdpa_fp16": ("ScaledDotProductAttention",
                  [r(1, 2, 4, 16, dtype=H), r(1, 2, 5, 16, dtype=H), r(1, 2, 5, 8, dtype=H)], (1, 2, 4, 8), None, F16,
                  [("gemm", S, True), ("gemm", S, True)]),
    "conv_transpose": ("ConvTranspose", [r(2, 3, 4, 4), r(3, 2, 3, 3)], (2, 2, 9, 9), {"strides": (2, 2)}, F32,
                       [("gemm", ("gathered", "strided"), False)]),   # Select-guarded input: no conv path
    "matmul_fp16": ("MatMul", [r(8, 64, dtype=torch.float16), r(64, 9, dtype=torch.float16)], (8, 9), None, F16,
                    [("gemm", S, True)]),
    "matmul_bf16": ("MatMul", [r(8, 64, dtype=torch.bfloat16), r(64, 9, dtype=torch.bfloat16)], (8, 9), None,
                    BF16, [("gemm", S, True)]),
    "matmul_int64": ("MatMul", [r(2, 5, 7, dtype=torch.int64), r(7, 3, dtype=torch.int64)], (2, 5, 3), None, I64,
                     [("gemm", S, True)]),
    "matmul_int32": ("MatMul", [r(5, 7, dtype=torch.int32), r(7, 3, dtype=torch.int32)], (5, 3), None, I32,
                     [("gemm", S, True)]),
    "einsum_three_operands": ("Einsum", [r(3, 4), r(4, 5), r(5, 2)], (3, 2), {"equation": "ij,jk,kl->il"}, F32,
                              [("einsum", ("strided",) * 3, False)]),
    "einsum_one_sided_sum": ("Einsum", [r(3, 4, 2), r(4, 5)], (3, 5), {"equation": "ijx,jk->ik"}, F32,
                             [("einsum", S, False)]),
}


@pytest.mark.parametrize("case", list(OPS))
def test_operator_contractions_match_reference(case):
    op, ins, shape, attrs, dtype, expect = OPS[case]
    found = contractions(op, ins, shape, attrs, dtype)
    assert len(found) == len(expect)
    for (prim, xs), (path, factors, direct) in zip(found, expect):
        k = run_and_check(prim, xs)
        assert (k.path, k.factors, k.direct) == (path, factors, direct), k


# Convolutions take the "conv" path: torch's conv{1,2,3}d on views of the input and the weight.
# (op, inputs, output shape, attrs, dtype, groups)
CONVS = {
    "conv1d": ("Conv", [r(2, 4, 12), r(6, 4, 3)], (2, 6, 10), None, F32, 1),
    "conv1d_stride_dilation_pad": ("Conv", [r(2, 3, 20), r(5, 3, 4)], (2, 5, 6),
                                   {"strides": (3,), "dilations": (2,), "pads": (2, 1)}, F32, 1),
    "conv2d_stride_dilation_pad": ("Conv", [r(2, 3, 11, 10), r(4, 3, 3, 3)], (2, 4, 5, 5),
                                   {"strides": (2, 2), "dilations": (2, 1), "pads": (1, 0, 1, 1)}, F32, 1),
    "conv2d_batch1": ("Conv", [r(1, 3, 9, 9), r(4, 3, 3, 3)], (1, 4, 3, 3), {"strides": (2, 2), "dilations": (2, 2)},
                      F32, 1),
    "conv2d_nonsquare_batch3": ("Conv", [r(3, 2, 9, 8), r(4, 2, 1, 3)], (3, 4, 5, 6), {"strides": (2, 1)}, F32, 1),
    "conv2d_same_upper": ("Conv", [r(1, 2, 7, 7), r(3, 2, 3, 3)], (1, 3, 4, 4),
                          {"strides": (2, 2), "auto_pad": "SAME_UPPER"}, F32, 1),
    "conv2d_1x1": ("Conv", [r(2, 3, 5, 5), r(4, 3, 1, 1)], (2, 4, 5, 5), None, F32, 1),
    "conv2d_1x1_stride2": ("Conv", [r(2, 3, 5, 5), r(4, 3, 1, 1)], (2, 4, 3, 3), {"strides": (2, 2)}, F32, 1),
    "conv2d_one_channel_in_out": ("Conv", [r(2, 1, 6, 6), r(1, 1, 3, 3)], (2, 1, 4, 4), None, F32, 1),
    "conv2d_full_window": ("Conv", [r(2, 3, 4, 4), r(5, 3, 4, 4)], (2, 5, 1, 1), None, F32, 1),
    "conv3d": ("Conv", [r(2, 2, 7, 8, 6), r(3, 2, 3, 2, 3)], (2, 3, 3, 7, 3),
               {"strides": (2, 1, 2), "dilations": (1, 2, 1), "pads": (1, 0, 1, 0, 1, 1)}, F32, 1),
    "grouped": ("Conv", [r(2, 4, 9, 9), r(6, 2, 3, 3)], (2, 6, 7, 7), {"group": 2}, F32, 2),
    "grouped_1d_padded": ("Conv", [r(2, 6, 9), r(6, 2, 3)], (2, 6, 9), {"group": 3, "pads": (1, 1)}, F32, 3),
    "grouped_3d": ("Conv", [r(1, 4, 5, 5, 4), r(6, 2, 2, 2, 2)], (1, 6, 2, 4, 3), {"group": 2, "strides": (2, 1, 1)},
                   F32, 2),
    "grouped_fp16": ("Conv", [r(2, 8, 6, 6, dtype=H), r(8, 2, 3, 3, dtype=H)], (2, 8, 4, 4), {"group": 4}, F16, 4),
    "depthwise": ("Conv", [r(1, 3, 6, 6), r(3, 1, 3, 3)], (1, 3, 4, 4), {"group": 3}, F32, 3),
    "depthwise_padded_strided": ("Conv", [r(2, 3, 7, 7), r(3, 1, 3, 3)], (2, 3, 4, 4),
                                 {"group": 3, "pads": (1, 1, 1, 1), "strides": (2, 2)}, F32, 3),
    "depthwise_multiplier": ("Conv", [r(1, 2, 6, 6), r(4, 1, 3, 3)], (1, 4, 4, 4), {"group": 2}, F32, 2),
    "conv2d_fp16": ("Conv", [r(2, 3, 8, 8, dtype=H), r(4, 3, 3, 3, dtype=H)], (2, 4, 8, 8),
                    {"pads": (1, 1, 1, 1)}, F16, 1),
    "depthwise_bf16": ("Conv", [r(2, 4, 8, 8, dtype=torch.bfloat16), r(4, 1, 3, 3, dtype=torch.bfloat16)],
                       (2, 4, 6, 6), {"group": 4}, BF16, 4),
}


@pytest.mark.parametrize("case", list(CONVS))
def test_convolutions_take_the_conv_path(case):
    op, ins, shape, attrs, dtype, groups = CONVS[case]
    (prim, xs), = contractions(op, ins, shape, attrs, dtype)
    k = run_and_check(prim, xs)
    assert (k.path, k.factors, k.direct, k.conv.groups) == ("conv", S, False, groups), k
    strides, dilations = (attrs or {}).get("strides"), (attrs or {}).get("dilations")
    assert k.conv.stride == (strides or (1,) * (len(shape) - 2))
    assert k.conv.dilation == (dilations or (1,) * (len(shape) - 2))


def test_conv_reads_views_and_never_builds_windows(monkeypatch):
    # stride 2 leaves the input's last row and column unread: the view still spans the whole input
    (prim, xs), = contractions("Conv", [r(2, 3, 10, 10), r(4, 3, 3, 3)], (2, 4, 4, 4), {"strides": (2, 2)})
    k = library_kernel(prim)
    x, w = k.operands(xs)
    assert x.data_ptr() == xs[0].data_ptr() and x.shape == xs[0].shape and x.is_contiguous()
    assert w.data_ptr() == xs[1].data_ptr()
    out = torch.empty(prim.out.shape)
    with monkeypatch.context() as m:
        for fn in ("bmm", "mm", "einsum"):
            m.setattr(torch, fn, lambda *a, **kw: pytest.fail("conv went through a GEMM"))
        k(xs, out)
    torch.testing.assert_close(out, eval_prim(prim, xs), rtol=1e-5, atol=1e-5)


def test_transposed_b_gemm_reads_views_and_never_gathers(monkeypatch):
    (prim, xs), = contractions("Gemm", [r(6, 4), r(5, 4)], (6, 5), {"transB": 1})
    k = library_kernel(prim)

    def no_gather(*a, **kw):
        raise AssertionError("a strided factor was gathered")

    monkeypatch.setattr(factor_module, "Grid", no_gather)
    ops = k.operands(xs)
    for t in ops:  # every operand is a view of an input's storage: no copy, no gather
        assert any(t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for x in xs)
    b = next(t for t in ops if t.shape == (4, 5))  # B[k, n] = x1[n, k]: the transposed view
    assert b.stride() == (1, 4)
    run_and_check(prim, xs)


# ---------------------------------------------------------------- hand-built prims

def build(shapes, out_shape, extents, body, dtypes=None):
    """One sum prim over inputs of ``shapes``: ``body(refs, i, r)``."""
    fx = Fission(set())
    dtypes = dtypes or [F32] * len(shapes)
    refs = [fx.ref(f"a{k}", TensorType(s, d)) for k, (s, d) in enumerate(zip(shapes, dtypes))]
    fx.reduce(out_shape, extents, "sum", lambda i, rr: body(refs, i, rr))
    return fx.prims[-1]


def feed(prim, xs):
    """Tensors in ``prim.inputs`` order (slots follow first use in the body) from a0, a1, ... order."""
    return [xs[int(n[1:])] for n in prim.inputs]


def run_built(prim, xs):
    return run_and_check(prim, feed(prim, xs))


def test_constant_scale_factor_is_applied():
    prim = build([(3, 8), (5, 8)], (3, 5), (8,),
                 lambda a, i, rr: a[0][i[0], rr[0]] * a[1][i[1], rr[0]] * Const(1 / math.sqrt(8), F32))
    k = run_built(prim, [r(3, 8), r(5, 8)])
    assert (k.path, k.factors, k.direct) == ("gemm", S, True)
    assert k.scale == pytest.approx(1 / math.sqrt(8))


def test_cast_operand_is_strided_then_converted():
    prim = build([(4, 6), (6, 3)], (4, 3), (6,),
                 lambda a, i, rr: cast(a[0][i[0], rr[0]], F32) * a[1][rr[0], i[1]], [I32, F32])
    k = run_built(prim, [r(4, 6, dtype=torch.int32), r(6, 3)])
    assert (k.path, k.factors) == ("gemm", S)


def test_noncontiguous_and_offset_inputs_use_their_own_strides():
    prim = build([(4, 6), (6, 5)], (4, 5), (6,), lambda a, i, rr: a[0][i[0], rr[0]] * a[1][rr[0], i[1]])
    big = r(9, 10)
    xa = r(6, 4).t()                 # transposed: not contiguous
    xb = big[2:8, 3:8]               # a slice with a storage offset
    k = run_built(prim, [xa, xb])
    assert k.path == "gemm" and not xb.is_contiguous()


def test_slice_with_constant_offset_and_diagonal():
    prim = build([(6, 10), (5, 5)], (3, 5), (5,),
                 lambda a, i, rr: a[0][i[0] + 2, rr[0] * 2 + 1] * a[1][rr[0], rr[0]] * a[1][i[1], i[1]])
    k = run_built(prim, [r(6, 10), r(5, 5)])
    assert (k.path, k.factors) == ("einsum", ("strided",) * 3)


def test_non_affine_and_data_dependent_factors_are_gathered():
    flip = build([(3, 4), (4, 5)], (3, 5), (4,), lambda a, i, rr: a[0][i[0], 3 - rr[0]] * a[1][rr[0], i[1]])
    k = run_built(flip, [r(3, 4), r(4, 5)])
    assert k.factors == ("gathered", "strided")        # negative stride: no view
    reshape = build([(2, 6), (4, 5)], (3, 5), (4,),
                    lambda a, i, rr: a[0][(i[0] * 4 + rr[0]) // 6, (i[0] * 4 + rr[0]) % 6] * a[1][rr[0], i[1]])
    k = run_built(reshape, [r(2, 6), r(4, 5)])
    assert k.factors == ("gathered", "strided")
    lookup = build([(7, 3), (4,), (4, 5)], (3, 5), (4,),
                   lambda a, i, rr: a[0][a[1][(rr[0],)], i[0]] * a[2][rr[0], i[1]], [F32, I64, F32])
    k = run_built(lookup, [r(7, 3), torch.tensor([6, 0, 2, 6]), r(4, 5)])
    assert (k.path, k.factors) == ("gemm", ("gathered", "strided"))


def test_extent_one_variable_read_by_one_factor_keeps_the_gemm_form():
    prim = build([(3, 4), (4, 1, 5)], (3, 5), (4, 1),
                 lambda a, i, rr: a[0][2 - i[0], rr[0]] * a[1][rr[0], rr[1], i[1]])
    k = run_built(prim, [r(3, 4), r(4, 1, 5)])
    assert (k.path, k.factors, k.direct) == ("gemm", ("gathered", "strided"), True)


def test_scalar_output_and_matrix_vector():
    dot = build([(6,), (6,)], (), (6,), lambda a, i, rr: a[0][(rr[0],)] * a[1][(rr[0],)])
    assert run_built(dot, [r(6), r(6)]).path == "gemm"
    mv = build([(4, 6), (6,)], (4,), (6,), lambda a, i, rr: a[0][i[0], rr[0]] * a[1][(rr[0],)])
    assert run_built(mv, [r(4, 6), r(6)]).direct


def test_bool_and_single_factor_sums_fall_back_to_reference():
    both = build([(3, 4), (4, 2)], (3, 2), (4,),
                 lambda a, i, rr: a[0][i[0], rr[0]] * a[1][rr[0], i[1]], [DType.bool, DType.bool])
    k = run_built(both, [torch.rand(3, 4) > 0.5, torch.rand(4, 2) > 0.5])
    assert k.path == "reference" and "bool" in k.reason
    rowsum = build([(3, 4)], (3,), (4,), lambda a, i, rr: a[0][i[0], rr[0]])
    assert run_built(rowsum, [r(3, 4)]).path == "reference"
    unread = build([(2, 4), (4,)], (2, 3), (4,), lambda a, i, rr: a[0][i[0], rr[0]] * a[1][(rr[0],)])
    k = run_built(unread, [r(2, 4), r(4)])          # output axis i1 is read by no factor
    assert k.path == "reference" and "no factor" in k.reason


@pytest.mark.parametrize("m,k", [(3, 0), (0, 4)])
def test_zero_extents(m, k):
    prim = build([(m, k), (k, 5)], (m, 5), (k,), lambda a, i, rr: a[0][i[0], rr[0]] * a[1][rr[0], i[1]])
    assert run_built(prim, [r(m, k), r(k, 5)]).path == "fill"


def test_out_of_bounds_input_is_never_read_silently():
    prim = build([(3, 4), (4, 5)], (3, 5), (4,), lambda a, i, rr: a[0][i[0], rr[0]] * a[1][rr[0], i[1]])
    k = library_kernel(prim)
    with pytest.raises(ReferenceError, match="out of bounds"):
        k(feed(prim, [r(3, 3), r(4, 5)]), torch.empty(3, 5))      # too small for the prim's index: falls back, raises


# Hand-built conv-like prims: (input shapes, output shape, reduce extents, body, dtypes, conv path?)
# a[0] is the input, a[1] the weight; i = (n, f, o...), rr = (c, k...).
CONV_LIKE = {
    "offsets_slice_the_input": ([(2, 5, 14), (3, 2, 3)], (2, 3, 4), (2, 3),
                                lambda a, i, rr: a[0][i[0], rr[0] + 1, i[2] * 2 + rr[1] * 2 + 3]
                                * a[1][i[1], rr[0], rr[1]], None, True),
    "constant_batch_index": ([(3, 2, 9), (4, 2, 3)], (1, 4, 7), (2, 3),
                             lambda a, i, rr: a[0][2, rr[0], i[2] + rr[1]] * a[1][i[1], rr[0], rr[1]], None, True),
    "weight_layout_c_f_kw_kh": ([(2, 3, 7, 6), (3, 4, 2, 3)], (2, 4, 4, 5), (3, 3, 2),
                                lambda a, i, rr: a[0][i[0], rr[0], i[2] + rr[1], i[3] + rr[2]]
                                * a[1][rr[0], i[1], rr[2], rr[1]], None, True),    # a permuted weight view: a conv
    "scaled_mixed_precision": ([(2, 3, 8), (4, 3, 3)], (2, 4, 6), (3, 3),
                               lambda a, i, rr: cast(a[0][i[0], rr[0], i[2] + rr[1]], F32) * a[1][i[1], rr[0], rr[1]]
                               * Const(0.25, F32), [F16, F32], True),
    "flipped_input": ([(2, 3, 8), (4, 3, 3)], (2, 4, 6), (3, 3),
                      lambda a, i, rr: a[0][i[0], rr[0], i[2] - rr[1] + 2] * a[1][i[1], rr[0], rr[1]], None, False),
    "flipped_weight": ([(2, 3, 8), (4, 3, 3)], (2, 4, 6), (3, 3),
                       lambda a, i, rr: a[0][i[0], rr[0], i[2] + rr[1]] * a[1][i[1], rr[0], 2 - rr[1]], None, False),
    "locally_connected": ([(2, 3, 8), (4, 3, 8)], (2, 4, 6), (3, 3),
                          lambda a, i, rr: a[0][i[0], rr[0], i[2] + rr[1]] * a[1][i[1], rr[0], i[2] + rr[1]],
                          None, False),
    "output_axes_n_o_f": ([(2, 3, 8), (4, 3, 3)], (2, 6, 4), (3, 3),
                          lambda a, i, rr: a[0][i[0], rr[0], i[1] + rr[1]] * a[1][i[2], rr[0], rr[1]], None, False),
    "overlapping_channel_windows": ([(2, 5, 8), (4, 2, 3)], (2, 4, 6), (2, 3),
                                    lambda a, i, rr: a[0][i[0], i[1] + rr[0], i[2] + rr[1]] * a[1][i[1], rr[0], rr[1]],
                                    None, False),
    "overlapping_groups": ([(2, 3, 8), (4, 2, 3)], (2, 4, 6), (2, 3),
                           lambda a, i, rr: a[0][i[0], i[1] // 2 + rr[0], i[2] + rr[1]] * a[1][i[1], rr[0], rr[1]],
                           None, False),
    "kernel_axis_in_two_dims": ([(2, 3, 6, 6), (4, 3, 3)], (2, 4, 4, 4), (3, 3),
                                lambda a, i, rr: a[0][i[0], rr[0], i[2] + rr[1], i[3] + rr[1]]
                                * a[1][i[1], rr[0], rr[1]], None, False),
    "spatial_dims_mixed": ([(2, 3, 6, 9), (4, 3, 3, 3)], (2, 4, 4, 4), (3, 3, 3),
                           lambda a, i, rr: a[0][i[0], rr[0], i[2] + rr[1], i[3] + i[2] + rr[2]]
                           * a[1][i[1], rr[0], rr[1], rr[2]], None, False),
    "integer_conv": ([(2, 3, 8), (4, 3, 3)], (2, 4, 6), (3, 3),
                     lambda a, i, rr: a[0][i[0], rr[0], i[2] + rr[1]] * a[1][i[1], rr[0], rr[1]], [I32, I32], False),
}


@pytest.mark.parametrize("case", list(CONV_LIKE))
def test_conv_like_prims(case):
    shapes, out_shape, extents, body, dtypes, is_conv = CONV_LIKE[case]
    dtypes = dtypes or [F32] * len(shapes)
    prim = build(shapes, out_shape, extents, body, dtypes)
    k = run_built(prim, [r(*sh, dtype=d.to_torch()) for sh, d in zip(shapes, dtypes)])
    assert (k.path == "conv") == is_conv, k


def test_conv_on_noncontiguous_input_and_out_of_bounds():
    (prim, xs), = contractions("Conv", [r(2, 3, 9, 9), r(4, 3, 3, 3)], (2, 4, 7, 7), {"strides": (1, 1)})
    x = xs[0].transpose(2, 3).contiguous().transpose(2, 3)   # same values, column-major spatial dims
    assert run_and_check(prim, [x, xs[1]]).path == "conv"
    k = library_kernel(prim)
    with pytest.raises(ReferenceError, match="out of bounds"):
        k([xs[0][:, :, :8], xs[1]], torch.empty(2, 4, 7, 7))


@pytest.mark.gpu
def test_cuda_conv_fp32_and_fp16():
    for dt, tol in ((F32, 1e-4), (F16, 1e-2)):
        t = dt.to_torch()
        (prim, xs), = contractions("Conv", [r(2, 8, 12, 12, dtype=t), r(8, 2, 3, 3, dtype=t)], (2, 8, 6, 6),
                                   {"group": 4, "strides": (2, 2), "pads": (1, 1, 1, 1)}, dt)
        k = library_kernel(prim)
        out = torch.empty(prim.out.shape, dtype=t, device="cuda")
        k([x.cuda() for x in xs], out)
        assert k.path == "conv"
        torch.testing.assert_close(out.cpu(), eval_prim(prim, xs), rtol=tol, atol=tol)


@pytest.mark.gpu
def test_cuda_gemm_and_integer_fallback():
    (prim, xs), = contractions("MatMul", [r(16, 32, dtype=torch.float16), r(32, 8, dtype=torch.float16)],
                               (16, 8), dtype=F16)
    k = library_kernel(prim)
    xs = [x.cuda() for x in xs]
    out = torch.empty(16, 8, dtype=torch.float16, device="cuda")
    k(xs, out)
    torch.testing.assert_close(out.cpu(), eval_prim(prim, [x.cpu() for x in xs]), rtol=1e-2, atol=1e-2)
    (prim, xs), = contractions("MatMul", [r(4, 5, dtype=torch.int64), r(5, 3, dtype=torch.int64)], (4, 3),
                               dtype=I64)
    out = torch.empty(4, 3, dtype=torch.int64, device="cuda")
    library_kernel(prim)([x.cuda() for x in xs], out)
    assert torch.equal(out.cpu(), eval_prim(prim, xs))
