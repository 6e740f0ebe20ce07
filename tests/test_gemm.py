"""The gemm kernel family (one contraction with its fused prologue and epilogue, tl.dot), planned
for h100 and run in the Triton interpreter, against eager torch and the reference executor.

Two ways in: ``tilefuse.compile`` (the planner chooses the fusion and the tile; the test asserts
the kernel is a gemm kernel holding the expected ops), and the family's own API on the whole
graph as one group with a forced tile (``_forced``), to cover ragged shapes, looped K, several M
and N tiles and the group-M swizzle deterministically.
"""
import pytest
import torch

import tilefuse
from tilefuse.ir.samples import allocate
from tilefuse.families.fused import FusedFamily
from tilefuse.families.gemm import GemmFamily, _schedule, gemm_body
from tilefuse.ir.dtypes import DType
from tilefuse.ir.evaluate import run_reference
from tilefuse.families.gemm import GemmShape, GemmTile, ranked_tiles
from tilefuse.families.gemm.space import tile_space

from gemm_eval import (F32_TOL, H100, HALF_TOL, _cache, _seed, batchnorm, check_planned, compile_h100, eager,  # noqa: F401
                       feeds_of, forced, gemm_kernels, run_cpu, tile, whole)



# ---------------------------------------------------------------- dtypes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape,act", [((7, 40), torch.nn.ReLU), ((2, 7, 40), torch.nn.GELU)], ids=["gemm", "matmul"])
def test_linear_activation_is_one_gemm_kernel_in_every_dot_dtype(dtype, shape, act):
    """Linear + activation (2-D input: a Gemm op with its bias; 3-D: MatMul + Add) is one gemm
    kernel in fp32/fp16/bf16, its output in the model's dtype."""
    model = torch.nn.Sequential(torch.nn.Linear(40, 24), act()).eval().to(dtype)
    x = torch.randn(*shape).to(dtype)
    cm = check_planned(model, x, tol=F32_TOL if dtype is torch.float32 else HALF_TOL[dtype])
    (k,) = gemm_kernels(cm)
    assert {"Relu" if act is torch.nn.ReLU else "Gelu"} <= {o.split(":")[0] for o in k.ops}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_dot_dtypes_ragged_looped_k(dtype):
    """Operands in each dot dtype, ragged M, N, K and a looped K: one tl.dot per K step,
    accumulating in fp32 and rounding once; fp32 dots run in IEEE precision (no TF32)."""
    x, w = torch.randn(37, 45).to(dtype), torch.randn(45, 29).to(dtype)
    tol = F32_TOL if dtype is torch.float32 else HALF_TOL[dtype]
    built, body = forced(lambda x, w: torch.relu(x @ w), tile(16, 16, 16), x, w, tol=tol)
    assert body.in_dtype.to_torch() == dtype
    assert "for k_start in range(0, 45, BLOCK_K)" in built.source
    assert built.source.count("tl.dot(") == 1
    assert ('input_precision="ieee"' in built.source) == (dtype is torch.float32)


# ---------------------------------------------------------------- tiles


@pytest.mark.parametrize("t", [tile(16, 16, 16), tile(32, 16, 32), tile(64, 32, 64), tile(16, 32, 16, swizzle=8)],
                         ids=["16x16x16", "32x16x32", "64x32x64-one-k-step", "swizzle-with-few-row-tiles"])
def test_ragged_shape_with_forced_tiles(t):
    """37x29x45 (no dimension a multiple of any tile): every element written and right, with a
    looped K (K > BK) or one K step, one or several M and N tiles."""
    built, body = forced(lambda x, w: x @ w, t, torch.randn(37, 45), torch.randn(45, 29))
    assert (body.shape.m, body.shape.n, body.shape.k) == (37, 29, 45)
    assert ("for k_start in range(0, 45, BLOCK_K)" in built.source) == (t.bk < 45)


@pytest.mark.parametrize("swizzle", [1, 8])
def test_group_m_swizzle(swizzle):
    """M=150 over BM=16 (10 row tiles, the last group partial) by N=40 over BN=16 (3 column
    tiles): the group-M order covers every tile exactly once, and is only emitted when asked."""
    built, _ = forced(lambda x, w: torch.relu(x @ w), tile(16, 16, 16, swizzle), torch.randn(150, 45),
                      torch.randn(45, 40))
    assert ("group" in built.source) == (swizzle > 1)
    if swizzle > 1:
        assert "tl.minimum(" in built.source      # the last, partial group of row tiles


# ---------------------------------------------------------------- operand layouts


@pytest.mark.parametrize("fn,shapes", [
    (lambda x, w: x @ w.t(), [(37, 45), (29, 45)]),
    (lambda x, w: x.t() @ w, [(45, 37), (45, 29)]),
    (lambda x, w: x.transpose(0, 1) @ w + 1.0, [(24, 12), (24, 20)]),
], ids=["x@wT", "xT@w", "transposed-input-prologue"])
def test_transposed_operands_load_through_the_transpose(fn, shapes):
    """A transpose feeding an operand is its load order: the vertical transformation composes it
    into the contraction's index map, so no Transpose prim is left and the plan is one kernel
    (a library GEMM on a transposed view, or a gemm kernel with the bias); forced as a gemm
    kernel, it matches."""
    args = [torch.randn(*s) for s in shapes]
    cm = compile_h100(fn, *args)
    assert len(cm.kernels) == 1 and not any(p.origin.op == "Transpose" for p in cm.primgraph.prims)
    torch.testing.assert_close(run_cpu(cm, *args)[0], eager(fn, *args)[0], **F32_TOL)
    forced(fn, tile(16, 16, 16), *args)


@pytest.mark.parametrize("fn,shapes", [
    (lambda x, w, b: torch.relu(x @ w + b), [(3, 10, 24), (24, 20), (20,)]),
    (lambda x, w: torch.relu(x @ w), [(2, 1, 8, 16), (1, 3, 16, 12)]),
], ids=["BMK@KN", "broadcast-batch"])
def test_broadcast_operands(fn, shapes):
    """[B,M,K] @ [K,N] and [B,1,M,K] @ [1,H,K,N] (batch axes each operand broadcasts): one gemm kernel."""
    args = [torch.randn(*s) for s in shapes]
    check_planned(fn, *args)
    forced(fn, tile(16, 16, 16), *args)


