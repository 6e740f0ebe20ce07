"""Souffle's semantic-preserving graph transformations: vertical (layout prims composed into their
readers, transform/vertical.py) and horizontal (contractions sharing an activation merged over
concatenated weights, transform/horizontal.py), checked on the notes' §7 cases and on real
blocks, each graph evaluated by the reference executor before and after."""
import pytest
import torch
import torch.nn.functional as F

import tilefuse
from tilefuse.analysis.classify import Category, classify
from tilefuse.api import choose_graph
from tilefuse.cost.target import Target
from tilefuse.fission import fission
from tilefuse.frontend.torch import import_torch
from tilefuse.ir.evaluate import run_reference
from tilefuse.ir.expr import Load
from tilefuse.transform.fold import fold_constants
from tilefuse.transform.horizontal import horizontal
from tilefuse.transform.simplify import simplify_graph
from tilefuse.transform.vertical import vertical

H100 = Target.get("h100")


def prims_of(fn, *args):
    """(PrimGraph as the pipeline has it before the transformations, feeds)."""
    imported = import_torch(fn, args)
    pg = fold_constants(simplify_graph(fission(imported.graph)))
    feeds = dict(zip([d.name for d in pg.inputs], imported.flatten_inputs(args, {})))
    return pg, feeds


def same_values(a, b, feeds):
    for x, y in zip(run_reference(a, feeds), run_reference(b, feeds)):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def ops(pg):
    return [p.origin.op for p in pg.prims]


# ---------------------------------------------------------------- vertical

def test_figure_4_composes_consumer_first():
    """B = relu(A) (4, 8); C[i, j] = B[2i, j] (2, 4); D[i, j] = C[j, i] (4, 2): the layouts
    collapse into one map, D[i, j] = B[2j, i] (the notes' correction of the paper's A[j, 2i])."""
    fn = lambda a: torch.relu(a)[0:4:2, 0:4].transpose(0, 1)  # noqa: E731
    pg, feeds = prims_of(fn, torch.randn(4, 8))
    v = simplify_graph(vertical(pg))
    assert len(v.prims) == 2 and classify(v.prims[0]) is Category.elementwise
    d = v.prims[1]
    assert d.inputs == (v.prims[0].name,)
    (ld,) = [n for n in [d.body] if isinstance(n, Load)]
    i, j = d.axes
    assert ld.index == (j * 2, i)
    same_values(pg, v, feeds)


def test_a_chain_of_layouts_collapses_into_its_reader():
    """reshape -> transpose -> slice -> exp: the three layouts vanish into exp's load."""
    fn = lambda x: torch.exp(x.reshape(4, 6, 5).transpose(0, 2)[1:4])  # noqa: E731
    pg, feeds = prims_of(fn, torch.randn(120))
    v = simplify_graph(vertical(pg))
    assert ops(v) == ["Exp"] and len(pg.prims) >= 3
    same_values(pg, v, feeds)


def test_concat_composes_into_elementwise_readers():
    fn = lambda a, b: torch.cat([a, b], 1) * 2.0  # noqa: E731
    pg, feeds = prims_of(fn, torch.randn(3, 4), torch.randn(3, 5))
    v = vertical(pg)
    assert len(v.prims) == 1 and {d.name for d in pg.inputs} <= set(v.prims[0].inputs)
    same_values(pg, v, feeds)


def test_a_contraction_keeps_reading_a_select():
    """Padding (a select) composed into a convolution would make it no contraction: the pad prim
    stays; a transpose composes into a matmul's operand and the matmul stays a contraction."""
    conv = torch.nn.Conv2d(2, 3, 3, padding=1).eval()
    pg, feeds = prims_of(lambda x: conv(x), torch.randn(1, 2, 5, 5))
    v = vertical(pg)
    assert any(classify(p) is Category.layout for p in v.prims)
    assert sum(classify(p) is Category.contraction for p in v.prims) == 1
    same_values(pg, v, feeds)
    pg, feeds = prims_of(lambda x, w: x.transpose(0, 1) @ w, torch.randn(6, 4), torch.randn(6, 5))
    v = vertical(pg)
    assert [classify(p) for p in v.prims] == [Category.contraction]
    same_values(pg, v, feeds)


