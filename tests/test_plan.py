"""Plans: validation, buffer lifetimes, kernel-by-kernel reference execution, end-to-end orchestration.

``dag_graph`` (also used by the other orchestration tests) builds a PrimGraph from a named DAG:
each node is an elementwise prim combining its inputs (or the graph input x); ``optimal_plan``
plans it with ``plan_strategies`` for a plain cost function.
"""
from functools import reduce

import pytest
import torch

from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.evaluate import run_reference
from tilefuse.ir.expr import Load, Var
from tilefuse.ir.prim import Prim, PrimGraph, TensorDecl
from tilefuse.orchestrate import (Caps, Plan, PlannedKernel, PlanError, build_plan, execute_reference, make_segment,
                                  split_segments)
from tilefuse.orchestrate.blp import Selection
from tilefuse.orchestrate.candidates import make_candidate
from tilefuse.orchestrate.strategies import plan_strategies

F32 = DType.float32
SHAPE = (2, 3)


def dag_graph(nodes: dict[str, list[str]], outputs: list[str], shape=SHAPE, coef=None) -> PrimGraph:
    """nodes: name -> predecessor names, in topological order; a node without one reads x.

    ``coef(k, name)`` picks each node's constants (default: its position, so that every node
    differs and a wrong wiring changes the numbers)."""
    axes = tuple(Var(f"i{k}") for k in range(len(shape)))
    prims = []
    for k, (name, ins) in enumerate(nodes.items()):
        ins = tuple(ins) or ("x",)
        loads = [Load(j, axes, F32) for j in range(len(ins))]
        c = float(k if coef is None else coef(k, name))
        body = reduce(lambda a, b: a + b, loads) * (0.5 + 0.25 * c) - c
        prims.append(Prim(name, ins, axes, body, TensorType(shape, F32)))
    return PrimGraph((TensorDecl("x", TensorType(shape, F32)),), (), tuple(prims), tuple(outputs))


class Priced:
    """A plain cost function in the Coster's shape: ``plan_strategies`` also asks for each kernel's
    schedule, and these kernels have none."""

    def __init__(self, cost_fn):
        self.cost_fn = cost_fn

    def __call__(self, cand):
        return self.cost_fn(cand)

    def best(self, cand):
        cost = self.cost_fn(cand)
        return None if cost is None else (cost, None)


def optimal_plan(pg: PrimGraph, cost_fn, **options) -> Plan:
    """The optimal strategy's plan for a plain cost function (``options``: of ``plan_strategies``)."""
    return plan_strategies(pg, Priced(cost_fn), **options)["optimal"]


def feeds(shape=SHAPE):
    return {"x": torch.randn(*shape, generator=torch.Generator().manual_seed(0))}


def one_segment_plan(pg, groups: list[tuple[str, str]]) -> Plan:
    """A plan from (members, outputs) strings of single-letter prim names."""
    seg = make_segment(pg, 0, len(pg.prims))
    cands = tuple(make_candidate(seg, seg.mask(m), seg.mask(o)) for m, o in groups)
    sel = Selection(cands, (1.0,) * len(cands), float(len(cands)), "optimal", 0.0, 0.0, 0)
    return build_plan(pg, [seg], [sel])


def same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_execute_reference_matches_run_reference():
    pg = dag_graph({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}, ["d", "b"])
    plan = one_segment_plan(pg, [("ab", "ab"), ("acd", "d")])   # a computed twice, written once
    assert same(execute_reference(plan, pg, feeds()), run_reference(pg, feeds()))


def test_kernel_internal_values_are_not_visible():
    pg = dag_graph({"a": [], "b": ["a"], "c": ["a"]}, ["b", "c"])
    seg = make_segment(pg, 0, 3)
    k1 = make_candidate(seg, seg.mask("ab"), seg.mask("b"))     # a computed but not written
    k2 = make_candidate(seg, seg.mask("c"), seg.mask("c"))      # needs a
    plan = Plan((PlannedKernel(k1, 1.0, 0), PlannedKernel(k2, 1.0, 0)), frozenset({"x"}), ("b", "c"))
    with pytest.raises(PlanError, match="reads 'a'"):
        plan.validate()
    with pytest.raises(PlanError, match="reads 'a'"):
        execute_reference(plan, pg, feeds())


def test_missing_output_is_reported():
    pg = dag_graph({"a": [], "b": ["a"]}, ["b"])
    with pytest.raises(PlanError, match="graph output 'b'"):
        one_segment_plan(pg, [("a", "a")])


def test_lifetimes():
    pg = dag_graph({"a": [], "b": ["a"], "c": ["b"], "d": ["a", "c"]}, ["d"])
    plan = one_segment_plan(pg, [("a", "a"), ("b", "b"), ("c", "c"), ("d", "d")])
    lt = plan.lifetimes
    assert (lt["a"].first, lt["a"].last) == (0, 3)
    assert (lt["b"].first, lt["b"].last) == (1, 2)
    assert (lt["d"].first, lt["d"].last) == (3, 4)            # graph output: past the end


def test_orchestrate_chain_end_to_end():
    names = [f"p{k}" for k in range(50)]
    nodes = {n: ([names[k - 1]] if k else []) for k, n in enumerate(names)}
    pg = dag_graph(nodes, [names[-1]])
    caps = Caps(max_prims=20)
    segments = split_segments(pg, caps)
    assert [len(s) for s in segments] == [20, 10, 20] or len(segments) == 3
    # Fusing is cheaper than launching: the cost is one launch plus a little per prim.
    plan = optimal_plan(pg, lambda c: 1.0 + 0.1 * len(c.names) + 0.2 * len(c.outputs), caps=caps)
    plan.validate()
    assert plan.solver["status"] == "optimal"
    assert len(plan.kernels) == 3                             # one kernel per segment
    assert plan.cost == pytest.approx(3 * 1.2 + 0.1 * 50)
    assert same(execute_reference(plan, pg, feeds()), run_reference(pg, feeds()))


def test_orchestrate_multiple_outputs_and_dead_code():
    pg = dag_graph({"a": [], "b": ["a"], "dead": ["a"], "c": ["b"], "d": ["a", "b"]}, ["c", "d"])
    plan = optimal_plan(pg, lambda c: 1.0 + 0.05 * len(c.names))
    assert all("dead" not in k.candidate.names for k in plan.kernels)
    assert same(execute_reference(plan, pg, feeds()), run_reference(pg, feeds()))


def test_orchestrate_without_solver_time_uses_the_fallback():
    pg = dag_graph({"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]}, ["d"])
    # Fusing saves nothing here, so the greedy plan is no cheaper than the fallback (else
    # plan_strategies would take it, status "fallback+greedy").
    plan = optimal_plan(pg, lambda c: float(len(c.names)), time_limit=0.0)
    assert plan.solver["status"] == "time_limit+fallback"
    assert plan.solver["time_limit_cut"] == ["segment 0: candidates and solver"]
    assert same(execute_reference(plan, pg, feeds()), run_reference(pg, feeds()))