def test_attention_scores_batched():
    """QK^T over [2,3] batch positions ([2,3,8,16] @ [2,3,16,8]): a batch of 6 GEMMs, one program
    column each; scaled through the planner, plain with a forced tile."""
    q, k = torch.randn(2, 3, 8, 16), torch.randn(2, 3, 16, 8)
    check_planned(lambda q, k: (q @ k) * 0.25, q, k)
    _, body = forced(lambda q, k: q @ k, tile(16, 16, 16), q, k)
    assert (body.shape.batch, body.shape.m, body.shape.n, body.shape.k) == (6, 8, 8, 16)


def test_gemv():
    """M = 1: (1, 40) @ (40, 24), through the planner with bias + GELU, and with two N tiles."""
    x, w, b = torch.randn(1, 40), torch.randn(40, 24), torch.randn(24)
    check_planned(lambda x, w, b: torch.nn.functional.gelu(x @ w + b), x, w, b)
    _, body = forced(lambda x, w: x @ w, tile(16, 16, 16), x, w)
    assert (body.shape.m, body.shape.n, body.shape.k) == (1, 24, 40)


# ---------------------------------------------------------------- epilogues


EPILOGUES = {
    "bias": (lambda x, w, b, r: x @ w + b, "Add"),
    "scale": (lambda x, w, b, r: (x @ w) * 0.125, "Mul"),
    "relu": (lambda x, w, b, r: torch.relu(x @ w + b), "Relu"),
    "gelu": (lambda x, w, b, r: torch.nn.functional.gelu(x @ w + b), "Gelu"),
    "sigmoid": (lambda x, w, b, r: torch.sigmoid(x @ w), "Sigmoid"),
    "residual": (lambda x, w, b, r: x @ w + r, "Add"),
    "cast": (lambda x, w, b, r: (x @ w + b).half(), "Cast"),
}


@pytest.mark.parametrize("kind", list(EPILOGUES))
def test_epilogue_kinds(kind):
    """Each epilogue is inlined at the accumulator: one gemm kernel holding MatMul and the op."""
    fn, op = EPILOGUES[kind]
    x, w, b, r = torch.randn(12, 32), torch.randn(32, 24), torch.randn(24), torch.randn(12, 24)
    cm = check_planned(fn, x, w, b, r, tol=HALF_TOL[torch.float16] if kind == "cast" else F32_TOL)
    (k,) = gemm_kernels(cm)
    assert any(o.startswith("MatMul:") for o in k.ops) and any(o.startswith(f"{op}:") for o in k.ops)


def test_two_outputs_pre_and_post_activation():
    """Both the pre-activation and the activation written by one kernel (one store each)."""
    def f(x, w, b):
        pre = x @ w + b
        return pre, torch.relu(pre)
    args = torch.randn(12, 32), torch.randn(32, 24), torch.randn(24)
    cm = check_planned(f, *args)
    assert len(cm.kernels[0].outputs) == 2
    built, _ = forced(f, tile(16, 16, 16), *args)
    assert built.source.count("tl.store(") == 2


