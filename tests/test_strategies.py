"""Plans of all three strategies on random graphs mixing elementwise, reductions and matmuls."""
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from test_orchestrate_properties import brute_optimum
from tilefuse.cost.target import Target
from tilefuse.fission.registry import Fission
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.ir.evaluate import run_reference
from tilefuse.ir.expr import maximum
from tilefuse.ir.prim import Constant, Origin, PrimGraph, TensorDecl
from tilefuse.orchestrate import enumerate_candidates, make_segment
from tilefuse.orchestrate.costing import Coster
from tilefuse.orchestrate.plan import execute_reference
from tilefuse.orchestrate.strategies import plan_strategies

F32 = DType.float32
SHAPE = (16, 32)


@st.composite
def graphs(draw, max_ops=8):
    """Ops in topological order; each reads 1-2 earlier values: add, relu, row-softmax, matmul."""
    n = draw(st.integers(1, max_ops))
    fx = Fission({"x", "w"})
    x = fx.ref("x", TensorType(SHAPE, F32))
    w = fx.ref("w", TensorType((SHAPE[1], SHAPE[1]), F32))
    vals = [x]
    for k in range(n):
        kind = draw(st.sampled_from(["add", "relu", "softmax", "matmul"]))
        a = vals[draw(st.integers(0, len(vals) - 1))]
        if kind == "add":
            b = vals[draw(st.integers(0, len(vals) - 1))]
            v = fx.compute(SHAPE, lambda i, a=a, b=b, k=k: a[i] + b[i] * (0.5 + 0.1 * k))
        elif kind == "relu":
            v = fx.compute(SHAPE, lambda i, a=a: maximum(a[i], 0.0))
        elif kind == "softmax":
            m = fx.reduce((SHAPE[0], 1), (SHAPE[1],), "max", lambda i, r, a=a: a[i[0], r[0]])
            e = fx.compute(SHAPE, lambda i, a=a, m=m: (a[i] - m[i[0], 0]) * 0.5)
            s = fx.reduce((SHAPE[0], 1), (SHAPE[1],), "sum", lambda i, r, e=e: e[i[0], r[0]])
            v = fx.compute(SHAPE, lambda i, e=e, s=s: e[i] - s[i[0], 0] * 0.01)
        else:
            v = fx.reduce(SHAPE, (SHAPE[1],), "sum", lambda i, r, a=a: a[i[0], r[0]] * w[r[0], i[1]])
        vals.append(v)
    outs = draw(st.sets(st.integers(1, len(vals) - 1), min_size=1, max_size=3))
    wdata = torch.randn(SHAPE[1], SHAPE[1], generator=torch.Generator().manual_seed(1)) * 0.2
    return PrimGraph((TensorDecl("x", x.type),), (Constant("w", wdata),), tuple(fx.prims),
                     tuple(sorted({vals[o].name for o in outs})))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.sampled_from(["h100", "cpu"]))
def test_every_strategy_orders_and_reproduces_the_reference_and_the_solver_beats_greedy_on_its_own(pg, target):
    plans = plan_strategies(pg, Coster(pg.types, Target.get(target)), time_limit=30.0)
    feeds = {"x": torch.randn(*SHAPE, generator=torch.Generator().manual_seed(0))}
    want = run_reference(pg, feeds)
    for name, plan in plans.items():
        plan.validate()
        got = execute_reference(plan, pg, feeds)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), name
        assert all(k.schedule is not None for k in plan.kernels)
    # plan_strategies replaces an optimum worse than greedy by greedy (status "...+greedy"), so
    # optimal <= greedy holds by construction; what must hold is that it never has to
    assert plans["optimal"].solver["status"] == "optimal"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(max_ops=2), st.sampled_from(["h100", "cpu"]))
def test_the_optimal_plan_is_the_cheapest_selection_of_its_candidates_by_brute_force(pg, target):
    coster = Coster(pg.types, Target.get(target))
    plans = plan_strategies(pg, coster, time_limit=30.0)
    assume(plans["optimal"].solver["num_segments"] == 1)
    seg = make_segment(pg, 0, len(pg.prims))
    cands = enumerate_candidates(seg, coster)
    assume(len(cands) <= 16)                   # keep the exhaustive search small
    best = brute_optimum(seg, cands)
    assert plans["optimal"].cost == pytest.approx(best, rel=1e-9)
    assert plans["greedy"].cost >= best - 1e-15 and plans["unfused"].cost >= best - 1e-15


def test_optimum_fuses_a_shared_row_reduction_with_both_consumers_into_one_multi_output_kernel():
    fx = Fission({"x"})
    x = fx.ref("x", TensorType(SHAPE, F32))
    fx.origin = Origin("ReduceMax", "m")
    m = fx.reduce((SHAPE[0], 1), (SHAPE[1],), "max", lambda i, r: x[i[0], r[0]])
    fx.origin = Origin("Sub", "a")
    a = fx.compute(SHAPE, lambda i: x[i] - m[i[0], 0])
    fx.origin = Origin("Add", "b")
    b = fx.compute(SHAPE, lambda i: x[i] * 2.0 + m[i[0], 0])
    pg = PrimGraph((TensorDecl("x", x.type),), (), tuple(fx.prims), (a.name, b.name))
    plans = plan_strategies(pg, Coster(pg.types, Target.get("h100")))
    assert len(plans["unfused"].kernels) == 3
    (kernel,) = plans["optimal"].kernels
    assert set(kernel.outputs) == {a.name, b.name}
    assert plans["optimal"].cost < plans["unfused"].cost
