"""Segments: cutting at narrow points, caps, canonical keys of repeated blocks, stitching plans."""
import pytest
import torch

from test_plan import dag_graph, feeds, optimal_plan, same
from tilefuse.analysis.classify import Category, classify
from tilefuse.fission import fission
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.evaluate import run_reference
from tilefuse.ir.graph import Attrs, Graph, Node
from tilefuse.ir.prim import Constant, PrimGraph, TensorDecl
from tilefuse.orchestrate import (Caps, build_plan, enumerate_candidates, execute_reference, make_segment, select,
                                  split_segments)
from tilefuse.orchestrate.segment import crossing


def chain(n):
    names = [f"p{k}" for k in range(n)]
    return dag_graph({m: ([names[k - 1]] if k else []) for k, m in enumerate(names)}, [names[-1]])


BLOCK = {"b0": ["in"], "b1": ["b0"], "b2": ["b0"], "b3": ["b1", "b2"], "b4": ["b3", "in"]}


def blocks(n, vary=None):
    """n copies of BLOCK, each reading the previous block's b4 (the first reads x)."""
    nodes, coefs = {}, {}
    prev = None
    for i in range(n):
        for j, (name, ins) in enumerate(BLOCK.items()):
            ins = [f"B{i}{m}" if m != "in" else prev for m in ins]
            nodes[f"B{i}{name}"] = [m for m in ins if m is not None]
            coefs[f"B{i}{name}"] = j + (1 if vary == i and j == 2 else 0)
        prev = f"B{i}b4"
    return dag_graph(nodes, [f"B{n - 1}b4"], coef=lambda k, name: coefs[name])


def cost(c):
    return 1.0 + 0.1 * len(c.names) + 0.3 * len(c.outputs)


def test_long_chain_is_cut_and_plans_stitch():
    pg = chain(100)
    caps = Caps(max_prims=16)
    segs = split_segments(pg, caps)
    assert len(segs) >= 7
    assert [p for s in segs for p in s.prims] == list(pg.prims)        # a partition, in order
    assert all(len(s) <= 16 for s in segs)
    for a, b in zip(segs, segs[1:]):
        assert a.outputs == (b.inputs[0],)                               # one tensor crosses each cut
    sels = [select(s, enumerate_candidates(s, cost, caps)) for s in segs]
    plan = build_plan(pg, segs, sels)
    assert len(plan.kernels) == len(segs)
    assert same(execute_reference(plan, pg, feeds()), run_reference(pg, feeds()))


def test_cuts_fall_where_fewest_tensors_cross():
    pg = blocks(6)
    count, _ = crossing(pg)
    segs = split_segments(pg, Caps(max_prims=12))
    cuts = [s.start for s in segs[1:]]
    assert cuts and all(count[k] == 1 for k in cuts)
    assert all(k % len(BLOCK) == 0 for k in cuts)                       # at block boundaries


def test_segment_inputs_and_outputs():
    pg = dag_graph({"a": [], "b": ["a"], "c": ["b"], "d": ["a", "c"], "e": ["d"]}, ["b", "e"])
    seg = make_segment(pg, 1, 3)                                         # b, c
    assert seg.inputs == ("a",)
    assert seg.outputs == ("b", "c")                                     # b: graph output; c: read by d
    assert make_segment(pg, 0, 5).outputs == ("b", "e")


def test_state_cap_splits_wide_graphs():
    pg = dag_graph({f"w{k}": [] for k in range(12)}, [f"w{k}" for k in range(12)])
    caps = Caps(max_prims=64, max_states=200)
    segs = split_segments(pg, caps)
    assert len(segs) >= 2
    assert all(len(s.states) <= 200 for s in segs)
    plan = optimal_plan(pg, cost, caps=caps)
    assert same(execute_reference(plan, pg, feeds()), run_reference(pg, feeds()))


def test_repeated_blocks_share_a_key():
    pg = blocks(4)
    segs = split_segments(pg, Caps(max_prims=5))
    assert len(segs) == 4
    keys = {s.canonical_key() for s in segs[1:]}
    assert len(keys) == 1                       # the first block reads x, the others a prim: same wiring
    assert len({s.digest() for s in segs[1:]}) == 1
    plan = optimal_plan(pg, cost, caps=Caps(max_prims=5))
    assert plan.solver["num_distinct_segments"] < plan.solver["num_segments"]
    assert same(execute_reference(plan, pg, feeds()), run_reference(pg, feeds()))
    # The remapped selections name their own segment's prims.
    for k in plan.kernels:
        assert set(k.candidate.names) <= {p.name for p in segs[k.segment].prims}


