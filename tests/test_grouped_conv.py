"""Grouped convolutions (1 < group, several output channels per group): fission computes the
contraction as ``[N, G, m_out, spatial...]``, the group an axis both operands read (the GEMM's
batch) and the group's output channels one only the weight reads (N), then reshapes it to
``[N, G*m_out, spatial...]``.  Checked against torch through the reference executor, the gemm
family (planned end to end, and the contraction alone), and the library's conv path; depthwise
convolutions keep their flat form (no N axes: a row reduction per output)."""
import pytest
import torch
import torch.nn.functional as F

from gemm_eval import _cache, _seed, F32_TOL, H100, HALF_TOL, batchnorm, compile_h100, eager, run_cpu, tile  # noqa: F401
from opcheck import check_op
from test_library_kernels import build, contractions, r, run_and_check, run_built

from tilefuse.analysis.classify import Category, classify, contraction_operands
from tilefuse.families.base import Group
from tilefuse.families.gemm import GemmFamily, _schedule, gemm_body
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.samples import allocate
from tilefuse.ir.evaluate import eval_prim
from tilefuse.ir.expr import Load, walk
from tilefuse.vendor.torch_call import library_kernel

TOL = dict(rtol=1e-4, atol=1e-4)
CONV = {1: F.conv1d, 2: F.conv2d}
CONVT = {1: F.conv_transpose1d, 2: F.conv_transpose2d}

# (x shape, w shape, torch keyword arguments): out channels per group m_out = w.shape[0] // groups
CASES = {
    "conv2d_g4_stride2": ((2, 8, 7, 7), (8, 2, 3, 3), dict(stride=2, padding=1, groups=4)),
    "conv1d_g2_dilation2": ((2, 4, 11), (6, 2, 3), dict(dilation=2, padding=2, groups=2)),
    "conv2d_channel_multiplier": ((1, 3, 6, 6), (6, 1, 3, 3), dict(padding=1, groups=3)),
}


def onnx_attrs(kw, nsp):
    each = lambda k, d: (kw.get(k, d),) * nsp  # noqa: E731
    return dict(strides=each("stride", 1), dilations=each("dilation", 1), pads=each("padding", 0) * 2,
                group=kw["groups"])


def contraction_of(pg):
    (c,) = [p for p in pg.prims if classify(p) is Category.contraction]
    return c


def extents(p, axes):
    return tuple(p.extents[v] for v in axes)


@pytest.mark.parametrize("case", list(CASES))
def test_fission_is_a_group_axis_contraction_and_a_reshape(case):
    xs, ws, kw = CASES[case]
    x, w, b = torch.randn(xs), torch.randn(ws), torch.randn(ws[0])
    ref = CONV[len(xs) - 2](x, w, b, **kw)
    pg = check_op("Conv", [x, w, b], ref, attrs=onnx_attrs(kw, len(xs) - 2), const=(1, 2), **TOL)
    assert [classify(p) for p in pg.prims] == [Category.layout, Category.contraction, Category.layout,
                                               Category.broadcast]
    g = kw["groups"]
    c = contraction_of(pg)
    assert c.out.shape == (xs[0], g, ws[0] // g) + ref.shape[2:]
    assert pg.prims[2].out.shape == ref.shape


@pytest.mark.parametrize("case", list(CASES))
def test_gemm_view_has_the_group_as_batch_and_its_channels_as_n(case):
    """After simplification, as the planner sees it: batch = g, M = (n, o...), N = f, K = (c, k...)."""
    xs, ws, kw = CASES[case]
    g, x, w = kw["groups"], torch.randn(xs), torch.randn(ws)
    (c, _), = contractions("Conv", [x, w], CONV[len(xs) - 2](x, w, **kw).shape, onnx_attrs(kw, len(xs) - 2))
    batch, m, n = contraction_operands(c)
    out = c.out.shape
    assert extents(c, batch) == (g,) and extents(c, n) == (ws[0] // g,)
    assert extents(c, m) == (out[0],) + out[3:]
    assert c.reduce.extents == ws[1:]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_grouped_conv_bn_relu_runs_through_a_gemm_kernel(dtype):
    """Compiled for h100 and run on the CPU under the interpreter; the gemm kernel is one GEMM per
    group (batch 4, N = 2 channels per group, K = 2*3*3), not one per output channel."""
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3, padding=1, groups=4, bias=False), batchnorm(8),
                                torch.nn.ReLU()).eval().to(dtype)
    x = torch.randn(2, 8, 6, 6, dtype=dtype)
    cm = compile_h100(model, x)
    (got,), (want,) = run_cpu(cm, x), eager(model, x)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, **(F32_TOL if dtype == torch.float32 else HALF_TOL[dtype]))
    assert any(k.family == "gemm" and any(o.startswith("Conv:") for o in k.ops) for k in cm.report.kernels), \
        [(k.family, k.ops) for k in cm.report.kernels]
    c = contraction_of(cm.primgraph)
    body = gemm_body(Group((c,), tuple(c.inputs), (c.name,), cm.primgraph.types))
    assert (body.shape.batch, body.shape.m, body.shape.n, body.shape.k) == (4, 2 * 6 * 6, 2, 2 * 3 * 3)


