"""Select -> measure -> re-select (cost/measure.py) with an injected fake timer, on CPU."""
import json

import pytest
import torch

from planning import meta

from opcheck import one_node_graph

from tilefuse.api import orchestrate
from tilefuse.cost.cache import TuningCache
from tilefuse.cost.measure import TimerResult, tune
from tilefuse.cost.target import Target
from tilefuse.fission import fission
from tilefuse.ir.dtypes import DType, TensorType
from tilefuse.transform.simplify import simplify_graph

H100 = Target.get("h100")


def _layernorm_graph():
    g = one_node_graph("LayerNormalization", [meta(512, 1024), meta(1024), meta(1024)],
                       [TensorType((512, 1024), DType.float16)], {"axis": -1, "epsilon": 1e-5})
    return simplify_graph(fission(g))


class FakeDevice:
    """Runs nothing; 'measures' a schedule at its modelled time, times ``slow`` for fused kernels
    of more than one prim (as if the GPU disagreed with the model about fusion)."""

    def __init__(self, slow=1.0):
        self.slow, self.calls = slow, 0

    def runner(self, sched):
        fn = lambda: None
        fn.sched = sched
        return fn

    def timer(self, fn):
        from tilefuse.families.base import Cost
        self.calls += 1
        s = fn.sched
        t = Cost.modelled(s.work, H100).seconds - H100.launch_s
        if s.family == "fused" and len(s.group.prims) > 1:
            t *= self.slow
        return TimerResult(t, (t,))


def _tune(pg, dev, cache=None, **kw):
    return tune(lambda m: orchestrate(pg, H100, measured=m, time_limit=5), dev.runner, dev.timer,
                launch_s=H100.launch_s, target="h100", cache=cache, versions={"test": "1"}, **kw)


def _fused_sizes(tuning):
    return sorted(len(k.prims) for k in tuning.plans["optimal"].kernels)


def test_agreeing_measurements_keep_the_plan_and_converge():
    pg = _layernorm_graph()
    modelled, _ = orchestrate(pg, H100, time_limit=5)
    dev = FakeDevice()
    tuning = _tune(pg, dev)
    assert tuning.stable and tuning.rounds <= 2
    assert [k.candidate.names for k in tuning.plans["optimal"].kernels] == \
           [k.candidate.names for k in modelled["optimal"].kernels]
    # every kernel of the plan was measured, and the report's cost says so
    for k in tuning.plans["optimal"].kernels:
        cost, sched = tuning.coster.best(k.candidate)
        assert cost.measured and sched.key() in tuning.measured
    assert dev.calls == len(tuning.measured)


def test_measurements_that_disagree_change_the_plan():
    pg = _layernorm_graph()
    fused = _tune(pg, FakeDevice())
    assert max(_fused_sizes(fused)) > 1                     # the model fuses the layer norm
    bounded = _tune(pg, FakeDevice(slow=50.0))               # ROUNDS re-solves with the top few...
    assert bounded.rounds > 3 and bounded.stable             # ...then only the plan's own kernels
    for k in bounded.plans["optimal"].kernels:               # every kernel it runs has a measured time
        assert bounded.coster.best(k.candidate)[0].measured
    slow = _tune(pg, FakeDevice(slow=50.0), rounds=30)
    assert slow.stable and slow.rounds < 30                  # each round rules out what it measured
    assert max(_fused_sizes(slow)) < max(_fused_sizes(fused))   # measured: fusion did not pay
    total = sum(slow.coster.best(k.candidate)[0].seconds for k in slow.plans["optimal"].kernels)
    assert total == pytest.approx(slow.plans["optimal"].cost)


def test_the_tuning_cache_round_trips_and_heals(tmp_path):
    pg = _layernorm_graph()
    cache = TuningCache(tmp_path / "tuning")
    first = FakeDevice()
    a = _tune(pg, first, cache)
    assert first.calls > 0 and a.from_cache == 0
    second = FakeDevice()
    b = _tune(pg, second, TuningCache(tmp_path / "tuning"))
    assert second.calls == 0 and b.from_cache == len(b.measured) == len(a.measured)
    assert b.measured == pytest.approx(a.measured)
    # corrupt one entry: it is measured again (and rewritten), the others still come from the cache
    entries = sorted((tmp_path / "tuning").rglob("*.json"))
    entries[0].write_bytes(entries[0].read_bytes() + b"\xff")
    third = FakeDevice()
    c = _tune(pg, third, TuningCache(tmp_path / "tuning"))
    assert third.calls == 1 and c.from_cache == len(c.measured) - 1
    json.loads(entries[0].read_text())                      # healed


def test_compile_measure_fills_measured_us(tmp_path, monkeypatch):
    import tilefuse
    monkeypatch.setenv("TILEFUSE_CACHE_DIR", str(tmp_path))
    seen = []

    def timer(fn):
        fn()                                                   # really runs the kernel (interpreter)
        seen.append(1)
        return TimerResult(3e-6, (3e-6,))

    x = torch.randn(4, 8)
    compiled = tilefuse.compile(lambda t: torch.softmax(t * 2, -1), (x,), target="cpu", measure=timer)
    r = compiled.report
    assert seen and r.measurement["schedules_measured"] == len(seen)
    assert r.measurement["stable"]
    for k in r.kernels:
        assert k.measured_us == pytest.approx(3 + Target.get("cpu").launch_s * 1e6)
    torch.testing.assert_close(compiled(x), torch.softmax(x * 2, -1))


def test_measure_without_a_gpu_is_a_clear_error():
    import tilefuse
    from tilefuse.errors import TilefuseError
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(TilefuseError, match="CUDA device"):
        tilefuse.compile(lambda t: t + 1, (torch.randn(3),), target="h100", measure=True)


def test_kernels_are_timed_after_an_l2_flush_only_when_the_model_outgrows_half_the_l2():
    from tilefuse.api import cold_l2
    small = _layernorm_graph()
    assert sum(t.nbytes for t in small.types.values()) < H100.l2_bytes // 2
    assert not cold_l2(small, H100)
    from dataclasses import replace
    tiny_l2 = replace(H100, l2_bytes=2 * sum(t.nbytes for t in small.types.values()) - 2)
    assert cold_l2(small, tiny_l2)
