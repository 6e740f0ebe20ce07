"""Measuring kernels on a CUDA device: timers that run a callable and report its time in seconds.

A ``Timer`` takes a zero-argument callable that launches work on the current CUDA stream and
returns a ``TimerResult``.  Modelled times (``cost/model.py``) need no device; measured times do,
so ``measurement_available()`` says whether this machine can measure at all.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
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


def _l2_flush_buffer() -> torch.Tensor:
    return torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