def test_key_sees_structure_not_names():
    pg = blocks(3, vary=2)                      # block 2 has a different constant in b2
    segs = split_segments(pg, Caps(max_prims=5))
    assert segs[1].canonical_key() != segs[2].canonical_key()
    # Renaming every prim keeps the key.
    ren = {p.name: f"r_{p.name}" for p in pg.prims}
    prims = tuple(type(p)(ren[p.name], tuple(ren.get(n, n) for n in p.inputs), p.axes, p.body, p.out)
                  for p in pg.prims)
    pg2 = PrimGraph(pg.inputs, pg.constants, prims, tuple(ren[o] for o in pg.outputs))
    segs2 = split_segments(pg2, Caps(max_prims=5))
    assert [s.canonical_key() for s in segs2] == [s.canonical_key() for s in segs]


def test_key_sees_outputs_and_shapes():
    two = dag_graph({"a": [], "b": ["a"]}, ["b"])
    both = dag_graph({"a": [], "b": ["a"]}, ["a", "b"])
    wide = dag_graph({"a": [], "b": ["a"]}, ["b"], shape=(4, 3))
    keys = [make_segment(g, 0, 2).canonical_key() for g in (two, both, wide)]
    assert len(set(keys)) == 3


@pytest.mark.parametrize("n", [0, 1])
def test_tiny_graphs(n):
    pg = chain(n) if n else dag_graph({}, ["x"])
    plan = optimal_plan(pg, cost)
    got = execute_reference(plan, pg, feeds())
    assert same(got, run_reference(pg, feeds()))
    assert torch.is_tensor(got[0])


def encoder(layers, seq=4, d=8, heads=2, ff=16):
    """A small BERT-style encoder as an operator graph, fissioned."""
    g = torch.Generator().manual_seed(0)
    types, nodes, consts = {"x": TensorType((1, seq, d), DType.float32)}, [], []

    def const(shape):
        name = f"w{len(consts)}"
        consts.append(Constant(name, torch.randn(shape, generator=g) * 0.3))
        types[name] = TensorType(shape, DType.float32)
        return name

    def op(kind, ins, shape, **attrs):
        name = f"v{len(nodes)}"
        nodes.append(Node(kind, f"n{len(nodes)}", tuple(ins), (name,), Attrs(attrs)))
        types[name] = TensorType(shape, DType.float32)
        return name

    def linear(x, n_in, n_out):
        return op("Add", [op("MatMul", [x, const((n_in, n_out))], (1, seq, n_out)), const((n_out,))],
                  (1, seq, n_out))

    def split_heads(t, perm, shape):
        return op("Transpose", [op("Reshape", [t], (1, seq, heads, d // heads))], shape, perm=perm)

    def norm(t):
        return op("LayerNormalization", [t, const((d,)), const((d,))], (1, seq, d), axis=-1)

    x, dh = "x", d // heads
    for _ in range(layers):
        q = split_heads(linear(x, d, d), (0, 2, 1, 3), (1, heads, seq, dh))
        k = split_heads(linear(x, d, d), (0, 2, 3, 1), (1, heads, dh, seq))
        v = split_heads(linear(x, d, d), (0, 2, 1, 3), (1, heads, seq, dh))
        s = op("Mul", [op("MatMul", [q, k], (1, heads, seq, seq)), const(())], (1, heads, seq, seq))
        o = op("MatMul", [op("Softmax", [s], (1, heads, seq, seq), axis=-1), v], (1, heads, seq, dh))
        o = op("Reshape", [op("Transpose", [o], (1, seq, heads, dh), perm=(0, 2, 1, 3))], (1, seq, d))
        x1 = norm(op("Add", [x, linear(o, d, d)], (1, seq, d)))
        h = linear(op("Gelu", [linear(x1, d, ff)], (1, seq, ff)), ff, d)
        x = norm(op("Add", [x1, h], (1, seq, d)))
    return fission(Graph((TensorDecl("x", types["x"]),), (x,), tuple(nodes), tuple(consts), types))


def test_encoder_layers_are_solved_once_and_exact():
    pg = encoder(3)
    category = {p.name: classify(p) for p in pg.prims}

    def cost(c):  # one launch, the bytes moved, at most one contraction per kernel
        if sum(category[n] is Category.contraction for n in c.names) > 1:
            return None
        moved = sum(pg.types[t].nbytes for t in c.inputs + c.outputs)
        return 5.0 + moved / 100.0 + 0.1 * len(c.names)

    plan = optimal_plan(pg, cost)
    assert plan.solver["status"] == "optimal"
    assert plan.solver["num_distinct_segments"] < plan.solver["num_segments"]
    assert len(plan.kernels) < len(pg.prims) / 3           # fusion happened
    x = {"x": torch.randn(1, 4, 8, generator=torch.Generator().manual_seed(1))}
    assert same(execute_reference(plan, pg, x), run_reference(pg, x))
