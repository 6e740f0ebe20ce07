"""Measuring kernels on a CUDA device: timers that run a callable and report its time in seconds.

A ``Timer`` takes a zero-argument callable that launches work on the current CUDA stream and
returns a ``TimerResult``.  Modelled times (``cost/model.py``) need no device; measured times do,
so ``measurement_available()`` says whether this machine can measure at all.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from time import perf_counter
from typing import Callable

import torch

from ..errors import TargetAbsentError

# Written between timed runs so each starts with a cold L2, as in steady-state inference where
# other kernels evict the inputs; several times the L2 of current NVIDIA GPUs (the size
# triton.testing.do_bench uses).
L2_FLUSH_BYTES = 256 * 2**20


@dataclass(frozen=True)
class TimerResult:
    """The median of the timed runs and every run's time, in seconds."""

    median_s: float
    samples: tuple[float, ...]


Timer = Callable[[Callable[[], object]], TimerResult]


class MeasurementUnavailable(TargetAbsentError, RuntimeError):
    """Measuring kernel times was asked for on a machine without a CUDA device."""


def measurement_available() -> bool:
    """Whether kernels can be measured here (a CUDA device is attached)."""
    return torch.cuda.is_available()


def cuda_timer(warmup: int = 10, reps: int = 50, flush_l2: bool = True) -> Timer:
    """A timer that runs ``fn`` ``warmup`` times untimed (compilation, caches, clocks), then
    ``reps`` times, each between a pair of CUDA events on the current stream.

    Events time the device work alone, without Python or launch overhead outside the stream.
    With ``flush_l2`` a 256 MiB buffer is written before every timed run (outside its events).
    The median resists outliers (other processes, clock changes).  A callable that launches no
    device work can time as 0.0 s.
    """
    if warmup < 0 or reps < 1:
        raise ValueError(f"cuda_timer needs warmup >= 0 and reps >= 1, got warmup={warmup}, reps={reps}")
    if not measurement_available():
        raise MeasurementUnavailable(
            "measuring kernel times needs a CUDA device, and none is available on this machine; "
            "use modelled times (the default) or run on a machine with an NVIDIA GPU")

    def time(fn: Callable[[], object]) -> TimerResult:
        flush = _l2_flush_buffer() if flush_l2 else None
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        for start, end in events:
            if flush is not None:
                flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        samples = tuple(start.elapsed_time(end) / 1e3 for start, end in events)  # ms -> s
        return TimerResult(statistics.median(samples), samples)

    return time


def wall_timer(warmup: int = 1, reps: int = 10) -> Timer:
    """A timer of wall-clock time per call: ``warmup`` untimed calls, then ``reps`` timed ones.
    For calls that return when their work is done (host arrays, the interpreter, a CPU model):
    latency as a caller sees it, launches and Python included."""
    if warmup < 0 or reps < 0:
        raise ValueError(f"wall_timer needs warmup >= 0 and reps >= 0, got warmup={warmup}, reps={reps}")

    def time(fn: Callable[[], object]) -> TimerResult:
        for _ in range(warmup):
            fn()
        samples = []
        for _ in range(reps):
            t0 = perf_counter()
            fn()
            samples.append(perf_counter() - t0)
        return TimerResult(statistics.median(samples) if samples else 0.0, tuple(samples))

    return time


def _l2_flush_buffer() -> torch.Tensor:
    return torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")


# --- select -> measure -> re-select (DESIGN.md §7) ---------------------------------------------

ROUNDS = 3          # re-solves at most; a plan whose kernels were all measured is stable
TOP_K = 4           # schedules measured per chosen kernel: the family's best few by the model
FINISH_ROUNDS = 12  # re-plans after ROUNDS that value only the plan's own unvalued kernels


@dataclass(frozen=True)
class Tuning:
    """What the measurement loop did: the final plans and coster, every measured schedule
    (key -> seconds as costed: device time plus the plan mode's launch), how many rounds ran,
    whether the plan stopped changing, and how many times came from the tuning cache."""
    plans: dict
    coster: object
    measured: dict[str, float]
    rounds: int
    stable: bool
    from_cache: int


