"""Property tests of the orchestrator on random DAGs: Theorem 1 against brute force, and every plan
valid, optimal among the candidates (checked exhaustively when small) and exact against the reference."""
import itertools
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_plan import dag_graph, feeds, optimal_plan, same
from tilefuse.ir.evaluate import run_reference
from tilefuse.orchestrate import (Caps, build_plan, convex_sets, enumerate_candidates, execute_reference,
                                  execution_states, is_convex, make_segment, select)
from tilefuse.orchestrate.blp import _order, _Problem
from tilefuse.orchestrate.states import successors

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def dags(draw, max_nodes=12, density=0.3):
    n = draw(st.integers(1, max_nodes))
    preds = [0] * n
    for v in range(n):
        for u in range(v):
            if draw(st.floats(0, 1)) < density:
                preds[v] |= 1 << u
    return preds


def brute_states(preds):
    n = len(preds)
    return {m for m in range(1 << n) if all(preds[v] & ~m == 0 for v in range(n) if m >> v & 1)}


def brute_convex(preds):
    n = len(preds)
    reach = []                                  # reach[v]: the nodes a path from v reaches
    for v in range(n):
        seen, todo = 0, [v]
        while todo:
            u = todo.pop()
            for w in range(u + 1, n):
                if preds[w] >> u & 1 and not seen >> w & 1:
                    seen |= 1 << w
                    todo.append(w)
        reach.append(seen)

    def convex(m):
        for p in range(n):
            if m >> p & 1:
                for q in range(n):
                    if not m >> q & 1 and reach[p] >> q & 1 and reach[q] & m:
                        return False
        return True
    return {m for m in range(1, 1 << n) if convex(m)}


@SETTINGS
@given(dags(max_nodes=10, density=0.35))
def test_states_and_theorem_1(preds):
    states = execution_states(preds, cap=1 << 12)
    assert set(states) == brute_states(preds)
    conv = convex_sets(states, cap=1 << 12)
    assert conv == brute_convex(preds)
    succs = successors(preds)
    for m in range(1, 1 << len(preds)):
        assert is_convex(m, preds, succs) == (m in conv)


def graph_of(preds, outputs):
    names = [f"n{v}" for v in range(len(preds))]
    nodes = {names[v]: [names[u] for u in range(v) if preds[v] >> u & 1] for v in range(len(preds))}
    return dag_graph(nodes, [names[v] for v in outputs])


def random_costs(seed, reject=0.3):
    """A deterministic random price per candidate; lone prims are always buildable."""
    def cost(c):
        rng = random.Random(hash((seed, c.members, c.out_mask)))
        if len(c.names) > 1 and rng.random() < reject:
            return None
        return rng.uniform(0.5, 1.5) + 0.1 * len(c.names) + 0.2 * len(c.outputs)
    return cost


@st.composite
def problems(draw, max_nodes=12):
    preds = draw(dags(max_nodes=max_nodes))
    n = len(preds)
    outputs = sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n)))
    return preds, outputs, draw(st.integers(0, 2 ** 32))


@SETTINGS
@given(problems())
def test_plans_are_valid_and_exact(problem):
    preds, outputs, seed = problem
    pg = graph_of(preds, outputs)
    plan = optimal_plan(pg, random_costs(seed), caps=Caps(max_prims=8))
    plan.validate()
    assert plan.solver["status"] == "optimal"
    assert same(execute_reference(plan, pg, feeds()), run_reference(pg, feeds()))


def brute_optimum(seg, cands):
    p = _Problem(seg, cands)
    best = None
    for r in range(1, len(cands) + 1):
        for subset in itertools.combinations(range(len(cands)), r):
            _, stuck, written = _order(p, list(subset))
            if stuck or seg.out_mask & ~written:
                continue
            total = sum(p.costs[k] for k in subset)
            best = total if best is None else min(best, total)
    return best


@SETTINGS
@given(problems(max_nodes=4))
def test_selection_is_optimal(problem):
    preds, outputs, seed = problem
    pg = graph_of(preds, outputs)
    seg = make_segment(pg, 0, len(pg.prims))
    cands = enumerate_candidates(seg, random_costs(seed, reject=0.6))
    cands = cands[:14]                          # keep the exhaustive search small
    want = brute_optimum(seg, cands)
    if want is None:
        return
    sel = select(seg, cands)
    assert abs(sel.objective - want) < 1e-6
    assert abs(sel.objective - sum(sel.costs)) < 1e-9
    plan = build_plan(pg, [seg], [sel])
    assert same(execute_reference(plan, pg, feeds()), run_reference(pg, feeds()))