def test_graph_outputs_and_opaque_readers_keep_their_layouts():
    """A layout that is a graph output stays (its readers still read through it, composed); an
    opaque prim (TopK) reads tensors, so the layout feeding it stays."""
    fn = lambda x: (x.transpose(0, 1), x.transpose(0, 1) + 1.0)  # noqa: E731
    pg, feeds = prims_of(fn, torch.randn(3, 4))
    v = vertical(pg)
    assert "Transpose" in ops(v) and len(v.prims) == 2
    same_values(pg, v, feeds)
    pg, feeds = prims_of(lambda x: torch.topk(x.transpose(0, 1), 2).values, torch.randn(5, 4))
    v = vertical(pg)
    assert "Transpose" in ops(v)
    same_values(pg, v, feeds)


def test_vertical_leaves_a_graph_without_layouts_alone():
    pg, _ = prims_of(lambda x: torch.relu(x) + 1.0, torch.randn(4))
    assert vertical(pg) is pg


# ---------------------------------------------------------------- horizontal

class QKV(torch.nn.Module):
    def __init__(self, d=32, kv=None):
        super().__init__()
        kv = kv or d
        self.q, self.k, self.v = torch.nn.Linear(d, d), torch.nn.Linear(d, kv), torch.nn.Linear(d, kv)

    def forward(self, x):
        return self.q(x), self.k(x) * 2.0, torch.relu(self.v(x))


@pytest.mark.parametrize("kv", [32, 16], ids=["mha", "gqa"])
def test_projections_sharing_an_input_are_merged(kv):
    """Q, K, V projections (K and V narrower under grouped-query attention) become one contraction
    over the weights concatenated at compile time, each projection a slice of it; the old weights
    are dropped and the values are exactly the same."""
    model = QKV(kv=kv).eval()
    pg, feeds = prims_of(model, torch.randn(2, 5, 32))
    h = horizontal(pg)
    conts = [p for p in h.prims if classify(p) is Category.contraction]
    assert len(conts) == 1 and conts[0].out.shape == (2, 5, 32 + 2 * kv)
    cat = next(c for c in h.constants if c.name in conts[0].inputs)
    olds = [c for c in pg.constants if c.name not in {x.name for x in h.constants}]
    assert len(olds) == 3 and cat.data.shape[-1] == 32 + 2 * kv
    assert torch.equal(cat.data, torch.cat([c.data for c in olds], dim=-1))
    same_values(pg, h, feeds)
    v = simplify_graph(vertical(h))            # the slices vanish into their readers
    assert not any(p.origin.op == "MatMul" and classify(p) is Category.layout for p in v.prims)
    same_values(pg, v, feeds)