def tune(plan_fn: Callable[[dict[str, float]], tuple[dict, object]],
         runner: Callable[[object], Callable[[], object]], timer: Timer, *, launch_s: float,
         target: str, cache=None, versions=None, strategy: str = "optimal", rounds: int = ROUNDS,
         top_k: int = TOP_K) -> Tuning:
    """Measure the kernels the plan uses and re-plan with their times until the plan is stable.

    ``plan_fn(measured)`` plans with measured times (schedule key -> seconds) overriding the
    model and returns ``(plans, coster)``; ``coster.options(candidate)`` ranks a kernel's
    schedules.  For every kernel of ``plans[strategy]``, its ``top_k`` schedules are run by
    ``runner(schedule)()`` under ``timer`` (or read from ``cache``, keyed by the schedule's
    structural key, the target and the library versions) — only what the optimum uses is
    measured.  A measured device time is charged ``launch_s`` on top (the events time the device
    work; the launch is the plan mode's).  Stops when a round measured nothing new (every kernel
    of the plan is measured: the plan is stable) or after ``rounds`` re-solves.
    """
    from .cache import entry_key, library_versions
    versions = versions if versions is not None else library_versions()
    from_cache = 0

    def device_time(sched) -> float:
        nonlocal from_cache
        key = sched.key()
        ekey = entry_key(key, target, versions)
        device_s = cache.get(ekey) if cache is not None else None
        if device_s is None:
            device_s = timer(runner(sched)).median_s
            if cache is not None and device_s > 0:
                cache.put(ekey, device_s, schedule=key, target=target)
        else:
            from_cache += 1
        return device_s + launch_s

    plans, coster, measured, done, stable = settle(plan_fn, device_time, strategy=strategy, top_k=top_k,
                                                   rounds=rounds)
    return Tuning(plans, coster, measured, done, stable, from_cache)


def settle(plan_fn: Callable[[dict], tuple[dict, object]], value_of: Callable[[object], object], *,
           strategy: str = "optimal", top_k: int = TOP_K, rounds: int = ROUNDS,
           wanted: Callable[[object], bool] = lambda sched: True) -> tuple[dict, object, dict, int, bool]:
    """The loop of planning on better figures than the model's: plan with ``plan_fn(values)``
    (schedule key -> what ``value_of(schedule)`` gave: a measured time, a cost from the binary),
    get ``value_of`` for every kernel of ``plans[strategy]`` and its ``top_k`` options that
    ``wanted`` admits and that has none yet, re-plan, until a round adds nothing (stable) or
    after ``rounds`` re-plans.  Returns (plans, coster, values, rounds run, stable)."""
    values: dict = {}
    plans, coster = plan_fn(values)
    for done in range(rounds):
        new = 0
        for kernel in plans[strategy].kernels:
            for _, sched in coster.options(kernel.candidate)[:top_k]:
                key = sched.key()
                if key in values or not wanted(sched):
                    continue
                values[key] = value_of(sched)
                new += 1
        if not new:
            return plans, coster, values, done, True
        plans, coster = plan_fn(values)
    # Out of rounds with the plan still moving: value only what the plan runs from here on, so
    # every kernel it reports has a figure; each round adds a schedule, so this ends.
    for extra in range(FINISH_ROUNDS):
        pending = {s.key(): s for s in (coster.best(k.candidate)[1] for k in plans[strategy].kernels)
                   if s.key() not in values and wanted(s)}
        if not pending:
            return plans, coster, values, rounds + extra, True
        for key, sched in pending.items():
            values[key] = value_of(sched)
        plans, coster = plan_fn(values)
    best = [coster.best(k.candidate)[1] for k in plans[strategy].kernels]
    return plans, coster, values, rounds + FINISH_ROUNDS, all(s.key() in values or not wanted(s) for s in best)
