"""Progress of the steps that can take seconds (import, fission, planning each segment, building
each kernel, running kernels under the interpreter), for whoever shows it.

The pipeline calls ``report(what, done, total)``; nothing happens unless a reporter was installed
with ``reporting(fn)`` (the CLI's progress bar, on a terminal only).  The reporter is a context
variable, so concurrent compiles in other threads report nowhere unless they install their own.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

Reporter = Callable[[str, int, "int | None"], None]     # (what, done, total or None if unknown)
_reporter: ContextVar[Reporter | None] = ContextVar("tilefuse_progress", default=None)


@contextmanager
def reporting(reporter: Reporter | None) -> Iterator[None]:
    token = _reporter.set(reporter)
    try:
        yield
    finally:
        _reporter.reset(token)


def report(what: str, done: int, total: int | None = None) -> None:
    fn = _reporter.get()
    if fn is not None:
        fn(what, done, total)


@contextmanager
def step(what: str) -> Iterator[None]:
    """A step of unknown length: reported when it starts and when it ends."""
    report(what, 0, None)
    yield
    report(what, 1, 1)
