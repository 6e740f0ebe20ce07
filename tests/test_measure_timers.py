"""Timers that measure kernels on a CUDA device; without one they refuse with a clear error."""
import dataclasses

import pytest
import torch

from tilefuse.cost import measure
from tilefuse.cost.measure import MeasurementUnavailable, TimerResult, cuda_timer, measurement_available
from tilefuse.errors import TilefuseError


def _check_refusal(excinfo):
    assert isinstance(excinfo.value, RuntimeError) and isinstance(excinfo.value, TilefuseError)
    assert "needs a CUDA device" in str(excinfo.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_cuda_measurement_is_unavailable_and_the_timer_refuses():
    assert measurement_available() is False
    with pytest.raises(MeasurementUnavailable) as excinfo:
        cuda_timer()
    _check_refusal(excinfo)


def test_measurement_available_follows_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert measurement_available() is False
    with pytest.raises(RuntimeError) as excinfo:
        cuda_timer(warmup=1, reps=3, flush_l2=False)
    _check_refusal(excinfo)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert measurement_available() is True


@pytest.mark.parametrize("warmup, reps", [(-1, 5), (0, 0), (3, -2)])
def test_timer_rejects_meaningless_counts(warmup, reps):
    with pytest.raises(ValueError, match="warmup >= 0 and reps >= 1"):
        cuda_timer(warmup=warmup, reps=reps)


def test_timer_result_is_immutable():
    r = TimerResult(1e-3, (1e-3,))
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.median_s = 0.0


class _FakeCuda:
    """Stands in for CUDA: a clock in milliseconds that the timed callable and the L2 flush advance,
    events that read it, and a log of what happened in which order."""

    def __init__(self, monkeypatch, durations_ms):
        self.now, self.log, self.durations = 0.0, [], list(durations_ms)
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                self.t = None

            def record(self, stream=None):
                self.t = fake.now
                fake.log.append("record")

            def elapsed_time(self, end):
                return end.t - self.t

        class Buffer:
            def zero_(self):
                fake.now += 1000.0  # a flush inside the timed interval would show as +1 s
                fake.log.append("flush")

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: fake.log.append("sync"))
        monkeypatch.setattr(measure, "_l2_flush_buffer", Buffer)

    def fn(self):
        self.now += self.durations.pop(0)
        self.log.append("fn")


@pytest.mark.parametrize("flush_l2", [True, False])
def test_timer_warms_up_then_times_each_rep_between_events(monkeypatch, flush_l2):
    cuda = _FakeCuda(monkeypatch, [50.0, 60.0] + [3.0, 1.0, 2.0, 5.0, 4.0])
    result = cuda_timer(warmup=2, reps=5, flush_l2=flush_l2)(cuda.fn)
    assert result.samples == pytest.approx((3e-3, 1e-3, 2e-3, 5e-3, 4e-3))   # seconds, warm-up excluded
    assert result.median_s == pytest.approx(3e-3)
    rep = (["flush"] if flush_l2 else []) + ["record", "fn", "record"]
    assert cuda.log == ["fn", "fn", "sync"] + rep * 5 + ["sync"]
    assert cuda.durations == []


@pytest.mark.gpu
@pytest.mark.parametrize("flush_l2", [True, False])
def test_cuda_timer_times_a_matmul(flush_l2):
    x = torch.randn(1024, 1024, device="cuda")
    result = cuda_timer(warmup=3, reps=7, flush_l2=flush_l2)(lambda: x @ x)
    assert len(result.samples) == 7 and all(s > 0 for s in result.samples)
    assert 0 < result.median_s < 1.0
    assert min(result.samples) <= result.median_s <= max(result.samples)


def test_wall_timer_warms_up_then_times_each_call():
    """The wall-clock timer (``tilefuse run``'s latency, the CPU benchmarks): ``warmup`` untimed
    calls, then one sample per timed call, the median of them."""
    import time
    calls = []

    def fn():
        calls.append(1)
        time.sleep(0.002 * len(calls))      # each call slower than the last
    r = measure.wall_timer(warmup=2, reps=3)(fn)
    assert len(calls) == 5 and len(r.samples) == 3
    assert r.samples[0] < r.samples[2] and r.median_s == sorted(r.samples)[1]
    assert measure.wall_timer(warmup=0, reps=0)(fn).samples == ()
    with pytest.raises(ValueError, match="wall_timer needs"):
        measure.wall_timer(warmup=-1)