def gemm_alone(prim, xs):
    """The contraction alone as a gemm kernel (small forced tiles), checked against the reference;
    returns its GemmBody."""
    types = {n: TensorType(tuple(x.shape), DType.from_torch(x.dtype)) for n, x in zip(prim.inputs, xs)}
    body = gemm_body(Group((prim,), tuple(prim.inputs), (prim.name,), {**types, prim.name: prim.out}))
    built = GemmFamily().build(_schedule(body, tile(16, 16, 16), H100), "gemm_test")
    out = torch.full(prim.out.shape, float("nan"))
    built.run(list(xs), [out] + allocate(built.scratch, torch.device("cpu")))
    torch.testing.assert_close(out, eval_prim(prim, xs), **F32_TOL)
    return body


def test_grouped_conv_transpose():
    """ConvTranspose with groups gets the same form: fission against torch, the GEMM view, the
    contraction as a gemm kernel (its Select-guarded input load in operand A) and end to end."""
    x, w, b = torch.randn(1, 4, 4, 5), torch.randn(4, 3, 3, 3), torch.randn(6)
    kw = dict(stride=2, padding=1, output_padding=1, groups=2)
    ref = CONVT[2](x, w, b, **kw)
    attrs = dict(strides=(2, 2), pads=(1, 1, 1, 1), output_padding=(1, 1), group=2)
    pg = check_op("ConvTranspose", [x, w, b], ref, attrs=attrs, const=(1, 2), **TOL)
    assert [classify(p) for p in pg.prims] == [Category.contraction, Category.layout, Category.broadcast]
    (c, xs), = contractions("ConvTranspose", [x, w], ref.shape, attrs)
    assert c.out.shape == (1, 2, 3) + ref.shape[2:]
    batch, m, n = contraction_operands(c)
    assert extents(c, batch) == (2,) and extents(c, n) == (3,)
    body = gemm_alone(c, xs)
    assert (body.shape.batch, body.shape.n, body.shape.k) == (2, 3, 2 * 3 * 3)
    assert run_and_check(c, xs).path == "gemm"   # Select-guarded input: no conv path
    model = torch.nn.Sequential(torch.nn.ConvTranspose2d(4, 6, 3, **kw), torch.nn.ReLU()).eval()
    cm = compile_h100(model, x)
    torch.testing.assert_close(run_cpu(cm, x)[0], eager(model, x)[0], **F32_TOL)