class QKVAndTable(QKV):
    """A model that also returns a constant (a positional table: SAM3's vision model does)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.randn(4, 3))

    def forward(self, x):
        return *super().forward(x), self.table.t()


def test_a_constant_output_survives_the_merge():
    # the merge kept only the constants prims read: a graph output that is a constant was dropped
    # ("graph output 'permute_12' is never produced", SAM3's vision model in the sweep)
    model, x = QKVAndTable().eval(), torch.randn(2, 5, 32)
    pg, feeds = prims_of(model, x)
    h = horizontal(pg)
    assert h is not pg and h.outputs[-1] in h.constant_map
    same_values(pg, h, feeds)
    with torch.no_grad():
        for got, want in zip(tilefuse.compile(model, (x,))(x), model(x)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_contractions_that_are_no_siblings_are_left_alone():
    """Different activations, or a different index map on the shared input: nothing to merge."""
    w1, w2 = torch.randn(8, 6), torch.randn(8, 6)
    for fn, args in [(lambda a, b: (a @ w1, b @ w2), (torch.randn(3, 8), torch.randn(3, 8))),
                     (lambda a: (a @ w1, a.flip(0) @ w2), (torch.randn(8, 8),))]:
        pg, _ = prims_of(fn, *args)
        assert horizontal(pg) is pg


def test_weights_that_are_inputs_are_concatenated_by_a_layout_prim():
    """Weights that are not constants (graph inputs here) are concatenated by a select over the N
    ranges, no copy at compile time; the merged contraction reads it, and planned for h100 the
    select is the gemm kernel's operand load: one launch over both problems."""
    fn = lambda a, u, v: (torch.relu(a @ u), a @ v)  # noqa: E731
    args = torch.randn(20, 8), torch.randn(8, 16), torch.randn(8, 32)
    pg, feeds = prims_of(fn, *args)
    h = horizontal(pg)
    cat = next(p for p in h.prims if p.origin.op == "Concat")
    assert cat.out.shape == (8, 48) and len(h.constants) == len(pg.constants)
    same_values(pg, h, feeds)
    cm = tilefuse.compile(fn, args, target="h100", backend="triton")
    if any(p.origin.op == "Concat" for p in cm.primgraph.prims):     # the planner kept the merge
        # (the ReLU of one column range may be a kernel of its own: an epilogue over a range is not
        # in the gemm family; with h100's measured tensor-core latency the merge wins even so)
        (gemm,) = [b for b in cm.kernels if b.family == "gemm"]
        assert {"args_1", "args_2"} <= set(gemm.inputs), gemm.inputs
    from gemm_eval import run_cpu
    for got, want in zip(run_cpu(cm, *args), fn(*args)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_the_planner_keeps_the_merge_when_it_is_cheaper():
    """For a BERT layer planned for h100 the merged Q/K/V projection plans cheaper, so the
    compiled graph has it, and it computes what the model does."""
    from tilefuse import zoo
    model, sets = zoo.build("bert", "tiny")
    imported = import_torch(model, sets[0])
    pg = simplify_graph(vertical(fold_constants(simplify_graph(fission(imported.graph)))))
    chosen, plans, _, _ = choose_graph(pg, H100, time_limit=2.0)
    assert chosen is not pg and any(p.name.endswith(".h") for p in chosen.prims)
    cm = tilefuse.compile(model, sets[0], target="h100", backend="reference", time_limit=2.0)
    assert any(p.name.endswith(".h") for p in cm.primgraph.prims)
    assert cm.report.est_total_us == pytest.approx(plans["optimal"].cost * 1e6, abs=1e-3)
    feeds = dict(zip([d.name for d in pg.inputs], imported.flatten_inputs(sets[0], {})))
    for x, y in zip(run_reference(pg, feeds), run_reference(chosen, feeds)):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def test_choose_graph_without_siblings_plans_once():
    pg, _ = prims_of(lambda x: F.gelu(x @ torch.ones(4, 4)), torch.randn(2, 4))
    chosen, plans, _, _ = choose_graph(pg, H100, time_limit=2.0)
    assert chosen is pg and plans["optimal"].kernels


def test_choose_graph_keeps_a_padded_stem_only_where_it_plans_cheaper():
    """``api.ALTERNATIVES``: each rewrite is planned with and without, in order, and kept where the
    optimum with it is cheaper; a 3-channel stem's padded copy (``channels_padded``) is one."""
    from tilefuse import api
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, stride=2, padding=1), torch.nn.ReLU()).eval().half()
    pg = api.prims(import_torch(model, (torch.randn(1, 3, 32, 32).half(),)).graph)
    chosen, plans, _, steps = choose_graph(pg, H100, time_limit=2.0)
    assert [name for name, _, _ in steps] == [name for name, _ in api.ALTERNATIVES] == ["horizontal", "padded_channels"]
    (_, before, after), = [s for s in steps if s[0] == "padded_channels"]
    padded = api._padded(before)
    assert padded is not before and any(p.name.endswith("_rows4") for p in padded.prims)
    with_, without = (api.orchestrate(g, H100, time_limit=2.0)[0]["optimal"].cost for g in (padded, before))
    assert (after is not before) == (with_ < without)
    assert chosen is after and plans["optimal"].cost == pytest.approx(min(with_, without))