def test_head_split_transpose_is_a_store_order():
    """Linear -> GELU -> view(2,5,4,10).transpose(1,2): one gemm kernel storing in head order."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(48, 40)

        def forward(self, x):
            return torch.nn.functional.gelu(self.lin(x)).view(2, 5, 4, 10).transpose(1, 2)

    model, x = M().eval(), torch.randn(2, 5, 48)
    cm = check_planned(model, x, tol=dict(rtol=1e-5, atol=1e-6))
    (k,) = gemm_kernels(cm)
    # (the view is composed into the transpose, the graph's output, by the vertical transformation)
    assert {"Transpose", "Gelu"} <= {o.split(":")[0] for o in k.ops}
    forced(model, tile(16, 16, 16), x)


@pytest.mark.parametrize("n", [16, 20])
def test_softmax_over_n_in_the_epilogue(n):
    """softmax(x @ w) with a row of N <= BN: the row reductions run on the accumulator tile (N=20
    pads the row to 32: padding must not enter the max or the sum)."""
    fn = lambda x, w: torch.softmax(x @ w, -1)  # noqa: E731
    args = torch.randn(20, 40), torch.randn(40, n) * 3
    cm = check_planned(fn, *args, tol=dict(rtol=1e-5, atol=1e-6))
    (k,) = gemm_kernels(cm)
    assert {"MatMul", "Softmax"} <= {o.split(":")[0] for o in k.ops}
    _, body = forced(fn, tile(16, 32, 16), *args, tol=dict(rtol=1e-5, atol=1e-6))
    assert len(body.instances) == 2 and body.shape.row_reduction


@pytest.mark.parametrize("n,bn", [(32, 32), (40, 64)])
def test_layernorm_after_matmul_bias_residual(n, bn):
    """LayerNorm(x @ W + b + residual) over N: through the planner (whichever kernels it picks,
    the result matches), and as one forced gemm kernel holding whole rows (BN >= N)."""
    ln = torch.nn.LayerNorm(n).eval()
    lin = torch.nn.Linear(24, n).eval()
    with torch.no_grad():
        ln.weight.uniform_(0.5, 1.5)
        ln.bias.uniform_(-1, 1)
    fn = lambda x, res: ln(lin(x) + res)  # noqa: E731
    args = torch.randn(20, 24), torch.randn(20, n)
    cm = compile_h100(fn, *args)
    assert any(k.family == "gemm" for k in cm.kernels)
    torch.testing.assert_close(run_cpu(cm, *args)[0], eager(fn, *args)[0], rtol=1e-5, atol=1e-5)
    _, body = forced(fn, tile(16, bn, 16), *args, tol=dict(rtol=1e-5, atol=1e-5))
    assert body.instances and body.shape.n == n


def test_rows_whole_or_two_phase_whenever_the_epilogue_reduces():
    """A tile splits N, when the epilogue reduces over it, only in two phases (``fixup``);
    tiles holding whole rows (BN >= N) are offered too."""
    for n in (16, 20, 40, 100):
        tiles = ranked_tiles(GemmShape(1, 64, n, 64, DType.float16, True), H100)
        assert tiles and all(t.bn >= n or t.fixup for t in tiles)
        assert any(t.bn >= n and not t.fixup for t in tiles)
    tiles = ranked_tiles(GemmShape(1, 64, 100, 64, DType.float16, False), H100)
    assert any(t.bn < 100 for t in tiles)
    assert all(min(t.bm, t.bn, t.bk) >= 16 for t in tiles)


# ---------------------------------------------------------------- prologues


@pytest.mark.parametrize("fn,op", [
    (lambda x, w, v: torch.relu(x) @ w, "Relu"),
    (lambda x, w, v: (x + v) @ w, "Add"),
    (lambda x, w, v: torch.exp(x) @ w, "Exp"),
], ids=["relu", "add-vector", "exp"])
def test_elementwise_prologue_is_inlined_into_the_operand(fn, op):
    """An elementwise op feeding an operand becomes part of its load: one gemm kernel."""
    args = torch.randn(8, 16), torch.randn(16, 12), torch.randn(16)
    cm = check_planned(fn, *args)
    (k,) = gemm_kernels(cm)
    assert op == k.ops[0].split(":")[0]
    forced(fn, tile(16, 16, 16), *args)


@pytest.mark.parametrize("fn", [lambda x, w, v: (x * 2) @ w, lambda x, w, v: (x * v) @ w,
                                lambda x, w, v: x @ (w * 2)], ids=["x*2", "x*v", "w*2"])
def test_scaled_operand_prologue(fn):
    """An elementwise scale of an operand (the module doc's "elementwise scales") is a prologue."""
    args = torch.randn(8, 16), torch.randn(16, 12), torch.randn(16)
    forced(fn, tile(16, 16, 16), *args)


def test_embedding_gather_prologue():
    """Embedding lookup -> Linear: the Gather is the A operand's load, inside the gemm kernel."""
    emb, lin = torch.nn.Embedding(50, 32).eval(), torch.nn.Linear(32, 24).eval()
    fn = lambda ids: lin(emb(ids))  # noqa: E731
    ids = torch.randint(0, 50, (2, 7))
    cm = check_planned(fn, ids, tol=dict(rtol=1e-5, atol=1e-6))
    (k,) = gemm_kernels(cm)
    assert k.ops[0].startswith("Gather:") and any(o.startswith("MatMul:") for o in k.ops)
    forced(fn, tile(16, 16, 16), ids)


# ---------------------------------------------------------------- convolutions


class ConvBlock(torch.nn.Module):
    def __init__(self, cin, cout, **kw):
        super().__init__()
        self.conv = torch.nn.Conv2d(cin, cout, 3, **kw)
        self.bn = batchnorm(cout)

    def forward(self, x, res):
        return torch.relu(self.bn(self.conv(x))) + res


def conv_args(model, xshape):
    x = torch.randn(*xshape)
    with torch.no_grad():
        return x, torch.randn(*model.conv(x).shape)


@pytest.mark.parametrize("kw,xshape,cout", [
    (dict(stride=2, padding=1), (2, 4, 9, 9), 20),
    (dict(padding=2, dilation=2), (1, 4, 8, 8), 20),
    (dict(padding=1, groups=2), (1, 4, 8, 8), 8),
], ids=["stride2-pad1", "dilation2", "groups2"])
def test_conv_bn_relu_residual_is_an_implicit_gemm(kw, xshape, cout):
    """Conv2d -> BatchNorm (eval, non-trivial running stats) -> ReLU -> + residual: one gemm
    kernel (padding in the operand's load, BN folded into the epilogue), also with small forced
    tiles (several M and N tiles, K = C*3*3 looped)."""
    model = ConvBlock(4, cout, **kw).eval()
    args = conv_args(model, xshape)
    cm = check_planned(model, *args)
    (k,) = gemm_kernels(cm)
    assert {"Conv", "BatchNormalization", "Relu", "Add"} <= {o.split(":")[0] for o in k.ops}
    forced(model, tile(16, 16, 16), *args)


def test_conv1d_relu():
    """Conv1d + ReLU: one gemm kernel (M = N*L, N = F, K = C*KW)."""
    conv = torch.nn.Conv1d(4, 8, 3, padding=1).eval()
    fn = lambda x: torch.relu(conv(x))  # noqa: E731
    x = torch.randn(2, 4, 10)
    check_planned(fn, x)
    _, body = forced(fn, tile(16, 16, 16), x)
    assert (body.shape.m, body.shape.n, body.shape.k) == (20, 8, 12)


def test_depthwise_conv_is_offered_to_both_the_fused_and_the_gemm_family():
    """Depthwise conv (groups == channels) has no N axes: a batch of one GEMV per channel
    (N = 1, K = 3*3) to the gemm family, a row reduction to the fused family; both kernels are
    right and the cost model picks."""
    model = ConvBlock(4, 4, padding=1, groups=4).eval()
    args = conv_args(model, (1, 4, 8, 8))
    cm = compile_h100(model, *args)
    assert len(cm.kernels) == 1 and cm.kernels[0].family in ("gemm", "fused")
    torch.testing.assert_close(run_cpu(cm, *args)[0], eager(model, *args)[0], **F32_TOL)
    group = whole(cm.primgraph)
    (sched, *_) = FusedFamily().schedules(group, H100)
    built = FusedFamily().build(sched, "fused_depthwise")
    pg = cm.primgraph
    feeds = feeds_of(cm, args)
    env = {c.name: c.data for c in pg.constants} | feeds
    outs = [torch.full(pg.types[o].shape, float("nan")) for o in built.outputs]
    assert not built.scratch
    built.run([env[n] for n in built.inputs], outs)
    torch.testing.assert_close(outs[0], run_reference(pg, feeds)[0], **F32_TOL)
    _, body = forced(model, tile(16, 16, 16), *args)
    assert (body.shape.batch, body.shape.m, body.shape.n, body.shape.k) == (4, 64, 1, 9)


# ---------------------------------------------------------------- rejection


def test_an_epilogue_reading_a_prologue_value_recomputes_it():
    """relu(x) feeds the matmul and is added to its result: the epilogue reads the prologue's
    value (recomputed from x there), one kernel."""
    def fn(x, w):
        y = torch.relu(x)
        return y @ w + y
    _, body = forced(fn, tile(16, 16, 16), torch.randn(8, 16), torch.randn(16, 16))
    assert len(body.group.prims) == 3       # relu, matmul, add


def test_two_contractions_have_no_gemm_schedule():
    """A group holding two matmuls is not a gemm kernel (the family offers no schedule)."""
    cm = compile_h100(lambda x, w1, w2: torch.relu(x @ w1) @ w2, torch.randn(8, 16), torch.randn(16, 16),
                      torch.randn(16, 16))
    assert GemmFamily().schedules(whole(cm.primgraph), H100) == []


def test_gemm_body_of_two_contractions_is_none():
    """gemm_body itself answers None (its documented 'or None') for two contractions."""
    cm = compile_h100(lambda x, w1, w2: torch.relu(x @ w1) @ w2, torch.randn(8, 16), torch.randn(16, 16),
                      torch.randn(16, 16))
    assert gemm_body(whole(cm.primgraph)) is None


def test_prologue_value_written_out_is_rejected():
    """A prologue value that is also a group output cannot be inlined into the operand loads."""
    def f(x, w):
        y = torch.relu(x.t())
        return y, y @ w
    cm = compile_h100(f, torch.randn(16, 8), torch.randn(16, 12))
    pg = cm.primgraph
    assert gemm_body(whole(pg)) is None
    assert gemm_body(whole(pg, outputs=[pg.outputs[1]])) is not None     # without it: a prologue
    args = torch.randn(16, 8), torch.randn(16, 12)
    for g, w in zip(run_cpu(cm, *args), eager(f, *args)):
        torch.testing.assert_close(g, w)


def test_epilogue_member_not_reading_the_contraction_is_rejected():
    """A member that neither feeds nor reads the contraction and is written out, or reduces, does
    not belong in its kernel."""
    cm = compile_h100(lambda x, w, v: (x @ w, v * 3.0), torch.randn(8, 16), torch.randn(16, 12), torch.randn(5))
    assert gemm_body(whole(cm.primgraph)) is None
    cm = compile_h100(lambda x, w, v: x @ w + v.sum(0), torch.randn(8, 16), torch.randn(16, 12), torch.randn(5, 12))
    assert gemm_body(whole(cm.primgraph)) is None


def test_side_member_read_by_the_epilogue_is_recomputed_there():
    """sigmoid(v) neither feeds nor reads x @ w; the epilogue adding it recomputes it (one kernel)."""
    fn = lambda x, w, v: x @ w + torch.sigmoid(v)  # noqa: E731
    _, body = forced(fn, tile(16, 16, 16), torch.randn(20, 16), torch.randn(16, 24), torch.randn(20, 24))
    assert len(body.group.prims) == 3


def test_float64_contraction_stays_with_the_library():
    """tl.dot has no float64: such a contraction is not a gemm kernel."""
    x, w = torch.randn(8, 16, dtype=torch.float64), torch.randn(16, 12, dtype=torch.float64)
    cm = compile_h100(lambda x, w: torch.relu(x @ w), x, w)
    assert gemm_body(whole(cm.primgraph)) is None
    assert "gemm" not in [k.family for k in cm.kernels]
    torch.testing.assert_close(run_cpu(cm, x, w)[0], torch.relu(x @ w))


# ---------------------------------------------------------------- split-K, small M, guards


@pytest.mark.parametrize("dtype,split", [(torch.float32, 4), (torch.float16, 3)], ids=["fp32-4", "fp16-3"])
def test_split_k_partials_then_reduction_and_epilogue(dtype, split):
    """Split-K: a partials kernel over K ranges (the last one ragged) writes fp32 partial sums, a
    second kernel adds them and runs the epilogue (bias + ReLU)."""
    model = torch.nn.Sequential(torch.nn.Linear(700, 24), torch.nn.ReLU()).eval().to(dtype)
    x = torch.randn(20, 700).to(dtype)
    tol = F32_TOL if dtype is torch.float32 else dict(rtol=1e-2, atol=1e-2)
    built, body = forced(model, GemmTile(16, 16, 32, 4, 2, 1, True, split), x, tol=tol)
    assert "_partials(" in built.source and built.source.count("tl.dot(") == 1
    assert -(-700 // GemmTile(16, 16, 32, 4, 2, 1, True, split).k_range(700)) == split


@pytest.mark.parametrize("dtype,split,bk", [(torch.float32, 4, 32), (torch.float16, 3, 32), (torch.float16, 2, 64)],
                         ids=["fp32-4-ragged", "fp16-3-ragged", "fp16-2-exact"])
def test_split_k_in_one_launch(dtype, split, bk):
    """Split-K in one launch: each program stores its partial product and arrives at its output
    tile's counter; the last split to arrive sums the partials and runs the epilogue (bias +
    ReLU).  Launched twice on one scratch, on new inputs: the counters are back at zero after each
    launch, and the second result is right too."""
    k = 700 if bk == 32 else 768
    model = torch.nn.Sequential(torch.nn.Linear(k, 24), torch.nn.ReLU()).eval().to(dtype)
    tol = F32_TOL if dtype is torch.float32 else dict(rtol=1e-2, atol=1e-2)
    t = GemmTile(16, 16, bk, 4, 2, 1, True, split, in_launch=True)
    built, body = forced(model, t, torch.randn(20, k).to(dtype), tol=tol)
    assert len(built.kernels) == 1 and "_partials(" not in built.source and "tl.atomic_add(" in built.source
    assert (f"< {k}" in built.source) == (bk == 32)        # only a ragged last range is masked
    assert "tl.where(" not in built.source                  # (in the load's mask: zero-filled)
    assert [s.zeroed for s in built.scratch] == [False, True]      # the partials, the counters
    cm = compile_h100(model, torch.randn(20, k).to(dtype))
    env = {c.name: c.data for c in cm.primgraph.constants}
    scratch = allocate(built.scratch, torch.device("cpu"))
    for _ in range(2):
        x = torch.randn(20, k).to(dtype)
        env |= feeds_of(cm, (x,))
        out = torch.full((20, 24), float("nan"), dtype=dtype)
        built.run([env[n] for n in built.inputs], [out] + scratch)
        torch.testing.assert_close(out.float(), eager(model, x)[0].float(), **tol)
        assert int(scratch[-1].abs().sum()) == 0


def test_split_k_in_one_launch_of_a_batched_convolution():
    """The counters are per (batch, row tile, column tile); a convolution's K unravelled."""
    model = torch.nn.Sequential(torch.nn.Conv2d(32, 16, 3, padding=1), torch.nn.ReLU()).eval()
    forced(model, GemmTile(16, 16, 32, 4, 2, 1, True, 2, in_launch=True), torch.randn(2, 32, 5, 5))
    bmm = lambda a, b: torch.relu(a @ b)  # noqa: E731
    built, _ = forced(bmm, GemmTile(16, 16, 32, 4, 2, 1, True, 3, in_launch=True),
                      torch.randn(3, 20, 300), torch.randn(3, 300, 24))
    assert "BLOCK_B" in built.source


@pytest.mark.parametrize("stride,bk", [(1, 32), (2, 64)])
def test_a_padded_window_is_one_masked_load(stride, bk):
    """A convolution's zero padding (``where(in_bounds, x[...], 0)``) reaches the dot as one load
    masked by the window's test and the ragged K chunk's, filled with zeros: no select between
    the load (an asynchronous copy on a GPU) and the tensor cores; values against eager."""
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1, stride=stride), torch.nn.ReLU()).eval()
    built, body = forced(model, GemmTile(16, 16, bk, 4, 2), torch.randn(2, 16, 7, 7))
    assert "tl.where" not in built.source
    assert len([ln for ln in built.source.splitlines() if "tl.load(in0" in ln and "mask=" in ln]) == 1