@pytest.mark.parametrize("case", list(CASES))
def test_library_kernel_takes_the_conv_path(case, monkeypatch):
    xs, ws, kw = CASES[case]
    g, nsp = kw["groups"], len(xs) - 2
    shape = CONV[nsp](torch.randn(xs), torch.randn(ws), **kw).shape
    (prim, ins), = contractions("Conv", [torch.randn(xs), torch.randn(ws)], shape, onnx_attrs(kw, nsp))
    k = library_kernel(prim)
    assert (k.path, k.factors, k.conv.groups, k.conv.grouped) == ("conv", ("strided", "strided"), g, True), k
    assert k.conv.stride == (kw.get("stride", 1),) * nsp and k.conv.dilation == (kw.get("dilation", 1),) * nsp
    x, w = k.operands(ins)
    assert x.data_ptr() == ins[0].data_ptr() and w.data_ptr() == ins[1].data_ptr()   # views, no copies
    out = torch.empty(prim.out.shape)
    with monkeypatch.context() as m:
        for fn in ("bmm", "mm", "einsum"):
            m.setattr(torch, fn, lambda *a, **kw: pytest.fail("conv went through a GEMM"))
        k(ins, out)
    torch.testing.assert_close(out, eval_prim(prim, ins), **F32_TOL)


# Hand-built grouped-form prims (i = (n, g, f, o), rr = (c, k); a[0] the input, a[1] the weight):
# (input shapes, output shape, reduce extents, body, conv path?).  Any weight layout is a conv (its
# [G, F, C, K] view is flattened, a copy where it does not merge); anything else must not be.
GROUPED_LIKE = {
    "weight_f_major": ([(2, 4, 8), (6, 2, 3)], (2, 2, 3, 6), (2, 3),
                       lambda a, i, rr: a[0][i[0], i[1] * 2 + rr[0], i[3] + rr[1]]
                       * a[1][i[2] * 2 + i[1], rr[0], rr[1]], True),
    "weight_shared_by_groups": ([(2, 4, 8), (3, 2, 3)], (2, 2, 3, 6), (2, 3),
                                lambda a, i, rr: a[0][i[0], i[1] * 2 + rr[0], i[3] + rr[1]] * a[1][i[2], rr[0], rr[1]],
                                True),
    "overlapping_groups": ([(2, 3, 8), (4, 2, 3)], (2, 2, 2, 6), (2, 3),
                           lambda a, i, rr: a[0][i[0], i[1] + rr[0], i[3] + rr[1]]
                           * a[1][i[1] * 2 + i[2], rr[0], rr[1]], False),
    "input_reads_f": ([(2, 4, 9), (4, 2, 3)], (2, 2, 2, 6), (2, 3),
                      lambda a, i, rr: a[0][i[0], i[1] * 2 + rr[0], i[3] + rr[1] + i[2]]
                      * a[1][i[1] * 2 + i[2], rr[0], rr[1]], False),
}


@pytest.mark.parametrize("case", list(GROUPED_LIKE))
def test_grouped_form_like_prims(case):
    shapes, out_shape, extents, body, is_conv = GROUPED_LIKE[case]
    prim = build(shapes, out_shape, extents, body)
    k = run_built(prim, [r(*sh) for sh in shapes])
    assert (k.path == "conv") == is_conv, k


def test_depthwise_keeps_its_flat_form():
    """One input and one output channel per group: no group axis, no reshape; input and weight both
    read the output channel m (the batch of the GEMM view: no N axes, the fused family's row
    reductions), as before."""
    x, w, b = torch.randn(2, 4, 7, 7), torch.randn(4, 1, 3, 3), torch.randn(4)
    ref = F.conv2d(x, w, b, stride=2, padding=1, groups=4)
    attrs = dict(strides=(2, 2), pads=(1, 1, 1, 1), group=4)
    pg = check_op("Conv", [x, w, b], ref, attrs=attrs, const=(1, 2), **TOL)
    assert [classify(p) for p in pg.prims] == [Category.layout, Category.contraction, Category.broadcast]
    c = contraction_of(pg)
    assert c.out.shape == ref.shape
    n, m = c.axes[:2]
    xl, wl = (ld for ld in walk(c.body) if isinstance(ld, Load))
    assert xl.index[:2] == (n, m + c.reduce.axes[0]) and wl.index[:2] == (m, c.reduce.axes[0])
    (prim, ins), = contractions("Conv", [x, w], ref.shape, attrs)
    batch, _, nax = contraction_operands(prim)
    assert extents(prim, batch) == (4,) and nax == ()
    k = run_and_check(prim, ins)
    assert (k.path, k.conv.groups, k.conv.grouped) == ("conv", 4, False)
