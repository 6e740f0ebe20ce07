"""Constant folding of weight-only prims (transform/fold.py)."""
from __future__ import annotations

import torch

import tilefuse
from tilefuse.transform.fold import fold_constants


def _const_only(pg):
    consts = {c.name for c in pg.constants}
    return [p.name for p in pg.prims if p.inputs and all(n in consts for n in p.inputs)]


class ConvBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_batchnorm_scale_and_shift_are_folded_and_the_result_is_exact():
    model, x = ConvBN().eval(), torch.randn(1, 3, 6, 6)
    c = tilefuse.compile(model, (x,), target="h100", backend="reference")
    assert _const_only(c.primgraph) == []          # nothing left that reads weights alone
    # the conv and its BatchNorm + ReLU epilogue: one kernel
    assert [k.family for k in c.report.kernels] == ["gemm"]
    with torch.no_grad():
        torch.testing.assert_close(tilefuse.compile(model, (x,))(x), model(x), rtol=1e-5, atol=1e-5)


def _graph_of_constants(op, a, b, out_shape):
    """``op(a, b)`` with a and b constants, read by ``2 * op(a, b)``, the graph output."""
    from fused_eval import op_graph

    from tilefuse.fission.registry import Fission
    from tilefuse.ir.prim import Constant, PrimGraph
    pg, _ = op_graph(op, [a, b], out_shape, {})
    (p,) = pg.prims
    fx = Fission({p.name, "x0", "x1"})
    t = fx.ref(p.name, p.out)
    y = fx.compute(out_shape, lambda i: t[i] * 2.0)
    return PrimGraph((), (Constant("x0", a), Constant("x1", b)), pg.prims + tuple(fx.prims), (y.name,)), p.name


def test_a_weight_only_prim_becomes_a_constant_with_its_value():
    a, b = torch.randn(4), torch.randn(4)
    pg, name = _graph_of_constants("Mul", a, b, (4,))
    folded = fold_constants(pg)
    assert name not in {p.name for p in folded.prims} and len(folded.prims) == 1
    consts = {c.name: c.data for c in folded.constants}
    assert set(consts) == {name}                      # the inputs it consumed are dropped
    torch.testing.assert_close(consts[name], a * b, rtol=0, atol=0)


def test_a_broadcast_larger_than_its_inputs_is_not_materialized():
    pg, name = _graph_of_constants("Add", torch.randn(1, 4), torch.randn(64, 1), (64, 4))
    assert fold_constants(pg) is pg


def test_a_graph_output_is_not_folded():
    from fused_eval import op_graph

    from tilefuse.ir.prim import Constant, PrimGraph
    pg, _ = op_graph("Mul", [torch.randn(4), torch.randn(4)], (4,), {})
    consts = PrimGraph((), (Constant("x0", torch.randn(4)), Constant("x1", torch.randn(4))), pg.prims, pg.outputs)
    assert fold_constants(consts) is consts


def test_a_weight_read_through_its_transpose_is_not_copied():
    # issue #21: a Linear's weight reaches the graph as t(weight); folding the transpose made a
    # transposed copy of every weight (TinyLlama: 1.9 GB more while compiling, and held by the
    # compiled model).  The transpose stays a layout prim the planner composes into the GEMM's
    # loads; the compiled model's constants are the module's own parameters
    import torch

    import tilefuse
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(300, 400), torch.nn.GELU(), torch.nn.Linear(400, 300)).eval()
    x = torch.randn(2, 8, 300)             # batched: linear decomposes to t(weight) and a matmul
    cm = tilefuse.compile(m, (x,), backend="reference", time_limit=2.0)
    params = {p.untyped_storage().data_ptr() for p in m.parameters()}
    big = [c for c in cm.primgraph.constants if c.data.numel() > 1 << 16]
    assert len(big) == 2 and all(c.data.untyped_storage().data_ptr() in params for c in big)
    torch.testing.assert_close(cm(x), m(x), rtol=1e-4, atol=1e-5)


class _QKV(torch.nn.Module):
    def __init__(self, d=320):
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(d, d, bias=False) for _ in range(3))

    def forward(self, x):
        return torch.tanh(self.q(x)) + self.k(x) * self.v(x)


def test_merged_projections_read_their_weights_in_place():
    # issue #21: the horizontal merge of Q/K/V (and LLaMA's gate/up) concatenated large weights
    # into a new constant, a second copy the compiled model held (TinyLlama: 1.2 GB); it reads the
    # siblings' weights in place through a select over the N ranges, as for weights that are inputs
    torch.manual_seed(0)
    m = _QKV().eval().half()
    x = torch.randn(2, 16, 320).half()
    cm = tilefuse.compile(m, (x,), target="h100", time_limit=5.0)
    assert any("+" in p.origin.name for p in cm.primgraph.prims), "the projections were not merged"
    params = {p.untyped_storage().data_ptr() for p in m.parameters()}
    big = [c for c in cm.primgraph.constants if c.data.numel() > 1 << 16]
    assert big and all(c.data.untyped_storage().data_ptr() in params for c in big)
    torch.testing.assert_close(cm.emulate(x), m(x), rtol=2e-2, atol=2e-2)