def test_split_k_of_a_convolution_unravels_its_k_positions():
    """K of a convolution is (channel, kh, kw): each split's positions are unravelled back."""
    model = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU()).eval()
    forced(model, GemmTile(16, 16, 16, 4, 2, 1, True, 2), torch.randn(1, 8, 6, 6))


def test_split_k_is_offered_only_to_grids_that_leave_sms_idle():
    few = ranked_tiles(GemmShape(1, 64, 64, 8192, DType.float16), H100)
    assert any(t.split > 1 for t in few)
    many = ranked_tiles(GemmShape(1, 4096, 4096, 4096, DType.float16), H100)
    assert not any(t.split > 1 for t in many)           # every tiling already fills the SMs
    rows = ranked_tiles(GemmShape(1, 64, 64, 8192, DType.float16, row_reduction=True), H100)
    assert any(t.split > 1 for t in rows)               # the reduction kernel holds whole rows
    wide = ranked_tiles(GemmShape(1, 64, 4096, 8192, DType.float16, row_reduction=True), H100)
    assert wide and not any(t.split > 1 for t in wide)  # rows past MAX_ROW: two phases instead


@pytest.mark.parametrize("dtype,split,bn", [(torch.float32, 4, 64), (torch.float16, 3, 32)], ids=["fp32-4", "fp16-3"])
def test_split_k_with_an_epilogue_that_reduces_rows(dtype, split, bn):
    """Split-K under a LayerNorm (row reductions over N) and a residual add: the partials
    kernel's tiles need not hold rows (BN < N); the reduction kernel sums the splits of whole
    rows, then normalizes them."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.ln = torch.nn.Linear(600, 48), torch.nn.LayerNorm(48)

        def forward(self, x, r):
            return self.ln(self.fc(x) + r)
    model = M().eval().to(dtype)
    args = (torch.randn(20, 600).to(dtype), torch.randn(20, 48).to(dtype))
    tol = F32_TOL if dtype is torch.float32 else dict(rtol=2e-2, atol=2e-2)
    built, body = forced(model, GemmTile(16, bn, 32, 4, 2, 1, True, split), *args, tol=tol)
    assert len(body.instances) >= 2 and built.source.count("tl.dot(") == 1
    reduce_src = built.source.split("_partials(")[-1]
    assert "BLOCK_N: tl.constexpr" in built.source and "RBLOCK" in reduce_src


@pytest.mark.parametrize("case", ["linear", "bmm", "fp16-ragged", "batch-of-one"])
def test_operands_through_tensor_descriptors(case):
    """On sm_90 plans (``GemmTile.tma``) a Dot operand that is a whole input tile is read through
    a tensor descriptor (TMA): the weight of a Linear as [N, K] blocks transposed, a batched
    operand at its batch position (its [K, N] blocks as they are), ragged M, N and K past the tensor reading zeros,
    a [1, S, K] activation whose batch of one is merged into the rows (BERT's and LLaMA's
    projections read theirs through pointers before: 32 more cp.async addresses a thread); the same
    values as eager (run here by the interpreter's descriptors)."""
    torch.manual_seed(0)
    if case == "linear":
        fn, args, tol = torch.nn.Sequential(torch.nn.Linear(40, 24), torch.nn.ReLU()).eval(), (torch.randn(20, 40),), F32_TOL
    elif case == "batch-of-one":
        fn, args, tol = torch.nn.Linear(40, 24).eval(), (torch.randn(1, 20, 40),), F32_TOL
    elif case == "bmm":
        fn, args, tol = (lambda a, b: torch.bmm(a, b)), (torch.randn(3, 20, 40), torch.randn(3, 40, 24)), F32_TOL
    else:
        fn = torch.nn.Linear(72, 40).eval().half()
        args, tol = (torch.randn(33, 72).half(),), dict(rtol=1e-2, atol=1e-2)
    built, body = forced(fn, GemmTile(16, 16, 32, 4, 2, 1, True, tma=True), *args, tol=tol)
    assert built.source.count("tl.make_tensor_descriptor(") == 2
    # a Linear's weight is [N, K] in memory (over a 3-d input the export folds its transpose)
    assert ("tl.trans(" in built.source) == (case in ("linear", "fp16-ragged"))
    if case == "batch-of-one":
        assert ".load([0, pid_m * BLOCK_M, " in built.source     # the batch's position 0, the rows' tile


@pytest.mark.parametrize("in_launch,k,bk", [(False, 768, 64), (True, 768, 64), (True, 700, 32), (False, 600, 64)],
                         ids=["partials-exact", "in-launch-exact", "in-launch-ragged", "partials-ragged-chunk"])
def test_split_k_operands_through_descriptors_at_the_chunk_shift(in_launch, k, bk):
    """Under split-K each program reads its chunk of K at a shift (``ss * chunk + k``): on sm_90
    both operands still go through tensor descriptors, the box at the chunk's start (BERT's split
    GEMM + LayerNorm read them through pointers before: 95 registers against 58 in its sm_90
    binary).  Where the last chunk runs past K (ragged: the operands' index is guarded) they keep
    pointers and masks; values against eager either way."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(k, 24), torch.nn.ReLU()).eval()
    t = GemmTile(16, 16, bk, 4, 2, 1, True, 2, tma=True, in_launch=in_launch)
    built, _ = forced(model, t, torch.randn(20, k))
    chunk = t.k_range(k)
    shifted = k % chunk == 0 and chunk % bk == 0
    assert built.source.count("tl.make_tensor_descriptor(") == (2 if shifted else 0)
    if shifted:
        assert f"ss * {chunk}" in built.source and ".load([pid_n * BLOCK_N, k_start + " in built.source
    assert "tl.dot(" in built.source


def test_a_computed_operand_is_read_through_pointers_under_tma():
    """A prologue (GELU on the activation) is computed per value: that operand keeps pointer
    loads, the weight alone goes through a descriptor."""
    model = torch.nn.Sequential(torch.nn.GELU(), torch.nn.Linear(40, 24)).eval()
    built, _ = forced(model, GemmTile(16, 16, 16, 4, 2, 1, True, tma=True), torch.randn(20, 40))
    assert built.source.count("tl.make_tensor_descriptor(") == 1


def test_a_warp_specialized_tile_splits_its_k_loop_and_matches_eager():
    """``GemmTile.ws``: the K loop asks Triton's Hopper pass for a producer warp group
    (``tl.range(..., warp_specialize=True)``), both operands through tensor descriptors; ragged M,
    N and K (130 x 72 x 200, fp16, bias + GELU) against eager, run by the interpreter.  The tile
    is never in the planner's space (nothing measured says what it buys)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(200, 72), torch.nn.GELU()).eval().half()
    t = GemmTile(128, 64, 64, 4, 3, 1, True, tma=True, ws=True)
    built, body = forced(model, t, torch.randn(130, 200).half(), tol=HALF_TOL[torch.float16])
    assert "tl.range(0, 200, BLOCK_K, warp_specialize=True)" in built.source
    assert built.source.count("tl.make_tensor_descriptor(") == 2
    (k,) = built.kernels
    assert (k.num_warps, k.compute_warps, k.launched_warps) == (4, 8, 12)
    # a persistent kernel's phase is a function its loop calls: no producer group enters it
    from tilefuse.codegen.triton.emit import triton_source
    from tilefuse.codegen.triton.persistent import phase_kernels
    (phase,) = phase_kernels([k], [built.inputs], [built.outputs])
    assert not phase.specialized and "warp_specialize" not in triton_source(phase)
    shape = GemmShape(1, 2048, 2048, 2048, DType.float16)
    assert not any(x.ws for x in tile_space(shape, H100))
    # batched: each [batch, rows, columns] operand through a 2-D descriptor over its flattened rows
    # (Triton's pass fails on a reshaped 3-D box), where no tile crosses a batch position's rows
    bmm = lambda a, b: torch.bmm(a, b)      # noqa: E731
    t = GemmTile(128, 32, 32, 4, 2, 1, True, tma=True, ws=True)
    built, _ = forced(bmm, t, torch.randn(3, 128, 64).half(), torch.randn(3, 64, 48).half(), tol=HALF_TOL[torch.float16])
    assert "[384, 64], [64, 1], [BLOCK_M, BLOCK_K])" in built.source and "[192, 48], [48, 1]," in built.source
    assert "desc0_0.load([bs * 128 + pid_m * BLOCK_M, k_start])" in built.source
    with pytest.raises(ValueError, match="the one over \\('m', 'ka'\\) is not a whole input tile"):
        forced(bmm, t, torch.randn(3, 100, 64).half(), torch.randn(3, 64, 48).half(), tol=HALF_TOL[torch.float16])


def test_a_warp_specialized_tile_refuses_what_the_pass_cannot_split():
    """A computed operand (a prologue's arithmetic) cannot be the producer's copy, 8 warps are
    left unspecialized by Triton and BLOCK_M 64 fails in its pass, split-K is more than one
    loop: each a clear error naming the kernel, not a compiler crash or a silent plain loop."""
    gelu_first = torch.nn.Sequential(torch.nn.GELU(), torch.nn.Linear(256, 64)).eval().half()
    x = torch.randn(128, 256).half()
    with pytest.raises(ValueError, match="gemm\\w*: a warp-specialized loop reads its operands through"):
        forced(gelu_first, GemmTile(128, 64, 64, 4, 3, 1, True, tma=True, ws=True), x, tol=HALF_TOL[torch.float16])
    linear = torch.nn.Linear(256, 64).eval().half()
    for t in (GemmTile(128, 64, 64, 8, 3, 1, True, tma=True, ws=True), GemmTile(64, 64, 64, 4, 3, 1, True, tma=True, ws=True),
              GemmTile(128, 64, 64, 4, 3, 1, True, tma=False, ws=True)):
        with pytest.raises(ValueError, match="gemm\\w*: a warp-specialized K loop needs tensor cores"):
            forced(linear, t, x, tol=HALF_TOL[torch.float16])
    with pytest.raises(ValueError, match="gemm\\w*: a warp-specialized K loop is one kernel's whole K"):
        forced(linear, GemmTile(128, 64, 64, 4, 3, 1, True, 2, tma=True, ws=True), x, tol=HALF_TOL[torch.float16])


@pytest.mark.parametrize("m,stages", [(1, 3), (3, 1)])
def test_small_m_path_reduces_products_without_tensor_cores(m, stages):
    """The GEMV / decode path: all M rows in one program (BM = 1 or 4, not 16), the products
    reduced over K in fp32, bias + GELU in the epilogue; no tl.dot.  Its K loop asks Triton to
    pipeline it at the tile's stages (a loop of no ``tl.dot`` is pipelined only so)."""
    model = torch.nn.Sequential(torch.nn.Linear(300, 70), torch.nn.GELU()).eval()
    bm = 1 if m == 1 else 4
    built, body = forced(model, GemmTile(bm, 16, 64, 2, stages, 1, dot=False), torch.randn(m, 300))
    assert "tl.dot(" not in built.source and "tl.sum(" in built.source
    assert body.shape.m == m
    head = "tl.range(0, 300, BLOCK_K, num_stages=3)" if stages > 1 else "range(0, 300, BLOCK_K)"
    assert f"in {head}:" in built.source


def test_small_m_path_is_chosen_for_a_decode_gemv():
    """A 1 x 4096 x 4096 fp16 GEMV plans on the small-M path (no row padded to 16)."""
    tiles = ranked_tiles(GemmShape(1, 1, 4096, 4096, DType.float16), H100)
    assert not tiles[0].dot and tiles[0].bm == 1


@pytest.mark.parametrize("m", [1, 128])
def test_tiles_that_tie_rank_a_gemvs_over_more_sms_and_a_gemms_larger(m):
    """Among the tiles modelled equal to the first (both streaming the weights at the DRAM rate),
    a GEMV's first is the one over the most programs up to the SMs (each weight read once
    whatever the tile: over more SMs it leans less on each SM's rate); with 128 rows, whose
    activation each column tile re-reads, the largest tile."""
    from tilefuse.families.gemm import plain_body, plain_seconds
    s = GemmShape(1, m, 11264, 2048, DType.float16)
    tiles = ranked_tiles(s, H100)
    body, forms = plain_body(s), {}

    def sec(t):
        return plain_seconds(body, t, H100, forms)[0]

    def programs(t):
        return -(-s.m // t.bm) * -(-s.n // t.bn)
    first = sec(tiles[0])
    tied = [t for t in tiles[:200] if sec(t) == first and (t.bm * -(-s.m // t.bm) == tiles[0].bm * -(-s.m // tiles[0].bm))]
    assert len(tied) > 1, "the premise: tiles the model cannot tell apart"
    if m == 1:
        assert min(programs(tiles[0]), H100.sm_count) == max(min(programs(t), H100.sm_count) for t in tied)
        assert programs(tiles[0]) >= H100.sm_count // 2
    else:
        assert tiles[0].bm * tiles[0].bn == max(t.bm * t.bn for t in tied)


def test_a_row_reduction_tile_must_hold_the_row():
    """Forcing BLOCK_N < N on an epilogue that reduces rows is an error, not a wrong answer."""
    fn = lambda x, w: torch.softmax(x @ w, -1)  # noqa: E731
    cm = compile_h100(fn, torch.randn(8, 16), torch.randn(16, 32))
    body = gemm_body(whole(cm.primgraph))
    assert body is not None and body.instances
    with pytest.raises(ValueError, match="does not hold"):
        GemmFamily().build(_schedule(body, tile(16, 16, 16), H100), "gemm_rows")


def test_kernel_program_id_dimensions_must_be_contiguous():
    from tilefuse.codegen.kernel import Kernel, TileAxis
    from tilefuse.ir.expr import Var
    axis = TileAxis("b", (Var("a0"),), (4,), 1, -1, grid=1, block_name="BLOCK_B")
    with pytest.raises(ValueError, match="program-id dimensions"):
        Kernel("k", (), (), (axis,), (), 4, 1)


@pytest.mark.parametrize("name", ["bert", "resnet"])
def test_zoo_h100_plans_run_through_gemm_kernels_on_cpu(name):
    """The h100 plans of the tiny zoo models (GEMMs and convolutions with fused prologues and
    epilogues) run under the interpreter and match eager."""
    from torch.utils import _pytree as pytree

    from tilefuse import zoo
    model, sets = zoo.build(name, "tiny")
    cm = tilefuse.compile(model, sets[0], target="h100", backend="triton")
    assert sum(k.family == "gemm" for k in cm.kernels) >= 4        # with fused prologues/epilogues
    got = run_cpu(cm, *sets[0])
    with torch.no_grad():
        want = [t for t in pytree.tree_leaves(model(*sets[0])) if isinstance(t, torch.Tensor)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)



@pytest.mark.parametrize("bn,pieces,tma", [(32, True, False), (64, False, False), (32, True, True),
                                           (64, False, True)])
def test_concatenated_weight_read_one_piece_per_tile(bn, pieces, tma):
    """A weight concatenated along N (a merged Q/K/V projection's, read in place) is a select
    among its pieces.  Where BLOCK_N divides the pieces' boundaries (64, 96) each column tile
    reads one piece, through one pointer chosen per tile: a plain load (vectorized, cp.async),
    which the model charges as a direct operand, or on sm_90 (``tma``) through a descriptor
    made per program on the piece's base and rows, read at the tile's column less the piece's
    start (LLaMA's 128 x 128 QKV projection: 234 registers -> 154 in the sm_90 binary), which
    the model charges as the plain weight's descriptor; else one masked load per piece, a
    computed operand.  All match eager."""
    from tilefuse.cost.work import work
    fn = lambda x, a, b, c: x @ torch.cat([a, b, c]).T  # noqa: E731
    args = (torch.randn(40, 96).half(), torch.randn(64, 96).half(), torch.randn(32, 96).half(),
            torch.randn(32, 96).half())
    t = GemmTile(16, bn, 32, 4, 2, 1, tma=tma)
    built, body = forced(fn, t, *args, tol=HALF_TOL[torch.float16])
    src = built.source.split("@triton.jit")[-1]
    described = src.count("tl.make_tensor_descriptor(")
    assert described == ((1 + pieces) if tma else 0)
    assert (src.count("tl.load(") == 2 - described) == pieces and ("pid_n * BLOCK_N < 64" in src) == pieces
    if pieces and tma:      # the piece's rows and its start along the concatenation, chosen per tile
        assert "tl.where(" in src and "pid_n * BLOCK_N + " in src
    regs = work(built.kernels[0], H100).res.regs_per_thread
    plain = forced(lambda x, w: x @ w.T, t, args[0], torch.cat(args[1:]), tol=HALF_TOL[torch.float16])[0]  # noqa: E731
    assert (regs == work(plain.kernels[0], H100).res.regs_per_thread) == pieces


def test_depthwise_convolution_as_a_stencil():
    """A depthwise convolution is one column per channel (N = 1, the channels its batch): the
    stencil path tiles positions × channels and loops over the taps on CUDA cores (stride 2,
    padding, ragged positions and channels, the ReLU6 epilogue) and matches eager; the tile
    space offers it only for N = 1 with several batch positions."""
    model = torch.nn.Sequential(torch.nn.Conv2d(40, 40, 3, padding=1, stride=2, groups=40), torch.nn.ReLU6()).eval()
    built, body = forced(model, GemmTile(16, 1, 1, 4, 1, 1, dot=False, bb=16), torch.randn(1, 40, 13, 13))
    assert body.shape.n == 1 and body.shape.batch == 40 and "tl.dot(" not in built.source
    assert "for k_start in tl.static_range(0, 9, BLOCK_K)" in built.source    # the taps unrolled
    assert any(t.bb for t in tile_space(body.shape, H100))
    assert not any(t.bb for t in tile_space(GemmShape(4, 64, 2, 9, DType.float16), H100))


def test_a_one_tap_depthwise_stencil_reads_its_single_tap_as_a_scalar():
    """A 1 × 1 depthwise convolution (one channel per group, strided, dilated and padded): its
    single tap is one K position, no loop, and the tap index is the scalar 0 (it was printed as
    a rank-3 ``tl.arange`` in a rank-2 tile, which the interpreter refused; found by the long
    ONNX fuzzer).  Matches eager."""
    conv = torch.nn.Conv2d(16, 16, 1, stride=(2, 1), padding=(2, 1), dilation=(2, 1), groups=16, bias=False).eval()
    built, body = forced(conv, GemmTile(16, 1, 1, 4, 1, 1, dot=False, bb=16), torch.randn(2, 16, 5, 3))
    assert body.shape.k == 1 and "ks = 0" in built.source and "[None, None]" not in built.source


def test_the_stem_convolutions_64_row_wgmma_tiles_are_costed_on_its_own_kernels():
    """The ResNet stem (7 × 7, stride 2, over the NCHW image's 3 channels: an im2col gather per
    value): the plain GEMM's ranking of its shape has no 64-row wgmma tile among its first three,
    which the group's own kernels cost first; the shape's first such tiles (``_lowest``), costed
    on the group's kernels, come out faster, so the group's best schedule runs on wgmma.  The
    premise holds without the tensor-core latency floor (``Target.dot_program_s``: with it, fewer
    and larger tiles rank first and the shape's own ranking has 64-row tiles); the best is on
    wgmma either way."""
    from gemm_eval import H100_UNFLOORED
    from tilefuse.cost.dot import wgmma
    from tilefuse.families.gemm import TOP_K
    conv = torch.nn.Conv2d(3, 64, 7, 2, 3, bias=False).half()
    body = gemm_body(whole(compile_h100(lambda x: conv(x), torch.randn(1, 3, 224, 224).half()).primgraph))
    for target in (H100_UNFLOORED, H100):
        premise = not any(t.bm == 64 for t in ranked_tiles(body.shape, target)[:TOP_K])
        assert premise == (target is not H100)
        best = GemmFamily().schedules(body.group, target)[0]
        assert best.tile.bm == 64 and wgmma(best.tile.bm, best.tile.warps, target), best.tile


def test_channels_last_depthwise_block_plans_stencils():
    """MobileNet's block (1×1, depthwise 3×3, 1×1 in fp16, channels-last between them): the
    planner runs the depthwise convolution as a stencil, whose channel runs are contiguous, and
    the plan's kernels match eager."""
    torch.manual_seed(0)
    c = 32
    model = torch.nn.Sequential(torch.nn.Conv2d(16, c, 1), torch.nn.BatchNorm2d(c), torch.nn.ReLU6(),
                                torch.nn.Conv2d(c, c, 3, padding=1, groups=c), torch.nn.BatchNorm2d(c),
                                torch.nn.ReLU6(), torch.nn.Conv2d(c, 16, 1)).eval().half()
    x = torch.randn(1, 16, 32, 32).half()
    cm = compile_h100(model, x)
    stencils = [k for k in cm.plan.kernels if k.schedule.family == "gemm" and k.schedule.tile.bb]
    assert len(stencils) == 1
    # the weight re-laid out taps-outer: each tap's channels one contiguous run (no stride-9 gather)
    (built,) = [b for b, k in zip(cm.kernels, cm.plan.kernels) if k is stencils[0]]
    assert "_taps" in " ".join(built.inputs) and "bs * 9" not in built.source
    torch.testing.assert_close(run_cpu(cm, x)[0].float(), eager(model, x)[0].float(), **HALF_TOL[torch.float16])


def test_a_gemvs_weights_are_streamed_evict_first_and_a_gemms_are_not():
    """One row block (a decode step's projection): each weight byte is read by one program once,
    so its loads are evict-first (``Kernel.streamed``: they do not push out of L2 what others will
    read); with several row blocks the weights are re-read and keep the default policy.  Either
    way the kernel equals eager."""
    torch.manual_seed(0)
    lin = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU()).eval()
    for rows, streamed in ((1, True), (512, False)):
        x = torch.randn(rows, 64)
        c = tilefuse.compile(lin, (x,), target="h100", time_limit=1.0)
        (b,) = [b for b in c.kernels if b.family == "gemm"]
        assert ('eviction_policy="evict_first"' in b.source) == streamed, b.source
        assert bool(b.kernels[0].streamed) == streamed
        with torch.no_grad():
            torch.testing.assert_close(c.emulate(x), lin(x), rtol=1e-4, atol=1e-4)


def test_a_gemv_group_is_offered_a_whole_k_tensor_core_tile(monkeypatch):
    """BERT's pooler: the first token's row, a projection with its bias, a tanh (M = 1).  On the
    plain GEMV the small-M and split-K tiles rank first; with the slice, the bias and the tanh an
    unsplit 16-row tile can be the group's fastest, so the family offers the first one.  It is,
    without the tensor-core latency floor (``Target.dot_program_s``) and with the small-M K loop
    two stages deep (deeper, a GEMV is the fastest); with the floor, as MEASURED on an H200 (a
    BM-1 GEMV task 1.1 µs, the dot tasks beside it 3.1-6.0), the plain GEMV is fastest and
    planned."""
    from gemm_eval import H100_UNFLOORED as unfloored
    from gemm_eval import fresh_rankings
    from tilefuse.families import gemm
    from tilefuse.families.gemm import space
    monkeypatch.setattr(space, "SMALL_M_STAGES", 2)
    fresh_rankings(monkeypatch)
    torch.manual_seed(0)
    dense = torch.nn.Linear(768, 768).half().eval()
    fn = lambda x: torch.tanh(dense(x[:, 0]))                              # noqa: E731
    x = torch.randn(1, 8, 768, dtype=torch.float16)
    shape_first = gemm.ranked_tiles(GemmShape(1, 1, 768, 768, DType.float16), unfloored)[:gemm.TOP_K]
    assert not any(t.dot and t.split == 1 for t in shape_first)           # the premise
    cm = compile_h100(fn, x)
    scheds = GemmFamily().schedules(whole(cm.primgraph), unfloored)
    assert scheds[0].tile.dot and scheds[0].tile.split == 1, [s.tile.key() for s in scheds]
    scheds = GemmFamily().schedules(whole(cm.primgraph), H100)
    assert not scheds[0].tile.dot, scheds[0].tile
    (k,) = gemm_kernels(cm)
    assert k.est_us == pytest.approx(GemmFamily().cost(scheds[0], H100).seconds * 1e6, abs=1e-3)   # (rounded)
    torch.testing.assert_close(run_cpu(cm, x)[0].float(), eager(fn, x)[0].float(), **HALF_TOL[torch.float16])


def test_a_loop_triton_does_not_pipeline_loads_its_whole_k_at_once():
    """A stem convolution over the model's 3-channel NCHW input gathers its operand a value at a
    time (``cost/work._Walk.scalar``): Triton does not pipeline its loop, so each chunk waits for
    its loads, which the shape's plain ranking (pipelined) does not see. The family also costs the
    tiles that load the whole K (27) in one chunk, and one of them is the plan's: no chunk waits;
    its kernel (K padded to the block, masked) equals eager through the interpreter."""
    import torch.nn.functional as F
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 32, 3, stride=2, bias=False).half().eval()
    x = torch.randn(1, 3, 129, 129, dtype=torch.float16)
    fn = lambda t: conv(F.pad(t, (0, 1, 0, 1)))  # noqa: E731
    cm = check_planned(fn, x, tol=HALF_TOL[torch.float16])
    (s,) = [k.schedule for k in cm.plan.kernels]
    assert s.tile.bk >= 27 and s.tile.split == 1 and not s.work.serial_chunks, s.tile_key()
