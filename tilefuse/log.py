"""What each stage decided, through Python's ``logging``, in the spirit of ``TORCH_LOGS``.

Channels (loggers ``tilefuse.<channel>``), off by default::

    TILEFUSE_LOGS=plan,solver python app.py         # or: tilefuse.set_logs("plan,solver")
    TILEFUSE_LOGS=+cost                             # "+": that channel in detail (DEBUG)
    TILEFUSE_LOGS=all

``plan``: each stage's size and time, segments, the horizontal rewrite's verdict, the strategies'
totals and every chosen kernel with its modelled time; ``solver``: each segment's selection
(status, gap, objective, lazy rounds, seconds); ``cost``: candidates costed per segment and which
family won them (``+cost``: every candidate's families); ``kernels``: each kernel built (family,
schedule, source lines); ``recompile``: each plan compiled for a new input signature of a
``torch.compile`` graph, with what changed (input, dimension, old and new size) and how many plans
the graph has.  A channel switched on gets a handler writing ``[tilefuse.plan] ...`` to
stderr and stops propagating (as torch's do); configuring the loggers yourself works as for any
logger.
"""
from __future__ import annotations

import logging
import os
import sys
import warnings
from typing import Iterable

from .errors import OptionError

CHANNELS = {
    "plan": "each stage's size and time, segments, strategies, the chosen kernels",
    "solver": "each segment's selection: status, gap, objective, lazy rounds",
    "cost": "candidates costed per segment and the family that won (+cost: every candidate)",
    "kernels": "each kernel built: family, schedule, source lines",
    "recompile": "each new plan for a torch.compile graph: which input's which dimension caused it",
}
ENV = "TILEFUSE_LOGS"
_handlers: dict[str, logging.Handler] = {}


def logger(channel: str) -> logging.Logger:
    return logging.getLogger(f"tilefuse.{channel}")


def _parse(spec: str | Iterable[str]) -> dict[str, int]:
    """Channel -> level from ``"plan,+cost"`` (or a list of such names)."""
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec)]
    levels: dict[str, int] = {}
    for name in filter(None, names):
        level = logging.DEBUG if name.startswith("+") else logging.INFO
        name = name.lstrip("+")
        if name == "all":
            levels.update({c: level for c in CHANNELS})
        elif name in CHANNELS:
            levels[name] = level
        else:
            raise OptionError(f"unknown log channel {name!r}; the channels are {', '.join(CHANNELS)} "
                              f"(or all; +name for detail)")
    return levels


def set_logs(spec: str | Iterable[str] | None = None) -> None:
    """Switch channels on (``"plan,solver"``, ``["+cost"]``, ``"all"``); the others off.
    ``set_logs()`` or ``set_logs("")`` switches every channel off."""
    levels = _parse(spec or "")
    for channel in CHANNELS:
        log = logger(channel)
        old = _handlers.pop(channel, None)
        if old is not None:
            log.removeHandler(old)
        if channel in levels:
            h = logging.StreamHandler(sys.stderr)
            h.setFormatter(logging.Formatter(f"[tilefuse.{channel}] %(message)s"))
            log.addHandler(h)
            _handlers[channel] = h
            log.setLevel(levels[channel])
            log.propagate = False
        else:
            log.setLevel(logging.NOTSET)
            log.propagate = True


def from_environment() -> None:
    """Apply ``TILEFUSE_LOGS`` (at import); a bad value warns instead of failing the import."""
    spec = os.environ.get(ENV)
    if spec:
        try:
            set_logs(spec)
        except OptionError as e:
            warnings.warn(f"{ENV}: {e}", stacklevel=2)
